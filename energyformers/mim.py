# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Masked image modelling around `HyperSetForMaskedImageModeling`: the image tokenizer, the paper's masking and
the reconstruction metrics.

The model reads a grid of discrete codes; a VQ tokenizer turns pixels into codes and codes back into pixels. Any
object with `codebook_size`, `encode(pixels) -> codes` and `decode(codes) -> pixels` plugs in (`VQTokenizer`). The
paper's tokenizer is MaskGIT's VQGAN (256² images → 16 × 16 codes, codebook 1024), whose weights this package does
not ship and cannot download in tests: `VQGANTokenizer` runs it (or any VQ autoencoder held as a diffusers
`VQModel`) where a user has it. `PatchKMeansTokenizer` is a small tokenizer that works offline: a k-means
codebook of image patches, each code decoded to its centroid. It gives the whole loop (tokenize, train, mask,
decode, measure) on real images, but its reconstructions are blocky averages of patches, so its PSNR/SSIM are not
comparable with the paper's VQGAN numbers.
"""

from __future__ import annotations

import json
import math
import numbers
import os
import re
from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import torch

from .tokenizer_fit import (
    TOKENIZER_CONFIG_NAME,
    TOKENIZER_WEIGHTS_NAME,
    TokenizerMismatchError,
    check_tokenizer_fits,
    saved_tokenizer_numbers,
)

if TYPE_CHECKING:  # diffusers is an optional extra ([vqgan]): imported where a VQGAN is loaded
    from diffusers import VQModel


# `read_tokenizer_settings` words a refused file as the JSON reader of energyformers' training package does, and
# the two must stay in step (the package's test suite compares them); its own copy because the exported pipeline
# code carries this module, and that code imports nothing of the training package.
_TOKENIZER_REMEDY = (
    "save the image tokenizer again (PatchKMeansTokenizer / VQGANTokenizer .save_pretrained(model_dir))"
)
_JSON_TYPE_NAMES = {bool: "true or false", int: "an integer", float: "a number", str: "a string"}
_JSON_TYPE_NAMES.update({list: "a list", dict: "an object"})
_SHOWN_JSON = 40  # the characters of a refused value a message shows


def is_integer(value: object) -> bool:
    """Whether a count or seed argument is an integer: Python's or any other `numbers.Integral` (numpy's, from a
    sweep over `np.arange`), which is then used as `int(value)`; not a bool, a float of integral value or a tensor."""
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _json_type_name(types: type | tuple[type, ...]) -> str:
    names = [_JSON_TYPE_NAMES.get(t, t.__name__) for t in (types if isinstance(types, tuple) else (types,))]
    return "a number" if set(names) == {"an integer", "a number"} else " or ".join(names)


def _has_type(value: object, types: type | tuple[type, ...]) -> bool:
    # JSON's true/false are Python bools, which are ints too: an integer field does not take them
    if isinstance(value, bool) and bool not in (types if isinstance(types, tuple) else (types,)):
        return False
    return isinstance(value, types)


def read_tokenizer_settings(
    path: Path, fields: dict[str, type | tuple[type, ...]] | None = None, optional: tuple[str, ...] = ()
) -> dict:
    """The settings a saved image tokenizer holds in `path` (its vq_tokenizer_config.json): a JSON object with each
    of `fields` (name: type) and, where present and not null, each of `optional` as a string. A ValueError naming
    the file, what it holds and what was expected otherwise, in `read_json_object`'s words."""
    path = Path(path)
    try:
        settings = json.loads(path.read_text())
    except OSError as err:  # e.g. no permission to read it
        raise ValueError(f"{path}: cannot be read ({err.strerror or err}); {_TOKENIZER_REMEDY}.") from None
    except ValueError as err:  # UnicodeDecodeError is a ValueError
        raise ValueError(
            f"{path}: not valid JSON ({' '.join(str(err).split())}); {_TOKENIZER_REMEDY}."
        ) from None
    except RecursionError:  # the training package's `weights.parse_json`, in its words
        raise ValueError(
            f"{path}: not valid JSON (nested too deeply to read: Python's JSON parser stops at its recursion "
            f"limit); {_TOKENIZER_REMEDY}."
        ) from None
    if not isinstance(settings, dict):
        raise ValueError(
            f"{path}: holds a JSON {type(settings).__name__}, not an object; {_TOKENIZER_REMEDY}."
        )
    for key, types in {**dict.fromkeys(optional, str), **(fields or {})}.items():
        if key not in settings or settings[key] is None:
            if fields and key in fields:
                raise ValueError(f"{path}: no {key!r} ({_json_type_name(types)}); {_TOKENIZER_REMEDY}.")
            continue
        if not _has_type(settings[key], types):
            shown = json.dumps(settings[key])
            shown = shown if len(shown) <= _SHOWN_JSON else f"{shown[: _SHOWN_JSON - 3]}..."
            raise ValueError(f"{path}: {key}={shown} is not {_json_type_name(types)}; {_TOKENIZER_REMEDY}.")
    return settings


@runtime_checkable
class VQTokenizer(Protocol):
    """What the masked-image-modelling loop needs of an image tokenizer."""

    codebook_size: int

    def encode(self, pixel_values: torch.Tensor) -> torch.LongTensor:
        """`(B, C, H, W)` pixels → `(B, N)` codes in [0, codebook_size), row-major over the grid."""
        ...

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        """`(B, N)` codes → `(B, C, H, W)` pixels."""
        ...


