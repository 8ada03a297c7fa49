# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""PyTorch HyperBF (homogeneous Transformer).

Gan, Poggio, *A Homogeneous Transformer Architecture* (CBMM memo 143). Every block is two HyperBF units,
Gaussian radial-basis functions with a learned metric: a distance-based attention over the tokens
(score −τ‖q − k‖²) and a normalized RBF layer over K learned centers in place of the MLP.

Deliberate deviation from the public code: its RBF feedforward uses exp(−β·distance) with N(0, 1)
centers against LayerNorm'd inputs, so it underflows to 0 in float32 and never trains, and it hard-codes
widths. Here every width comes from the config and the kernel is initialised in its useful range.

Other layout choices (same function, different layout): q, k, v are three bias-free
`Linear(D, D)` (`q_proj`/`k_proj`/`v_proj`, the canonical names) instead of one fused `Linear(D, 3D)`; the
metric W is a bare (R, D) parameter `metric` rather than a `Linear`; and the centers start at N(0, 1), where
LayerNorm'd inputs live, rather than N(0, 0.02), with σ chosen from that (see `_init_weights`), so the scaled
distance d²/2σ² starts near ln K and every center weight near 1/K.

`attn_implementation` (transformers' standard names): `"eager"` is the reference, explicit scores with the
per-key bias as an additive mask, and the only path that returns attention maps and center weights; `"sdpa"`
(the default) runs both units as mask-free `scaled_dot_product_attention` with the per-key bias folded into
one extra head dimension (q' = [q, 1], k' = [k, b]): flash kernels apply, no scores are built. A function
registered in transformers' registry (`AttentionInterface.register`) is taken too and gets the same folded,
mask-free call in place of SDPA. The feedforward folds only while its folded head fits the fused kernels
(`FUSED_ATTENTION_MAX_HEAD_DIM`); wider, as at the memo's D = 768, it keeps the explicit path, which is faster
there.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import math
import os
import threading
import weakref
from collections.abc import Callable, Iterator
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import AttentionInterface, PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput, logging
from transformers.utils.generic import is_flash_attention_requested

from ..configuration.configuration_hyperbf import HyperBFConfig

logger = logging.get_logger(__name__)


@dataclass
class HyperBFRBFDiagnostics(ModelOutput):
    """What the two HyperBF units of every layer computed in this forward.

    center_weights: `(batch, num_layers, sequence_length, num_centers)`, the feedforward center weights
    w_α(x). feedforward_sigmas: `(num_layers, 1)` or `(num_layers, num_centers)` (`rbf_width="center"`), the
    feedforward kernel widths σ. attention_sigmas: `(num_layers, num_attention_heads)`, the attention kernel
    width σ_h = 1/√(2τ_h) of each head.
    """

    center_weights: torch.FloatTensor | None = None
    feedforward_sigmas: torch.FloatTensor | None = None
    attention_sigmas: torch.FloatTensor | None = None


@dataclass
class HyperBFModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling` plus `rbf_diagnostics` (a `HyperBFRBFDiagnostics`, with
    `output_rbf_diagnostics=True`).

    `hidden_states` holds the embedding output and the output of every layer (1 + L tensors, before the final
    LayerNorm); `attentions` the attention maps of every layer (L tensors).
    """

    rbf_diagnostics: HyperBFRBFDiagnostics | None = None


@dataclass
class HyperBFImageClassifierOutput(ImageClassifierOutput):
    """`ImageClassifierOutput` plus `rbf_diagnostics` (with `output_rbf_diagnostics=True`)."""

    rbf_diagnostics: HyperBFRBFDiagnostics | None = None


@dataclass
class HyperBFSequenceClassifierOutput(SequenceClassifierOutput):
    """`SequenceClassifierOutput` plus `rbf_diagnostics` (with `output_rbf_diagnostics=True`)."""

    rbf_diagnostics: HyperBFRBFDiagnostics | None = None


# --- shared helpers: identical in energyformers' three family model files (its test suite checks) ---


def select_attn_implementation(
    model: PreTrainedModel,
    requested: str | None,
    is_init_check: bool,
    choose: Callable[[str | None, bool], str],
    note: str = "",
) -> str:
    """`get_correct_attn_implementation` of the model classes: transformers calls it for `attn_implementation=` in
    `from_pretrained` / `from_config`, for `set_attn_implementation` and at `__init__`. A name outside the class's
    `attn_implementations` is refused with a ValueError naming the model, the name and those it takes (transformers'
    own message lists implementations these models do not run, or points at a Hub page made from the folder name);
    `note` ends that message. None and the names it takes go on to `choose(requested, is_init_check)`: transformers'
    own choice (None: "sdpa" where the class supports it, else "eager") or the family's."""
    taken = list(model.attn_implementations)  # at call time: a registry can grow after import
    if requested is not None and requested not in taken:
        names = ", ".join(f'`"{name}"`' for name in taken)
        raise ValueError(
            f'Specified `attn_implementation="{requested}"` is not supported by {type(model).__name__}. The only '
            f"possible arguments are {names}, or None for the default{note}."
        )
    if requested is None and model.config.output_attentions:
        # a config whose every call asks for maps gets the implementation that computes them, as transformers'
        # config does when output_attentions is set before an implementation is chosen
        requested = "eager"
    return choose(requested, is_init_check)


# pickle weight files: transformers' (`pytorch_model.bin`, its shards and index) and torch.save's usual suffixes;
# not every .bin (Trainer's `training_args.bin` holds no weights)
PICKLE_WEIGHT_PREFIX, PICKLE_WEIGHT_SUFFIXES = "pytorch_model", (".pt", ".pth", ".ckpt", ".pkl")


def load_naming_unreadable_file(
    load: Callable[..., PreTrainedModel],
    pretrained_model_name_or_path: object,
    *model_args: object,
    **kwargs: object,
) -> PreTrainedModel:
    """`load(pretrained_model_name_or_path, *model_args, **kwargs)` (transformers' `from_pretrained`), where an
    unreadable safetensors file (truncated or corrupt) raises an `OSError` naming the file, and a local folder that
    transformers refuses under `use_safetensors=True` while it holds pickle weights raises one `OSError` naming the
    folder and those files."""
    try:
        return load(pretrained_model_name_or_path, *model_args, **kwargs)
    except OSError as error:
        subfolder = kwargs.get("subfolder")
        folder = os.path.join(str(pretrained_model_name_or_path), *([str(subfolder)] if subfolder else []))
        names = sorted(os.listdir(folder)) if kwargs.get("use_safetensors") and os.path.isdir(folder) else []
        pickles = [
            n for n in names if n.startswith(PICKLE_WEIGHT_PREFIX) or n.endswith(PICKLE_WEIGHT_SUFFIXES)
        ]
        if not pickles or any(name.endswith(".safetensors") for name in names):
            raise
        raise OSError(
            f"{folder} holds pickle weights ({', '.join(pickles)}) and no model.safetensors: weights are loaded from "
            "safetensors only, never unpickled. Where the pickle file is trusted, load its state dict yourself and "
            "re-save the model with save_pretrained, which writes model.safetensors."
        ) from error
    except Exception as error:
        # safetensors' error class, matched by name: a model file imports only torch and transformers
        if type(error).__name__ != "SafetensorError":
            raise
        # safetensors' message does not say which file: the innermost loader frame holding a path does
        path, trace = pretrained_model_name_or_path, error.__traceback__
        while trace is not None:
            names = trace.tb_frame.f_locals.values()
            path = next((v for v in names if isinstance(v, str) and v.endswith(".safetensors")), path)
            trace = trace.tb_next
        raise OSError(
            f"{path} is not a readable safetensors file (truncated or corrupt): {error}; re-save or re-download it"
        ) from error


def config_choice(config: PreTrainedConfig, name: str, choices: dict[str, object]) -> object:
    """What `choices` maps the value of field `name` to. Code that runs after the model is built (a forward, a
    depth draw, `_init_weights`) reads a choice field through such a table, never by an `if`/`else` whose `else`
    would run for any other value: a value edited onto `model.config` after the build raises here, in the config's
    words, instead of running another model. A module's `__init__` may compare the value directly: the model's
    construction checks the config first (`FamilyPreTrainedMixin`), and a value it stores is the checked one."""
    value = getattr(config, name)
    if value not in choices:
        raise ValueError(
            f"{type(config).__name__}: invalid {name}={value!r}; expected one of {list(choices)}."
        )
    return choices[value]


def _is_tracing() -> bool:
    """True under torch.compile / torch.export: checks that read tensor values into Python run eagerly only."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def check_keep_mask(
    mask: torch.Tensor, name: str = "attention_mask", read_values: bool = True
) -> torch.Tensor:
    """`mask` as bool (True: attend): a bool mask as it is, an integer or floating one of 0/1 (1: attend) converted,
    as transformers' BERT and ViT read a 0/1 mask of any dtype. Any other value is refused, since `mask.bool()`
    would read it as "attend": a padding sentinel such as -1, or an additive mask, whose 0 means "attend" where a
    0/1 mask's means "masked". The values are read when `read_values` and not tracing (a host read: a caller that
    already reads other values from the device reads `stray_mask_values` with them instead). A floating mask is
    refused while tracing (torch.compile, torch.export, torch.jit.trace), where its values cannot be read: nothing
    would tell a 0/1 mask from an additive one."""
    floating = mask.dtype.is_floating_point
    if mask.is_complex():
        raise ValueError(f"{name} must be bool (True: attend) or 0/1 (1: attend); got dtype {mask.dtype}.")
    if floating and (_is_tracing() or torch.jit.is_tracing()):
        raise ValueError(
            f"{name} must be bool (True: attend) or integer 0/1 (1: attend) under torch.compile, torch.export and "
            f"torch.jit.trace, which cannot read a float mask's values to tell a 0/1 mask from an additive one; got "
            f"dtype {mask.dtype}. Convert it before the call: a 0/1 keep-mask with `{name}.bool()`, an additive one "
            f"(0: attend, -inf or a large negative number: masked) with `{name} == 0`."
        )
    if mask.dtype == torch.bool:
        return mask
    if read_values and mask.numel() and not _is_tracing() and int(stray_mask_values(mask)):
        stray = mask[(mask != 0) & (mask != 1)]
        if not floating:
            raise ValueError(f"an integer {name} must hold only 0 and 1 (1: attend); got {stray[0].item()}.")
        seen = stray.unique().tolist()  # NaN != NaN: each NaN counts once, the first few are enough
        raise ValueError(
            f"a float {name} must hold only 0 and 1 (1: attend, 0: masked); got {len(stray)} other value(s), "
            f"among them {seen[:4]}. An additive mask (0: attend, -inf or a large negative number: masked) "
            f"converts with `{name} == 0`."
        )
    return mask.bool()


def stray_mask_values(mask: torch.Tensor | None) -> torch.Tensor:
    """How many entries of an integer or floating `mask` are neither 0 nor 1 (NaN included), as a 0-d int64
    tensor on its device (0 for a bool mask; a CPU 0 for none)."""
    if mask is None:
        return torch.zeros((), dtype=torch.int64)
    if mask.dtype == torch.bool:
        return torch.zeros((), dtype=torch.int64, device=mask.device)
    return ((mask != 0) & (mask != 1)).sum()


def check_head_input_type(head: nn.Module, input_type: str, required: str) -> None:
    """Refuse, at construction, a head built on a config of the other input type (an image head on a sequence
    config, or the reverse): its `forward` could not take the inputs that config's embeddings read."""
    if input_type != required:
        raise ValueError(
            f"{type(head).__name__} needs config.input_type={required!r}; got input_type={input_type!r}."
        )


def route_main_input(
    config: PreTrainedConfig, pixel_values: torch.Tensor | None, input_ids: torch.Tensor | None
) -> tuple[torch.Tensor | None, torch.Tensor | None]:
    """(pixel_values, input_ids) of a backbone call. The one class-level `forward` of a backbone takes
    `pixel_values` first (the class's `main_input_name`, which transformers reads from the signature); a sequence
    backbone's `main_input_name` is `input_ids`, so `model(ids)` puts the ids in the first slot: integer ids there,
    with no `input_ids`, move to `input_ids`. Pixels given to a sequence backbone stay where they are and are
    rejected by name."""
    tokens = config_choice(config, "input_type", {"image": False, "sequence": True})
    if tokens and input_ids is None and pixel_values is not None:
        if not (pixel_values.is_floating_point() or pixel_values.is_complex()):
            return None, pixel_values
    return pixel_values, input_ids


def _check_inputs(
    config: PreTrainedConfig,
    pixel_values: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """Exactly the input kind of `config.input_type`, with the shapes and dtypes the embeddings read. With
    input_ids the mask's values are read by `_check_token_ids`, with the ids' range, in the one host read a call
    with ids makes anyway; without, they are read here on the CPU, and on an accelerator only for a float mask (an
    additive one would be misread; an integer device mask beside inputs_embeds: dtype only)."""
    if attention_mask is not None:
        read = attention_mask.device.type == "cpu" or attention_mask.dtype.is_floating_point
        check_keep_mask(attention_mask, read_values=input_ids is None and read)
    if config_choice(config, "input_type", {"image": True, "sequence": False}):
        if pixel_values is None or input_ids is not None or inputs_embeds is not None:
            raise ValueError(
                "this model takes images (config.input_type='image'): pass pixel_values, "
                "not input_ids or inputs_embeds."
            )
        if pixel_values.ndim != 4 or pixel_values.shape[1] != config.num_channels:
            raise ValueError(
                f"pixel_values must have shape (batch, num_channels={config.num_channels}, height, width); got "
                f"{tuple(pixel_values.shape)}. Convert the images to {config.num_channels} channel(s) or build "
                "the model with a matching num_channels."
            )
        return
    if pixel_values is not None or (input_ids is None) == (inputs_embeds is None):
        raise ValueError(
            "this model takes tokens (config.input_type='sequence'): pass exactly one of input_ids or "
            "inputs_embeds, and no pixel_values."
        )
    if input_ids is not None:
        if input_ids.ndim != 2 or input_ids.dtype.is_floating_point or input_ids.dtype == torch.bool:
            raise ValueError(
                "input_ids must be integer token ids of shape (batch, sequence_length); got shape "
                f"{tuple(input_ids.shape)} and dtype {input_ids.dtype}."
            )
        shape = input_ids.shape
    else:
        if inputs_embeds.ndim != 3 or inputs_embeds.shape[-1] != config.hidden_size:
            raise ValueError(
                f"inputs_embeds must have shape (batch, sequence_length, hidden_size={config.hidden_size}); got "
                f"{tuple(inputs_embeds.shape)}."
            )
        shape = inputs_embeds.shape[:2]
    if attention_mask is not None and attention_mask.shape != shape:
        raise ValueError(
            f"attention_mask must have the shape of the inputs, {tuple(shape)}; got {tuple(attention_mask.shape)}."
        )


def _check_image_size(
    pixel_values: torch.Tensor, image_size: tuple[int, int], patch_size: int, interpolate: bool | None = None
) -> None:
    """`interpolate`: None for models whose token count is fixed by image_size, else the caller's flag."""
    height, width = pixel_values.shape[-2:]
    if height % patch_size or width % patch_size:
        raise ValueError(
            f"pixel_values have spatial size {height}×{width}, not a multiple of patch_size={patch_size}; "
            "resize or crop the images."
        )
    if not interpolate and (height, width) != tuple(image_size):
        alternative = "" if interpolate is None else ", or pass interpolate_pos_encoding=True"
        raise ValueError(
            f"pixel_values have spatial size {height}×{width} but config.image_size is {image_size[0]}×"
            f"{image_size[1]}; resize the inputs to that size (the model's image processor does this){alternative}"
            f", or build the model with image_size=[{height}, {width}]."
        )


def _check_length(length: int, limit: int) -> None:
    if length > limit:
        raise ValueError(
            f"sequence length {length} exceeds max_position_embeddings={limit}; truncate the inputs "
            f"(text: tokenizer(..., truncation=True, max_length={limit}); image codes: one per position of the "
            "image tokenizer's grid, which must be the model's) or build the model with a larger "
            "max_position_embeddings."
        )


def _check_token_ids(
    input_ids: torch.Tensor | None, vocab_size: int, attention_mask: torch.Tensor | None = None
) -> None:
    """Ids inside the vocabulary and a mask of 0/1 only, in one host read; eager mode only. Callers pass
    `config.vocab_size` (kept by `resize_token_embeddings`), not the table's own size: a wrapped table (a PEFT
    LoRA `Embedding`) has no `num_embeddings`."""
    if input_ids is None or not input_ids.numel() or _is_tracing():
        return
    values = [input_ids.min(), input_ids.max()]
    if attention_mask is not None:  # no count, and no tensor to copy to the ids' device, without a mask
        values.append(stray_mask_values(attention_mask).to(input_ids.device))
    low, high, *stray = torch.stack([value.to(torch.int64) for value in values]).tolist()
    if any(stray):
        check_keep_mask(attention_mask)
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"input_ids must lie in [0, vocab_size={vocab_size}); got values in [{low}, {high}]. Use the "
            "tokenizer saved with the model."
        )


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    """(height, width) of an `image_size` given as one int (a square) or a pair."""
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def masked_mean(values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Mean over the token axis (dim 1) of `values` (B, N, ...) over the tokens `keep` (B, N) marks real."""
    if keep is None:
        return values.mean(1)
    # (B, N) → (B, N, 1, ...): broadcast over the feature axes; on the states' device, which a multi-device
    # split may have moved away from the mask's
    weights = keep.to(values.device, values.dtype).reshape(*keep.shape, *([1] * (values.ndim - 2)))
    return (values * weights).sum(1) / weights.sum(1).clamp_min(1.0)


# what `from_pretrained` passes on to locate config.json (a Hub repository's revision, cache, subfolder)
CONFIG_LOCATION_KWARGS = (
    "cache_dir",
    "force_download",
    "proxies",
    "token",
    "local_files_only",
    "revision",
    "subfolder",
)


def check_folder_model_type(model_class: type, pretrained_model_name_or_path: object, kwargs: dict) -> None:
    """Refuse, before any weights load, a folder whose config.json names another `model_type` than the class's
    config (another family's model, a ViT): transformers would only log it and return a randomly initialised
    model. A config.json that cannot be read, or names no model_type, is left to transformers' own loading."""
    if pretrained_model_name_or_path is None:
        return
    expected = model_class.config_class.model_type
    location = {name: kwargs[name] for name in CONFIG_LOCATION_KWARGS if name in kwargs}
    try:
        config_dict, _ = PreTrainedConfig.get_config_dict(pretrained_model_name_or_path, **location)
    except OSError:
        return
    found = config_dict.get("model_type")
    if found and found != expected:
        raise ValueError(
            f"{pretrained_model_name_or_path} holds a {found!r} model (config.json model_type); "
            f"{model_class.__name__} loads {expected!r} models. Load it with a class of its model type, or with "
            "transformers' AutoModel classes, which pick the class from config.json."
        )


class FamilyPreTrainedMixin:
    """What every family's `PreTrainedModel` shares, listed before transformers' class in its bases: the config's
    checks run again at construction, an `attn_implementation` outside the class's `attn_implementations` is refused
    by name (`select_attn_implementation`), and an unreadable weight file is named (`load_naming_unreadable_file`).

    A family that picks its own implementation (Hyper-SET's bi-softmax registry) overrides
    `_choose_attn_implementation`, and `_attn_implementation_note` ends the refusal's message; the defaults are
    transformers' own choice and no note. A backbone's `__init__` names its inputs by `config.input_type`
    (`_set_input_names`).
    """

    def __init__(self, config: PreTrainedConfig, *inputs: object, **kwargs: object) -> None:
        # A config edited by attribute assignment since its checks ran is refused by name. transformers' check of
        # output_attentions beside a non-eager implementation is left out (as BERT's construction does): a call
        # that asks for maps runs eager attention, and a head's backbone is built after the head chose sdpa.
        checked = config
        if config.output_attentions and config._attn_implementation not in (None, "eager"):
            checked = copy.copy(config)
            checked.output_attentions = False
        checked.validate()
        super().__init__(config, *inputs, **kwargs)

    def _set_input_names(self) -> None:
        """The input names of a backbone of `config.input_type`, set before `post_init`: `_input_embed_layer`, the
        table in `self.embeddings` that `get/set_input_embeddings` (transformers' defaults) find, and
        `main_input_name`, what processors, pipelines and `model(ids)` hand over first (`input_ids` for
        sequences; images keep the class's `pixel_values`)."""
        self._input_embed_layer = "projection" if self.config.input_type == "image" else "word_embeddings"
        if self.config.input_type == "sequence":
            self.main_input_name = "input_ids"

    def get_correct_attn_implementation(
        self, requested_attention: str | None, is_init_check: bool = False
    ) -> str:
        return select_attn_implementation(
            self,
            requested_attention,
            is_init_check,
            self._choose_attn_implementation,
            self._attn_implementation_note(),
        )

    def _choose_attn_implementation(self, requested: str | None, is_init_check: bool) -> str:
        """What a name this class takes (or None) runs: transformers' choice unless the family overrides it."""
        return super().get_correct_attn_implementation(requested, is_init_check)

    def _attn_implementation_note(self) -> str:
        """The end of the refusal of a name the class does not take (none unless the family overrides it)."""
        return ""

    def check_activation_checkpointing(self) -> None:
        """A ValueError if activation (gradient) checkpointing cannot train this model as built (none unless the
        family overrides it); `activation_checkpointing_enable` and `gradient_checkpointing_enable` call it before
        changing anything."""

    def check_call_arguments(self, **arguments: object) -> None:
        """A ValueError for a bad per-call argument among `arguments` (what a call would pass), as the forward
        raises it, without running the model (none unless the head overrides it): what the pipelines and
        `energyformers predict` check before the first call."""

    def _set_gradient_checkpointing(self, enable: bool = True, *args: object, **kwargs: object) -> None:
        # transformers' one step of every way to turn checkpointing on, before any module is changed; its public
        # names differ between the transformers versions supported, and overriding the old one makes the new warn
        if enable:
            self.check_activation_checkpointing()
        super()._set_gradient_checkpointing(enable, *args, **kwargs)

    @classmethod
    def from_pretrained(
        cls, pretrained_model_name_or_path: object, *model_args: object, **kwargs: object
    ) -> PreTrainedModel:
        # Weights are safetensors only: transformers' own switch, unless the caller sets it, refuses a checkpoint
        # that only a pickle file holds instead of unpickling it
        kwargs.setdefault("use_safetensors", True)
        # a config given (as the Auto classes give it) is the caller's choice
        if kwargs.get("config") is None:
            check_folder_model_type(cls, pretrained_model_name_or_path, kwargs)
        return load_naming_unreadable_file(
            super().from_pretrained, pretrained_model_name_or_path, *model_args, **kwargs
        )


def is_dispatched(module: nn.Module) -> bool:
    """Whether accelerate hooks run inside `module` (`from_pretrained(..., device_map=...)` with cpu/disk offload or
    a multi-device split, `dispatch_model`, `cpu_offload`): a hooked module's parameters may be on `meta` outside
    its own forward, and its outputs on its own device. The model then takes its hook-safe path: every parameter
    read inside its owner's call, no product hoisted out of a layer or batched across layers. A `device_map` that
    puts the whole model on one device attaches no hook and keeps the fast path."""
    return any(hasattr(submodule, "_hf_hook") for submodule in module.modules())


def head_loss(
    head: PreTrainedModel,
    logits: torch.Tensor,
    labels: torch.Tensor,
    num_items_in_batch: torch.Tensor | int | None = None,
    per_token: bool = False,
) -> torch.Tensor:
    """The loss of a head's `logits` by `config.problem_type` (transformers' `loss_function` for the head's class
    name; its token-classification loss takes (logits, labels), the others (labels, logits)).

    Without `num_items_in_batch`: the mean over this batch's labels (≠ −100). With it (what `Trainer` passes, the
    count of labels ≠ −100 over the whole gradient-accumulation window, and over the processes with
    `average_tokens_across_devices`): their sum divided by it, so the micro-batches' losses add up to the loss of the
    whole batch. transformers' regression (MSE) and multi-label (BCE) losses return a mean whatever the count says:
    that mean is rescaled to the sum over this batch's labels, which are what `Trainer` counts for them."""
    config = head.config
    if num_items_in_batch is None:
        return head.loss_function(*((logits, labels) if per_token else (labels, logits)), config)
    if per_token:
        return head.loss_function(logits, labels, config, num_items_in_batch=num_items_in_batch)
    loss = head.loss_function(labels, logits, config, num_items_in_batch=num_items_in_batch)
    if config.problem_type in ("regression", "multi_label_classification"):  # set by the call above
        if isinstance(num_items_in_batch, torch.Tensor):
            num_items_in_batch = num_items_in_batch.to(loss.device)
        loss = loss * labels.numel() / num_items_in_batch
    return loss


# --- end of shared helpers ---


# --- attention-family helpers: identical in energyformers' Hyper-SET and HyperBF files (its test suite checks) ---


class SoftmaxAttentionNames:
    """The `attn_implementations` of a class whose attention is standard softmax attention computed by transformers'
    attention functions (HyperBF's, the looped baseline's): "eager" and every name of transformers'
    `AttentionInterface` registry, read at each access, so a function registered with
    `AttentionInterface.register(name, function)` is taken as a ViT takes it. Left out: the names transformers refuses
    a class that does not declare them (flash attention without `_supports_flash_attn`, flex attention without
    `_supports_flex_attn`), and "paged|" ones, which serve transformers' paged-cache batching of generation."""

    def __get__(self, instance: object, owner: type) -> tuple[str, ...]:
        names = ["eager"]
        for name in AttentionInterface():
            flash = is_flash_attention_requested(requested_attention_implementation=name)
            if name.startswith("paged|") or (flash and not owner._supports_flash_attn):
                continue
            if "flex_attention" in name and not owner._supports_flex_attn:
                continue
            names.append(name)
        return tuple(names)


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float = 1.0,
    dropout: float = 0.0,
    **kwargs: object,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scaling·q·kᵀ + attention_mask) v with the maps, in the signature and layout of transformers' attention
    functions: the reference and the maps-returning path of every standard softmax attention here (HyperBF's, whose
    distances become a per-key bias in the mask, and the looped baseline's).

    query/key/value: (B, H, N, d_h); attention_mask: additive, broadcastable to (B, H, N, N). Output: (B, N, H, d_h).
    """
    # q is scaled before the product, transformers' eager functions scale the product: the same value, rounded
    # differently unless `scaling` is a power of two (this order is the looped baseline's, HyperBF passes 1)
    scores = torch.matmul(query * scaling, key.transpose(-1, -2))  # (B, H, N, N)
    if attention_mask is not None:
        scores = scores + attention_mask
    # Softmax in at least float32, as transformers' (half-precision scores lose the small weights); float64 stays.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(
        query.dtype
    )
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, H, N, d_h) → (B, N, H, d_h)
    return output, weights


def _check_position_ids(
    config: PreTrainedConfig, position_ids: torch.Tensor | None, shape: tuple[int, ...] | None
) -> torch.Tensor | None:
    """`position_ids` of a call: none for images (their positions are those of the patch grid), else integer
    positions in [0, max_position_embeddings), the rows of the position table, of the inputs' shape
    `(batch, sequence_length)` or `(1, sequence_length)` (one row for the whole batch, as BERT broadcasts its own
    `(1, L)` buffer); returned expanded to the inputs' shape. The values are read in eager mode only."""
    if position_ids is None:
        return None
    if config_choice(config, "input_type", {"image": True, "sequence": False}):
        raise ValueError(
            "position_ids apply to token inputs; this model takes images (config.input_type='image'), whose "
            "positions are those of the patch grid: pass no position_ids."
        )
    integer = not (
        position_ids.is_floating_point() or position_ids.is_complex() or position_ids.dtype == torch.bool
    )
    batch, length = shape
    if not integer or tuple(position_ids.shape) not in ((batch, length), (1, length)):
        raise ValueError(
            f"position_ids must be integer positions of the inputs' shape (batch, sequence_length) = {tuple(shape)}, "
            f"or (1, {length}) for every sample alike; got shape {tuple(position_ids.shape)} and dtype "
            f"{position_ids.dtype}."
        )
    position_ids = position_ids.expand(batch, length)
    if not position_ids.numel() or _is_tracing():
        return position_ids
    low, high, limit = int(position_ids.min()), int(position_ids.max()), config.max_position_embeddings
    if low < 0 or high >= limit:
        raise ValueError(
            f"position_ids must lie in [0, max_position_embeddings={limit}); got values in [{low}, {high}]. For "
            "left-padded inputs pass (attention_mask.cumsum(-1) - 1).clamp(min=0)."
        )
    return position_ids


def pool_tokens(
    config: PreTrainedConfig, hidden_states: torch.Tensor, keep: torch.Tensor | None, num_prefix_tokens: int
) -> torch.Tensor:
    """The classifier input `(B, D)` of a state `(B, N, D)` by `config.pooling`: the first token (`"cls"`) or the
    mean over the real tokens after the `num_prefix_tokens` prefix tokens (`"mean"`): an image's CLS token is no
    patch, so it stays out of the average, as in timm's and ViT's mean pooling."""
    if config_choice(config, "pooling", {"cls": True, "mean": False}):  # True: the first token
        return hidden_states[:, 0]
    prefix = num_prefix_tokens
    return masked_mean(hidden_states[:, prefix:], None if keep is None else keep[:, prefix:])


def interpolate_positions(
    positions: torch.Tensor, grid: tuple[int, int], new_grid: tuple[int, int], num_prefix_tokens: int
) -> torch.Tensor:
    """A position table `(1, P + Hp·Wp, D)` of P prefix tokens and an Hp×Wp patch grid (`grid`), its patch part
    resampled bicubically to `new_grid` (Hp', Wp'): the `interpolate_pos_encoding` of ViT, for images of another
    resolution. The prefix tokens keep their positions; the native grid returns `positions` itself."""
    if tuple(new_grid) == tuple(grid):
        return positions
    dim = positions.shape[-1]
    prefix, patches = positions[:, :num_prefix_tokens], positions[:, num_prefix_tokens:]
    patches = patches.reshape(1, grid[0], grid[1], dim).permute(0, 3, 1, 2)  # (1, Hp·Wp, D) → (1, D, Hp, Wp)
    # (1, D, Hp, Wp) → (1, D, Hp', Wp')
    patches = F.interpolate(patches, size=tuple(new_grid), mode="bicubic", align_corners=False)
    # (1, D, Hp', Wp') → (1, Hp'·Wp', D)
    patches = patches.permute(0, 2, 3, 1).reshape(1, new_grid[0] * new_grid[1], dim)
    return torch.cat((prefix, patches), dim=1)


def is_plain_linear(module: nn.Module) -> bool:
    """Whether `module` is an `nn.Linear` whose `.weight` is a plain tensor, which the model may read as one
    (transpose, fold into another product), rather than a tensor subclass (torchao's quantized weights) that
    implements the matmul but not those view ops, so that the module is called instead. The stand-ins a tracer
    gives a plain weight count as plain: non-strict `torch.export` (and `torch.onnx.export(dynamo=True)`, built on
    it) traces with `FakeTensor` parameters, functionalization with `FunctionalTensor` ones; a subclass weight keeps
    its own type there, with fake tensors inside."""
    plain = (
        torch.Tensor,
        nn.Parameter,
        torch._subclasses.FakeTensor,
        torch._subclasses.functional_tensor.FunctionalTensor,
    )
    return isinstance(module, nn.Linear) and type(module.weight) in plain


# --- end of attention-family helpers ---


class HyperBFEmbeddings(nn.Module):
    """The model's input, either kind, as tokens plus the padding mask.

    Images: a CLS token, then non-overlapping p×p patches through a strided convolution (as in ViT), plus learned
    positions for the configured grid (bicubically interpolated for other resolutions with
    `interpolate_pos_encoding`, as in ViT). Sequences: token embeddings (or `inputs_embeds`) plus learned absolute
    positions (0..N−1, or the rows `position_ids` `(B, N)` names), no CLS token. `num_prefix_tokens` (1 for images, 0 for sequences) is what mean pooling skips.
    Returns `(tokens, keep)`, `keep` the `(B, N)` bool padding mask (None: every token is real).
    """

    def __init__(self, config: HyperBFConfig) -> None:
        super().__init__()
        self.config = config
        if config.input_type == "image":
            self.image_size = _pair(config.image_size)
            self.grid = (self.image_size[0] // config.patch_size, self.image_size[1] // config.patch_size)
            self.cls_token = nn.Parameter(torch.empty(1, 1, config.hidden_size))
            self.num_prefix_tokens = 1  # the CLS token is no patch (mean pooling)
            self.projection = nn.Conv2d(
                config.num_channels,
                config.hidden_size,
                kernel_size=config.patch_size,
                stride=config.patch_size,
            )
            num_positions = self.grid[0] * self.grid[1] + 1
            self.position_embeddings = nn.Parameter(torch.empty(1, num_positions, config.hidden_size))
        else:
            self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            self.num_prefix_tokens = 0
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """Position table `(1, 1 + h·w, D)` for a (height, width) input: the patch grid resampled bicubically, the
        CLS position unchanged, as in ViT."""
        new_grid = (height // self.config.patch_size, width // self.config.patch_size)
        return interpolate_positions(self.position_embeddings, self.grid, new_grid, self.num_prefix_tokens)

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens `(B, N, D)` (images: `(B, 1 + Hp·Wp, D)`, CLS first) and `keep` `(B, N)` or None."""
        _check_inputs(self.config, pixel_values, input_ids, inputs_embeds, attention_mask)
        keep = None if attention_mask is None else attention_mask.bool()
        if pixel_values is not None:
            _check_position_ids(self.config, position_ids, None)
            _check_image_size(pixel_values, self.image_size, self.config.patch_size, interpolate_pos_encoding)
            height, width = pixel_values.shape[-2:]
            tokens = self.projection(pixel_values.to(self.projection.weight.dtype))
            tokens = tokens.flatten(2).transpose(1, 2)  # (B, D, Hp, Wp) → (B, N, D)
            # (B, 1 + N, D)
            tokens = torch.cat((self.cls_token.expand(tokens.shape[0], -1, -1), tokens), dim=1)
            positions = self.interpolate_pos_encoding(height, width)
        else:
            _check_token_ids(input_ids, self.config.vocab_size, attention_mask)
            # given embeddings of any dtype run in the model's, as pixel_values do (not promoted by the positions)
            dtype = self.word_embeddings.weight.dtype
            tokens = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds.to(dtype)
            _check_length(tokens.shape[1], self.config.max_position_embeddings)
            position_ids = _check_position_ids(self.config, position_ids, tokens.shape[:2])
            if position_ids is None:
                position_ids = torch.arange(tokens.shape[1], device=tokens.device)
            positions = self.position_embeddings(position_ids)  # (N, D), or (B, N, D) for given ids
        return self.dropout(tokens + positions), keep


# Widest head the fused CUDA attention kernels take (flash: `check_head_dim_size_flash`, cuDNN:
# `check_cudnn_tensor_shapes`, both in torch's aten/src/ATen/native/transformers/cuda/sdp_utils.cpp). A wider
# folded feedforward falls to the memory-efficient kernel, whose backward is much slower than the explicit
# path's two matrix products, so past this width the feedforward stays explicit.
FUSED_ATTENTION_MAX_HEAD_DIM = 256


def _reloads_tensors(module: nn.Module) -> bool:
    """Whether an accelerate hook on `module` itself (alone or in a chain of hooks) loads its tensors from an offload
    store before each call and drops them after (`offload=True`: cpu/disk offload): each call then sees a fresh copy,
    whose storage and version say nothing, and a write to it is dropped, so it cannot change between calls."""
    hook = getattr(module, "_hf_hook", None)
    return any(getattr(one, "offload", False) for one in getattr(hook, "hooks", (hook,)))


def _folded_width(query_key_dim: int, value_dim: int) -> int:
    """Head width of bias-folded attention inputs: flash kernels want q, k, v of one width, a multiple of 8"""
    return -(-max(query_key_dim, value_dim) // 8) * 8


def _concat_padded(parts: list[torch.Tensor], width: int) -> torch.Tensor:
    """`torch.cat(parts, -1)` zero-padded on the right to `width` columns, in one copy."""
    missing = width - sum(part.shape[-1] for part in parts)
    if missing:
        parts = [*parts, parts[0].new_zeros(*parts[0].shape[:-1], missing)]
    return torch.cat(parts, dim=-1)


def _fold_bias(
    query: torch.Tensor, key: torch.Tensor, key_bias: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """q' = [q, 1, 0…], k' = [k, b, 0…] of `width` columns: q'·k' = q·k + b, a per-key bias without a mask."""
    ones = query.new_ones(*query.shape[:-1], 1)
    return _concat_padded([query, ones], width), _concat_padded([key, key_bias], width)


def _padded_key_bias(dtype: torch.dtype) -> float:
    """Folded bias of a padded key: exp() of it is exactly 0 next to any real score, yet q'·k' stays finite
    (kernels scale scores by up to log2(e), add q·k to it), so a row with no real key averages, never NaN."""
    return torch.finfo(dtype).min / 8


class HyperBFAttention(nn.Module):
    """Gaussian-kernel attention: softmax_j(−τ_h‖q_i − k_j‖²) per head, a HyperBF unit over the tokens.

    ‖q_i‖² is constant along j and cancels in the softmax, so the score is 2τ q_i·k_j − τ‖k_j‖²: scaled
    dot-product attention with scale 2τ and a per-key additive bias (memo 143).
    """

    is_causal = False  # read by transformers' attention functions

    def __init__(self, config: HyperBFConfig) -> None:
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.dropout = config.attention_probs_dropout_prob
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size)
        # log τ_h per head; τ = 1/(2σ²) of the Gaussian kernel exp(−‖q − k‖²/(2σ²)).
        self.log_temperature = nn.Parameter(torch.empty(config.num_attention_heads))

    def sigma(self) -> torch.Tensor:
        """Kernel width σ_h = 1/√(2τ_h) of each head, shape (H,)."""
        return (2 * self.log_temperature.exp()).rsqrt()

    def attend(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        keep: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax_j(−τ_h‖q_i − k_j‖²) v_j for per-head (B, H, N, d_h) tensors → ((B, N, H, d_h), maps or None).

        `eager` (and any call that returns the maps) is the reference: the per-key bias −τ‖k_j‖² enters as an
        additive (B, H, 1, N) float mask. Every other implementation gets the bias folded into one extra head
        dimension, q' = [2τq, 1], k' = [k, −τ‖k‖²], so plain (flash) attention without any mask computes it.
        """
        tau = self.log_temperature.exp().to(query.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        dropout = self.dropout if self.training else 0.0
        implementation = "eager" if output_attentions else self.config._attn_implementation  # maps: eager
        if implementation in (None, "eager"):
            key_bias = -tau * key.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, N)
            if keep is not None:
                # (B, N) bool, True = real token → (B, 1, 1, N)
                key_bias = key_bias.masked_fill(~keep[:, None, None, :], torch.finfo(key_bias.dtype).min)
            return eager_attention_forward(self, query * (2 * tau), key, value, key_bias, dropout=dropout)

        key_bias = -tau * key.pow(2).sum(-1, keepdim=True)  # (B, H, N, 1)
        if keep is not None:
            # (B, N) bool, True = real token → (B, 1, N, 1); a finite bias keeps fully padded rows NaN-free
            key_bias = key_bias.masked_fill(~keep[:, None, :, None], _padded_key_bias(key.dtype))
        width = _folded_width(self.head_dim + 1, self.head_dim)
        query, key = _fold_bias(query * (2 * tau), key, key_bias, width)  # (B, H, N, width) each
        # (B, H, N, d_h) → (B, H, N, width): flash kernels want v as wide as q and k
        value = F.pad(value, (0, width - self.head_dim))
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        output, _ = attention_interface(
            self, query, key, value, None, scaling=1.0, dropout=dropout, is_causal=False
        )
        return output[..., : self.head_dim], None  # (B, N, H, width) → (B, N, H, d_h)

    def forward(
        self,
        hidden_states: torch.Tensor,
        keep: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(B, N, D)` → `(B, N, D)`, the maps `(B, H, N, N)` (eager, forced by `output_attentions`) or None."""
        batch_size, seq_len, _ = hidden_states.shape
        hidden_shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, N, D) → (B, H, N, d_h)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, N, D) → (B, H, N, d_h)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)  # (B, N, D) → (B, H, N, d_h)

        output, weights = self.attend(query, key, value, keep, output_attentions)
        output = output.reshape(batch_size, seq_len, -1)  # (B, N, H, d_h) → (B, N, D)
        return self.o_proj(output), weights


class HyperBFFeedForward(nn.Module):
    """Normalized (or Gaussian) RBF over K learned centers t_α with a PSD metric ‖a − b‖²_W = ‖W(a − b)‖².

    w_α(x) = softmax_α(−‖Wx − Wt_α‖²/(2σ²)) (or exp(·) for `feedforward_kernel="gaussian"`), out = Σ_α w_α c_α + b.
    Distances come from one matrix product against the projected centers: ‖Wx‖² − 2 Wx·Wt_α + ‖Wt_α‖², so no
    (B, N, K, D) tensor is ever built. The normalized kernel is cross-attention from the queries Wx to K
    keys Wt_α with values c_α and a per-key bias, so outside `eager` it runs as mask-free (flash) attention
    with the bias folded into the head dimension and builds no (B·N, K) weights either, when that head
    (`folded_width`: max(R + 1, D), or R + 2 with per-center widths, padded to 8) is no wider than the fused
    kernels take (`FUSED_ATTENTION_MAX_HEAD_DIM`); a wider one, and the unnormalised Gaussian kernel, which
    needs the weights themselves, stay on the explicit path. `folds` says which path `sdpa` takes (the explicit
    one whenever `values` is wrapped, as by a PEFT adapter).
    """

    is_causal = False  # read by the attention functions of the folded path

    def __init__(self, config: HyperBFConfig) -> None:
        super().__init__()
        self.config = config
        self.kernel = config.feedforward_kernel
        self.centers = nn.Parameter(torch.empty(config.num_centers, config.hidden_size))  # t_α: (K, D)
        self.metric = nn.Parameter(torch.empty(config.rbf_projection_dim, config.hidden_size))  # W: (R, D)
        self.log_sigma = nn.Parameter(torch.empty(config.num_centers if config.rbf_width == "center" else 1))
        self.values = nn.Linear(config.num_centers, config.hidden_size)  # c_α as columns, plus the bias b
        # Query/key columns of the folded head: Wx and the bias column, plus ‖Wx‖² with per-center widths.
        key_dim = config.rbf_projection_dim + (2 if config.rbf_width == "center" else 1)
        self.folded_width = _folded_width(key_dim, config.hidden_size)
        self.folds = self.kernel == "normalized" and self.folded_width <= FUSED_ATTENTION_MAX_HEAD_DIM
        # What the centers give ("folded", "projected": `_cached`) with the dtype and parameter versions it came
        # from, kept while a `cached_centers` scope is open (`reuse_centers`)
        self._eval_cache: dict[str, tuple[tuple, tuple[torch.Tensor, torch.Tensor]]] = {}

    def sigma(self) -> torch.Tensor:
        """Kernel width σ of the centers, shape (1,) or (K,) (`rbf_width="center"`)."""
        return self.log_sigma.exp()

    @property
    def reuse_centers(self) -> bool:
        """Whether this thread's (this context's) no-grad eval forwards reuse what the centers give: inside a
        `cached_centers` scope opened in it (`reusing_centers`)."""
        # a token this context holds may belong to a scope closed from another thread: only open ones count
        held = (_REUSING_CENTERS.get() or {}).get(weakref.ref(self))
        return bool(held) and not held.isdisjoint(_OPEN_SCOPES.get(id(self), ()))

    def _cached(
        self, name: str, dtype: torch.dtype, compute: Callable[[], tuple[torch.Tensor, torch.Tensor]]
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """`compute()`, kept across no-grad eval forwards while `reuse_centers` is set (`cached_centers`) and the
        parameters keep their storage and in-place versions; else computed at every call."""
        # the scope's context variable is read last: not in training, nor traced (torch.compile)
        if self.training or _is_tracing() or torch.is_grad_enabled() or not self.reuse_centers:
            return compute()
        own, values = _reloads_tensors(self), any(_reloads_tensors(m) for m in self.values.modules())
        parameters = (
            (self.centers, own),
            (self.metric, own),
            (self.log_sigma, own),
            (self.values.weight, values),
        )
        # `_version` (private): no public API reads it, and optimizer/load hooks miss `w.mul_(2)` under no_grad. An
        # offloaded parameter is stamped as such: its copy is new at every call (between calls it is on meta, whose
        # data_ptr is 0) and cannot change, so storage and version would only make hits depend on the allocator
        try:
            stamp = (
                dtype,
                *(("offloaded",) if offloaded else (p.data_ptr(), p._version) for p, offloaded in parameters),
            )
        except RuntimeError:  # inference tensors track no version: no cache
            return compute()
        hit = self._eval_cache.get(name)
        if hit is None or hit[0] != stamp:
            hit = self._eval_cache[name] = (stamp, compute())
        return hit[1]

    def _projected_centers(self) -> tuple[torch.Tensor, torch.Tensor]:
        projected = F.linear(self.centers, self.metric)  # (K, R)
        return projected, projected.pow(2).sum(-1)  # Wt_α and ‖Wt_α‖²

    def center_weights(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """w_α(x) of shape (..., K) for inputs (..., D)."""
        projected = F.linear(hidden_states, self.metric)  # (..., R)
        projected_centers, center_norms = self._cached("projected", projected.dtype, self._projected_centers)
        flat = projected.reshape(-1, projected.shape[-1])  # (B·N, R)
        # ‖Wt_α‖² − 2 Wx·Wt_α in one fused product
        partial = torch.addmm(center_norms, flat, projected_centers.t(), alpha=-2.0)  # (B·N, K)
        if self.kernel == "normalized" and self.log_sigma.numel() == 1:
            # one σ: −‖Wx‖²/(2σ²) is the same for every center and cancels in the softmax (as in the folded path)
            weights = F.softmax(partial * (-0.5 * torch.exp(-2.0 * self.log_sigma)), dim=-1)
        else:  # + ‖Wx‖²; clamp the cancellation error below 0
            sq_dist = (partial + flat.pow(2).sum(-1, keepdim=True)).clamp_min(0.0)  # (B·N, K)
            logits = -0.5 * sq_dist * torch.exp(-2.0 * self.log_sigma)  # −d²/(2σ²), always <= 0
            weights = F.softmax(logits, dim=-1) if self.kernel == "normalized" else torch.exp(logits)
        return weights.reshape(*projected.shape[:-1], -1)  # (B·N, K) → (..., K), the input's leading axes

    def folded_centers(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        """Keys (K, w) and values (K, w) of the normalized kernel as attention with the bias folded in.

        With s_α = 1/(2σ_α²), u = Wx and v_α = Wt_α the logit is −s_α‖u‖² + 2s_α u·v_α − s_α‖v_α‖², so
        q' = [u, 1, ‖u‖²] and k'_α = [2s_α v_α, −s_α‖v_α‖², −s_α]. With one width per layer the first term is
        the same for every α and cancels in the softmax, so both last columns are dropped. Values are c_α,
        zero-padded to w. Computed once per forward, or once for many inside `cached_centers` (`_cached`).
        """
        return self._cached("folded", dtype, functools.partial(self._fold_centers, dtype))

    def _fold_centers(self, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        projected, norms = self._projected_centers()  # (K, R), (K,)
        scale = 0.5 * torch.exp(-2.0 * self.log_sigma).unsqueeze(-1)  # s_α: (1 | K, 1)
        key_columns = [2 * scale * projected, -scale * norms.unsqueeze(-1)]
        if self.log_sigma.numel() > 1:  # per-center widths: −s_α‖u‖² no longer cancels
            key_columns.append(-scale)
        width = self.folded_width
        keys = _concat_padded(key_columns, width).to(dtype)  # (K, w)
        # (D, K) → (K, D) → (K, w)
        values = F.pad(self.values.weight.t(), (0, width - self.values.out_features)).to(dtype)
        return keys, values

    def forward(
        self, hidden_states: torch.Tensor, output_center_weights: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """(out, w_α(x) or None): the weights are returned by the explicit path, which also runs for `eager`,
        whenever the folded one does not apply (`folds` false), for every call that asks for them, and when
        `values` is no plain `nn.Linear` (e.g. wrapped by a PEFT LoRA adapter) or is hooked (`is_dispatched`: an
        offloaded weight is on meta outside its own call): the folded path reads its weight and bias as tensors,
        so only the explicit one calls the module and lets the adapter, or the offload hook, act."""
        implementation = self.config._attn_implementation
        explicit = output_center_weights or not self.folds
        # a quantized Linear (torchao's) holds its `.weight` as a tensor subclass without the transpose the fold
        # reads: it is called instead
        explicit = explicit or not is_plain_linear(self.values) or is_dispatched(self.values)
        if explicit or implementation in (None, "eager"):
            weights = self.center_weights(hidden_states)
            return self.values(weights), weights

        queries = F.linear(hidden_states, self.metric)  # (..., R)
        keys, values = self.folded_centers(queries.dtype)
        query_columns = [queries, queries.new_ones(*queries.shape[:-1], 1)]
        if self.log_sigma.numel() > 1:
            query_columns.append(queries.pow(2).sum(-1, keepdim=True))
        # Every token of every sequence queries the same K centers: one attention call over B·N queries.
        width = keys.shape[-1]
        folded = _concat_padded(query_columns, width).reshape(1, 1, -1, width)  # (..., w) → (1, 1, B·N, w)
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        keys, values = keys[None, None], values[None, None]  # (K, w) → (1, 1, K, w)
        # (1, B·N, 1, w)
        output, _ = attention_interface(
            self, folded, keys, values, None, scaling=1.0, dropout=0.0, is_causal=False
        )
        output = output[..., : self.values.out_features].reshape(*hidden_states.shape[:-1], -1)  # (..., D)
        return output + self.values.bias.to(output.dtype), None


class HyperBFLayer(GradientCheckpointingLayer):
    """Pre-norm block: z = x + Attention(LN1(x)); y = z + FeedForward(LN2(z)) (memo 143, read as the standard
    pre-norm pair)."""

    def __init__(self, config: HyperBFConfig) -> None:
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = HyperBFAttention(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feedforward = HyperBFFeedForward(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        keep: torch.Tensor | None = None,
        output_attentions: bool = False,
        output_center_weights: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """`(B, N, D)` → `(B, N, D)`, the maps and center weights `(B, N, K)` or None: one pre-norm block."""
        attended, attention_weights = self.attention(
            self.layernorm_before(hidden_states), keep, output_attentions
        )
        hidden_states = hidden_states + self.dropout(attended)
        fed, rbf_weights = self.feedforward(self.layernorm_after(hidden_states), output_center_weights)
        hidden_states = hidden_states + self.dropout(fed)
        return hidden_states, attention_weights, rbf_weights


# The scopes this context opened, per feedforward (weak keys: an entry left in another thread's context, by a scope
# closed from elsewhere, keeps no module alive), as tokens: one value per thread (and asyncio task), so a scope
# switches caching on for the forwards of the code inside it and of no other thread. Each scope removes its own token,
# so scopes of one thread closed in another order than opened (two `ExitStack`s, two generators) leave it as it was.
# Replaced, never mutated: an asyncio task started inside a scope holds the dict it started with.
_REUSING_CENTERS: contextvars.ContextVar[dict[weakref.ref, frozenset[object]] | None] = (
    contextvars.ContextVar("hyperbf_reusing_centers", default=None)
)
# The tokens of the scopes open on each feedforward, over all threads (by id; an entry lives only while a scope
# holds the module): a context reuses the centers while one of its tokens is open here, wherever that scope is
# closed. The cache is dropped when the last one closes. Written under one lock for all models (twice per scope),
# each value replaced rather than mutated, so `reuse_centers` reads it without the lock.
_OPEN_SCOPES: dict[int, frozenset[object]] = {}
_OPEN_SCOPES_LOCK = threading.Lock()


def _move_scope(feedforwards: list[nn.Module], token: object, opening: bool) -> None:
    """Add the scope `token` to (`opening`) or remove it from this context's tokens of each of `feedforwards`."""
    tokens = {key: held for key, held in (_REUSING_CENTERS.get() or {}).items() if key() is not None}
    for module in feedforwards:
        key = weakref.ref(module)
        held = tokens.pop(key, frozenset())
        held = held | {token} if opening else held - {token}
        if held:
            tokens[key] = held
    _REUSING_CENTERS.set(tokens)


