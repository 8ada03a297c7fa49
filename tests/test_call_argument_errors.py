"""Call-time arguments that used to be accepted and then read wrongly or not at all, refused by name:

* a float (additive or 0/1) `attention_mask`, or an integer one holding values other than 0 and 1, in every family's
  models (the wording of `energyformers.energy`);
* `from_pretrained` of a folder that holds another model type;
* per-call depth arguments that the call would ignore;
* `decode(seed=)`, `minimize_energy`'s tolerance and step size, `task_of`'s task, the depth pipelines' arguments.
"""

from __future__ import annotations

import pytest
import torch
from fixtures import SEQUENCE, Case, hyperset_config, perturb

from energyformers import LoopedTransformerConfig, LoopedTransformerForSequenceClassification
from energyformers.energy import EnergyAttention

# ------------------------------------------------------------------------------------------- attention_mask

MASK_CASES = [
    *SEQUENCE,
    # the looped baseline (no family of FAMILIES) reads its mask through Hyper-SET's embeddings
    pytest.param(None, id="looped"),
]


def _model_and_inputs(case: Case | None) -> tuple[torch.nn.Module, dict]:
    if case is None:
        torch.manual_seed(0)
        config = LoopedTransformerConfig.from_hyperset(hyperset_config("sequence"))
        model = perturb(LoopedTransformerForSequenceClassification(config)).eval()
        return model, _sequence_inputs()
    return perturb(case.build()), case.inputs()


def _sequence_inputs() -> dict:
    ids = torch.randint(1, 20, (3, 7), generator=torch.Generator().manual_seed(0))
    mask = torch.ones(3, 7, dtype=torch.long)
    mask[0, -2:] = 0
    return {"input_ids": ids, "attention_mask": mask}


FLOAT_MESSAGE = (
    "attention_mask must be bool (True: attend) or integer 0/1 (1: attend); got dtype torch.float32"
)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("form", ["additive", "keep"])
def test_a_float_attention_mask_is_refused_in_every_model(case, form):
    model, inputs = _model_and_inputs(case)
    mask = inputs["attention_mask"]
    inputs["attention_mask"] = (1 - mask).float() * -1e9 if form == "additive" else mask.float()
    with pytest.raises(ValueError, match=FLOAT_MESSAGE.replace("(", r"\(").replace(")", r"\)")):
        model(**inputs)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
@pytest.mark.parametrize("through", ["input_ids", "inputs_embeds"])
def test_an_integer_attention_mask_other_than_0_1_is_refused_in_every_model(case, through):
    model, inputs = _model_and_inputs(case)
    inputs["attention_mask"] = inputs["attention_mask"] * 2
    if through == "inputs_embeds":
        inputs["inputs_embeds"] = model.get_input_embeddings()(inputs.pop("input_ids"))
    with pytest.raises(
        ValueError, match=r"an integer attention_mask must hold only 0 and 1 \(1: attend\); got 2"
    ):
        model(**inputs)


@pytest.mark.parametrize("case", MASK_CASES, ids=str)
def test_bool_and_integer_0_1_masks_give_the_same_outputs(case):
    model, inputs = _model_and_inputs(case)
    with torch.no_grad():
        integer = model(**inputs)[0]
        inputs["attention_mask"] = inputs["attention_mask"].bool()
        boolean = model(**inputs)[0]
    torch.testing.assert_close(boolean, integer, atol=0, rtol=0)


def test_the_energy_module_refuses_masks_in_the_models_words():
    attention = EnergyAttention(8, 2)
    state = torch.randn(2, 3, 8, generator=torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match="attention_mask must be bool"):
        attention(state, attention_mask=torch.zeros(2, 3))
    with pytest.raises(ValueError, match="must hold only 0 and 1"):
        attention(state, attention_mask=torch.full((2, 3), 2))
