"""iMixer's host reads: what a CUDA run of a forward would wait for, counted on CPU with
`host_syncs.counting_host_syncs` (what it counts and what it cannot see: its docstring).

A host read (`.item()`, `bool()`, `int()`, `.tolist()`, a data-dependent shape such as `nonzero` or a boolean
index) makes the host wait for the device; a tensor made from Python data on the device (`torch.tensor(x,
device=...)`, a CPU tensor copied over) is a pageable copy, which synchronises too. Sequence inputs need one read,
the ids' range check, and none for `inputs_embeds`; the tolerance solvers read once per step (whether to stop, and
whether a sample diverged); the fixed-point diagnostics make no host copy.
"""

from __future__ import annotations

from collections.abc import Callable

import device_proxy
import pytest
import torch
from fixtures import Case, DispatchedOps
from host_syncs import Sync, counting_host_syncs

from energyformers import IMixerForImageClassification, IMixerForSequenceClassification

IMAGE = Case.of(IMixerForImageClassification)
SEQUENCE = Case.of(IMixerForSequenceClassification)


def host_reads(call: Callable[[], object]) -> list[Sync]:
    """The host reads and copies of `call()`, run on the stand-in device."""
    with counting_host_syncs() as probe:
        call()
    return probe.found


def on_device(model: torch.nn.Module) -> torch.nn.Module:
    return device_proxy.module_to_accelerator(model)


def sequence_reads(*, embeds: bool, mask: bool, length: int, real: int | None = None) -> list[Sync]:
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
        return host_reads(lambda: model(**inputs))


@pytest.mark.parametrize("mask", [False, True], ids=["no mask", "mask"])
@pytest.mark.parametrize("embeds", [False, True], ids=["input_ids", "inputs_embeds"])
def test_sequence_inputs_read_the_host_once_with_ids_and_never_with_embeddings(embeds, mask):
    # the fixtures' sequences fit the S = max_position_embeddings slots: no count of real tokens needs reading
    assert SEQUENCE.tiny.length <= SEQUENCE.tiny.positions
    found = sequence_reads(embeds=embeds, mask=mask, length=SEQUENCE.tiny.length)
    # the one read with ids: their range (and an integer mask's stray values) in `_check_token_ids`
    expected = 0 if embeds else 1
    assert len(found) == expected, f"{len(found)} host reads, expected {expected}: {list(map(str, found))}"
    assert all(sync.kind == "tolist" for sync in found), list(map(str, found))


def test_a_mask_over_more_positions_than_slots_reads_its_count_of_real_tokens():
    """More positions than S slots with a mask: whether the real tokens fit is only known on the device, so their
    largest count is read (besides the ids' range); too many are refused, as without a mask (no read)."""
    slots = SEQUENCE.tiny.positions
    found = sequence_reads(embeds=False, mask=True, length=slots + 2, real=slots)
    assert len(found) == 2, list(map(str, found))
    with pytest.raises(ValueError, match=f"sequence length {slots + 1} exceeds"):
        sequence_reads(embeds=False, mask=True, length=slots + 2, real=slots + 1)
    with pytest.raises(ValueError, match=f"sequence length {slots + 1} exceeds"):
        sequence_reads(embeds=True, mask=False, length=slots + 1)


def test_a_mask_is_used_as_the_keep_mask_without_building_one():
    model = SEQUENCE.build()
    inputs = SEQUENCE.inputs()
    with torch.no_grad(), DispatchedOps() as ops:
        model.imixer.embeddings(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"])
    made = [name for name in ops.ops if name.startswith(("aten.ones", "aten.full", "aten.fill"))]
    assert made == [], f"the embeddings built a keep mask beside the given one: {made}"


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_read_the_host_once_per_step(solver):
    model = on_device(IMAGE.build())
    pixels = device_proxy.to_accelerator(IMAGE.inputs()["pixel_values"])
    call = dict(fixed_point_solver=solver, fixed_point_tolerance=1e-4, fixed_point_iterations=12)
    with torch.no_grad():
        found = host_reads(lambda: model(pixels, **call))
        with device_proxy.accelerator():
            steps = model(pixels, output_fixed_point_residuals=True, **call).fixed_point_residuals.iterations
    # per block and step one read: whether any sample goes on (and whether one diverged, for the warning)
    expected = int(steps.sum())
    assert expected > len(model.imixer.layers), f"the solves stopped at once ({steps.tolist()}): a weak check"
    assert len(found) == expected, (
        f"{len(found)} host reads for {steps.tolist()} steps per block: {list(map(str, found))}"
    )


def test_fixed_point_diagnostics_make_no_host_copy():
    model = on_device(IMAGE.build())
    pixels = device_proxy.to_accelerator(IMAGE.inputs()["pixel_values"])
    with torch.no_grad():
        found = host_reads(lambda: model(pixels, output_fixed_point_residuals=True))
        with device_proxy.accelerator():
            diagnostics = model(pixels, output_fixed_point_residuals=True).fixed_point_residuals
    assert found == [], list(map(str, found))
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
