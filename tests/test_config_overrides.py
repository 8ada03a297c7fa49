"""A config is checked however it was made, not only by `__init__`: keyword overrides at load time (transformers'
`from_dict` applies them by attribute assignment, after `__init__`), a config edited by attribute assignment and then
given to a model or saved, bulk edits (`update`, `update_from_string`: checked at once, all or nothing), and the
model-side reads of choice fields after the build (a table lookup, never an `else` that runs another model). Also the
message of a head called without inputs, for every family and the looped baseline."""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable
from pathlib import Path

import pytest
import torch
import transformers
from fixtures import HEADS, cases, hyperbf_config, hyperset_config, imixer_config, looped_transformer_config

from energyformers import (
    HyperBFConfig,
    HyperBFForImageClassification,
    HyperSetConfig,
    HyperSetForImageClassification,
    IMixerConfig,
    IMixerForImageClassification,
    LoopedTransformerConfig,
    LoopedTransformerForImageClassification,
    LoopedTransformerForSequenceClassification,
    LoopedTransformerForTokenClassification,
)
from energyformers.modeling.modeling_hyperset import HyperSetFeedForward
from energyformers.modeling.modeling_looped_transformer import LoopedTransformerMLP


@dataclasses.dataclass(frozen=True)
class Family:
    """An image head of one family, its tiny config, and one good override of a field its config.json holds."""

    name: str
    head: type
    config: Callable[..., transformers.PretrainedConfig]
    good: tuple[str, object]

    def __str__(self) -> str:
        return self.name


FAMILIES = {
    "hyperset": Family(
        "hyperset",
        HyperSetForImageClassification,
        lambda **o: hyperset_config("image", **o),
        ("num_iterations", 5),
    ),
    "imixer": Family(
        "imixer",
        IMixerForImageClassification,
        lambda **o: imixer_config("image", **o),
        ("fixed_point_solver", "picard"),
    ),
    "hyperbf": Family(
        "hyperbf",
        HyperBFForImageClassification,
        lambda **o: hyperbf_config("image", **o),
        ("pooling", "mean"),
    ),
    "looped-transformer": Family(
        "looped-transformer",
        LoopedTransformerForImageClassification,
        lambda **o: looped_transformer_config("image", **o),
        ("num_iterations", 5),
    ),
}

# (family, field, bad value, what the constructor's message says is allowed)
BAD_OVERRIDES = [
    ("hyperset", "pooling", "bogus", "expected one of ['cls', 'mean']"),
    ("hyperset", "hidden_act", "bogus", "expected one of ['relu', 'gelu']"),
    ("hyperset", "num_iterations", 0, "expected an integer >= 1"),
    ("hyperset", "halting_tolerance", -1.0, "expected None or a float > 0 (finite)"),
    ("imixer", "fixed_point_solver", "newton", "expected one of ['unrolled', 'picard', 'anderson']"),
    ("imixer", "hidden_dropout_prob", 1.5, "expected a float in [0, 1)"),
    ("hyperbf", "pooling", "bogus", "expected one of ['cls', 'mean']"),
    ("hyperbf", "num_hidden_layers", 0, "expected an integer >= 1"),
    ("looped-transformer", "hidden_act", "bogus", "expected one of ['relu', 'gelu']"),
    ("looped-transformer", "num_iterations", 0, "expected an integer >= 1"),
]


def pixels(config: transformers.PretrainedConfig) -> torch.Tensor:
    return torch.randn(2, config.num_channels, 8, 8, generator=torch.Generator().manual_seed(0))


def saved(family: Family, folder: Path) -> Path:
    torch.manual_seed(0)
    family.head(family.config()).save_pretrained(folder)
    return folder


def invalid(config_class: type, name: str, value: object, allowed: str) -> str:
    """The constructor's message, as a regex."""
    return re.escape(f"{config_class.__name__}: invalid {name}={value!r}; {allowed}.")


@pytest.mark.parametrize(("family", "name", "value", "allowed"), BAD_OVERRIDES)
def test_constructor_refuses_what_the_load_time_override_is_checked_against(family, name, value, allowed):
    """The messages below are the constructor's own (checked here so the load-time tests match its wording)."""
    config_class = type(FAMILIES[family].config())
    with pytest.raises(ValueError, match=invalid(config_class, name, value, allowed)):
        FAMILIES[family].config(**{name: value})


