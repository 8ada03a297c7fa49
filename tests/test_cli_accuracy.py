"""benchmarks/cli_accuracy.py: its commands (--dry_run), one smoke row end to end (a real `energyformers train`
subprocess on 128 rotten_tomatoes sentences), and its refusals. The smoke numbers check the script, they are not
measurements: they go to `cli_accuracy_smoke.{md,json}`, marked so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from fixtures import loaded_script, require_dataset

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "cli_accuracy.py"


@pytest.fixture
def bench():
    with loaded_script(SCRIPT, "cli_accuracy") as module:
        yield module


def test_dry_run_prints_the_six_table_commands_and_trains_nothing(
    bench, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    assert bench.main(["--dry_run", "--output_dir", str(tmp_path)]) == {}
    lines = capsys.readouterr().out.splitlines()
    common = "--seed 42 --num_threads 1 --disable_tqdm --num_predictions 0 --output_dir RUN"
    assert lines == [
        f"energyformers train --model {model} --dataset {dataset} --epochs {epochs} {common}"
        for model, dataset, epochs in [
            ("hyperset", "fashion_mnist", 5),
            ("imixer", "fashion_mnist", 3),
            ("hyperbf", "fashion_mnist", 5),
            ("hyperset", "rotten_tomatoes", 5),
            ("imixer", "rotten_tomatoes", 5),
            ("hyperbf", "rotten_tomatoes", 5),
        ]
    ], lines
    assert not list(tmp_path.iterdir())


def test_smoke_row_writes_marked_files_with_the_numbers_and_their_provenance(bench, tmp_path: Path) -> None:
    require_dataset("rotten_tomatoes")  # the smoke row trains on it
    out = tmp_path / "results"
    report = bench.main(["--smoke", "--rows", "hyperbf-rotten_tomatoes", "--output_dir", str(out)])
    assert sorted(p.name for p in out.iterdir()) == ["cli_accuracy_smoke.json", "cli_accuracy_smoke.md"]
    assert json.loads((out / "cli_accuracy_smoke.json").read_text()) == json.loads(json.dumps(report))
    md = (out / "cli_accuracy_smoke.md").read_text()
    assert md.startswith("# SMOKE RUN") and "NOT a measurement" in md.splitlines()[0], md
    assert report["smoke"] is True
    assert report["missing"] == [i for i in bench.ROW_IDS if i != "hyperbf-rotten_tomatoes"], report[
        "missing"
    ]
    (row,) = report["rows"]
    assert row["id"] == "hyperbf-rotten_tomatoes" and row["model"] == "hyperbf" and row["seed"] == 42
    assert row["command"].startswith(
        "energyformers train --model hyperbf --dataset rotten_tomatoes --epochs 1 --seed 42 --num_threads 1"
    ), row["command"]
    assert row["epochs"] == 1 and "--max_train_samples 128" in row["command"], row["command"]
    assert 0 <= row["test_accuracy"] <= 1 and 0 <= row["test_f1_macro"] <= 1, row
    assert (
        row["num_parameters"] > 0 and row["wall_time_s"] > 0 and row["process_wall_s"] >= row["wall_time_s"]
    )
    assert row["config"]["model_type"] == "hyperbf" and "id2label" not in row["config"]
    run = row["run"]  # benchmarks/provenance.py's record of the run that measured the row
    for key in ("date", "command", "git_commit", "torch", "transformers", "python", "machine"):
        assert run[key], (key, run)
    assert run["seed"] == 42 and "benchmarks/cli_accuracy.py --smoke" in run["command"], run
    assert row["num_threads"] == 1, row["num_threads"]
    # the table row and the provenance lines show what the JSON holds
    assert (
        f"| HyperBF | rotten_tomatoes | 1 | {row['num_parameters']:,} | {row['test_accuracy']:.4f} |" in md
    ), md
    assert row["command"] in md and f"commit {run['git_commit']};" in md and run["machine"] in md, md
    assert run["command"] in md, md


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--rows", "hyperset-mnist"], "--rows hyperset-mnist: expected a comma-separated subset of"),
        (["--rows", ","], "--rows '': expected a comma-separated subset of"),
        (["--rows", "hyperbf-fashion_mnist,hyperbf-fashion_mnist"], "a row is named twice"),
        (["--num_threads", "0"], "--num_threads 0: expected an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    bench, argv: list[str], message: str, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    with pytest.raises(SystemExit) as exit_info:
        bench.main([*argv, "--output_dir", str(tmp_path)])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err
    assert not list(tmp_path.iterdir())
