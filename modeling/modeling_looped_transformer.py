# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Looped (weight-tied) Transformer: the baseline of Hyper-SET.

Hu, Zou, Xu, *Hyperspherical Energy Transformer with Recurrent Depth* compare Hyper-SET in every table with a
Transformer layer whose weights are shared across depth (as in Dehghani et al., *Universal Transformers*, and
Giannou et al., *Looped Transformers as Programmable Computers*). Here: one pre-norm layer per
`num_hidden_layers` — x ← x + Attn(RMSNorm(x)), x ← x + MLP(RMSNorm(x)), bias-free, softmax attention over the
real tokens, GELU MLP — applied `num_iterations` times, between Hyper-SET's own embeddings and head, with the same
depth controls (per-call `num_iterations`, random depth in training, truncated backpropagation through depth).

No transformers layer fits as is: the RMSNorm, bias-free families (Llama and its descendants) are causal with
rotary positions and a gated MLP; the bidirectional vision encoders with a plain GELU MLP (ViT, SigLIP, InternVL)
use biases and LayerNorm or layer scale. So the layer is a compact own one on `scaled_dot_product_attention`.
Only its masked-image-modelling head is exported to the Hub, with Hyper-SET's files beside it, so it imports
Hyper-SET's embeddings and depth schedule (`RecurrentDepthMixin`) directly.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch
from torch import nn
from transformers import PreTrainedModel
from transformers import initialization as init
from transformers.activations import ACT2FN
from transformers.modeling_layers import GradientCheckpointingLayer
from transformers.modeling_outputs import (
    BaseModelOutputWithPooling,
    ImageClassifierOutput,
    MaskedLMOutput,
    SequenceClassifierOutput,
    TokenClassifierOutput,
)
from transformers.modeling_utils import ALL_ATTENTION_FUNCTIONS
from transformers.utils import ModelOutput

from ..configuration.configuration_looped_transformer import LoopedTransformerConfig
from .modeling_hyperset import (
    FamilyPreTrainedMixin,
    HyperSetEmbeddings,
    HyperSetRMSNorm,
    MaskedImageModelingMixin,
    RecurrentDepthHeadMixin,
    RecurrentDepthHeadOutput,
    RecurrentDepthMixin,
    SoftmaxAttentionNames,
    check_head_input_type,
    check_initial_state,
    check_masked_image_modeling_head,
    config_choice,
    eager_attention_forward,
    initialize_embeddings,
    route_main_input,
)


# transformers' classifier outputs plus the fields of the supervision steps and of test-time search, as
# Hyper-SET's (`RecurrentDepthHeadOutput`, documented in `HyperSetHead.classify`)
@dataclass
class LoopedTransformerImageClassifierOutput(RecurrentDepthHeadOutput, ImageClassifierOutput):
    """`ImageClassifierOutput` plus the supervision-step and search fields (`RecurrentDepthHeadOutput`)."""


@dataclass
class LoopedTransformerSequenceClassifierOutput(RecurrentDepthHeadOutput, SequenceClassifierOutput):
    """`SequenceClassifierOutput` plus the supervision-step and search fields (`RecurrentDepthHeadOutput`)."""


@dataclass
class LoopedTransformerTokenClassifierOutput(RecurrentDepthHeadOutput, TokenClassifierOutput):
    """`TokenClassifierOutput` plus the supervision-step and search fields (`RecurrentDepthHeadOutput`)."""