@pytest.mark.parametrize(("family", "name", "value", "allowed"), BAD_OVERRIDES)
def test_from_pretrained_refuses_a_bad_override_before_reading_the_weights(
    tmp_path, family, name, value, allowed
):
    folder = saved(FAMILIES[family], tmp_path)
    config_class = type(FAMILIES[family].config())
    # A weights file that cannot be read: a check that ran after the weights would fail on it first.
    weights = folder / "model.safetensors"
    assert weights.is_file(), sorted(p.name for p in folder.iterdir())
    weights.write_bytes(b"not a safetensors file")
    with pytest.raises(ValueError, match=invalid(config_class, name, value, allowed)):
        transformers.AutoModelForImageClassification.from_pretrained(folder, **{name: value})
    with pytest.raises(ValueError, match=invalid(config_class, name, value, allowed)):
        FAMILIES[family].head.from_pretrained(folder, **{name: value})


@pytest.mark.parametrize(("family", "name", "value", "allowed"), BAD_OVERRIDES)
def test_auto_config_refuses_a_bad_override(tmp_path, family, name, value, allowed):
    folder = saved(FAMILIES[family], tmp_path)
    config_class = type(FAMILIES[family].config())
    with pytest.raises(ValueError, match=invalid(config_class, name, value, allowed)):
        transformers.AutoConfig.from_pretrained(folder, **{name: value})
    with pytest.raises(ValueError, match=invalid(config_class, name, value, allowed)):
        config_class.from_pretrained(folder, return_unused_kwargs=True, **{name: value})


def test_an_override_is_checked_against_the_cross_field_rules_too(tmp_path):
    folder = saved(FAMILIES["hyperset"], tmp_path)  # hidden_size 16
    message = "HyperSetConfig: invalid hidden_size=16; it must be divisible by num_attention_heads=3."
    with pytest.raises(ValueError, match=re.escape(message)):
        transformers.AutoConfig.from_pretrained(folder, num_attention_heads=3)


@cases(list(FAMILIES.values()))
def test_a_good_override_still_loads_and_runs(tmp_path, case):
    folder = saved(case, tmp_path)
    name, value = case.good
    config, unused = transformers.AutoConfig.from_pretrained(
        folder, return_unused_kwargs=True, **{name: value}
    )
    assert getattr(config, name) == value and unused == {}, (getattr(config, name), unused)
    model = transformers.AutoModelForImageClassification.from_pretrained(folder, **{name: value}).eval()
    assert type(model) is case.head and getattr(model.config, name) == value
    with torch.no_grad():
        logits = model(pixel_values=pixels(model.config)).logits
    assert logits.shape == (2, model.config.num_labels) and torch.isfinite(logits).all()
    model.save_pretrained(tmp_path / "again")  # what was accepted saves and loads again
    assert getattr(transformers.AutoConfig.from_pretrained(tmp_path / "again"), name) == value


# ---------------------------------------------------------------- configs edited by attribute assignment


@pytest.mark.parametrize(("family", "name", "value", "allowed"), BAD_OVERRIDES)
def test_an_edited_config_is_refused_by_the_model_and_by_save(tmp_path, family, name, value, allowed):
    config = FAMILIES[family].config()
    setattr(config, name, value)
    with pytest.raises(ValueError, match=invalid(type(config), name, value, allowed)):
        FAMILIES[family].head(config)
    with pytest.raises(ValueError, match=invalid(type(config), name, value, allowed)):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("family", list(FAMILIES))
def test_validate_keeps_the_checks_transformers_runs_at_save(tmp_path, family):
    """Our `validate` adds the family's checks to transformers' own (here its layer-type check), not replaces them."""
    config = FAMILIES[family].config()
    config.layer_types = ["bogus"] * config.num_hidden_layers
    with pytest.raises(Exception, match="layer_types"):
        config.validate()
    with pytest.raises(Exception, match="layer_types"):
        config.save_pretrained(tmp_path)
    assert not (tmp_path / "config.json").exists()


@pytest.mark.parametrize("family", ["hyperset", "hyperbf"])
def test_pooling_edited_after_the_model_was_built_raises_instead_of_mean_pooling(family):
    model = FAMILIES[family].head(FAMILIES[family].config()).eval()
    model.config.pooling = "bogus"
    with pytest.raises(
        ValueError, match=invalid(type(model.config), "pooling", "bogus", "expected one of ['cls', 'mean']")
    ):
        model(pixel_values=pixels(model.config))


