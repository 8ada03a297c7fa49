"""`energyformers convert`: the authors' official checkpoints ↔ model folders of this package.

Forward (official → ours)::

    energyformers convert --source {imixer,hyperbf,hyperset-ic,hyperset-sudoku} CHECKPOINT \\
        --official-config KWARGS.json|RUN.yaml --output_dir DIR [--dtype float32|float64]

1. reads the checkpoint: a `.safetensors` file, or a PyTorch file through `torch.load(weights_only=True)`
   (anything that needs full unpickling is refused unless `--trust-pickle` is given; pickle is never
   written), in any of the three layouts the authors' loaders accept: a PyTorch-Lightning checkpoint
   (`state_dict`, every key prefixed `model.`), a dict with `model_state_dict`, or a bare state_dict, with
   DDP's `module.` prefixes stripped. Keys under `golden/` (the fixtures' reference outputs) are set aside
   as the reference, never mapped;
2. builds the official key list with shapes from the official constructor kwargs (`--official-config`:
   the kwargs as a JSON object, a fixture JSON with `constructor.kwargs`, or a YAML holding them) and
   checks every key and shape explicitly: an unexpected or missing key or a wrong shape is an error naming
   the first offending key (no fuzzy matching);
3. maps the weights (float64 arithmetic), loads them strictly into our model, and only then writes, into a
   hidden sibling folder renamed into place at the end: `config.json`, `model.safetensors`, the image
   processor, `README.md` (provenance, the checkpoint's sha256, the structure it uses, the verification)
   and, when needed, `official_extras.safetensors` (below);
4. reloads the written folder and checks its logits before declaring success: against the reference outputs
   when the checkpoint (or `--reference`) carries them (`golden/f64/logits` for a float64 folder,
   `golden/f32/logits` for float32), always against the official computation re-implemented here from the
   authors' code (`official_logits`, the computation order of the fixtures' JSON) on a fixed input, and
   against the in-memory converted model. Any failure removes the temporary folder; nothing is left behind.

Reverse (ours → official)::

    energyformers convert --reverse --source SOURCE MODEL_DIR --output OFFICIAL.safetensors

writes an official-layout bare state_dict (safetensors) and `OFFICIAL.json` with the official constructor
kwargs (usable as `--official-config`), and checks the official computation on it against our model.

Exactness of the round trip. Some official tensors have no exact counterpart in our model: iMixer's
`weight_sigma` buffers (logging only), and HyperBF's attention metric M, scale and RBF metric M_RBF, which
are folded into our projections (see `HyperBFSource`; the map is many-to-one). The forward conversion
stores every official tensor that the reverse mapping would not reproduce bit for bit in
`official_extras.safetensors`, together with a fingerprint of our weights; the reverse conversion uses them
while the weights are unchanged, so official → ours → official is exact. After fine-tuning it emits a
function-equivalent official state (HyperBF: M = I, per-head temperatures folded into q, k) instead. Official
constructor arguments without a field in our configs (dropout rates and other training- or init-only settings,
`OfficialSource.training_only`) are kept in config.json as `official_training_kwargs` and given back.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import pickle
import shutil
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import PIL.Image
import torch
import torch.nn.functional as F
from safetensors import safe_open
from safetensors.torch import load_file, save_file
from transformers import PreTrainedConfig, PreTrainedModel, ViTImageProcessorPil

import energyformers

from ..configuration.configuration_hyperbf import HyperBFConfig
from ..configuration.configuration_hyperset import HyperSetConfig
from ..configuration.configuration_imixer import IMixerConfig
from ..modeling.modeling_hyperbf import HyperBFForImageClassification
from ..modeling.modeling_hyperset import HyperSetForImageClassification, HyperSetForTokenClassification
from ..modeling.modeling_imixer import IMixerForImageClassification
from .cli import UsageError
from .processing import cell_tokenizer
from .weights import checkpoint_format

EXTRAS_FILE = "official_extras.safetensors"
KEPT_KWARGS = "official_training_kwargs"  # config.json entry: `OfficialSource.training_only` values
REFERENCE_PREFIX = "golden/"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEFAULT_ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}
REQUIRED = object()  # marks an official constructor argument without a known default


class ConversionError(UsageError):
    """A checkpoint, official config or model folder that cannot be converted; nothing was written (a usage
    error of `energyformers convert`: exit status 2)."""


class NotExpressible(ConversionError):
    """The official structure needs an option our model does not have (yet)."""


# ------------------------------------------------------------------------------------------------
# Reading checkpoints and official configs
# ------------------------------------------------------------------------------------------------


def sha256_file(path: str | Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def _strip(key: str, prefix: str) -> str:
    while key.startswith(prefix):
        key = key[len(prefix) :]
    return key


def _load_raw(path: Path, trust_pickle: bool) -> Any:
    try:
        kind = checkpoint_format(
            path
        )  # a file that is no checkpoint at all is not "a pickle that needs trust"
    except UsageError as err:
        raise ConversionError(str(err)) from None
    if kind == "safetensors" or path.suffix == ".safetensors":
        try:
            return load_file(str(path))
        except Exception as err:  # SafetensorError derives from Exception only
            raise ConversionError(
                f"cannot read checkpoint {path}: truncated or not a safetensors file ({err})"
            ) from err
    try:
        return torch.load(path, map_location="cpu", weights_only=True)
    except pickle.UnpicklingError as err:
        if "Weights only load failed" not in str(err):
            raise ConversionError(f"cannot read checkpoint {path}: truncated or corrupt ({err})") from err
        if not trust_pickle:
            raise ConversionError(
                f"checkpoint {path} holds Python objects besides tensors, which only full unpickling can "
                "read, and unpickling can run arbitrary code. It was not loaded. If you trust the file's "
                "origin, pass --trust-pickle (the converted folder holds safetensors only); otherwise ask "
                "for a safetensors export."
            ) from err
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err
    try:
        return torch.load(path, map_location="cpu", weights_only=False)
    except Exception as err:
        raise ConversionError(
            f"cannot read checkpoint {path}: truncated or corrupt ({type(err).__name__}: {err})"
        ) from err


def read_checkpoint(
    path: str | Path, trust_pickle: bool = False
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], str]:
    """(official state_dict with prefixes stripped, reference tensors under `golden/`, layout description)."""
    path = Path(path)
    if not path.is_file():
        raise ConversionError(f"checkpoint {path} does not exist")
    raw = _load_raw(path, trust_pickle)
    if not isinstance(raw, dict):
        raise ConversionError(f"checkpoint {path} holds a {type(raw).__name__}, not a state_dict")
    if isinstance(raw.get("state_dict"), dict):
        layout, state, lightning = (
            "PyTorch-Lightning checkpoint (`state_dict`, `model.` prefix)",
            raw["state_dict"],
            True,
        )
    elif isinstance(raw.get("model_state_dict"), dict):
        layout, state, lightning = "native dict (`model_state_dict`)", raw["model_state_dict"], False
    elif all(isinstance(value, torch.Tensor) for value in raw.values()):
        layout, state, lightning = "bare state_dict", raw, False
    else:
        raise ConversionError(
            f"checkpoint {path}: unrecognised layout (top-level keys {sorted(map(str, raw))[:8]}); expected a "
            "Lightning checkpoint with `state_dict`, a dict with `model_state_dict`, or a bare state_dict"
        )
    official: dict[str, torch.Tensor] = {}
    reference: dict[str, torch.Tensor] = {}
    for key, value in state.items():
        if not isinstance(value, torch.Tensor):
            raise ConversionError(
                f"checkpoint {path}: entry {key!r} is a {type(value).__name__}, not a tensor"
            )
        if key.startswith(REFERENCE_PREFIX):
            reference[key] = value
            continue
        name = _strip(key, "module.")
        if lightning:
            if not name.startswith("model."):
                raise ConversionError(
                    f"checkpoint {path}: Lightning state_dict key {key!r} does not start with `model.`; only "
                    "the wrapped model's weights can be converted"
                )
            name = _strip(name[len("model.") :], "module.")
        if name in official:
            raise ConversionError(
                f"checkpoint {path}: key {key!r} duplicates {name!r} once prefixes are stripped"
            )
        official[name] = value
    return official, reference, layout


def _read_mapping(path: Path) -> Any:
    try:
        text = path.read_text()
    except OSError as err:
        raise ConversionError(f"cannot read official config {path}: {err}") from err
    if path.suffix in (".yaml", ".yml"):
        try:
            import yaml
        except ImportError as err:
            raise ConversionError(
                "reading a YAML official config needs PyYAML; pass the constructor kwargs as JSON instead"
            ) from err
        try:
            return yaml.safe_load(text)
        except yaml.YAMLError as err:
            raise ConversionError(f"official config {path} is not valid YAML: {err}") from err
    try:
        return json.loads(text)
    except json.JSONDecodeError as err:
        raise ConversionError(f"official config {path} is not valid JSON: {err}") from err


def read_official_config(path: str | Path, source: OfficialSource) -> tuple[dict[str, Any], dict[str, Any]]:
    """(normalised official constructor kwargs, provenance such as the repository and commit)."""
    path = Path(path)
    data = _read_mapping(path)
    if not isinstance(data, dict):
        raise ConversionError(f"official config {path} must hold a mapping of constructor kwargs")
    provenance = dict(data.get("source") or {}) if isinstance(data.get("source"), dict) else {}
    if isinstance(data.get("constructor"), dict):  # the fixtures' JSON: {"constructor": {"kwargs": ...}}
        raw = data["constructor"].get("kwargs", {})
    elif isinstance(data.get("model"), dict):  # a Hydra run config: the model group holds the kwargs
        raw = {**{k: v for k, v in data.items() if k in source.spec}, **data["model"]}
    else:
        raw = data
    provenance["ignored_kwargs"] = sorted(key for key in raw if key in source.ignored)
    return source.normalise_kwargs(raw, where=str(path)), provenance


# ------------------------------------------------------------------------------------------------
# Helpers
# ------------------------------------------------------------------------------------------------


def fingerprint(state: dict[str, torch.Tensor]) -> str:
    """sha256 over names, dtypes, shapes and bytes of a state_dict (order independent)."""
    digest = hashlib.sha256()
    for key in sorted(state):
        tensor = state[key].detach().cpu().contiguous()
        digest.update(f"{key}|{tensor.dtype}|{tuple(tensor.shape)}|".encode())
        digest.update(tensor.view(torch.uint8).numpy().tobytes() if tensor.numel() else b"")
    return digest.hexdigest()


def _cholesky(matrix: torch.Tensor, what: str) -> torch.Tensor:
    lower, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        raise NotExpressible(
            f"{what}: its symmetric part is not positive definite, so the official kernel is no Gaussian of a "
            "(semi-)metric and has no exact form in our model"
        )
    return lower


def _rms(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """torch.nn.RMSNorm(eps=None): eps = machine epsilon of the dtype, as in the authors' code."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps=None)


