"""`energyformers.training.callbacks.ContinueIterationDraws` with a plain `transformers.Trainer` (a user's own
fine-tuning script, not the CLI): resuming a random-depth Hyper-SET run from a checkpoint gives exactly the weights
of the uninterrupted run, because the depth-draw counter continues where the checkpoint's step left it. And a
user's callbacks with `energyformers train`'s `RecipeTrainer`: `on_evaluate` once per evaluation, with every pass's
metrics."""

from __future__ import annotations

import functools
import inspect
import os
import signal
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
from datasets import Dataset
from fixtures import hyperset_config
from safetensors.torch import load_file
from test_recipe_trainer import DEPTHS, training_recipe_trainer
from transformers import (
    EarlyStoppingCallback,
    PrinterCallback,
    ProgressCallback,
    Trainer,
    TrainerCallback,
    TrainingArguments,
)
from transformers.trainer_callback import CallbackHandler

from energyformers import HyperSetForImageClassification
from energyformers.training.callbacks import ContinueIterationDraws
from energyformers.training.interrupt import EvaluationStopped, StopRequest
from energyformers.training.trainer import RecipeTrainer

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


# --------------------------------------------------------------------------- on_evaluate in energyformers train
# `RecipeTrainer` (the Trainer of `energyformers train`) runs passes after Trainer's own in each evaluation: the
# accuracy at each depth and the masked-image-modelling decoding (here `test_recipe_trainer.MaskedImages`, a
# stand-in returning fixed reconstruction metrics). A user's callback hears of each evaluation once, after all of
# them, with every metric; of an evaluation a stop cut short, never.


class ReportedEvaluations(TrainerCallback):
    """(step, metrics) of every `on_evaluate` call."""

    def __init__(self) -> None:
        self.calls: list[tuple[int, dict]] = []

    def on_evaluate(self, args, state, control, metrics=None, **kwargs):
        self.calls.append((state.global_step, dict(metrics)))


EVERY_PASS = {"eval_loss", "eval_accuracy", "eval_psnr", *(f"eval_accuracy_iterations_{t}" for t in DEPTHS)}


def sigterm_in_depth_pass(trainer: RecipeTrainer, ready: Callable[[], bool]) -> list:
    """Sends a real SIGTERM once, at the first forward of a depth pass (a call with `num_iterations`) in the
    step-4 evaluation for which `ready()` holds; the returned list gets an entry when it is sent."""
    model, signalled = trainer.model, []
    forward = model.forward

    @functools.wraps(forward)  # its signature: Trainer passes what forward takes
    def signalling_forward(*args: object, **kwargs: object) -> object:
        if "num_iterations" in kwargs and trainer.state.global_step == 4 and not signalled and ready():
            signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        return forward(*args, **kwargs)

    model.forward = signalling_forward
    return signalled


def test_on_evaluate_gets_every_pass_once_per_evaluation(tmp_path: Path) -> None:
    # what RecipeTrainer relies on to hold Trainer's call back and make it later: the handler's public method
    # with these leading parameters (checked on transformers 5.17.0 and 5.24.0, whose Trainer.evaluate calls it
    # once, positionally, as `on_evaluate(args, state, control, output.metrics)`)
    parameters = list(inspect.signature(CallbackHandler.on_evaluate).parameters)
    assert parameters[:5] == ["self", "args", "state", "control", "metrics"], parameters
    reported = ReportedEvaluations()
    trainer = training_recipe_trainer(tmp_path, [reported], max_steps=4, lr=0.5)
    trainer.train()
    assert [step for step, _ in reported.calls] == [2, 4], reported.calls
    for step, metrics in reported.calls:
        assert EVERY_PASS <= metrics.keys(), (step, sorted(metrics))
        # every metric logged at that evaluation, with the value logged
        logged = {
            key: value
            for entry in trainer.state.log_history
            if entry["step"] == step
            for key, value in entry.items()
            if key.startswith("eval_")
        }
        assert logged == {k: metrics[k] for k in logged} and EVERY_PASS <= logged.keys(), (
            step,
            logged,
            metrics,
        )
    # an evaluation of the caller's, after training: the dict `evaluate` returns, in the one call
    returned = trainer.evaluate()
    assert len(reported.calls) == 3 and reported.calls[-1][1] == returned, (reported.calls[-1], returned)
    returned = trainer.evaluate(metric_key_prefix="test")
    assert len(reported.calls) == 4 and reported.calls[-1][1] == returned, (reported.calls[-1], returned)
    assert "test_psnr" in returned, returned


