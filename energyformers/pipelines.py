"""transformers pipelines that pass recurrent-depth arguments through to the model at call time.

transformers' classification pipelines call `model(**inputs)` and reject unknown call arguments. These
subclasses accept the depth arguments of the model's `forward` (Hyper-SET: `num_iterations`,
`halting_tolerance`, `halting_criterion`; iMixer: `fixed_point_iterations`, `fixed_point_solver`,
`fixed_point_tolerance`), and the halting threshold and test-time search of Hyper-SET and the looped Transformer
(`halting_threshold`, `search_trajectories`, `search_noise`, `search_seed`, `search_selector`), and forward them to
every model call, so depth and search can be chosen per call without editing the config:

    from transformers import pipeline
    from energyformers.pipelines import ImageClassificationPipeline

    classify = pipeline("image-classification", model="runs/demo-hyperset", pipeline_class=ImageClassificationPipeline)
    classify(image, num_iterations=16, halting_tolerance=1e-3)
    classify(image, search_trajectories=8, search_noise=0.1, search_seed=0, search_selector="energy")

A call of these pipelines runs inside `centers_scope`: on a model with `cached_centers` (HyperBF) inside it, so a
list of inputs computes what the centers give once rather than at every batch (`_CenterCacheMixin`); the outputs are
the same.
"""

from __future__ import annotations

import inspect
import os
from typing import Any

import transformers

from .center_cache import centers_scope
from .tokenizer_fit import MIM_TASK

# Forward arguments a pipeline call may set, when the model's forward takes them.
DEPTH_ARGUMENTS = (
    "num_iterations",
    "halting_tolerance",
    "halting_criterion",
    "fixed_point_iterations",
    "fixed_point_solver",
    "fixed_point_tolerance",
)
# Test-time search and the halting head's threshold (Hyper-SET and the looped Transformer heads).
SEARCH_ARGUMENTS = (
    "halting_threshold",
    "search_trajectories",
    "search_noise",
    "search_seed",
    "search_selector",
)
CALL_ARGUMENTS = (*DEPTH_ARGUMENTS, *SEARCH_ARGUMENTS)


class _DepthArgumentsMixin:
    """Takes `CALL_ARGUMENTS` (depth and search) out of the call's keyword arguments and hands them to the model
    call as keyword arguments of that call (transformers' classification pipelines call `self.model(**model_inputs)`),
    so the model instance is never patched and concurrent calls over one model cannot see each other's."""

    def _sanitize_parameters(self, **kwargs: Any) -> tuple[dict, dict, dict]:
        accepted = inspect.signature(self.model.forward).parameters
        depth = {name: kwargs.pop(name) for name in CALL_ARGUMENTS if name in kwargs}
        unknown = sorted(set(depth) - set(accepted))
        if unknown:
            raise ValueError(
                f"{type(self.model).__name__} takes no {unknown} argument(s); this model's depth and search "
                f"arguments are {[name for name in CALL_ARGUMENTS if name in accepted]}."
            )
        # the values too, by the model's own checks (where it has any): at construction, not at the first forward
        check = getattr(self.model, "check_call_arguments", None)
        if depth and check is not None:
            check(**depth)
        preprocess, forward, postprocess = super()._sanitize_parameters(**kwargs)
        return preprocess, {**forward, **depth}, postprocess

    def _forward(self, model_inputs: dict[str, Any], **forward_params: Any) -> Any:
        depth = {name: forward_params.pop(name) for name in CALL_ARGUMENTS if name in forward_params}
        if not depth:
            return super()._forward(model_inputs, **forward_params)
        outputs = super()._forward({**model_inputs, **depth}, **forward_params)
        # The token-classification pipeline returns its model inputs with the logits; the arguments added here are
        # no inputs to un-batch per item or hand to `postprocess`. Only the objects added are dropped: a model
        # output (returned as it is by the other pipelines) may have a field of the same name.
        if isinstance(outputs, dict) and not isinstance(outputs, transformers.utils.ModelOutput):
            for name, value in depth.items():
                if name in outputs and outputs[name] is value:
                    del outputs[name]
        return outputs


