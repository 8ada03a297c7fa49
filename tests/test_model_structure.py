"""Structure of the model and configuration files: one class-level `forward` per model, no field deleted from a
config, and what the code before these rules wrote (tests/data/old_models, tests/data/configs; written by
tests/data/old_models/generate.py) still loads to the same config and the same outputs."""

from __future__ import annotations

import ast
import inspect
import json
import pathlib

import pytest
import torch
from fixtures import ALL, assert_close_to_scale, compact_labels
from safetensors.torch import load_file

from energyformers import (
    BASELINES,
    FAMILIES,
    HyperBFConfig,
    HyperSetConfig,
    IMixerConfig,
    LoopedTransformerConfig,
)

ROOT = pathlib.Path(__file__).resolve().parents[1]
DATA = pathlib.Path(__file__).resolve().parent / "data"
CONFIG_CLASSES = {
    "hyperset": HyperSetConfig,
    "imixer": IMixerConfig,
    "hyperbf": HyperBFConfig,
    "looped-transformer": LoopedTransformerConfig,
}
OLD_MODELS = sorted(path.name for path in (DATA / "old_models").iterdir() if path.is_dir())


def expand(config_dict: dict) -> dict:
    """The inverse of `compact_labels`: a config.json as the old code wrote it."""
    out = dict(config_dict)
    if isinstance(out.get("id2label"), str):
        count = int(out["id2label"].split()[3])
        out["id2label"] = {str(i): f"LABEL_{i}" for i in range(count)}
        out["label2id"] = {f"LABEL_{i}": i for i in range(count)}
    return out


def _without_version(config_dict: dict) -> dict:
    return {k: v for k, v in config_dict.items() if k != "transformers_version"}


def _preset_records() -> list[tuple[str, str, dict]]:
    return [
        (family, name, record)
        for family in CONFIG_CLASSES
        for name, record in json.loads((DATA / "configs" / f"{family}.json").read_text()).items()
    ]


@pytest.mark.parametrize(
    ("family", "preset", "record"), _preset_records(), ids=lambda v: v if isinstance(v, str) else ""
)
def test_old_config_json_loads_to_the_same_config_and_presets_write_the_same_json(family, preset, record):
    config_class = CONFIG_CLASSES[family]
    loaded = config_class.from_dict(expand(record["config_json"]))
    loaded_dict = _without_version(compact_labels(json.loads(loaded.to_json_string(use_diff=False))))
    # Fields added since the fixture was written appear with their defaults (which keep the old behaviour); any
    # other difference means the old config.json now reads as another config.
    defaults = config_class().to_dict()
    added = {k: v for k, v in loaded_dict.items() if k not in record["to_dict"]}
    assert added == {k: defaults[k] for k in added}, f"{family} preset {preset!r}: new fields not at defaults"
    assert {k: v for k, v in loaded_dict.items() if k not in added} == _without_version(record["to_dict"]), (
        f"{family} preset {preset!r}: the old config.json loads to another config"
    )
    rebuilt = config_class.from_preset(preset, **record["overrides"])
    written = _without_version(compact_labels(json.loads(rebuilt.to_json_string(use_diff=True))))
    assert {k: v for k, v in written.items() if k not in added} == _without_version(record["config_json"]), (
        f"{family} preset {preset!r}: config.json keys or values changed"
    )


