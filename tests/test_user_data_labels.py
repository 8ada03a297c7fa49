"""Labels of user data, as transformers' run_glue.py treats them, and the inputs that go with them.

* A validation or test split whose labels are all -1 (unlabelled, as GLUE's test splits ship) is left out with a
  notice and carved out of train like a missing split; a split with some -1 labels is refused, naming it.
* Integer labels are classes by their sorted distinct values (stars {1, 5} → two classes named "1" and "5");
  `predict` names them, `evaluate` maps them the same way and scores what training scored.
* `--vocab_size` beside `--from_pretrained` is refused; `--max_length` is honoured up to the checkpoint's positions.
* Word-level token-classification data (run_ner's `tokens` + `ner_tags`) is refused, pointing to the Python recipe;
  sentence-level data that also carries such columns trains on its text and label.
* A text model given the name of an existing file refuses it and names `- < file`.
"""

from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pytest
from datasets import ClassLabel, Dataset, DatasetDict, Features, Sequence, Value
from fixtures import cli_config

from energyformers.training import evaluate, predict, train
from energyformers.training.data import DataError, load_data, normalize

QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm"]
GOOD = ["great", "superb", "lovely", "wonderful"]
BAD = ["boring", "awful", "poor", "dull"]


def reviews(n: int, seed: int, labels: tuple[int, int] = (1, 5)) -> tuple[list[str], list[int]]:
    """`n` synthetic reviews of 4-9 words, bad ones labelled `labels[0]`, good ones `labels[1]` (alternating)."""
    rng = np.random.default_rng(seed)
    texts, ys = [], []
    for i in range(n):
        words = GOOD if i % 2 else BAD  # the first word decides the class, so a text has one label
        rest = rng.choice([*words, "film", "the", "plot"], size=rng.integers(3, 9))
        texts.append(" ".join([str(rng.choice(words)), *rest]))
        ys.append(labels[i % 2])
    return texts, ys


def write_csv(path: Path, texts: list[str], labels: list[int]) -> None:
    path.write_text("text,label\n" + "".join(f"{t},{y}\n" for t, y in zip(texts, labels)))


def run_cli(*argv: object) -> int:
    return train.main([str(a) for a in argv])


# ------------------------------------------------------------------------- unlabelled splits (no training)


@pytest.mark.parametrize("typed", ["int", "ClassLabel"])
def test_an_unlabelled_test_split_is_left_out_and_carved_from_train(typed: str) -> None:
    """GLUE on the Hub: a ClassLabel column whose test split is all -1; a CSV folder gives plain integers."""
    texts, labels = reviews(60, seed=0, labels=(0, 1))
    feature = ClassLabel(names=["neg", "pos"]) if typed == "ClassLabel" else Value("int64")
    features = Features({"text": Value("string"), "label": feature})
    raw = DatasetDict(
        train=Dataset.from_dict({"text": texts[:40], "label": labels[:40]}, features=features),
        validation=Dataset.from_dict({"text": texts[40:50], "label": labels[40:50]}, features=features),
        test=Dataset.from_dict({"text": texts[50:], "label": [-1] * 10}, features=features),
    )
    dd = normalize(raw)
    sizes = {k: len(v) for k, v in dd.items()}
    assert sizes == {"train": 36, "validation": 10, "test": 4}, sizes  # 10 % of train became the test split
    assert set(dd["test"]["label"]) <= {0, 1} and set(dd["test"]["text"]) <= set(texts[:40]), dd["test"][:]
    assert dd.notices == [
        "split 'test' is unlabelled (all 10 labels are -1): left out; the test split is carved out of train "
        "(10 %) instead"
    ], dd.notices


@pytest.mark.parametrize("split", ["train", "validation", "test"])
def test_a_split_with_some_unlabelled_examples_is_refused_naming_it_and_the_count(split: str) -> None:
    texts, labels = reviews(30, seed=1, labels=(0, 1))
    columns = {s: {"text": texts[i * 10 : i * 10 + 10], "label": labels[i * 10 : i * 10 + 10]} for i, s in
               enumerate(("train", "validation", "test"))}  # fmt: skip
    columns[split]["label"][:3] = [-1, -1, -1]
    raw = DatasetDict({s: Dataset.from_dict(c) for s, c in columns.items()})
    with pytest.raises(DataError, match=rf"split '{split}' has 3 of 10 examples labelled -1 \(unlabelled\)"):
        normalize(raw)


def test_an_unlabelled_train_split_is_refused() -> None:
    raw = DatasetDict(train=Dataset.from_dict({"text": ["a", "b"] * 5, "label": [-1] * 10}))
    with pytest.raises(DataError, match=r"the train split is unlabelled: all 10 labels .* are -1"):
        normalize(raw)


