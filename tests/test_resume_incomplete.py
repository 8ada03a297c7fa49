"""`--resume` continues only from a checkpoint that holds everything the run resumes from, and falls back to the one
before it otherwise: one whose completion marker a killed process left half-written, or, with `--ema_decay`, one
without the EMA file. `energyformers train` writes the EMA file before Trainer's marker (`trainer_state.json`), so a
process killed right after the marker leaves a checkpoint that resumes exactly; `train-accelerate` writes its marker
(`loop_state.json`) through a temporary file, so one killed while writing it leaves no marker at all.

A "kill" is placed at one exact point of the real code path: `os._exit` in a subprocess right after Trainer's marker
is written, or an exception that no handler catches while `loop_state.json` is written. Checkpoints a kill would
leave are otherwise made from the uninterrupted run's (kept with `--keep_checkpoints`) in a fresh work folder, as
`tests/test_resume_exact.py` does. 32 training digits in batches of 8 (4 steps an epoch), 6 steps, a checkpoint
every 2."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import assert_same_saved_weights, cli_config

from energyformers.training import accelerate_loop, train

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
RUN = [
    "--dataset", "digits", "--config", *cli_config("hyperset"), "--max_train_samples", "32",
    "--max_eval_samples", "16", "--max_test_samples", "16", "--batch_size", "8", "--num_predictions", "0",
    "--num_threads", "1", "--disable_tqdm", "--max_steps", "6", "--eval_strategy", "no", "--save_strategy", "steps",
    "--save_steps", "2", "--save_total_limit", "3", "--ema_decay", "0.5",
]  # fmt: skip
EMA_FILE = "ema_model.safetensors"

# `energyformers train` killed (SIGKILL-like, `os._exit`: no handler runs) the moment Trainer has written
# checkpoint-<argv[1]>/trainer_state.json, the checkpoint's completion marker.
KILLED_AFTER_THE_MARKER = """
import os, sys
from transformers.trainer_callback import TrainerState
from energyformers.training import train

save_to_json, step = TrainerState.save_to_json, int(sys.argv[1])

def killed_after(self, json_path):
    save_to_json(self, json_path)
    if self.global_step == step:
        os._exit(137)

TrainerState.save_to_json = killed_after
sys.exit(train.main(sys.argv[2:]))
"""


@pytest.fixture(scope="module")
def straight(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The uninterrupted run's output folder; its checkpoints (2, 4, 6) are kept beside it."""
    out = tmp_path_factory.mktemp("straight") / "run"
    assert train.main([*RUN, "--output_dir", str(out), "--keep_checkpoints"]) == 0
    return out


def work_folder_of(straight: Path, out: Path, *checkpoints: str) -> Path:
    """A fresh work folder for `out` holding copies of the uninterrupted run's `checkpoints` and its record."""
    source, work = straight.with_name("run.checkpoints"), out.with_name(out.name + ".checkpoints")
    work.mkdir(parents=True)
    for name in checkpoints:
        shutil.copytree(source / name, work / name)
    for record in source.glob("*.json"):  # what the run built, which `--resume` compares with this one
        shutil.copy(record, work)
    return work


def resumed_from(out: Path) -> str:
    return Path(json.loads((out / "metrics.json").read_text())["recipe"]["resumed_from"]).name


def test_a_kill_after_the_marker_leaves_a_checkpoint_with_its_ema(tmp_path: Path, straight: Path) -> None:
    """Killed the moment checkpoint-4's trainer_state.json is written: the EMA file is already there, and the
    resume from checkpoint-4 ends on the uninterrupted run's weights (with the EMA file written after the marker,
    the average restarted from the live weights)."""
    out = tmp_path / "run"
    script = tmp_path / "kill.py"
    script.write_text(KILLED_AFTER_THE_MARKER)
    proc = subprocess.run(
        [sys.executable, str(script), "4", *RUN, "--output_dir", str(out)],
        capture_output=True, text=True, env=ENV, timeout=600,
    )  # fmt: skip
    assert proc.returncode == 137, (proc.returncode, proc.stderr[-3000:])
    checkpoint = out.with_name("run.checkpoints") / "checkpoint-4"
    written = sorted(p.name for p in checkpoint.iterdir())
    assert "trainer_state.json" in written and EMA_FILE in written, written
    assert train.main([*RUN, "--output_dir", str(out), "--resume"]) == 0
    assert resumed_from(out) == "checkpoint-4"
    assert_same_saved_weights(straight, out)


