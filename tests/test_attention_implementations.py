"""Hyper-SET's bi-softmax attention implementations (`attn_implementation` = eager | sdpa | triton) agree.

The eager path (S and both softmaxes materialised) is the reference. `sdpa` is pure torch on
`scaled_dot_product_attention`; `triton` is the fused kernel of `energyformers/kernels.py`, run here by Triton's CPU
interpreter (`TRITON_INTERPRET=1`, set in conftest.py before any kernel is built) and, on a machine with CUDA, also
compiled for the GPU (the `cuda` parameters: the same checks against eager on the GPU). Checked: the attention functions
(float32 forward and gradients within tens of ulps of each tensor's largest entry of eager, bfloat16 no worse than a few times eager's own
error against float64), with padding (a partly and a fully padded sequence), N = 1, 17, 197 and several heads; every
Hyper-SET head end to end; selection, save/load and the errors.
"""

from __future__ import annotations

import importlib.util
import json
import math
import os

import pytest
import torch
import torch.nn.functional as F
from fixtures import ALL, Case, assert_close_to_scale, cases, main_output, perturb, rounding

from energyformers import HyperSetForImageClassification
from energyformers.modeling import modeling_hyperset
from energyformers.modeling.modeling_hyperset import (
    ALL_ATTENTION_FUNCTIONS,
    DEFAULT_ATTN_IMPLEMENTATION,
    eager_bisoftmax_attention,
)

