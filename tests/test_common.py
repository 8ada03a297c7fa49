"""Behaviours every family shares, checked once, parametrised over every (family, head, input type).

The cases come from `tests/fixtures.py` (built from `energyformers.FAMILIES`), so a new family or head is
covered as soon as it is registered there and given a tiny config in `fixtures.TINY`; the per-family tables
below hold each family's specific overrides. Family-specific behaviour lives in the family test files.

The recorded logits (`EXPECTED_SLICES`) are regenerated with
    .venv/bin/python tests/test_common.py --regenerate-expected-slices
"""

from __future__ import annotations

import copy
import inspect
import itertools
import re
import sys
import types
import warnings
from pathlib import Path

import pytest
import torch
import transformers
from fixtures import (
    ALL,
    HEADS,
    IMAGE,
    SEQUENCE,
    TINY,
    Case,
    assert_close_to_scale,
    assert_differs,
    assert_same_structure_and_tensors,
    cases,
    main_output,
    perturb,
    rounding,
    step_once,
    tensors,
)
from transformers.utils import ModelOutput

from energyformers import FAMILIES
from energyformers.training.setup import enable_activation_checkpointing

# Families that zero-initialise parameters (Hyper-SET's step-size MLP, iMixer's classifier) get one optimiser
# step before "every parameter gets a gradient"; HyperBF must pass at initialisation.
ZERO_INITIALISED = {"hyperset", "imixer"}

