"""The command-line arguments of both training loops, as typed dataclasses parsed by `HfArgumentParser`.

`energyformers train` (transformers.Trainer) and `energyformers train-accelerate` (a plain Accelerate loop)
parse the same four dataclasses, so every flag exists in both with the same meaning and default:

* `ModelArguments`: which model (family, preset, `--config` overrides, checkpoint) and its config-level
  training switches (recurrent depth, drop path);
* `DataArguments`: which data, which columns, how much of it;
* `RunArguments`: optimisation, schedule, evaluation, checkpoints, output folder, Hub upload;
* `AugmentationArguments` (`training/recipes.py`): training-batch augmentation.

`--recipe NAME` (`recipes.RECIPES`) sets the defaults of the flags it names; flags given explicitly win.
`parse_arguments` validates every numeric flag (a `UsageError` naming the flag, the value and what is
allowed) before anything is loaded or written.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import re
import sys
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..tokenizer_fit import MIM_TASK, TOKENIZER_CONFIG_NAME
from .cli import CommandParser, UsageError, UsageErrorParserMixin, check_output_folder
from .recipes import RECIPES, AugmentationArguments, split_recipe
from .weights import SHOWN_JSON, JSONNestingError, parse_json

# Recurrent-depth flags (docs/hyperset.md, "Recurrent depth"): each sets the config field of the same name.
DEPTH_FIELDS = (
    "iteration_conditioning",
    "iteration_sampling",
    "min_iterations",
    "max_iterations",
    "backprop_iterations",
    "deep_supervision",
    "deep_supervision_interval",
    "deep_supervision_samples",
    "deep_supervision_weights",
    "supervision_steps",
    "halting_head",
    "halting_loss_weight",
)
# The built-in datasets `--sudoku_augmentation` applies to (9 × 9 boards, training/sudoku.py).
SUDOKU_DATASETS = ("sudoku", "sudoku-hard")
# Model-config fields a flag of ModelArguments may set (None = not given: the config's value stays).
CONFIG_FIELDS = (*DEPTH_FIELDS, "drop_path_rate")
# The values of the depth flags that have a fixed set: the config tables' (`HyperSetConfig.choices`, which the looped
# baseline's `choices` repeat where it has the field). Written out rather than read from the config class, whose
# import pulls in torch before the flags are parsed (`train --help` would pay it); tests/test_cli_depth_choices.py
# checks them against every family's table.
DEPTH_CHOICES = {
    "iteration_conditioning": ("none", "sinusoidal", "sinusoidal-no-mlp"),
    "iteration_sampling": ("fixed", "uniform", "poisson-lognormal"),
    "deep_supervision": ("last", "all", "every", "random"),
    "deep_supervision_weights": ("uniform", "linear"),
}

# The `--lr_scheduler_type` names: transformers' `SchedulerType` values that `get_scheduler` builds from the warm-up
# and step counts alone, as both loops call it. Left out: reduce_lr_on_plateau and greedy step on an evaluation
# metric neither loop passes, cosine_with_min_lr, cosine_warmup_with_min_lr and warmup_stable_decay need
# scheduler kwargs (the floor is `--min_learning_rate` on cosine). Written out rather than read from
# transformers.trainer_utils, which imports torch; tests/test_train_arguments.py checks it against SchedulerType.
LR_SCHEDULER_TYPES = (
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
)

# `--report_to`'s default, transformers' own: no tracker, so no run reaches a tracker's service unasked.
NO_TRACKERS = ("none",)

# The `attn_implementation` names each family's models accept (`from_pretrained(..., attn_implementation=...)`),
# so a wrong one is refused before torch loads; tests/test_train_cli.py checks this table against the models.
# A model_type not listed (remote code) is left to the model to check.
ATTN_IMPLEMENTATIONS: dict[str, tuple[str, ...]] = {
    "hyperset": (
        "eager",
        "sdpa",
        "triton",
    ),  # its own bi-softmax table; triton needs CUDA (or the interpreter)
    "hyperbf": ("eager", "sdpa"),
    "imixer": ("eager",),  # no attention: token mixing is an MLP
    "looped-transformer": ("eager", "sdpa"),
}


def check_attn_flag(value: str | None, model_type: str, flag: str = "--attn_implementation") -> None:
    """A `UsageError` naming the flag, the value and the family's implementations when `value` is not one of the
    names `model_type` knows (`ATTN_IMPLEMENTATIONS`; read without torch). Whether a known name can run here (e.g.
    a kernel that needs CUDA) is the model's own `check_attn_implementation(config, value)`, asked later."""
    allowed = ATTN_IMPLEMENTATIONS.get(model_type)
    if value is not None and allowed is not None and value not in allowed:
        raise UsageError(f"{flag} {value}: {model_type} models take one of {', '.join(allowed)}")


# The flags that name a dataset's columns (`train`, `evaluate`).
COLUMN_FLAGS = ("image_column", "text_column", "text_pair_column", "label_column")


def check_column_flags(dataset: str, columns: dict[str, str | None]) -> None:
    """The column flags (`COLUMN_FLAGS`, their values in `columns`) name columns of a local or Hub dataset; a
    built-in dataset is read with its own columns and no others (`data.load_data`), so a column flag given with one
    is a `UsageError` naming the flag, its value and the dataset, rather than a flag silently ignored."""
    given = [name for name in COLUMN_FLAGS if columns.get(name) is not None]
    if not given:
        return
    from .data import BUILTIN_DATASETS  # imports `datasets` (seconds): only when a column flag is given

    if dataset in BUILTIN_DATASETS:
        raise UsageError(
            f"--{given[0]} {columns[given[0]]}: --dataset {dataset} is a built-in dataset with its own columns; "
            "the column flags name columns of a local or Hub dataset. Drop the flag"
        )


@dataclass
class ModelArguments:
    """Which model to train and the config fields the command line sets directly."""

    _argument_group_name = "model"

    model: str | None = field(
        default=None,
        metadata={
            "help": "model family (hyperset, imixer, hyperbf) or baseline (energyformers.BASELINES); "
            "unset: hyperset, or the checkpoint's family with --from_pretrained"
        },
    )
    preset: str | None = field(
        default=None,
        metadata={"help": "named config of the family (Config.from_preset); unset: the CLI's small config"},
    )
    config: list[str] = field(
        default_factory=list,
        metadata={"help": "config overrides KEY=VALUE (values parsed as JSON), e.g. hidden_size=64"},
    )
    from_pretrained: str | None = field(
        default=None, metadata={"help": "fine-tune this model folder (or Hub repo id) instead of a new model"}
    )
    iteration_conditioning: str | None = field(
        default=None,
        metadata={
            "choices": list(DEPTH_CHOICES["iteration_conditioning"]),
            "help": "step sizes of Hyper-SET's recurrent depth (the looped baseline has no such setting): 'none' = "
            "one time-invariant map that extrapolates in depth (every preset's default); t-conditioned ablations: "
            "'sinusoidal' = through a time MLP, 'sinusoidal-no-mlp' = sinusoid(t) added to x₀, the paper's MIM "
            "conditioning (time_embedding_dim = hidden_size); unset: the config's",
        },
    )
    iteration_sampling: str | None = field(
        default=None,
        metadata={
            "choices": list(DEPTH_CHOICES["iteration_sampling"]),
            "help": "depth of each training forward: num_iterations, uniform over [min, max], or "
            "poisson-lognormal with mean num_iterations; unset: the config's",
        },
    )
    min_iterations: int | None = field(
        default=None, metadata={"help": "smallest sampled depth; unset: the config's"}
    )
    max_iterations: int | None = field(
        default=None, metadata={"help": "largest sampled depth; unset: the config's"}
    )
    backprop_iterations: int | None = field(
        default=None,
        metadata={"help": "differentiate only the last k iterations (truncated backprop); unset: all"},
    )
    deep_supervision: str | None = field(
        default=None,
        metadata={
            "choices": list(DEPTH_CHOICES["deep_supervision"]),
            "help": "iterations the training loss reads (Hyper-SET, looped baseline): 'last' (the paper), 'all', "
            "'every' k-th back from the last, or a 'random' subset per step; unset: the config's",
        },
    )
    deep_supervision_interval: int | None = field(
        default=None, metadata={"help": "k of --deep_supervision every; unset: the config's"}
    )
    deep_supervision_samples: int | None = field(
        default=None,
        metadata={
            "help": "n of --deep_supervision random (the last iteration included); unset: the config's"
        },
    )
    deep_supervision_weights: str | None = field(
        default=None,
        metadata={
            "choices": list(DEPTH_CHOICES["deep_supervision_weights"]),
            "help": "weights of the supervised iterations' losses ('linear': iteration t weighs t); unset: "
            "the config's",
        },
    )
    supervision_steps: int | None = field(
        default=None,
        metadata={
            "help": "S outer steps of T iterations per batch (Hyper-SET, looped baseline; HRM/TRM style): the "
            "state carried between steps without gradient, the loss the mean of the steps' losses, one optimizer "
            "step per batch; inference runs S·T iterations; unset: the config's (1)"
        },
    )
    halting_head: bool | None = field(
        default=None,
        metadata={
            # `--halting_head` alone means true (as the bool flags without a default); unset keeps the config's
            "nargs": "?",
            "const": True,
            "help": "--halting_head [true|false]: a learned halting head (BCE on 'this step's answer is correct') "
            "that stops a sample's outer steps at inference; unset: the config's (off)",
        },
    )
    halting_loss_weight: float | None = field(
        default=None,
        metadata={"help": "weight of the halting head's BCE in the loss (> 0); unset: the config's"},
    )
    drop_path_rate: float | None = field(
        default=None,
        metadata={
            "help": "stochastic depth rate, in [0, 1) (models with that config field); unset: the config's"
        },
    )
    attn_implementation: str | None = field(
        default=None,
        metadata={
            "help": "attention implementation, as transformers' attn_implementation (hyperset: eager, sdpa, "
            "triton; hyperbf, looped-transformer: eager, sdpa; imixer: eager); unset: the model's default"
        },
    )


