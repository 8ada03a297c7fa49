"""A `--sudoku_augmentation` run stopped and resumed equals the uninterrupted one, in both training loops, with or
without DataLoader workers: the symmetries of a batch follow from the seed and the batch's index, which a resumed run
continues from its step and each worker numbers its batches by (`sudoku.SudokuAugmentation`, `batches.NumberedBatches`),
as it continues the data order and the RNG states. The run resumed with 2 workers (`--dataloader_num_workers`) starts
from the checkpoint of the run without workers and must end on its weights: the same symmetries batch for batch.
A resumed Trainer run also writes the uninterrupted run's log history: the summary row's `train_loss` is the whole
run's mean (as `metrics.json["train"]`), not Trainer's mean of the steps since the resume, and the rows read back from
the checkpoint keep the key order of the rows logged live.

The "stop" is a copy of one checkpoint of the uninterrupted run (kept with `--keep_checkpoints`) into a fresh run's
work folder: what a run killed right after that save leaves (`test_train_cli.py` stops one by a real SIGTERM).
40 training puzzles in batches of 8 (5 steps an epoch), 8 steps: the resume at step 6 is one step into the second
epoch, so the symmetry stream continues past a whole epoch."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from fixtures import assert_same_saved_weights

from energyformers.training import accelerate_loop, data, train

TINY = ["hidden_size=16", "num_attention_heads=2", "intermediate_size=16", "num_iterations=2"]
COMMON = [
    "--model", "hyperset", "--dataset", "sudoku", "--config", *TINY, "--sudoku_augmentation",
    "--max_steps", "8", "--batch_size", "8", "--logging_steps", "1", "--eval_strategy", "steps", "--eval_steps", "4",
    "--save_total_limit", "4", "--num_predictions", "0", "--num_threads", "1", "--warmup_ratio", "0",
    "--disable_tqdm",
]  # fmt: skip
RESUMED_AT = 6
WORKERS = ["--dataloader_num_workers", "2"]
# wall-clock fields of a log row, which differ from run to run
TIMES = ("runtime", "per_second")


@pytest.fixture(scope="module")
def cache(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("cache")


@pytest.fixture(autouse=True)
def small_generated(cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dataset sudoku` with 40/8/8 puzzles, generated once for the module (the real one takes ~30 s)."""
    monkeypatch.setattr(data, "SUDOKU_SIZES", {"train": 40, "validation": 8, "test": 8})
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(cache))


def straight_and_resumed(tmp_path: Path, loop, argv: list[str], checkpoint: str) -> tuple[Path, Path]:
    """The uninterrupted run of `argv` and the run resumed from its `checkpoint` in a fresh folder."""
    straight = tmp_path / "straight"
    assert loop.main([*argv, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    return straight, resumed(tmp_path, loop, argv, checkpoint, "resumed")


def resumed(tmp_path: Path, loop, argv: list[str], checkpoint: str, name: str) -> Path:
    """The run of `argv` resumed in a fresh folder `name` from the uninterrupted run's `checkpoint`."""
    out = tmp_path / name
    work = tmp_path / f"{name}.checkpoints"
    work.mkdir()
    shutil.copytree(tmp_path / "straight.checkpoints" / checkpoint, work / checkpoint)
    # what the run built, which `--resume` compares with this one
    for record in (tmp_path / "straight.checkpoints").glob("*.json"):
        shutil.copy(record, work)
    assert loop.main([*argv, "--output_dir", str(out), "--resume"]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["resumed_from"].endswith(checkpoint), metrics["recipe"]
    return out


def test_trainer_run_resumed_with_sudoku_augmentation_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    argv = [*COMMON, "--save_strategy", "steps", "--save_steps", "3"]
    straight, again = straight_and_resumed(tmp_path, train, argv, f"checkpoint-{RESUMED_AT}")
    assert_same_saved_weights(straight, again)

    a, b = (json.loads((run / "metrics.json").read_text()) for run in (straight, again))
    whole_run = b["train"]["train_loss"]
    (summary,) = [entry for entry in b["log_history"] if "train_loss" in entry]
    assert summary["train_loss"] == whole_run, (summary, whole_run)
    # the whole-run mean sums the logged windows in another order than Trainer's running sum: a few float32
    # roundings of a loss of order 1 apart
    uninterrupted = a["train"]["train_loss"]
    tolerance = 8 * torch.finfo(torch.float32).eps * abs(uninterrupted)
    assert abs(whole_run - uninterrupted) <= tolerance, (whole_run, uninterrupted, tolerance)
    # the same rows with the same keys in the same order; the same values but for wall-clock times and that mean
    assert [list(entry) for entry in b["log_history"]] == [list(entry) for entry in a["log_history"]], (
        a["log_history"],
        b["log_history"],
    )
    for row, (x, y) in enumerate(zip(a["log_history"], b["log_history"], strict=True)):
        differ = {
            key: (x[key], y[key])
            for key in x
            if x[key] != y[key] and key != "train_loss" and not key.endswith(TIMES)
        }
        assert not differ, f"log_history[{row}] (step {x.get('step')}): straight vs resumed {differ}"

    # the resumed epoch's 3 batches from 2 DataLoader workers: the symmetries of the run without workers
    checkpoint = f"checkpoint-{RESUMED_AT}"
    assert_same_saved_weights(straight, resumed(tmp_path, train, [*argv, *WORKERS], checkpoint, "workers"))


def test_accelerate_run_resumed_with_sudoku_augmentation_equals_the_uninterrupted_run(tmp_path: Path) -> None:
    argv = [*COMMON, "--checkpointing_steps", "3"]
    straight, again = straight_and_resumed(tmp_path, accelerate_loop, argv, f"step_{RESUMED_AT}")
    assert_same_saved_weights(straight, again)
    # the resumed epoch's 3 batches from 2 DataLoader workers: the symmetries of the run without workers
    with_workers = resumed(tmp_path, accelerate_loop, [*argv, *WORKERS], f"step_{RESUMED_AT}", "workers")
    assert_same_saved_weights(straight, with_workers)


@pytest.mark.parametrize(
    ("loop", "save", "checkpoint"),
    [
        (train, ["--save_strategy", "steps", "--save_steps", "1"], "checkpoint-3"),
        (accelerate_loop, ["--checkpointing_steps", "1"], "step_4"),
    ],
    ids=["trainer-epoch-end", "accelerate-mid-epoch"],
)
def test_a_run_accumulating_gradients_at_random_depth_resumes_exactly(
    tmp_path: Path, loop, save: list[str], checkpoint: str
) -> None:
    """Two batches a step (5 an epoch: 3 steps, the last of one batch) and a depth drawn per forward: the batch
    index the symmetries and the depth draws continue from counts the leftover batch. Trainer resumes at the end of
    the first epoch, the Accelerate loop one step into the second."""
    depth = ["iteration_sampling=uniform", "min_iterations=1", "max_iterations=3"]
    argv = [*COMMON, "--gradient_accumulation_steps", "2", *save]
    argv[argv.index("--max_steps") + 1], argv[argv.index("--save_total_limit") + 1] = "7", "10"
    at = argv.index("--config") + 1 + len(TINY)
    argv[at:at] = depth  # one --config: every field of it
    straight, again = straight_and_resumed(tmp_path, loop, argv, checkpoint)
    assert_same_saved_weights(straight, again)
