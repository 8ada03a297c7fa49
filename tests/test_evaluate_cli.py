"""`energyformers evaluate MODEL --dataset D`: a saved classifier scored on a split as `energyformers train` scored
it (the same data, preprocessing, batches and metrics), and bad input refused in one line with status 2.

One tiny Hyper-SET is trained for two steps on digits (32/16/16 examples, per-iteration accuracy at T = 1, 2, 4
logged); its run's metrics.json holds what Trainer.evaluate reported at the end of training for both evaluated
splits, which evaluate must reproduce from the folder alone.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import cli_config, rounding, run_cli_cases
from PIL import Image

from energyformers.training import cli, setup, train

EVAL_ITERATIONS = ["1", "2", "4"]
RUN = [
    "--model", "hyperset", "--dataset", "digits", "--config", *cli_config("hyperset"),
    "--max_steps", "2", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm",
    "--max_train_samples", "32", "--max_eval_samples", "16", "--max_test_samples", "16", "--num_predictions", "0",
    "--eval_iterations", *EVAL_ITERATIONS,
]  # fmt: skip
SAMPLES = "16"  # the run's --max_eval_samples and --max_test_samples


@pytest.fixture(scope="module")
def run_folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("evaluate") / "hyperset-digits"
    assert train.main([*RUN, "--output_dir", str(out)]) == 0
    return out


def evaluate(*argv: object) -> int:
    """Through the `energyformers` entry point, so the command's registration is exercised too."""
    return cli.main(["evaluate", *map(str, argv)])


def files_under(folder: Path) -> dict[str, bytes]:
    return {str(p.relative_to(folder)): p.read_bytes() for p in sorted(folder.rglob("*")) if p.is_file()}


def only_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.strip()]
    assert len(lines) == 1, err
    return lines[0]


@pytest.mark.parametrize(
    "split, prefix, recorded", [("test", "test", "test"), ("validation", "eval", "eval")]
)
def test_the_metrics_are_the_train_runs_own_for_the_same_split_and_examples(
    run_folder, tmp_path, capsys, split, prefix, recorded
):
    expected = json.loads((run_folder / "metrics.json").read_text())[recorded]
    before = files_under(run_folder)
    output = tmp_path / "metrics.json"
    argv = [run_folder, "--dataset", "digits", "--split", split, "--max_samples", SAMPLES]
    assert evaluate(*argv, "--json", "--output_file", output) == 0, capsys.readouterr().err
    printed = json.loads(capsys.readouterr().out)
    got = printed["metrics"]
    assert (printed["split"], printed["num_samples"], printed["primary_metric"]) == (
        split, int(SAMPLES), f"{prefix}_accuracy",
    ), printed  # fmt: skip
    # counts over the same 16 predictions: equal exactly
    for name in ("accuracy", "f1_macro"):
        assert got[f"{prefix}_{name}"] == expected[name], (name, got, expected)
    # the mean of one batch's 16 float32 cross-entropies, same weights and examples; evaluate's default thread count
    # may split the mean's 16-term sum and the forward's reductions differently: 32 float32 roundings of the loss
    loss, bound = got[f"{prefix}_loss"], rounding(torch.float32, 32, abs(expected["loss"]))
    assert abs(loss - expected["loss"]) <= bound, (
        f"loss {loss!r}, the run's {expected['loss']!r} (bound {bound:.2g})"
    )
    # the file holds what was printed, and nothing else was written: not into the model folder, not beside the file
    assert json.loads(output.read_text()) == printed
    # the software the numbers came from, as the run's own record names it
    run_environment = json.loads((run_folder / "metrics.json").read_text())["environment"]
    assert printed["environment"] == run_environment, (printed["environment"], run_environment)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["metrics.json"]
    assert files_under(run_folder) == before