@contextlib.contextmanager
def reusing_centers(model: nn.Module) -> Iterator[None]:
    """Inside this block, no-grad eval forwards of `model` compute what each feedforward needs from its centers
    (the projected centers Wt_α and their norms, or the folded keys and values) once and reuse it; leaving the
    block drops it. Without it that work is redone at every forward: K·R·D multiply-adds per layer, about what
    D/2 tokens cost at the default K = 4D, R = D, so it pays at small batches. A parameter written in place
    through `param.data` inside the block is not seen (such a write leaves the parameter's storage and version
    as they were); optimiser steps, `load_state_dict` and writes under `torch.no_grad()` are. What
    `HyperBFPreTrainedModel.cached_centers` runs.

    Blocks may overlap, nested in one thread or open at once in several (a server's concurrent pipeline calls).
    The block is scoped to the thread that opens it (a `contextvars.ContextVar`, so also to an asyncio task):
    only forwards run by the code inside it reuse the centers, and another thread's forwards, outside any block,
    compute them as usual and see a `param.data` write, as they would with no block open elsewhere; a per-model
    flag or counter would switch caching on for every thread while any one is inside. Threads started inside
    the block do not inherit it. The cache itself is shared by the blocks open on the model (stamped as
    `_cached` says) and dropped when the last of them, over all threads, closes. A block closed in another
    thread than its opener's (a generator resumed on another pool thread) ends there and then for its opener
    too, and leaves any block of the closing thread open."""
    feedforwards = [module for module in model.modules() if isinstance(module, HyperBFFeedForward)]
    token = object()
    with _OPEN_SCOPES_LOCK:
        for module in feedforwards:
            if (
                id(module) not in _OPEN_SCOPES
            ):  # the first block: nothing a forward racing the last close left
                module._eval_cache.clear()
            _OPEN_SCOPES[id(module)] = _OPEN_SCOPES.get(id(module), frozenset()) | {token}
    _move_scope(feedforwards, token, opening=True)
    try:
        yield
    finally:
        _move_scope(feedforwards, token, opening=False)  # a no-op in a thread that did not open it
        with _OPEN_SCOPES_LOCK:
            for module in feedforwards:
                left = _OPEN_SCOPES[id(module)] - {token}
                if left:
                    _OPEN_SCOPES[id(module)] = left
                else:  # under the lock: a block opening now fills the cache after this
                    del _OPEN_SCOPES[id(module)]
                    module._eval_cache.clear()


