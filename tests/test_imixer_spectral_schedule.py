"""iMixer's `spectral_norm_schedule="per_optimizer_step"`: σ estimates refined once per weight change, traceably.

The weight-change check is tensor code (a non-persistent copy of W at the last refinement), so
`torch.compile(fullgraph=True)` captures a training forward whole and its u, v, losses and gradients follow the
eager model's over optimiser steps with gradient accumulation; a change means a change of W's bits, not of its
in-place version; the stored copy stays out of checkpoints and state_dict.
"""

from __future__ import annotations

import copy

import pytest
import torch
from fixtures import Case, assert_differs, perturb, rounding

from energyformers import IMixerForImageClassification
from energyformers.modeling.modeling_imixer import refine_spectral_norms

IMAGE = Case.of(IMixerForImageClassification)


def spectral_norms(model: IMixerForImageClassification) -> dict[str, torch.nn.Module]:
    """Every IMixerSpectralNorm of the model by name, e.g. `layers.0.fc_sn1`."""
    return {
        f"layers.{index}.{name}": getattr(layer.token_mixing, name).parametrizations.weight[0]
        for index, layer in enumerate(model.imixer.layers)
        for name in ("fc_sn1", "fc_sn2")
    }


def estimates(model: IMixerForImageClassification) -> dict[str, torch.Tensor]:
    return {
        f"{name}.{vector}": getattr(norm, vector).clone()
        for name, norm in spectral_norms(model).items()
        for vector in ("u", "v")
    }


def schedule_model(**overrides) -> IMixerForImageClassification:
    # one power step per refinement: a second refinement within an optimiser step would move u, v visibly;
    # perturbed: a non-zero classifier, so every step changes F's weights (a zero head gives them no gradient)
    model = IMAGE.build(
        spectral_norm_schedule="per_optimizer_step", spectral_norm_power_iterations=1, **overrides
    )
    return perturb(model).train()


def train(model, forward, steps: int = 3, forwards: int = 2) -> dict[str, list]:
    """`steps` SGD steps of `forwards` accumulated forward + backward passes each; what every pass and step left."""
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    inputs = IMAGE.inputs(labels=True)
    record = {"losses": [], "estimates": [], "grads": []}
    for _ in range(steps):
        for _ in range(forwards):
            loss = forward(**inputs).loss
            loss.backward()
            record["losses"].append(loss.detach().clone())
            record["estimates"].append(estimates(model))
        record["grads"].append({name: p.grad.clone() for name, p in model.named_parameters()})
        optimizer.step()
        optimizer.zero_grad()
    return record


def test_compiled_training_forward_is_one_graph_and_follows_eager_over_accumulated_steps():
    eager = schedule_model()
    compiled_model = copy.deepcopy(eager)
    # fullgraph=True: any graph break (such as a Python check of the weight's storage) raises
    compiled = torch.compile(compiled_model, fullgraph=True, backend="aot_eager")
    expected, actual = train(eager, eager), train(compiled_model, compiled)
    for record in (
        expected,
        actual,
    ):  # the second forward of each step (same weights) leaves u, v as they were
        for first, second in zip(record["estimates"][::2], record["estimates"][1::2]):
            for name in first:
                assert torch.equal(first[name], second[name]), name
    # float32: aot_eager's decomposed ops may round differently from eager, and three SGD steps (lr 0.5) on O(1)
    # values compound that: 64 ulps of the magnitude (3 steps × a forward and backward of ~20 roundings each). A
    # second refinement within a step would move u, v by a power step, orders of magnitude more.
    allowed = rounding(torch.float32, 64)
    for key in ("losses", "estimates", "grads"):
        for index, (want, got) in enumerate(zip(expected[key], actual[key])):
            pairs = (
                [(key, want, got)] if key == "losses" else [(name, want[name], got[name]) for name in want]
            )
            for name, a, b in pairs:
                scale = max(1.0, a.abs().max().item())
                error = (a - b).abs().max().item()
                assert error <= allowed * scale, (
                    f"{key}[{index}] {name}: max |eager - compiled| = {error:.3g} > {allowed * scale:.3g}"
                )


def test_a_change_is_a_change_of_the_weight_bits_not_of_its_version():
    model = schedule_model()
    inputs = IMAGE.inputs(labels=True)
    model(**inputs)
    refined = estimates(model)
    # an optimiser step whose update is zero bumps every weight's in-place version but leaves its bits
    optimizer = torch.optim.SGD(model.parameters(), lr=0.5)
    for parameter in model.parameters():
        parameter.grad = torch.zeros_like(parameter)
    optimizer.step()
    model(**inputs)
    for name, value in estimates(model).items():
        assert torch.equal(value, refined[name]), f"{name} refined again for an unchanged weight"
    # one element of one weight changed: that weight's u, v are refined, the other weights' are kept
    fc_sn2 = model.imixer.layers[1].token_mixing.fc_sn2
    with torch.no_grad():
        fc_sn2.parametrizations.weight.original[0, 0] += 1e-3
    model(**inputs)
    after = estimates(model)
    for name, value in after.items():
        moved = not torch.equal(value, refined[name])
        assert moved == name.startswith("layers.1.fc_sn2"), f"{name}: moved={moved}"


