"""`energyformers.training.trainer.RecipeTrainer`: the evaluation settings of `energyformers train` (the accuracy
at each depth of `depth_evaluation`, the masked-image-modelling metrics of `masked_images`) are constructor
arguments, and `evaluate` adds exactly what it was given."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from fixtures import hyperset_config
from transformers import TrainingArguments

from energyformers import HyperSetForImageClassification
from energyformers.training.evaluation import TrainerMetrics, argmax_logits
from energyformers.training.trainer import RecipeTrainer

EXAMPLES, TASK, DEPTHS = 24, "image-classification", [1, 5]
# what the masked-image-modelling evaluation returns here, for every split
RECONSTRUCTION = {"psnr": 12.5}


def depth_model() -> HyperSetForImageClassification:
    """A Hyper-SET whose predictions change with the depth: every weight drawn wide (at their initial values the
    logits do not depend on the input)."""
    torch.manual_seed(0)
    model = HyperSetForImageClassification(hyperset_config("image")).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.normal_(0.0, 0.5)
    return model


def predictions(model: HyperSetForImageClassification, pixels: torch.Tensor, depth: int) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=pixels, num_iterations=depth).logits.argmax(-1)


def examples(model: HyperSetForImageClassification) -> Dataset:
    """Random images labelled with `model`'s own predictions at the deepest of `DEPTHS`: accuracy 1 there."""
    pixels = torch.randn(EXAMPLES, 1, 8, 8, generator=torch.Generator().manual_seed(0))
    labels = predictions(model, pixels, DEPTHS[-1])
    return Dataset.from_dict({"pixel_values": pixels.tolist(), "labels": labels.tolist()}).with_format(
        "torch"
    )


class MaskedImages:
    """A stand-in for `setup.Built.masked_images`: records the (model, split) of each call."""

    def __init__(self) -> None:
        self.calls: list[tuple[object, str]] = []

    def __call__(self, model: object, split: str) -> dict[str, float]:
        self.calls.append((model, split))
        return dict(RECONSTRUCTION)


def recipe_trainer(output_dir: Path, **settings: object) -> RecipeTrainer:
    model = depth_model()
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_eval_batch_size=10,  # the last batch is partial
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
    )
    return RecipeTrainer(
        model=model,
        args=args,
        eval_dataset=examples(model),
        compute_metrics=TrainerMetrics(TASK),
        preprocess_logits_for_metrics=argmax_logits,
        training_loss=SimpleNamespace(active=False),  # evaluation only: the model's plain loss
        run_args=None,
        schedule=None,
        **settings,
    )


def test_evaluate_adds_the_depths_and_reconstruction_metrics_given_to_the_constructor(tmp_path: Path) -> None:
    masked_images = MaskedImages()
    trainer = recipe_trainer(tmp_path, depth_evaluation=(TASK, DEPTHS), masked_images=masked_images)
    data = trainer.eval_dataset[:]
    shallow = (predictions(trainer.model, data["pixel_values"], DEPTHS[0]) == data["labels"]).double().mean()
    assert shallow < 1, (
        f"accuracy {shallow.item()} at depth {DEPTHS[0]}: the test needs predictions that change"
    )
    metrics = trainer.evaluate()
    # accuracies over 24 examples: multiples of 1/24, the same counts both ways
    expected = {
        f"eval_accuracy_iterations_{DEPTHS[0]}": shallow.item(),
        f"eval_accuracy_iterations_{DEPTHS[1]}": 1.0,
    }
    assert {k: metrics.get(k) for k in expected} == pytest.approx(expected, abs=1e-9), metrics
    assert metrics["eval_psnr"] == RECONSTRUCTION["psnr"], metrics
    assert [(model is trainer.model, split) for model, split in masked_images.calls] == [(True, "validation")]
    logged = [
        entry for entry in trainer.state.log_history if f"eval_accuracy_iterations_{DEPTHS[0]}" in entry
    ]
    assert len(logged) == 1, trainer.state.log_history

    # the test split: the reconstruction metrics, and no depth rows (they are the validation split's)
    metrics = trainer.evaluate(metric_key_prefix="test")
    assert metrics["test_psnr"] == RECONSTRUCTION["psnr"], metrics
    assert not [k for k in metrics if "_iterations_" in k], metrics
    assert [split for _, split in masked_images.calls] == ["validation", "test"]


def test_evaluate_adds_nothing_without_them(tmp_path: Path) -> None:
    trainer = recipe_trainer(tmp_path)
    assert trainer.depth_evaluation is None and trainer.masked_images is None
    metrics = trainer.evaluate()
    assert sorted(k for k in metrics if "_iterations_" in k or "psnr" in k) == [], metrics
    assert "eval_accuracy" in metrics, metrics