# Every optional output a family can return: `return_dict=False` must keep them, padding must keep them finite.
EXTRA_OUTPUTS = {
    "hyperset": dict(output_attentions=True, output_energies=True),
    "imixer": dict(output_fixed_point_residuals=True),
    "hyperbf": dict(output_attentions=True, output_rbf_diagnostics=True),
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

# The code paths gradient checkpointing must recompute exactly: Hyper-SET's two step-size conditions, dropout
# and drop path (the RNG state is replayed), HyperBF's two feedforward kernels.
CHECKPOINTING_VARIANTS = {
    "hyperset": [dict(step_size_condition="current"), dict(step_size_condition="input")],
    "imixer": [dict(hidden_dropout_prob=0.1, drop_path_rate=0.2)],
    "hyperbf": [
        dict(hidden_dropout_prob=0.1, attention_probs_dropout_prob=0.1),
        dict(feedforward_kernel="gaussian", rbf_width="center"),
    ],
}


def test_every_registered_family_has_a_tiny_config():
    tables = (TINY, EXTRA_OUTPUTS, ROUND_TRIP_OVERRIDES, PADDING_VARIANTS, CHECKPOINTING_VARIANTS)
    assert all(set(table) == set(FAMILIES) for table in tables)
    assert {case.family for case in HEADS} == set(FAMILIES)
    assert set(EXPECTED_SLICES) == {str(case) for case in ALL}


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
        step_once(model, case.inputs(labels=True))
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
            # padding changes only how float32 sums over the positions are split: ~16 ulps of the largest entry
            assert_close_to_scale(got, expected[key], rounding(torch.float32, 16), f"{key}, row {row}")
        key = "pooler_output" if case.is_base else "logits"
        changed = max(changed, (real(unmasked, row, len(seq))[key] - expected[key]).abs().max().item())
    # the padding really was there to ignore: without the mask the answer changes, by far more than the rounding
    # allowed above (16 ulps of outputs of size ~6, about 1e-5)
    assert changed > 1e-4, changed
    assert all(torch.isfinite(t).all() for t in tensors(detailed))  # e.g. energies, attention maps


# ---------------------------------------------------------------- configuration


@cases(HEADS)
def test_head_rejects_a_config_of_the_other_input_type(case):
    given = "sequence" if case.input_type == "image" else "image"
    with pytest.raises(ValueError, match=rf"input_type\W.*{re.escape(repr(given))}"):
        case.model_class(case.tiny.config(given))


@pytest.mark.parametrize(
    ("overrides", "name", "value"),
    [
        (dict(num_hidden_layers=0), "num_hidden_layers", 0),
        (dict(input_type="video"), "input_type", "video"),
        (dict(image_size=30, patch_size=4), "image_size", 30),
        (dict(input_type="sequence"), "vocab_size", None),
    ],
)
@pytest.mark.parametrize("family", list(FAMILIES))
def test_invalid_config_raises_naming_the_argument_and_value(family, overrides, name, value):
    # (every field of every config: tests/test_configuration.py)
    with pytest.raises(ValueError, match=re.escape(f"{name}={value!r}")):
        FAMILIES[family].config_class(**overrides)


# ---------------------------------------------------------------- bad inputs: a ValueError naming the argument


def _accepts(model: torch.nn.Module, name: str) -> bool:
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.name == name or p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def _other_kind(case: Case) -> tuple[str, torch.Tensor]:
    """A valid input of the other input type (ids for an image model, pixels for a sequence model)."""
    other = Case(case.family, "AutoModel", "sequence" if case.input_type == "image" else "image")
    return other.main_input_name, other.inputs()[other.main_input_name]


@cases(ALL)
def test_input_of_the_other_kind_is_rejected(case):
    model = case.build()
    wrong, value = _other_kind(case)
    inputs = case.inputs()
    if not _accepts(model, wrong):  # Python itself rejects the keyword, naming it
        with pytest.raises(TypeError, match=wrong):
            model(**{**inputs, wrong: value})
        return
    names = rf"{case.main_input_name}|{wrong}"
    with pytest.raises(ValueError, match=names):  # instead of the right input
        model(**{wrong: value})
    with pytest.raises(ValueError, match=names):  # next to it: never silently ignored
        model(**{**inputs, wrong: value})


@cases(IMAGE)
def test_wrong_channel_count_is_rejected(case):
    model, pixels = case.build(), case.inputs()["pixel_values"]
    bad = 5  # neither 1 nor 3 channels, and no tiny size
    with pytest.raises(ValueError, match="pixel_values") as excinfo:
        model(pixel_values=pixels[:, :1].expand(-1, bad, -1, -1))
    assert "num_channels" in str(excinfo.value) and str(bad) in str(excinfo.value)


@cases(IMAGE)
def test_wrong_image_size_is_rejected(case):
    model, pixels = case.build(), case.inputs()["pixel_values"]
    bigger = torch.nn.functional.pad(pixels, (0, 4, 0, 4))  # 12×12, still a multiple of the patch size
    with pytest.raises(ValueError, match="pixel_values") as excinfo:
        model(pixel_values=bigger)
    assert "12" in str(excinfo.value)


@pytest.mark.parametrize("where", ["negative", "vocab_size", "beyond"])
@cases(SEQUENCE)
def test_out_of_vocabulary_ids_are_rejected(case, where):
    model, inputs = case.build(), case.inputs()
    bad = {"negative": -1, "vocab_size": case.tiny.vocab, "beyond": case.tiny.vocab + 7}[where]
    inputs["input_ids"][1, 2] = bad
    with pytest.raises(ValueError, match="input_ids") as excinfo:
        model(**inputs)
    assert str(bad) in str(excinfo.value)


@cases(SEQUENCE)
def test_over_long_sequence_is_rejected(case):
    model, length = case.build(), case.tiny.positions + 1
    with pytest.raises(ValueError, match="max_position_embeddings") as excinfo:
        model(input_ids=torch.ones(2, length, dtype=torch.long))
    assert str(length) in str(excinfo.value)


@cases(SEQUENCE)
def test_float_input_ids_are_rejected(case):
    model, inputs = case.build(), case.inputs()
    with pytest.raises(ValueError, match="input_ids"):
        model(**{**inputs, "input_ids": inputs["input_ids"].float()})


# ---------------------------------------------------------------- transformers API


@cases(ALL)
def test_main_input_is_the_first_positional_argument(case):
    model = perturb(case.build())
    assert model.main_input_name == case.main_input_name
    inputs = case.inputs()
    main = inputs.pop(case.main_input_name)
    with torch.no_grad():
        positional = main_output(model(main, **inputs))
        by_name = main_output(model(**{case.main_input_name: main}, **inputs))
    assert torch.equal(positional, by_name)


@cases(SEQUENCE)
def test_inputs_embeds_replace_input_ids(case):
    model = perturb(case.build())
    inputs = case.inputs()
    ids = inputs.pop("input_ids")
    with torch.no_grad():
        embeds = model.get_input_embeddings()(ids)
        assert embeds.shape == (*ids.shape, case.tiny.hidden)
        expected = main_output(model(input_ids=ids, **inputs))
        got = main_output(model(inputs_embeds=embeds, **inputs))
        # the same rows looked up and the same float32 operations after them: a few ulps at most
        assert_close_to_scale(got, expected, rounding(torch.float32, 8), "inputs_embeds vs input_ids")
        # other embeddings give other outputs: the model really reads inputs_embeds
        flipped = main_output(model(inputs_embeds=embeds.flip(0), **inputs))
        assert_differs(flipped, expected, "flipped embeddings", beyond_allclose=True)
        for both_or_neither in ({"input_ids": ids, "inputs_embeds": embeds}, {}):
            with pytest.raises(ValueError, match="inputs_embeds"):
                model(**both_or_neither, **inputs)


# the masked-image-modelling head predicts the codebook (vocab_size − 1 codes), whatever num_labels says
@cases([case for case in HEADS if case.auto_name != "AutoModelForMaskedImageModeling"])
def test_num_labels_zero_gives_the_classifier_features_as_logits(case):
    features = perturb(case.build(num_labels=0))
    assert isinstance(features.classifier, torch.nn.Identity)
    classifier = perturb(case.build(), seed=2)
    missing, unexpected = classifier.load_state_dict(features.state_dict(), strict=False)
    assert unexpected == [] and all(key.startswith("classifier.") for key in missing), missing
    inputs = case.inputs()
    with torch.no_grad():
        pooled = features(**inputs).logits
        logits = classifier(**inputs).logits
    assert pooled.shape == (*logits.shape[:-1], case.tiny.hidden)
    # the same float32 linear layer on the same pooled state: a few ulps at most
    assert_close_to_scale(logits, classifier.classifier(pooled), rounding(torch.float32, 8), "logits")


@cases(ALL)
def test_input_embeddings_can_be_read_and_replaced(case):
    model = perturb(case.build())
    inputs = case.inputs()
    old = model.get_input_embeddings()
    assert isinstance(old, torch.nn.Module) and old is model.base_model.get_input_embeddings()
    assert any(module is old for module in model.modules())
    new = perturb(copy.deepcopy(old), seed=2)
    with torch.no_grad():
        before = main_output(model(**inputs))
        model.set_input_embeddings(new)
        assert model.get_input_embeddings() is new
        replaced = main_output(model(**inputs))
        assert_differs(replaced, before, "new embeddings", beyond_allclose=True)
        model.set_input_embeddings(old)
        assert torch.equal(main_output(model(**inputs)), before)


@cases(SEQUENCE)
def test_resize_token_embeddings_then_new_ids_work(case):
    model = perturb(case.build())
    inputs, vocab = case.inputs(), case.tiny.vocab
    with torch.no_grad():
        before = main_output(model(**inputs))
    model.resize_token_embeddings(vocab + 4, mean_resizing=False)
    assert model.get_input_embeddings().num_embeddings == model.config.vocab_size == vocab + 4
    new_ids = inputs["input_ids"].clone()
    new_ids[:, 1] = vocab + 3  # an id only the resized table has
    with torch.no_grad():
        # old rows kept: the same float32 computation on the same rows, a few ulps at most
        assert_close_to_scale(main_output(model(**inputs)), before, rounding(torch.float32, 8), "old rows")
        after = main_output(model(**{**inputs, "input_ids": new_ids}))
    assert_differs(after, before, "a new id", beyond_allclose=True)


# ---------------------------------------------------------------- gradient checkpointing

_CHECKPOINTING_CASES = [
    pytest.param(case, variant, id=f"{case}-{'-'.join(map(str, variant.values()))}")
    for case in ALL
    for variant in CHECKPOINTING_VARIANTS[case.family]
]


def test_checkpointing_is_enabled_by_the_installed_transformers_name():
    """`activation_checkpointing_enable` where transformers has it, without its deprecation warning for the old
    name; `gradient_checkpointing_enable` where it is the only one (transformers 5.17, the GPU image's)."""
    model = ALL[0].build()
    with warnings.catch_warnings():
        warnings.simplefilter("error", FutureWarning)
        enable_activation_checkpointing(model)
    assert all(layer.gradient_checkpointing for layer in model.base_model.layers)
    calls = []
    old = types.SimpleNamespace(gradient_checkpointing_enable=lambda: calls.append("old name"))  # 5.17's API
    enable_activation_checkpointing(old)
    assert calls == ["old name"]


@pytest.mark.parametrize(("case", "variant"), _CHECKPOINTING_CASES)
def test_gradient_checkpointing_matches_plain_backprop(case, variant):
    reference = perturb(case.build(**variant))
    checkpointed = copy.deepcopy(reference)
    enable_activation_checkpointing(checkpointed)
    assert all(layer.gradient_checkpointing for layer in checkpointed.base_model.layers)
    inputs = case.inputs(labels=not case.is_base, seed=1)
    losses = []
    for model in (reference, checkpointed):
        model.train()
        torch.manual_seed(123)  # the same dropout / drop-path masks; checkpointing replays the RNG state
        outputs = model(**inputs)
        loss = outputs.last_hidden_state.pow(2).mean() if case.is_base else outputs.loss
        loss.backward()
        losses.append(loss.detach())
    # checkpointing recomputes the same float32 forward: the loss and gradients within a few ulps of their scale
    assert_close_to_scale(losses[1], losses[0], rounding(torch.float32, 8), "loss")
    grads = dict(checkpointed.named_parameters())
    for name, parameter in reference.named_parameters():
        assert parameter.grad is not None, name
        assert_close_to_scale(grads[name].grad, parameter.grad, rounding(torch.float32, 8), name)
    for name, buffer in reference.named_buffers():  # e.g. iMixer's u, v: one power iteration per forward
        assert torch.equal(checkpointed.get_buffer(name), buffer), name


@cases([case for case in IMAGE if not case.is_base])
def test_bfloat16_model_casts_float32_images(case):
    """Image processors give float32; a bfloat16 model casts them to its dtype, as transformers' image models do."""
    model = perturb(case.build())
    pixel_values = case.inputs()["pixel_values"]
    with torch.no_grad():
        expected = model(pixel_values).logits
        logits = model.to(torch.bfloat16)(pixel_values).logits
    assert pixel_values.dtype == torch.float32 and logits.dtype == torch.bfloat16
    error, scale = float((logits.float() - expected).abs().max()), float(expected.abs().max())
    assert error <= 0.05 * scale, f"bfloat16 logits differ by {error:.2e} (max |float32 logit| {scale:.2e})"


# ---------------------------------------------------------------- recorded outputs (fixed seed)

# logits[0, :3] (per token: logits[0, 0, :3]; base models: last_hidden_state[0, 0, :3]) of `perturb(case.build())`
# on `case.inputs()`. Regenerate: .venv/bin/python tests/test_common.py --regenerate-expected-slices
# BEGIN EXPECTED_SLICES
EXPECTED_SLICES: dict[str, list[float]] = {
    "HyperSetModel-image": [-0.0280, 1.6255, -0.3158],
    "HyperSetModel-sequence": [-0.0071, 1.0106, -0.0047],
    "HyperSetForImageClassification-image": [0.1706, 0.0118, -0.0644],
    "HyperSetForSequenceClassification-sequence": [-0.0033, -0.0111, -0.0072],
    "HyperSetForTokenClassification-sequence": [-0.0033, -0.0111, -0.0072],
    "HyperSetForMaskedImageModeling-sequence": [0.1518, -0.1067, 0.1172],
    "HyperBFModel-image": [-0.3577, -0.6324, -2.2377],
    "HyperBFModel-sequence": [-0.6162, 0.5672, 0.7919],
    "HyperBFForImageClassification-image": [-0.0895, -0.0543, -0.1826],
    "HyperBFForSequenceClassification-sequence": [-0.0272, -0.3956, -0.0369],
    "IMixerModel-image": [0.0761, 0.3931, 0.4181],
    "IMixerModel-sequence": [-0.2773, 0.6275, 1.7180],
    "IMixerForImageClassification-image": [0.0022, -0.0144, -0.0267],
    "IMixerForSequenceClassification-sequence": [0.0132, -0.0061, -0.0107],
}
# END EXPECTED_SLICES


def _expected_slice_output(case: Case) -> torch.Tensor:
    model = perturb(case.build())
    with torch.no_grad():
        outputs = model(**case.inputs())
    if case.is_base:
        return outputs.last_hidden_state[0, 0, :3]
    return outputs.logits[0, 0, :3] if case.per_token else outputs.logits[0, :3]


@cases(ALL)
def test_outputs_match_the_recorded_values(case):
    expected = torch.tensor(EXPECTED_SLICES[str(case)])
    # the values are recorded to 4 decimals (off by up to 5e-5), and another platform's float32 kernels may round
    # the forward differently: a few hundred ulps of outputs up to ~2.5
    bound = 0.5e-4 + rounding(torch.float32, 256, 2.5)
    torch.testing.assert_close(_expected_slice_output(case), expected, atol=bound, rtol=0)


def _regenerate_expected_slices() -> None:
    torch.set_num_threads(1)
    lines = ["EXPECTED_SLICES: dict[str, list[float]] = {"]
    for case in ALL:
        values = ", ".join(f"{v:.4f}" for v in _expected_slice_output(case).tolist())
        lines.append(f'    "{case}": [{values}],')
    lines.append("}")
    path = Path(__file__)
    text = path.read_text()
    start = text.index("# BEGIN EXPECTED_SLICES\n") + len("# BEGIN EXPECTED_SLICES\n")
    end = text.index("# END EXPECTED_SLICES")
    path.write_text(text[:start] + "\n".join(lines) + "\n" + text[end:])
    print(f"wrote {len(ALL)} expected slices to {path}")


if __name__ == "__main__" and sys.argv[1:] == ["--regenerate-expected-slices"]:
    _regenerate_expected_slices()
