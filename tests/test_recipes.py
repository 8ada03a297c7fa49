"""The papers' recipes in both training loops: `--recipe` and the augmentation flags run end
to end on fashion_mnist (short CI variant with `--max_steps`), the augmentation changes the training batches
(and only those), the loss uses the soft targets, and the preprocessing saved with the model is unchanged.
"""

from __future__ import annotations

import ast
import functools
import io
import json
import math
import re
import tokenize
from pathlib import Path
from typing import Any

import pytest
import torch
from fixtures import cli_config, require_dataset, rounding

import energyformers
from energyformers.training import accelerate_loop, optimization, recipes, train
from energyformers.training.data import load_data
from energyformers.training.recipes import RECIPES, AugmentationArguments, split_recipe

LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}
AUGMENT = ["--rand_augment_ops", "2", "--mixup_alpha", "0.8", "--random_erasing", "0.25"]
AUGMENT += ["--horizontal_flip", "0.5", "--label_smoothing", "0.1"]
SHORT = [
    "--max_steps",
    "2",
    "--batch_size",
    "8",
    "--num_threads",
    "1",
    "--disable_tqdm",
    "--num_predictions",
    "0",
]
SHORT += ["--max_train_samples", "16", "--max_eval_samples", "8", "--max_test_samples", "8"]


@pytest.fixture(scope="module")
def fashion_mnist() -> str:
    require_dataset("fashion_mnist")
    return "fashion_mnist"


@pytest.fixture
def spy(monkeypatch) -> dict[str, list[Any]]:
    """Record the pixel values every Hyper-SET image forward sees (training / eval) and the loss targets."""
    seen: dict[str, list[Any]] = {"train": [], "eval": [], "targets": []}
    head = energyformers.HyperSetForImageClassification
    forward = head.forward

    @functools.wraps(forward)  # Trainer reads the signature (which arguments are labels)
    def recording_forward(self, pixel_values=None, *args, **kwargs):
        seen["train" if self.training else "eval"].append(pixel_values.detach().clone())
        return forward(self, pixel_values, *args, **kwargs)

    loss = optimization.soft_target_cross_entropy

    def recording_loss(logits, targets):
        seen["targets"].append(targets.detach().clone())
        return loss(logits, targets)

    monkeypatch.setattr(head, "forward", recording_forward)
    monkeypatch.setattr(optimization, "soft_target_cross_entropy", recording_loss)
    return seen


def processed_images(dataset: str, split: str, limit: int, folder: Path) -> torch.Tensor:
    """The split's images after the processor saved in `folder` only (what an unaugmented batch holds)."""
    from transformers import AutoImageProcessor

    from energyformers.training.processing import image_transform

    processor = AutoImageProcessor.from_pretrained(folder, backend="pil")
    rows = load_data(dataset)[split].select(range(limit))
    return image_transform(processor)({"image": rows["image"], "label": rows["label"]})["pixel_values"]


def matches(images: torch.Tensor, reference: torch.Tensor) -> torch.Tensor:
    """For each image, whether it equals one of `reference` exactly."""
    flat, ref = images.flatten(1), reference.flatten(1)
    return (flat[:, None, :] == ref[None, :, :]).all(-1).any(-1)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_recipe_runs_end_to_end_augments_training_batches_only(tmp_path, fashion_mnist, spy, loop):
    common = ["--dataset", fashion_mnist, "--config", *cli_config("hyperset"), *SHORT]
    out = tmp_path / "recipe"
    assert LOOPS[loop]([*common, "--recipe", "imixer-s", *AUGMENT, "--output_dir", str(out)]) == 0
    train_images = processed_images(fashion_mnist, "train", 16, out)
    held_out = [processed_images(fashion_mnist, split, 8, out) for split in ("validation", "test")]
    augmented = torch.cat(spy["train"])  # both training batches (setup's check batch runs in eval mode)
    assert augmented.shape[1:] == train_images.shape[1:]
    assert not matches(augmented, train_images).any()  # mixup: every training image is changed
    assert matches(torch.cat(spy["eval"][1:]), torch.cat(held_out)).all()  # evaluation sees the plain images
    targets = torch.cat(spy["targets"])
    assert targets.is_floating_point() and targets.shape[1] == 10  # soft targets reach the loss
    torch.testing.assert_close(targets.sum(-1), torch.ones(len(targets)))
    metrics = json.loads((out / "metrics.json").read_text())
    assert (
        metrics["recipe"]["recipe"] == "imixer-s" and metrics["recipe"]["augmentation"]["mixup_alpha"] == 0.8
    )
    assert metrics["recipe"]["global_step"] == 2

    spy["train"].clear()
    plain = tmp_path / "plain"
    assert LOOPS[loop]([*common, "--output_dir", str(plain)]) == 0
    assert matches(torch.cat(spy["train"]), train_images).all()  # without flags: the batches as processed
    saved = [(folder / "preprocessor_config.json").read_bytes() for folder in (out, plain)]
    assert saved[0] == saved[1]  # augmentation is never part of the saved preprocessing


