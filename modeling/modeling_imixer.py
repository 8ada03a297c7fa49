# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""iMixer: an MLP-Mixer whose token-mixing MLP inverts a contractive residual block.

Ota, Taki, *iMixer: hierarchical Hopfield network implies an invertible, implicit and iterative
MLP-Mixer*. In the adiabatic limit the hidden layer of a hierarchical Hopfield network solves
(1 − F)(x) = G(t), so the token-mixing MLP becomes fc2(GELU((1 − F)⁻¹(fc1(t)))): the inverse of an
invertible-ResNet block F (Behrmann et al., *Invertible Residual Networks*), approximated by n
fixed-point steps x ← fc1(t) + F(x) and kept contractive by soft spectral normalisation. n = 0 is the
vanilla MLP-Mixer (Tolstikhin et al.). Everything else is timm's Mixer: patch convolution, pre-norm
blocks with token then channel mixing, final LayerNorm, mean pooling, linear classifier.

Beyond the paper's n unrolled steps with backprop, the fixed point can be solved to a tolerance (Picard or
Anderson iteration) and differentiated implicitly (the adjoint fixed point, Bai et al.'s DEQ) or with a
phantom gradient (Geng et al.), so training memory does not grow with the number of steps.
"""

from __future__ import annotations

import copy
import numbers
import os
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from transformers import PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SequenceClassifierOutput,
)
from transformers.utils import ModelOutput, logging

from ..configuration.configuration_imixer import IMixerConfig

logger = logging.get_logger(__name__)


@dataclass
class IMixerFixedPointDiagnostics(ModelOutput):
    """How the fixed-point solve x_a = x₀ + F(x_{a−1}), a = 1, 2, …, converged in this forward.

    relative_residuals / cosines / residuals: `(num_layers, steps)`, per step the batch means of
    ‖x_a − x_{a−1}‖ / ‖x_{a−1}‖, of cos(x_a, x_{a−1}) and of the paper's ‖x_a − x_{a−1}‖ / √(D·D_S) (over the
    samples still iterating; NaN after a block's last step). spectral_norms: `(num_layers, 2)`, the σ estimates
    uᵀWv of fc_sn1 and fc_sn2 that this forward normalised with (exact σ(W) without spectral normalisation).
    iterations: `(num_layers,)`, steps each block ran. final_residuals / final_relative_residuals:
    `(num_layers,)`, batch means of each sample's last residual (of the iterate it returned), in the two
    measures. lipschitz_bounds: `(num_layers,)`, s² σ(W₁) σ(W₂) (s the activation's largest slope, σ exact):
    below 1 guarantees that F is a contraction. All `(num_layers, 0)` / zeros when n = 0.
    """

    relative_residuals: torch.FloatTensor | None = None
    cosines: torch.FloatTensor | None = None
    spectral_norms: torch.FloatTensor | None = None
    residuals: torch.FloatTensor | None = None
    iterations: torch.LongTensor | None = None
    final_residuals: torch.FloatTensor | None = None
    final_relative_residuals: torch.FloatTensor | None = None
    lipschitz_bounds: torch.FloatTensor | None = None


@dataclass
class IMixerModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling` plus `fixed_point_residuals` (with `output_fixed_point_residuals=True`).

    `hidden_states` holds the embedding output and the output of every block (1 + L tensors, before the
    final LayerNorm). For sequences `last_hidden_state` and every `hidden_states` entry are `(B, L, D)`, row i the
    state of input position i, as BERT's, whatever the side and amount of padding: the blocks run on S slots (the
    real tokens first, then pad slots), gathered back to the input positions here. A padded position holds the
    state of its row's first pad slot (the slot after the real tokens), or zeros when the real tokens fill all S
    slots. Each entry is on the path to the outputs, so its gradient is the state's at the real tokens. `pooler_output`
    is the mean over the real tokens.
    """

    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


@dataclass
class IMixerImageClassifierOutput(ImageClassifierOutput):
    """`ImageClassifierOutput` plus `fixed_point_residuals` (with `output_fixed_point_residuals=True`)."""

    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


@dataclass
class IMixerSequenceClassifierOutput(SequenceClassifierOutput):
    """`SequenceClassifierOutput` plus `fixed_point_residuals` (with `output_fixed_point_residuals=True`)."""

    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


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


# --- integer check: identical in energyformers' Hyper-SET and iMixer files (its test suite checks) ---


def _is_integer(value: object) -> bool:
    """Whether a count or seed argument is an integer: Python's or any other `numbers.Integral` (numpy's, from a
    sweep over `np.arange`), which callers store as `int(value)`; not a bool, a float of integral value or a
    tensor."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


# --- end of integer check ---


class IMixerEmbeddings(nn.Module):
    """The model's input, either kind, as the S tokens of the fixed token-mixing length plus the padding mask.

    Images: non-overlapping p×p patches → Conv2d(C, D, p, stride p); no position embedding, token mixing is
    position-specific already. Sequences: token embeddings (or `inputs_embeds`) laid out on S =
    `max_position_embeddings` slots: the real tokens (attention_mask = 1) move to the front in their order and
    the remaining slots hold a learned pad embedding, so a sequence occupies the same S slots whatever padding
    its batch had (amount or side) and its logits do not depend on it. Returns `(tokens, keep, positions)`, `keep`
    the `(B, S)` bool mask of the slots holding real tokens and `positions` the `(B, L)` slot each input position
    reads its output from (`at_input_positions`; None for images: every token is real and in place).
    """

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        self.config = config
        if config.input_type == "image":
            self.image_size = _pair(config.image_size)
            self.projection = nn.Conv2d(
                config.num_channels,
                config.hidden_size,
                kernel_size=config.patch_size,
                stride=config.patch_size,
            )
        else:
            self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
            self.pad_embedding = nn.Parameter(torch.zeros(config.hidden_size))

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
        """Tokens `(B, S, D)`, `keep` `(B, S)` and `positions` `(B, L)` (both None for images).
        `interpolate_pos_encoding` changes nothing; a caller who passed it is told why when the size is refused."""
        _check_inputs(self.config, pixel_values, input_ids, inputs_embeds, attention_mask)
        if pixel_values is not None:
            height, width = pixel_values.shape[-2:]
            if interpolate_pos_encoding and (height, width) != tuple(self.image_size):
                patches = (self.image_size[0] // self.config.patch_size) * (
                    self.image_size[1] // self.config.patch_size
                )
                raise ValueError(
                    f"pixel_values have spatial size {height}×{width} but config.image_size is "
                    f"{self.image_size[0]}×{self.image_size[1]}, and interpolate_pos_encoding=True cannot apply to "
                    "iMixer: it has no position embedding to resample, and its token-mixing weights are sized to "
                    f"the {patches} patches of config.image_size. Resize the inputs to that size (the model's "
                    f"image processor does this), or build and train a model with image_size=[{height}, {width}]."
                )
            _check_image_size(pixel_values, self.image_size, self.config.patch_size)
            # images arrive as float32 whatever the model's dtype (e.g. bfloat16), as in transformers' models
            patches = self.projection(pixel_values.to(self.projection.weight.dtype))  # (B, D, Hp, Wp)
            # (B, D, Hp, Wp) → (B, S, D), copied into that layout once: the residual adds keep their first input's
            # layout, so a transposed view here would reach every LayerNorm, which copies a non-contiguous input
            return patches.flatten(2).transpose(1, 2).contiguous(), None, None
        _check_token_ids(input_ids, self.config.vocab_size, attention_mask)
        # given embeddings of any dtype (bfloat16 ones from another model) run in the model's, as pixel_values do
        dtype = self.word_embeddings.weight.dtype
        # (B, L, D)
        tokens = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds.to(dtype)
        if attention_mask is None:
            keep = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
        else:
            keep = attention_mask.bool()  # (B, L)
        lengths = keep.sum(1)  # (B,)
        num_tokens = self.config.max_position_embeddings
        if lengths.numel() and not _is_tracing():
            # A count of real tokens is at most the length L, known on the host: only a mask over more than S
            # positions needs its counts read from the device (a host read, a sync on an accelerator).
            if attention_mask is None:
                _check_length(tokens.shape[1], num_tokens)
            elif tokens.shape[1] > num_tokens:
                _check_length(int(lengths.max()), num_tokens)
        # Slot of each real token = its rank among the real tokens; padding (and, when traced, any token past
        # S, which eager mode rejects above) goes to a spare slot S that is dropped.
        # summed as int64, what torch makes of a bool cumsum anyway: ONNX's CumSum takes no bool input
        rank = keep.long().cumsum(1) - 1  # (B, L)
        slots = torch.where(keep & (rank < num_tokens), rank, num_tokens)  # (B, L)
        # (B, S + 1, D)
        canvas = self.pad_embedding.to(dtype).expand(tokens.shape[0], num_tokens + 1, -1)
        embeddings = canvas.scatter(1, slots.unsqueeze(-1).expand_as(tokens), tokens)  # (B, S + 1, D)
        slot_keep = torch.arange(num_tokens, device=tokens.device) < lengths[:, None]  # (B, S)
        # The inverse for the outputs: a real token reads its own slot, a padded position its row's first pad slot
        # (slot S, all zeros in `at_input_positions`, when the real tokens fill all S)
        positions = torch.where(slots < num_tokens, slots, lengths.clamp(max=num_tokens)[:, None])  # (B, L)
        return embeddings[:, :num_tokens], slot_keep, positions  # (B, S, D)


def at_input_positions(states: torch.Tensor, positions: torch.Tensor | None) -> torch.Tensor:
    """A state on the S token-mixing slots `(B, S, D)` gathered back to the L input positions `(B, L, D)` by the
    `positions` of `IMixerEmbeddings` (slot S: zeros); `states` itself for images (`positions` None)."""
    if positions is None:
        return states
    padded = F.pad(states, (0, 0, 0, 1))  # (B, S, D) → (B, S + 1, D): slot S all zeros
    # (B, L) → (B, L, D), on the states' device, which a multi-device split may have moved away from the mask's
    index = positions.to(states.device).unsqueeze(-1).expand(-1, -1, states.shape[-1])
    return padded.gather(1, index)  # (B, L, D)


def recorded_state(
    states: torch.Tensor, positions: torch.Tensor | None, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor]:
    """(a `hidden_states` entry, the state the blocks go on with): the S-slot state `(B, S, D)` at the input positions
    `(B, L, D)` (`at_input_positions`), and `states` with the real tokens' slots read back from that entry (the same
    values), so the entry is on the path to the outputs and its gradient is the state's, as BERT's `hidden_states`
    are (a padded position's copy of a pad slot gets none). Both `states` itself for images (`positions` None)."""
    if positions is None:
        return states, states
    recorded = at_input_positions(states, positions)  # (B, L, D)
    num_tokens = states.shape[1]
    lengths = keep.to(positions.device).sum(1, keepdim=True)  # (B, 1) real tokens per row
    # a real token's slot is its rank (< its row's length); a padded position writes to slot S, cut off below
    slots = torch.where(positions < lengths, positions, num_tokens).to(states.device)  # (B, L)
    canvas = F.pad(states, (0, 0, 0, 1))  # (B, S, D) → (B, S + 1, D)
    routed = canvas.scatter(1, slots.unsqueeze(-1).expand_as(recorded), recorded)  # (B, S + 1, D)
    return recorded, routed[:, :num_tokens]  # (B, S, D)


def _unit_start(like: torch.Tensor) -> torch.Tensor:
    """The power iteration's fixed start: the unit vector along (1, …, 1)."""
    return torch.full_like(like, like.numel() ** -0.5)


_SAME_SIZE_INTEGERS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}


def _bits_differ(new: torch.Tensor, old: torch.Tensor) -> torch.Tensor:
    """`(G,)` bool for stacked `(G, ...)` tensors: whether any element of `new[g]` and `old[g]` differs bit for bit
    (so NaN = NaN and -0 ≠ 0: exact)."""
    integers = _SAME_SIZE_INTEGERS[new.element_size()]
    # view(dtype) of the same element size: the same shape, the bits read as integers
    return (new.view(integers) != old.view(integers)).flatten(1).any(1)


def _normalized(rows: torch.Tensor) -> torch.Tensor:
    """Each row scaled to unit length, a zero row kept at zero: `F.normalize(rows, dim=-1)`."""
    return rows / torch.linalg.vector_norm(rows, dim=-1, keepdim=True).clamp_min(1e-12)


@torch.no_grad()
def refine_spectral_norms(
    targets: list[tuple[IMixerSpectralNorm, torch.Tensor]], only_if_changed: bool = False
) -> None:
    """The power iteration of the σ estimates: for each (parametrization, W) pair of `targets`, k =
    `config.spectral_norm_power_iterations` steps v ← n(Wᵀu), u ← n(Wv), written into the parametrization's
    buffers u, v. The weights of one shape, dtype and device are stacked into one batch and stepped at once.
    With `only_if_changed` (the `per_optimizer_step` schedule), a weight keeps its old u, v unless it changed
    (any bit, as an optimiser step changes it) since the last refinement, or there was none.

    Every schedule of `config.spectral_norm_schedule` calls this in training mode: `IMixerModel.forward` before
    the first block (`per_forward`, `per_optimizer_step`), `IMixerTokenMixing.solve` before every application of
    F (`per_call`). Per weight the result is that of its own power iteration, up to rounding: the batched
    products sum in another order than a matrix-vector product of one weight. One batch rather than a loop over
    weights keeps the number of (tiny) kernels per training forward independent of the number of blocks.
    """
    groups: dict[tuple, list[tuple[IMixerSpectralNorm, torch.Tensor]]] = {}
    for norm, weight in targets:
        if only_if_changed and not hasattr(norm, "refined_weight"):
            raise ValueError(
                "only_if_changed=True needs the copy of W that spectral_norm_schedule='per_optimizer_step' "
                "stores, but this model was built with another schedule; pass only_if_changed=False, or build "
                "it with config.spectral_norm_schedule='per_optimizer_step'."
            )
        steps = norm.num_power_iterations
        key = (tuple(weight.shape), weight.dtype, weight.device, steps)
        groups.setdefault(key, []).append((norm, weight))
    for (*_, steps), group in groups.items():
        norms = [norm for norm, _ in group]
        weights = [weight for _, weight in group]
        # Eager shortcut, same result: W and the comparison state untouched since the last check (same storage,
        # same in-place versions) means the select below would keep u, v. It saves the k power steps of every
        # further forward between optimiser steps; under tracing the select decides alone. A write through
        # `param.data` bumps no version W shares, so only the select sees it: write weights under
        # `torch.no_grad()` (`p.copy_(...)`) or through `p.detach()`, which share W's version counter.
        if (
            only_if_changed
            and not _is_tracing()
            and all(norm._untouched_since_last_check(weight) for norm, weight in group)
        ):
            continue
        stacked = torch.stack(weights)  # (G, out, in)
        first_u = u = torch.stack([norm.u for norm in norms])  # (G, out)
        first_v = v = torch.stack([norm.v for norm in norms])  # (G, in)
        for _ in range(steps):
            v = _normalized(torch.bmm(u.unsqueeze(1), stacked).squeeze(1))  # (Wᵀu)ᵀ = uᵀW: (G, in)
            u = _normalized(torch.bmm(stacked, v.unsqueeze(2)).squeeze(2))  # (G, out)
        if only_if_changed:
            # The steps always run and a select keeps them or the old u, v: no Python branch on a tensor
            # value, so a compiled training forward is one graph, and the result is the same as skipping them.
            stored = torch.stack([norm.refined_weight for norm in norms])
            refined = torch.stack([norm.refined for norm in norms])
            changed = refined.logical_not() | _bits_differ(stacked, stored)  # (G,)
            u = torch.where(changed[:, None], u, first_u)
            v = torch.where(changed[:, None], v, first_v)
            torch._foreach_copy_([norm.refined_weight for norm in norms], weights)
            torch._foreach_copy_([norm.refined for norm in norms], [changed.new_ones(())] * len(norms))
        # one batched copy into the G pairs of buffers
        torch._foreach_copy_(
            [norm.u for norm in norms] + [norm.v for norm in norms], [*u.unbind(0), *v.unbind(0)]
        )
        if only_if_changed and not _is_tracing():
            for norm, weight in group:
                norm._last_check = norm._fingerprint(weight)


class IMixerSpectralNorm(nn.Module):
    """Soft spectral normalisation as a `torch.nn.utils.parametrize` parametrization (i-ResNet style).

    W ↦ W / max(1, σ/c) with σ = uᵀWv (differentiable in W), so a weight whose σ is below c is used
    unchanged. u, v are persistent buffers (saved with the checkpoint, so eval outputs survive a
    save/load exactly); the module-level `refine_spectral_norms` refines them, in training mode only, for a
    weight whose parameter requires grad, on the schedule of `config.spectral_norm_schedule` (see
    `IMixerModel.forward`), or when `IMixerTokenMixing.update_spectral_norms` is called. c is
    `config.contractive_coeff`.
    """

    def __init__(self, config: IMixerConfig, weight: torch.Tensor) -> None:
        super().__init__()
        self.coeff = config.contractive_coeff
        self.num_power_iterations = config.spectral_norm_power_iterations
        out_features, in_features = weight.shape
        # u, v start at a fixed unit vector, not a random draw: a model built directly and one built on the meta
        # device and initialised afterwards then agree exactly (transformers' init tests compare them). The σ
        # estimate converges in training, `spectral_norm_power_iterations` steps per forward.
        self.register_buffer("u", _unit_start(weight.new_empty(out_features)))
        self.register_buffer("v", _unit_start(weight.new_empty(in_features)))
        if config.spectral_norm_schedule == "per_optimizer_step":
            # What `refine_spectral_norms(..., only_if_changed=True)` compares W with: W as it was at the last
            # refinement, and whether there was one. Tensors, not Python attributes, so the comparison is
            # traceable (torch.compile(fullgraph=True) of a training forward); non-persistent, so checkpoints and
            # state_dict keys are the same for every schedule. `_init_weights` resets them (meta-device init).
            self.register_buffer("refined_weight", torch.zeros_like(weight.detach()), persistent=False)
            self.register_buffer(
                "refined", torch.zeros((), dtype=torch.bool, device=weight.device), persistent=False
            )

    def _fingerprint(self, weight: torch.Tensor) -> tuple[int, ...] | None:
        """Storage and in-place version of W and of the comparison state (None for inference tensors, which
        track no version)."""
        # `_version` (private): no public API reads it, and optimizer/load hooks miss `w.mul_(2)` under no_grad
        try:
            return tuple(t._version for t in (weight, self.refined_weight, self.refined)) + tuple(
                t.data_ptr() for t in (weight, self.refined_weight, self.refined)
            )
        except RuntimeError:
            return None

    def _untouched_since_last_check(self, weight: torch.Tensor) -> bool:
        last = getattr(self, "_last_check", None)
        return last is not None and last == self._fingerprint(weight)

    def sigma(self, weight: torch.Tensor) -> torch.Tensor:
        """σ = uᵀWv of `weight` with the current u, v: the 0-d estimate, differentiable in W."""
        # Σ_ij u_i W_ij v_j elementwise: BLAS gemv (torch.mv) rounds differently for differently aligned
        # buffers (safetensors loads are not 64-byte aligned), and eval outputs must match bit for bit after
        # save → load. The product also copies u, v, which a later training forward updates in place.
        return (weight * torch.outer(self.u, self.v)).sum()

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        """The weight as used: W / max(1, σ/c), same shape as `weight`."""
        return weight / torch.clamp(self.sigma(weight) / self.coeff, min=1.0)

    def __getstate__(self) -> dict:
        # The eager shortcut's fingerprint names storages of this process: a copy (pickle, deepcopy) holds other
        # tensors, so it starts with no check done rather than one an address reused by chance could match.
        state = super().__getstate__()
        state.pop("_last_check", None)
        return state


def rebuild_contractive_linear(
    cls: type, state: dict, parametrizations: dict[str, tuple[torch.Tensor, list[nn.Module], bool]]
) -> nn.Module:
    """The module `IMixerContractiveLinear.__reduce_ex__` pickled: its own state, then each parametrized tensor's
    original registered again with its parametrizations (`unsafe=True`: nothing is computed, u and v stay as
    pickled)."""
    module = cls.__new__(cls)
    module.__setstate__(state)
    for name, (original, modules, training) in parametrizations.items():
        if isinstance(original, nn.Parameter):
            module.register_parameter(name, original)
        else:
            module.register_buffer(name, original)
        for parametrization in modules:
            parametrize.register_parametrization(module, name, parametrization, unsafe=True)
        module.parametrizations[name].train(training)
    return module


class IMixerContractiveLinear(nn.Linear):
    """One of F's two linear layers (fc_sn1, fc_sn2): an `nn.Linear` that pickles with its spectral-norm
    parametrization. torch refuses to pickle a parametrized module (only its state_dict); this one pickles as its
    plain state plus each parametrized tensor's original and parametrizations, registered again when unpickled, so
    `pickle` / `torch.save(model)` work while `copy.deepcopy` keeps torch's own path."""

    def __reduce_ex__(self, protocol: int) -> tuple:
        if not parametrize.is_parametrized(self):
            return super().__reduce_ex__(protocol)
        state = nn.Module.__getstate__(self)  # a copy of __dict__, without torch's refusal
        state["_modules"] = {name: m for name, m in self._modules.items() if name != "parametrizations"}
        parametrizations = {
            name: (plist.original, list(plist), plist.training)
            for name, plist in self.parametrizations.items()
        }
        # the class before `register_parametrization` derived one from it (which cannot be pickled by name)
        return rebuild_contractive_linear, (type(self).__bases__[0], state, parametrizations)


# Divergence rule of the tolerance solvers, per sample, on the residual ‖f(x) − x‖: non-finite, this many times
# its smallest so far, or grown in this many consecutive steps (Picard on a contraction never grows). Both values
# are our choice.
_DIVERGENCE_FACTOR = 10.0
_DIVERGENCE_PATIENCE = 5


@dataclass(frozen=True)
class _FixedPointSettings:
    """Solver and gradient of one forward's fixed-point solves: the config's, with the call's overrides. No field
    has a default: `of` builds them from the config, so the defaults live in IMixerConfig alone."""

    iterations: int
    solver: str
    tolerance: float
    gradient: str
    anderson_memory: int
    anderson_damping: float
    phantom_steps: int
    phantom_damping: float

    @classmethod
    def of(
        cls, config: IMixerConfig, iterations: int, **overrides: str | float | None
    ) -> _FixedPointSettings:
        """`config`'s settings with `iterations` steps; an override that is None keeps the config's value."""
        values = dict(
            solver=config.fixed_point_solver,
            tolerance=config.fixed_point_tolerance,
            gradient=config.fixed_point_gradient,
            anderson_memory=config.anderson_memory,
            anderson_damping=config.anderson_damping,
            phantom_steps=config.phantom_gradient_steps,
            phantom_damping=config.phantom_gradient_damping,
        )
        values.update({name: value for name, value in overrides.items() if value is not None})
        return cls(iterations=iterations, **values)


def _residuals(new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per sample `(B,)`: ‖new − old‖ / √(numel) (the paper's measure) and ‖new − old‖ / ‖old‖, in float32+."""
    new, old = new.flatten(1), old.flatten(1)  # (B, D·D_S)
    if new.dtype not in (torch.float32, torch.float64):
        new, old = new.float(), old.float()
    distance = (new - old).norm(dim=1)
    relative = distance / old.norm(dim=1).clamp_min(torch.finfo(old.dtype).tiny)
    return distance / new.shape[1] ** 0.5, relative


def _at_most(tolerance: float, dtype: torch.dtype) -> float:
    """The largest value of `dtype` that is <= `tolerance`. A tensor compared with a Python float rounds the float
    to the tensor's dtype, to nearest and so possibly upward; comparing residuals of `dtype` with this bound
    instead decides exactly as comparing their values with the tolerance itself."""
    bound = torch.tensor(tolerance, dtype=dtype)
    if bound.item() > tolerance:
        bound = torch.nextafter(bound, bound.new_full((), -torch.inf))
    return bound.item()


class _SolveRecord:
    """What the diagnostics report of one block's solve: per-step batch means over the samples still iterating
    (relative residual, the paper's residual, cosine; only with `track`), the steps run, and each sample's
    residuals at the iterate it returns."""

    def __init__(self, track: bool) -> None:
        self.track = track
        self.relative: list[torch.Tensor] = []
        self.absolute: list[torch.Tensor] = []
        self.cosines: list[torch.Tensor] = []
        self.steps = 0
        self.final_absolute: torch.Tensor | None = None  # (B,)
        self.final_relative: torch.Tensor | None = None  # (B,)

    def add(
        self,
        new: torch.Tensor,
        old: torch.Tensor,
        residuals: tuple[torch.Tensor, torch.Tensor] | None = None,
        active: torch.Tensor | None = None,
    ) -> None:
        self.steps += 1
        if self.track:
            with torch.no_grad():
                self._statistics(new, old, residuals, active)

    def _statistics(
        self,
        new: torch.Tensor,
        old: torch.Tensor,
        residuals: tuple[torch.Tensor, torch.Tensor] | None,
        active: torch.Tensor | None,
    ) -> None:
        absolute, relative = _residuals(new, old) if residuals is None else residuals
        # (B, D, D_S) → (B, D·D_S): one cosine per sample
        cosine = F.cosine_similarity(
            new.flatten(1).to(relative.dtype), old.flatten(1).to(relative.dtype), dim=1
        )
        if active is None:
            self.final_absolute, self.final_relative = absolute, relative
            means = (relative.mean(), absolute.mean(), cosine.mean())
        else:
            weights = active.to(relative.dtype)
            means = tuple(
                (v * weights).sum() / weights.sum().clamp_min(1.0) for v in (relative, absolute, cosine)
            )
        for values, mean in zip((self.relative, self.absolute, self.cosines), means):
            values.append(mean.float())


def _is_graph_export() -> bool:
    """True while a graph is recorded for export: torch.export (so `torch.onnx.export(dynamo=True)`) or the JIT
    tracer of the legacy `torch.onnx.export(dynamo=False)`, which would bake a host read's value into the graph."""
    return torch.compiler.is_exporting() or torch.jit.is_tracing()


def _eliminate(matrix: torch.Tensor, rhs: torch.Tensor) -> torch.Tensor:
    """x with `matrix @ x = rhs`, `matrix` (B, h, h) symmetric positive definite, `rhs` (B, h, k): Gauss-Jordan
    elimination without pivoting (stable for such a matrix), unrolled over the small h, in ops every exporter has."""
    rows = list(torch.cat((matrix, rhs), -1).unbind(1))  # h rows (B, h + k) of [matrix | rhs]
    for i in range(len(rows)):
        rows[i] = rows[i] / rows[i][:, i, None]
        rows = [row if j == i else row - row[:, i, None] * rows[i] for j, row in enumerate(rows)]
    return torch.stack(rows, 1)[..., matrix.shape[-1] :]  # (B, h, k)


class _AndersonMixing:
    """Anderson acceleration (Walker & Ni 2011, DEQ's form) per sample: the next iterate mixes the last m
    evaluations with weights α minimising ‖Σ α_i (f(x_i) − x_i)‖ subject to Σ α_i = 1.

    Without autograd the history lives in preallocated ring buffers and the Gram matrix of the residuals
    gains one row per step (each step reads the history about twice); with autograd (the unrolled gradient
    through an Anderson solve) it is rebuilt from lists, since in-place slot writes would break backprop.
    """

    def __init__(self, memory: int, damping: float) -> None:
        self.memory, self.damping = memory, damping
        self.count = 0
        self.states: list[torch.Tensor] = []
        self.images: list[torch.Tensor] = []
        self.buffers: dict[str, torch.Tensor] = {}

    def __call__(self, state: torch.Tensor, image: torch.Tensor) -> torch.Tensor:
        # (B, D, D_S) → (B, D·D_S): one vector per sample; the history adds an axis, (B, h, D·D_S)
        states, images, gram = (
            self._history(state.flatten(1), image.flatten(1))
            if torch.is_grad_enabled() and (state.requires_grad or image.requires_grad)
            else self._ring(state.flatten(1), image.flatten(1))
        )
        history = gram.shape[-1]
        # Tikhonov term relative to the Gram's scale keeps the system solvable when residuals vanish or repeat;
        # 1e-10 is our choice: far below the scale of distinct residuals, far above float64 round-off
        eye = torch.eye(history, dtype=gram.dtype, device=gram.device)
        # the diagonal as row sums of the Gram with zeros off it (exact), since the legacy ONNX exporter writes
        # `diagonal` of a float64 matrix as a graph onnxruntime refuses; selected, not multiplied by I: inf · 0
        diagonal = torch.where(eye.bool(), gram, 0.0).sum(-1)
        scale = diagonal.mean(-1, keepdim=True).clamp_min(torch.finfo(torch.float64).tiny)
        gram = gram + 1e-10 * scale[..., None] * eye
        ones = gram.new_ones(gram.shape[0], history, 1)
        # ONNX has no linear solve: an exported graph eliminates instead (the same α to float64 rounding)
        solve = _eliminate if _is_graph_export() else torch.linalg.solve
        alpha = solve(gram, ones)  # (B, h, 1)
        alpha = (alpha / alpha.sum(1, keepdim=True)).to(images.dtype).transpose(1, 2)  # (B, 1, h)
        mixed = alpha @ images  # (B, 1, D·D_S)
        if self.damping != 1.0:
            mixed = self.damping * mixed + (1.0 - self.damping) * (alpha @ states)
        return mixed.reshape(state.shape)  # (B, 1, D·D_S) → (B, D, D_S)

    def _history(
        self, state: torch.Tensor, image: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        self.states = [*self.states, state][-self.memory :]
        self.images = [*self.images, image][-self.memory :]
        states, images = torch.stack(self.states, 1), torch.stack(self.images, 1)  # (B, h, D·D_S)
        gaps = images - states
        return states, images, (gaps @ gaps.transpose(1, 2)).double()  # Gram (B, h, h), solved in float64

    def _ring(
        self, state: torch.Tensor, image: torch.Tensor
    ) -> tuple[torch.Tensor | None, torch.Tensor, torch.Tensor]:
        if not self.buffers:
            batch, size = state.shape
            self.buffers = dict(
                images=state.new_zeros(batch, self.memory, size),
                gaps=state.new_zeros(batch, self.memory, size),
                gram=state.new_zeros(batch, self.memory, self.memory, dtype=torch.float64),
            )
            if self.damping != 1.0:
                self.buffers["states"] = state.new_zeros(batch, self.memory, size)
        slot, self.count = self.count % self.memory, self.count + 1
        # the slots in use are 0..history−1; their order does not matter
        history = min(self.count, self.memory)
        buffers = self.buffers
        buffers["images"][:, slot] = image
        torch.sub(image, state, out=buffers["gaps"][:, slot])
        if "states" in buffers:
            buffers["states"][:, slot] = state
        gaps = buffers["gaps"][:, :history]  # (B, h, D·D_S)
        row = (gaps @ buffers["gaps"][:, slot, :, None]).squeeze(-1).double()  # (B, h): new residual · all
        buffers["gram"][:, slot, :history] = row
        buffers["gram"][:, :history, slot] = row
        states = buffers["states"][:, :history] if "states" in buffers else None
        return states, buffers["images"][:, :history], buffers["gram"][:, :history, :history]


def _solve(
    step: Callable[[torch.Tensor], torch.Tensor],
    state: torch.Tensor,
    num_steps: int,
    settings: _FixedPointSettings,
    record: _SolveRecord,
    what: str = "fixed point",
) -> torch.Tensor:
    """Iterate `step` from `state`: exactly `num_steps` times (unrolled), or per sample until the relative
    residual is <= the tolerance (picard / anderson), at most `num_steps` times.

    A tolerance solver returns, per sample, the evaluation f(x) of its iterate with the lowest relative residual
    (the measure it stops on, so a converged sample returns the step that met the tolerance), and the record's
    final residuals are the returned iterate's. A sample whose residual turns non-finite or grows
    (`_DIVERGENCE_FACTOR`, `_DIVERGENCE_PATIENCE`) stops there, with a warning, rather than returning a silently
    wrong answer, and returns its iterate with the lowest absolute residual instead: on a blowing-up state the
    relative residual falls as the state grows, so it would pick the latest, largest iterate.
    """
    if settings.solver == "unrolled":
        for _ in range(num_steps):
            update = step(state)
            record.add(update, state)
            state = update
        return state
    batch = state.shape[0]
    per_sample = (batch, *([1] * (state.ndim - 1)))  # a (B,) mask → (B, 1, 1), to select whole states
    active = torch.ones(batch, dtype=torch.bool, device=state.device)
    diverged = torch.zeros_like(active)
    growth = torch.zeros(batch, dtype=torch.long, device=state.device)
    # (B,) each, in the residuals' dtype from the first step on: the residuals of the iterate with the lowest
    # relative residual (a converging sample's answer) and of the one with the lowest absolute residual (a diverged
    # sample's answer; `smallest` is also the divergence rule's reference), and the previous absolute residual
    best_relative = best_absolute = smallest = smallest_relative = previous = None
    threshold = settings.tolerance
    answer = least_moved = state
    any_diverged = False
    anderson = _AndersonMixing(settings.anderson_memory, settings.anderson_damping)
    for _ in range(num_steps):
        image = step(state)
        with torch.no_grad():
            absolute, relative = _residuals(image, state)
        record.add(image, state, (absolute, relative), active)
        with torch.no_grad():
            if best_relative is None:
                best_relative = best_absolute = smallest = smallest_relative = previous = torch.full_like(
                    absolute, torch.inf
                )
                # the record keeps these residuals as computed: a sample stops exactly when the value recorded
                # for it is <= the tolerance
                threshold = _at_most(settings.tolerance, relative.dtype)
            # divergence is judged on the absolute residual: a blowing-up state can keep its relative one flat
            finite = torch.isfinite(absolute) & torch.isfinite(relative)
            growth = torch.where(absolute > previous, growth + 1, 0)
            blown = ~finite | (absolute > _DIVERGENCE_FACTOR * smallest) | (growth >= _DIVERGENCE_PATIENCE)
            diverged = diverged | (active & blown)
            # the iterate kept is chosen on the relative residual, the measure the tolerance is on; the step that
            # trips the divergence rule is never kept, since its state may already have blown up
            improved = active & ~blown & (relative < best_relative)
            best_relative = torch.where(improved, relative, best_relative)
            best_absolute = torch.where(improved, absolute, best_absolute)
            # the tripping step never lowers the absolute residual (it is non-finite, or above `smallest`)
            lowered = active & finite & (absolute < smallest)
            smallest = torch.where(lowered, absolute, smallest)
            smallest_relative = torch.where(lowered, relative, smallest_relative)
            previous = absolute
            # a new tensor, not `&=`: the previous step's torch.where saved `active` for the unrolled gradient
            active = active & ~blown & ~(relative <= threshold)
        answer = torch.where(improved.reshape(per_sample), image, answer)
        least_moved = torch.where(lowered.reshape(per_sample), image, least_moved)
        # one host read per step: whether to go on, and (for the warning) whether a sample diverged so far;
        # `diverged` changes nowhere after the last step's read, so no read after the loop is needed. An exported
        # graph can hold no data-dependent exit: it runs all num_steps, where `active` keeps every stopped
        # sample's state and answer as they were, and cannot warn of a divergence
        if not _is_graph_export():
            going_on, any_diverged = torch.stack((active, diverged)).any(1).tolist()
            if not going_on:
                break
        proposal = image if settings.solver == "picard" else anderson(state, image)
        state = torch.where(active.reshape(per_sample), proposal, state)
    if best_relative is not None:
        answer = torch.where(diverged.reshape(per_sample), least_moved, answer)
        record.final_absolute = torch.where(diverged, smallest, best_absolute)
        record.final_relative = torch.where(diverged, smallest_relative, best_relative)
    if any_diverged:
        logger.warning(
            f"iMixer {what} solve ({settings.solver}) diverged in {int(diverged.sum())} of {batch} samples "
            f"(residual growing or non-finite after {record.steps} steps); returning each such sample's "
            "iterate with the lowest residual ‖f(x) − x‖. Set fixed_point_contraction to guarantee a contraction, "
            "or use fewer fixed_point_iterations."
        )
    return answer


class IMixerTokenMixing(nn.Module):
    """The iMLP: out = fc2(act(x)), x = (1 − F)⁻¹(fc1(t)) = fixed point of x ↦ fc1(t) + F(x),
    F = fc_sn2∘act∘fc_sn1∘act.

    fc1 (S → D_S) and fc2 (D_S → S) are the vanilla Mixer's token MLP; F (D_S → N_h → D_S) is built only
    when n > 0, so n = 0 has the Mixer's parameters exactly and none unused. By default n unrolled steps with
    backprop through them (the paper's); `fixed_point_solver` / `fixed_point_gradient` choose a tolerance
    solver and an implicit or phantom gradient instead (config docstring).
    """

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        num_tokens, width, contractive = config.num_tokens, config.token_mixing_size, config.contractive_size
        self.normalization = config.contractive_normalization
        self.schedule = config.spectral_norm_schedule
        # The config's names (the keys of its slope table) are transformers' activation names, so ACT2FN builds the
        # activation whose largest slope `activation_max_slope` states, with no second list of names here.
        name = config_choice(
            config,
            "token_mixing_activation",
            {name: name for name in IMixerConfig.choices["token_mixing_activation"]},
        )
        self.activation = ACT2FN[name]
        self.max_slope = config.activation_max_slope
        self.fc1 = nn.Linear(num_tokens, width)
        if config.fixed_point_iterations > 0:
            self.fc_sn1 = IMixerContractiveLinear(width, contractive)
            self.fc_sn2 = IMixerContractiveLinear(contractive, width)
            if self.normalization == "spectral":
                for layer in (self.fc_sn1, self.fc_sn2):
                    parametrize.register_parametrization(
                        layer, "weight", IMixerSpectralNorm(config, layer.weight)
                    )
            elif self.normalization == "batch_norm":
                # the paper's Table 3 alternative: BatchNorm over the features after each of F's linear layers
                self.norm_sn1 = nn.BatchNorm1d(contractive)
                self.norm_sn2 = nn.BatchNorm1d(width)
        self.fc2 = nn.Linear(width, num_tokens)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.config = config  # read at call time when called on its own, as the model's forward reads it

    def spectral_layers(self) -> tuple[nn.Linear, ...]:
        """F's linear layers when they are spectrally normalised (n > 0, `contractive_normalization="spectral"`)."""
        if hasattr(self, "fc_sn1") and parametrize.is_parametrized(self.fc_sn1, "weight"):
            return (self.fc_sn1, self.fc_sn2)
        return ()

    def check_contractive_layers(self, where: str, prefix: str) -> None:
        """A ValueError if fc_sn1 or fc_sn2 is no longer the model's own Linear (spectrally parametrized under
        `contractive_normalization="spectral"`), e.g. wrapped by a PEFT LoRA adapter: the solve reads F's weights
        as tensors, so a wrapper would be ignored, and an update outside the spectral norm would void the bound
        that keeps the token mixer invertible. `where` names the forward called, `prefix` this module."""
        for name in ("fc_sn1", "fc_sn2"):
            layer = getattr(self, name, None)
            if layer is None:  # n = 0: no F
                return
            spectral = self.normalization == "spectral"
            if isinstance(layer, nn.Linear) and (
                not spectral or parametrize.is_parametrized(layer, "weight")
            ):
                continue
            kind = f"{type(layer).__module__}.{type(layer).__qualname__}"
            why = (
                "the token mixer is invertible only while F is a contraction, which the spectral normalisation "
                "keeps by holding ‖W‖₂ <= c (config.spectral_norm_coeff) on both of F's weights; the solver reads "
                "those normalised weights directly, so an adapter or quantized layer there is ignored (and "
                "merging an adapter is lost in the parametrization), and a weight change outside the "
                "normalisation would break the bound"
                if spectral
                else "the fixed-point solver reads F's weights directly, so an adapter or quantized layer there "
                "would be ignored"
            )
            raise ValueError(
                f"{where}: {prefix}.{name} is a {kind}, not the model's own Linear: F's layers fc_sn1 and fc_sn2 "
                f"cannot be adapted or quantized: {why}. Leave them out: of an adapter's target_modules, e.g. "
                "LoraConfig(target_modules=..., exclude_modules=['fc_sn1', 'fc_sn2']) (PEFT >= 0.14), adapting "
                "fc1, fc2 and the channel mixing instead; of a quantizer's layers, e.g. "
                "from_pretrained(..., quantization_config=QuantoConfig(..., modules_to_not_convert=['fc_sn1', "
                "'fc_sn2']))."
            )

    def update_spectral_norms(self, only_if_changed: bool = False) -> None:
        """Refine the σ estimates (u, v) of all of F's spectrally normalised weights, frozen ones included, by
        `refine_spectral_norms`; with `only_if_changed` (a `per_optimizer_step` model only), only those of a
        weight that changed since the last refinement. Training forwards do not call this: they call
        `refine_spectral_norms` directly, for the trainable weights only. Call it by hand, e.g. to refine the
        estimates of weights you are about to freeze (a frozen weight is not refined in training)."""
        refine_spectral_norms(self.spectral_norm_targets(), only_if_changed=only_if_changed)

    def spectral_norm_targets(
        self, trainable_only: bool = False
    ) -> list[tuple[IMixerSpectralNorm, torch.Tensor]]:
        """(parametrization, W) of each spectrally normalised weight of F: what `refine_spectral_norms` takes.
        With `trainable_only`, only the weights whose parameter requires grad: the ones training forwards refine."""
        return [
            (layer.parametrizations.weight[0], layer.parametrizations.weight.original)
            for layer in self.spectral_layers()
            if not trainable_only or layer.parametrizations.weight.original.requires_grad
        ]

    @torch.no_grad()
    def spectral_norm_estimates(self) -> torch.Tensor:
        """σ of fc_sn1 and fc_sn2, `(2,)` (`(0,)` when n = 0): the estimates uᵀWv that the soft spectral norm
        divides by, or the exact σ(W) when F is not spectrally normalised."""
        if not hasattr(self, "fc_sn1"):
            return self.fc1.weight.new_zeros(0, dtype=torch.float32)
        layers = self.spectral_layers()
        if not layers:
            return torch.stack(
                [torch.linalg.matrix_norm(m.weight.float(), ord=2) for m in (self.fc_sn1, self.fc_sn2)]
            )
        sigmas = [
            layer.parametrizations.weight[0].sigma(layer.parametrizations.weight.original) for layer in layers
        ]
        return torch.stack(sigmas).float()

    def contractive_weights(self) -> tuple[torch.Tensor, torch.Tensor]:
        """F's two weights as used (W / max(1, σ/c) when spectrally normalised), from W, u and v as they are now:
        σ = uᵀWv is one elementwise pass over each weight, little next to the fixed-point steps that use them."""
        return self.fc_sn1.weight, self.fc_sn2.weight

    def hooked(self) -> bool:
        """Whether F's layers are hooked (`is_dispatched`: an offloaded bias is on meta outside its layer's call),
        so that `residual_branch` calls them rather than reading their weights."""
        return is_dispatched(self.fc_sn1) or is_dispatched(self.fc_sn2)

    def residual_branch(
        self,
        state: torch.Tensor,
        weights: tuple[torch.Tensor, torch.Tensor],
        hooked: bool | None = None,
    ) -> torch.Tensor:
        """F(x) = fc_sn2(act(fc_sn1(act(x)))), BatchNorm after each linear layer in the `batch_norm` ablation.
        `weights`: `contractive_weights()`, read once per solve; hooked layers (`hooked`, None: `self.hooked()`)
        are called instead, which recomputes the same normalised weight."""
        if hooked is None:
            hooked = self.hooked()
        # (B, D, D_S) → (B, D, N_h) → (B, D, D_S)
        activated = self.activation(state)
        hidden = self.fc_sn1(activated) if hooked else F.linear(activated, weights[0], self.fc_sn1.bias)
        if self.normalization == "batch_norm":
            hidden = self.norm_sn1(hidden.flatten(0, 1)).view_as(hidden)  # (B·D, N_h): BatchNorm1d's layout
        activated = self.activation(hidden)
        output = self.fc_sn2(activated) if hooked else F.linear(activated, weights[1], self.fc_sn2.bias)
        if self.normalization == "batch_norm":
            output = self.norm_sn2(output.flatten(0, 1)).view_as(output)  # (B·D, D_S)
        return output

    @torch.no_grad()
    def lipschitz_bound(self, weights: tuple[torch.Tensor, torch.Tensor]) -> torch.Tensor:
        """Upper bound of F's Lipschitz constant: s² σ(W₁) σ(W₂) with s the activation's largest slope and σ the
        exact spectral norms of the weights as used (with BatchNorm: its eval-mode per-feature scales too)."""
        # s² as a Python number: a tensor made from it would be a host-to-device copy on an accelerator
        first, second = (torch.linalg.matrix_norm(weight.float(), ord=2) for weight in weights)
        bound = first * self.max_slope**2 * second
        if self.normalization == "batch_norm":
            for norm in (self.norm_sn1, self.norm_sn2):
                scale = norm.weight.float().abs() / (norm.running_var.float() + norm.eps).sqrt()
                bound = bound * scale.max()
        return bound

    def forward(
        self,
        tokens: torch.Tensor,
        fixed_point_iterations: int,
        output_diagnostics: bool = False,
        settings: _FixedPointSettings | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """`(B, D, S)` → `(B, D, S)`: fc2(act(x)), x = fc1(t) + F(x) in n steps; diagnostics or None."""
        # called on its own, without a model forward's per-call settings: the config's, as that forward's
        if settings is None:
            settings = _FixedPointSettings.of(self.config, fixed_point_iterations)
        # tokens: (B, D, S), token axis last so every Linear mixes tokens with one matmul
        start = self.fc1(tokens)  # (B, D, D_S): G(t), no activation yet
        state, record = start, _SolveRecord(output_diagnostics)
        weights = None
        if fixed_point_iterations > 0:
            state, weights = self.solve(start, fixed_point_iterations, settings, record)
        output = self.dropout(self.fc2(self.dropout(self.activation(state))))  # (B, D, S)
        if not output_diagnostics:
            return output, None
        empty = start.new_zeros(0, dtype=torch.float32)
        final = record.final_absolute is not None
        diagnostics = dict(
            relative_residuals=torch.stack(record.relative) if record.relative else empty,
            cosines=torch.stack(record.cosines) if record.cosines else empty,
            spectral_norms=self.spectral_norm_estimates(),
            residuals=torch.stack(record.absolute) if record.absolute else empty,
            # filled on the device: torch.tensor(steps, device=...) would copy from the host
            iterations=torch.full((), record.steps, device=start.device),
            final_residuals=record.final_absolute.float().mean() if final else empty.new_zeros(()),
            final_relative_residuals=record.final_relative.float().mean() if final else empty.new_zeros(()),
            lipschitz_bounds=self.lipschitz_bound(weights) if weights is not None else empty.new_zeros(()),
        )
        return output, diagnostics

    def solve(
        self,
        start: torch.Tensor,
        fixed_point_iterations: int,
        settings: _FixedPointSettings,
        record: _SolveRecord,
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, torch.Tensor]]:
        """The fixed point of x ↦ start + F(x) with the chosen solver and gradient; returns it and F's weights."""
        per_call = self.schedule == "per_call" and self.training
        weights = self.contractive_weights()  # read once: every fixed-point step applies the same F
        # once per solve too: the walk over F's submodules would otherwise run at every step
        hooked = self.hooked()

        def step(state: torch.Tensor) -> torch.Tensor:
            nonlocal weights
            # the authors' schedule: k power steps before every application of F (none for a frozen W, as in
            # `IMixerModel.forward`)
            if per_call:
                refine_spectral_norms(self.spectral_norm_targets(trainable_only=True))
                weights = self.contractive_weights()
            return start + self.residual_branch(state, weights, hooked)

        tracked = torch.is_grad_enabled() and (start.requires_grad or any(w.requires_grad for w in weights))
        if settings.gradient == "unrolled" or not tracked:
            return _solve(step, start, fixed_point_iterations, settings, record), weights
        unrolled = settings.solver == "unrolled"
        if settings.gradient == "implicit":
            # x* without a graph, then one step x = start + F(x*) with one (the unrolled solver's last step):
            # the hook on x turns ∂L/∂x into the adjoint solution g = Jᵀg + ∂L/∂x, J = ∂F/∂x at x*.
            with torch.no_grad():
                free_steps = fixed_point_iterations - 1 if unrolled else fixed_point_iterations
                fixed_point = _solve(step, start, free_steps, settings, record).detach()
            state = step(fixed_point)
            record.add(state, fixed_point)
            if state.requires_grad:
                state.register_hook(
                    self._adjoint_hook(fixed_point, weights, fixed_point_iterations, settings, hooked)
                )
            return state, weights
        # phantom (Geng et al.): the solution detached, then k damped steps with backprop; for the unrolled
        # solver these are the last min(k, n) of its n steps
        steps = min(settings.phantom_steps, fixed_point_iterations) if unrolled else settings.phantom_steps
        with torch.no_grad():
            state = _solve(
                step,
                start,
                fixed_point_iterations - steps if unrolled else fixed_point_iterations,
                settings,
                record,
            )
        state, damping = state.detach(), settings.phantom_damping
        for _ in range(steps):
            update = step(state)
            if damping != 1.0:
                update = (1.0 - damping) * state + damping * update
            record.add(update, state)
            state = update
        return state, weights

    def _adjoint_hook(
        self,
        fixed_point: torch.Tensor,
        weights: tuple[torch.Tensor, torch.Tensor],
        fixed_point_iterations: int,
        settings: _FixedPointSettings,
        hooked: bool,
    ) -> Callable[[torch.Tensor], torch.Tensor]:
        weights = tuple(w.detach() for w in weights)

        def hook(grad: torch.Tensor) -> torch.Tensor:
            with torch.enable_grad():
                point = fixed_point.detach().requires_grad_()
                image = self.residual_branch(point, weights, hooked)

            def adjoint_step(adjoint: torch.Tensor) -> torch.Tensor:  # g ↦ Jᵀg + ∂L/∂x
                (pulled,) = torch.autograd.grad(image, point, adjoint, retain_graph=True)
                return pulled + grad

            with torch.no_grad():
                return _solve(
                    adjoint_step, grad, fixed_point_iterations, settings, _SolveRecord(False), "adjoint"
                )

        return hook


class IMixerChannelMixing(nn.Module):
    """Channel MLP per token: Linear(D, D_C) → GELU → Linear(D_C, D), dropout after GELU and output."""

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.channel_mixing_size)
        self.fc2 = nn.Linear(config.channel_mixing_size, config.hidden_size)
        # Fixed, no config field: the channel MLP is the MLP-Mixer's, GELU in Tolstikhin et al. (Eq. 1) and in the
        # iMixer paper, which changes only the token-mixing MLP (whose activation `token_mixing_activation` picks).
        self.activation = nn.GELU()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`(B, S, D)` → `(B, S, D)`: the channel MLP on each token."""
        return self.dropout(self.fc2(self.dropout(self.activation(self.fc1(hidden_states)))))


class IMixerLayer(GradientCheckpointingLayer):
    """Mixer block: x + DropPath(iMLP(LN(x)ᵀ)ᵀ), then x + DropPath(MLP(LN(x)))."""

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.token_mixing = IMixerTokenMixing(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.channel_mixing = IMixerChannelMixing(config)
        self.drop_path_rate = config.drop_path_rate  # the same in every block, as in timm's Mixer

    def drop_path(self, residual: torch.Tensor) -> torch.Tensor:
        """Stochastic depth: drop the whole branch per sample, rescale the kept ones (timm)."""
        if not self.training or self.drop_path_rate == 0.0:
            return residual
        keep = 1.0 - self.drop_path_rate
        shape = (residual.shape[0],) + (1,) * (residual.ndim - 1)  # (B, 1, 1): one draw per sample
        mask = residual.new_empty(shape).bernoulli_(keep)
        return residual * mask / keep

    def forward(
        self,
        hidden_states: torch.Tensor,
        fixed_point_iterations: int = 0,
        output_diagnostics: bool = False,
        settings: _FixedPointSettings | None = None,
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor] | None]:
        """`(B, S, D)` → `(B, S, D)`, the token mixer's diagnostics or None: one pre-norm Mixer block."""
        tokens = self.layernorm_before(hidden_states).transpose(1, 2)  # (B, S, D) → (B, D, S)
        mixed, diagnostics = self.token_mixing(tokens, fixed_point_iterations, output_diagnostics, settings)
        hidden_states = hidden_states + self.drop_path(mixed.transpose(1, 2))  # (B, D, S) → (B, S, D)
        mixed = self.channel_mixing(self.layernorm_after(hidden_states))
        hidden_states = hidden_states + self.drop_path(mixed)
        return hidden_states, diagnostics


def refuse_per_call_checkpointing(model: nn.Module) -> None:
    """A ValueError if a token mixer of `model` refines its σ estimates with `spectral_norm_schedule="per_call"`:
    every application of F runs power steps first, so the recompute of a checkpointed block would run them again
    and differentiate other weights than its forward used. What iMixer's `check_activation_checkpointing` runs."""
    per_call = [
        module
        for module in model.modules()
        if isinstance(module, IMixerTokenMixing)
        and module.schedule == "per_call"
        and module.spectral_layers()
    ]
    if per_call:
        raise ValueError(
            f"{type(model).__name__}: spectral_norm_schedule='per_call' cannot be trained with activation "
            "(gradient) checkpointing: the recompute of a checkpointed block runs its power steps again, so its "
            "gradients would be those of other weights. Build the model with spectral_norm_schedule="
            "'per_forward' (the default) or 'per_optimizer_step' to use checkpointing, or train without it."
        )


class IMixerPreTrainedModel(FamilyPreTrainedMixin, PreTrainedModel):
    """The base of every iMixer model: its config class, weight initialisation, attention selection and loading."""

    config: IMixerConfig
    config_class = IMixerConfig
    base_model_prefix = "imixer"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["IMixerEmbeddings", "IMixerLayer"]

    # what `attn_implementation` takes: "eager" only, iMixer mixes tokens with an MLP and has no attention
    attn_implementations = ("eager",)

    # the per-call schedule cannot be checkpointed (`refuse_per_call_checkpointing`)
    def check_activation_checkpointing(self) -> None:
        refuse_per_call_checkpointing(self)

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        # timm's Mixer init (the authors' code base): Xavier-uniform MLP weights with N(0, 1e-6) biases,
        # LeCun-normal patch convolution, zero classifier.
        if isinstance(module, IMixerClassifier):
            init.zeros_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Linear):
            if parametrize.is_parametrized(module, "weight"):
                init.xavier_uniform_(module.parametrizations.weight.original)
                spectral_norm = module.parametrizations.weight[0]
                init.copy_(spectral_norm.u, _unit_start(spectral_norm.u))  # guarded: loaded u, v are kept
                init.copy_(spectral_norm.v, _unit_start(spectral_norm.v))
            else:
                init.xavier_uniform_(module.weight)
            init.normal_(module.bias, mean=0.0, std=1e-6)
        elif isinstance(module, IMixerSpectralNorm) and hasattr(module, "refined"):
            # per_optimizer_step's comparison state, never loaded (non-persistent): no refinement yet. A branch of
            # its own: a loaded Linear is skipped whole, its parametrization is not.
            init.zeros_(module.refined_weight)
            init.zeros_(module.refined)
        elif isinstance(module, nn.Conv2d):
            init.lecun_normal_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, (nn.LayerNorm, nn.BatchNorm1d)):
            init.ones_(module.weight)
            init.zeros_(module.bias)
            if isinstance(module, nn.BatchNorm1d):  # the `batch_norm` ablation of F
                init.zeros_(module.running_mean)
                init.ones_(module.running_var)
                init.zeros_(module.num_batches_tracked)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, IMixerEmbeddings) and config_choice(
            module.config, "input_type", {"image": False, "sequence": True}
        ):
            init.normal_(module.pad_embedding, mean=0.0, std=self.config.initializer_range)


