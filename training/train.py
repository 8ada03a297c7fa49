"""`energyformers train`: fine-tune any registered family on a dataset with `transformers.Trainer`.

    energyformers train --model hyperset --dataset digits --output_dir runs/demo-hyperset

Everything that can be wrong with the input (model, preset, config overrides, recurrent-depth flags, dataset,
columns, labels, images, output folder) is checked before training starts and before anything is written.
Token-classification built-ins (`--dataset sudoku`, `--dataset sudoku-hard`) train the family's
`AutoModelForTokenClassification` head and report board and blank-cell accuracy.
Checkpoints go to `<output_dir>.checkpoints/` (resume with `--resume`); the finished model folder is
assembled there and renamed to `<output_dir>` in one step, so `<output_dir>` is either complete or absent.
"""

from __future__ import annotations

import argparse
import functools
import inspect
import json
import math
import os
import re
import shlex
import shutil
import signal
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

# Concise logs: silence TF/flax probes and tokenizers fork warnings before transformers is imported.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np
import torch
import transformers
from accelerate import PartialState
from transformers import (
    AutoConfig,
    DataCollatorWithPadding,
    Trainer,
    TrainerCallback,
    TrainingArguments,
    default_data_collator,
)

import energyformers

from .data import (
    BUILTIN_DATASETS,
    DataError,
    MissingDataError,
    input_type_of,
    label_names,
    load_data,
    task_of,
)
from .processing import (
    build_image_processor,
    cell_tokenizer,
    cells_transform,
    image_transform,
    text_transform,
    train_tokenizer,
)

METRICS_DIR = Path(__file__).parent / "metrics"

# Small configs used when no --preset is given, per (family, input_type). They are sized for the
# built-in datasets on a 2-core CPU (the README's main job trains digits in under ~3 minutes).
# Dataset-dependent fields (image_size/patch_size, vocab_size/max_position_embeddings, labels) are
# filled in from the data; --config key=value overrides win over everything.
DEFAULT_CONFIGS: dict[tuple[str, str], dict[str, Any]] = {
    # digits (16×16, patch 2), 12 epochs at lr 3e-3; CLS pooling learns far slower because the step sizes start
    # at zero (identity map), leaving the CLS token constant early on. The anchor energy and random depth in
    # [2, 12] make test-time depth extrapolate (benchmarks/results/recurrent_depth.md: accuracy within 1 point
    # of its T = 4 value at 2T, 4T and 10T, where the fixed-depth model falls by 29 points at 10T).
    ("hyperset", "image"): dict(
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=128,
        num_iterations=4,
        time_embedding_dim=64,
        pooling="mean",
        input_anchor=0.5,
        iteration_sampling="uniform",
        min_iterations=2,
        max_iterations=12,
    ),
    ("hyperset", "sequence"): dict(
        hidden_size=128,
        num_attention_heads=4,
        intermediate_size=256,
        num_iterations=4,
        time_embedding_dim=64,
        pooling="mean",
    ),
    # digits with the CLI's 16×16 upsampling and defaults (12 epochs): iMixer 0.975, HyperBF 0.961 (README).
    ("imixer", "image"): dict(
        hidden_size=128, num_hidden_layers=4, hidden_ratio=2.0, fixed_point_iterations=2
    ),
    ("imixer", "sequence"): dict(
        hidden_size=128, num_hidden_layers=2, hidden_ratio=2.0, fixed_point_iterations=2
    ),
    ("hyperbf", "image"): dict(hidden_size=64, num_attention_heads=4, num_hidden_layers=2),
    ("hyperbf", "sequence"): dict(hidden_size=128, num_attention_heads=4, num_hidden_layers=2),
}
# Longest tokenized text per built-in (spam e-mails are long; rotten_tomatoes sentences are ~25 tokens).
DEFAULT_MAX_LENGTH = {"spam": 256}
# Recurrent depth (shared/specs/recurrent-depth.md): CLI flags that set the config field of the same name, in
# both training loops. Default: the config's (the preset's, the checkpoint's or the class default).
DEPTH_FLAGS: dict[str, tuple[type, str]] = {
    "iteration_conditioning": (
        str,
        '"none" (one time-invariant map, extrapolates in depth; the default) or "sinusoidal" (t-conditioned, ablation)',
    ),
    "iteration_sampling": (
        str,
        'depth of each training forward: "fixed" (num_iterations), "uniform" over [min, max] or "poisson-lognormal" '
        "(mean num_iterations); every process draws the same depth per step",
    ),
    "min_iterations": (int, "smallest sampled depth"),
    "max_iterations": (int, "largest sampled depth"),
    "backprop_iterations": (
        int,
        "k: differentiate only the last k iterations (truncated backpropagation through depth)",
    ),
}


class UsageError(ValueError):
    """Bad command-line input, reported before training starts."""


# --------------------------------------------------------------------------- arguments


def model_registry() -> dict[str, energyformers.Family]:
    """Everything `--model` accepts: the families, and the baselines where `energyformers.BASELINES` exists
    (trainable here like a family; `export`/`push` take families only)."""
    return {**energyformers.FAMILIES, **getattr(energyformers, "BASELINES", {})}