# The DeiT values (Touvron et al., ICML 2021, Table 9, and the defaults of its main.py), as documented next to
# RECIPES["deit"]: a typo in the recipe fails here.
DEIT = {
    "learning_rate": 5e-4 * 64 / 512,  # 5e-4 × batch / 512 at the per-device batch of 64
    "per_device_train_batch_size": 64,
    "lr_scheduler_type": "cosine",
    "weight_decay": 0.05,
    "adam_beta1": 0.9,
    "adam_beta2": 0.999,
    "max_grad_norm": 0.0,
    "warmup_epochs": 5,
    "warmup_learning_rate": 1e-6,
    "min_learning_rate": 1e-5,
    "cooldown_epochs": 10,
    "num_train_epochs": 300,
    "label_smoothing": 0.1,
    "drop_path_rate": 0.1,
    "rand_augment_ops": 2,
    "rand_augment_magnitude": 9.0,
    "mixup_alpha": 0.8,
    "cutmix_alpha": 1.0,
    "mix_prob": 1.0,
    "random_erasing": 0.25,
    "random_resized_crop_scale": 0.08,
    "horizontal_flip": 0.5,
}


def test_deit_recipe_holds_exactly_the_deit_values():
    assert RECIPES["deit"] == DEIT
    augmentation, training = split_recipe("deit")
    assert set(augmentation) == {k for k in DEIT if k in AugmentationArguments.__dataclass_fields__}
    assert set(training) == set(DEIT) - set(augmentation)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_deit_recipe_alone_augments_training_batches_but_not_the_saved_preprocessing(
    tmp_path, fashion_mnist, spy, capsys, loop
):
    """The short CI run of the DeiT recipe: `--recipe deit --max_steps 2` with no augmentation flag of its own."""
    common = ["--dataset", fashion_mnist, "--config", *cli_config("hyperset"), *SHORT]
    out = tmp_path / "deit"
    assert LOOPS[loop]([*common, "--recipe", "deit", "--output_dir", str(out)]) == 0
    train_images = processed_images(fashion_mnist, "train", 16, out)
    augmented = torch.cat(spy["train"])  # both training batches (setup's check batch runs in eval mode)
    assert len(augmented) == 16 and augmented.shape[1:] == train_images.shape[1:]
    # random-resized crop from 8 % of the area, mixup/cutmix on every batch: no training image stays as processed
    assert not matches(augmented, train_images).any()
    held_out = [processed_images(fashion_mnist, split, 8, out) for split in ("validation", "test")]
    assert matches(torch.cat(spy["eval"][1:]), torch.cat(held_out)).all()  # evaluation sees the plain images
    targets = torch.cat(spy["targets"])
    assert targets.is_floating_point() and targets.shape == (16, 10)
    torch.testing.assert_close(targets.sum(-1), torch.ones(16))
    # label smoothing 0.1 over 10 classes caps every target at 0.9 + 0.01, mixed or not: λ on + (1 − λ) off in
    # float32 rounds on, off, two products and a sum, 4 roundings of the target's size
    top, bottom = targets.max().item(), targets.min().item()
    assert top <= 0.91 + rounding(torch.float32, 4), f"max target {top!r}"
    assert bottom >= 0.01 - rounding(torch.float32, 4, 0.01), f"min target {bottom!r}"

    metrics = json.loads((out / "metrics.json").read_text())
    recipe = metrics["recipe"]
    assert recipe["recipe"] == "deit" and recipe["global_step"] == 2
    expected = {k: v for k, v in DEIT.items() if k in AugmentationArguments.__dataclass_fields__}
    assert {k: recipe["augmentation"][k] for k in expected} == expected
    assert recipe["learning_rate"] == DEIT["learning_rate"] and recipe["max_grad_norm"] == 0.0
    assert recipe["batch_size"] == 8  # SHORT's explicit --batch_size wins over the recipe's 64
    # Hyper-SET has no stochastic depth: skipped with one warning line, and not recorded as applied
    skipped = "--recipe deit: drop_path_rate=0.1 not applied: hyperset has no drop_path_rate config field"
    assert [w for w in metrics["warnings"] if w.startswith(skipped)] != []
    assert recipe["depth_flags"] == {} and metrics["arguments"]["model"]["drop_path_rate"] is None
    assert f"warning: {skipped}" in capsys.readouterr().err

    spy["train"].clear()
    plain = tmp_path / "plain"
    assert LOOPS[loop]([*common, "--output_dir", str(plain)]) == 0
    # without the recipe: the training batches are the 16 images as processed
    assert len(spy["train"]) == 2 and matches(torch.cat(spy["train"]), train_images).all()
    saved = [(folder / "preprocessor_config.json").read_bytes() for folder in (out, plain)]
    assert saved[0] == saved[1]  # the recipe is never part of the saved preprocessing


