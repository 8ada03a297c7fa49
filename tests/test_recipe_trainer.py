"""`energyformers.training.trainer.RecipeTrainer`: the evaluation settings of `energyformers train` (the accuracy
at each depth of `depth_evaluation`, the masked-image-modelling metrics of `masked_images`) are constructor
arguments, and `evaluate` adds exactly what it was given."""

from __future__ import annotations

import functools
from pathlib import Path
from types import SimpleNamespace

import pytest
import torch
from datasets import Dataset
from fixtures import hyperset_config
from transformers import Trainer, TrainerCallback, TrainingArguments

from energyformers import HyperSetForImageClassification
from energyformers.training.augmentation import EMACallback
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

    def __call__(self, model: object, split: str, stop: object = None) -> dict[str, float]:
        self.calls.append((model, split))
        return dict(RECONSTRUCTION)


def training_arguments(output_dir: Path, max_steps: int, **settings: object) -> TrainingArguments:
    """A training run of `max_steps` on CPU, batches of 8, evaluated every 2 steps (batches of 10, the last one
    partial), logged at every step, no checkpoints."""
    return TrainingArguments(
        output_dir=str(output_dir),
        max_steps=max_steps,
        per_device_train_batch_size=8,
        per_device_eval_batch_size=10,
        eval_strategy="steps",
        eval_steps=2,
        save_strategy="no",
        logging_steps=1,
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        remove_unused_columns=False,
        seed=0,
        **settings,
    )


def training_recipe_trainer(
    output_dir: Path,
    callbacks: list,
    max_steps: int,
    lr: float,
    model: HyperSetForImageClassification | None = None,
    **settings: object,
) -> RecipeTrainer:
    """A RecipeTrainer training `model` (default: the wide-weight Hyper-SET, `depth_model`) on its 24 examples
    with SGD at a constant `lr`, evaluated every 2 steps; unless `settings` say otherwise, with the accuracy at
    depths `DEPTHS` and the stand-in decoding metrics (`MaskedImages`); `metric_for_best_model` and
    `skip_memory_metrics` go to its TrainingArguments."""
    model = depth_model().train() if model is None else model
    optimizer = torch.optim.SGD(model.parameters(), lr=lr)
    schedule = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda step: 1.0)
    arguments = {
        k: settings.pop(k) for k in ("metric_for_best_model", "skip_memory_metrics") if k in settings
    }
    args = training_arguments(output_dir, max_steps, **arguments)
    data = examples(model)
    settings = {"depth_evaluation": (TASK, DEPTHS), "masked_images": MaskedImages(), **settings}
    return RecipeTrainer(
        model=model,
        args=args,
        train_dataset=data,
        eval_dataset=data,
        compute_metrics=TrainerMetrics(TASK),
        preprocess_logits_for_metrics=argmax_logits,
        optimizers=(optimizer, schedule),
        callbacks=callbacks,
        training_loss=SimpleNamespace(active=False),
        run_args=None,
        schedule=None,
        **settings,
    )


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


class WeightsSeen:
    """Which weights each pass of an evaluation during training scores: at every evaluation forward (Trainer's
    pass, and the depth pass, the forwards given `num_iterations`), decoding call (a `masked_images` stand-in)
    and training forward after the first step, whether the model holds the EMA's averaged parameters, the live
    ones (`LiveWeights`' copy after the last optimizer step), or neither."""

    def __init__(self, model: torch.nn.Module, ema: EMACallback) -> None:
        self.model, self.ema, self.live, self.step = model, ema, None, 0
        self.seen: list[tuple[int, str, str]] = []  # (step, pass, weights)
        forward = model.forward

        @functools.wraps(forward)  # its signature: Trainer passes what forward takes
        def recording_forward(*args: object, **kwargs: object) -> object:
            if not model.training:
                self.record("depths" if "num_iterations" in kwargs else "trainer")
            elif self.live is not None:  # a training step after the first
                self.record("training")
            return forward(*args, **kwargs)

        model.forward = recording_forward

    def record(self, evaluation_pass: str) -> None:
        now = list(self.model.parameters())
        averaged = all(map(torch.equal, now, self.ema.ema.averaged.module.parameters()))
        live = all(map(torch.equal, now, self.live))
        # after the first step the average is that step's weights (equal to the live ones)
        weights = {(True, False): "averaged", (False, True): "live", (True, True): "both"}.get(
            (averaged, live), "neither"
        )
        self.seen.append((self.step, evaluation_pass, weights))

    def __call__(self, model: object, split: str, stop: object = None) -> dict[str, float]:
        self.record("decoding")
        return dict(RECONSTRUCTION)


