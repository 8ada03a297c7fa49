"""Config validation: one block of generic checks, textually identical in the three configuration files, and
per-family tables (`_CHOICES`, `_POSITIVE_INTS`, ...) plus one `_check_cross_field_rules` method whose every
entry is enforced. Tiny base configs are spelled out here so that this file depends on nothing but the configs."""

from __future__ import annotations

import difflib
import inspect
import math
import re
import sys
import warnings
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
from fixtures import ARCHITECTURE, TINY

from energyformers.configuration import (
    configuration_hyperbf,
    configuration_hyperset,
    configuration_imixer,
    configuration_looped_transformer,
)

ROOT = Path(__file__).resolve().parents[1]
# The marker names no file of tests/: the config files are copied verbatim into Hub repositories, which have none.
BEGIN = "# --- shared config machinery: identical in energyformers' three family configs (its test suite checks) ---"
END = "# --- end of shared config machinery ---"

MODULES: dict[str, ModuleType] = {
    "hyperset": configuration_hyperset,
    "imixer": configuration_imixer,
    "hyperbf": configuration_hyperbf,
}
CONFIGS = {
    "hyperset": configuration_hyperset.HyperSetConfig,
    "imixer": configuration_imixer.IMixerConfig,
    "hyperbf": configuration_hyperbf.HyperBFConfig,
}
# The tiny image configs of tests/fixtures.py, with a vocabulary so that input_type="sequence" is valid too.
BASE: dict[str, dict[str, Any]] = {
    family: dict(
        **ARCHITECTURE[family],
        image_size=tiny.image,
        patch_size=2,
        num_channels=tiny.channels,
        vocab_size=tiny.vocab,
        max_position_embeddings=tiny.positions,
        num_labels=tiny.labels,
    )
    for family, tiny in TINY.items()
}
TABLES = (
    "_CHOICES",
    "_POSITIVE_INTS",
    "_NON_NEGATIVE_INTS",
    "_OPTIONAL_POSITIVE_INTS",
    "_PROBABILITIES",
    "_POSITIVE_FLOATS",
    "_OPTIONAL_POSITIVE_FLOATS",
    "_IMAGE_SIZES",
    "_BOOLEANS",
)
# `__init__` arguments no table covers: vocab_size is checked by the cross-field rule (required for sequences),
# pad_token_id (None or an integer >= 0) beside num_labels, HyperBF's intermediate_size is an alias of num_centers.
UNTABLED = {
    # input_anchor: a float in [0, 1]; feature_map: required by two energies, None otherwise (cross-field rules)
    "hyperset": {"vocab_size", "pad_token_id", "input_anchor", "feature_map"},
    "imixer": {"vocab_size", "pad_token_id"},
    "hyperbf": {"vocab_size", "pad_token_id", "intermediate_size"},
}


def make(family: str, **overrides: Any):
    return CONFIGS[family](**{**BASE[family], **overrides})


# Each cross-field rule of `_check_cross_field_rules`, with overrides that break only that rule, the start of its
# message and the fields its refusal declares (`ConfigValueError.fields`: the refused one, then those the rule reads):
# the rules every family runs (`_check_common_rules`, `shared_cross_field`), then each family's own.
CrossFieldCase = tuple[dict[str, Any], str, tuple[str, ...]]


def shared_cross_field(family: str) -> list[CrossFieldCase]:
    """The cases of the shared rules for `family`, from its tiny config: heads that divide the width (a family with
    heads), patches that tile the image (either side), a vocabulary >= 1 for sequences (None, 0, a bool)."""
    config = make(family)
    cases: list[CrossFieldCase] = []
    if "num_attention_heads" in inspect.signature(CONFIGS[family].__init__).parameters:
        heads = config.num_attention_heads
        assert heads >= 2, f"{family}: a width that no head count divides needs >= 2 heads; got {heads}"
        width = config.hidden_size + heads // 2  # between two multiples of the head count
        message = f"hidden_size={width}; it must be divisible by num_attention_heads={heads}"
        cases.append((dict(hidden_size=width), message, ("hidden_size", "num_attention_heads")))
    patch, side = (
        config.patch_size,
        config.image_size,
    )  # the tiny configs' square images tile: side % patch == 0
    assert isinstance(side, int) and patch >= 2, f"{family}: the cases need a square image, patch >= 2"
    for size in (side + 1, [side, side + 1], [side + 1, side]):  # one side, or the other, off by one
        message = f"image_size={size!r}; both sides must be divisible by patch_size={patch}"
        cases.append((dict(image_size=size), message, ("image_size", "patch_size")))
    for vocab in (None, 0, True):
        message = f'vocab_size={vocab!r}; input_type="sequence" needs'
        cases.append((dict(input_type="sequence", vocab_size=vocab), message, ("vocab_size", "input_type")))
    return cases


