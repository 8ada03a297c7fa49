# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""iMixer configuration.

Ota, Taki, *iMixer: hierarchical Hopfield network implies an invertible, implicit and iterative
MLP-Mixer*. An MLP-Mixer whose token-mixing MLP inverts a spectrally normalised residual block
x = (1 − F)⁻¹(fc1(t)) with `fixed_point_iterations` fixed-point steps (0 = the vanilla MLP-Mixer).
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


# Largest slope of each token-mixing activation: the Lipschitz constant an activation contributes to the residual
# branch F = fc_sn2 ∘ act ∘ fc_sn1 ∘ act. GELU: Φ(√2) + √2 φ(√2) ≈ 1.1289 (at x = √2); SiLU: ≈ 1.0998 (at x ≈ 2.40,
# numerically); ReLU and tanh: 1. Its keys are the `token_mixing_activation` choices of the tables below.
ACTIVATION_MAX_SLOPES: dict[str, float] = {
    "gelu": 0.5 * (1.0 + math.erf(1.0)) + math.exp(-1.0) / math.sqrt(math.pi),
    "silu": 1.0998393201288648,
    "relu": 1.0,
    "tanh": 1.0,
}

# Validation tables of iMixer (the form is the same in the three configuration files).
_CHOICES: dict[str, tuple[str, ...]] = {
    "input_type": ("image", "sequence"),
    "fixed_point_solver": ("unrolled", "picard", "anderson"),
    "fixed_point_gradient": ("unrolled", "implicit", "phantom"),
    "contractive_normalization": ("spectral", "none", "batch_norm"),
    "token_mixing_activation": tuple(ACTIVATION_MAX_SLOPES),
    "spectral_norm_schedule": ("per_forward", "per_call", "per_optimizer_step"),
}
_POSITIVE_INTS: tuple[str, ...] = (
    "hidden_size",
    "num_hidden_layers",
    "patch_size",
    "num_channels",
    "spectral_norm_power_iterations",
    "max_position_embeddings",
    "anderson_memory",
    "phantom_gradient_steps",
)
_NON_NEGATIVE_INTS: tuple[str, ...] = ("fixed_point_iterations",)
_OPTIONAL_POSITIVE_INTS: tuple[str, ...] = ()
_PROBABILITIES: tuple[str, ...] = ("hidden_dropout_prob", "drop_path_rate")
_POSITIVE_FLOATS: tuple[str, ...] = (
    "token_mixing_ratio",
    "channel_mixing_ratio",
    "hidden_ratio",
    "spectral_norm_coeff",
    "layer_norm_eps",
    "initializer_range",
    "fixed_point_tolerance",
    "anderson_damping",
    "phantom_gradient_damping",
)
_OPTIONAL_POSITIVE_FLOATS: tuple[str, ...] = ("fixed_point_contraction",)
_IMAGE_SIZES: tuple[str, ...] = ("image_size",)
_BOOLEANS: tuple[str, ...] = ()
# Solvers that stop on a tolerance: they look for the fixed point of one fixed map, which batch statistics (a
# BatchNorm F changes with every iterate in training) and per-call power iterations (W changes per step) are not.
_TOLERANCE_SOLVERS = ("picard", "anderson")


def check_fixed_point_settings(
    config: PreTrainedConfig, solver: str, gradient: str, tolerance: float, where: str | None = None
) -> None:
    """Rules on solver and gradient choices, shared by the config and per-call overrides of the model's forward
    (`where` names that call in the message: the bad value is the call's, not the config's)."""
    _require(
        config,
        solver in _CHOICES["fixed_point_solver"],
        "fixed_point_solver",
        solver,
        f"expected one of {list(_CHOICES['fixed_point_solver'])}",
        where,
    )
    _require(
        config,
        gradient in _CHOICES["fixed_point_gradient"],
        "fixed_point_gradient",
        gradient,
        f"expected one of {list(_CHOICES['fixed_point_gradient'])}",
        where,
    )
    _require(
        config,
        _is_real(tolerance) and tolerance > 0,
        "fixed_point_tolerance",
        tolerance,
        "expected a float > 0",
        where,
    )
    needs_fixed_map = solver in _TOLERANCE_SOLVERS or gradient != "unrolled"
    for name, value, moving in (
        ("contractive_normalization", config.contractive_normalization, "batch_norm"),
        ("spectral_norm_schedule", config.spectral_norm_schedule, "per_call"),
    ):
        _require(
            config,
            not (needs_fixed_map and value == moving),
            name,
            value,
            f"{moving!r} changes F between fixed-point steps in training, so fixed_point_solver={solver!r} with "
            f"fixed_point_gradient={gradient!r} has no fixed point to converge to or differentiate; use the "
            "'unrolled' solver and gradient",
            where,
            depends_on=("fixed_point_solver", "fixed_point_gradient"),
        )


