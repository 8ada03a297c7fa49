"""Writes the model folders beside this file with the code of the commit named in README.md (run from the
repository root with that commit checked out): tiny Hyper-SET and looped-Transformer models, their config.json as
that code saved it, and `expected.safetensors` with the inputs and the outputs that code computed on CPU.

tests/test_attention_selection.py loads them with today's code and compares the outputs.
"""

from __future__ import annotations

import sys
from pathlib import Path

import torch
from safetensors.torch import save_file

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from fixtures import Case, hyperset_config, perturb

from energyformers import (
    HyperSetForImageClassification,
    HyperSetForSequenceClassification,
    HyperSetForTokenClassification,
    LoopedTransformerConfig,
    LoopedTransformerForSequenceClassification,
)

HERE = Path(__file__).resolve().parent

# (folder, model class, attn_implementation requested when saving; None: the old default, not written to config.json)
MODELS = [
    ("hyperset_image_default", HyperSetForImageClassification, None),
    ("hyperset_tokens_sdpa", HyperSetForTokenClassification, "sdpa"),
    ("looped_tokens_default", LoopedTransformerForSequenceClassification, None),
]

if __name__ == "__main__":
    torch.use_deterministic_algorithms(True)
    for folder, model_class, implementation in MODELS:
        if model_class is LoopedTransformerForSequenceClassification:  # the tiny Hyper-SET config's baseline
            case = Case.of(HyperSetForSequenceClassification)
            torch.manual_seed(0)
            model = model_class(LoopedTransformerConfig.from_hyperset(hyperset_config("sequence"))).eval()
        else:
            case = Case.of(model_class)
            model = case.build(seed=0, attn_implementation=implementation)
        # perturbed: the step sizes start at zero (identity map), which would hide a changed attention path
        model = perturb(model, seed=1)
        model.save_pretrained(HERE / folder)
        inputs = case.inputs(seed=0)
        with torch.no_grad():
            logits = model(**inputs).logits
        save_file({**inputs, "logits": logits.contiguous()}, HERE / folder / "expected.safetensors")
        print(folder, model.config._attn_implementation, tuple(logits.shape))
