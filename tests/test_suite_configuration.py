"""The suite's own pytest configuration (tests/conftest.py): how xdist spreads the tests, the random state a test
starts from."""

import json
import os
import random
import sys
from pathlib import Path
from types import SimpleNamespace

import conftest
import fixtures
import numpy
import pytest
import torch
import transformers

INI = Path(__file__).resolve().parents[1] / "pyproject.toml"


def _configured(dist: str, args: tuple[str, ...], addopts: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The `--dist` mode left by conftest's `pytest_configure` for a run whose xdist option is `dist`, given the
    command-line `args` and `PYTEST_ADDOPTS`."""
    monkeypatch.setenv("PYTEST_ADDOPTS", addopts)
    config = SimpleNamespace(option=SimpleNamespace(dist=dist), invocation_params=SimpleNamespace(args=args))
    conftest.pytest_configure(config)
    return config.option.dist


@pytest.mark.parametrize(
    ("dist", "args", "addopts", "expected"),
    [
        ("load", ("-n", "2"), "", "loadfile"),  # xdist's default: whole files to one process
        ("load", ("-n", "2", "--dist", "load"), "", "load"),  # asked for on the command line
        ("load", ("-n", "2", "--dist=load"), "", "load"),
        ("load", ("-n", "2", "-d"), "", "load"),
        ("load", ("-n", "2"), "--dist load", "load"),  # asked for in PYTEST_ADDOPTS
        ("loadscope", ("-n", "2", "--dist", "loadscope"), "", "loadscope"),
        ("no", (), "", "no"),  # without xdist nothing is distributed
    ],
)
def test_xdist_sends_whole_files_to_one_process_unless_dist_is_given(
    dist: str, args: tuple[str, ...], addopts: str, expected: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    got = _configured(dist, args, addopts, monkeypatch)
    assert got == expected, (
        f"args {args}, PYTEST_ADDOPTS {addopts!r}: --dist {dist!r} became {got!r}, not {expected!r}"
    )


# A test body that records the first draw of each global generator the suite seeds.
PROBE = """
import json, os, random

import numpy
import torch


def test_probe():
    draws = {"random": random.random(), "numpy": float(numpy.random.rand()), "torch": float(torch.rand(1))}
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump(draws, out)
"""


def test_a_test_body_draws_the_same_under_every_order_seed(tmp_path):
    """conftest's seed holds inside the test body for Python's `random`, NumPy and torch alike: pytest-randomly's
    --randomly-seed changes the order only, not what a test draws."""
    (tmp_path / "conftest.py").symlink_to(Path(conftest.__file__))
    (tmp_path / "test_probe.py").write_text(PROBE)
    env = {key: value for key, value in os.environ.items() if key != "PYTEST_ADDOPTS"}
    commands = {}
    for seed in (1, 2):
        args = [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:xdist",
            "-c",
            str(INI),
        ]
        args += ["--rootdir", str(tmp_path), f"--randomly-seed={seed}", str(tmp_path / "test_probe.py")]
        commands[seed] = dict(
            args=args, cwd=tmp_path, env={**env, "PROBE_OUT": str(tmp_path / f"{seed}.json")}
        )
    runs = fixtures.run_at_once(commands, timeout=600)
    draws = {}
    for seed, run in runs.items():
        output = run.stdout + run.stderr
        assert run.returncode == 0, f"--randomly-seed={seed} exited {run.returncode}:\n{output}"
        # pytest-randomly took part (conftest's summary line), so the comparison below is not vacuous
        assert f"pytest-randomly seed {seed}" in output, output
        draws[seed] = json.loads((tmp_path / f"{seed}.json").read_text())
    transformers.set_seed(conftest.SEED)
    expected = {"random": random.random(), "numpy": float(numpy.random.rand()), "torch": float(torch.rand(1))}
    assert draws[1] == draws[2] == expected, (
        f"first draws by --randomly-seed {draws}, after conftest's seed {expected}"
    )
