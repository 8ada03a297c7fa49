"""Preprocessing that is saved next to the model: a PIL image processor, an offline-trained tokenizer, or
the fixed one-token-per-cell tokenizer of Sudoku grids.

All load back with `AutoImageProcessor` / `AutoTokenizer` from the output folder, which is what
`pipeline(...)` uses, so inference sees exactly the training-time preprocessing.
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import numpy as np
import PIL.Image
from tokenizers import Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast, ViTImageProcessorPil

from ..tokenizer_fit import TOKENIZER_CONFIG_NAME
from .weights import read_json_object

# PAD = 0 so zero-padding and the padding id agree; [SEP] closes each text of a sentence pair
SPECIAL_TOKENS = ["[PAD]", "[UNK]", "[CLS]", "[SEP]"]


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


# Modes whose `convert("RGB")` clips: values above 255 become white (and negative ones black).
CLIPPED_MODES = ("I", "I;16", "I;16B", "I;16L", "I;16N", "F")


def to_rgb(image: Any) -> PIL.Image.Image:
    """A PIL image of any mode (L, P, RGBA, CMYK, I;16, ...) or a uint8 array → an RGB PIL image, by PIL's
    `convert("RGB")`: what `pipeline("image-classification")` (`load_image`) and the saved processor
    (`do_convert_rgb`) do, so training, `evaluate`, `predict` and the pipeline see the same pixels. 16/32-bit grey
    (`CLIPPED_MODES`) is clipped at 255 by it, as by transformers' run_image_classification.py: such data is
    rescaled to 8 bit before training (`clipped_image_modes` finds it)."""
    if isinstance(image, np.ndarray):
        image = PIL.Image.fromarray(image)
    return image if image.mode == "RGB" else image.convert("RGB")


def clipped_image_modes(dataset: Any, limit: int = 2000) -> dict[str, int]:
    """{mode: count} of the images of `dataset` (a split with an `image` column, or a DatasetDict) whose mode
    `to_rgb` clips (`CLIPPED_MODES`), among the first `limit` of each split. Reads the file headers only, not the
    pixels; a file that has none PIL knows is an `UnreadableImage` naming it (`data.unreadable_image`)."""
    import io

    from datasets import Image

    from .data import unreadable_image

    splits = dataset.items() if hasattr(dataset, "items") else [("given", dataset)]
    found: dict[str, int] = {}
    for name, split in splits:
        rows = split.select(range(min(limit, len(split)))).cast_column("image", Image(decode=False))
        for i, item in enumerate(rows.with_format(None)["image"]):
            source = io.BytesIO(item["bytes"]) if item.get("bytes") else item["path"]
            try:
                image = PIL.Image.open(source)  # lazy: the header gives the mode
            except Exception as err:  # not an image at all: named now rather than when a batch reads it
                raise unreadable_image(item, f"image {i} of the {name} split", err) from err
            with image:
                if image.mode in CLIPPED_MODES:
                    found[image.mode] = found.get(image.mode, 0) + 1
    return found


def clipped_modes_warning(found: dict[str, int]) -> str | None:
    """The one-line warning about `clipped_image_modes`' result; None when there are no such images."""
    if not found:
        return None
    modes = ", ".join(f"{count} of mode {mode}" for mode, count in sorted(found.items()))
    return (
        f"images of 16/32-bit grey modes ({modes}): they are converted to RGB as pipeline() converts them, which "
        "clips every value above 255 to white; rescale them to 8 bit first, with one scale for the whole dataset "
        "(e.g. Image.fromarray((numpy.asarray(im) // 257).astype('uint8')) for the full 16-bit range)"
    )


def pair_separator_refusal(data: Any, tokenizer: Any, model: str) -> str | None:
    """The one-line refusal when `data` (a normalised `DatasetDict`) holds sentence pairs (`text_pair`) and
    `tokenizer`, a model folder's, has no separator token: a tokenizer trained before `[SEP]` was one of its special
    tokens encodes a pair as `[CLS] A B`, the two texts run together. None otherwise. `model` names the folder as
    the command's arguments do (`--from_pretrained DIR`, or DIR)."""
    if not any("text_pair" in split.column_names for split in data.values()):
        return None
    return no_separator_refusal(tokenizer, model, "use single texts (--text_column only)")