OWN_CROSS_FIELD: dict[str, list[CrossFieldCase]] = {
    "hyperset": [
        (
            dict(time_embedding_dim=7),
            "time_embedding_dim=7; expected an even integer >= 4",
            ("time_embedding_dim",),
        ),
        (
            dict(time_embedding_dim=2),
            "time_embedding_dim=2; expected an even integer >= 4",
            ("time_embedding_dim",),
        ),
        (
            dict(iteration_conditioning="sinusoidal-no-mlp", time_embedding_dim=8),
            "time_embedding_dim=8; iteration_conditioning='sinusoidal-no-mlp' adds the sinusoid to the state",
            ("time_embedding_dim", "iteration_conditioning", "hidden_size"),
        ),
        (dict(input_anchor=1.5), "input_anchor=1.5; expected a float in [0, 1]", ("input_anchor",)),
        (dict(input_anchor=-0.1), "input_anchor=-0.1; expected a float in [0, 1]", ("input_anchor",)),
        (dict(input_anchor="0.5"), "input_anchor='0.5'; expected a float in [0, 1]", ("input_anchor",)),
        (
            dict(iteration_sampling="uniform", min_iterations=9, max_iterations=8),
            "min_iterations=9; it must not",
            ("min_iterations", "max_iterations", "iteration_sampling", "num_iterations"),
        ),
        (
            dict(backprop_iterations=7),
            "backprop_iterations=7; it must not exceed num_hidden_layers × num_iter",
            ("backprop_iterations", "num_hidden_layers", "num_iterations"),
        ),
        (
            dict(attention_energy="linear"),
            "feature_map=None; attention_energy='linear' and feedforward",
            ("feature_map", "attention_energy", "feedforward_energy"),
        ),
        (
            dict(feedforward_energy="gated"),
            "feature_map=None; attention_energy='linear' and feedforward",
            ("feature_map", "attention_energy", "feedforward_energy"),
        ),
        (
            dict(attention_energy="linear", feature_map="exp"),
            "feature_map='exp'; attention_energy='linear'",
            ("feature_map", "attention_energy", "feedforward_energy"),
        ),
        (
            dict(feature_map="relu"),
            "feature_map='relu'; only attention_energy='linear' and feedforward",
            ("feature_map", "attention_energy", "feedforward_energy"),
        ),
        (
            dict(position_embedding_type="sincos-2d"),
            "position_embedding_type='sincos-2d'; the row/column table",
            ("position_embedding_type", "input_type"),
        ),
        (
            dict(input_type="sequence", position_embedding_type="sincos-2d", max_position_embeddings=12),
            'max_position_embeddings=12; position_embedding_type="sincos-2d" lays the positions out on a square',
            ("max_position_embeddings", "position_embedding_type"),
        ),
        (
            dict(
                input_type="sequence",
                position_embedding_type="sincos-2d",
                hidden_size=18,
                num_attention_heads=2,
            ),
            'hidden_size=18; position_embedding_type="sincos-2d" gives rows and columns hidden_size/2',
            ("hidden_size", "position_embedding_type"),
        ),
    ],
    "imixer": [
        (
            dict(spectral_norm_coeff=1.0),
            "spectral_norm_coeff=1.0; expected 0 < c < 1",
            ("spectral_norm_coeff",),
        ),
        (
            dict(token_mixing_ratio=0.05),
            "token_mixing_ratio=0.05; it must give a width int(token_mixing_ratio · 16)",
            ("token_mixing_ratio", "hidden_size"),
        ),
        (
            dict(channel_mixing_ratio=0.05),
            "channel_mixing_ratio=0.05; it must give a width",
            ("channel_mixing_ratio", "hidden_size"),
        ),
        (
            dict(hidden_ratio=0.1),
            "hidden_ratio=0.1; it must give a width int(hidden_ratio · 8) >= 1",
            ("hidden_ratio", "token_mixing_ratio", "hidden_size"),
        ),
        (
            dict(anderson_damping=1.5),
            "anderson_damping=1.5; expected a damping in (0, 1]",
            ("anderson_damping",),
        ),
        (
            dict(phantom_gradient_damping=2.0),
            "phantom_gradient_damping=2.0; expected a damping in (0, 1]",
            ("phantom_gradient_damping",),
        ),
        (
            dict(fixed_point_contraction=1.0),
            "fixed_point_contraction=1.0; expected None or a Lipschitz bound",
            ("fixed_point_contraction",),
        ),
        (
            dict(fixed_point_contraction=0.9, contractive_normalization="none"),
            "fixed_point_contraction=0.9; it caps the spectral norm",
            ("fixed_point_contraction", "contractive_normalization"),
        ),
        (
            dict(contractive_normalization="batch_norm", fixed_point_solver="picard"),
            "contractive_normalization='batch_norm'; 'batch_norm' changes F between fixed-point steps",
            ("contractive_normalization", "fixed_point_solver", "fixed_point_gradient"),
        ),
        (
            dict(contractive_normalization="batch_norm", fixed_point_gradient="implicit"),
            "contractive_normalization='batch_norm'; 'batch_norm' changes F between fixed-point steps",
            ("contractive_normalization", "fixed_point_solver", "fixed_point_gradient"),
        ),
        (
            dict(spectral_norm_schedule="per_call", fixed_point_solver="anderson"),
            "spectral_norm_schedule='per_call'; 'per_call' changes F between fixed-point steps",
            ("spectral_norm_schedule", "fixed_point_solver", "fixed_point_gradient"),
        ),
    ],
    "hyperbf": [
        (
            dict(num_centers=8, intermediate_size=9),
            "intermediate_size=9; it is an alias of num_centers=8",
            ("intermediate_size", "num_centers"),
        ),
    ],
}
CROSS_FIELD: dict[str, list[CrossFieldCase]] = {
    family: shared_cross_field(family) + own for family, own in OWN_CROSS_FIELD.items()
}