def test_early_stopping_and_the_best_metric_follow_a_depth_metric(tmp_path: Path) -> None:
    """`metric_for_best_model` naming the accuracy at a depth: with a learning rate of 0 it never improves, so
    `EarlyStoppingCallback` (patience 1) stops at the second evaluation, and Trainer's best metric is the first's."""
    key = f"eval_accuracy_iterations_{DEPTHS[0]}"
    reported = ReportedEvaluations()
    trainer = training_recipe_trainer(
        tmp_path,
        [reported, EarlyStoppingCallback(early_stopping_patience=1)],
        max_steps=8,
        lr=0.0,
        metric_for_best_model=key.removeprefix("eval_"),
    )
    trainer.train()
    assert trainer.state.global_step == 4, (
        f"stopped at step {trainer.state.global_step}; expected 4 (evaluations at 2 and 4 both "
        f"{key}={[m.get(key) for _, m in reported.calls]})"
    )
    first = reported.calls[0][1][key]
    assert trainer.state.best_metric == first, (trainer.state.best_metric, reported.calls)


def test_an_evaluation_a_stop_cuts_short_calls_no_on_evaluate(tmp_path: Path) -> None:
    """SIGTERM at the first forward of the depth pass of the step-4 evaluation (after Trainer's own pass): the run
    stops at step 4, and callbacks heard only of the step-2 evaluation."""
    reported = ReportedEvaluations()
    stop = StopRequest()
    trainer = training_recipe_trainer(tmp_path, [reported], max_steps=6, lr=0.5, stop=stop)
    signalled = sigterm_in_depth_pass(trainer, lambda: True)
    with stop.installed(announce=False):
        trainer.train()
    assert signalled and stop.signum == signal.SIGTERM, (signalled, stop.signum)
    assert trainer.state.global_step == 4, f"stopped at step {trainer.state.global_step}; expected 4"
    assert [step for step, _ in reported.calls] == [2], reported.calls
    assert EVERY_PASS <= reported.calls[0][1].keys(), reported.calls


class BarsShown(TrainerCallback):
    """Shows Trainer's progress bars on `trainer` (`ProgressCallback`, as without `disable_tqdm`: these runs
    disable them) and watches them, added after it: `counts` gets (bar, its count, its total) at every
    prediction step, after the bar's update."""

    def __init__(self, trainer: RecipeTrainer) -> None:
        trainer.remove_callback(PrinterCallback)
        self.progress = ProgressCallback()
        trainer.add_callback(self.progress)
        trainer.add_callback(self)
        self.counts: list[tuple[object, int, int]] = []

    def on_prediction_step(self, args, state, control, **kwargs):
        bar = self.progress.prediction_bar
        self.counts.append((bar, bar.n, bar.total))

    def assert_closed(self) -> None:
        """Every bar shown was closed (tqdm's `close` disables it), and none is left in the callback."""
        assert self.counts, "no prediction step was shown"
        bars = list({id(bar): bar for bar, _, _ in self.counts}.values())
        assert all(bar.disable for bar in bars) and self.progress.prediction_bar is None, (
            [str(bar) for bar in bars],
            self.progress.prediction_bar,
        )


def sigterm_in_trainers_pass(trainer: RecipeTrainer, step: int) -> list:
    """Sends a real SIGTERM once, at the second forward of Trainer's own pass (in eval mode, without
    `num_iterations`) in the evaluation at `step`: the pass stops after that batch, its bar shown at 1; the
    returned list gets an entry when it is sent."""
    model, signalled, forwards = trainer.model, [], []
    forward = model.forward

    @functools.wraps(forward)
    def signalling_forward(*args: object, **kwargs: object) -> object:
        if not model.training and "num_iterations" not in kwargs and trainer.state.global_step == step:
            forwards.append(None)
            if len(forwards) == 2 and not signalled:
                signalled.append(os.kill(os.getpid(), signal.SIGTERM))
        return forward(*args, **kwargs)

    model.forward = signalling_forward
    return signalled


@pytest.mark.parametrize("cut", ["trainer's pass", "depth pass"])
def test_an_evaluation_a_stop_cuts_short_closes_its_progress_bar(tmp_path: Path, cut: str) -> None:
    """SIGTERM in the step-4 evaluation, in Trainer's own pass (its bar at 1 of 3) or in the depth pass after
    it: the bar is closed, as `on_evaluate` closes it after a complete evaluation, not left for the next line
    printed to write over."""
    stop = StopRequest()
    trainer = training_recipe_trainer(tmp_path, [], max_steps=6, lr=0.5, stop=stop)
    shown = BarsShown(trainer)
    if cut == "depth pass":
        signalled = sigterm_in_depth_pass(trainer, lambda: True)
    else:
        signalled = sigterm_in_trainers_pass(trainer, 4)
    with stop.installed(announce=False):
        trainer.train()
    assert signalled and trainer.state.global_step == 4, (signalled, trainer.state.global_step)
    if cut == "trainer's pass":
        assert shown.counts[-1][1:] == (1, 3), shown.counts  # the premise: the bar of a pass cut short
    shown.assert_closed()


