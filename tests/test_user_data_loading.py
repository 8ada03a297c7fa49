"""Bringing your own data: DataLoader workers under the spawn start method (the macOS and Windows default), the
loader flags of both loops, 16-bit grey images, and sentence-pair datasets."""

from __future__ import annotations

import json
import multiprocessing
import pickle
import re
from collections.abc import Iterator
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import PIL.Image
import pytest
import torch
from datasets import Dataset, Image
from fixtures import cli_config, decompression_bomb_png
from torch.utils.data import ConcatDataset, DataLoader

from energyformers.training import accelerate_loop, cli, train
from energyformers.training.arguments import RunArguments
from energyformers.training.processing import (
    build_image_processor,
    cells_transform,
    image_transform,
    text_transform,
    train_tokenizer,
)
from energyformers.training.setup import AugmentedTransform
from energyformers.training.sudoku import SudokuAugmentation

TEXTS = ["a good film", "a bad plot", "good acting and a good plot", "a bad film", "bad acting"] * 4


def grey_images(n: int, side: int = 8) -> list[PIL.Image.Image]:
    return [
        PIL.Image.fromarray(((np.arange(side * side) * (i + 1)) % 256).reshape(side, side).astype(np.uint8))
        for i in range(n)
    ]


def transformed_datasets() -> list[Dataset]:
    """One small dataset per `set_transform` callable the loops attach: images, texts, Sudoku cells, and Sudoku cells
    behind the augmentation."""
    images = Dataset.from_dict({"image": grey_images(2), "label": [0, 1]}).cast_column("image", Image())
    images.set_transform(
        image_transform(build_image_processor(SimpleNamespace(image_size=8, num_channels=3)))
    )
    texts = Dataset.from_dict({"text": TEXTS[:2], "label": [0, 1]})
    texts.set_transform(text_transform(train_tokenizer(TEXTS, vocab_size=50, max_length=16), 16))
    cells = {
        "input_ids": [[0] * 81, [1] * 81],
        "labels": [[-100] * 81, [2] * 81],
        "givens": [[0] * 81, [1] * 81],
    }
    sudoku = Dataset.from_dict(cells)
    sudoku.set_transform(cells_transform())
    augmented = Dataset.from_dict(cells)
    augmented.set_transform(AugmentedTransform(SudokuAugmentation(seed=0), cells_transform()))
    return [images, texts, sudoku, augmented]


def as_lists(row: dict) -> dict:
    return {k: v.tolist() if isinstance(v, torch.Tensor) else v for k, v in row.items()}


def test_every_transform_reaches_a_dataloader_worker_started_by_spawn() -> None:
    """The datasets travel to a spawned worker pickled, transform included (a closure cannot be pickled); the rows
    it returns are the ones the main process computes from the same seeded state, but for the augmented puzzle the
    worker relabels with the symmetry of the batch index it takes (`SudokuAugmentation`), checked by its shape: every
    given digit becomes one digit, every label one other digit. One worker for all four keeps it to one
    interpreter start. The main process reads a pickled copy, so the worker's datasets start from the same state."""
    datasets = transformed_datasets()
    expected = [as_lists(ds[i]) for ds in pickle.loads(pickle.dumps(datasets)) for i in range(2)]
    loader = DataLoader(
        ConcatDataset(datasets),
        batch_size=1,
        collate_fn=list,
        num_workers=1,
        multiprocessing_context="spawn",
    )
    rows = [as_lists(batch[0]) for batch in loader]
    # the augmented all-ones puzzle (labels: digit 3 everywhere) under digit relabelling d: d(1) and d(3) - 1
    relabelled = rows[-1]
    given, labels = set(relabelled["input_ids"]), set(relabelled["labels"])
    assert len(given) == len(labels) == 1, relabelled
    (digit,), (label,) = given, labels
    assert 1 <= digit <= 9 and 0 <= label <= 8 and label + 1 != digit, relabelled
    expected[-1] = relabelled
    for i, (row, want) in enumerate(zip(rows, expected, strict=True)):
        assert row == want, f"row {i}: the spawned worker gave {row}, the main process {want}"


