"""A full disk while a command writes is reported in one line naming the folder and "no space left on device" (an
exceeded quota: "disk quota exceeded"), status 1, with no traceback (`cli.full_disk_message`): an OSError with errno
ENOSPC / EDQUOT anywhere in the exception's chain, another error whose text names one (safetensors' Rust I/O error,
a RuntimeError of torch.save carrying it), and torch.save's stream failure, which names no cause,
when the folder the command writes to is on a full disk. The disk is filled in-process (the writer raises what it
raises on a full disk; the free space is reported as none), and for real on a small tmpfs where this test may mount
one (root)."""

from __future__ import annotations

import errno
import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest
import torch
from fixtures import cli_config

from energyformers.training import cli, train

RUN = [
    "--dataset", "digits", "--config", *cli_config("hyperset"), "--max_train_samples", "32",
    "--max_eval_samples", "16", "--max_test_samples", "16", "--batch_size", "8", "--num_predictions", "0",
    "--num_threads", "1", "--disable_tqdm", "--max_steps", "2", "--eval_strategy", "no",
]  # fmt: skip
# what torch.save to a path raises when the disk fills (torch 2.x's C++ stream, then its zip writer), in that chain
STREAM = "basic_ios::clear: iostream error"
ZIP_WRITER = "[enforce fail at inline_container.cc:672] . unexpected pos 704 vs 598"


def torch_stream_failure() -> RuntimeError:
    try:
        try:
            raise RuntimeError(STREAM)
        except RuntimeError:
            raise RuntimeError(ZIP_WRITER)  # noqa: B904 (the chain torch leaves: the second during the first)
    except RuntimeError as err:
        return err


def disk_free(monkeypatch: pytest.MonkeyPatch, free: int) -> None:
    usage = shutil.disk_usage("/")
    monkeypatch.setattr(cli.shutil, "disk_usage", lambda path: usage._replace(free=free))


def test_the_write_errors_of_a_full_disk_are_told_apart(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An ENOSPC / EDQUOT OSError as the exception's cause or context names its file's folder; a Rust I/O error
    the folder written to; torch's stream failure is a full disk only when that folder's disk is full."""
    target = tmp_path / "run.checkpoints" / "checkpoint-5" / "optimizer.pt"
    try:
        try:
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(target))
        except OSError as err:
            raise RuntimeError("saving failed") from err
    except RuntimeError as err:
        caused = err
    assert cli.full_disk_message(caused) == f"no space left on device writing in {target.parent}"
    quota = OSError(errno.EDQUOT, os.strerror(errno.EDQUOT))
    assert cli.full_disk_message(quota, [tmp_path]) == f"disk quota exceeded writing in {tmp_path}"
    rust = Exception("Error while serializing: I/O error: No space left on device (os error 28)")
    assert cli.full_disk_message(rust, [tmp_path]) == f"no space left on device writing in {tmp_path}"
    # an exceeded quota named in the text of an error that is no OSError, in each way a writer names an errno
    for text in (
        f"Error while serializing: I/O error: Disk quota exceeded (os error {errno.EDQUOT})",  # safetensors
        f'IoError(Os {{ code: {errno.EDQUOT}, kind: QuotaExceeded, message: "Disk quota exceeded" }})',
        f"[enforce fail at inline_container.cc:672] . [Errno {errno.EDQUOT}] Disk quota exceeded",  # torch.save
        f"PytorchStreamWriter failed writing file data/0: errno {errno.EDQUOT}",
    ):
        assert cli.full_disk_message(RuntimeError(text), [tmp_path]) == (
            f"disk quota exceeded writing in {tmp_path}"
        ), text
    assert (
        cli.full_disk_message(RuntimeError(f"[Errno {errno.EACCES}] Permission denied"), [tmp_path]) is None
    )

    stream = torch_stream_failure()
    disk_free(monkeypatch, 0)
    assert (
        cli.full_disk_message(stream, [tmp_path / "new"])
        == f"no space left on device writing in {tmp_path / 'new'}"
    )
    assert cli.full_disk_message(stream) is None  # no folder to look at: the traceback, as any failure
    disk_free(monkeypatch, 10 * cli.FULL_DISK_BYTES)
    assert cli.full_disk_message(stream, [tmp_path]) is None  # another write failure
    for other in (
        OSError(errno.EACCES, "Permission denied", "x"),
        RuntimeError("CUDA out of memory"),
        ValueError(),
    ):
        assert cli.full_disk_message(other, [tmp_path]) is None, other


@pytest.mark.parametrize("raised", ["OSError", "torch", "quota"])
def test_train_on_a_full_disk_says_so_in_one_line(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], raised: str
) -> None:
    """The first checkpoint's first torch.save (its training_args.bin) fails as on a full disk: status 1 and one
    error line naming the folder, no traceback; as an OSError ENOSPC it names the checkpoint's folder, as torch's
    own stream failure the folder the run writes in, whose disk has no space left; as a RuntimeError whose text
    carries EDQUOT, an exceeded quota (the disk has space) in that folder."""
    out = tmp_path / "run"

    def full(obj, f, *args, **kwargs):
        if raised == "OSError":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC), str(f))
        if raised == "quota":
            raise RuntimeError(
                f"[enforce fail at inline_container.cc:672] . [Errno {errno.EDQUOT}] Disk quota exceeded"
            )
        disk_free(monkeypatch, 0)  # what the partial file leaves
        raise torch_stream_failure()

    monkeypatch.setattr(torch, "save", full)
    assert train.main([*RUN, "--output_dir", str(out)]) == 1
    err = capsys.readouterr().err
    folder = out.with_name("run.checkpoints") / "checkpoint-2" if raised == "OSError" else tmp_path
    failure = "disk quota exceeded" if raised == "quota" else "no space left on device"
    line = f"energyformers train: error: {failure} writing in {folder}; free some space"
    errors = [text for text in err.splitlines() if "error" in text.lower()]
    assert len(errors) == 1 and errors[0].startswith(line), err[-3000:]
    assert "Traceback" not in err, err[-3000:]


@pytest.fixture
def small_tmpfs(tmp_path: Path):
    """A 64 KiB tmpfs mounted in `tmp_path` (root only; skipped where mounting is not allowed)."""
    mount = tmp_path / f"full-{uuid.uuid4().hex[:6]}"
    mount.mkdir()
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a tmpfs needs root")
    made = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", "size=64k", "tmpfs", str(mount)], capture_output=True
    )
    if made.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {made.stderr.decode().strip()}")
    try:
        yield mount
    finally:
        subprocess.run(["umount", str(mount)], check=True)


def test_train_on_a_real_full_disk(small_tmpfs: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """On a 64 KiB disk the first checkpoint does not fit: one line naming the folder, status 1."""
    assert train.main([*RUN, "--output_dir", str(small_tmpfs / "run")]) == 1
    err = capsys.readouterr().err
    assert f"energyformers train: error: no space left on device writing in {small_tmpfs}" in err, err[-3000:]
    assert "Traceback" not in err, err[-3000:]