def add_model_data_arguments(p: argparse.ArgumentParser) -> None:
    """Model and data flags shared by `train` and `train-accelerate`."""
    g = p.add_argument_group("model")
    g.add_argument(
        "--model",
        default=None,
        help=f"model family or baseline, one of {sorted(model_registry())} (default hyperset)",
    )
    g.add_argument("--preset", default=None, help="named paper config of the family (Config.from_preset)")
    g.add_argument(
        "--config", nargs="*", default=[], metavar="KEY=VALUE", help="config overrides; values parsed as JSON"
    )
    g.add_argument("--from_pretrained", default=None, metavar="DIR_OR_REPO", help="fine-tune this checkpoint")
    g = p.add_argument_group(
        "recurrent depth (Hyper-SET and the looped-Transformer baseline; default: the config's)"
    )
    for name, (kind, help_) in DEPTH_FLAGS.items():  # SUPPRESS: absent unless given (help shows no "None")
        g.add_argument(f"--{name}", type=kind, default=argparse.SUPPRESS, help=help_)
    g = p.add_argument_group("data")
    g.add_argument(
        "--dataset",
        default="digits",
        help=f"built-in ({', '.join(BUILTIN_DATASETS)}), local folder/file, or Hub dataset name",
    )
    g.add_argument("--image_column", default=None)
    g.add_argument("--text_column", default=None)
    g.add_argument("--label_column", default=None)
    g.add_argument("--max_train_samples", type=int, default=None, help="use the first N training examples")
    g.add_argument("--max_eval_samples", type=int, default=None)
    g.add_argument("--max_test_samples", type=int, default=None)
    g.add_argument("--max_length", type=int, default=None, help="text: max tokens (default 128; spam 256)")
    g.add_argument(
        "--vocab_size", type=int, default=8000, help="text: size of the tokenizer trained on train"
    )


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="energyformers train",
        description="Fine-tune a Hyper-SET / iMixer / HyperBF model with transformers.Trainer.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_data_arguments(p)
    g = p.add_argument_group("training")
    g.add_argument("--output_dir", required=True)
    g.add_argument("--overwrite_output_dir", action="store_true", help="replace an existing output folder")
    g.add_argument(
        "--num_train_epochs", "--epochs", type=float, default=None, help="default 12 for images, 5 for text"
    )
    g.add_argument(
        "--max_steps", type=int, default=-1, help="stop after N optimizer steps (overrides epochs)"
    )
    g.add_argument("--per_device_train_batch_size", "--batch_size", type=int, default=64)
    g.add_argument("--per_device_eval_batch_size", type=int, default=256)
    g.add_argument(
        "--learning_rate",
        "--lr",
        type=float,
        default=None,
        help="default 3e-3 from scratch, 5e-4 fine-tuning",
    )
    g.add_argument("--lr_scheduler_type", default="cosine")
    g.add_argument("--warmup_steps", type=float, default=0.05, help="int steps, or a float < 1 as a fraction")
    g.add_argument("--weight_decay", type=float, default=0.05)
    g.add_argument("--max_grad_norm", type=float, default=1.0)
    g.add_argument("--adam_beta1", type=float, default=0.9, help="AdamW β1 (the paper's Sudoku recipe: 0)")
    g.add_argument(
        "--adam_beta2", type=float, default=0.999, help="AdamW β2 (the paper's Sudoku recipe: 0.95)"
    )
    g.add_argument("--label_smoothing_factor", type=float, default=0.0)
    g.add_argument("--gradient_accumulation_steps", type=int, default=1)
    g.add_argument("--seed", type=int, default=42)
    g.add_argument(
        "--bf16", action="store_true", help="bfloat16 autocast (error where the device lacks bf16)"
    )
    g.add_argument("--gradient_checkpointing", action="store_true")
    g.add_argument(
        "--torch_compile",
        action="store_true",
        help="torch.compile the model (TrainingArguments.torch_compile)",
    )
    g.add_argument("--eval_strategy", default=None, choices=["no", "steps", "epoch"], help="default epoch")
    g.add_argument("--eval_steps", type=int, default=None)
    g.add_argument("--save_strategy", default=None, choices=["no", "steps", "epoch"], help="default: as eval")
    g.add_argument("--save_steps", type=int, default=None)
    g.add_argument("--save_total_limit", type=int, default=2)
    g.add_argument("--logging_steps", type=int, default=None, help="default: ~10 log lines per run")
    g.add_argument("--dataloader_num_workers", type=int, default=0)
    g.add_argument(
        "--num_threads", type=int, default=None, help="torch CPU threads (1 is faster on a busy machine)"
    )
    g.add_argument(
        "--resume", action="store_true", help="continue from the last checkpoint of an interrupted run"
    )
    g.add_argument(
        "--keep_checkpoints", action="store_true", help="keep <output_dir>.checkpoints after success"
    )
    g.add_argument("--disable_tqdm", action="store_true", help="no progress bars (log lines instead)")
    g.add_argument("--num_predictions", type=int, default=5, help="pipeline predictions printed at the end")
    g = p.add_argument_group("hub (real network; tests use a local stand-in)")
    g.add_argument("--push_to_hub", action="store_true")
    g.add_argument("--hub_model_id", default=None)
    g.add_argument("--hub_private_repo", action="store_true")
    g.add_argument("--hub_token", default=None)
    return p


def parse_overrides(items: list[str]) -> dict[str, Any]:
    """["hidden_size=64", "image_size=[8,8]", "pooling=mean"] → dict; values are JSON, else strings."""
    out = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not sep or not key.strip():
            raise UsageError(f"--config {item!r}: expected KEY=VALUE, e.g. --config hidden_size=64")
        try:
            out[key.strip()] = json.loads(value)
        except json.JSONDecodeError:
            out[key.strip()] = value
    return out


