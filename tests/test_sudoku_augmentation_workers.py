"""`SudokuAugmentation` behind a real `torch.utils.data.DataLoader`: the n-th batch's symmetries come from
`np.random.default_rng([seed, n])` in the main process and in DataLoader workers alike (worker w of W draws for batches
`batches` + j·W + w, `batches.NumberedBatches`), so workers draw distinct symmetries, an epoch continued with
`continue_after` as the training loops continue it draws anew, the same seed repeats them, and a resumed epoch's
batches from workers are those of the run without workers. Loaders whose workers cannot number their batches are
refused, and so is `--dataloader_persistent_workers` on the command line, before any work. The dataset is built as
`--sudoku_augmentation` builds it (`AugmentedTransform` of the augmentation and the cells transform), over copies of
one puzzle, so equal rows mean equal symmetries."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from accelerate import skip_first_batches
from torch.utils.data import DataLoader

from energyformers.training import accelerate_loop, train
from energyformers.training.processing import cells_transform
from energyformers.training.setup import AugmentedTransform
from energyformers.training.sudoku import (
    AugmentationCollator,
    SudokuAugmentation,
    augment,
    generate_puzzles,
    is_valid_solution,
    to_dataset,
)

COPIES = 8  # rows, one per batch: 4 rounds of 2 workers


def augmented_copies(augmentation: SudokuAugmentation):
    puzzles, solutions = generate_puzzles(1, seed=5)
    dataset = to_dataset(np.repeat(puzzles, COPIES, 0), np.repeat(solutions, COPIES, 0))
    dataset.set_transform(AugmentedTransform(augmentation, cells_transform()))
    return dataset


def first_row(batch: list[dict]) -> tuple[list[int], list[int]]:
    return list(batch[0]["input_ids"]), list(batch[0]["labels"])


def loader(dataset, num_workers: int, epoch: int = 0, **loader_kwargs) -> DataLoader:
    # batch_size 1 with 2 workers: worker 0 gives rows 0, 2, 4, 6 and worker 1 rows 1, 3, 5, 7; the torch generator
    # (which seeds the workers) changes with the epoch, as a seedable sampler's does
    return DataLoader(
        dataset,
        batch_size=1,
        num_workers=num_workers,
        collate_fn=first_row,
        generator=torch.Generator().manual_seed(epoch),
        **loader_kwargs,
    )


def epoch_rows(num_workers: int, epoch: int, seed: int = 0, skip: int = 0) -> list[tuple[list, list]]:
    """One epoch as the training loops take it (one batch an optimizer step): `skip` batches skipped by accelerate's
    `skip_first_batches` on a resume, and `continue_after(step)` before the loader's iterator starts its workers."""
    augmentation = SudokuAugmentation(seed=seed)
    rows = loader(augmented_copies(augmentation), num_workers, epoch)
    batches = skip_first_batches(rows, skip) if skip else rows
    augmentation.continue_after(
        epoch * COPIES + skip, batches_per_epoch=COPIES, gradient_accumulation_steps=1
    )
    return list(batches)


def test_two_workers_draw_the_symmetries_of_the_main_process_batch_for_batch():
    # epoch 0, epoch 1, and epoch 1 resumed after 3 batches (5 left: the workers' shares differ)
    for epoch, skip in ((0, 0), (1, 0), (1, 3)):
        alone, with_workers = epoch_rows(0, epoch, skip=skip), epoch_rows(2, epoch, skip=skip)
        assert len(with_workers) == len(alone) == COPIES - skip, (len(with_workers), len(alone))
        differ = [k for k, (a, b) in enumerate(zip(alone, with_workers, strict=True)) if a != b]
        assert differ == [], (
            f"epoch {epoch} after {skip} skipped: batches {differ} differ from the main process's"
        )


