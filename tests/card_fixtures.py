"""Small real run folders for the model-card and release tests: `energyformers train` on a few generated Sudoku
puzzles, and the Python blocks of a rendered card."""

from __future__ import annotations

import contextlib
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
from fixtures import tiny_vq_model

from energyformers.training import data, train

# A model small enough to train one step in about a second; its card is what matters here, not its accuracy.
TINY = ["hidden_size=16", "num_attention_heads=2", "intermediate_size=32", "num_iterations=2"]
# Fewer generated puzzles than the built-in's 12,000 (about 20 s to generate): enough for one batch per split.
TINY_SUDOKU_SIZES = {"train": 16, "validation": 8, "test": 8}


def train_sudoku_run(output_dir: Path, model: str = "hyperset") -> Path:
    """A finished `energyformers train --dataset sudoku` run folder (model, tokenizer, metrics.json, card)."""
    argv = [
        "--model", model, "--dataset", "sudoku", "--config", *TINY, "--max_steps", "1", "--batch_size", "8",
        "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0", "--output_dir", str(output_dir),
    ]  # fmt: skip
    assert train.main(argv) == 0, argv
    return output_dir


@contextlib.contextmanager
def tiny_sudoku(cache: Path) -> Iterator[None]:
    """The `sudoku` built-in with `TINY_SUDOKU_SIZES` puzzles, cached in `cache`, which stays named in the
    environment inside the block, so an `energyformers inspect` subprocess reads the same puzzles."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(data, "SUDOKU_SIZES", TINY_SUDOKU_SIZES)
        patch.setenv("ENERGYFORMERS_CACHE", str(cache))
        yield


# A MIM folder's model reads a 4 × 4 grid of codes of 8 × 8 images: 2 × 2 patches (patch k-means, grey) or the
# latents of a VQGAN that halves each side (RGB); [MASK] = the codebook size.
MIM_GRID, MIM_SIDE = 16, 8
# What a MIM run's metrics.json holds; the values are placeholders (the tests read them back, never publish them).
MIM_SCORES = {"masked_token_accuracy": 0.375, "decoded_token_accuracy": 0.3125, "psnr": 12.5, "ssim": 0.5}
MIM_RUN = {
    "model": "hyperset",
    "task": "masked-image-modeling",
    "dataset": "digits",
    "num_parameters": 0,
    "recipe": {"command": "pytest fixture"},
    "test": {**MIM_SCORES, "tokenizer_psnr": 25.0},
}


def build_mim_folder(path: Path, tokenizer_class: str) -> Path:
    """A Hyper-SET masked-image-modelling folder as `energyformers train --task mim` leaves it (tiny random model,
    its image tokenizer, metrics.json): with a `PatchKMeansTokenizer` of grey images or a `VQGANTokenizer` (a tiny
    random diffusers VQModel, downsampling 2) of RGB images."""
    import torch

    import energyformers
    from energyformers.mim import PatchKMeansTokenizer, VQGANTokenizer

    torch.manual_seed(0)
    if tokenizer_class == "PatchKMeansTokenizer":
        centroids = torch.rand(8, 2 * 2, generator=torch.Generator().manual_seed(3))
        tokenizer = PatchKMeansTokenizer(
            centroids, patch_size=2, image_size=(MIM_SIDE, MIM_SIDE), num_channels=1
        )
    else:
        vq_model = tiny_vq_model(sample_size=MIM_SIDE)
        tokenizer = VQGANTokenizer(vq_model)
    config = energyformers.HyperSetConfig.from_preset(
        "cli-mim",
        hidden_size=16,
        intermediate_size=16,
        time_embedding_dim=16,
        num_attention_heads=4,
        num_iterations=2,
        vocab_size=tokenizer.codebook_size + 1,
        max_position_embeddings=MIM_GRID,
    )
    energyformers.HyperSetForMaskedImageModeling(config).save_pretrained(path)
    tokenizer.save_pretrained(path)
    (path / "metrics.json").write_text(json.dumps(MIM_RUN))
    return path


def python_blocks(card_text: str) -> list[str]:
    """The ```python blocks of a card, in order."""
    return re.findall(r"```python\n(.*?)```", card_text, flags=re.S)
