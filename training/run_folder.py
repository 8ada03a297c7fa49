"""The finished model folder of a training run, written the same way by both loops.

A loop saves the model and processor into `<output_dir>.checkpoints/final`, then `finish_run` adds
`metrics.json` (the full record of the run), `training_curve.png` and the model card (`training/card.py`),
renames the folder to `<output_dir>` in one step (so `<output_dir>` is either complete or absent), removes the
checkpoints, prints the result and `pipeline` predictions of the reloaded folder, and pushes it if asked.
`leave_nothing_behind` removes a work folder that a failed run created before its first checkpoint.

A run holds `<output_dir>.lock` (beside the folder) from its start to its end, however it ends
(`interrupt.locked_output_dir`, around the run by `setup.output_paths`), so a second run, export or conversion on
the same folder is refused before it reads or writes anything; a folder that a run killed while replacing it left
hidden is put back by the next one (`interrupt.restore_interrupted_publish`).
"""

from __future__ import annotations

import contextlib
import json
import shlex
import shutil
import sys
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from .arguments import (
    MIM_TASK,
    TRACKER_FOLDER,
    Arguments,
    config_flags,
    parse_overrides,
    recorded,
    redacted_argv,
)
from .card import render_model_card
from .data import BUILTIN_DATASETS, input_type_of, raw_rows
from .evaluation import primary_metric, summary
from .interrupt import (
    LOCK_SUFFIX,
    lock_output_dir,
    lock_path,
    locked_output_dir,
    publish,
    release_output_dir,
    remove_path,
    replaced_names,
    restore_interrupted_publish,
)
from .setup import (
    FINISHED_RUN_FILE,
    auto_head,
    auto_processor,
    cli_preset,
    model_registry,
    processor_keyword,
)

CURVE = "training_curve.png"
METRICS = "metrics.json"


@dataclass
class RunResult:
    """What a finished run reports, whichever loop ran it."""

    loop: str  # the sub-command: "train" or "train-accelerate"
    args: Arguments
    model: Any  # the trained model (unwrapped)
    data: Any
    task: str
    epochs: float
    learning_rate: float
    world_size: int
    global_step: int
    train: dict[
        str, Any
    ]  # train_runtime, train_loss (over the whole run, resumed parts included), global_step
    eval: dict[str, float]
    test: dict[str, float]
    log_history: list[dict[str, Any]]
    start_time: float
    resumed_from: str | None = None
    warnings: list[str] = field(default_factory=list)
    # which weights the folder holds (`train.restore_best_weights`); None: the last step's
    saved_weights: dict[str, Any] | None = None


def dataset_name(args: Arguments) -> str:
    """The dataset as the card and the curve name it: a built-in's name, else the folder or file name."""
    name = args.data.dataset
    return name if name in BUILTIN_DATASETS else Path(name).name


def data_summary(data: Any) -> dict[str, str] | None:
    """For grid puzzles (a `givens` column): the distribution of given cells per split."""
    if "givens" not in data["train"].column_names:
        return None
    from .sudoku import format_givens_counts

    return {split: format_givens_counts(ds.with_format(None)["givens"]) for split, ds in data.items()}


def preset_used(result: RunResult) -> str:
    """The preset the run's model was built from, as the card names it: `--preset`, else the CLI's default for the
    task and input type (`cli-mim`, `cli-image`, `cli-sequence`; `setup.cli_preset`), or the checkpoint's config of
    `--from_pretrained`; "none" where no preset applied (the config class's defaults under `--config`)."""
    m = result.args.model
    if m.from_pretrained:
        return f"from {m.from_pretrained}'s config"
    if m.preset:
        return m.preset
    if result.task == MIM_TASK:
        return "cli-mim"
    config = result.model.config
    modality = getattr(config, "input_type", None) or input_type_of(result.data)
    return f"cli-{modality}" if cli_preset(config.model_type, modality) else "none"


# What the numbers of a run depend on besides its arguments: torchmetrics' SSIM changed between releases, for one;
# tokenizers' WordPiece trainer gives a text run its token ids, Pillow converts and resizes the images, scikit-learn
# carves the missing splits (stratified) and, with numpy, builds `digits`.
RECORDED_PACKAGES = (
    "energyformers",
    "torch",
    "transformers",
    "accelerate",
    "datasets",
    "torchmetrics",
    "kornia",
    "tokenizers",
    "pillow",
    "numpy",
    "scikit-learn",
)


def software_environment() -> dict[str, Any]:
    """The Python version, platform and the installed versions of `RECORDED_PACKAGES` (None: not installed)."""
    import platform
    from importlib.metadata import PackageNotFoundError, version

    def installed(name: str) -> str | None:
        try:
            return version(name)
        except PackageNotFoundError:
            return None

    return {
        "python": platform.python_version(),
        "platform": platform.platform(),
        "packages": {name: installed(name) for name in RECORDED_PACKAGES},
    }


