# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""iMixer: an MLP-Mixer whose token-mixing MLP inverts a contractive residual block.

Ota, Taki, *iMixer: hierarchical Hopfield network implies an invertible, implicit and iterative
MLP-Mixer*. In the adiabatic limit the hidden layer of a hierarchical Hopfield network solves
(1 − F)(x) = G(t), so the token-mixing MLP becomes fc2(GELU((1 − F)⁻¹(fc1(t)))): the inverse of an
invertible-ResNet block F (Behrmann et al., *Invertible Residual Networks*), approximated by n
fixed-point steps x ← fc1(t) + F(x) and kept contractive by soft spectral normalisation. n = 0 is the
vanilla MLP-Mixer (Tolstikhin et al.). Everything else is timm's Mixer: patch convolution, pre-norm
blocks with token then channel mixing, final LayerNorm, mean pooling, linear classifier.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.utils import parametrize
from transformers import PreTrainedConfig, PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SequenceClassifierOutput,
)
from transformers.utils import ModelOutput

from ..configuration.configuration_imixer import IMixerConfig


@dataclass
class IMixerFixedPointDiagnostics(ModelOutput):
    """How the fixed-point solve x_a = x₀ + F(x_{a−1}), a = 1..n, converged in this forward.

    relative_residuals / cosines: `(num_layers, n)`, batch means of ‖x_a − x_{a−1}‖ / ‖x_{a−1}‖ and of
    cos(x_a, x_{a−1}) per sample. spectral_norms: `(num_layers, 2)`, the σ estimates uᵀWv of fc_sn1 and
    fc_sn2 that this forward normalised with (`(num_layers, 0)` tensors when n = 0).
    """

    relative_residuals: torch.FloatTensor | None = None
    cosines: torch.FloatTensor | None = None
    spectral_norms: torch.FloatTensor | None = None


@dataclass
class IMixerModelOutput(BaseModelOutputWithPooling):
    """`BaseModelOutputWithPooling` plus `fixed_point_residuals` (with `output_fixed_point_residuals=True`).

    `hidden_states` holds the embedding output and the output of every block (1 + L tensors, before the
    final LayerNorm). For sequences all states have the token-mixing length S, real tokens first.
    """

    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


@dataclass
class IMixerImageClassifierOutput(ImageClassifierOutput):
    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


@dataclass
class IMixerSequenceClassifierOutput(SequenceClassifierOutput):
    fixed_point_residuals: IMixerFixedPointDiagnostics | None = None


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


# --- input checks: identical in the three modeling files (tests/test_layout.py checks) ---


def _is_tracing() -> bool:
    """True under torch.compile / torch.export: checks that read tensor values into Python run eagerly only."""
    return torch.compiler.is_compiling() or torch.compiler.is_exporting()


def _check_head_input_type(head: nn.Module, input_type: str, required: str) -> None:
    if input_type != required:
        raise ValueError(
            f"{type(head).__name__} needs config.input_type={required!r}; got input_type={input_type!r}."
        )


def _check_inputs(
    config: PreTrainedConfig,
    pixel_values: torch.Tensor | None,
    input_ids: torch.Tensor | None,
    inputs_embeds: torch.Tensor | None,
    attention_mask: torch.Tensor | None,
) -> None:
    """Exactly the input kind of `config.input_type`, with the shapes and dtypes the embeddings read."""
    if config.input_type == "image":
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
            f"(tokenizer(..., truncation=True, max_length={limit})) or build the model with a larger "
            "max_position_embeddings."
        )


def _check_token_ids(input_ids: torch.Tensor | None, vocab_size: int) -> None:
    """Ids inside the vocabulary, read from the (possibly resized) embedding table; eager mode only."""
    if input_ids is None or not input_ids.numel() or _is_tracing():
        return
    low, high = int(input_ids.min()), int(input_ids.max())
    if low < 0 or high >= vocab_size:
        raise ValueError(
            f"input_ids must lie in [0, vocab_size={vocab_size}); got values in [{low}, {high}]. Use the "
            "tokenizer saved with the model."
        )


# --- end of input checks ---


