"""What every benchmark result file records about the run that wrote it.

`run_info()` collects the date, the command as it was actually typed (`sys.argv`, plus the environment variables
that change a measurement, only where the user set them), the git commit, the torch / transformers / Python
versions, the machine (OS, CPU model, the cores this process may actually use) and the seed. `markdown_lines()`
renders it as the header of a results .md file; the same dict goes into the .json as `"run"`.

Scripts import this module as `provenance` (the benchmarks folder is on `sys.path` when a script runs, and tests
insert it), and set their own environment defaults through `setdefault_env`, so that a default the script chose
is not reported as something the user typed.
"""

from __future__ import annotations

import datetime
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
RESULTS = Path(__file__).resolve().parent / "results"

# Environment variables that change what a benchmark measures (threading, devices, hub access).
RECORDED_ENV = (
    "OMP_WAIT_POLICY",
    "OMP_NUM_THREADS",
    "MKL_NUM_THREADS",
    "CUDA_VISIBLE_DEVICES",
    "HF_HUB_OFFLINE",
    "PYTORCH_CUDA_ALLOC_CONF",
)
# Names the running script defaulted itself (setdefault_env), so they are not part of the user's command.
_SCRIPT_DEFAULTS: set[str] = set()


def setdefault_env(name: str, value: str) -> None:
    """`os.environ.setdefault`, remembering that `name` was the script's default rather than the user's."""
    if name not in os.environ:
        os.environ[name] = value
        _SCRIPT_DEFAULTS.add(name)


def user_env() -> dict[str, str]:
    """The recorded environment variables that are set, except those the script defaulted itself."""
    return {k: os.environ[k] for k in RECORDED_ENV if k in os.environ and k not in _SCRIPT_DEFAULTS}


def command(argv: list[str] | None = None, script: str | Path | None = None) -> str:
    """The command line that ran: `[VAR=value ...] python <script> <args>`.

    With `argv=None` it is `sys.argv` as given; a caller that parsed its own `argv` (a `main(argv)` called from
    Python) passes it with `script`, the script's path, shown relative to the repository when it lies inside.
    """
    if argv is None:
        words = list(sys.argv)
    else:
        path = Path(script if script is not None else sys.argv[0]).resolve()
        shown = path.relative_to(REPO) if path.is_relative_to(REPO) else path
        words = [str(shown), *argv]
    env = [f"{k}={shlex.quote(v)}" for k, v in user_env().items()]
    return " ".join([*env, shlex.join(["python", *words])])


def cpu_model() -> str:
    """The processor's model name (Linux: /proc/cpuinfo), else what `platform` knows."""
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.lower().startswith(("model name", "hardware", "cpu model")):
                return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown CPU"


def available_cores() -> int:
    """Cores this process may run on (its affinity mask, which containers and `taskset` narrow), not the host's."""
    if hasattr(os, "sched_getaffinity"):
        return len(os.sched_getaffinity(0))
    return os.cpu_count() or 1


def machine() -> str:
    """`Linux x86_64, <CPU model>, N cores available`."""
    return f"{platform.system()} {platform.machine()}, {cpu_model()}, {available_cores()} cores available"


# Tracked paths whose changes do not change a measurement: a script rewriting its results as it goes (or a docs or
# test edit) does not make the code it measures dirty.
NOT_MEASURED = ("benchmarks/results", "docs", "tests")


# A copy of the tree without its `.git` (what the GPU tool runs in) cannot ask git; its caller names the commit here.
COMMIT_ENV = "ENERGYFORMERS_GIT_COMMIT"


def git_commit() -> str | None:
    """The short commit of the repository, with `-dirty` when tracked files that can change a measurement differ
    (all but NOT_MEASURED); outside a git checkout, `$ENERGYFORMERS_GIT_COMMIT` if set, else None."""
    commit = checkout_commit()
    return commit if commit is not None else os.environ.get(COMMIT_ENV) or None


def checkout_commit() -> str | None:
    """`git_commit` as git sees it: None outside a git checkout."""
    try:
        head = subprocess.run(
            ["git", "-C", str(REPO), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            timeout=10,
        )
        if head.returncode != 0:
            return None
        dirty = subprocess.run(
            ["git", "-C", str(REPO), "status", "--porcelain", "--untracked-files=no", "--", "."]
            + [f":!{path}" for path in NOT_MEASURED],
            capture_output=True,
            text=True,
            timeout=10,
        )
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("-dirty" if dirty.stdout.strip() else "")


def run_info(
    seed: int | list[int] | None,
    argv: list[str] | None = None,
    script: str | Path | None = None,
    device: str | None = None,
) -> dict[str, Any]:
    """Date, command, commit, software versions, machine and seed(s) of this run (see the module docstring).

    `seed` is required so that a script states it has none (`None`) rather than forgetting it; `device` replaces
    the CPU description when the measurement ran on an accelerator.
    """
    import torch
    import transformers

    return {
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "command": command(argv, script),
        "git_commit": git_commit(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "machine": machine(),
        **({"device": device} if device else {}),
        "seed": seed,
    }


def markdown_lines(info: dict[str, Any]) -> list[str]:
    """The run's header for a results .md: the command in backticks, then one line of everything else."""
    seed = info["seed"]
    seeds = (
        "none (deterministic)"
        if seed is None
        else ", ".join(map(str, seed))
        if isinstance(seed, list)
        else seed
    )
    details = [
        info["date"],
        f"commit {info['git_commit'] or 'unknown'}",
        f"torch {info['torch']}",
        f"transformers {info['transformers']}",
        f"Python {info['python']}",
        info["machine"],
        *([f"device {info['device']}"] if info.get("device") else []),
        f"seed {seeds}",
    ]
    return [f"Command: `{info['command']}`  ", "Run: " + "; ".join(details) + "."]


def output_dir(path: str | Path) -> Path:
    """The `--output_dir` folder, created if missing."""
    folder = Path(path)
    folder.mkdir(parents=True, exist_ok=True)
    return folder
