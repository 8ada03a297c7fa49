"""A masked-image-modelling run given its image tokenizer (`--tokenizer`, or a `--from_pretrained` folder that
carries one): the tokenizer-fitting flags are refused, as they would shape nothing, and a tokenizer whose codebook or
grid does not fit the checkpoint is refused from the folders' JSON files while the arguments are parsed, before
torch is imported (`energyformers.tokenizer_fit`); the torch-time checks stay for what the files do not say."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from fixtures import run_cli_cases
from PIL import Image

from energyformers import HyperSetConfig, HyperSetForMaskedImageModeling
from energyformers.mim import PatchKMeansTokenizer
from energyformers.training import train
from energyformers.training.arguments import parse_arguments

MIM = ["--task", "mim", "--dataset", "digits", "--num_threads", "1", "--max_steps", "1"]


def tokenizer(patch_size: int, codebook_size: int = 16) -> PatchKMeansTokenizer:
    """A (random, seeded) patch codebook of 16 × 16 one-channel images."""
    centroids = torch.rand(codebook_size, patch_size * patch_size, generator=torch.Generator().manual_seed(0))
    return PatchKMeansTokenizer(centroids, patch_size, (16, 16), 1)


def mim_folder(folder: Path, tokenizer_patch_size: int | None = 2) -> Path:
    """A saved tiny masked-image-modelling model of 16 codes on an 8 × 8 grid (digits' 16 × 16 in 2 × 2 patches),
    with an image tokenizer of `tokenizer_patch_size` beside it (2: the model's own grid)."""
    torch.manual_seed(0)
    config = HyperSetConfig.from_preset(
        "mim-1-12-d", hidden_size=16, num_attention_heads=4, intermediate_size=16, time_embedding_dim=16,
        num_iterations=2, vocab_size=17, max_position_embeddings=64,
    )  # fmt: skip
    HyperSetForMaskedImageModeling(config).save_pretrained(folder)
    if tokenizer_patch_size is not None:
        tokenizer(tokenizer_patch_size).save_pretrained(folder)
    return folder


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("mim_given_tokenizer")
    small_grid = root / "small-grid"  # 4 × 4 codes of 4 × 4 patches: not the models' 8 × 8 grid
    tokenizer(4).save_pretrained(small_grid)
    return {
        "fits": mim_folder(root / "fits"),
        "bad-grid": mim_folder(root / "bad-grid", tokenizer_patch_size=4),  # its own tokenizer does not fit
        "small-grid": small_grid,
    }


@pytest.mark.parametrize(
    ("flag", "value", "has"),
    [
        ("codebook_size", "32", "its codebook_size is 16"),
        ("tokenizer_patch_size", "4", "its patch_size is 2"),
        ("tokenizer_fit_samples", "50", "it is fitted already"),
    ],
)
def test_a_fitting_flag_with_a_checkpoint_that_carries_its_tokenizer_is_refused(
    folders, flag, value, has, tmp_path, capsys
):
    """Before, the checkpoint's tokenizer was used and the flag left unread, yet recorded in metrics.json."""
    out = tmp_path / "out"
    argv = [*MIM, "--from_pretrained", str(folders["fits"]), f"--{flag}", value, "--output_dir", str(out)]
    assert train.main(argv) == 2
    err = capsys.readouterr().err.strip()
    expected = (
        f"energyformers train: error: --{flag} {value}: applies only when a tokenizer is fitted, and "
        f"--from_pretrained {folders['fits']} gives one (the checkpoint's tokenizer, which the run uses; {has}); "
        f"drop --{flag}"
    )
    assert err == expected, (err, expected)
    assert not out.exists()


def test_the_fitting_flags_left_alone_record_the_checkpoint_tokenizers_values(folders, tmp_path):
    """The run's recorded arguments (metrics.json) say which codebook it used: the checkpoint's 16 codes of 2 × 2
    patches, not the fitting defaults (64 codes, patch unset)."""
    argv = [*MIM, "--from_pretrained", str(folders["fits"]), "--output_dir", str(tmp_path / "out")]
    data = parse_arguments(argv, "energyformers train", "").data
    assert (data.codebook_size, data.tokenizer_patch_size) == (16, 2), data


def test_a_tokenizer_that_does_not_fit_the_checkpoint_is_refused_before_torch_is_imported(folders, tmp_path):
    """The codebook and grid are in the folders' JSON files: `train` (a checkpoint with `--tokenizer`, or with its
    own tokenizer), `predict` and `inspect` refuse a mismatch from them, in a process that never imports torch."""
    image = tmp_path / "digit.png"
    Image.new("L", (16, 16), 128).save(image)
    fits, bad, small = (str(folders[name]) for name in ("fits", "bad-grid", "small-grid"))
    out = str(tmp_path / "out")
    grid = (
        "the image tokenizer's grid is 4 × 4 = 16 codes, the model has max_position_embeddings=64 positions"
    )
    cases = {
        "train, --tokenizer": (
            ["train", *MIM, "--from_pretrained", fits, "--tokenizer", small, "--output_dir", out],
            f"--tokenizer {small!r} does not fit --from_pretrained {fits!r}: {grid}",  # blames the given one
        ),
        "train, its own tokenizer": (
            ["train", *MIM, "--from_pretrained", bad, "--output_dir", out],
            f"--from_pretrained {bad!r}: {grid}",
        ),
        "predict": (["predict", bad, str(image)], f"{bad}: {grid}"),
        "inspect": (["inspect", bad, str(image), "--output_dir", out], f"{bad}: {grid}"),
    }
    results = run_cli_cases([argv for argv, _ in cases.values()], cwd=tmp_path)
    for (name, (_, fragment)), result in zip(cases.items(), results, strict=True):
        lines = [line for line in result["err"].splitlines() if line.strip()]
        assert result["code"] == 2 and len(lines) == 1 and fragment in lines[0], (name, fragment, result)
        # cumulative: what any case imported shows in every later case's list
        assert result["heavy"] == [], (name, result["heavy"])
    assert not Path(out).exists()


def test_a_checkpoint_whose_weights_do_not_fit_its_config_is_refused(folders, tmp_path, capsys):
    """`train --task mim --from_pretrained` loads every tensor as saved (the model predicts the tokenizer's codes):
    a folder missing one is refused in one line naming it, not trained on with that tensor re-initialised."""
    import shutil

    from safetensors.torch import load_file, save_file

    from energyformers.training import cli

    folder = tmp_path / "missing-one"
    shutil.copytree(folders["fits"], folder)
    weights = load_file(str(folder / "model.safetensors"))
    dropped = sorted(weights)[-1]
    save_file(
        {k: v for k, v in weights.items() if k != dropped},
        str(folder / "model.safetensors"),
        {"format": "pt"},
    )
    out = tmp_path / "out"
    status = cli.main(["train", *MIM, "--from_pretrained", str(folder), "--output_dir", str(out)])
    err = [line for line in capsys.readouterr().err.splitlines() if "error:" in line]
    assert status == 2 and len(err) == 1, (status, err)
    assert "weights do not match" in err[0] and dropped in err[0] and str(folder) in err[0], err
    assert not out.exists()
