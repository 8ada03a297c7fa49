"""The Sudoku benchmarks end to end on a tiny budget (benchmarks/sudoku_depth.py: Hyper-SET and the looped
Transformer, last-only vs deep supervision; benchmarks/sudoku_easy.py: probes, the wall-time-capped main run, easy
and hard evaluation), and their plateau-exit and target arithmetic on hand-made numbers."""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path
from typing import NamedTuple

import pytest
import torch
from fixtures import require_dataset

BENCHMARKS = Path(__file__).resolve().parents[1] / "benchmarks"

# The benchmarks folder is not a package: its scripts import each other as top-level modules, and each puts the
# folder on sys.path when imported. Both only while they are imported here, so no other test file finds a
# top-level `speed` or `mim` by accident (MonkeyPatch puts back the whole sys.path, the scripts' inserts included).
with pytest.MonkeyPatch.context() as _patch:
    _patch.syspath_prepend(str(BENCHMARKS))
    import sudoku_depth
    import sudoku_easy
# what the imports above left on sys.path, read at once: later tests of the session may put the folder there too
_LEFT_ON_PATH = [entry for entry in sys.path if Path(entry or ".").resolve() == BENCHMARKS]


def test_importing_the_scripts_leaves_sys_path_as_it_was():
    assert _LEFT_ON_PATH == [], f"benchmarks/ left on sys.path by the imports above: {_LEFT_ON_PATH}"


def needs(dataset: str) -> None:
    require_dataset(dataset)


def test_plateau_exit_is_the_first_step_whose_window_mean_is_below_the_level():
    level = math.log(9) - sudoku_depth.PLATEAU_MARGIN
    # five points at ln 9, then points 0.1 below the level: one low point in the window of five leaves its mean
    # above the level (level + (4 × 0.05 - 0.1) / 5 = level + 0.02), two put it below (level - 0.01): step 70
    losses = [math.log(9)] * 5 + [level - 0.1] * 5
    history = [{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)]
    expected = 70
    assert sudoku_depth.plateau_exit(history) == expected, [h["loss"] for h in history]
    assert sudoku_depth.plateau_exit(history[:5]) is None  # never below: None, not the last step
    # evaluation lines carry no "loss" and do not count as logged points
    mixed = [*history[:6], {"step": 60, "eval_loss": 0.1}, *history[6:]]
    assert sudoku_depth.plateau_exit(mixed) == expected


def result(model: str, supervision: str, exit_step: int | None, blanks: dict[int, float]) -> dict:
    return {
        "model_type": model,
        "supervision": supervision,
        "trained_iterations": 8,
        "plateau_exit_step": exit_step,
        "budget_steps": 600,
        "depths": {str(d): {"blank_cell_accuracy": b, "board_accuracy": 0.0} for d, b in blanks.items()},
    }


def test_targets_say_met_or_missed_with_the_numbers():
    flat = {4: 0.5, 8: 0.6, 16: 0.6, 24: 0.6, 32: 0.6}
    results = {
        "hyperset-last": result("hyperset", "last", 300, flat),
        "hyperset-all": result("hyperset", "all", 100, flat),
        "looped-transformer-all": result("looped-transformer", "all", 50, {**flat, 8: 0.61}),
    }
    checks = sudoku_depth.targets(results)
    assert [c["met"] for c in checks] == [True, True, True], checks
    assert "ratio 3.00" in checks[0]["numbers"] and "-1.0 points" in checks[1]["numbers"], checks

    results["hyperset-last"]["plateau_exit_step"] = 250  # 2.5x sooner only
    results["looped-transformer-all"]["depths"]["8"]["blank_cell_accuracy"] = 0.63  # 3 points ahead
    results["hyperset-all"]["depths"]["32"]["blank_cell_accuracy"] = 0.55  # falls from T to 4T
    assert [c["met"] for c in sudoku_depth.targets(results)] == [False, False, False]

    results["hyperset-last"]["plateau_exit_step"] = None  # last-only never left it in 600 steps: ratio > 6
    checks = sudoku_depth.targets(results)
    assert checks[0]["met"] and "ratio > 6.0" in checks[0]["numbers"], checks
    assert not any(c.get("vacuous") for c in checks), checks

    results["hyperset-all"]["plateau_exit_step"] = None  # still on the plateau: the other two say nothing
    checks = sudoku_depth.targets(results)
    assert not checks[0]["met"] and [c["vacuous"] for c in checks[1:]] == [True, True], checks


