"""Weights are safetensors only (ARCHITECTURE.md): every family's and the baseline's `from_pretrained` refuses a
folder whose weights only a pickle file holds, with one message naming the folder and the file, and
`save_pretrained` writes no pickle file."""

from __future__ import annotations

import pytest
import torch
from fixtures import Case, looped_transformer_config
from transformers import AutoModelForImageClassification

from energyformers import (
    HyperBFForImageClassification,
    HyperSetForImageClassification,
    IMixerForImageClassification,
    LoopedTransformerForImageClassification,
)

MODELS = {
    "hyperset": (
        HyperSetForImageClassification,
        lambda: Case.of(HyperSetForImageClassification, "image").config(),
    ),
    "hyperbf": (
        HyperBFForImageClassification,
        lambda: Case.of(HyperBFForImageClassification, "image").config(),
    ),
    "imixer": (IMixerForImageClassification, lambda: Case.of(IMixerForImageClassification, "image").config()),
    "looped-transformer": (
        LoopedTransformerForImageClassification,
        lambda: looped_transformer_config("image"),
    ),
}


@pytest.mark.parametrize("pickle_name", ["pytorch_model.bin", "model.pt"])
@pytest.mark.parametrize("family", list(MODELS))
def test_a_folder_with_only_pickle_weights_is_refused_by_name(family, pickle_name, tmp_path):
    model_class, config = MODELS[family]
    model = model_class(config())
    model.config.save_pretrained(tmp_path)
    torch.save(model.state_dict(), tmp_path / pickle_name)
    for load in (AutoModelForImageClassification.from_pretrained, model_class.from_pretrained):
        with pytest.raises(OSError) as raised:
            load(tmp_path)
        message = str(raised.value)
        assert f"{tmp_path} holds pickle weights ({pickle_name})" in message, (family, message)
        assert "safetensors only" in message, message


@pytest.mark.parametrize("family", list(MODELS))
def test_save_pretrained_writes_safetensors_and_no_pickle(family, tmp_path):
    model_class, config = MODELS[family]
    model_class(config()).save_pretrained(tmp_path)
    written = sorted(path.name for path in tmp_path.iterdir())
    assert written == ["config.json", "model.safetensors"], (family, written)
    reloaded = model_class.from_pretrained(tmp_path)
    assert type(reloaded) is model_class, family


def test_a_non_weight_pickle_is_not_named_as_weights(tmp_path):
    """Trainer's `training_args.bin` beside no weights: transformers' own missing-file error, not the pickle one."""
    model_class, config = MODELS["hyperset"]
    model_class(config()).config.save_pretrained(tmp_path)
    torch.save({"learning_rate": 1e-3}, tmp_path / "training_args.bin")
    with pytest.raises(OSError) as raised:
        model_class.from_pretrained(tmp_path)
    assert "pickle weights" not in str(raised.value), str(raised.value)
