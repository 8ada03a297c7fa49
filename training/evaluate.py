"""`energyformers evaluate MODEL --dataset D`: score a saved classifier on a split of a labelled dataset.

    energyformers evaluate runs/demo-hyperset --dataset digits
    energyformers evaluate runs/demo-hyperset --dataset digits --split validation --eval_iterations 2 4 8 16
    energyformers evaluate runs/sudoku-hyperset --dataset sudoku --max_samples 200 --json --output_file eval.json

transformers' `run_*.py --model_name_or_path MODEL --do_eval` without `--do_train`, for the models of this package:
the dataset is loaded, its columns detected and its examples preprocessed exactly as `energyformers train` does for
its validation and test splits (`data.load_data`, `setup.preprocessing`, with the processor saved in MODEL), and
the split is scored by `transformers.Trainer.evaluate` with the training loops' metrics (`evaluation.TrainerMetrics`):
loss, accuracy and macro-F1 for classification, blank-cell and board accuracy for Sudoku. The metric keys carry
Trainer's `metric_key_prefix` of the split, as the training run names them: `eval_` for validation, `test_` for
test, `train_eval_` for train (`eval_accuracy`, `test_board_accuracy`, `train_eval_loss`, ...: a run's own
`train_loss` is its running training loss, another number). `--eval_iterations T ...` adds the primary
metric at each iteration count T (`<prefix>_<metric>_iterations_<T>`, `evaluation.depth_metrics`, as
`train --eval_iterations` logs it); `--num_iterations T` runs the whole evaluation at depth T. The other per-call
depth flags of `energyformers predict` (`--halting_tolerance`, `--halting_criterion` for Hyper-SET;
`--fixed_point_iterations`, `--fixed_point_solver`, `--fixed_point_tolerance` for iMixer) are passed on every
forward the same way (the `--eval_iterations` rows too), checked as predict checks them; a flag the model's family
does not take is refused before the model loads.

A split the dataset has without labels (all -1) is never scored (`scored_split`: without `--split`, an unlabelled
test split gives way to validation).

The metrics are printed (a table, or one JSON object with `--json`) and, with `--output_file`, written to that file
in one step; nothing else is written. Masked-image-modelling models are refused (their metrics need the run's
tokenizer fit, masks and decoding settings: see the run's metrics.json and `energyformers predict`).
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..tokenizer_fit import TOKENIZER_CONFIG_NAME
from .arguments import COLUMN_FLAGS, check_column_flags
from .cli import CommandParser, UsageError, check_model_source, run_command
from .predict import (
    DEPTH_FLAGS,
    MODEL_TYPES,
    add_halting_and_solver_flags,
    check_halting_criterion,
    check_local_model_folder,
    check_ranges,
    depth_arguments,
    masked_image_modeling_head,
)

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

PROG = "energyformers evaluate"
# The splits every dataset has after loading (`data.SPLITS`: a missing validation or test split is carved out of
# train with a fixed seed, as `train` carves it); named here so that argument checks import no `datasets`.
SPLITS = ("test", "validation", "train")
# The split scored when --split is not given, and the one scored instead where the dataset's test split is unlabelled
# (GLUE on the Hub: all -1), as run_glue.py's --do_eval scores validation.
DEFAULT_SPLIT, FALLBACK_SPLIT = "test", "validation"
# Trainer's `metric_key_prefix` of each split, as the training loops name their final evaluations; the train split
# has its own, since a run's `train_loss`, `train_runtime`, ... (metrics.json's "train") are the training's running
# mean loss and time, not an evaluation of the trained model on that split.
METRIC_PREFIXES = {"validation": "eval", "test": "test", "train": "train_eval"}
# Trainer's per-evaluation timing of moving the model to its device: not a metric, and not in a run's metrics.json.
NOT_METRICS = ("model_preparation_time", "epoch")
# The default batch size: the training loops' `--per_device_eval_batch_size`, so the batches are theirs.
EVAL_BATCH_SIZE = 256
# transformers' names for labels a config was given no names for (`PreTrainedConfig`'s LABEL_0, LABEL_1, ...).
DEFAULT_LABEL = "LABEL_{}"
# How many label names a mismatch message shows of each side.
SHOWN_LABELS = 6
# predict's per-call depth flags (`predict.DEPTH_FLAGS`, the forward arguments of `energyformers.pipelines`) that
# set the depth of a scored forward: the test-time search and the halting head's threshold are predict's alone.
EVAL_DEPTH_FLAGS = tuple(
    name for name in DEPTH_FLAGS if name != "halting_threshold" and not name.startswith("search_")
)
# Each family's per-call depth argument, the forward argument (and flag) that sets how deep it runs: the recurrent
# iterations, iMixer's fixed-point solver steps; None where the depth is fixed (HyperBF). Named when evaluate
# refuses another family's flag; inspect's accuracy-against-depth curves vary it.
FAMILY_DEPTH_ARGUMENTS: dict[str, str | None] = {
    "hyperset": "num_iterations",
    "looped-transformer": "num_iterations",
    "imixer": "fixed_point_iterations",
    "hyperbf": None,
}


def build_parser() -> argparse.ArgumentParser:
    """The `energyformers evaluate` argument parser."""
    p = CommandParser(prog=PROG, description=__doc__.split("\n\n")[0])
    p.add_argument(
        "model_dir",
        metavar="MODEL",
        help="a model folder (`energyformers train` output, an export) or a Hub repo id",
    )
    p.add_argument(
        "--dataset",
        required=True,
        help="a built-in name, a local folder or file, or a Hub dataset name (`energyformers train --dataset` names)",
    )
    p.add_argument(
        "--split",
        choices=SPLITS,
        help=f"the split scored (default: test, or {FALLBACK_SPLIT} where the dataset's test split is unlabelled); "
        "an unlabelled one (all labels -1) is refused",
    )
    p.add_argument("--image_column", help="image column; unset: image, img, ... (as train)")
    p.add_argument("--text_column", help="text column; unset: text, sentence, ... (as train)")
    p.add_argument(
        "--text_pair_column",
        help="the second text of sentence-pair data; unset: sentence2 beside sentence1 (as train)",
    )
    p.add_argument("--label_column", help="label column; unset: label, labels, class or target (as train)")
    p.add_argument("--max_samples", type=int, help="score the first N examples of the split (default: all)")
    p.add_argument(
        "--per_device_eval_batch_size",
        type=int,
        default=EVAL_BATCH_SIZE,
        help=f"evaluation batch size (default {EVAL_BATCH_SIZE}, the training loops')",
    )
    p.add_argument(
        "--eval_iterations",
        type=int,
        nargs="+",
        metavar="T",
        help="recurrent-depth models (Hyper-SET, looped Transformer): also the primary metric with each of these "
        "iteration counts, one row each (<prefix>_<metric>_iterations_<T>)",
    )
    depth = p.add_argument_group(
        "test-time depth (passed to every forward, as `energyformers predict` takes them)"
    )
    depth.add_argument(
        "--num_iterations",
        type=int,
        metavar="T",
        help="recurrent-depth models: run the whole evaluation with T iterations (default: the config's)",
    )
    add_halting_and_solver_flags(depth)
    p.add_argument(
        "--output_file", metavar="FILE", help="also write the metrics as JSON to FILE (replaced whole)"
    )
    p.add_argument("--json", action="store_true", help="print one JSON object instead of the table")
    p.add_argument("--num_threads", type=int, help="torch CPU threads")
    return p


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and check what needs no model: the numbers, the column flags (none for a built-in dataset), the output
    file, and a local model folder (its config,
    model type and weights; a classifier, not a masked-image-modelling model; the depth flags it takes)."""
    args = build_parser().parse_args(argv)
    counts = ("max_samples", "per_device_eval_batch_size", "num_threads")
    given = {name: getattr(args, name) for name in counts if getattr(args, name) is not None}
    check_ranges(given, {name: (lambda v: v >= 1, "an integer >= 1") for name in counts})
    # predict's ranges of the depth flags: the flags evaluate lacks (search, top_k) are not given
    flags = {name: getattr(args, name, None) for name in DEPTH_FLAGS}
    args.depth = depth_arguments(argparse.Namespace(**flags, top_k=None))
    bad = [t for t in args.eval_iterations or () if t < 1]
    if bad:
        raise UsageError(
            f"--eval_iterations {' '.join(map(str, args.eval_iterations))}: expected iteration counts >= 1"
        )
    check_column_flags(args.dataset, {name: getattr(args, name) for name in COLUMN_FLAGS})
    if args.output_file is not None:
        check_output_file(args.output_file)
    folder = check_model_source(args.model_dir, "model folder")
    if folder is not None:  # a local folder: what is wrong with it is named before torch loads
        config, _ = check_local_model_folder(
            folder,
            args.model_dir,
            MODEL_TYPES,
            check_flags=lambda mim, first: refuse_mim(args.model_dir, mim),
        )
        check_model_config(args, config)
    return args