@dataclass
class DataArguments:
    """Which dataset, which columns and how many examples of each split."""

    _argument_group_name = "data"

    dataset: str = field(
        default="digits",
        metadata={
            "help": "built-in name (digits, fashion_mnist, mnist5k, rotten_tomatoes, spam, sudoku, sudoku-hard), "
            "local folder or file (imagefolder, csv, json, parquet, a save_to_disk folder), or Hub dataset name"
        },
    )
    image_column: str | None = field(default=None, metadata={"help": "image column; unset: image, img, ..."})
    text_column: str | None = field(
        default=None, metadata={"help": "text column; unset: text, sentence, ..."}
    )
    text_pair_column: str | None = field(
        default=None,
        metadata={
            "help": "the second text of sentence-pair data (tokenized as [CLS] text [SEP] pair [SEP]); unset: "
            "sentence2 when the columns sentence1 and sentence2 exist and --text_column is unset, else none"
        },
    )
    label_column: str | None = field(
        default=None, metadata={"help": "label column; unset: label, labels, class or target"}
    )
    max_train_samples: int | None = field(
        default=None, metadata={"help": "use the first N training examples"}
    )
    max_eval_samples: int | None = field(
        default=None, metadata={"help": "use the first N validation examples"}
    )
    max_test_samples: int | None = field(default=None, metadata={"help": "use the first N test examples"})
    sudoku_augmentation: bool = field(
        default=False,
        metadata={
            "help": "sudoku and sudoku-hard: a fresh random validity-preserving symmetry of every training "
            "puzzle each time it is read (digit relabelling, row/column and band/stack permutations, "
            "transposition); training split only"
        },
    )
    max_length: int | None = field(
        default=None,
        metadata={
            "help": "text: longest tokenized input; unset: 128 (spam: 256); with --from_pretrained: at most the "
            "checkpoint's max_position_embeddings (unset: that)"
        },
    )
    vocab_size: int = field(
        default=8000,
        metadata={
            "help": "text: size of the tokenizer trained on train (not with --from_pretrained: its own)"
        },
    )
    # masked image modelling (docs/mim.md): `--task masked-image-modeling` and its flags, kept together
    task: str | None = field(
        default=None,
        metadata={
            "choices": [MIM_TASK, "mim"],
            "help": "train masked image modelling (the Hyper-SET paper's third task; 'mim' is short for it) on "
            "an image dataset: images → VQ codes, masked per batch, loss on the masked codes; unset: the data's "
            "task (classification)",
        },
    )
    tokenizer: str | None = field(
        default=None,
        metadata={
            "help": f"{MIM_TASK}: a saved VQ tokenizer folder (PatchKMeansTokenizer.save_pretrained, e.g. a "
            "finished MIM run); unset: the --from_pretrained folder's, else a patch k-means codebook fitted on "
            "the training images"
        },
    )
    codebook_size: int = field(default=64, metadata={"help": f"{MIM_TASK}: codes of a fitted tokenizer"})
    tokenizer_patch_size: int | None = field(
        default=None,
        metadata={
            "help": f"{MIM_TASK}: pixels per code side of a fitted tokenizer; unset: 2 (≤ 16 px), else 4"
        },
    )
    tokenizer_fit_samples: int = field(
        default=2000, metadata={"help": f"{MIM_TASK}: training images the fitted tokenizer's k-means sees"}
    )
    mask_ratio_max: float = field(
        default=0.4,
        metadata={"help": f"{MIM_TASK}: training mask ratio r ~ U[0, this] per image (the paper: 0.4)"},
    )
    eval_mask_ratio: float = field(
        default=0.4,
        metadata={"help": f"{MIM_TASK}: fixed mask ratio of validation and test (the paper: 0.4)"},
    )
    decode_steps: int = field(
        default=8,
        metadata={"help": f"{MIM_TASK}: MaskGIT decoding steps of the reconstruction metrics (PSNR, SSIM)"},
    )
    decode_samples: int = field(
        default=256,
        metadata={"help": f"{MIM_TASK}: images per split decoded for the reconstruction metrics"},
    )
    lpips_weights: str | None = field(
        default=None,
        metadata={
            "help": f"{MIM_TASK}: also report LPIPS, its backbone read from this local file (torchvision's "
            "alexnet-owt-7be5be79.pth, vgg16-397923af.pth or squeezenet1_1-b8a52dc0.pth; needs torchvision); "
            "nothing is downloaded"
        },
    )
    fid_weights: str | None = field(
        default=None,
        metadata={
            "help": f"{MIM_TASK}: also report FID, its Inception read from this local file (TorchScript "
            "inception-2015-12-05.pt, or torch-fidelity's state dict with torch-fidelity installed); nothing is "
            "downloaded"
        },
    )


