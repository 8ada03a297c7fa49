"""Batch numbering for the training draws that must follow from a batch's index alone, so that a resumed run draws
what an uninterrupted one would: the masks of masked image modelling (`data.MaskedCodesCollator`) and the Sudoku
symmetries (`sudoku.SudokuAugmentation`). Apart from `data`, which imports the package's registry (torch,
transformers), so that `sudoku` imports it cheaply."""

from __future__ import annotations

from typing import Any


def batches_done(global_step: int, batches_per_epoch: int, gradient_accumulation_steps: int) -> int:
    """The training batches (forwards) a run has taken when it reaches `global_step` optimizer steps: every batch
    of the finished epochs, then `gradient_accumulation_steps` per step of the current one. An epoch has
    ceil(batches_per_epoch / gradient_accumulation_steps) optimizer steps, its last one taking the leftover batches,
    as both training loops count (Trainer's `num_update_steps_per_epoch`, `plan_schedule`). Where a resumed run
    continues the training masks (`MaskedCodesCollator`), the Sudoku symmetries (`sudoku.SudokuAugmentation`) and the
    sampled depths (`setup.continue_iteration_draws`)."""
    for name, value, least in (
        ("global_step", global_step, 0),
        ("batches_per_epoch", batches_per_epoch, 1),
        ("gradient_accumulation_steps", gradient_accumulation_steps, 1),
    ):
        if not isinstance(value, int) or isinstance(value, bool) or value < least:
            raise ValueError(f"{name}={value!r}: expected an integer >= {least}")
    steps_per_epoch = -(-batches_per_epoch // gradient_accumulation_steps)
    epochs, steps = divmod(global_step, steps_per_epoch)
    return epochs * batches_per_epoch + steps * gradient_accumulation_steps


class NumberedBatches:
    """Batch numbering for training draws that must follow from a batch's index alone (seeded and resumable):
    `next_batch_index` is the index n of the batch being drawn for, whatever the number of DataLoader workers, so
    a resumed run draws what an uninterrupted one would. Shared by the masks of masked image modelling
    (`MaskedCodesCollator`) and the Sudoku symmetries (`sudoku.SudokuAugmentation`); `draws` names them in errors.

    `batches` is the index of the next batch the main process draws for: it counts up there, and a loop sets it
    from its global step (`continue_after`) where a loader iteration starts, on a resume (which skips the batches
    already seen without reading them) and at every epoch, as both training loops do (with workers the count
    does not advance in the main process, so without that call every epoch would repeat the first one's draws).

    With `num_workers` = W > 0 each worker draws with a copy of this object taken when the loader's iterator
    starts (its worker processes are started then), and a map-style DataLoader hands its k-th batch of that
    iteration to worker k mod W, each worker taking its batches in order; worker w's j-th batch is therefore
    batch `batches` + j·W + w. That needs fresh workers per iteration and that order, which `check_loader` checks:
    not `persistent_workers` (workers keep their copy across epochs), not `in_order=False` (batches go to whichever
    worker has room), not an iterable dataset (each worker yields batches of its own).
    """

    draws = "the draws"
    batches: int = 0
    # batches this copy has drawn for in a DataLoader worker (the main process never counts here, so every
    # worker's copy starts at 0)
    _in_worker: int = 0

    def next_batch_index(self) -> int:
        """The index of the batch drawn for now (see the class docstring), counted as taken."""
        import torch

        worker = torch.utils.data.get_worker_info()
        if worker is None:
            index = self.batches
            self.batches += 1
            return index
        index = self.batches + self._in_worker * worker.num_workers + worker.id
        self._in_worker += 1
        return index

    def continue_after(
        self, global_step: int, batches_per_epoch: int, gradient_accumulation_steps: int
    ) -> None:
        """Set the stream to where a run that reached `global_step` optimizer steps stands (`batches_done`): the
        index of the next loader iteration's first batch, which DataLoader workers number theirs from."""
        self.batches = batches_done(global_step, batches_per_epoch, gradient_accumulation_steps)

    @classmethod
    def check_workers(
        cls,
        num_workers: int,
        persistent_workers: bool = False,
        in_order: bool = True,
        iterable_dataset: str | None = None,
    ) -> None:
        """Refuse DataLoader settings whose workers cannot know the index of the batches they take (see the class
        docstring); with `num_workers` = 0 any is fine. `iterable_dataset` is the class name of the loader's dataset
        when it is an IterableDataset. A ValueError names the setting."""
        if not num_workers:
            return
        why = (
            f"with num_workers={num_workers} {cls.draws} of a batch follow from its index only if a DataLoader "
            "hands batch k to worker k mod num_workers with fresh workers per iteration"
        )
        if persistent_workers:
            raise ValueError(f"persistent_workers=True: {why}; use persistent_workers=False or num_workers=0")
        if not in_order:
            raise ValueError(f"in_order=False: {why}; use in_order=True or num_workers=0")
        if iterable_dataset is not None:
            raise ValueError(
                f"dataset={iterable_dataset} (an IterableDataset): {why}; use a map-style dataset or num_workers=0"
            )

    def check_loader(self, loader: Any) -> None:
        """`check_workers` on a training DataLoader's settings."""
        import torch

        dataset = getattr(loader, "dataset", None)
        self.check_workers(
            getattr(loader, "num_workers", 0),
            persistent_workers=getattr(loader, "persistent_workers", False),
            in_order=getattr(loader, "in_order", True),
            iterable_dataset=(
                type(dataset).__name__ if isinstance(dataset, torch.utils.data.IterableDataset) else None
            ),
        )
