"""Seeded Sudoku puzzles with proven-unique solutions, for Hyper-SET's reasoning task.

A grid is 81 ints in row-major order, 0 = blank, 1-9 = digits. The solver is a depth-first search
over bitmask candidates that always branches on the cell with the fewest candidates (minimum
remaining values) and stops after `limit` solutions, so `count_solutions(p, 2) == 1` proves a
puzzle unique. Generation: fill a random full grid with the same search (candidates in random
order), then blank cells in random order, keeping each removal only while the solution stays
unique, until a target number of givens drawn uniformly from [min_givens, max_givens] is reached.
Very low targets are often unreachable by this greedy removal; the puzzle then keeps the
fewest givens it reached, so report what was generated: a run records the givens of each split in
`metrics.json` under `data` (`format_givens_counts`).

Pure Python (the search is branchy; numpy does not help). Fewer givens cost more: each removal tried is
another uniqueness proof, and the searches grow as blanks accumulate.
"""

from __future__ import annotations

import random
from collections import Counter
from collections.abc import Sequence
from typing import Any

import numpy as np
import pyarrow as pa
from datasets import ClassLabel, Dataset, DatasetDict, DatasetInfo, Features, Value
from datasets import Sequence as SequenceFeature

from .batches import NumberedBatches

ALL = 0x1FF  # nine candidate bits: bit d-1 set = digit d allowed
_ROW = [i // 9 for i in range(81)]
_COL = [i % 9 for i in range(81)]
_BOX = [(i // 27) * 3 + (i % 9) // 3 for i in range(81)]
_POPCOUNT = [bin(m).count("1") for m in range(512)]
_BITS = [[d for d in range(9) if m >> d & 1] for m in range(512)]  # digit-1 of each set bit


def _masks(grid: Sequence[int]) -> tuple[list[int], list[int], list[int]] | None:
    """Used-digit masks per row/column/box, or None if the givens already clash."""
    rows, cols, boxes = [0] * 9, [0] * 9, [0] * 9
    for i, v in enumerate(grid):
        if v:
            bit = 1 << (v - 1)
            r, c, b = _ROW[i], _COL[i], _BOX[i]
            if (rows[r] | cols[c] | boxes[b]) & bit:
                return None
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
    return rows, cols, boxes


def _search(grid: Sequence[int], limit: int, rng: random.Random | None) -> tuple[int, list[int] | None]:
    """DFS with MRV; returns (number of solutions found, capped at limit; the first solution)."""
    masks = _masks(grid)
    if masks is None:
        return 0, None
    rows, cols, boxes = masks
    cells = list(grid)
    empty = [i for i, v in enumerate(cells) if not v]
    found: list[list[int]] = []
    count = 0

    def dfs() -> bool:  # True = stop (limit reached)
        nonlocal count
        best, best_mask, best_n = -1, 0, 10
        for i in empty:
            if cells[i]:
                continue
            m = ALL & ~(rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]])
            n = _POPCOUNT[m]
            if n < best_n:
                best, best_mask, best_n = i, m, n
                if n <= 1:  # dead end or forced move: no better choice exists
                    break
        if best < 0:  # no empty cell left
            count += 1
            if not found:
                found.append(cells.copy())
            return count >= limit
        if best_n == 0:
            return False
        r, c, b = _ROW[best], _COL[best], _BOX[best]
        digits = _BITS[best_mask]
        if rng is not None:
            digits = digits.copy()
            rng.shuffle(digits)
        for d in digits:
            bit = 1 << d
            cells[best] = d + 1
            rows[r] |= bit
            cols[c] |= bit
            boxes[b] |= bit
            stop = dfs()
            rows[r] ^= bit
            cols[c] ^= bit
            boxes[b] ^= bit
            if stop:
                cells[best] = 0
                return True
        cells[best] = 0
        return False

    dfs()
    return count, (found[0] if found else None)


def count_solutions(puzzle: Sequence[int], limit: int = 2) -> int:
    """Number of solutions of `puzzle` (81 ints, 0 = blank), counted up to `limit`. A check for tests and users'
    own scripts: the generator proves uniqueness with its own search."""
    return _search(puzzle, limit, None)[0]


def solve(puzzle: Sequence[int]) -> list[int] | None:
    """One solution (81 digits) or None if the puzzle has none."""
    return _search(puzzle, 1, None)[1]


def is_valid_solution(grid: Sequence[int]) -> bool:
    """Every row, column and box of a full grid is a permutation of 1-9. A check for tests and users' own
    scripts; nothing in a run calls it."""
    g = np.asarray(grid).reshape(9, 9)  # (81,) → (9, 9)
    want = np.arange(1, 10)
    # (box row, row in box, box column, column in box) → (box, cell in box) = (9, 9)
    boxes = g.reshape(3, 3, 3, 3).transpose(0, 2, 1, 3).reshape(9, 9)
    return all((np.sort(block, axis=1) == want).all() for block in (g, g.T, boxes))


def _random_full_grid(rng: random.Random) -> list[int]:
    return _search([0] * 81, 1, rng)[1]  # the empty grid always has a solution


def _make_puzzle(rng: random.Random, target: int) -> tuple[list[int], list[int]]:
    solution = _random_full_grid(rng)
    puzzle = solution.copy()
    order = list(range(81))
    rng.shuffle(order)
    givens = 81
    for i in order:
        if givens <= target:
            break
        digit, puzzle[i] = puzzle[i], 0
        # The puzzle is unique before this removal, so it stays unique iff no *other* digit in cell i
        # completes to a solution: one cheap "any solution?" search per alternative digit.
        masks = _masks(puzzle)
        rows, cols, boxes = masks
        used = rows[_ROW[i]] | cols[_COL[i]] | boxes[_BOX[i]]
        alternatives = [d + 1 for d in _BITS[ALL & ~used] if d + 1 != digit]
        ambiguous = False
        for alt in alternatives:
            puzzle[i] = alt
            if _search(puzzle, 1, None)[0]:
                ambiguous = True
                break
        puzzle[i] = digit if ambiguous else 0
        givens -= not ambiguous
    return puzzle, solution


def generate_puzzles(
    n: int, seed: int = 0, min_givens: int = 36, max_givens: int = 45
) -> tuple[np.ndarray, np.ndarray]:
    """`n` unique-solution puzzles and their solutions, uint8 arrays of shape (n, 81), 0 = blank.

    The number of givens is drawn uniformly from [min_givens, max_givens] per puzzle (targets below
    what greedy removal can reach leave a few more givens). Same seed, same puzzles.
    """
    if not 17 <= min_givens <= max_givens <= 81:
        raise ValueError(f"need 17 <= min_givens <= max_givens <= 81, got {min_givens}, {max_givens}")
    rng = random.Random(seed)
    puzzles = np.zeros((n, 81), np.uint8)
    solutions = np.zeros((n, 81), np.uint8)
    for k in range(n):
        puzzles[k], solutions[k] = _make_puzzle(rng, rng.randint(min_givens, max_givens))
    return puzzles, solutions


def format_givens_counts(counts: Sequence[int] | np.ndarray) -> str:
    """One line, `givens min/mean/max` plus the histogram, from the number of givens of each puzzle (a dataset's
    `givens` column): what a run records in `metrics.json` under `data`."""
    counts = np.asarray(counts)
    hist = ", ".join(f"{g}: {c}" for g, c in sorted(Counter(counts.tolist()).items()))
    return f"givens min {counts.min()}, mean {counts.mean():.1f}, max {counts.max()} ({hist})"


DIGITS = [str(d) for d in range(1, 10)]  # label names: label k is digit k + 1


def to_dataset(puzzles: np.ndarray, solutions: np.ndarray) -> Dataset:
    """(N, 81) puzzles (0 = blank) and solutions → a token-classification `Dataset`: `input_ids` (the 81 cells),
    `labels` (solution digit − 1 on blank cells, −100 on given cells; a `ClassLabel` of the digits, as a NER
    dataset's tags) and `givens` (count of given cells). Built as Arrow columns (no Python object per puzzle).
    """
    puzzles, solutions = np.asarray(puzzles, np.uint8), np.asarray(solutions, np.uint8)
    labels = np.where(puzzles == 0, solutions.astype(np.int64) - 1, -100)  # loss on blanks only
    features = Features(
        {
            "input_ids": SequenceFeature(Value("int8"), length=81),
            "labels": SequenceFeature(ClassLabel(names=DIGITS), length=81),
            "givens": Value("int16"),
        }
    )
    # (N, 81) → (N·81,), regrouped into 81-cell lists
    table = pa.table(
        {
            "input_ids": pa.FixedSizeListArray.from_arrays(pa.array(puzzles.reshape(-1).astype(np.int8)), 81),
            "labels": pa.FixedSizeListArray.from_arrays(pa.array(labels.reshape(-1)), 81),
            "givens": pa.array((puzzles != 0).sum(1).astype(np.int16)),
        }
    ).cast(features.arrow_schema)
    return Dataset(table, info=DatasetInfo(features=features))


def generate_splits(
    sizes: dict[str, int], seed: int = 0, givens: tuple[int, int] = (36, 45)
) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """Generated (puzzles, solutions) per split, each split from its own seed (spawned from `seed`).

    A puzzle that already occurs in an earlier split is dropped, so a later split can be slightly smaller than
    asked (in practice it never is at these sizes: the generator's space is astronomically large).
    """
    seeds = np.random.SeedSequence(seed).spawn(len(sizes))
    seen: set[bytes] = set()
    out = {}
    for (split, n), split_seed in zip(sizes.items(), seeds):
        puzzles, solutions = generate_puzzles(n, int(split_seed.generate_state(1)[0]), *givens)
        keep = np.array([p.tobytes() not in seen for p in puzzles], dtype=bool)
        seen.update(p.tobytes() for p in puzzles)
        out[split] = (puzzles[keep], solutions[keep])
    return out


def load_sudoku(sizes: dict[str, int], seed: int = 0, givens: tuple[int, int] = (36, 45)) -> DatasetDict:
    """The splits of generated puzzles `generate_splits` draws, as datasets (see `to_dataset` for the columns); the
    built-in `sudoku` dataset is this with `data.SUDOKU_SIZES`."""
    splits = generate_splits(sizes, seed, givens)
    return DatasetDict({split: to_dataset(*arrays) for split, arrays in splits.items()})


# ------------------------------------------------------------------ validity-preserving augmentation


def random_symmetry(rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A random symmetry of Sudoku: (cells, digits) with `new_grid = digits[grid[cells]]`.

    `cells` (81 indices) permutes the bands, the rows inside each band, the stacks, the columns inside each stack and
    transposes with probability 1/2; `digits` (10 entries, `digits[0] == 0` keeps blanks blank) relabels 1-9. Every
    one of these maps a valid board to a valid board and a puzzle with one solution to a puzzle with one solution
    (the image of that solution), so the pair stays a correct training example.
    """
    rows = np.concatenate([3 * band + rng.permutation(3) for band in rng.permutation(3)])  # (9,)
    cols = np.concatenate([3 * stack + rng.permutation(3) for stack in rng.permutation(3)])  # (9,)
    cells = rows[:, None] * 9 + cols[None, :]  # (9, 9): new cell (r, c) reads old cell cells[r, c]
    if rng.random() < 0.5:
        cells = cells.T
    digits = np.concatenate([[0], 1 + rng.permutation(9)])  # (10,): old digit -> new digit
    return cells.reshape(81), digits  # cells (9, 9) → (81,)


def augment(
    input_ids: np.ndarray, labels: np.ndarray, rng: np.random.Generator
) -> tuple[np.ndarray, np.ndarray]:
    """One random symmetry per puzzle of a batch of `to_dataset` rows: `input_ids` (B, 81) with 0 = blank and
    `labels` (B, 81) with solution digit − 1 on blanks and −100 on givens; returns the transformed pair."""
    input_ids, labels = np.asarray(input_ids), np.asarray(labels)
    if input_ids.ndim != 2 or input_ids.shape[1] != 81 or labels.shape != input_ids.shape:
        raise ValueError(
            f"augment: input_ids and labels must both be (batch, 81); got {input_ids.shape} and {labels.shape}"
        )
    new_ids, new_labels = np.empty_like(input_ids), np.empty_like(labels)
    for k in range(len(input_ids)):
        cells, digits = random_symmetry(rng)
        new_ids[k] = digits[input_ids[k, cells]]
        moved = labels[k, cells]
        new_labels[k] = np.where(moved >= 0, digits[np.clip(moved, 0, 8) + 1] - 1, moved)
    return new_ids, new_labels


class SudokuAugmentation(NumberedBatches):
    """`Dataset.with_transform` callable: a fresh random symmetry of every puzzle each time it is read.

    The symmetries of the n-th training batch come from a generator seeded with (`seed`, n) alone, n numbered as
    `batches.NumberedBatches` says: in the main process `batches` counts the batches read, in DataLoader worker w of
    W the j-th batch it reads is batch `batches` + j·W + w. Both training loops set `batches` from their global step
    where each epoch's loader iterator starts (`continue_after`, through `AugmentationCollator`), as they continue the
    training masks of masked image modelling (`data.MaskedCodesCollator`). So a resumed run, which skips the batches
    already seen without reading them, draws what the uninterrupted run drew, with or without workers, and `--seed`
    fixes it. Not one generator advanced read by read: its state is in no checkpoint, so a resumed run would start
    the stream over. Nor each batch's seed drawn from torch's generator, which the checkpoints hold: a loader reads
    one batch ahead, and both loops read a resumed epoch's first batches before they set the checkpoint's RNG states
    again (Trainer's order, `accelerate_loop.resume_rng_after_first_window`), so those reads would draw elsewhere.
    """

    draws = "the Sudoku symmetries"

    def __init__(self, seed: int = 0) -> None:
        self.seed = seed
        self.batches = 0

    def __call__(self, batch: dict[str, list]) -> dict[str, list]:
        rng = np.random.default_rng([self.seed, self.next_batch_index()])
        input_ids, labels = augment(np.asarray(batch["input_ids"]), np.asarray(batch["labels"]), rng)
        return {**batch, "input_ids": input_ids.tolist(), "labels": labels.tolist()}


class AugmentationCollator:
    """The collator of a `--sudoku_augmentation` run: `collator`'s batches, with `augmentation`'s `continue_after`
    and `check_loader`. Both training loops continue their collator's stream where each epoch's loader iterator
    starts, and check their training loader against it; the symmetries come from the training split's transform,
    so this carries those calls to them (`SudokuAugmentation`). A class, not a closure, so DataLoader workers started
    by spawn can pickle it."""

    def __init__(self, collator: Any, augmentation: SudokuAugmentation) -> None:
        self.collator = collator
        self.augmentation = augmentation

    def __call__(self, rows: list[Any]) -> Any:
        return self.collator(rows)

    def continue_after(
        self, global_step: int, batches_per_epoch: int, gradient_accumulation_steps: int
    ) -> None:
        self.augmentation.continue_after(global_step, batches_per_epoch, gradient_accumulation_steps)

    def check_loader(self, loader: Any) -> None:
        self.augmentation.check_loader(loader)
