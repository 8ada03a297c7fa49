"""PyTorch HyperBF (homogeneous Transformer).

Gan, Poggio, *A Homogeneous Transformer Architecture* (CBMM memo 143). Every block is two HyperBF units,
Gaussian radial-basis functions with a learned metric: a distance-based attention over the tokens
(score −τ‖q − k‖²) and a normalized RBF layer over K learned centers in place of the MLP.

Deliberate deviation from the public code: its RBF feedforward uses exp(−β·distance) with N(0, 1)
centers against LayerNorm'd inputs, so it underflows to 0 in float32 and never trains, and it hard-codes
widths. Here every width comes from the config and the kernel is initialised in its useful range.

Other departures from the spec's sketch (same function, different layout): q, k, v are three bias-free
`Linear(D, D)` (`q_proj`/`k_proj`/`v_proj`, the canonical names) instead of one fused `Linear(D, 3D)`; the
metric W is a bare (R, D) parameter `metric` rather than a `Linear`; and the centers start at N(0, 1), where
LayerNorm'd inputs live, rather than N(0, 0.02), with σ chosen from that (see `_init_weights`), so the scaled
distance d²/2σ² starts near ln K and every center weight near 1/K.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    SequenceClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import logging

from ..configuration.configuration_hyperbf import HyperBFConfig

logger = logging.get_logger(__name__)


@dataclass
class HyperBFModelOutput(BaseModelOutputWithPooling):
    r"""
    rbf_weights (`tuple[torch.FloatTensor]`, *optional*, returned when `output_rbf_weights=True`):
        Per layer, the feedforward center weights w_α(x) of shape `(batch_size, sequence_length, num_centers)`.
    rbf_sigmas (`tuple[torch.FloatTensor]`, *optional*, returned when `output_rbf_weights=True`):
        Per layer, the feedforward kernel width σ, shape `(1,)` or `(num_centers,)` (`rbf_width="center"`).
    attention_sigmas (`tuple[torch.FloatTensor]`, *optional*, returned when `output_rbf_weights=True`):
        Per layer, the attention kernel width σ_h = 1/√(2τ_h) of each head, shape `(num_attention_heads,)`.
    """

    rbf_weights: tuple[torch.FloatTensor, ...] | None = None
    rbf_sigmas: tuple[torch.FloatTensor, ...] | None = None
    attention_sigmas: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class HyperBFImageClassifierOutput(ImageClassifierOutput):
    r"""
    rbf_weights, rbf_sigmas, attention_sigmas: see [`HyperBFModelOutput`].
    """

    rbf_weights: tuple[torch.FloatTensor, ...] | None = None
    rbf_sigmas: tuple[torch.FloatTensor, ...] | None = None
    attention_sigmas: tuple[torch.FloatTensor, ...] | None = None


@dataclass
class HyperBFSequenceClassifierOutput(SequenceClassifierOutput):
    r"""
    rbf_weights, rbf_sigmas, attention_sigmas: see [`HyperBFModelOutput`].
    """

    rbf_weights: tuple[torch.FloatTensor, ...] | None = None
    rbf_sigmas: tuple[torch.FloatTensor, ...] | None = None
    attention_sigmas: tuple[torch.FloatTensor, ...] | None = None


def _image_grid(config: HyperBFConfig) -> tuple[int, int]:
    size = config.image_size
    height, width = (size, size) if isinstance(size, int) else (int(size[0]), int(size[1]))
    return height, width


class HyperBFPatchEmbeddings(nn.Module):
    """Non-overlapping p×p patches → D-dimensional tokens (a strided convolution, as in ViT)."""

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.image_size = _image_grid(config)
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        self.grid = (self.image_size[0] // config.patch_size, self.image_size[1] // config.patch_size)
        self.num_patches = self.grid[0] * self.grid[1]
        self.projection = nn.Conv2d(
            config.num_channels, config.hidden_size, kernel_size=config.patch_size, stride=config.patch_size
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        # (B, C, H, W) -> (B, D, H/p, W/p) -> (B, N, D)
        return self.projection(pixel_values).flatten(2).transpose(1, 2)


class HyperBFEmbeddings(nn.Module):
    """CLS token + patch embeddings + learned positions for the configured grid (interpolated on demand)."""

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.cls_token = nn.Parameter(torch.empty(1, 1, config.hidden_size))
        self.patch_embeddings = HyperBFPatchEmbeddings(config)
        self.position_embeddings = nn.Parameter(
            torch.empty(1, self.patch_embeddings.num_patches + 1, config.hidden_size)
        )
        self.dropout = nn.Dropout(config.hidden_dropout_prob)
        self.patch_size = config.patch_size

    def interpolate_pos_encoding(self, height: int, width: int) -> torch.Tensor:
        """Position table for a (height, width) input: bicubic resampling of the patch grid, as in HF ViT."""
        grid_h, grid_w = self.patch_embeddings.grid
        new_h, new_w = height // self.patch_size, width // self.patch_size
        if (new_h, new_w) == (grid_h, grid_w):
            return self.position_embeddings
        dim = self.position_embeddings.shape[-1]
        class_pos, patch_pos = self.position_embeddings[:, :1], self.position_embeddings[:, 1:]
        # (1, gh·gw, D) -> (1, D, gh, gw) for 2-D resampling
        patch_pos = patch_pos.reshape(1, grid_h, grid_w, dim).permute(0, 3, 1, 2)
        patch_pos = F.interpolate(patch_pos, size=(new_h, new_w), mode="bicubic", align_corners=False)
        # (1, D, h, w) -> (1, h·w, D)
        patch_pos = patch_pos.permute(0, 2, 3, 1).reshape(1, new_h * new_w, dim)
        return torch.cat((class_pos, patch_pos), dim=1)

    def forward(self, pixel_values: torch.Tensor, interpolate_pos_encoding: bool = False) -> torch.Tensor:
        batch_size, _, height, width = pixel_values.shape
        embeddings = self.patch_embeddings(pixel_values)
        embeddings = torch.cat((self.cls_token.expand(batch_size, -1, -1), embeddings), dim=1)  # (B, 1+N, D)
        if interpolate_pos_encoding:
            embeddings = embeddings + self.interpolate_pos_encoding(height, width)
        else:
            embeddings = embeddings + self.position_embeddings
        return self.dropout(embeddings)


class HyperBFSequenceEmbeddings(nn.Module):
    """Token embedding + learned absolute positions (no CLS token: pooling reads the first token or the mean)."""

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        positions = torch.arange(input_ids.shape[1], device=input_ids.device)
        return self.dropout(self.word_embeddings(input_ids) + self.position_embeddings(positions))


def eager_attention_forward(
    module: nn.Module,
    query: torch.Tensor,
    key: torch.Tensor,
    value: torch.Tensor,
    attention_mask: torch.Tensor | None,
    scaling: float = 1.0,
    dropout: float = 0.0,
    **kwargs,
) -> tuple[torch.Tensor, torch.Tensor]:
    """softmax(scaling·q·kᵀ + attention_mask) v, the attention-interface signature; also returns the maps.

    query/key/value: (B, H, N, d); attention_mask: additive, broadcastable to (B, H, N, N). Output: (B, N, H, d).
    """
    scores = torch.matmul(query, key.transpose(-1, -2)) * scaling  # (B, H, N, N)
    if attention_mask is not None:
        scores = scores + attention_mask
    # Softmax in at least float32 (half-precision scores lose the small weights), float64 stays float64.
    weights = F.softmax(scores, dim=-1, dtype=torch.promote_types(scores.dtype, torch.float32)).to(
        query.dtype
    )
    weights = F.dropout(weights, p=dropout, training=module.training)
    output = torch.matmul(weights, value).transpose(1, 2).contiguous()  # (B, H, N, d) -> (B, N, H, d)
    return output, weights


class HyperBFAttention(nn.Module):
    """Gaussian-kernel attention: softmax_j(−τ_h‖q_i − k_j‖²) per head, a HyperBF unit over the tokens.

    ‖q_i‖² is constant along j and cancels in the softmax, so the score is 2τ q_i·k_j − τ‖k_j‖²: scaled
    dot-product attention with scale 2τ and a per-key additive bias (memo 143).
    """

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.config = config
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.dropout = config.attention_probs_dropout_prob
        self.is_causal = False
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
        key_padding_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """softmax_j(−τ_h‖q_i − k_j‖²) v_j for per-head (B, H, N, d) tensors -> ((B, N, H, d), maps or None)."""
        tau = self.log_temperature.exp().to(query.dtype).view(1, -1, 1, 1)  # (1, H, 1, 1)
        # The per-key bias −τ‖k_j‖² goes in as an additive attention mask (padding folded in), the per-head
        # scale 2τ into the query, so any backend that takes a float mask (SDPA, eager) computes the kernel.
        key_bias = -tau * key.pow(2).sum(-1).unsqueeze(-2)  # (B, H, 1, N)
        if key_padding_mask is not None:
            # (B, N) bool, True = real token -> (B, 1, 1, N)
            key_bias = key_bias.masked_fill(
                ~key_padding_mask[:, None, None, :], torch.finfo(key_bias.dtype).min
            )

        attention_interface: Callable = eager_attention_forward
        if not output_attentions:  # attention maps only exist on the eager path
            attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(
                self.config._attn_implementation, eager_attention_forward
            )
        return attention_interface(
            self,
            query * (2 * tau),
            key,
            value,
            key_bias,
            scaling=1.0,
            dropout=self.dropout if self.training else 0.0,
        )

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        batch_size, seq_len, _ = hidden_states.shape
        hidden_shape = (batch_size, seq_len, self.num_heads, self.head_dim)
        # (B, N, D) -> (B, H, N, d)
        query = self.q_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        key = self.k_proj(hidden_states).view(hidden_shape).transpose(1, 2)
        value = self.v_proj(hidden_states).view(hidden_shape).transpose(1, 2)

        output, weights = self.attend(query, key, value, key_padding_mask, output_attentions)
        output = output.reshape(batch_size, seq_len, -1)  # (B, N, H, d) -> (B, N, D)
        return self.o_proj(output), weights


class HyperBFFeedForward(nn.Module):
    """Normalized (or Gaussian) RBF over K learned centers t_α with a PSD metric ‖a − b‖²_W = ‖W(a − b)‖².

    w_α(x) = softmax_α(−‖Wx − Wt_α‖²/(2σ²)) (or exp(·) for `feedforward_kernel="gaussian"`), out = Σ_α w_α c_α + b.
    Distances come from one matrix product against the projected centers: ‖Wx‖² − 2 Wx·Wt_α + ‖Wt_α‖², so no
    (B, N, K, D) tensor is ever built.
    """

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.kernel = config.feedforward_kernel
        self.centers = nn.Parameter(torch.empty(config.num_centers, config.hidden_size))  # t_α: (K, D)
        self.metric = nn.Parameter(torch.empty(config.rbf_projection_dim, config.hidden_size))  # W: (R, D)
        self.log_sigma = nn.Parameter(torch.empty(config.num_centers if config.rbf_width == "center" else 1))
        self.values = nn.Linear(config.num_centers, config.hidden_size)  # c_α as columns, plus the bias b

    def sigma(self) -> torch.Tensor:
        return self.log_sigma.exp()

    def center_weights(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """w_α(x) of shape (..., K) for inputs (..., D)."""
        projected = F.linear(hidden_states, self.metric)  # (..., R)
        projected_centers = F.linear(self.centers, self.metric)  # (K, R)
        flat = projected.reshape(-1, projected.shape[-1])  # (B·N, R)
        # ‖Wt_α‖² − 2 Wx·Wt_α in one fused product, then + ‖Wx‖²; clamp the cancellation error below 0.
        sq_dist = torch.addmm(projected_centers.pow(2).sum(-1), flat, projected_centers.t(), alpha=-2.0)
        sq_dist = (sq_dist + flat.pow(2).sum(-1, keepdim=True)).clamp_min(0.0)  # (B·N, K)
        logits = -0.5 * sq_dist * torch.exp(-2.0 * self.log_sigma)  # −d²/(2σ²), always <= 0
        weights = F.softmax(logits, dim=-1) if self.kernel == "normalized" else torch.exp(logits)
        return weights.reshape(*projected.shape[:-1], -1)

    def forward(self, hidden_states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        weights = self.center_weights(hidden_states)
        return self.values(weights), weights


class HyperBFLayer(GradientCheckpointingLayer):
    """Pre-norm block: z = x + Attention(LN1(x)); y = z + FeedForward(LN2(z)) (memo 143, read as the standard pre-norm pair)."""

    def __init__(self, config: HyperBFConfig):
        super().__init__()
        self.layernorm_before = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.attention = HyperBFAttention(config)
        self.layernorm_after = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.feedforward = HyperBFFeedForward(config)
        self.dropout = nn.Dropout(config.hidden_dropout_prob)

    def forward(
        self,
        hidden_states: torch.Tensor,
        key_padding_mask: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor]:
        attended, attention_weights = self.attention(
            self.layernorm_before(hidden_states), key_padding_mask, output_attentions
        )
        hidden_states = hidden_states + self.dropout(attended)
        fed, rbf_weights = self.feedforward(self.layernorm_after(hidden_states))
        hidden_states = hidden_states + self.dropout(fed)
        return hidden_states, attention_weights, rbf_weights


class HyperBFPreTrainedModel(PreTrainedModel):
    config: HyperBFConfig
    config_class = HyperBFConfig
    base_model_prefix = "hyperbf"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperBFEmbeddings", "HyperBFSequenceEmbeddings", "HyperBFLayer"]
    _supports_sdpa = True

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        super()._init_weights(module)
        std = self.config.initializer_range
        if isinstance(module, HyperBFEmbeddings):
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
    """The bare HyperBF encoder: embeddings → `num_hidden_layers` blocks → final LayerNorm (+ pooled token)."""

    def __init__(self, config: HyperBFConfig):
        super().__init__(config)
        self.config = config
        if config.input_type == "image":
            self.embeddings = HyperBFEmbeddings(config)
        else:
            self.embeddings = HyperBFSequenceEmbeddings(config)
            self.main_input_name = "input_ids"
        self.layers = nn.ModuleList([HyperBFLayer(config) for _ in range(config.num_hidden_layers)])
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        if self.config.input_type == "image":
            return self.embeddings.patch_embeddings
        return self.embeddings.word_embeddings

    def set_input_embeddings(self, value: nn.Module) -> None:
        # Needed by `resize_token_embeddings` (sequence inputs); images have no token table to swap.
        if self.config.input_type == "image":
            self.embeddings.patch_embeddings = value
        else:
            self.embeddings.word_embeddings = value

    def _check_image(self, pixel_values: torch.Tensor | None, interpolate_pos_encoding: bool) -> None:
        if pixel_values is None:
            raise ValueError(
                'HyperBFModel with input_type="image" needs `pixel_values` of shape (batch, C, H, W).'
            )
        if pixel_values.ndim != 4:
            raise ValueError(
                f"pixel_values must have shape (batch, channels, height, width); got {tuple(pixel_values.shape)}."
            )
        _, channels, height, width = pixel_values.shape
        if channels != self.config.num_channels:
            raise ValueError(
                f"pixel_values have {channels} channels but the model expects num_channels={self.config.num_channels};"
                " convert the images (e.g. to RGB or greyscale) or use a config with matching num_channels."
            )
        expected = _image_grid(self.config)
        if not interpolate_pos_encoding and (height, width) != expected:
            raise ValueError(
                f"Input image size ({height}×{width}) doesn't match the model ({expected[0]}×{expected[1]}); resize "
                "the images or pass interpolate_pos_encoding=True."
            )
        patch = self.config.patch_size
        if height % patch or width % patch:
            raise ValueError(
                f"Input image size ({height}×{width}) is not a multiple of patch_size={patch}; resize or crop it."
            )

    def _check_sequence(self, input_ids: torch.Tensor | None, attention_mask: torch.Tensor | None) -> None:
        if input_ids is None:
            raise ValueError(
                'HyperBFModel with input_type="sequence" needs `input_ids` of shape (batch, length).'
            )
        if input_ids.ndim != 2:
            raise ValueError(f"input_ids must have shape (batch, length); got {tuple(input_ids.shape)}.")
        if input_ids.dtype.is_floating_point or input_ids.dtype.is_complex or input_ids.dtype == torch.bool:
            raise ValueError(
                f"input_ids must be integer token ids (torch.long); got dtype {input_ids.dtype}."
            )
        if input_ids.shape[1] > self.config.max_position_embeddings:
            raise ValueError(
                f"Sequence length {input_ids.shape[1]} exceeds max_position_embeddings="
                f"{self.config.max_position_embeddings}; truncate the inputs (tokenizer truncation=True, max_length)."
            )
        if input_ids.numel() and (input_ids.min() < 0 or input_ids.max() >= self.config.vocab_size):
            raise ValueError(
                f"input_ids must lie in [0, vocab_size={self.config.vocab_size}); got values in "
                f"[{int(input_ids.min())}, {int(input_ids.max())}]. Use the tokenizer this model was trained with."
            )
        if attention_mask is not None and attention_mask.shape != input_ids.shape:
            raise ValueError(
                f"attention_mask shape {tuple(attention_mask.shape)} must equal input_ids shape {tuple(input_ids.shape)}."
            )

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperBFModelOutput | tuple[torch.Tensor, ...]:
        r"""
        pixel_values (`torch.FloatTensor` of shape `(batch_size, num_channels, height, width)`):
            Images, for `input_type="image"`.
        input_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)`):
            Token ids, for `input_type="sequence"`; `attention_mask` (1 = token, 0 = padding) masks keys and
            the mean pooling. `token_type_ids` is accepted for tokenizer compatibility and ignored.
        interpolate_pos_encoding (`bool`, *optional*):
            Resample the position table for images of another resolution (a multiple of `patch_size`).
        output_rbf_weights (`bool`, *optional*):
            Return the per-layer feedforward center weights and kernel widths (σ) of both HyperBF units.
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict

        key_padding_mask = None
        if self.config.input_type == "image":
            self._check_image(pixel_values, bool(interpolate_pos_encoding))
            pixel_values = pixel_values.to(self.embeddings.patch_embeddings.projection.weight.dtype)
            hidden_states = self.embeddings(
                pixel_values, interpolate_pos_encoding=bool(interpolate_pos_encoding)
            )
        else:
            self._check_sequence(input_ids, attention_mask)
            hidden_states = self.embeddings(input_ids)
            if attention_mask is not None:
                key_padding_mask = attention_mask.bool()

        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        all_rbf_weights = () if output_rbf_weights else None
        for layer in self.layers:
            hidden_states, attention_weights, rbf_weights = layer(
                hidden_states, key_padding_mask, output_attentions
            )
            if output_hidden_states:
                all_hidden_states += (hidden_states,)
            if output_attentions:
                all_attentions += (attention_weights,)
            if output_rbf_weights:
                all_rbf_weights += (rbf_weights,)

        sequence_output = self.layernorm(hidden_states)
        if self.config.pooling == "cls":
            pooled_output = sequence_output[:, 0]
        elif key_padding_mask is None:
            pooled_output = sequence_output.mean(dim=1)
        else:
            mask = key_padding_mask.unsqueeze(-1).to(sequence_output.dtype)  # (B, N, 1)
            pooled_output = (sequence_output * mask).sum(1) / mask.sum(1).clamp_min(1.0)

        output = HyperBFModelOutput(
            last_hidden_state=sequence_output,
            pooler_output=pooled_output,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            rbf_weights=all_rbf_weights,
            rbf_sigmas=tuple(layer.feedforward.sigma() for layer in self.layers)
            if output_rbf_weights
            else None,
            attention_sigmas=tuple(layer.attention.sigma() for layer in self.layers)
            if output_rbf_weights
            else None,
        )
        return output if return_dict else output.to_tuple()


class HyperBFForImageClassification(HyperBFPreTrainedModel):
    """HyperBF encoder with a linear classifier on the pooled (CLS by default) token."""

    main_input_name = "pixel_values"
    input_modalities = ("image",)

    def __init__(self, config: HyperBFConfig):
        if config.input_type != "image":
            raise ValueError(
                f'HyperBFForImageClassification needs input_type="image"; got input_type={config.input_type!r}. '
                "Use HyperBFForSequenceClassification for token inputs."
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.hyperbf = HyperBFModel(config)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        )
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperBFImageClassifierOutput | tuple[torch.Tensor, ...]:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Class indices for the cross-entropy loss (float targets: regression / multi-label, as in ViT).
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hyperbf(
            pixel_values=pixel_values,
            interpolate_pos_encoding=interpolate_pos_encoding,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_rbf_weights=output_rbf_weights,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)
        loss = self.loss_function(labels, logits, self.config) if labels is not None else None
        output = HyperBFImageClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            rbf_weights=outputs.rbf_weights,
            rbf_sigmas=outputs.rbf_sigmas,
            attention_sigmas=outputs.attention_sigmas,
        )
        return output if return_dict else output.to_tuple()


class HyperBFForSequenceClassification(HyperBFPreTrainedModel):
    """HyperBF encoder over tokens with a linear classifier on the first token or the masked mean."""

    main_input_name = "input_ids"
    input_modalities = ("text",)

    def __init__(self, config: HyperBFConfig):
        if config.input_type != "sequence":
            raise ValueError(
                f'HyperBFForSequenceClassification needs input_type="sequence"; got input_type={config.input_type!r}. '
                "Use HyperBFForImageClassification for images."
            )
        super().__init__(config)
        self.num_labels = config.num_labels
        self.hyperbf = HyperBFModel(config)
        self.classifier = (
            nn.Linear(config.hidden_size, config.num_labels) if config.num_labels > 0 else nn.Identity()
        )
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_rbf_weights: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperBFSequenceClassifierOutput | tuple[torch.Tensor, ...]:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size,)`, *optional*):
            Class indices for the cross-entropy loss (float targets: regression / multi-label).
        """
        return_dict = self.config.return_dict if return_dict is None else return_dict
        outputs = self.hyperbf(
            input_ids=input_ids,
            attention_mask=attention_mask,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_rbf_weights=output_rbf_weights,
            return_dict=True,
        )
        logits = self.classifier(outputs.pooler_output)
        loss = self.loss_function(labels, logits, self.config) if labels is not None else None
        output = HyperBFSequenceClassifierOutput(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            rbf_weights=outputs.rbf_weights,
            rbf_sigmas=outputs.rbf_sigmas,
            attention_sigmas=outputs.attention_sigmas,
        )
        return output if return_dict else output.to_tuple()


__all__ = [
    "HyperBFForImageClassification",
    "HyperBFForSequenceClassification",
    "HyperBFModel",
    "HyperBFPreTrainedModel",
]