@pytest.mark.parametrize(("family", "applied"), [("imixer", True), ("hyperbf", False)])
def test_deit_drop_path_reaches_imixer_and_is_skipped_out_loud_elsewhere(
    tmp_path, fashion_mnist, capsys, family, applied
):
    out = tmp_path / family
    argv = ["--model", family, "--dataset", fashion_mnist, "--config", *cli_config(family), *SHORT]
    assert accelerate_loop.main([*argv, "--recipe", "deit", "--output_dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    config = json.loads((out / "config.json").read_text())
    notes = [w for w in metrics["warnings"] if "drop_path_rate" in w]
    err = capsys.readouterr().err
    if applied:
        assert config["drop_path_rate"] == 0.1 and metrics["recipe"]["depth_flags"] == {"drop_path_rate": 0.1}
        assert notes == [] and "drop_path_rate" not in err
    else:
        assert "drop_path_rate" not in config and metrics["recipe"]["depth_flags"] == {}
        assert notes == [
            f"--recipe deit: drop_path_rate=0.1 not applied: {family} has no drop_path_rate "
            "config field (the rest of the recipe is)"
        ]
        assert f"warning: {notes[0]}" in err


def test_text_data_takes_label_smoothing_but_refuses_image_augmentation(tmp_path, capsys):
    from energyformers.training.arguments import parse_arguments

    args = parse_arguments(["--output_dir", "x", "--label_smoothing_factor", "0.1"], train.PROG, "")
    assert args.augmentation.label_smoothing == 0.1  # one label smoothing, the same in both loops
    runs = tmp_path / "runs"
    runs.mkdir()
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "a good film,1\na bad film,0\n" * 20)
    argv = ["--dataset", str(data), "--mixup_alpha", "0.5", "--output_dir", str(runs / "m"), *SHORT]
    assert train.main(argv) == 2
    assert "apply to image classification" in capsys.readouterr().err
    assert list(runs.iterdir()) == []


def test_lr_floor_and_cooldown_reach_both_loops(tmp_path):
    """--warmup_learning_rate / --min_learning_rate / --cooldown_epochs: the same schedule in both loops."""
    rates: dict[str, list[float]] = {}
    argv = ["--config", *cli_config("hyperset"), *SHORT, "--max_steps", "6", "--lr", "1e-2"]
    argv += ["--warmup_steps", "2", "--warmup_learning_rate", "1e-3", "--min_learning_rate", "1e-4"]
    argv += ["--logging_steps", "1", "--eval_strategy", "no"]
    for loop, main in LOOPS.items():
        out = tmp_path / loop
        assert main([*argv, "--output_dir", str(out)]) == 0
        metrics = json.loads((out / "metrics.json").read_text())
        assert metrics["arguments"]["run"]["min_learning_rate"] == 1e-4
        rates[loop] = [h["learning_rate"] for h in metrics["log_history"] if "learning_rate" in h]
    # the lr each of the 6 steps used: warm-up from the 1e-3 floor over 2 steps, then cosine down to 1e-4
    cosine = [1e-4 + 0.5 * (1e-2 - 1e-4) * (1 + math.cos(math.pi * k / 4)) for k in range(4)]
    expected = [1e-3, 1e-3 + (1e-2 - 1e-3) / 2, *cosine]
    # the schedule's float64 factor times the base lr against the same formulas written here in another order: a
    # cosine, a few products and sums, relative to the rate itself (abs=0: approx would add an absolute 1e-12)
    rel = rounding(torch.float64, 8)
    for loop, got in rates.items():
        assert got == pytest.approx(expected, rel=rel, abs=0), f"{loop}: rates {got}, expected {expected}"


# ------------------------------------------------------------------ the papers' own recipes (training/recipes.py)
# A value's comment must name its source: a table / section / appendix of a paper, the memo, a config file, or
# DeiT's Table 9 / main.py; a value a paper does not give says "not given" and names what is filled in.
CITATION = re.compile(
    r"HS (Table \d|§\d|Appendix A\.\d)|iMixer Table \d|memo 143 §\d|DeiT (T9|main\.py)|\.yaml"
    r"|measured here: benchmarks/results/\w+\.md"
)
PAPERS = ("hyperset-ic", "hyperset-sudoku", "hyperset-mim", "imixer-s", "imixer-b", "imixer-l", "hyperbf")


def recipe_value_comments() -> dict[tuple[str, str], str]:
    """(recipe, key) -> the comments on the lines of that value in training/recipes.py (parsed, not grepped)."""
    source = Path(recipes.__file__).read_text()
    comments: dict[int, str] = {}
    for token in tokenize.generate_tokens(io.StringIO(source).readline):
        if token.type == tokenize.COMMENT:
            comments[token.start[0]] = token.string
    tree = ast.parse(source)
    table = next(
        node.value
        for node in tree.body
        if isinstance(node, ast.AnnAssign) and getattr(node.target, "id", None) == "RECIPES"
    )
    found = {}
    for name_node, recipe_node in zip(table.keys, table.values, strict=True):
        for key_node, value_node in zip(recipe_node.keys, recipe_node.values, strict=True):
            lines = range(key_node.lineno, value_node.end_lineno + 1)
            found[(name_node.value, key_node.value)] = " ".join(comments.get(n, "") for n in lines)
    return found


def test_every_recipe_value_has_a_citation_comment():
    comments = recipe_value_comments()
    assert set(comments) == {(name, key) for name, recipe in RECIPES.items() for key in recipe}
    uncited = {k: c for k, c in comments.items() if not CITATION.search(c)}
    assert uncited == {}, f"values without a source in their comment: {uncited}"
    filled = {k for k, c in comments.items() if "not given" in c}
    # HyperBF's memo names no optimiser, schedule, weight decay or clipping: each of those says so
    assert {
        ("hyperbf", k) for k in ("lr_scheduler_type", "weight_decay", "adam_beta1", "max_grad_norm")
    } <= filled


def test_the_papers_recipes_replace_the_guesses():
    assert set(RECIPES) == {*PAPERS, "deit", "hyperset-sudoku-ds", "hyperset-sudoku-ds-fast"}
    assert not {"imixer-cifar", "hyperbf-memo"} & set(RECIPES)


@pytest.mark.parametrize("name", sorted(RECIPES))
@pytest.mark.parametrize("prog", [train.PROG, accelerate_loop.PROG])
def test_every_recipe_value_is_a_flag_both_loops_take_and_parse_to(name, prog):
    from energyformers.training.arguments import parse_arguments

    # a recipe with the board symmetries needs a Sudoku dataset (the flag refuses any other)
    data = ["--dataset", "sudoku-hard"] if RECIPES[name].get("sudoku_augmentation") else []
    args = parse_arguments(["--output_dir", "x", *data, "--recipe", name], prog, "")
    parsed = {}
    for part in (args.model, args.run, args.augmentation, args.data):
        parsed.update(vars(part))
    assert {key: parsed.get(key, "no such flag") for key in RECIPES[name]} == RECIPES[name]


def test_the_papers_values():
    """The spec's numbers, one table per paper (a typo in RECIPES fails here)."""
    assert RECIPES["hyperset-sudoku"] == {
        "num_train_epochs": 200,
        "per_device_train_batch_size": 16,
        "adam_beta1": 0.0,
        "adam_beta2": 0.95,
        "weight_decay": 0.1,
        "learning_rate": 1e-4,
        "lr_scheduler_type": "cosine",
        "min_learning_rate": 1e-7,
        "warmup_epochs": 0,
        "max_grad_norm": 1.0,
    }
    ic = RECIPES["hyperset-ic"]
    assert (ic["learning_rate"], ic["adam_beta1"], ic["adam_beta2"], ic["weight_decay"]) == (
        1e-4,
        0.0,
        0.95,
        0.0,
    )
    assert (ic["per_device_train_batch_size"], ic["num_train_epochs"], ic["max_grad_norm"]) == (128, 200, 1.0)
    mim = RECIPES["hyperset-mim"]
    assert (mim["lr_scheduler_type"], mim["max_grad_norm"], mim["weight_decay"]) == ("constant", 3.0, 0.1)
    for size, (batch, drop_path) in {"s": (512, 0.1), "b": (256, 0.2), "l": (64, 0.3)}.items():
        mixer = RECIPES[f"imixer-{size}"]
        assert mixer["per_device_train_batch_size"] == batch and mixer["drop_path_rate"] == drop_path
        # iMixer Table 5's base lr is the linear scaling rule batch / 512 × 5e-4
        # the same product and division in float64, perhaps in another order: 2 roundings, relative
        assert mixer["learning_rate"] == pytest.approx(
            batch / 512 * 5e-4, rel=rounding(torch.float64, 2), abs=0
        ), (
            size,
            mixer,
        )
    bf = RECIPES["hyperbf"]
    assert (bf["num_train_epochs"], bf["per_device_train_batch_size"], bf["learning_rate"]) == (
        100,
        256,
        1e-4,
    )
    assert bf["warmup_epochs"] == 0 and bf["horizontal_flip"] == 0.5


@pytest.mark.parametrize(
    ("recipe", "model", "applied"),
    [
        ("hyperset-ic", "hyperset", {}),
        ("imixer-s", "imixer", {"drop_path_rate": 0.1}),
        ("hyperbf", "hyperbf", {}),
    ],
)
def test_each_papers_recipe_family_trains_end_to_end(tmp_path, recipe, model, applied):
    """One tiny run per recipe family (train-accelerate, digits): the recipe's schedule values reach the run."""
    out = tmp_path / recipe
    argv = ["--model", model, "--dataset", "digits", "--config", *cli_config(model), *SHORT]
    assert accelerate_loop.main([*argv, "--recipe", recipe, "--output_dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    run = metrics["arguments"]["run"]
    assert metrics["recipe"]["recipe"] == recipe and metrics["recipe"]["global_step"] == 2
    assert metrics["recipe"]["learning_rate"] == RECIPES[recipe]["learning_rate"], metrics["recipe"]
    for key in ("adam_beta1", "adam_beta2", "weight_decay", "max_grad_norm", "lr_scheduler_type"):
        assert run[key] == RECIPES[recipe][key], (key, run[key])
    assert metrics["recipe"]["depth_flags"] == applied


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_the_mim_recipe_is_refused_for_another_task(tmp_path, capsys, loop):
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["--dataset", "digits", "--recipe", "hyperset-mim", *SHORT, "--output_dir", str(runs / "m")]
    assert LOOPS[loop](argv) == 2
    err = capsys.readouterr().err
    assert (
        "--recipe hyperset-mim: the paper's masked-image-modeling recipe needs a masked-image-modelling run "
        "over VQ codes (Hyper-SET paper Table 2): add --task masked-image-modeling; the data's task "
        "is image-classification" in err
    )
    assert list(runs.iterdir()) == []


def test_the_sudoku_default_is_the_papers_recipe_plus_the_measured_values():
    measured = {"deep_supervision": "all", "deep_supervision_weights": "uniform", "sudoku_augmentation": True}
    ds = dict(RECIPES["hyperset-sudoku-ds"])
    assert {key: ds.pop(key, None) for key in measured} == measured
    assert ds == RECIPES["hyperset-sudoku"]  # every other value is the paper's


def test_the_gpu_sudoku_recipe_is_the_deep_supervised_one_with_the_measured_optimiser():
    """`hyperset-sudoku-ds-fast` changes only the optimiser of `hyperset-sudoku-ds`, to the values of the CPU runs
    that left the chance plateau (benchmarks/results/sudoku_easy.md): β1 0.9, lr 1e-2, and the CLI's own warm-up
    (5 % of the run) and cosine floor (0) in place of the paper's none and 1e-7; the paper's recipe stays as it is."""
    from dataclasses import fields

    from energyformers.training.arguments import RunArguments

    cli = {f.name: f.default for f in fields(RunArguments)}
    fast, ds = dict(RECIPES["hyperset-sudoku-ds-fast"]), dict(RECIPES["hyperset-sudoku-ds"])
    measured = {"adam_beta1": 0.9, "learning_rate": 1e-2, "warmup_steps": 0.05, "min_learning_rate": 0.0}
    assert {key: fast.pop(key, None) for key in measured} == measured
    assert fast["per_device_train_batch_size"] == 16, fast  # the paper's batch, the measured runs' too
    # the measured runs had the CLI's warm-up and floor (no recipe): a change of those defaults shows here
    assert (cli["warmup_steps"], cli["min_learning_rate"] or 0.0) == (0.05, 0.0), cli
    assert {
        key: ds.pop(key) for key in ("warmup_epochs", "min_learning_rate", "adam_beta1", "learning_rate")
    } == {
        "warmup_epochs": 0,
        "min_learning_rate": 1e-7,
        "adam_beta1": 0.0,
        "learning_rate": 1e-4,
    }
    assert fast == ds  # every other value is the deep-supervised recipe's


@pytest.mark.parametrize("recipe", ["hyperset-sudoku-ds", "hyperset-sudoku-ds-fast"])
def test_the_sudoku_recipes_train_deep_supervised_with_the_symmetries(tmp_path, recipe):
    require_dataset("sudoku-hard")
    out = tmp_path / "sudoku"
    config = ["hidden_size=16", "num_attention_heads=2", "intermediate_size=32", "num_iterations=2"]
    argv = ["--model", "hyperset", "--dataset", "sudoku-hard", "--preset", "sudoku", "--config", *config]
    argv += [*SHORT, "--recipe", recipe, "--output_dir", str(out)]
    assert train.main(argv) == 0
    saved = json.loads((out / "config.json").read_text())
    assert (saved["deep_supervision"], saved["deep_supervision_weights"]) == ("all", "uniform"), saved
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["arguments"]["data"]["sudoku_augmentation"] is True, metrics["arguments"]["data"]
    ran = metrics["recipe"]
    expected = (recipe, RECIPES[recipe]["learning_rate"], [RECIPES[recipe]["adam_beta1"], 0.95])
    assert (ran["recipe"], ran["learning_rate"], ran["adam_betas"]) == expected, ran


def test_every_recipe_is_documented_in_docs_training() -> None:
    """docs/training.md has a row of the recipe table for each recipe (`imixer-s` / `-b` / `-l` share one), or
    for a recipe that is no paper's (`deit`) a paragraph that names `--recipe NAME`."""
    text = (Path(__file__).parents[1] / "docs" / "training.md").read_text()
    table = text.split("## The papers' recipes", 1)[1].split("\n## ", 1)[0]
    documented = set()
    for row in table.splitlines():
        if not row.startswith("| `"):
            continue
        first = row.split("|")[1]
        names = re.findall(r"`([\w-]+)`", first)
        family = names[0].rsplit("-", 1)[0]
        documented |= {names[0], *(family + name for name in names[1:] if name.startswith("-"))}
    documented |= set(re.findall(r"`--recipe ([\w-]+)`", text))
    assert set(RECIPES) <= documented, sorted(set(RECIPES) - documented)
