"""`energyformers train`: train any registered family on a dataset with `transformers.Trainer`.

    energyformers train --model hyperset --dataset digits --output_dir runs/demo-hyperset

The flags (`training/arguments.py`) are those of `energyformers train-accelerate`, with the same meanings;
the model and data come from `training/setup.py`, the finished folder from `training/run_folder.py`. Every
input is checked before training starts and before anything is written. Checkpoints go to
`<output_dir>.checkpoints/` (continue with `--resume`); the finished folder is renamed to `<output_dir>` in
one step, so `<output_dir>` is either complete or absent.
"""

from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path
from typing import Any

# Concise logs: silence tokenizers fork warnings before transformers is imported.
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

from .arguments import Arguments, check_best_model_metric, parse_arguments, quiet_libraries
from .cli import run_command
from .interrupt import StopRequest

PROG = "energyformers train"
DESCRIPTION = "Train a Hyper-SET / iMixer / HyperBF model with transformers.Trainer."


def trainer_checkpoints(work_dir: Path) -> list[Path]:
    """Trainer's complete checkpoints in `work_dir` (trainer_state.json is written last), oldest first."""
    found = [p for p in work_dir.glob("checkpoint-*") if (p / "trainer_state.json").is_file()]
    return sorted(found, key=lambda p: int(p.name.split("-")[-1]))


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


def build_trainer_classes() -> tuple[type, type, type]:
    """The Trainer subclass and callbacks (defined on first use: importing transformers.Trainer is slow)."""
    from transformers import Trainer, TrainerCallback

    from .callbacks import ContinueIterationDraws
    from .optimization import make_scheduler

    class RecipeTrainer(Trainer):
        """Trainer with the recipe's training loss (augmentation, soft targets) and lr schedule (floors,
        cooldown); evaluation keeps the model's plain loss."""

        def __init__(
            self, *args: Any, training_loss: Any, run_args: Any, schedule: Any, **kwargs: Any
        ) -> None:
            super().__init__(*args, **kwargs)
            self.training_loss, self.run_args, self.schedule = training_loss, run_args, schedule
            if training_loss.active:
                self.loss_is_scaled_for_ga = (
                    False  # a per-batch mean: Trainer divides by the accumulation steps
                )

        def compute_loss(
            self,
            model: Any,
            inputs: dict[str, Any],
            return_outputs: bool = False,
            num_items_in_batch: Any = None,
        ) -> Any:
            if not (self.training_loss.active and model.training):
                return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)
            loss, outputs = self.training_loss(model, inputs)
            return (loss, outputs) if return_outputs else loss

        # (task, depths) of the per-iteration accuracy logged at every evaluation (`evaluation.depth_metrics`)
        depth_evaluation: tuple[str, list[int]] | None = None
        # masked image modelling: (model, split) -> reconstruction metrics after decoding (`Built.masked_images`)
        masked_images: Any = None

        def evaluate(
            self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
        ) -> dict[str, float]:
            """Trainer's evaluation; for masked image modelling also the reconstruction metrics after MaskGIT
            decoding; on the validation split also the accuracy at each depth of `depth_evaluation`; each logged as
            its own entry at the same step and returned with the metrics."""
            metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
            if self.masked_images is not None and metric_key_prefix in ("eval", "test"):
                split = "validation" if metric_key_prefix == "eval" else "test"
                with self.autocast_smart_context_manager():
                    decoded = self.masked_images(self.model, split)
                decoded = {f"{metric_key_prefix}_{k}": v for k, v in decoded.items()}
                self.log(decoded)
                metrics = {**metrics, **decoded}
            if self.depth_evaluation is None or metric_key_prefix != "eval" or not self.depth_evaluation[1]:
                return metrics
            from .evaluation import depth_metrics

            task, depths = self.depth_evaluation
            loader = self.get_eval_dataloader(eval_dataset)
            with self.autocast_smart_context_manager():
                extra = depth_metrics(
                    self.model,
                    loader,
                    self.accelerator.gather_for_metrics,
                    task,
                    depths,
                    f"{metric_key_prefix}_",
                )
            self.log(extra)
            return {**metrics, **extra}

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            if self.lr_scheduler is None:
                self.lr_scheduler = make_scheduler(
                    self.run_args, optimizer or self.optimizer, self.schedule, num_training_steps
                )
                self._created_lr_scheduler = True
            return self.lr_scheduler

    class StopOnSignal(TrainerCallback):
        """SIGTERM or SIGINT (`interrupt.StopRequest`) → save a checkpoint at the end of this step and stop; with
        several processes all ranks decide together (Trainer calls this on every rank; its save is collective)."""

        def __init__(self, request: StopRequest) -> None:
            self.request = request

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self.request.should_stop(args.device):
                control.should_save = True
                control.should_training_stop = True

    class LoopState(ContinueIterationDraws):
        """Continue the sampled depths where a resumed run stopped (`ContinueIterationDraws`) and the training
        masks (a collator with `continue_after`) where each epoch starts, and log the loss at every checkpoint step
        (so the logged windows end exactly at each checkpoint: `whole_run_train_loss`)."""

        def __init__(self, collator: Any = None) -> None:
            self.collator = collator

        def on_train_begin(
            self,
            args: Any,
            state: Any,
            control: Any,
            model: Any = None,
            train_dataloader: Any = None,
            **kwargs: Any,
        ) -> None:
            super().on_train_begin(
                args, state, control, model=model, train_dataloader=train_dataloader, **kwargs
            )
            if hasattr(self.collator, "check_loader"):
                self.collator.check_loader(train_dataloader)

        def on_epoch_begin(
            self, args: Any, state: Any, control: Any, train_dataloader: Any = None, **kwargs: Any
        ) -> None:
            # before the epoch's loader iterator (and its DataLoader workers) starts: its first batch's index in
            # the mask stream, past the batches a resumed epoch skips (Trainer's `steps_trained_in_current_epoch`)
            if hasattr(self.collator, "continue_after"):
                self.collator.continue_after(
                    state.global_step, len(train_dataloader), args.gradient_accumulation_steps
                )

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if control.should_save:
                control.should_log = True

    return RecipeTrainer, StopOnSignal, LoopState