def test_a_checkpoint_without_its_ema_file_is_passed_over(
    tmp_path: Path, straight: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint-4 with its marker but without the EMA file (what a run of the EMA file written after the marker
    leaves when killed in between) is skipped with a warning naming it: the run resumes from checkpoint-2 and
    ends on the uninterrupted run's weights. With no other checkpoint, `--resume` refuses (status 2)."""
    out = tmp_path / "run"
    work = work_folder_of(straight, out, "checkpoint-2", "checkpoint-4")
    (work / "checkpoint-4" / EMA_FILE).unlink()
    assert train.main([*RUN, "--output_dir", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert resumed_from(out) == "checkpoint-2"
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert any(str(work / "checkpoint-4") in line and EMA_FILE in line for line in warnings), err[-3000:]
    assert_same_saved_weights(straight, out)

    alone = tmp_path / "alone"
    work = work_folder_of(straight, alone, "checkpoint-4")
    (work / "checkpoint-4" / EMA_FILE).unlink()
    assert train.main([*RUN, "--output_dir", str(alone), "--resume"]) == 2
    err = capsys.readouterr().err
    refusal = f"{work / 'checkpoint-4'}: no {EMA_FILE}"
    assert refusal in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert not alone.exists()


def test_a_half_written_marker_falls_back_to_the_checkpoint_before(
    tmp_path: Path, straight: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """checkpoint-4's trainer_state.json cut to half its length (a process killed while Trainer wrote it): the run
    resumes from checkpoint-2 with a one-line warning naming the file, and ends on the uninterrupted run's weights.
    With no other checkpoint, `--resume` refuses (status 2), naming the file."""
    out = tmp_path / "run"
    work = work_folder_of(straight, out, "checkpoint-2", "checkpoint-4")
    marker = work / "checkpoint-4" / "trainer_state.json"
    marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    assert train.main([*RUN, "--output_dir", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert resumed_from(out) == "checkpoint-2"
    warnings = [line for line in err.splitlines() if line.startswith("warning:")]
    assert any(f"{marker}: not valid JSON" in line for line in warnings), err[-3000:]
    assert_same_saved_weights(straight, out)

    alone = tmp_path / "alone"
    work = work_folder_of(straight, alone, "checkpoint-4")
    marker = work / "checkpoint-4" / "trainer_state.json"
    marker.write_bytes(marker.read_bytes()[: marker.stat().st_size // 2])
    assert train.main([*RUN, "--output_dir", str(alone), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{marker}: not valid JSON" in err and len(err.strip().splitlines()) == 1, err[-3000:]


class Killed(BaseException):
    """What no handler of the command catches: the process ends here, as under SIGKILL."""


def test_a_kill_while_the_accelerate_loop_writes_its_marker_leaves_none(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`train-accelerate` killed halfway through writing step_4's loop_state.json: step_4 has no marker (an
    incomplete checkpoint) rather than a truncated one, and the run's complete checkpoints end at step_2."""
    write_text = Path.write_text
    cut = []

    def killed_halfway(self: Path, data: str, *args, **kwargs):
        if self.parent.name == "step_4" and self.name.startswith(accelerate_loop.STATE_FILE):
            write_text(self, data[: len(data) // 2], *args, **kwargs)
            cut.append(self.name)
            raise Killed
        return write_text(self, data, *args, **kwargs)

    monkeypatch.setattr(Path, "write_text", killed_halfway)
    out = tmp_path / "run"
    with pytest.raises(Killed):
        accelerate_loop.main([*RUN, "--output_dir", str(out)])
    assert cut, "loop_state.json was not written with Path.write_text: place the kill in its writer"
    work = out.with_name("run.checkpoints")
    assert not (work / "step_4" / accelerate_loop.STATE_FILE).exists(), sorted(os.listdir(work / "step_4"))
    assert [p.name for p in accelerate_loop.accelerate_checkpoints(work)] == ["step_2"]


@pytest.mark.parametrize(
    ("main", "checkpoint"),
    [(train.main, "checkpoint-2"), (accelerate_loop.main, "step_2")],
    ids=["train", "accelerate"],
)
def test_ema_decay_added_on_resume_is_refused(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], main, checkpoint: str
) -> None:
    """`--resume` with `--ema_decay` added to a run that had none: its checkpoints hold no EMA to continue the
    average from, and both loops refuse in one line naming the checkpoint (status 2) before any work, rather than
    start the average at the resumed step."""
    without_ema = [*RUN[: RUN.index("--ema_decay")], "--max_steps", "2"]
    first = tmp_path / "first"
    assert main([*without_ema, "--output_dir", str(first), "--keep_checkpoints"]) == 0
    out = tmp_path / "run"
    work = first.with_name("first.checkpoints").rename(out.with_name("run.checkpoints"))
    before = sorted(str(p.relative_to(work)) for p in work.rglob("*"))
    capsys.readouterr()
    assert main([*without_ema, "--ema_decay", "0.5", "--output_dir", str(out), "--resume"]) == 2
    err = capsys.readouterr().err
    assert f"{work / checkpoint}: no {EMA_FILE}" in err and len(err.strip().splitlines()) == 1, err[-3000:]
    assert not out.exists()
    assert sorted(str(p.relative_to(work)) for p in work.rglob("*")) == before