def check_output_file(path: str) -> None:
    """`--output_file` names a file that can be written: not a folder, in an existing folder we may write into."""
    target = Path(path).expanduser()
    if target.is_dir():
        raise UsageError(f"--output_file {path}: is a folder; name a file to write the metrics into")
    folder = target.parent
    if not folder.is_dir():
        raise UsageError(f"--output_file {path}: the folder {folder} does not exist; create it first")
    if not os.access(folder, os.W_OK | os.X_OK):
        raise UsageError(f"--output_file {path}: the folder {folder} is not writable")


def refuse_mim(model_dir: str, architecture: str | None) -> None:
    """A masked-image-modelling model is refused, saying where its metrics are."""
    if architecture is None:
        return
    folder = Path(model_dir)
    where = []  # what this folder has to offer instead
    if (folder / "metrics.json").is_file():
        where.append(
            "its masked-token accuracy and reconstruction metrics are the eval/test entries of its metrics.json"
        )
    if (folder / TOKENIZER_CONFIG_NAME).is_file():
        where.append(
            f"`energyformers predict {model_dir} IMAGE...` reconstructs images with PSNR/SSIM per image"
        )
    else:
        where.append(
            "it holds no image tokenizer: save one into it (`energyformers.mim.PatchKMeansTokenizer.fit(...).save_pretrained` "
            "FOLDER) before `energyformers predict` can reconstruct images with it"
        )
    raise UsageError(
        f"{model_dir} is a masked-image-modelling model ({architecture}); evaluate scores classifiers; "
        + "; ".join(where)
    )