@pytest.fixture
def spawn_start_method() -> Iterator[None]:
    """The process-wide start method set to spawn, as on macOS and Windows, and put back afterwards."""
    before = multiprocessing.get_start_method(allow_none=True)
    multiprocessing.set_start_method("spawn", force=True)
    yield
    multiprocessing.set_start_method(before, force=True)


SUBSET = ["--max_train_samples", "16", "--max_eval_samples", "8", "--max_test_samples", "8"]
QUIET = ["--num_threads", "1", "--num_predictions", "0", "--warmup_ratio", "0", "--disable_tqdm"]


def test_train_with_spawned_workers(spawn_start_method: None, tmp_path: Path) -> None:
    """`--dataloader_num_workers 1` under spawn trains and evaluates; persistent workers keep it to few starts."""
    out = tmp_path / "run"
    argv = ["--dataset", "digits", *SUBSET, *QUIET, "--config", *cli_config("hyperset"), "--max_steps", "1"]
    argv += ["--batch_size", "8", "--eval_strategy", "no", "--output_dir", str(out)]
    argv += ["--dataloader_num_workers", "1", "--dataloader_persistent_workers"]
    assert train.main(argv) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert 0 <= metrics["test"]["accuracy"] <= 1, metrics["test"]


# ------------------------------------------------------------------ --dataloader_persistent_workers / _pin_memory


def test_loader_flags_reach_both_loops(tmp_path: Path) -> None:
    base = ["--output_dir", str(tmp_path / "o")]
    args = train.parse([*base, "--dataloader_num_workers", "2", "--dataloader_persistent_workers"])
    assert (
        args.run.dataloader_persistent_workers and args.run.dataloader_pin_memory
    )  # TrainingArguments' defaults
    assert not train.parse([*base, "--dataloader_pin_memory", "false"]).run.dataloader_pin_memory
    targs = train.training_arguments(args, tmp_path / "w")
    assert targs.dataloader_persistent_workers and targs.dataloader_num_workers == 2
    built = SimpleNamespace(data={s: list(range(4)) for s in ("train", "validation", "test")}, collator=list)
    for loader in accelerate_loop.make_loaders(built, args.run):
        assert loader.persistent_workers and loader.num_workers == 2
        # pinned as Trainer pins: only with an accelerator (TrainingArguments(use_cpu=True) turns it off)
        assert loader.pin_memory == (torch.cuda.is_available() and targs.dataloader_pin_memory)


