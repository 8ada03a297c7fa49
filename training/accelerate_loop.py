"""`energyformers train-accelerate`: the same training as `energyformers train`, as a plain Accelerate loop.

For users who write their own loops: `Accelerator` with mixed precision and `save_state`/`load_state` checkpoints,
and gradient accumulation over windows whose labels are counted first (`train_step`), as `Trainer` does. The
flags (`training/arguments.py`), the model and data (`training/setup.py`), the schedule and loss
(`training/optimization.py`) and the finished folder (`training/run_folder.py`) are those of the Trainer CLI.

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
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .arguments import (
    NO_TRACKERS,
    Arguments,
    RunArguments,
    parse_arguments,
    quiet_libraries,
    tracker_config,
    tracker_folder,
    tracker_run_name,
)
from .cli import run_command
from .interrupt import EvaluationStopped, StopRequest
from .train import written_folders

if TYPE_CHECKING:  # annotations only: the CLI parses the flags before torch and accelerate are imported
    from accelerate import Accelerator

    from .augmentation import ExponentialMovingAverage
    from .optimization import Schedule, TrainingLoss
    from .setup import Built

PROG = "energyformers train-accelerate"
DESCRIPTION = "Train a Hyper-SET / iMixer / HyperBF model with a plain Accelerate loop (no Trainer)."
STATE_FILE = "loop_state.json"  # our step counter, loss sum and log history, next to Accelerate's state files
EMA_FILE = "ema_model.safetensors"


def accelerate_checkpoints(work_dir: Path) -> list[Path]:
    """The loop's complete checkpoints in `work_dir` (STATE_FILE is written last), oldest first."""
    found = [p for p in work_dir.glob("step_*") if (p / STATE_FILE).is_file()]
    return sorted(found, key=lambda p: int(p.name.split("_")[1]))


def read_loop_state(checkpoint: Path) -> dict[str, Any]:
    """The loop state `save_checkpoint` wrote into `checkpoint` (its step, log history and loss sum), read before
    any work (`run`) and again to resume; a `UsageError` naming the file when it is not that."""
    from .cli import UsageError
    from .weights import read_json_object

    try:
        return read_json_object(
            checkpoint / STATE_FILE,
            {"step": int, "history": list},
            optional={"loss_sum": (int, float)},
            remedy=f"delete {checkpoint} to resume from an earlier checkpoint, or {checkpoint.parent} to start again",
        )
    except ValueError as err:
        raise UsageError(str(err)) from None


def sample_losses(logits: Any, labels: Any) -> tuple[Any, Any]:
    """Per sample: the sum of its cross-entropy terms and their count (1 per classified sample, its labelled
    tokens or masked positions otherwise; label -100 is ignored, as in the models' loss). Summed over a split and
    divided, they give the split's loss whatever the batches and processes: a batch mean cannot, since a process's
    last batch may hold a sample repeated to even out the processes, and its mean counts that sample."""
    import torch.nn.functional as F

    # logits (B, V) or (B, N, V) → (M, V) and labels → (M,), M = B or B·N; the terms go back to labels' shape
    terms = F.cross_entropy(
        logits.float().reshape(-1, logits.shape[-1]), labels.reshape(-1), ignore_index=-100, reduction="none"
    ).reshape(labels.shape)
    valid = labels != -100
    dims = tuple(range(1, labels.dim()))
    if not dims:
        return terms, valid.float()
    return terms.sum(dims), valid.sum(dims).float()


def evaluate_split(
    model: Any, loader: Any, accelerator: Any, task: str, stop: StopRequest | None = None
) -> dict[str, float]:
    """Loss and the task's metrics (`evaluation.task_metrics`) over a whole split, gathered across processes
    (duplicates dropped). With `stop`, the ranks ask it after each batch (`StopRequest.evaluation_check`) and
    raise `EvaluationStopped` together."""
    import torch

    from ..center_cache import centers_scope
    from .evaluation import task_metrics

    model.eval()
    predictions, references, loss_sums, counts = [], [], [], []
    check = stop.evaluation_check(accelerator.device) if stop is not None else None
    # HyperBF computes what its centers give once for the split, not at every batch: no weight changes here
    with torch.no_grad(), centers_scope(model):
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
            if check is not None:
                try:
                    check.batch_done()
                except EvaluationStopped:
                    model.train()
                    raise
    model.train()
    p, r = torch.cat(predictions).numpy(), torch.cat(references).numpy()
    loss = (torch.cat(loss_sums).sum() / torch.cat(counts).sum()).item()
    return {"loss": loss, **task_metrics(task, p, r)}


