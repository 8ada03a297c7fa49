# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Hyper-SET configuration.

Hu, Zou, Xu, *Hyperspherical Energy Transformer with Recurrent Depth*. One weight-tied layer is
iterated `num_iterations` times; each iteration is a gradient step on a hyperspherical Hopfield
energy (attention) followed by one on a dictionary energy (feedforward).
"""

from __future__ import annotations

import dataclasses
import difflib
import inspect
import math
import numbers
import os
import re
import shutil
import sys
import warnings
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


# Validation tables of Hyper-SET (the form is the same in the three configuration files).
_CHOICES: dict[str, tuple[str, ...]] = {
    "input_type": ("image", "sequence"),
    "qkv_norm": ("separate", "shared"),
    "step_size_condition": ("current", "input"),
    "hidden_act": ("relu", "gelu"),
    "attention_energy": ("bisoftmax", "sigmoid", "linear"),
    "feedforward_energy": ("relu", "softmax", "gated"),
    "position_embedding_type": ("sinusoidal", "learned", "sincos-2d"),
    "pooling": ("cls", "mean"),
    "iteration_conditioning": ("none", "sinusoidal", "sinusoidal-no-mlp"),
    "iteration_sampling": ("fixed", "uniform", "poisson-lognormal"),
    "halting_criterion": ("state", "energy"),
    "step_size_norm": ("rmsnorm", "none", "rmsnorm-sum"),
    "classifier_norm": ("layernorm", "rmsnorm"),
    "deep_supervision": ("last", "all", "every", "random"),
    "deep_supervision_weights": ("uniform", "linear"),
}
_POSITIVE_INTS: tuple[str, ...] = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "num_hidden_layers",
    "num_iterations",
    "time_embedding_dim",
    "patch_size",
    "num_channels",
    "max_position_embeddings",
    "deep_supervision_interval",
    "deep_supervision_samples",
    "supervision_steps",
)
_NON_NEGATIVE_INTS: tuple[str, ...] = ()
_OPTIONAL_POSITIVE_INTS: tuple[str, ...] = ("min_iterations", "max_iterations", "backprop_iterations")
_PROBABILITIES: tuple[str, ...] = ()
_POSITIVE_FLOATS: tuple[str, ...] = (
    "layer_norm_eps",
    "initializer_range",
    "iteration_sampling_sigma",
    "halting_loss_weight",
)
_OPTIONAL_POSITIVE_FLOATS: tuple[str, ...] = ("rms_norm_eps", "halting_tolerance")
_IMAGE_SIZES: tuple[str, ...] = ("image_size",)
_BOOLEANS: tuple[str, ...] = ("classifier_bias", "halting_head")
# φ of attention_energy="linear" and feedforward_energy="gated" (the authors' `hyper-set-alt-attn` choices); `None`
# otherwise. Not a `_CHOICES` entry (so not in `HyperSetConfig.choices`): `_validate_config` refuses a value outside
# its tuple, None included, while feature_map is required by those two energies and must be None for the others, a
# cross-field rule (`HyperSetConfig._check_cross_field_rules`). This tuple is the public list of the accepted names.
FEATURE_MAPS: tuple[str, ...] = ("sigmoid", "relu", "tanh", "softplus", "silu", "gelu", "elu", "elu+1")


# The pipeline code of a masked-image-modelling folder (the only folders whose config.json has `custom_pipelines`),
# copied by `RecurrentDepthConfig._save_extra_code` when the folder is saved again without the package.
def _pipeline_code_files(custom_pipelines: dict[str, Any]) -> list[str]:
    """The module files the `custom_pipelines` entries of config.json name (`"impl": "pipeline_mim.Class"` ->
    `pipeline_mim.py`). An entry in another repo (`"repo--module.Class"`) is left out: transformers reads it there."""
    files = []
    for entry in custom_pipelines.values():
        impl = entry.get("impl") if isinstance(entry, dict) else None
        if isinstance(impl, str) and "." in impl and "--" not in impl:
            files.append(impl.split(".")[0] + ".py")
    return sorted(set(files))


def _loaded_revision(config: PreTrainedConfig) -> str | None:
    """The commit a Hub repo's config was loaded at, or None. The config does not keep it, but transformers copies a
    repo's remote code into `transformers_modules/<repo>/<commit hash>/`, from where this module then runs; saving
    must copy the pipeline files of that commit, not of whatever the repo's main branch holds now."""
    module_file = getattr(sys.modules.get(type(config).__module__), "__file__", None) or ""
    folder = os.path.basename(os.path.dirname(module_file))
    return folder if re.fullmatch(r"[0-9a-f]{40}", folder) else None


