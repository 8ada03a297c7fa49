"""`energyformers release --take` with a Sudoku run: its summary row, the paths it prints, and that a failure late
in the release leaves `--dist_dir` as it was (the rest of release is covered in tests/test_export.py)."""

from __future__ import annotations

import json
import os
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
from card_fixtures import tiny_sudoku, train_sudoku_run

from energyformers.training import release


@pytest.fixture(scope="module")
def sudoku_run(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """A finished Hyper-SET Sudoku run folder; its few puzzles stay cached for the `inspect` that release runs."""
    root = tmp_path_factory.mktemp("sudoku")
    with tiny_sudoku(root / "cache"):
        yield train_sudoku_run(root / "hyperset-sudoku")


@pytest.fixture(scope="module")
def inspected_run(sudoku_run: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A copy of the run that release takes as already inspected (an inspect.json naming no figure), so the tests of
    what happens after the export need no `energyformers inspect` subprocess."""
    folder = tmp_path_factory.mktemp("inspected") / sudoku_run.name
    shutil.copytree(sudoku_run, folder)
    (folder / "inspect.json").write_text('{"figures": []}\n')
    return folder


def tree(folder: Path) -> dict[str, bytes]:
    """Every file under `folder` (hidden ones too) with its bytes."""
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def test_release_of_a_sudoku_run_prints_its_metrics_and_the_final_paths(sudoku_run, tmp_path, capsys):
    dist = tmp_path / "dist"
    assert release.main(["--take", str(sudoku_run), "--dist_dir", str(dist)]) == 0, capsys.readouterr().err
    printed = capsys.readouterr().out
    test = json.loads((sudoku_run / "metrics.json").read_text())["test"]
    row = (
        f"{'hyperset-sudoku':<32} blank-cell accuracy {test['blank_cell_accuracy']:.4f}, board accuracy "
        f"{test['board_accuracy']:.4f}"
    )
    assert row in printed.splitlines(), (row, printed)
    assert sorted(p.name for p in dist.iterdir()) == ["hyperset-sudoku", "release.json"]  # no staging left
    summary = json.loads((dist / "release.json").read_text())
    assert summary["released"]["hyperset-sudoku"]["test"] == test and summary["failed"] == {}, summary
    # the files `inspect` wrote are printed where they are once release is done, inside the exported folder
    written = [Path(line) for line in printed.splitlines() if line.endswith((".png", ".json"))]
    assert dist / "hyperset-sudoku" / "inspect.json" in written, printed
    for path in written:
        assert path.parent == dist / "hyperset-sudoku" and path.is_file(), (path, printed)


def test_summary_rows_show_a_dash_for_a_metric_the_run_did_not_record():
    assert release.summary_row("m-sudoku", {"blank_cell_accuracy": 0.5}) == (
        f"{'m-sudoku':<32} blank-cell accuracy 0.5000, board accuracy —"
    )
    assert release.summary_row("m-digits", {"accuracy": 0.25}) == f"{'m-digits':<32} {'0.2500':>9} {'—':>9}"
    assert release.summary_row("m-mim-digits", {"masked_token_accuracy": 0.5}) == (
        f"{'m-mim-digits':<32} masked-token accuracy 0.5000, PSNR — dB (tokenizer bound — dB)"
    )


def _older_release(dist: Path) -> dict[str, bytes]:
    """A `--dist_dir` holding an older release of the same name, as a file tree."""
    (dist / "hyperset-sudoku").mkdir(parents=True)
    (dist / "hyperset-sudoku" / "README.md").write_text("an older export\n")
    (dist / "release.json").write_text('{"released": {}, "failed": {}}\n')
    return tree(dist)


@pytest.mark.parametrize("existing", [True, False], ids=["older-release", "new-dist-dir"])
def test_a_failure_while_writing_release_json_leaves_dist_as_it_was(
    inspected_run, tmp_path, capsys, monkeypatch, existing
):
    """The summary cannot be written (a full disk): everything exported is gone again, an older release of the same
    name is intact, and a --dist_dir the run created is removed."""
    dist = tmp_path / "dist"
    before = _older_release(dist) if existing else None
    dumps = json.dumps

    def failing_dumps(obj, *args, **kwargs):
        if isinstance(obj, dict) and "released" in obj:
            raise OSError(28, "No space left on device")
        return dumps(obj, *args, **kwargs)

    monkeypatch.setattr(json, "dumps", failing_dumps)
    assert release.main(["--take", str(inspected_run), "--dist_dir", str(dist)]) == 1
    assert "No space left on device" in capsys.readouterr().err
    if existing:
        assert tree(dist) == before, sorted(tree(dist))
    else:
        assert not dist.exists(), sorted(tree(dist))


def test_a_failure_while_publishing_puts_the_older_release_back(inspected_run, tmp_path, capsys, monkeypatch):
    """The last step of publishing fails after the new folder was moved into place: it is removed and the older
    folder it replaced is back, byte for byte."""
    dist = tmp_path / "dist"
    before = _older_release(dist)
    replace = os.replace

    def failing_replace(src, dst, *args, **kwargs):
        if Path(dst).name == "release.json":
            raise OSError(5, "Input/output error")
        return replace(src, dst, *args, **kwargs)

    monkeypatch.setattr(os, "replace", failing_replace)
    assert release.main(["--take", str(inspected_run), "--dist_dir", str(dist)]) == 1
    assert "Input/output error" in capsys.readouterr().err
    assert tree(dist) == before, sorted(tree(dist))