class IMixerConfig(_CheckedConfig, PreTrainedConfig):
    r"""Configuration of an iMixer model (`model_type="imixer"`).

    Args:
        input_type (`str`, *optional*, defaults to `"image"`):
            `"image"` (patch embedding of `pixel_values`) or `"sequence"` (token embedding of `input_ids`).
        hidden_size (`int`, *optional*, defaults to 512):
            Channel width D (Mixer-S).
        num_hidden_layers (`int`, *optional*, defaults to 8):
            Number of Mixer blocks (Mixer-S).
        patch_size (`int`, *optional*, defaults to 16):
            Side of the square, non-overlapping patches (Mixer-S/16).
        image_size (`int` or `list[int]`, *optional*, defaults to 224):
            Input resolution (height, width): the paper resizes CIFAR-10 to 224 × 224; it fixes the token-mixing
            length S = (H/p)(W/p).
        num_channels (`int`, *optional*, defaults to 3):
            Image channels (RGB).
        token_mixing_ratio (`float`, *optional*, defaults to 0.5):
            Token-mixing width D_S = int(ratio · D) (timm's Mixer `mlp_ratio[0]`).
        channel_mixing_ratio (`float`, *optional*, defaults to 4.0):
            Channel-mixing width D_C = int(ratio · D) (timm's Mixer `mlp_ratio[1]`).
        hidden_ratio (`float`, *optional*, defaults to 2.0):
            h_r: width N_h = int(h_r · D_S) of the contractive block F (paper's best setting: 2).
        fixed_point_iterations (`int`, *optional*, defaults to 2):
            n: fixed-point steps x ← x₀ + F(x) that approximate (1 − F)⁻¹ (paper's best: 2); 0 builds
            no contractive block and is exactly the vanilla MLP-Mixer. The step count of the `unrolled`
            solver, the maximum of the `picard` and `anderson` ones.
        fixed_point_solver (`str`, *optional*, defaults to `"unrolled"`):
            How the fixed point is sought: `"unrolled"` (exactly n steps, the paper's), `"picard"` (steps
            until the relative residual ‖x_a − x_{a−1}‖/‖x_{a−1}‖ of every sample is <= the tolerance, at
            most n) or `"anderson"` (Anderson acceleration, same stopping rule). Each sample stops on its own.
        fixed_point_tolerance (`float`, *optional*, defaults to 1e-4):
            Relative residual at which `picard` / `anderson` stop a sample.
        anderson_memory (`int`, *optional*, defaults to 5):
            m: past iterates Anderson acceleration mixes (Walker & Ni; DEQ's default 5).
        anderson_damping (`float`, *optional*, defaults to 1.0):
            β in (0, 1]: x ← β Σα f(x) + (1 − β) Σα x; 1 = undamped.
        fixed_point_gradient (`str`, *optional*, defaults to `"unrolled"`):
            Training gradient of the solve: `"unrolled"` (backprop through every step, the paper's; memory
            grows with n), `"implicit"` (implicit function theorem: the adjoint fixed point g = Jᵀg + ∂L/∂x*
            solved with the same solver, n unrolled steps for the unrolled one; memory of one step) or
            `"phantom"` (Geng et al.'s unrolled phantom gradient: the solution detached, then
            `phantom_gradient_steps` damped steps with backprop). Both put the graph on the last step only.
        phantom_gradient_steps (`int`, *optional*, defaults to 1):
            k of the phantom gradient; k = 1 with damping 1 is the one-step (Jacobian-free, Fung et al.)
            gradient. With the unrolled solver they are the last min(k, n) of its n steps.
        phantom_gradient_damping (`float`, *optional*, defaults to 1.0):
            λ in (0, 1] of the phantom steps x ← (1 − λ) x + λ (x₀ + F(x)) (Geng et al. use e.g. 0.5); the
            default 1 makes the default k = 1 the one-step gradient.
        fixed_point_contraction (`float`, *optional*):
            Target Lipschitz bound L < 1 of F: caps each weight at c = min(spectral_norm_coeff,
            √L / s) with s the activation's largest slope (GELU: 1.1289), so s² c² <= L. None = the paper's
            c alone, whose bound with GELU is 1.1289² · 0.9² ≈ 1.03 (not a guaranteed contraction).
        contractive_normalization (`str`, *optional*, defaults to `"spectral"`):
            How F's weights are kept small (the paper's Table 3 ablation): `"spectral"` (soft spectral
            norm), `"none"`, or `"batch_norm"` (BatchNorm1d after each of F's linear layers instead).
        token_mixing_activation (`str`, *optional*, defaults to `"gelu"`):
            Activation of the token-mixing MLP (inside F and before fc2): gelu (the paper's, exact), silu, relu
            or tanh.
        spectral_norm_schedule (`str`, *optional*, defaults to `"per_forward"`):
            When training refines the σ estimates: `"per_forward"` (k power steps once per forward, before
            the blocks), `"per_call"` (the authors' code: k steps at every fixed-point step, so n·k per
            forward and W changes between steps) or `"per_optimizer_step"` (k steps at the first forward
            after the weights changed, i.e. once per optimiser step that changes them, however many forwards it
            takes; `torch.compile(fullgraph=True)`-traceable).
        spectral_norm_coeff (`float`, *optional*, defaults to 0.9):
            c: soft spectral normalisation caps σ(W) of F's two weights at c (0.9, the paper's value).
        spectral_norm_power_iterations (`int`, *optional*, defaults to 8):
            k: power-iteration steps per training forward that refine the σ estimate (8, the paper's value).
        hidden_dropout_prob (`float`, *optional*, defaults to 0.0):
            Dropout after each MLP's activation and output (timm's Mixer `proj_drop_rate`; 0 = off).
        drop_path_rate (`float`, *optional*, defaults to 0.0):
            Stochastic-depth rate, the same for every block as in timm's Mixer (0 = off).
        vocab_size (`int`, *optional*):
            Token vocabulary for `input_type="sequence"` (required there).
        pad_token_id (`int`, *optional*):
            Id of the padding token of `input_ids`, as in BERT's config: the models do not read it (`attention_mask`
            marks padding); transformers' tools do (`Trainer` aligns it with its tokenizer's, logging when they
            differ). Unset (None) by default, as an old config.json reads: a config built by hand gets its
            tokenizer's from `Trainer`; `energyformers train` sets its tokenizer's.
        max_position_embeddings (`int`, *optional*, defaults to 128):
            Token-mixing length S for sequences: every input is padded internally to S, so longer ones
            are rejected; 128 covers sentence-level tasks without paying for 512 padded tokens.
        layer_norm_eps (`float`, *optional*, defaults to 1e-6):
            LayerNorm epsilon (timm's Mixer).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of token and pad embeddings (Linear layers use timm's
            Xavier-uniform, the patch convolution LeCun-normal, the classifier zeros).
        num_labels (`int`, *optional*, defaults to 2):
            Classes of the classification heads (a `PreTrainedConfig` argument, checked here to be >= 0);
            0 = the heads use `nn.Identity()` as classifier and return the features (as in ViT).
    """

    model_type = "imixer"
    # The values each choice field of this file's tables accepts (`choices["fixed_point_solver"]`), read-only: the
    # models' tables of implementations can be keyed by it instead of repeating the names. Unannotated, as
    # `model_type`: transformers makes every config class a dataclass, which reads the annotations of its body.
    choices = MappingProxyType(_CHOICES)
    # The output fields besides `loss` and `logits` that Trainer's `evaluate` / `predict` leave out of the
    # predictions (its `prediction_step` reads this), so `compute_metrics` gets the logits alone, as with ViT.
    # A list: Trainer adds `["loss"]` to it.
    keys_to_ignore_at_inference = ["hidden_states", "attentions", "fixed_point_residuals"]

    def __init__(
        self,
        input_type: str = "image",
        hidden_size: int = 512,
        num_hidden_layers: int = 8,
        patch_size: int = 16,
        image_size: int | list[int] = 224,
        num_channels: int = 3,
        token_mixing_ratio: float = 0.5,
        channel_mixing_ratio: float = 4.0,
        hidden_ratio: float = 2.0,
        fixed_point_iterations: int = 2,
        fixed_point_solver: str = "unrolled",
        fixed_point_tolerance: float = 1e-4,
        anderson_memory: int = 5,
        anderson_damping: float = 1.0,
        fixed_point_gradient: str = "unrolled",
        phantom_gradient_steps: int = 1,
        phantom_gradient_damping: float = 1.0,
        fixed_point_contraction: float | None = None,
        contractive_normalization: str = "spectral",
        token_mixing_activation: str = "gelu",
        spectral_norm_schedule: str = "per_forward",
        spectral_norm_coeff: float = 0.9,
        spectral_norm_power_iterations: int = 8,
        hidden_dropout_prob: float = 0.0,
        drop_path_rate: float = 0.0,
        vocab_size: int | None = None,
        pad_token_id: int | None = None,
        max_position_embeddings: int = 128,
        layer_norm_eps: float = 1e-6,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        self.input_type = input_type
        self.hidden_size = hidden_size
        self.num_hidden_layers = num_hidden_layers
        self.patch_size = patch_size
        self.image_size = list(image_size) if isinstance(image_size, (list, tuple)) else image_size
        self.num_channels = num_channels
        self.token_mixing_ratio = token_mixing_ratio
        self.channel_mixing_ratio = channel_mixing_ratio
        self.hidden_ratio = hidden_ratio
        self.fixed_point_iterations = fixed_point_iterations
        self.fixed_point_solver = fixed_point_solver
        self.fixed_point_tolerance = fixed_point_tolerance
        self.anderson_memory = anderson_memory
        self.anderson_damping = anderson_damping
        self.fixed_point_gradient = fixed_point_gradient
        self.phantom_gradient_steps = phantom_gradient_steps
        self.phantom_gradient_damping = phantom_gradient_damping
        self.fixed_point_contraction = fixed_point_contraction
        self.contractive_normalization = contractive_normalization
        self.token_mixing_activation = token_mixing_activation
        self.spectral_norm_schedule = spectral_norm_schedule
        self.spectral_norm_coeff = spectral_norm_coeff
        self.spectral_norm_power_iterations = spectral_norm_power_iterations
        self.hidden_dropout_prob = hidden_dropout_prob
        self.drop_path_rate = drop_path_rate
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.max_position_embeddings = max_position_embeddings
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        _validate_config(self, kwargs)
        super().__init__(**kwargs)

    def _check_cross_field_rules(self) -> None:
        """Rules the tables cannot express; `_validate_config` runs it once every table check has passed."""
        _require(
            self,
            self.spectral_norm_coeff < 1,
            "spectral_norm_coeff",
            self.spectral_norm_coeff,
            "expected 0 < c < 1 (the fixed-point solve needs a contractive F)",
        )
        for name in ("anderson_damping", "phantom_gradient_damping"):
            value = getattr(self, name)
            _require(self, value <= 1, name, value, "expected a damping in (0, 1]")
        _require(
            self,
            self.fixed_point_contraction is None or self.fixed_point_contraction < 1,
            "fixed_point_contraction",
            self.fixed_point_contraction,
            "expected None or a Lipschitz bound in (0, 1)",
        )
        _require(
            self,
            self.fixed_point_contraction is None or self.contractive_normalization == "spectral",
            "fixed_point_contraction",
            self.fixed_point_contraction,
            f"it caps the spectral norm, which contractive_normalization={self.contractive_normalization!r} "
            "does not apply; use 'spectral'",
            depends_on=("contractive_normalization",),
        )
        check_fixed_point_settings(
            self, self.fixed_point_solver, self.fixed_point_gradient, self.fixed_point_tolerance
        )
        for name, base, depends_on in (
            ("token_mixing_ratio", self.hidden_size, ("hidden_size",)),
            ("channel_mixing_ratio", self.hidden_size, ("hidden_size",)),
            (
                "hidden_ratio",
                int(self.token_mixing_ratio * self.hidden_size),
                ("token_mixing_ratio", "hidden_size"),
            ),
        ):
            value = getattr(self, name)
            _require(
                self,
                int(value * base) >= 1,
                name,
                value,
                f"it must give a width int({name} · {base}) >= 1",
                depends_on=depends_on,
            )
        self._check_common_rules()

    def check_fixed_point_settings(
        self, solver: str, gradient: str, tolerance: float, where: str | None = None
    ) -> None:
        """Raise ValueError for a solver / gradient / tolerance this model cannot use (also per call: `where`
        names the call, e.g. `"IMixerModel.forward"`, in place of the config's class)."""
        check_fixed_point_settings(self, solver, gradient, tolerance, where)

    @property
    def activation_max_slope(self) -> float:
        """Largest slope of `token_mixing_activation` (`ACTIVATION_MAX_SLOPES`), a factor of F's Lipschitz bound."""
        return ACTIVATION_MAX_SLOPES[self.token_mixing_activation]

    @property
    def contractive_coeff(self) -> float:
        """The cap c on σ of F's weights: spectral_norm_coeff, lowered to √L / s by `fixed_point_contraction`."""
        if self.fixed_point_contraction is None:
            return self.spectral_norm_coeff
        return min(
            self.spectral_norm_coeff, math.sqrt(self.fixed_point_contraction) / self.activation_max_slope
        )

    @property
    def num_tokens(self) -> int:
        """Token-mixing length S: patches per image, or `max_position_embeddings` for sequences."""
        if self.input_type == "sequence":
            return self.max_position_embeddings
        height, width = _image_sides(self.image_size)
        return (height // self.patch_size) * (width // self.patch_size)

    @property
    def token_mixing_size(self) -> int:
        """D_S = int(token_mixing_ratio · D)."""
        return int(self.token_mixing_ratio * self.hidden_size)

    @property
    def channel_mixing_size(self) -> int:
        """D_C = int(channel_mixing_ratio · D)."""
        return int(self.channel_mixing_ratio * self.hidden_size)

    @property
    def contractive_size(self) -> int:
        """N_h = int(hidden_ratio · D_S), the width of the contractive block F."""
        return int(self.hidden_ratio * self.token_mixing_size)


__all__ = ["ACTIVATION_MAX_SLOPES", "IMixerConfig"]