def parse(argv: list[str]) -> Arguments:
    """The checked arguments (no torch, no model loaded: `cli.run_command` imports those afterwards)."""
    return parse_arguments(argv, PROG, DESCRIPTION)


@dataclass
class LoopParts:
    """What the setup builds once and every step reads: the prepared model, optimizer, scheduler and loaders."""

    args: Arguments
    accelerator: Accelerator
    built: Built  # the model before `prepare`, the data, collator, processor, task
    model: Any  # `accelerator.prepare`d (DDP-wrapped with several processes)
    optimizer: Any
    scheduler: Any
    train_dl: Any
    eval_dl: Any
    test_dl: Any
    schedule: Schedule
    training_loss: TrainingLoss
    ema: ExponentialMovingAverage | None
    depths: list[int]  # the iteration counts each evaluation also reports (`evaluation.depth_metrics`)
    work_dir: Path  # the checkpoints (`<output_dir>.checkpoints/`)

    @property
    def unwrapped(self) -> Any:
        """The model without its DDP/compile wrappers (what the EMA, decoding and saving act on)."""
        return self.accelerator.unwrap_model(self.model)


@dataclass
class LoopState:
    """Where training stands: what a checkpoint saves (`step`, `history`, `loss_sum`) and the open log window."""

    step: int
    history: list[dict[str, float]]
    loss_sum: (
        float  # the logged steps' losses (each the processes' mean) summed: / step is the run's mean loss
    )
    running: Any  # the window's summed loss since the last log (a scalar tensor on the device)
    start_step: int  # the step this process started from (after a resume, the checkpoint's)
    seen: int = 0  # optimizer steps in the open window
    # the step of the last checkpoint, resumed from or saved (the same on every rank)
    saved_at: int | None = None
    # a resume inside an epoch: the checkpoint's RNG states, set again once the resumed epoch's first window is
    # drawn (`resume_rng_after_first_window`)
    checkpoint_rng: dict[str, Any] | None = None


def make_accelerator(run_args: RunArguments, work_dir: Path) -> Accelerator:
    """The `Accelerator` of the run: precision from the flags; the scheduler is ours to step, and so is gradient
    accumulation (`train_step`: its loss is normalised over the whole window, which `accelerator.backward`'s
    division by the accumulation steps would undo); the trackers of `--report_to` (`start_trackers` starts them),
    those that write files in `arguments.tracker_folder` (under `work_dir` unless `--logging_dir`)."""
    import torch
    from accelerate import Accelerator, DataLoaderConfiguration

    trackers = {}
    if run_args.report_to != list(NO_TRACKERS):
        trackers = {
            "log_with": run_args.report_to,
            "project_dir": tracker_folder(run_args, work_dir),
        }
    return Accelerator(
        cpu=not torch.cuda.is_available(),  # required for real multi-process DDP over gloo on a CPU machine
        mixed_precision=run_args.precision,
        step_scheduler_with_optimizer=False,  # we step the scheduler once per optimizer step ourselves
        dataloader_config=DataLoaderConfiguration(use_seedable_sampler=True),  # same order on resume
        **trackers,
    )


def start_trackers(args: Arguments, accelerator: Accelerator) -> None:
    """`init_trackers` with the run's name (`tracker_run_name`: accelerate's project name, TensorBoard's subfolder)
    and its arguments as one flat dict (`tracker_config`); nothing without `--report_to`."""
    if accelerator.log_with:
        accelerator.init_trackers(tracker_run_name(args.run), config=tracker_config(args))


def log_to_trackers(accelerator: Accelerator, entry: dict[str, float]) -> None:
    """`entry` (a log-history entry: its `step` and scalars) to the trackers, under the names Trainer's callbacks
    give the same scalars (`transformers.integrations.rewrite_logs`: train/loss, eval/accuracy, test/accuracy), so
    the two loops' runs line up in one tracker."""
    if not accelerator.trackers:
        return
    from transformers.integrations import rewrite_logs

    scalars = {key: value for key, value in entry.items() if key != "step"}
    accelerator.log(rewrite_logs(scalars), step=entry["step"])