@dataclass
class RunArguments:
    """Optimisation, schedule, evaluation, checkpoints and outputs: the same in both training loops."""

    _argument_group_name = "training"

    output_dir: str = field(metadata={"help": "where the finished model folder goes (written atomically)"})
    overwrite_output_dir: bool = field(default=False, metadata={"help": "replace an existing output folder"})
    recipe: str | None = field(
        default=None,
        metadata={
            "choices": sorted(RECIPES),
            "help": "named training recipe of a paper: sets the defaults of the flags it names "
            "(augmentation, optimiser, schedule); explicit flags win",
        },
    )
    num_train_epochs: float | None = field(
        default=None,
        metadata={"aliases": ["--epochs"], "help": "epochs of training; unset: 12 for images, 5 for text"},
    )
    max_steps: int = field(
        default=-1, metadata={"help": "stop after N optimizer steps, overriding the epochs (-1 = off)"}
    )
    per_device_train_batch_size: int = field(
        default=64, metadata={"aliases": ["--batch_size"], "help": "training batch size per device"}
    )
    per_device_eval_batch_size: int = field(
        default=256, metadata={"help": "evaluation batch size per device"}
    )
    learning_rate: float | None = field(
        default=None,
        metadata={
            "aliases": ["--lr"],
            "help": "peak learning rate; unset: 3e-3 from scratch, 5e-4 fine-tuning",
        },
    )
    lr_scheduler_type: str = field(
        default="cosine",
        metadata={
            "choices": list(LR_SCHEDULER_TYPES),
            "help": "decay after warm-up (transformers.get_scheduler names; for a floor: cosine with "
            "--min_learning_rate)",
        },
    )
    warmup_steps: float = field(
        default=0.05, metadata={"help": "linear warm-up: steps, or a float < 1 as a fraction of the run"}
    )
    warmup_ratio: float | None = field(
        default=None,
        metadata={"help": "fraction of the run for warm-up, in [0, 1): the same as --warmup_steps"},
    )
    warmup_epochs: float | None = field(
        default=None, metadata={"help": "warm-up length in epochs (recipes); replaces --warmup_steps"}
    )
    warmup_learning_rate: float | None = field(
        default=None, metadata={"help": "learning rate the warm-up starts from (a floor); unset: 0"}
    )
    min_learning_rate: float | None = field(
        default=None, metadata={"help": "floor the cosine decays to; unset: 0"}
    )
    cooldown_epochs: float = field(
        default=0.0,
        metadata={"help": "epochs held at --min_learning_rate after the decay, added to the run (timm)"},
    )
    weight_decay: float = field(default=0.05, metadata={"help": "AdamW decoupled weight decay"})
    max_grad_norm: float = field(
        default=1.0, metadata={"help": "clip gradients to this global norm (0 = no clipping)"}
    )
    adam_beta1: float = field(default=0.9, metadata={"help": "AdamW β1 (the paper's Sudoku recipe: 0)"})
    adam_beta2: float = field(default=0.999, metadata={"help": "AdamW β2 (the paper's Sudoku recipe: 0.95)"})
    label_smoothing_factor: float = field(
        default=0.0, metadata={"help": "label smoothing ε in [0, 1): the same as --label_smoothing"}
    )
    ema_decay: float | None = field(
        default=None,
        metadata={
            "help": "keep an EMA of the weights with this per-step decay in (0, 1); it is evaluated and saved"
        },
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": "micro-batches per optimizer step"})
    seed: int = field(
        default=42,
        metadata={
            "help": "seed of the initial weights, data order, augmentation and the sampled training depths"
        },
    )
    full_determinism: bool = field(
        default=False,
        metadata={
            "help": "transformers.enable_full_determinism(--seed) in place of set_seed, before the model is built "
            "(as TrainingArguments.full_determinism): deterministic torch algorithms (an op without one raises), "
            "cuDNN deterministic and unbenchmarked, CUBLAS_WORKSPACE_CONFIG; slower on a GPU"
        },
    )
    bf16: bool = field(
        default=False, metadata={"help": "bfloat16 autocast (the same as --mixed_precision bf16)"}
    )
    mixed_precision: str | None = field(
        default=None,
        metadata={
            "choices": ["no", "bf16", "fp16"],
            "help": "autocast precision (fp16 needs a GPU); unset: no",
        },
    )
    gradient_checkpointing: bool = field(
        default=False, metadata={"help": "recompute activations in backward (less memory, more time)"}
    )
    torch_compile: bool = field(default=False, metadata={"help": "torch.compile the model"})
    eval_strategy: str | None = field(
        default=None,
        metadata={
            "choices": ["no", "steps", "epoch"],
            "help": "when to evaluate on validation; unset: steps with --max_steps, else epoch",
        },
    )
    eval_steps: int | None = field(
        default=None,
        metadata={"help": "evaluate every N steps (steps strategy); unset: a quarter of the run"},
    )
    eval_iterations: list[int] | None = field(
        default=None,
        metadata={
            "help": "recurrent-depth models: at every evaluation also log the accuracy of the head run with "
            "each of these iteration counts (eval_<metric>_iterations_<t>); unset: T/2, T and 2T"
        },
    )
    save_strategy: str | None = field(
        default=None,
        metadata={
            "choices": ["no", "steps", "epoch"],
            "help": "when to checkpoint; unset: as --eval_strategy",
        },
    )
    save_steps: int | None = field(
        default=None, metadata={"help": "checkpoint every N steps (steps strategy); unset: as --eval_steps"}
    )
    checkpointing_steps: int | None = field(
        default=None, metadata={"help": "the same as --save_strategy steps --save_steps N"}
    )
    save_total_limit: int = field(
        default=2, metadata={"help": "checkpoints kept in <output_dir>.checkpoints"}
    )
    logging_steps: int | None = field(
        default=None, metadata={"help": "log the training loss every N steps; unset: ~10 lines per run"}
    )
    dataloader_num_workers: int = field(default=0, metadata={"help": "data loading worker processes"})
    dataloader_persistent_workers: bool = field(
        default=False,
        metadata={
            "help": "keep the data loading workers alive between epochs and evaluations instead of starting them "
            "again (needs --dataloader_num_workers >= 1)"
        },
    )
    dataloader_pin_memory: bool = field(
        default=True,
        metadata={"help": "pin the batches' memory for faster copies to the GPU (no effect on CPU); true"},
    )
    num_threads: int | None = field(
        default=None, metadata={"help": "torch CPU threads (1 is faster on a busy machine); unset: torch's"}
    )
    resume: bool = field(
        default=False, metadata={"help": "continue from the last checkpoint of an interrupted run"}
    )
    keep_checkpoints: bool = field(
        default=False, metadata={"help": "keep <output_dir>.checkpoints after success"}
    )
    load_best_model_at_end: bool = field(
        default=False,
        metadata={
            "help": "`energyformers train` only: the output folder gets the weights of the checkpoint with the best "
            "--metric_for_best_model (as transformers' TrainingArguments; checkpoints must follow the evaluations: "
            "the same strategy, --save_steps a multiple of --eval_steps); unset: the last step's weights (the "
            "EMA with --ema_decay)"
        },
    )
    metric_for_best_model: str | None = field(
        default=None,
        metadata={
            "help": "with --load_best_model_at_end: the evaluation metric that picks the checkpoint, as the run "
            "logs it, with or without eval_ (classification: accuracy, f1_macro; Sudoku: blank_cell_accuracy, "
            "board_accuracy; masked image modelling: masked_token_accuracy, decoded_token_accuracy, psnr, ssim; "
            "any task: loss, the only one where lower is better; models with recurrent depth also "
            "<metric>_iterations_<t> of the task's first metric at a depth t the run evaluates, "
            "--eval_iterations or unset T/2, T and 2T, e.g. accuracy_iterations_16); unset: loss"
        },
    )
    report_to: list[str] = field(
        default_factory=lambda: list(NO_TRACKERS),
        metadata={
            "help": "experiment trackers that get the logged training loss, learning rate and evaluation metrics: "
            "one or more names of transformers' integrations (train) or accelerate's trackers "
            "(train-accelerate), 'all' (every one installed) or 'none' (the default, as transformers')"
        },
    )
    run_name: str | None = field(
        default=None,
        metadata={
            "help": "the run's name in the trackers (with --report_to); unset: the output folder's name"
        },
    )
    logging_dir: str | None = field(
        default=None,
        metadata={
            "help": "folder of the trackers that write files (TensorBoard), each run in <logging_dir>/<run_name> "
            "(with --report_to); unset: <output_dir>/runs, written in <output_dir>.checkpoints/runs during the run"
        },
    )
    disable_tqdm: bool = field(default=False, metadata={"help": "no progress bar (log lines only)"})
    num_predictions: int = field(
        default=5, metadata={"help": "pipeline predictions on test examples printed at the end"}
    )
    push_to_hub: bool = field(
        default=False, metadata={"help": "upload the finished folder to the Hub (real network)"}
    )
    hub_model_id: str | None = field(default=None, metadata={"help": "ORG/NAME of the Hub repository"})
    hub_private_repo: bool = field(default=False, metadata={"help": "create the Hub repository private"})
    hub_token: str | None = field(default=None, metadata={"help": "Hub token; unset: HF_TOKEN or the login"})

    @property
    def precision(self) -> str:
        """ "no", "bf16" or "fp16", from --bf16 / --mixed_precision."""
        return "bf16" if self.bf16 else (self.mixed_precision or "no")


@dataclass
class Arguments:
    """Everything one training run was asked to do, as parsed (and validated) from the command line."""

    model: ModelArguments
    data: DataArguments
    run: RunArguments
    augmentation: AugmentationArguments
    argv: list[str]  # the command line as given (recorded in metrics.json)
    explicit: frozenset[str]  # flags given on the command line (dest names), as opposed to defaults
    # the `--from_pretrained` checkpoint's config, checked and loaded once (`setup` asks for it at each step): held
    # by the run's arguments, so it does not outlive the run
    pretrained_config: Any = field(default=None, init=False, repr=False, compare=False)


@dataclass
class AugmentationFlags(AugmentationArguments):
    """`augmentation.AugmentationArguments` under its own heading in `--help`."""

    _argument_group_name = "augmentation (training batches only; never in eval or the saved processor)"


DATACLASSES = (ModelArguments, DataArguments, RunArguments, AugmentationFlags)


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """One option name per flag (no hyphenated twins) and "(default: X)" only where a default is set."""

    def _format_action_invocation(self, action: argparse.Action) -> str:
        if not action.option_strings:
            return super()._format_action_invocation(action)
        names = [s for s in action.option_strings if s not in _hyphen_twins(action)]
        metavar = "" if action.nargs == 0 else f" {self._format_args(action, action.dest.upper())}"
        return ", ".join(names) + metavar

    def _get_help_string(self, action: argparse.Action) -> str:
        help_ = action.help or ""
        unset = action.default is None or action.default is False or action.default in ([], argparse.SUPPRESS)
        if unset or "default" in help_:
            return help_  # unset means what the help says; a help that names its default says it once
        return help_ + " (default: %(default)s)"


def _hyphen_twins(action: argparse.Action) -> set[str]:
    """HfArgumentParser also registers --foo-bar for --foo_bar; help shows only the underscore name."""
    return {s for s in action.option_strings if s.startswith("--") and "-" in s[2:]}


class _PreParser(CommandParser):
    """The parser that reads `--recipe` before the full parser is built."""


def build_parser(prog: str, description: str) -> argparse.ArgumentParser:
    """The parser of both loops (`HfArgumentParser` over `DATACLASSES`); its errors are `UsageError`s."""
    from transformers import HfArgumentParser

    parser_class = type("TrainingArgumentParser", (UsageErrorParserMixin, HfArgumentParser), {})
    return parser_class(DATACLASSES, prog=prog, description=description, formatter_class=_HelpFormatter)


def parse_arguments(argv: list[str], prog: str, description: str) -> Arguments:
    """Parse and validate `argv`; `--recipe` supplies defaults that explicit flags override."""
    parser = build_parser(prog, description)
    recipe = _recipe_name(argv, prog)
    if recipe is not None:
        augmentation, training = split_recipe(recipe)
        unknown = sorted(set(training) - _dests(parser))
        if unknown:  # a recipe key without a flag would be silently ignored
            raise UsageError(f"--recipe {recipe}: sets {unknown}, which no flag of {prog} takes")
        parser.set_defaults(**augmentation, **training)
    try:
        *parsed, unknown = parser.parse_args_into_dataclasses(
            argv, look_for_args_file=False, return_remaining_strings=True
        )
    except UsageError:
        raise
    except ValueError as err:  # AugmentationArguments.__post_init__ names the flag
        raise UsageError(str(err)) from None
    refuse_sharding(unknown)
    if unknown:  # argparse's own wording, as the other sub-commands report them
        raise UsageError(f"unrecognized arguments: {' '.join(unknown)}")
    model, data, run, augmentation = parsed
    args = Arguments(model, data, run, augmentation, list(argv), _explicit(parser, argv))
    validate(args)
    validate_best_model(args, prog)
    validate_trackers(args.run, args.explicit, prog)
    return args


# FSDP, asked for with TrainingArguments' flags or by `accelerate launch --use_fsdp` (the variable it sets, read by
# `Accelerator()` exactly as here), is refused by both loops: docs/training.md, "Sharding with FSDP", says why.
FSDP_FLAGS = ("--fsdp", "--fsdp_config")
FSDP_VARIABLE = "ACCELERATE_USE_FSDP"
FSDP_REFUSAL = (
    "FSDP is not supported; several processes train with DDP (torchrun, accelerate launch --multi_gpu); why: "
    'docs/training.md, "Sharding with FSDP"'
)


def refuse_sharding(unknown: list[str]) -> None:
    """A `UsageError` when FSDP is asked for: a TrainingArguments FSDP flag among the strings the parser did not take
    (`unknown`, named with its value), or `accelerate launch --use_fsdp` (its environment variable). On CPU accelerate
    would run the processes as DDP whatever the FSDP settings; on GPUs its FSDP2 wrapping fails on these models."""
    for index, token in enumerate(unknown):
        flag, equals, value = token.partition("=")
        if flag in FSDP_FLAGS:
            if not equals and index + 1 < len(unknown) and not unknown[index + 1].startswith("--"):
                value = unknown[index + 1]
            named = f"{flag} {value}" if value else flag
            raise UsageError(f"{named}: {FSDP_REFUSAL}")
    value = os.environ.get(FSDP_VARIABLE, "")
    if value.lower() == "true":
        raise UsageError(
            f"{FSDP_VARIABLE} {value} (accelerate launch --use_fsdp, or an accelerate config with FSDP): "
            f"{FSDP_REFUSAL}"
        )


def _recipe_name(argv: list[str], prog: str) -> str | None:
    pre = _PreParser(prog=prog, add_help=False)
    pre.add_argument("--recipe", choices=sorted(RECIPES))
    known, _ = pre.parse_known_args(argv)
    return known.recipe


def _dests(parser: argparse.ArgumentParser) -> set[str]:
    return {action.dest for action in parser._actions}


def _explicit(parser: argparse.ArgumentParser, argv: list[str]) -> frozenset[str]:
    """The dest names given on the command line: parse again with every default suppressed."""
    quiet = argparse.ArgumentParser(add_help=False, argument_default=argparse.SUPPRESS)
    for action in parser._actions:
        if action.option_strings and action.dest != "help":
            kwargs = {"dest": action.dest, "nargs": action.nargs}
            if action.nargs == 0:
                kwargs = {"dest": action.dest, "action": "store_true"}
            elif action.const is not None:
                kwargs["const"] = action.const
            quiet.add_argument(*action.option_strings, **kwargs)
    known, _ = quiet.parse_known_args(argv)
    return frozenset(vars(known))


# --------------------------------------------------------------------------- validation


def _check(name: str, value: Any, ok: bool, allowed: str) -> None:
    if not ok:
        raise UsageError(f"--{name} {value}: expected {allowed}")


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def validate(args: Arguments) -> None:
    """Every numeric flag in its range, and flags that replace each other not in conflict.

    Runs before any data is loaded or any file is written; the first problem found is the one reported, in the
    order below. Once the flags are in range and agree, resolves the alias flags (`--warmup_ratio`, `--checkpointing_steps`,
    `--label_smoothing_factor`) into their canonical ones (`--bf16` is read through `RunArguments.precision`).
    """
    _validate_model_flags(args.model)
    _validate_data_flags(args.data, args.explicit, args.model.from_pretrained)
    _validate_optimizer_flags(args.run, args.augmentation, args.explicit)
    _validate_run_flags(args.run)
    _resolve_alias_flags(args.run, args.augmentation)
    _validate_output_flags(args.run)


def _validate_model_flags(m: ModelArguments) -> None:
    """`--attn_implementation` (also as `--config attn_implementation=NAME`) and the iteration and regularisation
    flags of the model."""
    parse_overrides(m.config)  # a `--config` value that cannot be read is named before anything loads
    _take_attn_implementation_from_config(m)
    for name in (
        "min_iterations",
        "max_iterations",
        "backprop_iterations",
        "deep_supervision_interval",
        "deep_supervision_samples",
        "supervision_steps",
    ):
        value = getattr(m, name)
        _check(name, value, value is None or value >= 1, "an integer >= 1")
    _check(
        "halting_loss_weight",
        m.halting_loss_weight,
        m.halting_loss_weight is None or (_finite(m.halting_loss_weight) and m.halting_loss_weight > 0),
        "a finite weight > 0",
    )
    _check(
        "drop_path_rate",
        m.drop_path_rate,
        m.drop_path_rate is None or (_finite(m.drop_path_rate) and 0.0 <= m.drop_path_rate < 1.0),
        "a probability in [0, 1)",
    )


def _validate_data_flags(d: DataArguments, explicit: frozenset[str], from_pretrained: str | None) -> None:
    """The sample limits, the dataset's columns and augmentation, the tokenizer size and the masked-image-modelling
    flags."""
    for name in ("max_train_samples", "max_eval_samples", "max_test_samples", "max_length"):
        value = getattr(d, name)
        _check(name, value, value is None or value >= 1, "an integer >= 1 (or leave it unset)")
    if d.sudoku_augmentation and d.dataset not in SUDOKU_DATASETS:
        raise UsageError(
            f"--sudoku_augmentation: --dataset {d.dataset} is not a Sudoku dataset; the symmetries apply to the "
            f"built-in boards only ({', '.join(SUDOKU_DATASETS)})"
        )
    check_column_flags(d.dataset, {name: getattr(d, name) for name in COLUMN_FLAGS})
    _check("vocab_size", d.vocab_size, d.vocab_size >= 8, "an integer >= 8 (special tokens + characters)")
    _validate_mim(d, explicit, from_pretrained)


def _validate_optimizer_flags(r: RunArguments, a: AugmentationArguments, explicit: frozenset[str]) -> None:
    """The learning rate and its schedule, the run length and batch sizes, the optimizer's and the loss's settings;
    an alias flag that disagrees with the flag it stands for is refused here, in its place in this order (it is
    resolved by `_resolve_alias_flags`)."""
    lr = r.learning_rate
    _check("learning_rate", lr, lr is None or (_finite(lr) and lr > 0), "a finite learning rate > 0")
    epochs = r.num_train_epochs
    _check(
        "num_train_epochs",
        epochs,
        epochs is None or (_finite(epochs) and epochs > 0),
        "a number of epochs > 0 (or --max_steps N)",
    )
    _check("max_steps", r.max_steps, r.max_steps == -1 or r.max_steps >= 1, "-1 (off) or an integer >= 1")
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        _check(name, getattr(r, name), getattr(r, name) >= 1, "an integer >= 1")
    _check("warmup_steps", r.warmup_steps, _finite(r.warmup_steps) and r.warmup_steps >= 0, "a value >= 0")
    if r.warmup_ratio is not None:
        _check("warmup_ratio", r.warmup_ratio, _finite(r.warmup_ratio) and 0 <= r.warmup_ratio < 1, "[0, 1)")
        if "warmup_steps" in explicit and r.warmup_steps != r.warmup_ratio:
            raise UsageError("--warmup_ratio and --warmup_steps both set the warm-up; pass one of them")
    for name in ("warmup_epochs", "cooldown_epochs"):
        value = getattr(r, name)
        _check(name, value, value is None or (_finite(value) and value >= 0), "a number of epochs >= 0")
    for name in ("warmup_learning_rate", "min_learning_rate"):
        value = getattr(r, name)
        _check(name, value, value is None or (_finite(value) and value >= 0), "a learning rate >= 0")
        if value is not None and lr is not None:
            _check(name, value, value <= lr, f"a learning rate <= --learning_rate {lr}")
    _check("weight_decay", r.weight_decay, _finite(r.weight_decay) and r.weight_decay >= 0, "a value >= 0")
    _check("max_grad_norm", r.max_grad_norm, _finite(r.max_grad_norm) and r.max_grad_norm >= 0, ">= 0")
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(r, name)
        _check(name, value, _finite(value) and 0.0 <= value < 1.0, "0 <= value < 1")
    _check(
        "label_smoothing_factor",
        r.label_smoothing_factor,
        _finite(r.label_smoothing_factor) and 0 <= r.label_smoothing_factor < 1,
        "a value in [0, 1)",
    )
    if (
        r.label_smoothing_factor > 0
        and a.label_smoothing > 0
        and a.label_smoothing != r.label_smoothing_factor
    ):
        raise UsageError(
            f"--label_smoothing_factor {r.label_smoothing_factor} and --label_smoothing {a.label_smoothing} "
            "disagree; pass one of them"
        )
    if r.ema_decay is not None:
        _check("ema_decay", r.ema_decay, _finite(r.ema_decay) and 0 < r.ema_decay < 1, "a decay in (0, 1)")
    if r.bf16 and r.mixed_precision not in (None, "bf16"):
        raise UsageError(f"--bf16 and --mixed_precision {r.mixed_precision} disagree; pass one of them")


def _validate_run_flags(r: RunArguments) -> None:
    """The evaluation, checkpointing and logging intervals, the seed and the run's other counts; `--checkpointing_steps`
    that disagrees with `--save_strategy` / `--save_steps` is refused in its place in this order."""
    for name in ("eval_steps", "save_steps", "checkpointing_steps", "logging_steps", "num_threads"):
        value = getattr(r, name)
        _check(name, value, value is None or value >= 1, "an integer >= 1 (or leave it unset)")
    for value in r.eval_iterations or ():
        _check("eval_iterations", value, value >= 1, "iteration counts >= 1")
    if r.checkpointing_steps is not None and (
        r.save_strategy not in (None, "steps") or r.save_steps not in (None, r.checkpointing_steps)
    ):
        raise UsageError("--checkpointing_steps N is --save_strategy steps --save_steps N; pass one form")
    _check("seed", r.seed, 0 <= r.seed < 2**32, "an integer in [0, 2**32) (numpy's seed range)")
    _check("save_total_limit", r.save_total_limit, r.save_total_limit >= 1, "an integer >= 1")
    _check(
        "dataloader_num_workers", r.dataloader_num_workers, r.dataloader_num_workers >= 0, "an integer >= 0"
    )
    if r.dataloader_persistent_workers and r.dataloader_num_workers == 0:
        # torch's DataLoader refuses it only when the first loader is built, after the model
        raise UsageError(
            "--dataloader_persistent_workers keeps worker processes alive, and --dataloader_num_workers is 0 "
            "(no workers); pass --dataloader_num_workers N (N >= 1) or drop the flag"
        )
    _check("num_predictions", r.num_predictions, r.num_predictions >= 0, "an integer >= 0")


def _resolve_alias_flags(r: RunArguments, a: AugmentationArguments) -> None:
    """The alias flags, already checked, written into the flags they stand for: `--warmup_ratio` into
    `--warmup_steps` (a value < 1 is a ratio there), `--label_smoothing_factor` into the batch augmentation's
    `--label_smoothing` (one label smoothing in both loops; both then hold it), `--checkpointing_steps N` into
    `--save_strategy steps --save_steps N`."""
    if r.warmup_ratio is not None:
        r.warmup_steps = r.warmup_ratio
    if r.label_smoothing_factor > 0:
        a.label_smoothing = r.label_smoothing_factor
    r.label_smoothing_factor = a.label_smoothing
    if r.checkpointing_steps is not None:
        r.save_strategy, r.save_steps = "steps", r.checkpointing_steps


def _validate_output_flags(r: RunArguments) -> None:
    """What `--push_to_hub` needs (the upload comes after the whole run, so it is checked before the run starts),
    and `--output_dir` usable."""
    if r.push_to_hub and not r.hub_model_id:
        raise UsageError("--push_to_hub needs --hub_model_id ORG/NAME")
    if r.push_to_hub:
        from .push import check_push_request

        check_push_request(r.hub_model_id, r.hub_token, repo_flag="--hub_model_id", token_flag="--hub_token")
    check_output_dir(r.output_dir, r.overwrite_output_dir)


# --------------------------------------------------------------------------- experiment trackers

# The availability check of a `--report_to` name of transformers' whose function in `transformers.integrations` is not
# `is_<name>_available` (flyte: its callback needs the deck plugin as well as flytekit). Accelerate's checks are all
# `accelerate.utils.is_<name>_available`. tests/test_report_to.py checks that every name of both registries has one.
TRAINER_TRACKER_CHECKS = {
    "azure_ml": "is_azureml_available",
    "comet_ml": "is_comet_available",
    "flyte": "is_flyte_deck_standard_available",
}
# What to install for a tracker whose package is not named as the tracker is (`pip install <name>` otherwise).
TRACKER_INSTALL = {
    "aim": "pip install 'aim<4'",  # accelerate's check accepts aim 3 only
    "azure_ml": "pip install azureml-core",
    "comet_ml": "pip install comet-ml (and set COMET_API_KEY: transformers' check asks for it too)",
    "dagshub": "pip install dagshub mlflow",
    "flyte": "pip install flytekit flytekitplugins-deck-standard",
    "kubeflow": "transformers turns it on inside a Kubeflow TrainJob (KUBEFLOW_TRAINER_SERVER_URL set)",
    "tensorboard": "pip install tensorboardX (or tensorboard)",
}


def tracker_names(prog: str) -> tuple[str, ...]:
    """The `--report_to` names `prog` takes besides 'all' and 'none': the loop's library's own registry,
    transformers' `INTEGRATION_TO_CALLBACK` (Trainer builds one callback per name) or accelerate's
    `LOGGER_TYPE_TO_CLASS` (`Accelerator(log_with=...)`). Imported only when a tracker is named: both import torch."""
    if prog == ACCELERATE_PROG:
        from accelerate.tracking import LOGGER_TYPE_TO_CLASS

        return tuple(sorted(LOGGER_TYPE_TO_CLASS))
    from transformers.integrations import INTEGRATION_TO_CALLBACK

    return tuple(sorted(INTEGRATION_TO_CALLBACK))


def tracker_check(name: str, prog: str) -> tuple[str, Any] | None:
    """(its qualified name, the function) of the library's check that tracker `name` can be used here, as the loop's
    library decides it (`tracker_names`); None for a name without one (a tracker registered after this release)."""
    if prog == ACCELERATE_PROG:
        import accelerate.utils as library

        function = f"is_{name}_available"
    else:
        import transformers.integrations as library

        function = TRAINER_TRACKER_CHECKS.get(name, f"is_{name}_available")
    check = getattr(library, function, None)
    return None if check is None else (f"{library.__name__}.{function}", check)


def validate_trackers(r: RunArguments, explicit: frozenset[str], prog: str) -> None:
    """`--report_to`: 'none', 'all', or names of the loop's trackers (`tracker_names`) each installed (its
    library's own check, `tracker_check`), repeats dropped; `--run_name` and `--logging_dir` only with a tracker,
    and `--logging_dir` not a file. A `UsageError` naming the flag, the value and what is allowed otherwise."""
    names = list(dict.fromkeys(r.report_to))
    given = " ".join(r.report_to)
    if len(names) > 1 and {"all", "none"} & set(names):
        raise UsageError(
            f"--report_to {given}: 'all' and 'none' stand alone; name the trackers, or one of those"
        )
    r.report_to = names
    if names == ["none"]:
        unused = [name for name in ("run_name", "logging_dir") if name in explicit]
        if unused:
            raise UsageError(
                f"--{unused[0]} {getattr(r, unused[0])}: applies to the trackers, and --report_to is none; add "
                "--report_to NAME or drop it"
            )
        return
    if r.logging_dir is not None and os.path.isfile(os.path.expanduser(r.logging_dir)):
        raise UsageError(f"--logging_dir {r.logging_dir}: a file; expected a folder (new or existing)")
    if r.logging_dir is not None:
        check_logging_dir(r)
    if names == ["all"]:
        return
    known = tracker_names(prog)
    for name in names:
        if name not in known:
            other = "energyformers train" if prog == ACCELERATE_PROG else ACCELERATE_PROG
            also = f"; {name} is a tracker of {other}" if name in tracker_names(other) else ""
            raise UsageError(
                f"--report_to {name}: {prog} reports to {', '.join(known)}, all (those installed) or none{also}"
            )
        found = tracker_check(name, prog)
        if found is not None and not found[1]():
            install = TRACKER_INSTALL.get(name, f"pip install {name}")
            raise UsageError(f"--report_to {name}: not available here ({found[0]}() is false); {install}")


def check_logging_dir(r: RunArguments) -> None:
    """`--logging_dir` outside the folders the run replaces or removes: `--output_dir` (the finished model folder
    takes its place, so the trackers' files would make the folder non-empty or be deleted with it) and, without
    --keep_checkpoints, its work folder (removed at the end). A `UsageError` naming both folders otherwise."""
    logs = Path(r.logging_dir).expanduser().resolve()
    output = Path(r.output_dir).expanduser().resolve()
    removed = [(output, "--output_dir", "which the finished model folder replaces")]
    if not r.keep_checkpoints:
        removed.append(
            (work_folder(output), "the work folder", "which a finished run removes (no --keep_checkpoints)")
        )
    for folder, name, why in removed:
        if logs.is_relative_to(folder):
            raise UsageError(
                f"--logging_dir {r.logging_dir}: inside {name} {folder}, {why}; without --logging_dir the trackers' "
                f"files go to {output / TRACKER_FOLDER} anyway (moved there with the model), or choose a folder "
                "outside it"
            )


def tracker_run_name(r: RunArguments) -> str:
    """The run's name in the trackers: `--run_name`, else the output folder's name."""
    return r.run_name or os.path.basename(os.path.abspath(os.path.expanduser(r.output_dir)))


# Where the trackers that write files write while the run goes, in the work folder, unless `--logging_dir`:
# `run_folder.finish_run` moves it into the finished output folder (as Trainer's own default, <output_dir>/runs).
TRACKER_FOLDER = "runs"


def tracker_folder(r: RunArguments, work_dir: Any) -> str:
    """The folder the trackers that write files write in (each run in `<folder>/<run name>`): `--logging_dir`, else
    `<work_dir>/runs`, moved with the finished folder."""
    if r.logging_dir is not None:
        return os.path.abspath(os.path.expanduser(r.logging_dir))
    return os.path.join(os.fspath(work_dir), TRACKER_FOLDER)


def tracker_config(args: Arguments) -> dict[str, Any]:
    """The run's arguments (`recorded`) as one flat dict of plain values, as trackers' hyper-parameter tables take
    them: each flag by its name (unique across the dataclasses), a list or dict as its JSON text, unset ones left
    out."""
    flat: dict[str, Any] = {}
    for group in recorded(args).values():
        for name, value in group.items():
            if value is not None:
                plain = isinstance(value, (bool, int, float, str))
                flat[name] = value if plain else json.dumps(value)
    return flat


# --------------------------------------------------------------------------- best checkpoint

# The metrics each task's evaluation logs (`evaluation.task_metrics`, plus the decoded reconstruction metrics of
# masked image modelling), by the names `--metric_for_best_model` takes: higher is better for all but `loss`,
# so transformers' default direction (lower only for a name ending in "loss") is right and no
# `--greater_is_better` is needed. LPIPS / FID (lower is better, present only with their weight files) are left
# out. The depth pass (`evaluation.depth_metrics`) adds `<primary metric>_iterations_<t>` (higher is better) for
# each depth t the run evaluates: not listed here, since the depths depend on the run; `check_best_model_metric`
# accepts them by name, checked against the depths where they are known.
BEST_MODEL_METRICS: dict[str, tuple[str, ...]] = {
    "classification": ("accuracy", "f1_macro", "loss"),
    "token-classification": ("blank_cell_accuracy", "board_accuracy", "loss"),
    MIM_TASK: ("masked_token_accuracy", "decoded_token_accuracy", "psnr", "ssim", "loss"),
}
# Whether each model type the CLI builds has the depth pass (a backbone with recurrent depth, whose calls take
# `num_iterations`: `evaluation.has_recurrent_depth`), written out so a per-depth metric is checked while parsing,
# before torch loads; tests/test_train_best_model.py checks it against the registry. A type not listed (remote
# code) is checked once the model is built.
DEPTH_PASS: dict[str, bool] = {
    "hyperset": True,
    "looped-transformer": True,
    "imixer": False,
    "hyperbf": False,
    "vit": False,
}
# The command that has no best-checkpoint tracking (its own loop): the flags are refused there.
ACCELERATE_PROG = "energyformers train-accelerate"


def best_model_metrics(task: str) -> tuple[str, ...]:
    """The `--metric_for_best_model` names a run of `task` (a pipeline task, or `MIM_TASK`) can pick besides the
    per-depth ones (`depth_metric`)."""
    return BEST_MODEL_METRICS.get(task, BEST_MODEL_METRICS["classification"])


def depth_metric(metric: str) -> tuple[str, int] | None:
    """(metric, t) of a per-depth name `[eval_]<metric>_iterations_<t>` as the depth pass logs it (t written
    without leading zeros); None for any other name."""
    match = re.fullmatch(r"(?:eval_)?(.+)_iterations_([1-9][0-9]*)", metric)
    return None if match is None else (match[1], int(match[2]))


def check_best_model_metric(
    metric: str,
    task: str | None,
    dataset: str,
    depths: list[int] | None = None,
    model_type: str | None = None,
) -> None:
    """A `UsageError` naming `--metric_for_best_model`, its value and the metrics `task`'s evaluation logs, when
    `metric` (with or without the `eval_` prefix) is not one of them. `task` None: not known yet (a local or Hub
    dataset, classification or per-token). A per-depth name `<metric>_iterations_<t>` (`depth_metric`) must name
    the task's primary metric (the one the depth pass logs) and one of `depths`, the depths the run evaluates:
    None while they are not known, [] when the run has no depth pass (`model_type` has no recurrent depth).
    Called while parsing with what the flags say and again by `energyformers train` with the task of the data as
    loaded (a local per-token dataset) and the depths of the model as built (T/2, T and 2T of its
    `num_iterations` unless `--eval_iterations`)."""
    from .evaluation import primary_metric  # numpy only: no torch while parsing

    tasks = ("classification", "token-classification") if task is None else (task,)
    name = metric.removeprefix("eval_")
    if any(name in best_model_metrics(t) for t in tasks):
        return
    if task is not None:
        allowed = f"--dataset {dataset} ({task}) logs {_logged_metrics(task, depths)}"
    else:
        allowed = (
            f"classification logs {_logged_metrics('classification', depths)}, per-token datasets (Sudoku) "
            f"{_logged_metrics('token-classification', depths)}"
        )
    split = depth_metric(name)
    if split is not None and split[0] in {primary_metric(t) for t in tasks}:
        base, t = split
        if depths is None or t in depths:
            return
        if not depths:
            raise UsageError(
                f"--metric_for_best_model {metric}: {model_type} has no recurrent depth (no per-call "
                f"num_iterations), so the run has no depth pass and logs no {base}_iterations_<t>; {allowed}"
            )
        raise UsageError(
            f"--metric_for_best_model {metric}: the run evaluates {base}_iterations_<t> at t = "
            f"{', '.join(map(str, depths))} (--eval_iterations; unset: T/2, T and 2T of the model's "
            "num_iterations); pick one of those depths or add it to --eval_iterations"
        )
    raise UsageError(
        f"--metric_for_best_model {metric}: {allowed} at each evaluation (with or without the eval_ prefix)"
    )


def _logged_metrics(task: str, depths: list[int] | None) -> str:
    """What `task`'s evaluations log, by `--metric_for_best_model` name, for a refusal: the per-depth name with its
    depths when known, none without the depth pass."""
    from .evaluation import primary_metric

    names = list(best_model_metrics(task))
    if depths is None:
        names.append(f"{primary_metric(task)}_iterations_<t> (t a depth the run evaluates)")
    elif depths:
        names.append(f"{primary_metric(task)}_iterations_<t> (t = {', '.join(map(str, depths))})")
    return ", ".join(names)


def _depths_while_parsing(args: Arguments) -> tuple[list[int] | None, str | None]:
    """(the depths the run evaluates, or None where the built model decides them; the model type, None when
    unknown) as far as the flags say: [] for a model type without the depth pass (`DEPTH_PASS`), else
    `--eval_iterations` (a model without the pass refuses them), else T/2, T and 2T of a T given by `--config
    num_iterations=T` or the local `--from_pretrained` folder's config.json. A preset's T, or a Hub checkpoint's,
    is read once the model is built (`energyformers train` checks the metric again then)."""
    from .evaluation import default_eval_depths

    m = args.model
    saved: Any = {}
    if m.from_pretrained:
        try:
            with open(os.path.join(os.path.expanduser(m.from_pretrained), "config.json")) as file:
                saved = parse_json(file.read())
        except (OSError, ValueError):  # a Hub id or a broken folder: checked where it loads
            saved = {}
        saved = saved if isinstance(saved, dict) else {}
    model_type = m.model or saved.get("model_type") or (None if m.from_pretrained else "hyperset")
    has_pass = DEPTH_PASS.get(model_type) if isinstance(model_type, str) else None
    if has_pass is False:
        return [], model_type
    if args.run.eval_iterations:
        return sorted(set(args.run.eval_iterations)), model_type
    overrides = parse_overrides(m.config)
    trained = overrides.get("num_iterations", saved.get("num_iterations"))
    if has_pass and isinstance(trained, int) and not isinstance(trained, bool) and trained >= 1:
        return default_eval_depths(trained), model_type
    return None, model_type


def _builtin_datasets() -> frozenset[str]:
    from .data import BUILTIN_DATASETS  # imports `datasets` (seconds): only when a metric is named

    return frozenset(BUILTIN_DATASETS)


def validate_best_model(args: Arguments, prog: str) -> None:
    """`--load_best_model_at_end` / `--metric_for_best_model`: `energyformers train` only (Trainer tracks the best
    checkpoint; the Accelerate loop does not); a checkpoint at every evaluation that can be the best one, as
    transformers requires (the same strategy, other than "no"; by steps, `save_steps` a multiple of `eval_steps`),
    worked out from the cadence `optimization.plan_schedule` will use; and a metric the run logs."""
    r, d = args.run, args.data
    given = [
        f"--{name}" for name in ("load_best_model_at_end", "metric_for_best_model") if name in args.explicit
    ]
    if given and prog == ACCELERATE_PROG:
        raise UsageError(
            f"{given[0]}: {prog} does not track the best checkpoint; use energyformers train (the Trainer loop), "
            "which takes the same flags"
        )
    if r.metric_for_best_model is not None and not r.load_best_model_at_end:
        raise UsageError(
            f"--metric_for_best_model {r.metric_for_best_model}: picks the checkpoint --load_best_model_at_end "
            "loads; add --load_best_model_at_end or drop it"
        )
    if not r.load_best_model_at_end:
        return
    # the cadence as `optimization.cadence_strategies` / `plan_schedule` resolve it (no torch needed)
    eval_strategy = r.eval_strategy or ("steps" if r.max_steps > 0 else "epoch")
    save_strategy = r.save_strategy or eval_strategy
    if eval_strategy == "no" or save_strategy == "no":
        which = "--eval_strategy no" if eval_strategy == "no" else "--save_strategy no"
        raise UsageError(
            f"--load_best_model_at_end: {which} leaves no evaluated checkpoint to pick from; evaluate and save "
            "with the same strategy (steps or epoch)"
        )
    if eval_strategy != save_strategy:
        raise UsageError(
            f"--load_best_model_at_end: evaluation by {eval_strategy} and checkpoints by {save_strategy}; "
            "evaluate and save with the same strategy (steps or epoch), so each evaluation has its checkpoint"
        )
    if eval_strategy == "steps":
        eval_steps = r.eval_steps
        if eval_steps is None and r.save_steps is not None:
            if r.max_steps <= 0:  # a quarter of a run whose length waits for the data: unknown here
                raise UsageError(
                    f"--load_best_model_at_end with --save_steps {r.save_steps} needs --eval_steps too (a "
                    "divisor of it): unset, evaluation comes every quarter of the run"
                )
            eval_steps = max(1, r.max_steps // 4)
        save_steps = r.save_steps or eval_steps
        if eval_steps is not None and save_steps % eval_steps:
            raise UsageError(
                f"--load_best_model_at_end: --save_steps {save_steps} is not a multiple of --eval_steps "
                f"{eval_steps}, so the best evaluation may have no checkpoint; make it one (e.g. --save_steps "
                f"{eval_steps})"
            )
    if r.metric_for_best_model is not None:
        if d.task == MIM_TASK:
            task: str | None = MIM_TASK
        elif d.dataset in SUDOKU_DATASETS:
            task = "token-classification"
        elif d.dataset in _builtin_datasets():  # the other built-ins classify images or texts
            task = "classification"
        else:  # a local or Hub dataset may be per-token: checked again once loaded
            task = None
        check_best_model_metric(r.metric_for_best_model, task, d.dataset, *_depths_while_parsing(args))


# The flags that only mean something with `--task masked-image-modeling`.
MIM_FLAGS = (
    "tokenizer",
    "codebook_size",
    "tokenizer_patch_size",
    "tokenizer_fit_samples",
    "mask_ratio_max",
    "eval_mask_ratio",
    "decode_steps",
    "decode_samples",
    "lpips_weights",
    "fid_weights",
)


def _validate_mim(d: DataArguments, explicit: frozenset[str], from_pretrained: str | None = None) -> None:
    """The masked-image-modelling flags in range, and none of them without `--task masked-image-modeling`; no
    tokenizer-fitting flag when the run is given a tokenizer (`--tokenizer`, or a `--from_pretrained` folder
    that carries one)."""
    if d.task == "mim":
        d.task = MIM_TASK
    if d.task != MIM_TASK:
        given = [name for name in MIM_FLAGS if name in explicit]
        if given:
            raise UsageError(f"--{given[0]}: a masked-image-modelling flag; add --task {MIM_TASK} or drop it")
        return
    _check("codebook_size", d.codebook_size, d.codebook_size >= 2, "an integer >= 2")
    _check(
        "tokenizer_patch_size",
        d.tokenizer_patch_size,
        d.tokenizer_patch_size is None or d.tokenizer_patch_size >= 1,
        "an integer >= 1 (or leave it unset)",
    )
    for name in ("tokenizer_fit_samples", "decode_steps", "decode_samples"):
        _check(name, getattr(d, name), getattr(d, name) >= 1, "an integer >= 1")
    for name in ("mask_ratio_max", "eval_mask_ratio"):
        value = getattr(d, name)
        _check(name, value, _finite(value) and 0 < value <= 1, "a fraction in (0, 1]")
    if d.tokenizer is not None and not os.path.isdir(os.path.expanduser(d.tokenizer)):
        raise UsageError(f"--tokenizer {d.tokenizer}: no such folder (a saved VQ tokenizer folder)")
    given = mim_tokenizer_source(d.tokenizer, from_pretrained)
    if given is not None:
        _refuse_fitting_flags(d, explicit, *given)
        if from_pretrained:
            _check_given_tokenizer_fits(from_pretrained, *given)
    if d.lpips_weights is None and d.fid_weights is None:
        return  # nothing to check, and energyformers.mim imports torch
    from energyformers.mim import check_perceptual_weights

    try:  # the message names the flag and its value itself (flags=True)
        check_perceptual_weights(d.lpips_weights, d.fid_weights, flags=True)
    except (OSError, ValueError, ImportError) as err:
        raise UsageError(str(err)) from None


# The flags that shape the tokenizer a run fits, and the field of a saved tokenizer's config each one sets.
TOKENIZER_FITTING_FLAGS = {
    "codebook_size": "codebook_size",
    "tokenizer_patch_size": "patch_size",
    "tokenizer_fit_samples": None,  # not recorded: the saved tokenizer is fitted already
}


def mim_tokenizer_source(tokenizer: str | None, from_pretrained: str | None) -> tuple[str, str] | None:
    """(flag, folder) of the image tokenizer a masked-image-modelling run is given, as `setup._mim_tokenizer`
    loads it: `--tokenizer`, else a local `--from_pretrained` folder that holds one (its vq_tokenizer_config.json);
    None when the run fits one."""
    if tokenizer is not None:
        return "--tokenizer", tokenizer
    if from_pretrained and os.path.isfile(
        os.path.join(os.path.expanduser(from_pretrained), TOKENIZER_CONFIG_NAME)
    ):
        return "--from_pretrained", from_pretrained
    return None


def _refuse_fitting_flags(d: DataArguments, explicit: frozenset[str], flag_given: str, folder: str) -> None:
    """With a tokenizer given (`--tokenizer`, or the one a `--from_pretrained` folder carries, which that run
    uses) none is fitted, so a fitting flag given as well would be ignored (and recorded in metrics.json as if
    used): refused, naming the flag and the given tokenizer's own value. The flags left at their defaults take the
    given tokenizer's values, so the run's recorded arguments say what it used."""
    try:
        with open(os.path.join(os.path.expanduser(folder), TOKENIZER_CONFIG_NAME)) as file:
            saved = parse_json(file.read())
    except (OSError, ValueError):  # not a tokenizer folder: the run names that when it loads it
        saved = {}
    saved = saved if isinstance(saved, dict) else {}
    whose = "" if flag_given == "--tokenizer" else "the checkpoint's tokenizer, which the run uses; "
    for flag, key in TOKENIZER_FITTING_FLAGS.items():
        value = saved.get(key) if key else None
        if flag in explicit:
            has = f"its {key} is {value}" if value is not None else "it is fitted already"
            raise UsageError(
                f"--{flag} {getattr(d, flag)}: applies only when a tokenizer is fitted, and {flag_given} "
                f"{folder} gives one ({whose}{has}); drop --{flag}"
            )
        if isinstance(value, int) and not isinstance(value, bool):
            setattr(d, flag, value)


def _check_given_tokenizer_fits(from_pretrained: str, flag_given: str, tokenizer_folder: str) -> None:
    """The codebook and grid the given tokenizer's vq_tokenizer_config.json records (the `flag_given` folder:
    `--tokenizer`, or the `--from_pretrained` folder's own) against the local `--from_pretrained` folder's
    config.json (`energyformers.tokenizer_fit`, no torch): a mismatch is refused while parsing, worded as the run's
    own check (`setup._masked_image_modeling_config`), which stays for what these files do not say (a Hub
    checkpoint, a `--config` on top, a tokenizer whose file records no grid)."""
    from energyformers.tokenizer_fit import (
        TokenizerMismatchError,
        check_tokenizer_fits,
        saved_tokenizer_numbers,
    )

    settings = []
    for path in (
        os.path.join(os.path.expanduser(from_pretrained), "config.json"),
        os.path.join(os.path.expanduser(tokenizer_folder), TOKENIZER_CONFIG_NAME),
    ):
        try:
            with open(path) as file:
                settings.append(parse_json(file.read()))
        except (OSError, ValueError):  # a Hub id or an unreadable file: named where the run loads it
            return
    config, saved = settings
    if not isinstance(config, dict) or not isinstance(saved, dict):
        return
    try:
        check_tokenizer_fits(*saved_tokenizer_numbers(saved), config)
    except TokenizerMismatchError as err:
        if flag_given == "--tokenizer":  # the tokenizer the user chose is the one that does not fit
            raise UsageError(
                f"--tokenizer {tokenizer_folder!r} does not fit --from_pretrained {from_pretrained!r}: {err}"
            ) from None
        raise UsageError(  # the folder's own tokenizer: another one can be given
            f"--from_pretrained {from_pretrained!r}: {err}; pass --tokenizer with the checkpoint's tokenizer"
        ) from None


def _take_attn_implementation_from_config(m: ModelArguments) -> None:
    """`--config attn_implementation=NAME` is `--attn_implementation NAME` (transformers' config kwarg of that name
    is not a field of the config); then the name is checked against the family when it is known without a model:
    `--model`, the default family, or the model_type in a local `--from_pretrained` folder's config.json."""
    kept = []
    for item in m.config:
        key, sep, value = item.partition("=")
        if sep and key.strip() == "attn_implementation":
            value = value.strip().strip('"')
            if m.attn_implementation is not None and m.attn_implementation != value:
                raise UsageError(
                    f"--attn_implementation {m.attn_implementation} and --config attn_implementation={value} "
                    "disagree; pass one of them"
                )
            m.attn_implementation = value
        else:
            kept.append(item)
    m.config = kept
    model_type = m.model
    if model_type is None and m.from_pretrained:
        try:
            with open(os.path.join(os.path.expanduser(m.from_pretrained), "config.json")) as file:
                model_type = parse_json(file.read()).get("model_type")
        except (OSError, ValueError, AttributeError):  # a Hub id or a broken folder: checked where it loads
            model_type = None
    elif model_type is None:
        model_type = "hyperset"
    check_attn_flag(m.attn_implementation, model_type or "")


# `<output_dir>.checkpoints`, beside the output folder: a run's checkpoints, its finished stage and (without
# --logging_dir) its trackers' files until the model folder is published.
WORK_SUFFIX = ".checkpoints"


def work_folder(output_dir: Path) -> Path:
    """The work folder of `output_dir` (`WORK_SUFFIX`)."""
    return output_dir.with_name(output_dir.name + WORK_SUFFIX)


def output_folder(work_dir: Path) -> Path:
    """The output folder whose work folder is `work_dir` (`work_folder`'s inverse)."""
    return work_dir.with_name(work_dir.name.removesuffix(WORK_SUFFIX))


def check_output_dir(output_dir: str, overwrite: bool, *, repaired: bool = False) -> None:
    """`--output_dir` names a folder (new, empty, or replaced with --overwrite_output_dir), never a file: a file
    there is refused whatever the flags, since replacing it with a model folder is not what anyone meant.

    Checked while the arguments are parsed (no torch yet) and again by `setup.output_paths` when the run starts,
    before and after (`repaired`) it repairs what a run killed inside `publish` left: before, a folder with such
    leftovers beside it is not refused for being taken, since the repair may put its previous folder back or
    leave it (and only it) there."""
    path = str(
        check_output_folder(
            output_dir,
            "--output_dir",
            "--overwrite_output_dir",
            overwrite=overwrite,
            repair_first=not repaired,
        )
    )
    checkpoints = str(work_folder(Path(os.path.abspath(path))))
    if os.path.lexists(checkpoints) and not os.path.isdir(checkpoints):
        raise UsageError(
            f"--output_dir {output_dir}: {checkpoints} (where its checkpoints go) is a file, not a folder; "
            "move it away or choose another --output_dir"
        )


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """["hidden_size=64", "image_size=[8,8]", "pooling=mean"] → dict; values are JSON, else strings."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config {item!r}: expected KEY=VALUE, e.g. --config hidden_size=64")
        try:
            out[key.strip()] = parse_json(value)
        except JSONNestingError as err:
            shown = item if len(item) <= SHOWN_JSON else f"{item[: SHOWN_JSON - 3]}..."
            raise UsageError(f"--config {shown}: {err}; expected KEY=VALUE with a JSON value") from None
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


def config_flags(model: ModelArguments) -> dict[str, Any]:
    """The config-field flags that were given (recurrent depth, drop path), by field name."""
    return {name: getattr(model, name) for name in CONFIG_FIELDS if getattr(model, name) is not None}


def recorded(args: Arguments) -> dict[str, Any]:
    """The parsed arguments as plain JSON values (metrics.json's record of the run)."""
    from dataclasses import asdict

    return {
        "model": asdict(args.model),
        "data": asdict(args.data),
        "run": {k: v for k, v in asdict(args.run).items() if not is_secret_name(k)},
        "augmentation": asdict(args.augmentation),
    }


# A recorded command (metrics.json, the model card, the work folder's run record) shows a secret flag's value as
# transformers' `TrainingArguments.to_dict` shows it: the card and metrics.json are uploaded by `push`.
REDACTED = "<HUB_TOKEN>"


def is_secret_name(name: str) -> bool:
    """Whether the flag or field `name` (no dashes, `_` or `-` between words) takes a secret: a token."""
    name = name.replace("-", "_")
    return name == "token" or name.endswith("_token")


def _is_secret_flag(word: str) -> bool:
    """Whether the command-line word `word` (`--flag` or `--flag=value`) is a secret flag, spelled whole or as an
    abbreviation the training parser takes (argparse's `allow_abbrev`: a prefix of one flag's name only)."""
    if not word.startswith("--"):
        return False
    name = word[2:].partition("=")[0].replace("-", "_")
    if not name:
        return False
    if is_secret_name(name):
        return True
    names = {f.name for group in DATACLASSES for f in fields(group)}
    return name not in names and any(is_secret_name(full) and full.startswith(name) for full in names)


def redacted_argv(argv: list[str]) -> list[str]:
    """`argv` with the value of each secret flag (`is_secret_name`: `--hub_token VALUE`, `--hub_token=VALUE`,
    hyphenated or abbreviated) replaced by `REDACTED`: how a command is recorded, and how `export` rewrites a
    command recorded before."""
    words: list[str] = []
    secret_next = False
    for word in argv:
        if secret_next:
            words.append(REDACTED)
            secret_next = False
        elif _is_secret_flag(word):
            flag, equals, _ = word.partition("=")
            words.append(flag + equals + REDACTED if equals else word)
            secret_next = not equals
        else:
            words.append(word)
    return words


def quiet_libraries() -> None:
    """Quiet the libraries' own progress bars (the training bar stays).

    `datasets` is not imported here (seconds of start-up): its progress bars are switched off through its
    environment variable when it is not loaded yet.
    """
    import transformers

    transformers.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()  # weight-loading/saving bars
    if "datasets" in sys.modules:  # dataset casting/saving bars are noise next to the training bar
        sys.modules["datasets"].disable_progress_bars()
    else:
        os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")


__all__ = [
    "ACCELERATE_PROG",
    "ATTN_IMPLEMENTATIONS",
    "BEST_MODEL_METRICS",
    "COLUMN_FLAGS",
    "CONFIG_FIELDS",
    "DATACLASSES",
    "DEPTH_FIELDS",
    "DEPTH_PASS",
    "FSDP_FLAGS",
    "FSDP_VARIABLE",
    "LR_SCHEDULER_TYPES",
    "NO_TRACKERS",
    "SUDOKU_DATASETS",
    "TRACKER_FOLDER",
    "TRACKER_INSTALL",
    "TRAINER_TRACKER_CHECKS",
    "WORK_SUFFIX",
    "Arguments",
    "AugmentationFlags",
    "DataArguments",
    "ModelArguments",
    "RunArguments",
    "UsageError",
    "best_model_metrics",
    "build_parser",
    "check_attn_flag",
    "check_best_model_metric",
    "check_column_flags",
    "check_logging_dir",
    "check_output_dir",
    "config_flags",
    "depth_metric",
    "output_folder",
    "parse_arguments",
    "parse_overrides",
    "quiet_libraries",
    "recorded",
    "refuse_sharding",
    "tracker_check",
    "tracker_config",
    "tracker_folder",
    "tracker_names",
    "tracker_run_name",
    "validate",
    "validate_best_model",
    "validate_trackers",
    "work_folder",
]