# --------------------------------------------------------------------------- setup


@dataclass
class Setup:
    """Everything `Trainer` needs, built and validated before any file is written."""

    args: argparse.Namespace
    training_args: TrainingArguments
    model: transformers.PreTrainedModel
    data: Any  # DatasetDict with transforms attached
    processor: Any  # image processor or tokenizer
    collator: Any
    task: str
    output_dir: Path
    work_dir: Path
    resume_from: str | None


def _family(model_type: str) -> energyformers.Family:
    registry = model_registry()
    if model_type not in registry:
        raise UsageError(f"--model {model_type!r} is not available; registered models are {sorted(registry)}")
    return registry[model_type]


def depth_flags(args: argparse.Namespace) -> dict[str, Any]:
    """The recurrent-depth flags given on the command line, by config field."""
    return {name: getattr(args, name) for name in DEPTH_FLAGS if hasattr(args, name)}


def depth_overrides(args: argparse.Namespace, config_class: type, model_type: str) -> dict[str, Any]:
    """The recurrent-depth flags that were given, as config fields; a `UsageError` naming the flag for a model
    without that field (iMixer, HyperBF) or when `--config` sets the same field to something else."""
    given = depth_flags(args)
    for name, value in given.items():
        if not _accepts(config_class, name):
            having = sorted(m for m, f in model_registry().items() if _accepts(f.config_class, name))
            raise UsageError(
                f"--{name} {value}: {model_type} has no recurrent depth to configure ({config_class.__name__} has "
                f"no {name} field); it applies to {having}. Drop the flag."
            )
    overrides = parse_overrides(args.config)
    for name, value in given.items():
        if name in overrides and overrides[name] != value:
            raise UsageError(
                f"--{name} {value} and --config {name}={overrides[name]} disagree; pass one of them"
            )
    return given


def _config_error(err: Exception, depth: dict[str, Any], what: str) -> UsageError:
    """A config validation error as a usage error naming the flag behind the field it names, if a flag set it."""
    message = str(err)
    related = {"min_iterations": ("min_iterations", "max_iterations")}
    related["max_iterations"] = related["min_iterations"]
    for field in DEPTH_FLAGS:
        if f"invalid {field}=" in message:
            flags = [f"--{name} {depth[name]}" for name in related.get(field, (field,)) if name in depth]
            if flags:
                return UsageError(f"invalid {' and '.join(flags)}: {message}")
    return UsageError(f"invalid {what}: {message}")


def auto_head(input_type: str, task: str) -> type:
    """The transformers Auto class of `task`'s head for `input_type` inputs (`energyformers.INPUT_TYPES`)."""
    return getattr(transformers, energyformers.INPUT_TYPES[input_type].tasks[task])


def auto_processor(input_type: str) -> type:
    """The transformers Auto class that loads the saved processor of `input_type` inputs."""
    return getattr(transformers, energyformers.INPUT_TYPES[input_type].processor_class)


def processor_keyword(input_type: str) -> str:
    """`transformers.pipeline`'s keyword for that processor: AutoImageProcessor → image_processor, AutoTokenizer → tokenizer."""
    name = energyformers.INPUT_TYPES[input_type].processor_class.removeprefix("Auto")
    return re.sub(r"(?<!^)(?=[A-Z])", "_", name).lower()


def _check_override_keys(config_class: type, overrides: dict[str, Any]) -> None:
    # PreTrainedConfig swallows unknown kwargs as attributes; a typo in --config must not be silently ignored.
    known = set(inspect.signature(config_class.__init__).parameters) | set(
        transformers.PreTrainedConfig().to_dict()
    )
    unknown = sorted(set(overrides) - known)
    if unknown:
        allowed = sorted(
            k for k in inspect.signature(config_class.__init__).parameters if k not in ("self", "kwargs")
        )
        raise UsageError(
            f"--config {unknown}: not fields of {config_class.__name__}; its fields are {allowed}"
        )


def _accepts(config_class: type, key: str) -> bool:
    return key in inspect.signature(config_class.__init__).parameters


def _image_geometry(data: Any) -> dict[str, Any]:
    """Native image size of the dataset → image_size/patch_size giving ≤ 64 patch tokens."""
    width, height = data["train"][0]["image"].size
    side = max(height, width)
    if side <= 16:
        return {"image_size": 16, "patch_size": 2}  # digits: 8×8 upsampled → 64 tokens (0.98 vs 0.89 at 8×8)
    if side <= 32:
        return {"image_size": 4 * math.ceil(side / 4), "patch_size": 4}  # 28×28 → 49 tokens of 4×4
    return {"image_size": 32, "patch_size": 4}


def _load_and_check_data(args: argparse.Namespace, state: PartialState) -> Any:
    with state.local_main_process_first():  # one rank per machine builds the Arrow cache
        data = load_data(
            args.dataset,
            image_column=args.image_column,
            text_column=args.text_column,
            label_column=args.label_column,
            seed=0,
        )
    for split, limit in (
        ("train", args.max_train_samples),
        ("validation", args.max_eval_samples),
        ("test", args.max_test_samples),
    ):
        if limit is not None:
            if limit < 1:
                raise UsageError(f"--max_{split}_samples={limit}: expected >= 1")
            data[split] = data[split].select(range(min(limit, len(data[split]))))
    if input_type_of(data) == "image":
        for i in range(min(8, len(data["train"]))):  # decode a few now: broken files fail here, not mid-epoch
            try:
                data["train"][i]["image"].load()
            except Exception as err:
                raise DataError(f"training image {i} of {args.dataset!r} cannot be decoded: {err}") from err
    return data