def finish_trackers(accelerator: Accelerator) -> None:
    """Finish the trackers (what `end_training` does first) before the finished folder is written, which takes
    the files they wrote in the work folder along (`run_folder.finish_run`); `end_training` then finds none."""
    for tracker in accelerator.trackers:
        tracker.finish()
    accelerator.trackers.clear()


def make_loaders(built: Built, run_args: RunArguments) -> tuple[Any, Any, Any]:
    """The train (shuffled), validation and test `DataLoader`s, before `prepare`."""
    import torch
    from torch.utils.data import DataLoader

    def loader(split: str, batch_size: int, shuffle: bool) -> DataLoader:
        return DataLoader(
            built.data[split],
            batch_size=batch_size,
            shuffle=shuffle,
            collate_fn=built.collator,
            num_workers=run_args.dataloader_num_workers,
            persistent_workers=run_args.dataloader_persistent_workers,
            # as Trainer: pinned only where there is an accelerator to copy to (`TrainingArguments(use_cpu=True)`
            # turns it off)
            pin_memory=run_args.dataloader_pin_memory and torch.cuda.is_available(),
        )

    return (
        loader("train", run_args.per_device_train_batch_size, True),
        loader("validation", run_args.per_device_eval_batch_size, False),
        loader("test", run_args.per_device_eval_batch_size, False),
    )


def prepare_training(
    args: Arguments, accelerator: Accelerator, work_dir: Path, resume_from: Path | None
) -> LoopParts:
    """Build the model and data, record the run's arguments, make the optimizer and scheduler and `prepare` them
    with the loaders; the EMA starts from the built weights (a resume loads its own afterwards)."""
    import torch

    from .evaluation import eval_depths, load_metrics
    from .optimization import TrainingLoss, make_scheduler, param_groups, plan_schedule
    from .setup import (
        announce_run,
        build,
        check_resume_arguments,
        enable_activation_checkpointing,
        record_run_arguments,
        seed_run,
    )

    run_args = args.run
    # transformers' seeding in both loops: with --full_determinism, enable_full_determinism (Trainer's effect of
    # the flag); accelerate's set_seed(deterministic=True) would not set cuDNN's flags or CUBLAS_WORKSPACE_CONFIG
    seed_run(run_args)
    built = build(args, accelerator.state)
    if resume_from is not None:  # what was built against the record, before `load_state`
        check_resume_arguments(args, built, work_dir, resume_from)
    training_loss = TrainingLoss(args, built)
    if accelerator.is_main_process:
        record_run_arguments(args, built, work_dir)  # what a --resume must repeat (`check_resume_arguments`)
        announce_run(built, args.data.dataset, accelerator.num_processes)
    with accelerator.local_main_process_first():  # evaluate copies the metric scripts into its module cache
        load_metrics()
    schedule = plan_schedule(args, built.task, len(built.data["train"]), accelerator.num_processes)
    train_dl, eval_dl, test_dl = make_loaders(built, run_args)
    model = built.model
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
    scheduler = accelerator.prepare(make_scheduler(args, optimizer, schedule))  # save_state includes it
    ema = None
    if run_args.ema_decay is not None:
        from .augmentation import ExponentialMovingAverage

        ema = ExponentialMovingAverage(accelerator.unwrap_model(model), run_args.ema_decay)
    return LoopParts(
        args=args,
        accelerator=accelerator,
        built=built,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        train_dl=train_dl,
        eval_dl=eval_dl,
        test_dl=test_dl,
        schedule=schedule,
        training_loss=training_loss,
        ema=ema,
        depths=eval_depths(accelerator.unwrap_model(model), run_args.eval_iterations),
        work_dir=work_dir,
    )


# The accelerators whose global generators transformers' Trainer saves and restores beside Python's, numpy's and the
# CPU's (`Trainer._save_rng_state`, `_load_rng_state`), by its keys, with the `transformers.utils` check of each;
# tests/test_accelerate_loop.py checks the keys against the installed Trainer's.
DEVICE_GENERATORS = {
    "cuda": None,  # torch.cuda.is_available()
    "xla": "is_torch_xla_available",
    "npu": "is_torch_npu_available",
    "hpu": "is_torch_hpu_available",
    "mlu": "is_torch_mlu_available",
    "musa": "is_torch_musa_available",
}


