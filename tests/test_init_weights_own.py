"""Each family initialises every module in its own `_init_weights`: none hands modules to transformers' generic
`PreTrainedModel._init_weights`, whose choices (distributions, which module types it knows) belong to transformers
and may change between its releases, so a family's initial weights would change with them."""

from __future__ import annotations

import pytest
import torch
from fixtures import hyperbf_config, hyperset_config, imixer_config, looped_transformer_config
from transformers import PreTrainedModel

from energyformers import (
    HyperBFForImageClassification,
    HyperBFForSequenceClassification,
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    IMixerForImageClassification,
    IMixerForSequenceClassification,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
)

HEADS = {
    "hyperset": (HyperSetForImageClassification, HyperSetForSequenceClassification, hyperset_config),
    "imixer": (IMixerForImageClassification, IMixerForSequenceClassification, imixer_config),
    "hyperbf": (HyperBFForImageClassification, HyperBFForSequenceClassification, hyperbf_config),
    "looped-transformer": (
        LoopedTransformerForImageClassification,
        LoopedTransformerForSequenceClassification,
        looped_transformer_config,
    ),
}


@pytest.mark.parametrize("input_type", ["image", "sequence"])
@pytest.mark.parametrize("family", list(HEADS))
def test_init_weights_does_not_use_the_generic_transformers_init(
    family: str, input_type: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    image_head, sequence_head, config = HEADS[family]
    head = image_head if input_type == "image" else sequence_head
    handed_over = []

    def generic(self: PreTrainedModel, module: torch.nn.Module) -> None:
        handed_over.append(type(module).__name__)

    monkeypatch.setattr(PreTrainedModel, "_init_weights", generic)
    torch.manual_seed(0)
    model = head(config(input_type))
    model.apply(model._init_weights)
    assert handed_over == [], f"modules handed to PreTrainedModel._init_weights: {sorted(set(handed_over))}"