def test_bad_supervision_list_is_refused_naming_the_flag(tmp_path):
    # --results in tmp_path: were a list let through, --render_only would rewrite that stem, not the repository's
    for text in ("last,sometimes", "", "all,all"):
        with pytest.raises(SystemExit, match="--supervision"):
            sudoku_depth.main(["--supervision", text, "--render_only", "--results", str(tmp_path / "depth")])


@pytest.mark.parametrize("work_dir", [False, True], ids=["temporary", "work_dir"])
def test_threads_hold_for_the_run_and_the_callers_count_comes_back(tmp_path, monkeypatch, work_dir):
    # `benchmark` stands in for the training and evaluation, so no run trains: only main's thread handling runs.
    # A count other than the caller's, so a count left behind shows.
    caller, asked = torch.get_num_threads(), torch.get_num_threads() + 1
    seen: list[int] = []

    def counting(*args, **kwargs):
        seen.append(torch.get_num_threads())

    monkeypatch.setattr(sudoku_depth, "benchmark", counting)
    argv = [
        *TINY_DEPTH,
        "--models",
        "hyperset",
        "--supervision",
        "last",
        "--results",
        str(tmp_path / "depth"),
    ]
    argv += ["--threads", str(asked)] + (["--work_dir", str(tmp_path / "runs")] if work_dir else [])
    sudoku_depth.main(argv)
    assert (seen, torch.get_num_threads()) == ([asked], caller), (seen, torch.get_num_threads(), caller)

    # and when the run fails part-way
    def failing(*args, **kwargs):
        raise RuntimeError("the run failed")

    monkeypatch.setattr(sudoku_depth, "benchmark", failing)
    with pytest.raises(RuntimeError, match="the run failed"):
        sudoku_depth.main(argv)
    assert torch.get_num_threads() == caller, (torch.get_num_threads(), caller)


def test_threads_below_one_are_refused_naming_the_flag(tmp_path, capsys):
    # --results in tmp_path: were the flag let through, --render_only would rewrite that stem, not the repository's
    with pytest.raises(SystemExit):
        sudoku_depth.main(["--threads", "0", "--render_only", "--results", str(tmp_path / "depth")])
    assert "--threads must be an integer >= 1; got 0" in capsys.readouterr().err


TINY_DEPTH = ["--hidden_size", "16", "--heads", "2", "--iterations", "2", "--n_train", "16", "--steps", "2"]
TINY_DEPTH += ["--batch_size", "8", "--n_test", "8", "--logging_steps", "1", "--eval_steps", "1"]


class DepthRun(NamedTuple):
    argv: list[str]
    stem: Path
    work: Path
    out: dict


def train_depth(root: Path, models: list[str]) -> DepthRun:
    """sudoku_depth.main on TINY_DEPTH for `models` (last and all), trained into `root/runs` (--work_dir)."""
    stem, work = root / "depth", root / "runs"
    argv = [*TINY_DEPTH, "--work_dir", str(work), "--results", str(stem), "--supervision", "last,all"]
    argv += ["--models", ",".join(models)]
    # main sets torch's thread count in this process: the suite's own, which the rest of the suite runs with
    argv += ["--threads", str(torch.get_num_threads())]
    sudoku_depth.main(argv)
    return DepthRun(argv, stem, work, json.loads(stem.with_suffix(".json").read_text()))


@pytest.fixture(scope="module")
def hyperset_depth(tmp_path_factory) -> DepthRun:
    """The default run's training (Hyper-SET, both supervision modes), once per module: its trained folders and
    results are read by the tests, never written (a --reuse run writes its results under another stem)."""
    needs("sudoku-hard")
    return train_depth(tmp_path_factory.mktemp("sudoku-depth"), ["hyperset"])


