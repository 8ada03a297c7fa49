"""`MaskedImageModelingPipeline` end to end, offline: real `digits` images, a fitted `PatchKMeansTokenizer` saved in
the model folder, a tiny `HyperSetForMaskedImageModeling` trained a few steps."""

from __future__ import annotations

import math

import numpy as np
import PIL.Image
import pytest
import torch
from fixtures import assert_differs, digit_images, digit_mim_model, rounding

from energyformers import HyperSetForMaskedImageModeling
from energyformers.mim import PatchKMeansTokenizer, mask_codes
from energyformers.pipelines import MaskedImageModelingPipeline


@pytest.fixture(scope="module")
def model_folder(tmp_path_factory):
    """A model folder with the tokenizer saved beside the weights, as training writes a run folder."""
    images = digit_images()
    tokenizer = PatchKMeansTokenizer.fit(images[:512], patch_size=2, codebook_size=32, seed=0)
    model = digit_mim_model(tokenizer.codebook_size)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, betas=(0.0, 0.95), weight_decay=0.1)
    codes = tokenizer.encode(images[:512])
    generator = torch.Generator().manual_seed(0)
    model.train()
    for _ in range(30):
        batch = codes[torch.randint(0, len(codes), (64,), generator=generator)]
        inputs, labels = mask_codes(batch, model.mask_token_id, (0.0, 0.4), generator=generator)
        model(inputs, labels=labels).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    folder = tmp_path_factory.mktemp("mim")
    model.save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    return folder, images[-8:]


def test_pipeline_reconstructs_a_masked_image_and_measures_it(model_folder):
    folder, images = model_folder
    reconstruct = MaskedImageModelingPipeline(model=str(folder))  # the tokenizer comes from the folder
    image = images[0, 0].numpy()  # (16, 16) floats in [0, 1]
    out = reconstruct(image, mask_ratio=0.4, steps=6, schedule="cosine", seed=3)
    assert isinstance(out["reconstruction"], PIL.Image.Image) and out["reconstruction"].size == (16, 16)
    masked = out["masked"]
    assert int(masked.sum()) == round(0.4 * 64), int(masked.sum())
    assert torch.equal(out["input_codes"][masked], torch.full((int(masked.sum()),), 32))
    assert torch.equal(out["codes"][~masked], out["true_codes"][~masked]), "known codes changed"
    assert (out["codes"] < 32).all()
    # PSNR is the reconstruction's against the input (10 log10(1 / MSE) for data range 1), computed here again
    mse = (out["pixel_values"].double() - torch.from_numpy(image).double()[None]).pow(2).mean().item()
    # float32 pixels against this float64 MSE: a 256-pixel mean of squares, 256 float32 ulps of the PSNR
    psnr = 10 * math.log10(1 / mse)
    assert abs(out["psnr"] - psnr) <= rounding(torch.float32, 256, psnr), (out["psnr"], psnr)
    # true codes are each patch's nearest centroid, so no other codes reconstruct better; equal codes decode to the
    # same bits, so 1e-9 dB (far below a float32 ulp of a PSNR) allows no real excess
    assert out["psnr"] <= out["tokenizer_psnr"] + 1e-9, (out["psnr"], out["tokenizer_psnr"])
    assert 0.0 <= out["masked_accuracy"] <= 1.0
    assert out["decoding"].sequences.shape == (7, 1, 64)  # the grid before and after each of the 6 steps
    # seeded: the same call gives the same codes; another seed masks other positions
    again = reconstruct(image, mask_ratio=0.4, steps=6, schedule="cosine", seed=3)
    assert torch.equal(again["codes"], out["codes"]) and torch.equal(again["masked"], masked)
    other = reconstruct(image, mask_ratio=0.4, steps=6, schedule="cosine", seed=4)
    assert_differs(other["masked"], masked, "masked positions, seed 4 vs 3")


def test_pipeline_reads_pil_images_paths_and_uint8_arrays_alike(model_folder, tmp_path):
    folder, images = model_folder
    reconstruct = MaskedImageModelingPipeline(model=str(folder))
    grey = (images[1, 0] * 255).round().to(torch.uint8).numpy()
    path = tmp_path / "digit.png"
    PIL.Image.fromarray(grey).convert("RGB").save(path)  # RGB on disk: read back as grey ("L")
    results = [reconstruct(x, seed=0, steps=4) for x in (grey, PIL.Image.fromarray(grey), str(path))]
    for result in results[1:]:
        assert torch.equal(result["true_codes"], results[0]["true_codes"])
        assert torch.equal(result["codes"], results[0]["codes"])
    # the default ratio is the paper's 0.4; mask_ratio 0 decodes nothing and returns the tokenizer's bound
    assert int(results[0]["masked"].sum()) == round(0.4 * 64)
    nothing = reconstruct(np.asarray(grey), mask_ratio=0.0, seed=0, steps=1)
    assert (
        torch.equal(nothing["codes"], nothing["true_codes"]) and nothing["psnr"] == nothing["tokenizer_psnr"]
    )


