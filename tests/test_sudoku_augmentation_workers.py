"""`SudokuAugmentation` behind a real `torch.utils.data.DataLoader`: each worker draws its own symmetries, every epoch
of fresh workers draws new ones, the same torch seed repeats them, and outside any worker the n-th read draws from
`np.random.default_rng([seed, n])`, n set by `continue_after` as a resumed run sets it. The dataset is built as `--sudoku_augmentation` builds it (`AugmentedTransform` of the
augmentation and the cells transform), over copies of one puzzle, so equal rows mean equal symmetries."""

from __future__ import annotations

import numpy as np
import torch
from torch.utils.data import DataLoader

from energyformers.training.processing import cells_transform
from energyformers.training.setup import AugmentedTransform
from energyformers.training.sudoku import (
    SudokuAugmentation,
    augment,
    generate_puzzles,
    is_valid_solution,
    to_dataset,
)

COPIES = 8  # rows: 4 rounds of 2 workers


def augmented_copies(seed: int = 0):
    puzzles, solutions = generate_puzzles(1, seed=5)
    dataset = to_dataset(np.repeat(puzzles, COPIES, 0), np.repeat(solutions, COPIES, 0))
    dataset.set_transform(AugmentedTransform(SudokuAugmentation(seed=seed), cells_transform()))
    return dataset


def first_row(batch: list[dict]) -> tuple[list[int], list[int]]:
    return list(batch[0]["input_ids"]), list(batch[0]["labels"])


def loader(dataset, generator_seed: int) -> DataLoader:
    # batch_size 1 with 2 workers: worker 0 gives rows 0, 2, 4, 6 and worker 1 rows 1, 3, 5, 7
    return DataLoader(
        dataset,
        batch_size=1,
        num_workers=2,
        collate_fn=first_row,
        generator=torch.Generator().manual_seed(generator_seed),
    )


def test_two_workers_draw_different_symmetries_and_every_epoch_draws_anew():
    rows_loader = loader(augmented_copies(), generator_seed=0)
    first, second = list(rows_loader), list(rows_loader)  # two epochs, each with workers started anew
    for ids, labels in first:
        solution = np.where(np.array(labels) >= 0, np.array(labels) + 1, np.array(ids))
        assert is_valid_solution(solution), f"an augmented row is no valid board:\n{solution.reshape(9, 9)}"
    # a symmetry group of 2·6⁸·9! ≈ 1.2e12 elements: two independent draws coincide with probability ~1e-12
    same_round = [k for k in range(0, COPIES, 2) if first[k] == first[k + 1]]
    assert same_round == [], f"rounds {same_round}: both workers drew the same symmetry"
    repeated = [k for k in range(COPIES) if first[k] == second[k]]
    assert repeated == [], f"rows {repeated}: the second epoch drew the first epoch's symmetries"


def test_the_same_torch_seed_repeats_the_workers_symmetries():
    dataset = augmented_copies()
    again = list(loader(dataset, generator_seed=1))
    assert list(loader(dataset, generator_seed=1)) == again, "the same loader seed gave other symmetries"
    assert list(loader(dataset, generator_seed=2)) != again, "another loader seed gave the same symmetries"


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