class LoopedTransformerAttention(nn.Module):
    """Bias-free multi-head softmax attention; padded keys are masked out of every row. Standard softmax
    attention, so `config._attn_implementation` picks it from transformers' `ALL_ATTENTION_FUNCTIONS`."""

    is_causal = False  # read by transformers' attention functions

    def __init__(self, config: LoopedTransformerConfig) -> None:
        super().__init__()
        self.config = config  # `config._attn_implementation` is read at every call
        self.num_heads = config.num_attention_heads
        self.head_dim = config.head_dim
        self.q_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.k_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.v_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)
        self.o_proj = nn.Linear(config.hidden_size, config.hidden_size, bias=False)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_bias: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`attention_bias`: `(B, 1, 1, N)` additive, 0 on real keys and the dtype's minimum on padded ones."""
        batch, length, width = hidden_states.shape

        def heads(projection: nn.Linear) -> torch.Tensor:  # (B, N, d) → (B, H, N, d_h)
            return projection(hidden_states).view(batch, length, self.num_heads, -1).transpose(1, 2)

        q, k, v = heads(self.q_proj), heads(self.k_proj), heads(self.v_proj)
        implementation = "eager" if output_attentions else self.config._attn_implementation  # maps: eager
        attention_interface = ALL_ATTENTION_FUNCTIONS.get_interface(implementation, eager_attention_forward)
        mixed, probs = attention_interface(
            self, q, k, v, attention_bias, scaling=1 / math.sqrt(self.head_dim)
        )
        mixed = mixed.reshape(batch, length, width)  # (B, N, H, d_h) → (B, N, d)
        return self.o_proj(mixed), probs


class LoopedTransformerMLP(nn.Module):
    """fc2(act(fc1(x))), bias-free, width `intermediate_size` (4d by default)."""

    def __init__(self, config: LoopedTransformerConfig) -> None:
        super().__init__()
        self.fc1 = nn.Linear(config.hidden_size, config.intermediate_size, bias=False)
        # the config's choices, not any name ACT2FN knows: another value raises rather than running its activation
        self.activation = config_choice(
            config,
            "hidden_act",
            {name: ACT2FN[name] for name in LoopedTransformerConfig.choices["hidden_act"]},
        )
        self.fc2 = nn.Linear(config.intermediate_size, config.hidden_size, bias=False)

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        """`(B, N, d)` → `(B, N, d)`: fc2(act(fc1(x)))."""
        return self.fc2(self.activation(self.fc1(hidden_states)))


class LoopedTransformerLayer(GradientCheckpointingLayer):
    """One iteration: x ← x + Attn(RMSNorm(x)), then x ← x + MLP(RMSNorm(x)) (pre-norm).

    Submodules keep Llama's names (`self_attn`, `mlp`, ...), not HyperBF's: renaming changes the weight keys."""

    def __init__(self, config: LoopedTransformerConfig) -> None:
        super().__init__()
        self.input_layernorm = HyperSetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.self_attn = LoopedTransformerAttention(config)
        self.post_attention_layernorm = HyperSetRMSNorm(config.hidden_size, eps=config.rms_norm_eps)
        self.mlp = LoopedTransformerMLP(config)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_bias: torch.Tensor | None = None,
        output_attentions: bool = False,
    ) -> tuple[torch.Tensor, torch.Tensor | None]:
        """`(B, N, d)` → `(B, N, d)`, the maps `(B, H, N, N)` or None: one pre-norm Transformer block."""
        update, probs = self.self_attn(self.input_layernorm(hidden_states), attention_bias, output_attentions)
        hidden_states = hidden_states + update
        hidden_states = hidden_states + self.mlp(self.post_attention_layernorm(hidden_states))
        return hidden_states, probs