def _ln(x: torch.Tensor, p: dict[str, torch.Tensor], name: str, eps: float) -> torch.Tensor:
    return F.layer_norm(x, (x.shape[-1],), p[f"{name}.weight"], p[f"{name}.bias"], eps=eps)


def _linear(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    return F.linear(x, p[f"{name}.weight"], p.get(f"{name}.bias"))


def _image_processor(height: int, width: int, channels: int, mean: list[float], std: list[float]):
    return ViTImageProcessorPil(
        size={"height": height, "width": width},
        resample=PIL.Image.Resampling.BILINEAR,
        image_mean=mean,
        image_std=std,
        do_convert_rgb=channels == 3,
    )


def _square(config: PreTrainedConfig, family: str) -> int:
    size = config.image_size
    sides = (size, size) if isinstance(size, int) else tuple(size)
    if sides[0] != sides[1]:
        raise NotExpressible(f"the official {family} takes square images; this model has image_size={size}")
    return int(sides[0])


# ------------------------------------------------------------------------------------------------
# Sources: one per official model class
# ------------------------------------------------------------------------------------------------


class OfficialSource:
    """One official model class: its kwargs, its state_dict layout, the maps both ways, its computation."""

    name: str = ""
    official_class: str = ""
    repository: str = ""
    head_class: type[PreTrainedModel] | None = None
    input_kind = "image"  # "image" or "ids"
    spec: dict[str, Any] = {}  # constructor argument -> default (REQUIRED: no known default)
    ignored: dict[str, str] = {}  # accepted arguments the official constructor ignores -> why
    # Official arguments with no counterpart in our config (training-only or init-only): their values are kept in
    # config.json under `official_training_kwargs`, so the reverse conversion gives back the official config.
    training_only: tuple[str, ...] = ()

    # --- official config ---
    def normalise_kwargs(self, raw: dict[str, Any], where: str = "official config") -> dict[str, Any]:
        unknown = [key for key in raw if key not in self.spec and key not in self.ignored]
        if unknown:
            raise ConversionError(
                f"{where}: {unknown[0]!r} is not an argument of the official {self.official_class} "
                f"(known: {sorted(self.spec)})"
            )
        kwargs = {}
        for key, default in self.spec.items():
            if key in raw:
                kwargs[key] = raw[key]
            elif default is REQUIRED:
                raise ConversionError(
                    f"{where}: the official {self.official_class} argument {key!r} is missing (it has no "
                    "default this converter knows of; give the value the checkpoint was trained with)"
                )
            else:
                kwargs[key] = default
        self.check_kwargs(kwargs, where)
        return kwargs

    def check_kwargs(self, kwargs: dict[str, Any], where: str) -> None:
        """Reject official settings that change the computation in ways no option here expresses."""

    # --- layouts ---
    def layout(self, kwargs: dict[str, Any]) -> dict[str, tuple[tuple[int, ...], str | None]]:
        """Official key -> (shape, our key if it is a plain copy, else None: derived in `derive`)."""
        raise NotImplementedError

    def check_state(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], what: str) -> None:
        layout = self.layout(kwargs)
        problems = []
        for key, tensor in state.items():
            if key not in layout:
                problems.append(
                    f"{what}: unexpected key {key!r}: not in the official {self.official_class} state_dict "
                    "for this config (no key is matched loosely; rename it or check --source)"
                )
            elif tuple(tensor.shape) != layout[key][0]:
                problems.append(
                    f"{what}: key {key!r} has shape {list(tensor.shape)}, but the official config gives "
                    f"{list(layout[key][0])}"
                )
            elif not tensor.is_floating_point():
                problems.append(f"{what}: key {key!r} has dtype {tensor.dtype}; expected floating point")
        problems += [f"{what}: missing key {key!r}" for key in layout if key not in state]
        if problems:
            more = f" ({len(problems) - 1} more: {'; '.join(problems[1:4])})" if len(problems) > 1 else ""
            raise ConversionError(problems[0] + more)

    # --- configs ---
    def config(self, kwargs: dict[str, Any]) -> PreTrainedConfig:
        raise NotImplementedError

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        raise NotImplementedError

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        return []

    # --- weights (float64 in, float64 out) ---
    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Our tensors that are not plain copies of one official tensor."""
        return {}

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        """Official tensors that are not plain copies of one of ours (the canonical reverse)."""
        return {}

    def to_ours(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        ours = {our: state[key] for key, (_, our) in self.layout(kwargs).items() if our is not None}
        ours.update(self.derive(state, kwargs))
        return ours

    def to_official(
        self, ours: dict[str, torch.Tensor], config: PreTrainedConfig
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        kwargs = self.kwargs_from_config(config)
        kept = getattr(config, KEPT_KWARGS, None) or {}
        kwargs.update({key: kept[key] for key in self.training_only if key in kept})
        layout = self.layout(kwargs)
        official = {key: ours[our] for key, (_, our) in layout.items() if our is not None}
        official.update(self.derive_back(ours, config))
        return {key: official[key] for key in layout}, kwargs

    # --- the official computation ---
    def official_logits(
        self, state: dict[str, torch.Tensor], kwargs: dict[str, Any], inputs: torch.Tensor, dtype: torch.dtype
    ) -> torch.Tensor:
        raise NotImplementedError

    def example_inputs(self, kwargs: dict[str, Any]) -> torch.Tensor:
        generator = torch.Generator().manual_seed(0)
        size = kwargs["img_size"]
        return torch.randn(2, kwargs.get("in_chans", 3), size, size, generator=generator)

    def model_logits(self, model: PreTrainedModel, inputs: torch.Tensor) -> torch.Tensor:
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            return model(inputs.to(dtype)).logits

    def processor(self, config: PreTrainedConfig, mean: list[float], std: list[float]):
        return None


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
        dim = kwargs["embed_dim"]
        tokens = (kwargs["img_size"] // kwargs["patch_size"]) ** 2
        token_width = int(kwargs["mlp_ratio"][0] * dim)
        channel_width = int(kwargs["mlp_ratio"][1] * dim)
        return dim, tokens, token_width, channel_width, int(kwargs["hidden_ratio"] * token_width)

    def layout(self, kwargs):
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

    def config(self, kwargs):
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

    def kwargs_from_config(self, config):
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
            "img_size": _square(config, "MlpMixer"),
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

    def derive_back(self, ours, config):
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

    def structure_notes(self, kwargs):
        return [
            f"iMLP token mixer with n = {kwargs['n_repeat']} fixed-point steps, soft spectral normalisation "
            f"c = {self.coeff} from the stored power-iteration vectors u, v (eval mode uses them as stored).",
            "LayerNorm eps 1e-6 (timm's Mixer); exact (erf) GELU; mean pooling; no CLS token or positions.",
            "`weight_sigma` buffers are logging only (no effect on outputs) and are not part of our model.",
        ]

    def official_logits(self, state, kwargs, inputs, dtype):
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
            t = _ln(x, p, b + "norm1", eps).transpose(1, 2)  # (B, D, S)
            start = _linear(t, p, b + "mlp_tokens.fc1")
            w1, w2 = normalised(b + "mlp_tokens.fc_sn1"), normalised(b + "mlp_tokens.fc_sn2")
            state_ = start
            for _ in range(kwargs["n_repeat"]):
                hidden = F.linear(F.gelu(state_), w1, p[b + "mlp_tokens.fc_sn1.bias"])
                state_ = F.linear(F.gelu(hidden), w2, p[b + "mlp_tokens.fc_sn2.bias"]) + start
            x = x + _linear(F.gelu(state_), p, b + "mlp_tokens.fc2").transpose(1, 2)
            y = _linear(
                F.gelu(_linear(_ln(x, p, b + "norm2", eps), p, b + "mlp_channels.fc1")),
                p,
                b + "mlp_channels.fc2",
            )
            x = x + y
        pooled = _ln(x, p, "norm", eps).mean(1)
        return _linear(pooled, p, "head") if kwargs["num_classes"] > 0 else pooled

    def processor(self, config, mean, std):
        size = _square(config, "MlpMixer")
        return _image_processor(size, size, config.num_channels, mean, std)


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

    def check_kwargs(self, kwargs, where):
        if kwargs["qkv_bias"]:
            raise NotExpressible(f"{where}: qkv_bias=True; our q/k/v projections have no bias")
        if kwargs["embed_dim"] % kwargs["num_heads"]:
            raise ConversionError(f"{where}: embed_dim is not divisible by num_heads")

    def layout(self, kwargs):
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

    def config(self, kwargs):
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

    def kwargs_from_config(self, config):
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
            "img_size": _square(config, "Hyper_ViT"),
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

    def derive(self, state, kwargs):
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
            lower = _cholesky(sign * (metric + metric.T) / 2, f"{b}attn.M (times the sign of attn.scale)")
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
            lower = _cholesky(symmetric, f"{b}mlp.M_RBF")
            moved = torch.cholesky_solve((centers @ rbf.T).T, lower).T  # rows t_α = M_s⁻¹ M c_α
            delta = (centers @ symmetric * centers).sum(-1) - (moved @ symmetric * moved).sum(-1)  # (K,)
            out[o + "feedforward.centers"] = moved
            out[o + "feedforward.metric"] = lower.T
            out[o + "feedforward.log_sigma"] = -0.5 * torch.log(2 * beta)
            out[o + "feedforward.values.weight"] = state[b + "mlp.fc.weight"] * torch.exp(-beta * delta)
        return out

    def derive_back(self, ours, config):
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
            out[b + "attn.scale"] = tau[0].reshape(())
            metric = ours[o + "feedforward.metric"]
            out[b + "mlp.M_RBF"] = metric.T @ metric
            out[b + "mlp.centers"] = ours[o + "feedforward.centers"]
            out[b + "mlp.beta"] = (0.5 * torch.exp(-2 * ours[o + "feedforward.log_sigma"])).expand(k).clone()
            out[b + "mlp.fc.weight"] = ours[o + "feedforward.values.weight"]
        return out

    def structure_notes(self, kwargs):
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

    def official_logits(self, state, kwargs, inputs, dtype):
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
            y = _ln(x, p, b + "norm1", eps)
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
            x = x + _linear((attn @ v).transpose(1, 2).reshape(batch, tokens, dim), p, b + "attn.proj")
            z = _ln(x, p, b + "norm2", eps)
            rbf, centers = p[b + "mlp.M_RBF"], p[b + "mlp.centers"]
            x_m = z @ rbf
            dist = (
                (z * x_m).sum(-1, keepdim=True)
                + (centers * (centers @ rbf)).sum(-1)
                + (-2 * (x_m @ centers.T))
            )
            x = x + _linear(torch.exp(-p[b + "mlp.beta"].unsqueeze(0) * dist), p, b + "mlp.fc")
        cls = _ln(x, p, "norm", eps)[:, 0]
        return _linear(cls, p, "head") if kwargs["num_classes"] > 0 else cls

    def processor(self, config, mean, std):
        size = _square(config, "Hyper_ViT")
        return _image_processor(size, size, config.num_channels, mean, std)


def _official_positions(num_positions: int, dim: int) -> torch.Tensor:
    """Hyper-SET IC `sinusoidal_positional_embedding`: float64 numpy, interleaved sin/cos, stored float32."""
    position = np.arange(num_positions)[:, None]
    div = np.exp(np.arange(0, dim, 2) * -(math.log(10000.0) / dim))
    table = np.zeros((num_positions, dim))
    table[:, 0::2] = np.sin(position * div)
    table[:, 1::2] = np.cos(position * div)
    return torch.from_numpy(table).float()


def _official_board_positions(num_positions: int, dim: int) -> torch.Tensor:
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


def _official_time_sinusoid(steps: int, dim: int, dtype: torch.dtype) -> torch.Tensor:
    """Hyper-SET `SinusoidalPosEmb(dim)(arange(1, T+1))` in the run's (default) dtype: cat(sin, cos)."""
    half = dim // 2
    freqs = torch.exp(torch.arange(half, dtype=dtype) * -(math.log(10000) / (half - 1)))
    angles = torch.arange(1, steps + 1, dtype=dtype)[:, None] * freqs[None, :]
    return torch.cat((angles.sin(), angles.cos()), dim=-1)


