"""`centers_scope`, opened around each pipeline call and evaluation, when scopes overlap across threads (a server
answering requests concurrently) and when other threads use a model while a scope is open: HyperBF's centers cache
(`cached_centers`) is scoped to the thread that opens it, and iMixer's scope switches on no cache, in particular not
torch's process-wide `parametrize.cached()`.

Real threads, with the interleaving forced by events (no timing): `ScopeInThread` opens a scope in a thread of its
own, runs a forward inside it (which fills the cache) and holds the scope open until `close()`. So
`a, b = ScopeInThread(...), ScopeInThread(...); a.close(); b.close()` is exactly A-enter, B-enter, A-exit, B-exit.
"""

from __future__ import annotations

import concurrent.futures
import contextlib
import gc
import threading
import weakref
from collections.abc import Callable

import pytest
import torch
from fixtures import hyperbf_config, imixer_config, perturb

from energyformers import HyperBFForImageClassification, IMixerForImageClassification
from energyformers.modeling.modeling_hyperbf import HyperBFFeedForward
from energyformers.pipelines import centers_scope

WAIT = 60.0  # seconds: only a deadlock ever waits this long


class ScopeInThread:
    """`scope()` entered in a new thread, `work()` run inside it, then held open until `close()`."""

    def __init__(
        self, scope: Callable[[], contextlib.AbstractContextManager], work: Callable[[], None]
    ) -> None:
        self.inside, self.release = threading.Event(), threading.Event()
        self.error: BaseException | None = None

        def run() -> None:
            try:
                with scope():
                    work()
                    self.inside.set()
                    assert self.release.wait(WAIT), "never released"
            except BaseException as error:  # handed to the test thread by close()
                self.error = error
            finally:
                self.inside.set()

        self.thread = threading.Thread(target=run, daemon=True)
        self.thread.start()
        assert self.inside.wait(WAIT), "the thread never entered its scope"
        if self.error is not None:
            raise self.error

    def close(self) -> None:
        self.release.set()
        self.thread.join(WAIT)
        assert not self.thread.is_alive(), "the thread did not leave its scope"
        if self.error is not None:
            raise self.error


def pixels(channels: int, seed: int = 0) -> torch.Tensor:
    return torch.randn(2, channels, 8, 8, generator=torch.Generator().manual_seed(seed))


