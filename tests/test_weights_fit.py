"""A model folder whose weights do not fit its config.json is refused by every command that loads it.

A Hyper-SET folder relabelled `model_type: imixer` (or given another hidden_size) would otherwise load as a
randomly initialised model and run with exit status 0. predict, evaluate, inspect and `train --from_pretrained`
refuse it in one line with status 2, naming the folder and the first tensors, before any work (the check is
`energyformers.training.weights.load_fitting_weights`, shared with export). `train --from_pretrained` still
re-initialises the classifier when the label set changes, and only it.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers
from fixtures import hyperset_config
from PIL import Image

from energyformers.training import cli
from energyformers.training.processing import build_image_processor

CLASSES = "abcd"  # the tiny model's four labels, and the class folders of the tiny dataset


def tiny_folder(folder: Path, **config_changes: object) -> Path:
    """A tiny trained-looking Hyper-SET image classifier (save_pretrained + its image processor); then
    `config_changes` written into its config.json only, so the weights no longer fit it."""
    config = hyperset_config(
        "image",
        num_channels=3,
        id2label=dict(enumerate(CLASSES)),
        label2id={name: i for i, name in enumerate(CLASSES)},
    )
    torch.manual_seed(0)
    transformers.AutoModelForImageClassification.from_config(config).save_pretrained(folder)
    build_image_processor(config).save_pretrained(folder)
    saved = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**saved, **config_changes}))
    return folder


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tmp_path_factory.mktemp("weights-fit")


@pytest.fixture(scope="module")
def relabelled(root: Path) -> Path:
    """A Hyper-SET folder whose config.json says imixer: no tensor name fits."""
    return tiny_folder(root / "relabelled", model_type="imixer")


@pytest.fixture(scope="module")
def fitting(root: Path) -> Path:
    return tiny_folder(root / "fitting")


@pytest.fixture(scope="module")
def images(root: Path) -> Path:
    """An imagefolder dataset with the model's classes, two 8 × 8 images each."""
    rng = np.random.default_rng(0)
    for name in CLASSES:
        (root / "images" / name).mkdir(parents=True)
        for i in range(2):
            pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)
            Image.fromarray(pixels).save(root / "images" / name / f"{i}.png")
    return root / "images"


def refused(capsys: pytest.CaptureFixture, command: str, *argv: object) -> str:
    """Run `energyformers COMMAND ARGV`; assert status 2, nothing on stdout and one error line; return it."""
    capsys.readouterr()
    status = cli.main([command, *map(str, argv)])
    out, err = capsys.readouterr()
    lines = [line for line in err.splitlines() if line.strip()]
    assert status == 2 and not out.strip() and len(lines) == 1, (status, out, err)
    assert lines[0].startswith(f"energyformers {command}: error: "), lines[0]
    return lines[0]


def assert_names_the_tensors(line: str, folder: Path) -> None:
    from energyformers.training.weights import SHOWN_TENSORS

    assert f"{folder}: weights do not match config.json" in line, line
    # the first few of the missing (imixer's) and unexpected (hyperset's) tensors, and how many there are
    for kind in ("missing", "unexpected"):
        found = re.search(rf"\b{kind} ((?:[\w.]+, ){{{SHOWN_TENSORS}}})\.\.\. \((\d+) in all\)", line)
        assert found and int(found[2]) > SHOWN_TENSORS, (kind, line)


@pytest.fixture(scope="module")
def widened(root: Path) -> Path:
    """A Hyper-SET folder whose config.json says twice the width: the same tensor names, other shapes."""
    width = json.loads((tiny_folder(root / "widened") / "config.json").read_text())["hidden_size"]
    return tiny_folder(root / "widened", hidden_size=2 * width)


@pytest.mark.parametrize("command", ["predict", "evaluate", "inspect"])
def test_tensors_of_another_shape_are_named_as_a_mismatch(command, widened, images, root, capsys):
    """A tensor of another shape is reported as the weights-fit refusal (the tensor, its saved and model shapes),
    as a missing or unexpected one is, not as a folder that cannot be loaded."""
    argv = {
        "predict": [images / "a" / "0.png"],
        "evaluate": ["--dataset", images, "--split", "train"],
        "inspect": [images / "a" / "0.png", "--output_dir", root / f"inspect-{command}"],
    }[command]
    line = refused(capsys, command, widened, *argv)
    assert f"{widened}: weights do not match config.json" in line, line
    assert "mismatched classifier.weight (4, 16) saved, (4, 32) in the model" in line, line


def test_predict_refuses_weights_that_do_not_fit(relabelled, images, capsys):
    line = refused(capsys, "predict", relabelled, images / "a" / "0.png")
    assert_names_the_tensors(line, relabelled)


def test_evaluate_refuses_weights_that_do_not_fit(relabelled, images, capsys):
    line = refused(capsys, "evaluate", relabelled, "--dataset", images, "--split", "train")
    assert_names_the_tensors(line, relabelled)


def test_inspect_refuses_weights_that_do_not_fit(relabelled, images, root, capsys):
    out = root / "inspect-out"
    line = refused(capsys, "inspect", relabelled, images / "a" / "0.png", "--output_dir", out)
    assert_names_the_tensors(line, relabelled)
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


def test_train_from_pretrained_refuses_a_backbone_that_does_not_fit(fitting, images, root, capsys):
    out = root / "train-out"
    line = refused(
        capsys, "train", "--from_pretrained", fitting, "--dataset", images, "--config", "hidden_size=32",
        "--output_dir", out, "--max_steps", "1", "--num_threads", "1", "--disable_tqdm",
    )  # fmt: skip
    assert f"--from_pretrained {fitting}: weights do not match config.json" in line, line
    assert "mismatched hyperset." in line, line  # the backbone's tensors, not (only) the classifier's
    assert not out.exists() or not any(out.iterdir()), sorted(out.iterdir())


def test_a_changed_label_set_re_initialises_only_the_classifier(fitting):
    from energyformers.training.setup import new_head_tensors
    from energyformers.training.weights import WeightsMismatchError, load_fitting_weights

    head = transformers.AutoModelForImageClassification
    fewer = transformers.AutoConfig.from_pretrained(fitting, num_labels=3)
    loaded = load_fitting_weights(
        head, fitting, allowed=new_head_tensors, config=fewer, ignore_mismatched_sizes=True
    )
    saved = head.from_pretrained(fitting).state_dict()
    kept = {name for name, tensor in loaded.state_dict().items() if torch.equal(tensor, saved[name])}
    assert set(saved) - kept == {"classifier.weight", "classifier.bias"}, sorted(set(saved) - kept)
    wider = transformers.AutoConfig.from_pretrained(fitting, hidden_size=32)
    with pytest.raises(
        WeightsMismatchError, match=r"weights do not match config.json.*mismatched hyperset\."
    ):
        load_fitting_weights(
            head, fitting, allowed=new_head_tensors, config=wider, ignore_mismatched_sizes=True
        )