def test_stored_weight_stays_out_of_the_state_dict_and_save_load_is_exact(tmp_path):
    model = schedule_model()
    inputs = IMAGE.inputs(labels=True)
    model(**inputs)
    per_forward = IMAGE.build()
    assert list(model.state_dict()) == list(per_forward.state_dict())
    buffers = dict(model.named_buffers())
    assert "imixer.layers.0.token_mixing.fc_sn1.parametrizations.weight.0.refined_weight" in buffers
    assert "imixer.layers.0.token_mixing.fc_sn1.parametrizations.weight.0.refined" in buffers
    model.save_pretrained(tmp_path)
    loaded = IMixerForImageClassification.from_pretrained(tmp_path)  # built on the meta device
    model.eval()
    with torch.no_grad():
        assert torch.equal(loaded(**inputs).logits, model(**inputs).logits)
    for name, norm in spectral_norms(loaded).items():
        # initialised, not left as whatever memory the meta → CPU move handed out: no refinement yet
        assert not norm.refined.item(), name
        assert torch.equal(norm.refined_weight, torch.zeros_like(norm.refined_weight)), name
    # the loaded model refines at its first training forward and not at its second
    before = estimates(loaded)
    loaded.train()(**inputs)
    first = estimates(loaded)
    loaded(**inputs)
    for name, value in estimates(loaded).items():
        assert_differs(first[name], before[name], f"{name}: u after the first training forward")
        assert torch.equal(value, first[name]), name


def test_init_weights_resets_the_comparison_state():
    model = schedule_model()
    model(**IMAGE.inputs(labels=True))
    norm = spectral_norms(model)["layers.0.fc_sn1"]
    assert norm.refined.item()
    assert_differs(
        norm.refined_weight, torch.zeros_like(norm.refined_weight), "refined_weight after a training forward"
    )
    model._init_weights(norm)
    assert not norm.refined.item()
    assert torch.equal(norm.refined_weight, torch.zeros_like(norm.refined_weight))
    # the same weights, but no refinement on record: the next training forward refines (the eager shortcut for
    # untouched weights sees that the comparison state was written)
    before = norm.u.clone()
    model(**IMAGE.inputs(labels=True))
    assert_differs(norm.u, before, "u after the training forward that follows _init_weights")
    assert norm.refined.item()


@pytest.mark.parametrize("caller", ["refine_spectral_norms", "update_spectral_norms"])
def test_only_if_changed_without_the_stored_weight_raises(caller):
    mixer = IMAGE.build().imixer.layers[0].token_mixing  # per_forward: no stored weight
    targets = mixer.spectral_norm_targets()
    assert not any(hasattr(norm, "refined_weight") for norm, _ in targets)
    before = [norm.u.clone() for norm, _ in targets]
    with pytest.raises(
        ValueError, match=r"only_if_changed=True .*spectral_norm_schedule='per_optimizer_step'"
    ):
        if caller == "refine_spectral_norms":
            refine_spectral_norms(targets, only_if_changed=True)
        else:
            mixer.update_spectral_norms(only_if_changed=True)
    for (norm, _), u in zip(targets, before, strict=True):  # refused before any power step
        assert torch.equal(norm.u, u), f"u changed by a refused refinement: {u.tolist()} -> {norm.u.tolist()}"


def test_eager_shortcut_sees_version_tracked_writes_and_misses_writes_through_data():
    """The documented limit of the eager shortcut (docs/imixer.md): it sees a weight write that bumps the
    parameter's in-place version (under `torch.no_grad()`, or through `p.detach()`) exactly as a run that never
    takes the shortcut does, and misses one through `p.data`. `p.data` is a new alias with a version counter of its
    own on every access, and writes leave the parameter's counter and storage pointer as they were, so no metadata
    check can see them; only comparing the values could, which costs what the shortcut saves (and a host sync on a
    GPU). If torch ever tracks such writes, the first assertion fails and the limit can go."""
    base = schedule_model()
    inputs = IMAGE.inputs(labels=True)
    base(**inputs)
    before = estimates(base)

    def written(how: str, shortcut: bool) -> dict[str, torch.Tensor]:
        model = copy.deepcopy(base)
        # a copy's tensors live elsewhere, so its first forward runs the full check (unchanged bits: u, v kept);
        # that forward records the copy's own storage and versions, as a model's own previous forward does
        model(**inputs)
        for norm in spectral_norms(model).values():
            if (
                not shortcut
            ):  # no record of the last check: the bitwise select alone decides, as when compiled
                norm.__dict__.pop("_last_check", None)
            else:
                assert norm._last_check is not None
        weight = model.imixer.layers[1].token_mixing.fc_sn2.parametrizations.weight.original
        new = weight.detach() * 1.5  # changes σ by 1.5×: a refinement moves u, v visibly
        version = weight._version
        if how == "no_grad":
            with torch.no_grad():
                weight.copy_(new)
        elif how == "detach":
            weight.detach().copy_(new)
        else:
            weight.data.copy_(new)
            assert weight._version == version, "torch now tracks writes through .data: see the docstring"
        model(**inputs)
        return estimates(model)

    reference = written("data", shortcut=False)
    moved = [name for name in reference if not torch.equal(reference[name], before[name])]
    assert moved and all(name.startswith("layers.1.fc_sn2") for name in moved), moved
    for how in ("no_grad", "detach"):
        got = written(how, shortcut=True)
        for name, value in got.items():
            assert torch.equal(value, reference[name]), f"{how}: {name} differs from the run without shortcut"
    missed = written("data", shortcut=True)
    for name, value in missed.items():
        assert torch.equal(value, before[name]), f"data: {name} moved; the documented limit no longer holds"