class IMixerEmbeddings(nn.Module):
    """The model's input, either kind, as the S tokens of the fixed token-mixing length plus the padding mask.

    Images: non-overlapping p×p patches → Conv2d(C, D, p, stride p); no position embedding, token mixing is
    position-specific already. Sequences: token embeddings (or `inputs_embeds`) laid out on S =
    `max_position_embeddings` slots: the real tokens (attention_mask = 1) move to the front in their order and
    the remaining slots hold a learned pad embedding, so a sequence occupies the same S slots whatever padding
    its batch had (amount or side) and its logits do not depend on it. Returns `(tokens, keep)`, `keep` the
    `(B, S)` bool mask of the slots holding real tokens (None for images: every token is real).
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
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        _check_inputs(self.config, pixel_values, input_ids, inputs_embeds, attention_mask)
        if pixel_values is not None:
            _check_image_size(pixel_values, self.image_size, self.config.patch_size)
            return self.projection(pixel_values).flatten(2).transpose(
                1, 2
            ), None  # (B, D, Hp, Wp) → (B, S, D)
        _check_token_ids(input_ids, self.word_embeddings.num_embeddings)
        tokens = self.word_embeddings(input_ids) if inputs_embeds is None else inputs_embeds  # (B, L, D)
        keep = torch.ones(tokens.shape[:2], dtype=torch.bool, device=tokens.device)
        keep = keep if attention_mask is None else attention_mask.bool()  # (B, L)
        lengths = keep.sum(1)  # (B,)
        num_tokens = self.config.max_position_embeddings
        if lengths.numel() and not _is_tracing():
            _check_length(int(lengths.max()), num_tokens)
        # Slot of each real token = its rank among the real tokens; padding (and, when traced, any token past
        # S, which eager mode rejects above) goes to a spare slot S that is dropped.
        rank = keep.cumsum(1) - 1  # (B, L)
        slots = torch.where(keep & (rank < num_tokens), rank, num_tokens)  # (B, L)
        canvas = self.pad_embedding.to(tokens.dtype).expand(
            tokens.shape[0], num_tokens + 1, -1
        )  # (B, S + 1, D)
        embeddings = canvas.scatter(1, slots.unsqueeze(-1).expand_as(tokens), tokens)  # (B, S + 1, D)
        slot_keep = torch.arange(num_tokens, device=tokens.device) < lengths[:, None]  # (B, S)
        return embeddings[:, :num_tokens], slot_keep  # (B, S, D)


def _masked_mean(values: torch.Tensor, keep: torch.Tensor | None) -> torch.Tensor:
    """Mean over the token axis (dim 1) of `values` (B, N, ...) over the tokens `keep` (B, N) marks real."""
    if keep is None:
        return values.mean(1)
    weights = keep.to(values.dtype).reshape(*keep.shape, *([1] * (values.ndim - 2)))
    return (values * weights).sum(1) / weights.sum(1).clamp_min(1.0)


def _unit_start(like: torch.Tensor) -> torch.Tensor:
    """The power iteration's fixed start: the unit vector along (1, …, 1)."""
    return torch.full_like(like, like.numel() ** -0.5)


class IMixerSpectralNorm(nn.Module):
    """Soft spectral normalisation as a `torch.nn.utils.parametrize` parametrization (i-ResNet style).

    W ↦ W / max(1, σ/c) with σ = uᵀWv (differentiable in W), so a weight whose σ is below c is used
    unchanged. u, v are persistent buffers (saved with the checkpoint, so eval outputs survive a
    save/load exactly); `power_iteration` refines them and runs in training mode only, once per model
    forward (see `IMixerModel.forward`).
    """

    def __init__(self, config: IMixerConfig, weight: torch.Tensor) -> None:
        super().__init__()
        self.coeff = config.spectral_norm_coeff
        self.num_power_iterations = config.spectral_norm_power_iterations
        out_features, in_features = weight.shape
        # u, v start at a fixed unit vector, not a random draw: a model built directly and one built on the meta
        # device and initialised afterwards then agree exactly (transformers' init tests compare them). The σ
        # estimate converges in training, `spectral_norm_power_iterations` steps per forward.
        self.register_buffer("u", _unit_start(weight.new_empty(out_features)))
        self.register_buffer("v", _unit_start(weight.new_empty(in_features)))

    @torch.no_grad()
    def power_iteration(self, weight: torch.Tensor, num_iterations: int | None = None) -> None:
        """k steps v ← n(Wᵀu), u ← n(Wv), written into the buffers."""
        u, v = self.u, self.v
        for _ in range(self.num_power_iterations if num_iterations is None else num_iterations):
            v = F.normalize(torch.mv(weight.t(), u), dim=0)
            u = F.normalize(torch.mv(weight, v), dim=0)
        self.u.copy_(u)
        self.v.copy_(v)

    def sigma(self, weight: torch.Tensor) -> torch.Tensor:
        # Σ_ij u_i W_ij v_j elementwise: BLAS gemv (torch.mv) rounds differently for differently aligned
        # buffers (safetensors loads are not 64-byte aligned), and eval outputs must match bit for bit after
        # save → load. The product also copies u, v, which a later training forward updates in place.
        return (weight * torch.outer(self.u, self.v)).sum()

    def forward(self, weight: torch.Tensor) -> torch.Tensor:
        return weight / torch.clamp(self.sigma(weight) / self.coeff, min=1.0)


