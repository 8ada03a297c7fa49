"""What a new user hits when trying the CLI as a newcomer would: the error each mistake gets and what it
leaves behind. Runs in-process with tiny configs, tiny data and `--max_steps`.

Also the contract that both training loops parse the same flags into the same values.
"""

from __future__ import annotations

import argparse
import json
import shutil
import socket
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import TINY_SPLITS, cli_config, rounding
from PIL import Image
from safetensors.torch import load_file

import energyformers
from energyformers.training import accelerate_loop, export, predict, train
from energyformers.training.arguments import build_parser, parse_arguments
from energyformers.training.processing import build_image_processor, train_tokenizer

TINY = ["--config", *cli_config("hyperset")]
QUICK = ["--num_threads", "1", "--disable_tqdm", "--num_predictions", "0", "--batch_size", "8"]
RUNS = {"train": train, "train-accelerate": accelerate_loop}  # the modules whose `run` does the work
LOOPS = {name: module.main for name, module in RUNS.items()}


def only_line(err: str) -> str:
    """The one error line of a failed command: no traceback, nothing else on stderr."""
    lines = [line for line in err.strip().splitlines() if line.strip()]
    assert "Traceback" not in err and len(lines) == 1, err
    return lines[0]


def assert_nothing_written(root: Path) -> None:
    assert sorted(p.name for p in root.iterdir()) == [], sorted(p.name for p in root.iterdir())


# ------------------------------------------------------------------------------- data


def one_class_folder(root: Path) -> Path:
    (root / "only").mkdir(parents=True)
    for i in range(6):
        Image.fromarray(np.full((8, 8), 20 * i, np.uint8)).save(root / "only" / f"{i}.png")
    return root


@pytest.mark.parametrize("extra", [[], ["--label_column", "label"]], ids=["plain", "label_column"])
def test_image_folder_with_one_class_says_two_class_folders_are_needed(tmp_path, capsys, extra):
    folder = one_class_folder(tmp_path / "data")
    runs = tmp_path / "runs"
    runs.mkdir()
    assert train.main(["--dataset", str(folder), "--output_dir", str(runs / "m"), *QUICK, *extra]) == 2
    line = only_line(capsys.readouterr().err)
    assert "at least two class folders" in line and "'only'" in line
    assert_nothing_written(runs)


@pytest.mark.parametrize("layout", ["backslash", "depths"])
def test_class_folders_imagefolder_infers_no_labels_from_are_named_for_what_is_wrong(
    tmp_path, capsys, layout
):
    """Three class folders, but one named with a backslash (datasets' imagefolder counts it as a path separator) or
    one holding its images a folder deeper: imagefolder infers no labels. The line says which, not that two class
    folders are needed when three were found."""
    root = tmp_path / "data"
    odd = root / "a\\b" if layout == "backslash" else root / "dog" / "more"
    for folder in (root / "cat", root / "bird", odd):
        folder.mkdir(parents=True)
        for i in range(4):
            Image.fromarray(np.full((8, 8), 20 * i, np.uint8)).save(folder / f"{i}.png")
    runs = tmp_path / "runs"
    runs.mkdir()
    assert train.main(["--dataset", str(root), "--output_dir", str(runs / "m"), *QUICK]) == 2
    line = only_line(capsys.readouterr().err)
    assert "at least two class folders" not in line, line
    if layout == "backslash":
        expected = f"{root}: class folder 'a\\\\b': a class folder's name must not hold a backslash"
    else:
        expected = f"{root}: its images lie at several folder depths (e.g. in "
    assert line.startswith(f"energyformers train: error: {expected}"), line
    assert_nothing_written(runs)


def test_unknown_dataset_with_the_hub_unreachable_fails_fast_with_the_builtin_names(
    tmp_path, capsys, monkeypatch
):
    import datasets
    from huggingface_hub import constants

    # A real user's machine without network: not HF_HUB_OFFLINE, just no route (a closed local port).
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setattr(constants, "ENDPOINT", "http://127.0.0.1:9")
    monkeypatch.setattr(datasets.config, "HF_HUB_OFFLINE", False)
    monkeypatch.delenv("HF_DATASETS_OFFLINE", raising=False)
    # "Fails fast": one TCP probe of the endpoint, and the Hub client (which retries for minutes) never called.
    probes, hub_loads = [], []
    connect = socket.create_connection
    monkeypatch.setattr(
        socket,
        "create_connection",
        lambda address, *a, **k: probes.append(address) or connect(address, *a, **k),
    )
    monkeypatch.setattr(
        datasets,
        "load_dataset",
        lambda *a, **k: hub_loads.append(a) or pytest.fail(f"Hub client called: {a}"),
    )
    assert train.main(["--dataset", "no_such_dataset_xyz", "--output_dir", str(tmp_path / "m"), *QUICK]) == 2
    assert probes == [("127.0.0.1", 9)] and hub_loads == [], (probes, hub_loads)
    line = only_line(capsys.readouterr().err)
    assert "cannot be reached" in line and "digits" in line and "fashion_mnist" in line