def device_generators() -> dict[str, Any]:
    """The generator module of each accelerator of `DEVICE_GENERATORS` present here, by key: an object with
    `get_rng_state_all()` and `set_rng_state_all(states)` over every device of the process (torch.cuda, torch.npu,
    ...; XLA's one state through torch_xla's `xla_model`)."""
    from types import SimpleNamespace

    import torch
    import transformers.utils

    found: dict[str, Any] = {}
    for key, check in DEVICE_GENERATORS.items():
        available = torch.cuda.is_available() if check is None else getattr(transformers.utils, check)()
        if not available:
            continue
        if key == "xla":
            import torch_xla.core.xla_model as xm

            found[key] = SimpleNamespace(
                get_rng_state_all=xm.get_rng_state, set_rng_state_all=xm.set_rng_state
            )
        else:
            found[key] = getattr(torch, key)
    return found


def rng_states() -> dict[str, Any]:
    """The global generators `accelerator.load_state` restores here, as Trainer reads them for its checkpoints:
    Python's, numpy's, torch's CPU one and each accelerator's present (`device_generators`)."""
    import random

    import numpy as np
    import torch

    states = {"random": random.getstate(), "numpy": np.random.get_state(), "torch": torch.get_rng_state()}
    for key, generator in device_generators().items():
        states[key] = generator.get_rng_state_all()
    return states


def set_rng_states(states: dict[str, Any]) -> None:
    """Set the generators `rng_states` read; one `states` lacks (a record of an older version, or of a machine
    without that accelerator) is left as it is."""
    import random

    import numpy as np
    import torch

    if "random" in states:
        random.setstate(states["random"])
    if "numpy" in states:
        np.random.set_state(states["numpy"])
    if "torch" in states:
        torch.set_rng_state(states["torch"])
    for key, generator in device_generators().items():
        if key in states:
            generator.set_rng_state_all(states[key])


def restore_progress(parts: LoopParts, resume_from: Path | None) -> LoopState:
    """Step 0, or the checkpoint's model, optimizer, scheduler, RNG, EMA and loop state; the sampled depths and
    training masks then continue from the step the run stands at. A resume inside an epoch keeps the checkpoint's
    RNG states in `checkpoint_rng`, for `resume_rng_after_first_window`."""
    import torch

    from .setup import continue_iteration_draws

    accelerator, run_args = parts.accelerator, parts.args.run
    step, history, loss_sum, checkpoint_rng = 0, [], 0.0, None
    if resume_from is not None:
        accelerator.load_state(str(resume_from))
        saved = read_loop_state(resume_from)
        step, history, loss_sum = saved["step"], saved["history"], saved.get("loss_sum") or 0.0
        if parts.ema is not None:  # the file is there (`check_ema_file` in `run`)
            from safetensors.torch import load_file

            parts.ema.load_state_dict(load_file(str(resume_from / EMA_FILE), device=str(accelerator.device)))
        accelerator.print(f"resuming from step {step} ({resume_from})")
        if step % parts.schedule.steps_per_epoch:
            checkpoint_rng = rng_states()
    # sampled depths (iteration_sampling) continue where the interrupted run stopped
    continue_iteration_draws(parts.unwrapped, step, len(parts.train_dl), run_args.gradient_accumulation_steps)
    collator = parts.built.collator
    if hasattr(collator, "check_loader"):  # masks that DataLoader workers can number exactly
        collator.check_loader(parts.train_dl)
    running = torch.zeros((), device=accelerator.device)
    saved_at = step if resume_from is not None else None
    return LoopState(
        step=step,
        history=history,
        loss_sum=loss_sum,
        running=running,
        start_step=step,
        saved_at=saved_at,
        checkpoint_rng=checkpoint_rng,
    )


def resume_rng_after_first_window(state: LoopState) -> None:
    """Set the checkpoint's RNG states again once a resume inside an epoch has drawn that epoch's first window, as
    Trainer does (`_load_rng_state` after its first `get_batch_samples`). The uninterrupted run started the epoch's
    loader iterator (which draws its base seed, the DataLoader workers' seeds, from torch's generator) before the
    checkpoint; the resumed run starts it again after `load_state`, so that draw would shift every later one of
    torch's generator (augmentation, mixup, drop-path) by one. At an epoch's start the uninterrupted run starts the
    iterator after the checkpoint too, so the states `load_state` set stand."""
    if state.checkpoint_rng is not None:
        set_rng_states(state.checkpoint_rng)
        state.checkpoint_rng = None


