"""The `transformers.Trainer` subclasses and callbacks of `energyformers train` and `energyformers evaluate`.

Importing this module imports `transformers.Trainer` (slow): the command modules import it when they run, never
at their own import, so `energyformers COMMAND --help` and an argument error stay fast.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from functools import partial
from pathlib import Path
from typing import Any

from transformers import Trainer, TrainerCallback
from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

from ..center_cache import centers_scope
from .callbacks import ContinueIterationDraws
from .evaluation import depth_metrics
from .interrupt import EvaluationStopped, StopRequest
from .optimization import make_scheduler


class CenterCacheTrainer(Trainer):
    """Trainer whose evaluation and prediction passes (`evaluation_loop`, which `evaluate` and `predict` run) hold
    `centers_scope` open: HyperBF computes what its centers give once per pass instead of at every batch (nothing
    writes the weights during a pass); the outputs are the same, and other families run as before."""

    def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
        with centers_scope(self.model):
            return super().evaluation_loop(*args, **kwargs)


class RecipeTrainer(CenterCacheTrainer):
    """Trainer with the recipe's training loss (augmentation, soft targets) and lr schedule (floors, cooldown);
    evaluation keeps the model's plain loss.

    Beyond `Trainer`'s arguments: `training_loss` (`optimization.TrainingLoss`), `run_args` (the run's
    `arguments.Arguments`) and `schedule` (`optimization.plan_schedule`'s) make the training loss and the lr
    schedule; `depth_evaluation`, `(task, depths)`, adds the per-iteration accuracy at each depth to every
    evaluation of the validation split (`evaluation.depth_metrics`); `masked_images`, a callable
    `(model, split) -> metrics` (`setup.Built.masked_images`), adds the masked-image-modelling reconstruction
    metrics after decoding to every validation and test evaluation. Left None, each adds nothing.

    `ema` (the run's `augmentation.EMACallback`, made with `swap_for_evaluation=False`): every evaluation during
    training scores its averaged weights, in all of its passes (Trainer's, the decoding, the depths), and the
    live weights come back when it ends, cut short or not, so checkpoints keep them (the callback's own swap ends
    at `on_evaluate`, which an evaluation cut short never calls: the stop's checkpoint would hold the averages).

    `stop` (the run's `interrupt.StopRequest`): every pass of an evaluation (Trainer's prediction steps, the
    decoding, the depths) ends at its next batch once a stop is agreed (`EvaluationStopped`), abandoned: none of
    the evaluation's metrics are logged. During training the training loss since the last log is logged, the
    checkpoint of the step just ended saved and training stops; after it (the final evaluations) `evaluate`
    raises `EvaluationStopped` to its caller."""

    def __init__(
        self,
        *args: Any,
        training_loss: Any,
        run_args: Any,
        schedule: Any,
        depth_evaluation: tuple[str, list[int]] | None = None,
        masked_images: Any = None,
        stop: StopRequest | None = None,
        ema: Any = None,
        **kwargs: Any,
    ) -> None:
        if ema is not None and ema.swap_for_evaluation:
            raise ValueError(
                "RecipeTrainer(ema=...) swaps the averaged weights in for each evaluation itself: make the "
                "EMACallback with swap_for_evaluation=False"
            )
        super().__init__(*args, **kwargs)
        self.training_loss, self.run_args, self.schedule = training_loss, run_args, schedule
        self.depth_evaluation = depth_evaluation
        self.masked_images = masked_images
        self.stop = stop
        self.ema = ema
        self.evaluation_check: Any = None  # the pass of Trainer's prediction steps in progress
        self.held_logs: list[tuple[Any, ...]] | None = (
            None  # an evaluation's `log` calls, until it is complete
        )
        self.step_end_call: tuple[tuple[Any, ...], dict[str, Any]] | None = (
            None  # (`_maybe_log_save_evaluate`)
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
        # normalised by `num_items_in_batch` when Trainer counts it (a model that accepts it, as ours do), as the
        # model's own loss: Trainer's default `loss_is_scaled_for_ga` then leaves it undivided, else divides the mean
        loss, outputs = self.training_loss(model, inputs, num_items_in_batch)
        if num_items_in_batch is not None and self.args.average_tokens_across_devices:
            # as Trainer.compute_loss: the count spans the processes, whose gradients DDP averages
            loss = loss * self.accelerator.num_processes
        return (loss, outputs) if return_outputs else loss

    def evaluate(
        self, eval_dataset: Any = None, ignore_keys: Any = None, metric_key_prefix: str = "eval"
    ) -> dict[str, float]:
        """Trainer's evaluation; for masked image modelling also the reconstruction metrics after MaskGIT
        decoding; on the validation split also the accuracy at each depth of `depth_evaluation`; each logged as
        its own entry at the same step, once all are complete, and returned with the metrics and, as Trainer's,
        the training state's `epoch` that `log` adds. Callbacks' `on_evaluate` is called once, after those logs,
        with the metrics returned (`held_on_evaluate`).

        A dict of datasets (given, or the trainer's `eval_dataset`) is evaluated as `Trainer` does: each named
        dataset in turn with the prefix `<metric_key_prefix>_<name>`, its own logs and its own `on_evaluate`
        with its metrics, on the validation split its accuracy at each depth too (`eval_<name>_<metric>_
        iterations_<t>`). The decoding reads the run's own split (`masked_images`), not a given dataset, so it
        runs once, after the named ones, as an evaluation of its own under `metric_key_prefix` (`eval_psnr`).
        A stop request during any of them ends the whole evaluation: nothing of it is logged or reported."""
        stopped = False
        completed: list[tuple[list[tuple[Any, ...]], dict[str, float], dict[str, Any]]] = []
        try:
            with self.evaluation_weights():
                for evaluation in self.evaluations(eval_dataset, ignore_keys, metric_key_prefix):
                    self.held_logs = []
                    with self.held_on_evaluate() as reported:
                        metrics = evaluation()
                    completed.append((self.held_logs, metrics, reported[0] if reported else {}))
        except EvaluationStopped:
            if not self.is_in_train:
                raise
            stopped = True
        finally:
            self.held_logs, self.evaluation_check = None, None
            self.close_prediction_bars()  # the bar of a pass cut short, which no `on_evaluate` closes
        if stopped:
            # a stop request during a training run's evaluation: no metrics are logged, no callback hears of it
            # (`on_evaluate`), the checkpoint of the step just ended is saved and training stops (as
            # `StopOnSignal.on_step_end` would have decided)
            self.log_open_window()
            self.control.should_save = True
            self.control.should_training_stop = True
            return self.unfinished_evaluation(metric_key_prefix)
        returned: dict[str, float] = {}
        for held, metrics, extra in completed:
            for logs, args, kwargs in held:
                self.log(logs, *args, **kwargs)
                # Trainer's `evaluate` returns (and reports to `on_evaluate`) the very dict it logged, which `log`
                # gave the training state's entries (`epoch`, the input tokens seen); ours joins several
                metrics.update(logs)
            self.control = self.callback_handler.on_evaluate(
                self.args, self.state, self.control, metrics, **extra
            )
            returned.update(metrics)
        return returned

    def evaluations(
        self, eval_dataset: Any, ignore_keys: Any, metric_key_prefix: str
    ) -> Iterator[Callable[[], dict[str, float]]]:
        """The evaluations one `evaluate` call makes, each a call returning its metrics: one
        (`complete_evaluation`), or for a dict of datasets one per named dataset and the decoding's."""
        given = eval_dataset is not None
        datasets = eval_dataset if given else self.eval_dataset
        if not isinstance(datasets, dict):
            yield partial(self.complete_evaluation, eval_dataset, ignore_keys, metric_key_prefix)
            return
        depths = metric_key_prefix == "eval"  # the named datasets of the validation split
        for name, dataset in datasets.items():
            # a name picks the trainer's own dataset (Trainer's `get_eval_dataloader` keeps a loader per name)
            yield partial(
                self.complete_evaluation,
                dataset if given else name,
                ignore_keys,
                f"{metric_key_prefix}_{name}",
                decoding=False,
                depths=depths,
            )
        if self.masked_images is not None and metric_key_prefix in ("eval", "test"):
            yield partial(self.decoding_metrics, metric_key_prefix)

    @contextmanager
    def held_on_evaluate(self) -> Iterator[list[dict[str, Any]]]:
        """Within it, Trainer's `callback_handler.on_evaluate` (which `Trainer.evaluate` calls with its own pass's
        metrics, before the decoding and depth passes) is held back: the yielded list gets each call's keyword
        arguments besides `metrics`, and `evaluate` makes the one call itself once every pass is complete, with
        all the metrics, or none for an evaluation cut short (callbacks such as `EarlyStoppingCallback` read a
        depth metric there)."""
        handler = self.callback_handler
        reported: list[dict[str, Any]] = []

        def hold(args: Any, state: Any, control: Any, metrics: Any, **kwargs: Any) -> Any:
            reported.append(kwargs)
            # Trainer's pass ends here: its bar closes now, as in Trainer (the next pass, a named dataset's,
            # would count on in it)
            self.close_prediction_bars()
            return control

        shadowed = handler.__dict__.get("on_evaluate")  # put back as found (a nested `evaluate`'s hold)
        handler.on_evaluate = hold  # the instance attribute shadows the class's method
        try:
            yield reported
        finally:
            if shadowed is None:
                del handler.on_evaluate
            else:
                handler.on_evaluate = shadowed

    def close_prediction_bars(self) -> None:
        """Close the progress bar of Trainer's evaluation pass that transformers' progress callbacks
        (`ProgressCallback`, `NotebookProgressCallback`) keep in their `prediction_bar`, as their `on_evaluate`
        does: `held_on_evaluate` holds that call back past the pass, and an evaluation cut short makes none."""
        for callback in self.callback_handler.callbacks:
            bar = getattr(callback, "prediction_bar", None)
            if bar is not None:
                bar.close()
                callback.prediction_bar = None

    def evaluation_weights(self) -> AbstractContextManager[Any]:
        """The weights an evaluation scores: during training with `ema`, its averaged ones, swapped in for the
        whole evaluation; otherwise the model's own (after training the EMA is already in it)."""
        average = self.ema.ema if self.ema is not None and self.is_in_train else None
        return nullcontext() if average is None else average.averaged_weights(self.model)

    def _save_checkpoint(self, model: Any, trial: Any) -> None:
        # Trainer writes trainer_state.json, the checkpoint's completion marker, last in here, and runs `on_save`
        # (no callback hook comes earlier) only afterwards: the EMA file is written first, so a checkpoint with a
        # marker holds everything a resume reads
        if self.ema is not None and self.ema.ema is not None and self.is_world_process_zero():
            # the folder `EMACallback.on_save` writes to (no hyper-parameter search trials here)
            folder = Path(self.args.output_dir) / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            folder.mkdir(parents=True, exist_ok=True)
            self.ema.save(folder)
        super()._save_checkpoint(model, trial)

    def _run_epoch(self, *args: Any, **kwargs: Any) -> None:
        # Trainer's loop checks `max_steps` only after a step: resumed from a checkpoint at the last step that ends
        # mid-epoch, it would train one step more. Nothing is left to train there: straight to the end of training.
        if self.state.global_step >= self.state.max_steps > 0:
            self.control.should_training_stop = True
            return
        super()._run_epoch(*args, **kwargs)

    def _maybe_log_save_evaluate(self, *args: Any, **kwargs: Any) -> None:
        # Trainer's step-end call (log, evaluate, save) with the step's loss, gradient norm and learning rate:
        # kept for `log_open_window` while an evaluation it starts runs
        self.step_end_call = args, kwargs
        try:
            super()._maybe_log_save_evaluate(*args, **kwargs)
        finally:
            self.step_end_call = None

    def log_open_window(self) -> None:
        """Log the training loss of the steps since the last log, as Trainer does at a logging step. Trainer
        decides whether to log before it evaluates, so a stop's checkpoint that an evaluation cut short asks
        for needs this to end a logged window, as every checkpoint does (`train.whole_run_train_loss`). The row
        is that of a logging step at this step: the step-end call's gradient norm and learning rate (the
        scheduler has stepped since)."""
        if self.step_end_call is None:
            return
        args, kwargs = self.step_end_call
        control = self.control
        flags = control.should_log, control.should_evaluate, control.should_save
        control.should_log, control.should_evaluate, control.should_save = True, False, False
        try:  # Trainer's own step-end call again: only the log (a no-op if this step is logged already)
            super()._maybe_log_save_evaluate(*args, **kwargs)
        finally:
            self.control.should_log, self.control.should_evaluate, self.control.should_save = flags

    def complete_evaluation(
        self,
        eval_dataset: Any,
        ignore_keys: Any,
        metric_key_prefix: str,
        decoding: bool = True,
        depths: bool | None = None,
    ) -> dict[str, float]:
        """`evaluate`'s passes over one dataset, their logs held back (`log`): Trainer's; the decoding (for
        `metric_key_prefix` "eval" or "test", unless `decoding` is False); the depths (`depths`, by default for
        the prefix "eval")."""
        if self.stop is not None:
            self.evaluation_check = self.stop.evaluation_check(self.args.device)
        metrics = super().evaluate(eval_dataset, ignore_keys, metric_key_prefix)
        self.evaluation_check = None
        if decoding and self.masked_images is not None and metric_key_prefix in ("eval", "test"):
            metrics = {**metrics, **self.decoding_metrics(metric_key_prefix)}
        if depths is None:
            depths = metric_key_prefix == "eval"
        if self.depth_evaluation is None or not depths or not self.depth_evaluation[1]:
            return metrics
        task, iterations = self.depth_evaluation
        loader = self.get_eval_dataloader(eval_dataset)
        with self.autocast_smart_context_manager():
            extra = depth_metrics(
                self.model,
                loader,
                self.accelerator.gather_for_metrics,
                task,
                iterations,
                f"{metric_key_prefix}_",
                stop=self.stop,
            )
        self.log(extra)
        return {**metrics, **extra}

    def decoding_metrics(self, metric_key_prefix: str) -> dict[str, float]:
        """The reconstruction metrics after MaskGIT decoding (`masked_images`) of the run's validation split
        ("eval") or test split ("test"), logged (held back within `evaluate`) and returned with the prefix."""
        split = "validation" if metric_key_prefix == "eval" else "test"
        with self.autocast_smart_context_manager():
            decoded = self.masked_images(self.model, split, stop=self.stop)
        decoded = {f"{metric_key_prefix}_{k}": v for k, v in decoded.items()}
        self.log(decoded)
        return decoded

    def log(self, logs: dict[str, float], *args: Any, **kwargs: Any) -> None:
        # within `evaluate`: held until every pass is complete, so an evaluation cut short logs nothing
        if self.held_logs is not None:
            # a copy: Trainer adds its memory metrics to the dict after logging it (returned, not logged)
            self.held_logs.append((dict(logs), args, kwargs))
            return
        super().log(logs, *args, **kwargs)

    def prediction_step(
        self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: Any = None
    ) -> Any:
        outputs = super().prediction_step(model, inputs, prediction_loss_only, ignore_keys)
        # every rank runs the same prediction steps (each gathers the batch's outputs), so all of them agree here
        if self.evaluation_check is not None:
            self.evaluation_check.batch_done()
        return outputs

    def unfinished_evaluation(self, metric_key_prefix: str) -> dict[str, float]:
        """What an evaluation cut short returns to Trainer: the best-model metric as NaN, which no comparison
        makes a new best (Trainer looks the metric up after every evaluation when `metric_for_best_model` is
        set), and nothing else."""
        metric = self.args.metric_for_best_model
        if metric is None:
            return {}
        if not metric.startswith(f"{metric_key_prefix}_"):
            metric = f"{metric_key_prefix}_{metric}"
        return {metric: math.nan}

    def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
        if self.lr_scheduler is None:
            self.lr_scheduler = make_scheduler(
                self.run_args, optimizer or self.optimizer, self.schedule, num_training_steps
            )
            self._created_lr_scheduler = True
        return self.lr_scheduler


class DepthTrainer(CenterCacheTrainer):
    """Trainer that adds `call_arguments` (the depth flags of `energyformers evaluate`) to every evaluation
    forward."""

    def __init__(self, *args: Any, call_arguments: dict[str, Any], **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.call_arguments = call_arguments

    def prediction_step(
        self, model: Any, inputs: dict[str, Any], prediction_loss_only: bool, ignore_keys: Any = None
    ) -> Any:
        return super().prediction_step(
            model, {**inputs, **self.call_arguments}, prediction_loss_only, ignore_keys
        )


class StopOnSignal(TrainerCallback):
    """SIGTERM or SIGINT (`interrupt.StopRequest`) → save a checkpoint at the end of this step and stop; with
    several processes all ranks decide together (Trainer calls this on every rank; its save is collective).

    An evaluation ends at its next batch (`RecipeTrainer`'s `stop`). An evaluation after the stop step does not
    start (the epoch's neither, which Trainer asks for after a stop too), and the stop step's checkpoint is saved
    once. The last step is always checkpointed (Trainer does so itself unless `--save_strategy no`), so a stop in
    the final evaluations after training leaves the trained run to resume from."""

    def __init__(self, request: StopRequest) -> None:
        self.request = request

    def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        if self.request.should_stop(args.device):
            # the checkpoint ends a logged window, as every checkpoint does (`ContinueRunCallback`, called
            # before this, saw no save to log for)
            control.should_save = control.should_log = True
            control.should_training_stop = True
            control.should_evaluate = False
        elif state.global_step >= state.max_steps and args.save_strategy == "no":
            # the checkpoint a stop in the final evaluations resumes from (Trainer saves the last step itself
            # with the steps and epoch strategies); logged, as every checkpoint step is (`ContinueRunCallback`)
            control.should_save = control.should_log = True

    def on_epoch_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
        # Trainer ends the epoch after a stop too, and DefaultFlowCallback (called before this) then asks for the
        # epoch's evaluation and save: the stop step's checkpoint is already saved (`on_step_end`, or
        # `RecipeTrainer.evaluate` after an evaluation cut short), so neither runs again. `agreed` is every
        # rank's shared answer, so this needs no collective.
        if self.request.agreed:
            control.should_evaluate = False
            control.should_save = False


class ContinueRunCallback(ContinueIterationDraws):
    """Continue the sampled depths where a resumed run stopped (`ContinueIterationDraws`) and the training
    masks (a collator with `continue_after`) where each epoch starts, and log the loss at every checkpoint step
    (so the logged windows end exactly at each checkpoint: `train.whole_run_train_loss`; a stop's checkpoint is
    logged by `StopOnSignal`, or `RecipeTrainer.evaluate` when an evaluation is cut short)."""

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
        super().on_train_begin(args, state, control, model=model, train_dataloader=train_dataloader, **kwargs)
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


__all__ = ["CenterCacheTrainer", "ContinueRunCallback", "DepthTrainer", "RecipeTrainer", "StopOnSignal"]
