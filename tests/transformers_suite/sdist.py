"""Fetch transformers' common test files for the installed transformers and import them as `transformers_tests`.

`load(cache)` downloads the source distribution of the installed version from the package index (through pip,
once; the archive is kept in `cache`), extracts `tests/test_modeling_common.py`,
`tests/test_configuration_common.py` and whatever they import from `tests/` that the sdist has, and imports
them as the package `transformers_tests` (our own `tests/` folder is no package; a distinct name keeps the two
apart). That package's path is the extracted folder, then this folder: the modules the sdist lacks come from
the stand-ins here. Raises `IndexUnreachable` when pip cannot connect to the index, and `RuntimeError` for
any other failure (an unknown version, a module neither the sdist nor the stand-ins provide).
"""

from __future__ import annotations

import ast
import importlib
import importlib.util
import re
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

import transformers

PACKAGE = "transformers_tests"
SUITE = ("test_modeling_common.py", "test_configuration_common.py")
STANDINS = Path(__file__).resolve().parent

# What pip prints when it cannot reach the index (the only case in which the suite is skipped).
_UNREACHABLE = re.compile(
    r"NewConnectionError|Failed to establish a new connection|ConnectTimeout|ReadTimeout|Max retries exceeded"
    r"|Temporary failure in name resolution|Name or service not known|Network is unreachable|No route to host"
    r"|ProxyError|connection broken"
)


class IndexUnreachable(RuntimeError):
    """pip could not connect to the package index."""


def load(cache: Path, version: str = transformers.__version__) -> tuple[ModuleType, ModuleType]:
    """transformers' `tests.test_modeling_common` and `tests.test_configuration_common` for `version`."""
    cache.mkdir(parents=True, exist_ok=True)
    tests = extract(download(cache, version), cache / version, version)
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, tests / "__init__.py", submodule_search_locations=[str(tests), str(STANDINS)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return tuple(importlib.import_module(f"{PACKAGE}.{Path(name).stem}") for name in SUITE)


def download(cache: Path, version: str) -> Path:
    """The sdist of transformers `version` in `cache`, downloaded with pip unless it is already there."""
    sdist = cache / f"transformers-{version}.tar.gz"
    if sdist.is_file():
        return sdist
    with tempfile.TemporaryDirectory(dir=cache) as staging:
        command = [sys.executable, "-m", "pip", "download", "--no-binary", ":all:", "--no-deps"]
        command += ["--retries", "2", "--timeout", "60", "--dest", staging, f"transformers=={version}"]
        result = subprocess.run(command, capture_output=True, text=True)
        output = f"$ {' '.join(command)}\n{result.stdout}{result.stderr}"
        if result.returncode != 0:
            if match := _UNREACHABLE.search(output):
                line = next(line for line in output.splitlines() if match.group() in line)
                raise IndexUnreachable(f"pip cannot reach the package index: {line.strip()}")
            raise RuntimeError(f"pip could not download the transformers=={version} sdist:\n{output}")
        found = sorted(Path(staging).glob("transformers-*.tar.gz"))
        if len(found) != 1:
            raise RuntimeError(f"expected one transformers-*.tar.gz from pip, got {found}:\n{output}")
        found[0].replace(sdist)  # atomic: a concurrent run sees the whole archive or none
    return sdist


def extract(sdist: Path, root: Path, version: str) -> Path:
    """`root/tests`: the suite's files from `sdist` (extracted once), plus an empty `__init__.py`."""
    tests = root / "tests"
    if (tests / "__init__.py").is_file():
        return tests
    root.mkdir(parents=True, exist_ok=True)
    prefix = f"transformers-{version}/tests/"
    with tarfile.open(sdist) as archive, tempfile.TemporaryDirectory(dir=root) as staging:
        members = {member.name[len(prefix) :]: member for member in archive if member.name.startswith(prefix)}
        pending, done = list(SUITE), set()
        while pending:
            name = pending.pop()
            if name in done:
                continue
            done.add(name)
            if name not in members:
                if not (STANDINS / name).is_file():
                    raise RuntimeError(
                        f"transformers {version}'s test suite imports tests/{name}, which neither its sdist nor "
                        f"the stand-ins in {STANDINS} provide."
                    )
                continue
            source = archive.extractfile(members[name]).read()
            target = Path(staging, "tests", name)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(source)
            pending += _local_imports(source, name)
        # Must stay empty: `ConfigTester`'s module runs it as `transformers` (`direct_transformers_import`).
        Path(staging, "tests", "__init__.py").write_text("")
        for package in {Path(name).parent for name in done if name in members} - {Path(".")}:
            Path(staging, "tests", package, "__init__.py").touch()
        try:
            Path(staging, "tests").rename(tests)
        except OSError:
            if not (tests / "__init__.py").is_file():  # not a concurrent run that got there first
                raise
    return tests


def _local_imports(source: bytes, name: str) -> list[str]:
    """The files of `tests/` that the module `tests/<name>` imports relatively (`from .x.y import z`)."""
    here = Path(name).parent.parts
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom) and node.level and node.module:
            base = here[: len(here) - node.level + 1]
            found.append("/".join([*base, *node.module.split(".")]) + ".py")
    return found