def _hyperset_attention(x, weight, gains, heads):
    """Official HyperSETAttention / Sudoku SelfAttention: tied W, RMS-normalised heads, bi-softmax."""
    batch, tokens, dim = x.shape
    dh = dim // heads
    w = F.linear(x, weight).view(batch, tokens, heads, dh).transpose(1, 2)  # (B, H, N, dh)
    n1, n2, n3 = (_rms(w, gain) for gain in gains)
    scores = torch.einsum("bhif,bhjf->bhij", n1, n2) / math.sqrt(dh)
    probs = scores.softmax(-1) + scores.softmax(-2)
    y = torch.einsum("bhij,bhjf->bihf", probs, n3).flatten(2)
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

    def check_kwargs(self, kwargs, where):
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

    def layout(self, kwargs):
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

    def config(self, kwargs):
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

    def kwargs_from_config(self, config):
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
        size = _square(config, "HyperSET")
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

    def derive(self, state, kwargs):
        return {
            f"hyperset.layers.{i}.attention.qkv_gain": torch.stack(
                [state[f"enc.{i}.attn.ln1_{role}.weight"] for role in (1, 2, 3)]
            )
            for i in range(kwargs["n_layer"])
        }

    def derive_back(self, ours, config):
        out = {}
        for i in range(config.num_hidden_layers):
            gains = ours[f"hyperset.layers.{i}.attention.qkv_gain"]
            for role in (1, 2, 3):
                out[f"enc.{i}.attn.ln1_{role}.weight"] = gains[role - 1]
        return out

    def structure_notes(self, kwargs):
        return [
            'Feedforward activation: **GELU** (`hidden_act="gelu"`), as in the official image model; the '
            "presets of this package use ReLU, the exact gradient of the paper's energy.",
            f'Step sizes from `time_mlp` over the iteration sinusoid (`iteration_conditioning="sinusoidal"`, '
            f"width {kwargs['time_embed']}), conditioned on "
            + ("the embedded input x₀." if kwargs["input_cond"] else "the current state x_t."),
            "Separate q/k/v RMSNorm gains; RMSNorm eps = machine epsilon of the dtype; LayerNorm eps 1e-5.",
            f"Training-only settings not represented: `dropout` (kept in config.json `{KEPT_KWARGS}`).",
        ]

    def official_logits(self, state, kwargs, inputs, dtype):
        p = {key: value.to(dtype) for key, value in state.items()}
        d, heads, steps = kwargs["n_embd"], kwargs["head"], kwargs["n_recur"]
        ps, eps = kwargs["img_size"] // kwargs["patch"], self.layer_norm_eps
        images = inputs.to(dtype)
        batch = images.shape[0]
        words = (
            images.unfold(2, ps, ps)
            .unfold(3, ps, ps)
            .permute(0, 2, 3, 4, 5, 1)
            .reshape(batch, kwargs["patch"] ** 2, -1)
        )
        tokens = _ln(_linear(_ln(words, p, "emb.0", eps), p, "emb.1"), p, "emb.2", eps)
        x0 = torch.cat([p["cls_token"].repeat(batch, 1, 1), tokens], dim=1)
        x0 = x0 + _official_positions(x0.shape[1], d).to(dtype)
        t = _linear(_official_time_sinusoid(steps, kwargs["time_embed"], dtype), p, "time_mlp.0.1")
        t = _rms(F.gelu(_rms(t, p["time_mlp.0.2.weight"])), p["time_mlp.0.4.weight"])
        time_emb = _rms(_linear(t, p, "time_mlp.0.5"), p["time_mlp.0.6.weight"])
        x = x0
        for i in range(kwargs["n_layer"]):
            b = f"enc.{i}."
            for step in range(steps):
                source = x0 if kwargs["input_cond"] else x
                alpha, beta = _linear(
                    F.gelu(time_emb[step] + _rms(source, p["ln_inp.weight"])), p, "time_mlp.1.1"
                ).chunk(2, -1)
                gains = [p[f"{b}attn.ln1_{role}.weight"] for role in (1, 2, 3)]
                x = x - alpha * _hyperset_attention(x, p[b + "attn.qkv.weight"], gains, heads)
                dictionary = p[b + "mlp.weight"]
                x = x + beta * F.linear(
                    F.gelu(_rms(F.linear(x, dictionary), p[b + "ln2.weight"])), dictionary.t()
                )
        cls = _ln(x[:, 0], p, "fc.0", eps)
        return _linear(cls, p, "fc.1") if kwargs["num_classes"] > 0 else cls

    def processor(self, config, mean, std):
        size = _square(config, "HyperSET")
        return _image_processor(size, size, 3, mean, std)