def test_eval_iterations_give_one_row_per_count_equal_to_the_runs_logged_depth_accuracy(run_folder, capsys):
    expected = json.loads((run_folder / "metrics.json").read_text())["eval"]
    argv = [run_folder, "--dataset", "digits", "--split", "validation", "--max_samples", SAMPLES]
    assert evaluate(*argv, "--eval_iterations", *EVAL_ITERATIONS, "--json") == 0, capsys.readouterr().err
    got = json.loads(capsys.readouterr().out)
    assert got["eval_iterations"] == [int(t) for t in EVAL_ITERATIONS], got
    for t in EVAL_ITERATIONS:
        key = f"accuracy_iterations_{t}"
        assert got["metrics"][f"eval_{key}"] == expected[key], (t, got["metrics"], expected)
    # the table: one row per T under the header, in order, with the same numbers
    assert evaluate(*argv, "--eval_iterations", "4", "1", "2", "2") == 0, capsys.readouterr().err
    lines = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(lines) if line.split() == ["iterations", "eval_accuracy"])
    rows = [line.split() for line in lines[header + 1 :]]
    assert rows == [[t, f"{expected[f'accuracy_iterations_{t}']:.4f}"] for t in EVAL_ITERATIONS], lines


def test_num_iterations_sets_the_depth_of_every_forward(run_folder, capsys):
    """`--num_iterations T` scores the head run with T iterations: its accuracy is the per-T row's."""
    argv = [run_folder, "--dataset", "digits", "--split", "validation", "--max_samples", SAMPLES, "--json"]
    assert evaluate(*argv, "--num_iterations", "1", "--eval_iterations", "1") == 0, capsys.readouterr().err
    metrics = json.loads(capsys.readouterr().out)["metrics"]
    assert metrics["eval_accuracy"] == metrics["eval_accuracy_iterations_1"], metrics
    assert evaluate(*argv, "--num_iterations", "1") == 0
    deep = json.loads(capsys.readouterr().out)["metrics"]["eval_loss"]
    assert evaluate(*argv) == 0
    trained = json.loads(capsys.readouterr().out)["metrics"]["eval_loss"]
    assert deep != trained, (deep, trained)  # one iteration is another function than the trained two


def test_the_train_split_has_its_own_prefix_and_no_preparation_time(run_folder, capsys):
    """The run's `train_loss` is its running training loss: the train split's evaluation is named apart from it."""
    argv = [run_folder, "--dataset", "digits", "--split", "train", "--max_samples", SAMPLES, "--json"]
    assert evaluate(*argv) == 0, capsys.readouterr().err
    report = json.loads(capsys.readouterr().out)
    keys = sorted(report["metrics"])
    assert report["primary_metric"] == "train_eval_accuracy", report["primary_metric"]
    assert all(key.startswith("train_eval_") for key in keys), keys
    assert {"train_eval_loss", "train_eval_accuracy", "train_eval_f1_macro"} <= set(keys), keys
    assert not any(key.endswith("model_preparation_time") for key in keys), keys


def test_predicts_depth_flags_reach_every_forward_and_every_depth_row(run_folder, capsys):
    """A halting tolerance no update is above stops every sample after its first iteration: the whole evaluation
    and each --eval_iterations row then equal one iteration's (the same forward, so the same numbers)."""
    argv = [run_folder, "--dataset", "digits", "--split", "validation", "--max_samples", SAMPLES, "--json"]
    assert evaluate(*argv, "--num_iterations", "1") == 0, capsys.readouterr().err
    one = json.loads(capsys.readouterr().out)["metrics"]
    assert evaluate(*argv, "--halting_tolerance", "1e9", "--eval_iterations", "1", "2") == 0, (
        capsys.readouterr().err
    )
    report = json.loads(capsys.readouterr().out)
    halted = report["metrics"]
    assert report["depth_arguments"] == {"halting_tolerance": 1e9}, report["depth_arguments"]
    assert halted["eval_loss"] == one["eval_loss"], (halted["eval_loss"], one["eval_loss"])
    rows = [halted["eval_accuracy_iterations_1"], halted["eval_accuracy_iterations_2"]]
    assert rows == [one["eval_accuracy"]] * 2, (rows, one["eval_accuracy"])