class HyperBFPreTrainedModel(FamilyPreTrainedMixin, PreTrainedModel):
    """The base of every HyperBF model: its config class, weight initialisation, attention selection and loading."""

    config: HyperBFConfig
    config_class = HyperBFConfig
    base_model_prefix = "hyperbf"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperBFEmbeddings", "HyperBFLayer"]
    _supports_sdpa = True

    # what `attn_implementation` takes: "eager", the reference with maps, or any softmax attention function of
    # transformers' registry ("sdpa", the default, or one registered with `AttentionInterface.register`), which
    # gets both units with the bias folded into q and k and no mask
    attn_implementations = SoftmaxAttentionNames()

    def cached_centers(self) -> contextlib.AbstractContextManager[None]:
        """`with model.cached_centers():` no-grad eval forwards reuse what the centers give (`reusing_centers`)."""
        return reusing_centers(self)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # Every module is initialised here, as in the other families, rather than partly by transformers' generic
        # `PreTrainedModel._init_weights`, whose choices belong to transformers and may change between releases.
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Conv2d, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:  # an Embedding has none
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, HyperBFEmbeddings) and config_choice(
            module.config, "input_type", {"image": True, "sequence": False}
        ):
            init.trunc_normal_(module.position_embeddings, mean=0.0, std=std)
            init.trunc_normal_(module.cls_token, mean=0.0, std=std)
        elif isinstance(module, HyperBFAttention):
            tau = self.config.attention_temperature_init or 1.0 / (2.0 * math.sqrt(self.config.head_dim))
            init.constant_(module.log_temperature, math.log(tau))
        elif isinstance(module, HyperBFFeedForward):
            # Centers live where LayerNorm'd inputs live (unit variance per coordinate) and W ~ N(0, 1/D) keeps
            # E‖Wa‖² = (R/D)‖a‖², so ‖W(x − t)‖² ≈ 2R at init. σ² = R / ln K then puts every Gaussian weight near
            # exp(−ln K) = 1/K: total mass ≈ 1 like the normalized kernel, instead of exp(−150) = 0 in the public code.
            init.normal_(module.centers, mean=0.0, std=1.0)
            init.normal_(module.metric, mean=0.0, std=self.config.hidden_size**-0.5)
            num_centers, rank = self.config.num_centers, self.config.rbf_projection_dim
            sigma = self.config.rbf_sigma_init or math.sqrt(rank / math.log(max(num_centers, 2)))
            init.constant_(module.log_sigma, math.log(sigma))


