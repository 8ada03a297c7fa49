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


def test_assert_differs_refuses_a_nan_that_not_equal_would_let_through() -> None:
    import torch

    reference = torch.tensor([1.0, 2.0])
    broken = torch.tensor([1.0, float("nan")])
    assert not torch.equal(broken, reference) and not torch.allclose(
        broken, reference
    )  # what the old asserts saw
    for beyond_allclose in (False, True):
        with pytest.raises(AssertionError, match="logits: got has 1 non-finite values out of 2"):
            fixtures.assert_differs(broken, reference, "logits", beyond_allclose=beyond_allclose)
    with pytest.raises(AssertionError, match=r"expected a difference, got max \|Δ\| = 0.0"):
        fixtures.assert_differs(reference.clone(), reference, "logits")
    # within allclose's tolerances (rtol 1e-5): different, but not beyond_allclose
    nearby = reference + 1e-7
    fixtures.assert_differs(nearby, reference, "logits")
    with pytest.raises(AssertionError, match="expected a difference"):
        fixtures.assert_differs(nearby, reference, "logits", beyond_allclose=True)
    fixtures.assert_differs(reference + 1, reference, "logits", beyond_allclose=True)
