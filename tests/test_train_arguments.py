"""The training commands' argument checks (`training/arguments.py`): answered in one line with status 2 before torch
is imported, as every sub-command does (`cli.run_command`): choices of `--lr_scheduler_type`, argparse's own errors
with the sub-command's name, unknown flags, and a non-empty `--output_dir`.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import run_cli_cases
from test_cli_errors import ENV
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
        "config nested too deeply": (  # deeper than Python's JSON parser recurses: a RecursionError before
            ["train", "--config", "hidden_size=" + "[" * 5000 + "]" * 5000, "--output_dir", out],
            f"energyformers train: error: --config hidden_size={'[' * 25}...: nested too deeply to read: Python's "
            "JSON parser stops at its recursion limit; expected KEY=VALUE with a JSON value",
        ),
        "output dir not empty": (
            ["train", "--output_dir", str(full), "--max_steps", "1"],
            f"energyformers train: error: --output_dir {full}: the folder exists and is not empty; pass "
            "--overwrite_output_dir or choose another folder",
        ),
    }


def test_argument_errors_are_one_line_with_status_2_before_torch(tmp_path: Path) -> None:
    table = cases(tmp_path)
    results = run_cli_cases([argv for argv, _ in table.values()], cwd=tmp_path, env=ENV, timeout=300)
    for (name, (_, expected)), result in zip(table.items(), results, strict=True):
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


# ------------------------------------------------------------------------------- --push_to_hub, checked before training

NO_TOKEN = "no Hugging Face token found: pass --hub_token, set HF_TOKEN, or run `hf auth login` (a token with write access)"
# the line `energyformers push` prints offline (tests/test_cli_errors.py), naming the flag that asked for the upload
OFFLINE = (
    "--push_to_hub: the Hub is offline (HF_HUB_OFFLINE=1), so nothing can be uploaded; unset HF_HUB_OFFLINE, or drop "
    "--push_to_hub and run `energyformers push` later"
)
PUSH = ["--push_to_hub", "--hub_model_id", "org/name"]


@pytest.fixture
def no_login(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """No token anywhere huggingface_hub looks (environment, stored login), the Hub online; returns the token file's
    path, so a test can log in by writing it."""
    from huggingface_hub import constants

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    token_file = tmp_path / "hf-home" / "token"
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(token_file))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    return token_file


@pytest.mark.parametrize("loop", ["train", "train-accelerate"])
@pytest.mark.parametrize(
    "extra, expected",
    [
        ([], NO_TOKEN),
        (
            ["--hub_model_id", "a/b/c", "--hub_token", "hf_x"],
            "--hub_model_id 'a/b/c': expected NAMESPACE/NAME",
        ),
        (
            ["--hub_model_id", "org/bad name", "--hub_token", "hf_x"],
            "--hub_model_id 'org/bad name': not a Hub",
        ),
        (["--hub_token", "hf_x", "OFFLINE"], OFFLINE),
    ],
    ids=["no-token", "three-parts", "bad-name", "offline"],
)
def test_push_to_hub_is_checked_before_the_run(
    loop, extra, expected, no_login, tmp_path, monkeypatch
) -> None:
    """What the upload at the end needs (a repo id the Hub takes, a token, an online Hub) is refused while parsing,
    in the words of `energyformers push`, not found after the whole run."""
    from huggingface_hub import constants

    from energyformers.training import accelerate_loop
    from energyformers.training.cli import UsageError

    if "OFFLINE" in extra:
        extra = [flag for flag in extra if flag != "OFFLINE"]
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    parse = {"train": train.parse, "train-accelerate": accelerate_loop.parse}[loop]
    out = tmp_path / "out"
    with pytest.raises(UsageError) as refused:
        parse(["--output_dir", str(out), *PUSH, *extra])
    assert str(refused.value).startswith(expected), str(refused.value)
    assert not out.exists()


def test_push_to_hub_takes_the_stored_login_or_hf_token(no_login, tmp_path, monkeypatch) -> None:
    """A token from `hf auth login` or HF_TOKEN is enough: `--hub_token` is not required."""
    out = str(tmp_path / "out")
    no_login.parent.mkdir(parents=True)
    no_login.write_text("hf_stored")
    assert train.parse(["--output_dir", out, *PUSH]).run.push_to_hub
    no_login.unlink()
    monkeypatch.setenv("HF_TOKEN", "hf_environment")
    assert train.parse(["--output_dir", out, *PUSH]).run.push_to_hub


def test_push_to_hub_refusals_are_one_line_with_status_2_before_torch(tmp_path: Path) -> None:
    """The command line: one line, status 2, torch not imported, nothing written (the offline refusal with a token;
    no token at all, with none in the environment and an empty Hugging Face home)."""
    env = {
        k: v for k, v in ENV.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE")
    }
    env["HF_HOME"] = str(tmp_path / "hf-home")  # no stored login
    out = str(tmp_path / "out")
    # a short real run, so that the code before these checks fails quickly instead of training for long
    quick = [
        "--dataset",
        "digits",
        "--max_steps",
        "1",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "8",
    ]
    quick += ["--max_test_samples", "8", "--num_threads", "1", "--disable_tqdm", "--output_dir", out, *PUSH]
    table = {
        "train no token": (["train", *quick], f"energyformers train: error: {NO_TOKEN}"),
        "accelerate no token": (
            ["train-accelerate", *quick],
            f"energyformers train-accelerate: error: {NO_TOKEN}",
        ),
        "train offline": (["train", *quick, "--hub_token", "hf_x"], f"energyformers train: error: {OFFLINE}"),
    }
    results = run_cli_cases([argv for argv, _ in table.values()], cwd=tmp_path, env=env, timeout=600)
    for (name, (_, expected)), result in zip(table.items(), results, strict=True):
        lines = [line for line in result["err"].splitlines() if line.strip()]
        assert result["code"] == 2, (name, result["code"], result["err"][-2000:])
        assert len(lines) == 1 and lines[0].startswith(expected), (name, expected, result["err"][-2000:])
        assert result["heavy"] == [], (name, result["heavy"])
    assert not (tmp_path / "out").exists() and not (tmp_path / "out.checkpoints").exists()


# Every spelling of the token flag the training parser takes: whole, hyphenated, abbreviated (argparse's
# allow_abbrev), each as `--flag VALUE` and as `--flag=VALUE`.
TOKEN_SPELLINGS = ["--hub_token", "--hub-token", "--hub_tok", "--hub-to"]


@pytest.mark.parametrize("flag", TOKEN_SPELLINGS)
@pytest.mark.parametrize("joined", [False, True], ids=["separate", "equals"])
def test_a_token_is_redacted_in_every_spelling_the_parser_takes(flag: str, joined: bool) -> None:
    from energyformers.training.arguments import REDACTED, build_parser, redacted_argv

    secret = "hf_SECRET123"
    given = [f"{flag}={secret}"] if joined else [flag, secret]
    argv = ["--model", "hyperset", *given, "--hub_model_id", "org/name", "--output_dir", "out"]
    parsed = build_parser("energyformers train", "").parse_args(argv)
    assert parsed.hub_token == secret, (argv, parsed.hub_token)  # a spelling the parser reads as the token
    redacted = redacted_argv(argv)
    expected = [f"{flag}={REDACTED}"] if joined else [flag, REDACTED]
    assert redacted == ["--model", "hyperset", *expected, "--hub_model_id", "org/name", "--output_dir", "out"]


def test_only_token_values_are_redacted() -> None:
    """A flag that is no abbreviation of a token flag keeps its value, even a prefix of one that is itself a flag's
    whole name (`--hub_model_id` is not cut to `--hub`), and a value that merely looks like a token is kept."""
    from energyformers.training.arguments import redacted_argv

    argv = [
        "--hub_model_id",
        "org/token",
        "--tokenizer",
        "tok_token",
        "--run_name",
        "--hub_token_x",
        "--config",
    ]
    assert redacted_argv(argv) == argv


@pytest.mark.parametrize("command", ["train", "train-accelerate"])
def test_the_resume_line_a_stop_prints_shows_no_token(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """`StopRequest.report`'s command to continue the run (stderr, which ends up in logs) has each token's value
    redacted, in both spellings, and is the run's own command with --resume otherwise."""
    import shlex
    import signal

    from energyformers.training.arguments import REDACTED
    from energyformers.training.interrupt import StopRequest

    secrets = ("hf_SECRET123", "hf_OTHER456")
    tokens = ["--hub_token", secrets[0], f"--hub-tok={secrets[1]}"]
    argv = ["--model", "hyperset", *tokens, "--output_dir", "out"]
    stop = StopRequest()
    stop.signum = signal.SIGTERM
    assert stop.report(command, argv, 3, tmp_path / "out.checkpoints") == 128 + signal.SIGTERM
    err = capsys.readouterr().err
    shown = ["--model", "hyperset", "--hub_token", REDACTED, f"--hub-tok={REDACTED}", "--output_dir", "out"]
    expected = shlex.join(["energyformers", command, *shown, "--resume"])
    assert err.splitlines()[-1] == f"  {expected}" and not any(s in err for s in secrets), err
