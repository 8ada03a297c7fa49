"""The suite's own pytest configuration (tests/conftest.py): how xdist spreads the tests."""

from types import SimpleNamespace

import conftest
import pytest


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