def test_tiny_splits_are_flagged_in_the_output_and_metrics(tmp_path, capsys):
    out = tmp_path / "m"
    argv = [
        "--max_steps",
        "1",
        "--max_train_samples",
        "16",
        "--max_eval_samples",
        "4",
        "--max_test_samples",
        "3",
    ]
    assert train.main([*TINY, *argv, *QUICK, "--output_dir", str(out)]) == 0
    err = capsys.readouterr().err
    assert "test split has only 3 examples" in err and "validation split has only 4 examples" in err
    metrics = json.loads((out / "metrics.json").read_text())
    assert any("only 3 examples" in w for w in metrics["warnings"])
    assert "only 3 examples" in (out / "README.md").read_text()  # the card says it too


# ------------------------------------------------------------------------------- numeric flags

BAD_NUMBERS = {
    "--lr": ("-1", "--learning_rate -1.0"),
    "--epochs": ("0", "--num_train_epochs 0.0"),
    "--max_steps": ("0", "--max_steps 0"),
    "--batch_size": ("0", "--per_device_train_batch_size 0"),
    "--warmup_steps": ("-2", "--warmup_steps -2.0"),
    "--weight_decay": ("nan", "--weight_decay nan"),
    "--max_grad_norm": ("-1", "--max_grad_norm -1.0"),
    "--adam_beta2": ("1.0", "--adam_beta2 1.0"),
    "--label_smoothing_factor": ("1", "--label_smoothing_factor 1.0"),
    "--save_total_limit": ("0", "--save_total_limit 0"),
    "--logging_steps": ("0", "--logging_steps 0"),
    "--max_train_samples": ("0", "--max_train_samples 0"),
    "--min_iterations": ("0", "--min_iterations 0"),
    "--ema_decay": ("1.5", "--ema_decay 1.5"),
    "--mixup_alpha": ("-1", "--mixup_alpha -1.0"),
    "--seed": ("-1", "--seed -1"),
    "--vocab_size": ("2", "--vocab_size 2"),
}


@pytest.mark.parametrize("loop", sorted(LOOPS))
@pytest.mark.parametrize("flag", sorted(BAD_NUMBERS))
def test_bad_numbers_fail_before_any_work_and_leave_nothing(tmp_path, capsys, monkeypatch, loop, flag):
    value, named = BAD_NUMBERS[flag]
    runs = tmp_path / "runs"
    runs.mkdir()
    # rejected while parsing: the run itself, which loads the data and builds the model, never starts
    started = []
    monkeypatch.setattr(RUNS[loop], "run", lambda *a, **k: started.append(a) or 0)
    status = LOOPS[loop](
        [*QUICK, "--output_dir", str(runs / "m"), flag, value]
    )  # the bad value last: it wins
    assert not started, f"{loop} started a run with {flag} {value}"
    assert status == 2, status
    assert named in only_line(capsys.readouterr().err)
    assert_nothing_written(runs)


