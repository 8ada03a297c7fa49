"""summary.md of a GPU run (benchmarks/gpu/run.sh): the device, each stage's status, time and result files, and
the headline results read from those files (attention test counts, gpu_speed best ratios, Sudoku board accuracy).

    python benchmarks/gpu/summary.py --out_dir OUT --stages STAGES.tsv [--smoke]

STAGES.tsv: one line per stage, `name<TAB>status<TAB>seconds<TAB>budget seconds`, as run.sh writes it; a stage
that run.sh's `--stages` left out has the status SKIPPED and `-` for its seconds and budget.
"""

from __future__ import annotations

import argparse
import importlib.metadata
import json
import platform
import re
import xml.etree.ElementTree as ET
from pathlib import Path

# The files each stage leaves in OUT_DIR (speed: the smoke run's names differ, gpu_speed.py marks them as such).
RESULT_FILES = {
    "install": [],
    "attention": ["attention.xml"],
    "speed": ["gpu_speed.json", "gpu_speed.md"],
    "sudoku": ["sudoku.json"],
}
SMOKE_RESULT_FILES = {**RESULT_FILES, "speed": ["gpu_speed_smoke.json", "gpu_speed_smoke.md"]}
# the status run.sh records for a stage its --stages list leaves out (not a failure)
SKIPPED = "skipped (not in --stages)"


def device_name() -> str:
    """`torch.cuda.get_device_name()` of the first GPU, or the CPU when there is none."""
    try:
        import torch
    except ImportError:
        return f"unknown (torch does not import); {platform.machine()}"
    software = f"Python {platform.python_version()}, torch {torch.__version__}"
    for name in ("transformers", "triton"):  # the versions a result depends on, the GPU image's own
        try:
            software += f", {name} {importlib.metadata.version(name)}"
        except importlib.metadata.PackageNotFoundError:
            software += f", no {name}"
    if torch.cuda.is_available():
        return f"{torch.cuda.get_device_name(0)} ({software}, CUDA {torch.version.cuda})"
    return f"CPU only, no CUDA device ({platform.machine()}; {software})"


def read_stages(path: Path) -> list[dict[str, str]]:
    stages = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        fields = line.split("\t")
        if len(fields) != 4:
            raise ValueError(f"{path}, line {number}: expected name, status, seconds, budget; got {line!r}")
        stages.append(dict(zip(("name", "status", "seconds", "budget"), fields)))
    return stages


def attention_result(path: Path) -> str:
    """Counts of the junit file, overall and for the CUDA and the bfloat16 test cases."""
    root = ET.parse(path).getroot()
    cases = list(root.iter("testcase"))

    def counts(selected: list[ET.Element]) -> str:
        failed = sum(1 for c in selected if c.find("failure") is not None or c.find("error") is not None)
        skipped = sum(1 for c in selected if c.find("skipped") is not None)
        return f"{len(selected) - failed - skipped} passed, {failed} failed, {skipped} skipped"

    cuda = [c for c in cases if re.search(r"[\[-]cuda[\]-]", c.get("name", ""))]  # the "cuda" parameter
    bf16 = [c for c in cases if "bfloat16" in c.get("name", "")]
    return f"{counts(cases)}; cuda cases: {counts(cuda)}; bfloat16 cases: {counts(bf16)}"


def speed_result(path: Path) -> str:
    report = json.loads(path.read_text())
    parts = []
    for name, group in report["groups"].items():
        best = group.get("best_ratio")
        ratios = ", ".join(f"{task} {ratio:.2f}×" for task, ratio in best.items()) if best else "no ratio"
        parts.append(f"{name.split(' (')[0]}: {ratios}")
    done = "complete" if report.get("complete", True) else "INCOMPLETE (stopped by its budget)"
    return f"{len(report['groups'])} groups, {done}{speed_runs(report)}; best mode vs baseline: " + "; ".join(
        parts
    )