def log_entry(parts: LoopParts, state: LoopState, entry: dict[str, float]) -> None:
    """Add `entry` to the log history and print it, rounded. Every rank computes the same entry (the reduced loss,
    the gathered metrics): the main process prints it, as Trainer logs; `tqdm.write` keeps the bar intact."""
    from tqdm.auto import tqdm

    state.history.append(entry)
    log_to_trackers(parts.accelerator, entry)
    if parts.accelerator.is_main_process:
        tqdm.write(json.dumps({k: round(v, 5) for k, v in entry.items()}))


def log_window(parts: LoopParts, state: LoopState, extra: dict[str, float]) -> None:
    """Log the mean loss since the last log and add the window to the run's loss sum."""
    window = parts.accelerator.reduce(state.running, reduction="mean").item()
    state.loss_sum += window
    log_entry(parts, state, {"step": state.step, "loss": window / state.seen, **extra})
    state.running.zero_()
    state.seen = 0


def evaluate_validation(parts: LoopParts, stop: StopRequest | None = None) -> dict[str, float]:
    """The validation split's loss and metrics, for masked image modelling the reconstruction metrics after
    decoding, and the accuracy at each depth of `parts.depths` (`depth_metrics`); with `stop`, each of these
    passes ends at its next batch once a stop is agreed (`EvaluationStopped`)."""
    from .evaluation import depth_metrics

    accelerator, task = parts.accelerator, parts.built.task
    metrics = evaluate_split(parts.model, parts.eval_dl, accelerator, task, stop)
    if parts.built.masked_images is not None:
        with accelerator.autocast():
            metrics.update(parts.built.masked_images(parts.unwrapped, "validation", stop=stop))
    if parts.depths:
        gather = accelerator.gather_for_metrics
        metrics.update(depth_metrics(parts.model, parts.eval_dl, gather, task, parts.depths, stop=stop))
    return metrics


def evaluate_test(parts: LoopParts, stop: StopRequest | None = None) -> dict[str, float]:
    """The test split's loss and metrics, for masked image modelling the reconstruction metrics after decoding;
    `stop`: `evaluate_validation`'s."""
    metrics = evaluate_split(parts.model, parts.test_dl, parts.accelerator, parts.built.task, stop)
    if parts.built.masked_images is not None:
        with parts.accelerator.autocast():
            metrics.update(parts.built.masked_images(parts.unwrapped, "test", stop=stop))
    return metrics


def log_evaluation(parts: LoopParts, state: LoopState, stop: StopRequest) -> None:
    """Evaluate on the validation split (with the EMA's averaged weights when there is one) and log it; at a stop
    request (`stop`), none starts and one in progress ends at its next batch (`EvaluationStopped`), unlogged."""
    if stop.agreed:
        return
    if parts.ema is None:
        metrics = evaluate_validation(parts, stop)
    else:
        with parts.ema.averaged_weights(parts.unwrapped):
            metrics = evaluate_validation(parts, stop)
    log_entry(parts, state, {"step": state.step, **{f"eval_{k}": v for k, v in metrics.items()}})


def save_checkpoint(parts: LoopParts, state: LoopState) -> None:
    """`save_state` in `step_<step>/`, the EMA and the loop state beside it (STATE_FILE last: the checkpoint is
    complete), then drop the checkpoints beyond `--save_total_limit`."""
    accelerator, work_dir = parts.accelerator, parts.work_dir
    state.saved_at = state.step
    if state.seen:  # log the open window first, so the saved loss sum covers every step up to here
        log_window(parts, state, {})
    target = work_dir / f"step_{state.step}"
    accelerator.save_state(str(target), safe_serialization=True)
    if accelerator.is_main_process:
        if parts.ema is not None:
            from safetensors.torch import save_file

            save_file({k: v.cpu() for k, v in parts.ema.state_dict().items()}, str(target / EMA_FILE))
        saved = {"step": state.step, "history": state.history, "loss_sum": state.loss_sum}
        # through a temporary file: a process killed while writing leaves no STATE_FILE (an incomplete checkpoint,
        # which a resume passes over), never a truncated one
        tmp = target / (STATE_FILE + ".tmp")
        tmp.write_text(json.dumps(saved))
        os.replace(tmp, target / STATE_FILE)
        for old in accelerate_checkpoints(work_dir)[: -parts.args.run.save_total_limit]:
            shutil.rmtree(old, ignore_errors=True)
    accelerator.wait_for_everyone()


