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
| `warmup_steps` | linear warm-up in steps, or a fraction < 1 of the run (when `warmup_epochs` is unset) |
| `warmup_learning_rate` | learning rate warm-up starts from (a floor, not 0) |
| `min_learning_rate` | floor the cosine decays to |
| `cooldown_epochs` | epochs held at `min_learning_rate` after the cosine (added to `num_train_epochs`, as timm) |
| `max_grad_norm` | gradient clipping by global norm |
| `drop_path_rate` | stochastic depth probability (a model-config field; only iMixer has it today) |
| `ema_decay` | per-step decay of the weight EMA used for evaluation and the saved model (`EMACallback`) |
| `num_train_epochs` | epochs of the decay schedule |
| `per_device_train_batch_size` | batch size per device (the papers quote the global batch; see each recipe) |
| `deep_supervision`, `deep_supervision_weights` | which iterations the loss reads, and their weights (recurrent depth) |
| `sudoku_augmentation` | a random board symmetry of every training puzzle (Sudoku datasets only) |

Three kinds of recipe live in `RECIPES`:

* the papers' own (`hyperset-ic`, `hyperset-sudoku`, `hyperset-mim`, `imixer-s`, `imixer-b`, `imixer-l`,
  `hyperbf`): the values of the papers' training tables, each with its source on its line; a value a paper does
  not give is marked "not given" with what is filled in. `hyperset-mim` trains masked image modelling only
  (`--task masked-image-modeling`); the loops refuse it for other tasks (`RECIPE_TASKS`).