class LiveWeights(TrainerCallback):
    """Registered before the EMA: a copy of the live weights right after each optimizer step."""

    def __init__(self, seen: WeightsSeen) -> None:
        self.seen = seen

    def on_step_end(
        self, args: object, state: object, control: object, model: object = None, **_: object
    ) -> None:
        self.seen.step = state.global_step
        self.seen.live = [p.detach().clone() for p in model.parameters()]


def test_every_pass_of_an_evaluation_during_training_scores_the_ema_weights(tmp_path: Path) -> None:
    """With an EMA (`ema`), Trainer's pass, the decoding and the accuracy at each depth of an evaluation during
    training all score the averaged weights; the depth T pass then repeats Trainer's accuracy. Between the
    evaluations the model trains on its live weights (the forwards of the training steps see them)."""
    model = depth_model().train()
    depth = model.config.num_iterations  # the depth Trainer's own pass runs at
    ema = EMACallback(0.99, swap_for_evaluation=False)
    seen = WeightsSeen(model, ema)
    # a large step against the labels of the wide weights: the live weights move away from their average
    trainer = training_recipe_trainer(
        tmp_path,
        [LiveWeights(seen), ema],
        max_steps=4,
        lr=0.5,
        model=model,
        depth_evaluation=(TASK, [depth]),
        masked_images=seen,
        ema=ema,
    )
    trainer.train()
    passes = sorted({(step, evaluation_pass) for step, evaluation_pass, _ in seen.seen})
    expected = [(s, p) for s in (2, 4) for p in ("decoding", "depths", "trainer")]
    expected += [(s, "training") for s in (1, 2, 3)]
    assert passes == sorted(expected), seen.seen
    # the evaluated steps' live weights differ from their average (else the test could not tell them apart)
    wrong = [e for e in seen.seen if e[2] not in (("live", "both") if e[1] == "training" else ("averaged",))]
    assert not wrong, (
        f"(step, pass, weights): evaluations must see the averaged weights, training the live: {wrong}"
    )
    # accuracies over 24 examples of the same weights, same data: equal
    main = {e["step"]: e["eval_accuracy"] for e in trainer.state.log_history if "eval_accuracy" in e}
    key = f"eval_accuracy_iterations_{depth}"
    at_depth = {e["step"]: e[key] for e in trainer.state.log_history if key in e}
    assert main == at_depth and sorted(main) == [2, 4], f"eval_accuracy {main}; {key} {at_depth}"


def test_an_ema_that_swaps_itself_is_refused(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="swap_for_evaluation=False"):
        recipe_trainer(tmp_path, ema=EMACallback(0.9))


class ReportedMetrics(TrainerCallback):
    """The metrics of every `on_evaluate` call."""

    def __init__(self) -> None:
        self.calls: list[dict] = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.calls.append(dict(metrics))


def relabelled(data: Dataset, model: HyperSetForImageClassification, depth: int) -> Dataset:
    """`data`'s images labelled with `model`'s predictions at `depth`: accuracy 1 there."""
    pixels = data[:]["pixel_values"]
    labels = predictions(model, pixels, depth)
    return Dataset.from_dict({"pixel_values": pixels.tolist(), "labels": labels.tolist()}).with_format(
        "torch"
    )


def depth_accuracies(model: HyperSetForImageClassification, data: Dataset, prefix: str) -> dict[str, float]:
    rows = data[:]
    return {
        f"{prefix}_accuracy_iterations_{t}": (predictions(model, rows["pixel_values"], t) == rows["labels"])
        .double()
        .mean()
        .item()
        for t in DEPTHS
    }


