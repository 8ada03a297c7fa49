"""`VQGANTokenizer`: a diffusers `VQModel` as the pluggable image tokenizer of masked image modelling.

Offline: a tiny randomly initialised VQModel of MaskGIT's VQGAN layout (attention at the lowest resolution), saved
to a temporary folder; nothing is downloaded."""

from __future__ import annotations

import sys

import pytest
import torch
from fixtures import tiny_vq_model

from energyformers.mim import VQGANTokenizer, VQTokenizer, load_vq_tokenizer
from energyformers.tokenizer_fit import TOKENIZER_CONFIG_NAME


@pytest.fixture
def saved(tmp_path):
    model = tiny_vq_model()
    model.save_pretrained(tmp_path / "vq")
    return model, tmp_path / "vq"


def images(batch: int = 3, side: int = 8) -> torch.Tensor:
    return torch.rand(batch, 3, side, side, generator=torch.Generator().manual_seed(1))


def test_encode_is_the_nearest_codebook_vector_of_the_encoder_latents(saved):
    model, folder = saved
    tokenizer = VQGANTokenizer.from_pretrained(folder)
    assert isinstance(tokenizer, VQTokenizer)
    assert (tokenizer.codebook_size, tokenizer.downsampling) == (16, 2)
    pixels = images()
    codes = tokenizer.encode(pixels)
    assert codes.shape == (3, 16) and codes.dtype == torch.long, (codes.shape, codes.dtype)
    # independently: diffusers' own quantiser on the latents of pixels mapped to [-1, 1]
    with torch.no_grad():
        latents = model.encode(pixels * 2 - 1).latents
        _, _, (_, _, indices) = model.quantize(latents)
    assert torch.equal(codes.flatten(), indices.flatten()), (codes.flatten(), indices.flatten())


def test_decode_is_the_decoder_on_the_codebook_vectors_mapped_to_unit_range(saved):
    model, folder = saved
    tokenizer = VQGANTokenizer.from_pretrained(folder)
    codes = torch.randint(0, 16, (2, 16), generator=torch.Generator().manual_seed(2))
    pixels = tokenizer.decode(codes)
    assert pixels.shape == (2, 3, 8, 8)
    with torch.no_grad():
        grid = model.quantize.embedding.weight[codes].view(2, 4, 4, 4).permute(0, 3, 1, 2)
        expected = ((model.decode(grid, force_not_quantize=True).sample + 1) / 2).clamp(0, 1)
    torch.testing.assert_close(pixels, expected, rtol=0, atol=0)  # the same float32 ops in the same order


def test_save_into_a_model_folder_and_load_back(saved, tmp_path):
    _, folder = saved
    tokenizer = VQGANTokenizer.from_pretrained(folder, pixel_range=(0.0, 1.0))
    model_folder = tmp_path / "model"
    tokenizer.save_pretrained(model_folder)
    assert (model_folder / TOKENIZER_CONFIG_NAME).is_file() and (
        model_folder / "vqgan" / "config.json"
    ).is_file()
    loaded = load_vq_tokenizer(model_folder)
    assert isinstance(loaded, VQGANTokenizer) and loaded.pixel_range == (0.0, 1.0)
    pixels = images()
    assert torch.equal(loaded.encode(pixels), tokenizer.encode(pixels))


def test_errors_name_the_path_the_package_and_the_bad_input(saved, tmp_path, monkeypatch):
    _, folder = saved
    missing = tmp_path / "nowhere"
    with pytest.raises(
        FileNotFoundError, match=r"path='.*nowhere': no such folder; expected a diffusers VQModel"
    ):
        VQGANTokenizer.from_pretrained(missing)
    (tmp_path / "empty").mkdir()
    with pytest.raises(FileNotFoundError, match=r"has no config\.json"):
        VQGANTokenizer.from_pretrained(tmp_path / "empty")
    tokenizer = VQGANTokenizer.from_pretrained(folder)
    with pytest.raises(ValueError, match=r"multiples of the downsampling factor 2; got \(1, 3, 7, 8\)"):
        tokenizer.encode(torch.zeros(1, 3, 7, 8))
    with pytest.raises(
        ValueError, match=r"codes must lie in \[0, codebook_size=16\); got values in \[0, 16\]"
    ):
        tokenizer.decode(torch.tensor([[0] * 15 + [16]]))
    with pytest.raises(ValueError, match="pixel_range must be"):
        VQGANTokenizer(tokenizer.model, pixel_range=(1.0, 1.0))
    monkeypatch.setitem(sys.modules, "diffusers", None)  # as if the optional package were not installed
    with pytest.raises(ImportError, match=r"optional package 'diffusers'.*energyformers\[vqgan\]"):
        VQGANTokenizer.from_pretrained(folder)
