"""What both training loops compute the same way: the step schedule, the learning-rate schedule, the training
loss (with the recipe's batch augmentation and label smoothing) and the weight EMA.

Both loops take their numbers from `plan_schedule`, their scheduler from `make_scheduler` and their training
loss from `TrainingLoss`, so one flag means one thing in both.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.nn.functional as F

from .arguments import Arguments, UsageError
from .augmentation import BatchAugmentation, recipe_lr_schedule, soft_target_cross_entropy
from .setup import Built, default_epochs, default_learning_rate, warmup_steps


@dataclass
class Schedule:
    """Step counts of a run, derived once from the flags and the data (the same formula as `Trainer`)."""

    epochs: float  # epochs of the decay, without the cooldown
    steps_per_epoch: int  # optimizer steps per epoch, per process
    total_steps: int  # optimizer steps of the whole run (cooldown included)
    warmup_steps: int
    cooldown_steps: int
    learning_rate: float
    logging_steps: int
    eval_strategy: str
    eval_steps: int | None
    save_strategy: str
    save_steps: int | None


def cadence_strategies(args: Arguments) -> tuple[str, str]:
    """(evaluation strategy, checkpoint strategy) of the run: the flags', else every few steps of a `--max_steps`
    run and every epoch otherwise; checkpoints follow evaluation unless `--save_strategy` says otherwise."""
    run = args.run
    eval_strategy = run.eval_strategy or ("steps" if run.max_steps > 0 else "epoch")
    return eval_strategy, run.save_strategy or eval_strategy


def plan_schedule(args: Arguments, task: str, num_train_examples: int, world_size: int) -> Schedule:
    """Epochs, steps, warm-up, cooldown, logging/evaluation/checkpoint cadence of the run."""
    run = args.run
    per_process = math.ceil(num_train_examples / world_size)
    batches = math.ceil(per_process / run.per_device_train_batch_size)
    # Trainer's count: a last partial accumulation window still makes an optimizer step
    steps_per_epoch = max(math.ceil(batches / run.gradient_accumulation_steps), 1)
    epochs = run.num_train_epochs if run.num_train_epochs is not None else default_epochs(task)
    cooldown = round(run.cooldown_epochs * steps_per_epoch)
    if run.max_steps > 0:
        total = run.max_steps
        cooldown = min(cooldown, total)
    else:
        total = math.ceil(steps_per_epoch * epochs) + cooldown
    warmup = min(warmup_steps(args, total - cooldown, steps_per_epoch), total - cooldown)
    eval_strategy, save_strategy = cadence_strategies(args)
    # four evaluations / checkpoints a run where they go by steps
    eval_steps = run.eval_steps or (max(1, total // 4) if eval_strategy == "steps" else None)
    save_steps = run.save_steps or eval_steps or (max(1, total // 4) if save_strategy == "steps" else None)
    return Schedule(
        epochs=epochs,
        steps_per_epoch=steps_per_epoch,
        total_steps=total,
        warmup_steps=warmup,
        cooldown_steps=cooldown,
        learning_rate=default_learning_rate(args),
        logging_steps=run.logging_steps or max(1, total // 10),
        eval_strategy=eval_strategy,
        eval_steps=eval_steps,
        save_strategy=save_strategy,
        save_steps=save_steps,
    )


def uses_recipe_schedule(args: Arguments) -> bool:
    """Whether the lr schedule needs the floors / cooldown (`augmentation.recipe_lr_schedule`)."""
    run = args.run
    return bool(run.warmup_learning_rate or run.min_learning_rate or run.cooldown_epochs)


def check_schedule(args: Arguments) -> None:
    """The floors and the cooldown are defined for the cosine schedule only."""
    if uses_recipe_schedule(args) and args.run.lr_scheduler_type != "cosine":
        raise UsageError(
            f"--warmup_learning_rate / --min_learning_rate / --cooldown_epochs shape the cosine schedule; "
            f"--lr_scheduler_type {args.run.lr_scheduler_type} has no floor. Use --lr_scheduler_type cosine"
        )


def make_scheduler(
    args: Arguments, optimizer: torch.optim.Optimizer, schedule: Schedule, total_steps: int | None = None
) -> Any:
    """The learning-rate scheduler of both loops (stepped once per optimizer step)."""
    total = total_steps or schedule.total_steps
    if uses_recipe_schedule(args):
        cooldown = min(schedule.cooldown_steps, total - min(schedule.warmup_steps, total))
        return recipe_lr_schedule(
            optimizer,
            num_training_steps=total,
            warmup_steps=min(schedule.warmup_steps, total - cooldown),
            cooldown_steps=cooldown,
            base_lr=schedule.learning_rate,
            min_lr=args.run.min_learning_rate or 0.0,
            warmup_lr=args.run.warmup_learning_rate or 0.0,
        )
    from transformers import get_scheduler

    return get_scheduler(
        args.run.lr_scheduler_type,
        optimizer=optimizer,
        num_warmup_steps=min(schedule.warmup_steps, total),
        num_training_steps=total,
    )


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict[str, Any]]:
    """As Trainer: no decay on biases, norms and other vectors/scalars."""
    decay = [p for p in model.parameters() if p.requires_grad and p.ndim >= 2]
    no_decay = [p for p in model.parameters() if p.requires_grad and p.ndim < 2]
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


def check_augmentation(args: Arguments, task: str) -> None:
    """Image transforms and mixing need image classification; label smoothing works for every task."""
    aug = args.augmentation
    image_only = aug.image_ops or aug.mixing or aug.random_erasing > 0
    if image_only and task != "image-classification":
        given = f"--recipe {args.run.recipe}" if args.run.recipe else "the augmentation flags"
        raise UsageError(
            f"{given}: RandAugment, crop, flip, erasing and mixup/cutmix apply to image classification; "
            f"{args.data.dataset!r} is a dataset for {task}"
        )


class TrainingLoss:
    """The training loss of both loops when the recipe changes it: batch augmentation (images) and soft targets
    (mixup/cutmix/label smoothing). `active` is False without any: the model's own loss is used unchanged.

    Evaluation never goes through here: it is the model's plain cross-entropy on unaugmented batches.
    """

    def __init__(self, args: Arguments, built: Built) -> None:
        check_augmentation(args, built.task)
        aug = args.augmentation
        self.augment: BatchAugmentation | None = None
        self.label_smoothing = 0.0
        if built.task == "image-classification" and aug.enabled:
            processor = built.processor
            self.augment = BatchAugmentation(
                aug, built.model.config.num_labels, processor.image_mean, processor.image_std
            )
        elif aug.label_smoothing > 0:
            self.label_smoothing = aug.label_smoothing
        self.active = self.augment is not None or self.label_smoothing > 0

    def __call__(
        self,
        model: torch.nn.Module,
        batch: dict[str, Any],
        num_items_in_batch: torch.Tensor | int | None = None,
    ) -> tuple[torch.Tensor, Any]:
        """(loss of the batch, model outputs) with the augmented inputs and soft targets: the mean over the batch's
        labels (≠ −100), or with `num_items_in_batch` (those labels counted over the whole accumulation window, as
        `Trainer` counts them) their sum divided by it, as the models' own loss (`head_loss`)."""
        inputs = {k: v for k, v in batch.items() if k != "labels"}
        labels = batch["labels"]
        if self.augment is not None:
            self.augment.train(model.training)
            inputs["pixel_values"], targets = self.augment(inputs["pixel_values"], labels)
            outputs = model(**inputs)
            loss = soft_target_cross_entropy(outputs.logits, targets)
            if num_items_in_batch is not None:  # the mean over the batch's images, one label each
                loss = loss * len(labels) / num_items_in_batch
            return loss, outputs
        outputs = model(**inputs)
        logits = outputs.logits
        # logits (B, V) or (B, N, V) → (M, V) and labels → (M,), M = B or B·N
        loss = F.cross_entropy(
            logits.reshape(-1, logits.shape[-1]).float(),
            labels.reshape(-1),
            ignore_index=-100,
            label_smoothing=self.label_smoothing,
            reduction="mean" if num_items_in_batch is None else "sum",
        )
        if num_items_in_batch is not None:
            loss = loss / num_items_in_batch
        return loss, outputs


__all__ = [
    "Schedule",
    "TrainingLoss",
    "cadence_strategies",
    "check_augmentation",
    "check_schedule",
    "make_scheduler",
    "param_groups",
    "plan_schedule",
    "uses_recipe_schedule",
]
