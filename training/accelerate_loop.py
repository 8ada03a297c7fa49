"""`energyformers train-accelerate`: the same training as `energyformers train`, as a plain Accelerate loop.

For users who write their own loops: `Accelerator` with gradient accumulation, mixed precision and
`save_state`/`load_state` checkpoints. The flags (`training/arguments.py`), the model and data
(`training/setup.py`), the schedule and loss (`training/optimization.py`) and the finished folder
(`training/run_folder.py`) are those of the Trainer CLI.

    energyformers train-accelerate --dataset digits --output_dir runs/acc-digits
    accelerate launch --multi_gpu --num_processes 2 --num_machines 1 --mixed_precision no \\
        --dynamo_backend no -m energyformers.training.accelerate_loop --output_dir runs/acc-ddp
"""

from __future__ import annotations

import json
import os
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .arguments import Arguments, parse_arguments, quiet_libraries
from .cli import run_command
from .interrupt import StopRequest

PROG = "energyformers train-accelerate"
DESCRIPTION = "Train a Hyper-SET / iMixer / HyperBF model with a plain Accelerate loop (no Trainer)."
STATE_FILE = "loop_state.json"  # our step counter, loss sum and log history, next to Accelerate's state files
EMA_FILE = "ema_model.safetensors"


def accelerate_checkpoints(work_dir: Path) -> list[Path]:
    """The loop's complete checkpoints in `work_dir` (STATE_FILE is written last), oldest first."""
    found = [p for p in work_dir.glob("step_*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def sample_losses(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per sample: the sum of its cross-entropy terms and their count (1 per classified sample, its labelled
    tokens or masked positions otherwise; label -100 is ignored, as in the models' loss). Summed over a split and
    divided, they give the split's loss whatever the batches and processes: a batch mean cannot, since a process's
    last batch may hold a sample repeated to even out the processes, and its mean counts that sample."""
    import torch.nn.functional as F

    terms = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).reshape(labels.shape)
    valid = labels != -100
    dims = tuple(range(1, labels.dim()))
    if not dims:
        return terms, valid.float()
    return terms.sum(dims), valid.sum(dims).float()


def evaluate_split(model: Any, loader: Any, accelerator: Any, task: str) -> dict[str, float]:
    """Loss and the task's metrics (`evaluation.task_metrics`) over a whole split, gathered across processes
    (duplicates dropped)."""
    import torch

    from .evaluation import task_metrics

    model.eval()
    predictions, references, loss_sums, counts = [], [], [], []
    with torch.no_grad():
        for batch in loader:
            out = model(**batch)
            preds, labels = accelerator.gather_for_metrics((out.logits.argmax(-1), batch["labels"]))
            if batch["labels"].is_floating_point():  # not a class index: no per-sample cross-entropy
                # (no task of the CLI: kept for models whose loss is another; exact unless a batch is padded)
                sums = out.loss.detach().float().repeat(len(batch["labels"]))
                sample_counts = torch.ones_like(sums)
            else:
                sums, sample_counts = sample_losses(out.logits, batch["labels"])
            sums, sample_counts = accelerator.gather_for_metrics((sums, sample_counts))
            loss_sums.append(sums.cpu())
            counts.append(sample_counts.cpu())
            predictions.append(preds.cpu())
            references.append(labels.cpu())
    model.train()
    p, r = torch.cat(predictions).numpy(), torch.cat(references).numpy()
    loss = (torch.cat(loss_sums).sum() / torch.cat(counts).sum()).item()
    return {"loss": loss, **task_metrics(task, p, r)}


def parse(argv: list[str]) -> Arguments:
    """The checked arguments (no torch, no model loaded: `cli.run_command` imports those afterwards)."""
    return parse_arguments(argv, PROG, DESCRIPTION)


def run(args: Arguments, on_train_end: Callable[[Any, Any], None] | None = None) -> int:
    """Train as `args` say; returns the exit status (0, or 128 + the signal when stopped by SIGTERM/SIGINT)."""
    start = time.time()
    quiet_libraries()
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration
    from accelerate.utils import set_seed
    from torch.utils.data import DataLoader
    from tqdm.auto import tqdm

    from .evaluation import depth_metrics, eval_depths, load_metrics
    from .optimization import TrainingLoss, check_schedule, make_scheduler, param_groups, plan_schedule
    from .run_folder import RunResult, finish_run, leave_nothing_behind
    from .setup import (
        announce_run,
        build,
        check_precision,
        check_resume_arguments,
        continue_iteration_draws,
        enable_activation_checkpointing,
        find_checkpoint,
        output_paths,
        record_run_arguments,
    )

    run_args = args.run
    if run_args.num_threads:
        torch.set_num_threads(run_args.num_threads)
    check_precision(run_args.precision)
    output_dir, work_dir = output_paths(args)
    resume_from = find_checkpoint(args, work_dir, accelerate_checkpoints(work_dir))
    check_schedule(args)

    accelerator = Accelerator(
        cpu=not torch.cuda.is_available(),  # required for real multi-process DDP over gloo on a CPU machine
        gradient_accumulation_steps=run_args.gradient_accumulation_steps,
        mixed_precision=run_args.precision,
        step_scheduler_with_optimizer=False,  # we step the scheduler once per optimizer step ourselves
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),  # same order on resume
    )
    with leave_nothing_behind(work_dir, accelerator.is_main_process):
        set_seed(run_args.seed)
        built = build(args, accelerator.state)
        if resume_from is not None:  # what was built against the record, before `load_state`
            check_resume_arguments(args, built, work_dir, resume_from)
        model, data, task = built.model, built.data, built.task
        training_loss = TrainingLoss(args, built)
        if accelerator.is_main_process:
            record_run_arguments(
                args, built, work_dir
            )  # what a --resume must repeat (`check_resume_arguments`)
            announce_run(built, args.data.dataset, accelerator.num_processes)
        with (
            accelerator.local_main_process_first()
        ):  # evaluate copies the metric scripts into its module cache
            load_metrics()
        schedule = plan_schedule(args, task, len(data["train"]), accelerator.num_processes)

        def loader(split: str, batch_size: int, shuffle: bool) -> DataLoader:
            return DataLoader(
                data[split],
                batch_size=batch_size,
                shuffle=shuffle,
                collate_fn=built.collator,
                num_workers=run_args.dataloader_num_workers,
            )

        train_dl = loader("train", run_args.per_device_train_batch_size, True)
        eval_dl = loader("validation", run_args.per_device_eval_batch_size, False)
        test_dl = loader("test", run_args.per_device_eval_batch_size, False)
        if run_args.gradient_checkpointing:
            enable_activation_checkpointing(model)
        optimizer = torch.optim.AdamW(
            param_groups(model, run_args.weight_decay),
            lr=schedule.learning_rate,
            betas=(run_args.adam_beta1, run_args.adam_beta2),
        )
        if run_args.torch_compile:  # in place (nn.Module.compile): same module, same state_dict keys
            model.compile()
        model, optimizer, train_dl, eval_dl, test_dl = accelerator.prepare(
            model, optimizer, train_dl, eval_dl, test_dl
        )
        total_steps, steps_per_epoch = schedule.total_steps, schedule.steps_per_epoch
        scheduler = accelerator.prepare(make_scheduler(args, optimizer, schedule))  # save_state includes it
        ema = None
        if run_args.ema_decay is not None:
            from .augmentation import ExponentialMovingAverage

            ema = ExponentialMovingAverage(accelerator.unwrap_model(model), run_args.ema_decay)

        step, history, loss_sum = 0, [], 0.0
        saved_at: int | None = None  # the step of this run's last checkpoint (the same on every rank)
        if resume_from is not None:
            accelerator.load_state(str(resume_from))
            saved = json.loads((resume_from / STATE_FILE).read_text())
            step, history, loss_sum = saved["step"], saved["history"], saved.get("loss_sum", 0.0)
            if ema is not None and (resume_from / EMA_FILE).is_file():
                from safetensors.torch import load_file

                ema.load_state_dict(load_file(str(resume_from / EMA_FILE), device=str(accelerator.device)))
            accelerator.print(f"resuming from step {step} ({resume_from})")
        # sampled depths (iteration_sampling) continue where the interrupted run stopped
        continue_iteration_draws(
            accelerator.unwrap_model(model), step, len(train_dl), run_args.gradient_accumulation_steps
        )
        if hasattr(built.collator, "check_loader"):  # masks that DataLoader workers can number exactly
            built.collator.check_loader(train_dl)

        depths = eval_depths(accelerator.unwrap_model(model), run_args.eval_iterations)

        def with_depths(loader_: DataLoader) -> dict[str, float]:
            """The split's loss and metrics, for masked image modelling the reconstruction metrics after decoding,
            and the accuracy at each depth of `depths` (`depth_metrics`)."""
            metrics = evaluate_split(model, loader_, accelerator, task)
            if built.masked_images is not None:
                split = "test" if loader_ is test_dl else "validation"
                with accelerator.autocast():
                    metrics.update(built.masked_images(accelerator.unwrap_model(model), split))
            if depths:
                metrics.update(depth_metrics(model, loader_, accelerator.gather_for_metrics, task, depths))
            return metrics

        def evaluate(loader_: DataLoader) -> dict[str, float]:
            if ema is None:
                return with_depths(loader_)
            with ema.averaged_weights(accelerator.unwrap_model(model)):
                return with_depths(loader_)

        def log_window(extra: dict[str, float]) -> None:
            """Log the mean loss since the last log and add the window to the run's loss sum."""
            nonlocal loss_sum, seen
            window = accelerator.reduce(running, reduction="mean").item()
            loss_sum += window
            history.append({"step": step, "loss": window / seen, **extra})
            log_line(json.dumps({k: round(v, 5) for k, v in history[-1].items()}))
            running.zero_()
            seen = 0

        def save_checkpoint() -> None:
            nonlocal saved_at
            saved_at = step
            if seen:  # log the open window first, so the saved loss sum covers every step up to here
                log_window({})
            target = work_dir / f"step_{step}"
            accelerator.save_state(str(target), safe_serialization=True)
            if accelerator.is_main_process:
                if ema is not None:
                    from safetensors.torch import save_file

                    save_file({k: v.cpu() for k, v in ema.state_dict().items()}, str(target / EMA_FILE))
                state = {"step": step, "history": history, "loss_sum": loss_sum}
                (target / STATE_FILE).write_text(json.dumps(state))
                for old in accelerate_checkpoints(work_dir)[: -run_args.save_total_limit]:
                    shutil.rmtree(old, ignore_errors=True)
            accelerator.wait_for_everyone()

        progress = tqdm(
            total=total_steps,
            initial=step,
            disable=run_args.disable_tqdm or not accelerator.is_local_main_process,
            dynamic_ncols=True,
        )
        # every rank computes the same log entry (the reduced loss, the gathered metrics): printed by the main
        # process only, as Trainer logs; `tqdm.write` keeps the bar intact (and prints on ranks whose bar is off)
        log_line = progress.write if accelerator.is_main_process else lambda line: None
        running, seen, start_step = torch.zeros((), device=accelerator.device), 0, step
        model.train()
        stop = StopRequest()
        several = accelerator.num_processes > 1
        with stop.installed(several_processes=several, announce=accelerator.is_main_process):
            # `stop.agreed` (the ranks' common answer, `StopRequest.should_stop` after every optimizer step), never
            # a rank's own signal: every rank must leave the loop after the same step
            while step < total_steps and not stop.agreed:
                epoch, done_in_epoch = divmod(step, steps_per_epoch)
                train_dl.set_epoch(epoch)
                # After a resume, skip the micro-batches this epoch already consumed (same order: seedable sampler).
                skip = done_in_epoch * run_args.gradient_accumulation_steps
                batches = accelerator.skip_first_batches(train_dl, skip) if skip else train_dl
                # The training masks continue where the run stands: the index of this epoch's first batch to
                # collate (the prepared loader's length: this process's batches an epoch), set before the
                # iterator starts the DataLoader workers, which number their batches from it.
                if hasattr(built.collator, "continue_after"):
                    built.collator.continue_after(step, len(train_dl), run_args.gradient_accumulation_steps)
                for batch in batches:
                    with accelerator.accumulate(model):
                        if training_loss.active:
                            loss, _ = training_loss(model, batch)
                        else:
                            loss = model(**batch).loss
                        accelerator.backward(loss)  # divides by gradient_accumulation_steps itself
                        if accelerator.sync_gradients and run_args.max_grad_norm > 0:
                            accelerator.clip_grad_norm_(model.parameters(), run_args.max_grad_norm)
                        optimizer.step()  # a no-op until the accumulation window is complete
                        optimizer.zero_grad()
                    running += loss.detach().float() / run_args.gradient_accumulation_steps
                    if not accelerator.sync_gradients:
                        continue
                    learning_rate = scheduler.get_last_lr()[0]  # the rate this step used (what Trainer logs)
                    scheduler.step()
                    if ema is not None:
                        ema.update(accelerator.unwrap_model(model))
                    step, seen = step + 1, seen + 1
                    progress.update(1)
                    if step % schedule.logging_steps == 0 or step == total_steps:
                        log_window({"learning_rate": learning_rate})
                    if schedule.eval_strategy == "steps" and step % schedule.eval_steps == 0:
                        metrics = evaluate(eval_dl)
                        history.append({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})
                        log_line(json.dumps({k: round(v, 5) for k, v in history[-1].items()}))
                    if schedule.save_strategy == "steps" and step % schedule.save_steps == 0:  # as Trainer
                        save_checkpoint()
                    if stop.should_stop(accelerator.device) or step >= total_steps:  # stop after this step
                        break
                end_of_epoch = step % steps_per_epoch == 0 or step >= total_steps
                if end_of_epoch and schedule.eval_strategy == "epoch":
                    metrics = evaluate(eval_dl)
                    history.append({"step": step, **{f"eval_{k}": v for k, v in metrics.items()}})
                    log_line(json.dumps({k: round(v, 5) for k, v in history[-1].items()}))
                if end_of_epoch and schedule.save_strategy == "epoch":
                    save_checkpoint()
        progress.close()
        if stop.agreed:
            if saved_at != step:  # not a file check: another machine's ranks may not see rank 0's files
                save_checkpoint()
            accelerator.end_training()
            if accelerator.is_main_process:
                return stop.report("train-accelerate", args.argv, step, work_dir)
            return 128 + int(stop.signum or 0)
        train_time = time.time() - start

        if on_train_end is not None:
            on_train_end(accelerator.unwrap_model(model), accelerator)
        if ema is not None:  # the saved and evaluated model is the average
            ema.copy_to(accelerator.unwrap_model(model))
        eval_metrics = with_depths(eval_dl)
        test_metrics = evaluate_split(model, test_dl, accelerator, task)
        if built.masked_images is not None:
            with accelerator.autocast():
                test_metrics.update(built.masked_images(accelerator.unwrap_model(model), "test"))
        accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        stage = work_dir / "final"
        shutil.rmtree(stage, ignore_errors=True)
        unwrapped = accelerator.unwrap_model(model)
        unwrapped.save_pretrained(stage, state_dict=accelerator.get_state_dict(model))
        built.processor.save_pretrained(stage)
        result = RunResult(
            loop="train-accelerate",
            args=args,
            model=unwrapped,
            data=data,
            task=task,
            epochs=schedule.epochs,
            learning_rate=schedule.learning_rate,
            world_size=accelerator.num_processes,
            global_step=step,
            train={
                "train_runtime": round(train_time, 2),
                "train_loss": loss_sum / step if step else None,  # the whole run, resumed parts included
                "global_step": step,
                "steps_this_process": step - start_step,
            },
            eval=eval_metrics,
            test=test_metrics,
            log_history=history,
            start_time=start,
            resumed_from=str(resume_from) if resume_from else None,
            warnings=built.warnings,
        )
        finish_run(stage, result, output_dir, work_dir)
    accelerator.wait_for_everyone()
    accelerator.end_training()
    return 0


def main(argv: list[str] | None = None, *, on_train_end: Callable[[Any, Any], None] | None = None) -> int:
    """CLI entry point; `on_train_end(model, accelerator)` runs on every process after the last step."""
    return run_command(
        "train-accelerate",
        parse,
        lambda args: run(args, on_train_end),
        list(sys.argv[1:] if argv is None else argv),
    )


if __name__ == "__main__":
    raise SystemExit(main())
