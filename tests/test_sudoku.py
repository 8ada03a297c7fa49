import itertools

import numpy as np
import pytest

from energyformers.training.sudoku import (
    count_solutions,
    format_givens_counts,
    generate_puzzles,
    is_valid_solution,
    load_sudoku,
    solve,
)

PUZZLE = "530070000600195000098000060800060003400803001700020006060000280000419005000080079"
SOLUTION = "534678912672195348198342567859761423426853791713924856961537284287419635345286179"


def _grid(s: str) -> list[int]:
    return [int(ch) for ch in s]


def test_solver_known_puzzle():
    assert solve(_grid(PUZZLE)) == _grid(SOLUTION)
    assert count_solutions(_grid(PUZZLE)) == 1
    assert is_valid_solution(_grid(SOLUTION))


def test_solver_no_solution_and_clash():
    clash = _grid(PUZZLE)
    clash[2] = 5  # second 5 in row 0
    assert count_solutions(clash) == 0 and solve(clash) is None
    bad = _grid(SOLUTION)
    bad[0], bad[1] = bad[1], bad[0]
    assert not is_valid_solution(bad)


# Rows and columns are permutations of 1-9, boxes are not (box 0 holds 1,2,3 / 2,3,4 / 3,4,5): only the box
# check can reject it, and a box reshape that yields rows or columns instead of boxes accepts it.
LATIN_NOT_SUDOKU = [(r + c) % 9 + 1 for r in range(9) for c in range(9)]


def test_a_latin_square_that_is_no_sudoku_is_invalid():
    g = np.asarray(LATIN_NOT_SUDOKU).reshape(9, 9)
    want = np.arange(1, 10)
    assert (np.sort(g, 1) == want).all() and (np.sort(g.T, 1) == want).all(), g  # the premise
    assert not is_valid_solution(LATIN_NOT_SUDOKU)
    assert not is_valid_solution(np.asarray(LATIN_NOT_SUDOKU, dtype=np.uint8))
    # every box a permutation but no row or column: the box check alone must not accept it either
    boxes_only = [(r % 3) * 3 + c % 3 + 1 for r in range(9) for c in range(9)]
    assert not is_valid_solution(boxes_only)
    assert is_valid_solution(
        _grid(SOLUTION)
    )  # a real solution, whose boxes are only right if box = 3x3 block


def _deadly_rectangle(g: list[int]) -> tuple[int, int, int, int] | None:
    """Cells (r1,c1),(r1,c2),(r2,c1),(r2,c2) in two boxes holding a,b / b,a: swapping them is another solution."""
    for r1, r2 in itertools.combinations(range(9), 2):
        if r1 // 3 != r2 // 3:
            continue
        for c1, c2 in itertools.combinations(range(9), 2):
            if c1 // 3 == c2 // 3:
                continue
            if g[r1 * 9 + c1] == g[r2 * 9 + c2] and g[r1 * 9 + c2] == g[r2 * 9 + c1]:
                return r1 * 9 + c1, r1 * 9 + c2, r2 * 9 + c1, r2 * 9 + c2
    return None


def test_uniqueness_detection():
    assert count_solutions([0] * 81) == 2  # capped at the limit
    assert count_solutions([0] * 81, limit=5) == 5
    # A full grid minus a deadly rectangle has exactly two solutions.
    _, solutions = generate_puzzles(20, seed=1)
    for sol in solutions.tolist():
        cells = _deadly_rectangle(sol)
        if cells is not None:
            break
    assert cells is not None
    puzzle = list(sol)
    for i in cells:
        puzzle[i] = 0
    assert count_solutions(puzzle, limit=10) == 2


@pytest.mark.parametrize("lo,hi,n", [(36, 45, 40), (24, 30, 8)])
def test_generated_puzzles_valid(lo, hi, n):
    puzzles, solutions = generate_puzzles(n, seed=3, min_givens=lo, max_givens=hi)
    assert puzzles.shape == solutions.shape == (n, 81) and puzzles.dtype == solutions.dtype == np.uint8
    givens = (puzzles != 0).sum(1)
    assert (givens >= lo).all() and (givens <= hi).all()
    for p, s in zip(puzzles, solutions):
        assert is_valid_solution(s)
        mask = p != 0
        assert (p[mask] == s[mask]).all()
        assert count_solutions(p.tolist()) == 1
        assert solve(p.tolist()) == s.tolist()


# no Sudoku with fewer than 17 givens has a unique solution (McGuire, Tugemann and Civario, "There is no 16-clue
# Sudoku"), so such a target is refused; so are an empty range and one past the 81 cells
@pytest.mark.parametrize("lo,hi", [(16, 20), (30, 29), (17, 82)])
def test_a_givens_range_outside_17_to_81_is_refused(lo, hi):
    with pytest.raises(ValueError, match=rf"need 17 <= min_givens <= max_givens <= 81, got {lo}, {hi}"):
        generate_puzzles(1, min_givens=lo, max_givens=hi)


def test_seeding_deterministic():
    a = generate_puzzles(10, seed=7)
    b = generate_puzzles(10, seed=7)
    c = generate_puzzles(10, seed=8)
    assert all((x == y).all() for x, y in zip(a, b))
    assert not (a[0] == c[0]).all()


def test_givens_distribution():
    puzzles, _ = generate_puzzles(30, seed=0, min_givens=40, max_givens=42)
    counts = (puzzles != 0).sum(1)
    assert set(counts.tolist()) <= {40, 41, 42} and len(counts) == 30, counts
    # what a run records in metrics.json's `data` (run_folder.data_summary, from the dataset's `givens` column)
    line = format_givens_counts([40, 42, 40])
    assert line == "givens min 40, mean 40.7, max 42 (40: 2, 42: 1)", line


def test_load_sudoku_layout():
    data = load_sudoku({"train": 20, "test": 10}, seed=0, givens=(38, 42))
    assert set(data) == {"train", "test"} and len(data["train"]) == 20 and len(data["test"]) == 10
    assert set(data["train"].column_names) == {"input_ids", "labels", "givens"}
    x = np.array(data["train"]["input_ids"])
    y = np.array(data["train"]["labels"])
    assert x.shape == y.shape == (20, 81) and x.min() >= 0 and x.max() <= 9
    assert ((y == -100) == (x != 0)).all()  # loss only on blanks
    assert ((y[x == 0] >= 0) & (y[x == 0] <= 8)).all()
    assert (np.array(data["train"]["givens"]) == (x != 0).sum(1)).all()
    for row_x, row_y in zip(x, y):  # puzzle + labels reassemble into the unique solution
        full = np.where(row_x == 0, row_y + 1, row_x)
        assert is_valid_solution(full) and solve(row_x.tolist()) == full.tolist()
    train = {bytes(r) for r in x.astype(np.uint8)}
    test = {bytes(r) for r in np.array(data["test"]["input_ids"]).astype(np.uint8)}
    assert not train & test
    again = load_sudoku({"train": 20, "test": 10}, seed=0, givens=(38, 42))
    assert again["test"]["input_ids"] == data["test"]["input_ids"]
