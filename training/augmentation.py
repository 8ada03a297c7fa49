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

Named recipes (`RECIPES`, `--recipe NAME`) map flag names to values. `split_recipe(name)` separates the
augmentation flags (the fields of `AugmentationArguments`) from the keys the training loop sets itself:

| key | meaning |
|---|---|
| `learning_rate` | peak learning rate, reached at the end of warm-up |
| `lr_scheduler_type` | shape of the decay after warm-up (`cosine`: `recipe_lr_schedule`) |
| `weight_decay` | AdamW decoupled weight decay |
| `adam_beta1`, `adam_beta2` | AdamW β1, β2 |
| `warmup_epochs` | epochs of linear warm-up (converted to steps by the loop) |
| `warmup_learning_rate` | learning rate warm-up starts from (a floor, not 0) |
| `min_learning_rate` | floor the cosine decays to |
| `cooldown_epochs` | epochs held at `min_learning_rate` after the cosine (added to `num_train_epochs`, as timm) |
| `max_grad_norm` | gradient clipping by global norm |
| `drop_path_rate` | stochastic depth probability (a model-config field; only iMixer has it today) |
| `ema_decay` | per-step decay of the weight EMA used for evaluation and the saved model (`EMACallback`) |
| `num_train_epochs` | epochs of the decay schedule |
| `per_device_train_batch_size` | batch size per device (the papers quote the global batch; see each recipe) |

Two kinds of recipe live in `RECIPES`:

* the papers' own (`hyperset-ic`, `hyperset-sudoku`, `imixer-cifar`, `hyperbf-memo`): the shared specs give only
  a few of the papers' training values (each written next to its recipe with the section it comes from); the
  papers' augmentation tables are not available offline, so every other key is left out and the loop's default
  applies. None of them switches an augmentation on.
