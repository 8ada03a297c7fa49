"""benchmarks/gpu/run.sh end to end on CPU (`--smoke`): every stage runs, reports ok, and leaves its result files.

The GPU run itself needs a CUDA machine; this checks the script that drives it (install step skipped because the
package is importable here, attention tests on a short selection through Triton's interpreter, gpu_speed.py in
smoke mode, two steps of the Sudoku recipe on the carried puzzles, the summary), `--stages`, and its refusals.

CI runs every stage once, in two `--stages` runs that split the four (install and speed: the speed stage gets the
others' budgets; attention and sudoku), and the default stage list (all four, in order) with a PYTHON whose every
stage fails at once, so only run.sh and the summary run; `-m slow` adds the one run of all four stages.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from energyformers.training.arguments import parse_overrides

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "benchmarks" / "gpu" / "run.sh"

# The setting the Sudoku stage trains with is the one the CPU probes measured to leave the chance plateau
# (benchmarks/sudoku_easy.py's WINNER). The benchmarks folder is not a package: on sys.path only for this import.
with pytest.MonkeyPatch.context() as _patch:
    _patch.syspath_prepend(str(ROOT / "benchmarks"))
    from sudoku_easy import WINNER, model_flags
STAGES = ("install", "attention", "speed", "sudoku")
# what each half of the stages leaves in OUT_DIR; a run of all four leaves both (at most 8 files: what the GPU tool
# brings back, none deeper than two folders)
SPEED_FILES = ["gpu_speed_smoke.json", "gpu_speed_smoke.md", "run.log", "summary.md"]
SUDOKU_FILES = ["attention.xml", "run.log", "sudoku.json", "summary.md"]
RESULT_FILES = sorted({*SPEED_FILES, *SUDOKU_FILES})

cpu_only = pytest.mark.skipif(torch.cuda.is_available(), reason="the CPU smoke run of machines without CUDA")


def run(*arguments: str, python: str = sys.executable) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": python}
    return subprocess.run(
        ["bash", str(SCRIPT), *arguments], cwd=ROOT, env=env, capture_output=True, text=True, timeout=1500
    )


def finished(out: Path, done: subprocess.CompletedProcess) -> tuple[str, str, dict[str, str]]:
    """The run's log, summary and summary rows by stage, once it exited with status 0."""
    log = (out / "run.log").read_text() if (out / "run.log").is_file() else ""
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{log[-4000:]}"
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary.splitlines() if line.startswith("| ")}
    assert "Device: CPU only" in summary and "SMOKE RUN" in summary, summary
    assert "missing" not in summary and "unreadable" not in summary, summary
    return log, summary, rows


def check_attention_and_sudoku(out: Path, rows: dict[str, str], summary: str) -> None:
    assert " 0 failed" in rows["attention"] and "bfloat16 cases: 0 passed" not in rows["attention"], summary
    sudoku = json.loads((out / "sudoku.json").read_text())
    assert sudoku["exit_code"] == 0, sudoku
    check_sudoku_setting(sudoku)
    # the recipe's deep supervision and board symmetries reached the run (the carried puzzles count as Sudoku)
    assert (sudoku["deep_supervision"], sudoku["sudoku_augmentation"]) == ("all", True), sudoku
    assert 0 <= sudoku["test"]["board_accuracy"] <= sudoku["test"]["blank_cell_accuracy"] <= 1, sudoku
    # the smoke run's time is up at once: training stops after its first step and still evaluates
    assert (sudoku["stopped_by"], sudoku["stopped_at_step"], sudoku["train_seconds"]) == (
        "train_seconds",
        1,
        0,
    )