def speed_runs(report: dict) -> str:
    """How many (group, mode, task) measurements this run added and how many it kept from earlier runs (files
    written with --resume record each measurement's run; older files say nothing)."""
    this = report.get("run")
    if this is None:
        return ""
    runs: dict[tuple[str, str, str], int] = {}
    for name, group in report["groups"].items():
        for entry in group["variants"].values():
            for mode, tasks in entry.items():
                if mode in ("eager", "compiled", "cuda-graphs"):
                    runs.update({(name, mode, task): t["run"] for task, t in tasks.items() if "run" in t})
    new = sum(1 for run in runs.values() if run == this)
    earlier = sorted({run for run in runs.values() if run != this})
    kept = f", {len(runs) - new} kept from run{'s' * (len(earlier) > 1)} {', '.join(map(str, earlier))}"
    kept = kept if earlier else ""
    return f"; measurements (group × mode × task): {new} new in run {this}{kept}"


def sudoku_result(path: Path) -> str:
    result = json.loads(path.read_text())
    test = result.get("test") or {}
    if test.get("board_accuracy") is None:
        return f"no accuracy (exit code {result.get('exit_code')})"
    # the steps that ran: a run stopped by --train_seconds records where (stopped_at_step), else it ran max_steps
    stopped = result.get("stopped_at_step")
    steps = (
        f"{stopped} of {result['max_steps']} steps (stopped by its {result['stopped_by']} budget)"
        if stopped is not None
        else f"{result['max_steps']} steps"
    )
    return (
        f"recipe {result['recipe']}, {steps}, {result['seconds']:.0f} s: test board accuracy "
        f"{test['board_accuracy']:.4f}, blank-cell accuracy {test['blank_cell_accuracy']:.4f}"
    )


READERS = {"attention": attention_result, "speed": speed_result, "sudoku": sudoku_result}


def command(stages: list[dict[str, str]], smoke: bool) -> str:
    """The run.sh command line that gave `stages` (`--stages` only when it left some out)."""
    text = "bash benchmarks/gpu/run.sh OUT_DIR" + (" --smoke" if smoke else "")
    if any(stage["status"] == SKIPPED for stage in stages):
        text += " --stages " + ",".join(s["name"] for s in stages if s["status"] != SKIPPED)
    return text


def summary(out_dir: Path, stages: list[dict[str, str]], smoke: bool) -> str:
    files = SMOKE_RESULT_FILES if smoke else RESULT_FILES
    lines = [
        "# GPU run" + (" — SMOKE RUN on CPU (checks the script; no measurement)" if smoke else ""),
        "",
        f"Device: {device_name()}  ",
        f"Command: `{command(stages, smoke)}`",
        "",
        "| stage | status | seconds (budget) | result files | result |",
        "|---|---|---|---|---|",
    ]
    for stage in stages:
        name = stage["name"]
        if stage["status"] == SKIPPED:  # not run: no time, no files to look for
            lines.append(f"| {name} | {SKIPPED} | – | – | – |")
            continue
        present = [f for f in files.get(name, []) if (out_dir / f).is_file()]
        missing = [f for f in files.get(name, []) if f not in present]
        result = "–"
        if name in READERS and present:
            try:
                result = READERS[name](out_dir / present[0])
            except Exception as error:  # a half-written or unexpected file: say so, keep the table
                result = f"unreadable: {type(error).__name__}: {error}"
        listed = ", ".join(present) + (f" (missing: {', '.join(missing)})" if missing else "")
        lines.append(
            f"| {name} | {stage['status']} | {stage['seconds']} ({stage['budget']}) | {listed or '–'} | {result} |"
        )
    lines += ["", "Every stage's output: run.log.", ""]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--out_dir", type=Path, required=True)
    parser.add_argument("--stages", type=Path, required=True)
    parser.add_argument("--smoke", action="store_true")
    args = parser.parse_args(argv)
    text = summary(args.out_dir, read_stages(args.stages), args.smoke)
    (args.out_dir / "summary.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
