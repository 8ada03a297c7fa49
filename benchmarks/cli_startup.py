"""Start-up time of the command line: median wall time of N cold `energyformers ... --help` processes.

    python benchmarks/cli_startup.py --runs 7
    python benchmarks/cli_startup.py --runs 7 --compare "before=/path/to/old/site"

Each command runs as a fresh `python -m energyformers ...` subprocess (no warm interpreter; the OS file cache is
warm after the first run, as it is for a user typing commands one after another). Reference rows time
`import torch` and `import energyformers` alone: `import energyformers` imports torch, transformers and the model
files (Auto registration), which the command line asked only for help skips (`energyformers/__init__.py`); the
last row runs the installed console script instead of `python -m`. `--compare LABEL=DIR` also times the package found
first on `DIR` (e.g. the previous commit unpacked with `git archive`, sub-packages copied under `energyformers/`).
The copies are timed interleaved (run 1 of every command and copy, then run 2, ...), so a change of machine load
during the benchmark hits them alike. Writes `benchmarks/results/cli_startup.md`.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

COMMANDS = {
    "import torch": ["-c", "import torch"],
    "import energyformers": ["-c", "import energyformers"],
    "energyformers --help": ["-m", "energyformers", "--help"],
    "energyformers train --help": ["-m", "energyformers", "train", "--help"],
    "energyformers train-accelerate --help": ["-m", "energyformers", "train-accelerate", "--help"],
    **{
        f"energyformers {command} --help": ["-m", "energyformers", command, "--help"]
        for command in ("predict", "export", "push", "release", "convert", "inspect")
    },
    # the console script pip installs beside the interpreter, run by it (its first line names that interpreter)
    "console script: energyformers train --help": [
        str(Path(sys.executable).with_name("energyformers")),
        "train",
        "--help",
    ],
}
RESULTS = Path(__file__).parent / "results" / "cli_startup.md"


def environment(pythonpath: str | None) -> dict[str, str]:
    env = {**os.environ, "OMP_WAIT_POLICY": "PASSIVE", "HF_HUB_OFFLINE": "1"}
    if pythonpath:
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [pythonpath, env.get("PYTHONPATH")]))
    return env


# Commands run from an empty folder: from the repository root, `python -m` would import the `energyformers/`
# folder of the working directory first, whatever PYTHONPATH says.
WORKDIR = tempfile.mkdtemp(prefix="cli_startup-")


def time_once(argv: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    proc = subprocess.run([sys.executable, *argv], capture_output=True, text=True, env=env, cwd=WORKDIR)
    elapsed = time.perf_counter() - start
    if proc.returncode != 0:
        raise SystemExit(f"{' '.join(argv)} failed ({proc.returncode}):\n{proc.stderr[-2000:]}")
    return elapsed


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--runs", type=int, default=7, help="cold runs per command (the median is reported)")
    parser.add_argument("--label", default="this tree", help="column label of the installed package")
    parser.add_argument(
        "--compare", action="append", default=[], metavar="LABEL=DIR", help="also time the package under DIR"
    )
    parser.add_argument("--output", type=Path, default=RESULTS, help="markdown file to write")
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs {args.runs}: expected >= 1")
    variants = {}
    for item in args.compare:
        label, sep, folder = item.partition("=")
        if not sep or not label or not Path(folder).is_dir():
            parser.error(f"--compare {item!r}: expected LABEL=DIR with an existing DIR")
        variants[label] = environment(folder)
    variants[args.label] = environment(None)
    origins = {
        label: subprocess.run(
            [sys.executable, "-c", "import energyformers; print(energyformers.__file__)"],
            capture_output=True,
            text=True,
            env=env,
            cwd=WORKDIR,
            check=True,
        ).stdout.strip()
        for label, env in variants.items()
    }
    if len(set(origins.values())) < len(origins):
        raise SystemExit(f"the compared copies resolve to the same package: {origins}")
    run_info = provenance.run_info(seed=None, argv=argv, script=__file__)
    load = os.getloadavg()[0]
    times: dict[tuple[str, str], list[float]] = {(c, v): [] for c in COMMANDS for v in variants}
    for run in range(args.runs):
        for command, argv in COMMANDS.items():
            for label, env in variants.items():
                times[command, label].append(time_once(argv, env))
        print(f"run {run + 1}/{args.runs} done", flush=True)
    load_end = os.getloadavg()[0]
    header = "| command | " + " | ".join(f"{label}: median (min–max) s" for label in variants) + " |"
    rows = [header, "|---" * (len(variants) + 1) + "|"]
    for command in COMMANDS:
        cells = []
        for label in variants:
            t = times[command, label]
            cells.append(f"{statistics.median(t):.2f} ({min(t):.2f}–{max(t):.2f})")
        rows.append(f"| `{command}` | " + " | ".join(cells) + " |")
    table = "\n".join(rows)
    print(table)
    sources = "\n".join(f"* {label}: `{origin}`" for label, origin in origins.items())
    args.output.parent.mkdir(parents=True, exist_ok=True)
    header = "\n".join(provenance.markdown_lines(run_info))
    args.output.write_text(
        f"# CLI start-up time\n\n{header}\n\n"
        f"Wall time of cold subprocesses (see the script's docstring), {args.runs} interleaved runs per command and "
        f"package copy, on CPUs shared with other jobs (load average {load:.1f} at the start, {load_end:.1f} at the "
        f"end).\n\n{sources}\n\n{table}\n"
    )
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