def test_a_stop_in_an_evaluation_outside_training_closes_its_progress_bar(tmp_path: Path) -> None:
    """SIGTERM in Trainer's own pass of an evaluation outside training, as the train command's final ones
    (`evaluate` raises `EvaluationStopped` to its caller): the bar is closed too."""
    stop = StopRequest()
    trainer = training_recipe_trainer(tmp_path, [], max_steps=0, lr=0.5, stop=stop)
    shown = BarsShown(trainer)
    signalled = sigterm_in_trainers_pass(trainer, 0)
    with stop.installed(announce=False), pytest.raises(EvaluationStopped):
        trainer.evaluate()
    assert signalled and shown.counts[-1][1:] == (1, 3), (signalled, shown.counts)
    shown.assert_closed()


# --------------------------------------------------------------------------- a dict of evaluation datasets
# Trainer's `eval_dataset={"a": ..., "b": ...}`: each named dataset evaluated in turn as `eval_<name>` (its own
# depth pass included), logged and reported once per name; a stop during any of them ends the whole evaluation.


def named_datasets(trainer: RecipeTrainer) -> dict[str, Dataset]:
    """The trainer's 24 examples as "a", and its first 12 as "b"."""
    data = trainer.eval_dataset
    return {"a": data, "b": data.select(range(12))}


def test_with_a_dict_the_best_metric_and_early_stopping_follow_one_named_depth_metric(tmp_path: Path) -> None:
    """`metric_for_best_model` naming the accuracy at a depth of dataset "a" (as Trainer requires with a dict):
    with a learning rate of 0 it never improves, so `EarlyStoppingCallback` (patience 1) stops at the second
    evaluation, and Trainer's best metric is the first's (the evaluation of "b", which lacks it, is skipped by the
    callback, as with Trainer)."""
    key = f"eval_a_accuracy_iterations_{DEPTHS[0]}"
    reported = ReportedEvaluations()
    trainer = training_recipe_trainer(
        tmp_path,
        [reported, EarlyStoppingCallback(early_stopping_patience=1)],
        max_steps=8,
        lr=0.0,
        metric_for_best_model=key,
    )
    trainer.eval_dataset = named_datasets(trainer)
    trainer.train()
    assert [step for step, _ in reported.calls] == [2, 2, 2, 4, 4, 4], reported.calls
    assert trainer.state.global_step == 4, (
        f"stopped at step {trainer.state.global_step}; expected 4 (evaluations at 2 and 4 both "
        f"{key}={[m.get(key) for _, m in reported.calls]})"
    )
    first = reported.calls[0][1][key]
    assert trainer.state.best_metric == first, (trainer.state.best_metric, reported.calls)
    for prefix, (_, metrics) in zip(("eval_a_", "eval_b_"), reported.calls[:2], strict=True):
        assert {f"{prefix}{k.removeprefix('eval_')}" for k in EVERY_PASS - {"eval_psnr"}} <= metrics.keys(), (
            prefix,
            sorted(metrics),
        )
    assert "eval_psnr" in reported.calls[2][1], reported.calls[2]


def test_each_named_evaluation_has_its_own_progress_bar(tmp_path: Path) -> None:
    """With a dict of datasets each named evaluation's pass shows its own bar, closed when the pass ends, as
    Trainer's `on_evaluate` closes it: "b"'s 2 batches do not count on in "a"'s bar of 3."""
    trainer = training_recipe_trainer(tmp_path, [], max_steps=0, lr=0.5)
    trainer.eval_dataset = named_datasets(trainer)
    shown = BarsShown(trainer)
    assert "eval_b_loss" in trainer.evaluate()
    bars = list({id(bar): bar for bar, _, _ in shown.counts})
    counts = [(bars.index(id(bar)), n, total) for bar, n, total in shown.counts]
    assert counts == [(0, 1, 3), (0, 2, 3), (0, 3, 3), (1, 1, 2), (1, 2, 2)], counts
    shown.assert_closed()


def test_a_stop_in_the_second_named_evaluation_ends_the_whole_evaluation(tmp_path: Path) -> None:
    """SIGTERM at the first forward of dataset "b"'s depth pass in the step-4 evaluation ("a" is complete by
    then): the run stops at step 4, nothing of that evaluation is logged ("a"'s neither), and callbacks heard only
    of the step-2 evaluations."""
    reported = ReportedEvaluations()
    stop = StopRequest()
    trainer = training_recipe_trainer(tmp_path, [reported], max_steps=6, lr=0.5, stop=stop)
    trainer.eval_dataset = named_datasets(trainer)
    signalled = sigterm_in_depth_pass(
        trainer, lambda: "eval_b_loss" in [k for logs, _, _ in trainer.held_logs or [] for k in logs]
    )
    with stop.installed(announce=False):
        trainer.train()
    assert signalled and stop.signum == signal.SIGTERM, (signalled, stop.signum)
    assert trainer.state.global_step == 4, f"stopped at step {trainer.state.global_step}; expected 4"
    assert [step for step, _ in reported.calls] == [2, 2, 2], reported.calls
    evaluated = sorted(
        {entry["step"] for entry in trainer.state.log_history if any(k.startswith("eval_") for k in entry)}
    )
    assert evaluated == [2], trainer.state.log_history