def test_a_dict_of_eval_datasets_is_evaluated_per_name_as_trainer_does(tmp_path: Path) -> None:
    """`eval_dataset={"a": ..., "b": ...}` (Trainer's multiple evaluation datasets): each named dataset is
    evaluated with the prefix `eval_<name>`, the accuracy at each depth of its own examples included, logged and
    reported to callbacks (`on_evaluate`) once per name with that evaluation's metrics; the decoding, which reads
    the run's own split, once under `eval`. A dict given to `evaluate` works the same way."""
    masked_images, reported = MaskedImages(), ReportedMetrics()
    trainer = recipe_trainer(
        tmp_path, depth_evaluation=(TASK, DEPTHS), masked_images=masked_images, callbacks=[reported]
    )
    # b: the first 12 images labelled at the shallow depth, so the two datasets' depth accuracies differ
    a = trainer.eval_dataset
    b = relabelled(a.select(range(12)), trainer.model, DEPTHS[0])
    trainer.eval_dataset = {"a": a, "b": b}
    expected = {
        **depth_accuracies(trainer.model, a, "eval_a"),
        **depth_accuracies(trainer.model, b, "eval_b"),
    }
    assert expected["eval_a_accuracy_iterations_1"] != expected["eval_b_accuracy_iterations_1"], expected

    metrics = trainer.evaluate()
    # accuracies over 24 and 12 examples: multiples of 1/24, the same counts both ways
    assert {k: metrics.get(k) for k in expected} == pytest.approx(expected, abs=1e-9), metrics
    assert {"eval_a_loss", "eval_a_accuracy", "eval_b_loss", "eval_b_accuracy", "eval_psnr"} <= metrics.keys()
    unprefixed = sorted(
        k for k in metrics if k.startswith("eval_") and not k.startswith(("eval_a_", "eval_b_"))
    )
    assert unprefixed == ["eval_psnr"], unprefixed
    assert [split for _, split in masked_images.calls] == ["validation"], masked_images.calls
    # one on_evaluate per named evaluation with all of its metrics, then the decoding's
    names = [sorted({k.split("_")[1] for k in call if k.startswith("eval_")}) for call in reported.calls]
    assert names == [["a"], ["b"], ["psnr"]], [sorted(call) for call in reported.calls]
    for call in reported.calls:
        different = {k: (v, metrics.get(k)) for k, v in call.items() if metrics.get(k) != v}
        assert not different, f"on_evaluate's metrics (reported, returned) differ: {different}"
    for key in expected:
        assert key in reported.calls[0 if "_a_" in key else 1], (key, reported.calls)
    # every metric logged once, with the value returned
    logged = [
        (k, v) for entry in trainer.state.log_history for k, v in entry.items() if k.startswith("eval_")
    ]
    assert sorted(k for k, _ in logged) == sorted(k for k in metrics if k.startswith("eval_")), logged
    assert all(metrics[k] == v for k, v in logged), logged

    # a dict given to `evaluate`, as the test split: no depth rows (the validation split's), the decoding's once
    metrics = trainer.evaluate({"c": b}, metric_key_prefix="test")
    assert "test_c_accuracy" in metrics and metrics["test_psnr"] == RECONSTRUCTION["psnr"], metrics
    assert not [k for k in metrics if "_iterations_" in k], metrics
    assert [split for _, split in masked_images.calls] == ["validation", "test"], masked_images.calls


# Runs in a fresh process (transformers' module cache in a temporary folder): loads each exported folder with
# `trust_remote_code=True` before the package is imported (once imported, its registered classes win over a folder's
# code), so the model is the folder's own code, then imports the package and records what its predicate and the
# depths the training loops evaluate make of that model.
REMOTE_DEPTH = r"""
import json, sys
import transformers
models = {
    model_type: transformers.AutoModelForImageClassification.from_pretrained(path, trust_remote_code=True)
    for model_type, path in json.loads(sys.argv[1]).items()
}
imported_before = sorted(name for name in sys.modules if name.split(".")[0] == "energyformers")
from energyformers.modeling.modeling_hyperset import RecurrentDepthMixin
from energyformers.training.evaluation import default_eval_depths, eval_depths, has_recurrent_depth
result = {"imported_before": imported_before}
for model_type, model in models.items():
    backbone = model.base_model
    trained = getattr(model.config, "num_iterations", None)
    result[model_type] = {
        "module": type(backbone).__module__,
        "subclass_of_the_package_mixin": isinstance(backbone, RecurrentDepthMixin),
        "has_recurrent_depth": [has_recurrent_depth(x) for x in (model, backbone, type(backbone))],
        "eval_depths": eval_depths(model, None),
        "default_depths": None if trained is None else default_eval_depths(trained),
    }
print(json.dumps(result))
"""


