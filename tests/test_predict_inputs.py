"""`energyformers predict`'s inputs: image files are opened one at a time as the pipeline reaches them (any number
of files within the open-file limit), a truncated JPEG is refused by name before the model loads, and texts read
from stdin with Windows line ends keep no carriage return."""

from __future__ import annotations

import io
import json
import sys
from pathlib import Path

import numpy as np
import psutil
import pytest
from PIL import Image
from test_export import build_model_dir
from test_predict_pairs import no_model_loads as no_model_loads  # a fixture, used by name
from test_registry_tasks import build_mim_folder
from transformers import pipeline

from energyformers import pipelines
from energyformers.training import predict

PREFIX = "energyformers predict: error: "
MANY = 40  # image files in one call: more than one at a time open is a file held open up front


@pytest.fixture(scope="module")
def folders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A tiny image classifier, a masked-image-modelling folder and a text classifier."""
    root = tmp_path_factory.mktemp("predict_inputs")
    return {
        "image": build_model_dir(root / "image", "hyperset", "AutoModelForImageClassification", "image"),
        "mim": build_mim_folder(root / "mim", "hyperset"),
        "text": build_model_dir(root / "text", "hyperset", "AutoModelForSequenceClassification", "sequence"),
    }


@pytest.fixture(scope="module")
def many_images(tmp_path_factory: pytest.TempPathFactory) -> list[Path]:
    """`MANY` 8 × 8 RGB PNGs of seeded noise (RGB: the mode PIL leaves unconverted, so nothing forces a load)."""
    root = tmp_path_factory.mktemp("many")
    rng = np.random.default_rng(0)
    paths = [root / f"{i:02d}.png" for i in range(MANY)]
    for path in paths:
        Image.fromarray(rng.integers(0, 256, (8, 8, 3), dtype=np.uint8)).save(path)
    return paths


def test_predict_holds_one_input_file_open_at_a_time(folders, many_images, capsys, monkeypatch):
    """Each time the pipeline preprocesses an image, at most that one input file is open (up front, all `MANY` were:
    past the open-file limit, "Too many open files"); the predictions are the pipeline's on the paths."""
    inputs = {str(path.resolve()) for path in many_images}
    open_counts: list[int] = []
    original = pipelines.ImageClassificationPipeline.preprocess

    def counting(self, image, *args, **kwargs):
        open_counts.append(sum(f.path in inputs for f in psutil.Process().open_files()))
        return original(self, image, *args, **kwargs)

    monkeypatch.setattr(pipelines.ImageClassificationPipeline, "preprocess", counting)
    argv = [str(folders["image"]), *map(str, many_images), "--json", "--top_k", "3"]
    assert predict.main(argv) == 0, capsys.readouterr().err
    records = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert len(open_counts) == MANY and max(open_counts) <= 1, (
        f"input files open at each image: {open_counts}"
    )

    monkeypatch.undo()
    expected = pipeline("image-classification", model=str(folders["image"]))(
        list(map(str, many_images)), top_k=3
    )
    assert [r["input"] for r in records] == list(map(str, many_images)), records
    for record, want in zip(records, expected):
        got = record["predictions"]
        assert [p["label"] for p in got] == [p["label"] for p in want], (record["input"], got, want)
        # the same model on the same pixels, in float32: equal up to float32 rounding of a probability
        np.testing.assert_allclose(
            [p["score"] for p in got], [p["score"] for p in want], rtol=0, atol=4 * np.finfo(np.float32).eps
        )


@pytest.fixture(scope="module")
def truncated_jpeg(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A readable 8 × 8 PNG and a 32 × 32 JPEG cut at half its bytes: its header is whole, its pixel data is not,
    so `Image.verify` passes it and decoding fails."""
    root = tmp_path_factory.mktemp("truncated")
    rng = np.random.default_rng(1)
    good = root / "good.png"
    Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)).save(good)
    buffer = io.BytesIO()
    Image.fromarray(rng.integers(0, 256, (32, 32, 3), dtype=np.uint8)).save(buffer, "JPEG", quality=95)
    bad = root / "cut.jpg"
    bad.write_bytes(buffer.getvalue()[: len(buffer.getvalue()) // 2])
    with Image.open(bad) as image:
        image.verify()  # what the old check stopped at: the test is about a file that passes it
    with Image.open(bad) as image, pytest.raises(OSError, match="truncated"):
        image.load()
    return good, bad


@pytest.mark.parametrize("kind", ["image", "mim"])
def test_a_truncated_jpeg_is_refused_by_name_before_the_model_loads(
    kind, folders, truncated_jpeg, no_model_loads, capsys
):
    good, bad = truncated_jpeg
    status = predict.main([str(folders[kind]), str(good), str(bad)])
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and not captured.out, (status, captured.err, captured.out)
    assert lines[0].startswith(f"{PREFIX}{bad}: not a readable image (image file is truncated"), lines


def test_stdin_with_windows_line_ends_gives_the_texts_without_carriage_returns(folders, capsys, monkeypatch):
    """`predict -` on "\\r\\n" lines: the records' inputs and the printed lines carry no "\\r", and the predictions
    are those of the same texts with "\\n" line ends."""
    texts = ["a good film", "boring plot and not great acting"]
    outputs = {}
    for end in ("\n", "\r\n"):
        monkeypatch.setattr(sys, "stdin", io.StringIO(end.join(texts) + end))
        assert predict.main([str(folders["text"]), "-", "--json", "--top_k", "3"]) == 0
        outputs[end] = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["input"] for r in outputs["\r\n"]] == texts, outputs["\r\n"]
    assert outputs["\r\n"] == outputs["\n"], outputs

    monkeypatch.setattr(sys, "stdin", io.StringIO("\r\n".join(texts) + "\r\n"))
    assert predict.main([str(folders["text"]), "-"]) == 0
    printed = capsys.readouterr().out
    assert "\r" not in printed and [line.split("\t")[0] for line in printed.splitlines()] == texts, repr(
        printed
    )