def no_separator_refusal(tokenizer: Any, model: str, single: str) -> str | None:
    """The one-line refusal of sentence pairs for `tokenizer`, a model folder's, when it has no separator token
    (`pair_separator_refusal`'s, for inputs that are not a dataset); None when it has one. `single` says how the
    command takes single texts instead."""
    if getattr(tokenizer, "sep_token", None) is not None:
        return None
    return (
        f"{model}: its tokenizer has no separator token ([SEP]), so it cannot read sentence pairs (the two texts "
        f"would run together); train a model from scratch on the pairs, or {single}"
    )


# The `Dataset.set_transform` callables are instances of module-level classes rather than closures: DataLoader
# workers started by spawn (the macOS and Windows default) receive the dataset, transform included, pickled.
@dataclass
class ImageTransform:
    """`Dataset.set_transform` callable: batch of {image, label} → {pixel_values, labels} through `processor`."""

    processor: Any

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        pixels = self.processor([to_rgb(im) for im in batch["image"]], return_tensors="pt")["pixel_values"]
        return {"pixel_values": pixels, "labels": batch["label"]}


def image_transform(processor: ViTImageProcessorPil) -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function: batch of {image, label} → {pixel_values, labels} on the fly."""
    return ImageTransform(processor)


def train_tokenizer(
    texts: Iterable[str], *, vocab_size: int = 8000, max_length: int = 128, algorithm: str = "wordpiece"
) -> PreTrainedTokenizerFast:
    """Train a lower-cased WordPiece (or BPE) tokenizer on `texts`, offline, with [PAD]/[UNK]/[CLS]/[SEP].

    Every encoding starts with [CLS] (the classifier's pooled token); a sentence pair is "[CLS] A [SEP] B [SEP]"
    (as BERT's, which run_glue's pairs are tokenized with); no token_type_ids are emitted: the separators mark
    the boundary.

    The same texts give the same tokens with the same ids in every process, so runs with the same seed train the
    same model. WordPiece needs `train_wordpiece` for that; 'bpe' (which nothing here uses) has no word-continuing
    prefix, so its trainer starts from the characters alone, which it numbers sorted, and breaks its ties alike
    in every process: its ids are left as trained.
    """
    if algorithm == "wordpiece":
        tokenizer = train_wordpiece(list(texts), vocab_size)
    elif algorithm == "bpe":
        tokenizer = bert_tokenizer(models.BPE(unk_token="[UNK]"), decoders.BPEDecoder())
        trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, min_frequency=2)
        tokenizer.train_from_iterator(texts, trainer)
    else:
        raise ValueError(f"tokenizer algorithm={algorithm!r}; expected 'wordpiece' or 'bpe'")
    special = [(token, tokenizer.token_to_id(token)) for token in ("[CLS]", "[SEP]")]
    tokenizer.post_processor = processors.TemplateProcessing(
        single="[CLS] $A", pair="[CLS] $A [SEP] $B:1 [SEP]:1", special_tokens=special
    )
    return wrap_tokenizer(tokenizer, max_length)


def bert_tokenizer(model: Any, decoder: Any) -> Tokenizer:
    """An untrained `tokenizers.Tokenizer` of `model` with BERT's lower-casing normalizer and pre-tokenizer."""
    tokenizer = Tokenizer(model)
    tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
    tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
    tokenizer.decoder = decoder
    return tokenizer


def train_wordpiece(texts: list[str], vocab_size: int) -> Tokenizer:
    """The WordPiece `tokenizers.Tokenizer` trained on `texts` (pairs seen at least twice), with `SPECIAL_TOKENS`
    and no post-processor: the same tokens with the same ids in every process.

    The `tokenizers` trainer merges the most frequent pair of tokens first and breaks ties by the tokens' ids, and
    it numbers the word-continuing characters ("##e") in the order of a hash map that each process seeds at
    random. Left alone, ties are broken differently from one process to the next: other ids, and, where tied
    pairs overlap ("preg"+"##nant" or "pregn"+"##ant") or tie at the `vocab_size` cut, other tokens. So a first
    pass without merges (vocab_size=0) collects the characters, and the training declares them, sorted, after the
    special tokens, which the trainer numbers first and in the order given; `canonical_wordpiece` then numbers the
    result.
    """
    probe = bert_tokenizer(models.WordPiece(unk_token="[UNK]"), decoders.WordPiece())
    probe_trainer = trainers.WordPieceTrainer(
        vocab_size=0, special_tokens=SPECIAL_TOKENS, show_progress=False
    )
    probe.train_from_iterator(texts, probe_trainer)  # no progress bar: the training proper shows one
    # without merges the vocabulary is the characters ("e") and the word-continuing characters ("##e"): numbered
    # in this order, each sorted, as the trainer numbers them when its hash map happens to yield them sorted
    characters = set(probe.get_vocab(with_added_tokens=False)) - set(SPECIAL_TOKENS)
    initial = sorted(characters, key=lambda token: (len(token), token))
    trained = bert_tokenizer(models.WordPiece(unk_token="[UNK]"), decoders.WordPiece())
    trainer = trainers.WordPieceTrainer(
        vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS + initial, min_frequency=2
    )
    trained.train_from_iterator(texts, trainer)
    return canonical_wordpiece(trained)


def canonical_wordpiece(trained: Tokenizer) -> Tokenizer:
    """`trained` (a WordPiece tokenizer without post-processor) with its vocabulary numbered canonically:
    `SPECIAL_TOKENS` 0, 1, ... in that order, then every other token sorted by string; `SPECIAL_TOKENS` are its only
    added tokens.

    Greedy longest-match WordPiece depends on the set of tokens only (and on the unknown token, the
    continuing-subword prefix and the longest word, kept from `trained`): every text splits into the same tokens
    as with `trained`; only their ids change.
    """
    vocab = trained.get_vocab(with_added_tokens=False)
    # by string: an order that depends on the set of tokens alone, not on the order the trainer found them in
    ordered = SPECIAL_TOKENS + sorted(token for token in vocab if token not in SPECIAL_TOKENS)
    model = trained.model
    tokenizer = Tokenizer(
        models.WordPiece(
            {token: index for index, token in enumerate(ordered)},
            unk_token=model.unk_token,
            continuing_subword_prefix=model.continuing_subword_prefix,
            max_input_chars_per_word=model.max_input_chars_per_word,
        )
    )
    tokenizer.normalizer, tokenizer.pre_tokenizer = trained.normalizer, trained.pre_tokenizer
    tokenizer.decoder = trained.decoder
    # not `trained`'s added tokens: `train_wordpiece` declares the characters as special tokens for the training
    tokenizer.add_special_tokens(SPECIAL_TOKENS)
    return tokenizer


def wrap_tokenizer(tokenizer: Tokenizer, max_length: int) -> PreTrainedTokenizerFast:
    """The transformers tokenizer of a `tokenizers.Tokenizer` that `train_tokenizer` trained (or one read back
    from its `to_str()`): its special tokens, length and input names."""
    # a tokenizer trained before [SEP] was a special token has none: naming it would add it to the vocabulary
    sep = {"sep_token": "[SEP]"} if tokenizer.token_to_id("[SEP]") is not None else {}
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        **sep,
        model_max_length=max_length,
        model_input_names=["input_ids", "attention_mask"],
    )