# Choices valid only together with other fields (their cross-field rules are in CROSS_FIELD).
CHOICE_NEEDS: dict[tuple[str, str, str], dict[str, Any]] = {
    ("hyperset", "position_embedding_type", "sincos-2d"): dict(input_type="sequence"),  # a 4 × 4 board
    ("hyperset", "attention_energy", "linear"): dict(feature_map="elu+1"),
    ("hyperset", "feedforward_energy", "gated"): dict(feature_map="elu+1"),
    ("hyperset", "iteration_conditioning", "sinusoidal-no-mlp"): dict(time_embedding_dim=16),  # = hidden_size
}


def declared_fields(err: BaseException) -> tuple[str, ...] | None:
    """The fields a refusal declares, read as `training/setup.py` reads them (each configuration file defines its
    own `ConfigValueError`)."""
    return getattr(err, "fields", None)


def expect_invalid(family: str, name: str, value: Any, **overrides: Any) -> None:
    """The config rejects `name=value` with "<Config>: invalid <name>=<value>; ..." naming argument and value, and
    the refusal declares `name` as the field it refuses (the first of its `fields`)."""
    message = f"{CONFIGS[family].__name__}: invalid {name}={value!r}; "
    with pytest.raises(ValueError, match="^" + re.escape(message)) as caught:
        make(family, **{name: value, **overrides})
    fields = declared_fields(caught.value)
    assert fields and fields[0] == name, f"{family} {name}={value!r}: declared fields {fields!r}"


def table_cases(table: str) -> list[Any]:
    return [
        pytest.param(family, name, id=f"{family}-{name}")
        for family, module in MODULES.items()
        for name in getattr(module, table)
    ]


# ---------------------------------------------------------------- one form in the three files


def shared_block(family: str) -> str:
    lines = (ROOT / "configuration" / f"configuration_{family}.py").read_text(encoding="utf-8").splitlines()
    assert lines.count(BEGIN) == 1 and lines.count(END) == 1, (
        f"{family}: expected one begin and one end marker"
    )
    start, end = lines.index(BEGIN), lines.index(END)
    assert start < end
    return "\n".join(lines[start : end + 1]) + "\n"


def test_shared_blocks_are_identical_in_the_three_configuration_files():
    reference = shared_block("hyperset")
    assert "def _validate_config(" in reference and "def _require(" in reference
    for family in ("imixer", "hyperbf"):
        block = shared_block(family)
        diff = "".join(
            difflib.unified_diff(
                reference.splitlines(keepends=True),
                block.splitlines(keepends=True),
                "configuration_hyperset.py",
                f"configuration_{family}.py",
            )
        )
        assert block == reference, f"shared blocks differ; copy the Hyper-SET one:\n{diff}"


