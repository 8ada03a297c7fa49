# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Masked image modelling around `HyperSetForMaskedImageModeling`: the image tokenizer, the paper's masking and
the reconstruction metrics.

The model reads a grid of discrete codes; a VQ tokenizer turns pixels into codes and codes back into pixels. Any
object with `codebook_size`, `encode(pixels) -> codes` and `decode(codes) -> pixels` plugs in (`VQTokenizer`). The
paper's tokenizer is MaskGIT's VQGAN (256² images → 16 × 16 codes, codebook 1024), whose weights this package does
not ship and cannot download in tests; `PatchKMeansTokenizer` is a small tokenizer that works offline: a k-means
codebook of image patches, each code decoded to its centroid. It gives the whole loop (tokenize, train, mask,
decode, measure) on real images, but its reconstructions are blocky averages of patches, so its PSNR/SSIM are not
comparable with the paper's VQGAN numbers.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Protocol, runtime_checkable

import torch


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


CONFIG_NAME = "vq_tokenizer_config.json"
WEIGHTS_NAME = "vq_tokenizer.safetensors"


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
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1; got {value!r}.")
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
        if not isinstance(codebook_size, int) or isinstance(codebook_size, bool) or codebook_size < 2:
            raise ValueError(f"codebook_size must be an integer >= 2; got {codebook_size!r}.")
        patches = _patches(images.float(), patch_size)  # raises for sizes that are not multiples of the patch
        flat = patches.flatten(0, 1)
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
        patches = patches.view(len(codes), rows, columns, channels, p, p)
        return patches.permute(0, 3, 1, 4, 2, 5).reshape(len(codes), channels, rows * p, columns * p)

    def save_pretrained(self, folder: str | os.PathLike) -> None:
        from safetensors.torch import save_file

        folder = Path(folder)
        folder.mkdir(parents=True, exist_ok=True)
        save_file({"centroids": self.centroids}, str(folder / WEIGHTS_NAME))
        config = {
            "tokenizer_class": type(self).__name__,
            "patch_size": self.patch_size,
            "image_size": list(self.image_size),
            "num_channels": self.num_channels,
            "codebook_size": self.codebook_size,
        }
        (folder / CONFIG_NAME).write_text(json.dumps(config, indent=2) + "\n")

    @classmethod
    def from_pretrained(cls, folder: str | os.PathLike) -> PatchKMeansTokenizer:
        from safetensors.torch import load_file

        folder = Path(folder)
        for name in (CONFIG_NAME, WEIGHTS_NAME):
            if not (folder / name).is_file():
                raise FileNotFoundError(f"{folder}: missing {name} (write it with save_pretrained).")
        config = json.loads((folder / CONFIG_NAME).read_text())
        if config.get("tokenizer_class") != cls.__name__:
            raise ValueError(
                f"{folder / CONFIG_NAME}: tokenizer_class={config.get('tokenizer_class')!r}; expected {cls.__name__!r}."
            )
        centroids = load_file(str(folder / WEIGHTS_NAME))["centroids"]
        return cls(centroids, config["patch_size"], tuple(config["image_size"]), config["num_channels"])

    def _check_pixels(self, pixel_values: torch.Tensor) -> None:
        expected = (self.num_channels, *self.image_size)
        if pixel_values.ndim != 4 or tuple(pixel_values.shape[1:]) != expected:
            raise ValueError(
                f"pixel_values must have shape (batch, {expected[0]}, {expected[1]}, {expected[2]}); got "
                f"{tuple(pixel_values.shape)}."
            )


def _patches(images: torch.Tensor, patch_size: int) -> torch.Tensor:
    """`(B, C, H, W)` → `(B, N, C·p·p)`, patches row-major over the grid, each in (channel, row, column) order."""
    batch, channels, height, width = images.shape
    if height % patch_size or width % patch_size:
        raise ValueError(f"image sides {height} × {width} must be multiples of patch_size={patch_size}.")
    p = patch_size
    grid = images.reshape(batch, channels, height // p, p, width // p, p).permute(0, 2, 4, 1, 3, 5)
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


def reconstruction_metrics(
    reconstructed: torch.Tensor, reference: torch.Tensor, data_range: float = 1.0
) -> dict:
    """Mean PSNR (per image, then averaged, as the paper), SSIM and, where the images are large enough for its
    five scales (sides > 160 pixels with the 11-pixel window), MS-SSIM, computed by torchmetrics. LPIPS and FID
    need network weights (AlexNet/VGG, Inception) that are not downloaded here: they are not computed."""
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
    return metrics


__all__ = ["PatchKMeansTokenizer", "VQTokenizer", "mask_codes", "reconstruction_metrics"]