# The official Sudoku structure in HyperSetConfig terms: time MLP Linear → GELU → Linear and step sizes from
# GELU(c_t + x) without RMSNorms, an RMSNorm + bias-free Linear head.
SUDOKU_FIELDS = {"step_size_norm": "none", "classifier_norm": "rmsnorm", "classifier_bias": False}
# The official Sudoku `pos_emb` option -> our position_embedding_type.
POSITIONS = {"learnable": "learned", "sincos": "sincos-2d"}


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

    def check_kwargs(self, kwargs, where):
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

    def layout(self, kwargs):
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

    def config(self, kwargs):
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
            num_labels=kwargs["num_classes"],
            **SUDOKU_FIELDS,
        )

    def kwargs_from_config(self, config):
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

    def derive(self, state, kwargs):
        out = {}
        if kwargs["pos_emb"] == "learnable":
            out["hyperset.embeddings.position_embeddings.weight"] = state["pos_emb"][0]
        for i in range(kwargs["n_layer"]):
            out[f"hyperset.layers.{i}.attention.qkv_gain"] = state[f"blocks.{i}.attn.ln1.weight"][None]
        return out

    def derive_back(self, ours, config):
        n = config.max_position_embeddings
        out = {}
        if config.position_embedding_type == "learned":
            out["pos_emb"] = ours["hyperset.embeddings.position_embeddings.weight"][None]
        for i in range(config.num_hidden_layers):
            out[f"blocks.{i}.attn.ln1.weight"] = ours[f"hyperset.layers.{i}.attention.qkv_gain"][0]
            out[f"blocks.{i}.attn.mask"] = torch.tril(torch.ones(n, n, dtype=torch.float64)).view(1, 1, n, n)
        return out

    def structure_notes(self, kwargs):
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

    def official_logits(self, state, kwargs, inputs, dtype):
        p = {key: value.to(dtype) for key, value in state.items()}
        heads, steps = kwargs["n_head"], kwargs["n_recur"]
        if kwargs["pos_emb"] == "learnable":
            positions = p["pos_emb"]
        else:  # a float32 table, promoted when added in a float64 run
            positions = _official_board_positions(kwargs["block_size"], kwargs["n_embd"])[None].to(dtype)
        x0 = F.embedding(inputs, p["tok_emb.weight"]) + positions[:, : inputs.shape[1]]
        t = _linear(
            F.gelu(_linear(_official_time_sinusoid(steps, kwargs["time_emb"], dtype), p, "time_mlp.0.1")),
            p,
            "time_mlp.0.3",
        )
        x = x0
        for i in range(kwargs["n_layer"]):
            b = f"blocks.{i}."
            for step in range(steps):
                source = x0 if kwargs["input_cond"] else x
                alpha, beta = _linear(F.gelu(t[step] + source), p, "time_mlp.1.1").chunk(2, -1)
                gain = p[b + "attn.ln1.weight"]
                x = x - alpha * _hyperset_attention(x, p[b + "attn.qkv.weight"], (gain, gain, gain), heads)
                dictionary = p[b + "mlp.weight"]
                x = x + beta * F.linear(
                    F.relu(_rms(F.linear(x, dictionary), p[b + "ln2.weight"])), dictionary.t()
                )
        return F.linear(_rms(x, p["ln_f.weight"]), p["head.weight"])

    def example_inputs(self, kwargs):
        generator = torch.Generator().manual_seed(0)
        return torch.randint(0, kwargs["vocab_size"], (2, kwargs["block_size"]), generator=generator)

    def model_logits(self, model, inputs):
        with torch.no_grad():
            return model(input_ids=inputs).logits

    def processor(self, config, mean, std):
        return cell_tokenizer(config.max_position_embeddings) if config.vocab_size == 10 else None


