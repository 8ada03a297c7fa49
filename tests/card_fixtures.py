"""Small real run folders for the model-card and release tests: `energyformers train` on a few generated Sudoku
puzzles, and the Python blocks of a rendered card."""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from pathlib import Path

import pytest

from energyformers.training import data, train

# A model small enough to train one step in about a second; its card is what matters here, not its accuracy.
TINY = ["hidden_size=16", "num_attention_heads=2", "intermediate_size=32", "num_iterations=2"]
# Fewer generated puzzles than the built-in's 12,000 (about 20 s to generate): enough for one batch per split.
TINY_SUDOKU_SIZES = {"train": 16, "validation": 8, "test": 8}


def train_sudoku_run(output_dir: Path, model: str = "hyperset") -> Path:
    """A finished `energyformers train --dataset sudoku` run folder (model, tokenizer, metrics.json, card)."""
    argv = [
        "--model", model, "--dataset", "sudoku", "--config", *TINY, "--max_steps", "1", "--batch_size", "8",
        "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0", "--output_dir", str(output_dir),
    ]  # fmt: skip
    assert train.main(argv) == 0, argv
    return output_dir


@contextlib.contextmanager
def tiny_sudoku(cache: Path) -> Iterator[None]:
    """The `sudoku` built-in with `TINY_SUDOKU_SIZES` puzzles, cached in `cache`, which stays named in the
    environment inside the block, so an `energyformers inspect` subprocess reads the same puzzles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data, "SUDOKU_SIZES", TINY_SUDOKU_SIZES)
        patch.setenv("ENERGYFORMERS_CACHE", str(cache))
        yield


def python_blocks(card_text: str) -> list[str]:
    """The ```python blocks of a card, in order."""
    return re.findall(r"```python\n(.*?)```", card_text, flags=re.S)