# What the shared block holds once for every family: the preset constructors and the shared cross-field rules
# (their messages are the CROSS_FIELD entries of every family, checked there).
SHARED_METHODS = ("preset_fields", "from_preset", "_check_common_rules")
SHARED_RULE_MESSAGES = (
    "it must be divisible by num_attention_heads=",
    "both sides must be divisible by patch_size=",
    'input_type="sequence" needs an integer vocab_size >= 1',
)


def test_presets_and_shared_rules_are_written_once_in_the_shared_block():
    """`preset_fields`, `from_preset` and the rules every family shares are defined in the block's `_CheckedConfig`
    alone; no config class (the looped baseline's included) nor any text outside the blocks repeats them."""
    looped = configuration_looped_transformer.LoopedTransformerConfig
    for name in SHARED_METHODS:
        defined = [
            klass.__qualname__
            for module in (*MODULES.values(), configuration_looped_transformer)
            for klass in vars(module).values()
            if isinstance(klass, type) and klass.__module__ == module.__name__ and name in vars(klass)
        ]
        # the baseline's `preset_fields` is its own: it takes its own rows and the shared fields of Hyper-SET's
        expected = ["_CheckedConfig"] * len(MODULES) + (
            ["LoopedTransformerConfig"] if name == "preset_fields" else []
        )
        assert defined == expected, f"{name} is defined in {defined}, expected in {expected}"
    for family in MODULES:
        source = (ROOT / "configuration" / f"configuration_{family}.py").read_text(encoding="utf-8")
        outside = source.replace(shared_block(family), "")
        repeated = [text for text in (*SHARED_RULE_MESSAGES, "def preset_fields(") if text in outside]
        assert not repeated, f"configuration_{family}.py repeats outside the shared block: {repeated}"
    # the inherited constructor builds the class it is called on, the baseline's own rows and Hyper-SET's alike
    presets = [
        *zip(CONFIGS.values(), ("cifar10-small", "s16", "tiny")),
        (looped, "cifar10-small"),
        (looped, "mim-1-12-4d"),
    ]
    for config_class, preset in presets:
        built = config_class.from_preset(preset)
        assert type(built) is config_class, f"{config_class.__name__}.from_preset({preset!r}): {type(built)}"


def test_recurrent_depth_base_has_no_defaults_and_each_subclass_defaults_every_shared_field():
    """`RecurrentDepthConfig.__init__` takes every shared field by keyword, with no default (one there would be a
    copy no call reads: Hyper-SET and its baseline pass every shared field, each with defaults of its own), so a
    subclass that forgot one fails at once; each subclass's signature gives every shared field a default, so a
    config.json saved without the field loads."""
    base = configuration_hyperset.RecurrentDepthConfig
    parameters = inspect.signature(base.__init__).parameters
    shared = [parameters[name] for name in base.shared_fields()]
    assert len(shared) == len(parameters) - 2, list(parameters)  # all but self and kwargs
    loose = [
        (p.name, p.kind.name, p.default)
        for p in shared
        if p.kind is not p.KEYWORD_ONLY or p.default is not p.empty
    ]
    assert loose == [], (
        f"RecurrentDepthConfig.__init__ parameters with a default or not keyword-only: {loose}"
    )
    for subclass in (
        configuration_hyperset.HyperSetConfig,
        configuration_looped_transformer.LoopedTransformerConfig,
    ):
        own = inspect.signature(subclass.__init__).parameters
        undefaulted = [name for name in base.shared_fields() if own[name].default is inspect.Parameter.empty]
        assert undefaulted == [], f"{subclass.__name__}: shared fields without a default {undefaulted}"


@pytest.mark.parametrize(
    "config_class", [*CONFIGS.values(), configuration_looped_transformer.LoopedTransformerConfig]
)
def test_from_preset_without_the_package_names_the_class_and_the_way_out(config_class, monkeypatch):
    """Where `energyformers.presets` cannot be imported (the Hub's remote code without the package), every config's
    `from_preset`, the looped baseline's own presets included, raises the one message of the shared block."""
    monkeypatch.setitem(sys.modules, "energyformers.presets", None)  # its import raises ImportError
    name = config_class.__name__
    expected = (
        f"{name}.from_preset('cifar10-small'): the named presets come with the energyformers package "
        f"(pip install energyformers), which is not installed; build the config from explicit fields instead, e.g. "
        f"{name}(hidden_size=...)."
    )
    with pytest.raises(ImportError, match="^" + re.escape(expected) + "$"):
        config_class.from_preset("cifar10-small")