# ------------------------------------------------------------------------- integer labels (no training)


@pytest.mark.parametrize(
    ("values", "names"),
    [((1, 5), ["1", "5"]), ((0, 2), ["0", "2"]), ((3, 0), ["0", "3"]), ((0, 1), ["0", "1"])],
)
def test_integer_labels_are_classes_by_their_sorted_distinct_values(values: tuple, names: list[str]) -> None:
    texts, labels = reviews(40, seed=2, labels=values)
    dd = normalize(DatasetDict(train=Dataset.from_dict({"text": texts, "label": labels})))
    assert dd["train"].features["label"].names == names
    for split in dd.values():  # each example keeps its own class: its value's position in `names`
        expected = [names.index(str(labels[texts.index(t)])) for t in split["text"]]
        assert split["label"] == expected, (split["label"], expected)


def test_a_models_class_names_map_integer_labels_when_every_value_is_one() -> None:
    """evaluate passes the model's labels: a model of six classes "0".."5" scores {1, 5} data on ids 1 and 5,
    and labels that are not all among the model's fall back to the data's own classes (check_labels refuses)."""
    texts, labels = reviews(40, seed=3, labels=(1, 5))
    raw = DatasetDict(train=Dataset.from_dict({"text": texts, "label": labels}))
    dd = normalize(raw, class_names=[str(i) for i in range(6)])
    assert dd["train"].features["label"].names == [str(i) for i in range(6)]
    assert set(dd["train"]["label"]) | set(dd["test"]["label"]) == {1, 5}
    assert normalize(raw, class_names=["0", "1"])["train"].features["label"].names == ["1", "5"]


# ------------------------------------------------------------------------- word-level token classification


@pytest.mark.parametrize("flags", [{}, {"text_column": "tokens", "label_column": "ner_tags"}])
def test_word_level_tagging_data_is_refused_pointing_to_the_python_recipe(flags: dict) -> None:
    features = Features(
        {"tokens": Sequence(Value("string")), "ner_tags": Sequence(ClassLabel(names=["O", "PER"]))}
    )
    rows = {"tokens": [["Ada", "wrote"], ["it", "ran"]] * 5, "ner_tags": [[1, 0], [0, 0]] * 5}
    raw = DatasetDict(train=Dataset.from_dict(rows, features=features))
    with pytest.raises(DataError) as caught:
        normalize(raw, **flags)
    message = str(caught.value)
    for part in (
        "'tokens'",
        "'ner_tags'",
        "Sudoku",
        'docs/usage.md, "Token classification from your own data"',
    ):
        assert part in message, message
    usage = (Path(__file__).parents[1] / "docs" / "usage.md").read_text()
    assert "## Token classification from your own data" in usage


def test_sentence_level_data_that_also_has_word_level_columns_trains_on_its_text() -> None:
    texts, labels = reviews(40, seed=3, labels=(0, 1))
    rows = {
        "text": texts,
        "label": labels,
        "tokens": [t.split() for t in texts],
        "pos_tags": [[i % 3 for i in range(len(t.split()))] for t in texts],
    }
    dd = normalize(DatasetDict(train=Dataset.from_dict(rows)), seed=0)
    assert {s: dd[s].column_names for s in dd} == {
        s: ["text", "label"] for s in ("train", "validation", "test")
    }
    assert sorted(t for s in dd for t in dd[s]["text"]) == sorted(texts)


def test_a_text_column_of_word_lists_says_to_join_them() -> None:
    raw = DatasetDict(train=Dataset.from_dict({"words": [["a", "b"]] * 10, "label": [0, 1] * 5}))
    with pytest.raises(DataError, match="one string per example, not a list of words: join them first"):
        normalize(raw, text_column="words")


# ------------------------------------------------------------------------- one CLI run, then its folder


@pytest.fixture(scope="module")
def stars_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """(dataset folder, model folder): stars {1, 5} in train.csv/validation.csv and an unlabelled test.csv (-1),
    trained for two steps."""
    root = tmp_path_factory.mktemp("stars")
    data = root / "data"
    data.mkdir()
    texts, labels = reviews(100, seed=4)
    write_csv(data / "train.csv", texts[:70], labels[:70])
    write_csv(data / "validation.csv", texts[70:90], labels[70:90])
    write_csv(data / "test.csv", texts[90:], [-1] * 10)
    out = root / "model"
    rc = run_cli(
        "--model", "hyperbf", "--dataset", data, "--output_dir", out, "--config", *cli_config("hyperbf"),
        "--vocab_size", "64", "--max_length", "16", "--num_predictions", "0", *QUICK,
    )  # fmt: skip
    assert rc == 0
    return data, out