def run_metrics(result: RunResult) -> dict[str, Any]:
    """The `metrics.json` record of a run (the same schema for both loops)."""
    args, run = result.args, result.args.run
    return {
        "model": result.model.config.model_type,
        "preset": preset_used(result),
        "dataset": args.data.dataset,
        "task": result.task,
        "loop": result.loop,
        "num_parameters": sum(p.numel() for p in result.model.parameters()),
        "recipe": {
            "command": f"energyformers {result.loop} " + shlex.join(redacted_argv(args.argv)),
            "recipe": run.recipe,
            "epochs": float(result.epochs),
            "learning_rate": result.learning_rate,
            "batch_size": run.per_device_train_batch_size,
            "seed": run.seed,
            "max_steps": run.max_steps if run.max_steps > 0 else None,
            "gradient_accumulation_steps": run.gradient_accumulation_steps,
            "adam_betas": [run.adam_beta1, run.adam_beta2],
            "weight_decay": run.weight_decay,
            "max_grad_norm": run.max_grad_norm,
            "ema_decay": run.ema_decay,
            "torch_compile": run.torch_compile,
            "mixed_precision": run.precision,
            "bf16": run.precision == "bf16",
            "world_size": result.world_size,
            "global_step": result.global_step,
            "config_overrides": parse_overrides(args.model.config),
            "depth_flags": config_flags(args.model),
            "augmentation": asdict(args.augmentation) if args.augmentation.enabled else None,
            "from_pretrained": args.model.from_pretrained,
            "resumed_from": result.resumed_from,
        },
        "arguments": recorded(args),
        "data": data_summary(result.data),
        # the dataset columns read, after detection (None for a built-in): the card shows a pair model's pair call
        "columns": getattr(result.data, "source_columns", None),
        "train": result.train,
        "eval": result.eval,
        "test": result.test,
        "warnings": result.warnings,
        "saved_weights": result.saved_weights
        or {"weights": "last", "step": result.global_step, "ema": run.ema_decay is not None},
        "log_history": result.log_history,  # the training curve's data
        "wall_time_s": round(time.time() - result.start_time, 2),
        "environment": software_environment(),
    }