HAS_TRITON = importlib.util.find_spec("triton") is not None
IMPLEMENTATIONS = [
    "sdpa",
    pytest.param("triton", marks=pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")),
]
HYPERSET = [case for case in ALL if case.family == "hyperset"]  # every head, both input types of the base
# CPU always (Triton through its interpreter); CUDA where there is one, where the fused kernel is compiled for real
DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
# Rounding counts are per CPU operation; on CUDA exp is approximate (ex2.approx, about 2 ulps) and cuBLAS picks its
# own split of each sum, so a CUDA comparison allows four times the count
ROUNDINGS_PER_OP = {"cpu": 1, "cuda": 4}


def skip_unrunnable(name: str, device: str) -> None:
    """The fused kernel on CPU needs Triton's interpreter (conftest.py sets it on machines without CUDA)."""
    if name == "triton" and device == "cpu" and os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("Triton runs on CPU only in its interpreter; this machine runs it on CUDA")


def attention_inputs(
    length: int, head_dim: int, padded: bool, dtype: torch.dtype = torch.float32
) -> tuple[torch.Tensor, ...]:
    """(z, c, v, keep) as the model makes them: z on the sphere, c the q-side scale (gains and 1/√d_h), v a gained
    z, and a padding mask. The model calls attention with q = z ⊙ c and k = z (`qk`): symmetric scores.

    Padding: sample 0 has no real token at all (only zeros, no NaN, allowed), sample 1 its second half padded.
    """
    batch, heads = (3, 3) if length <= 64 else (2, 2)  # the interpreter is slow: fewer pairs at N = 197
    g = torch.Generator().manual_seed(length * 100 + head_dim)
    z = F.rms_norm(torch.randn(batch, heads, length, head_dim, generator=g, dtype=torch.float64), (head_dim,))
    gains = 1 + 0.5 * torch.randn(3, head_dim, generator=g, dtype=torch.float64)
    scale, v = gains[0] * gains[1] / math.sqrt(head_dim), z * gains[2]
    keep = None
    if padded:
        keep = torch.ones(batch, length, dtype=torch.bool)
        keep[1, length // 2 + 1 :] = False
        if length > 1:
            keep[0] = False
    return z.to(dtype), scale.to(dtype), v.to(dtype), keep


def qk(z: torch.Tensor, scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return z * scale, z


def run(name: str, z, scale, v, keep, grad_out) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """Output and (dz, dc, dv) of `name` for the output gradient `grad_out`: the derivatives the model sees (the
    eager path uses the symmetry of S, so its partial derivatives in q and k alone are not those of the general
    map; through q = z ⊙ c, k = z they are)."""
    leaves = [x.detach().clone().requires_grad_() for x in (z, scale, v)]
    out, _ = ALL_ATTENTION_FUNCTIONS[name](*qk(*leaves[:2]), leaves[2], keep)
    grads = torch.autograd.grad(out, leaves, grad_out.to(device=out.device, dtype=out.dtype))
    return out, grads


SHAPES = [(1, 4), (17, 64), (197, 16)]  # (N, d_h): odd lengths, the presets' d_h = 64 and a tiny one


def on(device: str, *tensors: torch.Tensor | None) -> tuple[torch.Tensor | None, ...]:
    return tuple(None if t is None else t.to(device) for t in tensors)


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize(("length", "head_dim"), SHAPES, ids=[f"N{n}-d{d}" for n, d in SHAPES])
def test_float32_matches_eager(name, padded, length, head_dim, device):
    skip_unrunnable(name, device)
    z, scale, v, keep = on(device, *attention_inputs(length, head_dim, padded))
    grad_out = torch.randn(z.shape, generator=torch.Generator().manual_seed(0))
    expected, expected_grads = run("eager", z, scale, v, keep, grad_out)
    out, grads = run(name, z, scale, v, keep, grad_out)
    assert not out.isnan().any()
    # float32 sums over the N keys in another order (blocks, fused exp): tens of ulps of the largest entry
    assert_close_to_scale(out, expected, rounding(torch.float32, 32 * ROUNDINGS_PER_OP[device]), "output")
    for got, want, label in zip(grads, expected_grads, "zcv"):
        # dc sums over every sample, head and token pair (B·H·N² terms); rounding errors of independent terms add
        # like the square root of their count: 8 × √(B·H·N²) ulps of the largest entry
        terms = z.shape[0] * z.shape[1] * length**2
        count = 8 * math.sqrt(terms) * ROUNDINGS_PER_OP[device]
        assert_close_to_scale(got, want, rounding(torch.float32, count), f"d{label}")
    if padded and length > 1:  # sample 0 has no real token: exactly what eager gives, zeros
        assert out[0].abs().max() == 0


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
def test_sdpa_head_dimension_padding_gives_the_same_result(padded, monkeypatch):
    """CUDA's fused SDPA kernels get head dimensions padded to a multiple of 8; the padding is inert. Run on CPU by
    asking for CUDA's multiple there (the first GPU run found the sink channel read with the padding columns)."""
    z, scale, v, keep = attention_inputs(17, 4, padded)  # d = 4: the column pass pads 5 → 8, values 2 → 8
    grad_out = torch.randn(z.shape, generator=torch.Generator().manual_seed(0))
    expected, expected_grads = run("sdpa", z, scale, v, keep, grad_out)
    monkeypatch.setitem(modeling_hyperset._SDPA_HEAD_DIM_MULTIPLE, "cpu", 8)
    out, grads = run("sdpa", z, scale, v, keep, grad_out)
    # zero columns add nothing to the sums; only the kernel's split of them may change: a few ulps of the scale
    assert_close_to_scale(out, expected, rounding(torch.float32, 8), "output")
    for got, want, label in zip(grads, expected_grads, "zcv"):
        assert_close_to_scale(got, want, rounding(torch.float32, 16), f"d{label}")


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@pytest.mark.parametrize("length", [17, 197])
def test_bfloat16_no_worse_than_eager(name, length, device):
    """Against float64, bfloat16 errors stay within a few times eager's own bfloat16 error."""
    skip_unrunnable(name, device)
    z, scale, v, keep = on(device, *attention_inputs(length, 16, padded=True, dtype=torch.bfloat16))
    grad_out = torch.randn(z.shape, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    exact, exact_grads = run("eager", z.double(), scale.double(), v.double(), keep, grad_out)
    eager, eager_grads = run("eager", z, scale, v, keep, grad_out)
    out, grads = run(name, z, scale, v, keep, grad_out)
    assert out.dtype == torch.bfloat16 and all(g.dtype == torch.bfloat16 for g in grads)

    def error(a, b):
        return (a.double() - b).abs().max().item()

    # a few times eager's own error, plus one bfloat16 ulp of values of size 1 (eager may round exactly by chance)
    slack = rounding(torch.bfloat16, 1)
    assert error(out, exact) <= 4 * error(eager, exact) + slack, (error(out, exact), error(eager, exact))
    for got, base, want in zip(grads, eager_grads, exact_grads):
        assert error(got, want) <= 4 * error(base, want) + slack, (error(got, want), error(base, want))


def two_softmax_definition(q, k, v, keep):
    """P = R + C as the paper and the authors' code write it: a row and a column softmax of S (padded keys out
    of the rows, padded queries out of the columns, no token reads a padded key)."""
    scores = q @ k.transpose(-1, -2)
    if keep is None:
        probs = scores.softmax(-1) + scores.softmax(-2)
    else:
        key_keep = keep[:, None, None, :]
        blocked = torch.finfo(scores.dtype).min
        row = scores.masked_fill(~key_keep, blocked).softmax(-1)
        col = scores.masked_fill(~key_keep.transpose(-1, -2), blocked).softmax(-2)
        probs = (row + col) * key_keep
    return probs @ v, probs


@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("length", [1, 17, 197])
def test_eager_one_softmax_is_the_two_softmax_definition(padded, length):
    """The eager path's C = Rᵀ (S symmetric for q = z ⊙ c, k = z) against the definition, float64: maps, output and
    the gradients the model sees (through z, c and v)."""
    z, scale, v, keep = attention_inputs(length, 16, padded, dtype=torch.float64)
    grad_out = torch.randn(z.shape, generator=torch.Generator().manual_seed(1), dtype=torch.float64)
    results = []
    for attend in (eager_bisoftmax_attention, two_softmax_definition):
        leaves = [x.detach().clone().requires_grad_() for x in (z, scale, v)]
        out, probs = attend(*qk(*leaves[:2]), leaves[2], keep)
        results.append((out, probs, torch.autograd.grad(out, leaves, grad_out)))
    (out, probs, grads), (want_out, want_probs, want_grads) = results
    # float64, the same sums in another order (C = Rᵀ instead of a column softmax): tens of ulps of the scale
    assert_close_to_scale(probs, want_probs, rounding(torch.float64, 64), "probs")
    assert_close_to_scale(out, want_out, rounding(torch.float64, 64), "output")
    for got, want, label in zip(grads, want_grads, "zcv"):
        assert_close_to_scale(got, want, rounding(torch.float64, 64), f"d{label}")


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.parametrize("device", DEVICES)
def test_triton_with_general_q_and_k_is_the_two_softmax_definition(device):
    """The fused kernel is (R + C) v for any S = q kᵀ, as its docstring and custom op say, not only for the model's
    symmetric S = (z ⊙ c) zᵀ, with which the row and column log-sum-exps coincide: independent q, k, v against the
    definition in float64, output and the partial derivatives in q, k and v."""
    skip_unrunnable("triton", device)
    g = torch.Generator().manual_seed(2)
    q, k, v = (torch.randn(2, 2, 17, 16, generator=g) for _ in range(3))
    keep = torch.ones(2, 17, dtype=torch.bool)
    keep[1, 9:] = False  # sample 1's last 8 tokens padded
    real = keep[:, None, :, None].double()  # what the model reads: the real queries' rows
    grad_out = torch.randn(q.shape, generator=g, dtype=torch.float64) * real
    results = []
    runs = [
        (ALL_ATTENTION_FUNCTIONS["triton"], torch.float32, device),
        (two_softmax_definition, torch.float64, "cpu"),
    ]
    for attend, dtype, on_device in runs:
        leaves = [x.to(on_device, dtype).requires_grad_() for x in (q, k, v)]
        out, _ = attend(*leaves, keep.to(on_device))
        grads = torch.autograd.grad(out, leaves, grad_out.to(on_device, dtype))
        results.append([t.detach().cpu().double() for t in (out * real.to(on_device, dtype), *grads)])
    (out, *grads), (want, *want_grads) = results
    # float32 sums over the 17 keys in another order (blocks, fused exp) than float64's: tens of ulps of the scale
    assert_close_to_scale(out, want, rounding(torch.float32, 32 * ROUNDINGS_PER_OP[device]), "output")
    for got, expected, label in zip(grads, want_grads, "qkv"):
        # as in test_float32_matches_eager: 8 × √(B·H·N²) ulps of the largest entry
        count = 8 * math.sqrt(2 * 2 * 17**2) * ROUNDINGS_PER_OP[device]
        assert_close_to_scale(got, expected, rounding(torch.float32, count), f"d{label}")


def test_several_heads_and_batches_are_independent():
    """Each (sample, head) pair is its own attention: computing one alone gives the same rows."""
    z, scale, v, keep = on(DEVICES[-1], *attention_inputs(17, 16, padded=True))  # the GPU where there is one
    q, k = qk(z, scale)
    for name in ["sdpa"] + (["triton"] if HAS_TRITON else []):
        out, _ = ALL_ATTENTION_FUNCTIONS[name](q, k, v, keep)
        alone, _ = ALL_ATTENTION_FUNCTIONS[name](q[1:2, 2:3], k[1:2, 2:3], v[1:2, 2:3], keep[1:2])
        # the same rows through the same kernel, only batched differently: a few float32 ulps of the scale
        assert_close_to_scale(alone[0, 0], out[1, 2], rounding(torch.float32, 8), name)


def large_steps(model: torch.nn.Module) -> torch.nn.Module:
    """Perturbed weights and step sizes α, γ ≈ 0.3, so that the attention visibly moves the output."""
    perturb(model)
    with torch.no_grad():
        model.base_model.step_sizes.proj.bias.fill_(0.3)
    return model


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("name", IMPLEMENTATIONS)
@cases(HYPERSET)
def test_every_head_gives_the_eager_result(case, name, device):
    """Logits (padded sequences included: the fixtures pad the first row) and every parameter's gradient."""
    skip_unrunnable(name, device)
    overrides = dict(num_hidden_layers=1, num_iterations=2)  # the interpreter is slow; one layer, two steps
    inputs = {key: value.to(device) for key, value in case.inputs(labels=not case.is_base).items()}
    results = {}
    for implementation in ("eager", name):
        model = large_steps(case.build(attn_implementation=implementation, **overrides)).to(device).train()
        outputs = model(**inputs)
        loss = outputs.loss if not case.is_base else main_output(outputs).square().mean()
        loss.backward()
        grads = {key: p.grad for key, p in model.named_parameters() if p.grad is not None}
        results[implementation] = main_output(outputs), grads
    (expected, expected_grads), (got, grads) = results["eager"], results[name]
    # float32, per unit of each tensor's largest entry (the paths sum the same terms in another order): tens of
    # ulps through one layer of two iterations; the gradients go back through all of it and sum over the batch
    per_op = ROUNDINGS_PER_OP[device]
    assert_close_to_scale(got, expected, rounding(torch.float32, 64 * per_op), "output")
    assert grads.keys() == expected_grads.keys()
    for key, grad in grads.items():
        assert_close_to_scale(grad, expected_grads[key], rounding(torch.float32, 512 * per_op), key)


@cases(HYPERSET)
def test_default_is_eager_and_not_saved(case, tmp_path):
    """Eager on every device: the fastest measured on CPU and on an H200 (benchmarks/results/gpu_speed.md)."""
    model = case.build()
    assert DEFAULT_ATTN_IMPLEMENTATION == "eager"
    assert model.config._attn_implementation == "eager"
    model.save_pretrained(tmp_path)
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())


@pytest.mark.parametrize("device", DEVICES)
def test_default_is_the_same_on_cuda_and_the_fused_kernel_stays_selectable_by_name(device, monkeypatch):
    """With CUDA present (pretended where there is none) the default is still eager although "triton" is
    registered; asking for "triton" or "sdpa" by name gets it wherever it can run."""
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    case = Case.of(HyperSetForImageClassification)
    model = HyperSetForImageClassification._from_config(case.config())
    assert model.config._attn_implementation == "eager", model.config._attn_implementation
    if not HAS_TRITON:
        return
    assert "triton" in ALL_ATTENTION_FUNCTIONS  # registered: the default is a choice, not a missing kernel
    monkeypatch.undo()
    skip_unrunnable("triton", device)
    model = HyperSetForImageClassification._from_config(case.config(), attn_implementation="triton")
    assert model.config._attn_implementation == "triton"
    model.set_attn_implementation("sdpa")
    model.set_attn_implementation("triton")
    assert model.config._attn_implementation == "triton"


@pytest.mark.parametrize("name", ["eager", "sdpa", *(["triton"] if HAS_TRITON else [])])
def test_attn_implementation_is_chosen_when_loading_and_not_saved(name, tmp_path):
    """As in transformers: config.json names no implementation; `from_pretrained` / `from_config` take one."""
    skip_unrunnable(name, "cpu")
    case = Case.of(HyperSetForImageClassification)
    model = case.build(attn_implementation=name)
    model.save_pretrained(tmp_path)
    assert "attn_implementation" not in json.loads((tmp_path / "config.json").read_text())
    loaded = case.auto_class.from_pretrained(tmp_path)
    assert loaded.config._attn_implementation == DEFAULT_ATTN_IMPLEMENTATION
    chosen = case.auto_class.from_pretrained(tmp_path, attn_implementation=name)
    assert chosen.config._attn_implementation == name
    assert chosen.base_model.config is chosen.config
    rebuilt = HyperSetForImageClassification._from_config(case.config(), attn_implementation=name)
    assert rebuilt.config._attn_implementation == name


def test_unknown_implementation_is_rejected():
    case = Case.of(HyperSetForImageClassification)
    with pytest.raises(ValueError, match=r'attn_implementation="flash_attention_2".*eager.*sdpa.*triton'):
        HyperSetForImageClassification._from_config(case.config(), attn_implementation="flash_attention_2")
    model = case.build()
    default = model.config._attn_implementation  # eager
    with pytest.raises(ValueError, match=r'attn_implementation="foo"'):
        model.set_attn_implementation("foo")
    assert model.config._attn_implementation == default  # unchanged


def test_sigmoid_energy_runs_only_eager():
    case = Case.of(HyperSetForImageClassification)
    with pytest.raises(
        ValueError, match=r"attention_energy='sigmoid' runs only with attn_implementation='eager'"
    ):
        HyperSetForImageClassification._from_config(
            case.config(attention_energy="sigmoid"), attn_implementation="sdpa"
        )
    assert case.build(attention_energy="sigmoid").config._attn_implementation == "eager"


@pytest.mark.skipif(not HAS_TRITON, reason="Triton is not installed")
@pytest.mark.skipif(torch.cuda.is_available(), reason="the kernel can run on this machine")
def test_triton_without_cuda_or_interpreter_is_a_clear_error(monkeypatch):
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    case = Case.of(HyperSetForImageClassification)
    with pytest.raises(ValueError, match=r"attn_implementation='triton' cannot run here: .*CUDA"):
        HyperSetForImageClassification._from_config(case.config(), attn_implementation="triton")
    z, scale, v, keep = attention_inputs(5, 4, padded=False)
    q, k = qk(z, scale)
    with pytest.raises(ValueError, match=r'attn_implementation="triton" cannot run on cpu'):
        ALL_ATTENTION_FUNCTIONS["triton"](q.float(), k.float(), v.float(), keep)


def test_triton_missing_is_a_clear_error(monkeypatch):
    """As in Hub remote code (no energyformers package) or an install without Triton: no silent fallback."""
    interface = modeling_hyperset.BiSoftmaxAttentionInterface
    without = {name: function for name, function in interface._global_mapping.items() if name != "triton"}
    monkeypatch.setattr(interface, "_global_mapping", without)
    case = Case.of(HyperSetForImageClassification)
    with pytest.raises(ValueError, match=r'attn_implementation="triton"` is not supported.*Triton installed'):
        HyperSetForImageClassification._from_config(case.config(), attn_implementation="triton")
    assert HyperSetForImageClassification._from_config(case.config()).config._attn_implementation == "eager"


@pytest.mark.parametrize("name", ["sdpa", *(["triton"] if HAS_TRITON else [])])
def test_output_attentions_runs_eager_for_that_call(name):
    skip_unrunnable(name, "cpu")
    case = Case.of(HyperSetForImageClassification)
    inputs = case.inputs()
    expected = large_steps(case.build(attn_implementation="eager"))(**inputs, output_attentions=True)
    model = large_steps(case.build(attn_implementation=name))
    outputs = model(**inputs, output_attentions=True)
    assert model.config._attn_implementation == name  # only that call ran eager
    assert len(outputs.attentions) == len(expected.attentions) > 0
    for got, want in zip(outputs.attentions, expected.attentions):
        torch.testing.assert_close(got, want)
    assert model(**inputs).attentions is None


def test_attention_table_is_the_familys_own():
    """No global registration: transformers' attention registry does not know Hyper-SET's names."""
    from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS as TRANSFORMERS_ATTENTION_FUNCTIONS

    assert "triton" not in TRANSFORMERS_ATTENTION_FUNCTIONS.valid_keys()
    assert set(ALL_ATTENTION_FUNCTIONS) == {"eager", "sdpa"} | ({"triton"} if HAS_TRITON else set())
    assert ALL_ATTENTION_FUNCTIONS["eager"] is eager_bisoftmax_attention
