"""Where a command writes, checked before any work (`cli.check_output_folder`, `cli.check_output_file`): an output
under a file (`--output_dir notes.txt/run`), or whose folder (or, where it does not exist yet, the nearest folder
above it) is not writable, is one line naming the flag and the path, status 2, and nothing is written."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
import torch
from fixtures import cli_config, run_cli_cases
from safetensors.torch import save_file

from energyformers.training import cli


def model_folder(folder: Path) -> Path:
    """A config and a readable one-tensor safetensors file: what export checks before it looks at its output."""
    folder.mkdir()
    config = {
        "model_type": "hyperset",
        "input_type": "image",
        "architectures": ["HyperSetForImageClassification"],
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


def writing_commands(tmp: Path, out: Path) -> dict[str, tuple[list[str], str]]:
    """Case -> (`energyformers` argv writing to `out` or a file in it, the flag as the error names it): every command
    that writes a folder or a file given on its command line (push writes only a temporary folder; convert's
    outputs are not checked here yet)."""
    model = tmp / "model" if (tmp / "model").is_dir() else model_folder(tmp / "model")
    tiny = "--max_steps 1 --max_train_samples 8 --max_eval_samples 8 --max_test_samples 8".split()
    tiny += ["--config", *cli_config("hyperset")]
    return {
        "train": (["train", "--output_dir", str(out), *tiny], "--output_dir"),
        "train-accelerate": (["train-accelerate", "--output_dir", str(out), *tiny], "--output_dir"),
        "export": (["export", str(model), str(out)], "OUT_DIR"),
        "inspect": (["inspect", "--landscape", "--output_dir", str(out)], "--output_dir"),
        "predict": (["predict", str(tmp / "nowhere"), "x.png", "--output_dir", str(out)], "--output_dir"),
        "release runs": (["release", "--runs_dir", str(out), "--dry_run"], "--runs_dir"),
        "release dist": (["release", "--dist_dir", str(out), "--dry_run"], "--dist_dir"),
        "evaluate": (
            ["evaluate", str(tmp / "nowhere"), "--dataset", "digits", "--output_file", str(out / "m.json")],
            "--output_file",
        ),
    }


def tree(folder: Path) -> dict[str, bytes | None]:
    """Every entry under `folder` (hidden ones too), files with their bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() if p.is_file() else None for p in folder.rglob("*")}


def test_an_output_under_a_file_is_refused_naming_the_flag_before_any_work(tmp_path):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    cases = writing_commands(tmp_path, notes / "run")
    before = tree(tmp_path)
    results = dict(zip(cases, run_cli_cases([argv for argv, _ in cases.values()], cwd=tmp_path), strict=True))
    for name, (argv, flag) in cases.items():
        result = results[name]
        lines = result["err"].strip().splitlines()
        path = argv[argv.index(flag) + 1] if flag.startswith("-") else argv[2]
        expected = f"energyformers {argv[0]}: error: {flag} {path}: "
        one_line = len(lines) == 1 and lines[0].startswith(expected)
        assert result["code"] == 2 and one_line, (name, expected, result)
        if name != "evaluate":  # evaluate words it its own way (the folder of --output_file must exist)
            assert f"{notes} is a file" in lines[0], (name, lines)
        assert result["heavy"] == [], f"{name}: imported {result['heavy']} before refusing"
    assert tree(tmp_path) == before, sorted(set(tree(tmp_path)) ^ set(before))