* `deit`: NOT any of the three papers' values, but the documented standard recipe for training a ViT-like model
  from scratch — DeiT (Touvron et al., ICML 2021, Table 9, and the defaults of its public `main.py`), which timm's
  `train.py` (the base of the iMixer authors' code) implements. Each value names its source; what DeiT does and
  our flags cannot express is listed next to it as not reproduced.

A recipe value a model cannot take (today: `drop_path_rate`, a config field of iMixer only) is skipped for that
model with one warning line, and the run's metrics.json records only what was applied
(`drop_unapplied_recipe_values`).
"""

from __future__ import annotations

import math
import os
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch.optim.lr_scheduler import LambdaLR
from torch.optim.swa_utils import AveragedModel, get_ema_multi_avg_fn
from transformers import TrainerCallback

# kornia's RandAugment has 15 candidate operations (its `default_policy`); N cannot exceed it (drawn without
# replacement). Magnitudes are on timm's / the RandAugment paper's 0-10 scale ("rand-m9"); kornia's is 0-30.
RAND_AUGMENT_NUM_OPS = 15
RAND_AUGMENT_MAX_MAGNITUDE = 10.0
# With both mixup and cutmix on, each mixed batch uses cutmix with this probability (timm's `switch_prob`).
CUTMIX_SWITCH_PROB = 0.5
# File the EMA weights are written to inside each Trainer checkpoint folder, so `--resume` restores them.
EMA_WEIGHTS_NAME = "ema_model.safetensors"


# --------------------------------------------------------------------------- flags


@dataclass
class AugmentationArguments:
    """Training-batch augmentation flags (`HfArgumentParser`). The defaults switch every augmentation off."""

    rand_augment_ops: int = field(
        default=0,
        metadata={"help": f"RandAugment: operations per batch N, 0..{RAND_AUGMENT_NUM_OPS} (0 = off)"},
    )
    rand_augment_magnitude: float = field(
        default=9.0,
        metadata={
            "help": "RandAugment: magnitude M on the 0-10 scale of timm's rand-mM, 0 < M < 10 "
            "(default 9, the RandAugment paper's ImageNet ResNet-50 value)"
        },
    )
    mixup_alpha: float = field(
        default=0.0, metadata={"help": "mixup: λ ~ Beta(α, α) per batch, α >= 0 (0 = off)"}
    )
    cutmix_alpha: float = field(
        default=0.0, metadata={"help": "cutmix: λ ~ Beta(α, α) per image, α >= 0 (0 = off)"}
    )
    mix_prob: float = field(
        default=1.0,
        metadata={
            "help": "probability a batch is mixed when mixup or cutmix is on, in [0, 1] (with both on, "
            f"cutmix is picked with probability {CUTMIX_SWITCH_PROB})"
        },
    )
    random_erasing: float = field(
        default=0.0,
        metadata={"help": "probability each image gets one erased rectangle, in [0, 1] (0 = off)"},
    )
    random_resized_crop_scale: float | None = field(
        default=None,
        metadata={
            "help": "random-resized crop: smallest crop area as a fraction of the image, in (0, 1]; the crop "
            "is resized back to the input size (unset = off)"
        },
    )
    horizontal_flip: float = field(
        default=0.0, metadata={"help": "probability of a horizontal flip per image, in [0, 1] (0 = off)"}
    )
    label_smoothing: float = field(
        default=0.0,
        metadata={"help": "label smoothing ε of the soft targets, in [0, 1) (0 = off)"},
    )

    def __post_init__(self) -> None:
        ops = self.rand_augment_ops
        if not (isinstance(ops, int) and not isinstance(ops, bool)) or not 0 <= ops <= RAND_AUGMENT_NUM_OPS:
            raise ValueError(
                f"--rand_augment_ops {ops!r}: expected an integer in [0, {RAND_AUGMENT_NUM_OPS}] "
                "(0 = off; kornia's RandAugment draws distinct operations from 15)"
            )
        magnitude = _real("rand_augment_magnitude", self.rand_augment_magnitude)
        if not 0.0 < magnitude < RAND_AUGMENT_MAX_MAGNITUDE:
            raise ValueError(
                f"--rand_augment_magnitude {magnitude!r}: expected 0 < M < {RAND_AUGMENT_MAX_MAGNITUDE:g} "
                "(timm's rand-mM scale)"
            )
        for name in ("mixup_alpha", "cutmix_alpha"):
            if _real(name, getattr(self, name)) < 0.0:
                raise ValueError(f"--{name} {getattr(self, name)!r}: expected a value >= 0 (0 = off)")
        for name in ("mix_prob", "random_erasing", "horizontal_flip"):
            if not 0.0 <= _real(name, getattr(self, name)) <= 1.0:
                raise ValueError(f"--{name} {getattr(self, name)!r}: expected a probability in [0, 1]")
        if not 0.0 <= _real("label_smoothing", self.label_smoothing) < 1.0:
            raise ValueError(f"--label_smoothing {self.label_smoothing!r}: expected a value in [0, 1)")
        scale = self.random_resized_crop_scale
        if scale is not None and not 0.0 < _real("random_resized_crop_scale", scale) <= 1.0:
            raise ValueError(
                f"--random_resized_crop_scale {scale!r}: expected the smallest crop area fraction in (0, 1], "
                "or unset for no crop"
            )

    @property
    def mixing(self) -> bool:
        """Whether mixup or cutmix can mix a batch."""
        return (self.mixup_alpha > 0.0 or self.cutmix_alpha > 0.0) and self.mix_prob > 0.0

    @property
    def soft_targets(self) -> bool:
        """Whether `BatchAugmentation` returns (B, num_labels) probabilities instead of the integer labels."""
        return self.mixing or self.label_smoothing > 0.0

    @property
    def enabled(self) -> bool:
        """Whether any augmentation is on (off: `BatchAugmentation` returns its inputs unchanged)."""
        return self.soft_targets or self.image_ops or self.random_erasing > 0.0

    @property
    def image_ops(self) -> bool:
        """Whether a transform that needs [0, 1] images (crop, flip, RandAugment) is on."""
        return (
            self.random_resized_crop_scale is not None
            or self.horizontal_flip > 0.0
            or self.rand_augment_ops > 0
        )


def _real(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ValueError(f"--{name} {value!r}: expected a finite number")
    return float(value)


# --------------------------------------------------------------------------- recipes

# Keys a recipe may set besides the `AugmentationArguments` fields (meanings: the module docstring's table).
TRAINING_KEYS: tuple[str, ...] = (
    "learning_rate",
    "lr_scheduler_type",
    "weight_decay",
    "adam_beta1",
    "adam_beta2",
    "warmup_epochs",
    "warmup_learning_rate",
    "min_learning_rate",
    "cooldown_epochs",
    "max_grad_norm",
    "drop_path_rate",
    "ema_decay",
    "num_train_epochs",
    "per_device_train_batch_size",
)

# The papers' recipes: values from the shared specs only, each with its source. The specs carry no augmentation,
# optimiser or schedule table for the image-classification experiments of the three papers; every value they do
# not give is left out (listed under "not in the specs"), so the training loop's default applies to it.
# `deit` (last): DeiT's published from-scratch recipe, not a value of any of the three papers.
RECIPES: dict[str, dict[str, Any]] = {
    # Hyper-SET image classification (paper Table 1: CIFAR-10 Small / Scale-up at 224², patch 16; model presets
    # `cifar10-small`, `cifar10-small-scaleup`). Not in the specs: every training value — augmentation,
    # optimiser, lr, schedule, epochs, batch size, drop path, EMA of the paper's image experiments.
    "hyperset-ic": {},
    # Hyper-SET Sudoku (paper Table 4 model; model preset `sudoku`): the GPU recipe of
    # specs/recurrent-depth.md, "Measured targets" (Sudoku bullet). No augmentation: the inputs are grids.
    # Not in the specs: warm-up, lr floor, EMA.
    "hyperset-sudoku": {
        "adam_beta1": 0.0,  # recurrent-depth.md: "AdamW β=(0, 0.95)"
        "adam_beta2": 0.95,  # recurrent-depth.md: "AdamW β=(0, 0.95)"
        "weight_decay": 0.1,  # recurrent-depth.md: "wd 0.1"
        "learning_rate": 1e-4,  # recurrent-depth.md: "lr 1e-4 cosine"
        "lr_scheduler_type": "cosine",  # recurrent-depth.md: "lr 1e-4 cosine"
        "max_grad_norm": 1.0,  # recurrent-depth.md: "clip 1.0"
        "per_device_train_batch_size": 16,  # recurrent-depth.md: "bs 16" (one GPU)
        "num_train_epochs": 200,  # recurrent-depth.md: "200 epochs"
    },
    # iMixer on CIFAR-10 (model presets `s16`/`b16`/`l16`, 224², h_r = 2, n = 2). Trained with the authors'
    # fork of timm's train.py. Not in the specs: augmentation (RandAugment, mixup/cutmix, erasing, smoothing),
    # optimiser, lr, warm-up/floor/cooldown, batch size, drop path, EMA.
    "imixer-cifar": {
        "num_train_epochs": 300,  # imixer.md, "Paper results (CIFAR-10, 300 epochs, 4 GPUs)"
    },
    # HyperBF on CIFAR-10/100, Tiny-ImageNet (model presets `cifar`, `cifar100`: 4 heads, 4 blocks).
    # Not in the specs: augmentation, optimiser, lr, schedule, batch size, drop path, EMA.
    "hyperbf-memo": {
        "num_train_epochs": 100,  # hyperbf.md, "Paper results ... (100 epochs, 4 heads, 4 blocks)"
    },
    # DeiT's from-scratch ViT recipe — NOT a value of the three papers (theirs are not available offline): the
    # standard recipe of Touvron et al., "Training data-efficient image transformers & distillation through
    # attention" (ICML 2021), Table 9 ("DeiT-B" column) and the defaults of its public main.py, as timm's
    # train.py implements it. Sources: "DeiT T9" = the paper's Table 9, "DeiT main.py" = a main.py default.
    # Not reproduced (no flag for it here):
    # * repeated augmentation (main.py --repeated-aug, 3 repeats per image per epoch): plain shuffled epochs;
    # * RandAugment "rand-m9-mstd0.5-inc1": the magnitude noise (mstd0.5: M ~ N(9, 0.5) per op) and timm's
    #   "increasing" op variants (inc1) are not reproduced; kornia draws its N ops once per batch (timm: per
    #   image), from kornia's 15-op policy (timm's list differs slightly); on grey images the saturation op is
    #   dropped (`BatchAugmentation`);
    # * random erasing in timm's "pixel" mode (per-pixel normal noise, main.py --remode pixel): here the erased
    #   rectangle is the mean colour (value 0 after normalisation, timm's "const" mode);
    # * bicubic interpolation of the random-resized crop (main.py --train-interpolation bicubic): bilinear;
    # * the per-epoch lr steps of timm's scheduler (DeiT steps it once per epoch, and its cosine starts at epoch
    #   0 under the warm-up): here the lr moves every step and the cosine starts after the warm-up
    #   (`recipe_lr_schedule`);
    # * the weight EMA (main.py --model-ema, decay 0.99996): DeiT keeps it beside the model but evaluates and
    #   reports the live model; our --ema_decay evaluates and saves the average instead, and at 0.99996
    #   (1 / (1 - d) = 25 000 steps of memory) a short run's average is still mostly the initial weights —
    #   so the recipe leaves it off (add --ema_decay 0.99996 for an average of a long run);
    # * timm's batch-mode cutmix (--mixup-mode batch: one box for the whole batch): kornia cuts one box per
    #   image (mixup is batch-mode, as timm's);
    # * distillation (the "⚗" DeiT models): needs a teacher; this is the recipe without one.
    # Stochastic depth (drop_path_rate) exists only on iMixer configs: other models skip it with a warning.
    "deit": {
        "learning_rate": 6.25e-5,  # DeiT T9: "0.0005 × batchsize/512"; main.py scales --lr 5e-4 by the global
        # batch: 5e-4 × 64 / 512 on one device with the per-device batch below (DeiT: 64 × 16 GPUs = 1024 →
        # 1e-3). Our loops do not rescale the lr with the device count: on N devices pass --lr 6.25e-5 × N.
        "per_device_train_batch_size": 64,  # DeiT main.py --batch-size 64 (per GPU; T9: batch size 1024)
        "lr_scheduler_type": "cosine",  # DeiT T9: "Learning rate decay: cosine"; main.py --sched cosine
        "weight_decay": 0.05,  # DeiT T9: "Weight decay 0.05"; main.py --weight-decay 0.05 (AdamW)
        "adam_beta1": 0.9,  # DeiT main.py --opt adamw with --opt-betas unset: torch's default (0.9, 0.999)
        "adam_beta2": 0.999,  # DeiT main.py --opt adamw with --opt-betas unset: torch's default (0.9, 0.999)
        "max_grad_norm": 0.0,  # DeiT main.py --clip-grad None: no gradient clipping (T9: "Gradient Clip. ✗")
        "warmup_epochs": 5,  # DeiT T9: "Warmup epochs 5"; main.py --warmup-epochs 5
        "warmup_learning_rate": 1e-6,  # DeiT main.py --warmup-lr 1e-6 (not scaled with the batch)
        "min_learning_rate": 1e-5,  # DeiT main.py --min-lr 1e-5 (not scaled with the batch)
        "cooldown_epochs": 10,  # DeiT main.py --cooldown-epochs 10: as timm's train.py, 10 epochs at the
        # min lr after the cosine (310 in all). DeiT's main.py loop itself stops at --epochs (it discards the
        # epoch count create_scheduler returns), so pass --cooldown_epochs 0 to match its published runs.
        "num_train_epochs": 300,  # DeiT T9: "Epochs 300"; main.py --epochs 300
        "label_smoothing": 0.1,  # DeiT T9: "Label smoothing ε 0.1"; main.py --smoothing 0.1
        "drop_path_rate": 0.1,  # DeiT T9: "Stoch. Depth 0.1"; main.py --drop-path 0.1
        "rand_augment_ops": 2,  # DeiT T9: "Rand Augment 9/0.5"; main.py --aa rand-m9-mstd0.5-inc1 (n = 2 ops)
        "rand_augment_magnitude": 9.0,  # DeiT main.py --aa rand-m9-mstd0.5-inc1 (m = 9; mstd0.5 not reproduced)
        "mixup_alpha": 0.8,  # DeiT T9: "Mixup prob. 0.8" (an α); main.py --mixup 0.8: λ ~ Beta(0.8, 0.8)
        "cutmix_alpha": 1.0,  # DeiT T9: "Cutmix prob. 1.0" (an α); main.py --cutmix 1.0 (switch prob 0.5, ours)
        "mix_prob": 1.0,  # DeiT main.py --mixup-prob 1.0 (every batch mixed), --mixup-switch-prob 0.5
        "random_erasing": 0.25,  # DeiT T9: "Erasing prob. 0.25"; main.py --reprob 0.25 (one rectangle)
        "random_resized_crop_scale": 0.08,  # DeiT main.py: timm's create_transform, scale (0.08, 1)
        "horizontal_flip": 0.5,  # DeiT main.py: timm's create_transform, hflip 0.5
    },
}


def split_recipe(name: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """(augmentation kwargs for `AugmentationArguments`, training-loop kwargs keyed by `TRAINING_KEYS`)."""
    if name not in RECIPES:
        raise ValueError(f"--recipe {name!r}: unknown recipe; expected one of {sorted(RECIPES)}")
    augmentation_fields = {f.name for f in fields(AugmentationArguments)}
    augmentation, training = {}, {}
    for key, value in RECIPES[name].items():
        if key in augmentation_fields:
            augmentation[key] = value
        elif key in TRAINING_KEYS:
            training[key] = value
        else:
            raise ValueError(
                f"recipe {name!r} sets {key!r}, which is neither an augmentation flag "
                f"({sorted(augmentation_fields)}) nor a training key ({list(TRAINING_KEYS)})"
            )
    AugmentationArguments(**augmentation)  # validates the recipe's augmentation values
    return augmentation, training


# Recipe keys that are model-config fields: a model whose config lacks one cannot take the recipe's value.
MODEL_CONFIG_KEYS: tuple[str, ...] = ("drop_path_rate",)


def drop_unapplied_recipe_values(args: Any, config: Any) -> list[str]:
    """The recipe's config-field values `config` has no field for (e.g. `drop_path_rate` on Hyper-SET), as one
    warning line each; they are reset in `args` (a `training.arguments.Arguments`), so metrics.json records what
    was applied. Setup has already left them out of the config; an explicit flag never reaches here (setup
    refuses it for such a model).
    """
    recipe = args.run.recipe
    if recipe is None:
        return []
    import inspect

    takes = inspect.signature(type(config).__init__).parameters
    notes = []
    for key in MODEL_CONFIG_KEYS:
        value = RECIPES[recipe].get(key)
        if value is None or key in args.explicit or key in takes:
            continue
        setattr(args.model, key, None)
        notes.append(
            f"--recipe {recipe}: {key}={value} not applied: {config.model_type} has no {key} config field "
            "(the rest of the recipe is)"
        )
    return notes


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
    calling `on_step_end`/`on_epoch_end` (which set `should_evaluate`) before evaluating, then `on_evaluate`.
    """

    def __init__(self, decay: float, use_averaged_at_end: bool = True) -> None:
        if isinstance(decay, bool) or not isinstance(decay, (int, float)) or not 0.0 < decay < 1.0:
            raise ValueError(f"ema_decay={decay!r}: expected a value in (0, 1), e.g. 0.9998")
        self.decay = float(decay)
        self.use_averaged_at_end = use_averaged_at_end
        self.ema: ExponentialMovingAverage | None = None
        self._live: list[torch.Tensor] | None = None  # live weights while the averages are swapped in

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

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        if state.is_world_process_zero and folder.is_dir():
            from safetensors.torch import save_file

            tmp = folder / (EMA_WEIGHTS_NAME + ".tmp")
            save_file({k: v.cpu() for k, v in self.ema.state_dict().items()}, str(tmp))
            os.replace(tmp, folder / EMA_WEIGHTS_NAME)

    def on_train_end(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        self._swap_out(model)
        if self.use_averaged_at_end and self.ema is not None:
            self.ema.copy_to(model)

    def _swap_in_for_evaluation(self, control: Any, model: torch.nn.Module) -> None:
        if control.should_evaluate and self._live is None and self.ema is not None:
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
    "MODEL_CONFIG_KEYS",
    "RECIPES",
    "TRAINING_KEYS",
    "AugmentationArguments",
    "BatchAugmentation",
    "EMACallback",
    "ExponentialMovingAverage",
    "drop_unapplied_recipe_values",
    "recipe_lr_schedule",
    "soft_target_cross_entropy",
    "split_recipe",
]