def epoch_batches(parts: LoopParts, step: int) -> Iterable[Any]:
    """The training batches of the epoch that `step` is in, from where `step` stands in it."""
    run_args = parts.args.run
    epoch, done_in_epoch = divmod(step, parts.schedule.steps_per_epoch)
    parts.train_dl.set_epoch(epoch)
    # After a resume, skip the micro-batches this epoch already consumed (same order: seedable sampler).
    skip = done_in_epoch * run_args.gradient_accumulation_steps
    batches = parts.accelerator.skip_first_batches(parts.train_dl, skip) if skip else parts.train_dl
    # The training masks continue where the run stands: the index of this epoch's first batch to collate (the
    # prepared loader's length: this process's batches an epoch), set before the iterator starts the DataLoader
    # workers, which number their batches from it.
    if hasattr(parts.built.collator, "continue_after"):
        parts.built.collator.continue_after(step, len(parts.train_dl), run_args.gradient_accumulation_steps)
    return batches


def accepts_loss_kwargs(model: Any) -> bool:
    """Whether `model`'s forward takes `num_items_in_batch`, decided as `Trainer` decides it: its
    `accepts_loss_kwargs`, else whether its forward takes `**kwargs`."""
    import inspect

    if hasattr(model, "accepts_loss_kwargs"):
        return bool(model.accepts_loss_kwargs)
    parameters = inspect.signature(model.forward).parameters.values()
    return any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters)


def accumulation_windows(batches: Iterable[Any], size: int) -> Iterator[list[Any]]:
    """`batches` in lists of `size` (the last one of an epoch takes what is left): one optimizer step each."""
    window = []
    for batch in batches:
        window.append(batch)
        if len(window) == size:
            yield window
            window = []
    if window:
        yield window


def train_step(parts: LoopParts, window: list[dict[str, Any]], counts_items: bool) -> Any:
    """Forward and backward of the micro-batches of one accumulation window, then the optimizer step. Returns the
    window's loss (a detached scalar; its mean over the processes is the window's loss).

    `counts_items` (the model takes `num_items_in_batch`, `accepts_loss_kwargs`): as `Trainer`, the labels ≠ −100
    of the whole window are counted first, over all processes, and every micro-batch's summed loss is divided by
    that count, so the window gives the loss and gradient of one batch of all its samples (tokens, masked
    positions); the loss is multiplied by the number of processes, whose gradients DDP averages. Otherwise each
    micro-batch's mean loss is divided by the window's length."""
    from contextlib import nullcontext

    accelerator, model, run_args = parts.accelerator, parts.model, parts.args.run
    count = None
    if counts_items:
        local = sum((batch["labels"] != -100).sum() for batch in window)
        count = accelerator.gather(local).sum()  # a device tensor: no host read
    total = 0.0
    for index, batch in enumerate(window):
        # the gradients are reduced across processes once, with the window's last backward
        last = index == len(window) - 1
        with nullcontext() if last else accelerator.no_sync(model):
            if parts.training_loss.active:
                loss, _ = parts.training_loss(model, batch, count)
            elif count is not None:
                loss = model(**batch, num_items_in_batch=count).loss
            else:
                loss = model(**batch).loss
            loss = loss / len(window) if count is None else loss * accelerator.num_processes
            accelerator.backward(loss)
        total = total + loss.detach().float()
    if run_args.max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), run_args.max_grad_norm)
    parts.optimizer.step()
    parts.optimizer.zero_grad()
    return total