def check_sudoku_setting(sudoku: dict) -> None:
    """The stage trained the measured setting: the recipe with its optimiser, the model of the probe by --config
    (the smoke run's reduced sizes replace the probe's width, heads and depth; its init and positions stay)."""
    assert sudoku["recipe"] == "hyperset-sudoku-ds-fast", sudoku["recipe"]
    assert sudoku["optimizer"] == {"learning_rate": WINNER["lr"], "adam_betas": [WINNER["beta1"], 0.95]}, (
        sudoku
    )
    measured = parse_overrides(
        [*model_flags(*WINNER["model"])[1:], *(f"{k}={json.dumps(v)}" for k, v in WINNER["config"].items())]
    )
    assert parse_overrides(sudoku["config"]) == measured, (sudoku["config"], measured)
    kept = {key: measured[key] for key in ("initializer_range", "position_embedding_type")}
    assert {key: sudoku["model"][key] for key in kept} == kept, sudoku["model"]


def check_speed(out: Path, rows: dict[str, str], log: str) -> None:
    speed = json.loads((out / "gpu_speed_smoke.json").read_text())
    assert speed["smoke"] and speed["complete"], speed
    # the speed stage resumes as the real run does: the committed GPU results are read and refused for a smoke
    # run, so everything is measured in this run (a resume that keeps rows: tests/test_gpu_speed_smoke.py)
    committed = ROOT / "benchmarks" / "results" / "gpu_speed.json"
    assert f"--resume {committed}: ignored" in log and "kept from run" not in log, log[-4000:]
    assert [r["run"] for r in speed["runs"]] == [1] and speed["run"] == 1, (speed["runs"], speed["run"])
    for entry in next(iter(speed["groups"].values()))["variants"].values():
        if "skipped" not in entry:
            assert (entry["eager"]["inference"]["run"], entry["eager"]["train"]["run"]) == (1, 1), entry
    assert "measurements (group × mode × task): 2 new in run 1; " in rows["speed"], rows["speed"]


@pytest.mark.slow
@cpu_only
def test_smoke_run_reports_every_stage_ok_and_writes_every_result_file(tmp_path):
    """All four stages in one run (CI runs each of them in the two --stages runs below)."""
    out = tmp_path / "out"
    done = run(str(out), "--smoke")
    log, summary, rows = finished(out, done)
    assert sorted(p.name for p in out.iterdir()) == RESULT_FILES
    for stage in STAGES:
        assert f"| {stage} | ok |" in rows.get(stage, ""), f"stage {stage}: {rows.get(stage)}\n{summary}"
    check_attention_and_sudoku(out, rows, summary)
    check_speed(out, rows, log)
    assert "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke`" in summary, summary


@cpu_only
def test_stages_runs_only_those_and_gives_the_speed_stage_the_budget_of_the_others(tmp_path):
    """`--stages speed,install`: the two run (in the fixed order, whatever the list's), the other two are recorded
    as skipped, not failed, the exit status is 0, and the speed stage gets their budgets (smoke: 300 s each)."""
    out = tmp_path / "out"
    done = run(str(out), "--stages", "speed,install", "--smoke")
    log, summary, rows = finished(out, done)
    assert sorted(p.name for p in out.iterdir()) == SPEED_FILES
    assert [
        line.split(": ")[0] for line in done.stdout.splitlines() if line.endswith(("ok", "(not in --stages)"))
    ] == [f"[run.sh] {stage}" for stage in STAGES], done.stdout
    assert "===== speed (budget 900 s) =====" in log, log[-4000:]
    for stage in ("attention", "sudoku"):
        assert rows[stage] == f"| {stage} | skipped (not in --stages) | – | – | – |", summary
    assert "| install | ok |" in rows["install"] and "| speed | ok | " in rows["speed"], summary
    assert " (900) | gpu_speed_smoke.json, gpu_speed_smoke.md |" in rows["speed"], summary
    assert "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke --stages install,speed`" in summary, summary
    check_speed(out, rows, log)


