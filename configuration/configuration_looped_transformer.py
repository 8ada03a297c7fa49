# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Looped-Transformer baseline configuration.

The comparison of every table in Hu, Zou, Xu, *Hyperspherical Energy Transformer with Recurrent Depth*: one
pre-norm Transformer layer (RMSNorm, bias-free, GELU MLP) applied `num_iterations` times with shared weights,
with Hyper-SET's embeddings and classification head (the norm and bias of `classifier_norm`, `classifier_bias`), so
both models are measured side by side at the same width, heads and depth. Both configs derive from
`RecurrentDepthConfig` (defined with Hyper-SET's, whose validation tables it uses); it is a baseline, not a Hub
family: only its masked-image-modelling head is exported, with Hyper-SET's files beside it, so importing the
Hyper-SET configuration works there too.
"""

from __future__ import annotations

import inspect
import numbers
from types import MappingProxyType
from typing import Any

from .configuration_hyperset import ConfigValueError, HyperSetConfig, RecurrentDepthConfig


def _parameters(config_class: type) -> tuple[str, ...]:
    return tuple(
        name for name in inspect.signature(config_class.__init__).parameters if name not in ("self", "kwargs")
    )


# Hyper-SET options that the baseline's model does not build (energies, step sizes, halting by state or energy
# change): the fields `HyperSetConfig` adds to the base both configs share. Rejected as
# arguments, so a baseline's config.json never carries a setting it ignores.
HYPERSET_ONLY_FIELDS: tuple[str, ...] = tuple(
    name for name in _parameters(HyperSetConfig) if name not in _parameters(RecurrentDepthConfig)
)

# Fields `from_hyperset` copies: the shared base's, less the MLP (Hyper-SET's `intermediate_size` is the size of its
# dictionary, `hidden_act` its feedforward's), plus the loss the labels call for.
SHARED_FIELDS: tuple[str, ...] = (
    *(name for name in _parameters(RecurrentDepthConfig) if name not in ("intermediate_size", "hidden_act")),
    "problem_type",
)


# The head norm of a folder saved before `classifier_norm` was a field of the baseline, by its architecture, where it
# was not the default: the masked-image-modelling head has always been RMSNorm → Linear with bias (bias: the default).
LEGACY_CLASSIFIER_NORMS: MappingProxyType[str, str] = MappingProxyType(
    {"LoopedTransformerForMaskedImageModeling": "rmsnorm"}
)


class LoopedTransformerConfig(RecurrentDepthConfig):
    r"""Configuration of the looped (weight-tied) Transformer baseline (`model_type="looped-transformer"`).

    Args:
        input_type (`str`, *optional*, defaults to `"image"`):
            `"image"` (Hyper-SET's patch embedding + CLS token) or `"sequence"` (token embedding of `input_ids`).
        hidden_size (`int`, *optional*, defaults to 384):
            Token width d (as Hyper-SET's CIFAR-10 Small model).
        num_attention_heads (`int`, *optional*, defaults to 6):
            Heads H of the softmax attention (as Hyper-SET's CIFAR-10 Small model).
        intermediate_size (`int`, *optional*):
            Width of the GELU MLP; `None` = 4 · hidden_size, the standard Transformer ratio.
        num_hidden_layers (`int`, *optional*, defaults to 1):
            Distinct weight-tied layers L, applied one after the other (as Hyper-SET's CIFAR-10 Small model).
            `num_layers` is an alias: it reads and sets this field (`config.num_layers`, `num_layers=` in the
            constructor and `from_preset`).
        num_iterations (`int`, *optional*, defaults to 12):
            Iterations T of each layer (as Hyper-SET's CIFAR-10 Small model); effective depth L·T; can be
            overridden per forward call.
        hidden_act (`str`, *optional*, defaults to `"gelu"`):
            MLP activation, `"gelu"` (the paper's looped-Transformer baseline) or `"relu"`.
        iteration_sampling (`str`, *optional*, defaults to `"fixed"`):
            Depth of each training forward, as Hyper-SET's: `"fixed"`, `"uniform"` or `"poisson-lognormal"`.
        min_iterations (`int`, *optional*):
            Smallest sampled depth (Hyper-SET's defaults).
        max_iterations (`int`, *optional*):
            Largest sampled depth (Hyper-SET's defaults).
        iteration_sampling_sigma (`float`, *optional*, defaults to 0.5):
            σ of the log-normal rate of `"poisson-lognormal"` (Hyper-SET's default).
        backprop_iterations (`int`, *optional*):
            Differentiate only the last k of the L·T iterations (truncated backpropagation through depth).
        deep_supervision (`str`, *optional*, defaults to `"last"`):
            Which iterations the training loss reads, as Hyper-SET's: `"last"`, `"all"`, `"every"` or `"random"`.
        deep_supervision_interval (`int`, *optional*, defaults to 2):
            k of `"every"` (iterations T, T − k, …; 2: k = 1 is `"all"`).
        deep_supervision_samples (`int`, *optional*, defaults to 2):
            n of `"random"` (the last iteration plus n − 1 drawn per training forward; 2: n = 1 is `"last"`).
        deep_supervision_weights (`str`, *optional*, defaults to `"uniform"`):
            `"uniform"` or `"linear"` (iteration t weighs t) weights of the supervised iterations' losses.
        supervision_steps (`int`, *optional*, defaults to 1):
            S outer steps of T iterations with a detached carry, as Hyper-SET's.
        halting_head (`bool`, *optional*, defaults to `False`):
            A learned halting classifier on the pooled state after every outer step, as Hyper-SET's.
        halting_loss_weight (`float`, *optional*, defaults to 0.5):
            Weight of the halting head's BCE in the training loss, as Hyper-SET's.
        image_size (`int` or `list[int]`, *optional*, defaults to 224):
            Input resolution (height, width), as Hyper-SET's CIFAR-10 Small model.
        patch_size (`int`, *optional*, defaults to 16):
            Side of the square patches (as Hyper-SET's CIFAR-10 Small model).
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
            Positions of sequences, as Hyper-SET's: `"sinusoidal"` (fixed, 1-D), `"learned"`, or `"sincos-2d"`
            (the fixed row/column table of a square board, e.g. Sudoku); images always use the fixed 1-D sinusoid.
        pooling (`str`, *optional*, defaults to `"cls"`):
            Classifier input: first token (`"cls"`; the CLS token for images, as Hyper-SET's head) or masked mean
            over the real tokens (`"mean"`).
        classifier_norm (`str`, *optional*, defaults to `"layernorm"`):
            Norm before the classifier, as Hyper-SET's: `"layernorm"` (its image models) or `"rmsnorm"` (its Sudoku
            and masked-image-modelling models). A config saved without the field loads with the head it was saved
            with: LayerNorm for the classifiers, RMSNorm for the masked-image-modelling head.
        classifier_bias (`bool`, *optional*, defaults to `True`):
            Whether the classifier Linear (the masked-image-modelling head's code head) has a bias, as Hyper-SET's.
        rms_norm_eps (`float`, *optional*):
            Epsilon of the two pre-norm RMSNorms and of an RMSNorm head; `None` uses torch's default, as Hyper-SET.
        layer_norm_eps (`float`, *optional*, defaults to 1e-5):
            LayerNorm epsilon of the patch embedding and the classifier; Hyper-SET's, so the embeddings and head
            the two models share normalise alike.
        initializer_range (`float`, *optional*, defaults to 0.02):
            Std of the normal initialisation of linear and embedding weights; Hyper-SET's, so a side-by-side run
            starts both models from weights of the same scale.

    Hyper-SET-only options (`HYPERSET_ONLY_FIELDS`: energies, step sizes, halting by state or energy change) raise
    `ValueError`.
    """

    model_type = "looped-transformer"
    # the baseline's choice fields only: the Hyper-SET options it refuses are left out
    choices = MappingProxyType(
        {
            name: values
            for name, values in RecurrentDepthConfig.choices.items()
            if name not in HYPERSET_ONLY_FIELDS
        }
    )

    def __init__(
        self,
        input_type: str = "image",
        hidden_size: int = 384,
        num_attention_heads: int = 6,
        intermediate_size: int | None = None,
        num_hidden_layers: int = 1,
        num_iterations: int = 12,
        hidden_act: str = "gelu",
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
        for name in HYPERSET_ONLY_FIELDS:
            if name in kwargs:
                raise ConfigValueError(
                    f"{type(self).__name__}: invalid {name}={kwargs[name]!r}; a Hyper-SET option that the "
                    "looped-Transformer baseline does not have (build a HyperSetConfig for it).",
                    (name,),
                )
        width_known = isinstance(hidden_size, numbers.Integral) and not isinstance(hidden_size, bool)
        if intermediate_size is None and width_known:
            intermediate_size = 4 * hidden_size
        arguments = locals()  # the shared fields, as this signature received them
        super().__init__(**{name: arguments[name] for name in self.shared_fields()}, **kwargs)

    @classmethod
    def from_hyperset(cls, config: HyperSetConfig, **overrides: Any) -> LoopedTransformerConfig:
        """The baseline matching a Hyper-SET config: same embeddings, labels, width, heads, depth and head.

        The head's `classifier_norm` and `classifier_bias` are copied, so the baseline of a Sudoku preset has its
        RMSNorm → bias-free Linear. The MLP width is the baseline's own (4 · hidden_size unless
        `intermediate_size` is overridden): Hyper-SET's `intermediate_size` is the size of its dictionary, not an
        MLP width. `overrides` are checked as `from_preset`'s.
        """
        cls._check_override_names(overrides, "from_hyperset")
        kwargs = {name: getattr(config, name) for name in SHARED_FIELDS}
        if "num_labels" not in overrides and "id2label" not in overrides:
            kwargs["id2label"] = dict(config.id2label or {})
            if config.label2id:
                kwargs["label2id"] = dict(config.label2id)
        return cls(**{**kwargs, **overrides})

    @classmethod
    def preset_fields(cls, name: str) -> dict[str, Any]:
        """The fields preset `name` sets, as a new dict (the caller may change it).

        The presets are the baseline's own rows (`LOOPED_TRANSFORMER_PRESETS` of the package's
        `energyformers.presets`, e.g. Table 2's `mim-1-12-4d`), as they are, and every Hyper-SET row
        (`HYPERSET_PRESETS`), of which the baseline takes the fields it shares (same embeddings and iteration count,
        for side-by-side comparisons, the head's norm and bias included, as `from_hyperset`; its MLP is its own,
        4 · hidden_size wide); `PRESET_SOURCES` there says which paper setting each row reproduces.
        """
        own = _own_presets(cls, name)
        if name in own:
            return dict(own[name])
        # as `from_hyperset`: the MLP is the baseline's own (4 · hidden_size), not Hyper-SET's dictionary
        mlp = ("intermediate_size", "hidden_act")
        fields = HyperSetConfig.preset_fields(name).items()
        return {k: v for k, v in fields if k not in HYPERSET_ONLY_FIELDS and k not in mlp}

    @classmethod
    def from_dict(cls, config_dict: dict[str, Any], **kwargs: Any) -> Any:
        """As every config's, and a config.json without `classifier_norm` (saved before the baseline had the field)
        keeps the head its weights were saved with: the default LayerNorm for the classifiers, RMSNorm for the
        masked-image-modelling head (`LEGACY_CLASSIFIER_NORMS`). A new config always writes the field."""
        architectures = config_dict.get("architectures") or []
        legacy = {LEGACY_CLASSIFIER_NORMS[name] for name in architectures if name in LEGACY_CLASSIFIER_NORMS}
        if "classifier_norm" not in config_dict and len(legacy) == 1:
            config_dict = {**config_dict, "classifier_norm": legacy.pop()}
        return super().from_dict(config_dict, **kwargs)

    @classmethod
    def _check_override_names(cls, overrides: dict[str, Any], where: str) -> None:
        """As every config's (`from_preset`, which this class inherits, `from_hyperset` and `--config` call it),
        less the Hyper-SET-only options: the constructor refuses those with its own message, which says whose
        option each is, rather than as an unknown name."""
        shared = {name: value for name, value in overrides.items() if name not in HYPERSET_ONLY_FIELDS}
        super()._check_override_names(shared, where)


def _own_presets(config_class: type[LoopedTransformerConfig], name: str) -> dict[str, dict[str, Any]]:
    """The baseline's own preset rows, once `name` is known to be one of them or a Hyper-SET row: else a
    `ValueError` naming `config_class` and every name its `from_preset` takes (an `ImportError` without the package:
    remote code carries no preset tables)."""
    try:
        from energyformers.presets import HYPERSET_PRESETS, LOOPED_TRANSFORMER_PRESETS
    except ImportError:  # remote code loaded without the package (the import check skips try blocks)
        raise config_class._presets_need_the_package(name) from None
    if name not in LOOPED_TRANSFORMER_PRESETS and name not in HYPERSET_PRESETS:
        raise ValueError(
            f"{config_class.__name__}: unknown preset name={name!r}; expected one of "
            f"{sorted({*LOOPED_TRANSFORMER_PRESETS, *HYPERSET_PRESETS})} (the baseline's own rows and "
            "Hyper-SET's)."
        )
    return LOOPED_TRANSFORMER_PRESETS


__all__ = ["HYPERSET_ONLY_FIELDS", "LoopedTransformerConfig"]
