"""Hyper-SET: Hyperspherical Energy Transformer with recurrent depth.

Hu, Zou, Xu, *Hyperspherical Energy Transformer with Recurrent Depth*. Each of `num_hidden_layers`
weight-tied layers is applied `num_iterations` times; one iteration is a gradient step on the
attention energy E_ATTN = √d_h Σ_h Σ_i logsumexp_j(z_i·z_j/√d_h), z = n(W_hᵀx) (tokens spread out on
each head's sphere), then one on the feedforward energy E_FF = −½ Σ_i ‖ReLU(n(Dx_i))‖² (tokens align
with dictionary directions). Step sizes α, γ are predicted per token and channel from an iteration
embedding, so the number of iterations can be changed at test time.
"""

from __future__ import annotations

import math
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
    TokenClassifierOutput,
)
from transformers.utils import ModelOutput

from ..configuration.configuration_hyperset import HyperSetConfig


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
    """

    energies: HyperSetEnergies | None = None


@dataclass
class HyperSetImageClassifierOutput(ImageClassifierOutput):
    energies: HyperSetEnergies | None = None


@dataclass
class HyperSetSequenceClassifierOutput(SequenceClassifierOutput):
    energies: HyperSetEnergies | None = None


@dataclass
class HyperSetTokenClassifierOutput(TokenClassifierOutput):
    energies: HyperSetEnergies | None = None


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def sinusoidal_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Fixed 1-D position encoding, sin/cos interleaved over channels (Vaswani et al.), `(num_positions, dim)`."""
    position = torch.arange(num_positions, dtype=torch.float32).unsqueeze(1)
    div = torch.exp(torch.arange(0, dim, 2, dtype=torch.float32) * (-math.log(10000.0) / dim))
    encoding = torch.zeros(num_positions, dim)
    encoding[:, 0::2] = torch.sin(position * div)
    encoding[:, 1::2] = torch.cos(position * div[: dim // 2])
    return encoding


def iteration_embedding(steps: torch.Tensor, dim: int) -> torch.Tensor:
    """Iteration sinusoid [sin(t f_k), cos(t f_k)] (halves concatenated), f_k = exp(−k ln(10⁴)/(half − 1))."""
    half = dim // 2
    freqs = torch.exp(
        -math.log(10000.0) * torch.arange(half, dtype=torch.float32, device=steps.device) / (half - 1)
    )
    angles = steps.float().unsqueeze(-1) * freqs  # (T, half)
    return torch.cat([angles.sin(), angles.cos()], dim=-1)


class HyperSetPatchEmbeddings(nn.Module):
    """Patches (features ordered dy, dx, channel) → LayerNorm → Linear → LayerNorm, CLS token, fixed sinusoid."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.image_size = _pair(config.image_size)
        self.patch_size = config.patch_size
        self.num_channels = config.num_channels
        patch_dim = config.num_channels * config.patch_size**2
        num_patches = (self.image_size[0] // self.patch_size) * (self.image_size[1] // self.patch_size)
        self.patch_norm = nn.LayerNorm(patch_dim, eps=config.layer_norm_eps)
        self.projection = nn.Linear(patch_dim, config.hidden_size)
        self.norm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.cls_token = nn.Parameter(torch.zeros(1, 1, config.hidden_size))
        self.register_buffer(
            "position_encoding",
            sinusoidal_positions(num_patches + 1, config.hidden_size)[None],
            persistent=False,
        )

    def forward(self, pixel_values: torch.Tensor) -> torch.Tensor:
        if pixel_values.ndim != 4 or pixel_values.shape[1] != self.num_channels:
            raise ValueError(
                f"pixel_values must have shape (batch, {self.num_channels}, {self.image_size[0]}, "
                f"{self.image_size[1]}) for this config (num_channels={self.num_channels}); got "
                f"{tuple(pixel_values.shape)}. Convert the images to {self.num_channels} channel(s) or build the "
                f"model with num_channels={pixel_values.shape[1] if pixel_values.ndim == 4 else '?'}."
            )
        height, width = pixel_values.shape[-2:]
        if (height, width) != self.image_size:
            raise ValueError(
                f"pixel_values have spatial size {height}×{width} but config.image_size is "
                f"{self.image_size[0]}×{self.image_size[1]}; resize the inputs to that size (the model's image "
                f"processor does this) or build the model with image_size=[{height}, {width}]."
            )
        batch, channels, p = pixel_values.shape[0], self.num_channels, self.patch_size
        patches = pixel_values.reshape(batch, channels, height // p, p, width // p, p)  # (B, C, Hp, p, Wp, p)
        patches = patches.permute(0, 2, 4, 3, 5, 1).reshape(batch, -1, p * p * channels)  # (B, Hp·Wp, p·p·C)
        tokens = self.norm(self.projection(self.patch_norm(patches)))
        tokens = torch.cat([self.cls_token.expand(batch, -1, -1), tokens], dim=1)  # (B, 1 + Hp·Wp, d)
        return tokens + self.position_encoding.to(tokens.dtype)


class HyperSetTokenEmbeddings(nn.Module):
    """Token embedding plus a fixed sinusoidal or learned position encoding (learned for fixed layouts, e.g. Sudoku)."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.vocab_size = config.vocab_size
        self.max_positions = config.max_position_embeddings
        self.word_embeddings = nn.Embedding(config.vocab_size, config.hidden_size)
        if config.position_embedding_type == "learned":
            self.position_embeddings = nn.Embedding(config.max_position_embeddings, config.hidden_size)
            self.register_buffer("position_encoding", None, persistent=False)
        else:
            self.position_embeddings = None
            self.register_buffer(
                "position_encoding",
                sinusoidal_positions(config.max_position_embeddings, config.hidden_size)[None],
                persistent=False,
            )

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        if input_ids.ndim != 2:
            raise ValueError(
                f"input_ids must have shape (batch, sequence_length); got {tuple(input_ids.shape)}."
            )
        length = input_ids.shape[1]
        if length > self.max_positions:
            raise ValueError(
                f"input_ids has sequence length {length} but max_position_embeddings is {self.max_positions}; "
                f"truncate the inputs (tokenizer(..., truncation=True, max_length={self.max_positions}))."
            )
        if input_ids.numel() and (int(input_ids.min()) < 0 or int(input_ids.max()) >= self.vocab_size):
            raise ValueError(
                f"input_ids contain ids outside the vocabulary [0, {self.vocab_size}) (min {int(input_ids.min())}, "
                f"max {int(input_ids.max())}); use the tokenizer saved with the model."
            )
        tokens = self.word_embeddings(input_ids)
        if self.position_embeddings is not None:
            return tokens + self.position_embeddings.weight[:length]
        return tokens + self.position_encoding[:, :length].to(tokens.dtype)


def _masked_mean(values: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
    """Mean over the token axis (dim 1) of `values` (B, N, ...) weighting tokens by `keep` (B, N)."""
    weights = keep.to(values.dtype).reshape(*keep.shape, *([1] * (values.ndim - 2)))
    return (values * weights).sum(1) / weights.sum(1).clamp_min(1.0)


class HyperSetAttention(nn.Module):
    """Symmetric (bi-softmax) attention: the exact update −Wᵀ ∂E_ATTN/∂z of the hyperspherical energy.

    Q = K = V share one projection W; the output projection is W itself, transposed, so the update is
    a gradient of an energy of x (paper Eq. for E_ATTN).
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.eps = config.rms_norm_eps
        self.energy_kind = config.attention_energy
        self.qkv_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        # RMSNorm gains over d_h: q, k, v each ("separate") or one for all three ("shared").
        self.qkv_gain = nn.Parameter(torch.ones(3 if config.qkv_norm == "separate" else 1, self.head_dim))

    def normalized_heads(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """Gain-free z = n(W_hᵀx) on the sphere of radius √d_h: `(B, N, d)` → `(B, H, N, d_h)`."""
        batch, length, _ = hidden_states.shape
        z = self.qkv_proj(hidden_states).view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)
        return F.rms_norm(z, (self.head_dim,), eps=self.eps)

    def forward(
        self, hidden_states: torch.Tensor, keep: torch.Tensor | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        batch, length, width = hidden_states.shape
        z = self.normalized_heads(hidden_states)
        gain_q, gain_k, gain_v = self.qkv_gain[[0, 1, 2] if self.qkv_gain.shape[0] == 3 else [0, 0, 0]]
        # the fixed temperature 1/√d_h is folded into q: an (N, d_h) multiply instead of an (N, N) one
        q, k, v = z * (gain_q / math.sqrt(self.head_dim)), z * gain_k, z * gain_v
        scores = q @ k.transpose(-1, -2)  # (B, H, N, N)
        key_keep = None if keep is None else keep[:, None, None, :].to(scores.dtype)  # (B, 1, 1, N)
        if self.energy_kind == "sigmoid":
            sig = torch.sigmoid(scores)
            probs = sig * (1 - sig)  # σ'(S): symmetric already
        else:
            if keep is None:
                probs = scores.softmax(-1) + scores.softmax(-2)
            else:
                # a large finite negative (not −inf) keeps fully padded rows/columns NaN-free
                blocked = torch.finfo(scores.dtype).min
                row = scores.masked_fill(key_keep == 0, blocked).softmax(-1)  # padded keys out of each row
                col = scores.masked_fill(key_keep.transpose(-1, -2) == 0, blocked).softmax(
                    -2
                )  # padded queries out
                probs = row + col
        if key_keep is not None:
            probs = probs * key_keep  # no real token reads from a padded key through either softmax
        mixed = (probs @ v).transpose(1, 2).reshape(batch, length, width)  # (B, H, N, d_h) → (B, N, d)
        return F.linear(mixed, self.qkv_proj.weight.t()), probs

    @torch.no_grad()
    def diagnostics(self, hidden_states: torch.Tensor, keep: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """E_ATTN `(B,)`, effective rank `(B, H)` and mean pairwise angle in degrees `(B, H)` over real tokens."""
        z = self.normalized_heads(hidden_states.float()) * keep[:, None, :, None]  # padded rows → 0
        scores = z @ z.transpose(-1, -2) / math.sqrt(self.head_dim)  # (B, H, N, N)
        pair_keep = keep[:, None, :, None] * keep[:, None, None, :]  # (B, 1, N, N)
        if self.energy_kind == "sigmoid":
            energy = 0.5 * math.sqrt(self.head_dim) * (torch.sigmoid(scores) * pair_keep).sum((1, 2, 3))
        else:
            lse = scores.masked_fill(pair_keep == 0, float("-inf")).logsumexp(-1).nan_to_num(neginf=0.0)
            energy = math.sqrt(self.head_dim) * (lse * keep[:, None, :]).sum((1, 2))
        singular = torch.linalg.svdvals(z)  # (B, H, min(N, d_h)); zero rows add no singular value
        p = singular / singular.sum(-1, keepdim=True).clamp_min(torch.finfo(singular.dtype).tiny)
        effective_rank = torch.exp(-torch.special.xlogy(p, p).sum(-1))
        unit = F.normalize(z, dim=-1)
        angles = torch.rad2deg(torch.acos((unit @ unit.transpose(-1, -2)).clamp(-1.0, 1.0)))
        off_diagonal = pair_keep * (1 - torch.eye(z.shape[2], device=z.device))
        average_angle = (angles * off_diagonal).sum((-1, -2)) / off_diagonal.sum((-1, -2)).clamp_min(1.0)
        return energy, effective_rank, average_angle


class HyperSetFeedForward(nn.Module):
    """Symmetric feedforward act(n_M(Dx)) Dᵀ: the update −Dᵀ ∂E_FF/∂u, u = n_M(Dx), with a tied dictionary D."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.energy_kind = config.feedforward_energy
        self.activation = nn.ReLU() if config.hidden_act == "relu" else nn.GELU()
        self.eps = config.rms_norm_eps
        self.dictionary = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        self.norm = nn.RMSNorm(config.intermediate_size, eps=config.rms_norm_eps)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        projected = self.norm(self.dictionary(hidden_states))
        coefficients = projected.softmax(-1) if self.energy_kind == "softmax" else self.activation(projected)
        return F.linear(coefficients, self.dictionary.weight.t())

    @torch.no_grad()
    def energy(self, hidden_states: torch.Tensor, keep: torch.Tensor) -> torch.Tensor:
        """E_FF `(B,)` over real tokens, gain-free normalisation."""
        dictionary = self.dictionary.weight.float()
        projected = F.rms_norm(
            F.linear(hidden_states.float(), dictionary), (dictionary.shape[0],), eps=self.eps
        )
        if self.energy_kind == "softmax":
            per_token = -projected.logsumexp(-1)
        else:
            per_token = -0.5 * self.activation(projected).pow(2).sum(-1)
        return (per_token * keep).sum(-1)


class HyperSetStepSizeProjection(nn.Linear):
    """Linear(d, 2d) → [α, γ]; its own class so `_init_weights` can zero it (identity map at initialisation)."""


class HyperSetStepSizes(nn.Module):
    """Per-token, per-channel step sizes [α, γ] from an iteration embedding c_t and the token state.

    Shared by all layers. Only the last Linear starts at zero (α = γ = 0: identity at init). The public
    code also zero-initialises both Linears of `time_mlp`, which freezes c_t to a t-independent constant;
    here `time_mlp` gets the normal initialisation (deliberate fix, see README).
    """

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        width, eps = config.hidden_size, config.rms_norm_eps
        self.time_embedding_dim = config.time_embedding_dim
        self.time_mlp = nn.Sequential(
            nn.Linear(config.time_embedding_dim, width),
            nn.RMSNorm(width, eps=eps),
            nn.GELU(),
            nn.RMSNorm(width, eps=eps),
            nn.Linear(width, width),
            nn.RMSNorm(width, eps=eps),
        )
        self.condition_norm = nn.RMSNorm(width, eps=eps)
        self.proj = HyperSetStepSizeProjection(width, 2 * width)

    def iteration_conditions(self, num_iterations: int, reference: torch.Tensor) -> torch.Tensor:
        """c_t for t = 1..T in one batch, `(T, d)`: computed once per forward, not per iteration."""
        steps = torch.arange(1, num_iterations + 1, device=reference.device)
        return self.time_mlp(iteration_embedding(steps, self.time_embedding_dim).to(reference.dtype))

    def forward(
        self, iteration_condition: torch.Tensor, state: torch.Tensor
    ) -> tuple[torch.Tensor, torch.Tensor]:
        alpha, gamma = self.proj(F.gelu(iteration_condition + self.condition_norm(state))).chunk(2, dim=-1)
        return alpha, gamma


class HyperSetLayer(GradientCheckpointingLayer):
    """One iteration: x ← x − α ⊙ Attn(x), then x ← x + γ ⊙ FF(x) (descent on E_ATTN, then on E_FF)."""

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__()
        self.attention = HyperSetAttention(config)
        self.feedforward = HyperSetFeedForward(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        iteration_condition: torch.Tensor,
        condition_source: torch.Tensor,
        step_sizes: HyperSetStepSizes,
        keep: torch.Tensor | None = None,
    ) -> tuple[torch.Tensor, torch.Tensor]:
        # The shared step-size network is passed in (it lives on the model) so that one whole iteration,
        # step sizes included, is one checkpointed unit and memory does not grow with T.
        alpha, gamma = step_sizes(iteration_condition, condition_source)
        update, probs = self.attention(hidden_states, keep)
        hidden_states = hidden_states - alpha * update
        hidden_states = hidden_states + gamma * self.feedforward(hidden_states)
        return hidden_states, probs


class HyperSetPreTrainedModel(PreTrainedModel):
    config: HyperSetConfig
    config_class = HyperSetConfig
    base_model_prefix = "hyperset"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperSetPatchEmbeddings", "HyperSetTokenEmbeddings", "HyperSetLayer"]

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
        if isinstance(module, HyperSetPatchEmbeddings):
            init.normal_(module.cls_token, mean=0.0, std=1.0)  # N(0, 1) as in the authors' code
        if (
            isinstance(module, (HyperSetPatchEmbeddings, HyperSetTokenEmbeddings))
            and module.position_encoding is not None
        ):
            # non-persistent, so absent from checkpoints: rebuilt here when loading from the meta device
            init.copy_(
                module.position_encoding, sinusoidal_positions(*module.position_encoding.shape[1:])[None]
            )


class HyperSetModel(HyperSetPreTrainedModel):
    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        embeddings = HyperSetPatchEmbeddings if config.input_type == "image" else HyperSetTokenEmbeddings
        self.embeddings = embeddings(config)
        self.step_sizes = HyperSetStepSizes(config)
        self.layers = nn.ModuleList([HyperSetLayer(config) for _ in range(config.num_hidden_layers)])
        self.post_init()

    def get_input_embeddings(self) -> nn.Module:
        return getattr(self.embeddings, "word_embeddings", self.embeddings.projection)

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,  # accepted for tokenizers that emit it; unused
        num_iterations: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperSetModelOutput | tuple:
        r"""
        num_iterations (`int`, *optional*):
            Iterations per layer for this call (defaults to `config.num_iterations`); larger values
            extrapolate in depth at test time.
        output_energies (`bool`, *optional*):
            Return `energies` (`HyperSetEnergies`): E_ATTN, E_FF, effective rank and mean angle per
            layer for t = 0..T.
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        num_iterations = self.config.num_iterations if num_iterations is None else num_iterations
        if not isinstance(num_iterations, int) or num_iterations < 1:
            raise ValueError(f"num_iterations must be an integer >= 1; got {num_iterations!r}.")

        if self.config.input_type == "image":
            if pixel_values is None or input_ids is not None:
                raise ValueError(
                    "This Hyper-SET model takes images (config.input_type='image'): pass pixel_values."
                )
            hidden_states = self.embeddings(pixel_values)
            keep = None
            pool_keep = torch.ones(hidden_states.shape[:2], device=hidden_states.device)
            pool_keep[:, 0] = 0  # mean pooling over patch tokens only, as timm does with a CLS token
        else:
            if input_ids is None or pixel_values is not None:
                raise ValueError(
                    "This Hyper-SET model takes token ids (config.input_type='sequence'): pass input_ids."
                )
            hidden_states = self.embeddings(input_ids)
            if attention_mask is not None and attention_mask.shape != input_ids.shape:
                raise ValueError(
                    f"attention_mask shape {tuple(attention_mask.shape)} differs from input_ids shape "
                    f"{tuple(input_ids.shape)}."
                )
            keep = None if attention_mask is None else attention_mask.to(hidden_states.dtype)
            pool_keep = (
                torch.ones(hidden_states.shape[:2], device=hidden_states.device) if keep is None else keep
            )

        diagnostic_keep = pool_keep.new_ones(hidden_states.shape[:2]) if keep is None else keep
        iteration_conditions = self.step_sizes.iteration_conditions(num_iterations, hidden_states)
        embedded = hidden_states
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        per_layer_diagnostics = []
        for layer in self.layers:
            records = [self._diagnostics(layer, hidden_states, diagnostic_keep)] if output_energies else None
            for t in range(num_iterations):
                source = embedded if self.config.step_size_condition == "input" else hidden_states
                hidden_states, probs = layer(
                    hidden_states, iteration_conditions[t], source, self.step_sizes, keep
                )
                if output_hidden_states:
                    all_hidden_states += (hidden_states,)
                if output_attentions:
                    all_attentions += (probs,)
                if output_energies:
                    records.append(self._diagnostics(layer, hidden_states, diagnostic_keep))
            if output_energies:
                per_layer_diagnostics.append([torch.stack(values, dim=1) for values in zip(*records)])

        energies = None
        if output_energies:
            energies = HyperSetEnergies(
                *(torch.stack(values, dim=1) for values in zip(*per_layer_diagnostics))  # (B, L, T + 1[, H])
            )
        pooled = (
            hidden_states[:, 0] if self.config.pooling == "cls" else _masked_mean(hidden_states, pool_keep)
        )
        output = HyperSetModelOutput(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
            energies=energies,
        )
        return output if return_dict else output.to_tuple()

    @staticmethod
    def _diagnostics(
        layer: HyperSetLayer, hidden_states: torch.Tensor, keep: torch.Tensor
    ) -> tuple[torch.Tensor, ...]:
        attention_energy, effective_rank, average_angle = layer.attention.diagnostics(hidden_states, keep)
        return attention_energy, layer.feedforward.energy(hidden_states, keep), effective_rank, average_angle


class _HyperSetHeadMixin:
    """Final LayerNorm → Linear, shared by the classification heads (paper: LayerNorm then linear head)."""

    def _build_head(self, config: HyperSetConfig, required_input: str) -> None:
        if config.input_type != required_input:
            raise ValueError(
                f"{type(self).__name__} needs config.input_type={required_input!r}; got {config.input_type!r}."
            )
        self.hyperset = HyperSetModel(config)
        self.layernorm = nn.LayerNorm(config.hidden_size, eps=config.layer_norm_eps)
        self.classifier = nn.Linear(config.hidden_size, config.num_labels)

    def _classify(
        self, output_class: type, labels: torch.Tensor | None, return_dict: bool | None, **backbone_inputs
    ) -> ModelOutput | tuple:
        """Backbone → LayerNorm → classifier on the pooled state, or on every token for token classification."""
        outputs = self.hyperset(**backbone_inputs, return_dict=True)
        per_token = output_class is HyperSetTokenClassifierOutput
        logits = self.classifier(
            self.layernorm(outputs.last_hidden_state if per_token else outputs.pooler_output)
        )
        loss = None
        if (
            labels is not None
        ):  # transformers' loss for the head's suffix; the token loss takes (logits, labels)
            loss = (
                self.loss_function(logits, labels, self.config)
                if per_token
                else self.loss_function(labels, logits, self.config)
            )
        output = output_class(
            loss=loss,
            logits=logits,
            hidden_states=outputs.hidden_states,
            attentions=outputs.attentions,
            energies=outputs.energies,
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        return output if return_dict else output.to_tuple()


class HyperSetForImageClassification(_HyperSetHeadMixin, HyperSetPreTrainedModel):
    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        self._build_head(config, "image")
        self.post_init()

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperSetImageClassifierOutput | tuple:
        return self._classify(
            HyperSetImageClassifierOutput,
            labels,
            return_dict,
            pixel_values=pixel_values,
            num_iterations=num_iterations,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
        )


class HyperSetForSequenceClassification(_HyperSetHeadMixin, HyperSetPreTrainedModel):
    main_input_name = "input_ids"

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        self._build_head(config, "sequence")
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperSetSequenceClassifierOutput | tuple:
        return self._classify(
            HyperSetSequenceClassifierOutput,
            labels,
            return_dict,
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_iterations=num_iterations,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
        )


class HyperSetForTokenClassification(_HyperSetHeadMixin, HyperSetPreTrainedModel):
    """Per-token labels (e.g. Sudoku cells: label −100 on given cells so the loss covers unknown ones)."""

    main_input_name = "input_ids"

    def __init__(self, config: HyperSetConfig) -> None:
        super().__init__(config)
        self._build_head(config, "sequence")
        self.post_init()

    def forward(
        self,
        input_ids: torch.Tensor | None = None,
        attention_mask: torch.Tensor | None = None,
        token_type_ids: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        output_energies: bool | None = None,
        return_dict: bool | None = None,
    ) -> HyperSetTokenClassifierOutput | tuple:
        return self._classify(
            HyperSetTokenClassifierOutput,
            labels,
            return_dict,
            input_ids=input_ids,
            attention_mask=attention_mask,
            num_iterations=num_iterations,
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            output_energies=output_energies,
        )


__all__ = [
    "HyperSetEnergies",
    "HyperSetForImageClassification",
    "HyperSetForSequenceClassification",
    "HyperSetForTokenClassification",
    "HyperSetModel",
    "HyperSetModelOutput",
    "HyperSetPreTrainedModel",
]
