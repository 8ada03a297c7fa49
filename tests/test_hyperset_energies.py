"""Hyper-SET's `"linear"` attention and `"gated"` feedforward energies: each update is the exact gradient of its
stated energy (float64, against `torch.autograd`), for every feature map φ, with padding; configs validate; models
with them train."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import Case, assert_close_to_scale, rounding, step_once

from energyformers import HyperSetConfig, HyperSetForSequenceClassification, HyperSetModel
from energyformers.configuration.configuration_hyperset import FEATURE_MAPS
from energyformers.modeling.modeling_hyperset import (
    FEATURE_MAP_FUNCTIONS,
    HyperSetAttention,
    HyperSetGatedFeedForward,
    HyperSetLinearAttention,
    eager_bisoftmax_attention,
)

SEQUENCE = Case.of(HyperSetForSequenceClassification)
D = torch.float64
# the stated energies' φ, written independently of the modeling file (torch's own functions)
PHI = {
    "sigmoid": torch.sigmoid,
    "relu": torch.relu,
    "tanh": torch.tanh,
    "softplus": torch.nn.functional.softplus,
    "silu": torch.nn.functional.silu,
    "gelu": torch.nn.functional.gelu,
    "elu": torch.nn.functional.elu,
    "elu+1": lambda x: torch.nn.functional.elu(x) + 1,
}


def test_every_feature_map_of_the_config_has_phi_and_its_derivative():
    assert set(FEATURE_MAP_FUNCTIONS) == set(FEATURE_MAPS) == set(PHI)
    x = torch.linspace(-4, 4, 101, dtype=D).requires_grad_(True)
    for name, (phi, derivative) in FEATURE_MAP_FUNCTIONS.items():
        # float64 elementwise maps of |x| <= 4 written out twice: a few ulps of values up to ~5
        torch.testing.assert_close(phi(x), PHI[name](x), rtol=0, atol=rounding(D, 8, 5.0))
        (expected,) = torch.autograd.grad(PHI[name](x).sum(), x)
        # autograd's chain of a few elementwise steps against the closed form: tens of ulps of slopes up to ~2
        torch.testing.assert_close(
            derivative(x.detach()), expected, rtol=0, atol=rounding(D, 32, 2.0), msg=name
        )


def _layer(feature_map: str, **overrides):
    torch.manual_seed(0)
    config = SEQUENCE.config(feature_map=feature_map, **overrides)
    return HyperSetModel(config).double().layers[0]


def _keep(masked: bool) -> torch.Tensor:
    keep = torch.ones(2, 6, dtype=D)
    if masked:
        keep[1, -2:] = 0
    return keep


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("masked", [False, True])
def test_linear_attention_update_is_w_transpose_times_energy_gradient(feature_map, masked):
    attention = _layer(feature_map, attention_energy="linear", qkv_norm="shared").attention
    assert isinstance(attention, HyperSetLinearAttention)
    with torch.no_grad():
        attention.qkv_gain.uniform_(0.5, 1.5)  # one shared gain g: exact for E with z → g ⊙ z
    gain = attention.qkv_gain[0].detach()
    x, keep = torch.randn(2, 6, 16, dtype=D), _keep(masked)
    dh = attention.head_dim
    z = attention.normalized_heads(x).detach().requires_grad_(True)  # gain-free, (B, H, N, d_h)
    features = PHI[feature_map](gain * z) * keep[:, None, :, None]
    total = (features[:, :, :, None, :] * features[:, :, None, :, :]).sum() / (
        2 * math.sqrt(dh)
    )  # Σ_ij φ_i·φ_j
    (grad_z,) = torch.autograd.grad(total, z)
    expected = grad_z.transpose(1, 2).reshape(2, 6, 16) @ attention.qkv_proj.weight  # Wᵀ ∂E/∂z per token
    update, maps = attention(x, keep.bool() if masked else None)
    real = keep.bool()
    # the same sums as autograd's in another order: over 6 tokens and the 4 head channels, then the 16 rows of W
    assert_close_to_scale(update[real], expected[real], rounding(D, 64), "update vs autograd")
    assert maps is None  # the update forms no (N, N) map
    # the energy diagnostic is the stated (gain-free) energy over the real tokens
    plain = PHI[feature_map](z.detach()) * keep[:, None, :, None]
    stated = (plain[:, :, :, None, :] * plain[:, :, None, :, :]).sum((1, 2, 3, 4)) / (2 * math.sqrt(dh))
    # one sum of 4 heads × 6 × 6 token pairs × 4 head channels (576 terms) per row, in another order
    assert_close_to_scale(attention.energy(x, keep), stated, rounding(D, 1024), "E_ATTN")


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_of_a_real_token_does_not_depend_on_padding(feature_map):
    attention = _layer(feature_map, attention_energy="linear").attention
    x = torch.randn(1, 4, 16, dtype=D)
    padded = torch.cat([x, torch.randn(1, 3, 16, dtype=D)], 1)
    keep = torch.tensor([[True] * 4 + [False] * 3])
    short, _ = attention(x)
    long, _ = attention(padded, keep)
    # the padded tokens add exact zeros, but a longer sum may be blocked differently: a few roundings of each sum
    # over 7 tokens and 4 head channels
    assert_close_to_scale(long[:, :4], short, rounding(D, 16), "padded vs unpadded")


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_gated_feedforward_update_is_minus_d_transpose_times_energy_gradient(feature_map):
    feedforward = _layer(feature_map, feedforward_energy="gated").feedforward
    assert isinstance(feedforward, HyperSetGatedFeedForward)
    with torch.no_grad():
        feedforward.norm.weight.uniform_(0.5, 1.5)  # the update must hold with learnable gains too
    x, keep = torch.randn(2, 6, 16, dtype=D), _keep(True)
    u = feedforward.norm(feedforward.dictionary(x)).detach().requires_grad_(True)
    total = -0.5 * PHI[feature_map](u).sum(-1).pow(2).sum()  # E_FF = −½ Σ_i (Σ_m φ(u_im))²
    (grad_u,) = torch.autograd.grad(total, u)
    # the same sums as autograd's in another order: over the 24 dictionary atoms, then the 16 channels
    expected = -grad_u @ feedforward.dictionary.weight
    assert_close_to_scale(feedforward(x), expected, rounding(D, 64), "update vs autograd")
    # with padding: the per-token update of a real token ignores the others; the energy counts real tokens only
    # per-token maths, but a matmul of another shape may be blocked differently: a few roundings of a 24-long sum
    assert_close_to_scale(feedforward(x[1:, :4]), feedforward(x)[1:, :4], rounding(D, 16), "alone vs padded")
    with torch.no_grad():
        feedforward.norm.weight.fill_(1.0)
        u = feedforward.norm(feedforward.dictionary(x))
    stated = (-0.5 * PHI[feature_map](u).sum(-1).pow(2) * keep).sum(-1)
    # one sum of 6 tokens × (a 24-long sum, squared) per row, in another order
    assert_close_to_scale(feedforward.energy(x, keep), stated, rounding(D, 256), "E_FF")


def test_feature_map_is_validated_against_the_energies():
    base = dict(hidden_size=16, num_attention_heads=4, intermediate_size=8)
    HyperSetConfig(**base, attention_energy="linear", feature_map="elu+1")
    HyperSetConfig(**base, feedforward_energy="gated", feature_map="tanh")
    with pytest.raises(
        ValueError, match=r"invalid feature_map=None; attention_energy='linear' and .* need one of"
    ):
        HyperSetConfig(**base, attention_energy="linear")
    with pytest.raises(ValueError, match=r"invalid feature_map='cosh'; .*need one of \['sigmoid', 'relu'"):
        HyperSetConfig(**base, feedforward_energy="gated", feature_map="cosh")
    with pytest.raises(ValueError, match="invalid feature_map='relu'; only attention_energy='linear' and"):
        HyperSetConfig(**base, feature_map="relu")
    with pytest.raises(
        ValueError, match="attention_energy='linear' runs only with attn_implementation='eager'"
    ):
        HyperSetModel(
            HyperSetConfig(**base, attention_energy="linear", feature_map="relu")
        ).set_attn_implementation("sdpa")


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
@pytest.mark.parametrize("variant", ["linear", "gated", "both"])
def test_models_with_the_new_energies_run_forward_backward_and_report_energies(
    feature_map, variant, tmp_path
):
    energies = dict(
        attention_energy="bisoftmax" if variant == "gated" else "linear",
        feedforward_energy="relu" if variant == "linear" else "gated",
    )
    model = step_once(SEQUENCE.build(feature_map=feature_map, **energies), SEQUENCE.inputs(labels=True))
    inputs = SEQUENCE.inputs(labels=True, seed=1)
    model.train()
    outputs = model(**inputs, output_energies=True)
    outputs.loss.backward()
    assert torch.isfinite(outputs.loss) and torch.isfinite(outputs.logits).all()
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    assert grads and all(torch.isfinite(g).all() for g in grads)
    assert model.hyperset.layers[0].attention.qkv_proj.weight.grad.abs().sum() > 0
    assert model.hyperset.layers[0].feedforward.dictionary.weight.grad.abs().sum() > 0
    for value in (outputs.energies.attention_energy, outputs.energies.feedforward_energy):
        assert value.shape == (3, 2, 4) and torch.isfinite(value).all()
    # a config with the new energies survives a save/load round trip with identical outputs
    model.eval()
    model.save_pretrained(tmp_path)
    loaded = HyperSetForSequenceClassification.from_pretrained(tmp_path).eval()
    assert (loaded.config.feature_map, type(loaded.hyperset.layers[0].attention)) == (
        feature_map,
        type(model.hyperset.layers[0].attention),
    )
    with torch.no_grad():
        torch.testing.assert_close(loaded(**inputs).logits, model(**inputs).logits, rtol=0, atol=0)


# ---------------------------------------------------------------- what the iteration does and does not descend
# (model_cards/hyperset.md, "Energy descent: what is and is not guaranteed"). The updates are Wᵀ ∂E_ATTN/∂z and −Dᵀ ∂E_FF/∂u,
# gradients with respect to the *normalised* projections, not with respect to x: the RMS normalisation's Jacobian
# J is skipped. So ⟨∇ₓE_ATTN, Attn(x)⟩ = Σ_i g_iᵀ J_i W Wᵀ g_i, which is ≥ 0 when W W ᵀ = s² I (J is positive
# semi-definite) and of either sign otherwise.


def _bisoftmax_layer(width: int = 16, intermediate: int = 8) -> torch.nn.Module:
    torch.manual_seed(0)
    config = SEQUENCE.config(hidden_size=width, intermediate_size=intermediate, num_hidden_layers=1)
    return HyperSetModel(config).double().layers[0]  # gains at their initial 1: the energies' gain-free n(·)


def _step(layer, x: torch.Tensor, alpha: torch.Tensor, gamma: torch.Tensor) -> torch.Tensor:
    """One iteration of the layer with fixed per-token step sizes `(B, N, 1)` (same for every channel), no anchor."""
    width = x.shape[-1]
    steps = torch.cat([alpha.expand(-1, -1, width), gamma.expand(-1, -1, width)], dim=-1)
    return layer(x, None, None, None, fixed_step_sizes=steps)[0]


def _energies(layer, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    keep = torch.ones(x.shape[:2], dtype=x.dtype)
    return layer.attention.energy(x, keep), layer.feedforward.energy(x, keep)


def test_a_small_positive_attention_step_can_raise_e_attn():
    # the documented non-guarantee: a general (anisotropic) W, one token pair, α = 1e-6 > 0 on every channel
    layer = _bisoftmax_layer()
    g = torch.Generator().manual_seed(0)
    scales = torch.logspace(-1, 1, 16, dtype=D)  # singular values spread over two decades: W Wᵀ far from s² I
    for trial in range(500):
        with torch.no_grad():
            layer.attention.qkv_proj.weight.copy_(torch.randn(16, 16, generator=g, dtype=D) * scales)
        x = torch.randn(1, 2, 16, generator=g, dtype=D)
        alpha, zero = torch.full((1, 2, 1), 1e-6, dtype=D), torch.zeros(1, 2, 1, dtype=D)
        before = _energies(layer, x)[0]
        after = _energies(layer, _step(layer, x, alpha, zero))[0]
        # a rise of 4096 ulps of |E| is no rounding: the energy is one sum of 4 heads × 2 × 2 pairs × 4 channels
        if (after - before).item() > rounding(D, 4096, before.abs().item()):
            found = trial
            break
    else:
        pytest.fail("no state among 500 where a small positive attention step raises E_ATTN")
    assert after > before, f"trial {found}: E_ATTN {before.item():.17g} -> {after.item():.17g}"


@pytest.mark.parametrize("part", ["attention", "feedforward"])
def test_small_positive_steps_descend_each_energy_when_the_projection_is_a_scaled_isometry(part):
    # where the guarantee holds: W (resp. D, M ≤ d) with orthogonal rows of one norm s and unit gains, per-token
    # step sizes > 0 shared by all channels and small for the state (the bound shrinks with ‖W_h x‖, which the
    # attention step itself shrinks, so it is checked one step at a time, from many states)
    layer = _bisoftmax_layer()
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        rotation = torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=D))[0]
        layer.attention.qkv_proj.weight.copy_(1.5 * rotation)
        layer.feedforward.dictionary.weight.copy_(1.5 * rotation[:8])  # M = 8 orthonormal rows, scaled
    index = 0 if part == "attention" else 1
    for trial in range(20):
        x = torch.randn(3, 7, 16, generator=g, dtype=D) * (0.5 + 2 * torch.rand(1, generator=g, dtype=D))
        small = 1e-6 * (1 + torch.rand(3, 7, 1, generator=g, dtype=D))  # per token, in [1e-6, 2e-6)
        zero = torch.zeros_like(small)
        alpha, gamma = (small, zero) if part == "attention" else (zero, small)
        before = _energies(layer, x)[index]
        after = _energies(layer, _step(layer, x, alpha, gamma))[index]
        # a "rise" of a few ulps per term of the summed energy is roundoff (attention: 4 heads × 7 × 7 pairs × 4
        # channels; feedforward: 7 tokens × 8 atoms, both under 1024 terms); the descent of a 1e-6 step is
        # ~1e-6·‖∇E‖·‖update‖, far above it
        allowed = rounding(D, 1024, 1.0) * before.abs()
        assert (after - before <= allowed).all(), (
            f"{part}, trial {trial}: {before.tolist()} -> {after.tolist()}"
        )
        assert (after < before).any(), f"{part}, trial {trial}: no sample descended {before} -> {after}"


@pytest.mark.parametrize(
    ("attention_energy", "feedforward_energy", "feature_map"),
    [("bisoftmax", "relu", None), ("sigmoid", "softmax", None), ("linear", "gated", "elu+1")],
)
def test_energies_are_float32_under_a_bfloat16_autocast(attention_energy, feedforward_energy, feature_map):
    """bf16 training runs the model under autocast; the energies it reports (output_energies, energy halting,
    search's energy selector) must still be computed in float32, not in autocast's 16-bit products."""
    torch.manual_seed(0)
    config = SEQUENCE.config(
        attention_energy=attention_energy, feedforward_energy=feedforward_energy, feature_map=feature_map
    )
    layer = HyperSetModel(config).layers[0]
    hidden_states = torch.randn(2, 6, config.hidden_size)
    keep = _keep(masked=True).float()
    expected = (
        *layer.attention.diagnostics(hidden_states, keep),
        layer.feedforward.energy(hidden_states, keep),
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        got = (
            *layer.attention.diagnostics(hidden_states, keep),
            layer.feedforward.energy(hidden_states, keep),
        )
    names = ("attention energy", "effective rank", "mean angle", "feedforward energy")
    for name, value, reference in zip(names, got, expected, strict=True):
        assert value.dtype == torch.float32, f"{name}: {value.dtype} under autocast"
        # the same float32 computation: float32's default tolerances (bf16 products are off by ~1e-3 relative)
        torch.testing.assert_close(value, reference, msg=lambda m, name=name: f"{name} under autocast: {m}")


# ---------------------------------------------------------------- each update is the pull-back of the module's own energy
# With a square orthogonal projection (W, resp. D) and unit gains, the update gives ∂E/∂z (resp. −∂E/∂u) exactly:
# z-space coefficients = update · Wᵀ. Their pull-back through the token-wise normalisation z(x) must then equal
# autograd of the module's own reported energy in x. A reported energy that is not the one the update descends (a
# dropped factor, a flipped sign, another potential) fails here, whatever formula a test would write for it.


def _orthogonal_layer(**overrides):
    torch.manual_seed(0)
    config = SEQUENCE.config(intermediate_size=16, **overrides)
    layer = HyperSetModel(config).double().layers[0]
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        layer.attention.qkv_proj.weight.copy_(torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=D))[0])
        layer.feedforward.dictionary.weight.copy_(
            torch.linalg.qr(torch.randn(16, 16, generator=g, dtype=D))[0]
        )
    assert (layer.attention.qkv_gain == 1).all() and (layer.feedforward.norm.weight == 1).all()
    return layer


def _own_energy_gradient(module, x: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """∂(Σ_b module.energy(x, keep)_b)/∂x by autograd through the module's own (undecorated) energy method."""
    # the energy methods run without autograd (`_energy_precision`); the attention's energy is its diagnostics[0]
    if isinstance(module, HyperSetAttention):
        undecorated = lambda y: type(module).diagnostics.__wrapped__(module, y, keep, geometry=False)[0]  # noqa: E731
    else:
        undecorated = lambda y: type(module).energy.__wrapped__(module, y, keep)  # noqa: E731
    with torch.enable_grad():
        y = x.detach().requires_grad_(True)
        reported = undecorated(y)
        (grad,) = torch.autograd.grad(reported.sum(), y)
    assert torch.equal(reported.detach(), module.energy(x, keep)), "energy() is not what was differentiated"
    return grad


ATTENTION_KINDS = [("bisoftmax", None), ("sigmoid", None)] + [("linear", phi) for phi in FEATURE_MAPS]


@pytest.mark.parametrize("masked", [True, False], ids=["padded", "no mask"])
@pytest.mark.parametrize(("energy", "feature_map"), ATTENTION_KINDS)
def test_attention_update_is_the_pullback_of_its_reported_energy(energy, feature_map, masked):
    # "no mask": the update runs with keep=None, the branch of each implementation that reads no mask, and is
    # compared with the energy of all tokens
    layer = _orthogonal_layer(attention_energy=energy, feature_map=feature_map)
    attention = layer.attention
    assert attention.config._attn_implementation == "eager"  # the reference path, which also returns the maps
    x, keep = torch.randn(2, 6, 16, dtype=D, generator=torch.Generator().manual_seed(1)), _keep(masked)
    real = keep.bool()
    update, _ = attention(x, real if masked else None)
    grad_energy = _own_energy_gradient(attention, x, keep)
    # the update is W-mixed ∂E/∂z: with W orthogonal, update·Wᵀ is ∂E/∂z per token, (B, N, H·d_h)
    coefficients = (update @ attention.qkv_proj.weight.t()).detach()
    heads = coefficients.view(2, 6, attention.num_heads, attention.head_dim).transpose(1, 2)
    with torch.enable_grad():
        y = x.detach().requires_grad_(True)
        (expected,) = torch.autograd.grad(attention.normalized_heads(y), y, heads)
    # a padded token has no energy (its gradient is 0); its update is no gradient and is not compared
    assert torch.equal(grad_energy[~real], torch.zeros_like(grad_energy[~real]))
    # sums over 6 tokens × 4 head channels, then W, Wᵀ and the norm's pull-back over 16 channels, in another order
    assert_close_to_scale(grad_energy[real], expected[real], rounding(D, 256), f"∂E_ATTN/∂x ({energy})")
    assert grad_energy[real].abs().max() > 1e-3, "a vanishing gradient would make the comparison void"


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32], ids=str)
def test_eager_bisoftmax_without_a_mask_is_bit_for_bit_the_masked_path_with_every_token_kept(dtype):
    # the two branches of the reference implementation compute the same R + Rᵀ: with no token padded, the mask
    # fills nothing and multiplies by exact ones, so the outputs and the maps agree to the bit
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 3, 6, 4, generator=g, dtype=D).to(dtype) for _ in range(3))
    unmasked = eager_bisoftmax_attention(q, k, v, None)
    masked = eager_bisoftmax_attention(q, k, v, torch.ones(2, 6, dtype=torch.bool))
    for name, got, expected in zip(("output", "maps"), unmasked, masked):
        assert torch.equal(got, expected), (
            f"{name}: largest difference {(got - expected).abs().max().item()!r}"
        )
    # and the maps are R + Rᵀ with R the row softmax of q kᵀ (written here independently)
    row = (q @ k.transpose(-1, -2)).double().softmax(-1)
    assert_close_to_scale(
        unmasked[1].double(), row + row.transpose(-1, -2), rounding(dtype, 16), "P = R + Rᵀ without a mask"
    )


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_gated_feedforward_update_is_the_pullback_of_its_reported_energy(feature_map):
    # (the ReLU, GELU and softmax feedforward energies: test_modeling_hyperset.py's
    # test_reported_feedforward_energy_is_the_potential_of_the_update)
    feedforward = _orthogonal_layer(feedforward_energy="gated", feature_map=feature_map).feedforward
    x, keep = torch.randn(2, 6, 16, dtype=D, generator=torch.Generator().manual_seed(1)), _keep(True)
    grad_energy = _own_energy_gradient(feedforward, x, keep)
    # FF(x) = −(∂E/∂u) D, so −FF(x)·Dᵀ = ∂E/∂u
    coefficients = -(feedforward(x) @ feedforward.dictionary.weight.t()).detach()
    with torch.enable_grad():
        y = x.detach().requires_grad_(True)
        u = torch.nn.functional.rms_norm(feedforward.dictionary(y), (16,), eps=feedforward.eps)
        (expected,) = torch.autograd.grad(u, y, coefficients * keep[..., None])
    # sums of 16 terms, a few in a row (D, the norm, Dᵀ, the pull-back), in another order
    assert_close_to_scale(grad_energy, expected, rounding(D, 256), f"∂E_FF/∂x (gated, {feature_map})")
    assert grad_energy.abs().max() > 1e-3, "a vanishing gradient would make the comparison void"