def test_two_workers_draw_different_symmetries_and_every_epoch_draws_anew():
    first, second = epoch_rows(2, 0), epoch_rows(2, 1)  # workers started anew for each epoch
    for ids, labels in first:
        solution = np.where(np.array(labels) >= 0, np.array(labels) + 1, np.array(ids))
        assert is_valid_solution(solution), f"an augmented row is no valid board:\n{solution.reshape(9, 9)}"
    # a symmetry group of 2·6⁸·9! ≈ 1.2e12 elements: two independent draws coincide with probability ~1e-12
    seen = first + second
    repeats = [k for k in range(len(seen)) if seen[k] in seen[:k]]
    assert repeats == [], f"batches {repeats} of the two epochs repeat an earlier batch's symmetry"


def test_the_same_seed_repeats_the_workers_symmetries_and_another_seed_does_not():
    again = epoch_rows(2, 0, seed=1)
    assert epoch_rows(2, 0, seed=1) == again, "the same seed gave other symmetries"
    other = epoch_rows(2, 0, seed=2)
    same = [k for k in range(COPIES) if other[k] == again[k]]
    assert same == [], f"batches {same}: seed 2 drew seed 1's symmetries"


def test_outside_a_worker_the_nth_read_draws_from_the_seed_and_n_which_continue_after_sets():
    puzzles, solutions = generate_puzzles(3, seed=5)
    rows = to_dataset(puzzles, solutions)[:3]
    augmentation = SudokuAugmentation(seed=11)

    def expected(n: int) -> tuple[list, list]:
        rng = np.random.default_rng([11, n])
        ids, labels = augment(np.asarray(rows["input_ids"]), np.asarray(rows["labels"]), rng)
        return ids.tolist(), labels.tolist()

    def read() -> tuple[list, list]:
        got = augmentation(rows)
        return got["input_ids"], got["labels"]

    for n in range(3):
        assert read() == expected(n), f"read {n} differs"
    # 5 batches an epoch, 2 per optimizer step (3 steps an epoch): step 4 stands 2 batches into the second epoch
    augmentation.continue_after(4, 5, 2)
    assert augmentation.batches == 7, augmentation.batches
    assert read() == expected(7), "the read after continue_after(4, 5, 2) is not batch 7's"


def test_the_collator_refuses_persistent_workers_naming_the_symmetries() -> None:
    """`AugmentationCollator` carries the loops' `check_loader` call to the augmentation; which loaders
    `batches.NumberedBatches` refuses, and why, is tested on the masked-image-modelling collator
    (tests/test_mim_resume.py)."""
    augmentation = SudokuAugmentation(seed=3)
    collator = AugmentationCollator(first_row, augmentation)  # what the loops check, as a run builds it
    dataset = augmented_copies(augmentation)
    with pytest.raises(ValueError, match="persistent_workers=True: with num_workers=2 the Sudoku symmetries"):
        collator.check_loader(loader(dataset, 2, persistent_workers=True))
    collator.check_loader(loader(dataset, 2))


RUNS = {
    "sudoku": (
        ["--dataset", "sudoku", "--sudoku_augmentation"],
        "--sudoku_augmentation",
        "Sudoku symmetries",
    ),
    "mim": (
        ["--task", "mim", "--dataset", "digits"],
        "--task masked-image-modeling",
        "masked-image-modelling masks",
    ),
}


@pytest.mark.parametrize(
    ("loop", "command"),
    [(train, "train"), (accelerate_loop, "train-accelerate")],
    ids=["trainer", "accelerate"],
)
@pytest.mark.parametrize("run", RUNS)
def test_persistent_workers_are_a_usage_error_before_any_work(
    tmp_path: Path, capsys: pytest.CaptureFixture, loop, command: str, run: str
) -> None:
    flags, flag, draws = RUNS[run]
    out = tmp_path / "out"
    # the run kept to one step, in case the refusal fails to come
    short = ["--max_steps", "1", "--eval_strategy", "no", "--num_predictions", "0"]
    workers = ["--dataloader_num_workers", "2", "--dataloader_persistent_workers"]
    argv = [*flags, *short, *workers, "--output_dir", str(out)]
    assert loop.main(argv) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith(f"energyformers {command}: error: "), err
    for words in (f"--dataloader_persistent_workers with {flag} and --dataloader_num_workers 2", draws):
        assert words in err[0], err
    assert sorted(p.name for p in tmp_path.iterdir()) == [], "the refused run left files behind"
