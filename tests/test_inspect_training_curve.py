"""`energyformers inspect` on a run folder's log history: the training curve (loss with the chance level, eval
accuracy per logged iteration count), its numbers in inspect.json, and the plateau exit step
(`evaluation.plateau_exit_step`) on constructed loss curves and on a real run."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pytest
from PIL import Image

from energyformers import HyperSetConfig, HyperSetForTokenClassification
from energyformers.training import accelerate_loop, cli, data
from energyformers.training.evaluation import (
    PLATEAU_MARGIN,
    chance_loss,
    plateau_exit_step,
    training_losses,
)

LN9 = math.log(9)
FIGURE = "training_curve_by_iterations.png"


def plateau_history(exit_at: int, dip_at: int | None = None, steps: int = 100, every: int = 10) -> list[dict]:
    """A Trainer-style log history of a 9-class run: the loss falls from 3.0 to the chance plateau ln 9, wobbles
    there by ±0.02 (seeded), optionally dips once below the exit threshold at `dip_at` (one log only), and from
    `exit_at` on falls linearly well below it; eval entries every 20 steps with a separate per-iteration entry
    (as `Trainer.evaluate` logs them), the last one repeated as the final evaluation."""
    rng = np.random.default_rng(0)
    history: list[dict] = []
    for step in range(every, steps * every + 1, every):
        if step < 4 * every:
            loss = 3.0 - (3.0 - LN9) * step / (4 * every)
        elif step < exit_at:
            loss = LN9 + float(rng.uniform(-0.02, 0.02))
        else:
            loss = LN9 - 0.06 - 0.004 * (step - exit_at)
        if step == dip_at:
            loss = LN9 - 0.08
        history.append(
            {"loss": loss, "grad_norm": 0.3, "learning_rate": 1e-3, "epoch": step / 50, "step": step}
        )
        if step % 20 == 0:
            accuracy = 0.11 if step < exit_at else min(0.9, 0.11 + 0.002 * (step - exit_at))
            history.append({"eval_loss": loss, "eval_blank_cell_accuracy": accuracy, "step": step})
            history.append(
                {f"eval_blank_cell_accuracy_iterations_{t}": accuracy * t / (t + 1) for t in (2, 4, 8)}
                | {"epoch": step / 50, "step": step}
            )
    history.append({"train_runtime": 1.0, "train_loss": 2.0, "step": steps * every})
    history.extend(history[-3:-1])  # Trainer's final evaluation repeats the last one at the same step
    return history


# ------------------------------------------------------------------------------ the definition


def test_plateau_exit_is_the_first_of_two_successive_logs_below_chance_minus_the_margin() -> None:
    history = plateau_history(exit_at=520, dip_at=300)
    # the dip at 300 is one log only; the first log below ln 9 − 0.05 that the next log confirms is 520
    assert plateau_exit_step(history, 9) == 520, training_losses(history)[25:35]
    # with one log enough, the dip counts
    assert plateau_exit_step(history, 9, consecutive=1) == 300
    # a run that never leaves the plateau
    assert plateau_exit_step(plateau_history(exit_at=10**6), 9) is None
    # a run below the threshold from its first log exits there
    assert plateau_exit_step([{"step": 5, "loss": 0.1}, {"step": 10, "loss": 0.09}], 9) == 5
    # a trailing single log below the threshold at the very end of a run counts (nothing left to confirm it)
    assert plateau_exit_step([{"step": 5, "loss": 2.2}, {"step": 10, "loss": 1.0}], 9) == 10


def test_plateau_exit_reads_the_accelerate_loops_history_and_ignores_eval_entries() -> None:
    # the accelerate loop logs {"step", "loss"} and merges eval metrics into entries without "loss"
    history = [{"step": s, "loss": LN9} for s in (10, 20, 30)] + [
        {"step": 30, "eval_loss": 0.0, "eval_blank_cell_accuracy_iterations_4": 0.5},
        {"step": 40, "loss": LN9 - PLATEAU_MARGIN - 1e-3},
        {"step": 50, "loss": LN9 - PLATEAU_MARGIN - 1e-3},
    ]
    assert plateau_exit_step(history, 9) == 40
    # exactly at the threshold is not below it
    assert plateau_exit_step([{"step": 1, "loss": LN9 - PLATEAU_MARGIN}] * 2, 9) is None
    # exact: math.log(9) is the double nearest ln 9, written here to its 17 digits
    assert chance_loss(9) == 2.1972245773362196 == LN9


@pytest.mark.parametrize(
    "kwargs, named",
    [
        ({"num_classes": 1}, "num_classes must be an integer >= 2; got 1"),
        ({"num_classes": 9, "margin": -0.1}, "margin must be a finite number >= 0 (nats); got -0.1"),
        ({"num_classes": 9, "consecutive": 0}, "consecutive must be an integer >= 1; got 0"),
    ],
)
def test_plateau_exit_refuses_bad_arguments(kwargs: dict, named: str) -> None:
    with pytest.raises(ValueError) as error:
        plateau_exit_step([], **kwargs)
    assert named in str(error.value)


# ------------------------------------------------------------------------------ inspect


def inspect(*argv: object) -> int:
    return cli.main(["inspect", *map(str, argv)])


def assert_png(path: Path) -> None:
    with Image.open(path) as image:
        assert image.format == "PNG" and image.width >= 800 and image.height >= 300, image.size
        assert len(np.unique(np.asarray(image.convert("L")))) > 20  # drawn on, not blank


def sudoku_folder(folder: Path, history: list[dict], source: str = "metrics.json") -> Path:
    """A tiny Sudoku Hyper-SET (T = 4) saved with `history` as its run record."""
    config = HyperSetConfig(input_type="sequence", vocab_size=10, max_position_embeddings=81, hidden_size=16,
                            num_attention_heads=2, intermediate_size=8, num_iterations=4, num_labels=9)  # fmt: skip
    HyperSetForTokenClassification(config).save_pretrained(folder)
    record = {"log_history": history}
    if source == "metrics.json":
        record["task"] = "token-classification"
    (folder / source).write_text(json.dumps(record))
    return folder


@pytest.mark.parametrize("source", ["metrics.json", "trainer_state.json"])
def test_inspect_draws_the_training_curve_of_a_run_folder_and_reports_its_plateau_exit(
    tmp_path: Path, source: str
) -> None:
    history = plateau_history(exit_at=520, dip_at=300)
    folder = sudoku_folder(tmp_path / "run", history, source)
    out = tmp_path / "inspect"
    assert inspect(folder, "--output_dir", out) == 0  # no INPUTS, no --dataset: the log history is enough
    report = json.loads((out / "inspect.json").read_text())
    assert report["figures"] == [FIGURE], report["figures"]
    assert_png(out / FIGURE)
    curve = report["training_curve"]
    assert curve["source"] == source and curve["num_classes"] == 9 and curve["trained_iterations"] == 4
    # exact: math.log(9) through JSON, which writes a float's shortest round-tripping repr
    assert curve["chance_loss"] == LN9 and curve["metric"] == "blank_cell_accuracy"
    assert curve["plateau_exit"]["step"] == 520, curve["plateau_exit"]
    assert curve["logging_window_steps"] == 10
    losses = training_losses(history)
    assert curve["loss"]["steps"] == [s for s, _ in losses]
    # stored as Python's round(value, 6) of the logged float, through JSON (exact round trip): the same call here
    assert curve["loss"]["values"] == [round(v, 6) for _, v in losses]
    assert sorted(curve["eval_by_iterations"], key=int) == ["2", "4", "8"]
    for t in (2, 4, 8):
        logged = {e["step"]: e[f"eval_blank_cell_accuracy_iterations_{t}"] for e in history if "epoch" in e and
                  f"eval_blank_cell_accuracy_iterations_{t}" in e}  # fmt: skip
        entry = curve["eval_by_iterations"][str(t)]
        assert entry["steps"] == sorted(logged) == list(range(20, 1001, 20)), entry[
            "steps"
        ]  # the repeat: once
        assert entry["values"] == [round(logged[s], 6) for s in entry["steps"]]  # as the losses above


def test_inspect_on_a_folder_without_per_iteration_accuracy_still_asks_for_inputs(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    history = [
        entry
        for entry in plateau_history(exit_at=520)
        if "eval_blank_cell_accuracy_iterations_4" not in entry
    ]
    folder = sudoku_folder(tmp_path / "run", history)
    assert inspect(folder, "--output_dir", tmp_path / "out") == 2
    assert "give INPUTS (image paths or texts) or a labelled --dataset" in capsys.readouterr().err
    assert not (tmp_path / "out").exists()


def test_inspect_draws_the_curve_of_a_real_run_with_eval_iterations(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(data, "SUDOKU_SIZES", {"train": 40, "validation": 8, "test": 8})
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path / "cache"))
    run = tmp_path / "sudoku"
    argv = [
        "--dataset", "sudoku", "--config", "hidden_size=16", "num_attention_heads=2", "intermediate_size=16",
        "num_iterations=2", "--max_steps", "4", "--batch_size", "8", "--eval_strategy", "steps", "--eval_steps",
        "2", "--logging_steps", "1", "--eval_iterations", "1", "2", "3", "--num_predictions", "0",
        "--num_threads", "1", "--output_dir", str(run), "--disable_tqdm",
    ]  # fmt: skip
    assert accelerate_loop.main(argv) == 0
    out = tmp_path / "inspect"
    assert (
        inspect(run, "--dataset", "sudoku", "--max_samples", "8", "--output_dir", out, "--num_threads", "1")
        == 0
    )
    report = json.loads((out / "inspect.json").read_text())
    assert FIGURE in report["figures"] and "accuracy_vs_iterations.png" in report["figures"]
    assert_png(out / FIGURE)
    curve = report["training_curve"]
    history = json.loads((run / "metrics.json").read_text())["log_history"]
    assert curve["loss"]["steps"] == [1, 2, 3, 4] and curve["chance_loss"] == LN9  # exact: as above
    for t in (1, 2, 3):
        key = f"eval_blank_cell_accuracy_iterations_{t}"
        logged = {e["step"]: e[key] for e in history if key in e}
        entry = curve["eval_by_iterations"][str(t)]
        assert entry["steps"] == [2, 4] == sorted(logged), (t, entry, logged)
        # Python's round(value, 6) of the logged float, through JSON: exact, as above
        assert entry["values"] == [round(logged[2], 6), round(logged[4], 6)], (t, entry, logged)
    assert curve["plateau_exit"]["step"] == plateau_exit_step(history, 9)