def _share_tokenizer(tokenizer: Any, state: PartialState) -> Any:
    """With several processes, rank 0's tokenizer is the one every rank uses (training is not bit-reproducible)."""
    if state.num_processes == 1 or not torch.distributed.is_initialized():
        return tokenizer
    payload = [tokenizer.backend_tokenizer.to_str() if state.is_main_process else None]
    torch.distributed.broadcast_object_list(payload, src=0)
    from tokenizers import Tokenizer

    tokenizer._tokenizer = Tokenizer.from_str(payload[0])
    return tokenizer


def _build_config_and_processor(args: argparse.Namespace, data: Any, state: PartialState) -> tuple[Any, Any]:
    task = task_of(data)
    modality = input_type_of(data)
    names = label_names(data)
    labels = {"id2label": dict(enumerate(names)), "label2id": {n: i for i, n in enumerate(names)}}
    overrides = parse_overrides(args.config)
    if overrides.get("input_type", modality) != modality:
        raise UsageError(
            f"--config input_type={overrides['input_type']!r} but {args.dataset!r} is a {task} dataset"
        )

    if args.from_pretrained:
        if args.preset:
            raise UsageError(
                "--preset and --from_pretrained exclude each other (the checkpoint has its config)"
            )
        try:
            config = AutoConfig.from_pretrained(args.from_pretrained)
        except (OSError, ValueError) as err:
            raise UsageError(
                f"--from_pretrained {args.from_pretrained!r}: cannot load a config ({err})"
            ) from err
        if args.model and args.model != config.model_type:
            raise UsageError(
                f"--model {args.model} but {args.from_pretrained!r} is a {config.model_type!r} checkpoint"
            )
        if getattr(config, "input_type", None) != modality:
            raise UsageError(
                f"{args.from_pretrained!r} takes input_type={getattr(config, 'input_type', None)!r}, "
                f"but {args.dataset!r} is a {task} dataset"
            )
        if modality == "image":
            try:
                processor = auto_processor(modality).from_pretrained(args.from_pretrained, backend="pil")
            except (OSError, ValueError):
                processor = build_image_processor(config)
        else:
            try:
                processor = auto_processor(modality).from_pretrained(args.from_pretrained)
            except (OSError, ValueError) as err:
                raise UsageError(
                    f"{args.from_pretrained!r} has no tokenizer; a text checkpoint must ship the tokenizer its "
                    "embeddings were trained with"
                ) from err
        _check_override_keys(type(config), overrides)
        depth = depth_overrides(args, type(config), config.model_type)
        try:  # re-validate the merged config
            config = type(config)(**{**config.to_dict(), **overrides, **depth, **labels})
        except (TypeError, ValueError) as err:
            raise _config_error(err, depth, f"--config for {config.model_type}") from err
        return config, processor

    model_type = args.model or "hyperset"
    family = _family(model_type)
    config_class = family.config_class
    head = energyformers.INPUT_TYPES[modality].tasks[task]
    if head not in family.heads:
        having = sorted(m for m, f in model_registry().items() if head in f.heads)
        raise UsageError(
            f"--dataset {args.dataset} is a {task} dataset and {model_type} has no {task} head; use one of {having}"
        )
    depth = depth_overrides(args, config_class, model_type)
    fields: dict[str, Any] = {"input_type": modality}
    if not args.preset:
        fields.update(_default_config(model_type, modality))
    processor = None
    if task == "token-classification":  # the cells are the ids: a fixed tokenizer, nothing to train
        processor = cell_tokenizer(len(data["train"][0]["input_ids"]))
        fields.update(vocab_size=len(processor), max_position_embeddings=processor.model_max_length)
        if not args.preset and _accepts(config_class, "position_embedding_type"):
            fields["position_embedding_type"] = "learned"  # a fixed 81-cell layout, as the sudoku preset
    elif modality == "image":
        if not args.preset:
            fields.update({k: v for k, v in _image_geometry(data).items() if _accepts(config_class, k)})
        fields["num_channels"] = 3
    else:
        max_length = (
            overrides.get("max_position_embeddings")
            or args.max_length
            or DEFAULT_MAX_LENGTH.get(args.dataset, 128)
        )
        if state.is_main_process:
            print(
                f"training a WordPiece tokenizer (vocab {args.vocab_size}) on {len(data['train'])} texts",
                flush=True,
            )
        processor = train_tokenizer(data["train"]["text"], vocab_size=args.vocab_size, max_length=max_length)
        processor = _share_tokenizer(processor, state)
        fields.update(
            vocab_size=len(processor), max_position_embeddings=max_length, pad_token_id=processor.pad_token_id
        )
    fields.update(overrides)
    fields.update(depth)
    fields.update(labels)
    _check_override_keys(config_class, overrides)
    try:
        config = config_class.from_preset(args.preset, **fields) if args.preset else config_class(**fields)
    except (TypeError, ValueError) as err:  # the config's own validation names the field and what is allowed
        raise _config_error(err, depth, f"--preset/--config for {model_type}") from err
    if processor is None:
        processor = build_image_processor(config)
    return config, processor


