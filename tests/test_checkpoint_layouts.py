"""Each training loop resumes only its own checkpoints (`train`: Trainer's `checkpoint-N/`, `train-accelerate`:
`step_N/`). A work folder `<output_dir>.checkpoints/` holding the other loop's is refused as a usage error before
any work, with or without --resume, naming the command that continues it; its files stay (a finished run would
otherwise remove the whole work folder, the other loop's checkpoints with it)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

import pytest

from energyformers.training import cli

# A tiny, quick run: without the refusal, the plain command would train it to the end and remove the work folder.
ARGV = [
    "--dataset",
    "digits",
    "--model",
    "hyperset",
    "--config",
    "hidden_size=16",
    "num_attention_heads=2",
    "--max_steps",
    "2",
    "--num_threads",
    "1",
]
# Each loop's checkpoint folders and the file it writes last into one (what makes a checkpoint complete).
LAYOUTS = {
    "train": ("checkpoint-{}", "trainer_state.json"),
    "train-accelerate": ("step_{}", "loop_state.json"),
}


def interrupted(work: Path, command: str) -> dict[str, str]:
    """`command`'s checkpoints at steps 15 and 20 in `work` (minimal files: the refusal reads none of them);
    returns every file under `work` with its text."""
    folder, last = LAYOUTS[command]
    for step in (15, 20):
        checkpoint = work / folder.format(step)
        checkpoint.mkdir(parents=True)
        (checkpoint / "model.safetensors").write_text("weights")
        (checkpoint / last).write_text(json.dumps({"global_step": step, "step": step}))
    (work / "run_arguments.json").write_text(json.dumps({"built": {"model": "hyperset"}}))
    return tree(work)


def tree(work: Path) -> dict[str, str]:
    return {str(p.relative_to(work)): p.read_text() for p in sorted(work.rglob("*")) if p.is_file()}


@pytest.mark.parametrize("resume", [[], ["--resume"]], ids=["plain", "resume"])
@pytest.mark.parametrize(("command", "other"), [("train", "train-accelerate"), ("train-accelerate", "train")])
def test_a_loop_refuses_the_other_loops_checkpoints_and_keeps_them(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str, other: str, resume: list[str]
) -> None:
    out, work = tmp_path / "intr", tmp_path / "intr.checkpoints"
    before = interrupted(work, other)
    argv = [*ARGV, "--output_dir", str(out), *resume]
    status = cli.main([command, *argv])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2, (
        f"energyformers {command} over {other}'s checkpoints: exit status {status}; stderr: {err}"
    )
    folder = LAYOUTS[other][0]
    assert err == [
        f"energyformers {command}: error: {work} holds checkpoints of an interrupted `energyformers {other}` run "
        f"({folder.format(15)}, {folder.format(20)}); only `energyformers {other}` can continue it, or delete "
        "the folder",
        f"  continue with: {shlex.join(['energyformers', other, *ARGV, '--output_dir', str(out), '--resume'])}",
    ], err
    assert tree(work) == before, "the other loop's checkpoints changed"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["intr.checkpoints"], "a refused run wrote files"


def test_the_command_to_continue_the_other_loops_run_shows_no_token(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """The refusal's `continue with:` line has the token's value redacted (`arguments.redacted_argv`), as the run
    records its command."""
    from energyformers.training.arguments import REDACTED

    out, work = tmp_path / "intr", tmp_path / "intr.checkpoints"
    interrupted(work, "train-accelerate")
    secret = "hf_SECRET123"
    status = cli.main(["train", *ARGV, "--output_dir", str(out), "--hub_token", secret])
    err = capsys.readouterr().err
    shown = ["energyformers", "train-accelerate", *ARGV, "--output_dir", str(out), "--hub_token", REDACTED]
    assert status == 2 and err.splitlines()[-1] == f"  continue with: {shlex.join([*shown, '--resume'])}", err
    assert secret not in err, err


@pytest.mark.parametrize("command", ["train", "train-accelerate"])
def test_incomplete_folders_of_the_other_loop_are_not_checkpoints(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], command: str
) -> None:
    """A folder the other loop was killed while writing (no last file) holds nothing to continue: the run's own
    `--resume` finds no checkpoint, as for its own incomplete folders."""
    work = tmp_path / "intr.checkpoints"
    other = next(name for name in LAYOUTS if name != command)
    (work / LAYOUTS[other][0].format(5)).mkdir(parents=True)
    status = cli.main([command, *ARGV, "--output_dir", str(tmp_path / "intr"), "--resume"])
    err = capsys.readouterr().err.strip()
    assert (
        status == 2
        and err
        == f"energyformers {command}: error: --resume: no checkpoint in {work}; run without "
        "--resume to start training"
    ), (status, err)