@cpu_only
def test_the_attention_and_sudoku_stages_report_ok_with_their_results(tmp_path):
    """`--stages sudoku,attention`: the other half of the stages, run in the fixed order, each with its own
    budget (no speed stage to give it to)."""
    out = tmp_path / "out"
    done = run(str(out), "--stages", "sudoku,attention", "--smoke")
    log, summary, rows = finished(out, done)
    assert sorted(p.name for p in out.iterdir()) == SUDOKU_FILES
    assert [line for line in done.stdout.splitlines() if line.endswith(("ok", "(not in --stages)"))] == [
        "[run.sh] install: skipped (not in --stages)",
        "[run.sh] attention: ok",
        "[run.sh] speed: skipped (not in --stages)",
        "[run.sh] sudoku: ok",
    ], done.stdout
    assert "===== attention (budget 300 s) =====" in log and "===== sudoku (budget 300 s) =====" in log, log[
        -4000:
    ]
    for stage in ("install", "speed"):
        assert rows[stage] == f"| {stage} | skipped (not in --stages) | – | – | – |", summary
    for stage in ("attention", "sudoku"):
        assert f"| {stage} | ok |" in rows[stage], f"stage {stage}: {rows[stage]}\n{summary}"
    assert "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke --stages attention,sudoku`" in summary, (
        summary
    )
    check_attention_and_sudoku(out, rows, summary)


def test_without_stages_every_stage_runs_in_order_with_its_own_budget_and_failures_are_recorded(tmp_path):
    """No --stages: all four stages, in order, each with its own budget; here PYTHON fails every stage at once
    (only the summary gets the real interpreter), so each is recorded as failed, the summary still written, its
    command line without --stages, and the exit status is 1."""
    python = tmp_path / "python"
    python.write_text(
        f'#!/bin/sh\n[ "$1" = benchmarks/gpu/summary.py ] && exec "{sys.executable}" "$@"\nexit 1\n'
    )
    python.chmod(0o755)
    out = tmp_path / "out"
    done = run(str(out), "--smoke", python=str(python))
    log = (out / "run.log").read_text() if (out / "run.log").is_file() else ""
    assert done.returncode == 1, f"exit {done.returncode}\n{done.stdout}\n{done.stderr}\n{log[-4000:]}"
    assert [line for line in done.stdout.splitlines() if line.startswith("[run.sh] ")] == [
        *(f"[run.sh] {stage}: {text}" for stage in STAGES for text in ("up to 300 s", "failed (exit 1)")),
        f"[run.sh] wrote {out}/summary.md",
    ], done.stdout
    summary = (out / "summary.md").read_text()
    rows = {line.split(" | ")[0].lstrip("| "): line for line in summary.splitlines() if line.startswith("| ")}
    for stage in STAGES:
        assert rows[stage].startswith(f"| {stage} | failed (exit 1) | "), (
            f"stage {stage}: {rows[stage]}\n{summary}"
        )
    assert "Command: `bash benchmarks/gpu/run.sh OUT_DIR --smoke`" in summary and "SMOKE RUN" in summary, (
        summary
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


def test_fetch_wheels_reads_the_requirements_without_tomllib(tmp_path):
    """fetch_wheels.sh's first step (the requirements to fetch, from pyproject.toml) under a Python without tomllib
    and tomli (3.10 with nothing installed) gives what it gives with tomllib: pip's own copy of tomli reads it."""
    script = (ROOT / "benchmarks" / "gpu" / "fetch_wheels.sh").read_text()
    start = script.index("<<'PY'\n", script.index('"$WORK/roots.txt"')) + len("<<'PY'\n")
    snippet = script[start : script.index("\nPY\n", start)]
    outputs = {}
    for blocked in ((), ("tomllib", "tomli")):
        block = "".join(f"sys.modules[{name!r}] = None\n" for name in blocked)  # an import of it then fails
        kornia = tmp_path / f"kornia-{len(blocked)}.txt"
        done = subprocess.run(
            [
                sys.executable,
                "-c",
                f"import sys\n{block}{snippet}",
                str(ROOT / "pyproject.toml"),
                str(kornia),
            ],
            capture_output=True,
            text=True,
        )
        assert done.returncode == 0, f"blocked {blocked}:\n{done.stderr}"
        outputs[blocked] = (done.stdout, kornia.read_text())
    roots, kornia = outputs[()]
    assert "\nsafetensors" in f"\n{roots}" and "pytest>=8" in roots and kornia.startswith("kornia"), outputs
    assert outputs[("tomllib", "tomli")] == outputs[()], outputs