class PatchKMeansTokenizer:
    """A k-means codebook of non-overlapping `patch_size` × `patch_size` patches: a patch's code is its nearest
    centroid (Euclidean), and a code decodes to its centroid. Fitted on real images with `fit`; saved as
    safetensors (`save_pretrained` / `from_pretrained`).

    Args:
        centroids: `(codebook_size, num_channels · patch_size²)`, each row a patch flattened in (channel, row,
            column) order.
        patch_size: side of the square patches, in pixels.
        image_size: `(height, width)` of the images it encodes (multiples of `patch_size`).
        num_channels: channels of the images.
    """

    def __init__(
        self, centroids: torch.Tensor, patch_size: int, image_size: tuple[int, int], num_channels: int
    ) -> None:
        height, width = image_size
        for name, value in (("patch_size", patch_size), ("num_channels", num_channels)):
            if not is_integer(value) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
        patch_size, num_channels = int(patch_size), int(num_channels)
        if height % patch_size or width % patch_size or height < 1 or width < 1:
            raise ValueError(
                f"image_size must be positive multiples of patch_size={patch_size}; got {tuple(image_size)}."
            )
        expected = num_channels * patch_size**2
        if centroids.ndim != 2 or centroids.shape[1] != expected or centroids.shape[0] < 1:
            raise ValueError(
                f"centroids must have shape (codebook_size, num_channels·patch_size² = {expected}); got "
                f"{tuple(centroids.shape)}."
            )
        self.centroids = centroids.detach().float().contiguous()
        self.patch_size = patch_size
        self.image_size = (int(height), int(width))
        self.num_channels = num_channels

    @property
    def codebook_size(self) -> int:
        """Number of codes: the centroids' rows."""
        return self.centroids.shape[0]

    @property
    def grid(self) -> tuple[int, int]:
        """(rows, columns) of the code grid."""
        return self.image_size[0] // self.patch_size, self.image_size[1] // self.patch_size

    @classmethod
    def fit(
        cls,
        images: torch.Tensor,
        patch_size: int,
        codebook_size: int,
        seed: int = 0,
        n_init: int = 3,
    ) -> PatchKMeansTokenizer:
        """Fit the codebook with scikit-learn's k-means (k-means++ seeding, `n_init` restarts, seeded) on every
        patch of `images` `(B, C, H, W)`."""
        from sklearn.cluster import KMeans

        if images.ndim != 4:
            raise ValueError(
                f"images must have shape (batch, channels, height, width); got {tuple(images.shape)}."
            )
        if not is_integer(codebook_size) or codebook_size < 2:
            raise ValueError(f"codebook_size must be an integer >= 2; got {codebook_size!r}.")
        codebook_size = int(codebook_size)
        patches = _patches(images.float(), patch_size)  # raises for sizes that are not multiples of the patch
        flat = patches.flatten(0, 1)  # (B·N, C·p·p): every patch of every image is one k-means sample
        if len(flat) < codebook_size:
            raise ValueError(
                f"codebook_size={codebook_size} exceeds the {len(flat)} patches of the images; pass more images "
                "or a smaller codebook."
            )
        kmeans = KMeans(n_clusters=codebook_size, n_init=n_init, random_state=seed).fit(flat.double().numpy())
        centroids = torch.from_numpy(kmeans.cluster_centers_).float()
        return cls(centroids, patch_size, tuple(images.shape[-2:]), images.shape[1])

    def encode(self, pixel_values: torch.Tensor) -> torch.LongTensor:
        self._check_pixels(pixel_values)
        patches = _patches(pixel_values.float(), self.patch_size)  # (B, N, C·p·p)
        centroids = self.centroids.to(patches.device)
        return torch.cdist(patches, centroids[None].expand(len(patches), -1, -1)).argmin(-1)

    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        rows, columns = self.grid
        if codes.ndim != 2 or codes.shape[1] != rows * columns or codes.dtype.is_floating_point:
            raise ValueError(
                f"codes must be integer codes of shape (batch, {rows * columns}) for the {rows} × {columns} grid; "
                f"got shape {tuple(codes.shape)} and dtype {codes.dtype}."
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(
                f"codes must lie in [0, codebook_size={self.codebook_size}); got values in "
                f"[{int(codes.min())}, {int(codes.max())}] (fill every [MASK] before decoding)."
            )
        p, channels = self.patch_size, self.num_channels
        patches = self.centroids.to(codes.device)[codes]  # (B, N, C·p·p)
        # `_patches` undone: (B, N, C·p·p) → (B, rows, columns, C, p, p) → (B, C, rows, p, columns, p)
        # → (B, C, rows·p, columns·p)
        patches = patches.view(len(codes), rows, columns, channels, p, p)
        return patches.permute(0, 3, 1, 4, 2, 5).reshape(len(codes), channels, rows * p, columns * p)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"centroids": self.centroids}, str(folder / TOKENIZER_WEIGHTS_NAME))
        config = {
            "tokenizer_class": type(self).__name__,
            "patch_size": self.patch_size,
            "image_size": list(self.image_size),
            "num_channels": self.num_channels,
            "codebook_size": self.codebook_size,
        }
        (folder / TOKENIZER_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(
        cls,
        folder: str | os.PathLike,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
    ) -> PatchKMeansTokenizer:
        """Load the codebook saved in a local folder, or in a Hub repo `folder` ("user/repo", downloaded to the
        Hub cache with `revision`, `token`, `cache_dir` and `local_files_only`, as transformers' `from_pretrained`)."""
        from safetensors.torch import load_file

        folder = tokenizer_folder(
            folder, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
        )
        for name in (TOKENIZER_CONFIG_NAME, TOKENIZER_WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder}: missing {name} (write it with save_pretrained).")
        config = read_tokenizer_settings(
            folder / TOKENIZER_CONFIG_NAME,
            {"patch_size": int, "image_size": list, "num_channels": int},
            optional=("tokenizer_class",),
        )
        if config.get("tokenizer_class") != cls.__name__:
            raise ValueError(
                f"{folder / TOKENIZER_CONFIG_NAME}: tokenizer_class={config.get('tokenizer_class')!r}; expected {cls.__name__!r}."
            )
        centroids = load_file(str(folder / TOKENIZER_WEIGHTS_NAME))["centroids"]
        return cls(centroids, config["patch_size"], tuple(config["image_size"]), config["num_channels"])

    def _check_pixels(self, pixel_values: torch.Tensor) -> None:
        expected = (self.num_channels, *self.image_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values must have shape (batch, {expected[0]}, {expected[1]}, {expected[2]}); got "
                f"{tuple(pixel_values.shape)}."
            )


VQGAN_SUBFOLDER = (
    "vqgan"  # where `VQGANTokenizer.save_pretrained` puts the diffusers model inside a model folder
)


class VQGANTokenizer:
    """A VQ autoencoder held as a diffusers `VQModel`: the paper's tokenizer, MaskGIT's VQGAN, where a user has it.

    MaskGIT's VQGAN (`llvictorll/Maskgit-pytorch` on the Hub, `pretrained_maskgit/VQGAN/last.ckpt` with its
    `model.yaml`; the authors load it with their copy of taming-transformers' `VQModel`) is an f16 encoder/decoder
    of GroupNorm residual blocks with attention, a 1 × 1 quantisation convolution and a nearest-neighbour codebook
    of 1024 vectors: the structure of diffusers' `VQModel`, with `AttnDownEncoderBlock2D` / `AttnUpDecoderBlock2D`
    at the resolutions its `attn_resolutions` lists. `from_taming` loads that checkpoint and its YAML (mapping
    taming's names onto diffusers'); `from_pretrained` loads a `VQModel` folder (`config.json` + weights, as
    `save_pretrained` writes after a `from_taming`).
    Needs the optional `diffusers` package (`pip install "energyformers[vqgan]"`).

    `encode` takes pixels in [0, 1] and maps them to the model's `pixel_range` (MaskGIT's VQGAN: [−1, 1]); a code
    is the index of the codebook vector nearest to the encoder's latent at that grid position (row-major).
    `decode` looks the codes up in the codebook, runs the decoder and maps its output back to [0, 1], clamped.

    Args:
        model: a diffusers `VQModel`.
        pixel_range: (low, high), the pixel values the model was trained on.
    """

    def __init__(self, model: VQModel, pixel_range: tuple[float, float] = (-1.0, 1.0)) -> None:
        low, high = (float(v) for v in pixel_range)
        if not high > low:
            raise ValueError(f"pixel_range must be (low, high) with high > low; got {tuple(pixel_range)!r}.")
        self.model = model.eval()
        self.pixel_range = (low, high)

    @property
    def codebook_size(self) -> int:
        """Number of codes in the VQGAN's codebook."""
        return int(self.model.config.num_vq_embeddings)

    @property
    def downsampling(self) -> int:
        """Pixels per code along each side: 2^(levels − 1) (16 for MaskGIT's VQGAN)."""
        return 2 ** (len(self.model.config.block_out_channels) - 1)

    @property
    def num_channels(self) -> int:
        """Channels of the images the VQGAN encodes."""
        return int(self.model.config.in_channels)

    @classmethod
    def from_pretrained(
        cls,
        path: str | os.PathLike,
        pixel_range: tuple[float, float] | None = None,
        dtype: torch.dtype = torch.float32,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
    ) -> VQGANTokenizer:
        """Load a local diffusers `VQModel` folder, or a model folder holding one saved by `save_pretrained`
        (`vqgan/` with `vq_tokenizer_config.json` beside it), or such a model folder published as a Hub repo
        ("user/repo": its tokenizer files downloaded to the Hub cache with `revision`, `token`, `cache_dir` and
        `local_files_only`, as transformers' `from_pretrained`)."""
        folder = Path(path)
        if not folder.is_dir() and _looks_like_repo_id(path):
            folder = tokenizer_folder(
                path, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
            )
        if not folder.is_dir():
            raise FileNotFoundError(
                f"path={str(path)!r}: no such folder; expected a diffusers VQModel folder (config.json and "
                "diffusion_pytorch_model.safetensors, written by VQModel.save_pretrained) or a model folder with "
                f"{TOKENIZER_CONFIG_NAME} and {VQGAN_SUBFOLDER}/."
            )
        settings = {}
        if (folder / TOKENIZER_CONFIG_NAME).is_file():
            settings = read_tokenizer_settings(
                folder / TOKENIZER_CONFIG_NAME, optional=("tokenizer_class", "subfolder")
            )
            if settings.get("tokenizer_class") != cls.__name__:
                raise ValueError(
                    f"{folder / TOKENIZER_CONFIG_NAME}: tokenizer_class={settings.get('tokenizer_class')!r}; expected "
                    f"{cls.__name__!r}."
                )
            folder = folder / settings.get("subfolder", VQGAN_SUBFOLDER)
        if not (folder / "config.json").is_file():
            raise FileNotFoundError(
                f"path={str(path)!r}: {folder} has no config.json; expected a diffusers VQModel folder "
                "(VQModel.save_pretrained)."
            )
        vq_model = _diffusers_vq_model()
        model = vq_model.from_pretrained(folder, local_files_only=True, torch_dtype=dtype)
        pixel_range = pixel_range or tuple(settings.get("pixel_range", (-1.0, 1.0)))
        return cls(model, pixel_range)

    @classmethod
    def from_taming(
        cls,
        checkpoint: str | os.PathLike,
        config: str | os.PathLike,
        pixel_range: tuple[float, float] = (-1.0, 1.0),
        dtype: torch.dtype = torch.float32,
        trust_pickle: bool = False,
    ) -> VQGANTokenizer:
        """Load a taming-transformers VQGAN: MaskGIT's `pretrained_maskgit/VQGAN/last.ckpt` with its `model.yaml`.

        The `.ckpt` (a PyTorch Lightning checkpoint) is read without running code from it: the tensors are
        loaded by torch's weights-only reader and Lightning's other objects (optimizer and loop state, callbacks)
        stand in as inert placeholders; `trust_pickle=True` unpickles fully, for a file whose origin you trust.
        The YAML's `model.params` (`embed_dim`, `n_embed`, `ddconfig`) give the diffusers `VQModel`; every
        tensor of the checkpoint's `state_dict` is mapped onto it by name and shape, except the training-only
        `loss.*` entries (LPIPS network, discriminator), which are left out. A missing, unexpected or mis-shaped
        tensor, or a config the diffusers structure cannot hold, raises `ValueError` (a `ConversionError`)
        naming the file and the key. `save_pretrained` then writes the diffusers layout: convert once.
        """
        from .training.convert.vqgan import load_taming_vqgan

        _diffusers_vq_model()  # the optional dependency, with its install hint, before any file is read
        return cls(load_taming_vqgan(checkpoint, config, trust_pickle=trust_pickle, dtype=dtype), pixel_range)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        """Write the VQModel into `folder/vqgan/` and `vq_tokenizer_config.json` beside it, so that a model folder
        can carry its tokenizer (`load_vq_tokenizer`)."""
        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(folder / VQGAN_SUBFOLDER)
        config = {
            "tokenizer_class": type(self).__name__,
            "subfolder": VQGAN_SUBFOLDER,
            "pixel_range": list(self.pixel_range),
            "codebook_size": self.codebook_size,
        }
        (folder / TOKENIZER_CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @torch.no_grad()
    def encode(self, pixel_values: torch.Tensor) -> torch.LongTensor:
        factor = self.downsampling
        if (
            pixel_values.ndim != 4
            or pixel_values.shape[1] != self.num_channels
            or pixel_values.shape[-1] % factor
            or pixel_values.shape[-2] % factor
        ):
            raise ValueError(
                f"pixel_values must have shape (batch, {self.num_channels}, height, width) with sides multiples of "
                f"the downsampling factor {factor}; got {tuple(pixel_values.shape)}."
            )
        weight = self.model.quantize.embedding.weight
        low, high = self.pixel_range
        pixels = pixel_values.to(weight.device, weight.dtype) * (high - low) + low
        latents = self.model.encode(pixels).latents  # (B, C, h, w), before quantisation
        # (B, C, h, w) → (B, h·w, C), the grid in row-major order
        flat = latents.permute(0, 2, 3, 1).reshape(len(latents), -1, latents.shape[1])
        return torch.cdist(flat, weight[None].expand(len(flat), -1, -1)).argmin(-1)

    @torch.no_grad()
    def decode(self, codes: torch.Tensor) -> torch.Tensor:
        side = math.isqrt(codes.shape[-1]) if codes.ndim == 2 else 0
        if codes.ndim != 2 or side * side != codes.shape[1] or codes.dtype.is_floating_point:
            raise ValueError(
                "codes must be integer codes of shape (batch, side²) for a square grid; got shape "
                f"{tuple(codes.shape)} and dtype {codes.dtype}."
            )
        if codes.numel() and (int(codes.min()) < 0 or int(codes.max()) >= self.codebook_size):
            raise ValueError(
                f"codes must lie in [0, codebook_size={self.codebook_size}); got values in "
                f"[{int(codes.min())}, {int(codes.max())}] (fill every [MASK] before decoding)."
            )
        weight = self.model.quantize.embedding.weight
        quantized = weight[codes.to(weight.device)]  # (B, N, C)
        # (B, side·side, C) → (B, side, side, C) → (B, C, side, side): the row-major grid `encode` flattened
        quantized = quantized.view(len(codes), side, side, -1).permute(0, 3, 1, 2)
        pixels = self.model.decode(quantized, force_not_quantize=True).sample
        low, high = self.pixel_range
        return ((pixels.float() - low) / (high - low)).clamp(0, 1)


def _diffusers_vq_model():
    try:
        from diffusers import VQModel
    except ImportError as err:
        raise ImportError(
            "VQGANTokenizer needs the optional package 'diffusers' (its VQModel runs the VQGAN); install it with "
            '`pip install "energyformers[vqgan]"` or `pip install diffusers`.'
        ) from err
    return VQModel


def _looks_like_repo_id(path_or_repo_id: str | os.PathLike) -> bool:
    """ "name" or "namespace/name", as the Hub spells repo ids; anything else is meant as a local path."""
    text = str(path_or_repo_id)
    return not isinstance(path_or_repo_id, Path) and bool(re.fullmatch(r"[\w.-]+(/[\w.-]+)?", text))


def tokenizer_folder(
    path_or_repo_id: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> Path:
    """The local folder holding the image tokenizer of `path_or_repo_id`: the folder itself, or, for a Hub repo id,
    its snapshot in the Hub cache once `vq_tokenizer_config.json` and the files it names (the codebook, or a
    VQGAN's `config.json` and weights in its subfolder) are there. Downloads go through transformers'
    `cached_file`, so `revision`, `token`, `cache_dir`, `local_files_only` and `HF_HUB_OFFLINE` mean what they mean
    for `from_pretrained`. A repo without a tokenizer raises `FileNotFoundError` naming the repo and the file."""
    if Path(path_or_repo_id).is_dir() or not _looks_like_repo_id(path_or_repo_id):
        return Path(path_or_repo_id)
    from transformers.utils import cached_file

    repo_id = str(path_or_repo_id)
    hub = dict(revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
    where = f"Hub repo {repo_id!r}" + (f" at revision {revision!r}" if revision else "")

    def fetch(name: str, subfolder: str = "") -> Path:
        try:
            path = cached_file(
                repo_id,
                name,
                subfolder=subfolder,
                _raise_exceptions_for_missing_entries=False,
                **hub,
            )
        except OSError as err:  # no such repo or revision, or offline without the file in the cache
            raise OSError(f"{where}: cannot read {name!r} of its image tokenizer: {err}") from err
        if path is None:
            named = f"{subfolder}/{name}" if subfolder else name
            raise FileNotFoundError(
                f"{where} holds no {named}, so it has no image tokenizer (written by PatchKMeansTokenizer / "
                "VQGANTokenizer.save_pretrained into the model folder before export); pass vq_tokenizer= "
                "explicitly."
            )
        return Path(path)

    config_path = fetch(TOKENIZER_CONFIG_NAME)
    settings = read_tokenizer_settings(config_path, optional=("subfolder",))
    subfolder = settings.get("subfolder")
    if subfolder is None:
        fetch(TOKENIZER_WEIGHTS_NAME)
    else:  # a VQGAN: diffusers' VQModel folder, as VQModel.save_pretrained writes it
        fetch("config.json", str(subfolder))
        fetch("diffusion_pytorch_model.safetensors", str(subfolder))
    # the Hub cache's snapshot mirrors the repo's layout: the files fetched above lie beside the config
    return config_path.parent


def load_vq_tokenizer(
    folder: str | os.PathLike,
    *,
    revision: str | None = None,
    token: str | bool | None = None,
    cache_dir: str | os.PathLike | None = None,
    local_files_only: bool = False,
) -> PatchKMeansTokenizer | VQGANTokenizer:
    """The image tokenizer saved in `folder` (`vq_tokenizer_config.json` names its class): a local folder or a Hub
    repo id ("user/repo"; see `tokenizer_folder` for `revision`, `token`, `cache_dir`, `local_files_only`)."""
    folder = tokenizer_folder(
        folder, revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only
    )
    path = Path(folder) / TOKENIZER_CONFIG_NAME
    if not path.is_file():
        raise FileNotFoundError(
            f"{folder}: no {TOKENIZER_CONFIG_NAME}; save a tokenizer there (PatchKMeansTokenizer / VQGANTokenizer "
            ".save_pretrained), or give the pipeline one (vq_tokenizer=...)."
        )
    name = read_tokenizer_settings(path, optional=("tokenizer_class",)).get("tokenizer_class")
    classes = {cls.__name__: cls for cls in (PatchKMeansTokenizer, VQGANTokenizer)}
    if name not in classes:
        raise ValueError(f"{path}: tokenizer_class={name!r}; expected one of {sorted(classes)}.")
    return classes[name].from_pretrained(folder)


def _patches(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """`(B, C, H, W)` → `(B, N, C·p·p)`: the `N = (H / p)·(W / p)` patches of side `p = patch_size`."""
    batch, channels, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"image sides {height} × {width} must be multiples of patch_size={patch_size}.")
    p = patch_size
    # (B, C, H, W) → (B, C, H/p, p, W/p, p) → (B, H/p, W/p, C, p, p): the grid's rows and columns first
    grid = images.reshape(batch, channels, height // p, p, width // p, p).permute(0, 2, 4, 1, 3, 5)
    # → (B, N, C·p·p): patches row-major over the grid, each flattened in (channel, row, column) order (the order
    # of the centroids' rows and of `decode`'s inverse)
    return grid.reshape(batch, (height // p) * (width // p), channels * p * p)


def mask_codes(
    codes: torch.Tensor,
    mask_token_id: int,
    ratio: float | tuple[float, float],
    generator: torch.Generator | None = None,
) -> tuple[torch.LongTensor, torch.LongTensor]:
    """Hide round(r · N) random positions of each grid: `(input_ids, labels)`, [MASK] in the inputs and the true
    code in the labels where hidden, −100 elsewhere. `ratio`: a fixed r (evaluation: the paper's 0.4) or a range
    (low, high) from which each image draws r uniformly (training: the paper's (0, 0.4))."""
    low, high = (ratio, ratio) if isinstance(ratio, (int, float)) else ratio
    if not 0 <= low <= high <= 1:
        raise ValueError(
            f"ratio must be a fraction in [0, 1] or a range (low, high) within it; got {ratio!r}."
        )
    batch, length = codes.shape
    ratios = low + (high - low) * torch.rand(batch, generator=generator)
    counts = (ratios * length).round().long()  # (B,)
    order = torch.rand(batch, length, generator=generator).argsort(dim=-1)
    rank = torch.empty_like(order).scatter_(-1, order, torch.arange(length).expand(batch, -1))
    hidden = (rank < counts[:, None]).to(codes.device)
    return codes.masked_fill(hidden, mask_token_id), codes.masked_fill(~hidden, -100)


# The LPIPS backbones by the file names torchvision stores their ImageNet weights under (its `weights=DEFAULT`
# for each), and the backbone torchmetrics' LPIPS calls each one.
LPIPS_BACKBONE_FILES = {
    "alexnet-owt-7be5be79.pth": "alex",
    "vgg16-397923af.pth": "vgg",
    "squeezenet1_1-b8a52dc0.pth": "squeeze",
}


def _torchvision_problem() -> str | None:
    """Why torchvision cannot be used here, or None. Importing it is the only honest check: a wheel built for
    another torch (PyPI's CUDA build beside a CPU torch) is installed yet fails on import."""
    try:
        import torchvision  # noqa: F401
    except Exception as err:
        return f"torchvision does not import here ({type(err).__name__}: {err})"
    return None


# The width of Inception's pool features, what FID compares; an exported detector without `return_features` must
# return them (its class logits are 1008 wide)
INCEPTION_POOL_FEATURES = 2048

FID_DETECTOR_FORMATS = (
    "a TorchScript Inception such as inception-2015-12-05.pt, the same network saved with torch.export.save (a "
    ".pt2 archive), or torch-fidelity's state dict weights-inception-2015-12-05-6726825d.pth"
)


def _detector_format(path: Path) -> str | None:
    """How an FID detector file was saved, told by its contents, not its name: "torchscript" (torch.jit.save's
    archive holds compiled code beside its tensors), "export" (torch.export.save's holds a serialized graph under
    models/ and an archive_format record), "state_dict" (torch.save's zip with a pickle, or a legacy pickle file),
    or None for any other file."""
    import zipfile

    if not zipfile.is_zipfile(path):
        with open(path, "rb") as file:
            return "state_dict" if file.read(1) == b"\x80" else None  # a pickle of protocol 2 or later
    with zipfile.ZipFile(path) as archive:
        names = [name.split("/", 1)[-1] for name in archive.namelist()]
    if any(name.startswith("code/") for name in names):
        return "torchscript"
    if "archive_format" in names and any(name.startswith("models/") for name in names):
        return "export"
    return "state_dict" if "data.pkl" in names else None


def _saved_devices(path: Path) -> set[str]:
    """The device types a torch.export archive records for its tensors (the `device` entries of its JSON files),
    read without loading it; empty where none can be read."""
    import zipfile

    try:
        with zipfile.ZipFile(path) as archive:
            texts = [archive.read(name) for name in archive.namelist() if name.endswith(".json")]
    except (OSError, zipfile.BadZipFile):
        return set()
    return {kind.decode() for text in texts for kind in re.findall(rb'"device": *\{"type": *"(\w+)"', text)}


def _exported_detector(
    path: Path, named: str
) -> tuple[torch.nn.Module, dict, tuple[int, int] | None, int | None]:
    """The module of a torch.export FID detector, the keyword arguments it was exported with, its fixed image size
    (None when height and width are dynamic) and its feature count (None when not fixed). Refused, naming the
    argument: a program whose one tensor input is not `(batch, 3, height, width)` with a dynamic batch, one exported
    with `return_features=False`, or one exported without the flag whose output is not Inception's
    `INCEPTION_POOL_FEATURES` pool features per image (the plain `torch.export.export(net, (images,))` of a detector
    whose flag defaults to False records no flag and returns its class logits)."""
    from torch.export.graph_signature import ConstantArgument, InputKind, TensorArgument
    from torch.export.passes import move_to_device_pass

    try:
        program = torch.export.load(str(path))
    except Exception as err:
        # torch.export.load puts every tensor back on the device it was saved from and takes no map_location:
        # a detector exported on a GPU fails on a machine without one, in torch's words only
        devices = sorted(_saved_devices(path) - {"cpu"})
        if not devices:
            raise
        raise ValueError(
            f"{named}: the program was exported with its tensors on {', '.join(devices)}, which torch.export.load "
            f"cannot put them back on here ({type(err).__name__}: {err}); save it from the CPU: "
            "torch.export.save(torch.export.passes.move_to_device_pass(program, 'cpu'), path)"
        ) from err
    # on the CPU, where the metric gets its images and where a TorchScript detector is loaded (map_location)
    program = move_to_device_pass(program, "cpu")
    inputs = [spec.arg for spec in program.graph_signature.input_specs if spec.kind == InputKind.USER_INPUT]
    tensors = [arg.name for arg in inputs if isinstance(arg, TensorArgument)]
    constants = {arg.name: arg.value for arg in inputs if isinstance(arg, ConstantArgument)}
    placeholders = {node.name: node for node in program.graph.nodes if node.op == "placeholder"}
    shape = tuple(placeholders[tensors[0]].meta["val"].shape) if len(tensors) == 1 else ()
    export = (
        "export it as torch.export.export(net, (images,), {'return_features': True}, dynamic_shapes="
        "{'images': {0: Dim('batch'), 2: Dim('height'), 3: Dim('width')}, 'return_features': None})"
    )
    if len(shape) != 4 or shape[1] != 3 or isinstance(shape[0], int):
        raise ValueError(
            f"{named}: an exported FID detector takes one image batch (batch, 3, height, width) of any batch size; "
            f"this program takes tensors {tensors} of shape {shape or '?'}: {export}"
        )
    if constants not in ({}, {"return_features": True}):
        raise ValueError(
            f"{named}: an exported FID detector returns the pool features; this program was exported with "
            f"{constants}: {export}"
        )
    size = tuple(shape[2:]) if all(isinstance(side, int) for side in shape[2:]) else None
    output = next(node for node in program.graph.nodes if node.op == "output").args[0][0]
    # the values per image, as `_InceptionFeatures` flattens them: Inception's pool output may keep its 1 × 1
    # spatial dimensions, (batch, 2048, 1, 1)
    per_image = output.meta["val"].shape[1:]
    features = math.prod(per_image) if all(isinstance(side, int) for side in per_image) else None
    if not constants and features != INCEPTION_POOL_FEATURES:
        raise ValueError(
            f"{named}: an exported FID detector returns the {INCEPTION_POOL_FEATURES} pool features per image; this "
            f"program, exported without return_features, returns {features or 'a varying number of'} values per "
            f"image (a detector's class logits when its flag defaults to False): {export}"
        )
    return program.module(), constants, size, features


def check_perceptual_weights(
    lpips_weights: str | os.PathLike | None,
    fid_weights: str | os.PathLike | None,
    *,
    flags: bool = False,
) -> None:
    """Refuse, before any work, LPIPS/FID weight paths that cannot be used: a missing file (naming the argument and
    the path), an FID file in none of the detector formats or an exported detector of another signature, or a
    maintained implementation that cannot run here (naming what is missing). Loads nothing but an exported
    detector's program, whose signature only it can tell.

    Each message starts with the argument and its value as the caller gave it: `fid_weights='/x/y.pt'` for Python
    callers, `--fid_weights /x/y.pt` with `flags=True` (the command lines' `--lpips_weights` / `--fid_weights`, so
    their one-line error names the flag once)."""

    def given(name: str, value: str | os.PathLike) -> str:
        return f"--{name} {value}" if flags else f"{name}={str(value)!r}"

    if lpips_weights is not None:
        path, named = Path(lpips_weights).expanduser(), given("lpips_weights", lpips_weights)
        if not path.is_file():
            raise FileNotFoundError(
                f"{named}: no such file (torchvision's ImageNet weights of the LPIPS backbone, one of "
                f"{', '.join(LPIPS_BACKBONE_FILES)})"
            )
        if path.name not in LPIPS_BACKBONE_FILES:
            raise ValueError(
                f"{named}: the backbone is known by torchvision's file name, one of "
                f"{', '.join(LPIPS_BACKBONE_FILES)}; got {path.name!r}"
            )
        problem = _torchvision_problem()
        if problem is not None:
            raise ImportError(
                f"{named}: torchmetrics' LPIPS builds its backbone with torchvision, and {problem}; install the "
                "torchvision release built for this torch"
            )
    if fid_weights is not None:
        path, named = Path(fid_weights).expanduser(), given("fid_weights", fid_weights)
        if not path.is_file():
            raise FileNotFoundError(f"{named}: no such file ({FID_DETECTOR_FORMATS})")
        kind = _detector_format(path)
        if kind is None:
            raise ValueError(f"{named}: not an FID detector file; expected {FID_DETECTOR_FORMATS}")
        if kind == "export":
            _exported_detector(path, named)  # its signature, before any work
        if kind == "state_dict":
            problem = _torchvision_problem()
            try:
                if problem is None:
                    import torch_fidelity  # noqa: F401
            except Exception as err:
                problem = f"torch-fidelity does not import here ({type(err).__name__}: {err})"
            if problem is not None:
                raise ImportError(
                    f"{named}: a state dict, which needs torch-fidelity's Inception (through torchmetrics), and "
                    f"{problem}. Install torch-fidelity with a torchvision built for this torch, or pass the "
                    "TorchScript Inception (inception-2015-12-05.pt) or its torch.export program (.pt2), which "
                    "need neither"
                )


class _InceptionFeatures(torch.nn.Module):
    """torchmetrics' FID feature extractor over an Inception saved as TorchScript or with torch.export that follows
    the convention of the FID detectors distributed as TorchScript (StyleGAN2-ADA's, clean-fid's):
    `net(images, return_features=True)` on `(B, 3, H, W)` floats in [0, 255], resized inside, returning pool
    features. `call`: the keyword arguments of the call (an exported program takes the ones it was exported
    with); `size`: an exported program's fixed (height, width), checked before the call; `num_features`, when
    known, spares torchmetrics its probe call on a 299 × 299 image."""

    def __init__(
        self,
        net: torch.nn.Module,
        call: dict,
        named: str,
        size: tuple[int, int] | None = None,
        num_features: int | None = None,
    ) -> None:
        super().__init__()
        self.net, self.call, self.named, self.size = net, call, named, size
        if num_features is not None:
            self.num_features = num_features

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        if self.size is not None and tuple(images.shape[-2:]) != self.size:
            raise ValueError(
                f"{self.named}: the exported detector takes {self.size[0]}×{self.size[1]} images only; got "
                f"{images.shape[-2]}×{images.shape[-1]}. Export it with dynamic height and width "
                "(dynamic_shapes={'images': {0: Dim('batch'), 2: Dim('height'), 3: Dim('width')}, ...})."
            )
        # 8-bit levels, as FID's reference statistics are computed on stored 8-bit images
        pixels = (images.clamp(0, 1) * 255).round().float()
        # (B, F): one row of pool features per image, whatever extra dimensions the network keeps
        return self.net(pixels, **self.call).reshape(len(images), -1)


class PerceptualMetrics:
    """LPIPS and FID from maintained implementations (torchmetrics), their networks read from local files only.

    `lpips_weights`: torchvision's ImageNet weights of the LPIPS backbone (`alexnet-owt-7be5be79.pth`,
    `vgg16-397923af.pth` or `squeezenet1_1-b8a52dc0.pth`; the backbone is told by the name); torchmetrics ships
    LPIPS's own linear layers. Needs a torchvision that imports beside this torch. `fid_weights`: a TorchScript
    Inception (`inception-2015-12-05.pt`) or the same network saved with `torch.export.save` (a `.pt2` archive),
    either run by torchmetrics' FID with no other package, or torch-fidelity's state dict
    (`weights-inception-2015-12-05-6726825d.pth`, which needs torch-fidelity and torchvision).

    Nothing is downloaded: paths are checked first (`check_perceptual_weights`), and the torch hub folder points
    at a private folder holding only the given file while the backbone loads. Gray images are repeated to three
    channels, as both networks read RGB; images with a side under 64 pixels are upsampled to 64 for LPIPS, the
    patch size it was calibrated on (AlexNet's strides leave nothing of smaller images).
    """

    def __init__(
        self, lpips_weights: str | os.PathLike | None = None, fid_weights: str | os.PathLike | None = None
    ) -> None:
        check_perceptual_weights(lpips_weights, fid_weights)
        self.lpips = self.fid = None
        if lpips_weights is not None:
            self.lpips = self._load_lpips(Path(lpips_weights).expanduser().resolve())
        if fid_weights is not None:
            self.fid = self._load_fid(Path(fid_weights).expanduser().resolve())

    @staticmethod
    def _load_lpips(path: Path):
        import tempfile

        from torchmetrics.image.lpip import LearnedPerceptualImagePatchSimilarity

        previous = torch.hub.get_dir()
        with tempfile.TemporaryDirectory() as hub:
            # torchvision looks for <hub>/checkpoints/<its file name> before downloading: it finds the given file
            os.makedirs(os.path.join(hub, "checkpoints"))
            os.symlink(path, os.path.join(hub, "checkpoints", path.name))
            torch.hub.set_dir(hub)
            try:
                metric = LearnedPerceptualImagePatchSimilarity(
                    net_type=LPIPS_BACKBONE_FILES[path.name], normalize=True
                )
            finally:
                torch.hub.set_dir(previous)
        return metric

    @staticmethod
    def _load_fid(path: Path):
        from torchmetrics.image.fid import FrechetInceptionDistance

        named, kind = f"fid_weights={str(path)!r}", _detector_format(path)
        if kind == "torchscript":
            import warnings

            with warnings.catch_warnings():
                # torch deprecates TorchScript: the user chose a TorchScript detector file and cannot act on
                # torch's advice; the filter matches that message only, nothing else is hidden
                warnings.filterwarnings("ignore", message=r"`torch\.jit\.load` is deprecated")
                net = torch.jit.load(str(path), map_location="cpu").eval()
            features = _InceptionFeatures(net, {"return_features": True}, named)
            return FrechetInceptionDistance(feature=features, normalize=True)
        if kind == "export":
            net, call, size, num_features = _exported_detector(path, named)
            features = _InceptionFeatures(net, call, named, size, num_features)
            return FrechetInceptionDistance(feature=features, normalize=True)
        return FrechetInceptionDistance(
            feature=INCEPTION_POOL_FEATURES, feature_extractor_weights_path=str(path), normalize=True
        )

    def __call__(
        self, reconstructed: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0
    ) -> dict[str, float]:
        """`lpips` (mean over the images) and `fid` (the reconstructions against the references as two sets, so
        at least two images) of `(B, C, H, W)` batches in [0, data_range], C 1 or 3."""
        if reconstructed.shape != reference.shape or reference.ndim != 4 or reference.shape[1] not in (1, 3):
            raise ValueError(
                "reconstructed and reference must be image batches (batch, 1 or 3 channels, height, width) of one "
                f"shape; got {tuple(reconstructed.shape)} and {tuple(reference.shape)}."
            )
        if self.fid is not None and len(reference) < 2:
            raise ValueError(
                f"FID compares sets of images: got a batch of {len(reference)}, it needs at least 2."
            )
        images = [
            (x.float() / data_range).clamp(0, 1).expand(-1, 3, -1, -1) for x in (reconstructed, reference)
        ]
        metrics = {}
        with torch.no_grad():
            if self.lpips is not None:
                preds, target = images
                side = min(preds.shape[-2:])
                if side < 64:
                    size = [round(s * 64 / side) for s in preds.shape[-2:]]
                    preds, target = (
                        torch.nn.functional.interpolate(x, size=size, mode="bilinear", align_corners=False)
                        for x in (preds, target)
                    )
                self.lpips.reset()
                self.lpips.update(preds.clamp(0, 1), target.clamp(0, 1))
                metrics["lpips"] = float(self.lpips.compute())
            if self.fid is not None:
                self.fid.reset()
                self.fid.update(images[1], real=True)
                self.fid.update(images[0], real=False)
                metrics["fid"] = float(self.fid.compute())
        return metrics


_perceptual_cache: dict[tuple[str | None, str | None], PerceptualMetrics] = {}


def perceptual_metrics(
    lpips_weights: str | os.PathLike | None, fid_weights: str | os.PathLike | None
) -> PerceptualMetrics:
    """The `PerceptualMetrics` of these paths, loaded once per process (evaluation calls it every epoch)."""
    key = tuple(
        None if p is None else str(Path(p).expanduser().resolve()) for p in (lpips_weights, fid_weights)
    )
    if key not in _perceptual_cache:
        _perceptual_cache[key] = PerceptualMetrics(lpips_weights, fid_weights)
    return _perceptual_cache[key]


def reconstruction_metrics(
    reconstructed: torch.Tensor,
    reference: torch.Tensor,
    data_range: float = 1.0,
    lpips_weights: str | os.PathLike | None = None,
    fid_weights: str | os.PathLike | None = None,
) -> dict:
    """Mean PSNR (per image, then averaged, as the paper), SSIM and, where the images are large enough for its
    five scales (sides > 160 pixels with the 11-pixel window), MS-SSIM, computed by torchmetrics. LPIPS and FID
    (`PerceptualMetrics`) only where their weights are given as local files: `lpips` with `lpips_weights`, `fid`
    with `fid_weights`; a missing file is refused before anything is computed, and nothing is downloaded."""
    from torchmetrics.functional.image import (
        multiscale_structural_similarity_index_measure,
        peak_signal_noise_ratio,
        structural_similarity_index_measure,
    )

    if reconstructed.shape != reference.shape or reference.ndim != 4:
        raise ValueError(
            "reconstructed and reference must be image batches (batch, channels, height, width) of one shape; got "
            f"{tuple(reconstructed.shape)} and {tuple(reference.shape)}."
        )
    perceptual = None
    if lpips_weights is not None or fid_weights is not None:
        perceptual = perceptual_metrics(lpips_weights, fid_weights)
    preds, target = reconstructed.double(), reference.double()
    side = min(reference.shape[-2:])
    kernel = min(11, side - (1 - side % 2))  # an odd window no larger than the image
    metrics = {
        "psnr": peak_signal_noise_ratio(
            preds, target, data_range=data_range, reduction="elementwise_mean", dim=(1, 2, 3)
        ).item(),
        "ssim": structural_similarity_index_measure(
            preds, target, data_range=data_range, kernel_size=kernel
        ).item(),
    }
    if side > (11 - 1) * 2**4:
        metrics["ms_ssim"] = multiscale_structural_similarity_index_measure(
            preds, target, data_range=data_range
        ).item()
    if perceptual is not None:
        metrics.update(perceptual(reconstructed, reference, data_range=data_range))
    return metrics


__all__ = [
    "LPIPS_BACKBONE_FILES",
    "PatchKMeansTokenizer",
    "PerceptualMetrics",
    "TokenizerMismatchError",
    "VQGANTokenizer",
    "VQTokenizer",
    "check_perceptual_weights",
    "check_tokenizer_fits",
    "is_integer",
    "load_vq_tokenizer",
    "mask_codes",
    "perceptual_metrics",
    "read_tokenizer_settings",
    "reconstruction_metrics",
    "saved_tokenizer_numbers",
    "tokenizer_folder",
]