# ----------------------------------------------------------------------------------------------- bad input


def image_folder(root: Path, classes: str) -> Path:
    """An imagefolder dataset: one class folder per letter of `classes`, three 8 × 8 images each."""
    rng = np.random.default_rng(0)
    for name in classes:
        (root / name).mkdir(parents=True)
        for i in range(3):
            Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(root / name / f"{i}.png")
    return root


def readable_folder(folder: Path, model_type: str, architecture: str, **fields: object) -> Path:
    """A model folder whose config.json names `architecture`, with a readable one-tensor safetensors file: enough
    for the checks made before torch loads."""
    from safetensors.torch import save_file

    folder.mkdir()
    config = {"model_type": model_type, "input_type": "image", "architectures": [architecture], **fields}
    (folder / "config.json").write_text(json.dumps(config))
    save_file({"weight": torch.zeros(1)}, str(folder / "model.safetensors"))
    return folder


@pytest.fixture
def no_model_loads(monkeypatch):
    """Fail the test if evaluate gets as far as loading the model's weights."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(setup, "auto_head", loaded)


def test_a_dataset_that_does_not_fit_the_model_is_one_line_before_the_model_loads(
    run_folder, tmp_path, capsys, no_model_loads
):
    letters = image_folder(tmp_path / "letters", "abc")
    texts = tmp_path / "texts.csv"
    texts.write_text("text,label\n" + "".join(f"review {i},{i % 2}\n" for i in range(12)))
    cases = {
        "labels": (
            ["--dataset", letters],
            f"{run_folder} predicts 10 labels ['0', '1', '2', '3', '4', '5', ...] but --dataset {letters} has 3 "
            "labels ['a', 'b', 'c']",
        ),
        "missing column": (
            ["--dataset", letters, "--label_column", "grade"],
            "--label_column 'grade' is not a column of the dataset; columns are ['image', 'label']",
        ),
        "column of a built-in": (
            ["--dataset", "digits", "--image_column", "img"],
            "--image_column img: --dataset digits is a built-in dataset with its own columns",
        ),
        "task": (
            ["--dataset", texts],
            f"is a model for image-classification (HyperSetForImageClassification) and --dataset {texts} is a "
            "dataset for text-classification",
        ),
    }
    for name, (argv, fragment) in cases.items():
        assert evaluate(run_folder, *argv) == 2, name
        line = only_line(capsys.readouterr().err)
        assert line.startswith("energyformers evaluate: error: ") and fragment in line, (name, line)


def test_bad_flags_and_folders_are_one_line_with_status_2_before_torch_loads(tmp_path):
    mim = readable_folder(tmp_path / "mim", "hyperset", "HyperSetForMaskedImageModeling", num_iterations=2)
    backbone = readable_folder(tmp_path / "backbone", "hyperset", "HyperSetModel", num_iterations=2)
    rbf = readable_folder(tmp_path / "rbf", "hyperbf", "HyperBFForImageClassification")
    fields = {"fixed_point_iterations": 2, "fixed_point_solver": "unrolled", "fixed_point_tolerance": 1e-4}
    halting = readable_folder(tmp_path / "halting", "hyperset", "HyperSetForImageClassification", num_iterations=2,
                              halting_tolerance=None, halting_criterion="state")  # fmt: skip
    mixer = readable_folder(tmp_path / "mixer", "imixer", "IMixerForImageClassification", **fields)
    looped = readable_folder(tmp_path / "looped", "looped-transformer", "LoopedTransformerForImageClassification",
                             num_iterations=2)  # fmt: skip
    notes = tmp_path / "notes"
    notes.mkdir()
    (notes / "todo.txt").write_text("not a model")
    model = ["evaluate", backbone, "--dataset", "digits"]
    cases = {
        "unknown split": ([*model, "--split", "dev"], "--split: invalid choice: 'dev' (choose from 'test', "),
        "no dataset": (["evaluate", backbone], "the following arguments are required: --dataset"),
        "bad eval_iterations": ([*model, "--eval_iterations", "2", "0"], "--eval_iterations 2 0: expected"),
        "bad max_samples": ([*model, "--max_samples", "0"], "--max_samples 0: expected an integer >= 1"),
        "output file is a folder": ([*model, "--output_file", notes], f"--output_file {notes}: is a folder"),
        "output file's folder missing": (
            [*model, "--output_file", tmp_path / "nowhere" / "m.json"],
            f"the folder {tmp_path / 'nowhere'} does not exist",
        ),
        "not a model folder": (
            ["evaluate", notes, "--dataset", "digits"],
            f"model folder {notes}: no config.json",
        ),
        "missing folder": (
            ["evaluate", tmp_path / "gone", "--dataset", "digits"],
            "the folder does not exist",
        ),
        "masked image modelling": (
            ["evaluate", mim, "--dataset", "digits"],
            f"{mim} is a masked-image-modelling model (HyperSetForMaskedImageModeling); evaluate scores classifiers; "
            "it holds no image tokenizer: save one into it",
        ),
        "bare backbone": (
            model,
            f"{backbone} is a bare backbone (HyperSetModel) without a classification head",
        ),
        "depth of a model without it": (
            ["evaluate", rbf, "--dataset", "digits", "--eval_iterations", "4"],
            "--eval_iterations 4: hyperbf has no recurrent depth",
        ),
        "iMixer's depth is its solver steps": (
            ["evaluate", mixer, "--dataset", "digits", "--num_iterations", "3"],
            "--num_iterations 3: imixer has no recurrent depth (no per-call num_iterations); its depth flag is "
            "--fixed_point_iterations",
        ),
        "a depth flag of another family": (
            ["evaluate", looped, "--dataset", "digits", "--halting_tolerance", "0.1"],
            "--halting_tolerance 0.1: looped-transformer does not take it; its depth flags are --num_iterations",
        ),
        "a depth flag out of range": (
            ["evaluate", mixer, "--dataset", "digits", "--fixed_point_tolerance", "0"],
            "--fixed_point_tolerance 0.0: expected a finite number > 0",
        ),
        "a halting criterion without a tolerance": (
            ["evaluate", halting, "--dataset", "digits", "--halting_criterion", "energy"],
            "--halting_criterion energy: what --halting_tolerance measures, and no tolerance is given",
        ),
        "a depth flag's choices": (
            ["evaluate", mixer, "--dataset", "digits", "--fixed_point_solver", "newton"],
            "--fixed_point_solver: invalid choice: 'newton'",
        ),
    }
    results = run_cli_cases([argv for argv, _ in cases.values()], cwd=tmp_path)
    for (name, (_, fragment)), result in zip(cases.items(), results, strict=True):
        line = only_line(result["err"])
        assert result["code"] == 2, (name, result)
        assert line.startswith("energyformers evaluate: error: ") and fragment in line, (name, line)
    assert results[-1]["heavy"] == [], results[-1]["heavy"]  # none of them imported torch or the models
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "backbone",
        "halting",
        "looped",
        "mim",
        "mixer",
        "notes",
        "rbf",
    ]


# ------------------------------------------------------------------------------------------ unlabelled splits


def digit_images(n: int, labels: list[int], seed: int) -> dict[str, list]:
    """`n` random 8 × 8 grey images with `labels` (cycled): the run's digits shape and classes."""
    rng = np.random.default_rng(seed)
    images = [Image.fromarray(rng.integers(0, 17, (8, 8), dtype=np.uint8), mode="L") for _ in range(n)]
    return {"image": images, "label": [labels[i % len(labels)] for i in range(n)]}