def check_model_config(args: argparse.Namespace, config: Mapping[str, Any]) -> None:
    """What a model's config (as JSON) says against the flags: a classification head, not a bare backbone or a
    masked-image-modelling model; the depth flags only for a model with recurrent depth (`num_iterations`)."""
    architecture = str((config.get("architectures") or ["?"])[0])
    refuse_mim(args.model_dir, masked_image_modeling_head(config.get("architectures")))
    if "For" not in architecture and architecture != "?":
        raise UsageError(
            f"{args.model_dir} is a bare backbone ({architecture}) without a classification head; evaluate scores "
            "a model with one (a folder written by `energyformers train`)"
        )
    # a depth flag is a field of the config of the families that take it per call (num_iterations: Hyper-SET and
    # the looped Transformer, RecurrentDepthMixin; halting_*: Hyper-SET; fixed_point_*: iMixer)
    model_type = config.get("model_type")
    takes = [f"--{name}" for name in EVAL_DEPTH_FLAGS if name in config]
    if "num_iterations" not in config:
        own = FAMILY_DEPTH_ARGUMENTS.get(str(model_type))
        # a family whose depth argument is num_iterations (a config without it) has no other to name
        instead = f"its depth flag is --{own}" if own not in (None, "num_iterations") else "drop the flag"
        if args.eval_iterations:
            raise UsageError(
                f"--eval_iterations {' '.join(map(str, args.eval_iterations))}: {model_type} has no recurrent "
                f"depth (no per-call num_iterations); {instead}"
            )
        if args.num_iterations is not None:
            raise UsageError(
                f"--num_iterations {args.num_iterations}: {model_type} has no recurrent depth (no per-call "
                f"num_iterations); {instead}"
            )
    for name, value in getattr(args, "depth", {}).items():
        if name not in config:
            raise UsageError(
                f"--{name} {value}: {model_type} does not take it; its depth flags are "
                f"{' '.join(takes) or 'none (its depth is fixed)'}"
            )
    check_halting_criterion(getattr(args, "depth", {}), config)


