"""A taming-transformers VQGAN checkpoint (MaskGIT's `pretrained_maskgit/VQGAN/last.ckpt` with its `model.yaml`)
as a diffusers `VQModel`, the network `energyformers.mim.VQGANTokenizer` runs.

taming's `VQModel` (`taming/models/vqgan.py`) encodes with encoder → quant_conv → nearest codebook vector and decodes
with post_quant_conv → decoder; its `Encoder`/`Decoder` (`taming/modules/diffusionmodules/model.py`) are GroupNorm(32
groups, eps 1e-6) + SiLU residual blocks, single-head attention blocks of 1 × 1 convolutions, a zero-padded
stride-2 convolution down and a nearest ×2 + convolution up. diffusers' `VQModel` builds the same network from
`DownEncoderBlock2D`/`AttnDownEncoderBlock2D` and their decoder mirrors; only the names differ (and the attention
projections, which are linear layers there and 1 × 1 convolutions in taming). The key map below is explicit:
every tensor of the checkpoint must land on a parameter of the diffusers model with its shape, and every parameter
must be filled, or nothing is returned.
"""

from __future__ import annotations

import logging
import re
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from .base import ConversionError, NotExpressible
from .checkpoint import InertObject, load_raw, read_mapping, refuse_pickle

if TYPE_CHECKING:  # diffusers is an optional extra ([vqgan]): imported where a VQGAN is built
    from diffusers import VQModel

logger = logging.getLogger(__name__)

# Entries of taming's `VQModel.state_dict()` that only training uses: the LPIPS network and the patch
# discriminator of `VQLPIPSWithDiscriminator` (and its `logvar`), all under `loss.`.
TRAINING_ONLY_PREFIXES = ("loss.",)
# taming's `Normalize` is `GroupNorm(num_groups=32, eps=1e-6)`, the groups and eps diffusers' encoder/decoder use.
GROUPS = 32

_DDCONFIG_REQUIRED = (
    "ch",
    "ch_mult",
    "num_res_blocks",
    "attn_resolutions",
    "in_channels",
    "out_ch",
    "resolution",
    "z_channels",
)
# ddconfig entries that change nothing at inference (dropout) or that must hold their one supported value.
_DDCONFIG_FIXED = {"double_z": False, "resamp_with_conv": True, "give_pre_end": False, "attn_type": "vanilla"}
_DDCONFIG_IGNORED = ("dropout",)
# VQModel constructor arguments that do not change the network: training, logging and initialisation settings.
_PARAMS_IGNORED = ("lossconfig", "ckpt_path", "ignore_keys", "image_key", "monitor", "sane_index_shape")


