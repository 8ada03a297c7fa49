"""Hyper-SET's `"sdpa"` bi-softmax in half precision: its log-sum-exp arithmetic runs in float32.

The sdpa path recovers the row and column log-sum-exps ℓ = s + log a − log p from a sink key of score s (tens at
large scores) and two SDPA outputs a, p. Done in bfloat16, s + log a − log p is rounded to a few bits after the
point: an absolute error of a sizeable fraction of a unit in ℓ, so a relative error of that size in every weight
e^{S − ℓ}, growing with the scores. In float32 only the roundings of SDPA's own inputs and outputs are left, a
fixed number of units in the last place of the output whatever the scores. These tests compare against the exact
bi-softmax of the same (rounded) inputs in float64, at several score magnitudes.

Float16 (inputs, or a float16 autocast) is the exception: its range is too narrow for the sink identity (at scores of
about 16 SDPA's sums fall below its normal numbers, from about 32 the column factors overflow it), so both SDPA calls
run in float32 there and only the output is rounded to float16. Hyper-SET's scores are bounded by
max_c |g_q g_k| √d_h (S_ij = (z_i ⊙ g_q g_k)·z_j/√d_h with ‖z‖ = √d_h): 8 at initialisation for d_h = 64 (the paper's
presets), 16 once the gain products reach 2.
"""

from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from fixtures import rounding

from energyformers.modeling import modeling_hyperset
from energyformers.modeling.modeling_hyperset import sdpa_bisoftmax_attention

DEVICES = ["cpu", *(["cuda"] if torch.cuda.is_available() else [])]
# exp on CUDA is approximate (about 2 ulps) and its kernels split sums their own way: four times the count there
ROUNDINGS_PER_OP = {"cpu": 1, "cuda": 4}


