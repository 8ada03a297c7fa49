# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Hyper-SET: Hyperspherical Energy Transformer with recurrent depth.

Hu, Zou, Xu, *Hyperspherical Energy Transformer with Recurrent Depth*. Each of `num_hidden_layers`
weight-tied layers is applied `num_iterations` times; one iteration is a step along the gradient, with
respect to the normalised projections (not x: no monotone descent is guaranteed, model card), of the
attention energy E_ATTN = √d_h Σ_h Σ_i logsumexp_j(z_i·z_j/√d_h), z = n(W_hᵀx) (tokens spread out on
each head's sphere), then one on the feedforward energy E_FF = −½ Σ_i ‖ReLU(n(Dx_i))‖² (tokens align
with dictionary directions; with a GELU feedforward, the GELU's potential in place of ½ReLU²). Step sizes α, γ are predicted per token and channel from an iteration
embedding, so the number of iterations can be changed at test time.
"""

from __future__ import annotations

import contextlib
import contextvars
import copy
import functools
import math
import numbers
import os
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
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput, logging
from transformers.utils.generic import is_flash_attention_requested

from ..configuration.configuration_hyperset import HyperSetConfig

logger = logging.get_logger(__name__)


@dataclass
class HyperSetEnergies(ModelOutput):
    """Per-sample energy diagnostics for t = 0..T of every layer (t = 0: state before the first update).

    attention_energy / feedforward_energy: `(batch, num_layers, T + 1)`, E_ATTN and E_FF with gain-free
    RMS normalisation over the real (unpadded) tokens. effective_rank / average_angle:
    `(batch, num_layers, T + 1, num_heads)`, the entropy-effective rank of the singular values of
    n(W_hᵀX) and the mean pairwise angle (degrees) between its rows.
    """

    attention_energy: torch.FloatTensor | None = None
    feedforward_energy: torch.FloatTensor | None = None
    effective_rank: torch.FloatTensor | None = None
    average_angle: torch.FloatTensor | None = None


@dataclass
class HyperSetModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling` plus `energies` (a `HyperSetEnergies`, with `output_energies=True`).

    `hidden_states` holds the embedding output and then the state after every iteration of every
    layer (1 + L·T tensors); `attentions` holds the bi-softmax maps P of every iteration (L·T tensors).
    `iterations_used` (`(batch,)` long, with adaptive halting): the iterations each sample ran, over all layers.
    `final_energy` (`(batch,)`, with `output_final_energy=True`): Σ over layers of E_ATTN + E_FF of the state each
    layer's last iteration left (the verifier of test-time search).
    """

    energies: HyperSetEnergies | None = None
    iterations_used: torch.LongTensor | None = None
    final_energy: torch.FloatTensor | None = None


# The fields the heads add to transformers' classifier outputs (documented once, in `HyperSetHead.classify`), held
# by two field-only bases that each output class lists before transformers' class: a dataclass collects fields
# along the reversed MRO, so transformers' fields (loss, logits, ...) stay first and `to_tuple` keeps their order.
@dataclass
class RecurrentDepthHeadOutput(ModelOutput):
    """The fields of the supervision steps and of test-time search, shared with the looped baseline's heads."""

    supervision_steps_used: torch.LongTensor | None = None
    halting_probabilities: torch.FloatTensor | None = None
    search_chosen: torch.LongTensor | None = None
    search_energies: torch.FloatTensor | None = None
    search_confidences: torch.FloatTensor | None = None
    search_valid_boards: torch.BoolTensor | None = None


@dataclass
class HyperSetHeadOutput(ModelOutput):
    """The fields of Hyper-SET's energy diagnostics and adaptive halting."""

    energies: HyperSetEnergies | None = None
    iterations_used: torch.LongTensor | None = None


@dataclass
class HyperSetImageClassifierOutput(RecurrentDepthHeadOutput, HyperSetHeadOutput, ImageClassifierOutput):
    """`ImageClassifierOutput` plus the recurrent-depth and Hyper-SET fields (`HyperSetHead.classify`)."""


@dataclass
class HyperSetSequenceClassifierOutput(
    RecurrentDepthHeadOutput, HyperSetHeadOutput, SequenceClassifierOutput
):
    """`SequenceClassifierOutput` plus the recurrent-depth and Hyper-SET fields (`HyperSetHead.classify`)."""


@dataclass
class HyperSetTokenClassifierOutput(RecurrentDepthHeadOutput, HyperSetHeadOutput, TokenClassifierOutput):
    """`TokenClassifierOutput` plus the recurrent-depth and Hyper-SET fields (`HyperSetHead.classify`)."""


@dataclass
class MaskGITDecoderOutput(ModelOutput):
    """The result of `HyperSetForMaskedImageModeling.decode`.

    codes: `(B, N)` the decoded grid (no [MASK] left). sequences: `(S + 1, B, N)` the grid before the first step and
    after every step, [MASK] where a code is still open. unmasked: `(S, B, N)` bool, the positions each step fixed.
    confidences: `(S, B, N)` the probability the model gave the code it sampled at each position that was masked at
    that step (before MaskGIT's Gumbel noise), 0 elsewhere.
    """

    codes: torch.LongTensor | None = None
    sequences: torch.LongTensor | None = None
    unmasked: torch.BoolTensor | None = None
    confidences: torch.FloatTensor | None = None


@dataclass
class HyperSetMaskedImageModelingOutput(MaskedLMOutput):
    """`MaskedLMOutput` (what BEiT's masked-image-modelling head returns: logits over visual-token ids) plus
    `energies` and `iterations_used`, as the other Hyper-SET outputs."""

    energies: HyperSetEnergies | None = None
    iterations_used: torch.LongTensor | None = None


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed 1-D position encoding, sin/cos interleaved over channels (Vaswani et al.), `(num_positions, dim)`.

    Computed in float64 and rounded to float32, as the authors' table (a float32 tensor even in their float64
    runs), so a converted checkpoint sees their exact positions in any dtype.
    """
    position = torch.arange(num_positions, dtype=torch.float64).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float64) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(num_positions, dim, dtype=torch.float64)
    encoding[:, 0::2] = torch.sin(position * div)
    encoding[:, 1::2] = torch.cos(position * div[: dim // 2])
    return encoding.float()


def sincos_2d_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed row/column encoding of a square board `(num_positions, dim)`; position i is cell (i // side, i % side).

    The authors' Sudoku `sincos` table (MAE's 2-D sin-cos): channels [:dim/2] encode the column and [dim/2:] the
    row, each as [sin(p ω_k) | cos(p ω_k)], ω_k = 10000^(−k/(dim/4)) for k < dim/4. Computed in float64 and
    rounded to float32, as their table is.
    """
    side, quarter = math.isqrt(num_positions), dim // 4
    omega = 1.0 / 10000.0 ** (torch.arange(quarter, dtype=torch.float64) / quarter)  # (dim/4,)
    cells = torch.arange(num_positions, dtype=torch.float64)
    column, row = cells % side, torch.div(cells, side, rounding_mode="floor")

    def axis(coordinate: torch.Tensor) -> torch.Tensor:
        angles = coordinate[:, None] * omega  # (num_positions, dim/4)
        return torch.cat([angles.sin(), angles.cos()], dim=1)  # (num_positions, dim/2)

    return torch.cat([axis(column), axis(row)], dim=1).float()


def fixed_positions(config: HyperSetConfig, num_positions: int) -> torch.Tensor:
    """The `(1, num_positions, d)` fixed position table of `config`: row/column for "sincos-2d", else 1-D."""
    # also run by `_init_weights` after the build: read through the table (sincos-2d: sequences on a square board)
    row_column = {"sinusoidal": False, "learned": False, "sincos-2d": True}
    if config_choice(config, "position_embedding_type", row_column):
        return sincos_2d_positions(num_positions, config.hidden_size)[None]
    return sinusoidal_positions(num_positions, config.hidden_size)[None]


