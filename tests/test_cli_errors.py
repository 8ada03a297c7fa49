"""One error convention for every `energyformers` sub-command (`training/cli.py`, `run_command`).

Bad input is one line `energyformers <command>: error: ...` on stderr and exit status 2, answered before torch
or the models are imported; a failure of the work itself is status 1; an interruption is 130. Also the
test-time depth flags of `predict`, and bad paths (missing, empty, wrong kind) named in the error.
"""

from __future__ import annotations

import inspect
import io
import json
import queue
import shutil
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import IO

import pytest
import torch
from fixtures import CLI_ENV, Case, cli_config, perturb, run_cli_cases, run_launcher
from PIL import Image
from transformers import ViTImageProcessorPil

import energyformers
from energyformers.training import cli, predict, release, train
from energyformers.training.run_folder import has_checkpoint

ENV = CLI_ENV


def bad_inputs(tmp: Path) -> dict[str, tuple[list[str], str]]:
    """Case name -> (energyformers argv, a fragment its error line must hold). Every sub-command appears."""
    text_file = tmp / "notes.txt"
    text_file.write_text("this is not a model\n")  # 20 bytes of text
    truncated = tmp / "truncated"
    truncated.mkdir()
    (truncated / "config.json").write_text(json.dumps({"model_type": "hyperset", "input_type": "image"}))
    (truncated / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")  # header cut short
    no_weights = tmp / "no_weights"  # a config and nothing else
    no_weights.mkdir()
    (no_weights / "config.json").write_text(json.dumps({"model_type": "hyperset", "input_type": "image"}))
    image = tmp / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    config = tmp / "kwargs.json"
    config.write_text("{}")
    out = str(tmp / "out")
    # readable folders (a one-tensor safetensors file): what a config names is checked before torch loads
    classifier = readable_folder(tmp / "classifier", "hyperset", "HyperSetForImageClassification")
    mim = readable_folder(tmp / "mim", "hyperset", "HyperSetForMaskedImageModeling")  # no image tokenizer
    bert = readable_folder(tmp / "bertdir", "bert", "BertForSequenceClassification")
    taken = tmp / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    return {
        "unknown command": (["trian", "--model", "hyperset"], "unknown command 'trian'"),
        "train bad number": (["train", "--learning_rate", "-1", "--output_dir", out], "--learning_rate -1.0"),
        "train output is a file": (["train", "--output_dir", str(text_file)], "is a file"),
        "train-accelerate bad number": (
            ["train-accelerate", "--max_steps", "0", "--output_dir", out],
            "--max_steps 0",
        ),
        "predict missing folder": ([str(tmp / "nowhere"), str(image)], "does not exist"),
        "predict bad depth": (
            [str(tmp / "nowhere"), str(image), "--num_iterations", "0"],
            "--num_iterations 0",
        ),
        "predict truncated weights": (
            [str(truncated), str(image)],
            f"model folder {truncated}: model.safetensors cannot be read",
        ),
        "predict missing weights": (
            [str(no_weights), str(image)],
            f"error: model folder {no_weights}: missing model.safetensors.",
        ),
        "evaluate missing folder": (
            ["evaluate", str(tmp / "nowhere"), "--dataset", "digits"],
            "does not exist",
        ),
        "export missing folder": (["export", str(tmp / "nowhere"), out], "does not exist"),
        "push missing folder": (["push", str(tmp / "nowhere"), "org/name"], "does not exist"),
        "release missing folder": (["release", "--take", str(tmp / "nowhere")], "does not exist"),
        "convert a text file": (
            [
                "convert",
                "--source",
                "imixer",
                str(text_file),
                "--official-config",
                str(config),
                "--output_dir",
                out,
            ],
            "is not a checkpoint",
        ),
        "convert without --source": (
            ["convert", str(text_file), "--official-config", str(config), "--output_dir", out],
            "converting a checkpoint needs --source: only the authors' released files",
        ),
        "inspect truncated weights": (
            ["inspect", str(truncated), str(image), "--output_dir", out],
            f"model folder {truncated}: model.safetensors cannot be read",
        ),
        "inspect missing weights": (
            ["inspect", str(no_weights), str(image), "--output_dir", out],
            f"error: model folder {no_weights}: missing model.safetensors.",
        ),
        "predict not an image": ([str(classifier), str(text_file)], f"{text_file}: not a readable image"),
        "predict a folder as an image": (
            [str(classifier), str(taken)],
            f"{taken}: is a folder, not an image file",
        ),
        "predict another model type": (
            [str(bert), "hello"],
            f"{bert / 'config.json'}: model_type='bert' is not an energyformers family",
        ),
        "predict offline repo id": (
            ["no_such_model_here", str(image)],
            "no such local folder, and the Hub is offline (HF_HUB_OFFLINE=1)",
        ),
        "inspect missing folder without inputs": (
            ["inspect", str(tmp / "nowhere"), "--output_dir", out],
            "the folder does not exist",
        ),
        "inspect not an image": (
            ["inspect", str(classifier), str(text_file), "--output_dir", out],
            f"{text_file}: not a readable image",
        ),
        "inspect mim flag on a classifier": (
            ["inspect", str(classifier), str(image), "--output_dir", out, "--steps", "4"],
            "--steps: a masked-image-modelling flag",
        ),
        "inspect bad mask ratio": (
            ["inspect", "--landscape", "--output_dir", out, "--mask_ratio", "2"],
            "--mask_ratio 2.0: expected a fraction in [0, 1]",
        ),
        "inspect bad batch size": (
            ["inspect", "--landscape", "--output_dir", out, "--batch_size", "0"],
            "--batch_size 0: expected an integer >= 1",
        ),
        "inspect mim without tokenizer": (
            ["inspect", str(mim), str(image), "--output_dir", out],
            "has no image tokenizer (vq_tokenizer_config.json is missing)",
        ),
        "inspect non-empty output": (
            ["inspect", "--landscape", "--output_dir", str(taken)],
            f"--output_dir {taken}: the folder exists and is not empty; pass --overwrite_output_dir",
        ),
        "inspect output is a file": (
            ["inspect", "--landscape", "--output_dir", str(text_file)],
            f"--output_dir {text_file}: is a file",
        ),
        **parser_errors(),
    }


# Argument errors argparse itself finds, which read alike in every command (one line, no usage block):
# command -> (the arguments it requires, a flag with choices and what the message lists; None: no such flag).
PARSER_ERRORS: dict[str, tuple[list[str], tuple[str, str] | None]] = {
    "train": (["--output_dir", "out"], ("--eval_strategy", "'no', 'steps', 'epoch'")),
    "train-accelerate": (["--output_dir", "out"], ("--eval_strategy", "'no', 'steps', 'epoch'")),
    "predict": (["model", "x.png"], ("--schedule", "'arccos', 'cosine', 'linear', 'root', 'square'")),
    "inspect": (
        ["model", "--output_dir", "out"],
        ("--schedule", "'arccos', 'cosine', 'linear', 'root', 'square'"),
    ),
    "evaluate": (["model", "--dataset", "digits"], ("--split", "'test', 'validation', 'train'")),
    "export": (["model", "out"], None),
    "push": (["model", "org/name"], None),
    "release": ([], None),
    "convert": (["checkpoint.pt"], ("--dtype", "'float32', 'float64'")),
}
# What each command requires, as argparse names it when nothing is given.
REQUIRED = {
    "train": "--output_dir",
    "train-accelerate": "--output_dir",
    "predict": "model_dir, inputs",
    "inspect": "--output_dir",
    "evaluate": "MODEL, --dataset",
    "export": "model_dir, out_dir",
    "push": "model_dir, repo_id",
    "convert": "checkpoint",
}


def parser_errors() -> dict[str, tuple[list[str], str]]:
    """`bad_inputs` rows for an unknown flag, a bad choice and a missing argument in every command; the fragment
    holds the whole message after `error: `, so the same mistake reads the same everywhere."""
    rows = {}
    for command, (required, choice) in PARSER_ERRORS.items():
        argv = [] if command == "predict" else [command]  # `_argv` puts "predict" first for its rows
        name = "predict" if command == "predict" else command
        rows[f"{name} unknown flag"] = (
            [*argv, *required, "--bogus", "1"],
            "error: unrecognized arguments: --bogus 1",
        )
        if choice is not None:
            flag, choices = choice
            rows[f"{name} bad choice"] = (
                [*argv, *required, flag, "foo"],
                f"error: {flag}: invalid choice: 'foo' (choose from {choices})",
            )
        if command in REQUIRED and command != "predict":
            rows[f"{name} missing argument"] = (
                argv,
                f"error: the following arguments are required: {REQUIRED[command]}",
            )
    rows["predict missing argument"] = (
        ["--json"],
        "error: the following arguments are required: model_dir, inputs",
    )
    return rows


def readable_folder(folder: Path, model_type: str, architecture: str) -> Path:
    """A model folder whose config.json names `model_type` and `architecture`, with a readable (one-tensor)
    safetensors file: enough for the checks made before torch loads."""
    from safetensors.torch import save_file

    folder.mkdir()
    config = {"model_type": model_type, "input_type": "image", "architectures": [architecture]}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


def _argv(name: str, argv: list[str]) -> list[str]:
    return ["predict", *argv] if name.startswith("predict") else argv


def test_every_command_reports_bad_input_in_one_line_with_status_2_before_loading_torch(tmp_path):
    cases = bad_inputs(tmp_path)
    argvs = [_argv(name, argv) for name, (argv, _) in cases.items()]
    # in tmp_path: the relative paths of the argument-error rows (never reached) name nothing of the checkout
    results = dict(zip(cases, run_cli_cases(argvs, cwd=tmp_path), strict=True))
    commands = {argv[0] for argv in argvs}
    assert set(cli.COMMANDS) <= commands, sorted(set(cli.COMMANDS) - commands)
    for name, (argv, fragment) in cases.items():
        result = results[name]
        lines = [line for line in result["err"].splitlines() if line.strip()]
        command = _argv(name, argv)[0]
        prefix = (
            "energyformers: error: " if name == "unknown command" else f"energyformers {command}: error: "
        )
        assert result["code"] == 2, (name, result)
        assert len(lines) == 1 and lines[0].startswith(prefix) and fragment in lines[0], (name, result["err"])
        # Refused before the work starts: by the time the case returned, neither torch nor the package's model code
        # (fixtures.HEAVY) was imported. The cases share one process, so each list also covers the cases before it.
        assert result["heavy"] == [], f"{name}: {argv} imported {result['heavy']} before refusing"


@pytest.mark.parametrize("argv", [["trian"], ["train", "--learning_rate", "nan", "--output_dir", "x"]])
def test_the_console_script_exits_2_on_bad_arguments(argv):
    script = Path(sys.executable).with_name("energyformers")
    if not script.is_file():
        pytest.skip(f"no console script next to {sys.executable}")
    done = subprocess.run([str(script), *argv], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 2 and len(done.stderr.strip().splitlines()) == 1, done.stderr


# ------------------------------------------------------------------------------- under a launcher: reported once

LAUNCHED = {k: v for k, v in ENV.items() if k not in ("RANK", "LOCAL_RANK", "WORLD_SIZE")}


@pytest.mark.parametrize(
    ("ranks", "rank"),
    [
        ({}, 0),
        ({"WORLD_SIZE": "2", "RANK": "0", "LOCAL_RANK": "0"}, 0),
        ({"WORLD_SIZE": "2", "RANK": "1", "LOCAL_RANK": "1"}, 1),
        ({"WORLD_SIZE": "2", "LOCAL_RANK": "1"}, 1),
        ({"WORLD_SIZE": "4", "RANK": "2", "LOCAL_RANK": "0"}, 2),
        ({"WORLD_SIZE": "2", "RANK": "x"}, 0),
        # not launched: a RANK without a launcher's WORLD_SIZE (a job's pod, a command started from a worker)
        ({"RANK": "1", "LOCAL_RANK": "1"}, 0),
        ({"WORLD_SIZE": "1", "RANK": "1"}, 0),
        ({"WORLD_SIZE": "x", "RANK": "1"}, 0),
    ],
    ids=[
        "none", "rank0", "rank1", "local_rank_only", "second_machine", "not_a_number",
        "rank_without_world_size", "world_size_1", "world_size_not_a_number",
    ],
)  # fmt: skip
def test_the_launch_rank_is_the_global_rank(monkeypatch, ranks, rank):
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    for name, value in ranks.items():
        monkeypatch.setenv(name, value)
    assert cli.launch_rank() == rank, (ranks, cli.launch_rank())


# `python -m energyformers` that writes a file (argv[1]) when it starts the launcher's grace wait
ANNOUNCE_THE_GRACE = """
import pathlib, sys, time
from energyformers.training import cli

sleep = time.sleep

def announced(seconds):
    if seconds == cli.LAUNCH_GRACE_S:
        pathlib.Path(sys.argv[1]).write_text("waiting")
    sleep(seconds)

time.sleep = announced
sys.exit(cli.main(sys.argv[2:]))
"""


def test_under_a_launcher_rank_0_prints_a_usage_error_and_another_rank_stays_silent(tmp_path):
    """torchrun starts every rank with the same arguments, and each refuses them with status 2: rank 0 prints the one
    line at once, another rank prints nothing while the launcher, which ends the remaining workers once one has
    failed, still has it to end (as here, where the test is the launcher). Rank 1 says when it has reached its wait,
    so a rank 1 that printed or exited instead fails the test however slowly it started."""
    out = tmp_path / "out"
    arguments = ["train", "--learning_rate", "-1", "--output_dir", str(out)]
    script, waiting = tmp_path / "rank.py", tmp_path / "waiting"
    script.write_text(ANNOUNCE_THE_GRACE)
    argv = [sys.executable, str(script), str(waiting), *arguments]
    ranks = [
        subprocess.Popen(
            argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=tmp_path,
            env={**LAUNCHED, "WORLD_SIZE": "2", "RANK": str(rank), "LOCAL_RANK": str(rank)},
        )
        for rank in (0, 1)
    ]  # fmt: skip
    try:
        _, err0 = ranks[0].communicate(timeout=120)
        assert ranks[0].returncode == 2 and err0.strip().splitlines() == [
            "energyformers train: error: --learning_rate -1.0: expected a finite learning rate > 0"
        ], (ranks[0].returncode, err0)
        # rank 1 does the same work, so it refuses the arguments too, and then waits for the launcher silently
        deadline = time.monotonic() + 120
        while not waiting.exists() and ranks[1].poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert ranks[1].poll() is None, ("rank 1 exited before the launcher ended it", ranks[1].returncode)
        assert waiting.exists(), "rank 1 did not reach the launcher's grace wait within 120 s"
    finally:
        ranks[1].terminate()  # as torchrun ends the remaining workers
        _, err1 = ranks[1].communicate(timeout=60)
    assert err1 == "", err1
    assert not out.exists()


def test_a_usage_error_with_a_rank_but_no_launcher_is_printed_at_once(monkeypatch, capsys):
    """RANK without a launcher's WORLD_SIZE > 1 (a job's pod, a command a worker starts): no rank 0 prints for this
    process, so it does not wait."""
    monkeypatch.delenv("WORLD_SIZE", raising=False)
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cli, "LAUNCH_GRACE_S", 5.0)
    for world_size in (None, "1"):
        if world_size is not None:
            monkeypatch.setenv("WORLD_SIZE", world_size)
        start = time.perf_counter()
        status = cli.main(["trian"])
        waited = time.perf_counter() - start
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1, (world_size, status, err)
        assert err[0].startswith("energyformers: error: unknown command 'trian'"), (world_size, err)
        assert waited < cli.LAUNCH_GRACE_S, (world_size, waited, cli.LAUNCH_GRACE_S)


def test_a_usage_error_of_another_rank_alone_is_printed_after_the_grace(monkeypatch, capsys):
    """A rank the launcher did not end within `LAUNCH_GRACE_S` had an error rank 0 did not: it prints it (once) and
    exits with status 2 too, the dispatcher's and a command's errors alike."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setattr(cli, "LAUNCH_GRACE_S", 0.5)
    for argv, line in [
        (["trian"], "energyformers: error: unknown command 'trian'"),
        (
            ["train", "--learning_rate", "-1", "--output_dir", "x"],
            "energyformers train: error: --learning_rate -1.0",
        ),
    ]:
        start = time.perf_counter()
        status = cli.main(argv)
        waited = time.perf_counter() - start
        err = capsys.readouterr().err.strip().splitlines()
        assert status == 2 and len(err) == 1 and err[0].startswith(line), (argv, status, err)
        assert waited >= cli.LAUNCH_GRACE_S, (argv, waited, cli.LAUNCH_GRACE_S)


def test_a_ctrl_c_during_another_ranks_grace_wait_prints_nothing(monkeypatch, capsys):
    """Under a launcher a Ctrl-C reaches rank 0, which has printed the error, and every other rank while it waits
    out `LAUNCH_GRACE_S`: that rank ends silently, with the usage error's status."""
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    waits = []
    sleep = time.sleep

    def interrupted(seconds: float) -> None:
        if seconds != cli.LAUNCH_GRACE_S:
            return sleep(seconds)
        waits.append(seconds)
        raise KeyboardInterrupt  # the Ctrl-C the launcher passes on, during the wait

    monkeypatch.setattr(cli.time, "sleep", interrupted)
    status = cli.main(["trian"])
    err = capsys.readouterr().err
    assert waits == [cli.LAUNCH_GRACE_S], waits  # the premise: the rank reached its grace wait
    assert status == 2 and err == "", (status, err)


@pytest.mark.skipif(
    shutil.which("torchrun", path=str(Path(sys.executable).parent)) is None,
    reason="torchrun not installed in the venv",
)
def test_a_usage_error_under_torchrun_is_printed_once(tmp_path):
    """A real 2-process torchrun of bad arguments (a few seconds: the ranks refuse them before torch loads)."""
    out = tmp_path / "out"
    # torchrun as a module of this interpreter: the console script's shebang may name another environment's python
    argv = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2",
        "-m", "energyformers", "train", "--learning_rate", "-1", "--output_dir", str(out),
    ]  # fmt: skip
    done = run_launcher(argv, tmp_path, LAUNCHED, timeout=300)
    errors = [line for line in done.stderr.splitlines() if "energyformers train: error:" in line]
    assert done.returncode != 0 and len(errors) == 1, (done.returncode, done.stderr[-4000:])
    assert not out.exists()


