"""iMixer's host reads: what a CUDA run of a forward would wait for, counted on CPU with the stand-in device of
`tests/device_proxy.py`.

A host read (`.item()`, `bool()`, `int()`, `.tolist()`, a data-dependent shape such as `nonzero` or a boolean
index) makes the host wait for the device; a tensor made from Python data on the device (`torch.tensor(x,
device=...)`, a CPU tensor copied over) is a pageable copy, which synchronises too. Sequence inputs need one read,
the ids' range check, and none for `inputs_embeds`; the tolerance solvers read once per step (whether to stop, and
whether a sample diverged); the fixed-point diagnostics make no host copy.
"""

from __future__ import annotations

import os
import traceback
from collections import Counter

import device_proxy
import pytest
import torch
from fixtures import Case
from torch.utils._python_dispatch import TorchDispatchMode

from energyformers import IMixerForImageClassification, IMixerForSequenceClassification

IMAGE = Case.of(IMixerForImageClassification)
SEQUENCE = Case.of(IMixerForSequenceClassification)
_aten = torch.ops.aten
# ops whose result the host must wait for: a value read, or an output shape that depends on the values
_READS = {
    _aten._local_scalar_dense.default: "item/bool/int/float",
    _aten.nonzero.default: "nonzero",
    _aten.masked_select.default: "masked_select",
    _aten._unique2.default: "unique",
    _aten.unique_consecutive.default: "unique",
    _aten.unique_dim.default: "unique",
    _aten.repeat_interleave.Tensor: "repeat_interleave",
}
_PACKAGE = os.sep + "modeling" + os.sep


def _where() -> str:
    """The innermost package frame: the line that asked for the read."""
    frames = [f for f in traceback.extract_stack() if _PACKAGE in f.filename]
    return f"{os.path.basename(frames[-1].filename)}:{frames[-1].lineno}" if frames else "?"