def _imixer_slots_at_input_positions(slots: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """An iMixer sequence state as the old code returned it, on its S token-mixing slots `(B, S, D)` (the real
    tokens first, in order, then pad slots), moved to the input positions `(B, L, D)` where the model now returns it:
    a real token's state from the slot of its rank, a padded position's from the first pad slot."""
    keep = attention_mask.bool()
    lengths = keep.sum(1, keepdim=True)  # (B, 1); below S in the recorded batch, so there is a pad slot
    positions = torch.where(keep, keep.long().cumsum(1) - 1, lengths)  # (B, L)
    return slots.gather(1, positions.unsqueeze(-1).expand(-1, -1, slots.shape[-1]))


@pytest.mark.parametrize("name", OLD_MODELS)
def test_model_saved_by_the_old_code_loads_with_identical_outputs(name):
    folder = DATA / "old_models" / name
    class_name = name.split("-")[-2]  # <family>-<class>-<input type>
    heads = {
        head.__name__: head for spec in {**FAMILIES, **BASELINES}.values() for head in spec.heads.values()
    }
    model = heads[class_name].from_pretrained(folder).eval()
    expected = load_file(str(folder / "expected.safetensors"))
    inputs = {
        key.removeprefix("input."): value for key, value in expected.items() if key.startswith("input.")
    }
    with torch.no_grad():
        out = model(**inputs, return_dict=True)
    for key, value in expected.items():
        if key.startswith("output."):
            got = out[key.removeprefix("output.")]
            if name == "imixer-IMixerModel-sequence" and key == "output.last_hidden_state":
                value = _imixer_slots_at_input_positions(value, inputs["attention_mask"])
            # same weights and inputs; an implementation may now sum in another order (the looped baseline's
            # attention goes through transformers' SDPA function), so a few epsilons of the output's scale
            assert_close_to_scale(got, value, 16 * torch.finfo(value.dtype).eps, f"{name} {key}")


def _model_classes() -> list[type]:
    return sorted(
        {head for spec in {**FAMILIES, **BASELINES}.values() for head in spec.heads.values()},
        key=lambda c: c.__name__,
    )


@pytest.mark.parametrize("case", ALL, ids=str)
def test_no_model_rebinds_forward_on_the_instance(case):
    model = case.build()
    assert "forward" not in model.__dict__, f"{case}: forward is bound on the instance"
    assert "forward" not in model.base_model.__dict__, (
        f"{case}: the backbone's forward is bound on the instance"
    )


def test_no_modeling_file_assigns_self_forward():
    for path in sorted((ROOT / "modeling").glob("modeling_*.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Assign):
                for target in node.targets:
                    assert not (
                        isinstance(target, ast.Attribute)
                        and target.attr == "forward"
                        and isinstance(target.value, ast.Name)
                        and target.value.id == "self"
                    ), f"{path.name}:{node.lineno} assigns self.forward"


def test_no_configuration_file_deletes_a_field():
    for path in sorted((ROOT / "configuration").glob("configuration_*.py")):
        calls = [
            node.lineno
            for node in ast.walk(ast.parse(path.read_text()))
            if isinstance(node, ast.Call) and isinstance(node.func, ast.Name) and node.func.id == "delattr"
        ]
        assert not calls, f"{path.name} calls delattr on lines {calls}"


def test_every_base_model_and_head_has_one_class_level_forward():
    for model_class in _model_classes():
        assert "forward" in vars(model_class) or any(
            "forward" in vars(base) for base in model_class.__mro__[1:-1]
        )
        assert not hasattr(model_class, "forward_images") and not hasattr(model_class, "forward_tokens"), (
            f"{model_class.__name__} keeps per-modality entry points"
        )


def test_every_classifier_head_shares_one_call_contract():
    """A reader of one head knows every head: `classify` takes (labels, return_dict) by position and everything else,
    `num_items_in_batch` first, by keyword only (an old positional call fails instead of meaning something else); every head declares whether it is per token and has
    `check_call_arguments` (a no-op unless the head overrides it), which the pipelines and `predict` call."""
    heads = [model_class for model_class in _model_classes() if hasattr(model_class, "classify")]
    assert {head.__module__.rpartition(".")[2] for head in heads} == {
        "modeling_hyperset",
        "modeling_imixer",
        "modeling_hyperbf",
        "modeling_looped_transformer",
    }
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    for head in heads:
        parameters = list(inspect.signature(head.classify).parameters.values())[1:]  # after self
        leading = [parameter.name for parameter in parameters if parameter.kind in positional]
        keyword = [p.name for p in parameters if p.kind == inspect.Parameter.KEYWORD_ONLY]
        assert leading == ["labels", "return_dict"] and keyword[:1] == ["num_items_in_batch"], (
            f"{head.__name__}.classify: positional {leading}, keyword-only {keyword}"
        )
        assert isinstance(head._per_token, bool), f"{head.__name__}._per_token = {head._per_token!r}"
        assert callable(getattr(head, "check_call_arguments", None)), (
            f"{head.__name__}: no check_call_arguments"
        )
    # the function the recurrent-depth heads' `classify` calls, alike: the same arguments by keyword only
    from energyformers.modeling.modeling_hyperset import run_head

    parameters = list(inspect.signature(run_head).parameters.values())
    leading = [parameter.name for parameter in parameters if parameter.kind in positional]
    keyword = [p.name for p in parameters if p.kind == inspect.Parameter.KEYWORD_ONLY]
    assert leading == ["head", "backbone", "labels", "backbone_inputs"] and keyword[:1] == [
        "num_items_in_batch"
    ], f"run_head: positional {leading}, keyword-only {keyword}"