# ---------------------------------------------------------------- energies by hand on a tiny input
# d = d_h = M = 4, one head, W = D = I: tokens e1·2, e2·2 and (√2, √2, 0, 0) all have mean square 1, so
# z = u = c·x with c² = 1/(1 + eps), and a 4th, padded token holds an arbitrary state.
TOKENS = [[2.0, 0, 0, 0], [0, 2.0, 0, 0], [math.sqrt(2), math.sqrt(2), 0, 0], [0.3, -5.0, 1.0, 7.0]]


def _identity_layer(**overrides):
    # by default an eps large enough to be seen: z = x / √(mean x² + eps)
    overrides = {"rms_norm_eps": 0.01, **overrides}
    config = SEQUENCE.config(hidden_size=4, num_attention_heads=1, intermediate_size=4, **overrides)
    layer = HyperSetModel(config).double().layers[0]
    with torch.no_grad():
        layer.attention.qkv_proj.weight.copy_(torch.eye(4, dtype=D))
        layer.feedforward.dictionary.weight.copy_(torch.eye(4, dtype=D))
    return layer, config.rms_norm_eps


def _sigmoid(t: float) -> float:
    return 1 / (1 + math.exp(-t))


def test_sigmoid_attention_energy_by_hand():
    layer, eps = _identity_layer(attention_energy="sigmoid")
    x, keep = torch.tensor([TOKENS], dtype=D), torch.tensor([[1.0, 1, 1, 0]], dtype=D)
    c2 = 1 / (1 + eps)
    # E = ½√d_h Σ_ij σ(z_i·z_j/√d_h), √d_h = 2: scores 2c² on the diagonal (3), √2c² between token 3 and the
    # others (4 ordered pairs), 0 between tokens 1 and 2 (2 pairs)
    expected = 0.5 * 2 * (3 * _sigmoid(2 * c2) + 4 * _sigmoid(math.sqrt(2) * c2) + 2 * _sigmoid(0.0))
    got = layer.attention.energy(x, keep).item()
    # a sum of 9 sigmoids of size ≤ 1: a few ulps of 9
    assert abs(got - expected) <= rounding(D, 16, 9.0), f"E_ATTN {got!r} vs {expected!r}"


