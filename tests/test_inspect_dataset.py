"""`energyformers inspect --dataset`: the dataset is checked against the model as `evaluate` checks it (its labels,
its split) before the model loads, and the looped-Transformer baseline draws its accuracy against the iterations.

The models are tiny, untrained and built here (a digits label set, 8 × 8 RGB images): the checks and the curve's
shape are what is tested, not an accuracy.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from fixtures import saved_digits_classifier
from PIL import Image

from energyformers import (
    HyperSetConfig,
)
from energyformers.training import cli
from energyformers.training import inspect as inspect_command


@pytest.fixture(scope="module")
def models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    import torch

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("inspect_dataset")
    return {family: saved_digits_classifier(family, root / family) for family in ("hyperset", "looped")}


def inspect(*argv: object) -> int:
    return cli.main(["inspect", *map(str, argv)])


def image_folder(root: Path, classes: str) -> Path:
    """An imagefolder dataset: one class folder per letter of `classes`, three 8 × 8 images each."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if inspect gets as far as loading the model's weights."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(inspect_command, "load_model", loaded)


def one_error(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1 and lines[0].startswith("energyformers inspect: error: "), err
    return lines[0]


def test_a_dataset_of_another_label_set_is_refused_as_evaluate_refuses_it(
    models, tmp_path, capsys, no_model_loads
):
    """Ten classes, as the model's, but named a..j: scoring the digits model on them would be a meaningless number."""
    letters = image_folder(tmp_path / "letters", "abcdefghij")
    assert inspect(models["hyperset"], "--dataset", letters, "--output_dir", tmp_path / "out") == 2
    line = one_error(capsys.readouterr().err)
    assert (
        f"{models['hyperset']} predicts 10 labels ['0', '1', '2', '3', '4', '5', ...] but --dataset {letters} has "
        "10 labels ['a', 'b', 'c', 'd', 'e', 'f', ...]"
    ) in line, line
    assert not (tmp_path / "out").exists()


def test_an_unknown_split_is_refused_when_parsed(models, tmp_path, capsys, no_model_loads):
    argv = [models["hyperset"], "--dataset", "digits", "--split", "dev", "--output_dir", tmp_path / "out"]
    assert inspect(*argv) == 2
    line = one_error(capsys.readouterr().err)
    assert "--split: invalid choice: 'dev' (choose from 'test', 'validation', 'train')" in line, line


def test_the_looped_transformer_draws_its_accuracy_against_the_iterations(models, tmp_path):
    out = tmp_path / "out"
    argv = [models["looped"], "--dataset", "digits", "--max_samples", "16", "--max_iterations", "3"]
    assert inspect(*argv, "--output_dir", out, "--num_threads", "1") == 0
    report = json.loads((out / "inspect.json").read_text())
    curve = report["accuracy_vs_iterations"]
    assert curve["iterations"] == [1, 2, 3] and curve["argument"] == "num_iterations", curve
    assert curve["trained"] == 2 and len(curve["accuracy"]) == 3, curve
    assert all(0 <= a <= 1 for a in curve["accuracy"]), curve
    assert report["figures"] == ["accuracy_vs_iterations.png"], report["figures"]
    assert (out / "accuracy_vs_iterations.png").is_file()


def test_the_looped_transformer_without_a_dataset_is_refused_before_it_loads(
    models, tmp_path, capsys, no_model_loads
):
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8)).save(image)
    assert inspect(models["looped"], image, "--output_dir", tmp_path / "out") == 2
    line = one_error(capsys.readouterr().err)
    assert "holds a 'looped-transformer' model (LoopedTransformerForImageClassification)" in line, line
    assert (
        "with a labelled --dataset, their classifiers' accuracy against the number of iterations" in line
    ), line


def test_a_saved_halting_tolerance_is_off_and_recorded(tmp_path):
    """The per-iteration curves run at fixed depth: the saved tolerance is reported as not used."""
    import torch

    torch.manual_seed(0)
    folder = saved_digits_classifier("hyperset", tmp_path / "halting", halting_tolerance=1e-3)
    image = tmp_path / "x.png"
    Image.new("RGB", (8, 8), (40, 90, 200)).save(image)
    assert inspect(folder, image, "--output_dir", tmp_path / "out", "--num_threads", "1") == 0
    report = json.loads((tmp_path / "out" / "inspect.json").read_text())
    halting = report.get("halting_tolerance")
    assert halting is not None and halting["saved"] == 1e-3 and halting["used"] is None, report.keys()
    assert "fixed depth" in halting["note"], halting


