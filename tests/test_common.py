"""Behaviours every family shares, checked once, parametrised over every (family, head) pair.

The heads come from `energyformers.FAMILIES` (the single source for Auto registration), so a new family or
head is covered as soon as it is registered there and given a tiny-config factory in `TINY` below. The base
model (`AutoModel`) takes both input types, so it appears once per input type.
"""

from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Callable, Iterator
from typing import Any

import pytest
import torch
import transformers
from transformers.utils import ModelOutput

import energyformers
from energyformers import FAMILIES, HyperBFConfig, HyperSetConfig, IMixerConfig

# ---------------------------------------------------------------- tiny configs and inputs, one per family


@dataclasses.dataclass(frozen=True)
class Tiny:
    """A family's tiny config (the one its own test file uses) and the sizes its inputs need."""

    config: Callable[..., transformers.PretrainedConfig]  # (input_type, **overrides) -> config
    batch: int
    length: int
    image: int
    channels: int
    vocab: int
    labels: int


def hyperset_config(input_type: str, **overrides: Any) -> HyperSetConfig:
    kwargs = dict(
        hidden_size=16,
        num_attention_heads=4,
        intermediate_size=24,
        num_hidden_layers=2,
        num_iterations=3,
        time_embedding_dim=16,
        num_labels=4,
    )
    if input_type == "image":
        kwargs.update(image_size=8, patch_size=2, num_channels=1)
    else:
        kwargs.update(input_type="sequence", vocab_size=20, max_position_embeddings=16)
    return HyperSetConfig(**{**kwargs, **overrides})


def imixer_config(input_type: str, **overrides: Any) -> IMixerConfig:
    kwargs = dict(hidden_size=16, num_hidden_layers=2, fixed_point_iterations=2, num_labels=4)
    if input_type == "image":
        kwargs.update(image_size=8, patch_size=2, num_channels=1)
    else:
        kwargs.update(input_type="sequence", vocab_size=20, max_position_embeddings=10)
    return IMixerConfig(**{**kwargs, **overrides})


def hyperbf_config(input_type: str, **overrides: Any) -> HyperBFConfig:
    kwargs = dict(
        input_type=input_type,
        hidden_size=32,
        num_attention_heads=2,
        num_hidden_layers=2,
        image_size=8,
        patch_size=2,
        num_channels=3,
        num_labels=3,
    )
    if input_type == "sequence":
        kwargs.update(vocab_size=16, max_position_embeddings=12)
    return HyperBFConfig(**{**kwargs, **overrides})


TINY = {
    "hyperset": Tiny(hyperset_config, batch=3, length=7, image=8, channels=1, vocab=20, labels=4),
    "imixer": Tiny(imixer_config, batch=3, length=7, image=8, channels=1, vocab=20, labels=4),
    "hyperbf": Tiny(hyperbf_config, batch=2, length=12, image=8, channels=3, vocab=16, labels=3),
}

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


@dataclasses.dataclass(frozen=True)
class Case:
    family: str
    auto_name: str  # "AutoModel" is the base model
    input_type: str

    @property
    def model_class(self) -> type:
        return getattr(energyformers, FAMILIES[self.family][1][self.auto_name])

    @property
    def auto_class(self) -> type:
        return getattr(transformers, self.auto_name)

    @property
    def is_base(self) -> bool:
        return self.auto_name == "AutoModel"

    @property
    def per_token(self) -> bool:
        return self.auto_name == "AutoModelForTokenClassification"

    @property
    def tiny(self) -> Tiny:
        return TINY[self.family]

    def __str__(self) -> str:
        return f"{self.model_class.__name__}-{self.input_type}"

    def config(self, **overrides: Any) -> transformers.PretrainedConfig:
        return self.tiny.config(self.input_type, **overrides)

    def build(self, seed: int = 0, **overrides: Any) -> torch.nn.Module:
        attn_implementation = overrides.pop("attn_implementation", None)
        torch.manual_seed(seed)
        model = self.model_class(self.config(**overrides)).eval()
        if attn_implementation is not None:
            model.set_attn_implementation(attn_implementation)
            assert model.config._attn_implementation == attn_implementation
        return model

    def inputs(self, labels: bool = False, seed: int = 0) -> dict[str, torch.Tensor]:
        """`pixel_values`, or `input_ids` + `attention_mask` with padding in the first row."""
        tiny, g = self.tiny, torch.Generator().manual_seed(seed)
        if self.input_type == "image":
            shape = (tiny.batch, tiny.channels, tiny.image, tiny.image)
            inputs = {"pixel_values": torch.randn(shape, generator=g)}
        else:
            # every token id occurs, so every embedding row is exercised
            ids = torch.randperm(tiny.batch * tiny.length, generator=g) % tiny.vocab
            mask = torch.ones(tiny.batch, tiny.length, dtype=torch.long)
            mask[0, -2:] = 0
            inputs = {"input_ids": ids.view(tiny.batch, tiny.length), "attention_mask": mask}
        if labels:
            shape = (tiny.batch, tiny.length) if self.per_token else (tiny.batch,)
            inputs["labels"] = torch.randint(0, tiny.labels, shape, generator=g)
            if self.per_token:
                inputs["labels"][inputs["attention_mask"] == 0] = -100
        return inputs