def test_save_without_the_package_copies_pipeline_code_of_recurrent_depth_configs(tmp_path, monkeypatch):
    """Without the package's remote-code writer (`folder_code_writer` None, as in the copy an exported folder
    carries) `save_pretrained` runs the shared block's `_save_extra_code` hook. Hyper-SET's (`RecurrentDepthConfig`,
    whose masked-image-modelling folders are the only ones with `custom_pipelines`) copies the pipeline file from
    where the config was loaded and warns, at the caller's line, about the module it imports that is missing there;
    the other families' hook writes nothing."""
    source = tmp_path / "source"
    source.mkdir()
    (source / "pipeline_x.py").write_text("from .helper_x import VALUE\n", encoding="utf-8")
    entry = {"task-x": {"impl": "pipeline_x.XPipeline", "pt": ["AutoModel"], "type": "image"}}
    for config_class in (configuration_hyperset.RecurrentDepthConfig, *CONFIGS.values()):
        monkeypatch.setattr(config_class, "folder_code_writer", None)
    for family in CONFIGS:
        config = make(family)
        config.custom_pipelines = dict(entry)
        config.name_or_path = str(source)
        target = tmp_path / family
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            config.save_pretrained(target)
        found = [w for w in caught if "names custom_pipelines" in str(w.message)]
        files = sorted(path.name for path in target.iterdir())
        if family == "hyperset":
            assert files == ["config.json", "pipeline_x.py"], files
            assert len(found) == 1 and "['helper_x.py']" in str(found[0].message), [
                str(w.message) for w in found
            ]
            assert found[0].filename == __file__, (found[0].filename, found[0].lineno)
        else:
            assert (files, found) == (["config.json"], []), (family, files, [str(w.message) for w in found])


@pytest.mark.parametrize("family", MODULES)
def test_tables_have_the_same_form_and_cover_every_argument(family):
    module, config_class = MODULES[family], CONFIGS[family]
    parameters = set(inspect.signature(config_class.__init__).parameters) - {"self", "kwargs"}
    covered: list[str] = []
    for table in TABLES:
        entries = getattr(module, table)
        if table == "_CHOICES":
            assert isinstance(entries, dict)
            assert all(
                isinstance(c, tuple) and c and all(isinstance(x, str) for x in c) for c in entries.values()
            )
        else:
            assert isinstance(entries, tuple) and all(isinstance(name, str) for name in entries)
        covered += list(entries)
    assert len(covered) == len(set(covered)), "a field is in two tables"
    assert set(covered) <= parameters, f"table entries that are not arguments: {set(covered) - parameters}"
    assert parameters - set(covered) == UNTABLED[family], "an argument is in no table; add it to one"
    assert "_check_cross_field_rules" in vars(config_class)
    assert list(inspect.signature(config_class._check_cross_field_rules).parameters) == ["self"]


@pytest.mark.parametrize("family", MODULES)
def test_base_config_and_defaults_are_valid(family):
    """The validation accepts the tiny configs and the defaults, and what it accepts survives a round trip."""
    for config in (make(family), make(family, input_type="sequence"), CONFIGS[family]()):
        assert CONFIGS[family].from_dict(config.to_dict()).to_dict() == config.to_dict()
    assert make(family, input_type="sequence").input_type == "sequence"


# ---------------------------------------------------------------- every table entry is enforced


@pytest.mark.parametrize(("family", "name"), table_cases("_CHOICES"))
def test_choice_fields_reject_unknown_strings_and_accept_every_choice(family, name):
    choices = MODULES[family]._CHOICES[name]
    expect_invalid(family, name, "bogus")
    with pytest.raises(ValueError, match=re.escape(f"expected one of {list(choices)}")):
        make(family, **{name: "bogus"})
    expect_invalid(family, name, None)
    for choice in choices:
        needs = CHOICE_NEEDS.get((family, name, choice), {})
        assert getattr(make(family, **{name: choice, **needs}), name) == choice


@pytest.mark.parametrize(("family", "name"), table_cases("_POSITIVE_INTS"))
def test_positive_int_fields_reject_zero_negatives_bools_and_floats(family, name):
    valid = getattr(make(family), name)
    for value in (0, -1, True, float(valid), str(valid)):  # None is a default for some (HyperBF num_centers)
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: valid}), name) == valid