def _stack_diagnostics(blocks: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """Per-block diagnostics → `(L, ...)` tensors; per-step series padded with NaN to the longest block's."""
    stacked = {}
    for name in blocks[0]:
        values = [block[name] for block in blocks]
        if name in ("relative_residuals", "cosines", "residuals"):
            steps = max(v.shape[0] for v in values)
            values = [F.pad(v, (0, steps - v.shape[0]), value=float("nan")) for v in values]
        stacked[name] = torch.stack(values)
    return stacked


class IMixerModel(IMixerPreTrainedModel):
    """The bare iMixer encoder: embeddings → `num_hidden_layers` Mixer blocks (token mixing by the iMLP's fixed-point
    solve, then channel mixing) → final LayerNorm (+ the mean of the tokens as `pooler_output`).

    `last_hidden_state` (and `pooler_output`) come after the final LayerNorm, as ViT's. Hyper-SET's and the looped
    baseline's `Model` return the raw state instead (their heads hold the norm, since their recurrent-depth heads
    carry the raw state between outer steps), so base-model features are normalised here and raw there.

    `add_pooling_layer=False` builds it without the pooler, as ViT's and BERT's: `pooler_output` is then None.
    """

    def __init__(self, config: IMixerConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = IMixerEmbeddings(config)
        self.layers = nn.ModuleList([IMixerLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.add_pooling_layer = add_pooling_layer
        self._set_input_names()
        self.post_init()

    def _call_settings(
        self,
        where: str,
        fixed_point_iterations: int | None,
        fixed_point_solver: str | None,
        fixed_point_tolerance: float | None,
        fixed_point_gradient: str | None,
    ) -> tuple[int, _FixedPointSettings]:
        """The fixed-point step count and settings of one call: the config's, with the call's overrides, checked.
        An error names `where`, the forward the user called (a head checks before its backbone), since a bad value
        there came from the call: the config was checked when it was built or loaded."""
        fixed_point_iterations = (
            self.config.fixed_point_iterations if fixed_point_iterations is None else fixed_point_iterations
        )
        if not _is_integer(fixed_point_iterations) or fixed_point_iterations < 0:
            raise ValueError(
                f"{where}: invalid fixed_point_iterations={fixed_point_iterations!r}; expected an integer >= 0."
            )
        fixed_point_iterations = int(fixed_point_iterations)
        if fixed_point_iterations > 0 and self.config.fixed_point_iterations == 0:
            raise ValueError(
                f"{where}: invalid fixed_point_iterations={fixed_point_iterations}; it needs the contractive block F, but "
                "this model was built with config.fixed_point_iterations=0 (vanilla MLP-Mixer, no F): pass 0 or "
                "build it with n >= 1."
            )
        settings = _FixedPointSettings.of(
            self.config,
            fixed_point_iterations,
            solver=fixed_point_solver,
            tolerance=fixed_point_tolerance,
            gradient=fixed_point_gradient,
        )
        self.config.check_fixed_point_settings(settings.solver, settings.gradient, settings.tolerance, where)
        if fixed_point_tolerance is not None and settings.solver == "unrolled":
            # only picard and anderson stop at a residual: the unrolled solver runs its n steps whatever it is
            raise ValueError(
                f"{where}: fixed_point_tolerance={fixed_point_tolerance!r} is where the picard and anderson solvers "
                "stop, and this call's fixed_point_solver is 'unrolled', which runs all fixed_point_iterations: "
                "pass fixed_point_solver='picard' or 'anderson' with it, or no fixed_point_tolerance."
            )
        return fixed_point_iterations, settings

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        fixed_point_solver: str | None = None,
        fixed_point_tolerance: float | None = None,
        fixed_point_gradient: str | None = None,
        output_attentions: bool | None = None,  # accepted for callers that pass it to every model; unused
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
        interpolate_pos_encoding: bool | None = None,
    ) -> IMixerModelOutput | tuple:
        r"""
        fixed_point_iterations (`int`, *optional*):
            Fixed-point steps n for this call (defaults to `config.fixed_point_iterations`), e.g. to watch
            the solve converge over more steps; the maximum for the picard / anderson solvers. A model built
            with n = 0 has no F and accepts only 0.
        fixed_point_solver (`str`, *optional*):
            `"unrolled"`, `"picard"` or `"anderson"` for this call (defaults to `config.fixed_point_solver`).
        fixed_point_tolerance (`float`, *optional*):
            Relative residual at which picard / anderson stop (defaults to `config.fixed_point_tolerance`).
        fixed_point_gradient (`str`, *optional*):
            `"unrolled"`, `"implicit"` or `"phantom"` for this call (defaults to `config.fixed_point_gradient`).
        output_fixed_point_residuals (`bool`, *optional*):
            Return `fixed_point_residuals` (`IMixerFixedPointDiagnostics`): per block and step the residuals
            and cosine between successive iterates, steps run, final residuals, the σ of F's weights and
            the Lipschitz bound of F.
        output_attentions (`bool`, *optional*):
            Accepted and ignored, as ConvNext's: iMixer has no attention, so `attentions` is always None.
        interpolate_pos_encoding (`bool`, *optional*):
            Accepted for ViT's signature; iMixer has no position table to resample (its token mixing is a map over
            the S patches of `config.image_size`), so an image of another size is refused, with `True` by an error
            that says so.
        """
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        output_fixed_point_residuals = bool(output_fixed_point_residuals)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        pixel_values, input_ids = route_main_input(self.config, pixel_values, input_ids)
        fixed_point_iterations, settings = self._call_settings(
            f"{type(self).__name__}.forward",
            fixed_point_iterations,
            fixed_point_solver,
            fixed_point_tolerance,
            fixed_point_gradient,
        )

        for index, layer in enumerate(self.layers):
            layer.token_mixing.check_contractive_layers(
                f"{type(self).__name__}.forward", f"layers.{index}.token_mixing"
            )

        hidden_states, keep, positions = self.embeddings(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            interpolate_pos_encoding=interpolate_pos_encoding,
        )
        # None: "per_call" (refined inside the solve); else whether only a changed W is refined
        changed_only = config_choice(
            self.config,
            "spectral_norm_schedule",
            {"per_forward": False, "per_call": None, "per_optimizer_step": True},
        )
        if self.training and changed_only is not None:
            # Power iteration once per forward (or per weight update), before any block: all fixed-point steps of
            # this forward use one W_eff, and a gradient-checkpointing recompute of a block sees the same u, v as
            # its forward. ("per_call", the authors' schedule, refines at every step inside the solve instead.)
            # All blocks' weights in one call, so the weights of one shape are refined as one batch. A frozen W
            # (requires_grad False, e.g. the base under a PEFT adapter) keeps its u, v: it cannot change, and an
            # adapter file holds no buffers, so refining them would make base + adapter differ from the trained model.
            refine_spectral_norms(
                [
                    target
                    for layer in self.layers
                    for target in layer.token_mixing.spectral_norm_targets(trainable_only=True)
                ],
                only_if_changed=changed_only,
            )

        all_hidden_states = None
        if output_hidden_states:
            recorded, hidden_states = recorded_state(hidden_states, positions, keep)
            all_hidden_states = (recorded,)
        all_diagnostics = []
        for layer in self.layers:
            hidden_states, diagnostics = layer(
                hidden_states,
                fixed_point_iterations=fixed_point_iterations,
                output_diagnostics=output_fixed_point_residuals,
                settings=settings,
            )
            if output_hidden_states:
                recorded, hidden_states = recorded_state(hidden_states, positions, keep)
                all_hidden_states += (recorded,)
            if output_fixed_point_residuals:
                all_diagnostics.append(diagnostics)

        fixed_point_residuals = None
        if output_fixed_point_residuals:
            fixed_point_residuals = IMixerFixedPointDiagnostics(**_stack_diagnostics(all_diagnostics))
        hidden_states = self.layernorm(hidden_states)
        # Always the mean over the real tokens, as timm's Mixer: iMixer's config has no `pooling` field and its
        # tokens have no prefix (no CLS token), so this is the other families'
        # `pooling="mean"` with no prefix to skip.
        pooled = masked_mean(hidden_states, keep) if self.add_pooling_layer else None
        output = IMixerModelOutput(
            last_hidden_state=at_input_positions(hidden_states, positions),
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            fixed_point_residuals=fixed_point_residuals,
        )
        return output if return_dict else output.to_tuple()


class IMixerClassifier(nn.Linear):
    """Linear(D, num_labels); its own class so `_init_weights` can zero it (timm's Mixer head init)."""


class IMixerHead(IMixerPreTrainedModel):
    """The base of iMixer's heads: backbone → the mean of the tokens → Linear (timm's Mixer head; `nn.Identity()`
    when num_labels == 0). A head sets the input type it takes and its output class; its `forward` has the
    signature of its input type and hands everything to `classify`."""

    _input_type = "image"
    _per_token = False  # no per-token head: every head classifies the pooled token
    _output_class: type[ModelOutput] = IMixerImageClassifierOutput

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__(config)
        check_head_input_type(self, config.input_type, self._input_type)
        self.imixer = IMixerModel(config)
        self.classifier = (
            IMixerClassifier(config.hidden_size, config.num_labels)
            if config.num_labels > 0
            else nn.Identity()
        )
        self.post_init()

    def check_call_arguments(self, **arguments: object) -> None:
        """A ValueError naming this head's forward for a bad per-call solver argument among `arguments` (the
        `fixed_point_*` ones; others are ignored), as the forward raises it, without running the model: what the
        pipelines check when they are built."""
        self.imixer._call_settings(
            f"{type(self).__name__}.forward",
            *(
                arguments.get(f"fixed_point_{name}")
                for name in ("iterations", "solver", "tolerance", "gradient")
            ),
        )

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
        # the per-call solver arguments checked under this head's name, before the backbone (which checks them too)
        self.check_call_arguments(**backbone_inputs)
        outputs = self.imixer(**backbone_inputs, return_dict=True)
        logits = self.classifier(outputs.pooler_output)
        loss = (
            None if labels is None else head_loss(self, logits, labels, num_items_in_batch, self._per_token)
        )
        output = self._output_class(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            fixed_point_residuals=outputs.fixed_point_residuals,
        )
        return output if return_dict else output.to_tuple()


class IMixerForImageClassification(IMixerHead):
    """Classifies the pooled token of an image."""

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        fixed_point_solver: str | None = None,
        fixed_point_tolerance: float | None = None,
        fixed_point_gradient: str | None = None,
        output_attentions: bool | None = None,  # accepted for callers that pass it to every model; unused
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
        interpolate_pos_encoding: bool | None = None,
    ) -> IMixerImageClassifierOutput | tuple:
        r"""Images `(B, C, H, W)` → logits `(B, num_labels)`, loss with `labels`; rest as `IMixerModel`'s.

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
            fixed_point_iterations=fixed_point_iterations,
            fixed_point_solver=fixed_point_solver,
            fixed_point_tolerance=fixed_point_tolerance,
            fixed_point_gradient=fixed_point_gradient,
            output_hidden_states=output_hidden_states,
            output_fixed_point_residuals=output_fixed_point_residuals,
        )


class IMixerForSequenceClassification(IMixerHead):
    """Classifies the pooled token of a sequence."""

    main_input_name = "input_ids"
    _input_type = "sequence"
    _output_class = IMixerSequenceClassifierOutput

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        fixed_point_solver: str | None = None,
        fixed_point_tolerance: float | None = None,
        fixed_point_gradient: str | None = None,
        output_attentions: bool | None = None,  # accepted for callers that pass it to every model; unused
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> IMixerSequenceClassifierOutput | tuple:
        """Sequences `(B, L)` → logits `(B, num_labels)`, loss with `labels`; rest as `IMixerModel`'s;
        `num_items_in_batch` as `IMixerForImageClassification.forward`'s."""
        return self.classify(
            labels,
            return_dict,
            num_items_in_batch=num_items_in_batch,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            fixed_point_iterations=fixed_point_iterations,
            fixed_point_solver=fixed_point_solver,
            fixed_point_tolerance=fixed_point_tolerance,
            fixed_point_gradient=fixed_point_gradient,
            output_hidden_states=output_hidden_states,
            output_fixed_point_residuals=output_fixed_point_residuals,
        )


__all__ = [
    "IMixerEmbeddings",
    "IMixerFixedPointDiagnostics",
    "IMixerForImageClassification",
    "IMixerForSequenceClassification",
    "IMixerHead",
    "IMixerModel",
    "IMixerModelOutput",
    "IMixerPreTrainedModel",
]
