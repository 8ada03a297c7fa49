"""Sudoku augmentation keeps every example correct: the transformed solution is a valid board that agrees with the
transformed givens, the puzzle keeps exactly one solution, and every symmetry (bands, rows in a band, stacks,
columns in a stack, transposition, digit relabelling) is actually drawn."""

from __future__ import annotations

import numpy as np
import pytest

from energyformers.training.sudoku import (
    SudokuAugmentation,
    augment,
    count_solutions,
    generate_puzzles,
    is_valid_solution,
    random_symmetry,
    to_dataset,
)


@pytest.fixture(scope="module")
def examples() -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    puzzles, solutions = generate_puzzles(12, seed=3)
    labels = np.where(puzzles == 0, solutions.astype(np.int64) - 1, -100)
    return puzzles.astype(np.int64), solutions.astype(np.int64), labels


def test_augmented_examples_are_valid_unique_and_consistent(examples):
    puzzles, _, labels = examples
    rng = np.random.default_rng(0)
    for _ in range(5):
        new_ids, new_labels = augment(puzzles, labels, rng)
        for k, (puzzle, label) in enumerate(zip(new_ids, new_labels)):
            blank = puzzle == 0
            assert (blank == (label >= 0)).all(), f"puzzle {k}: the loss mask no longer marks the blank cells"
            solution = np.where(blank, label + 1, puzzle)
            assert is_valid_solution(solution), (
                f"puzzle {k}: the augmented solution is no valid board:\n{solution}"
            )
            assert count_solutions(puzzle.tolist(), 2) == 1, f"puzzle {k}: no longer one solution"
            assert blank.sum() == (puzzles[k] == 0).sum()


def test_every_symmetry_is_drawn():
    rng = np.random.default_rng(0)
    grid = np.arange(81).reshape(9, 9)
    seen = {
        "transposed": 0,
        "rows moved across bands": 0,
        "rows moved inside a band": 0,
        "digits relabelled": 0,
    }
    for _ in range(200):
        cells, digits = random_symmetry(rng)
        moved = cells.reshape(9, 9)
        transposed = moved[0, 1] // 9 != moved[0, 0] // 9  # along a new row the old row changes
        source_rows = (moved.T if transposed else moved)[:, 0] // 9  # old row of each new row
        seen["transposed"] += transposed
        seen["rows moved across bands"] += (source_rows // 3 != np.arange(9) // 3).any()
        seen["rows moved inside a band"] += (source_rows % 3 != np.arange(9) % 3).any()
        seen["digits relabelled"] += (digits[1:] != np.arange(1, 10)).any()
        assert (
            sorted(cells) == list(range(81)) and digits[0] == 0 and sorted(digits[1:]) == list(range(1, 10))
        )
        assert set(np.unique(grid.reshape(81)[cells] // 27)) == {0, 1, 2}
    assert all(60 <= count <= 200 for count in seen.values()), seen


def test_dataset_transform_draws_anew_each_read_and_is_seeded(examples):
    puzzles, solutions, _ = examples
    dataset = to_dataset(puzzles, solutions)
    first = dataset.with_transform(SudokuAugmentation(seed=7))
    again = dataset.with_transform(SudokuAugmentation(seed=7))
    a, b = first[:4]["input_ids"], first[:4]["input_ids"]
    assert a != b, "a second read must draw new symmetries"
    assert again[:4]["input_ids"] == a, "the same seed must give the same stream"
    assert first[:4].keys() == dataset[:4].keys()


def test_wrong_shapes_are_refused():
    with pytest.raises(ValueError, match=r"\(batch, 81\)"):
        augment(np.zeros((2, 80), np.int64), np.zeros((2, 80), np.int64), np.random.default_rng(0))
