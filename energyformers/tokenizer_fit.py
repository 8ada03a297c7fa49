"""Whether an image tokenizer fits a masked-image-modelling model, from numbers alone: the codebook size and code
grid a saved tokenizer records (its `vq_tokenizer_config.json`) against the model's config (a config object or its
config.json as a dict). Kept apart from `energyformers.mim`, which imports torch, so that the command lines can
refuse a mismatched folder while they parse their arguments; `energyformers.mim` re-exports the error and the two
functions.

It also spells, once for the package and without torch, the names the masked-image-modelling code shares: the task
(`MIM_TASK`) and its heads' Auto class (`MIM_AUTO_CLASS`), which the training CLI checks while it parses."""

from __future__ import annotations

import math
from typing import Any

# The file of a saved image tokenizer's settings (its class, codebook size, grid), beside the model's config.json.
# Here, with no torch, so the command lines' argument checks name and read it before torch loads.
TOKENIZER_CONFIG_NAME = "vq_tokenizer_config.json"
# Beside it, the codebook of a `PatchKMeansTokenizer` (a VQGAN is saved in a subfolder instead).
TOKENIZER_WEIGHTS_NAME = "vq_tokenizer.safetensors"
# The task of the masked-image-modelling heads: `MaskedImageModelingPipeline`'s name in transformers'
# `PIPELINE_REGISTRY` (`pipeline("masked-image-modeling", model=folder)`), `energyformers.INPUT_TYPES`' task of
# `MIM_AUTO_CLASS`, the training CLI's `--task` and the task a run's metrics.json records. Not transformers'
# "fill-mask", which is masked *language* modelling (text in, `AutoModelForMaskedLM`).
MIM_TASK = "masked-image-modeling"
# The Auto class the masked-image-modelling heads register with (`…ForMaskedImageModeling`).
MIM_AUTO_CLASS = "AutoModelForMaskedImageModeling"


class TokenizerMismatchError(ValueError):
    """An image tokenizer whose codes do not fit a masked-image-modelling model: another codebook size than the
    model predicts, or another grid than the model's positions."""


def saved_tokenizer_numbers(settings: dict) -> tuple[int | None, tuple[int, int] | None]:
    """(codebook size, grid) as a saved `vq_tokenizer_config.json` records them, without loading the tokenizer;
    None for what it does not record (a VQGAN's grid follows the image size, so it has none)."""
    codebook = settings.get("codebook_size")
    codebook = codebook if isinstance(codebook, int) and not isinstance(codebook, bool) else None
    size, patch = settings.get("image_size"), settings.get("patch_size")
    grid = None
    if (
        isinstance(size, (list, tuple))
        and len(size) == 2
        and all(isinstance(v, int) for v in size)
        and isinstance(patch, int)
        and patch >= 1
    ):
        grid = (size[0] // patch, size[1] // patch)
    return codebook, grid


def check_tokenizer_fits(codebook_size: int | None, grid: tuple[int, int] | None, config: Any) -> None:
    """Raise `TokenizerMismatchError` unless a tokenizer of `codebook_size` codes on a `grid` (rows, columns) of
    codes fits the masked-image-modelling model of `config` (a config object or its config.json as a dict): the
    same codebook (vocab_size = codes + [MASK]) and one code per position (max_position_embeddings), laid out as
    the model's square board where its positions are "sincos-2d". A grid of another size still runs (a shorter
    sequence takes the first positions), but every code then sits at another position than in training, so the
    numbers it gives are meaningless: refused. None skips that comparison (a tokenizer whose grid follows the
    image size is given a square one by the pipeline, so the positions must then be a square number)."""

    def field(name: str) -> Any:
        return config.get(name) if isinstance(config, dict) else getattr(config, name, None)

    vocab, positions, layout = (
        field("vocab_size"),
        field("max_position_embeddings"),
        field("position_embedding_type"),
    )
    if codebook_size is not None and isinstance(vocab, int) and codebook_size != vocab - 1:
        raise TokenizerMismatchError(
            f"the image tokenizer has codebook_size={codebook_size}, the model predicts {vocab - 1} codes "
            f"(vocab_size={vocab}, the last id [MASK]); they must be equal: use the tokenizer the model was "
            "trained with"
        )
    if not isinstance(positions, int):
        return
    side = math.isqrt(positions)
    board = f" (a {side} × {side} grid)" if side * side == positions else ""
    model = f"the model has max_position_embeddings={positions} positions{board}"
    if grid is None:
        if side * side != positions:
            raise TokenizerMismatchError(
                f"the image tokenizer encodes a square grid of codes, and {model}, which is no square number: "
                "use a tokenizer with the model's grid"
            )
        return
    rows, columns = grid
    if rows * columns != positions or (layout == "sincos-2d" and rows != columns):
        raise TokenizerMismatchError(
            f"the image tokenizer's grid is {rows} × {columns} = {rows * columns} codes, {model}; the grid must "
            "match the model's positions: use the tokenizer the model was trained with"
        )
