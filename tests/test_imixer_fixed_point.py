"""iMixer's token mixer as an implicit layer: solvers, gradients, contractivity, ablations, schedules.

Float64 throughout where numbers are compared: every solver reaches the same fixed point, the implicit gradient
matches autograd through a long converged unrolled solve and finite differences, and the phantom gradient
matches its definition computed by hand.
"""

from __future__ import annotations

import itertools
import math
import re

import pytest
import torch
import torch.nn.functional as F
from fixtures import (
    Case,
    DispatchedOps,
    Records,
    assert_close_to_scale,
    assert_differs,
    labelled,
    perturb,
    require_author_fixtures,
    rounding,
)
from safetensors.torch import load_file

from energyformers import IMixerConfig, IMixerForImageClassification
from energyformers.configuration.configuration_imixer import ACTIVATION_MAX_SLOPES
from energyformers.modeling import modeling_imixer
from energyformers.modeling.modeling_imixer import _FixedPointSettings, _SolveRecord
from energyformers.training.setup import enable_activation_checkpointing

IMAGE = Case.of(IMixerForImageClassification)
F64 = torch.float64
# The solves below stop at relative residual 1e-14 (the solver tolerance these tests pass) on F with contraction
# c = 0.5 (`contractive_model`): a point with residual r lies within r / (1 − c) of the fixed point.
SOLVER_TOLERANCE, CONTRACTION = 1e-14, 0.5


def converged(magnitude: float) -> float:
    """How far two converged float64 solves (or what is computed from them) may be apart, for values of size
    `magnitude`: each within SOLVER_TOLERANCE / (1 − c) of the fixed point, plus the rounding of the few hundred
    operations of a solve and of the layers after it."""
    return (2 * SOLVER_TOLERANCE / (1 - CONTRACTION)) * magnitude + rounding(F64, 256, magnitude)


def contractive_model(contraction: float = 0.5, **overrides) -> IMixerForImageClassification:
    """A float64 tiny model whose F is a guaranteed contraction (converged σ estimates, c = √L / s)."""
    model = IMAGE.build(
        fixed_point_contraction=contraction, spectral_norm_power_iterations=200, **overrides
    ).double()
    perturb(model)  # a non-zero classifier, so logits and gradients are not trivially zero
    model.train()(pixel_values=IMAGE.inputs()["pixel_values"].double())  # σ estimates converge
    return model.eval()


def pixels() -> torch.Tensor:
    return IMAGE.inputs()["pixel_values"].double()


def loss_and_grads(model, **call) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
    """Σ logits · fixed random weights and its gradient for every parameter (eval mode: no power iteration)."""
    model.zero_grad()
    logits = model(pixel_values=pixels(), **call).logits
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3), dtype=logits.dtype)
    loss = (logits * weights).sum()
    loss.backward()
    return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}


# ---------------------------------------------------------------- the default is today's model


def test_unrolled_defaults_are_the_plain_unrolled_loop():
    model = IMAGE.build(num_hidden_layers=1)
    perturb(model)
    mixing = model.imixer.layers[0].token_mixing
    tokens = torch.randn(3, 16, mixing.fc1.in_features)
    start = mixing.fc1(tokens)
    state = start
    for _ in range(2):
        state = start + mixing.fc_sn2(F.gelu(mixing.fc_sn1(F.gelu(state))))
    by_hand = mixing.fc2(F.gelu(state))
    assert torch.equal(mixing(tokens, fixed_point_iterations=2)[0], by_hand)
    settings = _FixedPointSettings.of(model.config, 2)
    assert (settings.solver, settings.gradient) == ("unrolled", "unrolled")