@pytest.mark.parametrize(
    ("module", "config"),
    [
        (HyperSetFeedForward, lambda: hyperset_config("image")),
        (LoopedTransformerMLP, lambda: looped_transformer_config("image")),
    ],
    ids=["hyperset", "looped-transformer"],
)
def test_activation_is_a_lookup_that_refuses_an_unknown_name(module, config):
    """The feedforward modules read `hidden_act` through a table of the config's choices: an edited value raises;
    it builds neither a default activation nor another one transformers' ACT2FN knows by that name."""
    for value in ("bogus", "silu"):  # "silu": an activation ACT2FN has, not one of the config's choices
        edited = config()
        edited.hidden_act = value
        allowed = "expected one of ['relu', 'gelu']"  # the config's choices, in its order, for both modules
        with pytest.raises(ValueError, match=invalid(type(edited), "hidden_act", value, allowed)):
            module(edited)


# ---------------------------------------------------------------- bulk edits: update() and update_from_string()

# BAD_OVERRIDES as update_from_string can spell them: it parses a value as the type of the field's current value, and
# halting_tolerance is None by default (no type to parse as; transformers refuses the key with a TypeError).
STRING_OVERRIDES = [row for row in BAD_OVERRIDES if row[1] != "halting_tolerance"]


@pytest.mark.parametrize(("family", "name", "value", "allowed"), BAD_OVERRIDES)
def test_update_refuses_a_bad_value_and_changes_nothing(family, name, value, allowed):
    """transformers' `update` assigns key by key; ours checks after the last one and, refused, restores every field
    (the good value applied before the bad one included)."""
    config = FAMILIES[family].config()
    before = config.to_dict()
    good_name, good_value = FAMILIES[family].good
    with pytest.raises(ValueError, match=invalid(type(config), name, value, allowed)):
        config.update({good_name: good_value, name: value})
    assert config.to_dict() == before, {k: v for k, v in config.to_dict().items() if before.get(k) != v}


@pytest.mark.parametrize(("family", "name", "value", "allowed"), STRING_OVERRIDES)
def test_update_from_string_refuses_a_bad_value_and_changes_nothing(family, name, value, allowed):
    config = FAMILIES[family].config()
    before = config.to_dict()
    good_name, good_value = FAMILIES[family].good
    with pytest.raises(ValueError, match=invalid(type(config), name, value, allowed)):
        config.update_from_string(f"{good_name}={good_value},{name}={value}")
    assert config.to_dict() == before, {k: v for k, v in config.to_dict().items() if before.get(k) != v}


@cases(list(FAMILIES.values()))
def test_update_applies_good_values_and_those_a_cross_field_rule_needs_together(case):
    """Checked once after all assignments: hidden_size=18 alone breaks "divisible by num_attention_heads" (4 or 2),
    as does num_attention_heads=3 alone (hidden_size 16 or 32); together they are valid."""
    config = case.config()
    name, value = case.good
    config.update({name: value})
    assert getattr(config, name) == value
    config.update({"hidden_size": 18, "num_attention_heads": 3})
    assert (config.hidden_size, config.num_attention_heads) == (18, 3)
    config.update_from_string("hidden_size=20,num_attention_heads=5")
    assert (config.hidden_size, config.num_attention_heads) == (20, 5)


# ---------------------------------------------------------------- choice fields edited after the model was built


@dataclasses.dataclass(frozen=True)
class Edit:
    """A choice field set to a typo on `model.config` after the build, and the call that reads it."""

    family: str
    name: str
    choices: tuple[str, ...]
    train: bool = False  # a training forward with labels (the depth schedule and deep supervision read there)
    build: tuple[tuple[str, object], ...] = ()  # config overrides under which the field is read at all

    def __str__(self) -> str:
        return f"{self.family}-{self.name}"