SOURCES: dict[str, OfficialSource] = {
    source.name: source
    for source in (IMixerSource(), HyperBFSource(), HyperSetICSource(), HyperSetSudokuSource())
}


# ------------------------------------------------------------------------------------------------
# Forward conversion
# ------------------------------------------------------------------------------------------------


def _max_abs(a: torch.Tensor, b: torch.Tensor) -> float:
    return float((a.double() - b.double()).abs().max())


def _scaled(atol: float, expected: torch.Tensor) -> float:
    """The tolerance for logits `expected`: atol × max(1, max |logit|) (float32 rounding grows with the logits)."""
    return atol * max(1.0, float(expected.detach().abs().max()))


def _check_output_dir(out: Path, overwrite: bool) -> None:
    if out.exists() and (not out.is_dir() or any(out.iterdir())) and not overwrite:
        raise ConversionError(f"output folder {out} exists and is not empty; pass --overwrite to replace it")


def _place(tmp: Path, out: Path) -> None:
    """Move the finished folder into place: rename, replacing an old folder only once the new one is complete."""
    if out.exists():
        old = out.with_name(f".{out.name}.old-{os.getpid()}")
        os.replace(out, old)
        os.replace(tmp, out)
        if old.is_dir():
            shutil.rmtree(old)
        else:
            old.unlink()
    else:
        os.replace(tmp, out)


