"""A model folder whose processor files are broken (invalid or truncated JSON, a field of the wrong type, a missing
size) is refused by `predict`, `inspect`, `export`, `push`, `evaluate` and `train --from_pretrained` in one line naming
the file, before the model runs or anything is written or uploaded (evaluate and train: before the dataset loads):
the shared check is `processing.load_processor`. A folder without an image processor is evaluated and fine-tuned
with the one training builds from the config.

Folders: a digits-size image classifier (8×8 RGB), a text classifier and a Sudoku model (their tokenizer files), and
a masked-image-modelling head (its image tokenizer, the processor of that head).
"""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path

import huggingface_hub
import numpy as np
import pytest
from card_fixtures import build_mim_folder
from fixtures import Case
from huggingface_hub import constants
from PIL import Image
from test_export import build_model_dir
from transformers import ViTImageProcessorPil

# setup imported here, before any test patches the `weights` and `data` functions it binds at its import
from energyformers.training import cli, export, inspect, predict, push, setup, train
from energyformers.training.processing import cell_tokenizer, load_processor

PUZZLE = "0" * 81


def _invalid(path: Path) -> None:
    path.write_text("{not json")


def _truncated(path: Path) -> None:
    text = path.read_bytes()
    path.write_bytes(text[: len(text) // 2])


def _json_list(path: Path) -> None:
    path.write_text("[]")


def _field(key: str, value: object = None, delete: bool = False) -> Callable[[Path], None]:
    def damage(path: Path) -> None:
        settings = json.loads(path.read_text())
        if delete:
            settings.pop(key)
        else:
            settings[key] = value
        path.write_text(json.dumps(settings))

    damage.__name__ = f"{key}-deleted" if delete else f"{key}={value!r}"
    return damage


# (folder, damaged file, damage, words of the refusal after the file's path)
CASES = [
    ("image", "preprocessor_config.json", _invalid, "not valid JSON"),
    ("image", "preprocessor_config.json", _truncated, "not valid JSON"),
    ("image", "preprocessor_config.json", _json_list, "holds a JSON list, not an object"),
    ("image", "preprocessor_config.json", _field("image_mean", "abc"), "fails on an image"),
    ("image", "preprocessor_config.json", _field("image_std", [0.5]), "fails on an image"),
    # without its size the processor resizes to transformers' default 224 × 224, which the 8 × 8 model refuses
    (
        "image",
        "preprocessor_config.json",
        _field("size", delete=True),
        "turns an image into 3×224×224 pixel values and the model takes 3×8×8",
    ),
    ("image", "preprocessor_config.json", _field("size", "abc"), "AutoImageProcessor cannot load it"),
    ("text", "tokenizer.json", _truncated, "not valid JSON"),
    ("text", "tokenizer.json", _field("model", "abc"), "not a tokenizer the tokenizers library reads"),
    ("text", "tokenizer_config.json", _invalid, "not valid JSON"),
    ("text", "tokenizer_config.json", _field("pad_token", 5), "AutoTokenizer cannot load the tokenizer"),
    ("text", "tokenizer_config.json", _field("model_max_length", "abc"), "the tokenizer fails on a text"),
    ("sudoku", "tokenizer.json", _truncated, "not valid JSON"),
    ("sudoku", "tokenizer.json", _field("normalizer", "x"), "not a tokenizer the tokenizers library reads"),
    ("sudoku", "tokenizer_config.json", _json_list, "holds a JSON list, not an object"),
    ("sudoku", "tokenizer_config.json", _field("model_max_length", "abc"), "the tokenizer fails on a text"),
    ("mim", "vq_tokenizer_config.json", _field("patch_size", "abc"), "the image tokenizer does not load"),
    (
        "mim",
        "vq_tokenizer_config.json",
        _field("tokenizer_class", delete=True),
        "the image tokenizer does not load",
    ),
    ("mim", "vq_tokenizer.safetensors", _truncated, "cannot be read"),
]
IDS = [f"{folder}-{name}-{damage.__name__.lstrip('_')}" for folder, name, damage, _ in CASES]


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    """The four intact folders and an input of each (an 8×8 RGB image, a text, a puzzle, an 8×8 grey image)."""
    root = tmp_path_factory.mktemp("processor-files")
    sudoku = root / "sudoku"
    Case("hyperset", "AutoModelForTokenClassification", "sequence").build(
        vocab_size=10, num_labels=10, max_position_embeddings=81
    ).save_pretrained(sudoku)
    cell_tokenizer().save_pretrained(sudoku)
    pixels = (np.arange(8 * 8 * 3).reshape(8, 8, 3) * 5 % 256).astype(np.uint8)
    Image.fromarray(pixels).save(root / "rgb.png")
    Image.fromarray(pixels[..., 0]).save(root / "grey.png")
    return {
        "image": build_model_dir(root / "image", "hyperset", "AutoModelForImageClassification", "image"),
        "text": build_model_dir(root / "text", "hyperset", "AutoModelForSequenceClassification", "sequence"),
        "sudoku": sudoku,
        "mim": build_mim_folder(root / "mim", "PatchKMeansTokenizer"),
        "image-input": root / "rgb.png",
        "text-input": "a good film",
        "sudoku-input": PUZZLE,
        "mim-input": root / "grey.png",
    }


@pytest.fixture
def no_model_runs(monkeypatch):
    """Loading a model's weights fails the test: a broken processor is refused before."""

    def loaded(model_class, source, *args, **kwargs):
        raise AssertionError(f"the weights of {source} were loaded")

    # every command loads the weights through it (`weights.load_or_refuse`)
    monkeypatch.setattr("energyformers.training.weights.load_fitting_weights", loaded)


def _damaged(folders: dict[str, Path], tmp_path: Path, folder: str, name: str, damage) -> Path:
    model_dir = shutil.copytree(folders[folder], tmp_path / folder)
    damage(model_dir / name)
    return model_dir


def _refusal(err: str, command: str, path: Path, words: str) -> None:
    """`err` is one line, `energyformers COMMAND: error: PATH: ...WORDS...`."""
    assert err.count("\n") == 1 and err.startswith(f"energyformers {command}: error: {path}: "), err
    assert words in err, f"{words!r} is not in {err!r}"


@pytest.mark.parametrize("folder, name, damage, words", CASES, ids=IDS)
def test_predict_and_inspect_refuse_a_broken_processor_before_the_model_runs(
    folders, tmp_path, capsys, no_model_runs, folder, name, damage, words
):
    model_dir = _damaged(folders, tmp_path, folder, name, damage)
    given = str(folders[f"{folder}-input"])
    capsys.readouterr()
    assert predict.main([str(model_dir), given]) == 2
    captured = capsys.readouterr()
    _refusal(captured.err, "predict", model_dir / name, words)
    assert captured.out == ""
    out = tmp_path / "inspect-out"
    assert inspect.main([str(model_dir), given, "--output_dir", str(out)]) == 2
    _refusal(capsys.readouterr().err, "inspect", model_dir / name, words)
    assert not out.exists(), "inspect made its output folder for a folder it refused"


@pytest.mark.parametrize("folder, name, damage, words", CASES, ids=IDS)
def test_export_refuses_a_broken_processor_and_writes_nothing(
    folders, tmp_path, capsys, no_model_runs, folder, name, damage, words
):
    model_dir = _damaged(folders, tmp_path, folder, name, damage)
    out = tmp_path / "exports" / "hub"
    capsys.readouterr()
    assert export.main([str(model_dir), str(out)]) == 2
    _refusal(capsys.readouterr().err, "export", model_dir / name, words)
    written = sorted(p.name for p in out.parent.iterdir()) if out.parent.exists() else []
    assert written == [], f"export left {written} behind"


@pytest.mark.parametrize("folder, name, damage, words", CASES, ids=IDS)
def test_push_refuses_a_broken_processor_before_any_upload(
    folders, tmp_path, capsys, monkeypatch, folder, name, damage, words
):
    """Online, with a token: only the folder's processor stops the upload (which would fail the test)."""
    model_dir = _damaged(folders, tmp_path, folder, name, damage)

    def upload(*args, **kwargs):
        raise AssertionError("push reached the Hub with a broken processor")

    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", upload)
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", upload)
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_used")
    capsys.readouterr()
    assert push.main([str(model_dir), "org/broken"]) == 2
    _refusal(capsys.readouterr().err, "push", model_dir / name, words)
    with pytest.raises(ValueError, match=words):
        push.push_model_dir(model_dir, "org/broken")


def test_a_grey_models_processor_is_probed_with_a_grey_image(tmp_path):
    """A one-channel model (a converted MNIST-style checkpoint) keeps a processor that does not convert to RGB: the
    probe image is grey for it, and the export goes through."""
    model_dir = tmp_path / "grey"
    Case("hyperset", "AutoModelForImageClassification", "image").build(num_channels=1).save_pretrained(
        model_dir
    )
    ViTImageProcessorPil(
        size={"height": 8, "width": 8}, image_mean=[0.5], image_std=[0.5], do_convert_rgb=False
    ).save_pretrained(model_dir)
    export.export_model_dir(model_dir, tmp_path / "out")
    assert (tmp_path / "out" / "preprocessor_config.json").is_file()


# what evaluate and train --from_pretrained load: an image processor or a text tokenizer (evaluate needs no Sudoku
# tokenizer, the cells being the ids; train --from_pretrained loads the checkpoint's, as the other commands do)
EVALUATE_CASES = [case for case in CASES if case[0] in ("image", "text")]
TRAIN_CASES = [case for case in CASES if case[0] in ("image", "text", "sudoku")]
DATASETS = {"image": "digits", "text": "spam", "sudoku": "sudoku"}


def _ids(cases: list) -> list[str]:
    return [f"{folder}-{name}-{damage.__name__.lstrip('_')}" for folder, name, damage, _ in cases]


@pytest.fixture
def no_data_loads(monkeypatch):
    """Loading the dataset fails the test: a broken processor is refused before."""

    def loaded(name, *args, **kwargs):
        raise AssertionError(f"the dataset {name!r} was loaded")

    monkeypatch.setattr("energyformers.training.data.load_data", loaded)
    monkeypatch.setattr(setup, "load_data", loaded)
    monkeypatch.setattr("energyformers.training.weights.load_fitting_weights", loaded)


@pytest.mark.parametrize("folder, name, damage, words", EVALUATE_CASES, ids=_ids(EVALUATE_CASES))
def test_evaluate_refuses_a_broken_processor_before_the_dataset_loads(
    folders, tmp_path, capsys, no_model_runs, no_data_loads, folder, name, damage, words
):
    model_dir = _damaged(folders, tmp_path, folder, name, damage)
    output = tmp_path / "metrics.json"
    capsys.readouterr()
    code = cli.main(["evaluate", str(model_dir), "--dataset", DATASETS[folder], "--output_file", str(output)])
    captured = capsys.readouterr()
    assert code == 2, captured.err
    _refusal(captured.err, "evaluate", model_dir / name, words)
    assert captured.out == "" and not output.exists()


@pytest.mark.parametrize("folder, name, damage, words", TRAIN_CASES, ids=_ids(TRAIN_CASES))
def test_train_from_pretrained_refuses_a_broken_processor_before_the_dataset_loads(
    folders, tmp_path, capsys, no_model_runs, no_data_loads, folder, name, damage, words
):
    model_dir = _damaged(folders, tmp_path, folder, name, damage)
    out = tmp_path / "finetuned"
    capsys.readouterr()
    code = train.main(
        ["--from_pretrained", str(model_dir), "--dataset", DATASETS[folder], "--output_dir", str(out)]
    )
    err = capsys.readouterr().err
    assert code == 2, err
    assert err.count("\n") == 1, err
    assert err.startswith(f"energyformers train: error: --from_pretrained {model_dir / name}: "), err
    assert words in err, f"{words!r} is not in {err!r}"
    assert not out.exists(), "train made its output folder for a checkpoint it refused"


DIGITS = {i: str(i) for i in range(10)}  # the label set of the built-in digits


def test_a_folder_without_an_image_processor_is_evaluated_with_the_one_training_builds(tmp_path, capsys):
    """The built processor is the saved one's twin (digits' 8×8 images, scaled to [-1, 1]): the same metrics."""
    saved = build_model_dir(
        tmp_path / "saved", "hyperset", "AutoModelForImageClassification", "image", labels=DIGITS
    )
    bare = shutil.copytree(saved, tmp_path / "bare")
    (bare / "preprocessor_config.json").unlink()
    reports = []
    for model_dir in (saved, bare):
        argv = ["evaluate", str(model_dir), "--dataset", "digits", "--max_samples", "16", "--json"]
        assert cli.main(argv) == 0, capsys.readouterr().err
        metrics = json.loads(capsys.readouterr().out)["metrics"]
        reports.append({key: metrics[f"test_{key}"] for key in ("loss", "accuracy", "f1_macro")})
    # the same pixels through the same model in one process: equal exactly
    assert reports[0] == reports[1], reports
    assert sorted(p.name for p in bare.iterdir()) == sorted(
        p.name for p in saved.iterdir() if p.name != "preprocessor_config.json"
    ), "evaluate wrote into the model folder"


def test_a_checkpoint_without_an_image_processor_is_fine_tuned_with_the_one_training_builds(tmp_path, capsys):
    source = build_model_dir(tmp_path / "bare", "hyperset", "AutoModelForImageClassification", "image")
    (source / "preprocessor_config.json").unlink()
    out = tmp_path / "finetuned"
    argv = [
        "--from_pretrained",
        str(source),
        "--dataset",
        "digits",
        "--output_dir",
        str(out),
        "--max_steps",
        "1",
    ]
    argv += ["--max_train_samples", "16", "--max_eval_samples", "8", "--max_test_samples", "8"]
    argv += [
        "--per_device_train_batch_size",
        "8",
        "--num_threads",
        "1",
        "--disable_tqdm",
        "--num_predictions",
        "0",
    ]
    assert train.main(argv) == 0, capsys.readouterr().err
    built = json.loads((out / "preprocessor_config.json").read_text())
    assert built["size"] == {"height": 8, "width": 8}, built
    assert (built["image_mean"], built["image_std"]) == ([0.5] * 3, [0.5] * 3), built


def test_push_loads_the_processor_once(folders, tmp_path, capsys, monkeypatch):
    """The command checks the folder (its processor loaded and tried) once and hands the result to the export."""
    import transformers

    loads = []
    original = transformers.AutoImageProcessor.from_pretrained

    def counted(*args, **kwargs):
        loads.append(args[0])
        return original(*args, **kwargs)

    uploaded = []
    monkeypatch.setattr(transformers.AutoImageProcessor, "from_pretrained", counted)
    monkeypatch.setattr(huggingface_hub.HfApi, "create_repo", lambda self, repo_id, **kw: f"hub/{repo_id}")
    monkeypatch.setattr(huggingface_hub.HfApi, "upload_folder", lambda self, **kw: uploaded.append(kw))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    monkeypatch.setenv("HF_TOKEN", "hf_not_used")
    model_dir = shutil.copytree(folders["image"], tmp_path / "image")
    capsys.readouterr()
    assert push.main([str(model_dir), "org/once"]) == 0, capsys.readouterr().err
    assert capsys.readouterr().out.strip() == "hub/org/once"
    assert len(uploaded) == 1, uploaded
    assert loads == [model_dir], f"the image processor was loaded {len(loads)} times: {loads}"


def test_a_processor_that_does_not_resize_passes_for_inputs_of_the_models_size(folders, tmp_path, capsys):
    """`do_resize=False` is valid for inputs already of the model's size: the probe is of that size, so the folder
    predicts, and the prediction is the resizing processor's (an 8×8 image is left as it is by either)."""
    model_dir = tmp_path / "no-resize"
    shutil.copytree(folders["image"], model_dir)
    config = json.loads((model_dir / "preprocessor_config.json").read_text())
    (model_dir / "preprocessor_config.json").write_text(json.dumps({**config, "do_resize": False}))
    outputs = []
    for folder in (folders["image"], model_dir):
        assert cli.main(["predict", str(folder), str(folders["image-input"])]) == 0, capsys.readouterr().err
        outputs.append(capsys.readouterr().out.split("\t", 1)[1])
    assert outputs[0] == outputs[1], outputs


def test_a_folder_named_with_a_tilde_loads(folders, monkeypatch):
    """`~` is expanded for the loaders too, not only for the folder test."""
    monkeypatch.setenv("HOME", str(folders["image"].parent))
    config = json.loads((folders["image"] / "config.json").read_text())
    processor = load_processor(f"~/{folders['image'].name}", config)
    assert processor.size == {"height": 8, "width": 8}, processor.size