def test_the_run_trains_on_the_labelled_splits_with_the_datas_classes(stars_run, capsys) -> None:
    data, out = stars_run
    capsys.readouterr()
    config = json.loads((out / "config.json").read_text())
    assert config["id2label"] == {"0": "1", "1": "5"} and config["label2id"] == {"1": 0, "5": 1}, config
    metrics = json.loads((out / "metrics.json").read_text())
    assert any("split 'test' is unlabelled (all 10 labels are -1)" in w for w in metrics["warnings"]), metrics
    # the test split scored is carved out of the labelled train split: 10 % of its 70 examples
    assert 0.0 <= metrics["test"]["accuracy"] <= 1.0, metrics["test"]
    assert load_data(str(data))["test"].num_rows == 7
    assert predict.main([str(out), "great superb film", "--top_k", "2", "--json"]) == 0
    shown = json.loads(capsys.readouterr().out)
    assert {p["label"] for p in shown["predictions"]} == {"1", "5"}, shown


def test_evaluate_maps_the_labels_as_training_did_and_scores_the_same(stars_run, capsys) -> None:
    """The test split is unlabelled: without --split, evaluate scores the validation split, as the run did."""
    data, out = stars_run
    capsys.readouterr()
    assert evaluate.main([str(out), "--dataset", str(data), "--json"]) == 0
    captured = capsys.readouterr()
    report = json.loads(captured.out)
    trained = json.loads((out / "metrics.json").read_text())
    assert (report["split"], report["num_samples"]) == ("validation", 20), report
    assert report["metrics"]["eval_accuracy"] == trained["eval"]["accuracy"], (
        report["metrics"],
        trained["eval"],
    )
    assert "warning: the test split of --dataset" in captured.err, captured.err


def test_from_pretrained_refuses_vocab_size_and_a_longer_max_length(stars_run, tmp_path, capsys) -> None:
    data, out = stars_run
    common = ["--from_pretrained", out, "--dataset", data, "--output_dir", tmp_path / "ft", *QUICK]
    assert run_cli(*common, "--vocab_size", "64") == 2
    err = capsys.readouterr().err
    assert (
        "--vocab_size 64: applies only when a tokenizer is trained" in err and "drop --vocab_size" in err
    ), err
    positions = json.loads((out / "config.json").read_text())["max_position_embeddings"]
    assert run_cli(*common, "--max_length", positions + 1) == 2
    err = capsys.readouterr().err
    assert f"--max_length {positions + 1}: larger than the max_position_embeddings {positions}" in err, err
    assert not (tmp_path / "ft").exists()


def test_from_pretrained_truncates_at_a_shorter_max_length(stars_run, tmp_path) -> None:
    from transformers import AutoConfig, AutoTokenizer

    from energyformers.training.setup import preprocessing

    data, out = stars_run
    ft = tmp_path / "ft"
    assert (
        run_cli("--from_pretrained", out, "--dataset", data, "--output_dir", ft, "--max_length", 5, *QUICK)
        == 0
    )
    tokenizer = AutoTokenizer.from_pretrained(ft)
    assert tokenizer.model_max_length == 5
    # what training and evaluate feed the model: the saved tokenizer's length, below the positions
    transform, _ = preprocessing("text-classification", AutoConfig.from_pretrained(ft), tokenizer)
    texts, labels = reviews(8, seed=5)
    lengths = [len(ids) for ids in transform({"text": texts, "label": labels})["input_ids"]]
    assert max(lengths) == 5 and max(len(tokenizer(t)["input_ids"]) for t in texts) > 5, lengths


# ------------------------------------------------------------------------- predict: a file name is no text


def test_predict_refuses_a_file_name_for_a_text_model_and_names_stdin(
    stars_run, tmp_path, monkeypatch, capsys
):
    _, out = stars_run
    monkeypatch.chdir(tmp_path)
    Path("reviews.txt").write_text("great superb film\nboring awful plot\n")
    capsys.readouterr()
    assert predict.main([str(out), "reviews.txt"]) == 2
    err = capsys.readouterr().err
    assert "'reviews.txt' is a file" in err and "- < reviews.txt" in err, err
    # stdin: one text per line, and a line that names a file is a text
    monkeypatch.setattr("sys.stdin", io.StringIO("great superb film\nreviews.txt\n"))
    assert predict.main([str(out), "-"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert [line.split("\t")[0] for line in lines] == ["great superb film", "reviews.txt"], lines