def restore_best_weights(trainer: Any, args: Arguments) -> dict[str, Any]:
    """After `trainer.train()`: which weights the model now holds, as metrics.json's `saved_weights` records it.

    Without `--load_best_model_at_end`: the last step's (the EMA of the last step with `--ema_decay`). With it,
    Trainer has loaded the best checkpoint's `model.safetensors`; with `--ema_decay` too, the evaluations that
    ranked the checkpoints ran on the EMA weights (`EMACallback` swaps them in), so those are the ones the best
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
        remove_unused_columns=False,  # the set_transform columns are produced on the fly
        # every parameter of every model the CLI builds gets a gradient at every step (halting head, deep
        # supervision and random depth included; tests/test_ddp_unused_parameters.py), as the Accelerate loop
        # assumes with DDP's own default: Trainer's default (True) costs an extra graph walk per step and a warning
        ddp_find_unused_parameters=False,
        disable_tqdm=run.disable_tqdm,
        report_to="none",
    )


def parse(argv: list[str]) -> Arguments:
    """The checked arguments (no torch, no model loaded: `cli.run_command` imports those afterwards)."""
    return parse_arguments(argv, PROG, DESCRIPTION)


def run(args: Arguments, callbacks: list[Any] | None = None) -> int:
    """Train as `args` say; returns the exit status (0, or 128 + the signal when stopped by SIGTERM/SIGINT)."""
    start = time.time()
    quiet_libraries()
    import torch
    from accelerate import PartialState

    from .evaluation import TrainerMetrics, argmax_logits, eval_depths, load_metrics
    from .optimization import TrainingLoss, check_schedule, plan_schedule
    from .run_folder import RunResult, finish_run, leave_nothing_behind
    from .setup import (
        announce_run,
        build,
        check_resume_arguments,
        find_checkpoint,
        output_paths,
        record_run_arguments,
    )

    if args.run.num_threads:
        torch.set_num_threads(args.run.num_threads)
    output_dir, work_dir = output_paths(args)
    resume_from = find_checkpoint(args, work_dir, trainer_checkpoints(work_dir))
    check_schedule(args)
    ta = training_arguments(args, work_dir)  # sets up the process group; writes no files
    main_process = ta.process_index == 0
    with leave_nothing_behind(work_dir, main_process):
        built = build(args, PartialState())
        if args.run.metric_for_best_model is not None:  # the task as loaded: a local dataset may be per-token
            check_best_model_metric(args.run.metric_for_best_model, built.task, args.data.dataset)
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
            record_run_arguments(
                args, built, work_dir
            )  # what a --resume must repeat (`check_resume_arguments`)
            announce_run(built, args.data.dataset, ta.world_size)
        RecipeTrainer, StopOnSignal, LoopState = build_trainer_classes()
        stop = StopRequest()
        extra = [LoopState(built.collator), StopOnSignal(stop)]
        if args.run.ema_decay is not None:
            from .augmentation import EMACallback

            extra.append(EMACallback(args.run.ema_decay))
        with PartialState().local_main_process_first():  # evaluate copies the scripts into its module cache
            load_metrics()

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
        )
        trainer.depth_evaluation = (built.task, eval_depths(built.model, args.run.eval_iterations))
        trainer.masked_images = built.masked_images
        initial_step = 0
        if resume_from is not None:
            initial_step = json.loads((resume_from / "trainer_state.json").read_text())["global_step"]
            if main_process:
                print(f"resuming from step {initial_step} ({resume_from})", flush=True)
        with stop.installed(several_processes=ta.world_size > 1, announce=main_process):
            train_result = trainer.train(resume_from_checkpoint=str(resume_from) if resume_from else None)
    # what the ranks agreed on, not a signal that came after the last step's agreement: with several processes a
    # rank acting on that alone would skip the evaluation the others wait in
    if stop.agreed:
        if main_process:
            return stop.report("train", args.argv, trainer.state.global_step, work_dir)
        return 128 + int(stop.signum or 0)

    saved_weights = restore_best_weights(trainer, args)
    eval_metrics = trainer.evaluate(built.data["validation"], metric_key_prefix="eval")
    test_metrics = trainer.evaluate(built.data["test"], metric_key_prefix="test")
    stage = work_dir / "final"
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
            log_history=trainer.state.log_history,
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
        "train", parse, lambda args: run(args, callbacks), list(sys.argv[1:] if argv is None else argv)
    )


if __name__ == "__main__":
    raise SystemExit(main())
