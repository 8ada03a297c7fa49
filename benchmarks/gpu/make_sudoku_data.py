"""Write the small Sudoku file that the GPU run trains on (`benchmarks/gpu/sudoku_hard_subset.csv.gz`).

The GPU machine has no network and no `larsdoku` package, so the puzzles travel in the work tree: the first
`--train` / `--validation` / `--test` puzzles of each split of the documented `sudoku-hard` split
(training/data.py: the larsdoku 4.0.0 collection, 21-29 givens, seed-0 permutation), with their solutions. One
CSV row per puzzle: `split,puzzle,solution`, 81 digits each (0 = blank). Run here, where `sudoku-hard` loads:

    python benchmarks/gpu/make_sudoku_data.py
"""

from __future__ import annotations

import argparse
import gzip
from pathlib import Path

import numpy as np

from energyformers.training.data import load_data

DEFAULT_PATH = Path(__file__).parent / "sudoku_hard_subset.csv.gz"
SIZES = {"train": 4096, "validation": 256, "test": 512}


def solutions_of(split) -> np.ndarray:
    """(N, 81) solutions: the given digits where a cell is given, else the label digit."""
    puzzles = np.asarray(split["input_ids"], dtype=np.int64)
    labels = np.asarray(split["labels"], dtype=np.int64)
    return np.where(labels >= 0, labels + 1, puzzles)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    for name, size in SIZES.items():
        parser.add_argument(f"--{name}", type=int, default=size, help=f"puzzles of the {name} split")
    parser.add_argument("--output", type=Path, default=DEFAULT_PATH)
    args = parser.parse_args(argv)
    for name in SIZES:
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1; got {getattr(args, name)}")
    data = load_data("sudoku-hard")
    rows = ["split,puzzle,solution"]
    for name in SIZES:
        split = data[name].select(range(getattr(args, name)))
        puzzles, solutions = np.asarray(split["input_ids"], dtype=np.int64), solutions_of(split)
        rows += [f"{name},{''.join(map(str, p))},{''.join(map(str, s))}" for p, s in zip(puzzles, solutions)]
    # mtime=0: the same puzzles give the same bytes, so a rerun leaves git with nothing to commit
    args.output.write_bytes(gzip.compress(("\n".join(rows) + "\n").encode(), mtime=0))
    print(f"wrote {args.output} ({args.output.stat().st_size / 1024:.0f} KiB, {len(rows) - 1} puzzles)")


if __name__ == "__main__":
    main()
