import os
import sys
from collections.abc import Iterator

# No test may reach the network (Hub, dataset downloads); set before transformers is imported.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
import pytest
import torch
import transformers

try:
    from transformers_suite import sdist  # how test_transformers_common.py imports transformers' common tests
except ImportError:  # this file linked into another folder by a test of the suite's own configuration
    sdist = None

# Without CUDA, Triton kernels run in Triton's CPU interpreter (read when the kernels are built, on first use); with
# CUDA they are compiled for the GPU, and the attention tests also run on it (tests/test_attention_implementations.py).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

# Tiny test models are dominated by thread hand-off on 2 shared cores; one thread is much faster. The suite must pass
# with any count (reductions split differently across threads): `ENERGYFORMERS_TEST_THREADS=2 make test` checks 2.
torch.set_num_threads(int(os.environ.get("ENERGYFORMERS_TEST_THREADS", "1")))
THREADS = torch.get_num_threads()

# The seed every test starts from (Python's `random`, NumPy and torch, CPU and CUDA, and the generator of
# transformers' common tests).
SEED = 0


def seed() -> None:
    """Every generator a test draws from, at `SEED`. transformers' common tests (test_transformers_common.py) draw
    their inputs (`ids_tensor`, `floats_tensor`, `random_attention_mask`) from their module's own `global_rng`,
    which `set_seed` does not reach: seeded here once that module is imported, so a failure there replays."""
    transformers.set_seed(SEED)
    common = sys.modules.get(f"{sdist.PACKAGE}.test_modeling_common") if sdist else None
    if common is not None and hasattr(common, "global_rng"):
        common.global_rng.seed(SEED)


@pytest.hookimpl(tryfirst=True)
def pytest_runtest_setup(item: pytest.Item) -> None:
    """The seed before any fixture of the test is set up, so a module-scoped fixture, built for whichever of its
    module's tests runs first, draws the same in every order too."""
    seed()


@pytest.fixture(autouse=True)
def _seeded() -> None:
    """Every test draws from the same random state whichever tests ran before it and whatever the order's seed, so
    the suite passes in any order (pytest-randomly shuffles it; `pytest_configure` stops its reseeding)."""
    seed()


@pytest.fixture(autouse=True)
def _logging_kept() -> Iterator[None]:
    """A test that leaves transformers' logging changed (a CLI run in-process quieting it) fails here, and the state
    is put back: tests that capture transformers' warnings (its own common tests) must not depend on what ran before.
    """
    before = (transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled())
    yield
    after = (transformers.logging.get_verbosity(), transformers.utils.logging.is_progress_bar_enabled())
    if after != before:
        transformers.logging.set_verbosity(before[0])
        (
            transformers.utils.logging.enable_progress_bar
            if before[1]
            else transformers.utils.logging.disable_progress_bar
        )()
        pytest.fail(
            f"transformers' (verbosity, progress bars) changed from {before} to {after} and was not restored"
        )


@pytest.fixture(autouse=True)
def _threads_kept() -> Iterator[None]:
    """A test that leaves torch's thread count changed (a command or benchmark run in-process with `--num_threads`)
    fails here, and the suite's count is put back, so every later test runs with the count the suite was started
    with. Compared with the suite's count, not only with the count before the test: a module-scoped fixture runs
    before this one, so its change shows as a test that starts with another count."""
    before = torch.get_num_threads()
    yield
    after = torch.get_num_threads()
    if before == after == THREADS:
        return
    torch.set_num_threads(THREADS)
    pytest.fail(
        f"torch's thread count was {before} when the test started and {after} when it ended; the suite runs with "
        f"{THREADS} (ENERGYFORMERS_TEST_THREADS), and what changes it must put it back"
    )


@pytest.fixture(autouse=True)
def _determinism_kept() -> Iterator[None]:
    """A test that leaves torch's deterministic-algorithms mode on (a command run in-process with
    `--full_determinism` that did not put it back) fails here, and the mode is put back, so no later test runs with
    it: under it an op without a deterministic algorithm raises."""
    before = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    yield
    after = (
        torch.are_deterministic_algorithms_enabled(),
        torch.is_deterministic_algorithms_warn_only_enabled(),
    )
    if after == before:
        return
    torch.use_deterministic_algorithms(before[0], warn_only=before[1])
    pytest.fail(
        f"torch's deterministic algorithms (on, warn only) went from {before} to {after} and were not put back"
    )


def pytest_configure(config: pytest.Config) -> None:
    """pytest-randomly only shuffles the order (its `--randomly-dont-reset-seed`): it would otherwise reseed Python's
    `random` and NumPy from its seed and the test's id just before each test body, after `_seeded`, so a test body
    would draw differently under each --randomly-seed. Set here rather than in addopts, which would be an unknown
    option under `-p no:randomly`.

    Under pytest-xdist (`make test`), whole test files go to one process rather than single tests (`--dist
    loadfile` in place of xdist's default `load`): a module-scoped fixture (a trained folder, a fresh process's
    outputs) is then built by one process instead of by each process that runs one of its file's tests. A `--dist`
    given on the command line or in PYTEST_ADDOPTS is kept."""
    if hasattr(config.option, "randomly_reset_seed"):
        config.option.randomly_reset_seed = False
    given = [*config.invocation_params.args, *os.environ.get("PYTEST_ADDOPTS", "").split()]
    chosen = any(str(arg).startswith("--dist") or str(arg) == "-d" for arg in given)
    if getattr(config.option, "dist", "no") == "load" and not chosen:
        config.option.dist = "loadfile"


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, config: pytest.Config) -> None:
    """The order's seed, also under `-q` (which hides pytest-randomly's header): replay with --randomly-seed=N."""
    seed = getattr(config.option, "randomly_seed", None)
    if seed is not None:
        terminalreporter.write_line(
            f"test order: pytest-randomly seed {seed} (replay: --randomly-seed={seed})"
        )
