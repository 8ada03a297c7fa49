"""`--report_to`, `--run_name`, `--logging_dir` in both training loops (`arguments.validate_trackers`).

A tiny digits run with `--report_to tensorboard` writes TensorBoard event files into the output folder, whose
scalars are the numbers the run records in metrics.json (the training loss at each logged step, the test accuracy);
the default (`none`) writes no tracker files. A tracker name neither loop's library knows, or one whose package is
missing here, is a usage error before anything runs. The event files are read back with tensorboardX's own record
framing and protobuf (`tensorboardX` has no reader; the `dev` extra installs it, as the lightest writer both
transformers' TensorBoardCallback and accelerate's TensorBoardTracker fall back to).
"""

from __future__ import annotations

import importlib.util
import json
import struct
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import pytest
from fixtures import TINY_DIGITS_RUN
from tensorboardX import event_file_writer
from tensorboardX.proto.event_pb2 import Event
from tensorboardX.record_writer import masked_crc32c
from transformers import TrainerCallback

from energyformers.training import accelerate_loop, train
from energyformers.training.arguments import (
    ACCELERATE_PROG,
    TRACKER_INSTALL,
    TRAINER_TRACKER_CHECKS,
    tracker_check,
    tracker_config,
    tracker_names,
)

TRAIN = "energyformers train"
LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}
# logged at every step, so that each of the 3 steps has a training loss to check
COMMON = [*TINY_DIGITS_RUN, "--logging_steps", "1"]


def event_scalars(folder: Path) -> dict[str, dict[int, float]]:
    """Every scalar in the TensorBoard event files under `folder`: tag -> {step: value}, each record's two CRCs
    checked (the TFRecord framing: length, its masked CRC, the Event bytes, their masked CRC)."""
    found: dict[str, dict[int, float]] = {}
    for path in sorted(folder.rglob("events.out.tfevents.*")):
        data, at = path.read_bytes(), 0
        while at < len(data):
            header = data[at : at + 8]
            (length,) = struct.unpack("<Q", header)
            assert struct.unpack("<I", data[at + 8 : at + 12])[0] == masked_crc32c(header), path
            record = data[at + 12 : at + 12 + length]
            assert struct.unpack("<I", data[at + 12 + length : at + 16 + length])[0] == masked_crc32c(
                record
            ), path
            at += 16 + length
            event = Event.FromString(record)
            for value in event.summary.value:
                if value.HasField("simple_value"):
                    found.setdefault(value.tag, {})[event.step] = value.simple_value
    return found