def read_taming_config(path: str | Path) -> dict[str, Any]:
    """The `VQModel` constructor arguments of a taming YAML (`model.params`, as in MaskGIT's `model.yaml`), checked:
    the diffusers structure can hold them exactly."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"config {path} does not exist; expected taming's model.yaml")
    data = read_mapping(path)
    model = data.get("model") if isinstance(data, dict) else None
    section = model if isinstance(model, dict) else data
    params = section.get("params") if isinstance(section, dict) else None
    if not isinstance(params, dict):
        raise ConversionError(
            f"config {path}: no `model.params` mapping; expected taming's VQGAN YAML (model: target: "
            "taming.models.vqgan.VQModel, params: {embed_dim, n_embed, ddconfig, ...})"
        )
    target = section.get("target")
    if target is not None and str(target).rsplit(".", 1)[-1] != "VQModel":
        raise NotExpressible(
            f"config {path}: model.target={target!r}; only taming's `VQModel` (nearest-neighbour codebook) is "
            "supported, not its Gumbel or EMA quantiser variants"
        )
    known = {"embed_dim", "n_embed", "ddconfig", "remap", "colorize_nlabels", *_PARAMS_IGNORED}
    unknown = sorted(set(params) - known)
    if unknown:
        raise ConversionError(
            f"config {path}: model.params has {unknown}, which taming's VQModel does not take; expected "
            f"{sorted(known)}"
        )
    for key in ("embed_dim", "n_embed", "ddconfig"):
        if key not in params:
            raise ConversionError(f"config {path}: model.params has no {key!r}")
    if params.get("remap") is not None:
        raise NotExpressible(
            f"config {path}: model.params.remap={params['remap']!r}; a remapped codebook (taming's `used` index "
            "table) is not supported, the codes would differ"
        )
    ddconfig = params["ddconfig"]
    if not isinstance(ddconfig, dict):
        raise ConversionError(f"config {path}: model.params.ddconfig must be a mapping, got {ddconfig!r}")
    unknown = sorted(set(ddconfig) - {*_DDCONFIG_REQUIRED, *_DDCONFIG_FIXED, *_DDCONFIG_IGNORED})
    missing = [key for key in _DDCONFIG_REQUIRED if key not in ddconfig]
    if unknown or missing:
        raise ConversionError(
            f"config {path}: ddconfig {'lacks ' + str(missing) if missing else 'has unknown ' + str(unknown)}; "
            f"expected {list(_DDCONFIG_REQUIRED)} and optionally {sorted([*_DDCONFIG_FIXED, *_DDCONFIG_IGNORED])}"
        )
    # taming's Encoder defaults to double_z=True, which its VQModel cannot run (quant_conv takes z_channels)
    settings = {**_DDCONFIG_FIXED, "double_z": True, **ddconfig}
    for key, allowed in _DDCONFIG_FIXED.items():
        if settings[key] != allowed:
            raise NotExpressible(
                f"config {path}: ddconfig.{key}={settings[key]!r}; only {allowed!r} is supported"
            )
    ch, ch_mult = ddconfig["ch"], list(ddconfig["ch_mult"])
    if not ch_mult or ch_mult[0] != 1:
        # taming's first level takes `ch` channels in, diffusers' first block takes block_out_channels[0]
        raise NotExpressible(
            f"config {path}: ddconfig.ch_mult={ch_mult}; diffusers' VQModel needs it to start at 1"
        )
    widths = [ch * m for m in ch_mult]
    if any(width % GROUPS for width in widths):
        raise ConversionError(
            f"config {path}: ddconfig ch={ch}, ch_mult={ch_mult} give widths {widths}; taming's GroupNorm has "
            f"{GROUPS} groups, so every width must be a multiple of {GROUPS}"
        )
    return params


def diffusers_config(params: dict[str, Any]) -> dict[str, Any]:
    """diffusers `VQModel` kwargs for taming `VQModel` kwargs (`read_taming_config`). Level i (side
    resolution / 2^i) has attention blocks after its residual blocks when that side is in attn_resolutions, in the
    encoder and in the decoder alike."""
    dd = params["ddconfig"]
    levels = len(dd["ch_mult"])
    attention = [dd["resolution"] // 2**level in dd["attn_resolutions"] for level in range(levels)]
    return {
        "in_channels": dd["in_channels"],
        "out_channels": dd["out_ch"],
        "down_block_types": [
            "AttnDownEncoderBlock2D" if attention[level] else "DownEncoderBlock2D" for level in range(levels)
        ],
        "up_block_types": [  # diffusers lists the decoder's levels from the lowest resolution up
            "AttnUpDecoderBlock2D" if attention[level] else "UpDecoderBlock2D"
            for level in reversed(range(levels))
        ],
        "block_out_channels": [dd["ch"] * m for m in dd["ch_mult"]],
        "layers_per_block": dd["num_res_blocks"],  # the decoder has one more per level, in both libraries
        "act_fn": "silu",
        "latent_channels": dd["z_channels"],
        "sample_size": dd["resolution"],
        "num_vq_embeddings": params["n_embed"],
        "norm_num_groups": GROUPS,
        "vq_embed_dim": params["embed_dim"],
        "norm_type": "group",
        "mid_block_add_attention": True,
        "lookup_from_codebook": False,
    }


# (taming prefix, diffusers prefix): {i} an encoder level, {u} a decoder level (taming counts it from the highest
# resolution, diffusers from the lowest: u ↔ levels − 1 − u), {j} a block within the level, {p} encoder|decoder.
_PREFIXES = [
    ("encoder.down.{i}.block.{j}.", "encoder.down_blocks.{i}.resnets.{j}."),
    ("encoder.down.{i}.attn.{j}.", "encoder.down_blocks.{i}.attentions.{j}."),
    ("encoder.down.{i}.downsample.conv.", "encoder.down_blocks.{i}.downsamplers.0.conv."),
    ("decoder.up.{u}.block.{j}.", "decoder.up_blocks.{u}.resnets.{j}."),
    ("decoder.up.{u}.attn.{j}.", "decoder.up_blocks.{u}.attentions.{j}."),
    ("decoder.up.{u}.upsample.conv.", "decoder.up_blocks.{u}.upsamplers.0.conv."),
    ("{p}.mid.block_1.", "{p}.mid_block.resnets.0."),
    ("{p}.mid.attn_1.", "{p}.mid_block.attentions.0."),
    ("{p}.mid.block_2.", "{p}.mid_block.resnets.1."),
    ("{p}.norm_out.", "{p}.conv_norm_out."),
    ("{p}.conv_in.", "{p}.conv_in."),
    ("{p}.conv_out.", "{p}.conv_out."),
    ("quant_conv.", "quant_conv."),
    ("post_quant_conv.", "post_quant_conv."),
    ("quantize.embedding.", "quantize.embedding."),
]
# Within a residual block (1 × 1 shortcut when the width changes) or an attention block.
_LEAVES = [
    ("nin_shortcut.", "conv_shortcut."),
    ("norm.", "group_norm."),
    ("q.", "to_q."),
    ("k.", "to_k."),
    ("v.", "to_v."),
    ("proj_out.", "to_out.0."),
]
_FIELDS = {"i": r"(?P<i>\d+)", "j": r"(?P<j>\d+)", "u": r"(?P<u>\d+)", "p": r"(?P<p>encoder|decoder)"}


def _pattern(template: str) -> re.Pattern:
    parts = re.split(r"\{(\w)\}", template)  # literal, field, literal, ...
    return re.compile(
        "".join(_FIELDS[part] if n % 2 else re.escape(part) for n, part in enumerate(parts)) + "(?P<rest>.*)"
    )


_RULES = [(_pattern(taming), _pattern(ours), taming, ours) for taming, ours in _PREFIXES]


def translate(key: str, levels: int, to_diffusers: bool = True) -> str | None:
    """taming's name of a tensor → diffusers' (or back); None for a name that no rule matches."""
    for taming_re, ours_re, taming, ours in _RULES:
        source, target = (taming_re, ours) if to_diffusers else (ours_re, taming)
        match = source.fullmatch(key)
        if match is None:
            continue
        fields = {k: v for k, v in match.groupdict().items() if k != "rest"}
        if "u" in fields:
            fields["u"] = str(levels - 1 - int(fields["u"]))
        rest = match["rest"]
        for taming_leaf, ours_leaf in _LEAVES:
            old, new = (taming_leaf, ours_leaf) if to_diffusers else (ours_leaf, taming_leaf)
            if rest.startswith(old):
                rest = new + rest[len(old) :]
                break
        return target.format(**fields) + rest
    return None


def taming_state_to_diffusers(
    state: dict[str, torch.Tensor], expected: dict[str, torch.Size], levels: int, where: str
) -> tuple[dict[str, torch.Tensor], list[str]]:
    """(the diffusers state_dict, the training-only keys left out). `expected`: the diffusers model's names and
    shapes. Any other key, a missing tensor or a wrong shape is an error naming the taming key."""
    ours: dict[str, torch.Tensor] = {}
    ignored: list[str] = []
    for key, value in state.items():
        if key.startswith(TRAINING_ONLY_PREFIXES):
            ignored.append(key)
            continue
        name = translate(key, levels)
        if name is None or name not in expected:
            raise ConversionError(
                f"checkpoint {where}: unexpected key {key!r}: the VQGAN its config describes has no such tensor "
                "(a different ddconfig, or not a taming VQModel checkpoint?)"
            )
        shape = expected[name]
        if len(shape) == 2 and tuple(value.shape) == (*shape, 1, 1):
            # (out, in, 1, 1) → (out, in): an attention projection, taming's 1 × 1 conv is diffusers' linear layer
            value = value.reshape(shape)
        if value.shape != shape:
            wanted = (
                (*shape, 1, 1) if len(shape) == 2 and value.ndim == 4 else tuple(shape)
            )  # in taming's terms
            raise ConversionError(
                f"checkpoint {where}: key {key!r} has shape {tuple(value.shape)}; the config gives "
                f"{wanted} (diffusers {name!r})"
            )
        if not value.is_floating_point():
            raise ConversionError(
                f"checkpoint {where}: key {key!r} has dtype {value.dtype}, not a float tensor"
            )
        ours[name] = value
    missing = [name for name in expected if name not in ours]
    if missing:
        raise ConversionError(
            f"checkpoint {where}: missing key {translate(missing[0], levels, to_diffusers=False)!r} (diffusers "
            f"{missing[0]!r}) that the config needs; {len(missing)} tensor(s) missing in all"
        )
    return ours, ignored


def read_taming_state(path: str | Path, trust_pickle: bool = False) -> dict[str, torch.Tensor]:
    """The `state_dict` of a taming/Lightning `.ckpt` (or a bare state_dict), read without running code from the
    file: Lightning's other entries (optimizer states, callbacks, loop state) are read as inert placeholders
    unless `trust_pickle`."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"checkpoint {path} does not exist; expected taming's VQGAN .ckpt")
    raw, _ = load_raw(path, trust_pickle)
    state = raw.get("state_dict", raw) if isinstance(raw, dict) else None
    if not isinstance(state, dict) or not state:
        raise ConversionError(
            f"checkpoint {path}: expected a Lightning checkpoint with a `state_dict` (or a bare state_dict); "
            f"found {type(raw).__name__} with keys {sorted(map(str, raw))[:8] if isinstance(raw, dict) else []}"
        )
    for key, value in state.items():
        if isinstance(value, InertObject):
            raise refuse_pickle(path, f"weight {key!r} is an object of {value.replaces}")
        if not isinstance(value, torch.Tensor):
            raise ConversionError(
                f"checkpoint {path}: entry {key!r} is a {type(value).__name__}, not a tensor"
            )
    return state


def load_taming_vqgan(
    checkpoint: str | Path, config: str | Path, trust_pickle: bool = False, dtype: torch.dtype = torch.float32
) -> VQModel:
    """A diffusers `VQModel` holding the weights of a taming VQGAN checkpoint, in eval mode. Everything is checked
    before the model is built; a problem raises `ConversionError` naming the file and the key."""
    from diffusers import VQModel

    params = read_taming_config(config)
    state = read_taming_state(checkpoint, trust_pickle)
    settings = diffusers_config(params)
    model = VQModel(**settings)
    if dtype != torch.float32:  # diffusers warns on any `to(dtype)`, even a no-op one
        model = model.to(dtype)
    expected = {key: value.shape for key, value in model.state_dict().items()}
    weights, ignored = taming_state_to_diffusers(
        state, expected, len(settings["block_out_channels"]), str(checkpoint)
    )
    if ignored:
        logger.info(
            "%s: left out %d training-only tensors (%s...: the loss's LPIPS network and discriminator)",
            checkpoint,
            len(ignored),
            ", ".join(ignored[:3]),
        )
    model.load_state_dict(weights, strict=True)  # copies into the model's dtype
    return model.eval()
