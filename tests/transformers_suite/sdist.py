"""transformers' common test files for the installed transformers, imported as `transformers_tests`.

`fetch(cache)` downloads the source distribution of the installed version from the package index (through pip,
into `cache`) and extracts `tests/test_modeling_common.py`, `tests/test_configuration_common.py` and whatever they
import from `tests/` that the sdist has. It is the network step, run before pytest by `make data`
(`.ci/install-data.sh` runs this file: `python tests/transformers_suite/sdist.py`). `load(cache)` only reads
`cache`, so the test suite stays offline: it imports the files as the package `transformers_tests` (our own
`tests/` folder is no package; a distinct name keeps the two apart), whose path is the extracted folder, then this
folder: the modules the sdist lacks come from the stand-ins here. `load` raises `SuiteMissing` when the sdist is not
in `cache`, and `RuntimeError` for any other failure (a module neither the sdist nor the stand-ins provide).
"""

from __future__ import annotations

import ast
import importlib
import importlib.metadata
import importlib.util
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path
from types import ModuleType

PACKAGE = "transformers_tests"
SUITE = ("test_modeling_common.py", "test_configuration_common.py")
STANDINS = Path(__file__).resolve().parent
# Where `fetch` puts the sdist and `load` reads it: the folder `request.config.cache.mkdir("transformers-sdist")`
# returns (the suite is needed at import time, before any fixture runs), or $ENERGYFORMERS_TRANSFORMERS_SUITE_CACHE.
CACHE = Path(
    os.environ.get("ENERGYFORMERS_TRANSFORMERS_SUITE_CACHE")
    or STANDINS.parents[1] / ".pytest_cache" / "d" / "transformers-sdist"
)
FETCH = "`make data` (or `.venv/bin/python tests/transformers_suite/sdist.py`)"
# Not `transformers.__version__`: running this file to fetch should not pay for importing transformers.
VERSION = importlib.metadata.version("transformers")


class SuiteMissing(RuntimeError):
    """The sdist is not in the cache: `fetch` (`make data`) has not run, or could not reach the index."""


def load(cache: Path = CACHE, version: str = VERSION) -> tuple[ModuleType, ModuleType]:
    """transformers' `tests.test_modeling_common` and `tests.test_configuration_common` for `version`, from
    `cache` only (no network)."""
    sdist = cache / f"transformers-{version}.tar.gz"
    if not sdist.is_file():
        raise SuiteMissing(
            f"transformers' common test files (the transformers=={version} sdist) are not in {cache}; "
            f"fetch them with {FETCH}"
        )
    tests = extract(sdist, cache / version, version)
    if PACKAGE not in sys.modules:
        spec = importlib.util.spec_from_file_location(
            PACKAGE, tests / "__init__.py", submodule_search_locations=[str(tests), str(STANDINS)]
        )
        package = importlib.util.module_from_spec(spec)
        sys.modules[PACKAGE] = package
        spec.loader.exec_module(package)
    return tuple(importlib.import_module(f"{PACKAGE}.{Path(name).stem}") for name in SUITE)


def fetch(cache: Path = CACHE, version: str = VERSION) -> Path:
    """Download (unless it is there) and extract the sdist of transformers `version` into `cache`: the folder
    `load` reads its test files from."""
    cache.mkdir(parents=True, exist_ok=True)
    return extract(download(cache, version), cache / version, version)


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


if __name__ == "__main__":
    try:
        print(f"transformers' common test files: {fetch()}")
    except RuntimeError as error:
        sys.exit(f"{Path(__file__).name}: {error}")