@dataclass
class TextTransform:
    """`Dataset.set_transform` callable: batch of {text, label} (and `text_pair`, the second text of sentence-pair
    data) → ids truncated at `max_length`; padding is the collator's."""

    tokenizer: Any
    max_length: int

    def __call__(self, batch: dict[str, list]) -> dict[str, Any]:
        pair = batch.get("text_pair")
        encoded = self.tokenizer(batch["text"], pair, truncation=True, max_length=self.max_length)
        return {
            "input_ids": encoded["input_ids"],
            "attention_mask": encoded["attention_mask"],
            "labels": batch["label"],
        }


def text_transform(
    tokenizer: PreTrainedTokenizerFast, max_length: int
) -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function: batch of {text, label} → truncated ids; padding is the collator's."""
    return TextTransform(tokenizer, max_length)


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


def _cells(batch: dict[str, list]) -> dict[str, Any]:
    return {"input_ids": batch["input_ids"], "labels": batch["labels"]}


def cells_transform() -> Callable[[dict[str, list]], dict[str, Any]]:
    """`Dataset.set_transform` function of the token-classification built-ins: the cells already are the ids,
    so a batch of {input_ids, labels, givens} → {input_ids, labels} as plain int lists (the collator makes
    int64 tensors)."""
    return _cells


