"""What every official source shares: the errors, the constants, `OfficialSource` and the tensor helpers of the
re-implemented official computations."""

from __future__ import annotations

import re
from typing import Any

import PIL.Image
import torch
import torch.nn.functional as F
from transformers import PreTrainedConfig, PreTrainedModel, PreTrainedTokenizerBase, ViTImageProcessorPil

from ..cli import UsageError

EXTRAS_FILE = "official_extras.safetensors"
KEPT_KWARGS = "official_training_kwargs"  # config.json entry: `OfficialSource.training_only` values
REFERENCE_PREFIX = "golden/"
DTYPES = {"float32": torch.float32, "float64": torch.float64}
DEFAULT_ATOL = {torch.float64: 1e-10, torch.float32: 1e-5}
REQUIRED = object()  # marks an official constructor argument without a known default
# What `OfficialSource.processor` saves with a converted folder: an image processor for image inputs, the cell
# tokenizer for token ids.
ProcessorLike = ViTImageProcessorPil | PreTrainedTokenizerBase


class ConversionError(UsageError):
    """A checkpoint, official config or model folder that cannot be converted; nothing was written (a usage
    error of `energyformers convert`: exit status 2)."""


class NotExpressible(ConversionError):
    """The official structure needs an option our model does not have (yet)."""


def cholesky_or_refuse(matrix: torch.Tensor, what: str) -> torch.Tensor:
    """The lower Cholesky factor of `matrix`; `NotExpressible` naming `what` when it is not positive definite."""
    lower, info = torch.linalg.cholesky_ex(matrix)
    if int(info) != 0:
        raise NotExpressible(
            f"{what}: its symmetric part is not positive definite, so the official kernel is no Gaussian of a "
            "(semi-)metric and has no exact form in our model"
        )
    return lower


def rms_norm_eps(x: torch.Tensor, weight: torch.Tensor | None) -> torch.Tensor:
    """torch.nn.RMSNorm(eps=None): eps = machine epsilon of the dtype, as in the authors' code."""
    return F.rms_norm(x, (x.shape[-1],), weight, eps=None)


def layer_norm_of(x: torch.Tensor, p: dict[str, torch.Tensor], name: str, eps: float) -> torch.Tensor:
    """LayerNorm of `x` with the official parameters `<name>.weight` / `<name>.bias` of `p`."""
    return F.layer_norm(x, (x.shape[-1],), p[f"{name}.weight"], p[f"{name}.bias"], eps=eps)


def linear_of(x: torch.Tensor, p: dict[str, torch.Tensor], name: str) -> torch.Tensor:
    """The official linear layer `name` of `p` applied to `x` (its bias where it has one)."""
    return F.linear(x, p[f"{name}.weight"], p.get(f"{name}.bias"))


def make_image_processor(
    height: int, width: int, channels: int, mean: list[float], std: list[float]
) -> ViTImageProcessorPil:
    """The image processor saved with a converted folder: resize to height × width, the official mean/std."""
    return ViTImageProcessorPil(
        size={"height": height, "width": width},
        resample=PIL.Image.Resampling.BILINEAR,
        image_mean=mean,
        image_std=std,
        do_convert_rgb=channels == 3,
    )


def square_image_side(config: PreTrainedConfig, family: str) -> int:
    """The side of the model's square images; `NotExpressible` for others (the official models take squares)."""
    size = config.image_size
    sides = (size, size) if isinstance(size, int) else tuple(size)
    if sides[0] != sides[1]:
        raise NotExpressible(f"the official {family} takes square images; this model has image_size={size}")
    return int(sides[0])


