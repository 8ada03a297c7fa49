"""The fixture's VQGAN weights, as a pure function of each tensor's name and shape.

The reference checkpoint is not committed (a taming VQGAN at its smallest legal width, GroupNorm's 32 channels, is
close to a megabyte of float32); both `generate.py` and the test build the same tensors from the manifest of names
and shapes with this rule. It uses integer arithmetic and correctly rounded float64 operations only, so the values
are identical on every platform and torch version, and none is zero.
"""

from __future__ import annotations

import math
import zlib

import torch

_MASK = (1 << 32) - 1


def _integers(name: str, count: int) -> torch.Tensor:
    """`count` pseudo-random integers in [−31, 31] \\ {0} (a 32-bit multiply-xorshift hash of index and name)."""
    seed = zlib.crc32(name.encode())
    h = (torch.arange(count, dtype=torch.int64) * 2654435761 + seed) & _MASK
    h = ((h ^ (h >> 15)) * 2246822519) & _MASK
    h = ((h ^ (h >> 13)) * 3266489917) & _MASK
    h = h ^ (h >> 16)
    values = h % 63 - 31
    return torch.where(values == 0, torch.full_like(values, 32), values)


def fixture_tensor(name: str, shape: list[int], codebook_scale: float) -> torch.Tensor:
    """float32 tensor for `name`: GroupNorm gains near 1, biases small, weights ~ U(−1, 1)/√fan_in, the codebook
    scaled to the spread of the encoder's latents so that the codes vary."""
    count = math.prod(shape)
    unit = _integers(name, count).to(torch.float64) / 32.0  # in [−1, 1], never 0
    leaf = name.rsplit(".", 1)[-1]
    if name.endswith("quantize.embedding.weight"):
        values = unit * codebook_scale
    elif len(shape) == 1 and leaf == "weight":  # GroupNorm gain
        values = 1.0 + unit / 4.0
    elif len(shape) <= 1:  # bias (or a scalar such as the loss's log-variance)
        values = unit / 8.0
    else:
        values = unit / math.sqrt(count // shape[0])
    return values.to(torch.float32).reshape(shape)