# Each training is a process of its own (most of its time is importing torch and transformers): the default run
# trains Hyper-SET's two supervision modes (the plateau-exit and no-fall targets); `-m slow` adds the looped
# Transformer (four runs, the "within 2 points" target too).
@pytest.mark.parametrize(
    ("models", "num_targets"),
    [
        pytest.param(["hyperset"], 2, id="hyperset"),
        pytest.param(["hyperset", "looped-transformer"], 3, id="both-models", marks=pytest.mark.slow),
    ],
)
def test_sudoku_depth_trains_each_model_and_supervision_and_writes_its_files(
    request, tmp_path, models, num_targets
):
    needs("sudoku-hard")
    run = (
        request.getfixturevalue("hyperset_depth") if models == ["hyperset"] else train_depth(tmp_path, models)
    )
    out, stem = run.out, run.stem
    keys = [f"{model}-{supervision}" for model in models for supervision in ("last", "all")]
    assert list(out["results"]) == keys, list(out["results"])
    for key, res in out["results"].items():
        assert res["supervision"] == key.rsplit("-", 1)[1], (key, res["supervision"])
        assert {"1", "2", "4", "8"} <= set(res["depths"]), res["depths"].keys()  # T/2 … 4T at T = 2
        assert [s for s, _ in res["training_loss"]] == [1, 2], res["training_loss"]
        assert set(res["eval_curve"]) == {"trained", "1", "2", "4", "8"}, res["eval_curve"].keys()
        assert "--deep_supervision" in out["training"][key]["command"]
    assert len(out["targets"]) == num_targets and all(isinstance(c["met"], bool) for c in out["targets"]), (
        out["targets"]
    )
    md = stem.with_suffix(".md").read_text()
    assert "### The spec's targets" in md and "Hyper-SET, all" in md and "plateau exit" in md
    assert stem.with_suffix(".png").stat().st_size > 0

    # --reuse keeps the trained folders (same commands): nothing is trained again (results under another stem)
    again_stem = tmp_path / "again"
    sudoku_depth.main([*run.argv, "--results", str(again_stem), "--reuse"])
    again = json.loads(again_stem.with_suffix(".json").read_text())
    assert all(t.get("reused") for t in again["training"].values()), again["training"]
    assert again["results"]["hyperset-all"]["depths"] == out["results"]["hyperset-all"]["depths"]


def test_sudoku_depth_without_work_dir_trains_in_a_temporary_folder_it_removes(
    tmp_path, monkeypatch, hyperset_depth
):
    # the script's mkdtemp goes here (`tempfile.tempdir`), so what it leaves behind shows
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    trained_into = []

    def copying_training(plan, work, *args, **kwargs):
        # stands for the training subprocess (the test above runs it): the folder it writes for the same command,
        # copied from the module's run (without that run's evaluation cache)
        trained_into.append(work)
        for key in plan:
            shutil.copytree(
                hyperset_depth.work / f"sudoku-{key}",
                work / f"sudoku-{key}",
                ignore=shutil.ignore_patterns(sudoku_depth.EVAL_CACHE),
            )
        return {key: hyperset_depth.out["training"][key] for key in plan}

    monkeypatch.setattr(sudoku_depth, "train_models", copying_training)
    stem = tmp_path / "depth"
    argv = [*TINY_DEPTH, "--models", "hyperset", "--supervision", "last", "--results", str(stem)]
    sudoku_depth.main([*argv, "--threads", str(torch.get_num_threads())])  # the suite's count (see above)
    out = json.loads(stem.with_suffix(".json").read_text())
    assert list(out["results"]) == ["hyperset-last"], list(out["results"])
    assert len(trained_into) == 1 and trained_into[0].parent == scratch, (trained_into, scratch)
    left = sorted(p.name for p in scratch.iterdir())
    assert left == [], f"sudoku_depth left {left} in its temporary directory"


@pytest.mark.parametrize("work_dir", [False, True], ids=["temporary", "work_dir"])
def test_sudoku_depth_removes_only_its_own_folder_when_training_fails(tmp_path, monkeypatch, work_dir):
    scratch = tmp_path / "tmp"
    scratch.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(scratch))
    trained_into = []

    def failing_training(plan, work, *args, **kwargs):
        trained_into.append(work)
        (work / "sudoku-hyperset-last").mkdir(parents=True)  # a run's folder, half written
        raise RuntimeError("training failed")

    monkeypatch.setattr(sudoku_depth, "train_models", failing_training)
    argv = [
        *TINY_DEPTH,
        "--models",
        "hyperset",
        "--supervision",
        "last",
        "--results",
        str(tmp_path / "depth"),
    ]
    argv += ["--threads", str(torch.get_num_threads())]
    user = tmp_path / "runs"
    with pytest.raises(RuntimeError, match="training failed"):
        sudoku_depth.main([*argv, "--work_dir", str(user)] if work_dir else argv)
    left = sorted(p.name for p in scratch.iterdir())
    assert left == [], f"sudoku_depth left {left} in its temporary directory"
    if work_dir:  # the user's folder is the user's: kept, with what the run wrote
        assert trained_into == [user], trained_into
        assert sorted(p.name for p in user.iterdir()) == ["sudoku-hyperset-last"], list(user.iterdir())
    else:
        assert len(trained_into) == 1 and trained_into[0].parent == scratch, (trained_into, scratch)