def saved_digits(folder: Path, **splits: int | None) -> Path:
    """A saved `DatasetDict` with the run's labels "0".."9": train labelled, each split of `splits` holding that
    many examples all labelled -1 (GLUE's unlabelled test splits on the Hub), ten labelled ones where None, and ten
    without a label column where 0."""
    from datasets import ClassLabel, Dataset, DatasetDict, Features
    from datasets import Image as ImageFeature

    features = Features({"image": ImageFeature(), "label": ClassLabel(names=[str(i) for i in range(10)])})
    dd = {"train": Dataset.from_dict(digit_images(40, list(range(10)), seed=1), features=features)}
    for i, (split, unlabelled) in enumerate(splits.items()):
        rows = digit_images(unlabelled or 10, [-1] if unlabelled else list(range(10)), seed=2 + i)
        dd[split] = Dataset.from_dict(rows, features=features)
        if unlabelled == 0:
            dd[split] = dd[split].remove_columns("label")
    DatasetDict(dd).save_to_disk(str(folder))
    return folder


def test_an_unlabelled_split_is_refused_naming_the_labelled_ones_before_the_model_loads(
    run_folder, tmp_path, capsys, no_model_loads
):
    """load_data carves an unlabelled split out of train; evaluate scores none, which for a model trained elsewhere
    could be its own training examples."""
    glue = saved_digits(tmp_path / "glue", validation=None, test=12)  # labelled validation, unlabelled test
    no_validation = saved_digits(tmp_path / "no_validation", test=12)
    unlabelled_validation = saved_digits(tmp_path / "unlabelled_validation", validation=12, test=None)
    no_label_column = saved_digits(tmp_path / "no_label_column", validation=None, test=0)
    cases = {
        "test asked for": (
            [glue, "--split", "test"],
            f"--split test: the test split of --dataset {glue} is unlabelled (all 12 labels are -1), so it cannot "
            "be scored; its labelled splits are validation, train: pass --split validation",
        ),
        "the default, with no labelled validation split": (
            [no_validation],
            f"--split (default test): the test split of --dataset {no_validation} is unlabelled (all 12 labels are "
            "-1), so it cannot be scored; its only labelled split is train: pass --split train (the training "
            "examples), or --split validation for the part of train that `energyformers train` holds out (seed 0)",
        ),
        "validation asked for": (
            [unlabelled_validation, "--split", "validation"],
            f"--split validation: the validation split of --dataset {unlabelled_validation} is unlabelled (all 12 "
            "labels are -1), so it cannot be scored; its labelled splits are test, train: pass --split test",
        ),
        "a test split without the label column": (
            [no_label_column, "--split", "test"],
            f"--split test: the test split of --dataset {no_label_column} is unlabelled (no label column 'label')",
        ),
    }
    for name, (argv, fragment) in cases.items():
        assert evaluate(run_folder, "--dataset", *argv) == 2, name
        line = only_line(capsys.readouterr().err)
        assert line.startswith("energyformers evaluate: error: ") and fragment in line, (name, line)


