"""`energyformers train-accelerate`: the same training as `energyformers train`, as a plain Accelerate loop.

For users who write their own loops: `Accelerator` with gradient accumulation, a mixed-precision flag
and `save_state`/`load_state` checkpoints; same datasets, models and output folder as the Trainer CLI.

    energyformers train-accelerate --dataset digits --output_dir runs/acc-digits
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m energyformers.training.accelerate_loop --output_dir runs/acc-ddp
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import torch
import transformers
from accelerate import Accelerator, DataLoaderConfiguration, PartialState
from accelerate.utils import set_seed
from torch.utils.data import DataLoader
from tqdm.auto import tqdm

from .train import (
    UsageError,
    _metric,
    _print_predictions,
    _publish,
    add_model_data_arguments,
    build_model_and_data,
    check_adam_betas,
    continue_iteration_draws,
    data_summary,
    default_epochs,
    depth_flags,
    parse_overrides,
    plot_training_curve,
    primary_metric,
    run_cli,
    summary,
    task_metrics,
)

STATE_FILE = "loop_state.json"  # our step counter and log history, next to Accelerate's own state files


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="energyformers train-accelerate",
        description="Train a Hyper-SET / iMixer / HyperBF model with a plain Accelerate loop (no Trainer).",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    add_model_data_arguments(p)
    g = p.add_argument_group("training")
    g.add_argument("--output_dir", required=True)
    g.add_argument("--overwrite_output_dir", action="store_true")
    g.add_argument("--num_train_epochs", "--epochs", type=int, default=None, help="default 12 images, 5 text")
    g.add_argument("--max_steps", type=int, default=None, help="stop after N optimizer steps")
    g.add_argument("--per_device_train_batch_size", "--batch_size", type=int, default=64)
    g.add_argument("--per_device_eval_batch_size", type=int, default=256)
    g.add_argument("--learning_rate", "--lr", type=float, default=3e-3)
    g.add_argument("--warmup_ratio", type=float, default=0.05)
    g.add_argument("--weight_decay", type=float, default=0.05)
    g.add_argument("--max_grad_norm", type=float, default=1.0)
    g.add_argument("--adam_beta1", type=float, default=0.9, help="AdamW β1")
    g.add_argument("--adam_beta2", type=float, default=0.999, help="AdamW β2")
    g.add_argument("--gradient_accumulation_steps", type=int, default=1)
    g.add_argument("--mixed_precision", choices=["no", "bf16", "fp16"], default="no")
    g.add_argument("--torch_compile", action="store_true", help="torch.compile the model (in place)")
    g.add_argument("--checkpointing_steps", type=int, default=None, help="save_state every N optimizer steps")
    g.add_argument(
        "--resume", action="store_true", help="continue from the last checkpoint in <output_dir>.checkpoints"
    )
    g.add_argument("--keep_checkpoints", action="store_true")
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--logging_steps", type=int, default=None, help="default: ~10 log lines per run")
    g.add_argument("--num_threads", type=int, default=None, help="torch CPU threads")
    g.add_argument("--num_predictions", type=int, default=5)
    return p


def _checkpoints(work_dir: Path) -> list[Path]:
    found = [p for p in work_dir.glob("step_*") if (p / STATE_FILE).is_file()]  # STATE_FILE is written last
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def _param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    # As Trainer: no decay on biases, norms and other vectors/scalars.
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


@torch.no_grad()
def evaluate_split(
    model: torch.nn.Module, loader: DataLoader, accelerator: Accelerator, task: str
) -> dict[str, float]:
    """Loss and the task's metrics (`train.task_metrics`) over a whole split, gathered across processes
    (duplicates dropped)."""
    model.eval()
    predictions, references, losses = [], [], []
    for batch in loader:
        out = model(**batch)
        preds, labels = accelerator.gather_for_metrics((out.logits.argmax(-1), batch["labels"]))
        losses.append(accelerator.gather_for_metrics(out.loss.detach().float().repeat(len(batch["labels"]))))
        predictions.append(preds.cpu())
        references.append(labels.cpu())
    model.train()
    p, r = torch.cat(predictions).numpy(), torch.cat(references).numpy()
    return {"loss": torch.cat(losses).mean().item(), **task_metrics(task, p, r)}


def _model_card(path: Path, metrics: dict[str, Any]) -> None:
    names = ["accuracy"] if metrics["task"] == "token-classification" else ["accuracy", "f1"]
    path.write_text(
        "---\nlibrary_name: transformers\ntags:\n- energyformers\n- "
        f"{metrics['model']}\n- generated_from_accelerate_loop\ndatasets:\n- {metrics['dataset']}\n"
        "metrics:\n" + "".join(f"- {name}\n" for name in names) + "---\n\n"
        f"# {path.parent.name}\n\n{metrics['model']} trained from scratch on `{metrics['dataset']}` with "
        "`energyformers train-accelerate` (a plain Accelerate loop).\n\n"
        f"Test {summary(metrics['task'], metrics['test'])}.\n\n"
        f"Command: `{metrics['recipe']['command']}`\n"
    )


def run(argv: list[str], on_train_end: Callable[[torch.nn.Module, Accelerator], None] | None = None) -> int:
    start = time.time()
    args = build_parser().parse_args(argv)
    if args.num_threads:
        torch.set_num_threads(args.num_threads)
    cuda = torch.cuda.is_available()
    if args.mixed_precision == "fp16" and not cuda:
        raise UsageError("--mixed_precision fp16 needs a GPU; use bf16 or no on CPU")
    if args.mixed_precision == "bf16":
        from transformers.utils.import_utils import is_torch_bf16_available_on_device

        if not is_torch_bf16_available_on_device("cuda" if cuda else "cpu"):
            raise UsageError(
                "--mixed_precision bf16: this device has no bfloat16 support; use --mixed_precision no"
            )
    if args.gradient_accumulation_steps < 1 or args.per_device_train_batch_size < 1:
        raise UsageError("--gradient_accumulation_steps and --per_device_train_batch_size must be >= 1")
    check_adam_betas(args)
    output_dir = Path(args.output_dir).expanduser().resolve()
    work_dir = output_dir.with_name(output_dir.name + ".checkpoints")
    if output_dir.exists() and any(output_dir.iterdir()) and not args.overwrite_output_dir:
        raise UsageError(f"output folder {output_dir} exists and is not empty; pass --overwrite_output_dir")
    checkpoints = _checkpoints(work_dir)
    if args.resume and not checkpoints:
        raise UsageError(f"--resume: no checkpoint in {work_dir}")
    if checkpoints and not args.resume:
        raise UsageError(f"{work_dir} holds checkpoints of an interrupted run; pass --resume or delete it")

    accelerator = Accelerator(
        cpu=not cuda,  # required for real multi-process DDP over gloo on a CPU machine
        gradient_accumulation_steps=args.gradient_accumulation_steps,
        mixed_precision=args.mixed_precision,
        step_scheduler_with_optimizer=False,  # we step the scheduler once per optimizer step ourselves
        dataloader_config=DataLoaderConfiguration(
            use_seedable_sampler=True
        ),  # epoch e shuffles the same on resume
    )
    set_seed(args.seed)
    model, data, processor, collator, task = build_model_and_data(args, PartialState())
    with accelerator.local_main_process_first():  # evaluate copies the metric scripts into its module cache
        _metric("accuracy"), _metric("f1")
    epochs = args.num_train_epochs or default_epochs(task)

    loader = lambda split, bs, shuffle: DataLoader(  # noqa: E731
        data[split], batch_size=bs, shuffle=shuffle, collate_fn=collator, num_workers=0
    )
    train_dl = loader("train", args.per_device_train_batch_size, True)
    eval_dl = loader("validation", args.per_device_eval_batch_size, False)
    test_dl = loader("test", args.per_device_eval_batch_size, False)
    optimizer = torch.optim.AdamW(
        _param_groups(model, args.weight_decay),
        lr=args.learning_rate,
        betas=(args.adam_beta1, args.adam_beta2),
    )
    if args.torch_compile:  # in place (nn.Module.compile): same module, same state_dict keys, saves as usual
        model.compile()
    model, optimizer, train_dl, eval_dl, test_dl = accelerator.prepare(
        model, optimizer, train_dl, eval_dl, test_dl
    )
    steps_per_epoch = math.ceil(len(train_dl) / args.gradient_accumulation_steps)  # len() is per process
    total_steps = args.max_steps or steps_per_epoch * epochs
    scheduler = transformers.get_cosine_schedule_with_warmup(
        optimizer, int(args.warmup_ratio * total_steps), total_steps
    )
    scheduler = accelerator.prepare(scheduler)  # so save_state/load_state include it
    logging_steps = args.logging_steps or max(1, total_steps // 10)

    step, history = 0, []
    if args.resume:
        accelerator.load_state(str(checkpoints[-1]))
        saved = json.loads((checkpoints[-1] / STATE_FILE).read_text())
        step, history = saved["step"], saved["history"]
        accelerator.print(f"resumed from {checkpoints[-1]} at step {step}")
    # sampled depths (iteration_sampling) continue where the interrupted run stopped
    continue_iteration_draws(accelerator.unwrap_model(model), step, args.gradient_accumulation_steps)

    if accelerator.is_main_process:
        n = sum(p.numel() for p in accelerator.unwrap_model(model).parameters())
        print(
            f"{type(accelerator.unwrap_model(model)).__name__}: {n:,} parameters; {accelerator.num_processes} process(es)"
        )
    progress = tqdm(
        total=total_steps, initial=step, disable=not accelerator.is_local_main_process, dynamic_ncols=True
    )
    running, seen = torch.zeros((), device=accelerator.device), 0
    model.train()
    while step < total_steps:
        epoch, done_in_epoch = divmod(step, steps_per_epoch)
        train_dl.set_epoch(epoch)
        # After a resume, skip the micro-batches this epoch already consumed (same order: seedable sampler).
        skip = done_in_epoch * args.gradient_accumulation_steps
        batches = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
        for batch in batches:
            with accelerator.accumulate(model):
                loss = model(**batch).loss
                accelerator.backward(loss)  # divides by gradient_accumulation_steps itself
                if accelerator.sync_gradients:
                    accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
                optimizer.step()  # a no-op until the accumulation window is complete
                optimizer.zero_grad()
            running += loss.detach().float() / args.gradient_accumulation_steps
            if not accelerator.sync_gradients:
                continue
            scheduler.step()
            step, seen = step + 1, seen + 1
            progress.update(1)
            if step % logging_steps == 0 or step == total_steps:
                mean = accelerator.reduce(running, reduction="mean").item() / seen
                history.append({"step": step, "loss": mean, "learning_rate": scheduler.get_last_lr()[0]})
                progress.write(json.dumps({k: round(v, 5) for k, v in history[-1].items()}))
                running.zero_()
                seen = 0
            if args.checkpointing_steps and step % args.checkpointing_steps == 0:
                target = work_dir / f"step_{step}"
                accelerator.save_state(str(target), safe_serialization=True)
                if accelerator.is_main_process:
                    (target / STATE_FILE).write_text(json.dumps({"step": step, "history": history}))
                accelerator.wait_for_everyone()
            if step >= total_steps:
                break
        if step % steps_per_epoch == 0 or step >= total_steps:
            metrics = evaluate_split(model, eval_dl, accelerator, task)
            history.append({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})
            progress.write(json.dumps({k: round(v, 5) for k, v in history[-1].items()}))
    progress.close()
    train_time = time.time() - start

    if on_train_end is not None:
        on_train_end(accelerator.unwrap_model(model), accelerator)
    eval_metrics = evaluate_split(model, eval_dl, accelerator, task)
    test_metrics = evaluate_split(model, test_dl, accelerator, task)
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        stage = work_dir / "final"
        shutil.rmtree(stage, ignore_errors=True)
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(stage, state_dict=accelerator.get_state_dict(model))
        processor.save_pretrained(stage)
        metrics = {
            "model": unwrapped.config.model_type,
            "preset": args.preset,
            "dataset": args.dataset,
            "task": task,
            "num_parameters": sum(p.numel() for p in unwrapped.parameters()),
            "recipe": {
                "command": "energyformers train-accelerate " + shlex.join(argv),
                "epochs": float(epochs),
                "learning_rate": args.learning_rate,
                "batch_size": args.per_device_train_batch_size,
                "seed": args.seed,
                "max_steps": args.max_steps,
                "gradient_accumulation_steps": args.gradient_accumulation_steps,
                "mixed_precision": args.mixed_precision,
                "adam_betas": [args.adam_beta1, args.adam_beta2],
                "torch_compile": args.torch_compile,
                "world_size": accelerator.num_processes,
                "global_step": step,
                "config_overrides": parse_overrides(args.config),
                "depth_flags": depth_flags(args),
                "from_pretrained": args.from_pretrained,
                "resumed_from": str(checkpoints[-1]) if args.resume else None,
            },
            "data": data_summary(data),
            "train": {
                "train_runtime": round(train_time, 2),
                "train_loss": next((h["loss"] for h in reversed(history) if "loss" in h), None),
                "global_step": step,
            },
            "eval": eval_metrics,
            "test": test_metrics,
            "wall_time_s": round(time.time() - start, 2),
        }
        (stage / "metrics.json").write_text(json.dumps(metrics, indent=2) + "\n")
        plot_training_curve(
            history,
            stage / "training_curve.png",
            f"{metrics['model']} on {args.dataset} (Accelerate)",
            primary_metric(task),
        )
        _model_card(stage / "README.md", metrics)
        for path in stage.iterdir():
            path.chmod(0o644)
        _publish(stage, output_dir)
        if not args.keep_checkpoints:
            shutil.rmtree(work_dir, ignore_errors=True)
        print(f"test {summary(task, test_metrics)} → {output_dir}")
        _print_predictions(output_dir, data, task, args.num_predictions)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


def main(
    argv: list[str] | None = None,
    *,
    on_train_end: Callable[[torch.nn.Module, Accelerator], None] | None = None,
) -> int:
    """CLI entry point; `on_train_end(model, accelerator)` runs on every process after the last step."""
    return run_cli("train-accelerate", run, list(sys.argv[1:] if argv is None else argv), on_train_end)


if __name__ == "__main__":
    raise SystemExit(main())