def test_pipeline_errors_name_the_argument(model_folder, tmp_path):
    folder, images = model_folder
    reconstruct = MaskedImageModelingPipeline(model=str(folder))
    image = images[0, 0].numpy()
    with pytest.raises(ValueError, match=r"mask_ratio must be a fraction in \[0, 1\]; got 1.5"):
        reconstruct(image, mask_ratio=1.5)
    with pytest.raises(ValueError, match=r"takes no \['top_k'\] argument"):
        reconstruct(image, top_k=3)
    with pytest.raises(ValueError, match="schedule must be one of"):
        reconstruct(image, schedule="cubic")
    # torch would read -1 as the seed 2**64 - 1
    with pytest.raises(ValueError, match=r"seed must be an integer in \[0, 2\*\*63\); got -1"):
        reconstruct(image, seed=-1)
    model = HyperSetForMaskedImageModeling.from_pretrained(folder)
    wrong = PatchKMeansTokenizer(torch.rand(8, 4), 2, (16, 16), 1)
    with pytest.raises(ValueError, match="vq_tokenizer has codebook_size=8, the model predicts 32"):
        MaskedImageModelingPipeline(model=model, vq_tokenizer=wrong)
    # the model's 8 × 8 grid of positions against a tokenizer of 4 × 4 codes (8 × 8 images, patch 2): the codes would
    # sit at the first 16 positions, not where the model learned them
    small_grid = PatchKMeansTokenizer(
        torch.rand(32, 4, generator=torch.Generator().manual_seed(0)), 2, (8, 8), 1
    )
    with pytest.raises(
        ValueError, match=r"grid is 4 × 4 = 16 codes, .*max_position_embeddings=64 .*8 × 8 grid"
    ):
        MaskedImageModelingPipeline(model=model, vq_tokenizer=small_grid)
    bare = tmp_path / "bare"
    model.save_pretrained(bare)  # no tokenizer saved beside the weights
    with pytest.raises(FileNotFoundError, match=r"no vq_tokenizer_config\.json"):
        MaskedImageModelingPipeline(model=str(bare))


def test_save_pretrained_writes_a_folder_the_pipeline_rebuilds_from(model_folder, tmp_path):
    import transformers

    folder, images = model_folder
    reconstruct = MaskedImageModelingPipeline(model=str(folder))
    reconstruct.save_pretrained(tmp_path / "saved")
    # the model and its image tokenizer; no copy of the package's pipeline module as remote code
    saved = sorted(p.name for p in (tmp_path / "saved").iterdir())
    assert {"config.json", "model.safetensors", "vq_tokenizer_config.json"} <= set(saved), saved
    assert not any(name.endswith(".py") for name in saved), saved
    again = transformers.pipeline("masked-image-modeling", model=str(tmp_path / "saved"))
    assert type(again) is MaskedImageModelingPipeline
    image = images[1, 0].numpy()
    expected, got = (p(image, mask_ratio=0.4, steps=4, seed=1) for p in (reconstruct, again))
    assert torch.equal(got["codes"], expected["codes"]) and got["psnr"] == expected["psnr"]


def test_save_pretrained_refuses_a_tokenizer_it_cannot_save(model_folder, tmp_path):
    folder, _ = model_folder
    saved = PatchKMeansTokenizer.from_pretrained(folder)

    class Unsaveable:  # the saved tokenizer without its save_pretrained: a VQTokenizer all the same
        def __getattr__(self, name: str):
            if name == "save_pretrained":
                raise AttributeError(name)
            return getattr(saved, name)

    reconstruct = MaskedImageModelingPipeline(model=str(folder), vq_tokenizer=Unsaveable())
    with pytest.raises(TypeError, match=r"vq_tokenizer \(Unsaveable\) has no save_pretrained"):
        reconstruct.save_pretrained(tmp_path / "saved")
    assert not (tmp_path / "saved").exists()  # refused before anything is written
