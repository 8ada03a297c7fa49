"""`TrainerCallback`s for training energyformers models with a plain `transformers.Trainer` (your own script).

    from energyformers.training.callbacks import ContinueIterationDraws

    trainer = Trainer(model=model, args=args, ..., callbacks=[ContinueIterationDraws()])
    trainer.train(resume_from_checkpoint=True)

`energyformers train` uses the same callback (its `trainer.ContinueRunCallback` builds on it); `energyformers train-accelerate` calls
`setup.continue_iteration_draws` itself.
"""

from __future__ import annotations

from typing import Any

from transformers import TrainerCallback

from .setup import continue_iteration_draws


class ContinueIterationDraws(TrainerCallback):
    """Make a resumed `Trainer` run draw the training depths an uninterrupted one would.

    A recurrent-depth model (Hyper-SET, the looped baseline) with `iteration_sampling` other than "fixed", or with
    `deep_supervision="random"`, seeds each training forward's draw with the run's seed and its count of training
    forwards (`iteration_draws`). That count is not model weight, so a checkpoint does not hold it and a resumed `Trainer`
    starts it at 0 again: the resumed run trains at other depths than the interrupted one would have. At the start
    of training this callback sets it to the forwards done by the resumed step (`state.global_step` optimizer
    steps of `gradient_accumulation_steps` forwards, an epoch's last step taking the leftover batches:
    `batches.batches_done`). A fresh run (step 0) sets it to 0; a model without recurrent depth is left alone.
    With several processes every rank sets the same count (each from its own loader's length), so they keep
    drawing the same depth at the same step.
    """

    def on_train_begin(
        self,
        args: Any,
        state: Any,
        control: Any,
        model: Any = None,
        train_dataloader: Any = None,
        **kwargs: Any,
    ) -> None:
        if (
            model is None or train_dataloader is None
        ):  # Trainer passes both; a silent no-op would hide the loss
            raise TypeError(
                "ContinueIterationDraws.on_train_begin needs the model and the train_dataloader, as "
                f"transformers.Trainer passes them; got model={type(model).__name__}, "
                f"train_dataloader={type(train_dataloader).__name__}"
            )
        # the prepared loader's length: this process's batches an epoch
        continue_iteration_draws(
            model, state.global_step, len(train_dataloader), args.gradient_accumulation_steps
        )


__all__ = ["ContinueIterationDraws"]
