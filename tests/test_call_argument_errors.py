"""Call-time arguments that used to be accepted and then read wrongly or not at all, refused by name:

* a float (additive or 0/1) `attention_mask`, or an integer one holding values other than 0 and 1, in every family's
  models (the wording of `energyformers.energy`);
* `from_pretrained` of a folder that holds another model type;
* per-call depth arguments that the call would ignore;
* `decode(seed=)`, `minimize_energy`'s tolerance and step size, `task_of`'s task, the depth pipelines' arguments.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import transformers
from fixtures import SEQUENCE, Case, hyperset_config, perturb

from energyformers import (
    FAMILIES,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
)
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


# ------------------------------------------------------------------------------------- from_pretrained model_type


@pytest.fixture(scope="module")
def saved_folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """One tiny saved image classifier per model type: the three families, the looped baseline and a ViT."""
    root = tmp_path_factory.mktemp("model-types")
    folders = {}
    for family in FAMILIES:
        case = Case.of(FAMILIES[family].heads["AutoModelForImageClassification"])
        case.build().save_pretrained(root / family)
        folders[family] = root / family
    torch.manual_seed(0)
    looped = LoopedTransformerConfig.from_hyperset(hyperset_config("image"))
    LoopedTransformerForImageClassification(looped).save_pretrained(root / "looped_transformer")
    folders["looped_transformer"] = root / "looped_transformer"
    vit = transformers.ViTConfig(
        image_size=8,
        patch_size=2,
        num_channels=1,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        num_labels=4,
    )
    transformers.ViTForImageClassification(vit).save_pretrained(root / "vit")
    folders["vit"] = root / "vit"
    return folders


IMAGE_CLASSES = {
    **{family: spec.heads["AutoModelForImageClassification"] for family, spec in FAMILIES.items()},
    "looped_transformer": LoopedTransformerForImageClassification,
}


@pytest.mark.parametrize("target", list(IMAGE_CLASSES))
@pytest.mark.parametrize("source", [*IMAGE_CLASSES, "vit"])
def test_from_pretrained_refuses_a_folder_of_another_model_type(saved_folders, source, target):
    model_class, folder = IMAGE_CLASSES[target], saved_folders[source]
    if source == target:
        model, loading = model_class.from_pretrained(folder, output_loading_info=True)
        assert type(model) is model_class and not any(loading.values()), loading
        return
    with pytest.raises(ValueError) as refused:
        model_class.from_pretrained(folder)
    expected = model_class.config_class.model_type
    found = "vit" if source == "vit" else IMAGE_CLASSES[source].config_class.model_type
    message = str(refused.value)
    assert f"{folder} holds a '{found}' model" in message, message
    assert f"{model_class.__name__} loads '{expected}' models" in message, message


@pytest.mark.parametrize("source", list(IMAGE_CLASSES))
def test_auto_classes_still_load_every_model_type(saved_folders, source):
    model = transformers.AutoModelForImageClassification.from_pretrained(saved_folders[source])
    assert type(model) is IMAGE_CLASSES[source]
