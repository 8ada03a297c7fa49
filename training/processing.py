"""Preprocessing that is saved next to the model: a PIL image processor, an offline-trained tokenizer, or
the fixed one-token-per-cell tokenizer of Sudoku grids.

All load back with `AutoImageProcessor` / `AutoTokenizer` from the output folder, which is what
`pipeline(...)` uses, so inference sees exactly the training-time preprocessing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from typing import Any

import numpy as np
import PIL.Image
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, ViTImageProcessorPil

SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]"]  # PAD = 0 so zero-padding and the padding id agree


def _pair(value: int | list[int] | tuple[int, int]) -> tuple[int, int]:
    return (value, value) if isinstance(value, int) else (int(value[0]), int(value[1]))


def build_image_processor(config: Any) -> ViTImageProcessorPil:
    """PIL-backend processor: any image → RGB, resized to `config.image_size`, scaled to [-1, 1].

    The PIL backend because the default torchvision backend does not import with the CPU torch wheel.
    Images are always converted to RGB (grey digits are replicated): `pipeline` converts every input to
    RGB anyway, so a 3-channel model is the one that works unchanged at inference.
    """
    if getattr(config, "num_channels", 3) != 3:
        raise ValueError(
            f"num_channels={config.num_channels} (an override, or HyperBF's grey preset 'digits'): image models "
            "served here take RGB input, because pipeline('image-classification') converts every image to RGB; "
            "build the config with num_channels=3"
        )
    height, width = _pair(config.image_size)
    return ViTImageProcessorPil(
        size={"height": height, "width": width},
        resample=PIL.Image.Resampling.BILINEAR,
        image_mean=[0.5, 0.5, 0.5],
        image_std=[0.5, 0.5, 0.5],
        do_convert_rgb=True,
    )


def to_rgb(image: Any) -> PIL.Image.Image:
    """A PIL image of any mode (L, P, RGBA, CMYK, I;16, ...) or a uint8 array → an RGB PIL image."""
    if isinstance(image, np.ndarray):
        image = PIL.Image.fromarray(image)
    if image.mode in ("I", "I;16", "I;16B", "I;16L", "F"):
        # 16/32-bit grey would be clipped at 255 by convert("RGB"); rescale it to 8 bits first.
        array = np.asarray(image, dtype=np.float32)
        span = max(float(array.max() - array.min()), 1e-6)
        image = PIL.Image.fromarray(((array - array.min()) * (255.0 / span)).astype(np.uint8))
    return image if image.mode == "RGB" else image.convert("RGB")


def image_transform(processor: ViTImageProcessorPil) -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function: batch of {image, label} → {pixel_values, labels} on the fly."""

    def transform(batch: dict[str, list]) -> dict[str, Any]:
        pixels = processor([to_rgb(im) for im in batch["image"]], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": batch["label"]}

    return transform


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 8000, max_length: int = 128, algorithm: str = "wordpiece"
) -> PreTrainedTokenizerFast:
    """Train a lower-cased WordPiece (or BPE) tokenizer on `texts`, offline, with [PAD]/[UNK]/[CLS].

    Every encoding starts with [CLS] (the classifier's pooled token); no token_type_ids are emitted.
    """
    if algorithm == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token="[UNK]"))
        trainer = trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2
        )
        tokenizer.decoder = decoders.WordPiece()
    elif algorithm == "bpe":
        tokenizer = Tokenizer(models.BPE(unk_token="[UNK]"))
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2)
        tokenizer.decoder = decoders.BPEDecoder()
    else:
        raise ValueError(f"tokenizer algorithm={algorithm!r}; expected 'wordpiece' or 'bpe'")
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.train_from_iterator(texts, trainer)
    cls_id = tokenizer.token_to_id("[CLS]")
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A $B", special_tokens=[("[CLS]", cls_id)]
    )
    return wrap_tokenizer(tokenizer, max_length)


def wrap_tokenizer(tokenizer: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """The transformers tokenizer of a `tokenizers.Tokenizer` that `train_tokenizer` trained (or one read back
    from its `to_str()`): its special tokens, length and input names."""
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        model_max_length=max_length,
        model_input_names=["input_ids", "attention_mask"],
    )


def text_transform(
    tokenizer: PreTrainedTokenizerFast, max_length: int
) -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function: batch of {text, label} → truncated ids; padding is the collator's."""

    def transform(batch: dict[str, list]) -> dict[str, Any]:
        encoded = tokenizer(batch["text"], truncation=True, max_length=max_length)
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": batch["label"],
        }

    return transform


def cell_tokenizer(num_cells: int = 81) -> PreTrainedTokenizerFast:
    """The fixed tokenizer of grid puzzles: one token per character, "0"–"9" → ids 0–9 (0 = blank).

    So a saved Sudoku model folder works with `pipeline("token-classification")` on a puzzle string such as
    "530070000600195000…" (81 characters; "." also means blank, whitespace and line breaks are ignored).
    The vocabulary is exactly the 10 cell values, matching the `sudoku` preset's `vocab_size=10`; there is no
    [UNK] (another character is an error) and no padding token (every puzzle has `num_cells` cells).
    """
    tokenizer = Tokenizer(models.WordLevel(vocab={str(d): d for d in range(10)}, unk_token=None))
    tokenizer.normalizer = normalizers.Sequence(
        [normalizers.Replace(".", "0"), normalizers.Replace(Regex(r"\s+"), "")]
    )
    tokenizer.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tokenizer.decoder = decoders.Fuse()
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=num_cells, model_input_names=["input_ids"]
    )


def cells_transform() -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function of the token-classification built-ins: the cells already are the ids,
    so a batch of {input_ids, labels, givens} → {input_ids, labels} as plain int lists (the collator makes
    int64 tensors)."""

    def transform(batch: dict[str, list]) -> dict[str, Any]:
        return {"input_ids": batch["input_ids"], "labels": batch["labels"]}

    return transform


__all__ = [
    "build_image_processor",
    "cell_tokenizer",
    "cells_transform",
    "image_transform",
    "text_transform",
    "to_rgb",
    "train_tokenizer",
    "wrap_tokenizer",
]
