"""Behaviours every family shares, checked once, parametrised over every (family, head) pair.

The heads come from `energyformers.FAMILIES` (the single source for Auto registration), so a new family or
head is covered as soon as it is registered there and given a tiny-config factory in `TINY` below. The base
model (`AutoModel`) takes both input types, so it appears once per input type.
"""

from __future__ import annotations

import itertools
import re

import pytest
import torch
import transformers
from fixtures import (
    ALL,
    HEADS,
    SEQUENCE,
    TINY,
    Case,
    assert_same_structure_and_tensors,
    main_output,
    perturb,
    tensors,
)
from transformers.utils import ModelOutput

from energyformers import FAMILIES

# Families that zero-initialise parameters (Hyper-SET's step-size MLP, iMixer's classifier) get one optimiser
# step before "every parameter gets a gradient"; HyperBF must pass at initialisation.
ZERO_INITIALISED = {"hyperset", "imixer"}

# Every optional output a family can return: `return_dict=False` must keep them, padding must keep them finite.
EXTRA_OUTPUTS = {
    "hyperset": dict(output_attentions=True, output_energies=True),
    "imixer": dict(output_fixed_point_residuals=True),
    "hyperbf": dict(output_attentions=True, output_rbf_weights=True),
}

# Config overrides that put as much state as possible into a checkpoint and make eval-mode determinism
# non-trivial: dropout everywhere, HyperBF's per-center Gaussian widths.
ROUND_TRIP_OVERRIDES = {
    "hyperset": {},
    "imixer": dict(hidden_dropout_prob=0.2, drop_path_rate=0.2),
    "hyperbf": dict(
        hidden_dropout_prob=0.2,
        attention_probs_dropout_prob=0.2,
        feedforward_kernel="gaussian",
        rbf_width="center",
    ),
}

# The ways a family's sequence models read padding: pooling choice and, for HyperBF, both attention paths.
PADDING_VARIANTS = {
    "hyperset": [dict(pooling="cls"), dict(pooling="mean")],
    "imixer": [{}],
    "hyperbf": [
        dict(pooling=pooling, attn_implementation=attn)
        for pooling, attn in itertools.product(["cls", "mean"], ["sdpa", "eager"])
    ],
}


# Each family's wording of the rejection: head class name, required and given input_type.
WRONG_INPUT_TYPE = {
    "hyperset": "{head} needs config.input_type='{required}'; got '{given}'",
    "imixer": "{head} needs config.input_type='{required}'; got '{given}'",
    "hyperbf": "{head} needs input_type=\"{required}\"; got input_type='{given}'",
}


def cases(selection: list[Case]):
    return pytest.mark.parametrize("case", selection, ids=str)


def test_every_registered_family_has_a_tiny_config():
    tables = (TINY, EXTRA_OUTPUTS, ROUND_TRIP_OVERRIDES, PADDING_VARIANTS, WRONG_INPUT_TYPE)
    assert all(set(table) == set(FAMILIES) for table in tables)
    assert {case.family for case in HEADS} == set(FAMILIES)


# ---------------------------------------------------------------- save / load


@cases(ALL)
def test_save_load_round_trip_is_exact(case, tmp_path):
    model = perturb(case.build(**ROUND_TRIP_OVERRIDES[case.family]))
    inputs = case.inputs(seed=1)
    with torch.no_grad():
        expected = main_output(model(**inputs))
        # eval mode is deterministic even with dropout / drop path configured
        assert torch.equal(main_output(model(**inputs)), expected)
    model.save_pretrained(tmp_path)
    assert (tmp_path / "model.safetensors").exists()
    state = model.state_dict()
    for loaded in (case.model_class.from_pretrained(tmp_path), case.auto_class.from_pretrained(tmp_path)):
        assert type(loaded) is case.model_class and not loaded.training
        loaded_state = loaded.state_dict()
        assert loaded_state.keys() == state.keys()
        for name, tensor in state.items():  # parameters and persistent buffers (iMixer's u, v)
            assert torch.equal(loaded_state[name], tensor), name
        with torch.no_grad():
            assert torch.equal(main_output(loaded(**inputs)), expected)


@cases(ALL)
def test_checkpoint_loads_into_every_other_class_with_identical_backbone(case, tmp_path):
    """A head checkpoint loads into the base model and the other heads; a base checkpoint into every head."""
    source = perturb(case.build())
    source.save_pretrained(tmp_path)
    inputs = case.inputs()
    with torch.no_grad():
        expected = source.base_model(**inputs)
    backbone_state = source.base_model.state_dict()
    targets = [other for other in ALL if other.family == case.family and other.input_type == case.input_type]
    targets = [other for other in targets if other.model_class is not case.model_class]
    assert targets  # at least the base model, or a head for a base checkpoint
    for target in targets:
        loaded = target.model_class.from_pretrained(tmp_path).eval()
        assert type(loaded) is target.model_class
        loaded_state = loaded.base_model.state_dict()
        assert loaded_state.keys() == backbone_state.keys(), target
        for name, tensor in backbone_state.items():
            assert torch.equal(loaded_state[name], tensor), f"{target}: {name}"
        with torch.no_grad():
            got = loaded.base_model(**inputs)
        assert_same_structure_and_tensors(got, expected, str(target))


# ---------------------------------------------------------------- Auto classes


