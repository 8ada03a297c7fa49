"""`energyformers.training.callbacks.ContinueIterationDraws` with a plain `transformers.Trainer` (a user's own
fine-tuning script, not the CLI): resuming a random-depth Hyper-SET run from a checkpoint gives exactly the weights
of the uninterrupted run, because the depth-draw counter continues where the checkpoint's step left it."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from datasets import Dataset
from fixtures import hyperset_config
from safetensors.torch import load_file
from transformers import Trainer, TrainingArguments

from energyformers import HyperSetForImageClassification
from energyformers.training.callbacks import ContinueIterationDraws

# 20 examples in batches of 4 with 2 accumulation steps: 5 batches an epoch, 3 optimizer steps (the last one
# takes the leftover batch), so checkpoint-4 sits inside the second epoch and its count of forwards (5 + 2 = 7)
# is not global_step × accumulation steps.
EXAMPLES, BATCH, ACCUMULATION, MAX_STEPS, RESUME_AT = 20, 4, 2, 7, 4


def digits_like() -> Dataset:
    generator = torch.Generator().manual_seed(0)
    pixels = torch.randn(EXAMPLES, 1, 8, 8, generator=generator)
    labels = torch.randint(0, 4, (EXAMPLES,), generator=generator)
    return Dataset.from_dict({"pixel_values": pixels.tolist(), "labels": labels.tolist()}).with_format(
        "torch"
    )


def random_depth_model() -> HyperSetForImageClassification:
    torch.manual_seed(0)
    config = hyperset_config("image", iteration_sampling="uniform", min_iterations=1, max_iterations=5)
    return HyperSetForImageClassification(config)


def trainer(output_dir: Path, callbacks: list) -> Trainer:
    args = TrainingArguments(
        output_dir=str(output_dir),
        per_device_train_batch_size=BATCH,
        gradient_accumulation_steps=ACCUMULATION,
        max_steps=MAX_STEPS,
        learning_rate=1e-2,
        save_strategy="steps",
        save_steps=2,
        eval_strategy="no",
        logging_strategy="no",
        report_to="none",
        disable_tqdm=True,
        use_cpu=True,
        seed=0,
        dataloader_num_workers=0,
    )
    return Trainer(model=random_depth_model(), args=args, train_dataset=digits_like(), callbacks=callbacks)


def final_weights(run: Trainer) -> dict[str, torch.Tensor]:
    return {name: p.detach().clone() for name, p in run.model.named_parameters()}


def max_difference(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    return max((a[k] - b[k]).abs().max().item() for k in a)


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, torch.Tensor]]:
    """(output folder with every checkpoint, final weights) of the run that is never stopped. It runs with the
    suite's thread count, as the resumed runs do: the same count splits the reductions the same way (bit-identical)."""
    out = tmp_path_factory.mktemp("callbacks") / "whole"
    run = trainer(out, [ContinueIterationDraws()])
    run.train()
    assert run.state.global_step == MAX_STEPS
    draws = run.model.base_model.iteration_draws
    assert draws == 2 * EXAMPLES // BATCH + ACCUMULATION, f"iteration_draws {draws} after {MAX_STEPS} steps"
    return out, final_weights(run)


def test_resume_with_the_callback_equals_the_uninterrupted_run(uninterrupted, tmp_path: Path) -> None:
    whole, expected = uninterrupted
    checkpoint = whole / f"checkpoint-{RESUME_AT}"
    assert (checkpoint / "model.safetensors").is_file(), sorted(p.name for p in whole.iterdir())
    draws_at_start = []

    # what the counter was set to, before any forward of the resumed run
    class Record(ContinueIterationDraws):
        def on_train_begin(self, args, state, control, model=None, **kwargs):
            super().on_train_begin(args, state, control, model=model, **kwargs)
            draws_at_start.append(model.base_model.iteration_draws)

    run = trainer(tmp_path / "resumed", [Record()])
    run.train(resume_from_checkpoint=str(checkpoint))
    # 4 steps = the first epoch's 5 batches (3 steps) + 2 batches of the second epoch
    assert draws_at_start == [EXAMPLES // BATCH + ACCUMULATION], (
        f"counter set to {draws_at_start}, expected [7]"
    )
    got = final_weights(run)
    # the same float32 operations in the same order on the same inputs and depths: bit-identical
    difference = max_difference(got, expected)
    assert difference == 0.0, f"resumed vs uninterrupted: max |Δw| = {difference:.3g}, expected 0"


def test_without_the_callback_the_resumed_run_draws_other_depths(uninterrupted, tmp_path: Path) -> None:
    """What the callback is for: a plain resume restarts the counter at 0 and ends on other weights (this also
    shows the comparison above can see the difference)."""
    whole, expected = uninterrupted
    run = trainer(tmp_path / "plain", [])
    run.train(resume_from_checkpoint=str(whole / f"checkpoint-{RESUME_AT}"))
    difference = max_difference(final_weights(run), expected)
    assert difference > 0.0, (
        "a plain resume matched the uninterrupted run: the depths do not vary in this setup"
    )


def test_the_callback_needs_what_trainer_passes() -> None:
    with pytest.raises(TypeError, match="needs the model and the train_dataloader"):
        ContinueIterationDraws().on_train_begin(None, None, None, model=None, train_dataloader=None)


def test_saved_folder_keeps_random_depth_training(uninterrupted) -> None:
    """The note docs/hyperset.md makes: a saved folder's config keeps `iteration_sampling`, so fine-tuning it with
    a plain Trainer samples depths (and needs the callback to resume) unless the config is changed."""
    whole, _ = uninterrupted
    weights = load_file(str(whole / f"checkpoint-{MAX_STEPS}" / "model.safetensors"))
    model = HyperSetForImageClassification.from_pretrained(str(whole / f"checkpoint-{MAX_STEPS}"))
    assert model.config.iteration_sampling == "uniform" and weights, model.config.iteration_sampling
    fixed = HyperSetForImageClassification.from_pretrained(
        str(whole / f"checkpoint-{MAX_STEPS}"), iteration_sampling="fixed"
    )
    assert fixed.config.iteration_sampling == "fixed"
