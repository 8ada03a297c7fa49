"""Hyper-SET: the authors' image classifier and Sudoku model (their positional tables, attention, both sources)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from transformers import PreTrainedConfig, PreTrainedModel

from ...configuration.configuration_hyperset import HyperSetConfig
from ...modeling.modeling_hyperset import HyperSetForImageClassification, HyperSetForTokenClassification
from ..processing import cell_tokenizer
from .base import (
    KEPT_KWARGS,
    REQUIRED,
    ConversionError,
    NotExpressible,
    OfficialSource,
    ProcessorLike,
    layer_norm_of,
    linear_of,
    make_image_processor,
    rms_norm_eps,
    square_image_side,
)


def _official_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Hyper-SET IC `sinusoidal_positional_embedding`: float64 numpy, interleaved sin/cos, stored float32."""
    position = np.arange(num_positions)[:, None]
    div = np.exp(np.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    table = np.zeros((num_positions, dim))
    table[:, 0::2] = np.sin(position * div)
    table[:, 1::2] = np.cos(position * div)
    return torch.from_numpy(table).float()


def official_board_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Hyper-SET Sudoku `pos_emb="sincos"` (MAE's `get_2d_sincos_pos_embed` over the √N × √N board), float32.

    float64 numpy: grid = meshgrid(arange(side), arange(side)) (x first: the column), each axis gets dim/2
    channels [sin(p ω) | cos(p ω)] with ω_k = 1 / 10000^(k / (dim/4)); the column block comes first.
    """
    side, half = math.isqrt(num_positions), dim // 2
    grid = np.stack(np.meshgrid(np.arange(side, dtype=np.float32), np.arange(side, dtype=np.float32)))

    def axis(coordinate: np.ndarray) -> np.ndarray:
        omega = 1.0 / 10000 ** (np.arange(half // 2, dtype=np.float64) / (half / 2.0))
        angles = np.einsum("m,d->md", coordinate.reshape(-1), omega)  # (N, dim/4)
        return np.concatenate([np.sin(angles), np.cos(angles)], axis=1)  # (N, dim/2)

    return torch.from_numpy(np.concatenate([axis(grid[0]), axis(grid[1])], axis=1)).float()


def official_time_sinusoid(steps: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Hyper-SET `SinusoidalPosEmb(dim)(arange(1, T+1))` in the run's (default) dtype: cat(sin, cos)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=dtype) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(1, steps + 1, dtype=dtype)[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def hyperset_attention(
    x: torch.Tensor, weight: torch.Tensor, gains: Sequence[torch.Tensor], heads: int
) -> torch.Tensor:
    """Official HyperSETAttention / Sudoku SelfAttention: tied W, RMS-normalised heads, bi-softmax."""
    batch, tokens, dim = x.shape
    dh = dim // heads
    w = F.linear(x, weight).view(batch, tokens, heads, dh).transpose(1, 2)  # (B, H, N, dh)
    n1, n2, n3 = (rms_norm_eps(w, gain) for gain in gains)
    scores = torch.einsum("bhif,bhjf->bhij", n1, n2) / math.sqrt(dh)
    probs = scores.softmax(-1) + scores.softmax(-2)
    y = torch.einsum("bhij,bhjf->bihf", probs, n3).flatten(2)  # (B, N, H, dh) → (B, N, d)
    return F.linear(y, weight.t())


class HyperSetICSource(OfficialSource):
    """`ic/models.py` `HyperSET` (huyunzhe/hyper-set), the image classifier."""

    name = "hyperset-ic"
    official_class = "HyperSET (ic/models.py)"
    repository = "https://github.com/huyunzhe/hyper-set"
    head_class = HyperSetForImageClassification
    layer_norm_eps = 1e-5
    spec = {
        "num_classes": REQUIRED,
        "img_size": REQUIRED,
        "patch": REQUIRED,
        "dropout": 0.0,
        "n_layer": REQUIRED,
        "n_recur": REQUIRED,
        "n_embd": REQUIRED,
        "head": REQUIRED,
        "mlp_hidden": REQUIRED,
        "use_cls_token": True,
        "input_cond": False,
        "time_embed": 512,
        "type": "hyper-set",
    }
    ignored = {}
    training_only = ("dropout",)

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        if kwargs["type"] != "hyper-set":
            raise NotExpressible(f"{where}: model type {kwargs['type']!r}; only 'hyper-set' converts")
        if not kwargs["use_cls_token"]:
            raise NotExpressible(
                f"{where}: use_cls_token=False is not expressible (our image models pool the CLS token)"
            )
        if kwargs["img_size"] % kwargs["patch"]:
            raise ConversionError(
                f"{where}: img_size is not divisible by patch (the number of patches per side)"
            )
        if kwargs["n_embd"] % kwargs["head"]:
            raise ConversionError(f"{where}: n_embd is not divisible by head")

    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        d, m, te = kwargs["n_embd"], kwargs["mlp_hidden"], kwargs["time_embed"]
        dh, features = d // kwargs["head"], (kwargs["img_size"] // kwargs["patch"]) ** 2 * 3
        e, s = "hyperset.embeddings.", "hyperset.step_sizes."
        out = {
            "cls_token": ((1, 1, d), e + "cls_token"),
            "emb.0.weight": ((features,), e + "patch_norm.weight"),
            "emb.0.bias": ((features,), e + "patch_norm.bias"),
            "emb.1.weight": ((d, features), e + "projection.weight"),
            "emb.1.bias": ((d,), e + "projection.bias"),
            "emb.2.weight": ((d,), e + "norm.weight"),
            "emb.2.bias": ((d,), e + "norm.bias"),
            "time_mlp.0.1.weight": ((d, te), s + "time_mlp.0.weight"),
            "time_mlp.0.1.bias": ((d,), s + "time_mlp.0.bias"),
            "time_mlp.0.2.weight": ((d,), s + "time_mlp.1.weight"),
            "time_mlp.0.4.weight": ((d,), s + "time_mlp.3.weight"),
            "time_mlp.0.5.weight": ((d, d), s + "time_mlp.4.weight"),
            "time_mlp.0.5.bias": ((d,), s + "time_mlp.4.bias"),
            "time_mlp.0.6.weight": ((d,), s + "time_mlp.5.weight"),
            "time_mlp.1.1.weight": ((2 * d, d), s + "proj.weight"),
            "time_mlp.1.1.bias": ((2 * d,), s + "proj.bias"),
            "ln_inp.weight": ((d,), s + "condition_norm.weight"),
        }
        for i in range(kwargs["n_layer"]):
            b, o = f"enc.{i}.", f"hyperset.layers.{i}."
            out[b + "attn.qkv.weight"] = ((d, d), o + "attention.qkv_proj.weight")
            for role in (1, 2, 3):
                out[f"{b}attn.ln1_{role}.weight"] = ((dh,), None)  # rows of our qkv_gain (q, k, v)
            out[b + "ln2.weight"] = ((m,), o + "feedforward.norm.weight")
            out[b + "mlp.weight"] = ((m, d), o + "feedforward.dictionary.weight")
        out["fc.0.weight"] = ((d,), "layernorm.weight")
        out["fc.0.bias"] = ((d,), "layernorm.bias")
        if kwargs["num_classes"] > 0:
            out["fc.1.weight"] = ((kwargs["num_classes"], d), "classifier.weight")
            out["fc.1.bias"] = ((kwargs["num_classes"],), "classifier.bias")
        return out

    def config(self, kwargs: dict[str, Any]) -> HyperSetConfig:
        return HyperSetConfig(
            input_type="image",
            hidden_size=kwargs["n_embd"],
            num_attention_heads=kwargs["head"],
            intermediate_size=kwargs["mlp_hidden"],
            num_hidden_layers=kwargs["n_layer"],
            num_iterations=kwargs["n_recur"],
            qkv_norm="separate",
            step_size_condition="input" if kwargs["input_cond"] else "current",
            hidden_act="gelu",
            attention_energy="bisoftmax",
            feedforward_energy="relu",
            iteration_conditioning="sinusoidal",
            time_embedding_dim=kwargs["time_embed"],
            image_size=kwargs["img_size"],
            patch_size=kwargs["img_size"] // kwargs["patch"],
            num_channels=3,
            pooling="cls",
            rms_norm_eps=None,
            layer_norm_eps=self.layer_norm_eps,
            num_labels=kwargs["num_classes"],
        )

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        required = {
            "input_type": "image",
            "num_channels": 3,
            "qkv_norm": "separate",
            "hidden_act": "gelu",
            "attention_energy": "bisoftmax",
            "feedforward_energy": "relu",
            "iteration_conditioning": "sinusoidal",
            "pooling": "cls",
            "rms_norm_eps": None,
            "layer_norm_eps": self.layer_norm_eps,
        }
        for name, official in required.items():
            if getattr(config, name) != official:
                raise NotExpressible(
                    f"the official HyperSET fixes {name}={official!r}; this model has {getattr(config, name)!r}"
                )
        size = square_image_side(config, "HyperSET")
        return {
            "num_classes": config.num_labels,
            "img_size": size,
            "patch": size // config.patch_size,
            "dropout": 0.0,
            "n_layer": config.num_hidden_layers,
            "n_recur": config.num_iterations,
            "n_embd": config.hidden_size,
            "head": config.num_attention_heads,
            "mlp_hidden": config.intermediate_size,
            "use_cls_token": True,
            "input_cond": config.step_size_condition == "input",
            "time_embed": config.time_embedding_dim,
            "type": "hyper-set",
        }

    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        return {
            f"hyperset.layers.{i}.attention.qkv_gain": torch.stack(
                [state[f"enc.{i}.attn.ln1_{role}.weight"] for role in (1, 2, 3)]
            )
            for i in range(kwargs["n_layer"])
        }

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        out = {}
        for i in range(config.num_hidden_layers):
            gains = ours[f"hyperset.layers.{i}.attention.qkv_gain"]
            for role in (1, 2, 3):
                out[f"enc.{i}.attn.ln1_{role}.weight"] = gains[role - 1]
        return out

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        return [
            'Feedforward activation: **GELU** (`hidden_act="gelu"`), as in the official image model; the '
            "presets of this package use ReLU, the exact gradient of the paper's energy.",
            f'Step sizes from `time_mlp` over the iteration sinusoid (`iteration_conditioning="sinusoidal"`, '
            f"width {kwargs['time_embed']}), conditioned on "
            + ("the embedded input x₀." if kwargs["input_cond"] else "the current state x_t."),
            "Separate q/k/v RMSNorm gains; RMSNorm eps = machine epsilon of the dtype; LayerNorm eps 1e-5.",
            f"Training-only settings not represented: `dropout` (kept in config.json `{KEPT_KWARGS}`).",
        ]

    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        p = {key: value.to(dtype) for key, value in state.items()}
        d, heads, steps = kwargs["n_embd"], kwargs["head"], kwargs["n_recur"]
        ps, eps = kwargs["img_size"] // kwargs["patch"], self.layer_norm_eps
        images = inputs.to(dtype)
        batch = images.shape[0]
        # (B, C, H, W) → (B, C, P, P, ps, ps) → (B, P, P, ps, ps, C) → (B, P², ps·ps·C), P = kwargs["patch"]
        words = (
            images.unfold(2, ps, ps)
            .unfold(3, ps, ps)
            .permute(0, 2, 3, 4, 5, 1)
            .reshape(batch, kwargs["patch"] ** 2, -1)
        )
        tokens = layer_norm_of(linear_of(layer_norm_of(words, p, "emb.0", eps), p, "emb.1"), p, "emb.2", eps)
        x0 = torch.cat([p["cls_token"].repeat(batch, 1, 1), tokens], dim=1)
        x0 = x0 + _official_positions(x0.shape[1], d).to(dtype)
        t = linear_of(official_time_sinusoid(steps, kwargs["time_embed"], dtype), p, "time_mlp.0.1")
        t = rms_norm_eps(F.gelu(rms_norm_eps(t, p["time_mlp.0.2.weight"])), p["time_mlp.0.4.weight"])
        time_emb = rms_norm_eps(linear_of(t, p, "time_mlp.0.5"), p["time_mlp.0.6.weight"])
        x = x0
        for i in range(kwargs["n_layer"]):
            b = f"enc.{i}."
            for step in range(steps):
                source = x0 if kwargs["input_cond"] else x
                alpha, beta = linear_of(
                    F.gelu(time_emb[step] + rms_norm_eps(source, p["ln_inp.weight"])), p, "time_mlp.1.1"
                ).chunk(2, -1)
                gains = [p[f"{b}attn.ln1_{role}.weight"] for role in (1, 2, 3)]
                x = x - alpha * hyperset_attention(x, p[b + "attn.qkv.weight"], gains, heads)
                dictionary = p[b + "mlp.weight"]
                x = x + beta * F.linear(
                    F.gelu(rms_norm_eps(F.linear(x, dictionary), p[b + "ln2.weight"])), dictionary.t()
                )
        cls = layer_norm_of(x[:, 0], p, "fc.0", eps)
        return linear_of(cls, p, "fc.1") if kwargs["num_classes"] > 0 else cls

    def processor(
        self, config: PreTrainedConfig, mean: list[float], std: list[float]
    ) -> ProcessorLike | None:
        size = square_image_side(config, "HyperSET")
        return make_image_processor(size, size, 3, mean, std)


# The official Sudoku structure in HyperSetConfig terms: time MLP Linear → GELU → Linear and step sizes from
# GELU(c_t + x) without RMSNorms, an RMSNorm + bias-free Linear head.
SUDOKU_FIELDS = {"step_size_norm": "none", "classifier_norm": "rmsnorm", "classifier_bias": False}
# The official Sudoku `pos_emb` option -> our position_embedding_type.
POSITIONS = {"learnable": "learned", "sincos": "sincos-2d"}
# The label names of a 9 × 9 board's 9 classes: class k is the digit k + 1, as in the authors' targets and the
# built-in Sudoku data (`training.sudoku.DIGITS`; a test checks they stay equal, kept apart from that module's
# datasets import).
SUDOKU_DIGITS = [str(digit) for digit in range(1, 10)]


class HyperSetSudokuSource(OfficialSource):
    """`sudoku/models.py` `Model(ModelConfig(**kwargs))` with model_type "hyper-set" (huyunzhe/hyper-set)."""

    name = "hyperset-sudoku"
    official_class = "Model (sudoku/models.py)"
    repository = "https://github.com/huyunzhe/hyper-set"
    head_class = HyperSetForTokenClassification
    input_kind = "ids"
    spec = {
        "vocab_size": REQUIRED,
        "block_size": REQUIRED,
        "n_layer": REQUIRED,
        "n_head": REQUIRED,
        "n_embd": REQUIRED,
        "time_emb": 512,
        "multiplier": 4,
        "num_classes": REQUIRED,
        "n_recur": REQUIRED,
        "model_type": "hyper-set",
        "resid_pdrop": 0.1,
        "attn_pdrop": 0.1,
        "embd_pdrop": 0.1,
        "adaptive_mode": "gd_with_learnable_step_size",
        "phi_func": None,
        "pos_emb": "learnable",
        "input_cond": True,
    }
    ignored = {}
    training_only = ("resid_pdrop", "attn_pdrop", "embd_pdrop")

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        fixed = {"model_type": "hyper-set", "adaptive_mode": "gd_with_learnable_step_size", "phi_func": None}
        for name, value in fixed.items():
            if kwargs[name] != value:
                raise NotExpressible(f"{where}: {name}={kwargs[name]!r}; only {value!r} converts")
        if kwargs["pos_emb"] not in POSITIONS:
            raise NotExpressible(
                f"{where}: pos_emb={kwargs['pos_emb']!r}; expected one of {sorted(POSITIONS)} (the official "
                "learned table or the fixed row/column `sincos` table)"
            )
        if kwargs["n_embd"] % kwargs["n_head"]:
            raise ConversionError(f"{where}: n_embd is not divisible by n_head")
        if kwargs["pos_emb"] == "sincos":
            side = math.isqrt(kwargs["block_size"])
            if side * side != kwargs["block_size"] or kwargs["n_embd"] % 4:
                raise ConversionError(
                    f"{where}: pos_emb='sincos' needs a square block_size (a board; got {kwargs['block_size']}) "
                    f"and n_embd divisible by 4 (got {kwargs['n_embd']})"
                )

    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        d, n, te = kwargs["n_embd"], kwargs["block_size"], kwargs["time_emb"]
        m, dh = kwargs["multiplier"] * d, d // kwargs["n_head"]
        s = "hyperset.step_sizes."
        out = {
            "tok_emb.weight": ((kwargs["vocab_size"], d), "hyperset.embeddings.word_embeddings.weight"),
            "time_mlp.0.1.weight": ((d, te), s + "time_mlp.0.weight"),
            "time_mlp.0.1.bias": ((d,), s + "time_mlp.0.bias"),
            "time_mlp.0.3.weight": ((d, d), s + "time_mlp.2.weight"),
            "time_mlp.0.3.bias": ((d,), s + "time_mlp.2.bias"),
            "time_mlp.1.1.weight": ((2 * d, d), s + "proj.weight"),
            "time_mlp.1.1.bias": ((2 * d,), s + "proj.bias"),
        }
        if kwargs["pos_emb"] == "learnable":  # `sincos` is a fixed tensor outside the state_dict
            out["pos_emb"] = ((1, n, d), None)  # (1, N, d) parameter -> our (N, d) table
        for i in range(kwargs["n_layer"]):
            b, o = f"blocks.{i}.", f"hyperset.layers.{i}."
            out[b + "attn.ln1.weight"] = ((dh,), None)  # our qkv_gain (1, dh)
            out[b + "attn.mask"] = ((1, 1, n, n), None)  # unused causal buffer of the official class
            out[b + "attn.qkv.weight"] = ((d, d), o + "attention.qkv_proj.weight")
            out[b + "ln2.weight"] = ((m,), o + "feedforward.norm.weight")
            out[b + "mlp.weight"] = ((m, d), o + "feedforward.dictionary.weight")
        out["ln_f.weight"] = ((d,), "layernorm.weight")
        out["head.weight"] = ((kwargs["num_classes"], d), "classifier.weight")
        return out

    def config(self, kwargs: dict[str, Any]) -> HyperSetConfig:
        return HyperSetConfig(
            input_type="sequence",
            hidden_size=kwargs["n_embd"],
            num_attention_heads=kwargs["n_head"],
            intermediate_size=kwargs["multiplier"] * kwargs["n_embd"],
            num_hidden_layers=kwargs["n_layer"],
            num_iterations=kwargs["n_recur"],
            qkv_norm="shared",
            step_size_condition="input" if kwargs["input_cond"] else "current",
            hidden_act="relu",
            attention_energy="bisoftmax",
            feedforward_energy="relu",
            iteration_conditioning="sinusoidal",
            time_embedding_dim=kwargs["time_emb"],
            vocab_size=kwargs["vocab_size"],
            max_position_embeddings=kwargs["block_size"],
            position_embedding_type=POSITIONS[kwargs["pos_emb"]],
            rms_norm_eps=None,
            **self.labels(kwargs),
            **SUDOKU_FIELDS,
        )

    def labels(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        """The config's labels: the digits on a Sudoku board (ten cell values, nine classes), as `energyformers
        train --dataset sudoku` names them; transformers' LABEL_k for any other board."""
        if kwargs["vocab_size"] == 10 and kwargs["num_classes"] == len(SUDOKU_DIGITS):
            return {
                "id2label": dict(enumerate(SUDOKU_DIGITS)),
                "label2id": {digit: k for k, digit in enumerate(SUDOKU_DIGITS)},
            }
        return {"num_labels": kwargs["num_classes"]}

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        required = {
            "input_type": "sequence",
            "qkv_norm": "shared",
            "hidden_act": "relu",
            "attention_energy": "bisoftmax",
            "feedforward_energy": "relu",
            "iteration_conditioning": "sinusoidal",
            "rms_norm_eps": None,
            **SUDOKU_FIELDS,
        }
        positions = {ours: official for official, ours in POSITIONS.items()}
        if config.position_embedding_type not in positions:
            raise NotExpressible(
                f"the official Sudoku Model has learned or row/column positions ({sorted(positions)}); this "
                f"model has position_embedding_type={config.position_embedding_type!r}"
            )
        for name, official in required.items():
            if getattr(config, name, None) != official:
                raise NotExpressible(
                    f"the official Sudoku Model fixes {name}={official!r}; this model has "
                    f"{getattr(config, name, None)!r}"
                )
        if config.intermediate_size % config.hidden_size:
            raise NotExpressible(
                "the official Sudoku Model needs intermediate_size = multiplier × hidden_size"
            )
        return {
            "vocab_size": config.vocab_size,
            "block_size": config.max_position_embeddings,
            "n_layer": config.num_hidden_layers,
            "n_head": config.num_attention_heads,
            "n_embd": config.hidden_size,
            "time_emb": config.time_embedding_dim,
            "multiplier": config.intermediate_size // config.hidden_size,
            "num_classes": config.num_labels,
            "n_recur": config.num_iterations,
            "model_type": "hyper-set",
            "resid_pdrop": 0.0,
            "attn_pdrop": 0.0,
            "embd_pdrop": 0.0,
            "adaptive_mode": "gd_with_learnable_step_size",
            "phi_func": None,
            "pos_emb": positions[config.position_embedding_type],
            "input_cond": config.step_size_condition == "input",
        }

    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        out = {}
        if kwargs["pos_emb"] == "learnable":
            out["hyperset.embeddings.position_embeddings.weight"] = state["pos_emb"][0]
        for i in range(kwargs["n_layer"]):
            out[f"hyperset.layers.{i}.attention.qkv_gain"] = state[f"blocks.{i}.attn.ln1.weight"][None]
        return out

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        n = config.max_position_embeddings
        out = {}
        if config.position_embedding_type == "learned":
            out["pos_emb"] = ours["hyperset.embeddings.position_embeddings.weight"][None]
        for i in range(config.num_hidden_layers):
            out[f"blocks.{i}.attn.ln1.weight"] = ours[f"hyperset.layers.{i}.attention.qkv_gain"][0]
            # (n, n) → (1, 1, n, n): the official causal-mask buffer
            out[f"blocks.{i}.attn.mask"] = torch.tril(torch.ones(n, n, dtype=torch.float64)).view(1, 1, n, n)
        return out

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        return [
            'Feedforward activation: **ReLU** (`hidden_act="relu"`), as in the official Sudoku model.',
            'One shared q/k/v RMSNorm gain (`qkv_norm="shared"`); step sizes from Linear-GELU-Linear over the '
            "iteration sinusoid with no RMSNorms, conditioned on "
            + ("the embedded puzzle x₀." if kwargs["input_cond"] else "the current state x_t."),
            "Positions: "
            + (
                'learned (`position_embedding_type="learned"`, the official `pos_emb` parameter).'
                if kwargs["pos_emb"] == "learnable"
                else 'the fixed row/column table of `pos_emb="sincos"` (`position_embedding_type="sincos-2d"`: '
                "channels [:d/2] the column, [d/2:] the row, each [sin | cos], rounded to float32 as theirs)."
            ),
            "Head: RMSNorm + bias-free Linear, per-cell logits over the 9 digits.",
            "`blocks.*.attn.mask` (an unused causal buffer of the official class) is rebuilt on the way back.",
            f"Training-only settings not represented: the official dropout rates (kept in config.json "
            f"`{KEPT_KWARGS}`).",
        ]

    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        p = {key: value.to(dtype) for key, value in state.items()}
        heads, steps = kwargs["n_head"], kwargs["n_recur"]
        if kwargs["pos_emb"] == "learnable":
            positions = p["pos_emb"]
        else:  # a float32 table, promoted when added in a float64 run
            positions = official_board_positions(kwargs["block_size"], kwargs["n_embd"])[None].to(dtype)
        x0 = F.embedding(inputs, p["tok_emb.weight"]) + positions[:, : inputs.shape[1]]
        t = linear_of(
            F.gelu(linear_of(official_time_sinusoid(steps, kwargs["time_emb"], dtype), p, "time_mlp.0.1")),
            p,
            "time_mlp.0.3",
        )
        x = x0
        for i in range(kwargs["n_layer"]):
            b = f"blocks.{i}."
            for step in range(steps):
                source = x0 if kwargs["input_cond"] else x
                alpha, beta = linear_of(F.gelu(t[step] + source), p, "time_mlp.1.1").chunk(2, -1)
                gain = p[b + "attn.ln1.weight"]
                x = x - alpha * hyperset_attention(x, p[b + "attn.qkv.weight"], (gain, gain, gain), heads)
                dictionary = p[b + "mlp.weight"]
                x = x + beta * F.linear(
                    F.relu(rms_norm_eps(F.linear(x, dictionary), p[b + "ln2.weight"])), dictionary.t()
                )
        return F.linear(rms_norm_eps(x, p["ln_f.weight"]), p["head.weight"])

    def example_inputs(self, kwargs: dict[str, Any]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, kwargs["vocab_size"], (2, kwargs["block_size"]), generator=generator)

    def model_logits(self, model: PreTrainedModel, inputs: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            return model(input_ids=inputs).logits

    def processor(
        self, config: PreTrainedConfig, mean: list[float], std: list[float]
    ) -> ProcessorLike | None:
        return cell_tokenizer(config.max_position_embeddings) if config.vocab_size == 10 else None