class OfficialSource:
    """One official model class: its kwargs, its state_dict layout, the maps both ways, its computation."""

    name: str = ""
    official_class: str = ""
    repository: str = ""
    head_class: type[PreTrainedModel] | None = None
    input_kind = "image"  # "image", "ids" (token ids) or "codes" (VQ codes of an image)
    reference_input: str | None = None  # the fixture key of the reference input (default: by `input_kind`)
    spec: dict[str, Any] = {}  # constructor argument -> default (REQUIRED: no known default)
    ignored: dict[str, str] = {}  # accepted arguments the official constructor ignores -> why
    # Official arguments with no counterpart in our config (training-only or init-only): their values are kept in
    # config.json under `official_training_kwargs`, so the reverse conversion gives back the official config.
    training_only: tuple[str, ...] = ()
    # Official keys (`*` for a layer index) that the canonical reverse recomputes from our weights as one
    # function-equivalent choice among many, not the tensor that was converted (HyperBF's folded metrics). Copies,
    # reshapes and slices of our tensors, constant buffers and buffers that the official forward itself sets from
    # the weights (iMixer's `weight_sigma`) are not listed: they come back bit for bit.
    recomputed_back: tuple[str, ...] = ()

    # --- official config ---
    def normalise_kwargs(self, raw: dict[str, Any], where: str = "official config") -> dict[str, Any]:
        """Every `spec` argument, from `raw` or its default, then `check_kwargs`; `ConversionError` for an unknown
        or missing one."""
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
        """`ConversionError` unless `state` has exactly `layout(kwargs)`'s keys and shapes, in floating point."""
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
        """Our config for the official `kwargs`; `NotExpressible` for a structure our model lacks."""
        raise NotImplementedError

    def kwargs_from_config(self, config: PreTrainedConfig) -> dict[str, Any]:
        """The official constructor kwargs of `config`: the reverse of `config()`."""
        raise NotImplementedError

    def structure_notes(self, kwargs: dict[str, Any]) -> list[str]:
        """Lines for the conversion record on how the official structure maps onto our config."""
        return []

    # --- weights (float64 in, float64 out) ---
    def derive(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Our tensors that are not plain copies of one official tensor."""
        return {}

    def derive_back(self, ours: dict[str, torch.Tensor], config: PreTrainedConfig) -> dict[str, torch.Tensor]:
        """Official tensors that are not plain copies of one of ours (the canonical reverse)."""
        return {}

    def to_ours(self, state: dict[str, torch.Tensor], kwargs: dict[str, Any]) -> dict[str, torch.Tensor]:
        """Our state_dict from the official `state`: `layout`'s plain copies plus `derive`'s tensors."""
        ours = {our: state[key] for key, (_, our) in self.layout(kwargs).items() if our is not None}
        ours.update(self.derive(state, kwargs))
        return ours

    def recomputed_keys(self, keys: list[str]) -> list[str]:
        """The patterns of `recomputed_back` that `keys` (official keys) hold, in that order."""
        present = {re.sub(r"\.\d+\.", ".*.", key) for key in keys}
        return [pattern for pattern in self.recomputed_back if pattern in present]

    def to_official(
        self, ours: dict[str, torch.Tensor], config: PreTrainedConfig
    ) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
        """The canonical official state_dict (`layout`'s keys, in order) and constructor kwargs for our `ours` and
        `config`, with the kept training-only kwargs."""
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
        """The official model's logits on `inputs`: its forward re-implemented on `state` in `dtype`."""
        raise NotImplementedError

    def example_inputs(self, kwargs: dict[str, Any]) -> torch.Tensor:
        """A seeded input of the official model's kind and size, for checks without the authors' reference input."""
        generator = torch.Generator().manual_seed(0)
        size = kwargs["img_size"]
        return torch.randn(2, kwargs.get("in_chans", 3), size, size, generator=generator)

    def model_logits(self, model: PreTrainedModel, inputs: torch.Tensor) -> torch.Tensor:
        """Our `model`'s logits on `inputs` (those `official_logits` takes), without gradients."""
        dtype = next(model.parameters()).dtype
        with torch.no_grad():
            return model(inputs.to(dtype)).logits

    def processor(
        self, config: PreTrainedConfig, mean: list[float], std: list[float]
    ) -> ProcessorLike | None:
        """The image processor or tokenizer saved with the converted folder; None: none is saved."""
        return None

    def processor_note(self, kwargs: dict[str, Any]) -> str:
        """What the card says about the folder's processor or tokenizer."""
        return "Tokenizer: one token per cell, digits 0-9 (0 = blank)."

    def reference_input_key(self) -> str:
        """The fixture key of the reference input: `reference_input`, else the default for `input_kind`."""
        if self.reference_input is not None:
            return self.reference_input
        return "golden/input/images" if self.input_kind == "image" else "golden/input/idx"