def test_sudoku_easy_probe_capped_main_run_and_easy_to_hard_evaluation(tmp_path, monkeypatch):
    needs("sudoku")
    needs("sudoku-hard")
    # a tiny model for the probe and the main run (the real PROBES are d = 64 … 128)
    monkeypatch.setitem(
        sudoku_easy.PROBES, "ds-init0.2", {"model": (16, 2, 2, 0.2), "lr": 3e-3, "supervision": "all"}
    )
    stem = tmp_path / "easy"
    argv = ["--probes", "ds-init0.2", "--probe_steps", "2", "--max_steps", "50", "--batch_size", "8"]
    argv += ["--eval_steps", "1", "--n_test", "8", "--work_dir", str(tmp_path / "w")]
    argv += ["--output_dir", str(tmp_path / "w" / "main"), "--results", str(stem)]
    # a 60 ns cap: any real training step takes longer, so the cap passes during the first step and stops it there
    argv += ["--minutes", str(1e-9)]
    sudoku_easy.main(argv)
    out = json.loads(stem.with_suffix(".json").read_text())
    assert out["main"]["training"]["stopped_by_wall_time_at_step"] == 1, out["main"]["training"]
    assert out["main"]["global_step"] == 1
    assert (tmp_path / "w" / "main" / "model.safetensors").is_file()  # kept for test-time search
    assert set(out["probes"]) == {"ds-init0.2"} and out["probes"]["ds-init0.2"]["global_step"] == 2
    for dataset in ("sudoku", "sudoku-hard"):
        depths = out["depths"][dataset]["depths"]
        assert set(depths) == {"1", "2", "3", "4", "6", "8"}, depths.keys()  # T/2 … 4T at T = 2
        for r in depths.values():
            assert 0 <= r["board_accuracy"] <= r["blank_cell_accuracy"] <= 1, r
    md = stem.with_suffix(".md").read_text()
    assert "stopped it at step 1" in md and "## Probes" in md and "easy blank-cell" in md
    assert stem.with_suffix(".png").stat().st_size > 0


def test_sudoku_easy_probe_runs_the_first_steps_of_a_longer_schedule_with_its_own_setting(
    tmp_path, monkeypatch
):
    """A probe's setting reaches the training command (β1, batch, config fields, extra flags), and with
    --probe_schedule_steps the probe trains the first --probe_steps of that schedule, validated every
    --probe_eval_steps; the probe table shows the setting and the curve."""
    needs("sudoku")
    needs("sudoku-hard")
    setting = {
        "model": (16, 2, 2, 0.2),
        "lr": 3e-3,
        "supervision": "all",
        "beta1": 0.9,
        "batch_size": 4,
        "config": {"position_embedding_type": "sincos-2d"},
        "flags": ["--deep_supervision_weights", "linear"],
    }
    monkeypatch.setitem(sudoku_easy.PROBES, "ds-init0.2", setting)
    work = tmp_path / "w"
    argv = [
        "--stage",
        "probes",
        "--probes",
        "ds-init0.2",
        "--probe_steps",
        "3",
        "--probe_schedule_steps",
        "40",
    ]
    sudoku_easy.main([*argv, "--probe_eval_steps", "1", "--batch_size", "8", "--work_dir", str(work)])
    folder = work / "probe-ds-init0.2"
    metrics = json.loads((folder / "metrics.json").read_text())
    recipe, config = metrics["recipe"], json.loads((folder / "config.json").read_text())
    assert (recipe["global_step"], recipe["max_steps"], recipe["batch_size"]) == (3, 40, 4), recipe
    assert recipe["adam_betas"][0] == 0.9, recipe["adam_betas"]
    assert config["position_embedding_type"] == "sincos-2d", config["position_embedding_type"]
    assert config["deep_supervision_weights"] == "linear", config["deep_supervision_weights"]
    trained = sudoku_easy.summary(folder)["eval_curve"]["trained"]
    assert [step for step, _, _ in trained][:3] == [1, 2, 3], trained  # validated every step
    # the table, rendered from results that hold this probe
    out = {
        "machine": "m", "command": "c", "batch_size": 8, "probe_steps": 3, "probe_schedule_steps": 40,
        "probes": {"ds-init0.2": sudoku_easy.summary(folder) | {"setting": setting}},
    }  # fmt: skip
    md = sudoku_easy.probe_lines(out)
    assert any("the first steps of a longer cosine schedule" in line for line in md), md
    row = next(line for line in md if line.startswith("| ds-init0.2 |"))
    assert "| 3 of 40 |" in row, row
    assert "β1 0.9, batch 4, position_embedding_type=sincos-2d --deep_supervision_weights linear" in row, row
    assert "1: " in row and "2: " in row, row


