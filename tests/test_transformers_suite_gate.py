"""transformers' common model tests may skip on a developer's machine without the package index, never in CI.

Runs `tests/test_transformers_common.py` in a child pytest whose pip cannot reach any index (an address nothing
listens on, an empty suite cache), once as a developer (skipped) and once with `CI=true` (an error that says why).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from fixtures import run_at_once

TESTS = Path(__file__).resolve().parent


def common_tests_command(suite_cache: Path, ci: bool) -> dict:
    env = {key: value for key, value in os.environ.items() if not key.startswith("PIP_") and key != "CI"}
    env.update(
        ENERGYFORMERS_TRANSFORMERS_SUITE_CACHE=str(suite_cache),
        PIP_CONFIG_FILE=os.devnull,  # no machine-wide find-links or index
        PIP_INDEX_URL="http://127.0.0.1:9/simple",  # the discard port: the connection is refused at once
        PIP_RETRIES="0",
    )
    if ci:
        env["CI"] = "true"
    command = [sys.executable, "-m", "pytest", "-q", "-rs", "-p", "no:randomly", "-p", "no:cacheprovider"]
    command += [str(TESTS / "test_transformers_common.py"), "-k", "test_config"]
    return dict(args=command, cwd=TESTS.parent, env=env)


@pytest.fixture(scope="module")
def child_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[bool, subprocess.CompletedProcess]:
    """The developer's and the CI child pytest, each with an empty suite cache of its own, run at once."""
    commands = {ci: common_tests_command(tmp_path_factory.mktemp("suite"), ci) for ci in (False, True)}
    return run_at_once(commands, timeout=300)


@pytest.mark.parametrize("ci", [False, True], ids=["developer", "ci"])
def test_common_tests_skip_only_outside_ci(child_runs, ci):
    result = child_runs[ci]
    output = result.stdout + result.stderr
    assert "need the package index" in output, output[-3000:]
    if ci:
        assert result.returncode not in (0, 5), (result.returncode, output[-3000:])
        assert "may not be skipped in CI" in output, output[-3000:]
    else:
        assert result.returncode in (0, 5) and "skipped" in output, (result.returncode, output[-3000:])
