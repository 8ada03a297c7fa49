"""Integer counts and seeds of the public functions of `energyformers.energy`, `energyformers.mim`, the
masked-image-modelling pipeline and the model's MaskGIT `decode` take any integer, numpy's included (a sweep over `np.arange` hands out `np.int64`),
give what the Python int gives and keep it as that int; a bool, a float or a string is still refused by name."""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import pytest
import torch
from fixtures import tiny_mim_model

from energyformers import energy
from energyformers.mim import PatchKMeansTokenizer
from energyformers.pipelines import MaskedImageModelingPipeline

STATE = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))  # (B, N_q, H·d_h)
STORED = torch.randn(2, 5, 8, generator=torch.Generator().manual_seed(1))  # (B, N_k, H·d_h)
PIXELS = torch.rand(4, 1, 8, 8, generator=torch.Generator().manual_seed(2))


@functools.cache
def mim_pipeline() -> MaskedImageModelingPipeline:
    tokenizer = PatchKMeansTokenizer(
        torch.rand(8, 4, generator=torch.Generator().manual_seed(3)), 2, (8, 8), 1
    )
    return MaskedImageModelingPipeline(model=tiny_mim_model("hyperset").eval(), vq_tokenizer=tokenizer)


def attention(**sizes: Any) -> tuple[torch.Tensor, list]:
    torch.manual_seed(0)
    module = energy.EnergyAttention(**{"hidden_size": 8, "num_heads": 2, "num_steps": 2, **sizes})
    return module(STATE)[0], [module.num_heads, module.num_steps, module.head_dim]


def tokenizer(**sizes: Any) -> tuple[torch.Tensor, list]:
    arguments = {"patch_size": 2, "num_channels": 1, **sizes}
    made = PatchKMeansTokenizer(
        torch.rand(8, 4, generator=torch.Generator().manual_seed(3)), image_size=(8, 8), **arguments
    )
    return made.encode(PIXELS), [made.patch_size, made.num_channels]


def fitted(codebook_size: Any) -> tuple[torch.Tensor, list]:
    made = PatchKMeansTokenizer.fit(PIXELS, patch_size=2, codebook_size=codebook_size, seed=0, n_init=1)
    return made.centroids, [made.codebook_size]


def reconstructed(**call: Any) -> tuple[torch.Tensor, list]:
    image = (PIXELS[0, 0] * 255).round().to(torch.uint8).numpy()
    return mim_pipeline()(image, mask_ratio=0.5, **call)["codes"], []


def decoded(**call: Any) -> tuple[torch.Tensor, list]:
    model = mim_pipeline().model
    masked = torch.full((1, model.config.max_position_embeddings), model.mask_token_id)  # (B, N): all [MASK]
    return model.decode(masked, **call).codes, []


def descent(max_steps: Any) -> tuple[torch.Tensor, list]:
    result = energy.minimize_energy(lambda x: energy.hopfield_energy(x, STORED), STATE, max_steps=max_steps)
    return result.state, [result.steps]


# (what, call(value) -> (output, ints it keeps), a valid value, the refusal's words)
CASES: list[tuple[str, Callable[[Any], tuple[Any, list]], int, str]] = [
    (
        "hopfield_energy num_heads",
        lambda n: (energy.hopfield_energy(STATE, STORED, num_heads=n), []),
        2,
        "num_heads",
    ),
    (
        "hopfield_gradient num_heads",
        lambda n: (energy.hopfield_gradient(STATE, STORED, num_heads=n), []),
        2,
        "num_heads",
    ),
    ("minimize_energy max_steps", descent, 3, "max_steps"),
    ("EnergyAttention hidden_size", lambda n: attention(hidden_size=n), 8, "hidden_size"),
    ("EnergyAttention num_heads", lambda n: attention(num_heads=n), 2, "num_heads"),
    ("EnergyAttention num_steps", lambda n: attention(num_steps=n), 3, "num_steps"),
    (
        "EnergyAttention.forward num_steps",
        lambda n: (energy.EnergyAttention(8, 2)(STATE, num_steps=n)[1].shape, []),
        3,
        "num_steps",
    ),
    ("PatchKMeansTokenizer patch_size", lambda n: tokenizer(patch_size=n), 2, "patch_size"),
    ("PatchKMeansTokenizer num_channels", lambda n: tokenizer(num_channels=n), 1, "num_channels"),
    ("PatchKMeansTokenizer.fit codebook_size", fitted, 4, "codebook_size"),
    ("MaskedImageModelingPipeline seed", lambda n: reconstructed(seed=n), 5, "seed"),
    ("MaskedImageModelingPipeline steps", lambda n: reconstructed(steps=n, seed=0), 3, "steps"),
    ("decode seed", lambda n: decoded(seed=n), 5, "seed"),
    ("decode steps", lambda n: decoded(steps=n, seed=0), 3, "steps"),
]
IDS = [case[0] for case in CASES]


def same(got: Any, expected: Any) -> bool:
    if isinstance(expected, torch.Tensor):
        return isinstance(got, torch.Tensor) and torch.equal(got, expected)
    if isinstance(expected, (tuple, list)):
        return len(got) == len(expected) and all(same(a, b) for a, b in zip(got, expected))
    return got == expected


@pytest.mark.parametrize("integer", [np.int64, np.int32, np.uint8])
@pytest.mark.parametrize(("what", "call", "value", "name"), CASES, ids=IDS)
def test_numpy_integers_are_taken_as_the_int(what, call, value, name, integer):
    expected, _ = call(value)
    got, kept = call(integer(value))
    assert same(got, expected), f"{what}={integer.__name__}({value}) gave another result than {value}"
    assert all(type(number) is int for number in kept), f"{what}: kept {[type(n).__name__ for n in kept]}"


@pytest.mark.parametrize("bad", [True, 2.0, "2"], ids=["bool", "float", "str"])
@pytest.mark.parametrize(("what", "call", "value", "name"), CASES, ids=IDS)
def test_bools_floats_and_strings_are_still_refused_by_name(what, call, value, name, bad):
    with pytest.raises(ValueError, match=rf"^{name} must be (None or )?an integer .*; got {bad!r}\.$"):
        call(bad)