def check_dataset_fits(model_dir: str, config: Any, dataset: str, data: Any) -> None:
    """The labelled `data` (a normalised `DatasetDict` of `--dataset`) is one the model can be scored on: the same
    task (image, text or token classification) and the same labels (`check_labels`). `evaluate` and
    `inspect --dataset` share it, so a model is never scored against another label set. A `UsageError` otherwise."""
    from .data import label_names, task_of
    from .predict import task_for

    task, model_task = task_of(data), task_for(config)
    if task != model_task:
        raise UsageError(
            f"{model_dir} is a model for {model_task} ({(config.architectures or ['?'])[0]}) and --dataset "
            f"{dataset} is a dataset for {task}; score it on {'an' if model_task[0] in 'aeiou' else 'a'} "
            f"{model_task} dataset"
        )
    check_labels(model_dir, config, dataset, label_names(data))


def model_labels(config: Any) -> list[str]:
    """The class names of a model config, in id order (transformers' LABEL_i where it names none)."""
    return [str(config.id2label.get(i, DEFAULT_LABEL.format(i))) for i in range(config.num_labels)]


def check_labels(model_dir: str, config: Any, dataset: str, names: list[str]) -> None:
    """The model predicts the dataset's labels, in its order: the same number, and the same names unless the model's
    are transformers' placeholders (LABEL_0, ...). A `UsageError` showing both label sets otherwise."""
    ours = model_labels(config)
    placeholders = all(name == DEFAULT_LABEL.format(i) for i, name in enumerate(ours))
    if len(ours) == len(names) and (placeholders or ours == names):
        return

    def shown(labels: list[str]) -> str:
        listed = ", ".join(repr(n) for n in labels[:SHOWN_LABELS])
        return f"[{listed}{', ...' if len(labels) > SHOWN_LABELS else ''}]"

    raise UsageError(
        f"{model_dir} predicts {len(ours)} labels {shown(ours)} but --dataset {dataset} has {len(names)} labels "
        f"{shown(names)}; score a model on a dataset of its own label set (names and order)"
    )


def load_config(model_dir: str, error: type[UsageError]) -> Any:
    """The model's transformers config; when it cannot load, a one-line `error` (the command's `UsageError` class)
    in predict's words (`predict.cannot_load`). Shared by evaluate and inspect."""
    import transformers

    from .predict import cannot_load

    try:
        return transformers.AutoConfig.from_pretrained(model_dir)
    except (OSError, ValueError) as err:
        raise error(cannot_load(model_dir, err)) from None


def saved_processor(model_dir: str, config: Any, task: str) -> Any:
    """The processor saved with the model, loaded and tried as `train --from_pretrained` loads it
    (`predict.load_processor_or_refuse`): an image processor (built from the config, as training builds it, when the
    folder has none), a tokenizer for texts; none for Sudoku cells, which already are the ids. A broken file is a
    one-line `UsageError` naming it."""
    from .predict import load_processor_or_refuse

    if task == "token-classification":
        return None
    return load_processor_or_refuse(model_dir, config.to_dict(), build_missing=True)


def scored_split(split: str | None, dataset: str, data: Any) -> str:
    """The split `--split` names (`split`; None when not given), checked against the loaded `data` of `--dataset`.

    A split the dataset has but does not label (all -1, or no label column: GLUE's test splits on the Hub) is
    refused: `load_data` carves it out of train in its place, which would score training examples of any model
    not trained by `energyformers train` on this very data. Without --split, such a test split gives way to the
    dataset's validation split when it labels one, with a warning. A split the dataset lacks altogether is carved
    out of train as `train` carves it (seed 0), so a model trained here is scored on the examples its run held
    out. A `UsageError` naming the split, the dataset and its labelled splits otherwise."""
    unlabelled = getattr(data, "unlabelled_splits", {})  # a built-in's splits are all labelled
    chosen = DEFAULT_SPLIT if split is None else split
    if chosen not in unlabelled:
        return chosen
    carved = getattr(data, "carved_splits", ())
    labelled = [name for name in SPLITS if name not in carved]  # the dataset's own, in --split's order
    if split is None and FALLBACK_SPLIT in labelled:
        print(
            f"warning: the {chosen} split of --dataset {dataset} is unlabelled ({unlabelled[chosen]}): scoring its "
            f"{FALLBACK_SPLIT} split; pass --split to choose another",
            file=sys.stderr,
            flush=True,
        )
        return FALLBACK_SPLIT
    given = f"--split {chosen}" if split is not None else f"--split (default {chosen})"
    others = [name for name in labelled if name != "train"]
    held_out = [name for name in SPLITS if name in carved and name not in unlabelled]
    if others:
        instead = f"its labelled splits are {', '.join(labelled)}: pass --split {others[0]}"
    else:
        instead = "its only labelled split is train: pass --split train (the training examples)"
        if held_out:
            instead += (
                f", or --split {held_out[0]} for the part of train that `energyformers train` holds out (seed 0), "
                "unseen only by a model it trained on this dataset"
            )
    raise UsageError(
        f"{given}: the {chosen} split of --dataset {dataset} is unlabelled ({unlabelled[chosen]}), so it cannot "
        f"be scored; {instead}"
    )