@torch.no_grad()
def _step_statistics(new: torch.Tensor, old: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Batch means of ‖new − old‖ / ‖old‖ and cos(new, old), each sample flattened."""
    new, old = new.flatten(1).float(), old.flatten(1).float()  # (B, D·D_S)
    residual = (new - old).norm(dim=1) / old.norm(dim=1).clamp_min(torch.finfo(old.dtype).tiny)
    return residual.mean(), F.cosine_similarity(new, old, dim=1).mean()


class IMixerTokenMixing(nn.Module):
    """The iMLP: out = fc2(GELU(x)), x = (1 − F)⁻¹(fc1(t)) by n fixed-point steps, F = fc_sn2∘GELU∘fc_sn1∘GELU.

    fc1 (S → D_S) and fc2 (D_S → S) are the vanilla Mixer's token MLP; F (D_S → N_h → D_S) is built only
    when n > 0, so n = 0 has the Mixer's parameters exactly and none unused. Gradients flow through the
    unrolled iterations (plain backprop, as in the paper).
    """

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        num_tokens, width, contractive = config.num_tokens, config.token_mixing_size, config.contractive_size
        self.fc1 = nn.Linear(num_tokens, width)
        if config.fixed_point_iterations > 0:
            self.fc_sn1 = nn.Linear(width, contractive)
            self.fc_sn2 = nn.Linear(contractive, width)
            for layer in (self.fc_sn1, self.fc_sn2):
                parametrize.register_parametrization(
                    layer, "weight", IMixerSpectralNorm(config, layer.weight)
                )
        self.fc2 = nn.Linear(width, num_tokens)
        self.activation = nn.GELU()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def spectral_layers(self) -> tuple[nn.Linear, ...]:
        return (self.fc_sn1, self.fc_sn2) if hasattr(self, "fc_sn1") else ()

    def update_spectral_norms(self) -> None:
        for layer in self.spectral_layers():
            layer.parametrizations.weight[0].power_iteration(layer.parametrizations.weight.original)

    @torch.no_grad()
    def spectral_norm_estimates(self) -> torch.Tensor:
        """Current σ estimates uᵀWv of fc_sn1 and fc_sn2, `(2,)` (`(0,)` when n = 0)."""
        sigmas = [
            layer.parametrizations.weight[0].sigma(layer.parametrizations.weight.original)
            for layer in self.spectral_layers()
        ]
        return torch.stack(sigmas).float() if sigmas else self.fc1.weight.new_zeros(0, dtype=torch.float32)

    def forward(
        self, tokens: torch.Tensor, num_iterations: int, output_diagnostics: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        # tokens: (B, D, S), token axis last so every Linear mixes tokens with one matmul
        start = self.fc1(tokens)  # (B, D, D_S): G(t), no activation yet
        state, statistics = start, []
        if num_iterations > 0:
            # read the parametrized weights once: every fixed-point step applies the same F
            weight1, weight2 = self.fc_sn1.weight, self.fc_sn2.weight
            for _ in range(num_iterations):
                # F(x) = fc_sn2(GELU(fc_sn1(GELU(x)))): (B, D, D_S) → (B, D, N_h) → (B, D, D_S)
                hidden = self.activation(F.linear(self.activation(state), weight1, self.fc_sn1.bias))
                update = start + F.linear(hidden, weight2, self.fc_sn2.bias)
                if output_diagnostics:
                    statistics.append(_step_statistics(update, state))
                state = update
        output = self.dropout(self.fc2(self.dropout(self.activation(state))))  # (B, D, S)
        if not output_diagnostics:
            return output, None
        residuals = (
            torch.stack([r for r, _ in statistics]) if statistics else start.new_zeros(0, dtype=torch.float32)
        )
        cosines = (
            torch.stack([c for _, c in statistics]) if statistics else start.new_zeros(0, dtype=torch.float32)
        )
        return output, (residuals, cosines, self.spectral_norm_estimates())


class IMixerChannelMixing(nn.Module):
    """Channel MLP per token: Linear(D, D_C) → GELU → Linear(D_C, D), dropout after GELU and output."""

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.channel_mixing_size)
        self.fc2 = nn.Linear(config.channel_mixing_size, config.hidden_size)
        self.activation = nn.GELU()
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
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
        self, hidden_states: torch.Tensor, num_iterations: int = 0, output_diagnostics: bool = False
    ) -> tuple[torch.Tensor, tuple[torch.Tensor, ...] | None]:
        tokens = self.layernorm_before(hidden_states).transpose(1, 2)  # (B, S, D) → (B, D, S)
        mixed, diagnostics = self.token_mixing(tokens, num_iterations, output_diagnostics)
        hidden_states = hidden_states + self.drop_path(mixed.transpose(1, 2))  # (B, D, S) → (B, S, D)
        mixed = self.channel_mixing(self.layernorm_after(hidden_states))
        hidden_states = hidden_states + self.drop_path(mixed)
        return hidden_states, diagnostics


class IMixerClassifier(nn.Linear):
    """Linear(D, num_labels); its own class so `_init_weights` can zero it (timm's Mixer head init)."""


class IMixerPreTrainedModel(PreTrainedModel):
    config: IMixerConfig
    config_class = IMixerConfig
    base_model_prefix = "imixer"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["IMixerEmbeddings", "IMixerLayer"]

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
        elif isinstance(module, nn.Conv2d):
            init.lecun_normal_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.Embedding):
            init.normal_(module.weight, mean=0.0, std=self.config.initializer_range)
        elif isinstance(module, IMixerEmbeddings) and module.config.input_type == "sequence":
            init.normal_(module.pad_embedding, mean=0.0, std=self.config.initializer_range)


class IMixerModel(IMixerPreTrainedModel):
    def __init__(self, config: IMixerConfig) -> None:
        super().__init__(config)
        self.embeddings = IMixerEmbeddings(config)
        self.layers = nn.ModuleList([IMixerLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        # `get/set_input_embeddings` (transformers' defaults) find this table in `self.embeddings`.
        self._input_embed_layer = "projection" if config.input_type == "image" else "word_embeddings"
        # The entry point follows the input type, images as ViT's (`pixel_values` first) and sequences as BERT's
        # (`input_ids` first, `inputs_embeds`), so positional calls, `main_input_name` and tools that read the
        # signature (pipelines, transformers' tests) see one modality. Both run the body of `forward`.
        if config.input_type == "image":
            self.forward = self.forward_images
        else:
            self.main_input_name = "input_ids"
            self.forward = self.forward_tokens
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
    ) -> IMixerModelOutput | tuple:
        r"""
        fixed_point_iterations (`int`, *optional*):
            Fixed-point steps n for this call (defaults to `config.fixed_point_iterations`), e.g. to watch
            the solve converge over more steps; a model built with n = 0 has no F and accepts only 0.
        output_fixed_point_residuals (`bool`, *optional*):
            Return `fixed_point_residuals` (`IMixerFixedPointDiagnostics`): per block and step the relative
            residual and cosine between successive iterates, and the σ estimates of F's weights.
        """
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        output_fixed_point_residuals = bool(output_fixed_point_residuals)
        return_dict = self.config.return_dict if return_dict is None else return_dict
        num_iterations = (
            self.config.fixed_point_iterations if fixed_point_iterations is None else fixed_point_iterations
        )
        if not isinstance(num_iterations, int) or isinstance(num_iterations, bool) or num_iterations < 0:
            raise ValueError(f"fixed_point_iterations must be an integer >= 0; got {num_iterations!r}.")
        if num_iterations > 0 and self.config.fixed_point_iterations == 0:
            raise ValueError(
                f"fixed_point_iterations={num_iterations} needs the contractive block F, but this model was built "
                "with config.fixed_point_iterations=0 (vanilla MLP-Mixer, no F); pass 0 or build it with n >= 1."
            )

        hidden_states, keep = self.embeddings(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
        )
        if self.training:
            # Power iteration once per forward, before any block: all fixed-point steps of this forward use
            # one W_eff, and a gradient-checkpointing recompute of a block sees the same u, v as its forward.
            for layer in self.layers:
                layer.token_mixing.update_spectral_norms()

        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_diagnostics = []
        for layer in self.layers:
            hidden_states, diagnostics = layer(
                hidden_states, num_iterations=num_iterations, output_diagnostics=output_fixed_point_residuals
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_fixed_point_residuals:
                all_diagnostics.append(diagnostics)

        fixed_point_residuals = None
        if output_fixed_point_residuals:
            fixed_point_residuals = IMixerFixedPointDiagnostics(
                *(torch.stack(values) for values in zip(*all_diagnostics))  # (L, n), (L, n), (L, 2)
            )
        hidden_states = self.layernorm(hidden_states)
        output = IMixerModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=_masked_mean(hidden_states, keep),  # mean over the real tokens (timm's Mixer)
            hidden_states=all_hidden_states,
            fixed_point_residuals=fixed_point_residuals,
        )
        return output if return_dict else output.to_tuple()

    def forward_images(self, pixel_values: torch.Tensor | None = None, **kwargs) -> IMixerModelOutput | tuple:
        """`forward` of an image backbone."""
        return IMixerModel.forward(self, pixel_values=pixel_values, **kwargs)

    def forward_tokens(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        inputs_embeds: torch.Tensor | None = None,
        **kwargs,
    ) -> IMixerModelOutput | tuple:
        """`forward` of a sequence backbone: token ids first."""
        return IMixerModel.forward(
            self, input_ids=input_ids, attention_mask=attention_mask, inputs_embeds=inputs_embeds, **kwargs
        )


class IMixerForImageClassification(IMixerPreTrainedModel):
    """Backbone → Linear on the mean of the tokens (timm's Mixer head)."""

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__(config)
        _check_head_input_type(self, config.input_type, "image")
        self.imixer = IMixerModel(config)
        self.classifier = (
            IMixerClassifier(config.hidden_size, config.num_labels)
            if config.num_labels > 0
            else nn.Identity()
        )
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
    ) -> IMixerImageClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.imixer(
            pixel_values=pixel_values,
            fixed_point_iterations=fixed_point_iterations,
            output_hidden_states=output_hidden_states,
            output_fixed_point_residuals=output_fixed_point_residuals,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        output = IMixerImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            fixed_point_residuals=outputs.fixed_point_residuals,
        )
        return output if return_dict else output.to_tuple()


class IMixerForSequenceClassification(IMixerPreTrainedModel):
    """Backbone → Linear on the mean of the real tokens."""

    main_input_name = "input_ids"

    def __init__(self, config: IMixerConfig) -> None:
        super().__init__(config)
        _check_head_input_type(self, config.input_type, "sequence")
        self.imixer = IMixerModel(config)
        self.classifier = (
            IMixerClassifier(config.hidden_size, config.num_labels)
            if config.num_labels > 0
            else nn.Identity()
        )
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        inputs_embeds: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        fixed_point_iterations: int | None = None,
        output_hidden_states: bool | None = None,
        output_fixed_point_residuals: bool | None = None,
        return_dict: bool | None = None,
    ) -> IMixerSequenceClassifierOutput | tuple:
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.imixer(
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            fixed_point_iterations=fixed_point_iterations,
            output_hidden_states=output_hidden_states,
            output_fixed_point_residuals=output_fixed_point_residuals,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)
        loss = None if labels is None else self.loss_function(labels, logits, self.config)
        output = IMixerSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            fixed_point_residuals=outputs.fixed_point_residuals,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "IMixerEmbeddings",
    "IMixerFixedPointDiagnostics",
    "IMixerForImageClassification",
    "IMixerForSequenceClassification",
    "IMixerModel",
    "IMixerModelOutput",
    "IMixerPreTrainedModel",
]