def test_evaluate_returns_the_epoch_as_trainers_own_does(tmp_path: Path) -> None:
    """Trainer's `evaluate` returns, and reports to `on_evaluate`, the dict it logged, to which `log` added the
    training state's `epoch`: RecipeTrainer's, joining the decoding and depth passes' metrics, too, during training,
    after it, and for each dataset of a dict."""
    reported = ReportedMetrics()
    trainer = training_recipe_trainer(tmp_path, [reported], max_steps=4, lr=0.5)
    # the premise, on the same model and data: Trainer's own, untrained (its state's epoch is 0 until it trains)
    plain = Trainer(
        model=trainer.model,
        args=trainer.args,
        eval_dataset=trainer.eval_dataset,
        compute_metrics=TrainerMetrics(TASK),
        preprocess_logits_for_metrics=argmax_logits,
    )
    returned = plain.evaluate()
    assert returned.get("epoch") == plain.state.epoch == 0, (returned, plain.state.epoch)
    assert "eval_psnr" not in returned, returned

    trainer.train()
    logged = {entry["step"]: entry["epoch"] for entry in trainer.state.log_history if "eval_loss" in entry}
    assert sorted(logged) == [2, 4] and len(reported.calls) == 2, (logged, reported.calls)
    every_pass = {"eval_loss", "eval_psnr", f"eval_accuracy_iterations_{DEPTHS[0]}"}
    for step, metrics in zip((2, 4), reported.calls, strict=True):
        assert every_pass <= metrics.keys() and metrics.get("epoch") == logged[step], (step, metrics, logged)
    epoch = trainer.state.epoch
    assert logged[2] < 1 < epoch, (logged, epoch)  # 3 steps an epoch: the two evaluations' epochs differ
    for prefix in ("eval", "test"):
        returned = trainer.evaluate(metric_key_prefix=prefix)
        assert f"{prefix}_psnr" in returned and returned.get("epoch") == epoch, (prefix, returned)
        assert reported.calls[-1] == returned, (reported.calls[-1], returned)
    trainer.eval_dataset = {"a": trainer.eval_dataset, "b": trainer.eval_dataset.select(range(12))}
    returned = trainer.evaluate()
    named = {f"eval_a_accuracy_iterations_{DEPTHS[0]}", "eval_b_loss", "eval_psnr"}
    assert named <= returned.keys() and returned.get("epoch") == epoch, returned
    assert [call.get("epoch") for call in reported.calls[-3:]] == [epoch] * 3, reported.calls[-3:]


def test_memory_metrics_are_returned_but_not_logged_as_trainers_own_are(tmp_path: Path) -> None:
    """With `skip_memory_metrics=False`, Trainer's `evaluate` adds its `eval_mem_*` deltas to the dict it returns
    after logging it: they are returned, not logged. RecipeTrainer holds its logs back past the extra passes; the
    held log must not pick them up meanwhile."""
    trainer = training_recipe_trainer(tmp_path, [], max_steps=2, lr=0.5, skip_memory_metrics=False)
    returned = trainer.evaluate()
    memory = sorted(k for k in returned if k.startswith("eval_mem_"))
    assert memory, f"no eval_mem_* in the returned metrics: {sorted(returned)}"
    logged = [sorted(k for k in entry if k.startswith("eval_mem_")) for entry in trainer.state.log_history]
    assert logged and not any(logged), f"memory metrics logged: {logged}"


def test_a_model_loaded_with_remote_code_is_judged_by_its_recurrent_depth(tmp_path: Path) -> None:
    """A model loaded with `trust_remote_code=True` from an exported folder runs the folder's own modeling code,
    whose depth mixin is not the package's class: `has_recurrent_depth` (used by `eval_depths` and the training
    setup) still finds Hyper-SET's depth, and none in iMixer's."""
    import json
    import os
    import subprocess
    import sys

    from test_export import build_model_dir

    from energyformers.training.export import export_model_dir

    kinds = {"hyperset": True, "imixer": False}
    folders = {}
    for model_type in kinds:
        source = build_model_dir(
            tmp_path / f"{model_type}-src", model_type, "AutoModelForImageClassification", "image"
        )
        folders[model_type] = str(export_model_dir(source, tmp_path / model_type))
    env = {
        **os.environ,
        "HF_HUB_OFFLINE": "1",
        "HF_MODULES_CACHE": str(tmp_path / "hf_modules"),
        "OMP_NUM_THREADS": "1",
    }
    done = subprocess.run(
        [sys.executable, "-c", REMOTE_DEPTH, json.dumps(folders)],
        cwd=tmp_path,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-4000:]
    result = json.loads(done.stdout.strip().splitlines()[-1])
    assert result["imported_before"] == [], result["imported_before"]
    for model_type, recurrent in kinds.items():
        seen = result[model_type]
        # the premise: the folder's own classes, not the package's
        assert seen["module"].startswith("transformers_modules"), (model_type, seen)
        assert not seen["subclass_of_the_package_mixin"], (model_type, seen)
        assert seen["has_recurrent_depth"] == [recurrent] * 3, (model_type, seen)
        expected = seen["default_depths"] if recurrent else []
        assert seen["eval_depths"] == expected and (expected or not recurrent), (model_type, seen)