def _find_code_file(source: str, filename: str, revision: str | None) -> str | None:
    """The local path of `filename` from `source` (a folder, or a Hub repo id through transformers' cache, which
    offline answers from what an earlier load downloaded); None where it is not to be had."""
    if os.path.isdir(source):
        path = os.path.join(source, filename)
        return path if os.path.isfile(path) else None
    from transformers.utils import cached_file

    try:
        return cached_file(source, filename, revision=revision)
    except (OSError, ValueError):
        return None  # not in the repo, no such repo, offline without a cached copy, or not a repo id


def _copy_pipeline_code(config: PreTrainedConfig, save_directory: str | os.PathLike) -> None:
    """Copy the pipeline files `config`'s `custom_pipelines` names, and the files they import relatively
    (transitively), from where the config was loaded into `save_directory`; warn, naming them, about any not found.

    transformers copies a remote model's and config's own files on save, and a pipeline's only when that pipeline was
    registered in the process, which a pipeline read from `custom_pipelines` is not; so without this a folder loaded
    with only transformers and saved again names a pipeline module it lacks. A missing file is a warning, not an
    error: the weights and config.json (what a Trainer checkpoint needs, and all `from_pretrained` reads) are still
    written, and copying the named file into the folder later makes `pipeline()` work."""
    from transformers.dynamic_module_utils import get_relative_imports

    source = str(config.name_or_path or "")
    revision = _loaded_revision(config)
    pending = _pipeline_code_files(config.__dict__["custom_pipelines"])
    found: dict[str, str] = {}
    missing: list[str] = []
    while pending:
        filename = pending.pop()
        if filename in found or filename in missing:
            continue
        path = _find_code_file(source, filename, revision) if source else None
        if path is None:
            missing.append(filename)
            continue
        found[filename] = path
        # the rule transformers applies to decide which files a remote module needs
        pending += [f"{module}.py" for module in get_relative_imports(path)]
    os.makedirs(save_directory, exist_ok=True)
    for filename, path in sorted(found.items()):
        target = os.path.join(save_directory, filename)
        if not (os.path.exists(target) and os.path.samefile(path, target)):  # saving over the source folder
            shutil.copyfile(path, target)
    if missing:
        where = f"{source!r}" if source else "nowhere: the config does not say where it was loaded from"
        warnings.warn(
            f"{type(config).__name__}.save_pretrained: config.json names custom_pipelines "
            f"{sorted(config.__dict__['custom_pipelines'])} whose code {sorted(missing)} was not found in {where}; "
            f"{str(save_directory)!r} gets the weights and config, and from_pretrained reads it, but "
            "pipeline(..., trust_remote_code=True) fails there until those files are copied into it (the exported "
            "folder or Hub repo the model came from has them).",
            UserWarning,
            stacklevel=4,  # the caller of save_pretrained (through _save_extra_code)
        )


