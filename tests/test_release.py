"""`energyformers release --take` with a Sudoku run: its summary row, the paths it prints, and that a failure late
in the release leaves `--dist_dir` as it was (the rest of release is covered in tests/test_export.py)."""

from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest
from card_fixtures import tiny_sudoku, train_sudoku_run

from energyformers.training import release
from energyformers.training.export import export_model_dir


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


def test_two_releases_of_a_run_are_the_same_bytes_and_name_no_local_folder(sudoku_run, tmp_path, capsys):
    """`--take` inspects a copy in a staging folder of random name: the published inspect.json names the model by
    its release name, not by that folder (removed afterwards) or the run's, so two releases differ only in
    release.json's absolute folders."""
    dists = [tmp_path / "first", tmp_path / "second"]
    for dist in dists:
        assert release.main(["--take", str(sudoku_run), "--dist_dir", str(dist)]) == 0, (
            capsys.readouterr().err
        )
    first, second = (tree(dist / "hyperset-sudoku") for dist in dists)
    differing = sorted(name for name in first.keys() | second.keys() if first.get(name) != second.get(name))
    assert differing == [], {name: (first.get(name), second.get(name)) for name in differing}
    report = json.loads(first["inspect.json"])
    assert report["model_dir"] == "hyperset-sudoku", report["model_dir"]
    for local in (str(tmp_path), str(sudoku_run)):
        assert local.encode() not in first["inspect.json"], (local, first["inspect.json"][:300])
    summaries = [json.loads((dist / "release.json").read_text()) for dist in dists]
    for summary, dist in zip(summaries, dists):
        assert summary["released"]["hyperset-sudoku"].pop("folder") == str(dist / "hyperset-sudoku"), summary
    assert summaries[0] == summaries[1], summaries


def test_an_export_names_the_model_by_its_hub_id_or_folder_name_in_inspect_json(inspected_run, tmp_path):
    """What `inspect` recorded as local paths (the model folder, a decoded image) is published without them; the
    run's own inspect.json keeps them."""
    folder = tmp_path / "run"
    shutil.copytree(inspected_run, folder)
    dataset = str(tmp_path / "data" / "puzzles")  # a local --dataset folder
    local = {
        "figures": [],
        "model_dir": str(folder),
        "inputs": f"{dataset} (test, first batch)",
        "accuracy_vs_iterations": {"dataset": dataset, "split": "test"},
        "accuracy": {"dataset": "sudoku", "split": "test"},  # a built-in name stays as given
        "mim": {"image": str(tmp_path / "images" / "seven.png")},
    }
    (folder / "inspect.json").write_text(json.dumps(local, indent=1) + "\n")
    for repo_id, out, name in [
        (None, tmp_path / "hub" / "my-model", "my-model"),
        ("me/sudoku", tmp_path / "x", "me/sudoku"),
    ]:
        export_model_dir(folder, out, repo_id=repo_id)
        published = json.loads((out / "inspect.json").read_text())
        assert published == {
            "figures": [],
            "model_dir": name,
            "inputs": "puzzles (test, first batch)",
            "accuracy_vs_iterations": {"dataset": "puzzles", "split": "test"},
            "accuracy": {"dataset": "sudoku", "split": "test"},
            "mim": {"image": "seven.png"},
        }, published
    assert json.loads((folder / "inspect.json").read_text()) == local


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
    assert "no space left on device" in capsys.readouterr().err.lower()
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


# ------------------------------------------------------------------------- the train flags after `--`


