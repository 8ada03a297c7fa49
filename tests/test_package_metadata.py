"""The package's version is written once, in pyproject.toml: `energyformers.__version__` and `energyformers
--version` report what the installed distribution's metadata says."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

import energyformers

try:
    import tomllib
except ModuleNotFoundError:  # Python 3.10: the same parser as a package
    tomllib = pytest.importorskip("tomli")

PYPROJECT = Path(__file__).resolve().parents[1] / "pyproject.toml"
ENV = {**os.environ, "HF_HUB_OFFLINE": "1"}


def pyproject_version() -> str:
    with PYPROJECT.open("rb") as file:
        return tomllib.load(file)["project"]["version"]


def test_version_attribute_is_pyprojects():
    assert energyformers.__version__ == pyproject_version(), (energyformers.__version__, pyproject_version())


def test_version_command_prints_pyprojects_version():
    # the console script installed next to this interpreter, as a user runs it
    script = Path(sys.executable).with_name("energyformers")
    command = [str(script)] if script.exists() else [sys.executable, "-m", "energyformers"]
    done = subprocess.run([*command, "--version"], capture_output=True, text=True, env=ENV, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == f"energyformers {pyproject_version()}", (done.stdout, pyproject_version())


def test_version_comes_from_the_distribution_metadata():
    # A version literal in the package would agree with pyproject.toml only until the next release: the attribute
    # must follow the metadata. A stand-in metadata version that no release has shows which one is read.
    program = (
        "import importlib.metadata as metadata\n"
        "real = metadata.version\n"
        "metadata.version = lambda name: '99.0.0.dev7' if name == 'energyformers' else real(name)\n"
        "import energyformers\n"
        "print(energyformers.__version__)\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", program], capture_output=True, text=True, env=ENV, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "99.0.0.dev7", done.stdout
