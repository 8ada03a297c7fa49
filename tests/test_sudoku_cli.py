"""Sudoku as a task of the training CLI: `--dataset sudoku` (our generator) and
`--dataset sudoku-hard` (the larsdoku 4.0.0 collection), token classification with board and blank-cell
accuracy, a saved folder that `pipeline("token-classification")` reads puzzle strings with.

Short CI variants; the full-size command (full validation and test splits) and the paper-size preset
are `slow`.
"""

from __future__ import annotations

import importlib.metadata
import json
from pathlib import Path

import numpy as np
import pytest
from fixtures import require_dataset
from transformers import AutoTokenizer, pipeline

from energyformers.training import accelerate_loop, data, train
from energyformers.training.data import MissingDataError, load_data
from energyformers.training.evaluation import task_metrics
from energyformers.training.processing import cell_tokenizer
from energyformers.training.sudoku import count_solutions, is_valid_solution

REDUCED = ["hidden_size=32", "num_attention_heads=4", "intermediate_size=64", "num_iterations=4"]
SMALL_EVAL = ["--max_eval_samples", "32", "--max_test_samples", "32"]
INSTALL = "pip install --no-deps larsdoku==4.0.0"
# The documented split: first puzzle of each split of sudoku-hard (seed-0 permutation of the collection).
FIRST_HARD = {
    "train": "000100930090300200003009006005004320004203600000050004080070400009002060500030000",
    "validation": "030068000010003006900700000080620310000000002000001680405000160020006008000040200",
    "test": "000302009900016200070000006800530601100089020007000000014000800000000000700068002",
}


@pytest.fixture(scope="module")
def hard() -> data.DatasetDict:
    return require_dataset("sudoku-hard")


@pytest.fixture
def small_generated(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """`--dataset sudoku` with 40/8/8 puzzles, cached under tmp_path (the real one takes ~30 s to generate)."""
    monkeypatch.setattr(data, "SUDOKU_SIZES", {"train": 40, "validation": 8, "test": 8})
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path / "cache"))


def grid(cells: list[int]) -> str:
    return "".join(str(c) for c in cells)


# ------------------------------------------------------------------------------ data


def test_sudoku_hard_split(hard: data.DatasetDict) -> None:
    assert {split: len(ds) for split, ds in hard.items()} == {
        "train": 100_000,
        "validation": 1_000,
        "test": 10_000,
    }
    assert {split: grid(hard[split][0]["input_ids"]) for split in hard} == FIRST_HARD
    seen: set[bytes] = set()
    for ds in hard.values():
        x = np.asarray(ds["input_ids"], np.uint8)
        givens = (x != 0).sum(1)
        assert givens.min() >= 21 and givens.max() <= 29
        assert (np.asarray(ds["givens"]) == givens).all()
        rows = {r.tobytes() for r in x}
        assert len(rows) == len(x) and not rows & seen  # distinct puzzles, disjoint splits
        seen |= rows
    test = hard["test"].select(range(20))
    for x, y in zip(test["input_ids"], test["labels"]):
        x, y = np.asarray(x), np.asarray(y)
        assert ((y == -100) == (x != 0)).all()
        solution = np.where(x == 0, y + 1, x)
        assert is_valid_solution(solution) and count_solutions(x.tolist()) == 1
    assert hard["train"].features["labels"].feature.names == [str(d) for d in range(1, 10)]


def test_sudoku_hard_missing_package_names_the_install_command(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture
) -> None:
    def missing(name: str):
        raise importlib.metadata.PackageNotFoundError(name)

    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path / "cache"))  # no cached copy either
    monkeypatch.setattr(data.importlib.metadata, "distribution", missing)
    with pytest.raises(MissingDataError) as err:
        load_data("sudoku-hard")
    assert err.value.install_command == INSTALL
    out = tmp_path / "model"
    assert train.main(["--dataset", "sudoku-hard", "--output_dir", str(out)]) == 2
    assert INSTALL in capsys.readouterr().err and not out.exists()


def test_cell_tokenizer_reads_puzzle_strings(tmp_path: Path) -> None:
    tokenizer = cell_tokenizer()
    assert tokenizer("53..7")["input_ids"] == [5, 3, 0, 0, 7]
    assert tokenizer("1 2\n3")["input_ids"] == [1, 2, 3]  # whitespace and line breaks are layout only
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(FIRST_HARD["test"])["input_ids"] == [int(c) for c in FIRST_HARD["test"]]
    assert len(reloaded) == 10 and reloaded.model_max_length == 81


