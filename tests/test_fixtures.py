"""The helpers of tests/fixtures.py that decide how a test reports: a missing prerequisite (skipped on a developer's
machine, failed under `CI=true`) and a fresh process that runs past its timeout (its output shown)."""

from __future__ import annotations

import sys
from pathlib import Path

import fixtures
import pytest


@pytest.mark.parametrize("ci", ["true", "1", "YES"])
def test_a_missing_prerequisite_fails_under_ci(monkeypatch: pytest.MonkeyPatch, ci: str) -> None:
    monkeypatch.setenv("CI", ci)
    with pytest.raises(
        pytest.fail.Exception, match=r"no data here \(CI=true: this test may not be skipped in CI\)"
    ):
        fixtures.skip_or_fail("no data here")


@pytest.mark.parametrize("ci", [None, "", "false", "0"])
def test_a_missing_prerequisite_skips_outside_ci(monkeypatch: pytest.MonkeyPatch, ci: str | None) -> None:
    if ci is None:
        monkeypatch.delenv("CI", raising=False)
    else:
        monkeypatch.setenv("CI", ci)
    with pytest.raises(pytest.skip.Exception, match=r"^no data here$"):
        fixtures.skip_or_fail("no data here")


def test_missing_author_fixtures_are_named_with_the_folder(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("CI", "true")
    monkeypatch.setattr(fixtures, "AUTHOR_FIXTURES", tmp_path)
    (tmp_path / "imixer_tiny.json").write_text("{}")  # one of the two files of the fixture
    with pytest.raises(pytest.fail.Exception) as failed:
        fixtures.require_author_fixtures("imixer_tiny")
    message = str(failed.value)
    assert f"not at {tmp_path} (missing: imixer_tiny.safetensors)" in message, message
    (tmp_path / "imixer_tiny.safetensors").write_bytes(b"")
    assert fixtures.require_author_fixtures("imixer_tiny") == tmp_path
    with pytest.raises(ValueError, match=r"names=\['imixer'\]: not an author fixture; the fixtures are \["):
        fixtures.require_author_fixtures("imixer")


def test_a_timed_out_run_shows_what_each_process_wrote() -> None:
    def python(code: str) -> dict[str, list[str]]:
        return {"args": [sys.executable, "-c", code]}

    commands = {
        # waited for first, so it has finished (and written everything) before the other one's timeout starts
        "quick": python("import sys; print('quick out'); print('quick err', file=sys.stderr)"),
        "stuck": python("import time; print('stuck before the wait', flush=True); time.sleep(120)"),
    }
    # 5 s: far more than a bare interpreter needs to start and print, far less than the stuck sleep
    with pytest.raises(AssertionError) as failed:
        fixtures.run_at_once(commands, timeout=5)
    message = str(failed.value)
    assert "ran past 5 s" in message, message
    for expected in ("'quick' (exit status 0)", "quick out", "quick err", "'stuck' (killed at the timeout)"):
        assert expected in message, f"{expected!r} not in:\n{message}"
    assert "stuck before the wait" in message, message
