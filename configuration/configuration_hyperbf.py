# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""HyperBF (homogeneous Transformer) configuration.

Gan, Poggio, *A Homogeneous Transformer Architecture* (CBMM memo 143). Every block is two HyperBF
(Gaussian radial-basis) units: a distance-based attention over the tokens, then a normalized RBF layer
over learned centers with a learned metric in place of the MLP.
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import numbers
import os
from collections.abc import Callable
from types import MappingProxyType
from typing import Any, ClassVar, TypeVar

from transformers import PreTrainedConfig


# --- shared config machinery: identical in energyformers' three family configs (its test suite checks) ---
# Per family only the tables below this block (_CHOICES, _POSITIVE_INTS, ...) and the config's
# `_check_cross_field_rules` differ; that method starts from `_check_common_rules`, the rules every family shares.
# The block is duplicated rather than shared because each file is copied verbatim into Hub remote code, which may
# import only the standard library and transformers.
def _is_int(value: Any) -> bool:
    """An integer: Python's or any other `numbers.Integral` (numpy's, from a sweep over `np.arange`); not a bool, a
    float of integral value or a tensor. `_validate_config` stores it as Python's (`_python_ints`)."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _python_ints(value: Any) -> Any:
    """`value` with an integer of another type than `int` (numpy's), alone or in a list or tuple (`image_size`),
    made Python's, which `to_json_string` can write; anything else as it is."""
    if _is_int(value) and type(value) is not int:
        return int(value)
    if isinstance(value, (list, tuple)) and any(_is_int(item) and type(item) is not int for item in value):
        items = [_python_ints(item) for item in value]
        return items if isinstance(value, list) else tuple(items)
    return value


def _is_real(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def _image_sides(value: Any) -> tuple[int, int]:
    """(height, width) of an `image_size` that is an integer >= 1 or a [height, width] pair of them; else (0, 0)."""
    sides = (value, value) if _is_int(value) else value
    if isinstance(sides, (list, tuple)) and len(sides) == 2 and all(_is_int(s) and s >= 1 for s in sides):
        return sides[0], sides[1]
    return 0, 0


class ConfigValueError(ValueError):
    """A config value refused, saying which fields the refusal involves: `fields` is the refused field first, then
    every other field the rule that refused it reads (`("hidden_size", "num_attention_heads")` for heads that do
    not divide the width), so a caller can tell which settings a refusal depends on without reading its message.
    Each configuration file defines its own copy of this class (Hub remote code shares no module), so a caller reads
    `fields` by duck typing (`getattr(err, "fields", None)`) rather than by catching one class."""

    def __init__(self, message: str, fields: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.fields = tuple(fields)


def _require(
    config: PreTrainedConfig,
    condition: bool,
    name: str,
    value: Any,
    allowed: str,
    where: str | None = None,
    depends_on: tuple[str, ...] = (),
) -> None:
    """`where`: what the message names as the source of the value, the config's class unless a call passed it
    (e.g. `"IMixerForImageClassification.forward"` for a per-call override). `depends_on`: the other fields the
    rule reads, which the error's `fields` names after `name` (a cross-field rule's; none for a table check)."""
    if not condition:
        message = f"{where or type(config).__name__}: invalid {name}={value!r}; {allowed}."
        raise ConfigValueError(message, (name, *depends_on))


def _transformers_keywords() -> frozenset[str]:
    """The keyword arguments `PreTrainedConfig` itself takes (`num_labels`, `id2label`, `label2id`, `problem_type`,
    `dtype`, `attn_implementation`, ...): its fields, its settable properties and the keywords its `__post_init__`
    reads, plus the special-token ids that transformers' tokenizers and pipelines look up on a config."""
    if dataclasses.is_dataclass(PreTrainedConfig):
        names = {field.name for field in dataclasses.fields(PreTrainedConfig)}
    else:  # a transformers whose configs are not dataclasses: its keywords are `__init__` parameters
        names = set(inspect.signature(PreTrainedConfig.__init__).parameters) - {"self", "kwargs"}
    for klass in PreTrainedConfig.__mro__:
        names |= {
            name
            for name, value in vars(klass).items()
            if isinstance(value, property) and value.fset is not None and not name.startswith("_")
        }
    popped = ("attn_implementation", "experts_implementation", "torch_dtype", "name_or_path", "num_labels")
    tokens = ("pad_token_id", "bos_token_id", "eos_token_id", "sep_token_id")
    return frozenset(names.union(popped, tokens))


def _fields_of(config: PreTrainedConfig, names: tuple[str, ...]) -> list[str]:
    """The names among `names` that `config` sets: a file's tables cover every config class defined in it (Hyper-SET's
    file also holds the base its looped-Transformer baseline shares, which sets only part of them)."""
    return [name for name in names if name in vars(config)]


def _validate_config(config: PreTrainedConfig, kwargs: dict[str, Any]) -> None:
    """Check the fields set by `__init__` against the tables, then `num_labels`, then the cross-field rules; integer
    fields given as numpy integers are stored as Python's first."""
    for name, value in list(vars(config).items()):
        converted = _python_ints(value)
        if converted is not value and not name.startswith("_"):
            setattr(config, name, converted)
    for name in _fields_of(config, tuple(_CHOICES)):
        value = getattr(config, name)
        _require(config, value in _CHOICES[name], name, value, f"expected one of {list(_CHOICES[name])}")
    for name in _fields_of(config, _POSITIVE_INTS):
        value = getattr(config, name)
        _require(config, _is_int(value) and value >= 1, name, value, "expected an integer >= 1")
    for name in _fields_of(config, _NON_NEGATIVE_INTS):
        value = getattr(config, name)
        _require(config, _is_int(value) and value >= 0, name, value, "expected an integer >= 0")
    for name in _fields_of(config, _OPTIONAL_POSITIVE_INTS):
        value = getattr(config, name)
        ok = value is None or (_is_int(value) and value >= 1)
        _require(config, ok, name, value, "expected None or an integer >= 1")
    for name in _fields_of(config, _PROBABILITIES):
        value = getattr(config, name)
        _require(config, _is_real(value) and 0 <= value < 1, name, value, "expected a float in [0, 1)")
    for name in _fields_of(config, _POSITIVE_FLOATS):
        value = getattr(config, name)
        _require(config, _is_real(value) and value > 0, name, value, "expected a float > 0 (finite)")
    for name in _fields_of(config, _OPTIONAL_POSITIVE_FLOATS):
        value = getattr(config, name)
        ok = value is None or (_is_real(value) and value > 0)
        _require(config, ok, name, value, "expected None or a float > 0 (finite)")
    for name in _fields_of(config, _BOOLEANS):
        value = getattr(config, name)
        _require(config, isinstance(value, bool), name, value, "expected True or False")
    for name in _fields_of(config, _IMAGE_SIZES):
        value = getattr(config, name)
        ok = _image_sides(value) != (0, 0)
        _require(config, ok, name, value, "expected an integer >= 1 or a [height, width] pair of them")
    # transformers would turn a negative count into no labels; 0 itself is valid (no classifier, as in ViT).
    if "num_labels" in kwargs:
        value = kwargs["num_labels"]
        _require(
            config,
            _is_int(value) and value >= 0,
            "num_labels",
            value,
            "expected an integer >= 0 (0: no classifier, as in ViT)",
        )
    # a token id (transformers itself only warns about one outside the vocabulary)
    if "pad_token_id" in vars(config):
        value = config.pad_token_id
        ok = value is None or (_is_int(value) and value >= 0)
        _require(
            config,
            ok,
            "pad_token_id",
            value,
            "expected None or an integer >= 0 (the tokenizer's pad_token_id)",
        )
    config._check_cross_field_rules()


# What `from_preset` returns: an instance of the class it is called on.
_Config = TypeVar("_Config", bound="_CheckedConfig")


class _CheckedConfig:
    """The hooks every config of this file shares, so that a config is checked however it was made, not only by
    `__init__`:

    * `from_dict` (what `from_pretrained`, `AutoConfig.from_pretrained` and the model classes' `from_pretrained`
      call) checks the config again after transformers has applied the keyword overrides by attribute assignment,
      which bypasses `__init__`: a bad override raises the constructor's `ValueError` before any weights are read.
    * `validate` runs the checks on the config as it is now; transformers' `save_pretrained` calls it, and so do
      the model classes when they are built, so a config edited by attribute assignment is refused there too.
    * `update` and `update_from_string` (transformers' bulk edits) check at once: a refused value raises the
      constructor's `ValueError` and changes nothing. A single attribute assignment is not checked (a cross-field
      rule may need two); the models read their choice fields through a table that refuses an unknown value.
    * `save_pretrained` keeps an exported folder whole: a config read from an export (it has `auto_map`) first has
      `folder_code_writer` write that folder's remote code beside it, so `auto_map` and `custom_pipelines` never
      name files the saved folder lacks (transformers' `custom_object_save` does this only for classes loaded as
      remote code). The energyformers package sets the writer when it is imported; it stays None in the copy an
      exported folder carries, where `custom_object_save` copies the model's and config's files and this module
      may not import the package's generator; there `_save_extra_code` writes what else the folder's config.json
      names (a masked-image-modelling folder's pipeline files, `RecurrentDepthConfig`'s override).

    It also holds what every family's config does alike: the named presets (`preset_fields`, `from_preset`) and
    the cross-field rules they share (`_check_common_rules`).
    """

    folder_code_writer: ClassVar[Callable[[Any, str | os.PathLike], Any] | None] = None

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        loaded = super().from_dict(config_dict, **kwargs)  # (config, unused kwargs) with return_unused_kwargs
        (loaded[0] if isinstance(loaded, tuple) else loaded).validate()
        return loaded

    def update(self, config_dict: dict[str, Any]) -> None:
        """transformers' `update` (attribute assignment of every key), then the checks, all or nothing: a refused
        value raises the constructor's `ValueError` and leaves every field as it was."""
        self._apply_checked(lambda: super(_CheckedConfig, self).update(config_dict))

    def update_from_string(self, update_str: str) -> None:
        """transformers' `update_from_string` (`"a=1,b=x"`, each value parsed as the type of the field's current
        value), then the checks, all or nothing as `update`."""
        self._apply_checked(lambda: super(_CheckedConfig, self).update_from_string(update_str))

    def _apply_checked(self, apply: Callable[[], None]) -> None:
        """Run `apply` (attribute assignments), then `validate`; on any error restore the fields as they were and
        re-raise. The checks run once, after every assignment, because a cross-field rule may need two new values
        (hidden_size and num_attention_heads) that no single assignment could satisfy alone; they are not run on
        each `setattr`, which transformers' own `__init__` and `from_dict` use field by field."""
        before = dict(vars(self))  # every field, the label maps and the attention implementation included
        try:
            apply()
            self.validate()
        except BaseException:  # nothing half-applied, whatever stopped it (a parse error, an interrupt)
            vars(self).clear()
            vars(self).update(before)
            raise

    @classmethod
    def _check_override_names(cls, overrides: dict[str, Any], where: str) -> None:
        """Refuse a keyword override (`from_preset`) that is neither a field of this config nor a `PreTrainedConfig`
        keyword, naming the closest names: transformers keeps any other keyword as an attribute that nothing reads,
        so a misspelt field would leave the preset's value in place without a word. `where`: the method named."""
        fields = [
            name for name in inspect.signature(cls.__init__).parameters if name not in ("self", "kwargs")
        ]
        known = {*fields, *cls.attribute_map, *_transformers_keywords()}
        for name, value in overrides.items():
            if name in known:
                continue
            close = difflib.get_close_matches(name, sorted(known), n=3, cutoff=0.6)
            hint = f"closest names: {close}" if close else f"{cls.__name__}'s fields are {sorted(fields)}"
            raise ConfigValueError(
                f"{cls.__name__}.{where}: unknown override {name}={value!r}; not a field of {cls.__name__} nor a "
                f"transformers config keyword (num_labels, id2label, label2id, problem_type, ...); {hint}.",
                (name,),
            )

    @classmethod
    def preset_fields(cls, name: str) -> dict[str, Any]:
        """The fields preset `name` sets, as a new dict (the caller may change it).

        The presets are the rows of the package's `energyformers.presets` (`PRESET_SOURCES` there says which paper
        setting or released model each row reproduces); the Hub's remote code carries none of them, so without
        the package there are no presets, only explicit fields.
        """
        try:
            from energyformers.presets import preset_fields
        except ImportError:  # remote code loaded without the package (the import check skips try blocks)
            raise cls._presets_need_the_package(name) from None
        return preset_fields(cls, name)

    @classmethod
    def _presets_need_the_package(cls, name: str) -> ImportError:
        """The error of `from_preset(name)` where the energyformers package, which holds the presets, cannot be
        imported (the Hub's remote code carries no presets)."""
        return ImportError(
            f"{cls.__name__}.from_preset({name!r}): the named presets come with the energyformers package "
            f"(pip install energyformers), which is not installed; build the config from explicit fields "
            f"instead, e.g. {cls.__name__}(hidden_size=...)."
        )

    @classmethod
    def from_preset(cls: type[_Config], name: str, **overrides: Any) -> _Config:
        """The config of preset `name` (`preset_fields`), with keyword `overrides` on top.

        An override is a field of this config or a transformers config keyword (`num_labels`, `id2label`, ...;
        an `id2label` replaces the preset's `num_labels`); any other name raises `ValueError` naming the closest
        ones, so a misspelt field never leaves the preset's value in place.
        """
        fields = cls.preset_fields(name)  # an unknown name is refused before the overrides are looked at
        cls._check_override_names(overrides, "from_preset")
        # an alias (transformers' attribute_map) sets its field, so the preset's value of that field gives way to it
        for alias, field in cls.attribute_map.items():
            if alias in overrides:
                fields.pop(field, None)
        kwargs = {**fields, **overrides}
        if "id2label" in overrides:
            kwargs.pop("num_labels", None)
        return cls(**kwargs)

    def _check_common_rules(self) -> None:
        """The cross-field rules of every family, which each config's `_check_cross_field_rules` runs: heads
        that divide the width (for a config with heads: iMixer has none), patches that tile the image, and a
        vocabulary for sequences."""
        if "num_attention_heads" in vars(self):
            _require(
                self,
                self.hidden_size % self.num_attention_heads == 0,
                "hidden_size",
                self.hidden_size,
                f"it must be divisible by num_attention_heads={self.num_attention_heads}",
                depends_on=("num_attention_heads",),
            )
        _require(
            self,
            all(side % self.patch_size == 0 for side in _image_sides(self.image_size)),
            "image_size",
            self.image_size,
            f"both sides must be divisible by patch_size={self.patch_size}",
            depends_on=("patch_size",),
        )
        _require(
            self,
            self.input_type != "sequence" or (_is_int(self.vocab_size) and self.vocab_size >= 1),
            "vocab_size",
            self.vocab_size,
            'input_type="sequence" needs an integer vocab_size >= 1',
            depends_on=("input_type",),
        )

    def validate(self) -> None:
        """transformers' own checks (architectures, layer types, RoPE, token ids; where this transformers has
        them), then the constructor's: a `ValueError` if a field now holds a value `__init__` would refuse."""
        parent = getattr(super(), "validate", None)
        if parent is not None:
            parent()
        _validate_config(self, {})

    def save_pretrained(
        self, save_directory: str | os.PathLike, push_to_hub: bool = False, **kwargs: Any
    ) -> None:
        self.validate()  # before the remote code is written: a refused config leaves no partial folder
        writer = type(self).folder_code_writer  # read on the class: a plain function, not a bound method
        if writer is not None and self.__dict__.get("auto_map"):
            writer(self, save_directory)
        elif writer is None:  # the copy an exported folder carries, run by transformers alone
            self._save_extra_code(save_directory)
        super().save_pretrained(save_directory, push_to_hub=push_to_hub, **kwargs)

    def _save_extra_code(self, save_directory: str | os.PathLike) -> None:
        """Hook of `save_pretrained` without the package (no `folder_code_writer`): write beside config.json the code
        files it names that transformers' own save does not copy. Nothing by default; `RecurrentDepthConfig` copies
        the pipeline files of its `custom_pipelines`."""


# --- end of shared config machinery ---


# Validation tables of HyperBF (the form is the same in the three configuration files).
_CHOICES: dict[str, tuple[str, ...]] = {
    "input_type": ("image", "sequence"),
    "feedforward_kernel": ("normalized", "gaussian"),
    "rbf_width": ("layer", "center"),
    "pooling": ("cls", "mean"),
}
_POSITIVE_INTS: tuple[str, ...] = (
    "hidden_size",
    "num_attention_heads",
    "num_hidden_layers",
    "num_centers",
    "rbf_projection_dim",
    "patch_size",
    "num_channels",
    "max_position_embeddings",
)
_NON_NEGATIVE_INTS: tuple[str, ...] = ()
_OPTIONAL_POSITIVE_INTS: tuple[str, ...] = ()
_PROBABILITIES: tuple[str, ...] = ("hidden_dropout_prob", "attention_probs_dropout_prob")
_POSITIVE_FLOATS: tuple[str, ...] = ("layer_norm_eps", "initializer_range")
_OPTIONAL_POSITIVE_FLOATS: tuple[str, ...] = ("rbf_sigma_init", "attention_temperature_init")
_IMAGE_SIZES: tuple[str, ...] = ("image_size",)
_BOOLEANS: tuple[str, ...] = ()


class HyperBFConfig(_CheckedConfig, PreTrainedConfig):
    r"""Configuration of a HyperBF model (`model_type="hyperbf"`).

    Args:
        input_type (`str`, *optional*, defaults to `"image"`):
            `"image"` (patch embedding + CLS token) or `"sequence"` (token embedding of `input_ids`).
        hidden_size (`int`, *optional*, defaults to 768):
            Token width D (the memo's CIFAR setting).
        num_attention_heads (`int`, *optional*, defaults to 4):
            Heads of the Gaussian-kernel attention (the memo uses 4).
        num_hidden_layers (`int`, *optional*, defaults to 4):
            Blocks (the memo uses 4).
        num_centers (`int`, *optional*):
            Learned RBF centers K of each feedforward unit; `None` → 4·hidden_size, which gives a block of
            13·D² + 6·D + H + 1 parameters (H heads), less than 1/12 more than a ViT block with MLP ratio 4
            (12·D² + 13·D).
            `intermediate_size` is an alias (the centers play the role of the MLP's hidden units).
        rbf_projection_dim (`int`, *optional*):
            Rows R of the metric W (‖a − b‖²_W = ‖W(a − b)‖², PSD by construction); `None` → hidden_size (full rank).
        feedforward_kernel (`str`, *optional*, defaults to `"normalized"`):
            `"normalized"`: softmax over centers (normalized RBF, the memo's choice); `"gaussian"`: unnormalised
            exp(−d²/2σ²) as in classic HyperBF networks.
        rbf_width (`str`, *optional*, defaults to `"layer"`):
            Learnable width σ of the feedforward kernel: one per layer (`"layer"`; the normalized kernel then drops
            ‖Wx‖², the same for every center) or one per center (`"center"`).
        rbf_sigma_init (`float`, *optional*):
            Initial σ of the feedforward kernel; `None` → √(rbf_projection_dim / ln num_centers). At init
            ‖W(x − t)‖² ≈ 2·rbf_projection_dim for LayerNorm'd inputs (metric std 1/√D, centers N(0, 1)), so every
            Gaussian weight starts near 1/K (total mass ≈ 1, as for the normalized kernel) instead of underflowing
            to 0 as in the public code.
        attention_temperature_init (`float`, *optional*):
            Initial τ of the attention score −τ‖q − k‖²; `None` → 1/(2√head_dim) so that 2τ equals the
            1/√d_h scale of dot-product attention.
        hidden_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout on embeddings and on each residual branch (the memo trains without it).
        attention_probs_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout on the attention weights (0 = off, ViT's default).
        image_size (`int` or `list[int]`, *optional*, defaults to 32):
            Input resolution (height, width): the memo's CIFAR setting, 32 × 32; non-square sizes are allowed.
        patch_size (`int`, *optional*, defaults to 4):
            Side of the square patches (the memo's CIFAR setting).
        num_channels (`int`, *optional*, defaults to 3):
            Image channels (RGB).
        vocab_size (`int`, *optional*):
            Token vocabulary for `input_type="sequence"` (required there).
        pad_token_id (`int`, *optional*):
            Id of the padding token of `input_ids`, as in BERT's config: the models do not read it (`attention_mask`
            marks padding); transformers' tools do (`Trainer` aligns it with its tokenizer's, logging when they
            differ). Unset (None) by default, as an old config.json reads: a config built by hand gets its
            tokenizer's from `Trainer`; `energyformers train` sets its tokenizer's.
        max_position_embeddings (`int`, *optional*, defaults to 512):
            Longest sequence accepted; the size of the learned position table (512, BERT's default; sequences only).
        pooling (`str`, *optional*, defaults to `"cls"`):
            Classifier input: first token (`"cls"`; the CLS token for images, as in ViT) or masked mean (`"mean"`).
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            LayerNorm epsilon (torch's default).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of linear, embedding and position weights (as in ViT).
        num_labels (`int`, *optional*, defaults to 2):
            Classes of the classification heads (a `PreTrainedConfig` argument, checked here to be >= 0);
            0 = the heads use `nn.Identity()` as classifier and return the features (as in ViT).
    """

    model_type = "hyperbf"
    # The values each choice field of this file's tables accepts (`choices["feedforward_kernel"]`), read-only: the
    # models' tables of implementations can be keyed by it instead of repeating the names. Unannotated, as
    # `model_type`: transformers makes every config class a dataclass, which reads the annotations of its body.
    choices = MappingProxyType(_CHOICES)
    # Generic code (Trainer helpers, benchmarks) may ask for the MLP width; for HyperBF that is K.
    attribute_map = {"intermediate_size": "num_centers"}
    # The output fields besides `loss` and `logits` that Trainer's `evaluate` / `predict` leave out of the
    # predictions (its `prediction_step` reads this), so `compute_metrics` gets the logits alone, as with ViT.
    # A list: Trainer adds `["loss"]` to it.
    keys_to_ignore_at_inference = ["hidden_states", "attentions", "rbf_diagnostics"]

    def __init__(
        self,
        input_type: str = "image",
        hidden_size: int = 768,
        num_attention_heads: int = 4,
        num_hidden_layers: int = 4,
        num_centers: int | None = None,
        intermediate_size: int | None = None,
        rbf_projection_dim: int | None = None,
        feedforward_kernel: str = "normalized",
        rbf_width: str = "layer",
        rbf_sigma_init: float | None = None,
        attention_temperature_init: float | None = None,
        hidden_dropout_prob: float = 0.0,
        attention_probs_dropout_prob: float = 0.0,
        image_size: int | list[int] = 32,
        patch_size: int = 4,
        num_channels: int = 3,
        vocab_size: int | None = None,
        pad_token_id: int | None = None,
        max_position_embeddings: int = 512,
        pooling: str = "cls",
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        # `intermediate_size` is an alias of `num_centers` (attribute_map); `None` for both means 4·hidden_size.
        _require(
            self,
            num_centers is None or intermediate_size is None or num_centers == intermediate_size,
            "intermediate_size",
            intermediate_size,
            f"it is an alias of num_centers={num_centers!r} and disagrees with it; pass only one of them",
            depends_on=("num_centers",),
        )
        num_centers = num_centers if num_centers is not None else intermediate_size
        if num_centers is None and _is_int(hidden_size):
            num_centers = 4 * hidden_size
        if rbf_projection_dim is None and _is_int(hidden_size):
            rbf_projection_dim = hidden_size

        self.input_type = input_type
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.num_hidden_layers = num_hidden_layers
        self.num_centers = num_centers
        self.rbf_projection_dim = rbf_projection_dim
        self.feedforward_kernel = feedforward_kernel
        self.rbf_width = rbf_width
        self.rbf_sigma_init = rbf_sigma_init
        self.attention_temperature_init = attention_temperature_init
        self.hidden_dropout_prob = hidden_dropout_prob
        self.attention_probs_dropout_prob = attention_probs_dropout_prob
        self.image_size = list(image_size) if isinstance(image_size, (list, tuple)) else image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.max_position_embeddings = max_position_embeddings
        self.pooling = pooling
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        _validate_config(self, kwargs)
        super().__init__(**kwargs)

    def _check_cross_field_rules(self) -> None:
        """Rules the tables cannot express; `_validate_config` runs it once every table check has passed."""
        self._check_common_rules()

    @property
    def head_dim(self) -> int:
        """Width d_h of one attention head: hidden_size // num_attention_heads."""
        return self.hidden_size // self.num_attention_heads


__all__ = ["HyperBFConfig"]