@pytest.mark.parametrize(("family", "name"), table_cases("_NON_NEGATIVE_INTS"))
def test_non_negative_int_fields_accept_zero_and_reject_negatives_bools_and_floats(family, name):
    for value in (-1, False, True, 0.0, 1.5, None):
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: 0}), name) == 0


@pytest.mark.parametrize(("family", "name"), table_cases("_OPTIONAL_POSITIVE_INTS"))
def test_optional_positive_int_fields_accept_none_and_reject_zero_bools_and_floats(family, name):
    for value in (0, -1, True, 1.5, "2"):
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: None}), name) is None
    assert getattr(make(family, **{name: 2}), name) == 2


@pytest.mark.parametrize(("family", "name"), table_cases("_PROBABILITIES"))
def test_probability_fields_reject_values_outside_zero_one(family, name):
    for value in (-0.1, 1.5, 1.0, False, math.nan, "0.1", None):
        expect_invalid(family, name, value)
    for value in (0, 0.0, 0.5):
        assert getattr(make(family, **{name: value}), name) == value


@pytest.mark.parametrize(("family", "name"), table_cases("_POSITIVE_FLOATS"))
def test_positive_float_fields_reject_non_positive_non_finite_and_non_numbers(family, name):
    for value in (0, 0.0, -1.0, True, math.inf, math.nan, "0.5", None):
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: 0.5}), name) == 0.5


@pytest.mark.parametrize(("family", "name"), table_cases("_OPTIONAL_POSITIVE_FLOATS"))
def test_optional_positive_float_fields_accept_none(family, name):
    for value in (0.0, -1.0, True, math.inf, "0.5"):
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: None}), name) is None
    assert getattr(make(family, **{name: 0.5}), name) == 0.5


@pytest.mark.parametrize(("family", "name"), table_cases("_BOOLEANS"))
def test_boolean_fields_take_only_true_or_false(family, name):
    for value in (0, 1, "True", None, 1.0):
        expect_invalid(family, name, value)
    for value in (True, False):
        assert getattr(make(family, **{name: value}), name) is value


@pytest.mark.parametrize(("family", "name"), table_cases("_IMAGE_SIZES"))
def test_image_size_fields_take_an_int_or_a_pair(family, name):
    for value in (0, -8, True, 8.0, "8", "88", None, [8], [8, 8, 8], [8, 8.0], [8, 0], [True, 8]):
        expect_invalid(family, name, value)
    assert getattr(make(family, **{name: 8}), name) == 8
    assert getattr(make(family, **{name: [8, 16]}), name) == [8, 16]
    assert getattr(make(family, **{name: (8, 16)}), name) == [8, 16]  # JSON-friendly, as saved


@pytest.mark.parametrize("family", [f for f in MODULES if "hidden_dropout_prob" in MODULES[f]._PROBABILITIES])
def test_hidden_dropout_prob_above_one_is_rejected(family):
    expect_invalid(family, "hidden_dropout_prob", 1.5)


@pytest.mark.parametrize(
    ("family", "overrides", "message", "fields"),
    [
        pytest.param(family, overrides, message, fields, id=f"{family}-{message.split(';')[0]}")
        for family, rules in CROSS_FIELD.items()
        for overrides, message, fields in rules
    ],
)
def test_every_cross_field_rule_fires_and_declares_the_fields_it_reads(family, overrides, message, fields):
    with pytest.raises(
        ValueError, match=re.escape(f"{CONFIGS[family].__name__}: invalid {message}")
    ) as caught:
        make(family, **overrides)
    assert declared_fields(caught.value) == fields, (family, message, declared_fields(caught.value), fields)


# ---------------------------------------------------------------- num_labels (ViT: 0 = no classifier)


@pytest.mark.parametrize("family", sorted(CONFIGS))
@pytest.mark.parametrize("input_type", ["image", "sequence"])
def test_cli_presets_build_the_input_type_they_name(family, input_type):
    """The CLI's from-scratch sizes are named presets (`cli-image`, `cli-sequence`) of every family; the data
    adds the rest (here a vocabulary for sequences, as the CLI's tokenizer does)."""
    fields = CONFIGS[family].preset_fields(f"cli-{input_type}")
    data = {"vocab_size": 100} if input_type == "sequence" else {}
    assert CONFIGS[family].from_preset(f"cli-{input_type}", **data).input_type == input_type
    fields["hidden_size"] = -1
    assert CONFIGS[family].preset_fields(f"cli-{input_type}")["hidden_size"] > 0  # a copy, not the table