def test_without_split_an_unlabelled_test_split_gives_way_to_the_validation_split(
    run_folder, tmp_path, capsys
):
    glue = saved_digits(tmp_path / "glue", validation=None, test=12)
    assert evaluate(run_folder, "--dataset", glue, "--json") == 0, capsys.readouterr().err
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    assert (report["split"], report["num_samples"], report["primary_metric"]) == (
        "validation", 10, "eval_accuracy",
    ), report  # fmt: skip
    # one warning naming what was scored instead; none saying the test split is carved out of train
    assert only_line(captured.err) == (
        f"warning: the test split of --dataset {glue} is unlabelled (all 12 labels are -1): scoring its validation "
        "split; pass --split to choose another"
    ), captured.err
    assert evaluate(run_folder, "--dataset", glue, "--split", "validation", "--json") == 0
    asked = json.loads(capsys.readouterr().out)["metrics"]
    # the same examples and weights on one thread count: the same counts; the loss as the first test bounds it
    assert report["metrics"]["eval_accuracy"] == asked["eval_accuracy"], (report["metrics"], asked)
    loss, bound = report["metrics"]["eval_loss"], rounding(torch.float32, 32, abs(asked["eval_loss"]))
    assert abs(loss - asked["eval_loss"]) <= bound, (loss, asked["eval_loss"], bound)
