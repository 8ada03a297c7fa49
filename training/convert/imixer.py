"""iMixer: the official `MlpMixer` of Toshihiro-Ota/imixer."""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from transformers import PreTrainedConfig

from ...configuration.configuration_imixer import IMixerConfig
from ...modeling.modeling_imixer import IMixerForImageClassification
from .base import (
    REQUIRED,
    NotExpressible,
    OfficialSource,
    ProcessorLike,
    layer_norm_of,
    linear_of,
    make_image_processor,
    square_image_side,
)


class IMixerSource(OfficialSource):
    """`models/mlp_imixer.py` `MlpMixer` (Toshihiro-Ota/imixer, a timm 0.6.11 fork)."""

    name = "imixer"
    official_class = "MlpMixer (models/mlp_imixer.py)"
    repository = "https://github.com/Toshihiro-Ota/imixer"
    head_class = IMixerForImageClassification
    spec = {  # timm 0.6.11 MlpMixer defaults; the iMixer arguments have no default we know of
        "num_classes": 1000,
        "img_size": 224,
        "in_chans": 3,
        "patch_size": 16,
        "num_blocks": 8,
        "embed_dim": 512,
        "mlp_ratio": [0.5, 4.0],
        "drop_rate": 0.0,
        "drop_path_rate": 0.0,
        "nlhb": False,
        "stem_norm": False,
        "global_pool": "avg",
        "hidden_ratio": REQUIRED,
        "n_power_iterations": REQUIRED,
        "n_repeat": REQUIRED,
    }
    ignored = {}
    training_only = ("nlhb",)  # timm's head-bias initialisation
    coeff = 0.9  # iMlp's spectral-norm coefficient c, fixed in the official code
    layer_norm_eps = 1e-6

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        ratio = kwargs["mlp_ratio"]
        kwargs["mlp_ratio"] = [float(ratio), float(ratio)] if isinstance(ratio, (int, float)) else list(ratio)
        if kwargs["stem_norm"]:
            raise NotExpressible(f"{where}: stem_norm=True (a LayerNorm after the stem) is not expressible")
        if kwargs["global_pool"] != "avg":
            raise NotExpressible(f"{where}: global_pool={kwargs['global_pool']!r}; only 'avg' is expressible")
        if kwargs["n_repeat"] < 1:
            raise NotExpressible(f"{where}: n_repeat={kwargs['n_repeat']}; the converter needs n >= 1")

    def sizes(self, kwargs: dict[str, Any]) -> tuple[int, int, int, int, int]:
        """(D, tokens N, token-mixing width, channel-mixing width, the iMLP's hidden width) of the official kwargs."""
        dim = kwargs["embed_dim"]
        tokens = (kwargs["img_size"] // kwargs["patch_size"]) ** 2
        token_width = int(kwargs["mlp_ratio"][0] * dim)
        channel_width = int(kwargs["mlp_ratio"][1] * dim)
        return dim, tokens, token_width, channel_width, int(kwargs["hidden_ratio"] * token_width)

    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        dim, tokens, ds, dc, nh = self.sizes(kwargs)
        p, c = kwargs["patch_size"], kwargs["in_chans"]
        out = {
            "stem.proj.weight": ((dim, c, p, p), "imixer.embeddings.projection.weight"),
            "stem.proj.bias": ((dim,), "imixer.embeddings.projection.bias"),
        }
        for i in range(kwargs["num_blocks"]):
            b, o = f"blocks.{i}.", f"imixer.layers.{i}."
            linears = (
                ("mlp_tokens.fc1", "token_mixing.fc1", ds, tokens),
                ("mlp_tokens.fc2", "token_mixing.fc2", tokens, ds),
                ("mlp_channels.fc1", "channel_mixing.fc1", dc, dim),
                ("mlp_channels.fc2", "channel_mixing.fc2", dim, dc),
            )
            for official, ours in (("norm1", "layernorm_before"), ("norm2", "layernorm_after")):
                out[f"{b}{official}.weight"] = ((dim,), f"{o}{ours}.weight")
                out[f"{b}{official}.bias"] = ((dim,), f"{o}{ours}.bias")
            for official, ours, rows, cols in linears:
                out[f"{b}{official}.weight"] = ((rows, cols), f"{o}{ours}.weight")
                out[f"{b}{official}.bias"] = ((rows,), f"{o}{ours}.bias")
            for layer, rows, cols in (("fc_sn1", nh, ds), ("fc_sn2", ds, nh)):
                official, ours = f"{b}mlp_tokens.{layer}", f"{o}token_mixing.{layer}"
                out[f"{official}.weight_orig"] = ((rows, cols), f"{ours}.parametrizations.weight.original")
                out[f"{official}.bias"] = ((rows,), f"{ours}.bias")
                out[f"{official}.weight_u"] = ((rows,), f"{ours}.parametrizations.weight.0.u")
                out[f"{official}.weight_v"] = ((cols,), f"{ours}.parametrizations.weight.0.v")
                out[f"{official}.weight_sigma"] = ((1,), None)  # logging only; recomputed on the way back
        out["norm.weight"] = ((dim,), "imixer.layernorm.weight")
        out["norm.bias"] = ((dim,), "imixer.layernorm.bias")
        if kwargs["num_classes"] > 0:
            out["head.weight"] = ((kwargs["num_classes"], dim), "classifier.weight")
            out["head.bias"] = ((kwargs["num_classes"],), "classifier.bias")
        return out

    def config(self, kwargs: dict[str, Any]) -> IMixerConfig:
        return IMixerConfig(
            hidden_size=kwargs["embed_dim"],
            num_hidden_layers=kwargs["num_blocks"],
            patch_size=kwargs["patch_size"],
            image_size=kwargs["img_size"],
            num_channels=kwargs["in_chans"],
            token_mixing_ratio=kwargs["mlp_ratio"][0],
            channel_mixing_ratio=kwargs["mlp_ratio"][1],
            hidden_ratio=kwargs["hidden_ratio"],
            fixed_point_iterations=kwargs["n_repeat"],
            spectral_norm_coeff=self.coeff,
            spectral_norm_power_iterations=kwargs["n_power_iterations"],
            hidden_dropout_prob=kwargs["drop_rate"],
            drop_path_rate=kwargs["drop_path_rate"],
            layer_norm_eps=self.layer_norm_eps,
            num_labels=kwargs["num_classes"],
        )

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        if config.input_type != "image" or config.fixed_point_iterations < 1:
            raise NotExpressible("the official MlpMixer takes images and has the contractive block (n >= 1)")
        fixed = (
            ("spectral_norm_coeff", self.coeff),
            ("layer_norm_eps", self.layer_norm_eps),
            ("contractive_normalization", "spectral"),
            ("token_mixing_activation", "gelu"),
            ("fixed_point_contraction", None),
        )
        for name, official in fixed:
            if getattr(config, name, official) != official:
                raise NotExpressible(
                    f"the official iMixer fixes {name}={official!r}; this model has {getattr(config, name)!r}"
                )
        return {
            "num_classes": config.num_labels,
            "img_size": square_image_side(config, "MlpMixer"),
            "in_chans": config.num_channels,
            "patch_size": config.patch_size,
            "num_blocks": config.num_hidden_layers,
            "embed_dim": config.hidden_size,
            "mlp_ratio": [config.token_mixing_ratio, config.channel_mixing_ratio],
            "drop_rate": config.hidden_dropout_prob,
            "drop_path_rate": config.drop_path_rate,
            "nlhb": False,
            "stem_norm": False,
            "global_pool": "avg",
            "hidden_ratio": config.hidden_ratio,
            "n_power_iterations": config.spectral_norm_power_iterations,
            "n_repeat": config.fixed_point_iterations,
        }

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        out = {}
        for i in range(config.num_hidden_layers):
            for layer in ("fc_sn1", "fc_sn2"):
                prefix = f"imixer.layers.{i}.token_mixing.{layer}.parametrizations.weight."
                weight, u, v = ours[prefix + "original"], ours[prefix + "0.u"], ours[prefix + "0.v"]
                # what the official eval forward writes into the logging buffer: σ = u·(W v)
                out[f"blocks.{i}.mlp_tokens.{layer}.weight_sigma"] = torch.dot(
                    u, torch.mv(weight, v)
                ).reshape(1)
        return out

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        return [
            f"iMLP token mixer with n = {kwargs['n_repeat']} fixed-point steps, soft spectral normalisation "
            f"c = {self.coeff} from the stored power-iteration vectors u, v (eval mode uses them as stored).",
            "LayerNorm eps 1e-6 (timm's Mixer); exact (erf) GELU; mean pooling; no CLS token or positions.",
            "`weight_sigma` buffers are logging only (no effect on outputs) and are not part of our model.",
        ]

    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        p = {key: value.to(dtype) for key, value in state.items()}
        one = torch.ones(1, dtype=dtype)
        x = F.conv2d(
            inputs.to(dtype), p["stem.proj.weight"], p["stem.proj.bias"], stride=kwargs["patch_size"]
        )
        x = x.flatten(2).transpose(1, 2)  # (B, D, h, w) -> (B, S, D)
        eps = self.layer_norm_eps

        def normalised(name: str) -> torch.Tensor:
            weight = p[f"{name}.weight_orig"]
            sigma = torch.dot(p[f"{name}.weight_u"], torch.mv(weight, p[f"{name}.weight_v"]))
            return weight / torch.max(one, sigma / self.coeff)

        for i in range(kwargs["num_blocks"]):
            b = f"blocks.{i}."
            t = layer_norm_of(x, p, b + "norm1", eps).transpose(1, 2)  # (B, D, S)
            start = linear_of(t, p, b + "mlp_tokens.fc1")
            w1, w2 = normalised(b + "mlp_tokens.fc_sn1"), normalised(b + "mlp_tokens.fc_sn2")
            state_ = start
            for _ in range(kwargs["n_repeat"]):
                hidden = F.linear(F.gelu(state_), w1, p[b + "mlp_tokens.fc_sn1.bias"])
                state_ = F.linear(F.gelu(hidden), w2, p[b + "mlp_tokens.fc_sn2.bias"]) + start
            x = x + linear_of(F.gelu(state_), p, b + "mlp_tokens.fc2").transpose(1, 2)
            y = linear_of(
                F.gelu(linear_of(layer_norm_of(x, p, b + "norm2", eps), p, b + "mlp_channels.fc1")),
                p,
                b + "mlp_channels.fc2",
            )
            x = x + y
        pooled = layer_norm_of(x, p, "norm", eps).mean(1)
        return linear_of(pooled, p, "head") if kwargs["num_classes"] > 0 else pooled

    def processor(
        self, config: PreTrainedConfig, mean: list[float], std: list[float]
    ) -> ProcessorLike | None:
        size = square_image_side(config, "MlpMixer")
        return make_image_processor(size, size, config.num_channels, mean, std)