# The fields Hyper-SET shares with its looped-Transformer baseline (the package's `LoopedTransformerConfig`): the
# embeddings, the width and heads, the recurrent-depth schedule and the classification head.
class RecurrentDepthConfig(_CheckedConfig, PreTrainedConfig):
    r"""The fields of a model that iterates weight-tied layers: Hyper-SET (`HyperSetConfig`) and the
    looped-Transformer baseline (`LoopedTransformerConfig`) derive from it, so both models read one definition of
    the embeddings, the width and heads, the depth schedule (`num_iterations`, `iteration_sampling`, truncation)
    and the head. Not a model of its own (no `model_type`); the fields are documented in `HyperSetConfig`.

    A subclass sets its own fields first, then calls this `__init__`, which sets the shared ones and validates
    all of them against this file's tables (a table entry for a field a class does not set is skipped). Every shared
    field is passed by keyword and none has a default here: the defaults are each subclass's own (its signature and
    `Args:`), which a config.json saved without a field loads with.
    """

    # The values each choice field of this file's tables accepts (`choices["iteration_sampling"]`), read-only: the
    # models' tables of implementations can be keyed by it instead of repeating the names. Unannotated, as
    # `model_type`: transformers makes every config class a dataclass, which reads the annotations of its body.
    choices = MappingProxyType(_CHOICES)
    # `num_layers`, the name Hyper-SET's specification gives L, reads and sets num_hidden_layers (transformers' aliases)
    attribute_map = {"num_layers": "num_hidden_layers"}
    # The output fields besides `loss` and `logits` that Trainer's `evaluate` / `predict` leave out of the
    # predictions (its `prediction_step` reads this), so `compute_metrics` gets the logits alone, as with ViT or
    # BERT: the heads' outer-step and search fields (with `supervision_steps > 1`, a halting head or test-time
    # search) and the hidden states / attentions. A list: Trainer adds `["loss"]` to it.
    keys_to_ignore_at_inference = [
        "hidden_states",
        "attentions",
        "supervision_steps_used",
        "halting_probabilities",
        "search_chosen",
        "search_energies",
        "search_confidences",
        "search_valid_boards",
    ]

    def __init__(
        self,
        *,
        input_type: str,
        hidden_size: int,
        num_attention_heads: int,
        intermediate_size: int,
        num_hidden_layers: int,
        num_iterations: int,
        hidden_act: str,
        iteration_sampling: str,
        min_iterations: int | None,
        max_iterations: int | None,
        iteration_sampling_sigma: float,
        backprop_iterations: int | None,
        deep_supervision: str,
        deep_supervision_interval: int,
        deep_supervision_samples: int,
        deep_supervision_weights: str,
        supervision_steps: int,
        halting_head: bool,
        halting_loss_weight: float,
        image_size: int | list[int],
        patch_size: int,
        num_channels: int,
        vocab_size: int | None,
        pad_token_id: int | None,
        max_position_embeddings: int,
        position_embedding_type: str,
        pooling: str,
        classifier_norm: str,
        classifier_bias: bool,
        rms_norm_eps: float | None,
        layer_norm_eps: float,
        initializer_range: float,
        **kwargs: Any,
    ) -> None:
        self.input_type = input_type
        self.hidden_size = hidden_size
        self.num_attention_heads = num_attention_heads
        self.intermediate_size = intermediate_size
        if "num_layers" in kwargs:
            # the alias, taken here rather than by transformers' `__init__` after the checks below
            num_layers = kwargs.pop("num_layers")
            default = inspect.signature(type(self).__init__).parameters["num_hidden_layers"].default
            _require(
                self,
                num_hidden_layers in (default, num_layers),
                "num_layers",
                num_layers,
                f"it is an alias of num_hidden_layers={num_hidden_layers!r} and disagrees with it; pass only one",
                depends_on=("num_hidden_layers",),
            )
            num_hidden_layers = num_layers
        self.num_hidden_layers = num_hidden_layers
        self.num_iterations = num_iterations
        self.hidden_act = hidden_act
        self.iteration_sampling = iteration_sampling
        self.min_iterations = min_iterations
        self.max_iterations = max_iterations
        self.iteration_sampling_sigma = iteration_sampling_sigma
        self.backprop_iterations = backprop_iterations
        # deep supervision: which iterations of the last layer the training loss reads, and their weights
        self.deep_supervision = deep_supervision
        self.deep_supervision_interval = deep_supervision_interval
        self.deep_supervision_samples = deep_supervision_samples
        self.deep_supervision_weights = deep_supervision_weights
        # supervision steps: S outer steps of T iterations, the state carried between them without gradient, and
        # an optional learned halting head that stops a sample's outer steps at inference
        self.supervision_steps = supervision_steps
        self.halting_head = halting_head
        self.halting_loss_weight = halting_loss_weight
        self.image_size = list(image_size) if isinstance(image_size, (list, tuple)) else image_size
        self.patch_size = patch_size
        self.num_channels = num_channels
        self.vocab_size = vocab_size
        self.pad_token_id = pad_token_id
        self.max_position_embeddings = max_position_embeddings
        self.position_embedding_type = position_embedding_type
        self.pooling = pooling
        # the head: the norm before the classifier and the classifier's bias (Hyper-SET's and its baseline's alike)
        self.classifier_norm = classifier_norm
        self.classifier_bias = classifier_bias
        self.rms_norm_eps = rms_norm_eps
        self.layer_norm_eps = layer_norm_eps
        self.initializer_range = initializer_range
        _validate_config(self, kwargs)
        super().__init__(**kwargs)

    # `custom_pipelines` (the pipeline module an exported masked-image-modelling folder carries beside its code, for
    # users without the package; transformers' `config.custom_pipelines` mechanism) is kept whole in the instance
    # dict, which is what `to_dict` and so `save_pretrained` / `push_to_hub` write, so a folder loaded and saved
    # again still names its pipeline for users without the package. Reading the attribute, as transformers'
    # `pipeline()` does, leaves out the tasks this process's transformers already serves (with the package imported,
    # its registered `MaskedImageModelingPipeline`): `pipeline()` prefers a config's custom pipeline to a registered
    # one and then demands `trust_remote_code=True`, so without the served entries `pipeline(task, model=folder)`
    # builds the registered class as for a folder without the entry. Without the package nothing serves the task and
    # the whole entry is seen. The property wins over the instance dict because it is a data descriptor.

    @property
    def custom_pipelines(self) -> dict[str, dict]:
        """The stored `custom_pipelines` less the tasks a pipeline registered in this process serves."""
        stored = self.__dict__.get("custom_pipelines")
        if stored is None:
            raise AttributeError(f"{type(self).__name__} has no custom_pipelines")
        registry = getattr(sys.modules.get("transformers.pipelines"), "PIPELINE_REGISTRY", None)
        served = set(registry.get_supported_tasks()) if registry is not None else set()
        return {task: entry for task, entry in stored.items() if task not in served}

    @custom_pipelines.setter
    def custom_pipelines(self, value: dict[str, dict]) -> None:
        self.__dict__["custom_pipelines"] = value

    @custom_pipelines.deleter
    def custom_pipelines(self) -> None:
        del self.__dict__["custom_pipelines"]

    def _save_extra_code(self, save_directory: str | os.PathLike) -> None:
        """Saved without the package: copy the pipeline files the stored `custom_pipelines` names, from where the
        config was loaded (`_copy_pipeline_code`: a file not found is a warning, the weights still save). A
        `save_directory` that is a file is left to transformers' own error."""
        if self.__dict__.get("custom_pipelines") and not os.path.isfile(save_directory):
            _copy_pipeline_code(self, save_directory)

    @staticmethod
    def shared_fields() -> tuple[str, ...]:
        """The fields this base sets: its `__init__` parameters, which a subclass's `__init__` hands on."""
        parameters = inspect.signature(RecurrentDepthConfig.__init__).parameters
        return tuple(name for name in parameters if name not in ("self", "kwargs"))

    def _check_cross_field_rules(self) -> None:
        """Rules the tables cannot express; `_validate_config` runs it once every table check has passed."""
        self._check_common_rules()
        low, high = self.iteration_range
        _require(
            self,
            low <= high,
            "min_iterations",
            self.min_iterations,
            f"it must not exceed max_iterations={high}",
            # the bound is `iteration_range`'s, which reads the sampling and the depth when either is None
            depends_on=("max_iterations", "iteration_sampling", "num_iterations"),
        )
        _require(
            self,
            self.backprop_iterations is None
            or self.backprop_iterations <= self.num_hidden_layers * self.num_iterations,
            "backprop_iterations",
            self.backprop_iterations,
            f"it must not exceed num_hidden_layers × num_iterations = {self.num_hidden_layers * self.num_iterations}",
            depends_on=("num_hidden_layers", "num_iterations"),
        )
        if self.position_embedding_type == "sincos-2d":  # a fixed table of rows and columns of a square board
            _require(
                self,
                self.input_type == "sequence",
                "position_embedding_type",
                self.position_embedding_type,
                'the row/column table is for input_type="sequence" (cells of a board); images always use the '
                '1-D sinusoid over their patches (use "sinusoidal")',
                depends_on=("input_type",),
            )
            side = math.isqrt(self.max_position_embeddings)
            _require(
                self,
                side * side == self.max_position_embeddings,
                "max_position_embeddings",
                self.max_position_embeddings,
                'position_embedding_type="sincos-2d" lays the positions out on a square board: expected a '
                "square number (81 = 9 × 9 for Sudoku)",
                depends_on=("position_embedding_type",),
            )
            _require(
                self,
                self.hidden_size % 4 == 0,
                "hidden_size",
                self.hidden_size,
                'position_embedding_type="sincos-2d" gives rows and columns hidden_size/2 channels each, as '
                "[sin | cos] halves: expected a multiple of 4",
                depends_on=("position_embedding_type",),
            )

    @property
    def iteration_range(self) -> tuple[int, int]:
        """(smallest, largest) depth `iteration_sampling` draws; (T, T) for `"fixed"`."""
        if self.iteration_sampling == "fixed":
            return self.num_iterations, self.num_iterations
        spread = self.num_iterations // 2
        poisson = self.iteration_sampling == "poisson-lognormal"
        default_low = 1 if poisson else self.num_iterations - spread
        low = default_low if self.min_iterations is None else self.min_iterations
        default_high = 4 * self.num_iterations if poisson else self.num_iterations + spread
        return low, default_high if self.max_iterations is None else self.max_iterations

    @property
    def head_dim(self) -> int:
        """Width d_h of one attention head: hidden_size // num_attention_heads."""
        return self.hidden_size // self.num_attention_heads