def test_persistent_workers_without_workers_is_a_usage_error(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    assert train.main(["--output_dir", str(tmp_path / "o"), "--dataloader_persistent_workers"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert (
        len(err) == 1 and "--dataloader_persistent_workers" in err[0] and "--dataloader_num_workers" in err[0]
    ), err
    assert not (tmp_path / "o").exists()
    assert RunArguments.__dataclass_fields__["dataloader_pin_memory"].default is True


# ------------------------------------------------------------------ 16-bit grey images


def sixteen_bit(seed: int) -> PIL.Image.Image:
    """A 16-bit grey image (mode I;16) with values up to 60000, well above 8 bits."""
    values = np.random.default_rng(seed).integers(0, 60000, size=(8, 8), dtype=np.uint16)
    return PIL.Image.fromarray(values)


def test_training_preprocesses_16_bit_grey_as_the_pipeline_does(tmp_path: Path) -> None:
    """The transform of training and `evaluate` gives the pixel values that `pipeline` / `predict` give (the saved
    processor after PIL's RGB conversion) for every mode, 16-bit grey included."""
    from transformers import AutoImageProcessor
    from transformers.image_utils import load_image

    build_image_processor(SimpleNamespace(image_size=8, num_channels=3)).save_pretrained(tmp_path)
    processor = AutoImageProcessor.from_pretrained(tmp_path, backend="pil")  # as the model folder loads it
    image = sixteen_bit(0)
    image.save(tmp_path / "i16.png")
    assert PIL.Image.open(tmp_path / "i16.png").mode == "I;16"
    served = processor(load_image(str(tmp_path / "i16.png")), return_tensors="pt")["pixel_values"]
    for mode_image in (image, image.convert("I"), image.convert("F"), grey_images(1)[0].convert("P")):
        trained = image_transform(processor)({"image": [mode_image], "label": [0]})["pixel_values"]
        reference = processor(mode_image, return_tensors="pt")["pixel_values"]
        # both sides run the same PIL conversion and processor: equal to the bit
        assert torch.equal(trained, reference), (mode_image.mode, (trained - reference).abs().max().item())
    trained = image_transform(processor)({"image": [PIL.Image.open(tmp_path / "i16.png")], "label": [0]})
    assert torch.equal(trained["pixel_values"], served), (trained["pixel_values"] - served).abs().max().item()


CLIPPED = r"warning: images of 16/32-bit grey modes \(\d+ of mode I;16\): .*; rescale them to 8 bit first, .*"


def clipped_warnings(err: str) -> list[str]:
    """The lines of `err` about 16/32-bit images."""
    return [line for line in err.splitlines() if "16/32-bit" in line]


def test_training_on_16_bit_grey_warns_once_before_training(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    folder = tmp_path / "images"
    for label in ("a", "b"):
        (folder / label).mkdir(parents=True)
        for i in range(6):
            image = sixteen_bit(i) if i % 2 else grey_images(1)[0]
            image.save(folder / label / f"{i}.png")
    out = tmp_path / "run"
    argv = ["--dataset", str(folder), *QUIET, "--config", *cli_config("hyperset"), "--max_steps", "1"]
    assert train.main([*argv, "--batch_size", "4", "--eval_strategy", "no", "--output_dir", str(out)]) == 0
    # one warning of the run: printed with the others when the run is announced (and again in the closing summary),
    # and recorded once in metrics.json
    recorded = [w for w in json.loads((out / "metrics.json").read_text())["warnings"] if "16/32-bit" in w]
    assert len(recorded) == 1, recorded
    assert "6 of mode I;16" in recorded[0] and "rescale them to 8 bit" in recorded[0], recorded[0]
    assert f"warning: {recorded[0]}" in capsys.readouterr().err.splitlines()
    # scoring or inspecting a model on such data gives the same warning: an old model trained on stretched pixels
    # would otherwise be re-scored on clipped ones silently
    from energyformers.training import evaluate, inspect

    assert evaluate.main([str(out), "--dataset", str(folder), "--split", "train", "--json"]) == 0
    warned = clipped_warnings(capsys.readouterr().err)
    assert len(warned) == 1 and re.fullmatch(CLIPPED, warned[0]), warned
    drawn = tmp_path / "inspect"
    argv = [
        str(out),
        "--dataset",
        str(folder),
        "--split",
        "train",
        "--max_samples",
        "12",
        "--output_dir",
        str(drawn),
    ]
    assert inspect.main(argv) == 0
    warned = clipped_warnings(capsys.readouterr().err)
    assert len(warned) == 1 and re.fullmatch(CLIPPED, warned[0]), warned


# ------------------------------------------------------------------ sentence pairs


def test_the_trained_tokenizer_marks_the_pair_boundary(tmp_path: Path) -> None:
    """run_glue tokenizes (sentence1, sentence2) with separators: "[CLS] A [SEP] B [SEP]"; a single text keeps its
    one leading [CLS]. The saved tokenizer does the same when reloaded, as pipeline loads it."""
    from transformers import AutoTokenizer

    train_tokenizer(TEXTS, vocab_size=50, max_length=16).save_pretrained(tmp_path)
    tokenizer = AutoTokenizer.from_pretrained(tmp_path)
    pair = tokenizer.convert_ids_to_tokens(tokenizer("a good film", "a bad plot")["input_ids"])
    assert pair == ["[CLS]", "a", "good", "film", "[SEP]", "a", "bad", "plot", "[SEP]"], pair
    single = tokenizer.convert_ids_to_tokens(tokenizer("a good film")["input_ids"])
    assert single == ["[CLS]", "a", "good", "film"], single
    assert tokenizer.sep_token == "[SEP]" and tokenizer.convert_ids_to_tokens(0) == "[PAD]"


def write_pairs(path: Path, first: str = "sentence1", second: str = "sentence2", n: int = 40) -> Path:
    rows = [f"{first},{second},label,source"]
    for i in range(n):
        rows.append(f"{TEXTS[i % 5]},{TEXTS[(i + 2) % 5]},{i % 2},web")
    path.write_text("\n".join(rows) + "\n")
    return path


def test_pair_columns_are_read_as_run_glue_reads_them(tmp_path: Path) -> None:
    from energyformers.training.data import DataError, load_data

    data = load_data(str(write_pairs(tmp_path / "pairs.csv")))
    assert data["train"].column_names == ["text", "label", "text_pair"], data["train"].column_names
    assert data.source_columns["text_pair_column"] == "sentence2", data.source_columns
    # the unused string column is named in one line, the pair columns are not
    assert data.notices == [
        "string column(s) ['source'] of the dataset are not used (the text is 'sentence1' paired with "
        "'sentence2')"
    ], data.notices
    named = load_data(
        str(write_pairs(tmp_path / "nli.csv", "premise", "hypothesis")),
        text_column="premise",
        text_pair_column="hypothesis",
    )
    row = named["test"][0]
    assert row["text"] in TEXTS and row["text_pair"] in TEXTS, row
    one = load_data(str(tmp_path / "pairs.csv"), text_column="sentence1")
    assert "text_pair" not in one["train"].column_names
    assert len(one.notices) == 1 and "['sentence2', 'source']" in one.notices[0], one.notices
    assert "--text_pair_column sentence2" in one.notices[0], one.notices
    with pytest.raises(DataError, match="--text_pair_column 'sentence1' is also the text column"):
        load_data(str(tmp_path / "pairs.csv"), text_column="sentence1", text_pair_column="sentence1")
    from datasets import DatasetDict

    train_split = Dataset.from_csv(str(tmp_path / "pairs.csv"))
    test_split = train_split.remove_columns("sentence2")  # a saved split without the second text
    DatasetDict(train=train_split, test=test_split).save_to_disk(tmp_path / "saved")
    with pytest.raises(DataError, match="split 'test' has no column 'sentence2'"):
        load_data(str(tmp_path / "saved"))
    with pytest.raises(DataError, match="text pair column 'label' has type"):
        load_data(str(tmp_path / "pairs.csv"), text_column="sentence1", text_pair_column="label")


def test_train_and_evaluate_on_sentence_pairs(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    """Both texts reach the model, separated; `evaluate` reads the pairs as training did and scores the same."""
    from energyformers.training import evaluate

    dataset = write_pairs(tmp_path / "nli.csv", "premise", "hypothesis")
    out = tmp_path / "run"
    columns = ["--text_column", "premise", "--text_pair_column", "hypothesis"]
    argv = [
        "--model",
        "hyperbf",
        "--dataset",
        str(dataset),
        *columns,
        *QUIET,
        "--config",
        *cli_config("hyperbf"),
    ]
    argv += ["--max_steps", "2", "--batch_size", "8", "--eval_strategy", "no", "--output_dir", str(out)]
    assert train.main([*argv, "--num_predictions", "1"]) == 0
    # the closing pipeline predictions are given the pairs too
    shown = [line for line in capsys.readouterr().out.splitlines() if line.strip().startswith("test[0]")]
    assert len(shown) == 1 and shown[0].count("' / '") == 1, shown
    metrics = json.loads((out / "metrics.json").read_text())
    unused = [w for w in metrics["warnings"] if "not used" in w]
    assert len(unused) == 1 and "['source']" in unused[0], metrics["warnings"]  # both texts are read
    tokenizer = transformers_tokenizer(out)
    assert tokenizer.sep_token_id is not None
    assert evaluate.main([str(out), "--dataset", str(dataset), *columns, "--json"]) == 0
    scored = json.loads(capsys.readouterr().out)["metrics"]
    for name in ("accuracy", "loss"):
        assert scored[f"test_{name}"] == pytest.approx(metrics["test"][name], abs=1e-6), (
            name,
            scored,
            metrics,
        )
    # without the pair column the same model scores other inputs: the second text mattered
    assert evaluate.main([str(out), "--dataset", str(dataset), "--text_column", "premise", "--json"]) == 0
    single = json.loads(capsys.readouterr().out)["metrics"]
    assert single["test_loss"] != pytest.approx(scored["test_loss"], abs=1e-6), (single, scored)


def without_separator(folder: Path) -> None:
    """Replace the tokenizer of the model `folder` with one as `train_tokenizer` made it before `[SEP]` was a
    special token: [PAD]/[UNK]/[CLS] only, a pair encoded as "[CLS] A B"."""
    from tokenizers import Tokenizer, models, normalizers, pre_tokenizers, processors, trainers

    from energyformers.training.processing import wrap_tokenizer

    tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    special = ["[PAD]", "[UNK]", "[CLS]"]
    tokenizer.train_from_iterator(TEXTS, trainers.WordPieceTrainer(vocab_size=50, special_tokens=special))
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", tokenizer.token_to_id("[CLS]"))]
    )
    wrap_tokenizer(tokenizer, 16).save_pretrained(folder)
    assert transformers_tokenizer(folder).sep_token is None


def test_pairs_are_refused_for_a_model_whose_tokenizer_has_no_separator(
    tmp_path: Path, capsys: pytest.CaptureFixture
) -> None:
    """A model folder whose tokenizer predates [SEP] would join a pair's texts with nothing between them: `train
    --from_pretrained` and `evaluate` refuse pairs with it before any work, and still take single texts."""
    from energyformers.training import evaluate

    pairs = write_pairs(tmp_path / "pairs.csv")
    model = tmp_path / "model"
    argv = ["--dataset", str(pairs), "--text_column", "sentence1", *QUIET, "--config", *cli_config("hyperbf")]
    argv += ["--model", "hyperbf", "--max_steps", "1", "--batch_size", "8", "--eval_strategy", "no"]
    assert train.main([*argv, "--output_dir", str(model)]) == 0
    without_separator(model)
    capsys.readouterr()
    fine_tuned = tmp_path / "fine_tuned"
    tail = ["--batch_size", "8", "--eval_strategy", "no", "--output_dir", str(fine_tuned)]
    refusals = {
        "train": train.main([*argv[:2], "--from_pretrained", str(model), *QUIET, "--max_steps", "1", *tail]),
        "evaluate": evaluate.main([str(model), "--dataset", str(pairs), "--json"]),
    }
    captured = capsys.readouterr()
    assert refusals == {"train": 2, "evaluate": 2}, (refusals, captured.err[-2000:])
    lines = [line for line in captured.err.splitlines() if "error:" in line]
    assert lines == [
        f"energyformers train: error: --from_pretrained {model}: its tokenizer has no separator token ([SEP]), so it "
        "cannot read sentence pairs (the two texts would run together); train a model from scratch on the pairs, or "
        "use single texts (--text_column only)",
        f"energyformers evaluate: error: {model}: its tokenizer has no separator token ([SEP]), so it cannot read "
        "sentence pairs (the two texts would run together); train a model from scratch on the pairs, or use single "
        "texts (--text_column only)",
    ], lines
    assert not fine_tuned.exists()
    # single texts of the same data are still read
    assert evaluate.main([str(model), "--dataset", str(pairs), "--text_column", "sentence1", "--json"]) == 0
    # `inspect --dataset` reads the pairs (sentence1/sentence2) as evaluate does, and refuses them alike
    assert (
        cli.main(["inspect", str(model), "--dataset", str(pairs), "--output_dir", str(tmp_path / "i")]) == 2
    )
    line = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert line == [f"energyformers inspect: error: {model}: its tokenizer has no separator token ([SEP]), so "
                    "it cannot read sentence pairs (the two texts would run together); train a model from scratch "
                    "on the pairs, or use single texts (--text_column only)"], line  # fmt: skip


def test_inspect_encodes_the_pairs_of_a_dataset_with_the_separator(tmp_path: Path) -> None:
    """`inspect --dataset`'s batches hold both texts of each pair, as training encoded them."""
    from energyformers.training.inspect import dataset_batches
    from energyformers.training.processing import train_tokenizer

    pairs = write_pairs(tmp_path / "pairs.csv")
    tokenizer = train_tokenizer(TEXTS, vocab_size=60, max_length=32)
    config = SimpleNamespace(input_type="sequence", num_labels=2, id2label={0: "0", 1: "1"})
    _, batches = dataset_batches(str(tmp_path), config, str(pairs), "test", 4, 4, tokenizer)
    ids = batches[0][0]["input_ids"]
    # [CLS] A [SEP] B [SEP] per row: two separators in each
    assert ((ids == tokenizer.sep_token_id).sum(-1) == 2).all(), ids


def transformers_tokenizer(folder: Path):
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder)


# ------------------------------------------------------------------ broken image files


def image_folder(root: Path, per_class: int = 12) -> Path:
    """Two class folders of `per_class` random 8 × 8 PNGs each."""
    rng = np.random.default_rng(0)
    for label in ("a", "b"):
        (root / label).mkdir(parents=True)
        for i in range(per_class):
            PIL.Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(
                root / label / f"{i}.png"
            )
    return root


def split_files(folder: Path, split: str) -> list[Path]:
    """The files of `split` of the image folder, in the order the commands read it (`load_data`, seed 0)."""
    from energyformers.training.data import load_data

    rows = load_data(str(folder), seed=0)[split].cast_column("image", Image(decode=False))
    return [Path(value["path"]) for value in rows.with_format(None)["image"]]


def break_file(file: Path, broken: str) -> Path:
    """`file` cut in half ("truncated": its header still reads), not an image at all ("garbage"), or a PNG too large
    for PIL to open ("bomb", `decompression_bomb_png`)."""
    if broken == "bomb":
        return decompression_bomb_png(file)
    data = file.read_bytes()
    file.write_bytes(data[: len(data) // 2] if broken == "truncated" else b"not an image")
    return file


def one_error_line(capsys: pytest.CaptureFixture, command: str) -> str:
    """The command's error, asserted to be its one line on stderr beside its warnings (e.g. about small splits)."""
    err = [
        line
        for line in capsys.readouterr().err.splitlines()
        if line.strip() and not line.startswith("warning: ")
    ]
    assert len(err) == 1 and err[0].startswith(f"energyformers {command}: error: "), err
    return err[0]


IMAGE_RUN = [*QUIET, "--config", *cli_config("hyperset"), "--batch_size", "4", "--eval_strategy", "no"]


@pytest.mark.parametrize("broken", ["truncated", "garbage", "bomb"])
def test_a_broken_image_file_is_one_line_naming_it_before_anything_is_written(
    tmp_path: Path, capsys: pytest.CaptureFixture, broken: str
) -> None:
    """A file PIL cannot decode among the first training images (decoded before the run starts): status 2 and one
    line naming the file, as a dataset that cannot be used is reported, before any output folder exists."""
    folder = image_folder(tmp_path / "images")
    bad = break_file(split_files(folder, "train")[5], broken)
    capsys.readouterr()  # load_data's progress
    argv = ["--dataset", str(folder), *IMAGE_RUN, "--max_steps", "1", "--output_dir", str(tmp_path / "run")]
    assert train.main(argv) == 2
    line = one_error_line(capsys, "train")
    assert str(bad) in line and "not a readable image" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["images"], sorted(tmp_path.iterdir())


@pytest.mark.parametrize("workers", [0, 1])
def test_a_broken_image_file_met_mid_run_is_one_line_naming_it(
    tmp_path: Path, capsys: pytest.CaptureFixture, workers: int
) -> None:
    """A truncated file past the images decoded up front: images are decoded as batches read them, so it is met
    mid-run, in the main process or in a DataLoader worker (whose exception torch rebuilds in the main process from
    its traceback's text); either way status 2 and one line naming the file and what PIL said. `evaluate` on a
    split with such a file too."""
    folder = image_folder(tmp_path / "images")
    train_files = split_files(folder, "train")
    assert len(train_files) > 8, train_files  # the broken one is not among the 8 decoded before the run
    test_files = split_files(folder, "test")
    assert len(test_files) > 2, test_files
    out = tmp_path / "run"
    argv = ["--dataset", str(folder), *IMAGE_RUN, "--num_train_epochs", "1", "--output_dir", str(out)]
    argv += ["--dataloader_num_workers", str(workers)]
    assert train.main(argv) == 0  # intact: the model evaluate scores below
    capsys.readouterr()
    bad = break_file(train_files[-1], "truncated")
    assert train.main([*argv[:-4], "--output_dir", str(tmp_path / "again"), *argv[-2:]]) == 2
    line = one_error_line(capsys, "train")
    assert str(bad) in line and "truncated" in line, line
    # evaluate: the file in the scored split, past the two rows checked through the model before scoring
    from energyformers.training import evaluate

    bad = break_file(test_files[-1], "truncated")
    assert evaluate.main([str(out), "--dataset", str(folder), "--split", "test", "--json"]) == 2
    line = one_error_line(capsys, "evaluate")
    assert str(bad) in line and "truncated" in line, line
    bad = break_file(test_files[-1], "bomb")  # PIL refuses to open it: its DecompressionBombError
    assert evaluate.main([str(out), "--dataset", str(folder), "--split", "test", "--json"]) == 2
    line = one_error_line(capsys, "evaluate")
    assert str(bad) in line and "decompression bomb" in line, line


def test_lazily_decoded_images_are_the_pixels_datasets_decodes(tmp_path: Path) -> None:
    """`decode_lazily` (the column stored undecoded, each image decoded in the transform) gives bitwise the
    pixel_values datasets' own decoding gives: PNGs of several modes and a JPEG stored sideways with EXIF
    Orientation 6 (read upright), one at a time and as a batch."""
    from energyformers.training.data import decode_lazily

    rng = np.random.default_rng(1)
    files = []
    for i, mode in enumerate(["RGB", "L", "RGBA", "P"]):
        image = PIL.Image.fromarray(rng.integers(0, 256, (6 + i, 9, 3), dtype=np.uint8))
        files.append(tmp_path / f"{i}.png")
        (image.convert(mode) if mode != "P" else image.quantize(16)).save(files[-1])
    exif = PIL.Image.Exif()
    exif[0x0112] = 6
    PIL.Image.fromarray(rng.integers(0, 256, (5, 11, 3), dtype=np.uint8)).save(tmp_path / "s.jpg", exif=exif)
    files.append(tmp_path / "s.jpg")
    rows = Dataset.from_dict({"image": [str(f) for f in files], "label": [0, 1, 0, 1, 0]})
    rows = rows.cast_column("image", Image())
    transform = image_transform(build_image_processor(SimpleNamespace(image_size=8, num_channels=3)))
    reference = rows.with_transform(transform)
    lazy = decode_lazily(rows, transform, "train")
    assert not lazy.features["image"].decode, lazy.features  # the decoding is the transform's
    assert PIL.Image.open(files[-1]).size == (11, 5) and rows[4]["image"].size == (5, 11)  # read upright
    for i in range(len(rows)):
        want, got = reference[i]["pixel_values"], lazy[i]["pixel_values"]
        assert torch.equal(got, want), f"image {i}: max difference {(got - want).abs().max().item()}"
    want, got = reference[:]["pixel_values"], lazy[:]["pixel_values"]
    assert torch.equal(got, want), f"batch: max difference {(got - want).abs().max().item()}"