# ------------------------------------------------------------------------------ loading a saved processor
# Files a processor may consist of; export copies them when present. The ones *required* are the input type's
# `processor_files` in `energyformers.INPUT_TYPES`.
PROCESSOR_FILES = (
    "preprocessor_config.json",
    "processor_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "special_tokens_map.json",
    "added_tokens.json",
    "vocab.txt",
    "vocab.json",
    "merges.txt",
    "chat_template.jinja",
)


def processor_kind(processor_class: str) -> str:
    """The processor's name in messages: AutoImageProcessor -> "image processor", AutoTokenizer -> "tokenizer"."""
    return " ".join(re.findall(r"[A-Z][a-z]*", processor_class.removeprefix("Auto"))).lower()


# The text a loaded tokenizer is tried on: a Sudoku cell tokenizer reads digits only, any other reads it too.
PROBE_TEXT = "0"


def one_line(err: BaseException) -> str:
    """An exception's message on one line (the commands' contract), its type where it has none."""
    return " ".join(str(err).split()) or type(err).__name__


def load_processor(
    model_dir: str | os.PathLike, config: dict[str, Any], *, mim: bool = False, build_missing: bool = False
) -> Any:
    """The processor saved with the model in `model_dir` (a folder, or a Hub repo id), loaded as a user of the folder
    loads it, and tried once on a probe input. Shared by predict, inspect, export, push, evaluate and
    `train --from_pretrained`, so a folder whose processor files are broken is refused, naming the file, before any
    of them runs the model or writes anything.

    `config` is the model's config.json as a dict. The processor is the input type's `processor_class`
    (`energyformers.INPUT_TYPES`): an image processor (`AutoImageProcessor`, the PIL backend), whose pixel values of
    a probe image must have the model's channels and image size (a processor without its `size` resizes to
    transformers' default, which the model does not take), or a tokenizer (`AutoTokenizer`), which must tokenize a
    probe text. With `mim`, a masked-image-modelling head's image tokenizer (`energyformers.mim.load_vq_tokenizer`),
    whose codebook and grid must fit the model; None when the folder has none (the tokenizer is optional in an
    export; the commands that need it word its absence themselves). With `build_missing`, an image model's folder
    (or Hub repo) without a preprocessor_config.json gets the processor training builds (`build_image_processor`
    of the config) instead of a refusal, as `evaluate` and `train --from_pretrained` take such a folder; a present
    file is loaded and tried all the same, and a missing tokenizer is refused either way.

    FileNotFoundError for a processor file that is missing, ValueError (`TokenizerMismatchError` for an image
    tokenizer that does not fit) naming the file and what is wrong with it."""
    folder = Path(model_dir).expanduser()
    local = folder.is_dir()  # else a Hub repo id: its files are the loader's to fetch and report
    if local:
        model_dir = folder  # `~` expanded for the loaders too
    if mim:
        return load_image_tokenizer(model_dir, folder, local, config)
    from energyformers import INPUT_TYPES

    input_type = config.get("input_type", "image")
    processor_class = INPUT_TYPES[input_type].processor_class
    image = processor_class == "AutoImageProcessor"
    if local:
        missing = [name for name in INPUT_TYPES[input_type].processor_files if not (folder / name).is_file()]
        if missing and image and build_missing:
            return built_image_processor(model_dir, config)
        if missing:
            kind = processor_kind(processor_class)
            raise FileNotFoundError(
                f"{model_dir}: missing {kind} file(s) {missing}; save the {kind} into the model folder "
                "(processor.save_pretrained(model_dir)) so the model can preprocess its inputs."
            )
        for name in PROCESSOR_FILES:
            if name.endswith(".json") and (folder / name).is_file():
                read_json_object(folder / name)
    if image:
        path = folder / "preprocessor_config.json"
        return load_image_processor(model_dir, path, config, build_missing=build_missing and not local)
    return load_tokenizer(model_dir, folder, local)


