"""The Sudoku stage of the GPU run: `energyformers train` with a named recipe on the puzzles carried in the tree.

The GPU machine has no network and no `larsdoku`, so `--dataset sudoku-hard` cannot be built there. This runner
registers the carried file (`sudoku_hard_subset.csv.gz`, written by make_sudoku_data.py: a prefix of each
documented `sudoku-hard` split) as a built-in dataset of this process only, `sudoku-hard-subset`, and runs the
training CLI on it; everything after loading is the CLI's own code. The run folder (weights, checkpoints, the
Arrow cache) goes to `--work_dir`; `--result` gets one JSON file with the command, the test and validation board
and blank-cell accuracy, and the run's time.

    python benchmarks/gpu/sudoku_train.py --recipe hyperset-sudoku-ds-fast --max_steps 6000 \\
        --work_dir /tmp/sudoku --result OUT/sudoku.json [--config KEY=VALUE ...] [--train_seconds 70] [--smoke]

`--config KEY=VALUE ...`: the model's config overrides on top of `--preset sudoku` (the CLI's `--config`; run.sh
passes the model its recipe was measured with), recorded in the result with the model's resulting fields.

`--train_seconds S`: training stops at `--max_steps` or once the script has run S seconds, whichever comes first,
and the run then evaluates and writes its metrics as after `--max_steps` (the result says which stopped it and at
which step), so a GPU slower than planned still yields a board accuracy inside the stage's budget.

`--smoke`: the reduced model of the CLI tests and a few puzzles (a CPU check of the stage, no measurement); its
sizes replace those `--config` gives, its other fields stay.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import sys
import time
from pathlib import Path

import numpy as np

DATA = Path(__file__).parent / "sudoku_hard_subset.csv.gz"
DATASET_NAME = "sudoku-hard-subset"
SPLITS = ("train", "validation", "test")
# the reduced Hyper-SET of tests/test_sudoku_cli.py: seconds per step on CPU
SMOKE_CONFIG = ["hidden_size=32", "num_attention_heads=4", "intermediate_size=64", "num_iterations=2"]
# the saved config fields the result records (what `--config` and the preset made of the model)
MODEL_FIELDS = (
    "hidden_size",
    "num_attention_heads",
    "intermediate_size",
    "num_iterations",
    "initializer_range",
    "position_embedding_type",
)


def read_puzzles(path: Path) -> dict[str, tuple[np.ndarray, np.ndarray]]:
    """{split: (puzzles, solutions)}, uint8 (N, 81) each, from the `split,puzzle,solution` CSV (gzip)."""
    rows: dict[str, tuple[list[bytes], list[bytes]]] = {split: ([], []) for split in SPLITS}
    lines = gzip.decompress(path.read_bytes()).decode().splitlines()
    if not lines or lines[0] != "split,puzzle,solution":
        raise ValueError(f"{path}: expected the header 'split,puzzle,solution', got {lines[:1]}")
    for number, line in enumerate(lines[1:], start=2):
        split, puzzle, solution = line.split(",")
        if split not in rows or len(puzzle) != 81 or len(solution) != 81:
            raise ValueError(f"{path}, line {number}: expected split in {SPLITS} and two 81-digit grids")
        rows[split][0].append(puzzle.encode())
        rows[split][1].append(solution.encode())
    out = {}
    for split, (puzzles, solutions) in rows.items():
        if not puzzles:
            raise ValueError(f"{path}: the {split!r} split is empty")
        grids = [
            np.frombuffer(b"".join(g), np.uint8).reshape(-1, 81) - ord("0") for g in (puzzles, solutions)
        ]
        out[split] = (grids[0].astype(np.uint8), grids[1].astype(np.uint8))
    return out


def register(path: Path) -> None:
    """Make `--dataset sudoku-hard-subset` load `path` (in this process), as a Sudoku dataset: its boards are
    9 × 9 Sudoku, so `--sudoku_augmentation` (a flag of the deep-supervised recipe) takes it."""
    from datasets import DatasetDict

    from energyformers.training import arguments, data
    from energyformers.training.sudoku import to_dataset

    def build() -> DatasetDict:
        return DatasetDict({split: to_dataset(*arrays) for split, arrays in read_puzzles(path).items()})

    data.BUILTIN_DATASETS[DATASET_NAME] = data.BuiltinDataset(
        build,
        f"the Sudoku puzzles of {path.name} (carried for the GPU run)",
        f"Sudoku ({path.name})",
        f"The Sudoku puzzles of `{path.name}`, carried for the GPU run.",
    )
    if DATASET_NAME not in arguments.SUDOKU_DATASETS:
        arguments.SUDOKU_DATASETS = (*arguments.SUDOKU_DATASETS, DATASET_NAME)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--recipe", required=True, help="a name of training.recipes.RECIPES")
    parser.add_argument("--max_steps", type=int, required=True, help="optimizer steps of the short run")
    parser.add_argument("--work_dir", type=Path, required=True, help="run folder, checkpoints and data cache")
    parser.add_argument("--result", type=Path, required=True, help="the JSON file of results")
    parser.add_argument("--data", type=Path, default=DATA, help="the carried puzzle file")
    parser.add_argument(
        "--train_seconds",
        type=float,
        default=None,
        help="stop training once the script has run this long (then evaluate); default: --max_steps only",
    )
    parser.add_argument(
        "--config",
        nargs="+",
        default=[],
        metavar="KEY=VALUE",
        help="model config overrides on top of --preset sudoku (the training CLI's --config; values as JSON)",
    )
    parser.add_argument("--smoke", action="store_true", help="reduced model, few puzzles: checks the stage")
    args = parser.parse_args(argv)
    if args.max_steps < 1:
        parser.error(f"--max_steps must be an integer >= 1; got {args.max_steps}")
    if args.train_seconds is not None and not args.train_seconds >= 0:
        parser.error(f"--train_seconds must be a number of seconds >= 0; got {args.train_seconds}")
    if not args.data.is_file():
        parser.error(f"--data {args.data}: no such file (write it with benchmarks/gpu/make_sudoku_data.py)")
    from energyformers.training.recipes import RECIPES

    if args.recipe not in RECIPES:
        parser.error(f"--recipe {args.recipe!r}: unknown recipe; expected one of {sorted(RECIPES)}")
    return args


def deadline_callback(deadline: float, record: dict):
    """A `TrainerCallback` that ends training at the first step end past `deadline` (`time.perf_counter()`), as
    reaching `max_steps` does (the run then evaluates and saves), writing the step into `record`."""
    from transformers import TrainerCallback

    class StopAtDeadline(TrainerCallback):
        def on_step_end(self, args, state, control, **kwargs):
            if time.perf_counter() >= deadline and not control.should_training_stop:
                control.should_training_stop = True
                record.update(stopped_by="train_seconds", stopped_at_step=state.global_step)
            return control

    return StopAtDeadline()


def main(argv: list[str] | None = None) -> int:
    started = time.perf_counter()
    args = parse_args(argv)
    # the built-in cache goes beside the run, not into the home folder of the GPU machine
    os.environ["ENERGYFORMERS_CACHE"] = str(args.work_dir / "cache")
    register(args.data)
    from energyformers.training import train

    run_dir = args.work_dir / "run"
    train_argv = [
        "--model", "hyperset", "--preset", "sudoku", "--dataset", DATASET_NAME, "--recipe", args.recipe,
        "--max_steps", str(args.max_steps), "--output_dir", str(run_dir), "--overwrite_output_dir",
        "--disable_tqdm", "--num_predictions", "2",
    ]  # fmt: skip
    # one --config list (a second one would replace the first); the smoke sizes come last, so they win
    config = [*args.config, *(SMOKE_CONFIG if args.smoke else [])]
    if config:
        train_argv += ["--config", *config]
    if args.smoke:
        train_argv += ["--max_train_samples", "32", "--batch_size", "8"]
        train_argv += ["--max_eval_samples", "16", "--max_test_samples", "16", "--num_threads", "1"]
    stop: dict = {"stopped_by": "max_steps"}
    callbacks = []
    if args.train_seconds is not None:
        callbacks.append(deadline_callback(started + args.train_seconds, stop))
    start = time.perf_counter()
    code = train.main(train_argv, callbacks=callbacks)
    seconds = time.perf_counter() - start
    result: dict = {
        "command": "energyformers train " + " ".join(train_argv),
        "recipe": args.recipe,
        "config": args.config,
        "max_steps": args.max_steps,
        "train_seconds": args.train_seconds,
        **stop,
        "smoke": args.smoke,
        "exit_code": code,
        "seconds": seconds,
    }
    config_file = run_dir / "config.json"
    # the model trained: the recipe's loss iterations, --config's fields
    if code == 0 and config_file.is_file():
        saved = json.loads(config_file.read_text())
        result["deep_supervision"] = saved.get("deep_supervision")
        result["deep_supervision_weights"] = saved.get("deep_supervision_weights")
        result["model"] = {key: saved.get(key) for key in MODEL_FIELDS}
    metrics_file = run_dir / "metrics.json"
    if code == 0 and metrics_file.is_file():
        metrics = json.loads(metrics_file.read_text())
        for split in ("eval", "test"):
            result[split] = {
                key: metrics.get(split, {}).get(key) for key in ("board_accuracy", "blank_cell_accuracy")
            }
        result["data"] = metrics.get("data")
        # the optimiser the run used (the recipe's values, or what a flag replaced)
        result["optimizer"] = {
            key: metrics.get("recipe", {}).get(key) for key in ("learning_rate", "adam_betas")
        }
        result["sudoku_augmentation"] = (
            metrics.get("arguments", {}).get("data", {}).get("sudoku_augmentation")
        )
    args.result.parent.mkdir(parents=True, exist_ok=True)
    args.result.write_text(json.dumps(result, indent=2) + "\n")
    board = result.get("test", {}).get("board_accuracy")
    print(f"sudoku: exit {code}, test board accuracy {board}, {seconds:.0f} s; wrote {args.result}")
    return code if code else (0 if board is not None else 1)


if __name__ == "__main__":
    sys.exit(main())