* `deit`: NOT any of the three papers' values, but the documented standard recipe for training a ViT-like model
  from scratch — DeiT (Touvron et al., ICML 2021, Table 9, and the defaults of its public `main.py`), which timm's
  `train.py` (the base of the iMixer authors' code) implements. Each value names its source; what DeiT does and
  our flags cannot express is listed next to it as not reproduced.
* `hyperset-sudoku-ds`: the paper's Sudoku values plus deep supervision over all iterations and the board
  symmetries; `hyperset-sudoku-ds-fast` (the GPU run's Sudoku recipe): that with the optimiser measured to leave
  the chance plateau (β1 0.9, lr 1e-2, the CLI's 5 % warm-up) in place of the paper's. Values not from the paper
  cite the result file that measured them ("measured here: benchmarks/results/...", which says what the
  measurement did and did not show).

A recipe value a model cannot take (today: `drop_path_rate`, a config field of iMixer only) is skipped for that
model with one warning line, and the run's metrics.json records only what was applied
(`drop_unapplied_recipe_values`).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields
from typing import Any

from ..tokenizer_fit import MIM_TASK

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
    "warmup_steps",
    "warmup_learning_rate",
    "min_learning_rate",
    "cooldown_epochs",
    "max_grad_norm",
    "drop_path_rate",
    "ema_decay",
    "num_train_epochs",
    "per_device_train_batch_size",
    "deep_supervision",
    "deep_supervision_weights",
    "sudoku_augmentation",
)

# The papers' recipes (their training tables, copied from the papers and the authors' configs). Every value carries its source in the comment on its line: "HS" = the Hyper-SET paper, "iMixer" = the
# iMixer paper, "memo 143" = the HyperBF CBMM memo. Where a paper and the authors' code disagree, the paper's
# table is the value and the code's value is named in the comment as the alternative. Where a paper gives no
# value, the comment says "not given" and names what is filled in. How the papers' global batch maps to
# `per_device_train_batch_size`: the value is the paper's global batch, exact on one device; on N devices pass
# `--batch_size B/N` (our loops do not divide it). Model sizes and input resolution are config fields, not recipe
# keys: each recipe names the preset that carries them.
# `deit` (last): DeiT's published from-scratch recipe, not a value of any of the three papers.
RECIPES: dict[str, dict[str, Any]] = {
    # Hyper-SET image classification, CIFAR at 224² (model: preset `cifar10-small`, HS Table 6; Table 7's Small
    # Scale-up, d = 512 / H = 8: `cifar10-small-scaleup`; its Base, d = 768 / H = 12, has no preset:
    # `--preset cifar10-small --config hidden_size=768 num_attention_heads=12 intermediate_size=768`). The paper
    # uses Adam with no weight decay: AdamW with weight_decay 0 is the same update. No augmentation is stated
    # (HS §5.2), so none is switched on.
    "hyperset-ic": {
        "num_train_epochs": 200,  # HS Table 5: epochs 200
        "per_device_train_batch_size": 128,  # HS Table 5: batch size 128 (one RTX 3090: global = per device)
        "adam_beta1": 0.0,  # HS Table 5: Adam β1 = 0.0
        "adam_beta2": 0.95,  # HS Table 5: Adam β2 = 0.95
        "weight_decay": 0.0,  # HS §5.2: "no weight decay" (Adam = AdamW at weight_decay 0)
        "learning_rate": 1e-4,  # HS §5.2: "cosine learning rate decay from 1e-4"
        "lr_scheduler_type": "cosine",  # HS §5.2: "cosine learning rate decay from 1e-4"
        "warmup_epochs": 0,  # HS §5.2: the decay starts "from 1e-4"; no warm-up is stated, so none
        "max_grad_norm": 1.0,  # HS Table 5: gradient clipping 1.0
    },
    # Hyper-SET Sudoku, Palm et al. hard puzzles (model: preset `sudoku`, HS Table 4; the loss on the blank
    # cells of the final iteration is the token-classification head's). Not reproduced: the public trainer
    # decays every parameter, our loops exempt biases and norms (`param_groups`), and it steps the cosine once
    # per epoch where ours moves every step.
    "hyperset-sudoku": {
        "num_train_epochs": 200,  # HS Table 3, §5.1: epochs 200
        "per_device_train_batch_size": 16,  # HS Table 3: batch size 16 (one RTX 3090: global = per device)
        "adam_beta1": 0.0,  # HS Table 3: AdamW β1 = 0.0 (public configs/task/sudoku.yaml: 0.9, the alternative)
        "adam_beta2": 0.95,  # HS Table 3: AdamW β2 = 0.95 (configs/task/sudoku.yaml agrees)
        "weight_decay": 0.1,  # HS Table 3: weight decay 0.1
        "learning_rate": 1e-4,  # HS Table 3: learning rate 1e-4, cosine
        "lr_scheduler_type": "cosine",  # HS Table 3: learning rate 1e-4, cosine
        "min_learning_rate": 1e-7,  # not given in HS Table 3; the authors' public trainer: cosine down to 1e-7
        "warmup_epochs": 0,  # not given in HS Table 3; the authors' public trainer: no warm-up
        "max_grad_norm": 1.0,  # HS Table 3: gradient clipping 1.0
    },
    # The same with a loss on every iteration and the board symmetries: NOT the paper's recipe (the GPU run's
    # Sudoku recipe is the next one, which also changes the optimiser). Why: the models that solve most boards
    # (Recurrent Transformer, TRM) supervise the iterations, and the paper's last-iteration loss keeps Hyper-SET at
    # chance (ln 9) for thousands of steps; in the reduced CPU runs of benchmarks/results/sudoku_depth.md only the
    # loss on every iteration took Hyper-SET off that plateau within the budget (that file has the numbers). Needs
    # a Sudoku dataset (`--sudoku_augmentation` refuses any other).
    "hyperset-sudoku-ds": {
        "num_train_epochs": 200,  # HS Table 3, §5.1: epochs 200
        "per_device_train_batch_size": 16,  # HS Table 3: batch size 16 (one RTX 3090: global = per device)
        "adam_beta1": 0.0,  # HS Table 3: AdamW β1 = 0.0
        "adam_beta2": 0.95,  # HS Table 3: AdamW β2 = 0.95
        "weight_decay": 0.1,  # HS Table 3: weight decay 0.1
        "learning_rate": 1e-4,  # HS Table 3: learning rate 1e-4, cosine
        "lr_scheduler_type": "cosine",  # HS Table 3: learning rate 1e-4, cosine
        "min_learning_rate": 1e-7,  # not given in HS Table 3; the authors' public trainer: cosine down to 1e-7
        "warmup_epochs": 0,  # not given in HS Table 3; the authors' public trainer: no warm-up
        "max_grad_norm": 1.0,  # HS Table 3: gradient clipping 1.0
        "deep_supervision": "all",  # measured here: benchmarks/results/sudoku_depth.md (last stays near chance)
        "deep_supervision_weights": "uniform",  # measured here: benchmarks/results/sudoku_depth.md (uniform, linear)
        "sudoku_augmentation": True,  # measured here: benchmarks/results/sudoku_easy.md (used, not compared without)
    },
    # The GPU run's Sudoku recipe (benchmarks/gpu/run.sh): `hyperset-sudoku-ds` with the optimiser the CPU probes
    # measured to leave the ln 9 plateau, NOT the paper's. Why: with the paper's β1 = 0 and lr 1e-4 Hyper-SET
    # stays at chance for thousands of steps (sudoku_depth.md, sudoku_easy.md); β1 0.9 and lr 1e-2, with the CLI's
    # linear warm-up and floor, left it early in training in sudoku_easy.md (that file has the numbers). The model
    # of that measurement (its width, heads, depth, init and sin-cos board positions) is no recipe value: run.sh
    # passes it with `--config`. Needs a Sudoku dataset (`--sudoku_augmentation` refuses any other).
    "hyperset-sudoku-ds-fast": {
        "num_train_epochs": 200,  # HS Table 3, §5.1: epochs 200
        "per_device_train_batch_size": 16,  # HS Table 3: batch 16 (measured here: benchmarks/results/sudoku_easy.md)
        "adam_beta1": 0.9,  # measured here: benchmarks/results/sudoku_easy.md (HS Table 3's β1 = 0 stays on ln 9)
        "adam_beta2": 0.95,  # HS Table 3: AdamW β2 = 0.95 (kept in the measured runs)
        "weight_decay": 0.1,  # HS Table 3: weight decay 0.1 (kept in the measured runs)
        "learning_rate": 1e-2,  # measured here: benchmarks/results/sudoku_easy.md (HS Table 3: 1e-4)
        "lr_scheduler_type": "cosine",  # HS Table 3: cosine (kept in the measured runs)
        "warmup_steps": 0.05,  # measured here: benchmarks/results/sudoku_easy.md (the CLI's 5 % of the run)
        "min_learning_rate": 0.0,  # measured here: benchmarks/results/sudoku_easy.md (the CLI's floor 0)
        "max_grad_norm": 1.0,  # HS Table 3: gradient clipping 1.0 (kept in the measured runs)
        "deep_supervision": "all",  # measured here: benchmarks/results/sudoku_depth.md (last stays near chance)
        "deep_supervision_weights": "uniform",  # measured here: benchmarks/results/sudoku_depth.md (uniform, linear)
        "sudoku_augmentation": True,  # measured here: benchmarks/results/sudoku_easy.md (used, not compared without)
    },
    # Hyper-SET masked image modelling on VQGAN codes (model: HS Table 9, 1 layer × 12 iterations, d = 768).
    # Training-loop values only: the masking (ratio ~ U[0, 0.4]), the learnable [MASK] token and the loss on
    # masked tokens belong to `--task masked-image-modeling` (docs/mim.md); the loops refuse this recipe for
    # any other task (`RECIPE_TASKS`, checked in `training/setup.py`).
    "hyperset-mim": {
        "num_train_epochs": 300,  # HS Appendix A.4: 300 epochs on ImageNet-100
        "per_device_train_batch_size": 256,  # HS Appendix A.4: batch 256 (global, 4 × A100: 64 per device)
        "adam_beta1": 0.0,  # HS Appendix A.4: AdamW β1 = 0.0
        "adam_beta2": 0.95,  # HS Appendix A.4: AdamW β2 = 0.95
        "weight_decay": 0.1,  # HS Appendix A.4: weight decay 0.1
        "learning_rate": 1e-4,  # HS Appendix A.4: lr 1e-4
        "lr_scheduler_type": "constant",  # HS Appendix A.4: "no decay schedule"
        "warmup_epochs": 0,  # HS Appendix A.4: no schedule stated at all, so no warm-up
        "max_grad_norm": 3.0,  # HS Appendix A.4: gradient clipping 3.0
    },
    # iMixer-S/B/L on CIFAR-10 resized to 224² (models: presets `s16` / `b16` / `l16`, h_r = 2, n = 2; iMixer
    # Appendix C.2: the same recipe trains the vanilla MLP-Mixer baseline). The authors train with timm's
    # train.py. Not reproduced: the 0.875 crop ratio (iMixer Table 5: a test-time centre crop; our processor
    # resizes the whole image), the RandAugment magnitude noise (0.5, timm's mstd) and AdamW ε 1e-8 is not a
    # flag (it is both loops' default, as torch's). Not given: random-resized crop and flip (timm's defaults
    # would add --random_resized_crop_scale 0.08 --horizontal_flip 0.5), EMA.
    "imixer-s": {
        "num_train_epochs": 300,  # iMixer Table 5: epochs 300
        "per_device_train_batch_size": 512,  # iMixer Table 5: batch size 512 (Small; global)
        "learning_rate": 5e-4,  # iMixer Table 5: base lr 5e-4 (Small; = 512 / 512 × 5e-4)
        "adam_beta1": 0.9,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "adam_beta2": 0.999,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "weight_decay": 0.05,  # iMixer Table 5: weight decay 0.05
        "lr_scheduler_type": "cosine",  # iMixer Table 5: cosine schedule
        "min_learning_rate": 1e-6,  # iMixer Table 5: cosine lower bound 1e-6
        "warmup_epochs": 20,  # iMixer Table 5: 20 warm-up epochs, linear
        "warmup_learning_rate": 1e-6,  # iMixer Table 5: warm-up from 1e-6
        "cooldown_epochs": 10,  # iMixer Table 5: cooldown 10 epochs
        "max_grad_norm": 0.0,  # not given in iMixer Table 5; timm train.py's default --clip-grad None: none
        "drop_path_rate": 0.1,  # iMixer Table 5: stochastic depth 0.1 (Small)
        "rand_augment_ops": 2,  # iMixer Table 5: RandAugment (9, 0.5); N = 2, timm's rand-m9-mstd0.5 default
        "rand_augment_magnitude": 9.0,  # iMixer Table 5: RandAugment (9, 0.5): magnitude 9
        "mixup_alpha": 0.8,  # iMixer Table 5: mixup α 0.8
        "cutmix_alpha": 1.0,  # iMixer Table 5: cutmix α 1.0
        "random_erasing": 0.25,  # iMixer Table 5: random erasing 0.25
        "label_smoothing": 0.1,  # iMixer Table 5: label smoothing 0.1
    },
    "imixer-b": {
        "num_train_epochs": 300,  # iMixer Table 5: epochs 300
        "per_device_train_batch_size": 256,  # iMixer Table 5: batch size 256 (Base; global)
        "learning_rate": 2.5e-4,  # iMixer Table 5: base lr 2.5e-4 (Base; = 256 / 512 × 5e-4)
        "adam_beta1": 0.9,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "adam_beta2": 0.999,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "weight_decay": 0.05,  # iMixer Table 5: weight decay 0.05
        "lr_scheduler_type": "cosine",  # iMixer Table 5: cosine schedule
        "min_learning_rate": 1e-6,  # iMixer Table 5: cosine lower bound 1e-6
        "warmup_epochs": 20,  # iMixer Table 5: 20 warm-up epochs, linear
        "warmup_learning_rate": 1e-6,  # iMixer Table 5: warm-up from 1e-6
        "cooldown_epochs": 10,  # iMixer Table 5: cooldown 10 epochs
        "max_grad_norm": 0.0,  # not given in iMixer Table 5; timm train.py's default --clip-grad None: none
        "drop_path_rate": 0.2,  # iMixer Table 5: stochastic depth 0.2 (Base)
        "rand_augment_ops": 2,  # iMixer Table 5: RandAugment (9, 0.5); N = 2, timm's rand-m9-mstd0.5 default
        "rand_augment_magnitude": 9.0,  # iMixer Table 5: RandAugment (9, 0.5): magnitude 9
        "mixup_alpha": 0.8,  # iMixer Table 5: mixup α 0.8
        "cutmix_alpha": 1.0,  # iMixer Table 5: cutmix α 1.0
        "random_erasing": 0.25,  # iMixer Table 5: random erasing 0.25
        "label_smoothing": 0.1,  # iMixer Table 5: label smoothing 0.1
    },
    "imixer-l": {
        "num_train_epochs": 300,  # iMixer Table 5: epochs 300
        "per_device_train_batch_size": 64,  # iMixer Table 5: batch size 64 (Large; global)
        "learning_rate": 6.25e-5,  # iMixer Table 5: base lr 6.25e-5 (Large; = 64 / 512 × 5e-4)
        "adam_beta1": 0.9,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "adam_beta2": 0.999,  # iMixer Table 5: AdamW β = (0.9, 0.999)
        "weight_decay": 0.05,  # iMixer Table 5: weight decay 0.05
        "lr_scheduler_type": "cosine",  # iMixer Table 5: cosine schedule
        "min_learning_rate": 1e-6,  # iMixer Table 5: cosine lower bound 1e-6
        "warmup_epochs": 20,  # iMixer Table 5: 20 warm-up epochs, linear
        "warmup_learning_rate": 1e-6,  # iMixer Table 5: warm-up from 1e-6
        "cooldown_epochs": 10,  # iMixer Table 5: cooldown 10 epochs
        "max_grad_norm": 0.0,  # not given in iMixer Table 5; timm train.py's default --clip-grad None: none
        "drop_path_rate": 0.3,  # iMixer Table 5: stochastic depth 0.3 (Large)
        "rand_augment_ops": 2,  # iMixer Table 5: RandAugment (9, 0.5); N = 2, timm's rand-m9-mstd0.5 default
        "rand_augment_magnitude": 9.0,  # iMixer Table 5: RandAugment (9, 0.5): magnitude 9
        "mixup_alpha": 0.8,  # iMixer Table 5: mixup α 0.8
        "cutmix_alpha": 1.0,  # iMixer Table 5: cutmix α 1.0
        "random_erasing": 0.25,  # iMixer Table 5: random erasing 0.25
        "label_smoothing": 0.1,  # iMixer Table 5: label smoothing 0.1
    },
    # HyperBF on 32×32 images (model: preset `cifar` / `cifar100`, 4 heads, 4 blocks). The memo names no
    # optimizer, schedule, weight decay or clipping: the values filled in for them are marked "not given".
    "hyperbf": {
        "num_train_epochs": 100,  # memo 143 §4: 100 epochs
        "per_device_train_batch_size": 256,  # memo 143 §4: batch 256 (one A100: global = per device)
        "learning_rate": 1e-4,  # memo 143 §4: learning rate 1e-4
        "warmup_epochs": 0,  # memo 143 §4: "no warm-up"
        "horizontal_flip": 0.5,  # memo 143 §4: flip augmentation (its probability not given: 0.5, the usual)
        "lr_scheduler_type": "constant",  # not given in memo 143 §4: no schedule is named, so a constant lr
        "weight_decay": 0.0,  # not given in memo 143 §4: no weight decay is named, so none
        "adam_beta1": 0.9,  # not given in memo 143 §4 (no optimizer named): AdamW, torch's default β1 0.9
        "adam_beta2": 0.999,  # not given in memo 143 §4 (no optimizer named): AdamW, torch's default β2 0.999
        "max_grad_norm": 0.0,  # not given in memo 143 §4: no clipping is named, so none
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


# Recipes that train one task only: recipe -> (pipeline task, what the model must be). A run whose data is another
# task is refused before the model is built (`check_recipe_task`).
RECIPE_TASKS: dict[str, tuple[str, str]] = {
    "hyperset-mim": (
        MIM_TASK,
        "a masked-image-modelling run over VQ codes (Hyper-SET paper Table 2): add --task masked-image-modeling",
    ),
}


def check_recipe_task(recipe: str | None, task: str | None) -> None:
    """A `ValueError` naming `--recipe` when the recipe is for another task than `task` (None: the data's task
    is not known yet; a recipe for a task no dataset here can be is refused then already)."""
    if recipe not in RECIPE_TASKS:
        return
    needed, what = RECIPE_TASKS[recipe]
    if task == needed:
        return
    data = "no dataset here is that task" if task is None else f"the data's task is {task}"
    raise ValueError(
        f"--recipe {recipe}: the paper's {needed} recipe needs {what}; {data}. Use it with that task, "
        f"or pick another recipe ({', '.join(sorted(set(RECIPES) - set(RECIPE_TASKS)))})"
    )


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
    "RECIPE_TASKS",
    "TRAINING_KEYS",
    "AugmentationArguments",
    "check_recipe_task",
    "drop_unapplied_recipe_values",
    "split_recipe",
]
