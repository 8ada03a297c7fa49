"""Writes the old-code fixtures of tests/test_model_structure.py; run once, from the repository root, on the code
whose checkpoints must keep loading (it was run on commit 19846ef, before the class-level `forward` and the shared
recurrent-depth base):

    HF_HUB_OFFLINE=1 python tests/data/old_models/generate.py

tests/data/old_models/<case>/ holds a tiny perturbed model saved with `save_pretrained` and `expected.safetensors`
(the inputs and that code's eval-mode outputs); tests/data/configs/<family>.json maps each preset name to the
config.json that code wrote (`config_json`) and the full `to_dict()` it had (`to_dict`).
"""

from __future__ import annotations

import json
import pathlib
import shutil
import sys

import torch
from safetensors.torch import save_file

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parents[1]))  # tests/, for fixtures

from fixtures import ALL, compact_labels, hyperset_config, perturb  # noqa: E402

from energyformers import BASELINES, HyperBFConfig, HyperSetConfig, IMixerConfig, LoopedTransformerConfig  # noqa: E402

PRESETS = {
    "hyperset": (HyperSetConfig, "HYPERSET_PRESETS", "energyformers.configuration.configuration_hyperset"),
    "imixer": (IMixerConfig, "IMIXER_PRESETS", "energyformers.configuration.configuration_imixer"),
    "hyperbf": (HyperBFConfig, "HYPERBF_PRESETS", "energyformers.configuration.configuration_hyperbf"),
    # the baseline has no presets of its own: it takes Hyper-SET's
    "looped-transformer": (
        LoopedTransformerConfig,
        "HYPERSET_PRESETS",
        "energyformers.configuration.configuration_hyperset",
    ),
}


def outputs_of(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    with torch.no_grad():
        out = model(**inputs, return_dict=True)
    named = {f"input.{k}": v for k, v in inputs.items()}
    for key in ("logits", "last_hidden_state", "pooler_output"):
        if getattr(out, key, None) is not None:
            named[f"output.{key}"] = out[key].contiguous()
    return named


def write_models() -> None:
    cases = [(f"{case.family}-{case.model_class.__name__}-{case.input_type}", case) for case in ALL]
    for name, case in cases:
        model = perturb(case.build(seed=0))
        folder = HERE / name
        shutil.rmtree(folder, ignore_errors=True)
        model.save_pretrained(folder)
        save_file(outputs_of(model, case.inputs(seed=0)), str(folder / "expected.safetensors"))
    # the baseline: the tiny Hyper-SET config's twin, each head with its input type
    heads = BASELINES["looped-transformer"].heads
    for auto_name, model_class in heads.items():
        if auto_name == "AutoModel":
            input_types = ["image", "sequence"]
        else:
            input_types = ["image"] if "Image" in auto_name else ["sequence"]
        for input_type in input_types:
            torch.manual_seed(0)
            config = LoopedTransformerConfig.from_hyperset(hyperset_config(input_type))
            model = perturb(model_class(config).eval())
            case = next(c for c in ALL if c.family == "hyperset" and c.auto_name == auto_name)
            case = type(case)("hyperset", auto_name, input_type)
            folder = HERE / f"looped-transformer-{model_class.__name__}-{input_type}"
            shutil.rmtree(folder, ignore_errors=True)
            model.save_pretrained(folder)
            save_file(outputs_of(model, case.inputs(seed=0)), str(folder / "expected.safetensors"))


def write_configs() -> None:
    import importlib

    for family, (config_class, table, module) in PRESETS.items():
        names = list(getattr(importlib.import_module(module), table))
        record = {}
        for name in names:
            # the CLI presets of sequences leave the vocabulary to the data: a fixed one here
            overrides = {"vocab_size": 30} if name == "cli-sequence" else {}
            if overrides and config_class is LoopedTransformerConfig:
                continue  # its from_preset passes overrides to the baseline, after Hyper-SET's preset failed
            config = config_class.from_preset(name, **overrides)
            record[name] = {
                "overrides": overrides,
                "config_json": compact_labels(json.loads(config.to_json_string(use_diff=True))),
                "to_dict": compact_labels(json.loads(config.to_json_string(use_diff=False))),
            }
        path = HERE.parent / "configs" / f"{family}.json"
        path.write_text(json.dumps(record, indent=1, sort_keys=True) + "\n")


if __name__ == "__main__":
    write_models()
    write_configs()