class _CenterCacheMixin:
    """One call runs inside `centers_scope` (HyperBF's `cached_centers()`): the weights cannot change during a call
    over many inputs, so what they give is computed once for all its batches instead of at every forward. A dataset
    or generator is answered with an iterator the caller drains later, between steps of its own that may write the
    weights, so those forwards run outside the block and compute it each time."""

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        with centers_scope(self.model):
            return super().__call__(*args, **kwargs)


class ImageClassificationPipeline(
    _CenterCacheMixin, _DepthArgumentsMixin, transformers.ImageClassificationPipeline
):
    """`image-classification` with the model's depth arguments as call arguments."""


class TextClassificationPipeline(
    _CenterCacheMixin, _DepthArgumentsMixin, transformers.TextClassificationPipeline
):
    """`text-classification` with the model's depth arguments as call arguments."""


class TokenClassificationPipeline(
    _CenterCacheMixin, _DepthArgumentsMixin, transformers.TokenClassificationPipeline
):
    """`token-classification` with the model's depth arguments as call arguments."""


__all__ = [
    "CALL_ARGUMENTS",
    "DEPTH_ARGUMENTS",
    "SEARCH_ARGUMENTS",
    "ImageClassificationPipeline",
    "TextClassificationPipeline",
    "TokenClassificationPipeline",
    "centers_scope",
]


# ------------------------------------------------------------------------------------ masked image modelling


