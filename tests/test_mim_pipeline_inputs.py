"""What the masked-image-modelling pipeline reads, compared with training and transformers' image pipelines: a file's
EXIF orientation is applied (as `datasets.Image` and `transformers.image_utils.load_image` do), a URL or base64 string
is loaded by `load_image`, an 8-bit array is read as the PIL image of the same data (alpha dropped as PIL's convert
does), and an array whose values are not 8-bit or fractions in [0, 1] is refused by name instead of clamped."""

from __future__ import annotations

import base64
import types
from pathlib import Path

import numpy as np
import pytest
import torch
import transformers.image_utils
from datasets import Dataset
from datasets import Image as ImageFeature
from fixtures import tiny_mim_model
from PIL import Image

from energyformers.mim import PatchKMeansTokenizer
from energyformers.pipelines import MaskedImageModelingPipeline
from energyformers.training.data import image_tensor

SIDE = 8  # the tokenizer's image size: inputs of this size are not resized, so pixels compare to the bit


@pytest.fixture(scope="module", params=[1, 3], ids=["grey", "rgb"])
def pipe(request) -> MaskedImageModelingPipeline:
    channels = request.param
    torch.manual_seed(0)
    tokenizer = PatchKMeansTokenizer(torch.rand(8, channels * 4), 2, (SIDE, SIDE), channels)
    return MaskedImageModelingPipeline(model=tiny_mim_model("hyperset"), vq_tokenizer=tokenizer)


def channels_of(pipe: MaskedImageModelingPipeline) -> int:
    return pipe.vq_tokenizer.num_channels


def read(pipe: MaskedImageModelingPipeline, image) -> torch.Tensor:
    return pipe(image, steps=1)["input_pixel_values"]


def pil_pixels(image: Image.Image, channels: int) -> torch.Tensor:
    """The `(C, H, W)` floats a PIL image of the tokenizer's size gives: PIL's conversion, divided by 255."""
    array = np.asarray(image.convert("L" if channels == 1 else "RGB"), dtype=np.float32) / 255.0
    return torch.from_numpy(array.reshape(SIDE, SIDE, channels)).permute(2, 0, 1)


def assert_equal(served: torch.Tensor, expected: torch.Tensor) -> None:
    assert served.shape == expected.shape, (tuple(served.shape), tuple(expected.shape))
    assert torch.equal(served, expected), f"max |diff| {(served - expected).abs().max().item()}"


def rgb_array(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (SIDE, SIDE, 3), dtype=np.uint8)


# ------------------------------------------------------------------------------------------------ EXIF orientation


@pytest.fixture(scope="module")
def rotated_jpeg(tmp_path_factory) -> Path:
    """A JPEG stored sideways with EXIF Orientation 6 (view rotated 90° clockwise), as phone cameras write."""
    path = tmp_path_factory.mktemp("exif") / "rotated.jpg"
    exif = Image.Exif()
    exif[0x0112] = 6
    Image.fromarray(rgb_array(1)).save(path, exif=exif, quality=95)
    assert Image.open(path).getexif()[0x0112] == 6
    return path


def test_a_file_is_read_upright_as_training_reads_it(pipe, rotated_jpeg):
    channels = channels_of(pipe)
    column = Dataset.from_dict({"image": [str(rotated_jpeg)]}).cast_column("image", ImageFeature())
    trained = image_tensor(column, SIDE, channels)[0]
    stored = pil_pixels(Image.open(rotated_jpeg), channels)
    # the orientation matters for this image: read as stored, it is another image
    assert not torch.equal(trained, stored), "the rotation leaves the test image unchanged"
    assert_equal(read(pipe, str(rotated_jpeg)), trained)
    assert_equal(read(pipe, rotated_jpeg), trained)  # a Path too
    # a PIL image opened from the file, as transformers' `load_image` reads one
    assert_equal(read(pipe, Image.open(rotated_jpeg)), trained)


# ------------------------------------------------------------------------------------------------ URL and base64


def test_a_url_and_a_base64_string_are_loaded_as_transformers_loads_them(pipe, tmp_path, monkeypatch):
    path = tmp_path / "image.png"
    Image.fromarray(rgb_array(2)).save(path)
    data = path.read_bytes()
    url = "https://example.com/image.png"
    fetched = []

    def get(address, **kwargs):  # offline: transformers' `load_image` fetches through `httpx.get`
        fetched.append(address)
        return types.SimpleNamespace(content=data)

    monkeypatch.setattr(transformers.image_utils, "httpx", types.SimpleNamespace(get=get))
    from_file = read(pipe, str(path))
    assert_equal(read(pipe, url), from_file)
    assert fetched == [url], fetched
    assert_equal(read(pipe, base64.b64encode(data).decode()), from_file)


