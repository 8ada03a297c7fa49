"""The training commands' argument checks (`training/arguments.py`): answered in one line with status 2 before torch
is imported, as every sub-command does (`cli.run_command`): choices of `--lr_scheduler_type`, argparse's own errors
with the sub-command's name, unknown flags, and a non-empty `--output_dir`.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from test_cli_errors import ENV, RUN_CASES
from transformers import get_scheduler
from transformers.trainer_utils import SchedulerType

from energyformers.training import train
from energyformers.training.arguments import LR_SCHEDULER_TYPES


def test_every_scheduler_choice_is_one_transformers_builds_from_the_step_counts() -> None:
    """Each `--lr_scheduler_type` choice is a `SchedulerType` that `get_scheduler` builds and steps with only the
    warm-up and step counts (`optimization.make_scheduler`'s call)."""
    known = {member.value for member in SchedulerType}
    assert set(LR_SCHEDULER_TYPES) <= known, sorted(set(LR_SCHEDULER_TYPES) - known)
    for name in LR_SCHEDULER_TYPES:
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(2))], lr=1e-3)
        scheduler = get_scheduler(name, optimizer=optimizer, num_warmup_steps=1, num_training_steps=4)
        for _ in range(4):
            optimizer.step()
            scheduler.step()


def cases(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Case name -> (energyformers argv, the whole expected error line)."""
    full = tmp / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    out = str(tmp / "out")
    schedulers = ", ".join(repr(name) for name in LR_SCHEDULER_TYPES)
    return {
        "scheduler typo": (
            ["train", "--lr_scheduler_type", "cosinus", "--output_dir", out, "--max_steps", "1"],
            f"energyformers train: error: --lr_scheduler_type: invalid choice: 'cosinus' (choose from {schedulers})",
        ),
        "scheduler typo, accelerate": (
            ["train-accelerate", "--lr_scheduler_type", "cosinus", "--output_dir", out],
            "energyformers train-accelerate: error: --lr_scheduler_type: invalid choice: 'cosinus' "
            f"(choose from {schedulers})",
        ),
        "unknown recipe": (
            ["train", "--recipe", "foo", "--output_dir", out],
            "energyformers train: error: --recipe: invalid choice: 'foo' (choose from 'deit', ",
        ),
        "unknown flag": (
            ["train", "--bogus", "1", "--output_dir", out],
            "energyformers train: error: unrecognized arguments: --bogus 1",
        ),
        "unknown flag, accelerate": (
            ["train-accelerate", "--output_dir", out, "--bogus"],
            "energyformers train-accelerate: error: unrecognized arguments: --bogus",
        ),
        "bad float": (
            ["train", "--lr", "fast", "--output_dir", out],
            "energyformers train: error: --learning_rate: invalid float value: 'fast'",
        ),
        "no output dir": (
            ["train-accelerate"],
            "energyformers train-accelerate: error: the following arguments are required: --output_dir",
        ),
        "output dir not empty": (
            ["train", "--output_dir", str(full), "--max_steps", "1"],
            f"energyformers train: error: --output_dir {full}: the folder exists and is not empty; pass "
            "--overwrite_output_dir to replace it or choose another",
        ),
    }


def test_argument_errors_are_one_line_with_status_2_before_torch(tmp_path: Path) -> None:
    table = cases(tmp_path)
    record = tmp_path / "results.json"
    program = [sys.executable, "-c", RUN_CASES, str(record), json.dumps([argv for argv, _ in table.values()])]
    done = subprocess.run(program, capture_output=True, text=True, env=ENV, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    for (name, (_, expected)), result in zip(table.items(), json.loads(record.read_text()), strict=True):
        lines = [line for line in result["err"].splitlines() if line.strip()]
        assert result["code"] == 2, (name, result)
        assert len(lines) == 1 and lines[0].startswith(expected), (name, expected, result["err"])
        assert result["heavy"] == [], (name, result["heavy"])  # torch and the models are not imported yet
    assert (tmp_path / "full" / "keep.txt").read_text() == "mine"
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.checkpoints").exists()


def test_overwrite_output_dir_lets_parsing_pass(tmp_path: Path) -> None:
    full = tmp_path / "full"
    full.mkdir()
    (full / "keep.txt").write_text("mine")
    args = train.parse(["--output_dir", str(full), "--overwrite_output_dir"])
    assert args.run.overwrite_output_dir and args.run.lr_scheduler_type == "cosine"
    with pytest.raises(SystemExit) as stop:  # argparse's --help still prints and exits 0
        train.parse(["--help"])
    assert stop.value.code == 0
