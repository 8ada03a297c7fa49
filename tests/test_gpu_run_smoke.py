"""benchmarks/gpu/run.sh end to end on CPU (`--smoke`): every stage runs, reports ok, and leaves its result files.

The GPU run itself needs a CUDA machine; this checks the script that drives it (install step skipped because the
package is importable here, attention tests on a short selection through Triton's interpreter, gpu_speed.py in
smoke mode, two steps of the Sudoku recipe on the carried puzzles, the summary), `--stages` (a run of the two
quick stages), and its refusals.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "run.sh"
STAGES = ("install", "attention", "speed", "sudoku")
RESULT_FILES = [
    "attention.xml",
    "gpu_speed_smoke.json",
    "gpu_speed_smoke.md",
    "run.log",
    "sudoku.json",
    "summary.md",
]


def run(*arguments: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable}
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500
    )


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run of machines without CUDA")
def test_smoke_run_reports_every_stage_ok_and_writes_every_result_file(tmp_path):
    out = tmp_path / "out"
    done = run(str(out), "--smoke")
    log = (out / "run.log").read_text() if (out / "run.log").is_file() else ""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{log[-4000:]}"
    # the GPU tool brings back at most 8 files from OUT_DIR, none deeper than two folders
    assert sorted(p.name for p in out.iterdir()) == RESULT_FILES
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary.splitlines() if line.startswith("| ")}
    for stage in STAGES:
        assert f"| {stage} | ok |" in rows.get(stage, ""), f"stage {stage}: {rows.get(stage)}\n{summary}"
    assert "Device: CPU only" in summary and "SMOKE RUN" in summary
    assert "missing" not in summary and "unreadable" not in summary, summary
    assert " 0 failed" in rows["attention"] and "bfloat16 cases: 0 passed" not in rows["attention"], summary
    sudoku = json.loads((out / "sudoku.json").read_text())
    assert sudoku["exit_code"] == 0 and sudoku["recipe"] == "hyperset-sudoku-ds"
    # the recipe's deep supervision and board symmetries reached the run (the carried puzzles count as Sudoku)
    assert (sudoku["deep_supervision"], sudoku["sudoku_augmentation"]) == ("all", True), sudoku
    assert 0 <= sudoku["test"]["board_accuracy"] <= sudoku["test"]["blank_cell_accuracy"] <= 1, sudoku
    # the smoke run's time is up at once: training stops after its first step and still evaluates
    assert (sudoku["stopped_by"], sudoku["stopped_at_step"], sudoku["train_seconds"]) == (
        "train_seconds",
        1,
        0,
    )
    speed = json.loads((out / "gpu_speed_smoke.json").read_text())
    assert speed["smoke"] and speed["complete"], speed
    # the speed stage resumes: the committed GPU results are read and refused for a smoke run; a second call
    # resumed from the first's results measures nothing and writes them again, whole
    committed = ROOT / "benchmarks" / "results" / "gpu_speed.json"
    assert f"--resume {committed}: ignored" in log and "inference, train kept from run 1 (--resume)" in log, (
        log[-4000:]
    )
    assert [r["run"] for r in speed["runs"]] == [1] and speed["run"] == 2, (speed["runs"], speed["run"])
    for entry in next(iter(speed["groups"].values()))["variants"].values():
        if "skipped" not in entry:
            assert (entry["eager"]["inference"]["run"], entry["eager"]["train"]["run"]) == (1, 1), entry
    assert "0 new in run 2, 2 kept from run 1" in rows["speed"], rows["speed"]
    assert "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke`" in summary, summary


@pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run of machines without CUDA")
def test_stages_runs_only_those_and_gives_the_speed_stage_the_budget_of_the_others(tmp_path):
    """`--stages speed,install`: the two run (in the fixed order, whatever the list's), the other two are recorded
    as skipped, not failed, the exit status is 0, and the speed stage gets their budgets (smoke: 300 s each)."""
    out = tmp_path / "out"
    done = run(str(out), "--stages", "speed,install", "--smoke")
    log = (out / "run.log").read_text() if (out / "run.log").is_file() else ""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{log[-4000:]}"
    assert sorted(p.name for p in out.iterdir()) == [
        "gpu_speed_smoke.json",
        "gpu_speed_smoke.md",
        "run.log",
        "summary.md",
    ]
    assert [
        line.split(": ")[0] for line in done.stdout.splitlines() if line.endswith(("ok", "(not in --stages)"))
    ] == [f"[run.sh] {stage}" for stage in STAGES], done.stdout
    assert "===== speed (budget 900 s) =====" in log, log[-4000:]
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary.splitlines() if line.startswith("| ")}
    for stage in ("attention", "sudoku"):
        assert rows[stage] == f"| {stage} | skipped (not in --stages) | – | – | – |", summary
    assert "| install | ok |" in rows["install"] and "| speed | ok | " in rows["speed"], summary
    assert " (900) | gpu_speed_smoke.json, gpu_speed_smoke.md |" in rows["speed"], summary
    assert (
        "missing" not in summary
        and "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke --stages install,speed`" in summary
    )


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (["--stages", "install,benchmark"], "--stages 'install,benchmark': unknown stage 'benchmark'"),
        (["--stages", ""], "--stages '': an empty list"),
        (["--stages", "speed,,sudoku"], "--stages 'speed,,sudoku': an empty stage name"),
        (["--stages", "speed,install,speed"], "--stages 'speed,install,speed': 'speed' is given twice"),
        (["--smoke", "--stages"], "--stages takes one value"),
    ],
)
def test_a_bad_stages_list_is_refused_before_any_work(tmp_path, arguments, message):
    out = tmp_path / "out"
    done = run(str(out), *arguments)
    assert done.returncode == 2 and message in done.stderr, (done.returncode, done.stderr)
    assert "install, attention, speed, sudoku" in done.stderr, done.stderr
    assert not out.exists() and done.stdout == "", done.stdout