def _input_types(auto_name: str) -> list[str]:
    if auto_name == "AutoModel":
        return ["image", "sequence"]
    return ["image"] if auto_name == "AutoModelForImageClassification" else ["sequence"]


ALL = [
    Case(family, auto_name, input_type)
    for family, (_, classes) in FAMILIES.items()
    for auto_name in classes
    if auto_name != "AutoConfig"
    for input_type in _input_types(auto_name)
]
HEADS = [case for case in ALL if not case.is_base]
SEQUENCE = [case for case in ALL if case.input_type == "sequence"]


def cases(selection: list[Case]):
    return pytest.mark.parametrize("case", selection, ids=str)


def test_every_registered_family_has_a_tiny_config():
    tables = (TINY, EXTRA_OUTPUTS, ROUND_TRIP_OVERRIDES, PADDING_VARIANTS, WRONG_INPUT_TYPE)
    assert all(set(table) == set(FAMILIES) for table in tables)
    assert {case.family for case in HEADS} == set(FAMILIES)


# ---------------------------------------------------------------- helpers


def perturb(model: torch.nn.Module, seed: int = 1) -> torch.nn.Module:
    """Move every saved floating tensor (parameters and persistent buffers such as iMixer's u, v) off its
    initial value, so a checkpoint that silently re-initialised anything, or a zero-initialised head, is seen."""
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for tensor in model.state_dict().values():
            if tensor.is_floating_point():
                tensor.add_(0.01 * torch.randn(tensor.shape, generator=g, dtype=tensor.dtype))
    return model


def main_output(outputs: ModelOutput) -> torch.Tensor:
    return outputs.logits if hasattr(outputs, "logits") else outputs.last_hidden_state


def tensors(value: Any) -> Iterator[torch.Tensor]:
    """Every tensor in a (possibly nested) output, in order."""
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, ModelOutput):
        yield from tensors(value.to_tuple())
    elif isinstance(value, dict):
        yield from tensors(tuple(value.values()))
    elif dataclasses.is_dataclass(value) and not isinstance(value, type):
        yield from tensors(tuple(getattr(value, f.name) for f in dataclasses.fields(value)))
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from tensors(item)


def assert_same_structure_and_tensors(got: Any, expected: Any, path: str = "out") -> None:
    """Exact (bitwise) equality, element by element, of two nested outputs."""
    if isinstance(expected, ModelOutput):
        expected = expected.to_tuple()
    if isinstance(got, ModelOutput):
        got = got.to_tuple()
    if isinstance(expected, torch.Tensor):
        assert isinstance(got, torch.Tensor), path
        assert torch.equal(got, expected), path
    elif isinstance(expected, (tuple, list)):
        assert isinstance(got, (tuple, list)) and len(got) == len(expected), path
        for i, (a, b) in enumerate(zip(got, expected)):
            assert_same_structure_and_tensors(a, b, f"{path}[{i}]")
    else:
        got_tensors, expected_tensors = list(tensors(got)), list(tensors(expected))
        assert len(got_tensors) == len(expected_tensors), path
        for i, (a, b) in enumerate(zip(got_tensors, expected_tensors)):
            assert torch.equal(a, b), f"{path}:{i}"


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
    config_class = getattr(energyformers, FAMILIES[family][1]["AutoConfig"])
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
    base = getattr(energyformers, FAMILIES[case.family][1]["AutoModel"])
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
