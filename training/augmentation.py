"""The papers' training recipes: batch augmentation on tensors (kornia), soft-target loss, EMA, lr schedule.

Augmentation is training-only: it runs on the collated batch of already-preprocessed `pixel_values`, after the
image processor, so the processor saved with the model (and used by `pipeline`) is never changed.
`BatchAugmentation` un-normalises the batch with the processor's `image_mean`/`image_std`, applies kornia's
batch transforms (pure PyTorch: the same code on CPU and CUDA), normalises again, then mixes images and labels:

    augment = BatchAugmentation(AugmentationArguments(mixup_alpha=0.8), num_labels=10,
                                image_mean=processor.image_mean, image_std=processor.image_std)
    pixel_values, targets = augment(batch["pixel_values"], batch["labels"])
    loss = soft_target_cross_entropy(model(pixel_values).logits, targets)

Order, as in timm's training pipeline: random-resized crop → horizontal flip → RandAugment (on [0, 1] images) →
normalise → random erasing → mixup or cutmix (with label smoothing folded into the soft targets).

The flags (`AugmentationArguments`) and the named recipes live in `training/recipes.py`, which imports no
torch, so `--help` stays quick.
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import TrainerCallback

from .recipes import CUTMIX_SWITCH_PROB, RAND_AUGMENT_MAX_MAGNITUDE, AugmentationArguments

# File the EMA weights are written to inside each Trainer checkpoint folder, so `--resume` restores them.
EMA_WEIGHTS_NAME = "ema_model.safetensors"


# --------------------------------------------------------------------------- batch augmentation


class BatchAugmentation(torch.nn.Module):
    """The recipe's augmentations applied to a whole training batch of normalised `pixel_values`.

    `forward(pixel_values, labels)` → `(pixel_values, targets)`: images keep their shape, dtype and device;
    targets are the integer labels when neither mixing nor label smoothing is on, else (B, num_labels) float32
    probabilities for `soft_target_cross_entropy`. Everything is computed in float32 and drawn from torch's
    global generators, so `torch.manual_seed` makes a batch reproducible. In `eval()` mode, or with every flag
    off, the inputs are returned unchanged (the same tensors).

    kornia's RandAugment draws its N operations once per batch (each image gets its own sign and is then the
    same op at the same magnitude); timm draws them per image. Mixup is written out here because kornia's
    `RandomMixUpV2` draws λ uniformly, not from Beta(α, α); cutmix is kornia's `RandomCutMixV2` with
    Beta(α, α) and the paper's λ = kept area.
    """

    def __init__(
        self,
        args: AugmentationArguments,
        num_labels: int,
        image_mean: Sequence[float],
        image_std: Sequence[float],
    ) -> None:
        super().__init__()
        if not (isinstance(num_labels, int) and not isinstance(num_labels, bool)) or num_labels < 2:
            raise ValueError(f"num_labels={num_labels!r}: expected an integer >= 2 (classes of the head)")
        mean, std = [float(v) for v in image_mean], [float(v) for v in image_std]
        if not mean or len(mean) != len(std):
            raise ValueError(
                f"image_mean={list(image_mean)} and image_std={list(image_std)}: expected one value per channel "
                "in each, of equal length (the processor's)"
            )
        if not all(math.isfinite(s) and s > 0 for s in std) or not all(math.isfinite(m) for m in mean):
            raise ValueError(f"image_std={std}, image_mean={mean}: expected finite values and std > 0")
        import kornia.augmentation as K  # lazy: kornia takes seconds to import, and only training needs it
        from kornia.augmentation.auto import RandAugment
        from kornia.augmentation.auto.rand_augment.rand_augment import default_policy

        self.args = args
        self.num_labels = num_labels
        self.image_mean, self.image_std = tuple(mean), tuple(std)
        self._crop_class = K.RandomResizedCrop
        # One crop module per input size: kornia fixes the output size at construction.
        self._crops: dict[tuple[int, int], torch.nn.Module] = {}
        self.flip = K.RandomHorizontalFlip(p=args.horizontal_flip) if args.horizontal_flip > 0 else None
        self.rand_augment = None
        if args.rand_augment_ops > 0:
            # kornia's "color" (saturation) accepts only RGB; it is a no-op on grey images anyway.
            policy = default_policy if len(mean) == 3 else [p for p in default_policy if p[0][0] != "color"]
            ops = min(args.rand_augment_ops, len(policy))
            # timm's 0-10 magnitude scale → kornia's 0-30 (the same strength: rotate 30° at the top of both).
            magnitude = args.rand_augment_magnitude * 30.0 / RAND_AUGMENT_MAX_MAGNITUDE
            self.rand_augment = RandAugment(n=ops, m=magnitude, policy=policy)
        # Erasing runs on the normalised batch with value 0, i.e. the mean colour (timm's --remode const);
        # kornia's scale/ratio defaults (0.02-0.33 of the area, aspect 0.3-3.3) are timm's.
        self.erasing = K.RandomErasing(p=args.random_erasing, value=0.0) if args.random_erasing > 0 else None
        self.cutmix = None
        if args.cutmix_alpha > 0:
            self.cutmix = K.RandomCutMixV2(
                beta=args.cutmix_alpha, use_correct_lambda=True, data_keys=["input", "class"]
            )

    def extra_repr(self) -> str:
        on = {k: v for k, v in asdict(self.args).items() if v != getattr(AugmentationArguments, k, None)}
        return f"num_labels={self.num_labels}, " + ", ".join(f"{k}={v}" for k, v in on.items())

    def forward(self, pixel_values: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if pixel_values.dim() != 4 or not pixel_values.is_floating_point():
            raise ValueError(
                f"pixel_values: expected a float (B, C, H, W) batch, got {tuple(pixel_values.shape)} "
                f"{pixel_values.dtype}"
            )
        batch, channels = pixel_values.shape[:2]
        if channels != len(self.image_mean):
            raise ValueError(
                f"pixel_values has {channels} channels but image_mean/image_std have {len(self.image_mean)}"
            )
        if labels.shape != (batch,) or labels.is_floating_point() or labels.is_complex():
            raise ValueError(
                f"labels: expected integer class ids of shape ({batch},), got {tuple(labels.shape)} {labels.dtype}"
            )
        if not self.training or not self.args.enabled:
            return pixel_values, labels
        if self.args.soft_targets and (labels.min() < 0 or labels.max() >= self.num_labels):
            raise ValueError(
                f"labels: expected class ids in [0, {self.num_labels}), got values from {int(labels.min())} "
                f"to {int(labels.max())}"
            )
        x = pixel_values.float()
        if self.args.image_ops:
            # (C,) → (1, C, 1, 1): broadcast over the batch and the pixels
            mean = pixel_values.new_tensor(self.image_mean, dtype=torch.float32).view(1, -1, 1, 1)
            std = pixel_values.new_tensor(self.image_std, dtype=torch.float32).view(1, -1, 1, 1)
            x = (x * std + mean).clamp(0.0, 1.0)  # (B, C, H, W) in [0, 1], what kornia's colour ops expect
            if self.args.random_resized_crop_scale is not None:
                x = self._crop(tuple(x.shape[-2:]))(x)
            if self.flip is not None:
                x = self.flip(x)
            if self.rand_augment is not None:
                x = self.rand_augment(x)
            x = (x - mean) / std
        if self.erasing is not None:
            x = self.erasing(x)
        targets = labels
        if self.args.soft_targets:
            x, targets = self._mix(x, labels)
        return x.to(pixel_values.dtype), targets

    def _crop(self, size: tuple[int, int]) -> torch.nn.Module:
        if size not in self._crops:
            scale = (self.args.random_resized_crop_scale, 1.0)
            self._crops[size] = self._crop_class(size, scale=scale)  # aspect 3/4-4/3, bilinear: timm's
        return self._crops[size]

    def _smoothed(self, labels: torch.Tensor) -> torch.Tensor:
        """One-hot (B, num_labels) float32 targets with label smoothing ε spread over all classes (timm's)."""
        off = self.args.label_smoothing / self.num_labels
        one_hot = F.one_hot(labels.long(), self.num_labels).float()
        return one_hot * (1.0 - self.args.label_smoothing) + off

    def _mix(self, x: torch.Tensor, labels: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        targets = self._smoothed(labels)
        args = self.args
        if not args.mixing or float(torch.rand(())) >= args.mix_prob:
            return x, targets
        use_cutmix = args.cutmix_alpha > 0 and (
            args.mixup_alpha == 0 or float(torch.rand(())) < CUTMIX_SWITCH_PROB
        )
        if use_cutmix:
            x, mixed = self.cutmix(x, labels)
            # mixed: (num_mix = 1, B, 3) rows of (own label, partner label, λ = share of the own image kept)
            own, partner, lam = mixed[0, :, 0].long(), mixed[0, :, 1].long(), mixed[0, :, 2:3].float()
            smooth = self._smoothed(torch.cat([own, partner]))
            return x, lam * smooth[: len(own)] + (1.0 - lam) * smooth[len(own) :]
        # mixup, timm's batch mode: one λ ~ Beta(α, α) per batch, each image paired with the batch reversed.
        alpha = torch.tensor(float(args.mixup_alpha))
        lam = float(torch.distributions.Beta(alpha, alpha).sample())
        x = lam * x + (1.0 - lam) * x.flip(0)
        return x, lam * targets + (1.0 - lam) * targets.flip(0)


def soft_target_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of (B, C) logits against (B, C) probabilities or (B,) class ids, in float32."""
    if logits.dim() != 2:
        raise ValueError(f"logits: expected (batch, num_labels), got {tuple(logits.shape)}")
    if targets.is_floating_point():
        if targets.shape != logits.shape:
            raise ValueError(
                f"targets: soft targets must match the logits' shape {tuple(logits.shape)}, got "
                f"{tuple(targets.shape)}"
            )
        return F.cross_entropy(logits.float(), targets.float())  # probability targets (torch >= 1.10)
    if targets.shape != logits.shape[:1]:
        raise ValueError(
            f"targets: class ids must have shape ({logits.shape[0]},), got {tuple(targets.shape)}"
        )
    return F.cross_entropy(logits.float(), targets)


# --------------------------------------------------------------------------- weight EMA


class ExponentialMovingAverage:
    """EMA of a model's parameters (torch's `AveragedModel` with `get_ema_multi_avg_fn`), for any loop.

    `update(model)` after each optimiser step; `averaged_weights(model)` temporarily loads the averages into
    `model` (evaluation); `copy_to(model)` loads them for good (the saved model). Buffers are not averaged
    (iMixer's spectral-norm vectors follow the live weights), as `AveragedModel(use_buffers=False)`.
    """

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay={decay!r}: expected a value in (0, 1), e.g. 0.9998")
        self.decay = float(decay)
        self.averaged = AveragedModel(model, multi_avg_fn=get_ema_multi_avg_fn(self.decay))
        self.averaged.requires_grad_(False)

    @torch.no_grad()
    def update(self, model: torch.nn.Module) -> None:
        """Fold `model`'s current parameters into the average (the first call copies them)."""
        self.averaged.update_parameters(model)

    @torch.no_grad()
    def copy_to(self, model: torch.nn.Module) -> None:
        """Overwrite `model`'s parameters with the averages."""
        for averaged, live in zip(self.averaged.module.parameters(), model.parameters(), strict=True):
            live.copy_(averaged)

    @contextmanager
    def averaged_weights(self, model: torch.nn.Module) -> Iterator[torch.nn.Module]:
        """`with ema.averaged_weights(model): evaluate(model)`: the live weights come back afterwards."""
        with torch.no_grad():
            live = [p.detach().clone() for p in model.parameters()]
        self.copy_to(model)
        try:
            yield model
        finally:
            with torch.no_grad():
                for param, saved in zip(model.parameters(), live, strict=True):
                    param.copy_(saved)

    def state_dict(self) -> dict[str, torch.Tensor]:
        """Averaged parameters by name, plus `n_averaged` (saved in checkpoints, for resuming)."""
        state = {name: p.detach().contiguous() for name, p in self.averaged.module.named_parameters()}
        state["n_averaged"] = self.averaged.n_averaged.detach().clone()
        return state

    @torch.no_grad()
    def load_state_dict(self, state: dict[str, torch.Tensor]) -> None:
        params = dict(self.averaged.module.named_parameters())
        missing = sorted(set(params) - set(state))
        if missing:
            raise ValueError(
                f"EMA state is missing parameters {missing[:5]} (a checkpoint of another model?)"
            )
        for name, param in params.items():
            param.copy_(state[name])
        self.averaged.n_averaged.copy_(state["n_averaged"])


class EMACallback(TrainerCallback):
    """`Trainer` callback keeping a weight EMA: updated after every optimiser step, swapped into the model for
    each evaluation, saved into every checkpoint folder (`EMA_WEIGHTS_NAME`, restored on resume) and, with
    `use_averaged_at_end`, left in the model when training ends so the saved model is the averaged one.

    Checkpoints keep the live weights (the optimizer state belongs to them); the swap relies on Trainer
    calling `on_step_end`/`on_epoch_end` (which set `should_evaluate`) before evaluating, then `on_evaluate`,
    which ends Trainer's own pass. A Trainer whose evaluation has more passes after it, or one an interruption
    may cut short before `on_evaluate`, makes it with `swap_for_evaluation=False` and swaps the averages in
    itself around the whole evaluation (`callback.ema.averaged_weights(model)`), as `energyformers train`'s
    `RecipeTrainer` does.
    """

    def __init__(
        self, decay: float, use_averaged_at_end: bool = True, swap_for_evaluation: bool = True
    ) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay={decay!r}: expected a value in (0, 1), e.g. 0.9998")
        self.decay = float(decay)
        self.use_averaged_at_end = use_averaged_at_end
        self.swap_for_evaluation = swap_for_evaluation
        self.ema: ExponentialMovingAverage | None = None
        self._live: list[torch.Tensor] | None = None  # live weights while the averages are swapped in
        self._saved: Path | None = None  # the folder of the last `save`

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.ema = ExponentialMovingAverage(model, self.decay)
        if state.global_step > 0:  # resuming: Trainer has loaded checkpoint-<step> already
            path = Path(args.output_dir) / f"checkpoint-{state.global_step}" / EMA_WEIGHTS_NAME
            if path.is_file():
                from safetensors.torch import load_file

                self.ema.load_state_dict(load_file(str(path), device=str(next(model.parameters()).device)))

    def on_step_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._swap_out(model)  # never train on the averages, even if an evaluation did not report back

    def on_step_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self.ema.update(model)
        self._swap_in_for_evaluation(control, model)

    def on_epoch_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._swap_in_for_evaluation(control, model)

    def on_evaluate(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._swap_out(model)

    def save(self, folder: Path) -> None:
        """Write the averages into the checkpoint `folder` (`EMA_WEIGHTS_NAME`, through a temporary file). A
        Trainer that calls it before its `_save_checkpoint` writes `trainer_state.json` (`RecipeTrainer`) makes
        the file part of every complete checkpoint; `on_save` then finds it written and skips it."""
        from safetensors.torch import save_file

        tmp = folder / (EMA_WEIGHTS_NAME + ".tmp")
        save_file({k: v.cpu() for k, v in self.ema.state_dict().items()}, str(tmp))
        os.replace(tmp, folder / EMA_WEIGHTS_NAME)
        self._saved = folder

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # with a plain Trainer this runs after the checkpoint's trainer_state.json is written: a process killed
        # in between leaves a checkpoint without the file, which `energyformers train --resume` skips
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            if self._saved != folder:  # a checkpoint folder is a step's: the averages written are this step's
                self.save(folder)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._swap_out(model)
        if self.use_averaged_at_end and self.ema is not None:
            self.ema.copy_to(model)

    def _swap_in_for_evaluation(self, control: Any, model: torch.nn.Module) -> None:
        if (
            self.swap_for_evaluation
            and control.should_evaluate
            and self._live is None
            and self.ema is not None
        ):
            with torch.no_grad():
                self._live = [p.detach().clone() for p in model.parameters()]
            self.ema.copy_to(model)

    @torch.no_grad()
    def _swap_out(self, model: torch.nn.Module) -> None:
        if self._live is not None:
            for param, saved in zip(model.parameters(), self._live, strict=True):
                param.copy_(saved)
            self._live = None


# --------------------------------------------------------------------------- lr schedule


def recipe_lr_schedule(
    optimizer: torch.optim.Optimizer,
    num_training_steps: int,
    warmup_steps: int,
    cooldown_steps: int,
    base_lr: float,
    min_lr: float,
    warmup_lr: float,
) -> LambdaLR:
    """timm-style schedule as a `LambdaLR`: linear warm-up from `warmup_lr` to `base_lr` over `warmup_steps`,
    cosine from `base_lr` down to the floor `min_lr` until `num_training_steps - cooldown_steps`, then held at
    `min_lr` for the `cooldown_steps` (timm's `--cooldown-epochs`).

    The factor is relative to `base_lr`, so a parameter group whose lr is `base_lr` follows these values
    exactly (others scale with it). Step k's lr is the value after k `scheduler.step()` calls. timm starts its
    cosine at step 0 underneath the warm-up; here it starts when the warm-up ends, so the lr is continuous.
    """
    for name, value in (
        ("num_training_steps", num_training_steps),
        ("warmup_steps", warmup_steps),
        ("cooldown_steps", cooldown_steps),
    ):
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"{name}={value!r}: expected an integer >= 0")
    if num_training_steps < 1 or warmup_steps + cooldown_steps > num_training_steps:
        raise ValueError(
            f"num_training_steps={num_training_steps}, warmup_steps={warmup_steps}, cooldown_steps="
            f"{cooldown_steps}: expected num_training_steps >= 1 and warm-up + cooldown <= num_training_steps"
        )
    for name, value in (("base_lr", base_lr), ("min_lr", min_lr), ("warmup_lr", warmup_lr)):
        if (
            isinstance(value, bool)
            or not isinstance(value, (int, float))
            or not math.isfinite(value)
            or value < 0
        ):
            raise ValueError(f"{name}={value!r}: expected a finite learning rate >= 0")
    if base_lr <= 0 or min_lr > base_lr or warmup_lr > base_lr:
        raise ValueError(
            f"base_lr={base_lr}, min_lr={min_lr}, warmup_lr={warmup_lr}: expected base_lr > 0 and "
            "min_lr, warmup_lr <= base_lr"
        )
    decay_end = num_training_steps - cooldown_steps
    decay_steps = decay_end - warmup_steps

    def lr_at(step: int) -> float:
        if step < warmup_steps:
            return warmup_lr + (base_lr - warmup_lr) * step / warmup_steps
        if step >= decay_end or decay_steps == 0:
            return min_lr
        progress = (step - warmup_steps) / decay_steps
        return min_lr + 0.5 * (base_lr - min_lr) * (1.0 + math.cos(math.pi * progress))

    return LambdaLR(optimizer, lambda step: lr_at(step) / base_lr)


__all__ = [
    "EMA_WEIGHTS_NAME",
    "BatchAugmentation",
    "EMACallback",
    "ExponentialMovingAverage",
    "recipe_lr_schedule",
    "soft_target_cross_entropy",
]