def after_optimizer_step(parts: LoopParts, state: LoopState, learning_rate: float, stop: StopRequest) -> None:
    """Log, evaluate and save at the step boundaries of the schedule (`--logging_steps`, `--eval_steps`,
    `--save_steps`); `stop`: `log_evaluation`'s."""
    schedule, step = parts.schedule, state.step
    if step % schedule.logging_steps == 0 or step == schedule.total_steps:
        log_window(parts, state, {"learning_rate": learning_rate})
    if schedule.eval_strategy == "steps" and step % schedule.eval_steps == 0:
        log_evaluation(parts, state, stop)
    if schedule.save_strategy == "steps" and step % schedule.save_steps == 0:  # as Trainer
        save_checkpoint(parts, state)


def after_epoch(parts: LoopParts, state: LoopState, stop: StopRequest) -> None:
    """Evaluate and save at the end of an epoch (or of the run) with the `epoch` strategies; `stop`:
    `log_evaluation`'s."""
    schedule = parts.schedule
    if not (state.step % schedule.steps_per_epoch == 0 or state.step >= schedule.total_steps):
        return  # left the epoch early: stopped on request
    if schedule.eval_strategy == "epoch":
        log_evaluation(parts, state, stop)
    if schedule.save_strategy == "epoch":
        save_checkpoint(parts, state)


def train(parts: LoopParts, state: LoopState, stop: StopRequest) -> None:
    """Optimizer steps until the schedule's last, or until the ranks agree to stop on SIGTERM/SIGINT (`stop`,
    whose handlers the caller installs)."""
    from tqdm.auto import tqdm

    accelerator, run_args, schedule = parts.accelerator, parts.args.run, parts.schedule
    progress = tqdm(
        total=schedule.total_steps,
        initial=state.step,
        disable=run_args.disable_tqdm or not accelerator.is_local_main_process,
        dynamic_ncols=True,
    )
    parts.model.train()
    counts_items = accepts_loss_kwargs(parts.unwrapped)
    # `stop.agreed` (the ranks' common answer, `StopRequest.should_stop` after every optimizer step), never a
    # rank's own signal: every rank must leave the loop after the same step
    while state.step < schedule.total_steps and not stop.agreed:
        batches = epoch_batches(parts, state.step)
        for window in accumulation_windows(batches, run_args.gradient_accumulation_steps):
            resume_rng_after_first_window(state)
            state.running += train_step(parts, window, counts_items)
            # the rate this step used (what Trainer logs), before the scheduler moves on
            learning_rate = parts.scheduler.get_last_lr()[0]
            parts.scheduler.step()
            if parts.ema is not None:
                parts.ema.update(parts.unwrapped)
            state.step, state.seen = state.step + 1, state.seen + 1
            progress.update(1)
            # asked before the step's evaluation, which then does not start (`log_evaluation`)
            stop.should_stop(accelerator.device)
            try:
                after_optimizer_step(parts, state, learning_rate, stop)
            except EvaluationStopped:
                pass  # `stop.agreed`: the ranks stop after this step
            if stop.agreed or state.step >= schedule.total_steps:
                break  # stop after this step
        try:
            after_epoch(parts, state, stop)
        except EvaluationStopped:
            pass
    progress.close()


def stop_with_checkpoint(
    parts: LoopParts, state: LoopState, stop: StopRequest, final_evaluation: bool = False
) -> int:
    """After an agreed stop: save the step reached unless just saved, print how to resume; the exit status.
    `final_evaluation`: the stop came in the evaluations after the last step (`StopRequest.report`)."""
    if state.saved_at != state.step:  # not a file check: another machine's ranks may not see rank 0's files
        save_checkpoint(parts, state)
    parts.accelerator.end_training()
    if parts.accelerator.is_main_process:
        return stop.report(
            "train-accelerate", parts.args.argv, state.step, parts.work_dir, final_evaluation=final_evaluation
        )
    return 128 + int(stop.signum or 0)