def test_a_failure_during_training_leaves_no_empty_checkpoint_folder(tmp_path, capsys):
    from transformers import TrainerCallback

    class Boom(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            raise RuntimeError("boom at the first step")

    runs = tmp_path / "runs"
    runs.mkdir()
    argv = [*TINY, *TINY_SPLITS, *QUICK, "--max_steps", "2", "--output_dir", str(runs / "m")]
    assert train.main(argv, callbacks=[Boom()]) == 1  # a failure of the work: status 1 with its traceback
    assert "RuntimeError: boom at the first step" in capsys.readouterr().err
    assert_nothing_written(runs)


# ------------------------------------------------------------------------------- checkpoints


def save_image_model(folder: Path, seed: int = 0) -> Path:
    """A tiny Hyper-SET image model folder (config, safetensors, image processor), saved without training.

    Its weights are drawn from a generator seeded here: the module fixture below is built before the per-test
    reseed (conftest's function-scoped `_seeded`), from whatever random state the tests before it left. The global
    state is restored afterwards, so building it changes no later draw either."""
    config = energyformers.HyperSetConfig(
        hidden_size=16, num_attention_heads=2, intermediate_size=16, num_iterations=2, image_size=16,
        patch_size=4, num_labels=10, id2label={i: str(i) for i in range(10)},
    )  # fmt: skip
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        energyformers.HyperSetForImageClassification(config).save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def image_model(tmp_path_factory) -> Path:
    return save_image_model(tmp_path_factory.mktemp("model") / "hyperset-tiny")


def test_the_image_model_is_the_same_whatever_random_state_came_before(tmp_path: Path) -> None:
    folders = []
    for state in (1, 2):  # two different random states left by earlier tests
        torch.manual_seed(state)
        folders.append(save_image_model(tmp_path / f"after-{state}"))
    first, second = (load_file(str(folder / "model.safetensors")) for folder in folders)
    assert first.keys() == second.keys(), sorted(first.keys() ^ second.keys())
    differ = {
        key: (first[key] - second[key]).abs().max().item()
        for key in first
        if not torch.equal(first[key], second[key])
    }
    assert not differ, f"weights that depend on the random state before the build (max |Δ|): {differ}"


@pytest.fixture
def truncated(image_model, tmp_path) -> Path:
    folder = tmp_path / "truncated"
    shutil.copytree(image_model, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    return folder


def named_once(line: str, folder: Path) -> bool:
    """The error names the folder once (no "x: x/model.safetensors"), then the file in it, and says why."""
    return (
        line.count(str(folder)) == 1
        and f"{folder}: model.safetensors cannot be read" in line
        and "truncated" in line
    )


def test_truncated_weights_are_named_in_train(truncated, tmp_path, capsys):
    argv = ["--from_pretrained", str(truncated), "--output_dir", str(tmp_path / "m"), *TINY_SPLITS, *QUICK]
    assert train.main([*argv, "--max_steps", "1"]) == 2
    line = only_line(capsys.readouterr().err)
    assert named_once(line, truncated), line
    assert not (tmp_path / "m.checkpoints").exists()


def test_truncated_weights_are_named_in_predict(truncated, tmp_path, capsys):
    image = tmp_path / "x.png"
    Image.new("L", (8, 8)).save(image)
    assert predict.main([str(truncated), str(image)]) == 2
    line = only_line(capsys.readouterr().err)
    assert named_once(line, truncated), line


def test_truncated_weights_are_named_in_export(truncated, tmp_path, capsys):
    assert export.main([str(truncated), str(tmp_path / "out")]) == 2
    line = only_line(capsys.readouterr().err)
    assert named_once(line, truncated), line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("source", ["{tmp}/no_such_model", "./no_such_model", "no/such/model"])
def test_from_pretrained_of_a_missing_folder_says_it_does_not_exist(tmp_path, capsys, source):
    argv = ["--from_pretrained", source.format(tmp=tmp_path), "--output_dir", str(tmp_path / "m"), *QUICK]
    assert train.main([*argv, *TINY_SPLITS]) == 2
    assert "does not exist" in only_line(capsys.readouterr().err)


def test_predict_refuses_an_image_path_for_a_text_model(tmp_path, capsys):
    folder = tmp_path / "text-model"
    tokenizer = train_tokenizer(
        ["a good film", "a bad film", "good", "bad"] * 5, vocab_size=50, max_length=16
    )
    config = energyformers.HyperSetConfig(
        input_type="sequence", vocab_size=len(tokenizer), max_position_embeddings=16, hidden_size=16,
        num_attention_heads=2, intermediate_size=16, num_iterations=1, num_labels=2,
        id2label={0: "neg", 1: "pos"}, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    energyformers.HyperSetForSequenceClassification(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    image = tmp_path / "cat.png"
    Image.new("RGB", (8, 8)).save(image)
    capsys.readouterr()  # saving the model may draw transformers' progress bar: not the command's output
    assert predict.main([str(folder), str(image)]) == 2
    line = only_line(capsys.readouterr().err)
    assert "text model" in line and "cat.png" in line
    assert predict.main([str(folder), "a good film", "--json"]) == 0  # texts still work
    assert json.loads(capsys.readouterr().out.splitlines()[0])["predictions"][0]["label"] in {"neg", "pos"}


# ------------------------------------------------------------------------------- config overrides


@pytest.mark.parametrize(
    "override",
    ["num_channels=1", "hidden_size=abc", "num_attention_heads=3", "patch_size=5", "image_size=[8]"],
)
def test_bad_config_values_are_one_line(tmp_path, capsys, override):
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = [*TINY, override, "--output_dir", str(runs / "m"), *TINY_SPLITS, *QUICK]
    assert train.main(argv) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith("energyformers train: error:") and override.split("=")[0] in line
    assert_nothing_written(runs)


# ------------------------------------------------------------------------------- resume


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_resume_prints_the_step_and_reports_the_whole_run_train_loss(tmp_path, capsys, loop):
    checkpoint = {"train": "checkpoint-3", "train-accelerate": "step_3"}[loop]
    argv = [*TINY, *TINY_SPLITS, *QUICK, "--max_steps", "6", "--save_strategy", "steps", "--save_steps", "3"]
    argv += ["--logging_steps", "5", "--eval_strategy", "no", "--iteration_sampling", "fixed"]
    straight = tmp_path / "straight"
    assert LOOPS[loop]([*argv, "--output_dir", str(straight), "--keep_checkpoints"]) == 0
    resumed = tmp_path / "resumed"
    shutil.copytree(
        tmp_path / "straight.checkpoints" / checkpoint, tmp_path / "resumed.checkpoints" / checkpoint
    )
    capsys.readouterr()
    assert LOOPS[loop]([*argv, "--output_dir", str(resumed), "--resume"]) == 0
    assert "resuming from step 3" in capsys.readouterr().out
    losses = [
        json.loads((d / "metrics.json").read_text())["train"]["train_loss"] for d in (straight, resumed)
    ]
    # both runs repeat the same float32 step losses (one thread; the restored weights, optimizer and RNG state),
    # so only the float64 recombination of the logged window means differs (`whole_run_train_loss`: a division and
    # a product per window, a sum, the mean): 16 float64 roundings, relative to the loss
    assert losses[1] == pytest.approx(losses[0], rel=rounding(torch.float64, 16), abs=0), losses


# ------------------------------------------------------------------------------- help and flags


@pytest.mark.parametrize("prog", [train.PROG, accelerate_loop.PROG])
def test_help_gives_every_option_a_text_and_each_default_once(prog):
    parser = build_parser(prog, "")
    formatter = parser._get_formatter()
    for action in parser._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS:
            continue
        assert action.help, f"{action.option_strings[0]} has no help text"
        shown = formatter._get_help_string(action).replace("%(default)s", "<value>")
        assert shown.count("default") <= 1, shown
    text = parser.format_help()
    assert "--num-train-epochs" not in text  # one spelling per option


def test_the_command_list_says_train_trains_new_models_too(capsys):
    """`energyformers --help`: the README's first command trains from scratch with `train`, which only
    fine-tunes with --from_pretrained."""
    from energyformers.training import cli

    assert cli.main(["--help"]) == 0
    (line,) = [line for line in capsys.readouterr().out.splitlines() if line.split()[:1] == ["train"]]
    assert "new model" in line and "--from_pretrained" in line, line


# Modules `--help` must not import (start-up time): the answer is a page of text, so neither
# torch nor the model files (the Auto registration) nor the training stack are loaded to print it.
HELP_MUST_NOT_IMPORT = (
    "torch",
    "transformers.modeling_utils",
    "energyformers.registry",
    "datasets",
    "evaluate",
    "kornia",
    "transformers.trainer",
    "matplotlib",
)


# `energyformers COMMAND --help` for each command in turn, run by runpy in one process, recording the names in
# sys.modules after each command: a module first loaded by a command appears from that command on.
RECORD_MODULES = """
import json, runpy, sys
out, commands = sys.argv[1], sys.argv[2:]
seen = {}
for command in commands:
    sys.argv = ["energyformers", command, "--help"]
    try:
        runpy.run_module("energyformers", run_name="__main__", alter_sys=True)
    except SystemExit as stop:
        assert stop.code in (0, None), (command, stop.code)
    seen[command] = sorted(sys.modules)
open(out, "w").write(json.dumps(seen))
"""


def test_help_imports_neither_torch_nor_the_models_nor_the_training_stack(tmp_path):
    import os
    import subprocess
    import sys

    from energyformers.training.cli import COMMANDS

    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    record = tmp_path / "modules.json"
    argv = [sys.executable, "-c", RECORD_MODULES, str(record), *COMMANDS]
    done = subprocess.run(argv, capture_output=True, text=True, env=env, timeout=120)
    assert done.returncode == 0 and done.stdout.count("usage: energyformers") == len(COMMANDS), done.stderr[
        -2000:
    ]
    seen = json.loads(record.read_text())
    assert list(seen) == list(COMMANDS)
    assert {"energyformers.training.arguments", "transformers.hf_argparser"} <= set(seen["train"])  # recorded
    loaded = {command: [m for m in HELP_MUST_NOT_IMPORT if m in modules] for command, modules in seen.items()}
    assert loaded == {command: [] for command in COMMANDS}


# `import energyformers`, then transformers' Auto classes on a saved folder, with no other access to the package
# (ARCHITECTURE.md, "Hub sharing"), in a fresh process. `order` says what ran before `import energyformers`: nothing,
# transformers' Auto classes, or the `energyformers` console script's command line (which must change nothing).
IMPORT_THEN_LOAD = """
import json, sys
folder, order = sys.argv[1], sys.argv[2]
if order == "transformers first":
    from transformers import AutoModelForImageClassification
if order == "as the console script":
    sys.argv[:] = ["/venv/bin/energyformers", "train", "--help"]
    sys.orig_argv[:] = ["python", "/venv/bin/energyformers", "train", "--help"]
import energyformers
torch_at_import = "torch" in sys.modules
from transformers import AutoConfig
config = AutoConfig.from_pretrained(folder)
models_for_config = "energyformers.registry" in sys.modules
from transformers import AutoModelForImageClassification
model = AutoModelForImageClassification.from_pretrained(folder)
print(json.dumps([torch_at_import, type(config).__name__, models_for_config, type(model).__name__]))
"""


IMPORT_ORDERS = ["energyformers first", "transformers first", "as the console script"]


@pytest.fixture(scope="module")
def import_runs(tmp_path_factory: pytest.TempPathFactory) -> dict:
    """`IMPORT_THEN_LOAD` on one saved folder, a fresh process per order, the processes run at once."""
    import os
    import sys

    from fixtures import cli_architecture, run_at_once
    from transformers import AutoConfig, AutoModelForImageClassification

    folder = tmp_path_factory.mktemp("import-then-load")
    config = AutoConfig.for_model(
        "hyperset", **{**cli_architecture("hyperset"), "image_size": 8, "patch_size": 2}
    )
    AutoModelForImageClassification.from_config(config).save_pretrained(folder)
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    commands = {
        order: dict(args=[sys.executable, "-c", IMPORT_THEN_LOAD, str(folder), order], env=env)
        for order in IMPORT_ORDERS
    }
    return run_at_once(commands, timeout=180)


@pytest.mark.parametrize("order", IMPORT_ORDERS)
def test_import_is_light_and_the_auto_classes_load_our_folders_with_no_other_access(import_runs, order):
    done = import_runs[order]
    assert done.returncode == 0, done.stderr[-3000:]
    # torch is loaded before `import energyformers` only when transformers' Auto classes were imported first; the
    # model files load only when a model is asked for, never for a config.
    expected = [order == "transformers first", "HyperSetConfig", False, "HyperSetForImageClassification"]
    assert json.loads(done.stdout.strip().splitlines()[-1]) == expected, done.stdout


def test_the_package_reads_no_command_line_and_its_lazy_table_matches_the_registry():
    import ast

    from energyformers import auto_registration, registry

    init = Path(energyformers.__file__).read_text()
    names = {node.attr for node in ast.walk(ast.parse(init)) if isinstance(node, ast.Attribute)}
    assert not names & {"argv", "orig_argv"}, names
    families = {**registry.FAMILIES, **registry.BASELINES}
    table = {model_type: (family.stem, tuple(family.heads)) for model_type, family in families.items()}
    assert auto_registration.AUTO_HEADS == table
    for family in families.values():
        for auto_class, head in family.heads.items():
            assert auto_registration.head_name(family.config_class, auto_class) == head.__name__
            stand_in = auto_registration.lazy_head(family.config_class, family.stem, auto_class)
            assert (stand_in.__name__, stand_in.__module__) == (head.__name__, head.__module__)
            assert stand_in.resolve() is head and stand_in.config_class is head.config_class


def test_both_loops_parse_the_same_flags_into_the_same_values():
    argv = [
        "--output_dir",
        "x",
        "--epochs",
        "2.5",
        "--lr",
        "1e-3",
        "--warmup_ratio",
        "0.1",
        "--batch_size",
        "16",
    ]
    argv += ["--checkpointing_steps", "7", "--bf16", "--recipe", "hyperset-ic", "--mixup_alpha", "0.2"]
    a = parse_arguments(argv, train.PROG, "")
    b = parse_arguments(argv, accelerate_loop.PROG, "")
    for part in ("model", "data", "run", "augmentation"):
        assert asdict(getattr(a, part)) == asdict(getattr(b, part))
    run = a.run
    assert (run.num_train_epochs, run.learning_rate, run.warmup_steps) == (2.5, 1e-3, 0.1)
    assert (run.save_strategy, run.save_steps, run.precision) == ("steps", 7, "bf16")
    defaults = [
        parse_arguments(["--output_dir", "x"], prog, "") for prog in (train.PROG, accelerate_loop.PROG)
    ]
    assert asdict(defaults[0].run) == asdict(defaults[1].run)
    assert defaults[0].run.learning_rate is None  # resolved the same way: 3e-3 new, 5e-4 fine-tuning


def test_recipe_sets_defaults_and_explicit_flags_win():
    sudoku = parse_arguments(["--output_dir", "x", "--recipe", "hyperset-sudoku"], train.PROG, "").run
    assert (sudoku.adam_beta1, sudoku.adam_beta2, sudoku.learning_rate) == (0.0, 0.95, 1e-4)
    mine = parse_arguments(
        ["--output_dir", "x", "--recipe", "hyperset-sudoku", "--lr", "3e-4"], train.PROG, ""
    )
    assert mine.run.learning_rate == 3e-4 and mine.run.adam_beta2 == 0.95


def test_training_loss_of_a_resumed_trainer_run_combines_the_logged_windows():
    history = [{"step": 2, "loss": 1.0}, {"step": 3, "loss": 4.0}, {"step": 5, "loss": 9.0}]
    # checkpoint at step 3 (windows 0-2 mean 1, 2-3 mean 4), then 3 more steps with mean 2 → (2 + 4 + 6) / 6;
    # exact: small integers times small integers, summed and divided by 6 into an integer, round nowhere
    combined = train.whole_run_train_loss(history, 3, 2.0, 6)
    assert combined == 2.0, f"whole-run loss {combined!r}, expected 2.0"
    assert train.whole_run_train_loss(history, 0, 2.5, 6) == 2.5


def test_weights_check_rejects_a_truncated_file_with_its_name(truncated):
    from energyformers.training.weights import check_weights_readable

    with pytest.raises(ValueError, match="truncated"):
        check_weights_readable(truncated)


def test_both_loops_write_the_same_run_folder_and_card(tmp_path):
    outputs = {}
    for loop, main in LOOPS.items():
        out = tmp_path / loop
        assert main([*TINY, *TINY_SPLITS, *QUICK, "--max_steps", "2", "--output_dir", str(out)]) == 0
        outputs[loop] = out
    files = {loop: sorted(p.name for p in out.iterdir()) for loop, out in outputs.items()}
    assert files["train"] == files["train-accelerate"]
    metrics = {loop: json.loads((out / "metrics.json").read_text()) for loop, out in outputs.items()}
    assert metrics["train"].keys() == metrics["train-accelerate"].keys()
    assert metrics["train"]["recipe"].keys() == metrics["train-accelerate"]["recipe"].keys()
    for record in metrics.values():
        record["arguments"]["run"].pop("output_dir")
    assert metrics["train"]["arguments"] == metrics["train-accelerate"]["arguments"]  # same flags and values
    cards = {loop: (out / "README.md").read_text() for loop, out in outputs.items()}
    headings = {
        loop: [line for line in card.splitlines() if line.startswith("#")][
            1:
        ]  # [0]: the title, the folder name
        for loop, card in cards.items()
    }
    assert headings["train"] == headings["train-accelerate"] and "## Citation" in headings["train"]
    assert all("trained from scratch" in card for card in cards.values())