def evaluate(args: argparse.Namespace) -> dict[str, Any]:
    """Load the model and the split, score it with Trainer; returns the report (`--json`'s object)."""
    import torch
    from transformers import PrinterCallback, ProgressCallback, TrainingArguments

    from .data import BUILTIN_DATASETS, decode_lazily, input_type_of, load_data, task_of, unlabelled_notice
    from .evaluation import (
        TrainerMetrics,
        argmax_logits,
        depth_metrics,
        eval_depths,
        load_metrics,
        primary_metric,
    )
    from .predict import cannot_load, check_depth_arguments, task_for
    from .processing import clipped_image_modes, clipped_modes_warning, pair_separator_refusal
    from .run_folder import software_environment
    from .setup import auto_head, check_one_batch, preprocessing
    from .trainer import DepthTrainer
    from .weights import load_or_refuse

    config = load_config(args.model_dir, UsageError)
    model_type = getattr(config, "model_type", None)
    if model_type not in MODEL_TYPES:  # a Hub model (a local folder's model_type was checked in `parse`)
        raise UsageError(
            f"{args.model_dir} holds model_type={model_type!r}, not an energyformers model; expected one of "
            f"{sorted(MODEL_TYPES)}"
        )
    check_model_config(args, config.to_dict())  # again for a Hub model
    # before the data loads: the dataset's task must be the model's (`check_dataset_fits`)
    processor = saved_processor(args.model_dir, config, task_for(config))
    data = load_data(
        args.dataset,
        image_column=args.image_column,
        text_column=args.text_column,
        label_column=args.label_column,
        text_pair_column=args.text_pair_column,
        seed=0,  # the seed `train` carves missing validation/test splits with: the same examples
        class_names=model_labels(
            config
        ),  # integer labels mapped onto the model's classes, as training mapped them
    )
    args.split = scored_split(args.split, args.dataset, data)
    unlabelled = getattr(data, "unlabelled_splits", {})
    # an unlabelled split's notice says `train` carves it out of train instead; evaluate scores no such split
    carved_notices = {unlabelled_notice(split, why) for split, why in unlabelled.items()}
    for notice in getattr(data, "notices", []):  # e.g. a column unused
        if notice not in carved_notices:
            print(f"warning: {notice}", file=sys.stderr, flush=True)
    check_dataset_fits(args.model_dir, config, args.dataset, data)
    refusal = pair_separator_refusal(data, processor, args.model_dir)
    if refusal:
        raise UsageError(refusal)
    task = task_of(data)
    rows = data[args.split]
    if args.max_samples is not None:
        rows = rows.select(range(min(args.max_samples, len(rows))))
    if input_type_of(data) == "image" and args.dataset not in BUILTIN_DATASETS:  # the built-ins are 8-bit
        clipped = clipped_modes_warning(clipped_image_modes(rows))
        if clipped:
            print(f"warning: {clipped}", file=sys.stderr, flush=True)
    transform, collator = preprocessing(task, config, processor)
    rows = decode_lazily(rows, transform, args.split)  # each image decoded as a batch reads it
    head = auto_head(getattr(config, "input_type", "image"), task)
    model = load_or_refuse(
        head, args.model_dir, error=UsageError, message=lambda err: cannot_load(args.model_dir, err)
    )
    # one real batch, as training checks one before it starts: ids or sizes that do not fit fail here
    check_one_batch(model, collator, rows, f"--dataset {args.dataset}: a batch of its {args.split} split")
    check_depth_arguments(model, args.depth)  # again for a Hub model, against its forward
    depths = eval_depths(model, args.eval_iterations) if args.eval_iterations else []
    load_metrics()
    prefix = METRIC_PREFIXES[args.split]
    # Trainer makes its output_dir when it is created; it saves nothing there when it only evaluates
    with tempfile.TemporaryDirectory(prefix="energyformers-evaluate-") as scratch:
        training_args = TrainingArguments(
            output_dir=scratch,
            per_device_eval_batch_size=args.per_device_eval_batch_size,
            use_cpu=not torch.cuda.is_available(),
            remove_unused_columns=False,  # the set_transform columns are produced on the fly
            disable_tqdm=True,
            report_to="none",
        )
        call = dict(args.depth)  # --num_iterations and the other depth flags given, on every forward
        trainer = DepthTrainer(
            model=model,
            args=training_args,
            data_collator=collator,
            compute_metrics=TrainerMetrics(task),
            preprocess_logits_for_metrics=argmax_logits,
            call_arguments=call,
        )
        for callback in (PrinterCallback, ProgressCallback):  # the metrics are this command's output alone
            trainer.remove_callback(callback)
        # HyperBF's centers computed once for the split: `DepthTrainer` evaluates inside `centers_scope`
        metrics = trainer.evaluate(rows, metric_key_prefix=prefix)
        # Trainer's training progress (0 here, trained or not) and its model preparation time are no metrics
        for name in NOT_METRICS:
            metrics.pop(name, None)
            metrics.pop(f"{prefix}_{name}", None)
        if depths:
            with trainer.autocast_smart_context_manager():
                # each row at its own T, with the other depth flags given (halting, ...) as the rest of the run
                metrics.update(
                    depth_metrics(
                        trainer.model,
                        trainer.get_eval_dataloader(rows),
                        trainer.accelerator.gather_for_metrics,
                        task,
                        depths,
                        f"{prefix}_",
                        call_arguments=call,
                    )
                )
    return {
        "model": args.model_dir,
        "model_type": model_type,
        "architecture": type(model).__name__,
        "dataset": args.dataset,
        "split": args.split,
        "num_samples": len(rows),
        "num_iterations": args.num_iterations,
        "depth_arguments": dict(args.depth),
        "eval_iterations": depths,
        "primary_metric": f"{prefix}_{primary_metric(task)}",
        "metrics": metrics,
        "environment": software_environment(),
    }


