"""iMixer's power iteration (the σ estimates of F's spectrally normalised weights): the weights of one shape are
refined as one batch, so a training step dispatches the same few dozen small ops however many blocks the model
has, and each weight's u, v and σ are those of its own per-weight power iteration up to rounding, also after
save → load (whose checkpoint layout is unchanged).
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures import Case, DispatchedOps, perturb, rounding

from energyformers import IMixerForImageClassification

IMAGE = Case.of(IMixerForImageClassification)
STEPS = 8  # the paper's k, the config's default


def spectral_norms(model) -> list[tuple[str, torch.nn.Module, torch.Tensor]]:
    """(name, parametrization, W) of every spectrally normalised weight."""
    return [
        (f"layers.{index}.{name}", linear.parametrizations.weight[0], linear.parametrizations.weight.original)
        for index, layer in enumerate(model.imixer.layers)
        for name in ("fc_sn1", "fc_sn2")
        for linear in [getattr(layer.token_mixing, name)]
    ]


def per_weight_power_iteration(u, v, weight, steps: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: one weight's k steps v ← n(Wᵀu), u ← n(Wv) with matrix-vector products."""
    for _ in range(steps):
        v = F.normalize(torch.mv(weight.t(), u), dim=0)
        u = F.normalize(torch.mv(weight, v), dim=0)
    return u, v


def training_step(model, inputs) -> None:
    model(**inputs).loss.backward()


def power_iteration_ops(blocks: int) -> tuple[int, int]:
    """(dispatched ops, non-view kernels) of the power iteration in one default (per_forward) training step: the
    step's count minus that of the same step in which no power step runs (per_optimizer_step, weights untouched
    since its last refinement, so its eager shortcut skips them); everything else in the two steps is the same."""
    inputs = IMAGE.inputs(labels=True)
    counts = []
    for schedule in ("per_forward", "per_optimizer_step"):
        model = IMAGE.build(
            num_hidden_layers=blocks, spectral_norm_power_iterations=STEPS, spectral_norm_schedule=schedule
        ).train()
        training_step(model, inputs)  # per_optimizer_step: the first refinement
        before = [norm.u.clone() for _, norm, _ in spectral_norms(model)]
        with DispatchedOps() as dispatched:
            training_step(model, inputs)
        refined = any(not torch.equal(norm.u, b) for (_, norm, _), b in zip(spectral_norms(model), before))
        assert refined == (schedule == "per_forward"), f"{schedule}: u refined = {refined}"
        counts.append((len(dispatched.ops), dispatched.kernels))
    (ops, kernels), (base_ops, base_kernels) = counts
    return ops - base_ops, kernels - base_kernels


def test_the_training_steps_power_iteration_is_batched_across_blocks():
    two_ops, two_kernels = power_iteration_ops(blocks=2)
    four_ops, four_kernels = power_iteration_ops(blocks=4)
    # One batch per weight shape (fc_sn1's, fc_sn2's): more blocks make the batch larger, not the op list longer.
    assert (four_ops, four_kernels) == (two_ops, two_kernels), (
        f"power-iteration ops with 2 blocks: {two_ops} ({two_kernels} kernels); with 4: {four_ops} "
        f"({four_kernels} kernels)"
    )
    # A loop over the weights needs, per weight and half step, a product and a 3-kernel normalisation (norm,
    # clamp, divide): 4 blocks × 2 weights × k × 2 × 4 kernels. The batch needs those per shape group (2).
    per_weight = 4 * 2 * STEPS * 2 * 4
    assert four_kernels <= per_weight / 3, (
        f"the power iteration of a 4-block training step launches {four_kernels} kernels ({four_ops} ops); a loop "
        f"over the 8 weights needs at least {per_weight}"
    )


def assert_agrees(got, want, tolerance: float, what: str) -> None:
    error = (got - want).abs().max().item()
    assert error <= tolerance, f"{what}: max |batched - per-weight| = {error:.3g} > {tolerance:.3g}"


def assert_refined_as_per_weight(
    model, start: dict[str, tuple[torch.Tensor, ...]]
) -> dict[str, torch.Tensor]:
    """After a refinement from `start` (name → u, v, W): each weight of `start` has the u, v and σ its own
    per-weight power iteration gives, to rounding; returns σ per name."""
    sigmas = {}
    for name, norm, weight in spectral_norms(model):
        if name not in start:
            continue
        u0, v0, w = start[name]
        u, v = per_weight_power_iteration(u0, v0, w, STEPS)
        # Each half step rounds a length-n product (at most n roundings, n the longer side of W) and a
        # normalisation (3); a power step does not amplify an error in the direction, so the errors of the 2k half
        # steps add up: 2k(n + 3) roundings, of the unit vectors and of σ ≈ ‖W‖₂.
        roundings = 2 * STEPS * (max(w.shape) + 3)
        sigma, reference = norm.sigma(weight), (w * torch.outer(u, v)).sum()
        assert_agrees(norm.u, u, rounding(torch.float32, roundings), f"{name}.u")
        assert_agrees(norm.v, v, rounding(torch.float32, roundings), f"{name}.v")
        assert_agrees(
            sigma, reference, rounding(torch.float32, roundings, reference.abs().item()), f"σ {name}"
        )
        sigmas[name] = sigma
    return sigmas


