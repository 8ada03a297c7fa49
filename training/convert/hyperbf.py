"""HyperBF: the official `Hyper_ViT` of sunrainyg/Unified_architecture."""

from __future__ import annotations

import math
from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedConfig

from ...configuration.configuration_hyperbf import HyperBFConfig
from ...modeling.modeling_hyperbf import HyperBFForImageClassification
from .base import (
    REQUIRED,
    ConversionError,
    NotExpressible,
    OfficialSource,
    ProcessorLike,
    cholesky_or_refuse,
    layer_norm_of,
    linear_of,
    make_image_processor,
    square_image_side,
)


class HyperBFSource(OfficialSource):
    """`main.py` `Hyper_ViT` (sunrainyg/Unified_architecture).

    Attention. The official score −s·(qMq + kMk − 2 (qM)kᵀ), with a non-symmetric M (dh×dh, shared by the
    heads) and a scalar s, is a softmax over keys, so the row constant qMq drops out and it equals
    2s·qᵀMk − s·kᵀM_s k, M_s = (M + Mᵀ)/2. Ours is 2τ q'·k' − τ‖k'‖². With σ = sign(s), τ = |s| and the
    Cholesky factor σM_s = L Lᵀ: k' = Lᵀ k and q' = L⁻¹(σMᵀ) q give ‖k'‖² = σ kᵀM_s k and
    q'·k' = σ qᵀMk, i.e. exactly the official scores. Needs σM_s positive definite.

    RBF. dist_α = xᵀM_s x + cᵀM_s c − 2xᵀM c (M = M_RBF). With WᵀW = M_s (W = Lᵀ) and centers
    t_α = M_s⁻¹M c_α, ‖W(x − t_α)‖² = dist_α − δ_α with the constant δ_α = c_αᵀM_s c_α − t_αᵀM_s t_α, so
    exp(−β_α dist_α) = exp(−β_α δ_α) · exp(−‖W(x − t_α)‖²/(2σ_α²)), β_α = 1/(2σ_α²): the factor
    exp(−β_α δ_α) goes into column α of the output weights (`feedforward_kernel="gaussian"`,
    `rbf_width="center"`). Needs M_s positive definite and β_α > 0.
    """

    name = "hyperbf"
    official_class = "Hyper_ViT (main.py)"
    repository = "https://github.com/sunrainyg/Unified_architecture"
    head_class = HyperBFForImageClassification
    num_centers = 11  # hard-coded in Hyper_Block (mlp_hidden_dim = int(11))
    layer_norm_eps = 1e-5
    spec = {
        "img_size": 224,
        "patch_size": REQUIRED,
        "in_chans": 3,
        "num_classes": REQUIRED,
        "embed_dim": 768,
        "depth": REQUIRED,
        "num_heads": 4,
        "mlp_ratio": 4.0,
        "qkv_bias": False,
        "qk_scale": None,
        "drop_rate": 0.0,
        "attn_drop_rate": 0.0,
        "drop_path_rate": 0.0,
    }
    ignored = {  # main.py passes these, but Hyper_ViT swallows them into **kwargs
        key: "not a Hyper_ViT argument (swallowed by **kwargs in the official code)"
        for key in ("image_size", "dim", "heads", "mlp_dim", "dropout", "emb_dropout")
    }
    training_only = ("mlp_ratio", "qk_scale", "drop_path_rate")  # unused by Hyper_Block / init / training
    # `derive_back`: M = I and the temperatures folded into q, k; M_RBF = WᵀW with the moved centres and the folded
    # output weights; β from σ. The forward map is many-to-one, so these are not the converted tensors.
    recomputed_back = tuple(
        f"blocks.*.{key}"
        for key in (
            "attn.qkv.weight",
            "attn.M",
            "attn.scale",
            "mlp.M_RBF",
            "mlp.centers",
            "mlp.beta",
            "mlp.fc.weight",
        )
    )

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        if kwargs["qkv_bias"]:
            raise NotExpressible(f"{where}: qkv_bias=True; our q/k/v projections have no bias")
        if kwargs["embed_dim"] % kwargs["num_heads"]:
            raise ConversionError(f"{where}: embed_dim is not divisible by num_heads")

    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        dim, heads, k = kwargs["embed_dim"], kwargs["num_heads"], self.num_centers
        p, c = kwargs["patch_size"], kwargs["in_chans"]
        tokens = (kwargs["img_size"] // p) ** 2 + 1
        e = "hyperbf.embeddings."
        out = {
            "patch_embed.proj.weight": ((dim, c, p, p), e + "projection.weight"),
            "patch_embed.proj.bias": ((dim,), e + "projection.bias"),
            "cls_token": ((1, 1, dim), e + "cls_token"),
            "pos_embed": ((1, tokens, dim), e + "position_embeddings"),
        }
        for i in range(kwargs["depth"]):
            b, o = f"blocks.{i}.", f"hyperbf.layers.{i}."
            for official, ours in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
                out[f"{b}{official}.weight"] = ((dim,), f"{o}{ours}.weight")
                out[f"{b}{official}.bias"] = ((dim,), f"{o}{ours}.bias")
            out[b + "attn.qkv.weight"] = ((3 * dim, dim), None)
            out[b + "attn.M"] = ((dim // heads, dim // heads), None)
            out[b + "attn.scale"] = ((), None)
            out[b + "attn.proj.weight"] = ((dim, dim), o + "attention.o_proj.weight")
            out[b + "attn.proj.bias"] = ((dim,), o + "attention.o_proj.bias")
            out[b + "mlp.centers"] = ((k, dim), None)
            out[b + "mlp.M_RBF"] = ((dim, dim), None)
            out[b + "mlp.beta"] = ((k,), None)
            out[b + "mlp.fc.weight"] = ((dim, k), None)
            out[b + "mlp.fc.bias"] = ((dim,), o + "feedforward.values.bias")
        out["norm.weight"] = ((dim,), "hyperbf.layernorm.weight")
        out["norm.bias"] = ((dim,), "hyperbf.layernorm.bias")
        if kwargs["num_classes"] > 0:
            out["head.weight"] = ((kwargs["num_classes"], dim), "classifier.weight")
            out["head.bias"] = ((kwargs["num_classes"],), "classifier.bias")
        return out

    def config(self, kwargs: dict[str, Any]) -> HyperBFConfig:
        return HyperBFConfig(
            hidden_size=kwargs["embed_dim"],
            num_attention_heads=kwargs["num_heads"],
            num_hidden_layers=kwargs["depth"],
            num_centers=self.num_centers,
            rbf_projection_dim=kwargs["embed_dim"],
            feedforward_kernel="gaussian",
            rbf_width="center",
            hidden_dropout_prob=kwargs["drop_rate"],
            attention_probs_dropout_prob=kwargs["attn_drop_rate"],
            image_size=kwargs["img_size"],
            patch_size=kwargs["patch_size"],
            num_channels=kwargs["in_chans"],
            pooling="cls",
            layer_norm_eps=self.layer_norm_eps,
            num_labels=kwargs["num_classes"],
        )

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        checks = (
            (
                config.input_type == "image",
                f"input_type={config.input_type!r} (the official model takes images)",
            ),
            (
                config.feedforward_kernel == "gaussian",
                "feedforward_kernel='normalized' (official: exp(-beta d))",
            ),
            (
                config.num_centers == self.num_centers,
                f"num_centers={config.num_centers} (official: 11, hard-coded)",
            ),
            (config.pooling == "cls", "pooling='mean' (official: the CLS token)"),
            (
                config.layer_norm_eps == self.layer_norm_eps,
                f"layer_norm_eps={config.layer_norm_eps} (official: 1e-5)",
            ),
        )
        for ok, what in checks:
            if not ok:
                raise NotExpressible(f"the official Hyper_ViT cannot express {what}")
        return {
            "img_size": square_image_side(config, "Hyper_ViT"),
            "patch_size": config.patch_size,
            "in_chans": config.num_channels,
            "num_classes": config.num_labels,
            "embed_dim": config.hidden_size,
            "depth": config.num_hidden_layers,
            "num_heads": config.num_attention_heads,
            "mlp_ratio": 4.0,
            "qkv_bias": False,
            "qk_scale": None,
            "drop_rate": config.hidden_dropout_prob,
            "attn_drop_rate": config.attention_probs_dropout_prob,
            "drop_path_rate": 0.0,
        }

    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        dim, heads = kwargs["embed_dim"], kwargs["num_heads"]
        dh = dim // heads
        out = {}
        for i in range(kwargs["depth"]):
            b, o = f"blocks.{i}.", f"hyperbf.layers.{i}."
            weight = state[b + "attn.qkv.weight"]
            w_q, w_k, w_v = weight[:dim], weight[dim : 2 * dim], weight[2 * dim :]
            metric, scale = state[b + "attn.M"], float(state[b + "attn.scale"])
            if scale == 0.0:
                raise NotExpressible(
                    f"{b}attn.scale is 0: a constant attention has no Gaussian-kernel form here"
                )
            sign = 1.0 if scale > 0 else -1.0
            lower = cholesky_or_refuse(
                sign * (metric + metric.T) / 2, f"{b}attn.M (times the sign of attn.scale)"
            )
            q_map = torch.linalg.solve_triangular(lower, sign * metric.T, upper=False)  # q' = L⁻¹(σMᵀ) q
            out[o + "attention.q_proj.weight"] = torch.cat(
                [q_map @ w_q[h * dh : (h + 1) * dh] for h in range(heads)]
            )
            out[o + "attention.k_proj.weight"] = torch.cat(
                [lower.T @ w_k[h * dh : (h + 1) * dh] for h in range(heads)]
            )
            out[o + "attention.v_proj.weight"] = w_v
            out[o + "attention.log_temperature"] = torch.full(
                (heads,), math.log(abs(scale)), dtype=weight.dtype
            )

            rbf, centers, beta = state[b + "mlp.M_RBF"], state[b + "mlp.centers"], state[b + "mlp.beta"]
            if bool((beta <= 0).any()):
                raise NotExpressible(f"{b}mlp.beta has values <= 0; exp(-beta d) is then no Gaussian kernel")
            symmetric = (rbf + rbf.T) / 2
            lower = cholesky_or_refuse(symmetric, f"{b}mlp.M_RBF")
            moved = torch.cholesky_solve((centers @ rbf.T).T, lower).T  # rows t_α = M_s⁻¹ M c_α
            delta = (centers @ symmetric * centers).sum(-1) - (moved @ symmetric * moved).sum(-1)  # (K,)
            out[o + "feedforward.centers"] = moved
            out[o + "feedforward.metric"] = lower.T
            out[o + "feedforward.log_sigma"] = -0.5 * torch.log(2 * beta)
            out[o + "feedforward.values.weight"] = state[b + "mlp.fc.weight"] * torch.exp(-beta * delta)
        return out

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        dim, heads, k = config.hidden_size, config.num_attention_heads, config.num_centers
        dh = dim // heads
        out = {}
        for i in range(config.num_hidden_layers):
            b, o = f"blocks.{i}.", f"hyperbf.layers.{i}."
            tau = ours[o + "attention.log_temperature"].exp()
            ratio = (tau / tau[0]).sqrt().repeat_interleave(dh).unsqueeze(1)  # per-head τ_h folded into q, k
            out[b + "attn.qkv.weight"] = torch.cat(
                [
                    ours[o + "attention.q_proj.weight"] * ratio,
                    ours[o + "attention.k_proj.weight"] * ratio,
                    ours[o + "attention.v_proj.weight"],
                ]
            )
            out[b + "attn.M"] = torch.eye(dh, dtype=tau.dtype)
            # 0-d, as the official attn.scale: head 0's τ (the other heads' ratios to it are folded into q and k)
            out[b + "attn.scale"] = tau[0].reshape(())
            metric = ours[o + "feedforward.metric"]
            out[b + "mlp.M_RBF"] = metric.T @ metric
            out[b + "mlp.centers"] = ours[o + "feedforward.centers"]
            out[b + "mlp.beta"] = (0.5 * torch.exp(-2 * ours[o + "feedforward.log_sigma"])).expand(k).clone()
            out[b + "mlp.fc.weight"] = ours[o + "feedforward.values.weight"]
        return out

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        return [
            "Attention: the official non-symmetric metric M (d_h×d_h) and scalar scale are folded exactly into "
            "the q and k projections (Cholesky factor of the symmetric part) with τ = |scale| for every head.",
            'RBF feedforward: `feedforward_kernel="gaussian"`, `rbf_width="center"` (σ_α = 1/√(2β_α)); M_RBF '
            "becomes the metric W = Lᵀ (WᵀW = sym(M_RBF)), the centres move to sym(M_RBF)⁻¹ M_RBF c_α and the "
            "constant factor exp(−β_α δ_α) that the non-symmetric part leaves is folded into the output weights. "
            "Our `center_weights` diagnostics therefore differ from the official φ by that per-centre factor.",
            f"K = {self.num_centers} centres (hard-coded in the official Hyper_Block); LayerNorm eps 1e-5; CLS pooling.",
            "Inputs must have the constructor's img_size: the official bicubic `interpolate_pos_encoding` for "
            "other sizes is not reproduced.",
        ]

    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        p = {key: value.to(dtype) for key, value in state.items()}
        dim, heads = kwargs["embed_dim"], kwargs["num_heads"]
        eps = self.layer_norm_eps
        x = F.conv2d(
            inputs.to(dtype),
            p["patch_embed.proj.weight"],
            p["patch_embed.proj.bias"],
            stride=kwargs["patch_size"],
        )
        x = x.flatten(2).transpose(1, 2)  # (B, N, D)
        x = torch.cat([p["cls_token"].expand(x.shape[0], -1, -1), x], dim=1) + p["pos_embed"]
        batch, tokens, _ = x.shape
        for i in range(kwargs["depth"]):
            b = f"blocks.{i}."
            y = layer_norm_of(x, p, b + "norm1", eps)
            # (B, N, 3D) → (B, N, 3, H, dh) → (3, B, H, N, dh)
            qkv = (
                F.linear(y, p[b + "attn.qkv.weight"])
                .reshape(batch, tokens, 3, heads, dim // heads)
                .permute(2, 0, 3, 1, 4)
            )
            q, k, v = qkv[0], qkv[1], qkv[2]  # (B, H, N, dh)
            metric = p[b + "attn.M"]
            q_m = q @ metric
            qmq = (q * q_m).sum(-1, keepdim=True)
            kmk = (k * (k @ metric)).sum(-1, keepdim=True).transpose(-2, -1)
            dists = qmq + kmk + (-2 * (q_m @ k.transpose(-2, -1)))
            attn = torch.softmax(-dists * p[b + "attn.scale"], dim=-1)
            # (B, H, N, dh) → (B, N, H, dh) → (B, N, D)
            x = x + linear_of((attn @ v).transpose(1, 2).reshape(batch, tokens, dim), p, b + "attn.proj")
            z = layer_norm_of(x, p, b + "norm2", eps)
            rbf, centers = p[b + "mlp.M_RBF"], p[b + "mlp.centers"]
            x_m = z @ rbf
            dist = (
                (z * x_m).sum(-1, keepdim=True)
                + (centers * (centers @ rbf)).sum(-1)
                + (-2 * (x_m @ centers.T))
            )
            x = x + linear_of(torch.exp(-p[b + "mlp.beta"].unsqueeze(0) * dist), p, b + "mlp.fc")
        cls = layer_norm_of(x, p, "norm", eps)[:, 0]
        return linear_of(cls, p, "head") if kwargs["num_classes"] > 0 else cls

    def processor(
        self, config: PreTrainedConfig, mean: list[float], std: list[float]
    ) -> ProcessorLike | None:
        size = square_image_side(config, "Hyper_ViT")
        return make_image_processor(size, size, config.num_channels, mean, std)