def table(report: dict[str, Any]) -> str:
    """The report as text: what was scored, one line per metric, then one row per iteration count."""
    depth = f", {report['num_iterations']} iterations" if report["num_iterations"] is not None else ""
    lines = [
        f"{report['model']} ({report['architecture']}) on {report['dataset']}: {report['split']} split, "
        f"{report['num_samples']} examples{depth}"
    ]
    metrics = report["metrics"]
    suffix = "_iterations_"
    plain = {k: v for k, v in metrics.items() if suffix not in k}
    width = max(len(k) for k in plain)
    lines += [f"  {key:<{width}}  {_number(value)}" for key, value in plain.items()]
    if report["eval_iterations"]:
        name = report["primary_metric"]
        lines.append(f"  {'iterations':>10}  {name}")
        lines += [f"  {t:>10}  {_number(metrics[f'{name}{suffix}{t}'])}" for t in report["eval_iterations"]]
    return "\n".join(lines)


def _number(value: Any) -> str:
    return f"{value:.4f}" if isinstance(value, float) else str(value)


def write_json(report: dict[str, Any], path: str) -> Path:
    """Write `report` to `path` through a temporary name beside it, so the file is never half written."""
    target = Path(path).expanduser()
    tmp = target.with_name(f".{target.name}.{os.getpid()}.tmp")
    try:
        tmp.write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
        os.replace(tmp, target)
    finally:
        tmp.unlink(missing_ok=True)
    return target


def execute(args: argparse.Namespace) -> int:
    """Score the split (`evaluate`), print the metrics and write `--output_file`."""
    import torch
    import transformers

    transformers.logging.set_verbosity_error()  # `run_command` restores the caller's logging afterwards
    transformers.utils.logging.disable_progress_bar()
    os.environ.setdefault("HF_DATASETS_DISABLE_PROGRESS_BARS", "1")
    if "datasets" in sys.modules:
        sys.modules["datasets"].disable_progress_bars()
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    report = evaluate(args)
    print(json.dumps(report) if args.json else table(report), flush=True)
    if args.output_file is not None:
        write_json(report, args.output_file)
    return 0


def main(argv: list[str] | None = None) -> int:
    """CLI entry point of `energyformers evaluate`; returns the exit status."""
    return run_command("evaluate", parse, execute, list(sys.argv[1:] if argv is None else argv))


if __name__ == "__main__":
    raise SystemExit(main())