def test_softmax_feedforward_energy_by_hand():
    layer, eps = _identity_layer(feedforward_energy="softmax")
    x, keep = torch.tensor([TOKENS], dtype=D), torch.tensor([[1.0, 1, 1, 0]], dtype=D)
    c = 1 / math.sqrt(1 + eps)
    # E_FF = −Σ_i logsumexp_m u_im, u = c·x
    expected = -(2 * math.log(math.exp(2 * c) + 3) + math.log(2 * math.exp(math.sqrt(2) * c) + 2))
    got = layer.feedforward.energy(x, keep).item()
    # three log-sum-exps of 4 terms, each of size ≤ 3: a few ulps of 7
    assert abs(got - expected) <= rounding(D, 16, 7.0), f"E_FF {got!r} vs {expected!r}"


# ---------------------------------------------------------------- geometry diagnostics by hand
@pytest.mark.parametrize(
    ("energy", "feature_map"), [("bisoftmax", None), ("sigmoid", None), ("linear", "elu+1")]
)
def test_geometry_diagnostics_by_hand_and_blind_to_padding(energy, feature_map):
    # W = I, d_h = 4, one head: 3 tokens along e1 and 1 along e2 give z = 2c·e1 (×3) and 2c·e2, whose singular
    # values are (√3, 1)·2c. The effective rank is exp(H(p)) with p ∝ σ (not σ²: p ∝ (3, 1) gives another
    # number), and of the 12 ordered pairs of distinct tokens 6 are at 90° and 6 at 0°: a mean angle of 45°
    # (the diagonal counted as pairs would give 540/16 = 33.75°). A second sample, 2 tokens at 60° beside 4 padded
    # ones, has the Gram matrix 4·[[1, ½], [½, 1]], σ = (√6, √2) ∝ (√3, 1): the same rank, a mean angle of 60° (the
    # angle of the unit vectors: raw z·z of 2 would clamp to 0°).
    # eps = float64's (the default): z = 2·x/|x| to the last bits for these mean squares ≥ 1/4
    layer, _ = _identity_layer(attention_energy=energy, feature_map=feature_map, rms_norm_eps=None)
    tokens = [[1.5, 0, 0, 0], [4.0, 0, 0, 0], [7.0, 0, 0, 0], [0, 3.0, 0, 0]]
    pad = [
        [0.3, -5.0, 1.0, 7.0],
        [9.0, 9.0, -9.0, 1.0],
        [-2.0, 0.1, 0, 0],
        [0, 0, 4.0, 0],
    ]  # arbitrary states
    at_60 = [[1.0, 0, 0, 0], [1.0, math.sqrt(3), 0, 0]]
    p = torch.tensor([math.sqrt(3), 1.0], dtype=D) / (math.sqrt(3) + 1)
    rank = math.exp(-(p * p.log()).sum().item())
    plain = layer.attention.diagnostics(torch.tensor([tokens], dtype=D), torch.ones(1, 4, dtype=D))
    with_padding = layer.attention.diagnostics(
        torch.tensor([pad[:1] + tokens + pad[1:2], pad[2:] + at_60 + pad[:2]], dtype=D),
        torch.tensor([[0.0, 1, 1, 1, 1, 0], [0, 0, 1, 1, 0, 0]], dtype=D),
    )
    for name, (_, got_rank, got_angle), angles in (
        ("unpadded", plain, [45.0]),
        ("padded", with_padding, [45.0, 60.0]),
    ):
        for sample, angle in enumerate(angles):
            where = f"{name}, sample {sample}"
            # an SVD of a ≤ 6 × 4 float64 matrix and a log of 2 terms: a few tens of ulps of the rank ≈ 1.9
            assert abs(got_rank[sample].item() - rank) <= rounding(D, 64, 2.0), (
                f"{where}: effective rank {got_rank[sample].item()!r} vs {rank!r}"
            )
            # acos near 1 turns a rounding δ of a unit dot product into √(2δ) rad ≈ 1e-6°: far below the 11.25°
            # of a diagonal counted as pairs or the degrees a padded token counted would add
            assert abs(got_angle[sample].item() - angle) <= 1e-5, (
                f"{where}: mean angle {got_angle[sample].item()!r} vs {angle}°"
            )