def built_image_processor(model_dir: str | os.PathLike, config: dict[str, Any]) -> ViTImageProcessorPil:
    """`load_processor(build_missing=True)` of an image model saved without an image processor: the one training
    builds from the config; a ValueError naming the folder when the config takes none (num_channels=1)."""
    try:
        return build_image_processor(SimpleNamespace(**config))
    except ValueError as err:
        raise ValueError(
            f"{model_dir}: no image processor saved (preprocessor_config.json) and none can be built from its "
            f"config ({one_line(err)})"
        ) from None


def load_image_processor(
    model_dir: str | os.PathLike, path: Path, config: dict[str, Any], *, build_missing: bool = False
) -> Any:
    """`load_processor` of an image model: `path` is its preprocessor_config.json, named in every refusal. With
    `build_missing` (a Hub repo), a repo the loader finds no such file in gets `built_image_processor`."""
    import transformers

    again = "save the image processor again (processor.save_pretrained(model_dir))"
    try:
        processor = transformers.AutoImageProcessor.from_pretrained(model_dir, backend="pil")
    except Exception as err:  # a local file is valid JSON: whatever the loader fails on is in its fields
        if build_missing and isinstance(err, OSError):  # a Hub repo without the file
            return built_image_processor(model_dir, config)
        if not Path(
            model_dir
        ).is_dir():  # a Hub repo: not found, offline, no such file; nothing to save again
            raise OSError(f"{model_dir}: cannot load its image processor ({one_line(err)})") from None
        raise ValueError(f"{path}: AutoImageProcessor cannot load it ({one_line(err)}); {again}") from None
    size = config.get("image_size")
    pair = isinstance(size, (list, tuple)) and len(size) == 2
    height, width = (size, size) if isinstance(size, int) else tuple(size) if pair else (None, None)
    channels = config.get("num_channels", 3)
    # a probe of the model's own size, which a processor that resizes and one that does not (do_resize=False, for
    # inputs of the model's size) both must give back at that size; grey for a one-channel model
    side_h, side_w = height or 8, width or 8
    # (h·w·3,) → (h, w, 3)
    pixels = (np.arange(side_h * side_w * 3).reshape(side_h, side_w, 3) % 256).astype(np.uint8)
    probe = PIL.Image.fromarray(pixels).convert("L" if channels == 1 else "RGB")
    try:
        values = np.asarray(processor([probe], return_tensors="np")["pixel_values"])
    except Exception as err:  # a field of the wrong type (image_mean "abc", ...) fails only on an image
        raise ValueError(
            f"{path}: the image processor fails on an image ({one_line(err)}); {again}"
        ) from None
    expected = (channels, height, width)
    if all(isinstance(n, int) for n in expected) and tuple(values.shape[1:]) != expected:
        got = "×".join(str(n) for n in values.shape[1:])
        raise ValueError(
            f"{path}: turns an image into {got} pixel values and the model takes "
            f"{'×'.join(str(n) for n in expected)} (config.json num_channels, image_size); {again} with the "
            "model's size"
        )
    if not np.isfinite(values).all():
        raise ValueError(f"{path}: gives non-finite pixel values (a zero in image_std?); {again}")
    return processor