class _HostReads:
    """Counts (kind, package line) of each host read and host-to-device copy of stand-in tensors while `active`."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.found: Counter = Counter()
        self.active = False
        run, tolist, on_stand_in = (
            device_proxy._run,
            device_proxy.Accelerated.tolist,
            device_proxy._on_stand_in,
        )

        def counted_run(func, args, kwargs):
            if self.active:
                self._check(func, args, kwargs)
            return run(func, args, kwargs)

        def counted_tolist(tensor):
            if self.active:
                self.found["tolist", _where()] += 1
            return tolist(tensor)

        def counted_on_stand_in(factory):
            create = on_stand_in(factory)

            def made(data, *args, device=None, **kwargs):
                if self.active and device is not None and torch.device(device) == device_proxy.STAND_IN:
                    self.found["tensor from host data", _where()] += 1
                return create(data, *args, device=device, **kwargs)

            return made

        monkeypatch.setattr(device_proxy, "_run", counted_run)
        monkeypatch.setattr(device_proxy.Accelerated, "tolist", counted_tolist)
        monkeypatch.setattr(device_proxy, "_on_stand_in", counted_on_stand_in)

    def _check(self, func, args, kwargs) -> None:
        flat = torch.utils._pytree.tree_flatten((args, kwargs))[0]
        on_device = any(isinstance(t, device_proxy.Accelerated) for t in flat)
        if func in _READS and on_device:
            self.found[_READS[func], _where()] += 1
        if func is _aten.index.Tensor and on_device:
            if any(i is not None and i.dtype == torch.bool for i in args[1]):
                self.found["boolean index", _where()] += 1
        if func in (_aten._to_copy.default, _aten.copy_.default):
            source = args[0] if func is _aten._to_copy.default else args[1]
            device = kwargs.get("device")
            to_device = (func is _aten.copy_.default and isinstance(args[0], device_proxy.Accelerated)) or (
                device is not None and torch.device(device) == device_proxy.STAND_IN
            )
            if to_device and isinstance(source, torch.Tensor) and not device_proxy.on_accelerator(source):
                self.found[f"host copy {tuple(source.shape)}", _where()] += 1

    def count(self, call) -> Counter:
        """The reads of `call()`, run on the stand-in device."""
        self.found.clear()
        with device_proxy.accelerator():
            self.active = True
            try:
                call()
            finally:
                self.active = False
        return Counter(self.found)


@pytest.fixture
def host_reads(monkeypatch) -> _HostReads:
    return _HostReads(monkeypatch)


def on_device(model: torch.nn.Module) -> torch.nn.Module:
    return device_proxy.module_to_accelerator(model)


def test_the_detector_counts_reads_and_host_copies(host_reads):
    values = device_proxy.to_accelerator(torch.tensor([0.5, -1.0, 2.0]))

    def reads():
        values.max().item()
        values.tolist()
        values[values > 0].sum()
        torch.tensor(3.0, device=device_proxy.STAND_IN)
        torch.full((), 3.0, device=device_proxy.STAND_IN)  # filled on the device: no copy

    found = host_reads.count(reads)
    kinds = Counter(kind for kind, _ in found.elements())
    assert kinds == Counter(
        {"item/bool/int/float": 1, "tolist": 1, "boolean index": 1, "tensor from host data": 1}
    ), found


def sequence_reads(host_reads, *, embeds: bool, mask: bool, length: int, real: int | None = None) -> Counter:
    """Host reads of a no-grad eval forward of the sequence classifier on `length` positions, `real` of them
    real tokens in every row when `mask`."""
    model = on_device(SEQUENCE.build())
    g = torch.Generator().manual_seed(0)
    ids = torch.randint(0, SEQUENCE.tiny.vocab, (SEQUENCE.tiny.batch, length), generator=g)
    inputs = {"inputs_embeds": model.imixer.embeddings.word_embeddings(device_proxy.to_accelerator(ids))}
    if not embeds:
        inputs = {"input_ids": device_proxy.to_accelerator(ids)}
    if mask:
        keep = torch.zeros(SEQUENCE.tiny.batch, length, dtype=torch.long)
        keep[:, : length if real is None else real] = 1
        inputs["attention_mask"] = device_proxy.to_accelerator(keep)
    with torch.no_grad():
        return host_reads.count(lambda: model(**inputs))


@pytest.mark.parametrize("mask", [False, True], ids=["no mask", "mask"])
@pytest.mark.parametrize("embeds", [False, True], ids=["input_ids", "inputs_embeds"])
def test_sequence_inputs_read_the_host_once_with_ids_and_never_with_embeddings(host_reads, embeds, mask):
    # the fixtures' sequences fit the S = max_position_embeddings slots: no count of real tokens needs reading
    assert SEQUENCE.tiny.length <= SEQUENCE.tiny.positions
    found = sequence_reads(host_reads, embeds=embeds, mask=mask, length=SEQUENCE.tiny.length)
    # the one read with ids: their range (and an integer mask's stray values) in `_check_token_ids`
    expected = 0 if embeds else 1
    assert sum(found.values()) == expected, f"{sum(found.values())} host reads, expected {expected}: {found}"
    assert all(kind == "tolist" for kind, _ in found), found


def test_a_mask_over_more_positions_than_slots_reads_its_count_of_real_tokens(host_reads):
    """More positions than S slots with a mask: whether the real tokens fit is only known on the device, so their
    largest count is read (besides the ids' range); too many are refused, as without a mask (no read)."""
    slots = SEQUENCE.tiny.positions
    found = sequence_reads(host_reads, embeds=False, mask=True, length=slots + 2, real=slots)
    assert sum(found.values()) == 2, found
    with pytest.raises(ValueError, match=f"sequence length {slots + 1} exceeds"):
        sequence_reads(host_reads, embeds=False, mask=True, length=slots + 2, real=slots + 1)
    with pytest.raises(ValueError, match=f"sequence length {slots + 1} exceeds"):
        sequence_reads(host_reads, embeds=True, mask=False, length=slots + 1)


class _Created(TorchDispatchMode):
    def __init__(self) -> None:
        super().__init__()
        self.names: list[str] = []

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        self.names.append(str(func))
        return func(*args, **(kwargs or {}))


def test_a_mask_is_used_as_the_keep_mask_without_building_one():
    model = SEQUENCE.build()
    inputs = SEQUENCE.inputs()
    with torch.no_grad(), _Created() as ops:
        model.imixer.embeddings(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    made = [name for name in ops.names if name.startswith(("aten.ones", "aten.full", "aten.fill"))]
    assert made == [], f"the embeddings built a keep mask beside the given one: {made}"


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_read_the_host_once_per_step(host_reads, solver):
    model = on_device(IMAGE.build())
    pixels = device_proxy.to_accelerator(IMAGE.inputs()["pixel_values"])
    call = dict(fixed_point_solver=solver, fixed_point_tolerance=1e-4, fixed_point_iterations=12)
    with torch.no_grad():
        found = host_reads.count(lambda: model(pixels, **call))
        with device_proxy.accelerator():
            steps = model(pixels, output_fixed_point_residuals=True, **call).fixed_point_residuals.iterations
    # per block and step one read: whether any sample goes on (and whether one diverged, for the warning)
    expected = int(steps.sum())
    assert expected > len(model.imixer.layers), f"the solves stopped at once ({steps.tolist()}): a weak check"
    assert sum(found.values()) == expected, (
        f"{sum(found.values())} host reads for {steps.tolist()} steps per block: {found}"
    )


def test_fixed_point_diagnostics_make_no_host_copy(host_reads):
    model = on_device(IMAGE.build())
    pixels = device_proxy.to_accelerator(IMAGE.inputs()["pixel_values"])
    with torch.no_grad():
        found = host_reads.count(lambda: model(pixels, output_fixed_point_residuals=True))
        with device_proxy.accelerator():
            diagnostics = model(pixels, output_fixed_point_residuals=True).fixed_point_residuals
    assert sum(found.values()) == 0, found
    # the values these are made from: the step count, and s² σ₁ σ₂ with the exact σ of the weights as used
    blocks, steps = len(model.imixer.layers), IMAGE.build().config.fixed_point_iterations
    assert diagnostics.iterations.dtype == torch.int64
    assert diagnostics.iterations.tolist() == [steps] * blocks
    slope = model.config.activation_max_slope
    for index, layer in enumerate(model.imixer.layers):
        first, second = (
            torch.linalg.matrix_norm(w.float(), ord=2) for w in layer.token_mixing.contractive_weights()
        )
        assert torch.equal(diagnostics.lipschitz_bounds[index], first * slope**2 * second), index