def snapshot(model) -> dict[str, tuple[torch.Tensor, ...]]:
    return {
        name: (norm.u.clone(), norm.v.clone(), weight.detach().clone())
        for name, norm, weight in spectral_norms(model)
    }


def test_batched_refinement_agrees_with_the_per_weight_power_iteration_also_after_save_and_load(tmp_path):
    # perturbed: u, v off their fixed start and a non-zero classifier, so nothing is at a special value
    model = perturb(IMAGE.build(num_hidden_layers=4, spectral_norm_power_iterations=STEPS))
    inputs = IMAGE.inputs()
    logits = model(**inputs).logits  # eval: no power step
    model.save_pretrained(tmp_path)
    loaded = IMixerForImageClassification.from_pretrained(tmp_path).eval()
    # the checkpoint layout is that of the per-weight code: the same u, v keys and shapes, loaded bit for bit
    keys = {k: v for k, v in model.state_dict().items() if k.endswith((".u", ".v"))}
    assert {k: v.shape for k, v in keys.items()} == {
        k: v.shape for k, v in loaded.state_dict().items() if k.endswith((".u", ".v"))
    }
    assert len(keys) == 4 * 2 * 2
    for key, value in keys.items():
        assert torch.equal(loaded.state_dict()[key], value), key
    assert torch.equal(loaded(**inputs).logits, logits), "eval logits changed by save → load"

    sigmas = {}
    for which, net in (("built", model), ("loaded", loaded)):
        start = snapshot(net)
        net.train()
        net(**inputs)
        sigmas[which] = assert_refined_as_per_weight(net, start)
    for name, sigma in sigmas["built"].items():
        roundings = 2 * STEPS * (max(spectral_norms(model)[0][2].shape) + 3)
        assert_agrees(
            sigmas["loaded"][name], sigma, rounding(torch.float32, roundings, sigma.abs().item()), f"σ {name}"
        )


@pytest.mark.parametrize("schedule", ["per_forward", "per_optimizer_step", "per_call"])
def test_every_schedule_refines_as_the_per_weight_power_iteration(schedule):
    model = perturb(IMAGE.build(num_hidden_layers=3, spectral_norm_schedule=schedule)).train()
    start = snapshot(model)
    if schedule == "per_call":  # refined before every application of F: one block's refinement alone
        model.imixer.layers[0].token_mixing.update_spectral_norms()
        for name, norm, _ in spectral_norms(model):
            if not name.startswith("layers.0."):  # the other blocks' estimates are untouched
                assert torch.equal(norm.u, start[name][0]) and torch.equal(norm.v, start[name][1]), name
        start = {name: value for name, value in start.items() if name.startswith("layers.0.")}
    else:
        model(**IMAGE.inputs())
    assert_refined_as_per_weight(model, start)


def test_per_optimizer_step_refines_only_the_changed_weights_of_a_batch():
    """One batch holds changed and unchanged weights: the select keeps the unchanged ones' u, v bit for bit."""
    model = perturb(IMAGE.build(num_hidden_layers=3, spectral_norm_schedule="per_optimizer_step")).train()
    inputs = IMAGE.inputs()
    model(**inputs)  # the first refinement: every weight
    start = snapshot(model)
    changed = model.imixer.layers[1].token_mixing.fc_sn1.parametrizations.weight.original
    with torch.no_grad():
        changed.mul_(1.5)  # a tracked in-place write: the eager shortcut sees it
    start["layers.1.fc_sn1"] = (*start["layers.1.fc_sn1"][:2], changed.detach().clone())
    model(**inputs)
    for name, norm, _ in spectral_norms(model):
        u0, v0, _ = start[name]
        moved = not (torch.equal(norm.u, u0) and torch.equal(norm.v, v0))
        assert moved == (name == "layers.1.fc_sn1"), f"{name}: u, v moved = {moved}"
    assert_refined_as_per_weight(model, {"layers.1.fc_sn1": start["layers.1.fc_sn1"]})


@pytest.mark.parametrize("schedule", ["per_forward", "per_optimizer_step", "per_call"])
def test_a_training_forward_refines_only_the_weights_that_require_grad(schedule):
    """A frozen W (`requires_grad_(False)`, as the base under a PEFT adapter) cannot change, so its u, v stay as
    saved, bit for bit, whatever the schedule; the trainable weights beside it are refined as their schedule
    says (per_optimizer_step: the first forward is their first refinement)."""
    model = perturb(IMAGE.build(num_hidden_layers=2, spectral_norm_schedule=schedule)).train()
    frozen = model.imixer.layers[0].token_mixing
    frozen.requires_grad_(False)
    start = snapshot(model)
    model(**IMAGE.inputs(labels=True)).loss.backward()
    for name, norm, _ in spectral_norms(model):
        u0, v0, _ = start[name]
        kept = torch.equal(norm.u, u0) and torch.equal(norm.v, v0)
        if name.startswith("layers.0."):
            drift = max((norm.u - u0).abs().max().item(), (norm.v - v0).abs().max().item())
            assert kept, f"{schedule}: frozen {name}'s u, v refined (max |change| {drift:.3g})"
        else:
            assert not kept, f"{schedule}: trainable {name}'s u, v not refined"
    # the trainable block's estimate is its own power iteration's (per_call: refined again at every F step)
    if schedule != "per_call":
        assert_refined_as_per_weight(model, {k: v for k, v in start.items() if k.startswith("layers.1.")})