@pytest.mark.parametrize("family", MODULES)
def test_num_labels_zero_is_accepted_and_survives_a_round_trip(family, tmp_path):
    config = make(family, num_labels=0)
    assert config.num_labels == 0 and config.id2label == {}
    config.save_pretrained(tmp_path)
    assert CONFIGS[family].from_pretrained(tmp_path).num_labels == 0
    assert CONFIGS[family].from_dict(config.to_dict()).num_labels == 0
    assert CONFIGS[family]().num_labels == 2  # transformers' default is untouched
    base = {key: value for key, value in BASE[family].items() if key != "num_labels"}
    assert CONFIGS[family](**base, id2label={0: "a", 1: "b", 2: "c"}).num_labels == 3
    presets = {"hyperset": "cifar10-small", "imixer": "s16", "hyperbf": "tiny"}
    assert CONFIGS[family].from_preset(presets[family], num_labels=0).num_labels == 0


@pytest.mark.parametrize("family", MODULES)
def test_num_labels_must_be_a_non_negative_integer(family):
    for value in (-1, -10, True, 2.0, "3", None):
        with pytest.raises(
            ValueError, match=re.escape(f"invalid num_labels={value!r}; expected an integer >= 0")
        ) as caught:
            make(family, num_labels=value)
        assert declared_fields(caught.value) == ("num_labels",), (
            family,
            value,
            declared_fields(caught.value),
        )


def test_configuration_files_point_to_no_file_a_hub_user_lacks():
    """The configuration files are the Hub's remote code, read through `help()`: a pointer to the repository's
    docs/, benchmarks/ or tests/ leads nowhere there (the shared block's begin marker, which these tests find,
    is the one exception)."""
    pointers = [
        f"{path.name}:{number}: {line.strip()}"
        for path in sorted((ROOT / "configuration").glob("configuration_*.py"))
        for number, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1)
        if line != BEGIN and re.search(r"\b(docs|benchmarks|tests)/", line)
    ]
    assert not pointers, "lines naming repository files:\n" + "\n".join(pointers)


def test_choice_tables_are_public_read_only_views_on_the_config_classes():
    """`Config.choices` is the file's `_CHOICES` table, readable through the config class alone (the one import a
    modeling file has) and not writable, so a model keys its implementations by it rather than by a copy of the names;
    it is class data, never a field config.json carries."""
    hyperset = configuration_hyperset.HyperSetConfig
    looped = configuration_looped_transformer.LoopedTransformerConfig
    for family, module in MODULES.items():
        view = CONFIGS[family].choices
        assert dict(view) == module._CHOICES, (family, dict(view), module._CHOICES)
        with pytest.raises(TypeError):
            view["input_type"] = ("image",)  # type: ignore[index]
        assert "choices" not in make(family).to_dict()
    assert hyperset.choices["iteration_sampling"] == ("fixed", "uniform", "poisson-lognormal")
    assert hyperset.choices["deep_supervision"] == ("last", "all", "every", "random")
    assert CONFIGS["imixer"].choices["token_mixing_activation"] == tuple(
        configuration_imixer.ACTIVATION_MAX_SLOPES
    )
    # the baseline's view: its own choice fields, the Hyper-SET options it refuses left out
    expected = {
        name: values
        for name, values in configuration_hyperset._CHOICES.items()
        if name not in configuration_looped_transformer.HYPERSET_ONLY_FIELDS
    }
    assert dict(looped.choices) == expected, dict(looped.choices)
    assert {"iteration_sampling", "deep_supervision"} <= set(looped.choices)


# ---------------------------------------------------------------- refusals declare their fields

# One value each table refuses, whatever the field.
REFUSED_BY_TABLE = {
    "_CHOICES": "bogus",
    "_POSITIVE_INTS": 0,
    "_NON_NEGATIVE_INTS": -1,
    "_OPTIONAL_POSITIVE_INTS": 0,
    "_PROBABILITIES": 1.5,
    "_POSITIVE_FLOATS": 0.0,
    "_OPTIONAL_POSITIVE_FLOATS": -1.0,
    "_IMAGE_SIZES": 0,
    "_BOOLEANS": "yes",
}
LOOPED = configuration_looped_transformer.LoopedTransformerConfig
LOOPED_FIELDS = set(inspect.signature(LOOPED.__init__).parameters) - {"self", "kwargs"}


def test_every_table_has_a_refused_value():
    assert set(REFUSED_BY_TABLE) == set(TABLES)


