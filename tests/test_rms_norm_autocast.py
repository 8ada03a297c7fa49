"""Hyper-SET's and the looped baseline's RMSNorms under autocast: computed in float32 on every device, as CUDA's
autocast computes `rms_norm`, so a bfloat16 autocast forward on CPU (`--bf16` there) warns of no input/weight dtype
mismatch; without autocast, and in float32, they are `nn.RMSNorm` bit for bit."""

from __future__ import annotations

import warnings
from collections.abc import Iterator

import pytest
import torch
import torch.nn.functional as F
from fixtures import hyperset_config, looped_transformer_config

from energyformers import (
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    LoopedTransformerForImageClassification,
)
from energyformers.modeling.modeling_hyperset import HyperSetRMSNorm

MISMATCH = "Mismatch dtype between input and weight"


@pytest.fixture
def every_torch_warning() -> Iterator[None]:
    """torch gives its C++ warnings once per process: show each, so an earlier test cannot hide one."""
    before = torch.is_warn_always_enabled()
    torch.set_warn_always(True)
    try:
        yield
    finally:
        torch.set_warn_always(before)


def rms_norms(seed: int = 0) -> tuple[torch.nn.RMSNorm, HyperSetRMSNorm]:
    """torch's RMSNorm and ours with the same (non-trivial) weight."""
    weight = torch.rand(16, generator=torch.Generator().manual_seed(seed)) + 0.5
    theirs, ours = torch.nn.RMSNorm(16, eps=1e-6), HyperSetRMSNorm(16, eps=1e-6)
    with torch.no_grad():
        theirs.weight.copy_(weight)
        ours.weight.copy_(weight)
    return theirs, ours


MODELS = {
    # every place an RMSNorm sits: the feedforward's n_M, the step-size network's norms, the classifier's norm
    "hyperset-step-rmsnorm": lambda: HyperSetForImageClassification(
        hyperset_config("image", step_size_norm="rmsnorm", classifier_norm="rmsnorm")
    ),
    "hyperset-step-rmsnorm-sum": lambda: HyperSetForSequenceClassification(
        hyperset_config("sequence", step_size_norm="rmsnorm-sum", classifier_norm="rmsnorm")
    ),
    "looped-transformer": lambda: LoopedTransformerForImageClassification(
        looped_transformer_config("image", classifier_norm="rmsnorm")
    ),
}


@pytest.mark.parametrize("name", list(MODELS))
def test_a_bf16_autocast_training_step_on_cpu_warns_of_no_dtype_mismatch(
    name: str, every_torch_warning
) -> None:
    torch.manual_seed(0)
    model = MODELS[name]()
    # each model's config asks for the classifier's RMSNorm: a config that lost the override would test a LayerNorm
    assert isinstance(model.layernorm, HyperSetRMSNorm), f"{name}: classifier norm {model.layernorm}"
    generator = torch.Generator().manual_seed(1)
    if model.config.input_type == "image":
        inputs = {"pixel_values": torch.randn(2, 1, 8, 8, generator=generator)}
    else:
        inputs = {"input_ids": torch.randint(0, 20, (2, 7), generator=generator)}
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        with torch.autocast("cpu", dtype=torch.bfloat16):
            outputs = model(**inputs, labels=torch.tensor([0, 1]))
        outputs.loss.backward()
    mismatches = [str(w.message) for w in caught if MISMATCH in str(w.message)]
    assert not mismatches, f"{name}: {len(mismatches)} warning(s), first: {mismatches[:1]}"
    assert torch.isfinite(outputs.loss), outputs.loss


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64, torch.bfloat16])
def test_without_autocast_it_is_torchs_rms_norm_bit_for_bit(dtype: torch.dtype) -> None:
    theirs, ours = rms_norms()
    theirs, ours = theirs.to(dtype), ours.to(dtype)
    x = (torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(2), dtype=torch.float64) * 3).to(dtype)
    expected, got = theirs(x), ours(x)
    assert got.dtype == expected.dtype == dtype
    assert torch.equal(got, expected), f"{dtype}: largest difference {(got - expected).abs().max().item()}"


def test_under_autocast_float32_inputs_are_untouched_and_half_inputs_normalised_in_float32(
    every_torch_warning,
) -> None:
    theirs, ours = rms_norms()
    x = torch.randn(3, 5, 16, generator=torch.Generator().manual_seed(3)) * 3
    with torch.autocast("cpu", dtype=torch.bfloat16):
        assert torch.equal(ours(x), theirs(x)), "float32 input under autocast: not nn.RMSNorm's result"
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            got = ours(x.bfloat16())
    # CUDA autocast's float32 policy for rms_norm: the bfloat16 input cast up, float32 weight, float32 result
    expected = F.rms_norm(x.bfloat16().float(), (16,), ours.weight, 1e-6)
    assert got.dtype == torch.float32, got.dtype
    assert torch.equal(got, expected), f"largest difference {(got - expected).abs().max().item()}"
    assert not [w for w in caught if MISMATCH in str(w.message)], [str(w.message) for w in caught]
