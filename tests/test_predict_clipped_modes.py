"""16/32-bit grey image files: `energyformers predict` warns once that their conversion clips at 255, as `train`,
`evaluate` and `inspect` do, for a classifier and for a masked-image-modelling folder; and the masked-image-modelling
pipeline tokenizes such a file from the pixels training tokenizes (`data.image_tensor`), so serving sees what
training saw."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
import torch
from datasets import Dataset, DatasetDict
from datasets import Image as ImageFeature
from fixtures import tiny_mim_model
from PIL import Image
from test_cli_errors import hyperset_folder as hyperset_folder  # a fixture, used by name
from test_registry_tasks import build_mim_folder

from energyformers.mim import PatchKMeansTokenizer
from energyformers.pipelines import MaskedImageModelingPipeline
from energyformers.training import predict
from energyformers.training.data import image_tensor, masked_image_data

# the shared wording (`processing.clipped_modes_warning`) with this test's counts: 2 files of I;16, 1 of F
CLIPPED = r"warning: images of 16/32-bit grey modes \(1 of mode F, 2 of mode I;16\): .*; rescale them to 8 bit first, .*"


@pytest.fixture(scope="module")
def images(tmp_path_factory) -> dict[str, Path]:
    """8 × 8 files: two 16-bit grey PNGs (values up to 60000), a 32-bit float TIFF (up to 300) and an 8-bit one."""
    root = tmp_path_factory.mktemp("clipped")
    rng = np.random.default_rng(0)
    files = {
        "a16.png": Image.fromarray(rng.integers(0, 60000, (8, 8), dtype=np.uint16)),
        "b16.png": Image.fromarray(rng.integers(0, 60000, (8, 8), dtype=np.uint16)),
        "f32.tif": Image.fromarray((rng.random((8, 8)) * 300).astype(np.float32)),
        "grey8.png": Image.fromarray(rng.integers(0, 256, (8, 8), dtype=np.uint8)),
    }
    paths = {}
    for name, image in files.items():
        image.save(root / name)
        paths[name] = root / name
    modes = {name: Image.open(path).mode for name, path in paths.items()}
    assert modes == {"a16.png": "I;16", "b16.png": "I;16", "f32.tif": "F", "grey8.png": "L"}, modes
    return paths


def clipped_warnings(err: str) -> list[str]:
    return [line for line in err.splitlines() if "16/32-bit" in line]


@pytest.fixture(scope="module")
def mim_folder(tmp_path_factory) -> Path:
    return build_mim_folder(tmp_path_factory.mktemp("mim") / "hyperset", "hyperset")


@pytest.mark.parametrize("kind", ["classifier", "mim"])
def test_predict_warns_once_naming_the_modes_and_counts(kind, images, hyperset_folder, mim_folder, capsys):
    folder = hyperset_folder[0] if kind == "classifier" else mim_folder
    assert predict.main([str(folder), *map(str, images.values()), "--json"]) == 0
    captured = capsys.readouterr()
    warned = clipped_warnings(captured.err)
    assert len(warned) == 1 and re.fullmatch(CLIPPED, warned[0]), warned
    assert len(captured.out.strip().splitlines()) == len(images), captured.out  # every file still predicted
    assert predict.main([str(folder), str(images["grey8.png"]), "--json"]) == 0
    assert clipped_warnings(capsys.readouterr().err) == [], "an 8-bit image alone is warned about"


@pytest.mark.parametrize("channels", [1, 3])
def test_mim_pipeline_tokenizes_16_bit_grey_from_the_pixels_training_does(images, channels):
    """Both read the file through PIL's conversion to grey or RGB (which clips above 255), at the tokenizer's 8 × 8."""
    path = images["a16.png"]
    trained = image_tensor(
        Dataset.from_dict({"image": [str(path)]}).cast_column("image", ImageFeature()), 8, channels
    )
    tokenizer = PatchKMeansTokenizer(torch.rand(8, channels * 4), 2, (8, 8), channels)
    pipe = MaskedImageModelingPipeline(model=tiny_mim_model("hyperset"), vq_tokenizer=tokenizer)
    served = pipe(str(path))["input_pixel_values"]
    # the same 8-bit values divided by 255 on both sides: equal to the bit
    assert torch.equal(served, trained[0]), (served - trained[0]).abs().max().item()
    clipped = (np.asarray(Image.open(path)) > 255).mean()
    assert (served == 1).float().mean().item() == pytest.approx(clipped), "not the clipped pixels at 1"


@pytest.mark.parametrize("mode", ["I;16", "I;16B"])
def test_mim_training_tokenizes_every_16_bit_grey_mode_as_one_channel(tmp_path, mode):
    """A fitted tokenizer reads grey files as one channel, whatever the byte order of their 16 bits."""
    rng = np.random.default_rng(1)
    paths = []
    for i in range(6):
        pixels = rng.integers(0, 255, (8, 8), dtype=np.uint16)
        image = Image.frombytes(mode, (8, 8), pixels.astype(">u2" if mode == "I;16B" else "<u2").tobytes())
        image.save(tmp_path / f"{i}.tif")
        paths.append(str(tmp_path / f"{i}.tif"))
    assert {Image.open(path).mode for path in paths} == {mode}
    split = Dataset.from_dict({"image": paths[:2]}).cast_column("image", ImageFeature())
    data = DatasetDict({"train": split, "validation": split, "test": split})
    result = masked_image_data(
        data,
        None,
        codebook_size=4,
        patch_size=None,
        fit_samples=2,
        eval_mask_ratio=0.5,
        seed=0,
        log=lambda _: None,
    )
    assert result.tokenizer.num_channels == 1, (mode, result.tokenizer.num_channels)