@pytest.mark.parametrize("family", list(FAMILIES))
def test_auto_config_resolves_to_the_family_config(family, tmp_path):
    config_class = FAMILIES[family].config_class
    config = transformers.AutoConfig.for_model(family)
    assert type(config) is config_class and config.model_type == family
    TINY[family].config("image").save_pretrained(tmp_path)
    assert type(transformers.AutoConfig.from_pretrained(tmp_path)) is config_class


@cases(ALL)
def test_auto_class_resolves_to_the_family_class(case, tmp_path):
    config = case.config()
    assert type(case.auto_class.from_config(config)) is case.model_class
    case.build().save_pretrained(tmp_path)
    assert type(case.auto_class.from_pretrained(tmp_path)) is case.model_class
    # any checkpoint of the family opens as its base model through AutoModel
    base = FAMILIES[case.family].heads["AutoModel"]
    assert type(transformers.AutoModel.from_pretrained(tmp_path)) is base


# ---------------------------------------------------------------- outputs


@cases(ALL)
def test_return_dict_false_gives_the_same_tensors_as_a_tuple(case):
    model = perturb(case.build())
    inputs = case.inputs(labels=not case.is_base)
    flags = dict(output_hidden_states=True, **EXTRA_OUTPUTS[case.family])
    with torch.no_grad():
        as_dict = model(**inputs, **flags)
        as_tuple = model(**inputs, **flags, return_dict=False)
    assert isinstance(as_dict, ModelOutput) and as_dict.hidden_states is not None
    assert isinstance(as_tuple, tuple) and len(as_tuple) == len(as_dict.to_tuple())
    if not case.is_base:
        assert torch.equal(as_tuple[0], as_dict.loss) and torch.equal(as_tuple[1], as_dict.logits)
    else:
        assert torch.equal(as_tuple[0], as_dict.last_hidden_state)
    assert_same_structure_and_tensors(as_tuple, as_dict)


# ---------------------------------------------------------------- training


@cases(HEADS)
def test_every_parameter_gets_a_finite_nonzero_gradient(case):
    model = case.build()
    if case.family in ZERO_INITIALISED:  # one optimiser step makes the zero-initialised parameters non-zero
        model.train()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        model(**case.inputs(labels=True)).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    model.train()
    model(**case.inputs(labels=True, seed=5)).loss.backward()
    for name, parameter in model.named_parameters():
        assert parameter.grad is not None, f"{name} got no gradient"
        assert torch.isfinite(parameter.grad).all(), f"{name} has a non-finite gradient"
        assert parameter.grad.abs().max() > 0, f"{name} has an all-zero gradient"


# ---------------------------------------------------------------- padding

_PADDING_CASES = [
    pytest.param(case, variant, id=f"{case}-{'-'.join(map(str, variant.values())) or 'default'}")
    for case in SEQUENCE
    for variant in PADDING_VARIANTS[case.family]
]


@pytest.mark.parametrize(("case", "variant"), _PADDING_CASES)
def test_right_padding_does_not_change_outputs(case, variant):
    model = perturb(case.build(**variant))
    vocab = case.tiny.vocab
    sequences = [[3, 5, 7, 2], [4, 4, 9, 1, 8, 6], [11]]
    width = 9  # every row padded, by different amounts
    ids = (torch.arange(3 * width).view(3, width) * 7) % vocab  # arbitrary, non-constant padding ids
    mask = torch.zeros(3, width, dtype=torch.long)
    for row, seq in enumerate(sequences):
        ids[row, : len(seq)], mask[row, : len(seq)] = torch.tensor(seq), 1
    with torch.no_grad():
        alone = [model(input_ids=torch.tensor([s]), output_hidden_states=True) for s in sequences]
        padded = model(
            input_ids=ids,
            attention_mask=mask,
            token_type_ids=torch.zeros_like(ids),
            output_hidden_states=True,
        )
        unmasked = model(input_ids=ids, output_hidden_states=True)
        detailed = model(input_ids=ids, attention_mask=mask, **EXTRA_OUTPUTS[case.family])

    def real(outputs, row: int, n: int) -> dict[str, torch.Tensor]:
        out = {"final_state": outputs.hidden_states[-1][row, :n]}
        if case.is_base:
            out["last_hidden_state"] = outputs.last_hidden_state[row, :n]
            out["pooler_output"] = outputs.pooler_output[row]
        else:
            out["logits"] = outputs.logits[row, :n] if case.per_token else outputs.logits[row]
        return out

    changed = 0.0
    for row, (seq, single) in enumerate(zip(sequences, alone)):
        expected = real(single, 0, len(seq))
        for key, got in real(padded, row, len(seq)).items():
            torch.testing.assert_close(got, expected[key], atol=1e-5, rtol=0, msg=f"{key}, row {row}")
        key = "pooler_output" if case.is_base else "logits"
        changed = max(changed, (real(unmasked, row, len(seq))[key] - expected[key]).abs().max().item())
    assert changed > 1e-4  # the padding really was there to ignore: without the mask the answer changes
    assert all(torch.isfinite(t).all() for t in tensors(detailed))  # e.g. energies, attention maps


# ---------------------------------------------------------------- configuration


@cases(HEADS)
def test_head_rejects_a_config_of_the_other_input_type(case):
    given = "sequence" if case.input_type == "image" else "image"
    message = WRONG_INPUT_TYPE[case.family].format(
        head=case.model_class.__name__, required=case.input_type, given=given
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        case.model_class(case.tiny.config(given))
