"""The inputs `inspect` and `predict` share a check for (`predict.check_inputs`): a Sudoku model's puzzle strings are
refused in one line with status 2 before torch loads unless they are 81 cells of 0-9 or '.'; and predict's
`--halting_criterion` without a tolerance to apply it to."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fixtures import run_cli_cases

SUDOKU_MESSAGE = "a Sudoku model takes 81-character puzzles of digits 0-9 or '.' (blank); got "
PUZZLE = "53..7....6..195....98....6.8...6...34..8.3..17...2...6.6....28....419..5....8..79"


def sudoku_folder(folder: Path) -> Path:
    """A Sudoku model folder as far as the checks before torch loads read it: its config names the
    token-classification head, and a readable one-tensor safetensors file."""
    from safetensors.torch import save_file

    folder.mkdir()
    config = {
        "model_type": "hyperset",
        "input_type": "sequence",
        "architectures": ["HyperSetForTokenClassification"],
        "num_iterations": 2,
    }
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


def test_a_puzzle_that_is_not_81_cells_is_one_line_before_torch_loads(tmp_path):
    model = sudoku_folder(tmp_path / "sudoku")
    assert len(PUZZLE) == 81
    cases = {
        "not digits": (["predict", model, "hello world"], "'hello world' ('h' is not a cell)"),
        "too short": (["predict", model, "12345"], "'12345' (5 cells)"),
        "too long, not cut": (["predict", model, PUZZLE + "1234"], "...' (85 cells)"),
        "search on a short one": (
            ["predict", model, "12345", "--search_trajectories", "2", "--search_selector", "sudoku"],
            "'12345' (5 cells)",
        ),
        "one bad among good": (["predict", model, PUZZLE, PUZZLE[:80] + "x"], "('x' is not a cell)"),
        "predict: a halting criterion without a tolerance": (
            ["predict", model, PUZZLE, "--halting_criterion", "energy"],
            "pass --halting_tolerance as well",
        ),
        "inspect": (
            ["inspect", model, "hello world", "--output_dir", tmp_path / "out"],
            "'hello world' ('h' is not a cell)",
        ),
    }
    results = run_cli_cases([argv for argv, _ in cases.values()], cwd=tmp_path)
    for (name, (argv, fragment)), result in zip(cases.items(), results, strict=True):
        lines = [line for line in result["err"].splitlines() if line.strip()]
        assert result["code"] == 2 and len(lines) == 1, (name, result)
        expected = f"energyformers {argv[0]}: error: " + (
            "" if "halting" in name else f"{model}: {SUDOKU_MESSAGE}"
        )
        assert lines[0].startswith(expected) and lines[0].endswith(fragment), (name, lines[0])
        assert result["heavy"] == [], (name, result["heavy"])  # refused before torch or the models load
    assert sorted(p.name for p in tmp_path.iterdir()) == ["sudoku"]