def test_failures_map_to_status_1_and_an_interruption_to_130(capsys):
    def fail(_: object) -> int:
        raise RuntimeError("disk full")

    def interrupted(_: object) -> int:
        raise KeyboardInterrupt

    def refused(_: object) -> int:
        raise cli.CommandFailed("the Hub refused the upload")

    assert cli.run_command("demo", list, fail, []) == 1
    err = capsys.readouterr().err
    assert "RuntimeError: disk full" in err and "energyformers demo: error: unexpected failure" in err
    assert cli.run_command("demo", list, refused, []) == 1
    assert capsys.readouterr().err.strip() == "energyformers demo: error: the Hub refused the upload"
    assert cli.run_command("demo", list, interrupted, []) == 130


def test_a_push_without_a_token_or_offline_is_status_2_as_in_train(tmp_path):
    """No token at all is missing input (status 2, the line says how to give one); with a token, offline mode is
    the user's setting too (status 2, as `train --push_to_hub` reports it); a Hub that refuses an upload is a
    failure of the work (status 1, tests/test_hub.py)."""
    folder = model_folder(tmp_path / "model", "hyperset")
    env = {k: v for k, v in ENV.items() if k not in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN")}
    env["HF_HOME"] = str(tmp_path / "hf-home")  # no stored login
    # both in one fresh process (huggingface_hub reads HF_HOME, where a stored login would be, when imported)
    argv = ["push", folder, "org/name"]
    without_token, offline = run_cli_cases([argv, [*argv, "--token", "hf_x"]], cwd=tmp_path, env=env)
    assert without_token["code"] == 2, without_token["err"][-2000:]
    assert without_token["err"].strip().splitlines() == [
        "energyformers push: error: no Hugging Face token found: pass --token, set HF_TOKEN, or run `hf auth login` "
        "(a token with write access)"
    ]
    assert offline["code"] == 2, offline["err"][-2000:]
    assert offline["err"].strip().splitlines() == [
        "energyformers push: error: the Hub is offline (HF_HUB_OFFLINE=1), so nothing can be uploaded; "
        "unset HF_HUB_OFFLINE"
    ]


def test_push_and_train_word_the_hub_checks_alike(tmp_path, monkeypatch):
    """One check (`push.hub_access_error`) for push, train --push_to_hub and `push_model_dir`: the same lines, only
    the flag named differs."""
    from huggingface_hub import constants

    from energyformers.training import push, train
    from energyformers.training.arguments import UsageError

    for name in ("HF_TOKEN", "HUGGING_FACE_HUB_TOKEN", "HF_OIDC_RESOURCE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-login"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    folder = model_folder(tmp_path / "model", "hyperset")
    out = str(tmp_path / "run")
    lines = {}
    for route, call in {
        "push": lambda: push.parse([str(folder), "org/name"]),
        "train": lambda: train.parse(["--output_dir", out, "--push_to_hub", "--hub_model_id", "org/name"]),
    }.items():
        with pytest.raises(UsageError) as caught:
            call()
        lines[route] = str(caught.value)
    with pytest.raises(push.MissingTokenError) as caught:
        push.push_model_dir(folder, "org/name")
    lines["api"] = str(caught.value)
    assert lines == {
        route: f"no Hugging Face token found: pass {flag}, set HF_TOKEN, or run `hf auth login` (a token with write "
        "access)"
        for route, flag in (("push", "--token"), ("train", "--hub_token"), ("api", "token="))
    }, lines
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    offline = "the Hub is offline (HF_HUB_OFFLINE=1), so nothing can be uploaded; unset HF_HUB_OFFLINE"
    with pytest.raises(UsageError) as caught:
        push.parse([str(folder), "org/name", "--token", "hf_x"])
    assert str(caught.value) == offline, caught.value
    with pytest.raises(UsageError) as caught:
        train.parse(
            ["--output_dir", out, "--push_to_hub", "--hub_model_id", "org/name", "--hub_token", "hf_x"]
        )
    assert str(caught.value) == (
        f"--push_to_hub: {offline}, or drop --push_to_hub and run `energyformers push` later"
    ), caught.value
    with pytest.raises(push.HubOfflineError) as caught:
        push.push_model_dir(folder, "org/name", token="hf_x")
    assert str(caught.value) == offline, caught.value


def test_the_token_placeholder_of_a_printed_command_is_refused_on_every_route(tmp_path, monkeypatch):
    """A resume line shows `--hub_token <HUB_TOKEN>` (`arguments.redacted_argv`); pasted as it is, the placeholder
    is refused before any work, even where a real token (HF_TOKEN) is set, instead of being sent as the token at the
    end of the run."""
    from huggingface_hub import constants

    from energyformers.training import push, train
    from energyformers.training.arguments import REDACTED, UsageError

    monkeypatch.setenv("HF_TOKEN", "hf_real")
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    folder = model_folder(tmp_path / "model", "hyperset")
    out = str(tmp_path / "run")
    lines = {}
    for route, call in {
        "push": lambda: push.parse([str(folder), "org/name", "--token", REDACTED]),
        "train": lambda: train.parse(
            ["--output_dir", out, "--push_to_hub", "--hub_model_id", "org/name", "--hub_token", REDACTED]
        ),
    }.items():
        with pytest.raises(UsageError) as caught:
            call()
        lines[route] = str(caught.value)
    with pytest.raises(push.MissingTokenError) as caught:
        push.push_model_dir(folder, "org/name", token=REDACTED)
    lines["api"] = str(caught.value)
    assert lines == {
        route: f"{flag} {REDACTED}: the placeholder a printed command shows instead of a token; pass your token, or "
        f"leave {flag} out and set HF_TOKEN, or run `hf auth login` (a token with write access)"
        for route, flag in (("push", "--token"), ("train", "--hub_token"), ("api", "token="))
    }, lines
    assert not (tmp_path / "run").exists()


def test_release_names_the_families_without_importing_them():
    assert sorted(release.RELEASED_MODEL_TYPES) == sorted(energyformers.FAMILIES)


# ------------------------------------------------------------------------------- train --output_dir a file


@pytest.mark.parametrize("overwrite", [[], ["--overwrite_output_dir"]], ids=["plain", "overwrite"])
def test_an_output_dir_that_is_a_file_is_refused_and_left_alone(tmp_path, capsys, overwrite):
    target = tmp_path / "model"
    target.write_text("my notes")
    argv = ["--output_dir", str(target), *overwrite, "--max_steps", "1", "--config", *cli_config("hyperset")]
    assert train.main(argv) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("energyformers train: error: --output_dir") and "is a file" in line, line
    assert "not empty" not in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["model"]  # no .model.old-<pid>, no checkpoints
    assert target.read_text() == "my notes"


# ------------------------------------------------------------------------------- predict's depth flags


def model_folder(path: Path, family: str) -> Path:
    """A saved image classifier (tiny, seeded, moved off its initialisation) with its image processor."""
    torch.manual_seed(0)
    overrides = dict(num_channels=3, num_labels=4, image_size=8)
    model = perturb(Case(family, "AutoModelForImageClassification", "image").build(**overrides))
    model.save_pretrained(path)
    ViTImageProcessorPil(
        size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(path)
    return path


@pytest.fixture(scope="module")
def hyperset_folder(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("predict_depth")
    image = root / "x.png"
    Image.fromarray(
        (torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy()
    ).save(image)
    return model_folder(root / "hyperset", "hyperset"), image


def predicted_scores(capsys, *argv: str) -> list[float]:
    assert predict.main([*argv, "--json", "--top_k", "4"]) == 0, capsys.readouterr().err
    out = json.loads(capsys.readouterr().out.strip().splitlines()[0])
    return [p["score"] for p in sorted(out["predictions"], key=lambda p: p["label"])]


def test_predict_passes_the_depth_flags_to_the_model_call(hyperset_folder, capsys, monkeypatch):
    folder, image = hyperset_folder
    calls: list[dict] = []
    original = energyformers.HyperSetForImageClassification.forward

    def recording(self, *args, **kwargs):
        calls.append({k: kwargs.get(k) for k in ("num_iterations", "halting_tolerance", "halting_criterion")})
        return original(self, *args, **kwargs)

    recording.__signature__ = inspect.signature(
        original
    )  # predict checks the flags against the forward's names
    monkeypatch.setattr(energyformers.HyperSetForImageClassification, "forward", recording)
    shallow = predicted_scores(capsys, str(folder), str(image), "--num_iterations", "1")
    deep = predicted_scores(
        capsys, str(folder), str(image), "--num_iterations", "6", "--halting_tolerance", "1e-4"
    )
    assert calls[0]["num_iterations"] == 1 and calls[-1] == {
        "num_iterations": 6,
        "halting_tolerance": 1e-4,
        "halting_criterion": None,
    }, calls
    # float32 softmax scores of a perturbed model: 1 vs 6 iterations move them far beyond rounding (~1e-7)
    assert max(abs(a - b) for a, b in zip(shallow, deep)) > 1e-4, (shallow, deep)


def test_an_in_process_command_gives_the_caller_its_logging_state_back(hyperset_folder, capsys):
    """`predict` and `inspect` quiet transformers for themselves; a notebook (or a test) that runs them keeps its own
    verbosity and progress bars, whether the command succeeds or stops on bad input."""
    import transformers

    folder, image = hyperset_folder
    logging = transformers.utils.logging
    before = (logging.get_verbosity(), logging.is_progress_bar_enabled())
    try:
        logging.set_verbosity_info()
        logging.enable_progress_bar()
        assert predict.main([str(folder), str(image)]) == 0
        assert predict.main([str(folder), str(image), "--num_iterations", "0"]) == 2
        after = (logging.get_verbosity(), logging.is_progress_bar_enabled())
    finally:
        logging.set_verbosity(before[0])
        (logging.enable_progress_bar if before[1] else logging.disable_progress_bar)()
    capsys.readouterr()
    assert after == (transformers.logging.INFO, True), f"(verbosity, progress bars) after predict: {after}"


def test_an_in_process_command_gives_the_caller_its_thread_count_back(hyperset_folder, tmp_path, capsys):
    """`--num_threads` is the command's: a notebook (or a test) that runs one in-process keeps its own torch thread
    count afterwards."""
    # the package's command, not the standard library's `inspect` this file imports
    from energyformers.training import inspect as inspect_command

    folder, image = hyperset_folder
    before = torch.get_num_threads()
    caller = before + 1  # never 1, so the command's `--num_threads 1` is a change
    argv = [str(folder), str(image), "--output_dir", str(tmp_path / "out"), "--num_threads", "1"]
    torch.set_num_threads(caller)
    try:
        status = inspect_command.main(argv)
        after = torch.get_num_threads()
    finally:
        torch.set_num_threads(before)
    assert status == 0, capsys.readouterr().err[-3000:]
    assert after == caller, (
        f"torch's thread count was {caller} before `inspect --num_threads 1`, {after} after"
    )


def test_predict_refuses_a_depth_flag_the_model_does_not_take(hyperset_folder, capsys):
    folder, image = hyperset_folder
    assert predict.main([str(folder), str(image), "--fixed_point_solver", "anderson"]) == 2
    line = capsys.readouterr().err.strip()
    assert line.startswith("energyformers predict: error: --fixed_point_solver") and "hyperset" in line, line
    assert "--num_iterations" in line, line  # what this model does take


# ------------------------------------------------------------------------------- Ctrl-C while training

LOOPS = ["train", "train-accelerate"]
# Generous for a loaded two-core machine: start-up and the first logged step take well under a minute alone.
FIRST_LOSS_TIMEOUT = 300


def first_line_with(stream: IO[str], marker: str, timeout: float) -> str | None:
    """The first line of `stream` that holds `marker`; None when the stream ends without one or `timeout` seconds
    pass first. The lines are read in a thread: a child that hangs before printing fails the test, not hangs it."""
    found: queue.Queue[str | None] = queue.Queue()

    def read() -> None:
        for line in stream:
            if marker in line:
                found.put(line)
                return
        found.put(None)

    threading.Thread(target=read, daemon=True).start()
    try:
        return found.get(timeout=timeout)
    except queue.Empty:
        return None


def test_waiting_for_a_line_gives_up_on_a_child_that_never_prints_it():
    """A silent (hung) child, a child that ends without the line, a child that prints it."""
    children = {
        "hung": "import time; print('starting', flush=True); time.sleep(120)",
        "ended": "print('starting')",
        "printed": "print('starting'); print('step 1 loss 2.3')",
    }
    got = {}
    for name, code in children.items():
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, text=True)
        try:
            got[name] = first_line_with(proc.stdout, "loss", timeout=2 if name == "hung" else 60)
        finally:
            proc.kill()
            proc.wait()
            proc.stdout.close()
    assert got == {"hung": None, "ended": None, "printed": "step 1 loss 2.3\n"}, got


@pytest.mark.parametrize("loop", LOOPS)
def test_ctrl_c_saves_a_checkpoint_and_prints_the_resume_command(tmp_path, loop):
    out = tmp_path / "run"
    argv = ["--dataset", "digits", "--config", *cli_config("hyperset"), "--max_train_samples", "32"]
    argv += ["--max_eval_samples", "16", "--max_test_samples", "16", "--max_steps", "100000"]
    argv += ["--per_device_train_batch_size", "8", "--logging_steps", "1", "--eval_strategy", "no"]
    argv += ["--save_strategy", "no", "--num_threads", "1", "--disable_tqdm", "--output_dir", str(out)]
    # stderr to a file: warnings that fill a pipe nobody reads yet would stall the child before its first loss
    with (tmp_path / "stderr.txt").open("w+") as stderr:
        proc = subprocess.Popen(
            [sys.executable, "-m", "energyformers", loop, *argv],
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            env=ENV,
        )
        try:
            # a logged loss: the loop is past its start-up and stepping
            line = first_line_with(proc.stdout, "loss", timeout=FIRST_LOSS_TIMEOUT)
            if line is not None:
                proc.send_signal(signal.SIGINT)  # what Ctrl-C sends the foreground process
                proc.communicate(timeout=300)
        finally:
            proc.kill()
            proc.wait()
        stderr.seek(0)
        err = stderr.read()
    assert line is not None, (
        f"no loss logged within {FIRST_LOSS_TIMEOUT} s (status {proc.returncode}):\n{err[-3000:]}"
    )
    assert proc.returncode == 130, err[-3000:]
    assert "Traceback" not in err and "KeyboardInterrupt" not in err, err[-3000:]
    assert f"energyformers {loop} " in err and "--resume" in err, err[-3000:]
    work = out.with_name("run.checkpoints")
    saved = [p.name for p in work.iterdir()] if work.is_dir() else []
    assert has_checkpoint(work) and not out.exists(), saved  # complete: the loop's state file is written last


# ------------------------------------------------------------------------------- the weights check names a folder once


def test_the_weights_check_names_the_folder_once_after_its_label(tmp_path):
    """`check_weights_readable(folder, label)` adds the folder itself: every problem reads `<label> <folder>: ...`
    with the folder named once, whichever file is at fault."""
    from safetensors.torch import save_file

    from energyformers.training.weights import check_weights_readable, weight_files

    empty = tmp_path / "empty"
    empty.mkdir()
    sharded = tmp_path / "sharded"
    sharded.mkdir()
    index = {"weight_map": {"a": "model-1.safetensors", "b": "model-2.safetensors"}}
    (sharded / "model.safetensors.index.json").write_text(json.dumps(index))
    save_file({"a": torch.zeros(1)}, str(sharded / "model-1.safetensors"))
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\x10\x00\x00\x00\x00\x00\x00\x00{")
    cases = [
        (empty, FileNotFoundError, "missing model.safetensors."),
        (sharded, FileNotFoundError, "shards listed in model.safetensors.index.json are missing"),
        (broken, ValueError, "model.safetensors cannot be read"),
    ]
    for folder, error, problem in cases:
        with pytest.raises(error) as raised:
            check_weights_readable(folder, label="--from_pretrained")
        message = str(raised.value)
        assert message.startswith(f"--from_pretrained {folder}: {problem}"), message
        assert message.count(str(folder)) == 1, message
    with pytest.raises(FileNotFoundError) as raised:  # the listing alone names the folder once too
        weight_files(empty)
    assert str(raised.value) == f"{empty}: missing model.safetensors.", raised.value


# ------------------------------------------------------------------- one check of a model folder, one wording


def test_every_command_words_a_broken_model_folder_alike(tmp_path):
    """`weights.check_model_folder` is the one check of a local model folder (config.json, a JSON object, readable
    weights): every command that takes a folder reports each problem in the same words, `<label> <folder>: ...`,
    the label being how the command names the argument."""
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    folders = {}
    for name, config in (("no_config", None), ("list_config", "[1, 2]"), ("bad_json", "{model_type:")):
        folder = folders[name] = tmp_path / name
        folder.mkdir()
        (folder / "notes.txt").write_text("not a model")
        if config is not None:
            (folder / "config.json").write_text(config)
    problems = {
        "no_config": "no config.json; expected a folder written by save_pretrained",
        "list_config": "config.json holds a JSON list, not an object",
        "bad_json": "config.json is not readable JSON (",
    }
    out = tmp_path / "out"
    commands = {  # command -> (argv for a folder, the label its messages give the folder)
        "train": (lambda f: ["train", "--from_pretrained", f, "--output_dir", out, "--num_threads", "1"]),
        "export": (lambda f: ["export", f, out]),
        "release": (lambda f: ["release", "--take", f]),
        "predict": (lambda f: ["predict", f, image]),
        "inspect": (lambda f: ["inspect", f, image, "--output_dir", out]),
        "evaluate": (lambda f: ["evaluate", f, "--dataset", "digits"]),
    }
    labels = {"train": "--from_pretrained", "release": "--take"}
    cases = [(command, name) for command in commands for name in folders]
    results = run_cli_cases([commands[c](folders[n]) for c, n in cases], cwd=tmp_path)
    for (command, name), result in zip(cases, results, strict=True):
        expected = f"energyformers {command}: error: {labels.get(command, 'model folder')} {folders[name]}: "
        expected += problems[name]
        assert result["code"] == 2, (command, name, result)
        assert result["err"].startswith(expected) and result["err"].count("\n") == 1, (
            command,
            name,
            result["err"],
        )
    assert not out.exists()


def test_predict_refuses_standard_input_without_a_line(tmp_path, capsys, monkeypatch):
    """`predict MODEL -` reads one input per line: blank input is a usage error (status 2), not an IndexError."""
    classifier = readable_folder(tmp_path / "classifier", "hyperset", "HyperSetForImageClassification")
    monkeypatch.setattr("sys.stdin", io.StringIO("\n   \n"))
    status = predict.main([str(classifier), "-"])
    err = capsys.readouterr().err.strip().splitlines()
    assert status == 2 and len(err) == 1, (status, err)
    assert err[0].startswith(
        "energyformers predict: error: inputs -: standard input held no non-empty line"
    ), err
