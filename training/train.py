"""`energyformers train`: train any registered family on a dataset with `transformers.Trainer`.

    energyformers train --model hyperset --dataset digits --output_dir runs/demo-hyperset

The flags (`training/arguments.py`) are those of `energyformers train-accelerate`, with the same meanings;
the model and data come from `training/setup.py`, the finished folder from `training/run_folder.py`. Every
input is checked before training starts and before anything is written. Checkpoints go to
`<output_dir>.checkpoints/` (continue with `--resume`); the finished folder is renamed to `<output_dir>` in
one step, so `<output_dir>` is either complete or absent.
"""

from __future__ import annotations

import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

# Concise logs: silence tokenizers fork warnings before transformers is imported.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .arguments import (
    Arguments,
    check_best_model_metric,
    parse_arguments,
    quiet_libraries,
    tracker_folder,
    tracker_run_name,
)
from .cli import run_command
from .interrupt import EvaluationStopped, StopRequest

PROG = "energyformers train"
DESCRIPTION = "Train a Hyper-SET / iMixer / HyperBF model with transformers.Trainer."


def trainer_checkpoints(work_dir: Path) -> list[Path]:
    """Trainer's complete checkpoints in `work_dir` (trainer_state.json is written last), oldest first."""
    found = [p for p in work_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


# The fields of a checkpoint's trainer_state.json that Trainer's resume (or `whole_run_train_loss`) computes with;
# Trainer overwrites or only compares the others, so it resumes whatever they hold.
RESUMED_STATE_FIELDS = {
    "log_history": list,
    "total_flos": (int, float),
    "num_input_tokens_seen": int,
    "best_metric": (int, float),
}


def checkpoint_step(checkpoint: Path, remedy: str | None = None) -> int:
    """The step Trainer's `checkpoint` stands at (its trainer_state.json's global_step), read before any work; a
    `UsageError` naming the file, then `remedy`, when it is not a state Trainer wrote or one its resume cannot read
    (`check_trainer_state`)."""
    from .cli import UsageError
    from .weights import read_json_object

    path = checkpoint / "trainer_state.json"
    remedy = remedy or (
        f"delete {checkpoint} to resume from an earlier checkpoint, or {checkpoint.parent} to start again"
    )
    try:
        state = read_json_object(path, {"global_step": int}, optional=RESUMED_STATE_FIELDS, remedy=remedy)
        check_trainer_state(path, state, remedy)
    except ValueError as err:
        raise UsageError(str(err)) from None
    return state["global_step"]


def check_ema_file(checkpoint: Path, remedy: str | None = None) -> None:
    """A `UsageError` naming `checkpoint` (then `remedy`, by default deleting the work folder) when it holds no
    EMA file, which a run with `--ema_decay` continues its average from: both loops refuse such a resume rather
    than restart the average from the live weights."""
    from .augmentation import EMA_WEIGHTS_NAME
    from .cli import UsageError

    if not (checkpoint / EMA_WEIGHTS_NAME).is_file():
        raise UsageError(
            f"{checkpoint}: no {EMA_WEIGHTS_NAME}, which a run with --ema_decay continues its average from "
            f"(the run stopped before writing it, or ran without --ema_decay); "
            + (remedy or f"delete {checkpoint.parent} to start again")
        )


def resume_checkpoint(checkpoints: list[Path], ema: bool) -> tuple[Path, int]:
    """The checkpoint `--resume` continues from and its step: the newest of Trainer's `checkpoints` (oldest first)
    that holds all a resume reads. One whose trainer_state.json Trainer did not finish writing (a process killed
    then), or, for a run with an EMA (`ema`), one without the EMA file, is skipped with a warning for the one
    before it; a `UsageError` naming the newest's problem when none is whole."""
    from .cli import UsageError, launch_rank

    def step_of(checkpoint: Path, remedy: str | None = None) -> int:
        step = checkpoint_step(checkpoint, remedy)
        if ema:
            check_ema_file(checkpoint, remedy)
        return step

    skipped = []
    for index in range(len(checkpoints) - 1, -1, -1):
        checkpoint = checkpoints[index]
        try:
            step = step_of(checkpoint, "skipped" if index else None)
        except UsageError as err:
            if index == 0:
                step_of(checkpoints[-1])  # none is whole: the newest's error, with its remedy
                raise
            skipped.append(str(err))
            continue
        if launch_rank() == 0:
            for reason in skipped:
                print(
                    f"warning: {reason.rstrip('.')}: resuming from {checkpoint.name}",
                    file=sys.stderr,
                    flush=True,
                )
        return checkpoint, step
    raise UsageError("--resume: no checkpoint to resume from")  # `find_checkpoint` refused an empty list


def check_trainer_state(path: Path, state: dict[str, Any], remedy: str) -> None:
    """A ValueError in one line naming `path` (then `remedy`) when transformers' own loader
    (`TrainerState.load_from_json`) refuses the state `path` holds (`state`, its JSON object), e.g. a key
    TrainerState has no field for, or a log entry is not an object whose loss and step are numbers
    (`whole_run_train_loss` adds them up). The fields Trainer computes with are `checkpoint_step`'s."""
    from transformers.trainer_callback import TrainerState

    from .weights import has_type

    try:
        TrainerState.load_from_json(str(path))
    except (TypeError, ValueError) as err:
        raise ValueError(
            f"{path}: not a state transformers' Trainer reads ({' '.join(str(err).split())}); {remedy}."
        ) from None
    for index, entry in enumerate(state.get("log_history") or []):
        if not isinstance(entry, dict) or not all(
            has_type(entry[key], (int, float)) for key in ("loss", "step") if key in entry
        ):
            raise ValueError(
                f"{path}: log_history[{index}] is not an object whose loss and step are numbers; {remedy}."
            )


def whole_run_train_loss(
    log_history: list[dict[str, Any]], initial_step: int, loss_since: float, global_step: int
) -> float:
    """Mean training loss over the whole run: the logged windows up to the resumed checkpoint (a log is forced
    at every checkpoint step, so they end exactly there) plus Trainer's mean over the steps run since."""
    if initial_step == 0 or global_step == 0:
        return loss_since
    total, previous = 0.0, 0
    for entry in log_history:
        if "loss" in entry and "step" in entry and entry["step"] <= initial_step:
            total += entry["loss"] * (entry["step"] - previous)
            previous = entry["step"]
    return (total + loss_since * (global_step - initial_step)) / global_step


def resumed_log_history(
    log_history: list[dict[str, Any]], initial_step: int, train_loss: float
) -> list[dict[str, Any]]:
    """Trainer's log history of a run resumed from `initial_step`, as the uninterrupted run logs it: the summary
    row's `train_loss` (Trainer's: the mean of the steps since the resume) becomes the whole run's `train_loss`
    (`whole_run_train_loss`), and each row read back from the checkpoint (`trainer_state.json` sorts its keys)
    takes the key order of the first row logged since the resume with the same keys, where there is one."""
    if initial_step == 0:
        return log_history
    live: dict[frozenset[str], list[str]] = {}
    for entry in log_history:
        if entry.get("step", 0) > initial_step:
            live.setdefault(frozenset(entry), list(entry))
    history = []
    for entry in log_history:
        if "train_loss" in entry:
            entry = {**entry, "train_loss": train_loss}
        elif entry.get("step", 0) <= initial_step and frozenset(entry) in live:
            entry = {key: entry[key] for key in live[frozenset(entry)]}
        history.append(entry)
    return history


def restore_best_weights(trainer: Any, args: Arguments) -> dict[str, Any]:
    """After `trainer.train()`: which weights the model now holds, as metrics.json's `saved_weights` records it.

    Without `--load_best_model_at_end`: the last step's (the EMA of the last step with `--ema_decay`). With it,
    Trainer has loaded the best checkpoint's `model.safetensors`; with `--ema_decay` too, the evaluations that
    ranked the checkpoints ran on the EMA weights (`RecipeTrainer` swaps them in), so those are the ones the best
    step earned: they are read from the same checkpoint's EMA file, over the EMA of the last step that
    `EMACallback.on_train_end` left in the model. The buffers (not averaged) stay the checkpoint's."""
    state, run = trainer.state, args.run
    ema = run.ema_decay is not None
    if not run.load_best_model_at_end or state.best_model_checkpoint is None:
        saved: dict[str, Any] = {"weights": "last", "step": state.global_step, "ema": ema}
        if run.load_best_model_at_end:  # no evaluation came before the last step
            saved["reason"] = "no evaluation during training to pick a best checkpoint from"
        return saved
    best = Path(state.best_model_checkpoint)
    if ema:
        import torch
        from safetensors.torch import load_file

        from .augmentation import EMA_WEIGHTS_NAME

        averaged = load_file(str(best / EMA_WEIGHTS_NAME))
        model = trainer.accelerator.unwrap_model(trainer.model)
        with torch.no_grad():
            for name, param in model.named_parameters():
                param.copy_(averaged[name].to(param.device, param.dtype))
    metric = trainer.args.metric_for_best_model
    return {
        "weights": "best",
        "step": int(best.name.rsplit("-", 1)[-1]),
        "metric": metric if metric.startswith("eval_") else f"eval_{metric}",
        "value": state.best_metric,
        "greater_is_better": trainer.args.greater_is_better,
        "ema": ema,
        "last_step": state.global_step,
    }


def training_arguments(args: Any, work_dir: Path) -> Any:
    """transformers.TrainingArguments of the run; the data-dependent counts are set by `run` after setup."""
    from transformers import TrainingArguments

    from .optimization import cadence_strategies
    from .setup import check_precision, checkpointing_name

    run = args.run
    device_type = check_precision(run.precision)
    eval_strategy, save_strategy = cadence_strategies(args)
    return TrainingArguments(
        output_dir=str(work_dir),
        num_train_epochs=1,  # set from the schedule in run()
        max_steps=run.max_steps,
        per_device_train_batch_size=run.per_device_train_batch_size,
        per_device_eval_batch_size=run.per_device_eval_batch_size,
        learning_rate=run.learning_rate or 1e-3,  # set from the schedule in run()
        lr_scheduler_type=run.lr_scheduler_type,
        weight_decay=run.weight_decay,
        max_grad_norm=run.max_grad_norm,
        adam_beta1=run.adam_beta1,
        adam_beta2=run.adam_beta2,
        gradient_accumulation_steps=run.gradient_accumulation_steps,
        seed=run.seed,
        full_determinism=run.full_determinism,  # Trainer seeds again with it, as `setup.seed_run` did
        bf16=run.precision == "bf16",
        fp16=run.precision == "fp16",
        torch_compile=run.torch_compile,
        use_cpu=device_type == "cpu",
        **{checkpointing_name(): run.gradient_checkpointing},
        eval_strategy=eval_strategy,  # eval_steps / save_steps: set from the schedule in run()
        save_strategy=save_strategy,
        save_total_limit=run.save_total_limit,
        logging_strategy="steps",
        logging_steps=run.logging_steps or 10,  # set from the schedule in run()
        dataloader_num_workers=run.dataloader_num_workers,
        dataloader_persistent_workers=run.dataloader_persistent_workers,
        dataloader_pin_memory=run.dataloader_pin_memory,
        remove_unused_columns=False,  # the set_transform columns are produced on the fly
        # every parameter of every model the CLI builds gets a gradient at every step (halting head, deep
        # supervision and random depth included; tests/test_ddp_unused_parameters.py), as the Accelerate loop
        # assumes with DDP's own default: Trainer's default (True) costs an extra graph walk per step and a warning
        ddp_find_unused_parameters=False,
        disable_tqdm=run.disable_tqdm,
        # the trackers are transformers' own callbacks; --run_name's default is derived here since Trainer's
        # output_dir is the work folder. Where TensorBoard writes: `tensorboard_folder`
        report_to=run.report_to,
        run_name=tracker_run_name(run),
    )


@contextlib.contextmanager
def tensorboard_folder(args: Arguments, work_dir: Path) -> Iterator[None]:
    """While Trainer is built: TENSORBOARD_LOGGING_DIR (transformers' TensorBoardCallback reads it when built; its
    `logging_dir` of TrainingArguments is gone in transformers 5) set to `<tracker folder>/<run name>`, as the
    Accelerate loop's TensorBoard writes (`arguments.tracker_folder`), then put back."""
    name = "TENSORBOARD_LOGGING_DIR"
    before = os.environ.get(name)
    os.environ[name] = os.path.join(tracker_folder(args.run, work_dir), tracker_run_name(args.run))
    try:
        yield
    finally:
        if before is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = before


def reopen_tensorboard(trainer: Any) -> None:
    """Open the TensorBoard writer the final evaluations log to, with a file name of its own. Trainer closes its
    writer when training ends, and the next log opens a new one in the same folder; tensorboardX names event files
    by the second and the host only, so one opened within the same second would replace the training's file."""
    from transformers.integrations import TensorBoardCallback

    if not trainer.is_world_process_zero():  # the one that writes (the callback's own rule)
        return
    for callback in trainer.callback_handler.callbacks:
        if isinstance(callback, TensorBoardCallback) and callback.tb_writer is None:
            try:  # the callback's own choice: torch's writer needs tensorboard, else tensorboardX
                from torch.utils.tensorboard import SummaryWriter
            except ImportError:
                from tensorboardX import SummaryWriter
            callback.tb_writer = SummaryWriter(log_dir=callback.logging_dir, filename_suffix=".evaluation")


def close_tensorboard(trainer: Any) -> None:
    """Close the TensorBoard writer the final evaluations' logs opened again (Trainer closes its own at the end of
    training), before its folder is moved into the output folder (`run_folder.finish_run`)."""
    from transformers.integrations import TensorBoardCallback

    callback = trainer.pop_callback(TensorBoardCallback)
    if callback is not None:
        callback.on_train_end(trainer.args, trainer.state, trainer.control)


def parse(argv: list[str]) -> Arguments:
    """The checked arguments (no torch, no model loaded: `cli.run_command` imports those afterwards)."""
    return parse_arguments(argv, PROG, DESCRIPTION)


def run(args: Arguments, callbacks: list[Any] | None = None) -> int:
    """Train as `args` say; returns the exit status (0, or 128 + the signal when stopped by SIGTERM/SIGINT)."""
    start = time.time()
    quiet_libraries()
    import torch
    from accelerate import PartialState

    from .accelerate_loop import accelerate_checkpoints
    from .evaluation import TrainerMetrics, argmax_logits, eval_depths, load_metrics
    from .optimization import TrainingLoss, check_schedule, plan_schedule
    from .run_folder import RunResult, finish_run, leave_nothing_behind
    from .setup import (
        STAGE_FOLDER,
        announce_run,
        build,
        check_resume_arguments,
        find_checkpoint,
        output_paths,
        record_run_arguments,
    )
    from .trainer import ContinueRunCallback, RecipeTrainer, StopOnSignal

    if args.run.num_threads:
        torch.set_num_threads(args.run.num_threads)
    # the rest of the run holds the output folder's lock (released however the run ends)
    with output_paths(args) as (output_dir, work_dir):
        checkpoints = {
            "train": trainer_checkpoints(work_dir),
            "train-accelerate": accelerate_checkpoints(work_dir),
        }
        resume_from, initial_step = find_checkpoint(args, work_dir, "train", checkpoints), 0
        # a damaged checkpoint skipped or refused before any work, not after the data is built
        if resume_from is not None:
            resume_from, initial_step = resume_checkpoint(
                checkpoints["train"], args.run.ema_decay is not None
            )
        check_schedule(args)
        ta = training_arguments(args, work_dir)  # sets up the process group; writes no files
        main_process = ta.process_index == 0
        with leave_nothing_behind(work_dir, main_process):
            built = build(args, PartialState())
            depths = eval_depths(built.model, args.run.eval_iterations)
            if args.run.metric_for_best_model is not None:
                # the task as loaded (a local dataset may be per-token) and the depths the model as built is evaluated
                # at (unset --eval_iterations: its config's T decides them)
                check_best_model_metric(
                    args.run.metric_for_best_model,
                    built.task,
                    args.data.dataset,
                    depths,
                    built.model.config.model_type,
                )
            if resume_from is not None:  # what was built against the record, before the checkpoint is loaded
                check_resume_arguments(args, built, work_dir, resume_from)
            training_loss = TrainingLoss(args, built)
            schedule = plan_schedule(args, built.task, len(built.data["train"]), ta.world_size)
            ta.num_train_epochs = schedule.epochs + args.run.cooldown_epochs
            ta.learning_rate = schedule.learning_rate
            ta.warmup_steps = schedule.warmup_steps
            ta.logging_steps = schedule.logging_steps
            # the evaluation / checkpoint cadence of the Accelerate loop: `plan_schedule`'s, the one place it is set
            if schedule.eval_steps is not None:
                ta.eval_steps = schedule.eval_steps
            if schedule.save_steps is not None:
                ta.save_steps = schedule.save_steps
            if args.run.load_best_model_at_end:
                # set here, with the cadence, rather than in `training_arguments`: TrainingArguments checks save_steps
                # against eval_steps when it is built, before the run's own steps are known (`validate_best_model`
                # has checked those); the direction is transformers' default, lower only for a "loss"
                ta.load_best_model_at_end = True
                ta.metric_for_best_model = args.run.metric_for_best_model or "loss"
                ta.greater_is_better = not ta.metric_for_best_model.endswith("loss")
            if main_process:
                # what a --resume must repeat (`check_resume_arguments`)
                record_run_arguments(args, built, work_dir)
                announce_run(built, args.data.dataset, ta.world_size)
            stop = StopRequest()
            extra = [ContinueRunCallback(built.collator), StopOnSignal(stop)]
            ema = None
            if args.run.ema_decay is not None:
                from .augmentation import EMACallback

                # RecipeTrainer swaps the averages in for each whole evaluation (its depth and decoding passes too)
                ema = EMACallback(args.run.ema_decay, swap_for_evaluation=False)
                extra.append(ema)
            # evaluate copies the scripts into its module cache
            with PartialState().local_main_process_first():
                load_metrics()

            with tensorboard_folder(args, work_dir):
                trainer = RecipeTrainer(
                    model=built.model,
                    args=ta,
                    train_dataset=built.data["train"],
                    eval_dataset=built.data["validation"],
                    processing_class=built.processor,
                    data_collator=built.collator,
                    compute_metrics=TrainerMetrics(built.task),
                    preprocess_logits_for_metrics=argmax_logits,
                    callbacks=[*extra, *(callbacks or [])],
                    training_loss=training_loss,
                    run_args=args,
                    schedule=schedule,
                    depth_evaluation=(built.task, depths),
                    masked_images=built.masked_images,
                    stop=stop,
                    ema=ema,
                )
            if resume_from is not None:
                if main_process:
                    print(f"resuming from step {initial_step} ({resume_from})", flush=True)
            # the handlers stay for the final evaluations: a stop there ends them at their next batch too, and the
            # run, its last step checkpointed (`StopOnSignal`), resumes to them
            final_evaluation = False
            with stop.installed(several_processes=ta.world_size > 1, announce=main_process):
                train_result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
                # what the ranks agreed on, not a signal that came after the last step's agreement: with several
                # processes a rank acting on that alone would skip the evaluation the others wait in
                if not stop.agreed:
                    saved_weights = restore_best_weights(trainer, args)
                    reopen_tensorboard(trainer)
                    try:
                        eval_metrics = trainer.evaluate(built.data["validation"], metric_key_prefix="eval")
                        test_metrics = trainer.evaluate(built.data["test"], metric_key_prefix="test")
                    except EvaluationStopped:
                        final_evaluation = True
            close_tensorboard(trainer)
        if stop.agreed:
            if main_process:
                step = trainer.state.global_step
                return stop.report("train", args.argv, step, work_dir, final_evaluation=final_evaluation)
            return 128 + int(stop.signum or 0)

        stage = work_dir / STAGE_FOLDER
        if main_process:
            import shutil

            shutil.rmtree(stage, ignore_errors=True)
        trainer.save_model(str(stage))  # model.safetensors + config.json + processor/tokenizer files
        if main_process:
            (stage / "training_args.bin").unlink(missing_ok=True)  # a pickle; the recipe is in metrics.json
            step = trainer.state.global_step
            train_metrics = dict(train_result.metrics)
            train_metrics["train_loss"] = whole_run_train_loss(
                trainer.state.log_history, initial_step, train_metrics["train_loss"], step
            )
            log_history = resumed_log_history(
                trainer.state.log_history, initial_step, train_metrics["train_loss"]
            )
            strip = lambda metrics, prefix: {k.removeprefix(prefix): v for k, v in metrics.items()}  # noqa: E731
            result = RunResult(
                loop="train",
                args=args,
                model=built.model,
                data=built.data,
                task=built.task,
                epochs=schedule.epochs,
                learning_rate=schedule.learning_rate,
                world_size=ta.world_size,
                global_step=step,
                train=train_metrics,
                eval=strip(eval_metrics, "eval_"),
                test=strip(test_metrics, "test_"),
                log_history=log_history,
                start_time=start,
                resumed_from=str(resume_from) if resume_from else None,
                warnings=built.warnings,
                saved_weights=saved_weights,
            )
            finish_run(stage, result, output_dir, work_dir)
        trainer.accelerator.wait_for_everyone()
        return 0


def main(argv: list[str] | None = None, *, callbacks: list[Any] | None = None) -> int:
    """CLI entry point; `callbacks` are extra `TrainerCallback`s (used by tests and for custom hooks)."""
    return run_command(
        "train",
        parse,
        lambda args: run(args, callbacks),
        list(sys.argv[1:] if argv is None else argv),
        writes_to=written_folders,
    )


def written_folders(args: Arguments) -> list[Path]:
    """Where a run writes (for `cli.run_command`'s full-disk report): the folder holding `--output_dir` and its
    `<output_dir>.checkpoints`, which the finished folder is renamed in."""
    return [Path(args.run.output_dir).expanduser().absolute().parent]


if __name__ == "__main__":
    raise SystemExit(main())