EDITS = [
    *(Edit(family, "input_type", ("image", "sequence")) for family in FAMILIES),
    Edit("hyperset", "step_size_condition", ("current", "input")),
    Edit("hyperset", "iteration_conditioning", ("none", "sinusoidal", "sinusoidal-no-mlp")),
    *(
        Edit(family, "iteration_sampling", ("fixed", "uniform", "poisson-lognormal"), train=True)
        for family in ("hyperset", "looped-transformer")
    ),
    *(
        Edit(family, "deep_supervision", ("last", "all", "every", "random"), train=True)
        for family in ("hyperset", "looped-transformer")
    ),
    Edit(
        "hyperset",
        "deep_supervision_weights",
        ("uniform", "linear"),
        train=True,
        build=(("deep_supervision", "all"),),
    ),
    Edit("imixer", "spectral_norm_schedule", ("per_forward", "per_call", "per_optimizer_step"), train=True),
]


@cases(EDITS)
def test_a_choice_field_edited_after_the_build_raises_in_forward(case):
    """A typo (here "bogus") on `model.config` after the build, when the checks of build and save have run, is not
    read as whatever the `else` of an `if field == ...` runs: the forward raises, naming the field, the value and
    the choices."""
    torch.manual_seed(0)
    model = FAMILIES[case.family].head(FAMILIES[case.family].config(**dict(case.build))).train(case.train)
    setattr(model.config, case.name, "bogus")
    labels = torch.tensor([0, 1]) if case.train else None
    allowed = f"expected one of {list(case.choices)}"
    with pytest.raises(ValueError, match=invalid(type(model.config), case.name, "bogus", allowed)):
        model(pixel_values=pixels(model.config), labels=labels)


def test_attention_energy_edited_after_the_build_is_refused_when_the_implementation_is_switched():
    """transformers' `set_attn_implementation` runs after the build: the check of the fused implementations reads
    `attention_energy` through its table, so a typo is named as one, not taken for a non-bi-softmax energy."""
    model = HyperSetForImageClassification(hyperset_config("image"))
    model.config.attention_energy = "bogus"
    allowed = "expected one of ['bisoftmax', 'sigmoid', 'linear']"
    with pytest.raises(ValueError, match=invalid(HyperSetConfig, "attention_energy", "bogus", allowed)):
        model.set_attn_implementation("sdpa")


# ---------------------------------------------------------------- a head called without inputs


def _missing_input_message(input_type: str) -> str:
    if input_type == "image":
        return "this model takes images (config.input_type='image'): pass pixel_values, not input_ids or inputs_embeds."
    return (
        "this model takes tokens (config.input_type='sequence'): pass exactly one of input_ids or inputs_embeds, "
        "and no pixel_values."
    )


@cases(HEADS)
def test_a_head_called_without_inputs_names_the_inputs_it_takes(case):
    with pytest.raises(ValueError, match=re.escape(_missing_input_message(case.input_type))):
        case.build()()


@pytest.mark.parametrize(
    ("head", "input_type"),
    [
        (LoopedTransformerForImageClassification, "image"),
        (LoopedTransformerForSequenceClassification, "sequence"),
        (LoopedTransformerForTokenClassification, "sequence"),
    ],
    ids=lambda v: getattr(v, "__name__", v),
)
def test_a_looped_head_called_without_inputs_names_the_inputs_it_takes(head, input_type):
    model = head(looped_transformer_config(input_type)).eval()
    with pytest.raises(ValueError, match=re.escape(_missing_input_message(input_type))):
        model()


def test_config_classes_are_the_families():
    """Every family of the package and the baseline is covered above."""
    assert {type(family.config()) for family in FAMILIES.values()} == {
        HyperSetConfig,
        IMixerConfig,
        HyperBFConfig,
        LoopedTransformerConfig,
    }


def test_pipeline_model_kwargs_are_checked_when_the_pipeline_is_built(tmp_path):
    """`pipeline(..., model_kwargs=...)` loads through `from_pretrained`: a bad value fails there, with the
    config's message, not at the first call with another one."""
    from energyformers.training.processing import build_image_processor

    torch.manual_seed(0)
    model = HyperSetForImageClassification(hyperset_config("image", num_channels=3))
    model.save_pretrained(tmp_path)
    build_image_processor(model.config).save_pretrained(tmp_path)
    with pytest.raises(
        ValueError, match=invalid(HyperSetConfig, "num_iterations", 0, "expected an integer >= 1")
    ):
        transformers.pipeline("image-classification", model=str(tmp_path), model_kwargs={"num_iterations": 0})
    classify = transformers.pipeline(
        "image-classification", model=str(tmp_path), model_kwargs={"num_iterations": 5}
    )
    assert classify.model.config.num_iterations == 5