def test_token_metrics() -> None:
    labels = np.array([[0, -100, 2], [1, 1, -100]])
    predictions = np.array([[0, 5, 2], [1, 0, 7]])  # board 0 solved (given cell ignored), board 1 half right
    metrics = task_metrics("token-classification", predictions, labels)
    assert metrics == {"blank_cell_accuracy": 0.75, "board_accuracy": 0.5}


def test_small_split_warning_counts_what_each_sudoku_metric_counts(small_generated: None) -> None:
    """8 boards: board_accuracy moves in 1/8 steps, but blank_cell_accuracy counts hundreds of blank cells; the
    warning says which metric is coarse and how many cells the other one counts."""
    from energyformers.training.setup import small_split_warnings

    boards = load_data("sudoku")
    warnings = small_split_warnings(boards)
    for split, warning in zip(("validation", "test"), warnings, strict=True):
        cells = int((np.asarray(boards[split]["labels"]) != -100).sum())
        assert warning.startswith(
            f"the {split} split has only 8 boards: its board_accuracy moves in steps of 12 "
        ), warning
        assert f"blank_cell_accuracy counts {cells:,} blank cells" in warning, (warning, cells)
        assert "examples" not in warning, warning


# ------------------------------------------------------------------------------ CLI


def test_sudoku_hard_short_run(hard: data.DatasetDict, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """The documented Sudoku command (reduced model, 64 puzzles, 3 steps), with small validation/test subsets."""
    out = tmp_path / "sudoku"
    argv = [
        "--model", "hyperset", "--dataset", "sudoku-hard", "--preset", "sudoku", "--config", *REDUCED,
        "--max_train_samples", "64", "--max_steps", "3", "--output_dir", str(out), *SMALL_EVAL,
        "--num_predictions", "2", "--disable_tqdm", "--num_threads", "1",
    ]  # fmt: skip
    assert train.main(argv) == 0
    printed = capsys.readouterr().out
    assert "test board accuracy" in printed and "blank-cell accuracy" in printed and "blanks right" in printed
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["task"] == "token-classification"
    for split in ("eval", "test"):
        assert 0 <= metrics[split]["board_accuracy"] <= metrics[split]["blank_cell_accuracy"] <= 1
    assert metrics["data"]["test"].startswith("givens min 2")
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["HyperSetForTokenClassification"]
    assert (config["hidden_size"], config["num_iterations"], config["vocab_size"]) == (32, 4, 10)
    assert config["max_position_embeddings"] == 81 and len(config["id2label"]) == 9
    # the folder is a standard token-classification model: a puzzle string in, one digit per cell out
    cells = pipeline("token-classification", model=str(out))(FIRST_HARD["test"].replace("0", "."))
    assert len(cells) == 81 and {cell["entity"] for cell in cells} <= set("123456789")


def test_generated_sudoku_with_the_accelerate_loop(small_generated: None, tmp_path: Path) -> None:
    out = tmp_path / "sudoku"
    argv = [
        "--dataset", "sudoku", "--config", *REDUCED, "--max_steps", "2", "--batch_size", "8",
        "--num_predictions", "1", "--output_dir", str(out),
    ]  # fmt: skip
    assert accelerate_loop.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert set(metrics["test"]) == {"loss", "blank_cell_accuracy", "board_accuracy"}
    assert metrics["data"]["train"].startswith("givens min 3")  # 36–45 givens
    config = json.loads((out / "config.json").read_text())
    assert config["architectures"] == ["HyperSetForTokenClassification"]
    assert config["position_embedding_type"] == "learned"  # the fixed 81-cell layout, without --preset


def test_sudoku_needs_a_token_classification_head(
    small_generated: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "model"
    assert train.main(["--model", "imixer", "--dataset", "sudoku", "--output_dir", str(out)]) == 2
    error = capsys.readouterr().err
    assert "token-classification" in error and "hyperset" in error and not out.exists()


@pytest.mark.slow
def test_sudoku_hard_documented_command(hard: data.DatasetDict, tmp_path: Path) -> None:
    """The documented Sudoku command as is: full 1,000-puzzle validation and 10,000-puzzle test split (15–60 s)."""
    out = tmp_path / "sudoku"
    argv = [
        "--model", "hyperset", "--dataset", "sudoku-hard", "--preset", "sudoku", "--config", *REDUCED,
        "--max_train_samples", "64", "--max_steps", "3", "--output_dir", str(out),
    ]  # fmt: skip
    assert train.main(argv) == 0
    assert set(json.loads((out / "metrics.json").read_text())["test"]) >= {
        "board_accuracy",
        "blank_cell_accuracy",
    }


@pytest.mark.slow
def test_sudoku_paper_size_preset(hard: data.DatasetDict, tmp_path: Path) -> None:
    """`--preset sudoku` unreduced: d = 768, 12 heads, T = 24 (paper Table 4), one step on CPU (5–40 s)."""
    out = tmp_path / "sudoku"
    argv = [
        "--dataset", "sudoku-hard", "--preset", "sudoku", "--max_train_samples", "4", "--batch_size", "2",
        "--max_steps", "1", "--max_eval_samples", "2", "--max_test_samples", "2", "--num_predictions", "0",
        "--output_dir", str(out),
    ]  # fmt: skip
    assert train.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    assert (config["hidden_size"], config["num_attention_heads"], config["num_iterations"]) == (768, 12, 24)


# ------------------------------------------------------------------------------ deep supervision and augmentation


@pytest.mark.parametrize("loop", [train, accelerate_loop], ids=["trainer", "accelerate"])
@pytest.mark.parametrize("model", ["hyperset", "looped-transformer"])
def test_deep_supervision_and_augmentation_flags_in_both_loops(
    small_generated: None, tmp_path: Path, loop, model: str
) -> None:
    """Tiny runs with a loss on several iterations and augmented boards: the flags set the config fields of the same
    name (saved in config.json) and the run is recorded with them."""
    out = tmp_path / "sudoku"
    supervision = (
        ["--deep_supervision", "random", "--deep_supervision_samples", "3"]
        if loop is accelerate_loop
        else ["--deep_supervision", "every", "--deep_supervision_interval", "2"]
    )
    argv = [
        "--model", model, "--dataset", "sudoku", "--config", *REDUCED, "--max_steps", "2", "--batch_size", "8",
        *supervision, "--deep_supervision_weights", "linear", "--sudoku_augmentation",
        "--num_predictions", "0", "--output_dir", str(out), "--disable_tqdm", "--num_threads", "1",
    ]  # fmt: skip
    assert loop.main(argv) == 0
    config = json.loads((out / "config.json").read_text())
    expected = {"deep_supervision": supervision[1], "deep_supervision_weights": "linear"}
    expected[supervision[2].removeprefix("--")] = int(supervision[3])
    assert {k: config[k] for k in expected} == expected
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["arguments"]["data"]["sudoku_augmentation"] is True
    assert set(metrics["test"]) >= {"blank_cell_accuracy", "board_accuracy"}


def test_sudoku_augmentation_transforms_the_training_split_only(
    small_generated: None, tmp_path: Path
) -> None:
    from accelerate import PartialState

    from energyformers.training.setup import build

    raw = load_data("sudoku")
    argv = [
        "--dataset",
        "sudoku",
        "--config",
        *REDUCED,
        "--sudoku_augmentation",
        "--output_dir",
        str(tmp_path / "unused"),
    ]
    built = build(train.parse(argv), PartialState())
    moved = 0
    for index in range(len(raw["train"])):
        row, original = built.data["train"][index], raw["train"][index]
        puzzle, labels = np.asarray(row["input_ids"]), np.asarray(row["labels"])
        assert ((labels == -100) == (puzzle != 0)).all(), f"train row {index}: labels not on the blanks"
        solution = np.where(puzzle == 0, labels + 1, puzzle)
        assert is_valid_solution(solution), f"train row {index}: the augmented solution is not a valid board"
        assert (puzzle != 0).sum() == original["givens"]
        moved += grid(row["input_ids"]) != grid(original["input_ids"])
    assert moved >= len(raw["train"]) - 1, f"only {moved} of {len(raw['train'])} training puzzles changed"
    for split in ("validation", "test"):
        for index in range(len(raw[split])):
            assert built.data[split][index]["input_ids"] == raw[split][index]["input_ids"], f"{split} {index}"


def test_sudoku_augmentation_needs_a_sudoku_dataset(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    out = tmp_path / "model"
    for loop in (train, accelerate_loop):
        assert loop.main(["--dataset", "digits", "--sudoku_augmentation", "--output_dir", str(out)]) == 2
        error = capsys.readouterr().err
        assert "--sudoku_augmentation" in error and "digits" in error and "sudoku-hard" in error
        assert not out.exists()


# ------------------------------------------------------------------------------ accuracy over depth during training


def saved_blank_cell_accuracy(folder: Path, split: data.Dataset, num_iterations: int) -> float:
    """The saved model's blank-cell accuracy on `split` at `num_iterations`, computed here from scratch."""
    import torch
    from transformers import AutoModelForTokenClassification

    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    ids, labels = torch.tensor(split["input_ids"], dtype=torch.long), np.asarray(split["labels"])
    with torch.no_grad():
        predictions = model(input_ids=ids, num_iterations=num_iterations).logits.argmax(-1).numpy()
    return task_metrics("token-classification", predictions, labels)["blank_cell_accuracy"]


@pytest.mark.parametrize("loop", [train, accelerate_loop], ids=["trainer", "accelerate"])
def test_accuracy_at_several_depths_is_logged_at_every_evaluation(
    small_generated: None, tmp_path: Path, loop
) -> None:
    out = tmp_path / "sudoku"
    argv = [
        "--dataset", "sudoku", "--config", *REDUCED, "--max_steps", "4", "--eval_steps", "2", "--batch_size", "8",
        "--num_predictions", "0", "--output_dir", str(out), "--disable_tqdm", "--num_threads", "1",
    ]  # fmt: skip
    assert loop.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    keys = [f"eval_blank_cell_accuracy_iterations_{t}" for t in (2, 4, 8)]  # T/2, T, 2T of T = 4
    logged = [entry for entry in metrics["log_history"] if keys[0] in entry]
    # at both evaluations of the run (Trainer logs its final evaluation too, at the last step again)
    assert sorted({entry["step"] for entry in logged}) == [2, 4], metrics["log_history"]
    assert all(set(keys) <= set(entry) and all(0 <= entry[k] <= 1 for k in keys) for entry in logged)
    final = metrics["eval"]
    # exact: each accuracy is a count of right cells over the count of blank cells, one float64 division
    # (`task_metrics`) that JSON writes and reads back unchanged, so the same predictions give the same float
    at_4, default = final["blank_cell_accuracy_iterations_4"], final["blank_cell_accuracy"]
    assert at_4 == default, f"at 4 iterations {at_4!r}, at the model's own 4 {default!r}"
    validation = load_data("sudoku")["validation"]
    for t in (2, 8):  # the logged numbers are the saved model's accuracy at that depth
        expected = saved_blank_cell_accuracy(out, validation, t)
        logged = final[f"blank_cell_accuracy_iterations_{t}"]
        assert logged == expected, f"{t} iterations: logged {logged!r}, the saved model's {expected!r}"
    assert "test_blank_cell_accuracy_iterations_4" not in json.dumps(metrics["test"])


def test_eval_iterations_sets_the_depths_and_needs_recurrent_depth(
    small_generated: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "sudoku"
    argv = [
        "--dataset", "sudoku", "--config", *REDUCED, "--max_steps", "1", "--batch_size", "8",
        "--eval_iterations", "1", "12", "--num_predictions", "0", "--output_dir", str(out), "--disable_tqdm",
    ]  # fmt: skip
    assert accelerate_loop.main(argv) == 0
    final = json.loads((out / "metrics.json").read_text())["eval"]
    assert sorted(k for k in final if "_iterations_" in k) == [
        "blank_cell_accuracy_iterations_1",
        "blank_cell_accuracy_iterations_12",
    ]
    refused = tmp_path / "imixer"
    argv = [
        "--model",
        "imixer",
        "--dataset",
        "digits",
        "--eval_iterations",
        "2",
        "--output_dir",
        str(refused),
    ]
    assert train.main(argv) == 2
    error = capsys.readouterr().err
    assert "--eval_iterations 2" in error and "imixer" in error and not refused.exists()


def test_deep_supervision_refuses_a_loss_computed_outside_the_model(
    small_generated: None, tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    out = tmp_path / "sudoku"
    argv = [
        "--dataset",
        "sudoku",
        "--deep_supervision",
        "all",
        "--label_smoothing",
        "0.1",
        "--output_dir",
        str(out),
    ]
    assert accelerate_loop.main(argv) == 2
    error = capsys.readouterr().err
    assert "--deep_supervision all" in error and "label smoothing" in error and not out.exists()
