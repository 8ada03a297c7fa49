"""benchmarks/sudoku_search.py end to end in its smoke mode (a tiny untrained Hyper-SET, 8 puzzles, K = 1, 2, 4),
and its refusals. The smoke numbers check the script, they are not measurements: they go to
`sudoku_search_smoke.{md,json,png}`, marked so."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from fixtures import loaded_script

from energyformers.training import data

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "sudoku_search.py"


@pytest.fixture
def search(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    # `--dataset sudoku` with 40/8/8 generated puzzles, cached under tmp_path (the full set takes ~30 s to build)
    monkeypatch.setattr(data, "SUDOKU_SIZES", {"train": 40, "validation": 8, "test": 8})
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path / "cache"))
    with loaded_script(SCRIPT, "sudoku_search") as module:
        yield module


def test_smoke_run_writes_marked_files_with_every_selector_k_and_the_cost(search, tmp_path: Path) -> None:
    out = tmp_path / "results"
    report = search.main(["--smoke", "--dataset", "sudoku", "--batch_size", "8", "--output_dir", str(out)])
    names = sorted(p.name for p in out.iterdir())
    assert names == ["sudoku_search_smoke.json", "sudoku_search_smoke.md", "sudoku_search_smoke.png"], names
    assert json.loads((out / "sudoku_search_smoke.json").read_text()) == json.loads(json.dumps(report))
    assert report["smoke"] and (out / "sudoku_search_smoke.md").read_text().startswith("# SMOKE RUN")
    # the run's provenance (benchmarks/provenance.py): in the JSON as "run", in the md's header
    run = report["run"]
    assert run["git_commit"] == search.provenance.git_commit() and run["seed"] == 0 and run["machine"], run
    assert "benchmarks/sudoku_search.py --smoke" in run["command"], run
    md = (out / "sudoku_search_smoke.md").read_text()
    assert f"Command: `{run['command']}`" in md and f"; commit {run['git_commit']};" in md, md[:800]
    assert (out / "sudoku_search_smoke.png").stat().st_size > 10_000
    (section,) = report["datasets"]
    assert section["dataset"] == "sudoku" and section["num_puzzles"] == 8
    rows = section["rows"]
    assert [(r["trajectories"], r["selector"]) for r in rows] == [(1, "none (plain forward)")] + [
        (k, s) for k in (2, 4) for s in ("energy", "confidence", "sudoku")
    ]
    plain = rows[0]
    assert plain["flops_per_puzzle"] > 0 and plain["seconds_per_puzzle"] > 0
    for row in rows[1:]:
        k = row["trajectories"]
        # FlopCounterMode counts matrix products: every trajectory runs the plain forward's, plus its final energy
        # (the verifier, once per layer): at least K times the plain forward's, and linear in K
        assert row["flops_per_puzzle"] > k * plain["flops_per_puzzle"], (row, plain["flops_per_puzzle"])
        same = next(r for r in rows[1:] if r["selector"] == row["selector"] and r["trajectories"] == 2)
        assert row["flops_per_puzzle"] * 2 == same["flops_per_puzzle"] * k, (row, same)
        assert row["iterations_per_puzzle"] == k * plain["iterations_per_puzzle"] == k * 2
        assert 0 <= row["board_accuracy"] <= 1 and 0 <= row["blank_cell_accuracy"] <= 1
        assert row["boards_gained"] + row["boards_lost"] <= 8
        if row["selector"] == "energy":  # the lowest energy is below (or equal to) the mean of the others
            assert row["chosen_energy_mean"] <= row["rejected_energy_mean"], row
            assert row["chosen_minus_rejected_mean"] <= 0, row
    # an untrained model makes no valid board: the sudoku selector falls back to the lowest energy, i.e. the
    # energy selector's choice among the same (same-seed) trajectories
    assert all(o["board_accuracy"] == 0 for o in section["oracle"]), section["oracle"]
    for k in (2, 4):
        energy, sudoku = (next(r for r in rows[1:] if r["trajectories"] == k and r["selector"] == s)
                          for s in ("energy", "sudoku"))  # fmt: skip
        assert energy["blank_cell_accuracy"] == sudoku["blank_cell_accuracy"], (energy, sudoku)
        assert energy["chosen_energy_mean"] == sudoku["chosen_energy_mean"]
    assert len(section["chosen_minus_rejected_energy"]) == 3  # one histogram per selector at the largest K
    assert len(section["scatter"]["0.3"]["valid"]) == 8 and len(section["scatter"]["0.3"]["valid"][0]) == 4
    assert report["reading"]["sudoku"] and all(isinstance(line, str) for line in report["reading"]["sudoku"])


def test_a_seeded_run_repeats_its_numbers(search, tmp_path: Path) -> None:
    argv = ["--smoke", "--dataset", "sudoku", "--trajectories", "1", "4", "--selectors", "energy"]
    first = search.main([*argv, "--output_dir", str(tmp_path / "a")])
    second = search.main([*argv, "--output_dir", str(tmp_path / "b")])
    keys = ("board_accuracy", "blank_cell_accuracy", "chosen_energy_mean", "share_not_trajectory_0")
    for a, b in zip(first["datasets"][0]["rows"][1:], second["datasets"][0]["rows"][1:]):
        assert {k: a[k] for k in keys} == {k: b[k] for k in keys}


def test_num_threads_holds_for_the_run_and_the_callers_count_comes_back(
    search, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # a count other than the caller's, so a count left behind shows
    caller, asked = torch.get_num_threads(), torch.get_num_threads() + 1
    seen: list[int] = []
    evaluate_dataset = search.evaluate_dataset

    def counting(*args, **kwargs):
        seen.append(torch.get_num_threads())
        return evaluate_dataset(*args, **kwargs)

    monkeypatch.setattr(search, "evaluate_dataset", counting)
    argv = ["--smoke", "--dataset", "sudoku", "--trajectories", "1", "--num_threads", str(asked)]
    report = search.main([*argv, "--output_dir", str(tmp_path / "out")])
    assert torch.get_num_threads() == caller, (torch.get_num_threads(), caller)
    assert (seen, report["environment"]["threads"]) == ([asked], asked), (seen, report["environment"])

    # and when the run fails part-way
    def failing(*args, **kwargs):
        raise RuntimeError("the run failed")

    monkeypatch.setattr(search, "evaluate_dataset", failing)
    with pytest.raises(RuntimeError, match="the run failed"):
        search.main([*argv, "--output_dir", str(tmp_path / "failed")])
    assert torch.get_num_threads() == caller, (torch.get_num_threads(), caller)


@pytest.mark.parametrize(
    "argv, message",
    [
        ([], "--model_dir is required"),
        (["--smoke", "--dataset", "sudoku-easy"], "--dataset 'sudoku-easy': expected one or more of"),
        (["--smoke", "--trajectories", "4", "16"], "--trajectories 4 16: include 1"),
        (["--smoke", "--noise", "0"], "--noise 0.0: expected finite numbers > 0"),
        (["--smoke", "--selectors", "halting"], "--selectors 'halting': expected one or more of"),
        (["--smoke", "--n_test", "0"], "--n_test 0: expected an integer >= 1"),
    ],
)
def test_bad_arguments_are_refused_before_any_work(
    search, tmp_path: Path, argv: list[str], message: str
) -> None:
    out = tmp_path / "results"
    with pytest.raises(SystemExit) as error:
        search.main([*argv, "--output_dir", str(out)])
    assert message in str(error.value)
    assert not out.exists()


def test_a_model_that_is_not_a_sudoku_hyperset_is_refused(search, tmp_path: Path) -> None:
    from energyformers import HyperSetConfig, HyperSetForSequenceClassification

    folder = tmp_path / "classifier"
    config = HyperSetConfig(input_type="sequence", vocab_size=10, max_position_embeddings=81, hidden_size=16,
                            num_attention_heads=2, intermediate_size=8, num_iterations=2, num_labels=2)  # fmt: skip
    HyperSetForSequenceClassification(config).save_pretrained(folder)
    with pytest.raises(SystemExit) as error:
        search.main(
            ["--model_dir", str(folder), "--dataset", "sudoku", "--output_dir", str(tmp_path / "out")]
        )
    assert "expected a Hyper-SET Sudoku model (HyperSetForTokenClassification, num_labels 9)" in str(
        error.value
    )
    assert "HyperSetForSequenceClassification" in str(error.value)
