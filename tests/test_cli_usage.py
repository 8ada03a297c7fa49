"""Mistakes a user makes with `energyformers predict` / `inspect`, each answered as the error convention wants
(`training/cli.py`): one line `energyformers <command>: error: ...`, status 2, before the model loads.

The cases that need no torch at all are in `test_cli_errors.bad_inputs` (one subprocess checks that none of them
imports torch); these are the ones that build a model folder or need a loaded config.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import torch
import transformers
from fixtures import Case, decompression_bomb_png, perturb, run_cli_cases
from PIL import Image
from test_mim_given_tokenizer import mim_folder
from transformers import ViTImageProcessorPil

import energyformers
from energyformers import HyperSetConfig, HyperSetForTokenClassification
from energyformers.kernels import triton_unavailable_reason
from energyformers.mim import load_vq_tokenizer
from energyformers.training import cli, inspect, predict
from energyformers.training.processing import cell_tokenizer

ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}
PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"


def only_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture(scope="module")
def classifier(tmp_path_factory) -> tuple[Path, Path]:
    """A tiny Hyper-SET image classifier folder (seeded, moved off its initialisation) and an 8 × 8 PNG."""
    root = tmp_path_factory.mktemp("cli_usage")
    torch.manual_seed(0)
    model = perturb(
        Case("hyperset", "AutoModelForImageClassification", "image").build(
            num_channels=3, num_labels=4, image_size=8
        )
    )
    folder = root / "hyperset"
    model.save_pretrained(folder)
    ViTImageProcessorPil(
        size={"height": 8, "width": 8}, image_mean=[0.5] * 3, image_std=[0.5] * 3
    ).save_pretrained(folder)
    image = root / "x.png"
    pixels = np.random.default_rng(3).integers(0, 256, (8, 8, 3), dtype=np.uint8)
    Image.fromarray(pixels).save(image)
    return folder, image


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if a command gets as far as loading a model (the pipeline or the inspect loader)."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(transformers, "pipeline", loaded)
    monkeypatch.setattr(inspect, "load_model", loaded)


# ------------------------------------------------------------------------------- inputs that are not images


@pytest.mark.parametrize("bad", ["text", "bomb"])
@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_a_file_that_is_not_an_image_is_named_before_the_model_loads(
    classifier, tmp_path, capsys, no_model_loads, command, bad
):
    """A text file, or a PNG too large for PIL to open (`decompression_bomb_png`: PIL's DecompressionBombError)."""
    folder, image = classifier
    if bad == "bomb":
        notes = decompression_bomb_png(tmp_path / "huge.png")
    else:
        notes = tmp_path / "passwd"
        notes.write_text("root:x:0:0:root:/root:/bin/bash\n")
    extra = ["--output_dir", str(tmp_path / "out")] if command == "inspect" else []
    assert cli.main([command, str(folder), str(image), str(notes), *extra]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.startswith(f"energyformers {command}: error: {notes}: not a readable image"), line
    assert not (tmp_path / "out").exists()


# ------------------------------------------------------------------------------- an attention that cannot run here


def test_triton_on_a_machine_that_cannot_run_it_is_one_line_before_the_weights_load(
    classifier, capsys, monkeypatch, no_model_loads
):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)  # the tests' CPU stand-in for CUDA (conftest.py)
    if triton_unavailable_reason() is None:
        pytest.skip("the Triton kernel can run on this machine")
    folder, image = classifier
    assert predict.main([str(folder), str(image), "--attn_implementation", "triton"]) == 2
    line = only_line(capsys.readouterr().err)
    # the model's own reason (modeling_hyperset.check_attn_implementation), under the flag's name
    reason = triton_unavailable_reason()
    assert (
        line.startswith("energyformers predict: error: --attn_implementation triton: ") and reason in line
    ), line


# ------------------------------------------------------------------------------- Sudoku puzzles as texts


@pytest.fixture(scope="module")
def sudoku_folder(tmp_path_factory) -> Path:
    """A tiny Hyper-SET Sudoku model with the grids' tokenizer (one token per cell, no padding token)."""
    torch.manual_seed(0)
    config = HyperSetConfig(
        input_type="sequence", vocab_size=10, max_position_embeddings=81, num_labels=9, hidden_size=16,
        num_attention_heads=2, intermediate_size=16, num_iterations=2,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("sudoku") / "model"
    HyperSetForTokenClassification(config).eval().save_pretrained(folder)
    tokenizer = cell_tokenizer(81)
    assert tokenizer.pad_token is None  # the case: transformers cannot pad a batch with it
    tokenizer.save_pretrained(folder)
    return folder


def test_inspect_takes_sudoku_puzzles_as_predict_does(sudoku_folder, tmp_path, capsys):
    out = tmp_path / "inspect"
    blank = "0" * 81
    argv = ["inspect", str(sudoku_folder), PUZZLE, blank, "--output_dir", str(out), "--max_iterations", "3"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((out / "inspect.json").read_text())
    assert report["num_inputs"] == 2 and report["hyperset"]["iterations"] == [0, 1, 2, 3], report
    # the energies inspect reports are the model's on exactly these two grids (the tokenizer's ids are the digits)
    model = HyperSetForTokenClassification.from_pretrained(sudoku_folder).eval()
    ids = torch.tensor([[int(c) for c in PUZZLE], [0] * 81])
    with torch.no_grad():
        energies = model(input_ids=ids, num_iterations=3, output_energies=True).energies
    expected = energies.attention_energy.float().mean(0)[0].tolist()
    got = report["hyperset"]["layers"][0]["attention_energy"]
    # exact: inspect makes this same model call on the same batch and stores round(float64(value), 6), through
    # JSON (an exact round trip), so the same rounding here gives the same numbers
    assert got == [round(value, 6) for value in expected], (got, expected)
    # the same string is what predict classifies
    assert predict.main([str(sudoku_folder), PUZZLE]) == 0, capsys.readouterr().err


def test_inspect_names_a_puzzle_that_is_not_81_cells(sudoku_folder, tmp_path, capsys):
    """A puzzle is 81 cells: a shorter one is refused (predict's `check_inputs`) before the model loads."""
    out = tmp_path / "inspect"
    assert cli.main(["inspect", str(sudoku_folder), PUZZLE, PUZZLE[:9], "--output_dir", str(out)]) == 2
    line = only_line(capsys.readouterr().err)
    assert "a Sudoku model takes 81-character puzzles" in line and f"got {PUZZLE[:9]!r} (9 cells)" in line, (
        line
    )
    assert not out.exists()


# ------------------------------------------------------------------------------- a MIM folder without its tokenizer


def tiny_mim_folder(folder: Path) -> Path:
    """A saved masked-image-modelling model (untrained, tiny) without its image tokenizer."""
    return mim_folder(folder, tokenizer_patch_size=None)


def test_inspect_says_how_to_save_an_image_tokenizer_and_suggests_no_flag(tmp_path, capsys, no_model_loads):
    folder = tiny_mim_folder(tmp_path / "mim")
    image = tmp_path / "digit.png"
    Image.new("L", (16, 16), 128).save(image)
    capsys.readouterr()  # save_pretrained's progress bar
    assert cli.main(["inspect", str(folder), str(image), "--output_dir", str(tmp_path / "out")]) == 2
    line = only_line(capsys.readouterr().err)
    assert "has no image tokenizer" in line and "save_pretrained" in line, line
    assert "pass one" not in line and "vq_tokenizer=" not in line, line  # inspect has no tokenizer flag
    # the Python API's message says where a tokenizer is passed there
    with pytest.raises(FileNotFoundError, match=r"vq_tokenizer=") as raised:
        load_vq_tokenizer(folder)
    assert "or pass one." not in str(raised.value), raised.value


def test_predict_and_inspect_check_a_local_folder_with_one_function(classifier, tmp_path, capsys):
    """`predict.check_local_model_folder` is the folder check both commands run: config and model type, weights,
    then the command's flag check (told the masked-image-modelling head, else None, and the first architecture),
    then the image tokenizer of such a head, then the inputs; it returns the config and that head."""
    folder, image = classifier
    seen: list[tuple[str | None, str]] = []
    config, head = predict.check_local_model_folder(
        folder,
        str(folder),
        predict.MODEL_TYPES,
        check_flags=lambda *kind: seen.append(kind),
        inputs=[str(image)],
    )
    assert (config["model_type"], head) == ("hyperset", None), (config, head)
    assert seen == [(None, "HyperSetForImageClassification")], seen
    text = tmp_path / "notes.txt"
    text.write_text("not an image")
    with pytest.raises(cli.UsageError, match=rf"{text}: not a readable image"):
        predict.check_local_model_folder(folder, str(folder), predict.MODEL_TYPES, inputs=[str(text)])
    with pytest.raises(cli.UsageError, match=r"model_type='hyperset' is not an energyformers family"):
        predict.check_local_model_folder(folder, str(folder), ("imixer",))
    # a masked-image-modelling head: the flag check sees it before the missing image tokenizer is named
    mim = tiny_mim_folder(tmp_path / "mim")
    seen.clear()
    with pytest.raises(
        cli.UsageError, match=r"has no image tokenizer \(vq_tokenizer_config.json is missing\)"
    ):
        predict.check_local_model_folder(
            mim, str(mim), predict.MODEL_TYPES, check_flags=lambda *k: seen.append(k)
        )
    assert seen == [("HyperSetForMaskedImageModeling", "HyperSetForMaskedImageModeling")], seen


# ------------------------------------------------------------------------------- inspect's flags and output folder


@pytest.mark.parametrize(
    "flags, fragment",
    [
        (["--schedule", "foo"], "error: --schedule: invalid choice: 'foo'"),
        (["--mask_ratio", "2"], "--mask_ratio 2.0: expected a fraction in [0, 1]"),
        (["--steps", "0"], "--steps 0: expected an integer >= 1"),
        (["--seed", "-1"], "--seed -1: expected an integer in [0, 2**63)"),
        (["--max_samples", "0"], "--max_samples 0: expected an integer >= 1"),
        (["--batch_size", "0"], "--batch_size 0: expected an integer >= 1"),
        (["--max_iterations", "0"], "--max_iterations 0: expected an integer >= 1"),
        (["--mask_ratio", "0.3"], "--mask_ratio: a masked-image-modelling flag, and"),
        (["--schedule", "cosine"], "--schedule: a masked-image-modelling flag, and"),
    ],
)
def test_inspect_refuses_bad_flag_values_as_predict_does(classifier, tmp_path, capsys, flags, fragment):
    folder, image = classifier
    out = tmp_path / "out"
    assert cli.main(["inspect", str(folder), str(image), "--output_dir", str(out), *flags]) == 2
    err = capsys.readouterr().err
    lines = err.strip().splitlines()  # argparse's own errors (a choice) too: one line, no usage block
    assert (
        len(lines) == 1 and lines[0].startswith("energyformers inspect: error: ") and fragment in lines[0]
    ), err
    assert not out.exists()


def test_every_command_words_its_output_folder_check_alike(classifier, tmp_path, capsys, no_model_loads):
    """train, inspect and export refuse a non-empty output folder, and those three and predict's --output_dir a
    file, with one wording (`cli.check_output_folder`), naming each its flag and the flag that allows it."""
    folder, image = classifier
    taken = tmp_path / "taken"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    a_file = tmp_path / "notes.txt"
    a_file.write_text("mine")
    commands = {  # command: (argv without the output, the output's flag, the flag that allows a non-empty one)
        "train": (["train", "--max_steps", "1", "--output_dir"], "--output_dir", "--overwrite_output_dir"),
        "inspect": (
            ["inspect", str(folder), str(image), "--output_dir"],
            "--output_dir",
            "--overwrite_output_dir",
        ),
        "export": (["export", str(folder)], "OUT_DIR", "--overwrite"),
    }
    for command, (argv, flag, overwrite_flag) in commands.items():
        assert cli.main([*argv, str(taken)]) == 2, command
        assert only_line(capsys.readouterr().err) == (
            f"energyformers {command}: error: {flag} {taken}: the folder exists and is not empty; pass "
            f"{overwrite_flag} or choose another folder"
        )
        assert cli.main([*argv, str(a_file)]) == 2, command
        assert only_line(capsys.readouterr().err) == (
            f"energyformers {command}: error: {flag} {a_file}: is a file, not a folder; name a folder to write into"
        )
    assert cli.main(["predict", str(folder), str(image), "--output_dir", str(a_file)]) == 2
    assert only_line(capsys.readouterr().err) == (
        f"energyformers predict: error: --output_dir {a_file}: is a file, not a folder; name a folder to write into"
    )
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"] and a_file.read_text() == "mine"


def test_inspect_refuses_a_non_empty_output_folder_unless_told_to_write_into_it(classifier, tmp_path, capsys):
    folder, image = classifier
    taken = tmp_path / "existing_out"
    taken.mkdir()
    (taken / "notes.txt").write_text("mine")
    argv = ["inspect", str(folder), str(image), "--output_dir", str(taken), "--max_iterations", "2"]
    assert cli.main(argv) == 2
    line = only_line(capsys.readouterr().err)
    assert (
        f"--output_dir {taken}: the folder exists and is not empty" in line
        and "--overwrite_output_dir" in line
    ), line
    assert sorted(p.name for p in taken.iterdir()) == ["notes.txt"]
    assert cli.main([*argv, "--overwrite_output_dir"]) == 0, capsys.readouterr().err
    assert (taken / "notes.txt").read_text() == "mine" and (taken / "inspect.json").is_file()


def test_inspect_writes_into_the_model_folder_itself(classifier, tmp_path, capsys):
    """`energyformers release` draws a run's figures into its own folder, where export's model card finds them."""
    folder, image = classifier
    copy = tmp_path / "run"
    copy.mkdir()
    for path in folder.iterdir():
        (copy / path.name).write_bytes(path.read_bytes())
    argv = ["inspect", str(copy), str(image), "--output_dir", str(copy), "--max_iterations", "2"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    assert "hyperset_energy.png" in json.loads((copy / "inspect.json").read_text())["figures"]


# ------------------------------------------------------------------------------- missing and foreign model folders


@pytest.mark.parametrize(
    "command, inputs",
    [("predict", ["x.png"]), ("inspect", ["x.png"]), ("inspect", [])],  # predict's INPUTS are required
    ids=["predict", "inspect", "inspect-no-inputs"],
)
def test_a_missing_folder_is_named_without_asking_an_offline_hub(
    tmp_path, capsys, monkeypatch, no_model_loads, command, inputs
):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.chdir(tmp_path)  # "nope_dir" is a name that could be a Hub repo, and no folder here
    extra = ["--output_dir", "o3"] if command == "inspect" else []
    assert cli.main([command, "nope_dir", *inputs, *extra]) == 2
    line = only_line(capsys.readouterr().err)
    assert line == (
        f"energyformers {command}: error: model folder 'nope_dir': no such local folder, and the Hub is offline "
        f"(HF_HUB_OFFLINE=1) and its cache ({constants.HF_HUB_CACHE}) holds no such repo, so it cannot be a Hub "
        "repo either"
    ), line
    assert cli.main([command, "./nope_dir", *inputs, *extra]) == 2
    line = only_line(capsys.readouterr().err)
    assert line.endswith("model folder './nope_dir': the folder does not exist"), line


def hub_cache_repo(cache: Path, repo_id: str, folder: Path) -> Path:
    """Lay `folder`'s files out in `cache` as huggingface_hub's download writes a repo: each file a blob named by
    its content hash, linked from `snapshots/<commit>/`, and `refs/main` naming that commit."""
    import hashlib

    repo = cache / f"models--{repo_id.replace('/', '--')}"
    commit = "0123456789abcdef0123456789abcdef01234567"
    snapshot = repo / "snapshots" / commit
    (repo / "blobs").mkdir(parents=True)
    snapshot.mkdir(parents=True)
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        blob = repo / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / path.name).symlink_to(os.path.relpath(blob, snapshot))
    (repo / "refs").mkdir()
    (repo / "refs" / "main").write_text(commit)
    return snapshot


def _cut(data: bytes) -> bytes:  # a download that stopped
    return data[:100]


def _patch_size_3(data: bytes) -> bytes:  # the 8 x 8 image is not divisible into 3 x 3 patches
    return json.dumps({**json.loads(data), "patch_size": 3}).encode()


# Repos in the Hub cache of `hub_cache_runs`, each the classifier's files with one changed: repo -> (file, change)
BROKEN = {
    "org/config-cut": ("config.json", _cut),  # a download cut short: the cached copy is broken
    "org/config-invalid": ("config.json", _patch_size_3),  # the config's check refuses it
    "org/weights-cut": ("model.safetensors", _cut),
}


def _train_from(repo: str, out: Path) -> list[Any]:
    return [
        "train", "--from_pretrained", repo, "--dataset", "digits", "--max_train_samples", "8",
        "--max_eval_samples", "8", "--max_test_samples", "8", "--output_dir", out,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def hub_cache_runs(classifier, tmp_path_factory) -> dict[str, Any]:
    """The commands of the tests below that read a Hub cache, all run offline in one fresh process
    (`run_cli_cases`, HF_HUB_CACHE set: huggingface_hub reads it when imported, so not in this process): one process
    rather than one per command, most of whose time would be importing torch and transformers.

    The cache holds `org/tiny` (the classifier) and the `BROKEN` repos; each command's output folder is under
    `root`, kept empty by a command that must fail. Returns the cache, the root and `runs`: name -> `run_cli_cases`'
    result."""
    folder, image = classifier
    root = tmp_path_factory.mktemp("hub_cache")
    cache = root / "cache"
    hub_cache_repo(cache, "org/tiny", folder)
    for repo, (broken, change) in BROKEN.items():
        bad = root / "copies" / repo
        bad.mkdir(parents=True)
        for path in folder.iterdir():
            data = path.read_bytes()
            (bad / path.name).write_bytes(change(data) if path.name == broken else data)
        hub_cache_repo(cache, repo, bad)
    commands = {
        **{f"predict {repo}": ["predict", repo, image] for repo in BROKEN},
        **{f"train {repo}": _train_from(repo, root / "train" / repo) for repo in BROKEN},
        "inspect org/weights-cut": ["inspect", "org/weights-cut", image, "--output_dir", root / "inspect"],
        "predict org/tiny": ["predict", "org/tiny", image, "--top_k", "2"],
        "predict local": ["predict", folder, image, "--top_k", "2"],
        "predict org/other": ["predict", "org/other", image],
    }
    env = {**ENV, "HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1"}
    results = run_cli_cases(list(commands.values()), cwd=root, env=env)
    runs = dict(zip(commands, results, strict=True))
    return {"cache": cache, "root": root, "runs": runs}


def error_line(result: dict[str, Any]) -> str:
    """The one error line of a `run_cli_cases` result, which must have exited with status 2."""
    assert result["code"] == 2, (result["code"], result["err"])
    return only_line(result["err"])


def test_a_repo_in_the_hub_cache_predicts_offline(hub_cache_runs):
    """HF_HUB_OFFLINE=1 is how a model from the Hub cache is used: a repo id the cache holds is not refused as
    'offline', and predicts as its local folder does."""
    runs, cache = hub_cache_runs["runs"], hub_cache_runs["cache"]
    cached, local = runs["predict org/tiny"], runs["predict local"]
    assert cached["code"] == 0, cached["err"]
    assert local["code"] == 0, local["err"]
    # the same model and image: the same line after the input's name
    assert cached["out"].split("\t")[1:] == local["out"].split("\t")[1:], (cached["out"], local["out"])
    assert len(cached["out"].split("\t")) > 1, cached["out"]  # a prediction line, not two empty outputs
    # a repo the cache does not hold is still refused before anything loads
    assert error_line(runs["predict org/other"]) == (
        f"energyformers predict: error: model folder 'org/other': no such local folder, and the Hub is offline "
        f"(HF_HUB_OFFLINE=1) and its cache ({cache}) holds no such repo, so it cannot be a Hub repo either"
    )


def test_a_cached_repo_with_an_invalid_config_is_named_by_its_config_error(hub_cache_runs):
    """A repo the Hub served (here: the cache) whose config the family's checks refuse is reported in the config's
    own words, one line, status 2, not as a repo the Hub did not serve."""
    line = error_line(hub_cache_runs["runs"]["predict org/config-invalid"])
    assert line.startswith("energyformers predict: error: cannot load a model from 'org/config-invalid': "), (
        line
    )
    assert "invalid image_size=8; both sides must be divisible by patch_size=3" in line, line
    assert "did not serve" not in line, line


def test_inspect_words_weights_that_cannot_load_as_predict_does(hub_cache_runs):
    """inspect and predict report the same weights that cannot load in the same words (`predict.cannot_load`)."""
    runs = hub_cache_runs["runs"]
    lines = {
        command: error_line(runs[f"{command} org/weights-cut"]).removeprefix(
            f"energyformers {command}: error: "
        )
        for command in ("predict", "inspect")
    }
    assert lines["inspect"] == lines["predict"], lines
    assert "model.safetensors" in lines["inspect"], lines
    assert not (hub_cache_runs["root"] / "inspect").exists()


@pytest.mark.parametrize("repo", list(BROKEN))
def test_train_words_a_checkpoint_that_cannot_load_as_predict_does(hub_cache_runs, repo):
    """`train --from_pretrained` reports a repo whose config or weights cannot load in predict's words
    (`predict.cannot_load`), the argument named as train names it, on one line."""
    runs = hub_cache_runs["runs"]
    predicted = error_line(runs[f"predict {repo}"])
    trained = error_line(runs[f"train {repo}"])
    expected = predicted.removeprefix("energyformers predict: error: ").replace(
        "model folder ", "--from_pretrained ", 1
    )
    assert trained == f"energyformers train: error: {expected}", (trained, predicted)
    assert not (hub_cache_runs["root"] / "train" / repo).exists()


def test_a_cached_repo_with_a_broken_config_file_is_named_as_the_broken_copy(hub_cache_runs):
    """A repo whose copy in the Hub cache has a config.json that is no JSON (a download cut short) is reported as
    that broken copy, naming the file, not as a repo the Hub did not serve."""
    line = error_line(hub_cache_runs["runs"]["predict org/config-cut"])
    cache = hub_cache_runs["cache"]
    assert line.startswith(
        f"energyformers predict: error: model folder 'org/config-cut': no such local folder, and its copy in the "
        f"Hub cache ({cache}) is broken ("
    ), line
    assert (
        f"{cache}/models--org--config-cut/snapshots/" in line
        and "config.json' is not a valid JSON file" in line
    ), line
    assert "did not serve" not in line, line


def test_train_from_pretrained_takes_a_repo_in_the_hub_cache_offline(classifier, tmp_path, monkeypatch):
    """`train --from_pretrained` shares the check (`setup.check_pretrained_source`): a cached repo id passes
    offline, and transformers then loads its config from the cache; an uncached one is refused."""
    from huggingface_hub import constants

    from energyformers.training.setup import check_pretrained_source

    folder, _ = classifier
    cache = tmp_path / "cache"
    hub_cache_repo(cache, "org/tiny", folder)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    check_pretrained_source("org/tiny")
    config = transformers.AutoConfig.from_pretrained("org/tiny", cache_dir=cache)
    assert config.model_type == "hyperset", config
    with pytest.raises(
        cli.UsageError, match=r"--from_pretrained 'org/other': no such local folder, and the Hub"
    ):
        check_pretrained_source("org/other")


@pytest.mark.parametrize("command", ["predict", "inspect"])
def test_a_folder_of_another_model_type_is_named_as_export_names_it(
    tmp_path, capsys, no_model_loads, command
):
    folder = tmp_path / "bertdir"
    config = transformers.BertConfig(
        vocab_size=32, hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8
    )
    torch.manual_seed(0)
    transformers.BertForSequenceClassification(config).save_pretrained(folder)
    capsys.readouterr()  # save_pretrained's progress bar
    extra = ["--output_dir", str(tmp_path / "out")] if command == "inspect" else []
    assert cli.main([command, str(folder), "hello", *extra]) == 2
    line = only_line(capsys.readouterr().err)
    assert f"{folder / 'config.json'}: model_type='bert' is not an energyformers family" in line, line
    assert "classifies images" not in line, line


def test_predict_runs_the_model_types_the_package_registers():
    from energyformers.registry import TRANSFORMERS_BASELINES

    expected = {*energyformers.FAMILIES, *energyformers.BASELINES, *TRANSFORMERS_BASELINES}
    assert set(predict.MODEL_TYPES) == expected, (predict.MODEL_TYPES, sorted(expected))
    assert set(inspect.MODEL_TYPES) == {*energyformers.FAMILIES, *energyformers.BASELINES}


# ------------------------------------------------------------------------------- --version


def test_version_prints_the_package_version_without_importing_torch():
    program = (
        "import sys; from energyformers.training import cli; code = cli.main(['--version']); "
        "print('torch' in sys.modules); sys.exit(code)"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == [f"energyformers {energyformers.__version__}", "False"], done.stdout