@pytest.fixture
def one_second(monkeypatch: pytest.MonkeyPatch) -> None:
    """tensorboardX's clock stopped: every event file a run opens is named in the same second (its names hold the
    second and the host only), as in a run whose training ends and final evaluation logs within one second."""
    monkeypatch.setattr(event_file_writer, "time", SimpleNamespace(time=lambda: 1_700_000_000.25))


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_tensorboard_gets_the_logged_training_loss_and_test_accuracy(loop, tmp_path, one_second):
    out = tmp_path / "tb-run"
    assert LOOPS[loop]([*COMMON, "--report_to", "tensorboard", "--output_dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    # each run in <logging_dir>/<run name>; unset, the output folder's name in <output_dir>/runs
    scalars = event_scalars(out / "runs" / "tb-run")
    logged = {entry["step"]: entry["loss"] for entry in metrics["log_history"] if "loss" in entry}
    assert sorted(logged) == [1, 2, 3], metrics["log_history"]
    # TensorBoard stores a scalar as float32: the recorded value rounded to float32 is what it holds, exactly
    expected = {step: float(np.float32(loss)) for step, loss in logged.items()}
    assert scalars.get("train/loss") == expected, (scalars.get("train/loss"), logged)
    # the final test evaluation too, under the name Trainer's callback gives it in both loops
    test_accuracy = float(np.float32(metrics["test"]["accuracy"]))
    assert scalars.get("test/accuracy") == {3: test_accuracy}, (scalars.get("test/accuracy"), test_accuracy)
    assert metrics["arguments"]["run"]["report_to"] == ["tensorboard"]
    assert not (tmp_path / "tb-run.checkpoints").exists()  # the files moved with the finished folder


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_no_tracker_files_by_default(loop, tmp_path):
    out = tmp_path / "plain"
    assert LOOPS[loop]([*COMMON, "--keep_checkpoints", "--output_dir", str(out)]) == 0
    written = [p for folder in (out, tmp_path / "plain.checkpoints") for p in folder.rglob("*")]
    assert written, "the run wrote nothing"
    trackers = [str(p) for p in written if p.name == "runs" or "tfevents" in p.name]
    assert trackers == [], trackers
    assert json.loads((out / "metrics.json").read_text())["arguments"]["run"]["report_to"] == ["none"]


class RunName(TrainerCallback):
    """The `run_name` of the TrainingArguments Trainer trains with (what its tracker callbacks name the run)."""

    def __init__(self) -> None:
        self.names: list[str | None] = []

    def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        self.names.append(args.run_name)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_logging_dir_and_run_name_place_the_files(loop, tmp_path):
    logs = tmp_path / "board"
    argv = [*COMMON, "--report_to", "tensorboard", "--run_name", "first"]
    argv += ["--logging_dir", str(logs), "--output_dir", str(tmp_path / "o")]
    seen = RunName()
    assert (train.main(argv, callbacks=[seen]) if loop == "train" else accelerate_loop.main(argv)) == 0
    assert set(event_scalars(logs / "first")) >= {"train/loss", "train/learning_rate", "eval/loss"}
    assert not (tmp_path / "o" / "runs").exists()
    assert seen.names == ([] if loop == "train-accelerate" else ["first"])


def _installed(name: str) -> bool:
    return importlib.util.find_spec(name) is not None


def usage_error_cases(tmp: Path) -> list[tuple[str, list[str], str]]:
    """(command, flags, the whole expected error line)."""
    assert not _installed("wandb") and not _installed("aim"), (
        "the not-installed cases need wandb and aim absent"
    )
    a_file = tmp / "a-file"
    a_file.write_text("mine")
    trainer_names = ", ".join(tracker_names(TRAIN))
    out = (tmp / "out").resolve()
    default_logs = (
        f"without --logging_dir the trackers' files go to {out / 'runs'} anyway (moved there with the model), or "
        "choose a folder outside it"
    )
    accelerate_names = ", ".join(tracker_names(ACCELERATE_PROG))
    return [
        (
            "train",
            ["--report_to", "nope"],
            f"{TRAIN}: error: --report_to nope: {TRAIN} reports to {trainer_names}, all (those installed) or none",
        ),
        (
            "train",
            ["--report_to", "aim"],
            f"{TRAIN}: error: --report_to aim: {TRAIN} reports to {trainer_names}, all (those installed) or none; "
            f"aim is a tracker of {ACCELERATE_PROG}",
        ),
        (
            "train-accelerate",
            ["--report_to", "tensorboard", "neptune"],
            f"{ACCELERATE_PROG}: error: --report_to neptune: {ACCELERATE_PROG} reports to {accelerate_names}, all "
            f"(those installed) or none; neptune is a tracker of {TRAIN}",
        ),
        (
            "train",
            ["--report_to", "wandb"],
            f"{TRAIN}: error: --report_to wandb: not available here "
            "(transformers.integrations.is_wandb_available() is false); pip install wandb",
        ),
        (
            "train-accelerate",
            ["--report_to", "tensorboard", "wandb"],
            f"{ACCELERATE_PROG}: error: --report_to wandb: not available here "
            "(accelerate.utils.is_wandb_available() is false); pip install wandb",
        ),
        (
            "train-accelerate",
            ["--report_to", "aim"],
            f"{ACCELERATE_PROG}: error: --report_to aim: not available here "
            "(accelerate.utils.is_aim_available() is false); pip install 'aim<4'",
        ),
        (
            "train",
            ["--report_to", "none", "tensorboard"],
            f"{TRAIN}: error: --report_to none tensorboard: 'all' and 'none' stand alone; name the trackers, or "
            "one of those",
        ),
        (
            "train-accelerate",
            ["--run_name", "x"],
            f"{ACCELERATE_PROG}: error: --run_name x: applies to the trackers, and --report_to is none; add "
            "--report_to NAME or drop it",
        ),
        (
            "train",
            ["--report_to", "tensorboard", "--logging_dir", str(a_file)],
            f"{TRAIN}: error: --logging_dir {a_file}: a file; expected a folder (new or existing)",
        ),
        # the folders the run replaces or removes at its end (`out`, the --output_dir of every case)
        (
            "train",
            ["--report_to", "tensorboard", "--logging_dir", str(tmp / "out" / "logs")],
            f"{TRAIN}: error: --logging_dir {tmp / 'out' / 'logs'}: inside --output_dir {out}, which the finished "
            f"model folder replaces; {default_logs}",
        ),
        (
            "train-accelerate",
            ["--report_to", "tensorboard", "--logging_dir", str(tmp / "out")],
            f"{ACCELERATE_PROG}: error: --logging_dir {tmp / 'out'}: inside --output_dir {out}, which the finished "
            f"model folder replaces; {default_logs}",
        ),
        (
            "train",
            ["--report_to", "tensorboard", "--logging_dir", str(tmp / "out.checkpoints" / "logs")],
            f"{TRAIN}: error: --logging_dir {tmp / 'out.checkpoints' / 'logs'}: inside the work folder {out}.checkpoints, "
            f"which a finished run removes (no --keep_checkpoints); {default_logs}",
        ),
    ]


def test_tracker_refusals_are_one_line_with_status_2_before_anything_runs(tmp_path, capsys):
    for command, flags, expected in usage_error_cases(tmp_path):
        out = tmp_path / "out"
        status = LOOPS[command](["--dataset", "digits", *flags, "--output_dir", str(out)])
        err = capsys.readouterr().err
        assert (status, err) == (2, expected + "\n"), (command, flags, status, err)
        assert not out.exists() and not (tmp_path / "out.checkpoints").exists(), (command, flags)


def test_a_logging_dir_in_the_kept_work_folder_or_beside_the_output_is_accepted(tmp_path):
    """Only the folders the run replaces or removes are refused: the work folder kept by --keep_checkpoints, or a
    sibling whose name starts like the output folder's, are not inside them."""
    for extra, logs in (
        ([], tmp_path / "out-logs"),
        (["--keep_checkpoints"], tmp_path / "out.checkpoints" / "l"),
    ):
        argv = [
            "--output_dir",
            str(tmp_path / "out"),
            "--report_to",
            "tensorboard",
            "--logging_dir",
            str(logs),
        ]
        for loop in (train, accelerate_loop):
            assert loop.parse([*argv, *extra]).run.logging_dir == str(logs)


@pytest.mark.parametrize("prog", [TRAIN, ACCELERATE_PROG])
def test_every_tracker_of_the_libraries_has_its_availability_check(prog):
    """Each name of the loop's library registry resolves to that library's own check (the table of transformers'
    differently named ones is complete), and the tables name no tracker neither library has."""
    names = tracker_names(prog)
    assert len(names) >= 8, names
    missing = [name for name in names if tracker_check(name, prog) is None]
    assert missing == [], missing
    everything = set(tracker_names(TRAIN)) | set(tracker_names(ACCELERATE_PROG))
    assert set(TRAINER_TRACKER_CHECKS) <= set(tracker_names(TRAIN))
    assert set(TRACKER_INSTALL) <= everything, sorted(set(TRACKER_INSTALL) - everything)


def test_the_tracker_config_is_flat_and_plain(tmp_path):
    args = train.parse(
        ["--report_to", "tensorboard", "--config", "hidden_size=32", "--output_dir", str(tmp_path)]
    )
    config: dict[str, Any] = tracker_config(args)
    assert all(isinstance(value, (bool, int, float, str)) for value in config.values()), config
    assert config["seed"] == 42 and config["dataset"] == "digits", config
    assert json.loads(config["config"]) == ["hidden_size=32"] and json.loads(config["report_to"]) == [
        "tensorboard"
    ]
    assert (
        "hub_token" not in config and "run_name" not in config
    )  # recorded() leaves the token out; unset left out


def test_the_docs_list_each_loops_trackers():
    """docs/training.md, "Logging to a tracker", lists each library's registry as installed."""
    text = " ".join((Path(__file__).parents[1] / "docs" / "training.md").read_text().split())
    for registry, prog in (("INTEGRATION_TO_CALLBACK", TRAIN), ("LOGGER_TYPE_TO_CLASS", ACCELERATE_PROG)):
        listed = f"{registry}`: {', '.join(tracker_names(prog))})"
        assert listed in text, f"docs/training.md should say {listed!r}"