@pytest.mark.parametrize(
    ("table", "name"),
    [
        pytest.param(table, name, id=name)
        for table in TABLES
        for name in getattr(configuration_hyperset, table)
        if name in LOOPED_FIELDS
    ],
)
def test_the_looped_baseline_declares_the_field_of_a_refused_value(table, name):
    """The baseline validates against Hyper-SET's tables (its shared fields): each refusal names its field."""
    value = REFUSED_BY_TABLE[table]
    with pytest.raises(
        ValueError, match=re.escape(f"LoopedTransformerConfig: invalid {name}={value!r}; ")
    ) as caught:
        LOOPED(**{name: value})
    assert declared_fields(caught.value) == (name,), (name, declared_fields(caught.value))


@pytest.mark.parametrize("name", configuration_looped_transformer.HYPERSET_ONLY_FIELDS)
def test_a_hyperset_option_refused_by_the_looped_baseline_declares_it(name):
    value = getattr(configuration_hyperset.HyperSetConfig(), name)
    with pytest.raises(
        ValueError, match=re.escape("a Hyper-SET option that the looped-Transformer")
    ) as caught:
        LOOPED(**{name: value})
    assert declared_fields(caught.value) == (name,), (name, declared_fields(caught.value))


@pytest.mark.parametrize("config_class", [*CONFIGS.values(), LOOPED])
def test_an_unknown_override_declares_its_name_and_fields_survive_pickling(config_class):
    import pickle

    with pytest.raises(ValueError, match="unknown override hidden_sise=8") as caught:
        config_class.from_preset("cli-image", hidden_sise=8)
    assert declared_fields(caught.value) == ("hidden_sise",), declared_fields(caught.value)
    # an error crossing a process boundary (a DataLoader worker, a launcher) keeps what it declares
    copy = pickle.loads(pickle.dumps(caught.value))
    assert (type(copy), str(copy), declared_fields(copy)) == (
        type(caught.value),
        str(caught.value),
        ("hidden_sise",),
    )


# ------------------------------------------------------------------ `num_layers`: the specification's name of L

RECURRENT_DEPTH_CONFIGS = [
    configuration_hyperset.HyperSetConfig,
    configuration_looped_transformer.LoopedTransformerConfig,
]


@pytest.mark.parametrize("config_class", RECURRENT_DEPTH_CONFIGS, ids=lambda c: c.__name__)
def test_num_layers_reads_and_sets_num_hidden_layers(config_class):
    """transformers' `attribute_map`: the constructor, attribute reads and writes; config.json keeps the field."""
    config = config_class(num_layers=3)
    assert (config.num_hidden_layers, config.num_layers) == (3, 3), vars(config)
    assert "num_layers" not in config.to_dict() and config.to_dict()["num_hidden_layers"] == 3
    assert config_class.from_dict(config.to_dict()).num_hidden_layers == 3
    config.num_layers = 2
    assert config.num_hidden_layers == 2
    assert config_class(num_layers=3, num_hidden_layers=3).num_hidden_layers == 3  # agreeing: accepted


@pytest.mark.parametrize("config_class", RECURRENT_DEPTH_CONFIGS, ids=lambda c: c.__name__)
def test_num_layers_is_checked_and_refused_beside_a_disagreeing_num_hidden_layers(config_class):
    with pytest.raises(ValueError, match=r"invalid num_hidden_layers=0; expected an integer >= 1"):
        config_class(num_layers=0)
    with pytest.raises(ValueError, match=r"invalid num_layers=2; it is an alias of num_hidden_layers=3"):
        config_class(num_layers=2, num_hidden_layers=3)


def test_num_layers_builds_that_many_layers():
    from energyformers import HyperSetModel

    config = configuration_hyperset.HyperSetConfig(
        num_layers=2, hidden_size=16, num_attention_heads=2, intermediate_size=16, image_size=8, patch_size=4
    )
    assert len(HyperSetModel(config).layers) == 2


def test_from_preset_takes_num_layers_over_the_presets_num_hidden_layers(monkeypatch):
    """An alias override replaces the preset's value of its field, as the field's own name would."""
    config_class = configuration_hyperset.HyperSetConfig
    assert config_class.from_preset("cifar10-small", num_layers=2).num_hidden_layers == 2
    # a preset that sets the field to a value other than the default (no such row today)
    monkeypatch.setattr(
        config_class, "preset_fields", classmethod(lambda cls, name: {"num_hidden_layers": 3})
    )
    assert config_class.from_preset("any", num_layers=2).num_hidden_layers == 2