def test_sudoku_easy_trains_the_looped_transformer_with_the_same_setting(tmp_path, monkeypatch):
    """`--model looped-transformer` trains the baseline with the setting's width, heads, depth and config fields,
    and the summary records which model it was (`model_name`, the page's and the plot's title, reads it)."""
    needs("sudoku")
    setting = {
        "model": (16, 2, 2, 0.2),
        "lr": 1e-2,
        "supervision": "all",
        "beta1": 0.9,
        "batch_size": 4,
        "config": {"position_embedding_type": "sincos-2d"},
    }
    monkeypatch.setitem(sudoku_easy.PROBES, "ds-init0.2", setting)
    work = tmp_path / "w"
    argv = ["--stage", "probes", "--probes", "ds-init0.2", "--probe_steps", "2", "--work_dir", str(work)]
    sudoku_easy.main([*argv, "--model", "looped-transformer"])
    folder = work / "probe-ds-init0.2"
    config = json.loads((folder / "config.json").read_text())
    got = {key: config[key] for key in ("model_type", "hidden_size", "num_attention_heads", "num_iterations")}
    assert got == {
        "model_type": "looped-transformer",
        "hidden_size": 16,
        "num_attention_heads": 2,
        "num_iterations": 2,
    }, got
    assert config["position_embedding_type"] == "sincos-2d", config["position_embedding_type"]
    run = sudoku_easy.summary(folder)
    assert run["model_type"] == "looped-transformer" and "--model looped-transformer" in run["command"], run
    assert sudoku_easy.model_name(run) == "looped Transformer"
    assert sudoku_easy.model_name({}) == "Hyper-SET"  # results written before runs recorded their model


def test_sudoku_easy_refuses_bad_arguments_before_training(tmp_path, capsys):
    for argv, message in (
        (["--model", "mlp"], "--model: invalid choice: 'mlp'"),
        (
            [
                "--model",
                "looped-transformer",
                "--stage",
                "main",
                "--setting",
                "b1-H2-lr1e-2-sincos-b16-anchor0.5",
            ],
            "['input_anchor'] are Hyper-SET options",
        ),
        (["--probes", "ds-init0.2,nope"], "--probes"),
        (["--setting", "nope"], "--setting"),
        (["--minutes", "0"], "--minutes must be > 0"),
    ):
        with pytest.raises(SystemExit) as stopped:
            sudoku_easy.main([*argv, "--work_dir", str(tmp_path)])
        err = capsys.readouterr().err
        assert message in err, (argv, err)
        assert stopped.value.code == 2, (
            f"{argv}: exit status {stopped.value.code!r}, argparse's usage error is 2"
        )
    assert not any(tmp_path.iterdir())


def test_benchmark_plateau_exit_is_not_inspects_plateau_exit_step():
    """The benchmarks' trailing-mean definition and `energyformers inspect`'s (two consecutive logs below the level)
    name different steps on the same history; sudoku_depth.plateau_exit's docstring says so."""
    from energyformers.training.evaluation import plateau_exit_step

    level = math.log(9) - sudoku_depth.PLATEAU_MARGIN
    # a drop 0.02 below the level after five logs at ln 9: two logs below suffice for inspect (step 60); the window
    # mean is below only with four low logs of five (level + (0.05 - 4 × 0.07) / 5 < level; three leave it above)
    losses = [math.log(9)] * 5 + [level - 0.02] * 5
    history = [{"step": 10 * (i + 1), "loss": v} for i, v in enumerate(losses)]
    benchmark, inspect = sudoku_depth.plateau_exit(history), plateau_exit_step(history, num_classes=9)
    assert (benchmark, inspect) == (90, 60), (benchmark, inspect, losses)
    assert "plateau_exit_step" in sudoku_depth.plateau_exit.__doc__


@pytest.mark.parametrize("script", ["sudoku_depth", "sudoku_easy"])
def test_render_embeds_the_plot_by_the_name_it_is_written_under(tmp_path, script):
    """`--results /x/sd` writes sd.png, and sd.md must embed sd.png (not the default name)."""
    committed = BENCHMARKS / "results" / f"{script}.json"
    stem = tmp_path / "sd"
    stem.with_suffix(".json").write_text(committed.read_text())
    if script == "sudoku_depth":
        sudoku_depth.main(["--render_only", "--results", str(stem)])
    else:
        sudoku_easy.main(["--stage", "render", "--results", str(stem)])
    md = stem.with_suffix(".md").read_text()
    assert stem.with_suffix(".png").stat().st_size > 0
    assert "](sd.png)" in md and f"]({script}.png)" not in md, [
        line for line in md.splitlines() if ".png" in line
    ]