class HyperBFModel(HyperBFPreTrainedModel):
    """The bare HyperBF encoder: embeddings → `num_hidden_layers` blocks → final LayerNorm (+ pooled token).

    `last_hidden_state` (and `pooler_output`) come after the final LayerNorm, as ViT's. Hyper-SET's and the looped
    baseline's `Model` return the raw state instead (their heads hold the norm, since their recurrent-depth heads
    carry the raw state between outer steps), so base-model features are normalised here and raw there.

    `add_pooling_layer=False` builds it without the pooler, as ViT's and BERT's: `pooler_output` is then None.
    """

    def __init__(self, config: HyperBFConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = HyperBFEmbeddings(config)
        self.layers = nn.ModuleList([HyperBFLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.add_pooling_layer = add_pooling_layer
        self._set_input_names()
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_diagnostics: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> HyperBFModelOutput | tuple:
        r"""
        output_rbf_diagnostics (`bool`, *optional*):
            Return `rbf_diagnostics` (`HyperBFRBFDiagnostics`): the feedforward center weights of every layer
            and the kernel widths σ of both HyperBF units.
        output_rbf_weights (`bool`, *optional*):
            The HyperBF specification's name of `output_rbf_diagnostics`, the same switch: either name set to True
            returns `rbf_diagnostics`; set both, they must agree.
        interpolate_pos_encoding (`bool`, *optional*):
            Resample the position table for images of another resolution (a multiple of `patch_size`).
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)` or `(1, sequence_length)`, *optional*):
            Sequences only: the row of the position table each token takes (None: 0..N−1). A left-padded batch
            passes `(attention_mask.cumsum(-1) - 1).clamp(min=0)`, so each real token keeps the position it has
            unpadded.
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        if output_rbf_weights is not None:  # the specification's name of the same switch
            if output_rbf_diagnostics is not None and bool(output_rbf_diagnostics) != bool(
                output_rbf_weights
            ):
                raise ValueError(
                    f"output_rbf_weights={output_rbf_weights!r} is an alias of output_rbf_diagnostics="
                    f"{output_rbf_diagnostics!r} and disagrees with it; pass only one"
                )
            output_rbf_diagnostics = output_rbf_weights
        output_rbf_diagnostics = bool(output_rbf_diagnostics)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        pixel_values, input_ids = route_main_input(self.config, pixel_values, input_ids)

        hidden_states, keep = self.embeddings(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            interpolate_pos_encoding=bool(interpolate_pos_encoding),
            position_ids=position_ids,
        )
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_center_weights = []
        for layer in self.layers:
            hidden_states, attention_weights, center_weights = layer(
                hidden_states, keep, output_attentions, output_rbf_diagnostics
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (attention_weights,)
            if output_rbf_diagnostics:
                all_center_weights.append(center_weights)

        rbf_diagnostics = None
        if output_rbf_diagnostics:
            rbf_diagnostics = HyperBFRBFDiagnostics(
                center_weights=torch.stack(all_center_weights, dim=1),  # (B, L, N, K)
                feedforward_sigmas=torch.stack(
                    [layer.feedforward.sigma() for layer in self.layers]
                ),  # (L, 1|K)
                attention_sigmas=torch.stack([layer.attention.sigma() for layer in self.layers]),  # (L, H)
            )
        hidden_states = self.layernorm(hidden_states)
        pooled = None
        if self.add_pooling_layer:
            pooled = pool_tokens(self.config, hidden_states, keep, self.embeddings.num_prefix_tokens)
        output = HyperBFModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            rbf_diagnostics=rbf_diagnostics,
        )
        return output if return_dict else output.to_tuple()


class HyperBFHead(HyperBFPreTrainedModel):
    """The base of HyperBF's heads: backbone → Linear (`nn.Identity()` when num_labels == 0) on the
    pooled token. A head sets the input type it takes and its output class; its `forward` has the signature of
    its input type and hands everything to `classify`."""

    _input_type = "image"
    _per_token = False  # no per-token head: every head classifies the pooled token
    _output_class: type[ModelOutput] = HyperBFImageClassifierOutput

    def __init__(self, config: HyperBFConfig) -> None:
        super().__init__(config)
        check_head_input_type(self, config.input_type, self._input_type)
        self.hyperbf = HyperBFModel(config)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        )
        self.post_init()

    # `Trainer` passes `num_items_in_batch` (forward takes it by name, not through **kwargs, so a misspelt argument
    # stays an error) and leaves the gradient-accumulation scaling to the loss
    accepts_loss_kwargs = True

    def classify(
        self,
        labels: torch.Tensor | None,
        return_dict: bool | None,
        *,
        num_items_in_batch: torch.Tensor | int | None = None,
        **backbone_inputs: object,
    ) -> ModelOutput | tuple:
        """The backbone on `backbone_inputs`, the classifier on its pooled token, the loss of `labels` by
        `config.problem_type` (transformers' `loss_function` for this head's class name), normalised by
        `num_items_in_batch` when given (`head_loss`)."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hyperbf(**backbone_inputs, return_dict=True)
        logits = self.classifier(outputs.pooler_output)
        loss = (
            None if labels is None else head_loss(self, logits, labels, num_items_in_batch, self._per_token)
        )
        output = self._output_class(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            rbf_diagnostics=outputs.rbf_diagnostics,
        )
        return output if return_dict else output.to_tuple()


class HyperBFForImageClassification(HyperBFHead):
    """Classifies the pooled token of an image."""

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_diagnostics: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> HyperBFImageClassifierOutput | tuple:
        r"""Images `(B, C, H, W)` → logits `(B, num_labels)`, loss with `labels`; rest as `HyperBFModel`'s.

        num_items_in_batch (`torch.Tensor` or `int`, *optional*):
            What `Trainer` passes: the number of labels ≠ −100 over the whole gradient-accumulation window; the
            summed loss is divided by it instead of taking this batch's mean (`head_loss`).
        """
        return self.classify(
            labels,
            return_dict,
            num_items_in_batch=num_items_in_batch,
            pixel_values=pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_rbf_diagnostics=output_rbf_diagnostics,
            output_rbf_weights=output_rbf_weights,
        )


class HyperBFForSequenceClassification(HyperBFHead):
    """Classifies the pooled token of a sequence."""

    main_input_name = "input_ids"
    _input_type = "sequence"
    _output_class = HyperBFSequenceClassifierOutput

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_diagnostics: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
        position_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> HyperBFSequenceClassifierOutput | tuple:
        r"""
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)` or `(1, sequence_length)`, *optional*):
            As `HyperBFModel.forward`'s: the row of the position table each token takes (None: 0..N−1).
        num_items_in_batch (`torch.Tensor` or `int`, *optional*):
            As `HyperBFForImageClassification.forward`'s.
        """
        return self.classify(
            labels,
            return_dict,
            num_items_in_batch=num_items_in_batch,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_rbf_diagnostics=output_rbf_diagnostics,
            output_rbf_weights=output_rbf_weights,
        )


__all__ = [
    "HyperBFEmbeddings",
    "HyperBFForImageClassification",
    "HyperBFForSequenceClassification",
    "HyperBFHead",
    "HyperBFModel",
    "HyperBFModelOutput",
    "HyperBFPreTrainedModel",
    "HyperBFRBFDiagnostics",
]