def _set_default_permissions(*paths: Path) -> None:
    """mkdtemp / safetensors create owner-only entries; give what we write the usual umask permissions."""
    umask = os.umask(0)
    os.umask(umask)
    for path in paths:
        if path.is_dir():
            path.chmod(0o777 & ~umask)
            for child in path.iterdir():
                child.chmod(0o666 & ~umask)
        else:
            path.chmod(0o666 & ~umask)


def _model_card(info: dict[str, Any]) -> str:
    kwargs = json.dumps(info["kwargs"], indent=2)
    checks = "\n".join(f"| {what} | {err:.3e} | {tol:.0e} |" for what, err, tol in info["checks"])
    notes = "\n".join(f"- {note}" for note in info["notes"])
    commit = f", commit `{info['commit']}`" if info.get("commit") else ""
    extras = (
        f"\n`{EXTRAS_FILE}` holds the official tensors that the reverse conversion cannot recompute bit for bit "
        f"from our weights ({', '.join(f'`{k}`' for k in info['extras'][:6])}{', …' if len(info['extras']) > 6 else ''}); "
        "`energyformers convert --reverse` uses them while `model.safetensors` is unchanged (fingerprint in its "
        "metadata), so official → ours → official is exact.\n"
        if info["extras"]
        else ""
    )
    return f"""---
library_name: transformers
tags:
- energyformers
- {info["model_type"]}
- converted-checkpoint
---

# {info["title"]}

Converted from the authors' checkpoint with `energyformers convert` (energyformers {info["version"]}).

| | |
|---|---|
| official class | `{info["official_class"]}` |
| official code | {info["repository"]}{commit} |
| checkpoint file | `{info["checkpoint"]}` |
| checkpoint sha256 | `{info["sha256"]}` |
| checkpoint layout | {info["layout"]} |
| weights here | `model.safetensors`, {info["dtype"]} |
| model class | `{info["head"]}` (`model_type="{info["model_type"]}"`) |

Official constructor kwargs:

```json
{kwargs}
```

## Structure

{notes}
- {info["processor"]}
{extras}
## Verification

The written folder was reloaded and its logits compared ({info["input"]}):

| check | max abs difference | tolerance (atol × max(1, max abs logit)) |
|---|---|---|
{checks}

```python
import energyformers  # registers the Auto classes
from transformers import {info["auto"]}

model = {info["auto"]}.from_pretrained("path/to/this/folder")
```
"""