def test_a_sudoku_models_curve_is_named_blank_cell_accuracy(tmp_path, monkeypatch):
    """The givens' labels are -100: the accuracy counted is over blank cells, evaluate's blank_cell_accuracy."""
    import torch

    from energyformers import HyperSetForTokenClassification
    from energyformers.training import data
    from energyformers.training.sudoku import DIGITS, load_sudoku

    # a few generated puzzles stand in for the built-in `sudoku` (the same generator and columns, fewer puzzles)
    puzzles = load_sudoku({"train": 4, "validation": 4, "test": 4})
    monkeypatch.setattr(data, "load_data", lambda name, **kwargs: puzzles)
    torch.manual_seed(0)
    config = HyperSetConfig(
        input_type="sequence", vocab_size=10, max_position_embeddings=81, hidden_size=16, num_attention_heads=2,
        intermediate_size=8, num_iterations=2, id2label=dict(enumerate(DIGITS)),
    )  # fmt: skip
    folder = tmp_path / "sudoku"
    HyperSetForTokenClassification(config).save_pretrained(folder)
    out = tmp_path / "out"
    argv = [folder, "--dataset", "sudoku", "--max_iterations", "2", "--num_threads", "1"]
    assert inspect(*argv, "--output_dir", out) == 0
    curve = json.loads((out / "inspect.json").read_text())["accuracy_vs_iterations"]
    assert curve["metric"] == "blank_cell_accuracy" and "accuracy" not in curve, curve
    assert len(curve["blank_cell_accuracy"]) == 2 and curve["num_samples"] == 4, curve


def test_integer_labels_are_mapped_onto_the_models_classes_as_evaluate_maps_them(models, tmp_path):
    """A dataset whose integer labels are some of the model's class ids (2 and 7 of the digits' 0..9): on its own
    it is a 2-class dataset, which the 10-class model would not fit; scored against the model, 2 and 7 are the
    model's classes '2' and '7', as `energyformers evaluate` maps them."""
    from datasets import Dataset, Features, Value
    from datasets import Image as ImageFeature

    rng = np.random.default_rng(0)
    images = [Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)) for _ in range(40)]
    features = Features({"image": ImageFeature(), "label": Value("int64")})
    rows = {"image": images, "label": [2, 7] * 20}
    Dataset.from_dict(rows, features=features).save_to_disk(tmp_path / "two_digits")
    out = tmp_path / "out"
    argv = [models["hyperset"], "--dataset", tmp_path / "two_digits", "--max_samples", "4"]
    assert inspect(*argv, "--output_dir", out, "--num_threads", "1") == 0
    assert (out / "inspect.json").is_file()


def test_an_unlabelled_split_is_chosen_as_evaluate_chooses_it(models, tmp_path, capsys, monkeypatch):
    """GLUE-style data (test split all -1): `--split test` is refused before the model loads, and without --split
    the labelled validation split is read, with one warning, as `energyformers evaluate` does."""
    from test_evaluate_cli import saved_digits

    glue = saved_digits(tmp_path / "glue", validation=None, test=12)
    argv = [
        models["looped"],
        "--dataset",
        glue,
        "--max_samples",
        "4",
        "--max_iterations",
        "2",
        "--num_threads",
        "1",
    ]
    with monkeypatch.context() as patched:
        patched.setattr(inspect_command, "load_model", lambda *a, **k: pytest.fail("the model was loaded"))
        assert inspect(*argv, "--split", "test", "--output_dir", tmp_path / "refused") == 2
    line = one_error(capsys.readouterr().err)
    assert f"--split test: the test split of --dataset {glue} is unlabelled (all 12 labels are -1)" in line, (
        line
    )
    assert not (tmp_path / "refused").exists()
    assert inspect(*argv, "--output_dir", tmp_path / "out") == 0
    warnings = [line for line in capsys.readouterr().err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: the test split of --dataset {glue} is unlabelled (all 12 labels are -1): scoring its validation "
        "split; pass --split to choose another"
    ], warnings
    report = json.loads((tmp_path / "out" / "inspect.json").read_text())
    assert report["accuracy_vs_iterations"]["split"] == "validation", report["accuracy_vs_iterations"]


def test_the_accuracy_figure_names_a_local_dataset_by_its_name():
    """The figure is exported as drawn, so its title names a local --dataset as the exported inspect.json does."""
    assert inspect_command.shown_dataset("/home/alice/data/reviews.csv") == "reviews.csv"
    assert inspect_command.shown_dataset("./runs/sudoku-data") == "sudoku-data"
    assert [inspect_command.shown_dataset(name) for name in ("digits", "org/dataset")] == [
        "digits",
        "org/dataset",
    ]