@pytest.fixture
def locked(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A folder `os.access` says cannot be written, as for a user without the permission or on a read-only
    filesystem (the tests run as root, which permissions do not stop)."""
    folder = tmp_path / "locked"
    folder.mkdir()
    access = os.access

    def no_writing_in_locked(path: str | os.PathLike, mode: int, **kwargs: object) -> bool:
        if mode & os.W_OK and Path(path).absolute() == folder:
            return False
        return access(path, mode, **kwargs)

    monkeypatch.setattr(os, "access", no_writing_in_locked)
    return folder


COMMANDS = ["train", "train-accelerate", "export", "inspect", "predict", "release runs", "release dist"]


# evaluate creates no folder: its --output_file goes into an existing one (refused otherwise), the locked one here
@pytest.mark.parametrize(
    ("command", "inside"),
    [(c, False) for c in [*COMMANDS, "evaluate"]] + [(c, True) for c in COMMANDS],
    ids=lambda value: {False: "the-folder", True: "the-folder-above"}.get(value, value),
)
def test_an_output_that_cannot_be_written_is_refused_naming_the_folder(
    tmp_path, locked, capsys, command, inside
):
    """`locked` itself, or a new folder in it, as the output (for evaluate, a file in it): refused in one line naming
    the flag, the path and the folder that cannot be written; nothing is written."""
    out = locked / "out" if inside else locked
    argv, flag = writing_commands(tmp_path, out)[command]
    before = tree(tmp_path)
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    path = argv[argv.index(flag) + 1] if flag.startswith("-") else argv[2]
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyformers {argv[0]}: error: {flag} {path}: "), err
    assert f"{locked} is not writable" in lines[0], err
    assert tree(tmp_path) == before, sorted(set(tree(tmp_path)) ^ set(before))


def test_a_folder_without_write_permission_is_refused_for_a_user(tmp_path, capsys):
    """Real permissions (the test above emulates them): a user who may not write into the folder is refused."""
    folder = tmp_path / "readonly"
    folder.mkdir()
    folder.chmod(0o555)
    try:
        if os.access(folder, os.W_OK):
            pytest.skip("running as root: permissions do not stop it (the emulated test above covers root)")
        assert cli.main(["inspect", "--landscape", "--output_dir", str(folder / "out")]) == 2
        assert f"the folder {folder} is not writable" in capsys.readouterr().err
        assert list(folder.iterdir()) == []
    finally:
        folder.chmod(0o755)


def test_check_output_file_refuses_what_cannot_be_written_and_allows_new_folders(tmp_path, locked):
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    refusals = {
        str(tmp_path): "is a folder, not a file",
        str(notes / "out.json"): f"{notes} is a file",
        str(locked / "out.json"): f"the folder {locked} is not writable",
        str(locked / "new" / "out.json"): f"the folder {locked} is not writable",
        str(notes): "the file exists; pass --overwrite",
    }
    for path, fragment in refusals.items():
        with pytest.raises(cli.UsageError) as refused:
            cli.check_output_file(path, "--output", "--overwrite")
        assert str(refused.value).startswith(f"--output {path}: ") and fragment in str(refused.value), (
            path,
            str(refused.value),
        )
    assert cli.check_output_file(notes, "--output", "--overwrite", overwrite=True) == notes
    # no overwrite flag: an existing file is replaced as a matter of course
    assert cli.check_output_file(notes, "--output") == notes
    new = tmp_path / "a" / "b" / "out.json"  # its folders are created by the command
    assert cli.check_output_file(new, "--output", "--overwrite") == new
    with pytest.raises(FileExistsError, match="the file exists"):
        cli.check_output_file(notes, "out", "overwrite=True", error=FileExistsError)


def test_an_api_caller_gets_the_os_error_of_a_folder_that_cannot_be_written(tmp_path, locked):
    """The Python API's `error` (export_model_dir: FileExistsError) is for the target itself; an output under a file
    or in a folder that is not writable is the NotADirectoryError / PermissionError it is."""
    notes = tmp_path / "notes.txt"
    notes.write_text("my notes\n")
    cases = {
        notes / "out": (NotADirectoryError, f"{notes} is a file"),
        locked / "out": (PermissionError, f"the folder {locked} is not writable"),
    }
    for path, (kind, fragment) in cases.items():
        for check in (cli.check_output_folder, cli.check_output_file):
            with pytest.raises(kind, match=re.escape(fragment)):
                check(path, "out_dir", "overwrite=True", error=FileExistsError)
    with pytest.raises(FileExistsError, match="is a file, not a folder"):
        cli.check_output_folder(notes, "out_dir", "overwrite=True", error=FileExistsError)