def test_token_mixing_called_without_settings_uses_the_configs_solver():
    """A token mixer called on its own (no per-call settings from a model's forward) solves with its config's
    solver and tolerance, not with defaults of its own: a Picard solve to a loose tolerance stops early."""
    steps, tolerance = 50, 1e-3
    model = contractive_model(fixed_point_solver="picard", fixed_point_tolerance=tolerance)
    mixing = model.imixer.layers[0].token_mixing
    tokens = torch.randn(3, 16, mixing.fc1.in_features, dtype=F64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        output, diagnostics = mixing(tokens, steps, output_diagnostics=True)
        explicit, _ = mixing(tokens, steps, settings=_FixedPointSettings.of(model.config, steps))
    ran, final = int(diagnostics["iterations"]), diagnostics["final_relative_residuals"].item()
    assert 1 <= ran < steps, f"ran {ran} of {steps} steps: not the config's picard solve to {tolerance}"
    assert final <= tolerance, f"final relative residual {final} above the config's tolerance {tolerance}"
    assert torch.equal(output, explicit), (output - explicit).abs().max().item()


def test_token_mixing_called_without_settings_reads_the_config_at_call_time():
    """The model's forward reads its config on every call; a token mixer called on its own does too: a solver
    chosen in the config after the model was built is the one it solves with."""
    steps, tolerance = 50, 1e-3
    model = contractive_model()
    model.config.fixed_point_solver, model.config.fixed_point_tolerance = "picard", tolerance
    mixing = model.imixer.layers[0].token_mixing
    tokens = torch.randn(3, 16, mixing.fc1.in_features, dtype=F64, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        _, diagnostics = mixing(tokens, steps, output_diagnostics=True)
    ran = int(diagnostics["iterations"])
    assert 1 <= ran < steps, (
        f"ran {ran} of {steps} steps: not the picard solve to {tolerance} set in the config"
    )


# ---------------------------------------------------------------- solvers reach the same fixed point


def test_every_solver_reaches_the_same_fixed_point_in_float64():
    model = contractive_model()
    mixing = model.imixer.layers[0].token_mixing
    start = mixing.fc1(torch.randn(3, 16, mixing.fc1.in_features, dtype=torch.float64))
    points = {}
    with torch.no_grad():
        for solver in ("unrolled", "picard", "anderson"):
            settings = _FixedPointSettings.of(model.config, 300, solver=solver, tolerance=SOLVER_TOLERANCE)
            points[solver], _ = mixing.solve(start, 300, settings, _SolveRecord(False))
    weights = mixing.contractive_weights()
    for solver, point in points.items():
        residual = point - start - mixing.residual_branch(point, weights)
        scale = max(1.0, point.abs().max().item())  # the points' entries are up to ~4
        assert residual.abs().max() <= converged(scale), (
            solver,
            residual.abs().max().item(),
            converged(scale),
        )
        torch.testing.assert_close(point, points["unrolled"], atol=converged(scale), rtol=0)
    # and the model's logits agree to the same precision
    logits = {
        solver: model(
            pixel_values=pixels(),
            fixed_point_iterations=300,
            fixed_point_solver=solver,
            # the unrolled solver takes no tolerance: it runs every step
            **({} if solver == "unrolled" else {"fixed_point_tolerance": SOLVER_TOLERANCE}),
        ).logits
        for solver in points
    }
    for solver in logits:  # logits below 1: the bound for values of size 1
        torch.testing.assert_close(logits[solver], logits["unrolled"], atol=converged(1.0), rtol=0)


def test_tolerance_solvers_stop_early_and_report_it():
    tolerance = 1e-6  # the solvers' fixed_point_tolerance: they stop once the relative residual is below it
    model = contractive_model()
    out = model(
        pixel_values=pixels(),
        fixed_point_iterations=100,
        fixed_point_solver="picard",
        fixed_point_tolerance=tolerance,
        output_fixed_point_residuals=True,
    )
    d = out.fixed_point_residuals
    layers = model.config.num_hidden_layers
    assert d.iterations.shape == d.final_residuals.shape == d.final_relative_residuals.shape == (layers,)
    assert torch.all(d.iterations < 100) and torch.all(d.iterations >= 2)
    assert torch.all(d.final_relative_residuals <= tolerance), d.final_relative_residuals
    steps = int(d.iterations.max())
    assert d.relative_residuals.shape == d.residuals.shape == d.cosines.shape == (layers, steps)
    # per block: the series stops (NaN) after the block's own last step
    for block in range(layers):
        ran = int(d.iterations[block])
        assert torch.isfinite(d.relative_residuals[block, :ran]).all()
        assert torch.isnan(d.relative_residuals[block, ran:]).all()
    anderson = model(
        pixel_values=pixels(),
        fixed_point_iterations=100,
        fixed_point_solver="anderson",
        fixed_point_tolerance=tolerance,
        output_fixed_point_residuals=True,
    ).fixed_point_residuals
    assert torch.all(anderson.iterations <= d.iterations)  # acceleration never needs more steps here
    assert torch.all(anderson.final_relative_residuals <= tolerance), anderson.final_relative_residuals


@pytest.mark.parametrize("solver", ["picard", "anderson"])
@pytest.mark.parametrize("scale", [1e3, 1e-3])
def test_tolerance_solvers_stop_on_the_relative_residual_whatever_the_state_scale(solver, scale):
    # The tolerance is on ‖f(x) − x‖ / ‖x‖; the paper's residual ‖f(x) − x‖ / √numel is that times the state's rms.
    # With fc1 (weight and bias) scaled, the start fc1(t) and the fixed point scale with it (F's biases zeroed so
    # F(0) = 0 and the small state stays small): the two residuals cross the tolerance steps apart, and the solve
    # must stop at the first step whose relative residual is <= the tolerance. Batch of 1: the recorded per-step
    # means are that sample's residuals.
    tolerance = 1e-6
    model = contractive_model()
    with torch.no_grad():
        for layer in model.imixer.layers:
            mixing = layer.token_mixing
            mixing.fc1.weight.mul_(scale)
            mixing.fc1.bias.mul_(scale)
            mixing.fc_sn1.bias.zero_()
            mixing.fc_sn2.bias.zero_()
    d = model(
        pixel_values=pixels()[:1],
        fixed_point_iterations=200,
        fixed_point_solver=solver,
        fixed_point_tolerance=tolerance,
        output_fixed_point_residuals=True,
    ).fixed_point_residuals
    for block in range(model.config.num_hidden_layers):
        ran = int(d.iterations[block])
        relative, absolute = d.relative_residuals[block, :ran].tolist(), d.residuals[block, :ran].tolist()
        first = next((step + 1 for step, value in enumerate(relative) if value <= tolerance), None)
        crossed = next((step + 1 for step, value in enumerate(absolute) if value <= tolerance), None)
        where = f"block {block}, {solver}, scale {scale}: relative {relative}, paper's residual {absolute}"
        # the premise: the state's rms is far from 1, so the paper's residual crosses elsewhere (or not yet)
        assert 0.01 < relative[0] and crossed != first and (crossed is None) == (scale > 1), where
        assert ran == first, (
            f"{where}: stopped after {ran} steps, not at the first relative residual <= {tolerance}"
        )


def test_paper_residual_is_the_step_norm_over_root_of_the_state_size():
    model = IMAGE.build(num_hidden_layers=1, fixed_point_iterations=3)
    mixing = model.imixer.layers[0].token_mixing
    embedded, _, _ = model.imixer.embeddings(pixel_values=IMAGE.inputs()["pixel_values"])
    start = mixing.fc1(model.imixer.layers[0].layernorm_before(embedded).transpose(1, 2))
    iterates = [start]
    for _ in range(3):
        iterates.append(start + mixing.fc_sn2(F.gelu(mixing.fc_sn1(F.gelu(iterates[-1])))))
    size = start[0].numel()  # D · D_S
    expected = torch.stack(
        [
            (new - old).flatten(1).norm(dim=1).mean() / math.sqrt(size)
            for old, new in itertools.pairwise(iterates)
        ]
    )
    d = model(
        pixel_values=IMAGE.inputs()["pixel_values"], output_fixed_point_residuals=True
    ).fixed_point_residuals
    torch.testing.assert_close(d.residuals[0], expected)
    torch.testing.assert_close(d.final_residuals[0], expected[-1])
    torch.testing.assert_close(d.final_relative_residuals[0], d.relative_residuals[0, -1])
    assert d.iterations.tolist() == [3]


def test_tolerance_solver_outputs_do_not_depend_on_the_batch():
    model = contractive_model(contraction=0.9)
    call = dict(fixed_point_iterations=60, fixed_point_solver="anderson", fixed_point_tolerance=1e-5)
    batch = model(pixel_values=pixels(), **call).logits
    alone = torch.cat([model(pixel_values=pixels()[i : i + 1], **call).logits for i in range(3)])
    # each sample takes the same solver steps alone and in the batch; only the batched matmuls round differently:
    # tens of float64 roundings of the O(1) values of the solve
    torch.testing.assert_close(batch, alone, atol=rounding(F64, 64), rtol=0)


# ---------------------------------------------------------------- gradients


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_implicit_gradient_matches_autograd_through_a_long_converged_unrolled_solve(solver):
    model = contractive_model()
    loss, reference = loss_and_grads(model, fixed_point_iterations=300)
    got_loss, got = loss_and_grads(
        model,
        fixed_point_iterations=300,
        fixed_point_solver=solver,
        fixed_point_tolerance=SOLVER_TOLERANCE,
        fixed_point_gradient="implicit",
    )
    torch.testing.assert_close(got_loss, loss, atol=converged(max(1.0, loss.abs().item())), rtol=0)
    for name in reference:  # the backward solve is a fixed point of the same contraction (its transpose)
        scale = max(1.0, reference[name].abs().max().item())
        torch.testing.assert_close(got[name], reference[name], atol=converged(scale), rtol=0, msg=name)
    # F's weights learn: not a rounding bound, a gradient far from 0 (they are O(0.1) here)
    largest = max(g.abs().max().item() for name, g in got.items() if "fc_sn" in name)
    assert largest > 1e-3, f"F's largest gradient entry {largest:.3g}"


def test_implicit_gradient_matches_finite_differences():
    model = contractive_model()
    call = dict(
        fixed_point_iterations=300, fixed_point_solver="anderson", fixed_point_tolerance=SOLVER_TOLERANCE
    )
    _, grads = loss_and_grads(model, fixed_point_gradient="implicit", **call)
    parameter = model.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight.original
    direction = torch.randn(
        parameter.shape, generator=torch.Generator().manual_seed(5), dtype=parameter.dtype
    )
    name = "imixer.layers.0.token_mixing.fc_sn1.parametrizations.weight.original"
    analytic = (grads[name] * direction).sum()
    eps, values = 1e-5, []
    with torch.no_grad():
        for sign in (1, -1):
            parameter.add_(sign * eps * direction)
            values.append(_loss(model, **call))
            parameter.sub_(sign * eps * direction)
    numeric = (values[0] - values[1]) / (2 * eps)
    # a central difference with step h is off by h² |f‴| / 6 (truncation; f‴ of this smooth model is O(1), so
    # h² bounds it) plus the loss's float64 rounding over h (cancellation: a few eps · |loss| / h)
    bound = eps**2 + rounding(F64, 16, max(1.0, abs(values[0].item()))) / eps
    torch.testing.assert_close(analytic, numeric, atol=bound, rtol=0)


def _loss(model, **call) -> torch.Tensor:
    logits = model(pixel_values=pixels(), **call).logits
    weights = torch.randn(logits.shape, generator=torch.Generator().manual_seed(3), dtype=logits.dtype)
    return (logits * weights).sum()


@pytest.mark.parametrize(("solver", "steps", "damping"), [("unrolled", 2, 0.5), ("picard", 3, 0.7)])
def test_phantom_gradient_matches_its_definition(solver, steps, damping):
    model = contractive_model(num_hidden_layers=1)
    n = 6 if solver == "unrolled" else 200
    call = dict(fixed_point_iterations=n, fixed_point_solver=solver)
    if solver != "unrolled":  # the unrolled solver takes no tolerance: it runs every step
        call["fixed_point_tolerance"] = 1e-12
    mixing = model.imixer.layers[0].token_mixing
    tokens = torch.randn(3, 16, mixing.fc1.in_features, dtype=torch.float64, requires_grad=True)
    cotangent = torch.randn(3, 16, mixing.fc2.out_features, dtype=torch.float64)
    settings = _FixedPointSettings.of(
        model.config,
        n,
        solver=solver,
        tolerance=1e-12,
        gradient="phantom",
        phantom_steps=steps,
        phantom_damping=damping,
    )
    output, _ = mixing(tokens, n, settings=settings)
    got = torch.autograd.grad((output * cotangent).sum(), [tokens, *mixing.parameters()])
    # by hand: the solution without a graph (the unrolled solver: its first n − k steps), then k damped steps
    start = mixing.fc1(tokens)
    weights = (mixing.fc_sn1.weight, mixing.fc_sn2.weight)
    with torch.no_grad():
        state = start
        for _ in range(n - steps if solver == "unrolled" else n):
            state = start + mixing.fc_sn2(F.gelu(mixing.fc_sn1(F.gelu(state))))
    state = state.detach()
    for _ in range(steps):
        image = start + F.linear(
            F.gelu(F.linear(F.gelu(state), weights[0], mixing.fc_sn1.bias)), weights[1], mixing.fc_sn2.bias
        )
        state = (1 - damping) * state + damping * image
    by_hand = mixing.fc2(F.gelu(state))
    # the same steps in float64, some through another code path: a few hundred roundings of the largest entry
    assert_close_to_scale(output, by_hand, rounding(F64, 256), "output")
    expected = torch.autograd.grad((by_hand * cotangent).sum(), [tokens, *mixing.parameters()])
    for i, (g, e) in enumerate(zip(got, expected)):
        assert_close_to_scale(g, e, rounding(F64, 256), f"gradient {i}")
    # the model-level call takes the same settings and backpropagates through them
    model(pixel_values=pixels(), fixed_point_gradient="phantom", **call).logits.sum().backward()
    assert model.imixer.layers[0].token_mixing.fc1.weight.grad.abs().max() > 0


def test_one_step_phantom_on_the_unrolled_solver_keeps_the_forward_value():
    model = contractive_model()
    reference = model(pixel_values=pixels()).logits
    phantom = model(pixel_values=pixels(), fixed_point_gradient="phantom").logits  # k = 1, damping 1
    # the gradient mode changes only the backward: the forward runs the same operations, so bit for bit
    torch.testing.assert_close(phantom, reference, atol=0, rtol=0)
    implicit = model(pixel_values=pixels(), fixed_point_gradient="implicit").logits
    torch.testing.assert_close(implicit, reference, atol=0, rtol=0)


def _saved_bytes(model, gradient: str, n: int) -> int:
    """Bytes autograd saves for the backward of one training forward (saved-tensor hooks count them)."""
    total = 0

    def pack(tensor):
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        model.train()(pixel_values=pixels().float(), fixed_point_iterations=n, fixed_point_gradient=gradient)
    return total


def test_training_memory_stops_growing_with_n_for_implicit_and_phantom():
    model = IMAGE.build(fixed_point_iterations=8)
    saved = {g: [_saved_bytes(model, g, n) for n in (2, 4, 8)] for g in ("unrolled", "implicit", "phantom")}
    assert saved["unrolled"][0] < saved["unrolled"][1] < saved["unrolled"][2]
    for gradient in ("implicit", "phantom"):
        assert len(set(saved[gradient])) == 1, (gradient, saved)
        assert saved[gradient][2] < saved["unrolled"][2]


# ---------------------------------------------------------------- contractivity


def test_lipschitz_bound_is_slope_squared_times_the_exact_spectral_norms():
    model = IMAGE.build()
    d = model(**IMAGE.inputs(), output_fixed_point_residuals=True).fixed_point_residuals
    slope = ACTIVATION_MAX_SLOPES["gelu"]
    # 1.1289 to 4 decimals (docs/imixer.md rounds it to 1.129): within half a unit of the last decimal
    assert abs(slope - 1.1289) <= 0.5e-4, f"slope {slope!r} is not 1.1289 to 4 decimals"
    for block, layer in enumerate(model.imixer.layers):
        mixing = layer.token_mixing
        sigmas = [torch.linalg.matrix_norm(m.weight, ord=2) for m in (mixing.fc_sn1, mixing.fc_sn2)]
        torch.testing.assert_close(d.lipschitz_bounds[block], slope**2 * sigmas[0] * sigmas[1])


def test_fixed_point_contraction_caps_the_bound_below_one():
    config = IMAGE.config(fixed_point_contraction=0.9)
    # √L / s in float64, here and in the config perhaps in another order: the root and the division, relative
    expected = math.sqrt(0.9) / ACTIVATION_MAX_SLOPES["gelu"]
    assert config.contractive_coeff == pytest.approx(expected, rel=rounding(torch.float64, 2), abs=0), (
        f"c = {config.contractive_coeff!r}, √0.9 / s = {expected!r}"
    )
    assert IMAGE.config().contractive_coeff == 0.9  # the paper's c by default
    assert IMAGE.config(fixed_point_contraction=0.99, spectral_norm_coeff=0.5).contractive_coeff == 0.5
    model = contractive_model(contraction=0.9)
    with torch.no_grad():  # large weights: the cap is what keeps F contractive
        for name, p in model.named_parameters():
            if name.endswith("original"):
                p.mul_(10.0)
    model.train()(pixel_values=pixels())
    d = model.eval()(pixel_values=pixels(), output_fixed_point_residuals=True).fixed_point_residuals
    # float32 bounds: a product of three factors of size ~1 may round a few ulps above the cap
    assert torch.all(d.lipschitz_bounds <= 0.9 + rounding(torch.float32, 8)), d.lipschitz_bounds
    default = IMAGE.build(spectral_norm_power_iterations=200)
    with torch.no_grad():
        for name, p in default.named_parameters():
            if name.endswith("original"):
                p.mul_(10.0)
    default.train()(**IMAGE.inputs())
    bounds = default.eval()(**IMAGE.inputs(), output_fixed_point_residuals=True).fixed_point_residuals
    # the paper's c = 0.9 with GELU: 1.1289² · 0.81 ≈ 1.03, not a guaranteed contraction
    # the capped σ estimates are c each (float32 power iteration, 200 steps): the bound is slope² c² up to the
    # float32 rounding of the estimates and their product, tens of ulps of a value near 1
    torch.testing.assert_close(
        bounds.lipschitz_bounds,
        torch.full((2,), ACTIVATION_MAX_SLOPES["gelu"] ** 2 * 0.81),
        atol=rounding(torch.float32, 128),
        rtol=0,
    )


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_a_diverging_solve_stops_with_a_warning_and_finite_output(solver):
    model = perturb(IMAGE.build(contractive_normalization="none")).double()
    with torch.no_grad():
        for layer in model.imixer.layers:
            for linear in (layer.token_mixing.fc_sn1, layer.token_mixing.fc_sn2):
                linear.weight.mul_(8.0)  # Lipschitz bound ≫ 1: the iteration blows up
    records = Records()
    modeling_imixer.logger.addHandler(records)
    try:
        out = model(
            pixel_values=pixels(),
            fixed_point_iterations=200,
            fixed_point_solver=solver,
            output_fixed_point_residuals=True,
        )
    finally:
        modeling_imixer.logger.removeHandler(records)
    assert any("diverged" in message for message in records.messages)
    assert torch.isfinite(out.logits).all()
    assert torch.all(out.fixed_point_residuals.iterations < 200)  # stopped, not run to the cap
    assert torch.all(out.fixed_point_residuals.lipschitz_bounds > 1)


# ---------------------------------------------------------------- the input checks' one host read


def test_the_ids_check_makes_no_mask_tensor_without_a_mask_and_counts_a_bool_mask_on_its_device():
    # `_check_token_ids` (the shared block, identical in every model file) reads the ids' range and an integer
    # mask's stray values in one host read. Without a mask it must create no tensor: a CPU zero would be copied
    # to an accelerator's ids on every forward. A bool mask's zero count is made on the mask's device (meta here,
    # where a CPU-made count would show), so the move to the ids' device is free when they share it.
    ids = torch.tensor([[1, 2, 3]])
    created = (
        "aten.zeros",
        "aten.empty",
        "aten.full",
        "aten.scalar_tensor",
        "aten._to_copy",
        "aten.lift_fresh",
    )
    with DispatchedOps() as ops:
        modeling_imixer._check_token_ids(ids, 10)
    made = [name for name in ops.ops if name.startswith(created)]
    assert made == [], f"ops dispatched without a mask: {ops.ops}"
    count = modeling_imixer.stray_mask_values(torch.ones(1, 3, dtype=torch.bool, device="meta"))
    assert count.device.type == "meta", f"a bool mask's count is made on {count.device}"
    # the checks themselves still refuse: ids outside the vocabulary, and an integer mask holding a 2
    with pytest.raises(ValueError, match=r"got values in \[1, 3\]"):
        modeling_imixer._check_token_ids(ids, 3)
    with pytest.raises(ValueError, match="attention_mask"):
        modeling_imixer._check_token_ids(ids, 10, torch.tensor([[1, 2, 0]]))
    modeling_imixer._check_token_ids(ids, 10, torch.tensor([[1, 1, 0]]))  # a 0/1 integer mask passes


# ---------------------------------------------------------------- per-call settings and their validation


def test_per_call_settings_are_validated_naming_the_call_and_the_argument():
    """A bad per-call value is the call's, not the config's: the message names the forward that was called (the
    head's, checked before its backbone runs; the backbone's when it is called itself), the argument, the value and
    what is allowed."""
    model = IMAGE.build()
    inputs = IMAGE.inputs()
    head = re.escape("IMixerForImageClassification.forward: invalid ")
    with pytest.raises(
        ValueError, match=head + r"fixed_point_solver='newton'; expected one of \['unrolled', "
    ):
        model(**inputs, fixed_point_solver="newton")
    with pytest.raises(
        ValueError, match=head + r"fixed_point_gradient='adjoint'; expected one of \['unrolled', "
    ):
        model(**inputs, fixed_point_gradient="adjoint")
    for tolerance in (0.0, -1e-3, math.nan):
        with pytest.raises(
            ValueError, match=head + re.escape(f"fixed_point_tolerance={tolerance!r}; expected")
        ):
            model(**inputs, fixed_point_solver="picard", fixed_point_tolerance=tolerance)
    for iterations in (-1, 1.5, True):
        with pytest.raises(
            ValueError, match=head + re.escape(f"fixed_point_iterations={iterations!r}; expected")
        ):
            model(**inputs, fixed_point_iterations=iterations)
    batch_norm = IMAGE.build(contractive_normalization="batch_norm")
    with pytest.raises(ValueError, match=head + r"contractive_normalization='batch_norm'.*'picard'"):
        batch_norm(**inputs, fixed_point_solver="picard")
    backbone = re.escape("IMixerModel.forward: invalid fixed_point_solver='newton'; expected one of ")
    with pytest.raises(ValueError, match=backbone):
        model.imixer(**inputs, fixed_point_solver="newton")


def test_pipeline_passes_solver_arguments_through():
    from energyformers.pipelines import DEPTH_ARGUMENTS

    assert {"fixed_point_iterations", "fixed_point_solver", "fixed_point_tolerance"} <= set(DEPTH_ARGUMENTS)


# ---------------------------------------------------------------- the paper's ablations


def test_normalization_ablations_build_train_and_keep_the_parameter_count():
    counts = {}
    for normalization in ("spectral", "none", "batch_norm"):
        model = IMAGE.build(contractive_normalization=normalization).train()
        model(**IMAGE.inputs(labels=True)).loss.backward()
        assert [n for n, p in model.named_parameters() if p.grad is None] == []
        counts[normalization] = sum(p.numel() for p in model.parameters())
        mixing = model.imixer.layers[0].token_mixing
        assert bool(mixing.spectral_layers()) == (normalization == "spectral")
        assert hasattr(mixing, "norm_sn1") == (normalization == "batch_norm")
        d = model.eval()(**IMAGE.inputs(), output_fixed_point_residuals=True).fixed_point_residuals
        assert torch.isfinite(d.lipschitz_bounds).all() and torch.isfinite(d.spectral_norms).all()
    assert counts["none"] == counts["spectral"]
    width = IMAGE.config().contractive_size + IMAGE.config().token_mixing_size
    assert counts["batch_norm"] == counts["spectral"] + 2 * width * IMAGE.config().num_hidden_layers


def test_batch_norm_ablation_is_f_with_batch_norm_after_each_linear():
    model = IMAGE.build(num_hidden_layers=1, contractive_normalization="batch_norm")
    perturb(model)
    mixing = model.imixer.layers[0].token_mixing
    tokens = torch.randn(3, 16, mixing.fc1.in_features)
    start = mixing.fc1(tokens)
    state = start
    for _ in range(2):
        hidden = mixing.norm_sn1(mixing.fc_sn1(F.gelu(state)).flatten(0, 1)).view(3, 16, -1)
        state = start + mixing.norm_sn2(mixing.fc_sn2(F.gelu(hidden)).flatten(0, 1)).view(3, 16, -1)
    torch.testing.assert_close(mixing(tokens, 2)[0], mixing.fc2(F.gelu(state)))


@pytest.mark.parametrize("activation", ["relu", "tanh", "silu"])
def test_activation_choice_is_used_throughout_the_token_mixer(activation):
    model = IMAGE.build(num_hidden_layers=1, token_mixing_activation=activation)
    mixing = model.imixer.layers[0].token_mixing
    act = {"relu": torch.relu, "tanh": torch.tanh, "silu": F.silu}[activation]
    tokens = torch.randn(2, 16, mixing.fc1.in_features)
    start = mixing.fc1(tokens)
    state = start
    for _ in range(2):
        state = start + mixing.fc_sn2(act(mixing.fc_sn1(act(state))))
    torch.testing.assert_close(mixing(tokens, 2)[0], mixing.fc2(act(state)))
    assert model.config.activation_max_slope == ACTIVATION_MAX_SLOPES[activation]


@pytest.mark.parametrize(
    ("preset", "expected", "iterations"),
    [("s16-hr1", 19_073_066, 2), ("s16-mixer", 18_020_394, 0), ("b16-mixer", 59_119_162, 0)],
)
def test_table_2_presets(preset, expected, iterations):
    config = IMixerConfig.from_preset(preset)
    assert config.fixed_point_iterations == iterations
    with torch.device("meta"):
        model = IMixerForImageClassification(config)
    assert sum(p.numel() for p in model.parameters()) == expected


# ---------------------------------------------------------------- spectral-norm schedules and the eval cache


def _authors_fixture() -> tuple:
    """(converter source, official kwargs, official state dict, all fixture tensors) of `imixer_tiny`."""
    from energyformers.training.convert import SOURCES, read_official_config

    folder = require_author_fixtures("imixer_tiny")
    source = SOURCES["imixer"]
    gold = load_file(str(folder / "imixer_tiny.safetensors"))
    kwargs, _ = read_official_config(folder / "imixer_tiny.json", source)
    official = {k: v for k, v in gold.items() if "/" not in k}
    return source, kwargs, official, gold


def test_per_call_schedule_is_the_authors_training_forward():
    source, kwargs, official, gold = _authors_fixture()
    for layer in (
        "blocks.0.mlp_tokens.fc_sn1",
        "blocks.0.mlp_tokens.fc_sn2",
        "blocks.1.mlp_tokens.fc_sn1",
        "blocks.1.mlp_tokens.fc_sn2",
    ):
        official[f"{layer}.weight_u"] = gold[f"golden/train/u0/{layer}"]
        official[f"{layer}.weight_v"] = gold[f"golden/train/v0/{layer}"]
    config = source.config(kwargs)
    results = {}
    # float64 here and in the authors' run, different code: a power step is two 16-long matrix-vector products and
    # a normalisation, the logits two blocks of token / channel mixing sums; 256 roundings of the O(1) values
    golden = rounding(torch.float64, 256)
    for schedule in ("per_call", "per_forward"):
        config.spectral_norm_schedule = schedule
        model = IMixerForImageClassification(config).double()
        model.load_state_dict({k: v.double() for k, v in source.to_ours(official, kwargs).items()})
        results[schedule] = model.train()(pixel_values=gold["golden/input/images"].double()).logits.detach()
        if schedule == "per_call":
            for block in range(2):
                for index in (1, 2):
                    norm = getattr(
                        model.imixer.layers[block].token_mixing, f"fc_sn{index}"
                    ).parametrizations.weight[0]
                    layer = f"blocks.{block}.mlp_tokens.fc_sn{index}"
                    assert_close_to_scale(
                        norm.u, gold[f"golden/train/u_after_f64/{layer}"], golden, f"u {layer}"
                    )
                    assert_close_to_scale(
                        norm.v, gold[f"golden/train/v_after_f64/{layer}"], golden, f"v {layer}"
                    )
    assert_close_to_scale(results["per_call"], gold["golden/train/logits_f64"], golden, "per_call logits")
    # the other schedule is no rounding away from the authors' forward
    apart = (results["per_forward"] - gold["golden/train/logits_f64"]).abs().max().item()
    assert apart > 1e3 * golden, f"per_forward logits are only {apart:.3g} from the authors'"


def test_per_optimizer_step_schedule_refines_once_per_weight_update():
    # perturbed: a non-zero classifier, so the step below changes F's weights (a zero head gives them no gradient)
    model = perturb(IMAGE.build(spectral_norm_schedule="per_optimizer_step")).train()
    norm = model.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight[0]
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    inputs = IMAGE.inputs(labels=True)
    before = norm.u.clone()
    model(**inputs).loss.backward()
    after_first = norm.u.clone()
    assert_differs(after_first, before, "u after the first backward")
    model(**inputs).loss.backward()  # same weights (gradient accumulation): no further power steps
    assert torch.equal(norm.u, after_first)
    optimizer.step()
    model(**inputs)
    assert_differs(norm.u, after_first, "u after the optimizer step")
    per_forward = IMAGE.build().train()
    u0 = per_forward.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight[0].u.clone()
    per_forward(**inputs)
    u1 = per_forward.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight[0].u.clone()
    per_forward(**inputs)
    assert_differs(u1, u0, "u after the first forward")
    u2 = per_forward.imixer.layers[0].token_mixing.fc_sn1.parametrizations.weight[0].u
    assert_differs(u2, u1, "u after the second forward")


@pytest.mark.parametrize("gradient", ["implicit", "phantom"])
def test_gradient_modes_work_under_gradient_checkpointing(gradient):
    # training mode (checkpointing is off in eval), without power steps between the two runs
    model = contractive_model(spectral_norm_schedule="per_optimizer_step").train()
    call = dict(fixed_point_iterations=50, fixed_point_solver="anderson", fixed_point_gradient=gradient)
    _, plain = loss_and_grads(model, **call)
    enable_activation_checkpointing(model)
    assert model.imixer.layers[0].gradient_checkpointing
    _, checkpointed = loss_and_grads(model, **call)
    for name in plain:
        # the checkpoint recomputes the forward with the same kernels on the same inputs: the same bits
        torch.testing.assert_close(checkpointed[name], plain[name], atol=0, rtol=0, msg=labelled(name))


@pytest.mark.parametrize("gradient", ["unrolled", "phantom"])
def test_unrolled_solve_compiles_to_one_graph(gradient):
    # the fixed-point loop is plain tensor code (no Python-side reads of values), so torch.compile captures the
    # whole forward, training and eval, and can fuse each step's activation / linear chain
    model = IMAGE.build()
    for mode in ("train", "eval"):
        getattr(model, mode)()
        explained = torch._dynamo.explain(model)(**IMAGE.inputs(), fixed_point_gradient=gradient)
        assert (explained.graph_count, explained.graph_break_count) == (1, 0), explained.break_reasons


@pytest.mark.parametrize("damping", [1.0, 0.6])
def test_anderson_ring_buffers_match_the_history_lists(damping):
    # the no-autograd path (ring buffers, Gram grown by one row per step) and the autograd path (lists)
    from energyformers.modeling.modeling_imixer import _AndersonMixing

    ring, lists = _AndersonMixing(3, damping), _AndersonMixing(3, damping)
    g = torch.Generator().manual_seed(0)
    for _ in range(7):  # past the memory: the ring wraps around
        state = torch.randn(4, 5, 6, generator=g, dtype=torch.float64)
        image = torch.randn(4, 5, 6, generator=g, dtype=torch.float64)
        with torch.no_grad():
            mixed = ring(state, image)
        tracked = lists(state.clone().requires_grad_(), image)
        # the ring grows the Gram matrix by one row, the lists rebuild it: 120-long dot products summed in other
        # orders, then a 3 × 3 solve of a well-conditioned Gram matrix of random vectors
        assert_close_to_scale(mixed, tracked.detach(), rounding(torch.float64, 256), "ring vs lists")


@pytest.mark.parametrize("path", ["ring", "lists"])
def test_anderson_damping_weighs_the_evaluation_by_beta(path):
    # x_{k+1} = β Σ α_i f(x_i) + (1 − β) Σ α_i x_i (Walker & Ni 2011); with one history entry α = [1], so the first
    # mixed iterate is β f(x_0) + (1 − β) x_0. Both paths, as the ring-vs-lists test above cannot tell β from 1 − β
    from energyformers.modeling.modeling_imixer import _AndersonMixing

    g = torch.Generator().manual_seed(0)
    state = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    image = torch.randn(2, 3, 4, generator=g, dtype=torch.float64)
    if path == "ring":
        with torch.no_grad():
            mixed = _AndersonMixing(3, 0.25)(state, image)
    else:
        mixed = _AndersonMixing(3, 0.25)(state.clone().requires_grad_(), image).detach()
    # α = g/g = 1 exactly; then the same two products and one sum: a few ulps of the inputs' scale
    assert_close_to_scale(
        mixed, 0.25 * image + 0.75 * state, rounding(torch.float64, 4), f"damped step ({path})"
    )


# ---------------------------------------------------------------- every solver x gradient trains


def _accepted_combinations() -> list[tuple[str, str]]:
    """Every (solver, gradient) pair of the config's own choice table that the config accepts by default."""
    from energyformers.configuration.configuration_imixer import _CHOICES

    pairs = itertools.product(_CHOICES["fixed_point_solver"], _CHOICES["fixed_point_gradient"])
    accepted = []
    for solver, gradient in pairs:
        try:
            IMAGE.config(fixed_point_solver=solver, fixed_point_gradient=gradient)
        except ValueError:
            continue  # a refusal is allowed; test_refused_combinations_name_the_fields checks its message
        accepted.append((solver, gradient))
    return accepted


@pytest.mark.parametrize(("solver", "gradient"), _accepted_combinations())
def test_every_accepted_solver_and_gradient_trains(solver, gradient):
    # training mode: forward, backward, an optimizer step; the tolerance solvers' per-sample bookkeeping must not
    # touch tensors autograd saved (the unrolled gradient backprops through every step of their loop)
    model = IMAGE.build(fixed_point_solver=solver, fixed_point_gradient=gradient, fixed_point_iterations=4)
    perturb(model)
    model.train()
    inputs = IMAGE.inputs(labels=True)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2)
    losses = []
    for _ in range(5):
        optimizer.zero_grad()
        loss = model(**inputs).loss
        loss.backward()
        missing = [name for name, p in model.named_parameters() if p.grad is None]
        assert missing == [], f"{solver}/{gradient}: no gradient for {missing}"
        bad = [name for name, p in model.named_parameters() if not torch.isfinite(p.grad).all()]
        assert bad == [], f"{solver}/{gradient}: non-finite gradients in {bad}"
        optimizer.step()
        losses.append(loss.item())
    # five Adam steps on the same tiny batch must lower its loss; no tolerance: a failure to train is not a
    # rounding effect
    assert losses[-1] < losses[0], f"{solver}/{gradient}: loss did not decrease: {losses}"


def test_refused_combinations_name_the_fields():
    from energyformers.configuration.configuration_imixer import _CHOICES

    for solver, gradient in itertools.product(
        _CHOICES["fixed_point_solver"], _CHOICES["fixed_point_gradient"]
    ):
        if (solver, gradient) in _accepted_combinations():
            continue
        with pytest.raises(ValueError, match="fixed_point"):
            IMAGE.config(fixed_point_solver=solver, fixed_point_gradient=gradient)


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_stop_exactly_when_the_recorded_residual_is_within_the_tolerance(solver):
    # float32 residuals, tolerance 1e-3: float32(1e-3) rounds above 1e-3, so a residual of exactly that value is
    # above the tolerance. The first step below has that relative residual ([1, 0] → [1, v], ‖·‖ exact), each
    # later one half the step before (residuals falling, as in a contraction): the solve must go on to the
    # second step, whose residual is within the tolerance, and record what it compared.
    tolerance = 1e-3
    v = torch.tensor(tolerance, dtype=torch.float32)
    assert v.item() > tolerance, "the case needs a tolerance that rounds up in float32"
    offset = torch.tensor([[[0.0, v.item()]]])  # (B=1, D=1, D_S=2)
    calls = []

    def step(state: torch.Tensor) -> torch.Tensor:
        calls.append(state)
        return state + offset / 2 ** (len(calls) - 1)

    record = _SolveRecord(True)
    settings = _FixedPointSettings.of(IMixerConfig(), 10, solver=solver, tolerance=tolerance)
    modeling_imixer._solve(step, torch.tensor([[[1.0, 0.0]]]), 10, settings, record)
    recorded = [r.item() for r in record.relative]
    assert recorded[0] == v.item(), f"the case's first relative residual is {recorded[0]!r}, not {v.item()!r}"
    # every step but the last was recorded above the tolerance, the last one within it
    stops = [r <= tolerance for r in recorded]
    assert stops == [False] * (len(stops) - 1) + [True], (
        f"recorded relative residuals {recorded}, tol {tolerance}"
    )
    assert len(recorded) == 2, f"recorded relative residuals {recorded}: the second is within {tolerance}"
    assert record.final_relative.item() <= tolerance, (record.final_relative.item(), tolerance)


def _scripted_solve(
    solver: str, images: list[list[float]], tolerance: float
) -> tuple[torch.Tensor, _SolveRecord]:
    """`_solve` from the state [1, 0] (B = 1, D = 1, D_S = 2) on a step that returns the scripted `images` in turn,
    whatever its input. Anderson with memory 1 mixes only the last evaluation, so it proposes the image as Picard
    does: both solvers see the same iterates, and the test reaches Anderson's path of `_solve` too."""
    states = []

    def step(state: torch.Tensor) -> torch.Tensor:
        states.append(state)
        return torch.tensor([[images[len(states) - 1]]], dtype=F64)

    record = _SolveRecord(True)
    settings = _FixedPointSettings.of(
        IMixerConfig(), len(images), solver=solver, tolerance=tolerance, anderson_memory=1
    )
    answer = modeling_imixer._solve(
        step, torch.tensor([[[1.0, 0.0]]], dtype=F64), len(images), settings, record
    )
    seen = [s.flatten().tolist() for s in states]
    expected = [[1.0, 0.0], *images[: len(states) - 1]]
    assert seen == expected, f"{solver}: the step saw {seen}, not the scripted iterates {expected}"
    return answer, record


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_tolerance_solvers_return_the_iterate_that_met_the_tolerance_not_an_earlier_smaller_step(solver):
    # The state's scale grows 4× at the second step, so the third step's ‖f(x) − x‖ (1) is larger than the first's
    # (0.5) while its relative residual, 1 / ‖[4, 0.5]‖ ≈ 0.248, is the first within the tolerance 0.25: the solve
    # stops there and must return that evaluation and report its residuals, not the first step's (relative 0.5,
    # above the tolerance). The jump stays within the divergence rule (3 <= 10 × 0.5, one growing step).
    tolerance = 0.25
    images = [[1.0, 0.5], [4.0, 0.5], [4.0, 1.5], [4.0, 1.5]]
    answer, record = _scripted_solve(solver, images, tolerance)
    relative = [r.item() for r in record.relative]
    absolute = [a.item() for a in record.absolute]
    # the per-step record holds float32 means (as the diagnostics report them); the final residuals are compared in it
    where = f"{solver}: per-step relative residuals {relative}, paper's residuals {absolute}"
    # the premise: the two measures pick different steps among those run
    assert len(relative) == 3 and relative[2] <= tolerance < min(relative[:2]), where
    assert min(absolute) == absolute[0] < absolute[2], where
    assert answer.flatten().tolist() == images[2], f"{where}: returned {answer.flatten().tolist()}"
    assert record.final_relative.float().item() == relative[2] <= tolerance, (
        f"{where}: reported final relative residual {record.final_relative.item()}"
    )
    assert record.final_absolute.float().item() == absolute[2], (
        f"{where}: reported final residual {record.final_absolute.item()}"
    )


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_a_relative_residual_exactly_at_the_tolerance_stops_the_solve(solver):
    # "stops when the relative residual is <= the tolerance", at equality too: the first step, [1, 0] → [1, 0.5],
    # has relative residual exactly 0.5 (‖[0, 0.5]‖ / ‖[1, 0]‖, exact in float64), and 0.5 is the tolerance
    tolerance = 0.5
    images = [[1.0, 0.5], [1.0, 0.75], [1.0, 0.8]]
    answer, record = _scripted_solve(solver, images, tolerance)
    relative = [r.item() for r in record.relative]
    where = f"{solver}: per-step relative residuals {relative}, tolerance {tolerance}"
    assert relative[0] == tolerance, f"{where}: the case needs a first residual exactly at the tolerance"
    assert record.steps == 1 and len(relative) == 1, f"{where}: ran {record.steps} steps, not 1"
    assert answer.flatten().tolist() == images[0], f"{where}: returned {answer.flatten().tolist()}"


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_a_residual_that_grows_now_and_then_while_falling_is_not_taken_for_divergence(solver):
    # Step sizes 1, 0.9, 1, 0.8, 0.9, …: ‖f(x) − x‖ grows at 5 steps (`_DIVERGENCE_PATIENCE`), never 2 in a row, and
    # falls overall, as a slow non-monotone (Anderson) solve's does. The rule counts consecutive growths only: the
    # solve runs to its cap with no warning and returns its last iterate (the lowest relative residual).
    assert modeling_imixer._DIVERGENCE_PATIENCE == 5 and modeling_imixer._DIVERGENCE_FACTOR == 10.0
    sizes = [1.0, 0.9, 1.0, 0.8, 0.9, 0.7, 0.8, 0.6, 0.7, 0.5, 0.6, 0.4]
    images, position = [], 0.0
    for size in sizes:
        position += size
        images.append([1.0, position])
    records = Records()
    modeling_imixer.logger.addHandler(records)
    try:
        answer, record = _scripted_solve(solver, images, 1e-12)
    finally:
        modeling_imixer.logger.removeHandler(records)
    absolute = [a.item() for a in record.absolute]
    where = f"{solver}: per-step paper's residuals {absolute}, warnings {records.messages}"
    growths = sum(later > earlier for earlier, later in itertools.pairwise(absolute))
    assert growths == modeling_imixer._DIVERGENCE_PATIENCE and max(absolute) < 10 * min(absolute), where
    assert record.steps == len(images), f"{where}: stopped after {record.steps} of {len(images)} steps"
    assert not any("diverged" in message for message in records.messages), where
    assert answer.flatten().tolist() == images[-1], f"{where}: returned {answer.flatten().tolist()}"


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_a_diverging_solve_returns_its_lowest_absolute_residual_iterate_not_its_lowest_relative_one(solver):
    # Each image is the state times 1 + r, r = 1, 0.9, …, 0.5: the relative residual r falls while the state, and
    # with it ‖f(x) − x‖ = r‖x‖, grows. The sixth step is the fifth growing one in a row (`_DIVERGENCE_PATIENCE`),
    # still under 10× the first (`_DIVERGENCE_FACTOR`): the sample stops as diverged there, and returns the first
    # step's evaluation, the lowest paper's residual, not the fifth's (the lowest relative residual before the
    # step that tripped the rule, a state 9× larger).
    assert modeling_imixer._DIVERGENCE_PATIENCE == 5 and modeling_imixer._DIVERGENCE_FACTOR == 10.0
    images, norm = [], 1.0
    for r in (1.0, 0.9, 0.8, 0.7, 0.6, 0.5, 0.4):
        norm *= 1 + r
        images.append([norm, 0.0])
    answer, record = _scripted_solve(solver, images, 1e-6)
    relative = [r.item() for r in record.relative]
    absolute = [a.item() for a in record.absolute]
    where = f"{solver}: per-step relative residuals {relative}, paper's residuals {absolute}"
    assert len(relative) == 6 and absolute[-1] < 10 * absolute[0], (
        where
    )  # stopped by patience, not the factor
    assert answer.flatten().tolist() == images[0], f"{where}: returned {answer.flatten().tolist()}"
    assert record.final_relative.float().item() == relative[0], (
        f"{where}: reported final relative residual {record.final_relative.item()}"
    )
    assert record.final_absolute.float().item() == absolute[0], (
        f"{where}: reported final residual {record.final_absolute.item()}"
    )


@pytest.mark.parametrize("solver", ["picard", "anderson"])
def test_a_diverging_non_contractive_model_reports_its_lowest_absolute_residual_iterate(solver):
    # F's weights scaled 2× with no normalisation: the Lipschitz bound is far above 1 and the solve blows up, its
    # state growing faster than its step, so the relative residual falls step by step. The block must report (and
    # return) the iterate with the lowest paper's residual, not the latest, most grown one.
    torch.manual_seed(0)
    config = IMixerConfig(
        hidden_size=16,
        num_hidden_layers=1,
        image_size=8,
        patch_size=2,
        num_labels=2,
        contractive_normalization="none",
    )
    model = IMixerForImageClassification(config).double().eval()
    with torch.no_grad():
        for layer in model.imixer.layers:
            for linear in (layer.token_mixing.fc_sn1, layer.token_mixing.fc_sn2):
                linear.weight.mul_(2.0)
    records = Records()
    modeling_imixer.logger.addHandler(records)
    try:
        with torch.no_grad():
            out = model(
                pixel_values=torch.randn(1, 3, 8, 8, dtype=F64),  # B = 1: the per-step means are the sample's
                fixed_point_iterations=40,
                fixed_point_solver=solver,
                fixed_point_tolerance=1e-6,
                output_fixed_point_residuals=True,
            ).fixed_point_residuals
    finally:
        modeling_imixer.logger.removeHandler(records)
    steps = int(out.iterations[0])
    absolute, relative = out.residuals[0, :steps].tolist(), out.relative_residuals[0, :steps].tolist()
    where = f"{solver}: per-step paper's residuals {absolute}, relative residuals {relative}"
    assert any("diverged" in message for message in records.messages), f"{where}: no divergence warning"
    # the premise: the two measures pick different steps, the relative one a later, larger step
    least = absolute.index(min(absolute))
    assert min(relative[: steps - 1]) < relative[least] and absolute[-1] > 2 * absolute[least], where
    reported = (out.final_residuals[0].item(), out.final_relative_residuals[0].item())
    assert reported == (absolute[least], relative[least]), f"{where}: reported final residuals {reported}"