class LoopedTransformerPreTrainedModel(FamilyPreTrainedMixin, PreTrainedModel):
    """The base of every looped-Transformer baseline model: config class, weight initialisation, attention
    selection and loading."""

    config: LoopedTransformerConfig
    config_class = LoopedTransformerConfig
    base_model_prefix = "looped_transformer"
    main_input_name = "pixel_values"
    input_modalities = ("image", "text")
    supports_gradient_checkpointing = True
    _no_split_modules = ["HyperSetEmbeddings", "LoopedTransformerLayer"]
    _supports_sdpa = True  # transformers' default then, "sdpa" on every device, as for its own models

    # what `attn_implementation` takes: softmax attention by transformers' functions ("eager", "sdpa", or one
    # registered with `AttentionInterface.register`), read from its registry at call time
    attn_implementations = SoftmaxAttentionNames()

    @torch.no_grad()
    def _init_weights(self, module: nn.Module) -> None:
        std = self.config.initializer_range
        if isinstance(module, (nn.Linear, nn.Embedding)):
            init.normal_(module.weight, mean=0.0, std=std)
            if getattr(module, "bias", None) is not None:
                init.zeros_(module.bias)
        elif isinstance(module, nn.LayerNorm):
            init.ones_(module.weight)
            init.zeros_(module.bias)
        elif isinstance(module, nn.RMSNorm):
            init.ones_(module.weight)
        elif isinstance(module, HyperSetEmbeddings):  # as Hyper-SET's own initialisation
            initialize_embeddings(module)


class LoopedTransformerModel(RecurrentDepthMixin, LoopedTransformerPreTrainedModel):
    """The baseline backbone: Hyper-SET's embeddings, then L weight-tied pre-norm layers iterated T times. The
    depth of a call and its truncation are Hyper-SET's (`RecurrentDepthMixin`), so both models follow one
    schedule in a side-by-side run; one `forward` serves both input types, as `HyperSetModel`'s.

    `last_hidden_state` (and the `pooler_output` taken from it) is the state the last iteration left, not
    normalised: the heads hold the norm before their classifier (`layernorm`), because the recurrent-depth
    heads read the raw state (the supervision steps carry it into the next step as `initial_state`). iMixer's and
    HyperBF's `Model` end in a LayerNorm (as ViT's), so their base-model features are normalised.

    `add_pooling_layer=False` builds it without the pooler, as ViT's and BERT's: `pooler_output` is then None.
    """

    has_energy = False

    def __init__(self, config: LoopedTransformerConfig, add_pooling_layer: bool = True) -> None:
        super().__init__(config)
        self.embeddings = HyperSetEmbeddings(config)
        self.layers = nn.ModuleList([LoopedTransformerLayer(config) for _ in range(config.num_hidden_layers)])
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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        initial_state: torch.Tensor | None = None,
        interpolate_pos_encoding: bool | None = None,
        position_ids: torch.Tensor | None = None,
    ) -> BaseModelOutputWithPooling | tuple:
        r"""
        num_iterations (`int`, *optional*):
            Iterations per layer for this call (defaults to `config.num_iterations`, or in training a depth drawn
            by `config.iteration_sampling`).
        backprop_iterations (`int`, *optional*):
            Differentiate only the last k of the L·T iterations (defaults to `config.backprop_iterations`).
        initial_state (`torch.Tensor` of shape `(batch, num_tokens, hidden_size)`, *optional*):
            The state the first iteration starts from, in place of the embedding output (a carried state of the
            supervision steps, a perturbed start of test-time search); the inputs are still embedded for their
            padding mask, and `hidden_states` starts with it. None: the embedding output.
        interpolate_pos_encoding (`bool`, *optional*):
            Images only: resample the position table bicubically to the patch grid of the input (another
            resolution, a multiple of `patch_size`), the CLS position unchanged, as ViT's argument. Without it an
            input of another size than `config.image_size` is refused.
        position_ids (`torch.LongTensor` of shape `(batch_size, sequence_length)` or `(1, sequence_length)`, *optional*):
            As `HyperSetModel.forward`'s: sequences only, the row of the position table each token takes.

        `hidden_states`: the embedding output, then the state after every iteration of every layer (1 + L·T);
        `attentions`: the softmax maps of every iteration (L·T).
        """
        output_attentions = self.config.output_attentions if output_attentions is None else output_attentions
        output_hidden_states = (
            self.config.output_hidden_states if output_hidden_states is None else output_hidden_states
        )
        return_dict = self.config.return_dict if return_dict is None else return_dict
        pixel_values, input_ids = route_main_input(self.config, pixel_values, input_ids)
        num_iterations = self._num_iterations(num_iterations)
        backprop_iterations = self._backprop_iterations(backprop_iterations, num_iterations)

        hidden_states, keep = self.embeddings(
            pixel_values=pixel_values,
            input_ids=input_ids,
            attention_mask=attention_mask,
            inputs_embeds=inputs_embeds,
            interpolate_pos_encoding=bool(interpolate_pos_encoding),
            position_ids=position_ids,
        )
        if initial_state is not None:
            hidden_states = check_initial_state(initial_state, hidden_states)
        attention_bias = None  # built once for all iterations: (B, N) → (B, 1, 1, N)
        if keep is not None:
            blocked = torch.finfo(hidden_states.dtype).min  # finite: a fully padded row stays NaN-free
            attention_bias = hidden_states.new_zeros(keep.shape).masked_fill(~keep, blocked)[:, None, None]
        all_hidden_states = (hidden_states,) if output_hidden_states else None
        all_attentions = () if output_attentions else None
        for index, layer in enumerate(self.layers):
            for t in range(num_iterations):
                # truncated backpropagation through depth: only the last k of the L·T iterations build a graph
                with self._iteration_grad(index, t, num_iterations, backprop_iterations, len(self.layers)):
                    hidden_states, probs = layer(hidden_states, attention_bias, output_attentions)
                if output_hidden_states:
                    all_hidden_states += (hidden_states,)
                if output_attentions:
                    all_attentions += (probs,)

        pooled = self._pool(hidden_states, keep) if self.add_pooling_layer else None
        output = BaseModelOutputWithPooling(
            last_hidden_state=hidden_states,
            pooler_output=pooled,
            hidden_states=all_hidden_states,
            attentions=all_attentions,
        )
        return output if return_dict else output.to_tuple()