def symmetric_heads(
    magnitude: float, dtype: torch.dtype, padded: bool, seed: int = 0
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None]:
    """q = z ⊙ c, k = z, v as Hyper-SET's attention forms them (z on the sphere of radius √d_h, so S_ii ≈
    `magnitude`), in `dtype`; with `padded`, sample 1 has its second half padded."""
    batch, heads, length, head_dim = 2, 3, 50, 16
    g = torch.Generator().manual_seed(seed)
    z = F.rms_norm(torch.randn(batch, heads, length, head_dim, generator=g, dtype=torch.float64), (head_dim,))
    scale = magnitude / head_dim * (1 + 0.25 * torch.randn(head_dim, generator=g, dtype=torch.float64))
    v = z * (1 + 0.5 * torch.randn(head_dim, generator=g, dtype=torch.float64))
    keep = None
    if padded:
        keep = torch.ones(batch, length, dtype=torch.bool)
        keep[1, length // 2 + 1 :] = False
    return (z * scale).to(dtype), z.to(dtype), v.to(dtype), keep


def exact_bisoftmax(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(R + C) v in float64 by the definition (rows over the real keys, columns over the real queries, no token
    reads a padded key) and (R + C) |v|, the size of the sum each output entry is: its rounding scale."""
    q, k, v = q.double(), k.double(), v.double()
    scores = q @ k.transpose(-1, -2)
    if keep is None:
        probs = scores.softmax(-1) + scores.softmax(-2)
    else:
        key_keep = keep[:, None, None, :].to(q.device)
        row = scores.masked_fill(~key_keep, -torch.inf).softmax(-1)
        col = scores.masked_fill(~key_keep.transpose(-1, -2), -torch.inf).softmax(-2)
        probs = (row + col.nan_to_num()) * key_keep  # a padded query's column entries: 0 (no real query, NaN)
    return probs @ v, probs @ v.abs()


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize(
    ("dtype", "magnitude"),
    # float16: 8 is an untrained paper-sized model's largest score, 16 to 64 trained gain products of 2 to 8
    [(torch.bfloat16, m) for m in (4, 16, 32, 64)] + [(torch.float16, m) for m in (4, 8, 16, 32, 64)],
    ids=lambda x: str(x).removeprefix("torch."),
)
def test_sdpa_half_precision_error_is_a_few_roundings_at_any_score_magnitude(
    dtype, magnitude, padded, device
):
    """Every output entry within a few units in the last place of its sum's size (R + C)|v| of the exact result.

    The roundings that reach the output: the weighted values v ⊙ e^{m − ℓᶜ} rounded into SDPA's input (1), SDPA
    rounding the weights it multiplies the values by (1) and each of its outputs (the sums out, a, p: 3), a and p of
    the column pass in ℓᶜ (2), then one final rounding: 8 roundings of at most half a unit each, 4 eps of the
    size of the sum. Float32 arithmetic in between adds nothing visible at this scale. With that arithmetic in
    bfloat16 the error grows with the scores, to tens of eps at magnitude 64. Float16 runs SDPA in float32, so
    only the final rounding is left of this count.
    """
    q, k, v, keep = symmetric_heads(magnitude, dtype, padded)
    q, k, v = q.to(device), k.to(device), v.to(device)
    keep = None if keep is None else keep.to(device)
    out, maps = sdpa_bisoftmax_attention(q, k, v, keep)
    assert maps is None and out.dtype == dtype
    exact, size = exact_bisoftmax(q, k, v, keep)
    error = (out.double() - exact).abs()
    allowed = rounding(dtype, 4 * ROUNDINGS_PER_OP[device], 1.0) * size
    worst = (error / size.clamp_min(torch.finfo(torch.float64).tiny)).max().item()
    assert (error <= allowed).all(), (
        f"{dtype} at |S| ≈ {magnitude}: worst error {error.max().item():.4g} (sum size "
        f"{size.flatten()[error.argmax()].item():.4g}), worst error per size {worst / torch.finfo(dtype).eps:.2f} eps "
        f"> allowed 4 eps × {ROUNDINGS_PER_OP[device]}"
    )


@pytest.mark.parametrize(
    "dtype, computed",
    [(torch.bfloat16, torch.bfloat16), (torch.float16, torch.float32)],
    ids=["bfloat16", "float16"],
)
def test_sdpa_computes_in_the_dtype_that_holds_the_sink_identity(dtype, computed, monkeypatch):
    """bfloat16 q, k, v reach both SDPA calls as they are (only the per-row statistics go to float32: no N×N float32
    work); float16 ones as float32 (float16's range cannot hold the sink identity's intermediates). The output comes
    back in the input dtype."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def recording(query, key, value, *args, **kwargs):
        seen.append((query.dtype, key.dtype, value.dtype))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_hyperset.F, "scaled_dot_product_attention", recording)
    q, k, v, keep = symmetric_heads(16, dtype, padded=True)
    out, _ = sdpa_bisoftmax_attention(q, k, v, keep)
    assert out.dtype == dtype
    assert seen == [(computed,) * 3] * 2, seen


def exact_bisoftmax_gradients(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None, weights: torch.Tensor
) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Gradients in q, k, v of Σ weights ⊙ (R + C) v in float64 by autograd through the definition, and the size
    of the sum each gradient entry is (its terms in absolute value): dS = R ⊙ (dP − δʳ) + C ⊙ (dP − δᶜ) with
    dP = weights vᵀ, so |dS| ≤ R (|dP| + |δʳ|) + C (|dP| + |δᶜ|), and dq = dS k, dk = dSᵀ q, dv = (R + C)ᵀ weights."""
    leaves = [x.detach().double().requires_grad_() for x in (q, k, v)]
    exact, _ = exact_bisoftmax(*leaves, keep)
    grads = list(torch.autograd.grad((exact * weights.double()).sum(), leaves))
    q, k, v, weights = (x.detach().double() for x in (q, k, v, weights))
    scores = q @ k.transpose(-1, -2)
    if keep is None:
        row, col = scores.softmax(-1), scores.softmax(-2)
    else:
        key_keep = keep[:, None, None, :].to(q.device)
        row = scores.masked_fill(~key_keep, -torch.inf).softmax(-1)
        col = scores.masked_fill(~key_keep.transpose(-1, -2), -torch.inf).softmax(-2).nan_to_num() * key_keep
    d_probs = weights @ v.transpose(-1, -2)
    d_row = (row * d_probs).sum(-1, keepdim=True).abs()
    d_col = (col * d_probs).sum(-2, keepdim=True).abs()
    d_scores = row * (d_probs.abs() + d_row) + col * (d_probs.abs() + d_col)
    sizes = [
        d_scores @ k.abs(),
        d_scores.transpose(-1, -2) @ q.abs(),
        (row + col).transpose(-1, -2) @ weights.abs(),
    ]
    return grads, sizes


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("padded", [False, True], ids=["full", "padded"])
@pytest.mark.parametrize("magnitude", [8, 16, 32, 64])
def test_sdpa_float16_backward_is_finite_and_within_a_rounding(magnitude, padded, device):
    """Float16 gradients in q, k and v within one float16 eps of the size of each entry's sum (its terms in
    absolute value, `exact_bisoftmax_gradients`), as the forward is held to the size of its sums.

    The weights of the loss are float16 numbers, so the gradient reaching the output is exact. The cast of each
    gradient back to float16 rounds by half an eps of the entry (at most half an eps of its size), or by half the
    subnormal spacing 2⁻²⁴ below float16's normal range; the float32 work in between must stay under the other
    half eps. Before SDPA ran float16 in float32 they were 5 to 9 such eps off at |S| ≈ 8, NaN from 16 (padded)
    or 24.
    """
    q, k, v, keep = symmetric_heads(magnitude, torch.float16, padded)
    q, k, v = (x.to(device).requires_grad_() for x in (q, k, v))
    keep = None if keep is None else keep.to(device)
    weights = torch.randn(q.shape, generator=torch.Generator().manual_seed(1)).half().to(device)
    out, _ = sdpa_bisoftmax_attention(q, k, v, keep)
    grads = torch.autograd.grad((out.double() * weights.double()).sum(), (q, k, v))
    exact, sizes = exact_bisoftmax_gradients(q, k, v, keep, weights)
    for name, got, want, size in zip("qkv", grads, exact, sizes):
        assert got.dtype == torch.float16 and got.isfinite().all(), (
            f"d{name} at |S| ≈ {magnitude}: not finite"
        )
        error = (got.double() - want).abs()
        subnormal = torch.finfo(torch.float16).smallest_normal * torch.finfo(torch.float16).eps
        allowed = rounding(torch.float16, 1, size) + subnormal / 2
        at = (error - allowed).argmax()
        assert (error <= allowed).all(), (
            f"d{name} at |S| ≈ {magnitude}: error {error.flatten()[at].item():.4g} > allowed "
            f"{allowed.flatten()[at].item():.4g} (exact {want.flatten()[at].item():.4g}, sum size "
            f"{size.flatten()[at].item():.4g}); worst error per sum size "
            f"{(error / size).max().item() / torch.finfo(torch.float16).eps:.3g} float16 eps"
        )


@pytest.mark.parametrize("device", DEVICES)
@pytest.mark.parametrize("magnitude", [16, 32, 64])
def test_sdpa_under_float16_autocast_is_finite_and_accurate(magnitude, device):
    """The model's q, k, v under float16 autocast are float32 (its RMSNorm runs in float32) and autocast would cast
    SDPA to float16; the sdpa path runs them in float32 instead: output within the float16 test's bound above (a
    float16 user's accuracy, at least) of the exact result, in the inputs' float32. Before, NaN from |S| ≈ 32."""
    q, k, v, keep = symmetric_heads(magnitude, torch.float32, padded=True)
    q, k, v, keep = q.to(device), k.to(device), v.to(device), keep.to(device)
    with torch.autocast(device, dtype=torch.float16):
        out, _ = sdpa_bisoftmax_attention(q, k, v, keep)
    assert out.dtype == torch.float32
    exact, size = exact_bisoftmax(q, k, v, keep)
    error = (out.double() - exact).abs()
    allowed = rounding(torch.float16, 4 * ROUNDINGS_PER_OP[device], 1.0) * size
    assert (error <= allowed).all(), (
        f"float16 autocast at |S| ≈ {magnitude}: worst error {error.max().item():.4g} (sum size "
        f"{size.flatten()[error.argmax()].item():.4g}) > allowed 4 float16 eps × {ROUNDINGS_PER_OP[device]}"
    )
