"""Choice fields read after the model is built: `_init_weights` (run again by `model.apply(model._init_weights)` to
re-initialise a built model) reads them through the config's tables, so a value edited onto `model.config` after the
build raises, naming the field and value, instead of initialising the other input type's or position table's model."""

from __future__ import annotations

import re

import pytest
import torch
from fixtures import hyperbf_config, hyperset_config, imixer_config, looped_transformer_config

from energyformers import (
    HyperBFModel,
    HyperSetModel,
    IMixerModel,
    LoopedTransformerModel,
)

MODELS = {
    "hyperset": (HyperSetModel, hyperset_config),
    "imixer": (IMixerModel, imixer_config),
    "hyperbf": (HyperBFModel, hyperbf_config),
    "looped-transformer": (LoopedTransformerModel, looped_transformer_config),
}


def refused(config: object, name: str, value: str) -> str:
    return re.escape(f"{type(config).__name__}: invalid {name}={value!r}; expected one of")


@pytest.mark.parametrize("input_type", ["image", "sequence"])
@pytest.mark.parametrize("family", list(MODELS))
def test_init_weights_refuses_an_input_type_edited_after_the_build(family: str, input_type: str) -> None:
    model_class, config = MODELS[family]
    torch.manual_seed(0)
    model = model_class(config(input_type))
    # each family's _init_weights tests one of the two names, so a misspelling of either must raise, not fall through
    for value in ("images", "sequences"):
        model.config.input_type = value
        with pytest.raises(ValueError, match=refused(model.config, "input_type", value)):
            model.apply(model._init_weights)


@pytest.mark.parametrize("family", ["hyperset", "looped-transformer"])
def test_init_weights_refuses_a_position_table_edited_after_the_build(family: str) -> None:
    """The fixed position table is rebuilt by `_init_weights` (it is not in checkpoints): a misspelt "sincos-2d"
    must not write the 1-D sinusoid into a row/column model's buffer."""
    model_class, config = MODELS[family]
    torch.manual_seed(0)
    model = model_class(config("sequence", position_embedding_type="sincos-2d"))
    assert model.config.position_embedding_type == "sincos-2d", model.config.position_embedding_type
    table = model.embeddings.position_encoding.clone()
    model.config.position_embedding_type = "sincos2d"
    with pytest.raises(ValueError, match=refused(model.config, "position_embedding_type", "sincos2d")):
        model.apply(model._init_weights)
    assert torch.equal(model.embeddings.position_encoding, table), (
        "the position table changed before the refusal"
    )


@pytest.mark.parametrize("family", list(MODELS))
def test_init_weights_of_an_unedited_config_runs(family: str) -> None:
    """The same reads with the checked values: re-initialising a built model still works for both input types."""
    model_class, config = MODELS[family]
    for input_type in ("image", "sequence"):
        torch.manual_seed(0)
        model = model_class(config(input_type))
        model.apply(model._init_weights)