class MaskedImageModelingPipeline(transformers.Pipeline):
    """Masked image modelling inference: image → VQ codes → a fraction masked → MaskGIT decoding → image.

    Registered with transformers as the task "masked-image-modeling" (`energyformers.tokenizer_fit.MIM_TASK`), so
    `transformers.pipeline("masked-image-modeling", model=folder)` builds this class once `energyformers` is
    imported (any further keyword, e.g. `vq_tokenizer=` or `lpips_weights=`, reaches `__init__`).

    `model`: a `HyperSetForMaskedImageModeling`, the path of its folder or its Hub repo id. `vq_tokenizer`: any
    `energyformers.mim.VQTokenizer`; when left out, the one saved with the model (`vq_tokenizer_config.json`,
    written by `PatchKMeansTokenizer.save_pretrained` / `VQGANTokenizer.save_pretrained`) is loaded from the
    model's folder or, for a model from the Hub, its repo (`energyformers.mim.load_vq_tokenizer`, with `revision`,
    `token`, `cache_dir` and `local_files_only`, which also load the model when `model` is a path or repo id).

    Call with an image (PIL image, path, URL or base64 string as transformers' `load_image` reads them, EXIF
    orientation applied; or an array / tensor `(H, W)`, `(H, W, C)` or `(C, H, W)` with C grey, grey+alpha, RGB or
    RGBA: integers in 0-255 read as the PIL image of the same data, alpha dropped; floats as fractions in [0, 1];
    anything else, e.g. floats in 0-255, uint16 or bool, refused) and, as call arguments, `mask_ratio` (default
    0.4, the paper's evaluation), `seed` (default 0: masking and decoding are reproducible), and the decoding
    settings of `HyperSetForMaskedImageModeling.decode`: `steps`, `schedule`, `temperature`,
    `randomize_temperature`, `num_iterations`. Returns a dict: `reconstruction` (PIL image), `pixel_values` (the
    reconstruction, `(C, H, W)` in [0, 1]), `input_pixel_values` (the image as tokenized), `codes` (decoded),
    `input_codes` (with [MASK]), `true_codes`, `masked` (bool), `masked_accuracy` (share of masked positions
    decoded to the true code), `psnr`/`ssim` of the reconstruction against the input and `tokenizer_psnr`, the PSNR
    of decoding the true codes: the tokenizer's own bound. With `lpips_weights` (a local file of the LPIPS backbone, see
    `energyformers.mim.PerceptualMetrics`; checked and loaded when the pipeline is built, never downloaded) also
    `lpips` and `tokenizer_lpips`. FID compares sets of images, so it is not a per-image output: it is reported by
    the training evaluation and the masked-image-modelling benchmark (their `fid_weights`).

        from energyformers.pipelines import MaskedImageModelingPipeline

        reconstruct = MaskedImageModelingPipeline(model="runs/mim")
        out = reconstruct(image, mask_ratio=0.4, steps=8, seed=0)
        out["reconstruction"].save("reconstruction.png"); print(out["psnr"])
    """

    _DECODE_ARGUMENTS = ("steps", "schedule", "temperature", "randomize_temperature", "num_iterations")

    def __init__(
        self,
        model: Any,
        vq_tokenizer: Any | None = None,
        device: Any = -1,
        lpips_weights: str | os.PathLike | None = None,
        *,
        revision: str | None = None,
        token: str | bool | None = None,
        cache_dir: str | os.PathLike | None = None,
        local_files_only: bool = False,
        **kwargs: Any,
    ) -> None:
        from pathlib import Path

        from .mim import (
            TokenizerMismatchError,
            VQTokenizer,
            check_tokenizer_fits,
            load_vq_tokenizer,
            perceptual_metrics,
        )

        # the weights first: a wrong path fails before the model is read
        self.perceptual = None if lpips_weights is None else perceptual_metrics(lpips_weights, None)

        hub = dict(revision=revision, token=token, cache_dir=cache_dir, local_files_only=local_files_only)
        source = model if isinstance(model, (str, Path)) else getattr(model, "name_or_path", None)
        if isinstance(model, (str, Path)):
            model = transformers.AutoModelForMaskedImageModeling.from_pretrained(model, **hub)
        if vq_tokenizer is None:
            if not source:
                raise ValueError(
                    "vq_tokenizer is needed: the model has no name_or_path to find its image tokenizer by; pass "
                    "vq_tokenizer=PatchKMeansTokenizer.from_pretrained(...) or VQGANTokenizer.from_pretrained(...)."
                )
            # a folder, or a Hub repo id as transformers' `pipeline()` leaves in `name_or_path`
            vq_tokenizer = load_vq_tokenizer(source, **hub)
        if not isinstance(vq_tokenizer, VQTokenizer):
            raise TypeError(
                "vq_tokenizer must implement energyformers.mim.VQTokenizer (codebook_size, encode, decode); got "
                f"{type(vq_tokenizer).__name__}."
            )
        if vq_tokenizer.codebook_size != model.codebook_size:
            raise TokenizerMismatchError(
                f"vq_tokenizer has codebook_size={vq_tokenizer.codebook_size}, the model predicts "
                f"{model.codebook_size} codes; they must be equal."
            )
        # the grid too: a tokenizer of another grid gives plausible-looking numbers from misplaced codes
        check_tokenizer_fits(None, getattr(vq_tokenizer, "grid", None), model.config)
        self.vq_tokenizer = vq_tokenizer
        if device == -1 and getattr(model, "hf_device_map", None) is not None:
            # loaded with a `device_map` (`pipeline(..., device_map=...)`): accelerate places it, and transformers
            # refuses any `device` for such a model, so the default is left to transformers' choice
            device = None
        super().__init__(model=model, device=device, **kwargs)
        self.model.eval()

    def save_pretrained(self, save_directory: str | os.PathLike, **kwargs: Any) -> None:
        """The model and its image tokenizer into `save_directory`, so `pipeline("masked-image-modeling",
        model=save_directory)` rebuilds this pipeline where `energyformers` is installed (`kwargs`, e.g.
        `push_to_hub=True`, go to the model's `save_pretrained`). A model read from an exported folder (its config
        has `auto_map`) also writes that folder's remote code, its pipeline files and `custom_pipelines` included, so
        the saved folder runs without the package as the export did. The copy of this class an
        exported folder carries does the same without the package: transformers copies the configuration and
        modeling files, and the config's `save_pretrained` the pipeline files from the folder or Hub repo the model
        was loaded from (a file it cannot find is a warning naming it; the weights are still saved).

        transformers' own `Pipeline.save_pretrained` saves no image tokenizer, and for a registered pipeline it
        copies this class's module as remote code, which imports the package; so neither is done here."""
        save = getattr(self.vq_tokenizer, "save_pretrained", None)
        if save is None:
            raise TypeError(
                f"vq_tokenizer ({type(self.vq_tokenizer).__name__}) has no save_pretrained, so the folder would "
                "have no image tokenizer; use PatchKMeansTokenizer or VQGANTokenizer, or save the model alone."
            )
        if os.path.isfile(save_directory):
            raise ValueError(f"save_directory={str(save_directory)!r} is a file; it must be a folder.")
        os.makedirs(save_directory, exist_ok=True)
        self.model.save_pretrained(save_directory, **kwargs)
        save(save_directory)

    def _sanitize_parameters(
        self, mask_ratio: float | None = None, seed: int | None = None, **kwargs: Any
    ) -> tuple[dict, dict, dict]:
        from .mim import is_integer

        unknown = sorted(set(kwargs) - set(self._DECODE_ARGUMENTS))
        if unknown:
            raise ValueError(
                f"MaskedImageModelingPipeline takes no {unknown} argument(s); it takes mask_ratio, seed and "
                f"{list(self._DECODE_ARGUMENTS)}."
            )
        # a numpy integer (a sweep over `np.arange`) reaches `decode` as the int it stands for; anything else as
        # given, for `decode`'s own checks to word
        preprocess = {}
        forward = {name: int(value) if is_integer(value) else value for name, value in kwargs.items()}
        if mask_ratio is not None:
            if (
                isinstance(mask_ratio, bool)
                or not isinstance(mask_ratio, (int, float))
                or not 0 <= mask_ratio <= 1
            ):
                raise ValueError(f"mask_ratio must be a fraction in [0, 1]; got {mask_ratio!r}.")
            preprocess["mask_ratio"] = float(mask_ratio)
        if seed is not None:
            if not is_integer(seed) or not 0 <= seed < 2**63:
                raise ValueError(f"seed must be an integer in [0, 2**63); got {seed!r}.")
            preprocess["seed"] = forward["seed"] = int(seed)
        return preprocess, forward, {}

    def _image_geometry(self) -> tuple[int, int, int]:
        """(channels, height, width) the tokenizer encodes into the model's grid of codes."""
        import math

        tokenizer = self.vq_tokenizer
        if hasattr(tokenizer, "image_size"):
            height, width = tokenizer.image_size
            return int(tokenizer.num_channels), int(height), int(width)
        side = math.isqrt(self.model.config.max_position_embeddings) * int(tokenizer.downsampling)
        return int(tokenizer.num_channels), side, side

    def _pixels(self, image: Any) -> Any:
        """`image` as a `(C, H, W)` float tensor in [0, 1] of the tokenizer's geometry."""
        from pathlib import Path

        import numpy as np
        import PIL.Image
        import PIL.ImageOps
        import torch
        import torch.nn.functional as F
        from transformers.image_utils import load_image

        channels, height, width = self._image_geometry()
        mode = "L" if channels == 1 else "RGB"
        if isinstance(image, Path) or (isinstance(image, str) and os.path.isfile(image)):
            image = PIL.Image.open(image)
        elif isinstance(image, str):
            image = load_image(image)  # a URL or base64, as transformers' image pipelines read them
        if isinstance(image, PIL.Image.Image):
            # upright, as training's `datasets.Image` and transformers' `load_image` read it; converted from the
            # stored mode, as training converts (`load_image`'s own RGB step would change a YCbCr file's grey)
            image = np.asarray(PIL.ImageOps.exif_transpose(image).convert(mode))
        if isinstance(image, np.ndarray):
            if image.dtype.kind not in "biuf":
                raise ValueError(f"image array has dtype {image.dtype}; it must be uint8, integer or float.")
            # a copy: torch warns on read-only arrays (those of PIL images)
            image = torch.from_numpy(np.array(image))
        if not isinstance(image, torch.Tensor) or image.ndim not in (2, 3) or image.numel() == 0:
            raise ValueError(
                "image must be a PIL image, a path, a URL, or an array/tensor of shape (H, W), (H, W, C) or "
                f"(C, H, W); got {type(image).__name__} {tuple(getattr(image, 'shape', ()))}."
            )
        # (H, W, C) with C grey, grey+alpha, RGB or RGBA; a leading 1 or 3 is read as channels first
        channels_last = image.ndim == 3 and image.shape[0] not in (1, 3) and image.shape[-1] in (1, 2, 3, 4)
        image = image if image.ndim == 3 else image[None]
        image = image.permute(2, 0, 1) if channels_last else image  # → (C, H, W)
        what = f"image of dtype {str(image.dtype).removeprefix('torch.')}"
        if image.dtype in (torch.bool, torch.uint16) or image.dtype.is_complex:
            raise ValueError(
                f"{what} is not read: images are uint8 (0-255) or floats in [0, 1]. Scale it to one of these "
                "first (a 16-bit image: `(x // 257).astype(np.uint8)`; a mask: `x.astype(np.uint8) * 255`)."
            )
        if image.dtype.is_floating_point:
            low, high = image.min().item(), image.max().item()
            if not (0 <= low and high <= 1):  # NaN fails too
                raise ValueError(
                    f"{what} has values in [{low:g}, {high:g}]; float images are read as fractions in [0, 1]. An "
                    "image in 0-255: divide it by 255 or pass it as uint8; a slight overshoot: clip it to [0, 1]."
                )
            pixels = image.float()
            if pixels.shape[0] in (2, 4):  # the alpha channel dropped, as PIL's convert from LA/RGBA does
                pixels = pixels[:-1]
        else:
            if image.dtype != torch.uint8:
                # int64 for the range: torch's min/max skip some unsigned dtypes (a wrapped uint64 is refused too)
                low, high = image.to(torch.int64).min().item(), image.to(torch.int64).max().item()
                if low < 0 or high > 255:
                    raise ValueError(
                        f"{what} has values in [{low}, {high}]; integer images are read as 0-255. Scale it to "
                        "uint8 (a 16-bit image: `x // 257`) or to floats in [0, 1] first."
                    )
            if image.shape[0] not in (1, 2, 3, 4):
                raise ValueError(f"image has {image.shape[0]} channels; the tokenizer takes {channels}.")
            image = image.to(torch.uint8)
            if image.shape[0] in (2, 4) or (image.shape[0] == 3 and channels == 1):
                # as the PIL image of the same data, so alpha and grey convert as they do for an image file
                array = image.permute(1, 2, 0).cpu().numpy()
                array = np.array(PIL.Image.fromarray(np.ascontiguousarray(array)).convert(mode))
                image = torch.from_numpy(array.reshape(*array.shape[:2], -1)).permute(2, 0, 1)
            pixels = image.float() / 255.0
        if pixels.shape[0] != channels:
            if pixels.shape[0] == 1:
                pixels = pixels.expand(channels, -1, -1)
            elif channels == 1 and pixels.shape[0] == 3:  # RGB → luminance (ITU-R 601, as PIL's "L")
                pixels = (pixels * torch.tensor([0.299, 0.587, 0.114])[:, None, None]).sum(0, keepdim=True)
            else:
                raise ValueError(f"image has {pixels.shape[0]} channels; the tokenizer takes {channels}.")
        if tuple(pixels.shape[-2:]) != (height, width):
            pixels = F.interpolate(
                pixels[None], size=(height, width), mode="bilinear", antialias=True, align_corners=False
            )[0]
        return pixels.clamp(0, 1)  # the antialiased resize can overshoot [0, 1] slightly

    def preprocess(self, image: Any, mask_ratio: float = 0.4, seed: int = 0) -> dict[str, Any]:
        import torch

        from .mim import mask_codes

        pixels = self._pixels(image)
        codes = self.vq_tokenizer.encode(pixels[None])
        generator = torch.Generator().manual_seed(seed)
        input_ids, _ = mask_codes(codes.cpu(), self.model.mask_token_id, mask_ratio, generator=generator)
        return {"input_ids": input_ids, "true_codes": codes.cpu(), "pixel_values": pixels[None]}

    def _forward(self, model_inputs: dict[str, Any], seed: int = 0, **decode: Any) -> dict[str, Any]:
        out = self.model.decode(model_inputs["input_ids"], seed=seed, **decode)
        return {**model_inputs, "codes": out.codes, "decoding": out}

    def postprocess(self, model_outputs: dict[str, Any]) -> dict[str, Any]:
        import PIL.Image
        import torch

        from .mim import reconstruction_metrics

        codes = model_outputs["codes"].cpu()
        true_codes, input_ids = model_outputs["true_codes"].cpu(), model_outputs["input_ids"].cpu()
        reference = model_outputs["pixel_values"].cpu().float()
        reconstruction = self.vq_tokenizer.decode(codes).cpu().float()
        metrics = reconstruction_metrics(reconstruction, reference)
        bound_pixels = self.vq_tokenizer.decode(true_codes).cpu().float()
        bound = reconstruction_metrics(bound_pixels, reference)
        if self.perceptual is not None:
            metrics.update(self.perceptual(reconstruction, reference))
            bound.update(self.perceptual(bound_pixels, reference))
        masked = input_ids == self.model.mask_token_id
        hits = (codes == true_codes)[masked]
        # (C, H, W) → (H, W, C) uint8, PIL's layout
        image = (reconstruction[0].clamp(0, 1) * 255).round().to(torch.uint8).permute(1, 2, 0).numpy()
        return {
            "reconstruction": PIL.Image.fromarray(image[..., 0] if image.shape[-1] == 1 else image),
            "pixel_values": reconstruction[0],
            "input_pixel_values": reference[0],
            "codes": codes[0],
            "input_codes": input_ids[0],
            "true_codes": true_codes[0],
            "masked": masked[0],
            "masked_accuracy": hits.float().mean().item() if hits.numel() else float("nan"),
            "psnr": metrics["psnr"],
            "ssim": metrics["ssim"],
            "tokenizer_psnr": bound["psnr"],
            **({"lpips": metrics["lpips"], "tokenizer_lpips": bound["lpips"]} if "lpips" in metrics else {}),
            "decoding": model_outputs["decoding"],
        }


def register_pipelines() -> None:
    """Register `MaskedImageModelingPipeline` with transformers' `PIPELINE_REGISTRY` under
    `MIM_TASK` (once; `energyformers.auto_registration` calls this when transformers' pipelines load)."""
    from transformers.pipelines import PIPELINE_REGISTRY

    if MIM_TASK not in PIPELINE_REGISTRY.get_supported_tasks():
        PIPELINE_REGISTRY.register_pipeline(
            MIM_TASK,
            pipeline_class=MaskedImageModelingPipeline,
            pt_model=transformers.AutoModelForMaskedImageModeling,
            type="image",  # an image goes in (and comes out); the codes are the pipeline's business
        )


register_pipelines()

__all__ += ["MaskedImageModelingPipeline", "register_pipelines"]
