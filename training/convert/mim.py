"""Hyper-SET masked image modelling: the authors' `MaskTransformerUncond` (`mim/models.py`, model "hyper-set")."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedConfig, PreTrainedModel

from ...configuration.configuration_hyperset import HyperSetConfig
from ...modeling.modeling_hyperset import HyperSetForMaskedImageModeling
from .base import KEPT_KWARGS, ConversionError, NotExpressible, OfficialSource, linear_of, rms_norm_eps
from .hyperset import hyperset_attention, official_board_positions, official_time_sinusoid

# The authors' class tokenises a 256² image into a 16 × 16 grid (`patch_size = img_size // 16` is the grid side
# their 2-D sin-cos table is built for) and its HyperSET block asserts 256 tokens.
GRID_DIVISOR = 16

# Official `MaskTransformerUncond` state_dict name -> ours. The single HyperSET block has no layer index (their
# `n_layer` is not used by model "hyper-set"); its one RMSNorm(d_h) `ln1` is shared by q, k and v (our
# `qkv_gain` of shape (1, d_h), derived below).
OFFICIAL_TO_OURS = {
    "tok_emb.weight": "hyperset.embeddings.word_embeddings.weight",
    "transformer.qkv.weight": "hyperset.layers.0.attention.qkv_proj.weight",
    "transformer.ln1.weight": "hyperset.layers.0.attention.qkv_gain",
    "transformer.mlp.weight": "hyperset.layers.0.feedforward.dictionary.weight",
    "transformer.ln2.weight": "hyperset.layers.0.feedforward.norm.weight",
    "transformer.time_mlp.1.0.weight": "hyperset.step_sizes.condition_norm.weight",  # RMSNorm(e_t + x₀)
    "transformer.time_mlp.1.2.weight": "hyperset.step_sizes.proj.weight",
    "transformer.time_mlp.1.2.bias": "hyperset.step_sizes.proj.bias",
    "lm_head.0.weight": "layernorm.weight",
    "lm_head.1.weight": "code_head.weight",
    "lm_head.1.bias": "code_head.bias",
}
# Keys whose tensor changes shape on the way (not plain copies).
_DERIVED = {"transformer.ln1.weight"}

# The official MIM structure in HyperSetConfig terms (the fields of the `mim-*` presets).
MIM_FIELDS = {
    "input_type": "sequence",
    "num_hidden_layers": 1,
    "position_embedding_type": "sincos-2d",
    "qkv_norm": "shared",
    "step_size_condition": "input",
    "iteration_conditioning": "sinusoidal-no-mlp",
    "step_size_norm": "rmsnorm-sum",
    "hidden_act": "relu",
    "attention_energy": "bisoftmax",
    "feedforward_energy": "relu",
    "classifier_norm": "rmsnorm",
    "classifier_bias": True,
    "rms_norm_eps": None,
}


class HyperSetMIMSource(OfficialSource):
    """`mim/models.py` `MaskTransformerUncond(model="hyper-set")` (huyunzhe/hyper-set)."""

    name = "hyperset-mim"
    official_class = "MaskTransformerUncond (mim/models.py)"
    repository = "https://github.com/huyunzhe/hyper-set"
    head_class = HyperSetForMaskedImageModeling
    input_kind = "codes"
    reference_input = "golden/input/tokens"
    spec = {
        "model": "hyper-set",
        "img_size": 256,
        "codebook_size": 1024,
        "n_embd": 768,
        "n_layer": 1,
        "n_recur": 12,
        "head": 8,
        "multiplier": 4,
        "dropout": 0.1,
        "nclass": 10,
        "phi_func": None,
        "adaptive_mode": None,
    }
    ignored = {}
    # Accepted and given back, without effect on the computation of model "hyper-set": `n_layer` (one HyperSET
    # block is built whatever it says), `dropout` (the block has no dropout), `nclass` (the unconditional class
    # embeds no label).
    training_only = ("n_layer", "dropout", "nclass")

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        fixed = {"model": "hyper-set", "phi_func": None, "adaptive_mode": "gd_with_learnable_step_size"}
        for name, value in fixed.items():
            if kwargs[name] != value:
                raise NotExpressible(
                    f"{where}: {name}={kwargs[name]!r}; only {value!r} converts (the paper's Hyper-SET MIM model)"
                )
        if kwargs["n_embd"] % kwargs["head"]:
            raise ConversionError(
                f"{where}: n_embd={kwargs['n_embd']} is not divisible by head={kwargs['head']}"
            )
        if kwargs["n_embd"] % 4:
            raise ConversionError(
                f"{where}: n_embd={kwargs['n_embd']} must be divisible by 4 (the 2-D sin-cos positions)"
            )
        if kwargs["img_size"] // GRID_DIVISOR < 1:
            raise ConversionError(
                f"{where}: img_size={kwargs['img_size']} gives no code grid (side img_size // 16)"
            )

    @staticmethod
    def side(kwargs: dict[str, Any]) -> int:
        """Side of the square code grid: img_size // GRID_DIVISOR."""
        return kwargs["img_size"] // GRID_DIVISOR

    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        d, k = kwargs["n_embd"], kwargs["codebook_size"]
        m, dh = kwargs["multiplier"] * d, d // kwargs["head"]
        shapes = {
            "tok_emb.weight": (k + 1, d),
            "transformer.qkv.weight": (d, d),
            "transformer.ln1.weight": (dh,),
            "transformer.mlp.weight": (m, d),
            "transformer.ln2.weight": (m,),
            "transformer.time_mlp.1.0.weight": (d,),
            "transformer.time_mlp.1.2.weight": (2 * d, d),
            "transformer.time_mlp.1.2.bias": (2 * d,),
            "lm_head.0.weight": (d,),
            "lm_head.1.weight": (k, d),
            "lm_head.1.bias": (k,),
        }
        return {
            key: (shape, None if key in _DERIVED else OFFICIAL_TO_OURS[key]) for key, shape in shapes.items()
        }

    def config(self, kwargs: dict[str, Any]) -> HyperSetConfig:
        d = kwargs["n_embd"]
        return HyperSetConfig(
            hidden_size=d,
            num_attention_heads=kwargs["head"],
            intermediate_size=kwargs["multiplier"] * d,
            num_iterations=kwargs["n_recur"],
            time_embedding_dim=d,  # SinusoidalPosEmb(d), no MLP after it
            vocab_size=kwargs["codebook_size"] + 1,  # the last id is [MASK]
            max_position_embeddings=self.side(kwargs) ** 2,
            **MIM_FIELDS,
        )

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        for name, official in MIM_FIELDS.items():
            if getattr(config, name, None) != official:
                raise NotExpressible(
                    f"the official MaskTransformerUncond fixes {name}={official!r}; this model has "
                    f"{getattr(config, name, None)!r}"
                )
        d, n = config.hidden_size, config.max_position_embeddings
        side = math.isqrt(n)
        if config.time_embedding_dim != d or config.intermediate_size % d or side * side != n:
            raise NotExpressible(
                "the official MaskTransformerUncond needs time_embedding_dim = hidden_size, intermediate_size = "
                f"multiplier × hidden_size and a square grid; this model has time_embedding_dim="
                f"{config.time_embedding_dim}, intermediate_size={config.intermediate_size}, hidden_size={d}, "
                f"max_position_embeddings={n}"
            )
        return {
            "model": "hyper-set",
            "img_size": side * GRID_DIVISOR,
            "codebook_size": config.vocab_size - 1,
            "n_embd": d,
            "n_layer": 1,
            "n_recur": config.num_iterations,
            "head": config.num_attention_heads,
            "multiplier": config.intermediate_size // d,
            "dropout": 0.0,
            "nclass": 0,
            "phi_func": None,
            "adaptive_mode": "gd_with_learnable_step_size",
        }

    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {"hyperset.layers.0.attention.qkv_gain": state["transformer.ln1.weight"][None]}

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        return {"transformer.ln1.weight": ours["hyperset.layers.0.attention.qkv_gain"][0]}

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        side = self.side(kwargs)
        return [
            f"Input: a {side} × {side} grid of VQ codes in [0, {kwargs['codebook_size']}), [MASK] = "
            f"{kwargs['codebook_size']} (`vocab_size` = codebook + 1); output: logits over the codebook for every "
            "position (`HyperSetForMaskedImageModeling`, Auto class `AutoModelForMaskedImageModeling`).",
            'Positions: the fixed 2-D sin-cos table over the grid (`position_embedding_type="sincos-2d"`, MAE\'s '
            "`get_2d_sincos_pos_embed`, rounded to float32 as theirs).",
            "Step sizes: `RMSNorm → GELU → Linear(d, 2d)` on e_t + x₀, e_t the [sin | cos] sinusoid of width d of "
            'the iteration with no MLP (`iteration_conditioning="sinusoidal-no-mlp"`, `step_size_norm="rmsnorm-sum"`).',
            "One shared q/k/v RMSNorm gain; ReLU feedforward; head RMSNorm → Linear with bias; RMSNorm eps = "
            "machine epsilon of the dtype.",
            "The image tokenizer (MaskGIT's VQGAN in the paper) is not part of the checkpoint: pass one to "
            "`MaskedImageModelingPipeline` (`energyformers.mim`).",
            f"Settings without effect on this computation, kept in config.json `{KEPT_KWARGS}`: `n_layer`, "
            "`dropout`, `nclass`.",
        ]

    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        """The computation order of the `hyperset_mim` fixture JSON, `inputs` `(B, side, side)` or `(B, N)` codes."""
        p = {key: value.to(dtype) for key, value in state.items()}
        d, heads, steps = kwargs["n_embd"], kwargs["head"], kwargs["n_recur"]
        tokens = inputs.reshape(inputs.shape[0], -1)  # (B, side, side) or (B, N) → (B, N)
        positions = official_board_positions(self.side(kwargs) ** 2, d)[None]  # float32, promoted when added
        x0 = F.embedding(tokens, p["tok_emb.weight"]) + positions.to(dtype)
        e = official_time_sinusoid(steps, d, dtype)
        x = x0
        gain = p["transformer.ln1.weight"]
        dictionary = p["transformer.mlp.weight"]
        for step in range(steps):
            hidden = F.gelu(rms_norm_eps(e[step] + x0, p["transformer.time_mlp.1.0.weight"]))
            alpha, beta = linear_of(hidden, p, "transformer.time_mlp.1.2").chunk(2, -1)
            x = x - alpha * hyperset_attention(x, p["transformer.qkv.weight"], (gain, gain, gain), heads)
            feedforward = F.relu(rms_norm_eps(F.linear(x, dictionary), p["transformer.ln2.weight"]))
            x = x + beta * F.linear(feedforward, dictionary.t())
        return linear_of(rms_norm_eps(x, p["lm_head.0.weight"]), p, "lm_head.1")

    def example_inputs(self, kwargs: dict[str, Any]) -> torch.Tensor:
        # one grid, 40 % of it [MASK] (the paper's evaluation ratio): a full-size check stays a single forward
        generator = torch.Generator().manual_seed(0)
        side, k = self.side(kwargs), kwargs["codebook_size"]
        codes = torch.randint(0, k, (1, side, side), generator=generator)
        hidden = torch.rand(1, side, side, generator=generator) < 0.4
        return codes.masked_fill(hidden, k)

    def model_logits(self, model: PreTrainedModel, inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            # (B, side, side) or (B, N) → (B, N)
            return model(input_ids=inputs.reshape(inputs.shape[0], -1)).logits

    def processor_note(self, kwargs: dict[str, Any]) -> str:
        return (
            "No processor: the model reads VQ codes. An image tokenizer (MaskGIT's VQGAN, f16, codebook "
            f"{kwargs['codebook_size']}, for the authors' model) turns images into codes and back."
        )