def plot_training_curve(
    log_history: list[dict[str, Any]], path: Path, title: str, metric: str = "accuracy"
) -> None:
    """Training loss, evaluation loss and the evaluation metric against the optimizer step."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    train = [(h["step"], h["loss"]) for h in log_history if "loss" in h]
    evals = [(h["step"], h["eval_loss"], h.get(f"eval_{metric}")) for h in log_history if "eval_loss" in h]
    # one legend below the axes: inside them the rising metric (right axis) ran through it
    fig, ax = plt.subplots(figsize=(6, 3.8), layout="constrained")
    if train:
        ax.plot(*zip(*train), label="train loss")
    if evals:
        ax.plot([e[0] for e in evals], [e[1] for e in evals], "o-", label="eval loss")
    ax.set_xlabel("optimizer step")
    ax.set_ylabel("loss")
    axes = [ax]
    if evals and evals[0][2] is not None:
        acc = ax.twinx()
        acc.plot(
            [e[0] for e in evals], [e[2] for e in evals], "s--", color="tab:green", label=f"eval {metric}"
        )
        acc.set_ylabel(metric.replace("_", " "))
        axes.append(acc)
    handles = [handle for axis in axes for handle in axis.get_legend_handles_labels()[0]]
    if handles:
        fig.legend(handles=handles, loc="outside lower center", ncol=len(handles), frameon=False)
    ax.set_title(title)
    fig.savefig(path, dpi=100)
    plt.close(fig)


def card_info(stage: Path, model: Any, task: str, metrics: dict[str, Any], name: str) -> dict[str, Any]:
    """The `card.render_model_card` description of a run folder (as `export.inspect_model_dir` gives it)."""
    heads = {head.__name__: auto for auto, head in model_registry()[model.config.model_type].heads.items()}
    architecture = type(model).__name__
    return {
        "config": model.config.to_dict(),
        "model_type": model.config.model_type,
        "architecture": architecture,
        "auto_class": heads.get(architecture, "AutoModel"),
        "input_type": model.config.input_type,
        "task": task,
        "files": sorted(p.name for p in stage.iterdir()),
        "metrics": metrics,
        "name": name,
    }


def write_run_folder(stage: Path, result: RunResult, name: str) -> dict[str, Any]:
    """Add metrics.json, the training curve and the model card to `stage` (which holds model + processor)."""
    metrics = run_metrics(result)
    (stage / METRICS).write_text(json.dumps(metrics, indent=2) + "\n")
    title = f"{metrics['model']} on {dataset_name(result.args)}" + (
        " (Accelerate)" if result.loop == "train-accelerate" else ""
    )
    plot_training_curve(result.log_history, stage / CURVE, title, primary_metric(result.task))
    info = card_info(stage, result.model, result.task, metrics, name)
    render_model_card(info, num_parameters=metrics["num_parameters"], remote_code=False).save(
        stage / "README.md"
    )
    for path in stage.iterdir():  # safetensors writes 0600 temp files; a model folder is for sharing
        path.chmod(0o644)
    return metrics


def print_predictions(output_dir: Path, data: Any, task: str, count: int) -> None:
    """Reload the saved folder through the Auto classes and show `pipeline` predictions on test examples."""
    if count <= 0:
        return
    if (
        task == MIM_TASK
    ):  # no transformers pipeline for it: reload model + tokenizer and decode masked test grids
        from .evaluation import print_masked_image_predictions

        print_masked_image_predictions(output_dir, data, count)
        return
    import transformers

    input_type = input_type_of(data)
    model = auto_head(input_type, task).from_pretrained(output_dir)
    processor = auto_processor(input_type).from_pretrained(output_dir)
    pipe = transformers.pipeline(task, model=model, **{processor_keyword(input_type): processor})
    test = raw_rows(data["test"], "test")  # raw images/texts, without the training transform
    print(f"pipeline({task!r}) on the reloaded {output_dir.name}:")
    if task == "token-classification":  # a grid puzzle as its string of cells, one predicted label per cell
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
    if "text_pair" in test.column_names:  # sentence pairs: the pipeline takes {"text", "text_pair"} dicts
        inputs = [{"text": row["text"], "text_pair": row["text_pair"]} for row in rows]
    else:
        inputs = [row["image" if input_type == "image" else "text"] for row in rows]
    outputs = pipe(inputs, **({"truncation": True} if task == "text-classification" else {}))
    for i, (row, out) in enumerate(zip(rows, outputs)):
        top = out[0] if isinstance(out, list) else out
        shown = "" if input_type == "image" else f"  {row['text'][:60]!r}"
        shown += f" / {row['text_pair'][:60]!r}" if "text_pair" in row else ""
        print(
            f"  test[{i}]  true: {names[row['label']]:<12} predicted: {top['label']:<12} p={top['score']:.3f}{shown}"
        )


def finish_run(stage: Path, result: RunResult, output_dir: Path, work_dir: Path) -> dict[str, Any]:
    """Complete `stage` (model + processor already saved), publish it as `output_dir`, report, push.

    Main process only. Returns the metrics.json record.
    """
    run = result.args.run
    metrics = write_run_folder(stage, result, output_dir.name)
    # the trackers' files without --logging_dir (`arguments.tracker_folder`) go with the model
    trackers = work_dir / TRACKER_FOLDER
    if trackers.is_dir():
        shutil.move(trackers, stage / TRACKER_FOLDER)
    # the stage is complete: once it is gone (published), the checkpoints left are a finished run's
    (work_dir / FINISHED_RUN_FILE).write_text(json.dumps({"output_dir": str(output_dir)}) + "\n")
    try:
        publish(stage, output_dir, overwrite=run.overwrite_output_dir)
    except BaseException:
        # not published (the stage is where it was): the trackers' files go back to the work folder, where a
        # --resume goes on writing them (its save replaces the stage)
        if (stage / TRACKER_FOLDER).is_dir():
            shutil.move(stage / TRACKER_FOLDER, trackers)
        raise
    if not run.keep_checkpoints:
        shutil.rmtree(work_dir, ignore_errors=True)
    print(
        f"test {summary(result.task, metrics['test'])}  ({metrics['wall_time_s']:.0f} s) → {output_dir}",
        flush=True,
    )
    for warning in result.warnings:
        print(f"warning: {warning}", file=sys.stderr)
    print_predictions(output_dir, result.data, result.task, run.num_predictions)
    if run.push_to_hub:
        from .push import push_model_dir  # lazily: the Hub stack is only needed here

        url = push_model_dir(output_dir, run.hub_model_id, private=run.hub_private_repo, token=run.hub_token)
        print(f"pushed to {url}")
    return metrics


def has_checkpoint(work_dir: Path) -> bool:
    """Whether `work_dir` holds a checkpoint of either loop (Trainer's checkpoint-N, Accelerate's step_N)."""
    return work_dir.is_dir() and (any(work_dir.glob("checkpoint-*")) or any(work_dir.glob("step_*")))


@contextlib.contextmanager
def leave_nothing_behind(work_dir: Path, main_process: bool = True) -> Iterator[None]:
    """On any failure inside the block, remove `work_dir` if this run created it and it holds no checkpoint
    (a failed start leaves no empty `<output_dir>.checkpoints/`); checkpoints stay for `--resume`."""
    existed = work_dir.exists()
    try:
        yield
    except BaseException:
        if main_process and not existed and work_dir.exists() and not has_checkpoint(work_dir):
            shutil.rmtree(work_dir, ignore_errors=True)
        raise


__all__ = [
    "LOCK_SUFFIX",
    "RunResult",
    "card_info",
    "data_summary",
    "dataset_name",
    "finish_run",
    "has_checkpoint",
    "leave_nothing_behind",
    "lock_output_dir",
    "lock_path",
    "locked_output_dir",
    "plot_training_curve",
    "print_predictions",
    "publish",
    "release_output_dir",
    "remove_path",
    "replaced_names",
    "restore_interrupted_publish",
    "run_metrics",
    "write_run_folder",
]