def _default_config(model_type: str, modality: str) -> dict[str, Any]:
    """The small CLI config of (model, input type); a baseline without its own entry gets Hyper-SET's sizes for
    the fields it shares (same embeddings, head and iteration count: side-by-side comparisons)."""
    if (model_type, modality) in DEFAULT_CONFIGS:
        return dict(DEFAULT_CONFIGS[model_type, modality])
    if model_type in getattr(energyformers, "BASELINES", {}):
        config_class = model_registry()[model_type].config_class
        return {k: v for k, v in DEFAULT_CONFIGS["hyperset", modality].items() if _accepts(config_class, k)}
    return {}


def default_epochs(task: str) -> int:
    return 12 if task == "image-classification" else 5


def build_model_and_data(args: argparse.Namespace, state: PartialState) -> tuple[Any, Any, Any, Any, str]:
    """Dataset (with preprocessing attached), processor, collator and model from the model/data flags.

    Shared by the Trainer CLI and the Accelerate loop; `state` is the (already initialised) process state.
    Runs one real batch through the model so mismatches surface here, before any training or writing.
    """
    data = _load_and_check_data(args, state)
    task = task_of(data)
    config, processor = _build_config_and_processor(args, data, state)
    transformers.set_seed(args.seed)  # same initial weights on every rank and every rerun
    head = auto_head(config.input_type, task)
    if args.from_pretrained:
        model = head.from_pretrained(args.from_pretrained, config=config, ignore_mismatched_sizes=True)
    else:
        model = head.from_config(config)
    if task == "token-classification":
        transform, collator = cells_transform(), default_data_collator
    elif config.input_type == "image":
        transform = image_transform(processor)
        collator = default_data_collator
    else:
        transform = text_transform(processor, config.max_position_embeddings)
        collator = DataCollatorWithPadding(processor)
    for split in data:
        data[split].set_transform(transform)
    try:  # the real preprocessing + forward on two examples: wrong sizes/ids fail now, not after an epoch
        batch = collator([data["train"][i] for i in range(min(2, len(data["train"])))])
        with torch.no_grad():
            model.eval()(**{k: v for k, v in batch.items() if k != "labels"})
    except Exception as err:
        raise DataError(f"a training batch does not fit the model: {err}") from err
    model.train()
    return model, data, processor, collator, task


def check_adam_betas(args: argparse.Namespace) -> None:
    """`--adam_beta1/--adam_beta2` in [0, 1), as AdamW requires; checked before anything is written."""
    for name in ("adam_beta1", "adam_beta2"):
        value = getattr(args, name)
        if not 0.0 <= value < 1.0:
            raise UsageError(f"--{name}={value}: expected 0 <= value < 1")


def _paths(args: argparse.Namespace) -> tuple[Path, Path, str | None]:
    output_dir = Path(args.output_dir).expanduser().resolve()
    work_dir = output_dir.with_name(output_dir.name + ".checkpoints")
    if output_dir.exists() and any(output_dir.iterdir()) and not args.overwrite_output_dir:
        raise UsageError(
            f"output folder {output_dir} exists and is not empty; pass --overwrite_output_dir or choose another"
        )
    resume_from = None
    checkpoints = sorted(
        (p for p in work_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()),
        key=lambda p: int(p.name.split("-")[-1]),
    )
    if args.resume:
        if not checkpoints:
            raise UsageError(f"--resume: no checkpoint in {work_dir}; run without --resume to start training")
        resume_from = str(checkpoints[-1])
    elif checkpoints:
        raise UsageError(
            f"{work_dir} holds checkpoints of an interrupted run; pass --resume to continue it or delete the folder"
        )
    return output_dir, work_dir, resume_from


