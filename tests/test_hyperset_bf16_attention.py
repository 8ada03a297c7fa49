"""Hyper-SET's `"sdpa"` bi-softmax in half precision: its log-sum-exp arithmetic runs in float32.

The sdpa path recovers the row and column log-sum-exps ℓ = s + log a − log p from a sink key of score s (tens at
large scores) and two SDPA outputs a, p. Done in bfloat16, s + log a − log p is rounded to a few bits after the
point: an absolute error of a sizeable fraction of a unit in ℓ, so a relative error of that size in every weight
e^{S − ℓ}, growing with the scores. In float32 only the roundings of SDPA's own inputs and outputs are left, a
fixed number of units in the last place of the output whatever the scores. These tests compare against the exact
bi-softmax of the same (rounded) inputs in float64, at several score magnitudes.
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
    # float16 only up to 8: from about 16 the sink score (a bound on the largest score) sits so far above the
    # log-sum-exp that SDPA's sums fall below float16's normal range, and from about 32 the column weights
    # e^{max ℓᶜ − ℓᶜ_j} folded into the values overflow it; bfloat16 has float32's range
    [(torch.bfloat16, m) for m in (4, 16, 32, 64)] + [(torch.float16, m) for m in (4, 8)],
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
    bfloat16 the error grows with the scores, to tens of eps at magnitude 64.
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


def test_sdpa_runs_in_the_input_dtype(monkeypatch):
    """Only the per-row statistics go to float32: both SDPA calls take bfloat16 q, k, v (no N×N float32 work)."""
    seen = []
    sdpa = F.scaled_dot_product_attention

    def recording(query, key, value, *args, **kwargs):
        seen.append((query.dtype, key.dtype, value.dtype))
        return sdpa(query, key, value, *args, **kwargs)

    monkeypatch.setattr(modeling_hyperset.F, "scaled_dot_product_attention", recording)
    q, k, v, keep = symmetric_heads(16, torch.bfloat16, padded=True)
    out, _ = sdpa_bisoftmax_attention(q, k, v, keep)
    assert out.dtype == torch.bfloat16
    assert seen == [(torch.bfloat16,) * 3] * 2, seen