class HyperSetConfig(RecurrentDepthConfig):
    r"""Configuration of a Hyper-SET model (`model_type="hyperset"`).

    Args:
        input_type (`str`, *optional*, defaults to `"image"`):
            `"image"` (patch embedding + CLS token) or `"sequence"` (token embedding of `input_ids`).
        hidden_size (`int`, *optional*, defaults to 384):
            Token width d (the paper's CIFAR-10 Small model, Table 6).
        num_attention_heads (`int`, *optional*, defaults to 6):
            Heads H (the paper's CIFAR-10 Small model, Table 6); each works in a d/H-dimensional subspace of the
            shared projection W.
        intermediate_size (`int`, *optional*, defaults to 384):
            Dictionary size M of the feedforward energy (the paper uses M = d for images).
        num_hidden_layers (`int`, *optional*, defaults to 1):
            Distinct weight-tied layers L, applied one after the other (the paper's CIFAR-10 Small model, Table 6).
            `num_layers` is an alias: it reads and sets this field (`config.num_layers`, `num_layers=` in the
            constructor and `from_preset`).
        num_iterations (`int`, *optional*, defaults to 12):
            Iterations T of each layer (the paper's CIFAR-10 Small model, Table 6); effective depth L·T; can be
            overridden per forward call.
        qkv_norm (`str`, *optional*, defaults to `"separate"`):
            `"separate"`: three RMSNorm gains for q, k, v (images); `"shared"`: one gain (Sudoku).
        step_size_condition (`str`, *optional*, defaults to `"current"`):
            Step sizes α, γ are conditioned on the current state x_t (`"current"`) or on the embedded
            input x_0 (`"input"`, the paper's Sudoku setting).
        hidden_act (`str`, *optional*, defaults to `"relu"`):
            Feedforward activation, `"relu"` (the energy's exact gradient) or `"gelu"`.
        attention_energy (`str`, *optional*, defaults to `"bisoftmax"`):
            `"bisoftmax"`: E = √d_h Σ logsumexp (row + column softmax update; the paper's energy); `"sigmoid"`:
            E = (√d_h/2) Σ σ(S) (update σ'(S)), a variant from the authors' poster; `"linear"`:
            E = (1/(2√d_h)) Σ_h ‖Σ_i φ(z_i)‖², the kernel φ(z_i)·φ(z_j) in place of exp(S_ij), whose update
            φ'(z_i) ⊙ Σ_j φ(z_j) costs O(N) per head (needs `feature_map`).
        feedforward_energy (`str`, *optional*, defaults to `"relu"`):
            `"relu"`: E = −½ Σ ‖act(n(Dx))‖² (the paper's energy); `"softmax"`: E = −Σ logsumexp(n(Dx))
            (update Dᵀ softmax); `"gated"`: E = −½ Σ_i (Σ_m φ(u_im))², u = n(Dx), update Dᵀ[(Σ_m φ(u_m)) φ'(u)]
            (needs `feature_map`).
        feature_map (`str`, *optional*):
            φ of the `"linear"` attention and `"gated"` feedforward energies, one of `FEATURE_MAPS` (sigmoid,
            relu, tanh, softplus, silu, gelu, elu, elu+1: the authors' choices); required by those energies and
            `None` otherwise (no other energy has a φ, so a value there would be silently ignored).
        iteration_conditioning (`str`, *optional*, defaults to `"none"`):
            `"none"`: the step sizes see one learned condition c at every iteration, so iteration t + 1 applies
            the same map as iteration t at any test-time depth, a map that need not lower any energy (what the
            authors' trained models compute: their zero-initialised time MLP never learns to depend on t);
            `"sinusoidal"`: c_t = MLP(sinusoid(t)), an ablation that does not extrapolate in depth;
            `"sinusoidal-no-mlp"`: c_t = sinusoid(t) itself, of width `time_embedding_dim` = `hidden_size` (the
            authors' masked-image-modelling model, "no MLP after the time embedding").
        step_size_norm (`str`, *optional*, defaults to `"rmsnorm"`):
            `"rmsnorm"`: RMSNorms inside the time MLP and on the state entering the step-size network (the
            authors' image models); `"none"`: neither (their Sudoku model: time MLP Linear → GELU → Linear,
            step-size input GELU(c + x)); `"rmsnorm-sum"`: one RMSNorm on the sum, GELU(RMSNorm(c + x)), none in
            the time MLP (their masked-image-modelling model).
        time_embedding_dim (`int`, *optional*, defaults to 512):
            Width of the iteration sinusoid of `iteration_conditioning="sinusoidal"` (paper: 512).
        input_anchor (`float`, *optional*, defaults to 0.0):
            λ of an anchor energy (λ/2)‖x − x₀‖² added to the layer's energy (x₀: the state entering the layer,
            for one layer the embedded input): every iteration also takes the step −λ(x_t − x₀). It makes the
            energy coercive, so the iteration has a fixed point and extra test-time iterations cannot drift
            away (our addition, not the paper's: 0 = the paper's model; the `cli-image` and `cli-mim` presets,
            which `energyformers train` builds for images and masked image modelling, use 0.5).
        iteration_sampling (`str`, *optional*, defaults to `"fixed"`):
            Depth of each training forward: `"fixed"` (num_iterations), `"uniform"` over [min_iterations,
            max_iterations], or `"poisson-lognormal"` with mean num_iterations (Geiping et al., *Scaling up
            Test-Time Compute with Latent Reasoning*), capped at max_iterations. The draw depends only on
            the model's count of training forwards, so every process of a distributed run draws the same depth.
        min_iterations (`int`, *optional*):
            Smallest sampled depth (defaults to num_iterations − num_iterations // 2 for `"uniform"`, 1 for
            `"poisson-lognormal"`).
        max_iterations (`int`, *optional*):
            Largest sampled depth (defaults to num_iterations + num_iterations // 2 for `"uniform"`, 4 ×
            num_iterations for `"poisson-lognormal"`).
        iteration_sampling_sigma (`float`, *optional*, defaults to 0.5):
            σ of the log-normal rate of `"poisson-lognormal"` (0.5, as Geiping et al.).
        backprop_iterations (`int`, *optional*):
            k: only the last k of the L·T iterations are differentiated, the earlier ones run without gradient
            (truncated backpropagation through depth: backward memory and time independent of T; with L > 1 a
            layer whose iterations all come before the last k gets no gradient). `None` differentiates all.
        deep_supervision (`str`, *optional*, defaults to `"last"`):
            Which iterations of the last layer the training loss reads (the head — norm and classifier — is
            applied to the state after each, and the loss is the weighted mean of their losses): `"last"` (the
            paper: only iteration T), `"all"` (1..T), `"every"` (T, T − k, T − 2k, … with k =
            `deep_supervision_interval`), `"random"` (T plus `deep_supervision_samples` − 1 others drawn per
            training forward, seeded by the model's depth-draw count). Iterations are those of the T drawn for
            the step (random depth); one run without gradient (before the last `backprop_iterations`) still adds
            its loss but trains only the head. Eval mode always reports the last iteration's loss, the loss of the
            logits returned.
        deep_supervision_interval (`int`, *optional*, defaults to 2):
            k of `deep_supervision="every"`: the supervised iterations step back from T by k (2: k = 1 is `"all"`).
        deep_supervision_samples (`int`, *optional*, defaults to 2):
            n of `deep_supervision="random"`: iterations supervised per training forward, the last included (at
            most T; 2: n = 1 is `"last"`).
        deep_supervision_weights (`str`, *optional*, defaults to `"uniform"`):
            Weights of the supervised iterations' losses: `"uniform"` or `"linear"` (iteration t weighs t, so
            later iterations count more); normalised to sum to 1.
        supervision_steps (`int`, *optional*, defaults to 1):
            S outer steps of T iterations each (HRM / TRM style): step s + 1 starts from the state step s ended
            in, detached (no gradient flows between steps); in training each step adds its loss (with
            `deep_supervision` inside the step) and the loss is their mean, one optimizer step per batch; at
            inference the heads run S·T iterations unless the halting head stops a sample earlier. 1 = one
            forward of T iterations, as the paper.
        halting_head (`bool`, *optional*, defaults to `False`):
            Add a Linear(d, 1) halting classifier on the normed pooled state after every outer step, trained
            with BCE to predict "this step's answer is correct" (every supervised token, or the sample's class);
            at inference a sample stops after the first step whose probability exceeds `halting_threshold`
            (a call argument, 0.5). Off: no extra parameter, the paper's model.
        halting_loss_weight (`float`, *optional*, defaults to 0.5):
            Weight of the halting head's BCE (mean over steps) added to the task loss (TRM's 0.5).
        halting_tolerance (`float`, *optional*):
            ε of adaptive halting at inference (eval mode): a sample stops iterating once its relative state
            change ‖x_{t+1} − x_t‖ / ‖x_t‖ (or relative energy change) falls below ε, at num_iterations at
            the latest, and costs no further compute. `None`: every sample runs num_iterations.
        halting_criterion (`str`, *optional*, defaults to `"state"`):
            What halting measures: `"state"` change (the default: it needs no energy evaluation) or `"energy"`
            change |E_t − E_{t+1}| / |E_t| of E_ATTN + E_FF, its size whether the energy falls or rises.
        image_size (`int` or `list[int]`, *optional*, defaults to 224):
            Input resolution (height, width): the paper resizes CIFAR images to 224 (Table 5); non-square sizes
            are allowed.
        patch_size (`int`, *optional*, defaults to 16):
            Side of the square patches (the paper's CIFAR-10 Small model, Table 6).
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
            Longest sequence accepted; the size of the position table (512, BERT's default; sequences only).
        position_embedding_type (`str`, *optional*, defaults to `"sinusoidal"`):
            Position encoding of sequences: `"sinusoidal"` (fixed, 1-D), `"learned"`, or `"sincos-2d"`, the
            fixed row/column table of the authors' Sudoku `sincos` option (max_position_embeddings cells of
            a square board, row-major). Images always use the fixed 1-D sinusoid over the patch tokens, as in
            the paper.
        pooling (`str`, *optional*, defaults to `"cls"`):
            Classifier input: first token (`"cls"`; the CLS token for images, which the paper's image head reads) or
            masked mean (`"mean"`).
        classifier_norm (`str`, *optional*, defaults to `"layernorm"`):
            Norm before the classifier: `"layernorm"` (the paper's image models) or `"rmsnorm"` (their Sudoku model).
        classifier_bias (`bool`, *optional*, defaults to `True`):
            Whether the classifier Linear has a bias (the authors' Sudoku head has none).
        rms_norm_eps (`float`, *optional*):
            RMSNorm epsilon; `None` uses torch's default (machine epsilon of the dtype), as the authors do.
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            LayerNorm epsilon of the patch embedding and the classifier (torch's default, as the authors' model).
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of linear and embedding weights (as in ViT).
        num_labels (`int`, *optional*, defaults to 2):
            Classes of the classification heads (a `PreTrainedConfig` argument, checked here to be >= 0);
            0 = the heads use `nn.Identity()` as classifier and return the features (as in ViT).
    """

    model_type = "hyperset"
    # as the baseline's (`RecurrentDepthConfig`), and the energy fields Hyper-SET's heads add
    keys_to_ignore_at_inference = [
        *RecurrentDepthConfig.keys_to_ignore_at_inference,
        "energies",
        "iterations_used",
    ]

    def __init__(
        self,
        input_type: str = "image",
        hidden_size: int = 384,
        num_attention_heads: int = 6,
        intermediate_size: int = 384,
        num_hidden_layers: int = 1,
        num_iterations: int = 12,
        qkv_norm: str = "separate",
        step_size_condition: str = "current",
        hidden_act: str = "relu",
        attention_energy: str = "bisoftmax",
        feedforward_energy: str = "relu",
        feature_map: str | None = None,
        iteration_conditioning: str = "none",
        step_size_norm: str = "rmsnorm",
        time_embedding_dim: int = 512,
        input_anchor: float = 0.0,
        iteration_sampling: str = "fixed",
        min_iterations: int | None = None,
        max_iterations: int | None = None,
        iteration_sampling_sigma: float = 0.5,
        backprop_iterations: int | None = None,
        deep_supervision: str = "last",
        deep_supervision_interval: int = 2,
        deep_supervision_samples: int = 2,
        deep_supervision_weights: str = "uniform",
        supervision_steps: int = 1,
        halting_head: bool = False,
        halting_loss_weight: float = 0.5,
        halting_tolerance: float | None = None,
        halting_criterion: str = "state",
        image_size: int | list[int] = 224,
        patch_size: int = 16,
        num_channels: int = 3,
        vocab_size: int | None = None,
        pad_token_id: int | None = None,
        max_position_embeddings: int = 512,
        position_embedding_type: str = "sinusoidal",
        pooling: str = "cls",
        classifier_norm: str = "layernorm",
        classifier_bias: bool = True,
        rms_norm_eps: float | None = None,
        layer_norm_eps: float = 1e-5,
        initializer_range: float = 0.02,
        **kwargs: Any,
    ) -> None:
        self.qkv_norm = qkv_norm
        self.step_size_condition = step_size_condition
        self.attention_energy = attention_energy
        self.feedforward_energy = feedforward_energy
        self.feature_map = feature_map
        self.iteration_conditioning = iteration_conditioning
        self.step_size_norm = step_size_norm
        self.time_embedding_dim = time_embedding_dim
        self.input_anchor = input_anchor
        self.halting_tolerance = halting_tolerance
        self.halting_criterion = halting_criterion
        arguments = locals()  # the shared fields, as this signature received them
        super().__init__(**{name: arguments[name] for name in self.shared_fields()}, **kwargs)

    def _check_cross_field_rules(self) -> None:
        """The shared rules (`RecurrentDepthConfig`), then Hyper-SET's own."""
        super()._check_cross_field_rules()
        _require(
            self,
            self.time_embedding_dim >= 4 and self.time_embedding_dim % 2 == 0,
            "time_embedding_dim",
            self.time_embedding_dim,
            "expected an even integer >= 4 ([sin, cos] halves)",
        )
        _require(
            self,
            _is_real(self.input_anchor) and 0 <= self.input_anchor <= 1,
            "input_anchor",
            self.input_anchor,
            "expected a float in [0, 1] (1: every iteration restarts from x₀ plus the update)",
        )
        _require(
            self,
            self.iteration_conditioning != "sinusoidal-no-mlp" or self.time_embedding_dim == self.hidden_size,
            "time_embedding_dim",
            self.time_embedding_dim,
            f"iteration_conditioning='sinusoidal-no-mlp' adds the sinusoid to the state: expected hidden_size="
            f"{self.hidden_size}",
            depends_on=("iteration_conditioning", "hidden_size"),
        )
        uses_feature_map = self.attention_energy == "linear" or self.feedforward_energy == "gated"
        _require(
            self,
            self.feature_map in FEATURE_MAPS if uses_feature_map else self.feature_map is None,
            "feature_map",
            self.feature_map,
            f"attention_energy='linear' and feedforward_energy='gated' need one of {list(FEATURE_MAPS)}"
            if uses_feature_map
            else "only attention_energy='linear' and feedforward_energy='gated' use a feature map: leave it None",
            depends_on=("attention_energy", "feedforward_energy"),
        )


__all__ = ["FEATURE_MAPS", "HyperSetConfig", "RecurrentDepthConfig"]