class LoopedTransformerHead(RecurrentDepthHeadMixin, LoopedTransformerPreTrainedModel):
    """The base of the baseline's heads, as Hyper-SET's (`HyperSetHead`): backbone → Hyper-SET's head, its
    LayerNorm or RMSNorm (`classifier_norm`) → Linear with or without bias (`classifier_bias`; `nn.Identity()` when
    num_labels == 0), on the pooled token or, per token, on every token; `classify` is Hyper-SET's
    (`RecurrentDepthHeadMixin`). The baseline has no energy: test-time search selects by confidence
    unless told otherwise, refuses the energy selector, and leaves `search_energies` None."""

    _output_class: type[ModelOutput] = LoopedTransformerImageClassifierOutput

    def __init__(self, config: LoopedTransformerConfig) -> None:
        super().__init__(config)
        check_head_input_type(self, config.input_type, self._input_type)
        self.looped_transformer = LoopedTransformerModel(config)
        self._build_head(config)  # Hyper-SET's head, so a side-by-side pair differs in the trunk only
        self.post_init()


class LoopedTransformerForImageClassification(LoopedTransformerHead):
    """Classifies the pooled (CLS) token of an image."""

    def forward(
        self,
        pixel_values: torch.Tensor | None = None,
        labels: torch.Tensor | None = None,
        num_iterations: int | None = None,
        backprop_iterations: int | None = None,
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        halting_threshold: float | None = None,
        search_trajectories: int | None = None,
        search_noise: float | None = None,
        search_seed: int | None = None,
        search_selector: str | None = None,
        interpolate_pos_encoding: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> LoopedTransformerImageClassifierOutput | tuple:
        r"""
        halting_threshold, the `search_*` arguments, `interpolate_pos_encoding` and `num_items_in_batch`: as
        `HyperSetForImageClassification.forward` (the baseline has no energy: the selector defaults to
        `"confidence"`, and `"energy"` is refused).
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
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
            interpolate_pos_encoding=interpolate_pos_encoding,
        )


class LoopedTransformerSequenceHead(LoopedTransformerHead):
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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        halting_threshold: float | None = None,
        search_trajectories: int | None = None,
        search_noise: float | None = None,
        search_seed: int | None = None,
        search_selector: str | None = None,
        position_ids: torch.Tensor | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> LoopedTransformerSequenceClassifierOutput | LoopedTransformerTokenClassifierOutput | tuple:
        r"""
        halting_threshold, the `search_*` arguments and `num_items_in_batch`: as
        `HyperSetForImageClassification.forward` (the baseline
        has no energy: the selector defaults to `"confidence"`, and `"energy"` is refused); `position_ids`: as
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
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )


class LoopedTransformerForSequenceClassification(LoopedTransformerSequenceHead):
    """Classifies the pooled token of a sequence (first token or masked mean)."""

    _output_class = LoopedTransformerSequenceClassifierOutput


class LoopedTransformerForTokenClassification(LoopedTransformerSequenceHead):
    """Classifies every token (e.g. Sudoku cells)."""

    _per_token = True
    _output_class = LoopedTransformerTokenClassifierOutput


# --- masked image modelling ---
# The baseline's head for the paper's third task, with the contract of `HyperSetForMaskedImageModeling`: code ids
# in, logits over the codebook out; the checks, the masked cross-entropy and MaskGIT decoding are Hyper-SET's
# (`MaskedImageModelingMixin`).
class LoopedTransformerForMaskedImageModeling(MaskedImageModelingMixin, LoopedTransformerPreTrainedModel):
    """Masked image modelling over a grid of VQ codes with the looped Transformer: the baseline of the paper's
    Table 2 (preset `mim-1-12-4d`, 1 layer × 12 iterations, GELU MLP of width 4d).

    Same inputs, outputs and `decode` as `HyperSetForMaskedImageModeling`: `input_ids` `(B, N)` codes in [0, K)
    with [MASK] = K = `config.vocab_size − 1`; logits `(B, N, K)`; `labels` the true codes where the loss is taken
    and −100 elsewhere. Structure: the sequence backbone, then the head of Hyper-SET's MIM model, the classifier norm
    (`classifier_norm`) → Linear(d, K) (bias: `classifier_bias`); the presets' is RMSNorm → Linear with bias, as
    Hyper-SET's, so the two differ in the trunk only.
    """

    main_input_name = "input_ids"
    _output_class = MaskedLMOutput

    def __init__(self, config: LoopedTransformerConfig) -> None:
        super().__init__(config)
        check_masked_image_modeling_head(self, config)
        self.looped_transformer = LoopedTransformerModel(config)
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
        output_attentions: bool | None = None,
        output_hidden_states: bool | None = None,
        return_dict: bool | None = None,
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> MaskedLMOutput | tuple:
        r"""
        labels (`torch.LongTensor` of shape `(batch_size, sequence_length)`, *optional*):
            The true code of every position where the loss is taken (the masked ones), −100 elsewhere; the loss is
            the mean cross-entropy over those positions (0 where there are none).
        num_iterations (`int`, *optional*):
            Iterations per layer for this call (defaults to `config.num_iterations`).
        backprop_iterations (`int`, *optional*):
            Differentiate only the last k of the L·T iterations (defaults to `config.backprop_iterations`).
        num_items_in_batch (`torch.Tensor` or `int`, *optional*):
            As `HyperSetForMaskedImageModeling.forward`'s.
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
            output_attentions=output_attentions,
            output_hidden_states=output_hidden_states,
        )


__all__ = [
    "LoopedTransformerForImageClassification",
    "LoopedTransformerForMaskedImageModeling",
    "LoopedTransformerForSequenceClassification",
    "LoopedTransformerForTokenClassification",
    "LoopedTransformerHead",
    "LoopedTransformerModel",
    "LoopedTransformerPreTrainedModel",
    "LoopedTransformerSequenceHead",
]
