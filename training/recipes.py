"""The training flags of the papers' recipes and the named recipes (`--recipe NAME`): no torch, no kornia.

`AugmentationArguments` are the training-batch augmentation flags that `training/augmentation.py` applies.
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

* the papers' own (`hyperset-ic`, `hyperset-sudoku`, `imixer-cifar`, `hyperbf-memo`): the papers give only a few
  training values (each written next to its recipe with its source); the
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
from dataclasses import dataclass, field, fields
from typing import Any

# kornia's RandAugment has 15 candidate operations (its `default_policy`); N cannot exceed it (drawn without
# replacement). Magnitudes are on timm's / the RandAugment paper's 0-10 scale ("rand-m9"); kornia's is 0-30.
RAND_AUGMENT_NUM_OPS = 15
RAND_AUGMENT_MAX_MAGNITUDE = 10.0
# With both mixup and cutmix on, each mixed batch uses cutmix with this probability (timm's `switch_prob`).
CUTMIX_SWITCH_PROB = 0.5


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

# The papers' recipes: only values the papers give, each with its source. The papers give no augmentation,
# optimiser or schedule table for their image-classification experiments; every value they do not give is left
# out (listed under "not given"), so the training loop's default applies to it.
# `deit` (last): DeiT's published from-scratch recipe, not a value of any of the three papers.
RECIPES: dict[str, dict[str, Any]] = {
    # Hyper-SET image classification (paper Table 1: CIFAR-10 Small / Scale-up at 224², patch 16; model presets
    # `cifar10-small`, `cifar10-small-scaleup`). Not given: every training value — augmentation,
    # optimiser, lr, schedule, epochs, batch size, drop path, EMA of the paper's image experiments.
    "hyperset-ic": {},
    # Hyper-SET Sudoku (paper Table 4 model; model preset `sudoku`): the one-GPU recipe of
    # benchmarks/results/sudoku_depth.md. No augmentation: the inputs are grids.
    # Not given: warm-up, lr floor, EMA.
    "hyperset-sudoku": {
        "adam_beta1": 0.0,  # "AdamW β=(0, 0.95)"
        "adam_beta2": 0.95,  # "AdamW β=(0, 0.95)"
        "weight_decay": 0.1,  # "wd 0.1"
        "learning_rate": 1e-4,  # "lr 1e-4 cosine"
        "lr_scheduler_type": "cosine",  # "lr 1e-4 cosine"
        "max_grad_norm": 1.0,  # "clip 1.0"
        "per_device_train_batch_size": 16,  # "bs 16" (one GPU)
        "num_train_epochs": 200,  # "200 epochs"
    },
    # iMixer on CIFAR-10 (model presets `s16`/`b16`/`l16`, 224², h_r = 2, n = 2). Trained with the authors'
    # fork of timm's train.py. Not given: augmentation (RandAugment, mixup/cutmix, erasing, smoothing),
    # optimiser, lr, warm-up/floor/cooldown, batch size, drop path, EMA.
    "imixer-cifar": {
        "num_train_epochs": 300,  # the paper's CIFAR-10 results: 300 epochs, 4 GPUs
    },
    # HyperBF on CIFAR-10/100, Tiny-ImageNet (model presets `cifar`, `cifar100`: 4 heads, 4 blocks).
    # Not given: augmentation, optimiser, lr, schedule, batch size, drop path, EMA.
    "hyperbf-memo": {
        "num_train_epochs": 100,  # the memo's results: 100 epochs, 4 heads, 4 blocks
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


__all__ = [
    "CUTMIX_SWITCH_PROB",
    "MODEL_CONFIG_KEYS",
    "RAND_AUGMENT_MAX_MAGNITUDE",
    "RAND_AUGMENT_NUM_OPS",
    "RECIPES",
    "TRAINING_KEYS",
    "AugmentationArguments",
    "drop_unapplied_recipe_values",
    "split_recipe",
]