@pytest.mark.parametrize(
    ("forwarded", "message"),
    [
        (
            ["--output_dir", "elsewhere"],
            "--output_dir elsewhere (after --): release sets --output_dir itself",
        ),
        (["--output-dir=elsewhere"], "--output-dir elsewhere (after --): release sets --output_dir itself"),
        (["--overwrite_output_dir", "False"], "--overwrite_output_dir False (after --): release sets"),
        (["--task", "mim"], "--task mim (after --): release sets --task itself"),
        (["--model", "imixer"], "--model imixer (after --): release sets --model itself"),
        (["--dataset", "spam"], "--dataset spam (after --): release sets --dataset itself"),
        (["--help"], "--help (after --): `energyformers train --help` lists the flags"),
        (
            ["--max_steps", "0"],
            "--max_steps 0: expected -1 (off) or an integer >= 1 (in `energyformers train ",
        ),
        (["--bogus"], "unrecognized arguments: --bogus (in `energyformers train --model hyperset --dataset"),
        (
            ["--sudoku_augmentation"],
            "--sudoku_augmentation: --dataset digits is not a Sudoku dataset; the symmetries apply to the built-in "
            "boards only (sudoku, sudoku-hard) (in `energyformers train --model hyperset --dataset digits ",
        ),
    ],
    ids=[
        "output_dir",
        "output-dir=",
        "overwrite_output_dir",
        "task",
        "model",
        "dataset",
        "help",
        "bad-value",
        "unknown",
        "not-for-this-dataset",
    ],
)
def test_release_refuses_bad_or_its_own_train_flags_in_a_dry_run(tmp_path, capsys, forwarded, message):
    """The flags after `--` are read by train's own parser, for each run, before the plan is printed; a flag release
    sets itself would override its own (the last one wins) and is refused, saying why."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = ["--models", "hyperset", "--datasets", "digits", "--runs_dir", str(runs), "--dist_dir", str(dist)]
    assert release.main([*argv, "--dry_run", "--", *forwarded]) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"energyformers release: error: {message}"), (
        message,
        lines,
    )
    assert captured.out == "" and list(tmp_path.iterdir()) == [], (captured.out, list(tmp_path.iterdir()))


def test_a_bad_train_flag_is_a_usage_error_before_any_run_starts(tmp_path, capsys):
    """Not a training run that fails (status 1) with an empty release.json: status 2 and nothing written."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = ["--models", "hyperset", "--datasets", "digits", "--runs_dir", str(runs), "--dist_dir", str(dist)]
    assert release.main([*argv, "--", "--learning_rate", "-1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith(
        "energyformers release: error: --learning_rate -1.0: expected a finite learning rate"
    ), err
    assert list(tmp_path.iterdir()) == [], list(tmp_path.iterdir())


def test_release_refuses_train_flags_with_take(inspected_run, tmp_path, capsys):
    """--take trains nothing, so flags for the training runs would be dropped without a word: refused, naming them
    with a token's value redacted."""
    dist = tmp_path / "dist"
    train_args = ["--max_steps", "2", "--hub_token", "hf_SECRET123"]
    assert release.main(["--take", str(inspected_run), "--dist_dir", str(dist), "--", *train_args]) == 2
    err = capsys.readouterr().err
    assert err == (
        "energyformers release: error: -- --max_steps 2 --hub_token '<HUB_TOKEN>': flags for the training runs, but "
        "--take trains nothing; leave them out\n"
    ), err
    assert not dist.exists()


@pytest.mark.parametrize(
    ("metrics_json", "reason"),
    [
        ("not json\n", "metrics.json: not valid JSON"),
        (
            '{"model": "vit", "dataset": "digits", "test": {"accuracy": "high"}}',
            "test={'accuracy': 'high'}; expected the run's test metrics, an object of numbers",
        ),
    ],
    ids=["not-json", "test-not-numbers"],
)
def test_a_baseline_with_an_unreadable_metrics_json_is_a_failure_of_its_own(
    tmp_path, capsys, monkeypatch, metrics_json, reason
):
    """A finished baseline run whose metrics.json is not a train run's, or holds test metrics the summary cannot
    show, is reported as failed, as an unreadable model folder is, and release.json still records the rest; not a
    crash that publishes nothing."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    baseline = runs / "vit-digits"
    baseline.mkdir(parents=True)
    for name in ("config.json", "model.safetensors"):
        (baseline / name).write_text("{}")
    (baseline / "metrics.json").write_text(metrics_json)
    # the family's run is the one trained here, and its training fails: only the baseline is left to read
    monkeypatch.setattr(
        release.subprocess, "run", lambda command, **kwargs: subprocess.CompletedProcess(command, 1)
    )
    argv = ["--models", "hyperset", "--baselines", "vit", "--datasets", "digits", "--runs_dir", str(runs)]
    assert release.main([*argv, "--dist_dir", str(dist)]) == 1
    err = capsys.readouterr().err
    summary = json.loads((dist / "release.json").read_text())
    assert sorted(summary["failed"]) == sorted([str(runs / "hyperset-digits"), str(baseline)]), (summary, err)
    assert reason in summary["failed"][str(baseline)], (reason, summary)
    assert summary["baselines"] == {} and summary["released"] == {}, summary
    assert f"energyformers release: error: {baseline}: " in err and "Traceback" not in err, err


# ------------------------------------------------------------------ one run's broken file fails that run only


def _released_beside(inspected_run: Path, runs: Path, dataset: str | None = None, **metrics) -> Path:
    """A finished, already inspected copy of the Sudoku run under `runs`, released as `hyperset-<dataset>`
    (its metrics.json updated with `metrics`); release reuses it as it is."""
    dataset = dataset or json.loads((inspected_run / "metrics.json").read_text())["dataset"]
    folder = runs / release.run_dir_name("hyperset", dataset)
    shutil.copytree(inspected_run, folder)
    record = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**record, "dataset": dataset, **metrics}))
    return folder


def _assert_failed_alone(dist: Path, broken: Path, reason: str, released: list[str], err: str) -> None:
    """release.json lists `broken` as the one failure, for `reason`, and publishes the `released` runs."""
    summary = json.loads((dist / "release.json").read_text())
    assert list(summary["failed"]) == [str(broken)], (summary, err)
    assert reason in summary["failed"][str(broken)], (reason, summary)
    assert sorted(summary["released"]) == released, summary
    assert sorted(p.name for p in dist.iterdir()) == [*released, "release.json"], sorted(dist.iterdir())
    assert f"energyformers release: error: {broken}: " in err and "Traceback" not in err, err


@pytest.mark.parametrize(
    ("metrics_json", "unreadable", "reason"),
    [
        ("not json\n", False, "metrics.json: not valid JSON"),
        ("[]\n", False, "metrics.json: holds a JSON list, not an object"),
        ('{"model": "hyperset", "dataset": ["digits"]}', False, 'dataset=["digits"] is not a string'),
        ('{"model": "hyperset"}', False, "metrics.json: no 'dataset' (a string)"),
        ('{"model": "", "dataset": "digits"}', False, 'metrics.json: model="" is not a name'),
        (
            '{"model": "hyperset", "dataset": "digits"}',
            True,
            "metrics.json: cannot be read (Permission denied)",
        ),
    ],
    ids=["not-json", "not-an-object", "dataset-not-a-name", "no-dataset", "empty-model", "unreadable"],
)
def test_a_run_trained_here_with_a_broken_metrics_json_is_a_failure_of_its_own(
    inspected_run, tmp_path, capsys, monkeypatch, metrics_json, unreadable, reason
):
    """A run release trains whose metrics.json it cannot read (the folders of --take are checked up front, these
    only once trained) is reported as failed before it is inspected; the finished run beside it is published."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    good = _released_beside(inspected_run, runs)
    broken = runs / "hyperset-digits"
    commands: list[list[str]] = []

    def fake_run(command, **kwargs):  # the training writes the folder; an `inspect` of it would fail
        shlex.join(command)  # refuses an argument that is not text, as subprocess does
        commands.append(command)
        if command[3] != "train":
            return subprocess.CompletedProcess(command, 1)
        broken.mkdir(parents=True)
        for name in ("config.json", "model.safetensors"):
            (broken / name).write_text("{}")
        (broken / "metrics.json").write_text(metrics_json)
        return subprocess.CompletedProcess(command, 0)

    monkeypatch.setattr(release.subprocess, "run", fake_run)
    if unreadable:  # root reads any file, whatever its mode: the read itself fails
        read_text = Path.read_text

        def denied(self, *args, **kwargs):
            if self == broken / "metrics.json":
                raise PermissionError(13, "Permission denied", str(self))
            return read_text(self, *args, **kwargs)

        monkeypatch.setattr(Path, "read_text", denied)
    argv = ["--models", "hyperset", "--datasets", "digits", "sudoku", "--runs_dir", str(runs)]
    assert release.main([*argv, "--dist_dir", str(dist)]) == 1
    err = capsys.readouterr().err
    _assert_failed_alone(dist, broken, reason, [good.name], err)
    assert [command[3] for command in commands] == ["train"], commands  # never inspected


@pytest.mark.parametrize(
    ("metrics", "reason"),
    [
        ({"test": {"board_accuracy": "high"}}, "expected the run's test metrics, an object of numbers"),
        ({"test": [0.5]}, "test=[0.5]; expected the run's test metrics"),
        ({}, "[Errno 13] Permission denied"),
    ],
    ids=["test-not-numbers", "test-not-an-object", "weights-unreadable"],
)
def test_a_finished_run_that_cannot_be_exported_or_summed_up_is_a_failure_of_its_own(
    inspected_run, tmp_path, capsys, monkeypatch, metrics, reason
):
    """A finished run that release reuses, with test metrics the summary cannot show or a file the export cannot
    read, is reported as failed; the run beside it is published (not a crash that publishes nothing)."""
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    good = _released_beside(inspected_run, runs)
    broken = _released_beside(inspected_run, runs, "sudoku-hard", **metrics)
    copyfile = shutil.copyfile

    def denied(src, dst, *args, **kwargs):
        if not metrics and Path(src) == broken / "model.safetensors":
            raise PermissionError(13, "Permission denied", str(src))
        return copyfile(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copyfile", denied)
    argv = ["--models", "hyperset", "--datasets", "sudoku", "sudoku-hard", "--runs_dir", str(runs)]
    assert release.main([*argv, "--dist_dir", str(dist)]) == 1
    _assert_failed_alone(dist, broken, reason, [good.name], capsys.readouterr().err)


def test_a_taken_folder_that_cannot_be_copied_is_a_failure_of_its_own(
    inspected_run, tmp_path, capsys, monkeypatch
):
    """A --take folder is inspected in a copy; a file of it that cannot be read fails that folder, and the other
    folder taken is published."""
    broken = tmp_path / "taken" / "hyperset-sudoku-hard"
    shutil.copytree(inspected_run, broken, ignore=shutil.ignore_patterns("inspect.json"))  # to be inspected
    record = json.loads((broken / "metrics.json").read_text())
    (broken / "metrics.json").write_text(json.dumps({**record, "dataset": "sudoku-hard"}))
    copytree = shutil.copytree

    def denied(src, dst, *args, **kwargs):
        if Path(src) == broken:
            raise shutil.Error(
                [(str(broken / "training_curve.png"), str(dst), "[Errno 13] Permission denied")]
            )
        return copytree(src, dst, *args, **kwargs)

    monkeypatch.setattr(shutil, "copytree", denied)
    dist = tmp_path / "dist"
    assert release.main(["--take", str(broken), str(inspected_run), "--dist_dir", str(dist)]) == 1
    reason = "cannot copy it to inspect it: "
    _assert_failed_alone(dist, broken, reason, ["hyperset-sudoku"], capsys.readouterr().err)


@pytest.mark.parametrize(
    ("dataset", "name"),
    [
        (
            "/home/alice/data/puzzles.csv",
            "hyperset-puzzles",
        ),  # a local data file: its stem, as the card names it
        ("puzzles.tsv", "hyperset-puzzles"),
        ("/home/alice/data/puzzles", "hyperset-puzzles"),  # a local folder: its name
        ("org/puzzles", "hyperset-puzzles"),  # a Hub dataset: its repository's name
    ],
)
def test_release_names_its_folders_as_the_card_names_the_model(
    inspected_run, tmp_path, capsys, dataset, name
):
    """The run folder release trains into, the folder it exports to, release.json and the card's model name are one
    name: `<model>-<dataset>` with a local data file by its stem (no `.csv`)."""
    assert release.run_dir_name("hyperset", dataset) == name, (
        dataset,
        release.run_dir_name("hyperset", dataset),
    )
    folder = tmp_path / "taken"
    shutil.copytree(inspected_run, folder)
    record = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**record, "dataset": dataset}))
    dist = tmp_path / "dist"
    assert release.main(["--take", str(folder), "--dist_dir", str(dist)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in dist.iterdir()) == [name, "release.json"], sorted(dist.iterdir())
    assert list(json.loads((dist / "release.json").read_text())["released"]) == [name]
    from huggingface_hub import ModelCard

    card = ModelCard.load(dist / name / "README.md")
    assert card.data.model_name == name, (card.data.model_name, name)


def test_two_datasets_of_one_name_are_refused_before_anything_trains(tmp_path, capsys):
    """`reviews.csv` and `reviews.tsv` are both `<model>-reviews`: one run folder and one release for two datasets."""
    for suffix in (".csv", ".tsv"):
        (tmp_path / f"reviews{suffix}").write_text("text,label\na,0\n")
    datasets = [str(tmp_path / "reviews.csv"), str(tmp_path / "reviews.tsv")]
    runs = tmp_path / "runs"
    assert release.main(["--datasets", *datasets, "--runs_dir", str(runs), "--dry_run"]) == 2
    err = capsys.readouterr().err
    expected = (
        f"energyformers release: error: --datasets {' '.join(datasets)}: both would be trained into and "
    )
    assert err.startswith(expected) and "<model>-reviews" in err, err
    assert not runs.exists(), sorted(runs.iterdir())


def test_the_release_name_comes_from_config_json_not_from_the_run_record(inspected_run, tmp_path, capsys):
    """metrics.json's `model` is not what decides where a --take folder is released (an absolute one replaced
    --dist_dir): config.json's model_type names the folder, as the card names the model."""
    folder = tmp_path / "taken" / inspected_run.name
    shutil.copytree(inspected_run, folder)
    outside = tmp_path / "outside" / "pwned"
    record = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**record, "model": str(outside)}))
    dist = tmp_path / "dist"
    assert release.main(["--take", str(folder), "--dist_dir", str(dist)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dist", "taken"], sorted(tmp_path.iterdir())
    assert sorted(p.name for p in dist.iterdir()) == ["hyperset-sudoku", "release.json"], sorted(
        dist.iterdir()
    )


def test_a_release_name_is_worked_out_once_for_the_steps_after_training(
    inspected_run, tmp_path, capsys, monkeypatch
):
    """Each name reads the folder's config.json: `--take`'s check works it out before anything runs, then the run
    once for the steps after training (the inspect's printed paths, the export, the baselines' entries)."""
    worked_out: list[Path] = []
    name_of = release._release_name

    def counted(run_dir: Path, metrics: dict) -> str:
        worked_out.append(run_dir)
        return name_of(run_dir, metrics)

    monkeypatch.setattr(release, "_release_name", counted)
    dist = tmp_path / "dist"
    assert release.main(["--take", str(inspected_run), "--dist_dir", str(dist)]) == 0, capsys.readouterr().err
    assert sorted(p.name for p in dist.iterdir()) == ["hyperset-sudoku", "release.json"], sorted(
        dist.iterdir()
    )
    assert worked_out == [inspected_run, inspected_run], (
        f"names worked out for {worked_out}, expected 2 (check, run)"
    )


@pytest.mark.parametrize(
    ("dataset", "name", "problem"),
    [
        ("org/" + "x" * 300, "hyperset-" + "x" * 300, "is longer than a folder name may be (255 bytes)"),
        ("sudoku\n## Verified", "hyperset-sudoku\n## Verified", "holds a control character"),
    ],
)
def test_a_release_name_that_is_not_one_folder_name_is_refused_before_anything_is_written(
    inspected_run, tmp_path, capsys, dataset, name, problem
):
    """A name made of a run record's dataset that is no folder name: a usage error naming the folder, nothing
    written."""
    folder = tmp_path / "taken"
    shutil.copytree(inspected_run, folder)
    record = json.loads((folder / "metrics.json").read_text())
    (folder / "metrics.json").write_text(json.dumps({**record, "dataset": dataset}))
    dist = tmp_path / "dist"
    assert release.main(["--take", str(folder), "--dist_dir", str(dist)]) == 2
    err = capsys.readouterr().err
    expected = (
        f"energyformers release: error: --take: {folder}: its release name {name!r} (config.json's model_type, "
        f"metrics.json's dataset) {problem}; it names a folder of --dist_dir\n"
    )
    assert err == expected, err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken"], sorted(tmp_path.iterdir())


def test_a_token_passed_on_to_the_training_runs_is_not_shown(tmp_path, capsys):
    """`release -- --hub_token T`: the runs get the token, the plan (and a failed run's line, which release.json
    records) shows the command with `<HUB_TOKEN>`, as the run folder records it."""
    runs = tmp_path / "runs"
    argv = ["--models", "hyperset", "--datasets", "digits", "--runs_dir", str(runs), "--dry_run"]
    assert release.main([*argv, "--", "--hub_token", "hf_SECRET"]) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    expected = (
        f"train  energyformers train --model hyperset --dataset digits --output_dir {runs / 'hyperset-digits'} "
        "--overwrite_output_dir --hub_token '<HUB_TOKEN>'"
    )
    assert out.splitlines() == [expected], out