def _training_arguments(args: argparse.Namespace, work_dir: Path) -> TrainingArguments:
    device_type = "cuda" if torch.cuda.is_available() else "cpu"
    if args.bf16:
        from transformers.utils.import_utils import is_torch_bf16_available_on_device

        if not is_torch_bf16_available_on_device(device_type):
            raise UsageError(f"--bf16: this {device_type} has no bfloat16 support; train without --bf16")
    eval_strategy = args.eval_strategy or ("steps" if args.max_steps > 0 else "epoch")
    return TrainingArguments(
        output_dir=str(work_dir),
        num_train_epochs=args.num_train_epochs
        if args.num_train_epochs is not None
        else 1,  # set in prepare()
        max_steps=args.max_steps,
        per_device_train_batch_size=args.per_device_train_batch_size,
        per_device_eval_batch_size=args.per_device_eval_batch_size,
        learning_rate=args.learning_rate
        if args.learning_rate is not None
        else (5e-4 if args.from_pretrained else 3e-3),
        lr_scheduler_type=args.lr_scheduler_type,
        warmup_steps=args.warmup_steps,
        weight_decay=args.weight_decay,
        max_grad_norm=args.max_grad_norm,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        label_smoothing_factor=args.label_smoothing_factor,
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        seed=args.seed,
        bf16=args.bf16,
        torch_compile=args.torch_compile,
        use_cpu=device_type == "cpu",
        activation_checkpointing=args.gradient_checkpointing,  # v5 name of gradient_checkpointing
        eval_strategy=eval_strategy,
        eval_steps=args.eval_steps or (max(1, args.max_steps // 4) if args.max_steps > 0 else None),
        save_strategy=args.save_strategy or eval_strategy,
        save_steps=args.save_steps
        or args.eval_steps
        or (max(1, args.max_steps // 4) if args.max_steps > 0 else 500),
        save_total_limit=args.save_total_limit,
        logging_strategy="steps",
        logging_steps=args.logging_steps or 10,  # replaced by ~1/10 of the run in prepare()
        dataloader_num_workers=args.dataloader_num_workers,
        remove_unused_columns=False,  # the set_transform columns are produced on the fly
        disable_tqdm=args.disable_tqdm,
        report_to="none",
    )


def prepare(args: argparse.Namespace) -> Setup:
    """Validate every input and build model, data and Trainer arguments; writes nothing to the output."""
    if args.model is not None and not args.from_pretrained:
        _family(args.model)
    for name in ("per_device_train_batch_size", "per_device_eval_batch_size", "gradient_accumulation_steps"):
        if getattr(args, name) < 1:
            raise UsageError(f"--{name}={getattr(args, name)}: expected >= 1")
    if args.push_to_hub and not args.hub_model_id:
        raise UsageError("--push_to_hub needs --hub_model_id ORG/NAME")
    check_adam_betas(args)
    output_dir, work_dir, resume_from = _paths(args)
    training_args = _training_arguments(args, work_dir)  # sets up the process group; writes no files
    built = build_model_and_data(args, PartialState())
    model, data, processor, collator, task = built
    if args.num_train_epochs is None:
        training_args.num_train_epochs = default_epochs(task)
    if args.gradient_checkpointing and not model.supports_gradient_checkpointing:
        raise UsageError(f"--gradient_checkpointing: {type(model).__name__} does not support it")

    steps_per_epoch = math.ceil(
        len(data["train"])
        / (args.per_device_train_batch_size * args.gradient_accumulation_steps * training_args.world_size)
    )
    total = (
        args.max_steps if args.max_steps > 0 else math.ceil(steps_per_epoch * training_args.num_train_epochs)
    )
    if args.logging_steps is None:
        training_args.logging_steps = max(1, total // 10)
    return Setup(
        args, training_args, model, data, processor, collator, task, output_dir, work_dir, resume_from
    )


# --------------------------------------------------------------------------- metrics and outputs


@functools.cache
def _metric(name: str) -> Any:
    import evaluate  # loaded by local path: works offline, never reaches the Hub

    return evaluate.load(str(METRICS_DIR / name / f"{name}.py"))


def task_metrics(task: str, predictions: Any, references: Any) -> dict[str, float]:
    """The metrics of `task` from predicted and true class ids (numpy), shared by both training loops.

    Classification: `accuracy` and `f1_macro`. Token classification (Sudoku: labels −100 on given cells):
    `blank_cell_accuracy`, the fraction of labelled (blank) cells predicted right, and `board_accuracy`, the
    fraction of sequences (boards) with every labelled cell right.
    """
    predictions, references = np.asarray(predictions), np.asarray(references)
    if task == "token-classification":
        labelled = references != -100
        hits = (predictions == references) & labelled
        return {
            "blank_cell_accuracy": float(hits.sum() / max(int(labelled.sum()), 1)),
            "board_accuracy": float((hits.sum(1) == labelled.sum(1)).mean()),
        }
    if predictions.ndim > 1:
        predictions = predictions.argmax(-1)
    f1 = _metric("f1").compute(predictions=predictions, references=references, average="macro")
    return {
        "accuracy": _metric("accuracy").compute(predictions=predictions, references=references)["accuracy"],
        "f1_macro": f1["f1"],
    }


def primary_metric(task: str) -> str:
    """The accuracy-like metric plotted next to the loss curve."""
    return "blank_cell_accuracy" if task == "token-classification" else "accuracy"


def summary(task: str, metrics: dict[str, float]) -> str:
    """The one-line result printed at the end of both loops (and quoted in the Accelerate model card)."""
    if task == "token-classification":
        return (
            f"board accuracy {metrics['board_accuracy']:.4f}  "
            f"blank-cell accuracy {metrics['blank_cell_accuracy']:.4f}"
        )
    return f"accuracy {metrics['accuracy']:.4f}  macro-F1 {metrics['f1_macro']:.4f}"


def data_summary(data: Any) -> dict[str, str] | None:
    """For grid puzzles (a `givens` column): the distribution of given cells per split (shared/specs/data.md)."""
    if "givens" not in data["train"].column_names:
        return None
    from .sudoku import format_givens_counts

    return {split: format_givens_counts(ds.with_format(None)["givens"]) for split, ds in data.items()}


def continue_iteration_draws(model: Any, global_step: int, gradient_accumulation_steps: int) -> None:
    """On (re)start, set the depth draw counter of a recurrent-depth backbone (`iteration_draws`, one draw per
    training forward) to the forwards done by `global_step` optimizer steps, so a resumed run continues the
    sequence of sampled depths where it stopped. Every process sets the same value: ranks stay in lock-step."""
    backbone = getattr(model, "base_model", model)
    if hasattr(backbone, "iteration_draws"):
        backbone.iteration_draws = global_step * gradient_accumulation_steps


class ContinueIterationDraws(TrainerCallback):
    """`continue_iteration_draws` when `Trainer` starts (the global step is already restored on `--resume`)."""

    def on_train_begin(self, args: Any, state: Any, control: Any, model: Any = None, **kwargs: Any) -> None:
        continue_iteration_draws(model, state.global_step, args.gradient_accumulation_steps)


def compute_metrics_fn(task: str) -> Any:
    def compute_metrics(eval_pred: Any) -> dict[str, float]:
        predictions, references = eval_pred.predictions, eval_pred.label_ids
        if isinstance(predictions, tuple):
            predictions = predictions[0]
        return task_metrics(task, predictions, references)

    return compute_metrics


def _argmax_logits(logits: Any, labels: Any) -> torch.Tensor:
    # Keep only predicted ids during evaluation instead of all logits (memory on 10k-example test sets).
    return (logits[0] if isinstance(logits, tuple) else logits).argmax(-1)


def plot_training_curve(
    log_history: list[dict[str, Any]], path: Path, title: str, metric: str = "accuracy"
) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(h["step"], h["loss"]) for h in log_history if "loss" in h]
    evals = [(h["step"], h["eval_loss"], h.get(f"eval_{metric}")) for h in log_history if "eval_loss" in h]
    fig, ax = plt.subplots(figsize=(6, 3.6))
    if train:
        ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    if evals and evals[0][2] is not None:
        acc = ax.twinx()
        acc.plot(
            [e[0] for e in evals], [e[2] for e in evals], "s--", color="tab:green", label=f"eval {metric}"
        )
        acc.set_ylabel(metric.replace("_", " "))
        acc.legend(loc="center right")
    ax.legend(loc="upper right")
    ax.set_title(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


class _StopOnSigterm(TrainerCallback):
    """SIGTERM (preemption, Ctrl-C of a scheduler) → save a checkpoint at the end of this step and stop."""

    def __init__(self) -> None:
        self.received = False

    def handler(self, signum: int, frame: Any) -> None:
        self.received = True

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.received:
            control.should_save = True
            control.should_training_stop = True


def _print_predictions(output_dir: Path, data: Any, task: str, count: int) -> None:
    """Reload the saved folder through the Auto classes and show `pipeline` predictions."""
    if count <= 0:
        return
    input_type = input_type_of(data)
    model = auto_head(input_type, task).from_pretrained(output_dir)
    processor = auto_processor(input_type).from_pretrained(output_dir)
    pipe = transformers.pipeline(task, model=model, **{processor_keyword(input_type): processor})
    test = data["test"].with_format(None)  # raw images/texts, without the training transform
    if task == "token-classification":  # a grid puzzle as its string of cells, one predicted label per cell
        print(f"pipeline({task!r}) on the reloaded {output_dir.name}:")
        for i in range(min(count, len(test))):
            row = test[i]
            puzzle = "".join(str(v) for v in row["input_ids"])
            predicted = [model.config.label2id[out["entity"]] for out in pipe(puzzle)]
            blanks = [(p, y) for p, y in zip(predicted, row["labels"]) if y != -100]
            right = sum(p == y for p, y in blanks)
            solved = "  solved" if right == len(blanks) else ""
            print(f"  test[{i}]  {puzzle}  blanks right: {right}/{len(blanks)}{solved}")
        return
    names = test.features["label"].names
    rows = [test[i] for i in range(min(count, len(test)))]
    inputs = [row["image" if input_type == "image" else "text"] for row in rows]
    outputs = pipe(inputs, **({"truncation": True} if task == "text-classification" else {}))
    print(f"pipeline({task!r}) on the reloaded {output_dir.name}:")
    for i, (row, out) in enumerate(zip(rows, outputs)):
        top = out[0] if isinstance(out, list) else out
        shown = "" if input_type == "image" else f"  {row['text'][:60]!r}"
        print(
            f"  test[{i}]  true: {names[row['label']]:<12} predicted: {top['label']:<12} p={top['score']:.3f}{shown}"
        )


def _publish(stage: Path, output_dir: Path) -> None:
    """Atomically replace `output_dir` with the finished `stage` folder (same filesystem)."""
    old = None
    if output_dir.exists():
        old = output_dir.with_name(f".{output_dir.name}.old-{os.getpid()}")
        output_dir.rename(old)
    stage.rename(output_dir)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


# --------------------------------------------------------------------------- main


def run(argv: list[str], callbacks: list[TrainerCallback] | None = None) -> int:
    start = time.time()
    args = build_parser().parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    setup = prepare(args)
    ta = setup.training_args
    main_process = ta.process_index == 0
    if main_process:
        n = sum(p.numel() for p in setup.model.parameters())
        print(
            f"{setup.model.config.model_type} {type(setup.model).__name__}: {n:,} parameters; {args.dataset}: "
            + ", ".join(f"{k} {len(v)}" for k, v in setup.data.items()),
            flush=True,
        )
    stopper = _StopOnSigterm()
    if ta.world_size == 1:  # with DDP a rank stopping alone would hang the others in all-reduce
        signal.signal(signal.SIGTERM, stopper.handler)
    with PartialState().local_main_process_first():  # evaluate copies the scripts into its module cache
        metrics_fn = compute_metrics_fn(setup.task)
        _metric("accuracy"), _metric("f1")
    trainer = Trainer(
        model=setup.model,
        args=ta,
        train_dataset=setup.data["train"],
        eval_dataset=setup.data["validation"],
        processing_class=setup.processor,
        data_collator=setup.collator,
        compute_metrics=metrics_fn,
        preprocess_logits_for_metrics=_argmax_logits,
        callbacks=[ContinueIterationDraws(), stopper, *(callbacks or [])],
    )
    train_result = trainer.train(resume_from_checkpoint=setup.resume_from)
    if stopper.received:
        if main_process:
            print(
                f"stopped by SIGTERM at step {trainer.state.global_step}; checkpoint saved in {setup.work_dir}. "
                f"Continue with the same command plus --resume.",
                file=sys.stderr,
            )
        return 128 + signal.SIGTERM

    eval_metrics = trainer.evaluate(setup.data["validation"], metric_key_prefix="eval")
    test_metrics = trainer.evaluate(setup.data["test"], metric_key_prefix="test")
    stage = setup.work_dir / "final"
    if main_process:
        shutil.rmtree(stage, ignore_errors=True)
    trainer.save_model(str(stage))  # model.safetensors + config.json + processor/tokenizer files
    if main_process:
        (stage / "training_args.bin").unlink(missing_ok=True)  # a pickle; the recipe is in metrics.json
        dataset_name = args.dataset if args.dataset in BUILTIN_DATASETS else Path(args.dataset).name
        if (
            not args.from_pretrained
        ):  # an existing folder stops the card from inferring a bogus "fine-tuned from"
            setup.model.config._name_or_path = str(setup.work_dir)
        trainer.create_model_card(
            model_name=setup.output_dir.name,
            finetuned_from=args.from_pretrained,
            tasks=setup.task,
            dataset_tags=dataset_name,
            dataset=dataset_name,
        )
        card = (setup.work_dir / "README.md").read_text()
        if args.from_pretrained and Path(args.from_pretrained).exists():  # a local folder is no Hub link
            source = args.from_pretrained
            card = card.replace(f"[{source}](https://huggingface.co/{source})", f"`{Path(source).name}`")
        (stage / "README.md").write_text(card)
        (setup.work_dir / "README.md").unlink()
        plot_training_curve(
            trainer.state.log_history,
            stage / "training_curve.png",
            f"{setup.model.config.model_type} on {dataset_name}",
            primary_metric(setup.task),
        )
        strip = lambda metrics, prefix: {k.removeprefix(prefix): v for k, v in metrics.items()}  # noqa: E731
        metrics = {
            "model": setup.model.config.model_type,
            "preset": args.preset,
            "dataset": args.dataset,
            "task": setup.task,
            "num_parameters": sum(p.numel() for p in setup.model.parameters()),
            "recipe": {
                "command": "energyformers train " + shlex.join(argv),
                "epochs": float(ta.num_train_epochs),
                "learning_rate": ta.learning_rate,
                "batch_size": args.per_device_train_batch_size,
                "seed": args.seed,
                "max_steps": args.max_steps if args.max_steps > 0 else None,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "adam_betas": [ta.adam_beta1, ta.adam_beta2],
                "torch_compile": ta.torch_compile,
                "bf16": ta.bf16,
                "world_size": ta.world_size,
                "global_step": trainer.state.global_step,
                "config_overrides": parse_overrides(args.config),
                "depth_flags": depth_flags(args),
                "from_pretrained": args.from_pretrained,
                "resumed_from": setup.resume_from,
            },
            "data": data_summary(setup.data),
            "train": train_result.metrics,
            "eval": strip(eval_metrics, "eval_"),
            "test": strip(test_metrics, "test_"),
            "wall_time_s": round(time.time() - start, 2),
        }
        (stage / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        for path in stage.iterdir():  # safetensors writes 0600 temp files; a model folder is for sharing
            path.chmod(0o644)
        _publish(stage, setup.output_dir)
        if not args.keep_checkpoints:
            shutil.rmtree(setup.work_dir, ignore_errors=True)
        print(
            f"test {summary(setup.task, metrics['test'])}  ({metrics['wall_time_s']:.0f} s) → {setup.output_dir}",
            flush=True,
        )
        _print_predictions(setup.output_dir, setup.data, setup.task, args.num_predictions)
        if args.push_to_hub:
            from .push import push_model_dir  # lazily: the Hub stack is only needed here

            url = push_model_dir(
                setup.output_dir, args.hub_model_id, private=args.hub_private_repo, token=args.hub_token
            )
            print(f"pushed to {url}")
    trainer.accelerator.wait_for_everyone()
    return 0


def run_cli(command: str, run_command: Any, *args: Any) -> int:
    """Quiet the libraries' own progress bars (Trainer's bar stays) and turn input errors into status 2."""
    transformers.logging.set_verbosity_warning()
    transformers.utils.logging.disable_progress_bar()  # weight-loading/saving bars
    import datasets

    datasets.disable_progress_bars()  # dataset casting/saving bars are noise next to the training bar
    try:
        return run_command(*args)
    except (UsageError, DataError) as err:
        hint = f"\n  install: {err.install_command}" if isinstance(err, MissingDataError) else ""
        print(f"energyformers {command}: error: {err}{hint}", file=sys.stderr)
        return 2


def main(argv: list[str] | None = None, *, callbacks: list[TrainerCallback] | None = None) -> int:
    """CLI entry point; `callbacks` are extra `TrainerCallback`s (used by tests and for custom hooks)."""
    return run_cli("train", run, list(sys.argv[1:] if argv is None else argv), callbacks)


if __name__ == "__main__":
    raise SystemExit(main())