def iteration_embedding(steps: torch.Tensor, dim: int, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Iteration sinusoid [sin(t f_k), cos(t f_k)] (halves concatenated), f_k = exp(−k ln(10⁴)/(half − 1)).

    Computed in `dtype` (the model's), in the authors' order of operations.
    """
    half = dim // 2
    freqs = torch.exp(
        torch.arange(half, dtype=dtype, device=steps.device) * -(math.log(10000.0) / (half - 1))
    )
    angles = steps.to(dtype).unsqueeze(-1) * freqs  # (T, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


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


# --- integer check: identical in energyformers' Hyper-SET and iMixer files (its test suite checks) ---


def _is_integer(value: object) -> bool:
    """Whether a count or seed argument is an integer: Python's or any other `numbers.Integral` (numpy's, from a
    sweep over `np.arange`), which callers store as `int(value)`; not a bool, a float of integral value or a
    tensor."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# --- end of integer check ---


def check_last_iteration_head(head: nn.Module, config: PreTrainedConfig) -> None:
    """Refuse the iteration-wise training settings in a head whose loss reads the last iteration only (the masked
    image modelling heads): deep supervision, supervision steps and the halting head would be ignored."""
    settings = {
        "deep_supervision": (config.deep_supervision, "last"),
        "supervision_steps": (config.supervision_steps, 1),
        "halting_head": (config.halting_head, False),
    }
    for name, (value, allowed) in settings.items():
        if value != allowed:
            raise ValueError(
                f"{type(head).__name__} takes its loss at the last iteration only: config.{name} must be "
                f"{allowed!r}; got {value!r}."
            )


class HyperSetEmbeddings(nn.Module):
    """The model's input, either kind, as tokens plus the padding mask.

    Images: patches (features ordered dy, dx, channel) → LayerNorm → Linear → LayerNorm, a CLS token in
    front, plus the fixed sinusoid laid over the configured grid (bicubically interpolated for other resolutions
    with `interpolate_pos_encoding`, as ViT's learned table). Sequences: token embeddings (or `inputs_embeds`)
    plus a fixed sinusoid, learned positions or a fixed row/column table (`"sincos-2d"`; both for fixed layouts,
    e.g. Sudoku), at positions 0..N−1 or at the table rows `position_ids` `(B, N)` (or `(1, N)`) names.
    `num_prefix_tokens` (1 for images, 0 for sequences) is what mean pooling skips.
    Returns `(tokens, keep)`, `keep` the `(B, N)` bool padding mask (None: every token is real).
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.config = config
        if config.input_type == "image":
            self.image_size = _pair(config.image_size)
            self.patch_size = config.patch_size
            patch_dim = config.num_channels * config.patch_size**2
            self.grid = (self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size)
            num_patches = self.grid[0] * self.grid[1]
            self.patch_norm = nn.LayerNorm(patch_dim, eps=config.layer_norm_eps)
            self.projection = nn.Linear(patch_dim, config.hidden_size)
            self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
            self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
            self.num_prefix_tokens = 1  # the CLS token is no patch (mean pooling)
            num_positions = num_patches + 1
        else:
            self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.num_prefix_tokens, num_positions = 0, config.max_position_embeddings
        learned = config.input_type == "sequence" and config.position_embedding_type == "learned"
        self.position_embeddings = nn.Embedding(num_positions, config.hidden_size) if learned else None
        self.register_buffer(
            "position_encoding", None if learned else fixed_positions(config, num_positions), persistent=False
        )

    def embed_patches(self, pixel_values: torch.Tensor) -> torch.Tensor:
        """Tokens `(B, 1 + Hp·Wp, d)` of images `(B, C, H, W)`: the CLS token, then each p×p patch flattened (dy, dx,
        channel), normalised, projected and normalised again; positions are added by `forward`."""
        batch, channels, height, width = pixel_values.shape
        p = self.patch_size
        patches = pixel_values.reshape(batch, channels, height // p, p, width // p, p)  # (B, C, Hp, p, Wp, p)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, -1, p * p * channels)  # (B, Hp·Wp, p·p·C)
        tokens = self.norm(self.projection(self.patch_norm(patches)))
        return torch.cat([self.cls_token.expand(batch, -1, -1), tokens], dim=1)  # (B, 1 + Hp·Wp, d)

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        interpolate_pos_encoding: bool = False,
        position_ids: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """Tokens `(B, N, d)` (images: `(B, 1 + Hp·Wp, d)`, CLS first) and `keep` `(B, N)` or None."""
        _check_inputs(self.config, pixel_values, input_ids, inputs_embeds, attention_mask)
        keep = None if attention_mask is None else attention_mask.bool()
        if pixel_values is not None:
            _check_position_ids(self.config, position_ids, None)
            _check_image_size(pixel_values, self.image_size, self.patch_size, interpolate_pos_encoding)
            # images arrive as float32 whatever the model's dtype (e.g. bfloat16), as in transformers' models; the
            # dtype is read from a parameter no quantizer replaces (quantize_dynamic makes `projection.weight` a method)
            tokens = self.embed_patches(pixel_values.to(self.cls_token.dtype))
            height, width = pixel_values.shape[-2:]
            new_grid = (height // self.patch_size, width // self.patch_size)
            positions = interpolate_positions(
                self.position_encoding, self.grid, new_grid, self.num_prefix_tokens
            )
            return tokens + positions.to(tokens.dtype), keep
        _check_token_ids(input_ids, self.config.vocab_size, attention_mask)
        # given embeddings of any dtype (bfloat16 ones from another model) run in the model's, as pixel_values do
        dtype = self.word_embeddings.weight.dtype
        tokens = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds.to(dtype)
        _check_length(tokens.shape[1], self.config.max_position_embeddings)
        length = tokens.shape[1]
        if position_ids is not None:  # (B, N) rows of the table, or one (1, N) row for every sample
            position_ids = _check_position_ids(self.config, position_ids, tokens.shape[:2])
            if self.position_embeddings is not None:
                return tokens + self.position_embeddings(position_ids), keep
            return tokens + self.position_encoding[0][position_ids].to(dtype), keep
        if self.position_embeddings is not None:
            # the module is called (not its `.weight` sliced), so an adapter wrapping it (PEFT's LoRA) takes part
            positions = self.position_embeddings(torch.arange(length, device=tokens.device))  # (N, d)
            return tokens + positions, keep
        return tokens + self.position_encoding[:, :length].to(dtype), keep


def initialize_embeddings(module: HyperSetEmbeddings) -> None:
    """`_init_weights` of `HyperSetEmbeddings`, in Hyper-SET and in the looped baseline (which embeds as Hyper-SET):
    the CLS token N(0, 1), and the fixed position table rebuilt."""
    if config_choice(module.config, "input_type", {"image": True, "sequence": False}):
        init.normal_(module.cls_token, mean=0.0, std=1.0)  # N(0, 1) as in the authors' code
    if module.position_encoding is not None:
        # non-persistent, so absent from checkpoints: rebuilt here when loading from the meta device
        # the table the config names (1-D sinusoid, or the row/column table of "sincos-2d")
        init.copy_(
            module.position_encoding, fixed_positions(module.config, module.position_encoding.shape[1])
        )


def check_initial_state(initial_state: torch.Tensor, embedded: torch.Tensor) -> torch.Tensor:
    """`initial_state` checked against the embedding output `(B, N, d)` it replaces, in the model's dtype."""
    if not isinstance(initial_state, torch.Tensor) or initial_state.shape != embedded.shape:
        shape = tuple(initial_state.shape) if isinstance(initial_state, torch.Tensor) else type(initial_state)
        raise ValueError(
            f"initial_state must have the shape of the embedding output (batch, num_tokens, hidden_size) = "
            f"{tuple(embedded.shape)}; got {shape}."
        )
    return initial_state.to(device=embedded.device, dtype=embedded.dtype)


# --- bi-softmax attention implementations: (q, k, v, keep) → (output, maps or None) ---
# q, k, v: `(B, H, N, d_h)`, q = z ⊙ c (gains and the temperature 1/√d_h folded in) and k = z, so S = q kᵀ is
# symmetric; keep: `(B, N)` bool (True: real token) or None.
# Output (R + C) v, `(B, H, N, d_h)`, with R the softmax of S = q kᵀ over the keys and C the one over the queries:
# heads before tokens, unlike transformers' attention functions, which return `(B, N, H, d_h)`.
# Padding rules (every implementation): padded keys leave the row softmax, padded queries the column softmax, no
# token reads a padded key through either, and a sequence without real tokens gives zeros, not NaN.


def eager_bisoftmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """The reference: S and P = R + C materialised, `(B, H, N, N)`; the only implementation that returns P.

    Hyper-SET's scores are symmetric (q = z ⊙ c and k = z, so S = z diag(c) zᵀ): the column softmax of S is the
    transposed row softmax, C = Rᵀ, and one softmax gives both (half the exponentials of two softmaxes, the cost
    of one ordinary softmax attention). With padding, R leaves padded keys out, so Rᵀ leaves padded
    queries out of the columns, as the column softmax does. R + Rᵀ is formed in at least float32 and rounded to the
    input dtype once, as transformers' eager attention rounds its weights.
    """
    scores = q @ k.transpose(-1, -2)  # (B, H, N, N)
    dtype = torch.promote_types(scores.dtype, torch.float32)  # half-precision weights: one rounding, not two
    if keep is None:
        row = scores.softmax(-1, dtype=dtype)
        probs = row + row.transpose(-1, -2)  # R + Rᵀ: (B, H, N, N), C = Rᵀ swaps the last two axes
    else:
        key_keep = keep[:, None, None, :].to(dtype)  # (B, 1, 1, N)
        # a large finite negative (not −inf) keeps a fully padded sequence NaN-free; padded keys out
        row = scores.masked_fill(key_keep == 0, torch.finfo(scores.dtype).min).softmax(-1, dtype=dtype)
        probs = (row + row.transpose(-1, -2)) * key_keep  # no real token reads a padded key through either
    probs = probs.to(q.dtype)
    return probs @ v, probs


# head-dimension multiple the fused SDPA kernels of a device type need (others: 1, no padding)
_SDPA_HEAD_DIM_MULTIPLE = {"cuda": 8}

# The constant tensors the sdpa implementation puts around its sink key (`_sink_constants`) depend on shapes, dtype
# and device alone, which stay the same over a forward's iterations: inside `sink_constants_scope` (a model forward)
# each is built at its first use and reused, rather than rebuilt at both calls of every iteration. One dict per
# context (thread, asyncio task), so concurrent forwards share nothing.
_SINK_CONSTANTS: contextvars.ContextVar[dict[tuple, object] | None] = contextvars.ContextVar(
    "hyperset_sink_constants", default=None
)


@contextlib.contextmanager
def sink_constants_scope() -> Iterator[None]:
    """Within it, `sdpa_bisoftmax_attention` builds each of its constant tensors once and reuses it (dropped when
    the block ends)."""
    token = _SINK_CONSTANTS.set({})
    try:
        yield
    finally:
        _SINK_CONSTANTS.reset(token)


def _reused(key: tuple, build: Callable[[], object]) -> object:
    """`build()`, kept for the rest of the `sink_constants_scope` under `key`; built afresh outside one and while
    traced (torch.compile and torch.export make their own constants)."""
    cache = None if _is_tracing() else _SINK_CONSTANTS.get()
    if cache is None:
        return build()
    if key not in cache:
        cache[key] = build()
    return cache[key]


def _sink_constants(
    keys: torch.Tensor, width: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """What `_sink_attention` appends to keys `(…, N, d)` and values of `width` columns: the keys' zero column
    `(…, N, 1)`, the values' columns [1, 0] `(…, N, 2)`, the sink key [0, 1] `(…, 1, d + 1)` and the sink value
    [0, 0, 1] `(…, 1, width + 2)`."""
    *lead, length, head_dim = keys.shape

    def build() -> tuple[torch.Tensor, ...]:
        zero, one = keys.new_zeros(*lead, length, 1), keys.new_ones(*lead, length, 1)
        sink = torch.cat([keys.new_zeros(*lead, 1, head_dim), keys.new_ones(*lead, 1, 1)], -1)
        sink_value = torch.cat([keys.new_zeros(*lead, 1, width + 1), keys.new_ones(*lead, 1, 1)], -1)
        return zero, torch.cat([one, zero], -1), sink, sink_value

    return _reused(("sink", tuple(keys.shape), width, keys.dtype, keys.device), build)


def _pad_last(x: torch.Tensor, columns: int) -> torch.Tensor:
    """`x` with `columns` zero columns appended to its last axis; `x` itself for none."""
    return F.pad(x, (0, columns)) if columns else x


def _sink_attention(
    queries: torch.Tensor, keys: torch.Tensor, values: torch.Tensor, mask: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """One SDPA call that also yields the log-sum-exp ℓ_i = logsumexp_j q_i·k_j over the unmasked keys.

    A sink key scores s_i = ‖q_i‖ · max_j ‖k_j‖ ≥ max_j q_i·k_j for query i (an extra channel: q' = [q, s],
    k' = [k, 0], sink [0, 1]); two extra value channels carry 1 for the real keys and 1 for the sink. Their outputs
    are a_i = Σ_j e^{S_ij} / Z_i and p_i = e^{s_i} / Z_i (Z_i = e^{s_i} + Σ_j e^{S_ij}, p_i ≥ 1/(N + 1)), so
    ℓ_i = s_i + log a_i − log p_i and Σ_j e^{S_ij} values_j = out_i e^{s_i} / p_i, both differentiable through
    SDPA's own backward. Returns (out `(…, N, d_v)`, a, p, s), the last three `(…, N, 1)`: out in the input dtype,
    a, p and s in at least float32 (s as the call saw it, rounded to the input dtype), so that the log-sum-exp
    arithmetic of the caller runs in float32 on these per-row statistics while SDPA runs in the input dtype.
    """
    real = keys.detach().norm(dim=-1, keepdim=True)  # (…, N, 1)
    if mask is not None:  # the bound runs over the keys a query may read
        real = real.masked_fill(~mask[..., :-1].transpose(-1, -2), 0.0)
    sink_score = queries.detach().norm(dim=-1, keepdim=True) * real.amax(-2, keepdim=True)  # (…, M, 1)
    width = values.shape[-1]
    zero, one_zero, sink, sink_value = _sink_constants(keys, width)
    keys = torch.cat([torch.cat([keys, zero], -1), sink], -2)  # (…, N + 1, d + 1)
    queries = torch.cat([queries, sink_score], -1)  # (…, M, d + 1)
    values = torch.cat([torch.cat([values, one_zero], -1), sink_value], -2)  # (…, N + 1, d_v + 2)
    # fused SDPA kernels need head dimensions that are multiples of 8 (CUDA): pad with zero columns, where any are
    # missing (`F.pad` by nothing still copies)
    multiple = _SDPA_HEAD_DIM_MULTIPLE.get(queries.device.type, 1)
    queries, keys, values = (_pad_last(x, -x.shape[-1] % multiple) for x in (queries, keys, values))
    out = F.scaled_dot_product_attention(queries, keys, values, attn_mask=mask, scale=1.0)
    # half-precision statistics: ℓ_i = s_i + log a_i − log p_i in 16 bits would round s_i (tens) by a sizeable
    # fraction of a unit, an error of that fraction in every weight e^{S_ij − ℓ_i}
    stats = torch.promote_types(out.dtype, torch.float32)
    sums, sinks = (out[..., at : at + 1].to(stats) for at in (width, width + 1))
    return out[..., :width], sums, sinks, sink_score.to(stats)


def sdpa_bisoftmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, None]:
    """Pure torch on `scaled_dot_product_attention`, never materialising S (three-call identity).

    R v = SDPA(q, k, v), and C v = Σ_j e^{S_ij − ℓᶜ_j} v_j = e^{ℓʳ_i} SDPA(q, k, v ⊙ e^{−ℓᶜ})_i, max_j ℓᶜ_j factored
    out to stay in range. The column LSE ℓᶜ comes from SDPA with the roles of q and k swapped; both LSEs come from
    a sink key (`_sink_attention`), so the row part, the column part and ℓʳ share one call: two SDPA calls in all.
    Float16 inputs, or float16 autocast, run both calls in float32 (below); other dtypes run them in their own.
    """
    kind = q.device.type
    autocast = torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind)
    if (torch.get_autocast_dtype(kind) if autocast else q.dtype) == torch.float16:
        # Float16's range is too narrow for this identity: the sink score (a bound on a row's largest score) can
        # sit units above the log-sum-exp, which pushes SDPA's weights below float16's normal numbers, and the
        # column factors e^{max ℓᶜ − ℓᶜ_j} span e^{range of ℓᶜ}, which overflows float16 once that range passes
        # about 11 (NaN forward, and backward earlier). Both SDPA calls then run in float32 (so does an enclosing
        # float16 autocast, which would cast them back), and the result is rounded to the output dtype once.
        with torch.autocast(kind, enabled=False):
            wide = torch.promote_types(q.dtype, torch.float32)
            out, _ = sdpa_bisoftmax_attention(q.to(wide), k.to(wide), v.to(wide), keep)
        return out.to(v.dtype), None
    batch, heads, length, head_dim = q.shape
    real = None if keep is None else keep[:, None, :, None]  # (B, 1, N, 1)
    # SDPA's boolean mask over the N keys plus the sink (which every query reads: no row is empty, no NaN)
    mask = None
    # the same `keep` at every iteration, so the same mask (the cache holds the tensor: its id stays its own)
    if keep is not None:
        mask = _reused(
            ("mask", id(keep)),
            lambda: (keep, torch.cat([keep, keep.new_ones(batch, 1)], 1)[:, None, None, :]),
        )[1]
    # column pass: each key j attends over the real queries; only the LSE is needed, so no values
    no_values = _reused(
        ("no values", tuple(q.shape), q.dtype, q.device), lambda: q.new_zeros(batch, heads, length, 0)
    )
    _, col_sum, col_sink, col_score = _sink_attention(k, q, no_values, mask)
    # no real query at all: ℓᶜ is never used, keep log finite (and its gradient) with a 1
    lse_col = col_score + torch.where(col_sum > 0, col_sum, 1.0).log() - col_sink.log()  # (B, H, N, 1)
    if real is None:
        shift = lse_col.detach().amax(-2, keepdim=True)  # (B, H, 1, 1)
        weighted = v * torch.exp(shift - lse_col)  # v_j e^{m − ℓᶜ_j}: factors in [1, e^{max ℓᶜ − min ℓᶜ}]
    else:
        shift = lse_col.detach().masked_fill(~real, float("-inf")).amax(-2, keepdim=True)
        shift = shift.masked_fill(shift == float("-inf"), 0.0)
        weighted = v * torch.exp(torch.where(real, shift - lse_col, 0.0)) * real
    # the ℓᶜ arithmetic above ran in at least float32 (`_sink_attention`'s statistics); SDPA takes the input dtype,
    # so the weighted values are rounded to it once
    out, row_sum, row_sink, row_score = _sink_attention(q, k, torch.cat([v, weighted.to(v.dtype)], -1), mask)
    row = out[..., :head_dim] / torch.where(row_sum > 0, row_sum, 1.0)  # R v; no real key: 0
    col = out[..., head_dim:] * torch.exp(row_score - shift - row_sink.log())  # C v
    if real is not None:
        col = col * real  # padded queries are out of the column softmax
    return (row + col).to(v.dtype), None  # R v + C v formed in at least float32, rounded once


class BiSoftmaxAttentionInterface(AttentionInterface):
    """Hyper-SET's bi-softmax implementations by `config._attn_implementation` ("eager", the reference, is also
    the default of `get_interface`). transformers' registry type with a mapping of its own: the bi-softmax is no softmax
    attention, so its implementations stay out of transformers' global `ALL_ATTENTION_FUNCTIONS`, where every model
    would accept them. `BiSoftmaxAttentionInterface.register(name, function)` adds one for every Hyper-SET model:
    `function(q, k, v, keep)` → (output `(B, H, N, d_h)`, maps or None), with an optional `unavailable_reason(device)`
    attribute saying why it cannot run (None: it can). The energyformers package registers `"triton"` (a fused
    kernel, kept out of this file, which Hub remote code copies and which may import only torch and transformers).
    """

    _global_mapping = {"eager": eager_bisoftmax_attention, "sdpa": sdpa_bisoftmax_attention}


# This file's own table, under the name of transformers' global softmax one (which HyperBF's and the looped
# baseline's files import) because transformers reads it: `set_attn_implementation` switches a model only when the
# source of its file calls `get_interface` on a table of that name (`PreTrainedModel._can_set_attn_implementation`).
# The attention layers look the implementation up here at every call.
ALL_ATTENTION_FUNCTIONS = BiSoftmaxAttentionInterface()


# What `attn_implementation=None` selects on every device: the materialised eager path, the reference that runs
# everywhere and returns the maps. At these models' token counts the (N, N) scores are small, and one softmax
# gives both directions (`eager_bisoftmax_attention`) where "sdpa" needs two fused calls; "triton" is the choice
# when memory is short (no (N, N) map), "sdpa" a fused path without Triton.
DEFAULT_ATTN_IMPLEMENTATION = "eager"


# Whether each `attention_energy` is the bi-softmax, the one energy the fused implementations compute.
COMPUTES_BISOFTMAX: dict[str, bool] = {"bisoftmax": True, "sigmoid": False, "linear": False}


def missing_kernel_note() -> str:
    """The end of the refusal of a name Hyper-SET does not take: where "triton" is not registered, what it needs."""
    if "triton" in ALL_ATTENTION_FUNCTIONS:
        return ""
    return (
        '; `"triton"`, the fused kernel, needs the energyformers package with Triton installed '
        "(pip install 'energyformers[kernels]')"
    )


def check_attn_implementation(config: HyperSetConfig, requested: str) -> None:
    """A ValueError saying why the implementation `requested` cannot run for `config` on this machine, if it cannot."""
    if requested not in ALL_ATTENTION_FUNCTIONS:
        names = ", ".join(f'`"{name}"`' for name in ALL_ATTENTION_FUNCTIONS)
        raise ValueError(  # worded as transformers' own message, which its tests and users match
            f'Specified `attn_implementation="{requested}"` is not supported by Hyper-SET. The only possible '
            f"arguments are {names}, or None for the default{missing_kernel_note()}."
        )
    if requested != "eager" and not config_choice(config, "attention_energy", COMPUTES_BISOFTMAX):
        raise ValueError(
            f"Hyper-SET: attn_implementation={requested!r} computes the bi-softmax; "
            f"attention_energy={config.attention_energy!r} runs only with attn_implementation='eager'."
        )
    check = getattr(ALL_ATTENTION_FUNCTIONS[requested], "unavailable_reason", None)
    reason = None if check is None else check(None)
    if reason is not None:
        raise ValueError(f"Hyper-SET: attn_implementation={requested!r} cannot run here: {reason}.")


def choose_attn_implementation(
    config: HyperSetConfig, requested: str | None, is_init_check: bool = False
) -> str:
    """What `attn_implementation=requested` runs: None → `DEFAULT_ATTN_IMPLEMENTATION`, a name of this file's
    registry once `check_attn_implementation` passes it. `is_init_check`: transformers' argument, unused (no check
    here depends on where the weights are)."""
    if requested is None:
        logger.info(
            f"Hyper-SET attention: attn_implementation={DEFAULT_ATTN_IMPLEMENTATION!r} (the default)."
        )
        return DEFAULT_ATTN_IMPLEMENTATION
    check_attn_implementation(config, requested)
    return requested


def warn_if_maps_need_eager(config: HyperSetConfig, output_attentions: bool) -> None:
    """Once: attention maps were asked of an implementation that returns none, so that call runs eager."""
    if output_attentions and config._attn_implementation not in (None, "eager"):
        if config_choice(config, "attention_energy", COMPUTES_BISOFTMAX):
            logger.warning_once(
                f"Hyper-SET: attn_implementation={config._attn_implementation!r} returns no attention "
                "maps; this call with output_attentions=True runs the eager path. Load the model with "
                "attn_implementation='eager' to get maps without this warning."
            )


def _energy_precision(method: Callable) -> Callable:
    """An energy method (`energy`, `diagnostics`): without autograd and outside any autocast. The energies are
    computed in at least float32 (half-precision energies lose the small terms); an enclosing autocast, as in bf16
    training, would run their products in 16 bits and blur the descent and the energy-halting decisions."""

    @functools.wraps(method)
    @torch.no_grad()
    def wrapped(self: nn.Module, hidden_states: torch.Tensor, *args, **kwargs):
        kind = hidden_states.device.type
        if torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
            with torch.autocast(kind, enabled=False):
                return method(self, hidden_states, *args, **kwargs)
        return method(self, hidden_states, *args, **kwargs)

    return wrapped


def refuse_tied_offset(linear: nn.Module, name: str) -> None:
    """A ValueError if `linear`, the tied projection `name` (`qkv_proj`, `dictionary`), carries an active PEFT LoRA
    adapter with `lora_bias=True`. The tie has no place for an offset: module(I) − module(0) drops it, so the
    adapter's bias would be ignored (and gets no gradient), and no merged model holds it: PEFT refuses to merge a
    LoRA bias into a bias-free layer, and Hyper-SET's config has no bias there. Read from the wrapper's structure,
    not its values: a bias initialised to zero is refused at the first forward, with no host read."""
    biased = getattr(linear, "lora_bias", None)
    if not biased or getattr(linear, "disable_adapters", False):
        return
    adapters = [adapter for adapter in getattr(linear, "active_adapters", ()) if biased.get(adapter)]
    if adapters:
        kind = f"{type(linear).__module__}.{type(linear).__qualname__}"
        raise ValueError(
            f"Hyper-SET's tied {name} is a {kind} whose adapter {adapters[0]!r} has lora_bias=True: {name} is "
            "bias-free and used twice (W on the input, Wᵀ for the update), so a LoRA bias on it would be ignored, "
            "and PEFT cannot merge it into a bias-free layer. Use LoraConfig(lora_bias=False), or keep lora_bias "
            "for the layers with a bias and leave the tied ones out: "
            "LoraConfig(..., lora_bias=True, exclude_modules=['qkv_proj', 'dictionary'])."
        )


def tied_weight(
    linear: nn.Module, name: str, in_features: int, like: torch.Tensor, device: torch.device | None = None
) -> torch.Tensor | None:
    """The weight `(out, in)` a tied projection applies, when it is no plain `nn.Linear` (e.g. a PEFT LoRA or DoRA
    layer wrapping one, or a quantized Linear whose `.weight` is a tensor subclass, torchao's, which implements the
    matmul but not the view ops the tie applies to a weight) or a hooked one (`is_dispatched`: its `.weight` may be
    on `meta` outside its own call):
    (module(I) − module(0))ᵀ, exact for any affine wrapper (and for a plain float32 Linear: x·1 and sums with
    exact zeros round nothing), so the transposed use of the tie sees the adapter too and the model trained is the
    one `merge_and_unload()` gives. None for a plain unhooked `nn.Linear`, whose module and `.weight` are used as
    they are. An adapter's offset module(0) has no place in the tie and is refused (`refuse_tied_offset`; `name`:
    the projection's attribute, for its message). `like`: a parameter of the model's dtype and device; `device`:
    where the product is wanted instead (an input's device: an offloaded `like` is on meta outside its owner's
    call). Called once per layer and forward (`iteration_weights`; per iteration on the hook-safe path): in
    training mode an adapter's dropout draws one sample there for every use in that forward."""
    plain = is_plain_linear(linear)
    if plain and not is_dispatched(linear):
        return None
    refuse_tied_offset(linear, name)
    # a plain Linear's dtype is known even when offloaded (a meta tensor keeps it); a wrapper's is `like`'s
    dtype = linear.weight.dtype if plain else like.dtype
    identity = torch.eye(in_features, dtype=dtype, device=like.device if device is None else device)
    return (linear(identity) - linear(torch.zeros_like(identity[:1]))).t()


class HyperSetRMSNorm(nn.RMSNorm):
    """`nn.RMSNorm` that computes under autocast as CUDA's autocast runs it on every device: in float32.

    CUDA's autocast lists `rms_norm` among the ops it runs in float32 (inputs cast up, float32 out); CPU's lists it
    nowhere, so a bfloat16 input meets the float32 weight, and torch warns that it cannot use its fused kernel and
    takes a slower path, rounding the output to bfloat16. Here a half-precision input under autocast is normalised
    in float32 on every device (what CUDA does already, so there nothing changes); outside autocast, and for float32
    inputs, this is `nn.RMSNorm` itself. Same parameters and state-dict keys.
    """

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`(..., d)` → `(..., d)`: a half-precision input under autocast in float32, else `nn.RMSNorm`'s."""
        kind = hidden_states.device.type
        half = hidden_states.dtype in (torch.float16, torch.bfloat16)
        if half and torch.amp.is_autocast_available(kind) and torch.is_autocast_enabled(kind):
            weight = None if self.weight is None else self.weight.float()
            with torch.autocast(kind, enabled=False):
                return F.rms_norm(hidden_states.float(), self.normalized_shape, weight, self.eps)
        return super().forward(hidden_states)


class HyperSetAttention(nn.Module):
    """Symmetric (bi-softmax) attention: the exact update −Wᵀ ∂E_ATTN/∂z of the hyperspherical energy.

    Q = K = V share one projection W; the output projection is W itself, transposed: the energy's gradient
    with respect to z pulled back through W, not through the normalisation, so it is not ∇ₓE_ATTN and a small
    positive step can raise E_ATTN for a general W (model card, "Energy descent").
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.config = config  # `config._attn_implementation` is read at every call
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.energy_kind = config.attention_energy
        self.qkv_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        # RMSNorm gains over d_h: q, k, v each ("separate") or one for all three ("shared").
        self.qkv_gain = nn.Parameter(torch.ones(3 if config.qkv_norm == "separate" else 1, self.head_dim))

    def projection_weight(self, device: torch.device | None = None) -> torch.Tensor:
        """W `(d, d)` as `qkv_proj` applies it: its `.weight`, or the effective weight of a wrapped or hooked one
        (on `device`, where given)."""
        tied = tied_weight(self.qkv_proj, "qkv_proj", self.config.hidden_size, self.qkv_gain, device)
        return self.qkv_proj.weight if tied is None else tied

    def normalized_heads(self, hidden_states: torch.Tensor, tied: torch.Tensor | None = None) -> torch.Tensor:
        """Gain-free z = n(W_hᵀx) on the sphere of radius √d_h: `(B, N, d)` → `(B, H, N, d_h)`. `tied`: the
        effective W of a wrapped `qkv_proj` (`iteration_weights`); None: `projection_weight()`."""
        batch, length, _ = hidden_states.shape
        weight = self.projection_weight(hidden_states.device) if tied is None else tied
        if hidden_states.dtype == weight.dtype and isinstance(self.qkv_proj, nn.Linear):
            projected = self.qkv_proj(hidden_states)
        else:  # the energy diagnostics run a bfloat16 / float16 model's states in float32: the weight follows
            projected = F.linear(hidden_states, weight.to(hidden_states.dtype))
        # (B, N, d) → (B, N, H, d_h) → (B, H, N, d_h)
        z = projected.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        return F.rms_norm(z, (self.head_dim,), eps=self.eps)

    def gains(self) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(g_q, g_k, g_v), each `(d_h,)`: views of `qkv_gain`, no kernel (the attention runs once per iteration)."""
        return self.qkv_gain.expand(3, -1).unbind(0)  # "shared": one row, read three times

    def iteration_weights(self) -> tuple[torch.Tensor | None, torch.Tensor | None, torch.Tensor | None]:
        """The weight-only factors of `forward`: the q·k scale g_q g_k/√d_h `(d_h,)`, the output projection W
        with g_v on its rows `(d, d)`, and W itself when `qkv_proj` is wrapped (`tied_weight`; None for a plain
        Linear). They depend on the parameters alone, so the model computes them once per forward and passes
        them to every iteration rather than rebuilding them L·T times."""
        gain_q, gain_k, gain_v = self.gains()
        tied = tied_weight(self.qkv_proj, "qkv_proj", self.config.hidden_size, self.qkv_gain)
        weight = self.qkv_proj.weight if tied is None else tied
        # S = (z g_q)(z g_k)ᵀ/√d_h = (z g_q g_k/√d_h) zᵀ and P (z g_v) W = (P z)(g_v-scaled rows of W): the gains and
        # the temperature go into one (N, d_h) multiply and a (d, d) one, so k = v = z needs no pass of its own
        rows = weight.unflatten(0, (self.num_heads, self.head_dim))  # (H, d_h, d)
        # row h·d_h + c of W scaled by g_v[c]
        return gain_q * gain_k / math.sqrt(self.head_dim), (rows * gain_v[:, None]).flatten(0, 1), tied

    def forward(
        self,
        hidden_states: torch.Tensor,
        keep: torch.Tensor | None = None,
        output_attentions: bool = False,
        qk_scale: torch.Tensor | None = None,
        output_weight: torch.Tensor | None = None,
        tied: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """The update and the maps P `(B, H, N, N)` (eager only, else None), computed by the implementation
        `config._attn_implementation` names in `ALL_ATTENTION_FUNCTIONS`, or by eager where maps are asked for.
        `qk_scale`, `output_weight`, `tied`: `iteration_weights()` computed once by the caller (None: computed
        here)."""
        batch, length, width = hidden_states.shape
        if qk_scale is None or output_weight is None:
            qk_scale, output_weight, tied = self.iteration_weights()
        # one copy into (B, H, N, d_h) order here rather than one per batched product of q, k, v below
        z = self.normalized_heads(hidden_states, tied).contiguous()
        q, k, v = z * qk_scale, z, z
        if self.energy_kind == "sigmoid":
            sig = torch.sigmoid(q @ k.transpose(-1, -2))  # (B, H, N, N)
            probs = sig * (1 - sig)  # σ'(S): symmetric already
            if keep is not None:
                probs = probs * keep[:, None, None, :].to(probs.dtype)  # no token reads from a padded key
            mixed = probs @ v
        else:
            implementation = "eager" if output_attentions else self.config._attn_implementation  # maps: eager
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                implementation, eager_bisoftmax_attention
            )
            mixed, probs = attention_interface(q, k, v, keep)
        mixed = mixed.transpose(1, 2).reshape(batch, length, width)  # (B, H, N, d_h) → (B, N, d)
        return F.linear(mixed, output_weight.t()), probs  # output projection Wᵀ (tied), g_v on its rows

    @_energy_precision
    def energy(self, hidden_states: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """E_ATTN `(B,)` over the real tokens (`keep`: `(B, N)` float), gain-free normalisation."""
        return self.diagnostics(hidden_states, keep, geometry=False)[0]

    @_energy_precision
    def diagnostics(
        self, hidden_states: torch.Tensor, keep: torch.Tensor, geometry: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """E_ATTN `(B,)`, effective rank `(B, H)` and mean pairwise angle in degrees `(B, H)` over real tokens."""
        # at least float32 (half-precision energies lose the small terms), float64 stays float64
        z = self.normalized_heads(hidden_states.to(torch.promote_types(hidden_states.dtype, torch.float32)))
        z = z * keep[:, None, :, None]  # padded rows → 0
        scores = z @ z.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, N, N)
        pair_keep = keep[:, None, :, None] * keep[:, None, None, :]  # (B, 1, N, N)
        if self.energy_kind == "sigmoid":
            energy = 0.5 * math.sqrt(self.head_dim) * (torch.sigmoid(scores) * pair_keep).sum((1, 2, 3))
        else:
            lse = scores.masked_fill(pair_keep == 0, float("-inf")).logsumexp(-1).nan_to_num(neginf=0.0)
            energy = math.sqrt(self.head_dim) * (lse * keep[:, None, :]).sum((1, 2))
        if not geometry:
            return (energy,)
        singular = torch.linalg.svdvals(z)  # (B, H, min(N, d_h)); zero rows add no singular value
        p = singular / singular.sum(-1, keepdim=True).clamp_min(torch.finfo(singular.dtype).tiny)
        effective_rank = torch.exp(-torch.special.xlogy(p, p).sum(-1))
        unit = F.normalize(z, dim=-1)
        # (B, H, N, d_h) @ (B, H, d_h, N) → (B, H, N, N): the angle between every pair of tokens, per head
        angles = torch.rad2deg(torch.acos((unit @ unit.transpose(-1, -2)).clamp(-1.0, 1.0)))
        off_diagonal = pair_keep * (1 - torch.eye(z.shape[2], device=z.device))
        average_angle = (angles * off_diagonal).sum((-1, -2)) / off_diagonal.sum((-1, -2)).clamp_min(1.0)
        return energy, effective_rank, average_angle


def relu_potential(u: torch.Tensor) -> torch.Tensor:
    """½ReLU(u)², elementwise: the potential whose derivative is ReLU(u)."""
    return 0.5 * F.relu(u).pow(2)


def gelu_potential(u: torch.Tensor) -> torch.Tensor:
    """∫₀ᵘ tΦ(t) dt = ½[(u² − 1)Φ(u) + uϕ(u)] + ¼, elementwise: the potential whose derivative is the exact (erf)
    GELU uΦ(u) (differentiate: uΦ + ½(u² − 1)ϕ + ½ϕ − ½u²ϕ = uΦ, with ϕ' = −uϕ), 0 at u = 0."""
    gaussian = torch.exp(-0.5 * u * u) / math.sqrt(2 * math.pi)
    return 0.5 * ((u * u - 1) * torch.special.ndtr(u) + u * gaussian) + 0.25


class HyperSetFeedForward(nn.Module):
    """Symmetric feedforward act(n_M(Dx)) Dᵀ: the update −Dᵀ ∂E_FF/∂u, u = n_M(Dx), with a tied dictionary D.

    E_FF = −Σ_i Σ_m P(u_im) with P' = act: ½ReLU(u)² for ReLU (the paper's energy), ∫₀ᵘ tΦ(t) dt for the exact
    GELU (`gelu_potential`), so the reported energy is the one the update descends for either activation."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.energy_kind = config.feedforward_energy
        self.activation = config_choice(config, "hidden_act", {"relu": nn.ReLU, "gelu": nn.GELU})()
        self.potential = config_choice(config, "hidden_act", {"relu": relu_potential, "gelu": gelu_potential})
        self.eps = config.rms_norm_eps
        self.hidden_size = config.hidden_size
        self.dictionary = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.norm = HyperSetRMSNorm(config.intermediate_size, eps=config.rms_norm_eps)

    def iteration_weights(self) -> torch.Tensor | None:
        """D `(M, d)` when `dictionary` is wrapped (`tied_weight`), computed once per forward by the model; None
        for a plain Linear."""
        return tied_weight(self.dictionary, "dictionary", self.hidden_size, self.norm.weight)

    def project(
        self, hidden_states: torch.Tensor, tied: torch.Tensor | None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """u = n_M(Dx) `(B, N, M)` and the D `(M, d)` of the transposed use: through the module and its `.weight`
        for a plain Linear, else both from the effective `tied` (None: `iteration_weights()`)."""
        if tied is None:  # on the state's device: an offloaded norm's weight is on meta here
            tied = tied_weight(
                self.dictionary, "dictionary", self.hidden_size, self.norm.weight, hidden_states.device
            )
        if tied is None:
            return self.norm(self.dictionary(hidden_states)), self.dictionary.weight
        return self.norm(F.linear(hidden_states, tied)), tied

    def forward(self, hidden_states: torch.Tensor, tied: torch.Tensor | None = None) -> torch.Tensor:
        """`(B, N, d)` → `(B, N, d)`: the update act(n_M(Dx)) Dᵀ (softmax over the M atoms for `softmax`). `tied`:
        `iteration_weights()` computed once by the caller."""
        projected, dictionary = self.project(hidden_states, tied)
        coefficients = projected.softmax(-1) if self.energy_kind == "softmax" else self.activation(projected)
        return F.linear(coefficients, dictionary.t())

    def dictionary_weight(self, device: torch.device | None = None) -> torch.Tensor:
        """D `(M, d)` as `dictionary` applies it: its `.weight`, or the effective weight of a wrapped or hooked one
        (on `device`, where given)."""
        tied = tied_weight(self.dictionary, "dictionary", self.hidden_size, self.norm.weight, device)
        return self.dictionary.weight if tied is None else tied

    @_energy_precision
    def energy(self, hidden_states: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """E_FF `(B,)` over real tokens, gain-free normalisation."""
        dtype = torch.promote_types(hidden_states.dtype, torch.float32)
        dictionary = self.dictionary_weight(hidden_states.device).to(dtype)
        projected = F.rms_norm(
            F.linear(hidden_states.to(dtype), dictionary), (dictionary.shape[0],), eps=self.eps
        )
        if self.energy_kind == "softmax":
            per_token = -projected.logsumexp(-1)
        else:  # for ReLU the paper's −½‖ReLU(u)‖² to the bit: scaling by ½ commutes with the rounded sum
            per_token = -self.potential(projected).sum(-1)
        return (per_token * keep).sum(-1)


def _gelu_derivative(x: torch.Tensor) -> torch.Tensor:
    """d/dx [x Φ(x)] = Φ(x) + x ϕ(x) for the exact (erf) GELU."""
    return 0.5 * (1 + torch.erf(x / math.sqrt(2))) + x * torch.exp(-0.5 * x * x) / math.sqrt(2 * math.pi)


def _silu_derivative(x: torch.Tensor) -> torch.Tensor:
    sig = torch.sigmoid(x)
    return sig * (1 + x * (1 - sig))


# φ and φ' of `config.feature_map` (the `"linear"` attention and `"gated"` feedforward energies): the updates use φ'
# in closed form, so they are the energies' exact gradients without autograd inside the forward.
FEATURE_MAP_FUNCTIONS: dict[str, tuple[Callable[[torch.Tensor], torch.Tensor], ...]] = {
    "sigmoid": (torch.sigmoid, lambda x: torch.sigmoid(x) * (1 - torch.sigmoid(x))),
    "relu": (F.relu, lambda x: (x > 0).to(x.dtype)),
    "tanh": (torch.tanh, lambda x: 1 - torch.tanh(x).pow(2)),
    "softplus": (F.softplus, torch.sigmoid),
    "silu": (F.silu, _silu_derivative),
    "gelu": (F.gelu, _gelu_derivative),
    "elu": (F.elu, lambda x: torch.where(x > 0, 1.0, torch.exp(x.clamp_max(0)))),
    "elu+1": (lambda x: F.elu(x) + 1, lambda x: torch.where(x > 0, 1.0, torch.exp(x.clamp_max(0)))),
}


class HyperSetLinearAttention(HyperSetAttention):
    """Linear-kernel attention (`attention_energy="linear"`): the update Wᵀ ∂E/∂z of the feature-map energy.

    E_ATTN = (1/(2√d_h)) Σ_h Σ_{i,j} φ(z_i)·φ(z_j) = (1/(2√d_h)) Σ_h ‖Σ_i φ(z_i)‖², z = n(W_hᵀx): the bi-softmax
    energy with the kernel φ(z_i)·φ(z_j) in place of exp(z_i·z_j/√d_h), φ = `config.feature_map` (the feature maps
    named by the authors' `hyper-set-alt-attn` variant; the energy built on them is our choice, not theirs). Its
    gradient φ'(z_i) ⊙ Σ_j φ(z_j) / √d_h needs one sum per head and no (N, N) map,
    so the update costs O(N·d_h) per head and returns no attention maps. Gains: k inside φ, q inside φ', v on the
    result; with one shared gain g (`qkv_norm="shared"`) it is the exact gradient of E with z replaced by g ⊙ z.
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        self.feature_map, self.feature_map_derivative = FEATURE_MAP_FUNCTIONS[config.feature_map]

    def iteration_weights(self) -> tuple[None, None, torch.Tensor | None]:
        """No weight-only product (W enters as a view, each gain on its own): None, None, and W when `qkv_proj`
        is wrapped (`tied_weight`; None for a plain Linear)."""
        return None, None, tied_weight(self.qkv_proj, "qkv_proj", self.config.hidden_size, self.qkv_gain)

    def forward(
        self,
        hidden_states: torch.Tensor,
        keep: torch.Tensor | None = None,
        output_attentions: bool = False,  # one implementation, which returns no maps; accepted for the layer's call
        qk_scale: None = None,  # `iteration_weights()`: none here (the gains act inside φ and φ')
        output_weight: None = None,
        tied: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, None]:
        """`(B, N, d)` → `(B, N, d)`: the update Wᵀ ∂E/∂z, and None for the maps. `tied`: W of a wrapped
        `qkv_proj` from `iteration_weights()` (None: computed here; None again for a plain Linear)."""
        batch, length, width = hidden_states.shape
        if tied is None:
            tied = self.iteration_weights()[2]
        z = self.normalized_heads(hidden_states, tied)  # (B, H, N, d_h)
        gain_q, gain_k, gain_v = self.gains()
        features = self.feature_map(z * gain_k)
        if keep is not None:  # padded tokens are no part of the energy (φ(0) need not be 0)
            features = features * keep[:, None, :, None].to(features.dtype)
        total = features.sum(2, keepdim=True) / math.sqrt(self.head_dim)  # (B, H, 1, d_h)
        mixed = gain_v * self.feature_map_derivative(z * gain_q) * total  # (B, H, N, d_h)
        mixed = mixed.transpose(1, 2).reshape(batch, length, width)  # (B, H, N, d_h) → (B, N, d)
        return F.linear(mixed, (self.qkv_proj.weight if tied is None else tied).t()), None

    @_energy_precision
    def diagnostics(
        self, hidden_states: torch.Tensor, keep: torch.Tensor, geometry: bool = True
    ) -> tuple[torch.Tensor, ...]:
        """E_ATTN `(B,)` of the feature-map energy, then the geometry of z as for the bi-softmax attention."""
        z = self.normalized_heads(hidden_states.to(torch.promote_types(hidden_states.dtype, torch.float32)))
        features = self.feature_map(z) * keep[:, None, :, None]  # (B, H, N, d_h), padded rows → 0
        energy = features.sum(2).pow(2).sum((1, 2)) / (2 * math.sqrt(self.head_dim))
        if not geometry:
            return (energy,)
        return (energy, *super().diagnostics(hidden_states, keep)[1:])


class HyperSetGatedFeedForward(HyperSetFeedForward):
    """Gated feedforward (`feedforward_energy="gated"`): the update −Dᵀ ∂E_FF/∂u of E_FF = −½ Σ_i (Σ_m φ(u_im))².

    u = n_M(Dx) as in the other feedforward energies, φ = `config.feature_map` (the authors' `hyper-set-alt-attn`
    choices). The exact gradient gates each dictionary coefficient φ'(u_m) by the token's total Σ_m φ(u_m).
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        self.feature_map, self.feature_map_derivative = FEATURE_MAP_FUNCTIONS[config.feature_map]

    def forward(self, hidden_states: torch.Tensor, tied: torch.Tensor | None = None) -> torch.Tensor:
        """`(B, N, d)` → `(B, N, d)`: the update (Σ_m φ(u_m)) φ'(u) Dᵀ, u = n_M(Dx) `(B, N, M)`."""
        projected, dictionary = self.project(hidden_states, tied)  # (B, N, M), (M, d)
        gate = self.feature_map(projected).sum(-1, keepdim=True)  # (B, N, 1)
        return F.linear(gate * self.feature_map_derivative(projected), dictionary.t())

    @_energy_precision
    def energy(self, hidden_states: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """E_FF `(B,)` over real tokens, gain-free normalisation, in at least float32."""
        precision = torch.promote_types(hidden_states.dtype, torch.float32)
        dictionary = self.dictionary_weight(hidden_states.device).to(precision)
        projected = F.rms_norm(
            F.linear(hidden_states.to(precision), dictionary), (dictionary.shape[0],), eps=self.eps
        )
        return (-0.5 * self.feature_map(projected).sum(-1).pow(2) * keep).sum(-1)


# `config.attention_energy` / `config.feedforward_energy` values with a class of their own (others: the base class).
ATTENTION_CLASSES: dict[str, type[HyperSetAttention]] = {"linear": HyperSetLinearAttention}
FEEDFORWARD_CLASSES: dict[str, type[HyperSetFeedForward]] = {"gated": HyperSetGatedFeedForward}


class HyperSetStepSizeProjection(nn.Linear):
    """Linear(d, 2d) → [α, γ]; its own class so `_init_weights` can zero it (identity map at initialisation)."""


class HyperSetStepSizes(nn.Module):
    """Per-token, per-channel step sizes [α, γ] = proj(GELU(c + RMSNorm(x))) from a condition c and the state.

    Shared by all layers. `proj` starts at zero (α = γ = 0: identity at init), and so does the learned condition
    `condition` (c of `iteration_conditioning="none"`; its gradient is zero until `proj` leaves zero). With
    `iteration_conditioning="none"` (default) c is one learned vector for every iteration: iteration t + 1
    applies the same map as iteration t, which is what the authors' trained models compute (their `time_mlp`
    is zero-initialised in both Linears, so c_t never learns to depend on t) and what lets the depth grow at
    test time. `"sinusoidal"` makes c_t = time_mlp(sinusoid(t)) really depend on t (an ablation: its conditions
    for t past the trained depth were never seen in training, so accuracy collapses there).
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.rms_norm_eps
        # RMSNorms inside the time MLP and on the state (the authors' image models), none (their Sudoku model), or
        # one on the sum c + x (their masked-image-modelling model)
        normed = config.step_size_norm == "rmsnorm"
        self.norm_sum = config.step_size_norm == "rmsnorm-sum"

        def norm() -> nn.Module:
            return HyperSetRMSNorm(width, eps=eps) if normed else nn.Identity()

        if config.iteration_conditioning in ("sinusoidal", "sinusoidal-no-mlp"):
            self.time_embedding_dim = config.time_embedding_dim
            if config.iteration_conditioning == "sinusoidal":  # else c_t is the sinusoid itself
                layers = [nn.Linear(config.time_embedding_dim, width), norm(), nn.GELU(), norm()]
                layers += [nn.Linear(width, width), norm()]
                self.time_mlp = nn.Sequential(
                    *(layer for layer in layers if not isinstance(layer, nn.Identity))
                )
        else:
            self.condition = nn.Parameter(torch.zeros(width))  # c (the authors' time_mlp output, folded)
        self.condition_norm = HyperSetRMSNorm(width, eps=eps) if self.norm_sum else norm()
        self.proj = HyperSetStepSizeProjection(width, 2 * width)

    def iteration_conditions(self, num_iterations: int, reference: torch.Tensor) -> torch.Tensor:
        """c_t for t = 1..T in one batch, `(T, d)`: computed once per forward, not per iteration."""
        if not hasattr(self, "time_embedding_dim"):
            return self.condition.to(reference.dtype).expand(num_iterations, -1)
        steps = torch.arange(1, num_iterations + 1, device=reference.device)
        # at least float32 (a half-precision sinusoid of t·f_k is useless), float64 in a float64 model
        precision = torch.promote_types(reference.dtype, torch.float32)
        sinusoid = iteration_embedding(steps, self.time_embedding_dim, precision).to(reference.dtype)
        return self.time_mlp(sinusoid) if hasattr(self, "time_mlp") else sinusoid

    def forward(
        self, iteration_condition: torch.Tensor | None, state: torch.Tensor, joined: bool = False
    ) -> tuple[torch.Tensor, torch.Tensor] | torch.Tensor:
        """`(α, γ)`, each shaped as `state` `(B, N, d)`, from the condition and the state (`joined`: [α | γ] in
        one tensor, `(B, N, 2d)`). `iteration_condition` None: the learned `condition`, read here, inside this
        module's call (the hook-safe path: an offloaded `condition` is on meta outside it)."""
        if iteration_condition is None:
            iteration_condition = self.condition.to(state.dtype)
        projected = self.project(iteration_condition, state)
        if joined:
            return projected
        alpha, gamma = projected.chunk(2, dim=-1)
        return alpha, gamma

    def project(self, iteration_condition: torch.Tensor, state: torch.Tensor) -> torch.Tensor:
        """[α | γ] in one tensor, `(B, N, 2d)`."""
        if self.norm_sum:
            return self.proj(F.gelu(self.condition_norm(iteration_condition + state)))
        return self.proj(F.gelu(iteration_condition + self.condition_norm(state)))

    @staticmethod
    def constant_over_iterations(config: HyperSetConfig) -> bool:
        """Whether α, γ are the same at every iteration and layer: conditioned on the embedded input, with one
        condition c for all t (the Sudoku preset). The model then computes them once per forward."""
        on_input = config_choice(config, "step_size_condition", {"current": False, "input": True})
        one_condition = config_choice(
            config, "iteration_conditioning", {"none": True, "sinusoidal": False, "sinusoidal-no-mlp": False}
        )
        return on_input and one_condition


def _compile_region(function: Callable) -> Callable:
    """The layer step as a nested compile region: torch.compile traces one iteration once and reuses it for all L·T
    calls of a layer, so compile time does not grow with the depth T (torch ≥ 2.8; a no-op in eager mode).

    Non-strict `torch.export` (its default) is the exception: there torch runs Dynamo on the region anew at every
    call, L·T Dynamo compiles of the same step, several times the cost of tracing the loop unrolled. So under
    export outside Dynamo the plain step is traced; Dynamo (torch.compile, strict export) still gets the region.
    """
    nested_compile_region = getattr(torch.compiler, "nested_compile_region", None)
    if nested_compile_region is None:
        return function

    @functools.wraps(function)
    def step(*args, **kwargs):
        if torch.compiler.is_exporting() and not torch.compiler.is_dynamo_compiling():
            return function(*args, **kwargs)
        return region(*args, **kwargs)

    region = nested_compile_region(function)  # after `wraps`: its marks stay on `function`, off `step`
    return step


class HyperSetLayer(GradientCheckpointingLayer):
    """One iteration: x ← x − α ⊙ Attn(x), then x ← x + γ ⊙ FF(x) (steps built on E_ATTN, then E_FF), and with
    `input_anchor` λ > 0 the step −λ(x_t − x₀) on the anchor energy (λ/2)‖x − x₀‖²."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.attention = ATTENTION_CLASSES.get(config.attention_energy, HyperSetAttention)(config)
        self.feedforward = FEEDFORWARD_CLASSES.get(config.feedforward_energy, HyperSetFeedForward)(config)
        self.input_anchor = config.input_anchor

    @_compile_region
    def forward(
        self,
        hidden_states: torch.Tensor,
        iteration_condition: torch.Tensor,
        condition_source: torch.Tensor,
        step_sizes: HyperSetStepSizes,
        keep: torch.Tensor | None = None,
        anchor: torch.Tensor | None = None,
        output_attentions: bool = False,
        fixed_step_sizes: torch.Tensor | None = None,
        qk_scale: torch.Tensor | None = None,
        output_weight: torch.Tensor | None = None,
        tied_projection: torch.Tensor | None = None,
        tied_dictionary: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`fixed_step_sizes`: [α | γ] `(B, N, 2d)` when they do not change over iterations (computed once by the
        model), else None and the step-size network computes them here. `qk_scale`, `output_weight`,
        `tied_projection`: the attention's `iteration_weights()`, `tied_dictionary`: the feedforward's, computed
        once per forward by the model (None: computed here; the tied ones are None for plain Linears)."""
        # The shared step-size network is passed in (it lives on the model) so that one whole iteration,
        # step sizes included, is one checkpointed unit and memory does not grow with T.
        if fixed_step_sizes is None:
            alpha, gamma = step_sizes(iteration_condition, condition_source)
        else:
            alpha, gamma = fixed_step_sizes.chunk(2, dim=-1)
        update, probs = self.attention(
            hidden_states, keep, output_attentions, qk_scale, output_weight, tied_projection
        )
        updated = torch.addcmul(hidden_states, alpha, update, value=-1)  # x − α ⊙ Attn(x) in one pass
        updated = torch.addcmul(updated, gamma, self.feedforward(updated, tied_dictionary))  # x + γ ⊙ FF(x)
        if self.input_anchor and anchor is not None:
            # x − λ(x_t − x₀): the scale rides on the subtraction (`alpha`), no kernel of its own
            updated = torch.add(updated, hidden_states - anchor, alpha=-self.input_anchor)
        return updated, probs


class HyperSetPreTrainedModel(FamilyPreTrainedMixin, PreTrainedModel):
    """The base of every Hyper-SET model: its config class, weight initialisation, attention selection and loading."""

    config: HyperSetConfig
    config_class = HyperSetConfig
    base_model_prefix = "hyperset"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperSetEmbeddings", "HyperSetLayer", "HyperSetStepSizes"]
    _supports_sdpa = True

    # what `attn_implementation` takes: this file's bi-softmax registry, read at call time ("triton" registers there)
    attn_implementations = ALL_ATTENTION_FUNCTIONS

    def _choose_attn_implementation(self, requested: str | None, is_init_check: bool) -> str:
        return choose_attn_implementation(self.config, requested, is_init_check)

    def _attn_implementation_note(self) -> str:
        return missing_kernel_note()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, HyperSetStepSizeProjection):
            init.zeros_(module.weight)  # α = γ = 0: identity map at initialisation
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            init.normal_(module.weight, mean=0.0, std=std)
            if module.bias is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=std)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, HyperSetAttention):
            init.ones_(module.qkv_gain)
        elif isinstance(module, HyperSetStepSizes) and hasattr(module, "condition"):
            init.zeros_(module.condition)
        elif isinstance(module, HyperSetEmbeddings):
            initialize_embeddings(module)


# --- depth schedule ---
# How many iterations a call of a weight-tied backbone runs and which of them are differentiated: the mixin of
# `HyperSetModel` and of the looped baseline's `LoopedTransformerModel`.
# The values of the depth-schedule fields are read from the config class's `choices` (the looped baseline's config
# shares that table), so a value added there needs no second list here; `config_choice` names them when it refuses one.


# The random streams of training forwards (`random_draw_generator`): the depth, and the deep-supervision subset.
_DEPTH_STREAM, _SUBSET_STREAM = 0, 1
_MASK64 = (1 << 64) - 1


def _splitmix64(value: int) -> int:
    """One splitmix64 step (Steele, Lea and Flood; Vigna's constants): a bijection of 64-bit integers that mixes
    every input bit into every output bit."""
    value = (value + 0x9E3779B97F4A7C15) & _MASK64
    value = ((value ^ (value >> 30)) * 0xBF58476D1CE4E5B9) & _MASK64
    value = ((value ^ (value >> 27)) * 0x94D049BB133111EB) & _MASK64
    return value ^ (value >> 31)


def random_draw_generator(stream: int, draw: int, seed: int | None = None) -> torch.Generator:
    """The CPU generator of draw number `draw` (a count of training forwards) in random stream `stream`
    (`_DEPTH_STREAM`, `_SUBSET_STREAM`) of a run seeded with `seed`; None reads the run's seed as
    `torch.initial_seed()`, what `transformers.set_seed(s)` / `torch.manual_seed(s)` set to s.

    So a run's draws depend on its seed, the stream and the forward count, and on nothing that differs between the
    processes of a distributed run or between a run and its resume: `Trainer` and `accelerate.utils.set_seed` (not
    `device_specific=True`) seed every rank with the same s, and a restored RNG state (a resume) restores its initial
    seed with it. A process that never sets a seed has a random initial seed, so its draws are not reproducible and
    differ between ranks, as its other random draws do. The three are mixed by splitmix64: torch's CPU generator
    keeps only the low 32 bits of a seed, so side-by-side bit fields (seed · 2**32 + draw) would collide."""
    state = _splitmix64((torch.initial_seed() if seed is None else seed) & _MASK64)
    for value in (stream, draw):
        state = _splitmix64(state ^ (value & _MASK64))
    return torch.Generator().manual_seed(state)


def sample_num_iterations(config: HyperSetConfig, draw: int, seed: int | None = None) -> int:
    """The depth of training forward number `draw` under `config.iteration_sampling`, in a run seeded with `seed`
    (None: `torch.initial_seed()`; `random_draw_generator` says why every process of a distributed run, counting its
    own forwards, draws the same depth at the same step, and a resume the interrupted run's).

    `"poisson-lognormal"` (Geiping et al., *Scaling up Test-Time Compute with Latent Reasoning*):
    τ ~ N(log(T − 1) − σ²/2, σ), depth = 1 + Poisson(e^τ), mean T; clipped to the range.
    """
    mode = config_choice(
        config, "iteration_sampling", {name: name for name in HyperSetConfig.choices["iteration_sampling"]}
    )
    low, high = config.iteration_range
    if mode == "fixed":
        return config.num_iterations
    generator = random_draw_generator(_DEPTH_STREAM, draw, seed)
    if mode == "uniform":
        return int(torch.randint(low, high + 1, (1,), generator=generator))
    if mode == "poisson-lognormal":
        sigma, rate = config.iteration_sampling_sigma, max(config.num_iterations - 1, 1e-6)
        tau = torch.normal(math.log(rate) - sigma**2 / 2, sigma, (1,), generator=generator)
        return min(max(1 + int(torch.poisson(tau.exp(), generator=generator)), low), high)
    # the names come from the config's table: one added there without a branch here must not run another schedule
    raise NotImplementedError(f"iteration_sampling={mode!r} has no depth sampler in this model file.")


def deep_supervision_mode(config: PreTrainedConfig) -> str:
    """`config.deep_supervision`, read through its table (`config_choice`): a value edited onto the config after the
    build raises instead of running as another mode."""
    return config_choice(
        config, "deep_supervision", {name: name for name in HyperSetConfig.choices["deep_supervision"]}
    )


class RecurrentDepthMixin:
    """The depth schedule of a backbone that iterates weight-tied layers (`self.layers`, each applied T times):
    Hyper-SET's `HyperSetModel` and the looped-Transformer baseline's `LoopedTransformerModel` use this one
    implementation, so both follow the same schedule in a side-by-side run.

    * T of a call: the per-call value, else in training a draw of `config.iteration_sampling`
      (`sample_num_iterations`, seeded by the run's seed and the count `iteration_draws`), else
      `config.num_iterations`;
    * k, the iterations differentiated (truncated backpropagation through depth): the last k of all L·T;
    * `iteration_draws`: training forwards that drew a depth or a random deep-supervision subset
      (`supervised_iterations`), the index of the next draw; one per forward, shared by both. Every process counts
      its own forwards, so all ranks of a distributed run draw the same at each step; the training loops set it
      from the global step when they resume. Nothing is counted when nothing is random, so a compiled fixed-depth
      model sees no changing attribute.

    `has_energy`: whether the backbone's layers have an energy (Hyper-SET declares it), which test-time search by
    energy and adaptive halting by `halting_tolerance` read; the looped baseline has neither.
    """

    iteration_draws: int = 0
    has_energy: bool = False

    def _num_iterations(self, requested: int | None) -> int:
        """This call's T: the request, else a depth drawn by `iteration_sampling` (training), else the config's."""
        if requested is None:
            random_subset = deep_supervision_mode(self.config) == "random"
            fixed = config_choice(
                self.config,
                "iteration_sampling",
                {name: name == "fixed" for name in HyperSetConfig.choices["iteration_sampling"]},
            )
            if not self.training or (fixed and not random_subset):
                return self.config.num_iterations
            self.iteration_draws += 1
            return sample_num_iterations(self.config, self.iteration_draws - 1)
        if not _is_integer(requested) or requested < 1:
            raise ValueError(f"num_iterations must be an integer >= 1; got {requested!r}.")
        return int(requested)

    def _backprop_iterations(self, requested: int | None, num_iterations: int) -> int:
        """This call's k, the iterations differentiated (the last k of all L·T): the request, the config's, or all."""
        total = self.config.num_hidden_layers * num_iterations
        if requested is None:
            configured = self.config.backprop_iterations
            return total if configured is None else min(configured, total)
        if not _is_integer(requested) or not 1 <= requested <= total:
            raise ValueError(
                f"backprop_iterations must be an integer in [1, num_hidden_layers × num_iterations = {total}]; "
                f"got {requested!r}."
            )
        return int(requested)

    def _pool(self, hidden_states: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
        """The classifier input of a state `(B, N, d)` (`pool_tokens`: the first token or the mean over the real
        tokens after the prefix); the deep-supervision steps pool the intermediate states with it too."""
        return pool_tokens(self.config, hidden_states, keep, self.embeddings.num_prefix_tokens)

    @staticmethod
    def _iteration_grad(
        layer_index: int, t: int, num_iterations: int, backprop_iterations: int, num_layers: int
    ) -> contextlib.AbstractContextManager:
        """The grad mode of iteration `t` of layer `layer_index`: `no_grad` for all but the last k of the L·T."""
        frozen = num_layers * num_iterations - backprop_iterations
        return torch.no_grad() if layer_index * num_iterations + t < frozen else contextlib.nullcontext()


@dataclass
class _CallSettings:
    """One `HyperSetModel.forward` call's settings: the arguments with the config's defaults, checked."""

    num_iterations: int
    backprop_iterations: int
    halting: tuple[float, str] | None  # (tolerance, criterion) when this call halts adaptively
    output_attentions: bool
    output_hidden_states: bool
    output_energies: bool
    return_dict: bool


@dataclass
class _LayerInputs:
    """What every iteration of every layer reads beside the state, fixed for one forward."""

    embedded: torch.Tensor  # x₀, the embedding output
    keep: torch.Tensor | None  # (B, N) bool, None without padding
    # (B, N) float: 1 for a real token, 0 for padding; None where nothing reads it (no energies, halting or
    # final energy), so a forward without padding builds no all-ones mask
    real_tokens: torch.Tensor | None
    iteration_conditions: torch.Tensor  # (T, …) the condition of each iteration
    fixed_step_sizes: torch.Tensor | None  # [α | γ] (B, N, 2d) where they do not change over iterations
    on_input: bool  # the step sizes read x₀ (`step_size_condition="input"`), else the state
    # `is_dispatched`: no weight product hoisted out of a layer, the learned condition read by the step sizes
    hook_safe: bool = False


class HyperSetModel(RecurrentDepthMixin, HyperSetPreTrainedModel):
    """The Hyper-SET backbone: embeddings, then L weight-tied layers iterated T times (`RecurrentDepthMixin`).

    One `forward` serves both input types: images ViT-style (`pixel_values` first) and sequences BERT-style
    (`input_ids`, `attention_mask`, `inputs_embeds`); a sequence backbone's `main_input_name` is `input_ids`, and
    `model(ids)` reads them (`route_main_input`). Pass the other inputs by name.

    `last_hidden_state` (and the `pooler_output` taken from it) is the state the last iteration left, not
    normalised: the heads hold the norm before their classifier (`layernorm`, LayerNorm or RMSNorm by
    `config.classifier_norm`), because the recurrent-depth heads read the raw state (the supervision steps carry it
    into the next step as `initial_state`). iMixer's and HyperBF's `Model` end in a LayerNorm (as ViT's), so their
    base-model features are normalised.

    `add_pooling_layer=False` builds it without the pooler, as ViT's and BERT's: `pooler_output` is then None.
    """

    has_energy = True

    def __init__(self, config: HyperSetConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = HyperSetEmbeddings(config)
        self.step_sizes = HyperSetStepSizes(config)
        self.layers = nn.ModuleList([HyperSetLayer(config) for _ in range(config.num_hidden_layers)])
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
        num_iterations: int | None = None,
        backprop_iterations: int | None = None,
        halting_tolerance: float | None = None,
        halting_criterion: str | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
        initial_state: torch.Tensor | None = None,
        output_final_energy: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> HyperSetModelOutput | tuple:
        r"""
        num_iterations (`int`, *optional*):
            Iterations per layer for this call (defaults to `config.num_iterations`, or in training a depth
            drawn by `config.iteration_sampling`); larger values extrapolate in depth at test time.
        backprop_iterations (`int`, *optional*):
            Differentiate only the last k of the L·T iterations (defaults to `config.backprop_iterations`).
        halting_tolerance (`float`, *optional*):
            Adaptive halting in eval mode (defaults to `config.halting_tolerance`): each sample stops once its
            relative state change (or the size of its relative energy change) is below this, `num_iterations`
            being the maximum; the output's `iterations_used` says how many it ran. Not under torch.compile /
            export (fixed T there).
        halting_criterion (`str`, *optional*):
            `"state"` or `"energy"` (defaults to `config.halting_criterion`).
        output_energies (`bool`, *optional*):
            Return `energies` (`HyperSetEnergies`): E_ATTN, E_FF, effective rank and mean angle per
            layer for t = 0..T.
        initial_state (`torch.Tensor` of shape `(batch, num_tokens, hidden_size)`, *optional*):
            The state x the first iteration of the first layer starts from, in place of the embedding output
            (a carried state of the supervision steps, or a perturbed start of test-time search). The inputs are
            embedded all the same: the embedding output stays x₀ of the step sizes (`step_size_condition=
            "input"`) and of the first layer's anchor energy (`input_anchor`), and the input's padding mask
            applies; `hidden_states` then starts with `initial_state`. None: start from the embedding output.
        output_final_energy (`bool`, *optional*):
            Return `final_energy` `(batch,)`: Σ over layers of E_ATTN + E_FF of the state each layer's last
            iteration left (no gradient; what test-time search's energy selector compares).
        interpolate_pos_encoding (`bool`, *optional*):
            Images only: resample the position table bicubically to the patch grid of the input (another
            resolution, a multiple of `patch_size`), the CLS position unchanged, as ViT's argument. Without it an
            input of another size than `config.image_size` is refused.
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)` or `(1, sequence_length)`, *optional*):
            Sequences only: the row of the position table each token takes (None: 0..N−1), e.g.
            `(attention_mask.cumsum(-1) - 1).clamp(min=0)` for left-padded inputs, so each real token keeps its position.
        """
        pixel_values, input_ids = route_main_input(self.config, pixel_values, input_ids)
        settings = self._call_settings(
            num_iterations,
            backprop_iterations,
            halting_tolerance,
            halting_criterion,
            output_attentions,
            output_hidden_states,
            output_energies,
            return_dict,
        )
        embedded, keep = self.embeddings(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            interpolate_pos_encoding=bool(interpolate_pos_encoding),
            position_ids=position_ids,
        )
        reads_real_tokens = (
            settings.output_energies or settings.halting is not None or bool(output_final_energy)
        )
        hidden_states, inputs = self._layer_inputs(
            embedded, keep, initial_state, settings.num_iterations, reads_real_tokens
        )
        warn_if_maps_need_eager(self.config, settings.output_attentions)
        all_hidden_states = (hidden_states,) if settings.output_hidden_states else None
        all_attentions = () if settings.output_attentions else None
        iterations_used = (
            None if settings.halting is None else torch.zeros_like(inputs.real_tokens[:, 0], dtype=torch.long)
        )
        per_layer_diagnostics = []
        final_energy = torch.zeros_like(inputs.real_tokens[:, 0]) if output_final_energy else None
        # the constants of the sdpa implementation's sink key, built at the first iteration and reused by the others;
        # torch.compile cannot trace a context variable's scope, and makes its own constants
        with contextlib.nullcontext() if _is_tracing() else sink_constants_scope():
            for index, layer in enumerate(self.layers):
                # x₀ of the anchor energy: the state entering this layer; for the first layer the embedded input, also
                # when the iterations start from an `initial_state` (the anchor keeps tying the state to the input).
                # A compiled region must not receive an unused tensor that aliases another input (torch.compile then
                # reuses the traced iteration with its inputs shifted), so without an anchor energy it is None.
                anchor = (embedded if index == 0 else hidden_states) if self.config.input_anchor else None
                if settings.halting is not None:
                    hidden_states, used = self._iterate_until_halted(
                        layer, hidden_states, anchor, inputs, *settings.halting
                    )
                    iterations_used += used
                else:
                    hidden_states, states, maps, diagnostics = self._iterate_layer(
                        index, layer, hidden_states, anchor, inputs, settings
                    )
                    if settings.output_hidden_states:
                        all_hidden_states += states
                    if settings.output_attentions:
                        all_attentions += maps
                    if settings.output_energies:
                        per_layer_diagnostics.append(diagnostics)
                if output_final_energy:
                    final_energy = final_energy + self._energy(layer, hidden_states, inputs.real_tokens)

        energies = None
        if settings.output_energies:
            energies = HyperSetEnergies(
                *(torch.stack(values, dim=1) for values in zip(*per_layer_diagnostics))  # (B, L, T + 1[, H])
            )
        output = HyperSetModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=self._pool(hidden_states, keep) if self.add_pooling_layer else None,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            energies=energies,
            iterations_used=iterations_used,
            final_energy=final_energy,
        )
        return output if settings.return_dict else output.to_tuple()

    def _call_settings(
        self,
        num_iterations: int | None,
        backprop_iterations: int | None,
        halting_tolerance: float | None,
        halting_criterion: str | None,
        output_attentions: bool | None,
        output_hidden_states: bool | None,
        output_energies: bool | None,
        return_dict: bool | None,
    ) -> _CallSettings:
        """The call's arguments with the config's defaults, checked before anything runs."""
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        # the iteration counts first (backprop_iterations' range depends on num_iterations), then halting and
        # its clash with the output flags: a call with several bad arguments is told about its iteration counts
        num_iterations = self._num_iterations(num_iterations)
        backprop_iterations = self._backprop_iterations(backprop_iterations, num_iterations)
        halting = self._halting(halting_tolerance, halting_criterion)
        if halting is not None and (output_attentions or output_hidden_states or output_energies):
            raise ValueError(
                "halting_tolerance cannot be combined with output_attentions, output_hidden_states or "
                "output_energies (samples stop at different iterations); pass a fixed num_iterations instead."
            )
        return _CallSettings(
            num_iterations=num_iterations,
            backprop_iterations=backprop_iterations,
            halting=halting,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=bool(output_energies),
            return_dict=self.config.return_dict if return_dict is None else return_dict,
        )

    def _layer_inputs(
        self,
        embedded: torch.Tensor,
        keep: torch.Tensor | None,
        initial_state: torch.Tensor | None,
        num_iterations: int,
        reads_real_tokens: bool,
    ) -> tuple[torch.Tensor, _LayerInputs]:
        """The state the first iteration starts from, and what every iteration of every layer reads beside it
        (`real_tokens` only where `reads_real_tokens`)."""
        # read once per forward, not per iteration: the step sizes' condition x₀ (the input) or the state
        on_input = config_choice(self.config, "step_size_condition", {"current": False, "input": True})
        hidden_states = self._starting_state(embedded, initial_state, on_input)
        real_tokens = None
        if reads_real_tokens:
            real_tokens = (
                torch.ones(hidden_states.shape[:2], device=hidden_states.device)
                if keep is None
                else keep.float()
            )
        hook_safe = is_dispatched(self)
        if hook_safe and not hasattr(self.step_sizes, "time_embedding_dim"):
            # the learned condition is read inside the step sizes' call (None), where an offload hook loads it
            iteration_conditions = (None,) * num_iterations
        else:
            iteration_conditions = self.step_sizes.iteration_conditions(num_iterations, hidden_states)
        fixed_step_sizes = None  # [α | γ] once per forward where they do not change over iterations
        if HyperSetStepSizes.constant_over_iterations(self.config) and hook_safe:
            # through the network's own call, which reads the learned condition (None) where its hook loads it
            fixed_step_sizes = self.step_sizes(iteration_conditions[0], embedded, joined=True)  # (B, N, 2d)
        elif HyperSetStepSizes.constant_over_iterations(self.config):
            fixed_step_sizes = self.step_sizes.project(iteration_conditions[0], embedded)  # (B, N, 2d)
        inputs = _LayerInputs(
            embedded, keep, real_tokens, iteration_conditions, fixed_step_sizes, on_input, hook_safe
        )
        return hidden_states, inputs

    def _starting_state(
        self, embedded: torch.Tensor, initial_state: torch.Tensor | None, on_input: bool
    ) -> torch.Tensor:
        """The state the first iteration starts from: `initial_state` (checked against the embedded input) or the
        embedding output, copied where the iterations also read the embedded input x₀."""
        if initial_state is not None:
            return check_initial_state(initial_state, embedded)
        if on_input or self.config.input_anchor:
            # the iterations read x₀ beside the state; torch.compile reuses one traced iteration for all of them,
            # which goes wrong when x₀ and the state are one tensor at the first call and two after it
            return embedded.clone()
        return embedded

    def _iterate_layer(
        self,
        index: int,
        layer: HyperSetLayer,
        hidden_states: torch.Tensor,
        anchor: torch.Tensor | None,
        inputs: _LayerInputs,
        settings: _CallSettings,
    ) -> tuple[torch.Tensor, tuple, tuple, list[torch.Tensor] | None]:
        """Layer `index` iterated T = `settings.num_iterations` times: the last state, the states after each
        iteration and the attention maps (empty unless asked for), and the energy diagnostics for t = 0..T stacked
        along dim 1 (None unless asked for)."""
        states, maps = (), ()
        num_iterations, real_tokens = settings.num_iterations, inputs.real_tokens
        records = [self._diagnostics(layer, hidden_states, real_tokens)] if settings.output_energies else None
        # weight-only factors, once per layer and forward; positional tensors below, so that reentrant gradient
        # checkpointing differentiates them and the compile region sees them as inputs (hook-safe: None, each
        # layer call computes them inside its own modules' calls)
        qk_scale, output_weight, tied_projection, tied_dictionary = self._iteration_weights(layer, inputs)
        for t in range(num_iterations):
            source = inputs.embedded if inputs.on_input else hidden_states
            source = None if inputs.fixed_step_sizes is not None else source  # [α | γ] given: not read
            # truncated backpropagation through depth: only the last k of the L·T iterations build a graph
            with self._iteration_grad(
                index, t, num_iterations, settings.backprop_iterations, len(self.layers)
            ):
                condition = inputs.iteration_conditions[t]
                step_sizes, fixed_step_sizes = self._step_sizes_of(inputs, condition, source)
                # positional: gradient checkpointing (reentrant) differentiates the positional tensors only
                hidden_states, probs = layer(
                    hidden_states,
                    condition,
                    source,
                    step_sizes,
                    inputs.keep,
                    anchor,
                    settings.output_attentions,
                    fixed_step_sizes,
                    qk_scale,
                    output_weight,
                    tied_projection,
                    tied_dictionary,
                )
            if settings.output_hidden_states:
                states += (hidden_states,)
            if settings.output_attentions:
                maps += (probs,)
            if settings.output_energies:
                records.append(self._diagnostics(layer, hidden_states, real_tokens))
        diagnostics = (
            [torch.stack(values, dim=1) for values in zip(*records)] if records is not None else None
        )
        return hidden_states, states, maps, diagnostics

    def _step_sizes_of(
        self,
        inputs: _LayerInputs,
        condition: torch.Tensor | None,
        source: torch.Tensor | None,
        fixed: torch.Tensor | str | None = "inputs",
    ) -> tuple[HyperSetStepSizes | None, torch.Tensor | None]:
        """What a layer call gets for its step sizes: the shared network and `fixed` ([α | γ] where they do not
        change over iterations; "inputs": `inputs.fixed_step_sizes`). On the hook-safe path [α | γ] are computed
        here, by the network's own call, and the layer gets no module: a hook moves every argument of its module's
        call to that module's device, a module argument included, which would move the shared network's
        parameters away from its own hook's device."""
        fixed = inputs.fixed_step_sizes if isinstance(fixed, str) else fixed
        if not inputs.hook_safe or fixed is not None:
            return self.step_sizes, fixed
        return None, self.step_sizes(condition, source, joined=True)

    @staticmethod
    def _iteration_weights(layer: HyperSetLayer, inputs: _LayerInputs) -> tuple[torch.Tensor | None, ...]:
        """The layer's weight-only factors (the attention's `iteration_weights()`, then the feedforward's), once per
        layer and forward; all None on the hook-safe path, where they read offloaded parameters outside their
        owners' calls, so every layer call computes its own."""
        if inputs.hook_safe:
            return None, None, None, None
        return (*layer.attention.iteration_weights(), layer.feedforward.iteration_weights())

    def _halting(self, tolerance: float | None, criterion: str | None) -> tuple[float, str] | None:
        """(ε, criterion) when this call halts adaptively: eval mode, eager, a tolerance given; else None."""
        requested_criterion = criterion
        tolerance = self.config.halting_tolerance if tolerance is None else tolerance
        criterion = self.config.halting_criterion if criterion is None else criterion
        criteria = HyperSetConfig.choices["halting_criterion"]
        if criterion not in criteria:
            raise ValueError(f"halting_criterion must be one of {list(criteria)}; got {criterion!r}.")
        if tolerance is None and requested_criterion is not None:
            # the criterion says what a tolerance measures: without one nothing halts, and the argument would
            # change nothing
            raise ValueError(
                f"halting_criterion={requested_criterion!r} says what halting_tolerance measures, and this call has "
                "no tolerance (none passed, config.halting_tolerance is None); pass halting_tolerance as well."
            )
        if tolerance is None:
            return None
        if isinstance(tolerance, bool) or not isinstance(tolerance, (int, float)) or not tolerance > 0:
            raise ValueError(f"halting_tolerance must be a number > 0 (or None); got {tolerance!r}.")
        if self.training:
            return None
        if torch.compiler.is_exporting():
            # a data-dependent exit has no place in a graph: the exported program (ONNX's too) runs the fixed depth
            # for every input, slower and with other outputs than eager's. Not under torch.compile, which runs the
            # fixed depth too (docs) but cannot trace a logging call without breaking the graph
            logger.warning_once(
                f"Hyper-SET: halting_tolerance={tolerance!r} is ignored under torch.export (and so ONNX export): "
                "the exported graph runs all num_iterations for every sample. Set halting_tolerance=None before "
                "exporting to silence this, or run the model eagerly to halt."
            )
        if _is_tracing():
            return None
        return float(tolerance), criterion

    def _iterate_until_halted(
        self,
        layer: HyperSetLayer,
        hidden_states: torch.Tensor,
        anchor: torch.Tensor | None,
        inputs: _LayerInputs,
        tolerance: float,
        criterion: str,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """Iterate `layer` per sample until its relative change is below `tolerance`, T at most.

        The change is ‖x_{t+1} − x_t‖ / ‖x_t‖ over the real tokens (`"state"`) or |E_t − E_{t+1}| / |E_t| with
        E = E_ATTN + E_FF (`"energy"`): a sample keeps iterating while its energy still changes by ε or more, up
        or down. A halted sample leaves the working batch, so it costs no more compute; its state is written back
        in place. Returns the states and the iterations each sample ran, `(B,)`.
        """
        batch = hidden_states.shape[0]
        active = torch.arange(batch, device=hidden_states.device)  # samples still iterating
        used = torch.zeros(batch, dtype=torch.long, device=hidden_states.device)
        keep, fixed_step_sizes = inputs.keep, inputs.fixed_step_sizes
        energy = self._energy(layer, hidden_states, inputs.real_tokens) if criterion == "energy" else None
        # once, as in `_iterate_layer`
        qk_scale, output_weight, tied_projection, tied_dictionary = self._iteration_weights(layer, inputs)
        for condition in inputs.iteration_conditions:
            current, tokens = hidden_states[active], inputs.real_tokens[active]  # (A, N, d), (A, N)
            source = inputs.embedded[active] if inputs.on_input else current
            given = None if fixed_step_sizes is None else fixed_step_sizes[active]
            step_sizes, given = self._step_sizes_of(inputs, condition, source, given)
            updated, _ = layer(
                current,
                condition,
                source,
                step_sizes,
                None if keep is None else keep[active],
                None if anchor is None else anchor[active],
                False,  # no maps: halting cannot return them
                given,
                qk_scale,
                output_weight,
                tied_projection,
                tied_dictionary,
            )
            hidden_states = hidden_states.index_copy(0, active, updated)
            used[active] += 1
            if criterion == "state":
                weights = tokens.unsqueeze(-1).to(updated.dtype)  # padded tokens do not count
                # (A, N, d) → (A, N·d) → (A,): one relative change per active sample
                change = ((updated - current) * weights).flatten(1).norm(dim=1)
                change = change / (current * weights).flatten(1).norm(dim=1).clamp_min(
                    torch.finfo(change.dtype).tiny
                )
            elif criterion == "energy":
                # The size of the change, up or down, as the state criterion measures a norm: a sample whose energy
                # rises is still moving (the step sizes are learned, so an update need not descend) and must not
                # read as converged.
                new_energy = self._energy(layer, updated, tokens)
                change = (energy[active] - new_energy).abs() / energy[active].abs().clamp_min(
                    torch.finfo(new_energy.dtype).tiny
                )
                energy = energy.index_copy(0, active, new_energy)
            else:  # `_halting` accepts the config's names: one added there without a measure here must not pass
                raise NotImplementedError(
                    f"halting_criterion={criterion!r} has no change measure in this model file."
                )
            active = active[change >= tolerance]
            if active.numel() == 0:
                break
        return hidden_states, used

    @staticmethod
    def _energy(layer: HyperSetLayer, hidden_states: torch.Tensor, real_tokens: torch.Tensor) -> torch.Tensor:
        """E_ATTN + E_FF per sample, `(B,)`."""
        return layer.attention.energy(hidden_states, real_tokens) + layer.feedforward.energy(
            hidden_states, real_tokens
        )

    @staticmethod
    def _diagnostics(
        layer: HyperSetLayer, hidden_states: torch.Tensor, keep: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        attention_energy, effective_rank, average_angle = layer.attention.diagnostics(hidden_states, keep)
        return attention_energy, layer.feedforward.energy(hidden_states, keep), effective_rank, average_angle


# --- recurrent-depth heads ---
# What the classification heads of Hyper-SET and of the looped baseline run around their backbone: deep
# supervision, the supervision steps with the halting head, test-time search (`run_head`), and the head mixin.
def supervised_iterations(
    config: PreTrainedConfig, num_iterations: int, draw: int | None = None, seed: int | None = None
) -> list[int]:
    """The iterations (1-based, ascending, the last one always included) whose states the training loss reads
    under `config.deep_supervision`, for a forward of `num_iterations` iterations.

    `"every"` steps back from T by `deep_supervision_interval`; `"random"` adds `deep_supervision_samples` − 1
    iterations drawn without replacement from 1..T − 1, by draw `draw` (the model's depth-draw count) of a stream
    of its own in a run seeded with `seed` (None: `torch.initial_seed()`; `random_draw_generator`), so every
    process of a distributed run supervises the same iterations, independently of the depth drawn.
    """
    mode = deep_supervision_mode(config)
    last = num_iterations
    if mode == "all":
        return list(range(1, last + 1))
    if mode == "every":
        return list(range(last, 0, -config.deep_supervision_interval))[::-1]
    if mode == "random":
        if draw is None:
            raise ValueError('deep_supervision="random" needs a draw index (the model\'s iteration_draws).')
        extra = min(config.deep_supervision_samples, last) - 1
        generator = random_draw_generator(_SUBSET_STREAM, draw, seed)
        picked = (torch.randperm(last - 1, generator=generator)[:extra] + 1).tolist()
        return [*sorted(picked), last]
    if mode == "last":
        return [last]
    # the names come from the config's table: one added there without a branch here must not supervise another set
    raise NotImplementedError(f"deep_supervision={mode!r} has no iteration subset in this model file.")


def supervision_weights(config: PreTrainedConfig, iterations: list[int]) -> list[float]:
    """The weights of `iterations`' losses (sum 1): equal (`"uniform"`) or proportional to t (`"linear"`)."""
    linear = config_choice(config, "deep_supervision_weights", {"uniform": False, "linear": True})
    raw = [float(t) for t in iterations] if linear else [1.0] * len(iterations)
    total = sum(raw)
    return [value / total for value in raw]


def _supervision_step(
    head: PreTrainedModel,
    backbone: nn.Module,
    labels: torch.Tensor | None,
    backbone_inputs: dict,
    draw: int | None,
    requested_states: bool,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> tuple[ModelOutput, torch.Tensor, torch.Tensor | None]:
    """One backbone call of T iterations (`backbone_inputs` name the T), the head on its last state, and the loss of
    `labels`: in training with `config.deep_supervision` other than `"last"` the weighted mean of the losses of the
    head on the states after the supervised iterations of the last layer (`supervised_iterations`, `draw` indexing a
    random subset), else the loss of the returned logits alone; each loss normalised by `num_items_in_batch` when
    given (`head_loss`)."""
    config = head.config
    beyond_last = deep_supervision_mode(config) != "last"
    supervise = labels is not None and head.training and beyond_last
    if supervise:  # the per-iteration states; kept by autograd in training anyway
        backbone_inputs = {**backbone_inputs, "output_hidden_states": True}
    outputs = backbone(**backbone_inputs, return_dict=True)
    features = outputs.last_hidden_state if head._per_token else outputs.pooler_output
    logits = head.classifier(head.layernorm(features))
    if labels is None:
        return outputs, logits, None
    if not supervise:
        return outputs, logits, head_loss(head, logits, labels, num_items_in_batch, head._per_token)
    states, num_layers = outputs.hidden_states, len(backbone.layers)
    num_iterations = (len(states) - 1) // num_layers
    attention_mask = backbone_inputs.get("attention_mask")
    keep = None if attention_mask is None else attention_mask.bool()
    chosen = supervised_iterations(config, num_iterations, draw)
    losses = []
    for t in chosen:
        if t == num_iterations:
            # the returned logits: the head is not applied twice
            losses.append(head_loss(head, logits, labels, num_items_in_batch, head._per_token))
            continue
        state = states[(num_layers - 1) * num_iterations + t]  # after iteration t of the last layer
        features = state if head._per_token else backbone._pool(state, keep)
        step_logits = head.classifier(head.layernorm(features))
        losses.append(head_loss(head, step_logits, labels, num_items_in_batch, head._per_token))
    # the weights as Python numbers: a weight tensor would be copied to the device at every step (a host sync)
    weights = supervision_weights(config, chosen)
    loss = torch.stack([weight * term for weight, term in zip(weights, losses)]).sum()
    if not requested_states:
        outputs.hidden_states = None
    return outputs, logits, loss


def halting_targets(head: PreTrainedModel, logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The halting head's BCE target `(B,)` float: 1 where the answer of `logits` is complete and correct.

    Per-token heads: every supervised token (label ≠ −100) predicted right (a sample without one counts as right).
    Pooled heads: the predicted class is the label (integer labels), or every label's sign is right (multi-label
    float labels). Regression has no "correct" answer: a `ValueError`.
    """
    logits, labels = logits.detach(), labels.to(logits.device)
    if head._per_token:
        right = (logits.argmax(-1) == labels) | (labels == -100)
        return right.flatten(1).all(-1).to(logits.dtype)  # (B, N, ...) → (B, N·...) → (B,)
    if head.config.problem_type == "regression" or head.config.num_labels == 1:
        raise ValueError(
            "halting_head=True needs a classification target (a correct / wrong answer); this head's "
            f"problem_type={head.config.problem_type!r} with num_labels={head.config.num_labels} is a regression."
        )
    if labels.is_floating_point():  # multi-label: each label's sign
        return ((logits > 0) == (labels > 0.5)).all(-1).to(logits.dtype)
    return (logits.argmax(-1) == labels).to(logits.dtype)


def _batch_size(config: PreTrainedConfig, backbone_inputs: dict) -> int:
    for name in ("pixel_values", "input_ids", "inputs_embeds"):
        if backbone_inputs.get(name) is not None:
            return backbone_inputs[name].shape[0]
    # No input at all: the input check of `config.input_type` raises, naming the inputs this head takes (an image
    # head's forward has no input_ids), in the words every family's models use.
    _check_inputs(config, None, None, None, None)
    raise AssertionError("unreachable: _check_inputs refuses a call without inputs")


# Batch-first inputs of a backbone call, subset for the samples still running under the halting head.
_BATCH_INPUTS = (
    "pixel_values",
    "input_ids",
    "attention_mask",
    "inputs_embeds",
    "initial_state",
    "position_ids",
)


def classify_with_deep_supervision(
    head: PreTrainedModel,
    backbone: nn.Module,
    labels: torch.Tensor | None,
    backbone_inputs: dict,
    halting_threshold: float | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> tuple[ModelOutput, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor | None]]:
    """(backbone outputs, logits, loss, step fields) of a recurrent-depth head (`HyperSetHead`,
    `LoopedTransformerHead`) over `config.supervision_steps` S outer steps of T iterations.

    One T per forward (drawn once under random depth, with one random deep-supervision draw) serves all S steps.
    Step s + 1 starts (`initial_state`) from the state step s ended in, detached; `backbone_inputs` may hold an
    `initial_state` for step 1. Each step's loss is `_supervision_step`'s (deep supervision inside the step; step s
    of forward number n draws its random subset with index n·S + s); the training loss is the mean over steps,
    plus `halting_loss_weight` × the mean over steps of the halting head's BCE (`halting_targets`; `_halting_step`
    weighs its samples). Every loss is normalised by `num_items_in_batch` when given (`head_loss`), so the losses of
    the micro-batches of a gradient-accumulation window add up to that of the whole batch. In eval mode the
    loss is that of the returned logits. With the halting head in eval mode a sample stops after the first step
    whose halting probability exceeds `halting_threshold` (default 0.5) and leaves the batch (no further compute).

    With S = 1 and no halting head this is one backbone call and the loss of deep supervision (no outer steps, no
    carried state). Outputs over S > 1 steps: `hidden_states` / `attentions` of all steps in order (the first step's
    starting state once), `iterations_used` summed, `energies` and `final_energy` of the last step each sample ran.
    Step fields: `supervision_steps_used` `(B,)` and `halting_probabilities` `(B, S)` (NaN for steps a sample did
    not run), or None with S = 1 and no halting head.
    """
    config = head.config
    steps = config.supervision_steps
    halting = getattr(head, "halting_classifier", None)
    if head.training and labels is None:
        warn_training_losses_need_labels(head)
    threshold, stop_early, requested_states = _check_outer_steps_call(
        head, backbone_inputs, halting_threshold
    )
    random_subset, first_draw, num_iterations = _depth_of_forward(head, backbone, labels, backbone_inputs)
    inputs = {**backbone_inputs, "num_iterations": num_iterations}
    carry = inputs.pop("initial_state", None)
    step_labels = labels if head.training else None  # eval: the loss of the returned logits, at the end

    batch = _batch_size(config, inputs)
    # the inputs' device, not the classifier's: an offloaded classifier's weight is on meta (moved to the logits'
    # device at each step)
    device = next(v.device for v in inputs.values() if isinstance(v, torch.Tensor))
    active = None  # indices of the samples still running (None: all)
    logits = step_outputs = merged = None
    step_losses, halting_losses, probabilities = [], [], []
    # the steps each sample ran: an output field only with outer steps or a halting head (`_step_fields`)
    used = torch.zeros(batch, dtype=torch.long, device=device) if steps > 1 or halting is not None else None
    for step in range(steps):
        step_inputs = dict(inputs)
        if active is not None:
            step_inputs = {
                k: v[active] if k in _BATCH_INPUTS and isinstance(v, torch.Tensor) else v
                for k, v in step_inputs.items()
            }
        if carry is not None:  # already the running samples' own
            step_inputs["initial_state"] = carry
        draw = first_draw * steps + step if random_subset else None
        step_outputs, step_logits, loss = _supervision_step(
            head, backbone, step_labels, step_inputs, draw, requested_states, num_items_in_batch
        )
        if used is not None:
            used = used.to(step_logits.device)
            if active is None:
                used += 1
            else:
                used[active] += 1
        if loss is not None:
            step_losses.append(loss)
        merged = _merge_step(merged, step_outputs, active)
        logits = step_logits if active is None else logits.index_copy(0, active, step_logits)
        carry = step_outputs.last_hidden_state.detach()
        if halting is None:
            continue
        probability, halting_loss = _halting_step(
            head,
            backbone,
            step_inputs,
            step_outputs,
            step_logits,
            step_labels,
            active,
            batch,
            num_items_in_batch,
        )
        probabilities.append(probability)
        if halting_loss is not None:
            halting_losses.append(halting_loss)
        if stop_early and step < steps - 1:
            index = slice(None) if active is None else active
            # the positions of the running samples among the active ones: the one host read of a step, by design
            # (the batch size of the next step); both selections below index with them on the device
            running = (probability[index] <= threshold).nonzero().squeeze(1)  # (A',)
            active = running if active is None else active[running]
            carry = carry[running]
            if active.numel() == 0:
                break

    if head.training and labels is not None:
        loss = torch.stack(step_losses).mean() if steps > 1 else step_losses[0]
        if halting_losses:
            loss = loss + config.halting_loss_weight * torch.stack(halting_losses).mean()
    else:
        loss = (
            None if labels is None else head_loss(head, logits, labels, num_items_in_batch, head._per_token)
        )
    return merged, logits, loss, _step_fields(steps, halting is not None, used, probabilities, batch)


def warn_training_losses_need_labels(head: PreTrainedModel) -> None:
    """Warn once when a head called in training mode without `labels` has losses that only its `forward` computes:
    deep supervision, supervision steps, the halting head. A loss taken outside from `logits` (the last iteration's
    of the last step) has none of them."""
    config = head.config
    beyond_last = deep_supervision_mode(config) != "last"
    asked = [
        *([f"deep_supervision={config.deep_supervision!r}"] if beyond_last else []),
        *([f"supervision_steps={config.supervision_steps}"] if config.supervision_steps > 1 else []),
        *(["halting_head=True"] if config.halting_head else []),
    ]
    if asked:
        logger.warning_once(
            f"{type(head).__name__} runs in training mode without labels, and its config asks for "
            f"{', '.join(asked)}: those losses only exist when `labels` reach forward, which then returns them in "
            "`loss`. A loss computed outside from `logits` (the last iteration's, of the last step) leaves them out. "
            "The usual cause is transformers' Trainer with `label_smoothing_factor` > 0 or a `compute_loss_func`, "
            "which take `labels` out of the inputs."
        )


def _check_outer_steps_call(
    head: PreTrainedModel, backbone_inputs: dict, halting_threshold: float | None
) -> tuple[float, bool, bool]:
    """(the halting threshold, whether samples stop early, whether the call returns `hidden_states`) of a call of
    `classify_with_deep_supervision`, or a `ValueError` for a threshold or output flags it cannot serve."""
    config = head.config
    threshold = 0.5 if halting_threshold is None else halting_threshold
    if isinstance(threshold, bool) or not isinstance(threshold, (int, float)) or not 0 < threshold < 1:
        raise ValueError(f"halting_threshold must be a number in (0, 1); got {halting_threshold!r}.")
    requested_states = backbone_inputs.get("output_hidden_states")
    if requested_states is None:
        requested_states = config.output_hidden_states
    halting = getattr(head, "halting_classifier", None)
    if halting is None and halting_threshold is not None:
        raise ValueError(
            f"halting_threshold={halting_threshold!r} is what the halting head's probability is compared with, and "
            f"{type(head).__name__} has no halting head (config.halting_head=False); pass no halting_threshold "
            "(halting_tolerance halts the iterations by the state's change)."
        )
    eligible = halting is not None and config.supervision_steps > 1 and not head.training
    stop_early = eligible and not _is_tracing()
    if eligible and torch.compiler.is_exporting():
        # as for halting_tolerance (`HyperSetModel._halting`): no data-dependent exit in an exported graph
        logger.warning_once(
            f"{type(head).__name__}: the halting head's early stop is ignored under torch.export (and so ONNX "
            f"export): the exported graph runs all supervision_steps={config.supervision_steps} outer steps for "
            "every sample (its logits are the last step's). Run the model eagerly to stop early."
        )
    if stop_early and any(backbone_inputs.get(name) for name in ("output_attentions", "output_energies")):
        raise ValueError(
            "the halting head stops samples after different outer steps: output_attentions and output_energies "
            "cannot be combined with it (config.halting_head=True, supervision_steps > 1) in eval mode."
        )
    if stop_early and requested_states:
        raise ValueError(
            "the halting head stops samples after different outer steps: output_hidden_states cannot be combined "
            "with it (config.halting_head=True, supervision_steps > 1) in eval mode."
        )
    return threshold, stop_early, requested_states


def _depth_of_forward(
    head: PreTrainedModel, backbone: nn.Module, labels: torch.Tensor | None, backbone_inputs: dict
) -> tuple[bool, int, int]:
    """(whether deep supervision draws a random subset, the draw count before this forward, T) of one forward:
    one depth, and one random-subset draw, per forward, so every process counts the same draws
    (`RecurrentDepthMixin`)."""
    random_mode = deep_supervision_mode(head.config) == "random"
    random_subset = labels is not None and head.training and random_mode
    first_draw = backbone.iteration_draws
    requested = backbone_inputs.get("num_iterations")
    num_iterations = backbone._num_iterations(requested)
    if random_subset and requested is not None:
        backbone.iteration_draws += (
            1  # the backbone drew nothing for a per-call T: one draw per forward still
        )
    return random_subset, first_draw, num_iterations


def _halting_step(
    head: PreTrainedModel,
    backbone: nn.Module,
    step_inputs: dict,
    step_outputs: ModelOutput,
    step_logits: torch.Tensor,
    step_labels: torch.Tensor | None,
    active: torch.Tensor | None,
    batch: int,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None]:
    """The halting head after one outer step run on the samples `active` (None: all): the halting probability of
    every sample `(B,)` (NaN for those that did not run) and, with labels, its BCE loss on `halting_targets`.

    The BCE is per sample. Without `num_items_in_batch` the loss is its mean over the batch. With it, each sample's
    BCE weighs as many items as the sample has labels ≠ −100 (the items `Trainer` counts), and the weighted sum is
    divided by `num_items_in_batch`, so the micro-batches of a gradient-accumulation window add up to the whole
    batch: pooled heads give every sample one item (the mean over the window's samples), per-token heads weigh a
    sample by its supervised tokens (a Sudoku board by its blank cells)."""
    mask = step_inputs.get("attention_mask")
    pooled = backbone._pool(step_outputs.last_hidden_state, None if mask is None else mask.bool())
    halting_logits = head.halting_classifier(head.layernorm(pooled)).squeeze(-1)  # (A,)
    probability = torch.full((batch,), float("nan"), device=halting_logits.device)
    index = slice(None) if active is None else active
    probability[index] = halting_logits.detach().float().sigmoid()
    if step_labels is None:
        return probability, None
    target = halting_targets(head, step_logits, step_labels)
    if num_items_in_batch is None:
        return probability, F.binary_cross_entropy_with_logits(halting_logits.float(), target.float())
    labels = step_labels.to(halting_logits.device)
    items = (labels.reshape(len(labels), -1) != -100).sum(-1)  # (A,): (A, ...) → (A, N·...) → (A,)
    per_sample = F.binary_cross_entropy_with_logits(halting_logits.float(), target.float(), reduction="none")
    if isinstance(num_items_in_batch, torch.Tensor):
        num_items_in_batch = num_items_in_batch.to(per_sample.device)
    return probability, (per_sample * items).sum() / num_items_in_batch


def _step_fields(
    steps: int,
    has_halting_head: bool,
    used: torch.Tensor | None,
    probabilities: list[torch.Tensor],
    batch: int,
) -> dict[str, torch.Tensor | None]:
    """The output fields of the outer steps: `supervision_steps_used` `(B,)` and `halting_probabilities` `(B, S)`,
    None with S = 1 and no halting head."""
    fields = {"supervision_steps_used": None, "halting_probabilities": None}
    if steps > 1 or has_halting_head:
        fields["supervision_steps_used"] = used
    if probabilities:
        missing = steps - len(probabilities)  # a batch that stopped early entirely
        nan = torch.full((batch,), float("nan"), device=probabilities[0].device)
        fields["halting_probabilities"] = torch.stack([*probabilities, *([nan] * missing)], dim=1)
    return fields


def _merge_step(merged: ModelOutput | None, step: ModelOutput, active: torch.Tensor | None) -> ModelOutput:
    """The backbone output of the steps so far, `merged`, with `step` (run on the samples `active`, None: all)
    folded in: states and maps appended (the step's starting state is the last one kept), iterations summed, the
    last state, pooled token, energies and final energy replaced where the step ran."""
    if merged is None:
        return step
    values = {}
    for name, value in step.items():
        previous = getattr(merged, name, None)
        if name in ("hidden_states", "attentions"):  # only without early stopping: whole batches
            if name == "hidden_states":
                value = value[1:]
            value = (*previous, *value) if previous is not None else value
        elif name == "iterations_used":
            value = previous.index_add(0, active, value) if active is not None else previous + value
        elif active is not None and isinstance(value, torch.Tensor):
            value = previous.index_copy(0, active, value)
        values[name] = value
    return type(step)(**values)


# --- test-time search: K perturbed trajectories per input, one chosen per sample ---

SEARCH_SELECTORS: tuple[str, ...] = ("energy", "confidence", "sudoku")


def check_search_arguments(
    trajectories: int, noise: float, seed: int | None, selector: str, has_energy: bool
) -> None:
    """A `ValueError` naming the argument, its value and what is allowed, before any work."""
    if not _is_integer(trajectories) or trajectories < 1:
        raise ValueError(f"search_trajectories must be an integer >= 1 (1: no search); got {trajectories!r}.")
    if (
        isinstance(noise, bool)
        or not isinstance(noise, (int, float))
        or not math.isfinite(noise)
        or noise < 0
    ):
        raise ValueError(f"search_noise must be a finite number >= 0; got {noise!r}.")
    if seed is not None and (not _is_integer(seed) or not 0 <= seed < 2**63):
        raise ValueError(f"search_seed must be None or an integer in [0, 2**63); got {seed!r}.")
    if selector not in SEARCH_SELECTORS:
        raise ValueError(f"search_selector must be one of {list(SEARCH_SELECTORS)}; got {selector!r}.")
    if selector == "energy" and not has_energy:
        raise ValueError(
            "search_selector='energy' needs a model with an energy (Hyper-SET); this model has none: use "
            "search_selector='confidence' (or 'sudoku', which falls back to confidence here)."
        )


def sudoku_boards_valid(input_ids: torch.Tensor, logits: torch.Tensor) -> torch.Tensor:
    """`(B,)` bool: the board of given digits (`input_ids` 1-9, 0 = blank) and predicted digits on the blanks
    (`logits` `(B, 81, 9)`, class k = digit k + 1) has every row, column and box
    a permutation of 1-9. The givens are kept, so a valid board is consistent with them."""
    board = torch.where(input_ids > 0, input_ids.long(), logits.argmax(-1) + 1).view(-1, 9, 9)  # (B, 9, 9)
    boxes = board.view(-1, 3, 3, 3, 3).transpose(2, 3).reshape(-1, 9, 9)  # (B, box, cell of the box)
    groups = torch.cat([board, board.transpose(1, 2), boxes], dim=1)  # (B, 27, 9): rows, columns, boxes
    counts = F.one_hot(groups - 1, 9).sum(-2)  # (B, 27, 9): how often each digit occurs in each group
    return (counts == 1).flatten(1).all(-1)  # (B, 27, 9) → (B, 243) → (B,)


def _check_sudoku(head: PreTrainedModel, backbone_inputs: dict) -> torch.Tensor:
    """The `input_ids` of a Sudoku batch, or a `ValueError` saying why this call is none."""
    input_ids = backbone_inputs.get("input_ids")
    ok = (
        head._per_token
        and head.config.num_labels == 9
        and input_ids is not None
        and input_ids.ndim == 2
        and input_ids.shape[1] == 81
        and (not input_ids.numel() or (0 <= int(input_ids.min()) and int(input_ids.max()) <= 9))
    )
    if not ok:
        shape = None if input_ids is None else tuple(input_ids.shape)
        raise ValueError(
            "search_selector='sudoku' needs a Sudoku token-classification call: a ForTokenClassification head "
            "with num_labels=9 (class k = digit k + 1) and input_ids of shape (batch, 81) with 0 = blank and 1-9 "
            f"= given digits; got {type(head).__name__}, num_labels={head.config.num_labels}, "
            f"input_ids shape {shape}."
        )
    return input_ids


def confidences(
    head: PreTrainedModel, logits: torch.Tensor, attention_mask: torch.Tensor | None
) -> torch.Tensor:
    """`(B,)` mean over the real tokens (per-token heads) of the highest softmax probability, or the sample's."""
    top = logits.float().softmax(-1).amax(-1)  # (B, N) or (B,)
    if not head._per_token:
        return top
    return masked_mean(top, None if attention_mask is None else attention_mask.bool())


def _pick(value: object, chosen: torch.Tensor, trajectories: int) -> object:
    """`value` with a leading `B·K` axis (trajectory k of sample b at b·K + k) reduced to the chosen trajectory of
    every sample; tuples element-wise, `ModelOutput`s field-wise, anything else as it is."""
    if isinstance(value, torch.Tensor):
        grouped = value.view(-1, trajectories, *value.shape[1:])  # (B, K, ...)
        index = chosen.to(value.device).view(-1, 1, *([1] * (value.ndim - 1)))  # (B, 1, 1, ...)
        return grouped.gather(1, index.expand(-1, 1, *value.shape[1:])).squeeze(1)
    if isinstance(value, tuple):
        return tuple(_pick(item, chosen, trajectories) for item in value)
    if isinstance(value, ModelOutput):
        return type(value)(**{name: _pick(item, chosen, trajectories) for name, item in value.items()})
    return value


def _noise_block(embeddings: HyperSetEmbeddings) -> int:
    """How many token positions one draw of search noise covers: the tokens of an image of the configured size (CLS
    and patches) or `max_position_embeddings` (what bounds a sequence), a length that no batch's padding changes."""
    if embeddings.config.input_type == "image":
        return embeddings.num_prefix_tokens + embeddings.grid[0] * embeddings.grid[1]
    return embeddings.config.max_position_embeddings


def _search_noise(
    seed: int, trajectories: int, length: int, hidden: int, block: int, device: torch.device
) -> torch.Tensor:
    """ε `(K, N, d)` float32 of test-time search; trajectory 0 (the plain start) is zero. Trajectory k ≥ 1 draws from a
    generator of its own, seeded by the k-th draw of a CPU generator seeded by `seed`, in blocks of `block`
    positions, so ε[k, n] depends only on the seed, k, n and d (and the device's generator): not on K, nor on
    N beyond n (images larger than configured take more blocks, the earlier ones unchanged)."""
    seeds = torch.Generator().manual_seed(seed)
    noise = [torch.zeros(length, hidden, device=device, dtype=torch.float32)]  # not the default dtype
    for _ in range(1, trajectories):
        generator = torch.Generator(device)
        # one draw per trajectory, so adding trajectories leaves the earlier ones' seeds as they were
        generator.manual_seed(int(torch.randint(0, 2**62, (1,), generator=seeds)))
        blocks = [
            torch.randn((block, hidden), generator=generator, device=device, dtype=torch.float32)
            for _ in range(-(-length // block))
        ]
        noise.append(torch.cat(blocks)[:length])
    return torch.stack(noise)


def classify_with_search(
    head: PreTrainedModel,
    backbone: nn.Module,
    labels: torch.Tensor | None,
    backbone_inputs: dict,
    trajectories: int,
    noise: float,
    seed: int | None,
    selector: str,
    halting_threshold: float | None = None,
    num_items_in_batch: torch.Tensor | int | None = None,
) -> tuple[ModelOutput, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor | None]]:
    """Test-time search (eval mode): `trajectories` K runs of every input in one batched forward of K·B, each from
    its own start x₀ + σ·rms(x₀)·ε (ε ~ N(0, I) per token and channel, σ = `noise`, rms over each token's channels;
    trajectory 0 starts from x₀ itself), one kept per sample by `selector`. ε of trajectory k at token n is the same
    for every sample of the batch and depends only on `seed`, k, n and the hidden size (`_search_noise`), so a
    sample's search is independent of its batch mates, its row and the batch's padding:

    * `"energy"`: the lowest final energy Σ_layers E_ATTN + E_FF (Hyper-SET's `final_energy`);
    * `"confidence"`: the highest mean max-softmax probability (over the real tokens of per-token heads);
    * `"sudoku"`: among the trajectories whose board is valid (`sudoku_boards_valid`), the lowest energy (the
      looped baseline: the highest confidence); with no valid board, the lowest energy (highest confidence) of all.

    Ties go to the lowest index (so trajectory 0, the unperturbed start, wins a tie). Returns what
    `classify_with_deep_supervision` does for the chosen trajectories, the loss that of the chosen logits, and the
    fields `search_chosen` `(B,)`, `search_energies` `(B, K)` (Hyper-SET; None for the baseline),
    `search_confidences` `(B, K)` and `search_valid_boards` `(B, K)` (selector `"sudoku"`).
    """
    has_energy = backbone.has_energy
    check_search_arguments(trajectories, noise, seed, selector, has_energy)
    trajectories = int(trajectories)  # a numpy integer too (`_is_integer`)
    if head.training:
        raise ValueError(
            f"search_trajectories={trajectories} is test-time search: call model.eval() first (training runs one "
            "trajectory per input)."
        )
    sudoku_ids = _check_sudoku(head, backbone_inputs) if selector == "sudoku" else None
    repeated = {
        name: value.repeat_interleave(trajectories, dim=0)
        if name in _BATCH_INPUTS and isinstance(value, torch.Tensor)
        else value
        for name, value in backbone_inputs.items()
    }  # (B·K, ...): trajectory k of sample b at b·K + k
    embedded, keep = backbone.embeddings(
        pixel_values=repeated.get("pixel_values"),
        input_ids=repeated.get("input_ids"),
        attention_mask=repeated.get("attention_mask"),
        inputs_embeds=repeated.get("inputs_embeds"),
        interpolate_pos_encoding=bool(repeated.get("interpolate_pos_encoding")),
        position_ids=repeated.get("position_ids"),
    )
    start = embedded
    if noise > 0 and trajectories > 1:
        seed = int(torch.randint(0, 2**62, (1,))) if seed is None else int(seed)
        length, hidden = embedded.shape[1:]
        epsilon = _search_noise(
            seed, trajectories, length, hidden, _noise_block(backbone.embeddings), embedded.device
        )
        # (K, N, d) → (B·K, N, d), row b·K + k: every sample's trajectory k gets the same ε, so a sample's answer
        # does not depend on its batch mates, its row or how far the batch is padded
        epsilon = epsilon.repeat(embedded.shape[0] // trajectories, 1, 1)
        scale = embedded.detach().float().pow(2).mean(-1, keepdim=True).sqrt()  # (B·K, N, 1) per-token rms
        if keep is not None:
            scale = scale * keep[..., None]  # padded tokens stay as embedded
        start = embedded + (noise * scale * epsilon).to(embedded.dtype)
    repeated["initial_state"] = start
    if has_energy:
        repeated["output_final_energy"] = True
    outputs, logits, _, fields = classify_with_deep_supervision(
        head, backbone, None, repeated, halting_threshold
    )
    batch = logits.shape[0] // trajectories
    # (B·K,) → (B, K), energies and confidences: trajectory k of sample b at b·K + k
    energies = None if not has_energy else outputs.final_energy.view(batch, trajectories)
    confidence = confidences(head, logits.detach(), repeated.get("attention_mask")).view(batch, trajectories)
    # the score each trajectory is ranked by, lower is better: its energy, or minus its confidence
    score = -confidence if selector == "confidence" or energies is None else energies.float()
    valid = None
    if sudoku_ids is not None:
        valid = sudoku_boards_valid(repeated["input_ids"], logits).view(batch, trajectories)  # (B, K)
        # any valid board beats every invalid one; a sample without one ranks all its trajectories by the score
        score = torch.where(valid | ~valid.any(-1, keepdim=True), score, math.inf)
    chosen = score.argmin(-1)  # (B,); the first of equal minima
    outputs = _pick(outputs, chosen, trajectories)
    logits = _pick(logits, chosen, trajectories)
    fields = {name: _pick(value, chosen, trajectories) for name, value in fields.items()}
    loss = None if labels is None else head_loss(head, logits, labels, num_items_in_batch, head._per_token)
    fields.update(
        search_chosen=chosen,
        search_energies=energies,
        search_confidences=confidence,
        search_valid_boards=valid,
    )
    return outputs, logits, loss, fields


def refuse_search_without_trajectories(given: dict[str, object]) -> None:
    """A ValueError for search arguments (`given`: the non-None ones) of a call without `search_trajectories`."""
    if given:
        raise ValueError(
            f"{', '.join(f'{k}={v!r}' for k, v in given.items())} given without search_trajectories; pass "
            "search_trajectories=K (an integer >= 1) to run test-time search."
        )


def _position_ids_per_sample(backbone_inputs: dict) -> dict:
    """`backbone_inputs` with `position_ids` of shape `(1, N)` (one row for every sample, which the embeddings take
    as BERT's do) expanded to `(B, N)`: the outer steps and test-time search take the batch inputs apart row by
    row (`_BATCH_INPUTS`). Any other shape is left to the embeddings' check, which names it."""
    position_ids = backbone_inputs.get("position_ids")
    tokens = backbone_inputs.get("input_ids")
    tokens = backbone_inputs.get("inputs_embeds") if tokens is None else tokens
    if not isinstance(position_ids, torch.Tensor) or not isinstance(tokens, torch.Tensor) or tokens.ndim < 2:
        return backbone_inputs
    if tuple(position_ids.shape) != (1, tokens.shape[1]):
        return backbone_inputs
    return {**backbone_inputs, "position_ids": position_ids.expand(tokens.shape[0], -1)}


def run_head(
    head: PreTrainedModel,
    backbone: nn.Module,
    labels: torch.Tensor | None,
    backbone_inputs: dict,
    *,
    num_items_in_batch: torch.Tensor | int | None = None,
    halting_threshold: float | None = None,
    search_trajectories: int | None = None,
    search_noise: float | None = None,
    search_seed: int | None = None,
    search_selector: str | None = None,
) -> tuple[ModelOutput, torch.Tensor, torch.Tensor | None, dict[str, torch.Tensor | None]]:
    """A head's call: test-time search when `search_trajectories` is given (`classify_with_search`; the selector
    defaults to `"energy"` for Hyper-SET, `"confidence"` for the baseline, which has no energy), else the outer
    steps (`classify_with_deep_supervision`). The search arguments without `search_trajectories` are an error."""
    backbone_inputs = _position_ids_per_sample(backbone_inputs)
    if search_trajectories is None:
        given = {
            name: value
            for name, value in (
                ("search_noise", search_noise),
                ("search_seed", search_seed),
                ("search_selector", search_selector),
            )
            if value is not None
        }
        refuse_search_without_trajectories(given)
        return classify_with_deep_supervision(
            head, backbone, labels, backbone_inputs, halting_threshold, num_items_in_batch
        )
    if search_selector is None:
        search_selector = "energy" if backbone.has_energy else "confidence"
    return classify_with_search(
        head,
        backbone,
        labels,
        backbone_inputs,
        search_trajectories,
        0.0 if search_noise is None else search_noise,
        search_seed,
        search_selector,
        halting_threshold,
        num_items_in_batch,
    )


def head_output(
    head: PreTrainedModel,
    outputs: ModelOutput,
    logits: torch.Tensor,
    loss: torch.Tensor | None,
    return_dict: bool,
    **fields: object,
) -> ModelOutput | tuple:
    """A head's output: its `_output_class` with `loss`, `logits`, the backbone `outputs`' hidden states, maps and
    the fields the head names in `_backbone_output_fields`, plus `fields`; a tuple unless `return_dict`."""
    output = head._output_class(
        loss=loss,
        logits=logits,
        hidden_states=outputs.hidden_states,
        attentions=outputs.attentions,
        **{name: getattr(outputs, name) for name in head._backbone_output_fields},
        **fields,
    )
    return output if return_dict else output.to_tuple()


class RecurrentDepthHeadMixin:
    """`classify` of the classification heads of Hyper-SET and of the looped baseline: a head sets the
    input type it takes, whether it classifies every token, its output class and the backbone output fields it
    passes on; its `forward` has the signature of its input type and hands everything to `classify`."""

    _input_type = "image"
    _per_token = False
    _output_class: type[ModelOutput]
    _backbone_output_fields: tuple[str, ...] = ()
    # `Trainer` passes `num_items_in_batch` (forward takes it by name, not through **kwargs, so a misspelt argument
    # stays an error) and leaves the gradient-accumulation scaling to the loss
    accepts_loss_kwargs = True

    def classify(
        self,
        labels: torch.Tensor | None,
        return_dict: bool | None,
        *,
        num_items_in_batch: torch.Tensor | int | None = None,
        halting_threshold: float | None = None,
        search_trajectories: int | None = None,
        search_noise: float | None = None,
        search_seed: int | None = None,
        search_selector: str | None = None,
        **backbone_inputs: object,
    ) -> ModelOutput | tuple:
        """The backbone on `backbone_inputs`, the classifier on its pooled token (or every token), the loss of
        `labels` by `config.problem_type` (transformers' `loss_function` for this head's class name), over
        `config.supervision_steps` outer steps (`classify_with_deep_supervision`: deep supervision, the detached
        carry, the halting head), or test-time search over `search_trajectories` starts (`classify_with_search`).

        Output fields besides transformers': `supervision_steps_used` `(B,)` (outer steps each sample ran) and
        `halting_probabilities` `(B, S)` (NaN: a step not run), with S > 1 or a halting head; `search_chosen`
        `(B,)`, `search_energies` `(B, K)`, `search_confidences` `(B, K)` and `search_valid_boards` `(B, K)` with
        test-time search.
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs, logits, loss, fields = run_head(
            self,
            getattr(self, self.base_model_prefix),
            labels,
            backbone_inputs,
            num_items_in_batch=num_items_in_batch,
            halting_threshold=halting_threshold,
            search_trajectories=search_trajectories,
            search_noise=search_noise,
            search_seed=search_seed,
            search_selector=search_selector,
        )
        return head_output(self, outputs, logits, loss, return_dict, **fields)

    def check_call_arguments(self, **arguments: object) -> None:
        """A ValueError for a bad depth, halting or search argument among `arguments` (what a call would pass;
        others are ignored), as the forward raises it, without running the model: what the pipelines check when
        they are built."""
        backbone = getattr(self, self.base_model_prefix)
        has_energy = backbone.has_energy  # the baseline has no energy and no halting tolerance
        if arguments.get("num_iterations") is not None:
            backbone._num_iterations(arguments["num_iterations"])
        if has_energy:
            backbone._halting(arguments.get("halting_tolerance"), arguments.get("halting_criterion"))
        if arguments.get("halting_threshold") is not None:
            _check_outer_steps_call(self, {}, arguments["halting_threshold"])
        noise, seed, selector = (arguments.get(f"search_{name}") for name in ("noise", "seed", "selector"))
        trajectories = arguments.get("search_trajectories")
        if trajectories is None:
            given = {"search_noise": noise, "search_seed": seed, "search_selector": selector}
            refuse_search_without_trajectories(
                {name: value for name, value in given.items() if value is not None}
            )
            return
        selector = ("energy" if has_energy else "confidence") if selector is None else selector
        check_search_arguments(trajectories, 0.0 if noise is None else noise, seed, selector, has_energy)

    def _build_head(self, config: PreTrainedConfig) -> None:
        """The modules after the backbone, one structure for both models so a side-by-side pair differs in the trunk
        only: the classifier norm (`classifier_norm`) → Linear (bias: `classifier_bias`; `nn.Identity()` when
        num_labels == 0), and the halting classifier of the supervision steps (`config.halting_head`)."""
        self.layernorm = classifier_norm_layer(config)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels, bias=config.classifier_bias)
            if config.num_labels > 0
            else nn.Identity()
        )
        # "is this step's answer complete and correct?" on the normed pooled state
        self.halting_classifier = nn.Linear(config.hidden_size, 1) if config.halting_head else None


def classifier_norm_layer(config: HyperSetConfig) -> nn.Module:
    """The norm before the classifier: LayerNorm (the paper's image models) or RMSNorm (their Sudoku model)."""
    if config.classifier_norm == "rmsnorm":
        return HyperSetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
    return nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)


class HyperSetHead(RecurrentDepthHeadMixin, HyperSetPreTrainedModel):
    """The base of Hyper-SET's heads: backbone → LayerNorm (or RMSNorm) → Linear (`nn.Identity()` when
    num_labels == 0; paper: a norm, then a linear head), on the pooled token or, per token, on every token.

    A head sets what `RecurrentDepthHeadMixin` reads; its `forward` hands everything to `classify`.
    """

    _output_class: type[ModelOutput] = HyperSetImageClassifierOutput
    _backbone_output_fields = ("energies", "iterations_used")

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        check_head_input_type(self, config.input_type, self._input_type)
        self.hyperset = HyperSetModel(config)
        self._build_head(config)
        self.post_init()


class HyperSetForImageClassification(HyperSetHead):
    """Classifies the pooled (CLS) token of an image."""

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        backprop_iterations: int | None = None,
        halting_tolerance: float | None = None,
        halting_criterion: str | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
        halting_threshold: float | None = None,
        search_trajectories: int | None = None,
        search_noise: float | None = None,
        search_seed: int | None = None,
        search_selector: str | None = None,
        interpolate_pos_encoding: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> HyperSetImageClassifierOutput | tuple:
        r"""
        halting_threshold (`float`, *optional*):
            With `config.halting_head` and `supervision_steps` > 1, in eval mode: a sample stops after the first
            outer step whose halting probability exceeds this (in (0, 1); default 0.5).
        search_trajectories (`int`, *optional*):
            K: test-time search over K trajectories per input from perturbed starts, in one batched forward of
            K·B (eval mode), the one `search_selector` prefers kept per input. None: no search.
        search_noise (`float`, *optional*):
            σ ≥ 0: trajectory k > 0 starts from x₀ + σ·rms(x₀)·ε, ε ~ N(0, I); trajectory 0 from x₀ (default 0).
        search_seed (`int`, *optional*):
            Seed of ε (None: drawn from torch's global generator).
        search_selector (`str`, *optional*):
            `"energy"` (default: the lowest final E_ATTN + E_FF), `"confidence"` or `"sudoku"` (a valid board,
            else the lowest energy).
        interpolate_pos_encoding (`bool`, *optional*):
            Resample the position table bicubically to the patch grid of the input (another
            resolution, a multiple of `patch_size`), the CLS position unchanged, as ViT's argument. Without it an
            input of another size than `config.image_size` is refused.
        num_items_in_batch (`torch.Tensor` or `int`, *optional*):
            What `Trainer` passes: the number of labels ≠ −100 over the whole gradient-accumulation window (and the
            processes, with `average_tokens_across_devices`). Every loss is then summed and divided by it, so the
            micro-batches' losses add up to the whole batch's. None: the mean over this batch.
        """
        return self.classify(
            labels,
            return_dict,
            num_items_in_batch=num_items_in_batch,
            halting_threshold=halting_threshold,
            search_trajectories=search_trajectories,
            search_noise=search_noise,
            search_seed=search_seed,
            search_selector=search_selector,
            pixel_values=pixel_values,
            num_iterations=num_iterations,
            backprop_iterations=backprop_iterations,
            halting_tolerance=halting_tolerance,
            halting_criterion=halting_criterion,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
            interpolate_pos_encoding=interpolate_pos_encoding,
        )


class HyperSetSequenceHead(HyperSetHead):
    """The `forward` of the sequence heads (token ids first)."""

    main_input_name = "input_ids"
    _input_type = "sequence"

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        backprop_iterations: int | None = None,
        halting_tolerance: float | None = None,
        halting_criterion: str | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
        halting_threshold: float | None = None,
        search_trajectories: int | None = None,
        search_noise: float | None = None,
        search_seed: int | None = None,
        search_selector: str | None = None,
        position_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> HyperSetSequenceClassifierOutput | HyperSetTokenClassifierOutput | tuple:
        r"""
        The depth arguments, `halting_threshold`, the `search_*` arguments of test-time search and
        `num_items_in_batch` are those of `HyperSetForImageClassification.forward`; `position_ids` is that of
        `HyperSetModel.forward`.
        """
        return self.classify(
            labels,
            return_dict,
            num_items_in_batch=num_items_in_batch,
            halting_threshold=halting_threshold,
            search_trajectories=search_trajectories,
            search_noise=search_noise,
            search_seed=search_seed,
            search_selector=search_selector,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            position_ids=position_ids,
            num_iterations=num_iterations,
            backprop_iterations=backprop_iterations,
            halting_tolerance=halting_tolerance,
            halting_criterion=halting_criterion,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
        )


class HyperSetForSequenceClassification(HyperSetSequenceHead):
    """Classifies the pooled token of a sequence (first token or masked mean)."""

    _output_class = HyperSetSequenceClassifierOutput


class HyperSetForTokenClassification(HyperSetSequenceHead):
    """Classifies every token (e.g. Sudoku cells: label −100 on givens)."""

    _per_token = True
    _output_class = HyperSetTokenClassifierOutput


# --- masked image modelling ---
# MaskGIT's schedules (Chang et al. 2022, as `valeoai/Maskgit-pytorch` computes them, the code the authors' MIM
# model follows): the weight w(r) of each decoding step, r running from 1 to 0 over the steps; step s unmasks a share
# w_s / Σ w of the masked tokens. Every schedule starts near 0, so the first steps fix few tokens.
MASKGIT_SCHEDULES: dict[str, Callable[[torch.Tensor], torch.Tensor]] = {
    "arccos": lambda r: torch.arccos(r) / (math.pi / 2),
    "linear": lambda r: 1 - r,
    "cosine": lambda r: torch.cos(r * math.pi / 2),
    "square": lambda r: 1 - r**2,
    "root": lambda r: 1 - r.sqrt(),
}


def maskgit_schedule(num_masked: torch.Tensor, steps: int, schedule: str = "arccos") -> torch.Tensor:
    """Tokens to unmask at each step, `(B, steps)` long, for `num_masked` `(B,)` masked tokens per sample.

    As MaskGIT's code for a whole grid, applied to each sample's own count M: round(M · w_s / Σ w) per step, at least
    1, the last step taking what is left; a step never unmasks more than is still masked (so a sample may finish
    before the last step). A sample with M = 0 unmasks nothing.
    """
    if schedule not in MASKGIT_SCHEDULES:
        raise ValueError(f"schedule must be one of {sorted(MASKGIT_SCHEDULES)}; got {schedule!r}.")
    # on the counts' device: a CPU weight vector times device counts is a device mismatch on a GPU
    weights = MASKGIT_SCHEDULES[schedule](
        torch.linspace(1, 0, steps, dtype=torch.float64, device=num_masked.device)
    )
    masked = num_masked.to(torch.float64)[:, None]
    # one step has the weight w(1) = 0 of every schedule: the guarded sum gives it everything (not 0/0 = NaN)
    counts = (weights / weights.sum().clamp_min(1e-12) * masked).round().clamp_min(1)  # (B, S)
    counts[:, -1] += masked[:, 0] - counts.sum(-1)
    counts = counts.clamp_min(0).long()
    # what is still masked before each step caps that step (MaskGIT: `if mask.sum() < t: t = mask.sum()`)
    before = num_masked[:, None] - torch.cat(
        [counts.new_zeros(len(counts), 1), counts.cumsum(-1)[:, :-1]], -1
    )
    return torch.minimum(counts, before.clamp_min(0))


def check_masked_image_modeling_head(head: nn.Module, config: PreTrainedConfig) -> None:
    """The checks of a masked-image-modelling head's config: sequence input, a last-iteration head (no deep
    supervision, supervision steps or halting head), and a vocabulary of codes plus [MASK]."""
    check_head_input_type(head, config.input_type, "sequence")
    check_last_iteration_head(head, config)
    if config.vocab_size < 2:
        raise ValueError(
            f"{type(head).__name__} needs vocab_size = codebook size + 1 (the last id is [MASK]) >= 2; got "
            f"vocab_size={config.vocab_size}."
        )


class MaskedImageModelingMixin:
    """What the masked-image-modelling heads of Hyper-SET and of the looped baseline share: the modules after the
    backbone, the `forward` (`predict_codes`), K and [MASK], the masked cross-entropy and MaskGIT decoding — one
    implementation for both models of a side-by-side run. A head sets its output class and the backbone output
    fields it passes on, builds its backbone under `base_model_prefix`, then calls `_build_code_head`."""

    code_head: nn.Linear
    _output_class: type[MaskedLMOutput]
    _backbone_output_fields: tuple[str, ...] = ()
    accepts_loss_kwargs = True  # `num_items_in_batch`, as `RecurrentDepthHeadMixin`'s

    def _build_code_head(self, config: PreTrainedConfig) -> None:
        """The modules after the backbone: the classifier norm (`classifier_norm`) → Linear(d, K) (bias:
        `classifier_bias`)."""
        self.layernorm = classifier_norm_layer(config)
        # K = vocab_size − 1 outputs: [MASK] is an input id only, never a prediction. Its own name (not the
        # classification heads' `classifier`, not `lm_head`, which transformers resizes with the vocabulary): a
        # classifier checkpoint loads its backbone here with a fresh code head, as into any other head
        self.code_head = nn.Linear(config.hidden_size, config.vocab_size - 1, bias=config.classifier_bias)

    def predict_codes(
        self,
        labels: torch.Tensor | None,
        return_dict: bool | None,
        num_items_in_batch: torch.Tensor | int | None = None,
        **backbone_inputs: object,
    ) -> MaskedLMOutput | tuple:
        """The backbone on `backbone_inputs`, logits `(B, N, K)` over the codes at every position, and the masked
        cross-entropy of `labels` (`_masked_loss`): what each head's `forward` hands over, as the classification
        heads' `classify`."""
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = getattr(self, self.base_model_prefix)(**backbone_inputs, return_dict=True)
        logits = self.code_head(self.layernorm(outputs.last_hidden_state))  # (B, N, K)
        loss = None if labels is None else self._masked_loss(logits, labels, num_items_in_batch)
        return head_output(self, outputs, logits, loss, return_dict)

    @property
    def codebook_size(self) -> int:
        """K, the number of codes the head predicts; K is also the id of [MASK]."""
        return self.code_head.out_features

    @property
    def mask_token_id(self) -> int:
        """The id of [MASK] in `input_ids`: K, one past the last code."""
        return self.codebook_size

    @torch.no_grad()
    def decode(
        self,
        input_ids: torch.Tensor,
        steps: int = 24,
        schedule: str = "arccos",
        temperature: float = 1.0,
        randomize_temperature: float = 4.5,
        generator: torch.Generator | None = None,
        seed: int | None = None,
        num_iterations: int | None = None,
    ) -> MaskGITDecoderOutput:
        """MaskGIT iterative decoding: fill every [MASK] of `input_ids` `(B, N)` in `steps` forward passes.

        At each step the model predicts every position; a code is sampled at each masked position from
        softmax(logits / `temperature`); its confidence log p + g·(1 − s/S), g Gumbel noise of scale
        `randomize_temperature` (0: no noise), ranks the masked positions, and the most
        confident ones are kept, as many as `schedule` (`maskgit_schedule`) gives for this step; the rest stay
        masked. Known codes are never changed. Seeded by `generator`, else by `seed`, else by a draw from torch's
        global generator: the same seed gives the same codes. Runs the model as it is (call `eval()` first), on its
        device, or a dispatched one (`device_map`) on the device of `input_ids`.

        Defaults: 24 `steps`, the decoding steps the authors evaluate reconstruction with; `randomize_temperature`
        4.5, the `r_temp` of the authors' MIM config; `temperature` 1 and the `"arccos"` schedule, MaskGIT's.
        """
        if not _is_integer(steps) or steps < 1:
            raise ValueError(f"steps must be an integer >= 1; got {steps!r}.")
        steps = int(steps)
        if schedule not in MASKGIT_SCHEDULES:
            raise ValueError(f"schedule must be one of {sorted(MASKGIT_SCHEDULES)}; got {schedule!r}.")
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float)) or not temperature > 0:
            raise ValueError(f"temperature must be a number > 0; got {temperature!r}.")
        if (
            isinstance(randomize_temperature, bool)
            or not isinstance(randomize_temperature, (int, float))
            or not randomize_temperature >= 0
        ):
            raise ValueError(f"randomize_temperature must be a number >= 0; got {randomize_temperature!r}.")
        # torch.Generator.manual_seed would take -1 as 2**64 - 1 (another seed's codes) and name no argument
        if seed is not None and (not _is_integer(seed) or not 0 <= seed < 2**63):
            raise ValueError(f"seed must be None or an integer in [0, 2**63); got {seed!r}.")
        if generator is not None and not isinstance(generator, torch.Generator):
            raise ValueError(f"generator must be None or a torch.Generator; got {type(generator).__name__}.")
        if (
            not isinstance(input_ids, torch.Tensor)
            or input_ids.ndim != 2
            or input_ids.dtype.is_floating_point
        ):
            raise ValueError(
                "input_ids must be integer codes of shape (batch, num_positions); got "
                f"{getattr(input_ids, 'shape', type(input_ids))}."
            )
        mask_id = self.mask_token_id
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) > mask_id):
            raise ValueError(
                f"input_ids must be codes in [0, {mask_id}) or [MASK] = {mask_id}; got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]."
            )
        # a dispatched model (`is_dispatched`) may hold its head on meta (offloaded) or on another device than its
        # first layer: it decodes on the inputs' device, which its hooks move each module's inputs from and return
        # the logits to; an undispatched one on its own device, whatever the ids' device
        device = input_ids.device if is_dispatched(self) else self.device
        if generator is None:
            seed = int(torch.randint(0, 2**62, (1,))) if seed is None else int(seed)
            generator = torch.Generator(device).manual_seed(seed)
        codes = input_ids.to(device).clone()
        masked = codes == mask_id
        counts = maskgit_schedule(masked.sum(-1), steps, schedule).to(device)  # (B, S)
        sequences, unmasked_steps, confidence_steps = [codes.clone()], [], []
        for step in range(steps):
            logits = self(input_ids=codes, num_iterations=num_iterations, return_dict=True).logits
            probs = (logits.float() / temperature).softmax(-1)  # (B, N, K)
            # (B·N, K) → (B·N, 1) → (B, N): one code per position
            sampled = torch.multinomial(probs.flatten(0, 1), 1, generator=generator).view(codes.shape)
            confidence = probs.gather(-1, sampled[..., None]).squeeze(-1)  # (B, N)
            uniform = torch.rand(codes.shape, generator=generator, device=device, dtype=probs.dtype)  # (B, N)
            # our clamp: u in [tiny, 1 − 1e-7] keeps both logarithms finite (u = 0 or 1 would give ±inf noise)
            gumbel = -torch.log(-torch.log(uniform.clamp(torch.finfo(probs.dtype).tiny, 1 - 1e-7)))  # (B, N)
            noisy = confidence.clamp_min(torch.finfo(probs.dtype).tiny).log()
            noisy = noisy + randomize_temperature * (1 - step / steps) * gumbel
            noisy = noisy.masked_fill(~masked, float("-inf"))  # known codes are not candidates
            # rank of every position by noisy confidence (0: most confident); keep the first counts[:, step]
            order = noisy.argsort(dim=-1, descending=True, stable=True)
            rank = torch.empty_like(order).scatter_(
                -1, order, torch.arange(order.shape[-1], device=device).expand_as(order)
            )
            keep = masked & (rank < counts[:, step : step + 1])
            codes = torch.where(keep, sampled, codes)
            confidence_steps.append(torch.where(masked, confidence, 0.0))
            masked = masked & ~keep
            sequences.append(codes.clone())
            unmasked_steps.append(keep)
        return MaskGITDecoderOutput(
            codes=codes,
            sequences=torch.stack(sequences),
            unmasked=torch.stack(unmasked_steps),
            confidences=torch.stack(confidence_steps),
        )

    def _masked_loss(
        self,
        logits: torch.Tensor,
        labels: torch.Tensor,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> torch.Tensor:
        """Cross-entropy (in float32 at least) summed over the positions whose label is not −100, divided by their
        number, or by `num_items_in_batch` when given (`Trainer`'s count of those positions over a
        gradient-accumulation window, so its micro-batches' losses add up to the whole batch's)."""
        if labels.shape != logits.shape[:2]:
            raise ValueError(
                f"labels must have the shape of input_ids, {tuple(logits.shape[:2])}; got {tuple(labels.shape)}."
            )
        if not _is_tracing() and labels.numel():
            bad = (labels != -100) & ((labels < 0) | (labels >= self.codebook_size))
            if bool(bad.any()):
                raise ValueError(
                    f"labels must be codes in [0, codebook_size={self.codebook_size}) or -100 (no loss); got "
                    f"{labels[bad][0].item()}."
                )
        labels = labels.to(logits.device)
        # logits (B, N, codebook_size) → (B·N, codebook_size), labels (B, N) → (B·N,)
        losses = F.cross_entropy(
            logits.flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="none"
        )
        if num_items_in_batch is not None:
            counted = torch.as_tensor(num_items_in_batch, device=losses.device)
        else:
            counted = (labels != -100).sum()
        # a batch without masked positions has loss 0 (not the NaN of a mean over nothing)
        return losses.sum() / counted.clamp_min(1)


class HyperSetForMaskedImageModeling(MaskedImageModelingMixin, HyperSetPreTrainedModel):
    """Masked image modelling over a grid of VQ codes (the paper's third task, MaskGIT-style).

    `input_ids` `(B, N)`: codes of an image tokenizer in [0, K), K = `config.vocab_size − 1` the codebook size, and
    [MASK] = K where a code is hidden. Output: logits over the K codes for every position; `labels` `(B, N)` hold
    the true codes where the loss is taken (the masked positions) and −100 elsewhere. Structure: the sequence
    backbone, then the classifier norm and Linear(d, K); the paper's model is the preset `mim-1-12-d` /
    `mim-1-24-8d` (token embedding + fixed 2-D sin-cos positions, step sizes conditioned on x₀ by the sinusoid
    of t with no time MLP, RMSNorm → Linear head with bias).

    Unlike transformers' `BeitForMaskedImageModeling`, which reads pixels and a `bool_masked_pos` and swaps a
    learned mask vector into the patch embeddings, this head reads the codes themselves, the mask being one more
    token id, so the image tokenizer stays a separate, pluggable component (`energyformers.mim`).
    """

    main_input_name = "input_ids"
    _output_class = HyperSetMaskedImageModelingOutput
    _backbone_output_fields = ("energies", "iterations_used")

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        check_masked_image_modeling_head(self, config)
        self.hyperset = HyperSetModel(config)
        self._build_code_head(config)
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        backprop_iterations: int | None = None,
        halting_tolerance: float | None = None,
        halting_criterion: str | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> HyperSetMaskedImageModelingOutput | tuple:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The true code of every position where the loss is taken (the masked ones), −100 elsewhere; the loss is
            the mean cross-entropy over those positions (0 where there are none).
        num_items_in_batch (`torch.Tensor` or `int`, *optional*):
            What `Trainer` passes: the number of those positions over the whole gradient-accumulation window; the
            summed cross-entropy is divided by it instead (`_masked_loss`).
        """
        return self.predict_codes(
            labels,
            return_dict,
            num_items_in_batch,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            num_iterations=num_iterations,
            backprop_iterations=backprop_iterations,
            halting_tolerance=halting_tolerance,
            halting_criterion=halting_criterion,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
        )


__all__ = [
    "MASKGIT_SCHEDULES",
    "SEARCH_SELECTORS",
    "HyperSetEmbeddings",
    "HyperSetEnergies",
    "HyperSetForImageClassification",
    "HyperSetForMaskedImageModeling",
    "HyperSetForSequenceClassification",
    "HyperSetForTokenClassification",
    "HyperSetHead",
    "HyperSetMaskedImageModelingOutput",
    "HyperSetModel",
    "HyperSetModelOutput",
    "HyperSetPreTrainedModel",
    "HyperSetSequenceHead",
    "MaskGITDecoderOutput",
    "MaskedImageModelingMixin",
    "RecurrentDepthHeadMixin",
    "RecurrentDepthHeadOutput",
    "RecurrentDepthMixin",
    "classify_with_search",
    "halting_targets",
    "maskgit_schedule",
    "sudoku_boards_valid",
]