# ------------------------------------------------------------------------------------------------ arrays


# the C of (H, W, C), 0 for a 2-D (H, W) array
LAYOUTS = {
    "grey (H, W)": 0,
    "grey (H, W, 1)": 1,
    "grey+alpha (H, W, 2)": 2,
    "RGB (H, W, 3)": 3,
    "RGBA (H, W, 4)": 4,
}


@pytest.mark.parametrize("layout", LAYOUTS)
def test_an_8_bit_array_is_read_as_the_pil_image_of_the_same_data(pipe, layout):
    rng = np.random.default_rng(3)
    count = LAYOUTS[layout]
    array = rng.integers(0, 256, (SIDE, SIDE, max(count, 1)), dtype=np.uint8)
    array = array[..., 0] if count == 0 else array
    # PIL's mode for this shape: L, LA, RGB or RGBA
    image = Image.fromarray(array[..., 0] if count == 1 else array)
    assert_equal(read(pipe, array), pil_pixels(image, channels_of(pipe)))


@pytest.mark.parametrize("kind", ["uint8 tensor (C, H, W)", "int64 array in 0-255", "RGBA tensor (4, H, W)"])
def test_other_8_bit_data_is_read_as_the_pil_image_of_the_same_data(pipe, kind):
    array = rgb_array(4)
    image = Image.fromarray(array)
    if kind == "uint8 tensor (C, H, W)":
        data = torch.from_numpy(array).permute(2, 0, 1)
    elif kind == "int64 array in 0-255":
        data = array.astype(np.int64)
    else:
        rgba = np.dstack([array, np.random.default_rng(5).integers(0, 256, (SIDE, SIDE), dtype=np.uint8)])
        data, image = torch.from_numpy(rgba).permute(2, 0, 1), Image.fromarray(rgba)
    assert_equal(read(pipe, data), pil_pixels(image, channels_of(pipe)))


def test_a_float_rgba_array_in_0_1_drops_its_alpha(pipe):
    rgb = np.random.default_rng(6).random((SIDE, SIDE, 3)).astype(np.float32)
    alpha = np.random.default_rng(7).random((SIDE, SIDE, 1)).astype(np.float32)
    assert_equal(read(pipe, np.concatenate([rgb, alpha], axis=-1)), read(pipe, rgb))
    if channels_of(pipe) == 3:  # fractions in [0, 1] are the pixels as given
        assert_equal(read(pipe, rgb), torch.from_numpy(rgb).permute(2, 0, 1))


@pytest.mark.parametrize(
    "kind, message",
    [
        (
            "float in 0-255",
            r"dtype float32 has values in \[0, 255\]; float images are read as fractions in \[0, 1",
        ),
        ("float with NaN", r"dtype float32 has values in \[nan, nan\]"),
        ("float below 0", r"dtype float64 has values in \[-0\.5, 1\]"),
        ("uint16", r"dtype uint16 is not read: images are uint8 \(0-255\) or floats in \[0, 1\]"),
        ("bool", r"dtype bool is not read: images are uint8 \(0-255\) or floats in \[0, 1\]"),
        ("int64 above 255", r"dtype int64 has values in \[0, 300\]; integer images are read as 0-255"),
        ("uint16 tensor", r"dtype uint16 is not read"),
    ],
)
def test_an_array_that_is_neither_8_bit_nor_fractions_is_refused_by_name(pipe, kind, message):
    grey = rgb_array(8)[..., 0]
    data = {
        "float in 0-255": np.where(grey == grey.max(), 255, grey).astype(np.float32),
        "float with NaN": np.full((SIDE, SIDE), np.nan, dtype=np.float32),
        "float below 0": np.where(grey == grey.min(), -0.5, 1.0),
        "uint16": grey.astype(np.uint16) * 257,
        "bool": grey > 128,
        "int64 above 255": np.where(
            grey == grey.max(), 300, np.where(grey == grey.min(), 0, grey.astype(np.int64))
        ),
        "uint16 tensor": torch.from_numpy(grey.astype(np.int32)).to(torch.uint16),
    }[kind]
    with pytest.raises(ValueError, match=message):
        pipe(data, steps=1)
