"""Loading a checkpoint whose weights file is unreadable names the file and says what is wrong.

Every family's heads and base models (tests/fixtures.py `Case`s) and the looped-Transformer baseline's, through the
model class and through the Auto class the family registers it with.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from fixtures import ALL, Case, looped_transformer_config

from energyformers import BASELINES


def _baseline_models() -> list[tuple[str, type, str]]:
    """(Auto class name, model class, input type) of every looped-Transformer baseline class."""
    rows = []
    for auto_name, model_class in BASELINES["looped-transformer"].heads.items():
        if auto_name == "AutoModel":
            rows += [(auto_name, model_class, "image"), (auto_name, model_class, "sequence")]
        else:
            # the masked-image-modelling head reads code ids: a sequence model
            rows.append(
                (auto_name, model_class, "image" if "ImageClassification" in auto_name else "sequence")
            )
    return rows


def _build(model: Case | tuple[str, type, str]) -> tuple[torch.nn.Module, str]:
    """A tiny model of a fixtures `Case` or a baseline row, and the Auto class name that loads it."""
    if isinstance(model, Case):
        return model.build(), model.auto_name
    auto_name, model_class, input_type = model
    torch.manual_seed(0)
    return model_class(looped_transformer_config(input_type)), auto_name


MODELS = [*ALL, *_baseline_models()]


def _name(model: Case | tuple[str, type, str]) -> str:
    return str(model) if isinstance(model, Case) else f"{model[1].__name__}-{model[2]}"


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])  # the header is intact, the tensor data it lists is cut off


def _garble_header(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[8:16] = b"\xff" * 8  # the JSON header after its 8-byte length no longer parses
    path.write_bytes(bytes(data))


@pytest.mark.parametrize("damage", [_truncate, _garble_header], ids=["truncated", "garbled-header"])
@pytest.mark.parametrize("model", MODELS, ids=_name)
def test_unreadable_safetensors_names_the_file(tmp_path, model, damage):
    built, auto_name = _build(model)
    built.save_pretrained(tmp_path)
    weights = tmp_path / "model.safetensors"
    damage(weights)
    for loader in (type(built), getattr(transformers, auto_name)):
        with pytest.raises(OSError) as raised:
            loader.from_pretrained(tmp_path)
        message = str(raised.value)
        assert str(weights) in message, f"{loader.__name__}: the message does not name {weights}: {message}"
        assert "not a readable safetensors file" in message and "re-download" in message, message
        cause = raised.value.__cause__
        assert type(cause).__name__ == "SafetensorError", f"{loader.__name__}: chained {type(cause)!r}"
        assert str(cause) in message, f"the original message {str(cause)!r} is missing from {message!r}"


def test_other_loading_errors_pass_through_unchanged(tmp_path):
    # only unreadable safetensors are reworded: a folder without weights keeps transformers' own error
    model, _ = _build(ALL[0])
    model.config.save_pretrained(tmp_path)
    with pytest.raises(OSError) as raised:
        type(model).from_pretrained(tmp_path)
    assert "not a readable safetensors file" not in str(raised.value), str(raised.value)
    assert raised.value.__cause__ is None or type(raised.value.__cause__).__name__ != "SafetensorError"
