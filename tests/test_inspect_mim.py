"""`energyformers inspect` on a masked-image-modelling folder: the decode sequence figure and its per-step data."""

from __future__ import annotations

import json

import numpy as np
import PIL.Image
import pytest
import torch
from fixtures import digit_images

from energyformers import HyperSetConfig, HyperSetForMaskedImageModeling
from energyformers.mim import PatchKMeansTokenizer
from energyformers.modeling.modeling_hyperset import maskgit_schedule
from energyformers.training import cli


@pytest.fixture(scope="module")
def mim_folder(tmp_path_factory):
    """A tiny MIM model (8 × 8 grid, codebook 16) with a k-means tokenizer fitted on `digits` saved beside it, and
    one digit as a PNG."""
    images = digit_images()
    tokenizer = PatchKMeansTokenizer.fit(images[:200], patch_size=2, codebook_size=16, seed=0, n_init=1)
    torch.manual_seed(0)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d",
        hidden_size=16,
        num_attention_heads=4,
        intermediate_size=16,
        time_embedding_dim=16,
        num_iterations=2,
        vocab_size=17,
        max_position_embeddings=64,
    )
    folder = tmp_path_factory.mktemp("mim-model")
    HyperSetForMaskedImageModeling(config).save_pretrained(folder)
    tokenizer.save_pretrained(folder)
    png = folder.parent / "digit.png"
    PIL.Image.fromarray((images[-1, 0] * 255).round().to(torch.uint8).numpy()).save(png)
    return folder, png


def test_inspect_draws_one_panel_per_decoding_step(mim_folder, tmp_path, capsys):
    folder, png = mim_folder
    out = tmp_path / "inspect"
    argv = [
        "inspect",
        str(folder),
        str(png),
        "--output_dir",
        str(out),
        "--steps",
        "5",
        "--schedule",
        "linear",
    ]
    assert cli.main(argv) == 0, capsys.readouterr().err
    figure = out / "mim_decode_sequence.png"
    assert figure.is_file() and str(figure) in capsys.readouterr().out
    assert np.asarray(PIL.Image.open(figure)).shape[0] > 100  # a real picture, not an empty file
    report = json.loads((out / "inspect.json").read_text())["mim"]
    # the input, the masked grid, then the grid after each of the 5 steps
    assert report["panels"] == 7 and report["titles"][:2] == ["input", "masked 40%"], report["titles"]
    # each step fixes the schedule's count of the 26 masked codes (round(0.4 · 64)); none is left at the end
    counts = maskgit_schedule(torch.tensor([26]), 5, "linear")[0]
    expected = (26 - torch.cat([torch.zeros(1, dtype=torch.long), counts.cumsum(0)])).tolist()
    assert report["masked_per_step"] == expected, (report["masked_per_step"], expected)
    assert report["masked_per_step"][-1] == 0
    assert report["psnr"] <= report["tokenizer_psnr"] + 1e-9, report


def test_decode_sequence_frames_grey_out_exactly_the_masked_codes(mim_folder):
    from energyformers.training.inspect import MASKED_GREY, decode_sequence

    folder, png = mim_folder
    model = HyperSetForMaskedImageModeling.from_pretrained(folder).eval()
    tokenizer = PatchKMeansTokenizer.from_pretrained(folder)
    sequence = decode_sequence(model, tokenizer, str(png), 0.4, 3, "arccos", seed=1)
    frames, result = sequence["frames"], sequence["result"]
    assert frames.shape == (3 + 2, 1, 16, 16), frames.shape
    masked = result["masked"].view(8, 8).repeat_interleave(2, 0).repeat_interleave(2, 1)
    assert (frames[1, 0][masked] == MASKED_GREY).all()
    # known codes are drawn as the tokenizer decodes them, and the last frame is the reconstruction
    truth = tokenizer.decode(result["true_codes"][None])[0, 0]
    assert torch.equal(frames[1, 0][~masked], truth[~masked])
    assert torch.equal(frames[-1], result["pixel_values"])


def test_inspect_refuses_a_mim_folder_without_an_image(mim_folder, tmp_path, capsys):
    folder, _ = mim_folder
    argv = ["inspect", str(folder), "--dataset", "digits", "--output_dir", str(tmp_path / "x")]
    assert cli.main(argv) == 2
    assert "masked-image-modelling model: give an image path" in capsys.readouterr().err


def test_inspect_refuses_a_tokenizer_whose_grid_is_not_the_models(mim_folder, tmp_path, capsys):
    """The model has 64 positions (8 × 8); a tokenizer of 16 × 16 images in 4 × 4 patches gives 4 × 4 codes."""
    folder, png = mim_folder
    copy = tmp_path / "other-grid"
    copy.mkdir()
    for name in ("config.json", "model.safetensors"):
        (copy / name).write_bytes((folder / name).read_bytes())
    centroids = torch.rand(16, 16, generator=torch.Generator().manual_seed(0))
    PatchKMeansTokenizer(centroids, 4, (16, 16), 1).save_pretrained(copy)
    assert cli.main(["inspect", str(copy), str(png), "--output_dir", str(tmp_path / "x")]) == 2
    err = capsys.readouterr().err
    lines = err.splitlines()
    assert len(lines) == 1 and "grid is 4 × 4 = 16 codes" in err and "8 × 8 grid" in err, err
    assert not (tmp_path / "x").exists()


def test_inspect_draws_the_looped_transformer_heads_decode_sequence_too(tmp_path, capsys):
    """Table 2's baseline takes its decoding from the Hyper-SET head: inspect draws it the same way."""
    from test_registry_tasks import build_mim_folder

    folder = build_mim_folder(tmp_path / "looped", "looped-transformer")
    png = tmp_path / "digit.png"
    PIL.Image.fromarray(np.full((8, 8), 128, dtype=np.uint8)).save(png)
    out = tmp_path / "inspect"
    argv = ["inspect", str(folder), str(png), "--output_dir", str(out), "--steps", "3"]
    assert cli.main(argv) == 0, capsys.readouterr().err
    report = json.loads((out / "inspect.json").read_text())
    assert report["architecture"] == "LoopedTransformerForMaskedImageModeling"
    assert report["mim"]["panels"] == 3 + 2 and report["mim"]["masked_per_step"][-1] == 0, report["mim"]
    assert (out / "mim_decode_sequence.png").is_file()


def test_inspect_refuses_a_baselines_classifier_naming_what_it_draws(tmp_path, capsys):
    from test_registry_tasks import build_mim_folder

    folder = build_mim_folder(tmp_path / "looped", "looped-transformer")
    config = json.loads((folder / "config.json").read_text())
    config["architectures"] = ["LoopedTransformerForImageClassification"]  # the baseline's classifier
    (folder / "config.json").write_text(json.dumps(config))
    argv = ["inspect", str(folder), str(tmp_path / "digit.png"), "--output_dir", str(tmp_path / "inspect")]
    assert cli.main(argv) == 2
    error = capsys.readouterr().err
    assert "'looped-transformer' model (LoopedTransformerForImageClassification)" in error, error
    assert "the baselines' masked-image-modelling heads" in error, error