def logits(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    with torch.no_grad():
        return model(pixel_values=x).logits


def assert_equal(got: torch.Tensor, expected: torch.Tensor, what: str) -> None:
    assert torch.equal(got, expected), f"{what}: max |Δ| = {(got - expected).abs().max().item():.3g}"


# ------------------------------------------------------------------------------------------------ HyperBF


def hyperbf(seed: int = 2) -> HyperBFForImageClassification:
    torch.manual_seed(0)
    return perturb(HyperBFForImageClassification(hyperbf_config("image")), seed=seed).eval()


def feedforwards(model: torch.nn.Module) -> list[HyperBFFeedForward]:
    return [module for module in model.modules() if isinstance(module, HyperBFFeedForward)]


def hyperbf_state(model: torch.nn.Module) -> list[tuple[bool, int]]:
    """Per feedforward, as this thread sees it: whether its forwards reuse the centers, and how much is cached."""
    return [(ff.reuse_centers, len(ff._eval_cache)) for ff in feedforwards(model)]


def write_centers_through_data(model: torch.nn.Module) -> None:
    """The write the cache's stamp cannot see (storage and version unchanged)."""
    for ff in feedforwards(model):
        ff.centers.data.mul_(0.5)


def test_hyperbf_scopes_overlapping_across_threads_leave_nothing_cached():
    """A-enter, B-enter, A-exit, B-exit in two threads (two concurrent pipeline calls): once both have left, no
    forward reuses the centers and the cache is empty, so a `.data` write afterwards is seen."""
    model = hyperbf()
    x = pixels(3)
    states: dict[str, list] = {}

    def forward_and_look(name: str) -> Callable[[], None]:
        def work() -> None:
            logits(model, x)
            states[name] = hyperbf_state(model)

        return work

    a = ScopeInThread(model.cached_centers, forward_and_look("A"))
    b = ScopeInThread(model.cached_centers, forward_and_look("B"))
    a.close()
    between = [len(ff._eval_cache) for ff in feedforwards(model)]
    b.close()
    layers = len(feedforwards(model))
    # the scopes did cache (else the checks below prove nothing), and A's exit kept the cache B still uses
    assert states["A"] == states["B"] == [(True, 1)] * layers, states
    assert between == [1] * layers, f"cache entries after A left, B still inside: {between}"
    assert hyperbf_state(model) == [(False, 0)] * layers, f"after both left: {hyperbf_state(model)}"
    before = logits(model, x)
    write_centers_through_data(model)
    reference = hyperbf()
    reference.load_state_dict(model.state_dict())
    after = logits(model, x)
    assert_equal(
        after, logits(reference, x), "a forward after both scopes against a model with the written weights"
    )
    assert not torch.equal(after, before), "the write changed nothing: the check above proves nothing"


def test_hyperbf_scope_of_one_thread_leaves_another_threads_forwards_uncached():
    """While a pipeline call holds `cached_centers` open in one thread, a direct call in another thread is outside
    any scope: it computes the centers as they are, so it sees a `.data` write (which a scope would miss)."""
    model = hyperbf()
    x = pixels(3)
    seen: list[list[tuple[bool, int]]] = []

    def work() -> None:
        logits(model, x)
        seen.append(hyperbf_state(model))

    serving = ScopeInThread(model.cached_centers, work)
    try:
        assert seen == [[(True, 1)] * len(feedforwards(model))], f"the scope's thread: {seen}"
        assert all(not reuse for reuse, _ in hyperbf_state(model)), f"this thread: {hyperbf_state(model)}"
        before = logits(model, x)
        write_centers_through_data(model)
        got = logits(model, x)
    finally:
        serving.close()
    reference = hyperbf()
    reference.load_state_dict(model.state_dict())
    assert_equal(got, logits(reference, x), "a direct call while another thread's scope is open")
    assert not torch.equal(got, before), "the write changed nothing: the check above proves nothing"


def test_hyperbf_scope_closed_from_another_thread_leaves_its_opener_uncached_and_holds_no_model():
    """A streaming response's generator holds `cached_centers` open and is resumed on another pool thread
    (`concurrent.futures`, `run_in_executor`: no context copied), so its scope closes in a thread other than the
    one that opened it. Afterwards the opening thread's forwards reuse nothing (they see a `.data` write) and its
    leftover token keeps no dropped model alive."""
    model, x = hyperbf(), pixels(3)
    opener, closer = (concurrent.futures.ThreadPoolExecutor(max_workers=1) for _ in range(2))

    def stream(served: torch.nn.Module):
        with served.cached_centers():
            logits(served, x)
            yield hyperbf_state(served)

    try:
        response = stream(model)
        inside = opener.submit(next, response).result(WAIT)
        assert inside == [(True, 1)] * len(feedforwards(model)), f"inside the scope: {inside}"
        closer.submit(response.close).result(WAIT)
        after = opener.submit(hyperbf_state, model).result(WAIT)
        assert after == [(False, 0)] * len(feedforwards(model)), f"the opening thread, scope closed: {after}"
        write_centers_through_data(model)
        got = opener.submit(logits, model, x).result(WAIT)
        reference = hyperbf()
        reference.load_state_dict(model.state_dict())
        assert_equal(got, logits(reference, x), "the opening thread's forward after a .data write")
        dropped = weakref.ref(feedforwards(model)[0])
        del model, response, reference
        gc.collect()
        assert dropped() is None, (
            f"a dropped model's feedforward is kept alive by: {gc.get_referrers(dropped())}"
        )
    finally:
        opener.shutdown()
        closer.shutdown()


def test_hyperbf_scope_closed_from_a_thread_inside_its_own_scope_ends_the_right_one():
    """The pool thread that closes another thread's streaming scope has a scope of its own open (a second
    streaming response): the closed scope ends for its opener, whose forwards then see a `.data` write, and the
    closing thread keeps reusing the centers inside its own scope."""
    model, x = hyperbf(), pixels(3)
    layers = len(feedforwards(model))
    opener, closer = (concurrent.futures.ThreadPoolExecutor(max_workers=1) for _ in range(2))

    def stream():
        with model.cached_centers():
            logits(model, x)
            yield hyperbf_state(model)

    own = model.cached_centers()
    try:
        response = stream()
        inside = opener.submit(next, response).result(WAIT)
        assert inside == [(True, 1)] * layers, f"the opener inside its scope: {inside}"
        closer.submit(own.__enter__).result(WAIT)
        closer.submit(response.close).result(WAIT)
        states = {
            "closer, inside its own scope": closer.submit(hyperbf_state, model).result(WAIT),
            "opener, its scope closed": opener.submit(hyperbf_state, model).result(WAIT),
        }
        # the cache stays for the closer's scope, which uses it; the opener's forwards no longer do
        expected = {
            "closer, inside its own scope": [(True, 1)] * layers,
            "opener, its scope closed": [(False, 1)] * layers,
        }
        assert states == expected, f"got {states}, expected {expected}"
        before = opener.submit(logits, model, x).result(WAIT)
        write_centers_through_data(model)
        got = opener.submit(logits, model, x).result(WAIT)
        reference = hyperbf()
        reference.load_state_dict(model.state_dict())
        assert_equal(
            got, logits(reference, x), "the opener's forward after a .data write, the closer's scope open"
        )
        assert not torch.equal(got, before), "the write changed nothing: the check above proves nothing"
    finally:
        closer.submit(own.__exit__, None, None, None).result(WAIT)
        opener.shutdown()
        closer.shutdown()
    assert hyperbf_state(model) == [(False, 0)] * layers, f"after both scopes: {hyperbf_state(model)}"


def test_hyperbf_scopes_of_one_thread_closed_out_of_order_leave_nothing_cached():
    """Two scopes of one thread closed in the order they were opened (two exit stacks, two generators): the model
    reuses the centers until the second one closes, and not after."""
    model = hyperbf()
    x = pixels(3)
    layers = len(feedforwards(model))
    a, b = model.cached_centers(), model.cached_centers()
    a.__enter__()
    b.__enter__()
    logits(model, x)
    a.__exit__(None, None, None)
    assert hyperbf_state(model) == [(True, 1)] * layers, f"B still open: {hyperbf_state(model)}"
    b.__exit__(None, None, None)
    assert hyperbf_state(model) == [(False, 0)] * layers, f"after both: {hyperbf_state(model)}"


# ------------------------------------------------------------------------------------------------ iMixer


def imixer(seed: int = 2) -> IMixerForImageClassification:
    torch.manual_seed(0)
    return perturb(IMixerForImageClassification(imixer_config("image")), seed=seed).eval()


@pytest.mark.parametrize("write", ["load_state_dict", "data"])
def test_imixer_weights_written_while_another_threads_pipeline_call_is_open_are_used(write):
    """A hot reload (`load_state_dict` under no_grad) or a `.data` write in one thread while a pipeline call
    (`centers_scope`) is in flight in another: the next direct call uses the new weights, F's normalised weights
    included."""
    model, new = imixer(), imixer(seed=7)
    x = pixels(1)
    serving = ScopeInThread(lambda: centers_scope(model), lambda: logits(model, x))
    try:
        with torch.no_grad():
            if write == "load_state_dict":
                model.load_state_dict(new.state_dict())
            else:
                for name, tensor in model.state_dict().items():
                    tensor.data.copy_(new.state_dict()[name].data)
        got = logits(model, x)
    finally:
        serving.close()
    expected = logits(new, x)
    assert not torch.equal(expected, logits(imixer(), x)), "the new weights answer as the old: proves nothing"
    assert_equal(got, expected, f"after {write} while another thread's scope is open, against the new model")


def sgd_steps(model: torch.nn.Module, evaluate_first: bool = False) -> list[torch.Tensor]:
    """The losses of two SGD steps of `model` on one seeded batch, each after an eval forward if `evaluate_first`."""
    x, labels = pixels(1, seed=1), torch.tensor([0, 1])
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(2):
        if evaluate_first:
            model.eval()
            logits(model, x)
        model.train()
        loss = model(pixel_values=x, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        losses.append(loss.detach())
    return losses


def test_imixer_training_while_another_threads_pipeline_call_is_open():
    """Training steps of an iMixer in one thread while a pipeline call of another iMixer is in flight in another:
    each step computes F's weights from the weights of that step, with the gradients of training alone."""
    served = imixer()
    alone = sgd_steps(imixer(seed=3))
    serving = ScopeInThread(lambda: centers_scope(served), lambda: logits(served, pixels(1)))
    try:
        beside = sgd_steps(imixer(seed=3))
    finally:
        serving.close()
    for step, (got, expected) in enumerate(zip(beside, alone)):
        assert_equal(got, expected, f"loss of step {step} beside a pipeline call against alone")


def test_imixer_training_steps_inside_a_scope_compute_the_weights():
    """A training step taken inside a scope (an evaluation between steps, say) differentiates through the weights of
    that step."""

    def two_steps(model: torch.nn.Module, scoped: bool) -> list[torch.Tensor]:
        with centers_scope(model) if scoped else contextlib.nullcontext():
            return sgd_steps(
                model, evaluate_first=True
            )  # each step's evaluation fills the cache inside the scope

    for step, (got, expected) in enumerate(zip(two_steps(imixer(), True), two_steps(imixer(), False))):
        assert_equal(got, expected, f"loss of step {step} inside a scope against outside")