def load_tokenizer(model_dir: str | os.PathLike, folder: Path, local: bool) -> Any:
    """`load_processor` of a text or Sudoku model: tokenizer.json read alone first (so a broken one is named as
    such), then `AutoTokenizer` on the folder, whose remaining input is tokenizer_config.json."""
    import transformers

    again = "save the tokenizer again (tokenizer.save_pretrained(model_dir))"
    if local:
        try:
            Tokenizer.from_file(str(folder / "tokenizer.json"))
        except Exception as err:  # the tokenizers library raises a bare Exception
            raise ValueError(
                f"{folder / 'tokenizer.json'}: not a tokenizer the tokenizers library reads ({one_line(err)}); {again}"
            ) from None
    path = folder / "tokenizer_config.json"
    try:
        tokenizer = transformers.AutoTokenizer.from_pretrained(model_dir)
    except Exception as err:  # tokenizer.json reads: what the loader fails on is the config's
        if not local:  # a Hub repo: not found, offline, no such file; nothing to save again
            raise OSError(f"{model_dir}: cannot load its tokenizer ({one_line(err)})") from None
        raise ValueError(
            f"{path}: AutoTokenizer cannot load the tokenizer ({one_line(err)}); {again}"
        ) from None
    try:
        tokenizer([PROBE_TEXT], truncation=True, padding=tokenizer.pad_token is not None)
    except Exception as err:  # e.g. a model_max_length that is no number fails only on a text
        raise ValueError(f"{path}: the tokenizer fails on a text ({one_line(err)}); {again}") from None
    return tokenizer


def load_image_tokenizer(
    model_dir: str | os.PathLike, folder: Path, local: bool, config: dict[str, Any]
) -> Any:
    """`load_processor` of a masked-image-modelling head: its image tokenizer's files (JSON and safetensors headers)
    read one by one, then the tokenizer loaded and its codebook and grid checked against the model."""
    from safetensors import safe_open

    from energyformers.mim import TokenizerMismatchError, check_tokenizer_fits, load_vq_tokenizer

    from .export import vq_tokenizer_files

    path = folder / TOKENIZER_CONFIG_NAME
    if local:
        if not path.is_file():
            return None
        read_json_object(path)
        for name in vq_tokenizer_files(folder):
            if name.endswith(".json"):
                read_json_object(folder / name)
            elif name.endswith(".safetensors"):
                try:
                    with safe_open(str(folder / name), framework="numpy"):
                        pass
                except Exception as err:  # safetensors' SafetensorError has no public base class
                    raise ValueError(
                        f"{folder / name}: cannot be read ({one_line(err)}); the file is truncated or corrupt: "
                        "save the image tokenizer again"
                    ) from None
    try:
        tokenizer = load_vq_tokenizer(model_dir)
    except FileNotFoundError:
        if not local:  # a Hub repo without an image tokenizer
            return None
        raise
    except Exception as err:  # its files read: what the loader fails on is in the settings
        raise ValueError(
            f"{path}: the image tokenizer does not load ({one_line(err)}); save it again (PatchKMeansTokenizer / "
            "VQGANTokenizer .save_pretrained(model_dir))"
        ) from None
    try:
        check_tokenizer_fits(tokenizer.codebook_size, getattr(tokenizer, "grid", None), config)
    except TokenizerMismatchError as err:
        raise TokenizerMismatchError(f"{model_dir}: {err}") from None
    return tokenizer


__all__ = [
    "CLIPPED_MODES",
    "PROBE_TEXT",
    "PROCESSOR_FILES",
    "ImageTransform",
    "TextTransform",
    "bert_tokenizer",
    "build_image_processor",
    "built_image_processor",
    "canonical_wordpiece",
    "cell_tokenizer",
    "cells_transform",
    "clipped_image_modes",
    "clipped_modes_warning",
    "image_transform",
    "load_image_processor",
    "load_image_tokenizer",
    "load_processor",
    "load_tokenizer",
    "no_separator_refusal",
    "one_line",
    "pair_separator_refusal",
    "processor_kind",
    "read_json_object",
    "text_transform",
    "to_rgb",
    "train_tokenizer",
    "train_wordpiece",
    "wrap_tokenizer",
]
