"""Hyper-SET's `"linear"` attention and `"gated"` feedforward energies: each update is the exact gradient of its
stated energy (float64, against `torch.autograd`), for every feature map φ, with padding; configs validate; models
with them train."""

from __future__ import annotations

import math

import pytest
import torch
from fixtures import Case, step_once

from energyformers import HyperSetConfig, HyperSetForSequenceClassification, HyperSetModel
from energyformers.configuration.configuration_hyperset import FEATURE_MAPS
from energyformers.modeling.modeling_hyperset import (
    FEATURE_MAP_FUNCTIONS,
    HyperSetGatedFeedForward,
    HyperSetLinearAttention,
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
        torch.testing.assert_close(phi(x), PHI[name](x), rtol=0, atol=1e-14)
        (expected,) = torch.autograd.grad(PHI[name](x).sum(), x)
        torch.testing.assert_close(derivative(x.detach()), expected, rtol=0, atol=1e-12, msg=name)


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
    torch.testing.assert_close(update[real], expected[real], rtol=1e-10, atol=1e-10)
    assert maps is None  # the update forms no (N, N) map
    # the energy diagnostic is the stated (gain-free) energy over the real tokens
    plain = PHI[feature_map](z.detach()) * keep[:, None, :, None]
    stated = (plain[:, :, :, None, :] * plain[:, :, None, :, :]).sum((1, 2, 3, 4)) / (2 * math.sqrt(dh))
    torch.testing.assert_close(attention.energy(x, keep), stated, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("feature_map", FEATURE_MAPS)
def test_linear_attention_of_a_real_token_does_not_depend_on_padding(feature_map):
    attention = _layer(feature_map, attention_energy="linear").attention
    x = torch.randn(1, 4, 16, dtype=D)
    padded = torch.cat([x, torch.randn(1, 3, 16, dtype=D)], 1)
    keep = torch.tensor([[True] * 4 + [False] * 3])
    short, _ = attention(x)
    long, _ = attention(padded, keep)
    torch.testing.assert_close(long[:, :4], short, rtol=1e-12, atol=1e-12)


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
    torch.testing.assert_close(
        feedforward(x), -grad_u @ feedforward.dictionary.weight, rtol=1e-10, atol=1e-10
    )
    # with padding: the per-token update of a real token ignores the others; the energy counts real tokens only
    torch.testing.assert_close(feedforward(x[1:, :4]), feedforward(x)[1:, :4], rtol=0, atol=1e-12)
    with torch.no_grad():
        feedforward.norm.weight.fill_(1.0)
        u = feedforward.norm(feedforward.dictionary(x))
    stated = (-0.5 * PHI[feature_map](u).sum(-1).pow(2) * keep).sum(-1)
    torch.testing.assert_close(feedforward.energy(x, keep), stated, rtol=1e-12, atol=1e-12)


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
