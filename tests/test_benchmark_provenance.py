"""Every benchmark result file records the run that wrote it, commit included, through benchmarks/provenance.py.

A static check covers every script of benchmarks/ (each calls `provenance.run_info`); the scripts cheap enough are
run on tiny settings into a temporary folder (their expensive parts replaced: subprocess commands, ptxas compiles,
training runs, model widths) and their result files are read back for the commit. sudoku_search.py, gpu_speed.py
and cli_accuracy.py are checked the same way by their own smoke tests."""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path

import pytest
from fixtures import loaded_script

ROOT = Path(__file__).resolve().parents[1]
BENCHMARKS = ROOT / "benchmarks"
SCRIPTS = sorted(p for p in BENCHMARKS.glob("*.py") if p.name != "provenance.py")

with pytest.MonkeyPatch.context() as _patch:
    _patch.syspath_prepend(str(BENCHMARKS))
    import provenance


def calls_run_info(path: Path) -> bool:
    """Whether the script calls `provenance.run_info(...)`."""
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        if (
            isinstance(node, ast.Call)
            and isinstance(node.func, ast.Attribute)
            and node.func.attr == "run_info"
            and isinstance(node.func.value, ast.Name)
            and node.func.value.id == "provenance"
        ):
            return True
    return False


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_benchmark_script_records_its_run_through_provenance(script: Path) -> None:
    assert calls_run_info(script), (
        f"{script.name} does not call provenance.run_info: its result files would lack the commit and machine"
    )


# ------------------------------------------------------------------ the cheap scripts, run


def hyperbf_param_counts(module, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    module.main(["--output", str(out / "hyperbf_param_counts.md")])


def hyperbf_feedforward_paths(module, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "WIDTHS", [16])  # the smallest width and model: the script's plumbing only
    monkeypatch.setattr(module, "MODELS", [("digits", "digits", {}, 2)])
    monkeypatch.setattr(module, "UNIT_BATCH", 2)
    module.main(["--repeats", "1", "--output", str(out / "hyperbf_feedforward_paths.md")])


def kernel_resources(module, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "measure", lambda arch: [])  # no ptxas compiles: the table's header only
    module.main(["--output", str(out / "kernel_resources.md")])


def cli_startup(module, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(module, "COMMANDS", {"python -c pass": ["-c", "pass"]})
    module.main(["--runs", "1", "--output", str(out / "cli_startup.md")])


def recipe_accuracy(module, out: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def run(
        command: list[str], output_dir: Path
    ) -> dict:  # no training: a run's record as the script makes it
        return {"test_accuracy": 0.5, "eval_accuracy": None, "train_loss": 1.0, "wall_s": 0.1,
                "command": "energyformers train RUN", "recipe": {}}  # fmt: skip

    monkeypatch.setattr(module, "run", run)
    monkeypatch.setattr(module, "cli_accepts", lambda flag: True)
    monkeypatch.setattr(module, "RESULTS", out)
    monkeypatch.setattr(sys, "argv", ["benchmarks/recipe_accuracy.py", "--recipe", "", "--model", "hyperset"])
    module.main()


RUNNERS: dict[str, Callable] = {
    f.__name__: f
    for f in (hyperbf_param_counts, hyperbf_feedforward_paths, kernel_resources, cli_startup, recipe_accuracy)
}


@pytest.mark.parametrize("name", RUNNERS)
def test_a_cheap_script_writes_the_commit_into_every_result_file(
    name: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.syspath_prepend(str(BENCHMARKS))
    # the scripts' environment defaults (provenance.setdefault_env) are put back afterwards: set, so that the
    # monkeypatch records what was there, then removed as a user who set none of them has it
    monkeypatch.setattr(provenance, "_SCRIPT_DEFAULTS", set())
    for variable in provenance.RECORDED_ENV:
        monkeypatch.setenv(variable, "")
        monkeypatch.delenv(variable)
    out = tmp_path / "results"
    out.mkdir()
    with loaded_script(BENCHMARKS / f"{name}.py", name) as module:
        RUNNERS[name](module, out, monkeypatch)
    commit = provenance.git_commit() or "unknown"
    written = sorted(p.name for p in out.iterdir())
    assert any(p.endswith(".md") for p in written), written
    for path in sorted(out.iterdir()):
        text = path.read_text(encoding="utf-8")
        if path.suffix == ".md":
            assert f"; commit {commit};" in text, (path.name, commit, text[:600])
        elif path.suffix == ".json":
            run = json.loads(text)["run"]
            assert run["git_commit"] == provenance.git_commit() and run["machine"], (path.name, run)


# ------------------------------------------------------------------ provenance.git_commit


def test_git_commit_is_dirty_for_code_changes_but_not_for_results_docs_or_tests(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A script that rewrites its result file during the run (cli_accuracy.py, gpu_speed.py: after every row or
    task) must not record its later rows as measured on modified code."""

    def git(*args: str) -> None:
        subprocess.run(["git", "-C", str(tmp_path), *args], check=True, capture_output=True)

    files = ["energyformers/model.py", "benchmarks/results/x.md", "docs/x.md", "tests/test_x.py"]
    for name in files:
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_text("v1\n")
    git("init", "-q")
    git("add", ".")
    git("-c", "user.name=t", "-c", "user.email=t@t", "commit", "-q", "-m", "one")
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    clean = provenance.git_commit()
    assert clean and not clean.endswith("-dirty"), clean
    for name in files[1:]:
        (tmp_path / name).write_text("v2\n")
    assert provenance.git_commit() == clean, (provenance.git_commit(), clean)
    (tmp_path / files[0]).write_text("v2\n")
    assert provenance.git_commit() == clean + "-dirty", (provenance.git_commit(), clean)


def test_git_commit_outside_a_checkout_is_the_one_its_caller_names(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The GPU tool runs a copy of the tree without `.git`: the commit comes from ENERGYFORMERS_GIT_COMMIT there,
    and git's answer wins wherever there is one."""
    monkeypatch.setattr(provenance, "REPO", tmp_path)
    monkeypatch.delenv(provenance.COMMIT_ENV, raising=False)
    assert provenance.git_commit() is None
    monkeypatch.setenv(provenance.COMMIT_ENV, "abc1234")
    assert provenance.git_commit() == "abc1234"
    monkeypatch.setattr(provenance, "REPO", ROOT)
    assert provenance.git_commit() not in (None, "abc1234"), provenance.git_commit()
