"""FSDP is refused by both training loops (`arguments.refuse_sharding`; docs/training.md, "Sharding with FSDP").

Asked for with TrainingArguments' flags (`--fsdp`, `--fsdp_config`) or by `accelerate launch --use_fsdp` (the
ACCELERATE_USE_FSDP variable it sets, which `Accelerator()` reads): one usage-error line, status 2, before torch is
imported and before anything is written. Without the refusal, one process trains unsharded as if FSDP had not been
asked for, and the 2-process launch ends in a traceback from each rank (accelerate's FSDP plugin wants a GPU).
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from fixtures import CLI_ENV, run_cli_cases, run_launcher

FSDP_VARIABLE = "ACCELERATE_USE_FSDP"  # accelerate's name, set by `accelerate launch --use_fsdp`
COMMANDS = ("train", "train-accelerate")
# argv after the command -> what the error line names (the flag and the value as given)
FLAG_CASES = {
    ("--fsdp",): "--fsdp: FSDP is not supported",
    ("--fsdp", "full_shard auto_wrap"): "--fsdp full_shard auto_wrap: FSDP is not supported",
    ("--fsdp=true",): "--fsdp true: FSDP is not supported",
    ("--fsdp_config", "fsdp.json"): "--fsdp_config fsdp.json: FSDP is not supported",
}
LAUNCH_ENV = {
    k: v for k, v in CLI_ENV.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE", FSDP_VARIABLE)
}


def assert_refused(result: dict, command: str, fragment: str, out: Path) -> None:
    lines = [line for line in result["err"].splitlines() if line.strip()]
    assert result["code"] == 2, result
    assert len(lines) == 1, result["err"]
    assert lines[0].startswith(f"energyformers {command}: error: {fragment}"), (lines[0], fragment)
    assert "Sharding with FSDP" in lines[0], lines[0]  # where the reason is
    assert result["heavy"] == [], f"imported {result['heavy']} before refusing"
    assert not out.exists() and not out.with_name(out.name + ".checkpoints").exists()


def test_the_fsdp_flags_are_refused_by_both_loops_before_any_work(tmp_path):
    out = tmp_path / "out"
    cases = [(command, argv, fragment) for command in COMMANDS for argv, fragment in FLAG_CASES.items()]
    argvs = [[command, *argv, "--output_dir", str(out)] for command, argv, _ in cases]
    env = {k: v for k, v in CLI_ENV.items() if k != FSDP_VARIABLE}
    for (command, _, fragment), result in zip(
        cases, run_cli_cases(argvs, cwd=tmp_path, env=env), strict=True
    ):
        assert_refused(result, command, fragment, out)


@pytest.mark.parametrize("value", ["true", "TRUE"])
def test_accelerates_fsdp_variable_is_refused_by_both_loops(tmp_path, value):
    """`accelerate launch --use_fsdp` sets ACCELERATE_USE_FSDP=true (accelerate compares it lower-cased)."""
    out = tmp_path / "out"
    argvs = [[command, "--output_dir", str(out)] for command in COMMANDS]
    env = {**CLI_ENV, FSDP_VARIABLE: value}
    for command, result in zip(COMMANDS, run_cli_cases(argvs, cwd=tmp_path, env=env), strict=True):
        assert_refused(result, command, f"{FSDP_VARIABLE} {value} (accelerate launch --use_fsdp", out)


def test_a_false_fsdp_variable_is_no_request(tmp_path):
    """accelerate reads only "true" as FSDP asked for; any other value runs the loop (here: to its next check)."""
    argvs = [
        [command, "--learning_rate", "-1", "--output_dir", str(tmp_path / "out")] for command in COMMANDS
    ]
    env = {**CLI_ENV, FSDP_VARIABLE: "false"}
    for result in run_cli_cases(argvs, cwd=tmp_path, env=env):
        assert result["code"] == 2 and "--learning_rate -1" in result["err"], result


def test_accelerate_launch_use_fsdp_is_refused_once_on_two_processes(tmp_path):
    """The real launch: `accelerate launch --use_fsdp` with 2 processes on CPU. Rank 0 prints the one error, and no
    folder is written."""
    out = tmp_path / "out"
    argv = [
        sys.executable, "-m", "accelerate.commands.launch", "--use_fsdp", "--num_processes", "2",
        "--num_machines", "1", "--mixed_precision", "no", "--dynamo_backend", "no",
        "-m", "energyformers.training.accelerate_loop", "--dataset", "digits", "--output_dir", str(out),
        # a short run, should the launch not be refused
        "--max_train_samples", "16", "--max_eval_samples", "8", "--max_test_samples", "8", "--batch_size", "4",
        "--max_steps", "2", "--num_predictions", "0", "--disable_tqdm",
    ]  # fmt: skip
    done = run_launcher(argv, tmp_path, LAUNCH_ENV, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "energyformers train-accelerate: error:" in line]
    assert done.returncode != 0, (done.returncode, done.stderr[-4000:])
    assert len(errors) == 1 and f"{FSDP_VARIABLE} true" in errors[0], done.stderr[-4000:]
    assert not out.exists() and not out.with_name("out.checkpoints").exists()