def write_model_folder(
    parts: LoopParts,
    state: LoopState,
    *,
    output_dir: Path,
    eval_metrics: dict[str, float],
    test_metrics: dict[str, float],
    start: float,
    train_time: float,
    resume_from: Path | None,
) -> None:
    """The finished run folder in `output_dir` (main process): the model and processor, staged in the work
    directory, with the metrics, curve and card (`run_folder.finish_run`)."""
    from .run_folder import RunResult, finish_run
    from .setup import STAGE_FOLDER

    accelerator, built, step = parts.accelerator, parts.built, state.step
    stage = parts.work_dir / STAGE_FOLDER
    shutil.rmtree(stage, ignore_errors=True)
    unwrapped = parts.unwrapped
    unwrapped.save_pretrained(stage, state_dict=accelerator.get_state_dict(parts.model))
    built.processor.save_pretrained(stage)
    result = RunResult(
        loop="train-accelerate",
        args=parts.args,
        model=unwrapped,
        data=built.data,
        task=built.task,
        epochs=parts.schedule.epochs,
        learning_rate=parts.schedule.learning_rate,
        world_size=accelerator.num_processes,
        global_step=step,
        train={
            "train_runtime": round(train_time, 2),
            "train_loss": state.loss_sum / step if step else None,  # the whole run, resumed parts included
            "global_step": step,
            "steps_this_process": step - state.start_step,
        },
        eval=eval_metrics,
        test=test_metrics,
        log_history=state.history,
        start_time=start,
        resumed_from=str(resume_from) if resume_from else None,
        warnings=built.warnings,
    )
    finish_run(stage, result, output_dir, parts.work_dir)


def run(args: Arguments, on_train_end: Callable[[Any, Any], None] | None = None) -> int:
    """Train as `args` say; returns the exit status (0, or 128 + the signal when stopped by SIGTERM/SIGINT)."""
    start = time.time()
    quiet_libraries()
    import torch

    from .optimization import check_schedule
    from .run_folder import leave_nothing_behind
    from .setup import check_precision, find_checkpoint, output_paths
    from .train import check_ema_file, trainer_checkpoints

    if args.run.num_threads:
        torch.set_num_threads(args.run.num_threads)
    check_precision(args.run.precision)
    # the rest of the run holds the output folder's lock (released however the run ends)
    with output_paths(args) as (output_dir, work_dir):
        checkpoints = {
            "train": trainer_checkpoints(work_dir),
            "train-accelerate": accelerate_checkpoints(work_dir),
        }
        resume_from = find_checkpoint(args, work_dir, "train-accelerate", checkpoints)
        # a damaged state file refused before any work, not after the data is built; so is --ema_decay added to
        # a run without one (the loop writes the EMA file before the state file, so only such a run lacks it)
        if resume_from is not None:
            read_loop_state(resume_from)
            if args.run.ema_decay is not None:
                check_ema_file(resume_from)
        check_schedule(args)

        accelerator = make_accelerator(args.run, work_dir)
        with leave_nothing_behind(work_dir, accelerator.is_main_process):
            parts = prepare_training(args, accelerator, work_dir, resume_from)
            state = restore_progress(parts, resume_from)
            start_trackers(args, accelerator)
            stop = StopRequest()
            # the handlers stay for the final evaluations: a stop there ends them at their next batch too, and the
            # run, its last step checkpointed first, resumes to them
            with stop.installed(
                several_processes=accelerator.num_processes > 1, announce=accelerator.is_main_process
            ):
                train(parts, state, stop)
                if stop.agreed:
                    return stop_with_checkpoint(parts, state, stop)
                train_time = time.time() - start
                if state.saved_at != state.step:  # the live weights, before the EMA replaces them below
                    save_checkpoint(parts, state)

                if on_train_end is not None:
                    on_train_end(parts.unwrapped, accelerator)
                if parts.ema is not None:  # the saved and evaluated model is the average
                    parts.ema.copy_to(parts.unwrapped)
                try:
                    eval_metrics, test_metrics = evaluate_validation(parts, stop), evaluate_test(parts, stop)
                except EvaluationStopped:
                    return stop_with_checkpoint(parts, state, stop, final_evaluation=True)
            # the saved weights' numbers, as Trainer's final evaluations log them
            log_to_trackers(
                accelerator, {"step": state.step, **{f"eval_{k}": v for k, v in eval_metrics.items()}}
            )
            log_to_trackers(
                accelerator, {"step": state.step, **{f"test_{k}": v for k, v in test_metrics.items()}}
            )
            finish_trackers(accelerator)
            accelerator.wait_for_everyone()
        if accelerator.is_main_process:
            write_model_folder(
                parts,
                state,
                output_dir=output_dir,
                eval_metrics=eval_metrics,
                test_metrics=test_metrics,
                start=start,
                train_time=train_time,
                resume_from=resume_from,
            )
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
        writes_to=written_folders,
    )


if __name__ == "__main__":
    raise SystemExit(main())