def convert_checkpoint(
    source: str,
    checkpoint: str | Path,
    official_config: str | Path,
    output_dir: str | Path,
    *,
    dtype: str = "float32",
    trust_pickle: bool = False,
    overwrite: bool = False,
    reference: str | Path | None = None,
    atol: float | None = None,
    image_mean: list[float] | None = None,
    image_std: list[float] | None = None,
    log=print,
) -> Path:
    """Official checkpoint → verified model folder. Raises `ConversionError` before writing anything."""
    family = SOURCES[source]
    out = Path(output_dir)
    torch_dtype = DTYPES[dtype]
    tolerance = DEFAULT_ATOL[torch_dtype] if atol is None else atol
    mean, std = image_mean or [0.5, 0.5, 0.5], image_std or [0.5, 0.5, 0.5]
    _check_output_dir(out, overwrite)

    kwargs, provenance = read_official_config(official_config, family)
    state, golden, layout = read_checkpoint(checkpoint, trust_pickle)
    if reference is not None:
        golden = {k: v for k, v in read_checkpoint(reference)[1].items()}
    family.check_state(state, kwargs, f"checkpoint {Path(checkpoint).name}")
    config = family.config(kwargs)  # NotExpressible for structures our models lack
    if family.training_only:
        setattr(config, KEPT_KWARGS, {key: kwargs[key] for key in family.training_only})
    state64 = {key: value.to(torch.float64) for key, value in state.items()}
    ours = family.to_ours(state64, kwargs)

    model = family.head_class(config).to(torch_dtype).eval()
    missing, unexpected = model.load_state_dict({k: v.to(torch_dtype) for k, v in ours.items()}, strict=False)
    if missing or unexpected:  # a bug in the mapping table, not in the checkpoint
        raise ConversionError(f"internal mapping error: missing {missing[:3]}, unexpected {unexpected[:3]}")
    saved = {key: value.detach().clone() for key, value in model.state_dict().items()}

    # Official tensors that the canonical reverse does not reproduce bit for bit (kept for an exact round trip).
    canonical, _ = family.to_official({k: v.to(torch.float64) for k, v in saved.items()}, config)
    extras = {
        key: value.contiguous()
        for key, value in state.items()
        if not torch.equal(canonical[key].to(value.dtype), value)
    }

    # What the written folder must reproduce.
    checks: list[tuple[str, torch.Tensor, float]] = []  # (what, expected logits, tolerance)
    input_key = "golden/input/images" if family.input_kind == "image" else "golden/input/idx"
    gold_key = f"golden/{'f64' if torch_dtype == torch.float64 else 'f32'}/logits"
    if input_key in golden and gold_key in golden:
        inputs, described = golden[input_key], f"on the reference input `{input_key}`"
        checks.append((f"reference outputs `{gold_key}`", golden[gold_key], tolerance))
    else:
        inputs = family.example_inputs(kwargs)
        described = "on a fixed seeded input; no reference outputs of the authors' run were given"
    official = family.official_logits(state, kwargs, inputs, torch_dtype)
    checks.append(("official computation (re-implemented, same dtype)", official, tolerance))
    checks.append(("in-memory converted model", family.model_logits(model, inputs), tolerance))

    out.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{out.name}.", suffix=".tmp", dir=out.parent))
    try:
        model.save_pretrained(tmp)
        processor = family.processor(config, mean, std)
        if processor is not None:
            processor.save_pretrained(tmp)
        if extras:
            metadata = {"format": "pt", "source": source, "weights_fingerprint": fingerprint(saved)}
            save_file(extras, str(tmp / EXTRAS_FILE), metadata=metadata)
        reloaded = family.head_class.from_pretrained(tmp, dtype=torch_dtype).eval()
        logits = family.model_logits(reloaded, inputs)
        measured = [
            (what, _max_abs(logits, expected), _scaled(tol, expected)) for what, expected, tol in checks
        ]
        failed = [f"the {what} by {error:.3e}" for what, error, tol in measured if not error <= tol]
        if failed:
            raise ConversionError(
                f"verification failed ({dtype}, {described}): the converted folder's logits differ from "
                f"{' and from '.join(failed)} (tolerance {tolerance:.0e} × max(1, max |logit|)); nothing was "
                "written (after checking the difference, --atol can accept a larger one)"
            )
        card = {
            "title": f"{family.official_class} → {family.head_class.__name__}",
            "version": energyformers.__version__,
            "official_class": family.official_class,
            "repository": provenance.get("repo", family.repository),
            "commit": provenance.get("commit"),
            "checkpoint": Path(checkpoint).name,
            "sha256": sha256_file(checkpoint),
            "layout": layout,
            "dtype": dtype,
            "head": family.head_class.__name__,
            "model_type": config.model_type,
            "kwargs": kwargs,
            "notes": family.structure_notes(kwargs)
            + [
                f"`{key}` in the official config ignored: {family.ignored[key]}."
                for key in provenance["ignored_kwargs"]
            ],
            "processor": (
                f"Image processor: resize to the model's image size, then normalise with mean {mean} and std {std} "
                "(`--image-mean/--image-std`). Check these against the training recipe of the checkpoint: the "
                "authors' data pipeline is not part of their checkpoints."
                if family.input_kind == "image"
                else "Tokenizer: one token per cell, digits 0-9 (0 = blank)."
            ),
            "auto": "AutoModelForImageClassification"
            if family.input_kind == "image"
            else "AutoModelForTokenClassification",
            "extras": sorted(extras),
            "input": described,
            "checks": measured,
        }
        (tmp / "README.md").write_text(_model_card(card))
        _set_default_permissions(tmp)
        _place(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    log(f"converted {Path(checkpoint).name} ({layout}) -> {out} [{family.head_class.__name__}, {dtype}]")
    for what, error, tol in measured:
        log(f"  verified against the {what} {described}: max |Δlogits| = {error:.3e} (tolerance {tol:.0e})")
    if extras:
        log(f"  {len(extras)} official tensors without an exact counterpart kept in {EXTRAS_FILE}")
    return out


# ------------------------------------------------------------------------------------------------
# Reverse conversion
# ------------------------------------------------------------------------------------------------


def _weights_dtype(model_dir: Path) -> torch.dtype:
    path = model_dir / "model.safetensors"
    if not path.is_file():
        raise ConversionError(
            f"{model_dir} has no model.safetensors (sharded or pickle folders are not read)"
        )
    with safe_open(str(path), framework="pt") as handle:
        dtypes = {handle.get_slice(key).get_dtype() for key in handle.keys()}
    return torch.float64 if dtypes == {"F64"} else torch.float32


def export_official(
    source: str,
    model_dir: str | Path,
    output: str | Path,
    *,
    overwrite: bool = False,
    atol: float | None = None,
    log=print,
) -> Path:
    """Our model folder → official-layout bare state_dict (safetensors) + `<output>.json` with the kwargs."""
    family = SOURCES[source]
    model_dir, output = Path(model_dir), Path(output)
    if output.suffix != ".safetensors":
        raise ConversionError(f"--output {output}: write a .safetensors file (pickle is never written)")
    sidecar = output.with_suffix(".json")
    for path in (output, sidecar):
        if path.exists() and not overwrite:
            raise ConversionError(f"{path} exists; pass --overwrite to replace it")
    if not (model_dir / "config.json").is_file():
        raise ConversionError(f"{model_dir} is not a model folder (no config.json)")
    torch_dtype = _weights_dtype(model_dir)
    model = family.head_class.from_pretrained(model_dir, dtype=torch_dtype).eval()
    ours = {key: value.detach() for key, value in model.state_dict().items()}
    official, kwargs = family.to_official({k: v.to(torch.float64) for k, v in ours.items()}, model.config)
    official = {key: value.to(torch_dtype).contiguous() for key, value in official.items()}
    mode = "canonical (function-equivalent) official tensors"
    extras_path = model_dir / EXTRAS_FILE
    if extras_path.is_file():
        with safe_open(str(extras_path), framework="pt") as handle:
            stored = (handle.metadata() or {}).get("weights_fingerprint")
        if stored == fingerprint(ours):
            official.update(load_file(str(extras_path)))
            mode = f"the exact official tensors (with {EXTRAS_FILE})"
        else:
            log(f"  note: the weights changed since conversion; {EXTRAS_FILE} is stale and not used")
    family.check_state(official, kwargs, "reverse conversion")

    inputs = family.example_inputs(kwargs)
    expected = family.official_logits(official, kwargs, inputs, torch_dtype)
    error = _max_abs(expected, family.model_logits(model, inputs))
    tolerance = _scaled(DEFAULT_ATOL[torch_dtype] if atol is None else atol, expected)
    if not error <= tolerance:
        raise ConversionError(
            f"verification failed: the official computation on the exported tensors differs from the model by "
            f"{error:.3e} (tolerance {tolerance:.0e}); nothing was written"
        )
    metadata = {"format": "pt", "source": source, "official_kwargs": json.dumps(kwargs)}
    output.parent.mkdir(parents=True, exist_ok=True)
    tmp_weights = output.with_name(f".{output.name}.{os.getpid()}.tmp")
    tmp_json = sidecar.with_name(f".{sidecar.name}.{os.getpid()}.tmp")
    try:
        save_file(official, str(tmp_weights), metadata=metadata)
        tmp_json.write_text(
            json.dumps(
                {
                    "source": {"repo": family.repository},
                    "constructor": {"class": family.official_class, "kwargs": kwargs},
                },
                indent=1,
            )
            + "\n"
        )
        _set_default_permissions(tmp_weights, tmp_json)
        os.replace(tmp_weights, output)
        os.replace(tmp_json, sidecar)
    except BaseException:
        for path in (tmp_weights, tmp_json):
            path.unlink(missing_ok=True)
        raise
    log(f"wrote {output} ({len(official)} official keys, {mode}) and {sidecar}")
    log(
        f"  verified: official computation vs model on a fixed input, max |Δlogits| = {error:.3e} (tolerance {tolerance:.0e})"
    )
    return output
