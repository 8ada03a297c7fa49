"""`energyformers predict --text_pairs`: a text classifier trained on sentence pairs is given pairs, each input
`TEXT<TAB>PAIR`, as transformers' text-classification pipeline takes them ({"text", "text_pair"}); the flag is
refused for models that read no text pairs, for an input without a TAB and for a tokenizer without [SEP], before
the model loads; without the flag such a model warns once that it was trained on pairs."""

from __future__ import annotations

import io
import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from test_cli_errors import model_folder
from test_registry_tasks import build_mim_folder
from test_user_data_loading import without_separator

import energyformers
from energyformers import HyperSetConfig, HyperSetForTokenClassification
from energyformers.training import predict, train
from energyformers.training.processing import cell_tokenizer

TEXTS = ["a good film", "a bad plot", "good acting and a good plot", "a bad film", "bad acting"]
# (text, pair) inputs: a pair of the training data, one of other words, and a pair whose second text has a TAB
PAIRS = [
    ("a good film", "a bad plot"),
    ("bad acting", "good acting and a good plot"),
    ("a film", "bad\tplot"),
]
PREFIX = "energyformers predict: error: "


@pytest.fixture(scope="module")
def pair_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny HyperBF run trained on a sentence-pair CSV whose `sentence1` and `sentence2` are read as run_glue
    reads them (detected, no column flag): its metrics.json records both columns."""
    root = tmp_path_factory.mktemp("predict_pairs")
    dataset = root / "pairs.csv"
    rows = [f"{TEXTS[i % 5]},{TEXTS[(i + 2) % 5]},{i % 2}" for i in range(40)]
    dataset.write_text("sentence1,sentence2,label\n" + "\n".join(rows) + "\n")
    run = root / "run"
    argv = [
        "--model", "hyperbf", "--dataset", str(dataset), "--output_dir", str(run), "--config", "hidden_size=16",
        "num_attention_heads=2", "num_hidden_layers=1", "--max_steps", "2", "--batch_size", "8",
        "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0", "--eval_strategy", "no",
    ]  # fmt: skip
    assert train.main(argv) == 0, argv
    columns = json.loads((run / "metrics.json").read_text())["columns"]
    assert columns["text_pair_column"] == "sentence2", columns
    return run


@pytest.fixture
def no_model_loads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail the test if predict gets as far as loading the weights."""

    def loaded(*args, **kwargs):
        raise AssertionError("the model was loaded before the bad input was refused")

    monkeypatch.setattr(predict, "pipeline_model", loaded)


def refusal(
    capsys: pytest.CaptureFixture, argv: list[str], stdin: str | None = None, monkeypatch=None
) -> str:
    """predict's one error line for `argv` (exit status 2), with `stdin` as standard input when given."""
    if stdin is not None:
        monkeypatch.setattr(sys, "stdin", io.StringIO(stdin))
    status = predict.main(argv)
    captured = capsys.readouterr()
    lines = [line for line in captured.err.splitlines() if line.strip()]
    assert status == 2 and len(lines) == 1 and not captured.out, (status, captured.err, captured.out)
    assert lines[0].startswith(PREFIX), lines
    return lines[0][len(PREFIX) :]


def test_predictions_of_pairs_equal_the_pipelines_on_text_and_text_pair(pair_run, capsys, monkeypatch):
    """From the arguments and from stdin, each input split at its first TAB scores as the pipeline scores
    {"text", "text_pair"}; the records carry the input and both texts; the second text changes the scores."""
    from transformers import pipeline

    lines = [f"{text}\t{pair}" for text, pair in PAIRS]
    assert predict.main([str(pair_run), *lines, "--text_pairs", "--json", "--top_k", "2"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err, captured.err
    from_arguments = [json.loads(line) for line in captured.out.splitlines()]
    monkeypatch.setattr(sys, "stdin", io.StringIO("\n".join(lines) + "\n"))
    assert predict.main([str(pair_run), "-", "--text_pairs", "--json", "--top_k", "2"]) == 0
    from_stdin = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert from_stdin == from_arguments, (from_stdin, from_arguments)

    assert energyformers.FAMILIES  # the package registers its models with transformers' auto classes
    pipe = pipeline("text-classification", model=str(pair_run))
    assert [(r["input"], r["text"], r["text_pair"]) for r in from_arguments] == [
        (line, text, pair) for line, (text, pair) in zip(lines, PAIRS)
    ], from_arguments
    for record, (text, pair) in zip(from_arguments, PAIRS):
        expected = pipe({"text": text, "text_pair": pair}, top_k=2, truncation=True)
        alone = pipe(text, top_k=2, truncation=True)
        got = {p["label"]: p["score"] for p in record["predictions"]}
        want = {p["label"]: p["score"] for p in expected}
        single = {p["label"]: p["score"] for p in alone}
        assert got.keys() == want.keys() and [p["label"] for p in record["predictions"]] == [
            p["label"] for p in expected
        ], (record, expected)
        # float32 softmax scores of one computation: equal to its rounding
        assert all(abs(got[k] - want[k]) <= 1e-6 for k in want), (text, pair, got, want)
        # the pair reached the model: the first text alone scores otherwise
        assert max(abs(got[k] - single[k]) for k in want) > 1e-6, (text, pair, got, single)

    # the printed lines show the two texts, with the line's one TAB before the labels
    assert predict.main([str(pair_run), lines[0], "--text_pairs"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 1 and shown[0].split("\t")[0] == "a good film / a bad plot", shown
    tabbed = next(line for line in lines if line.count("\t") > 1)  # a TAB inside the pair: shown as a space
    assert predict.main([str(pair_run), tabbed, "--text_pairs"]) == 0
    shown = capsys.readouterr().out.splitlines()
    assert len(shown) == 1 and shown[0].count("\t") == 1 and shown[0].startswith("a film / bad plot\t"), shown


def test_pairs_are_refused_for_an_input_without_a_tab_naming_its_number(
    pair_run, capsys, monkeypatch, no_model_loads
):
    model = str(pair_run)
    long = "a very long text without any tab in it at all, longer than forty characters"
    said = refusal(capsys, [model, "a\tb", long, "--text_pairs"])
    assert said == (
        f"--text_pairs: input 2 {long[:37] + '...'!r} has no TAB; each input is TEXT<TAB>PAIR (in a shell: "
        "$'first\\tsecond', or one pair per line from stdin with -)"
    ), said
    # from stdin an input is named by its line (1-based), blank lines counted though skipped, as an editor numbers them
    said = refusal(capsys, [model, "-", "--text_pairs"], "\na\tb\n\n \r\nc\td\r\nno tab here\n", monkeypatch)
    assert said.startswith("--text_pairs: line 6 of stdin 'no tab here' has no TAB"), said
    said = refusal(capsys, [model, "a\tb", " \tsecond", "--text_pairs"])
    assert said.startswith("--text_pairs: input 2 ' \\tsecond' has an empty text before the TAB"), said
    said = refusal(capsys, [model, "first\t", "--text_pairs"])
    assert said.startswith("--text_pairs: input 1 'first\\t' has an empty pair after the TAB"), said


@pytest.fixture(scope="module")
def other_models(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, list[str]]]:
    """Models that read no text pairs, each with inputs it takes: an image classifier, a masked-image-modelling
    model and a Sudoku model."""
    from PIL import Image

    root = tmp_path_factory.mktemp("not_pairs")
    image = root / "x.png"
    Image.fromarray(
        (torch.rand(8, 8, 3, generator=torch.Generator().manual_seed(3)) * 255).byte().numpy()
    ).save(image)
    grey = root / "grey.png"
    Image.fromarray((torch.rand(8, 8, generator=torch.Generator().manual_seed(4)) * 255).byte().numpy()).save(
        grey
    )
    torch.manual_seed(0)
    config = HyperSetConfig(
        input_type="sequence", vocab_size=10, max_position_embeddings=81, num_labels=9, hidden_size=16,
        num_attention_heads=2, intermediate_size=16, num_iterations=2,
    )  # fmt: skip
    sudoku = root / "sudoku"
    HyperSetForTokenClassification(config).eval().save_pretrained(sudoku)
    cell_tokenizer(81).save_pretrained(sudoku)
    return {
        "image": (model_folder(root / "image", "hyperset"), [str(image)]),
        "mim": (build_mim_folder(root / "mim", "hyperset"), [str(grey)]),
        "sudoku": (sudoku, ["0" * 81]),
    }


@pytest.mark.parametrize(
    ("kind", "what"),
    [
        ("image", "an image model, which classifies image files (HyperSetForImageClassification)"),
        (
            "mim",
            "a masked-image-modelling model, which reconstructs image files (HyperSetForMaskedImageModeling)",
        ),
        ("sudoku", "a Sudoku model, which takes puzzle strings (HyperSetForTokenClassification)"),
    ],
)
def test_pairs_are_refused_for_a_model_that_reads_no_text_pairs(
    kind, what, other_models, capsys, no_model_loads
):
    folder, inputs = other_models[kind]
    said = refusal(capsys, [str(folder), *inputs, "--text_pairs"])
    assert said == f"--text_pairs: sentence pairs are for text classifiers, and {folder} is {what}", said


def test_pairs_are_refused_for_a_tokenizer_without_a_separator(pair_run, tmp_path, capsys, no_model_loads):
    model = tmp_path / "model"
    shutil.copytree(pair_run, model)
    without_separator(model)
    said = refusal(capsys, [str(model), "a good film\ta bad plot", "--text_pairs"])
    assert said == (
        f"{model}: its tokenizer has no separator token ([SEP]), so it cannot read sentence pairs (the two texts "
        "would run together); train a model from scratch on the pairs, or give single texts (without --text_pairs)"
    ), said


def test_single_texts_to_a_pair_model_warn_once_naming_the_flag(pair_run, tmp_path, capsys):
    """Without --text_pairs a pair model still classifies single texts, with one warning; a model trained on single
    texts (the same folder, its record of the columns without the pair) warns nothing."""
    assert predict.main([str(pair_run), "a good film", "a bad plot"]) == 0
    captured = capsys.readouterr()
    warnings = [line for line in captured.err.splitlines() if line.startswith("warning:")]
    assert warnings == [
        f"warning: {pair_run} was trained on sentence pairs (the columns 'sentence1' and 'sentence2'); each input "
        "is classified as a single text: pass --text_pairs and inputs TEXT<TAB>PAIR to give it pairs"
    ], captured.err
    assert len(captured.out.splitlines()) == 2, captured.out
    single = tmp_path / "single"
    shutil.copytree(pair_run, single)
    metrics = json.loads((single / "metrics.json").read_text())
    metrics["columns"] = {"text_column": "sentence1", "label_column": "label"}
    (single / "metrics.json").write_text(json.dumps(metrics))
    assert predict.main([str(single), "a good film"]) == 0
    captured = capsys.readouterr()
    assert "warning" not in captured.err and len(captured.out.splitlines()) == 1, captured


def warnings_of(captured: pytest.CaptureResult) -> list[str]:
    return [line for line in captured.err.splitlines() if line.startswith("warning:")]


def with_metrics(run: Path, folder: Path, change: dict | None) -> Path:
    """A copy of `run` whose metrics.json has the fields `change` sets (None: no metrics.json at all)."""
    shutil.copytree(run, folder)
    if change is None:
        (folder / "metrics.json").unlink()
    else:
        metrics = json.loads((folder / "metrics.json").read_text())
        (folder / "metrics.json").write_text(json.dumps({**metrics, **change}))
    return folder


@pytest.mark.parametrize(
    ("change", "trained_on"),
    [
        ({"columns": {"text_column": "sentence1", "label_column": "label"}}, "the column 'sentence1'"),
        # a built-in dataset (single texts) records no columns
        ({"columns": None, "dataset": "rotten_tomatoes"}, "the built-in dataset 'rotten_tomatoes'"),
    ],
)
def test_pairs_to_a_single_text_model_warn_once_that_it_was_trained_on_single_texts(
    pair_run, tmp_path, capsys, change, trained_on
):
    """--text_pairs to a model whose run recorded single texts still classifies the pairs, with one warning."""
    single = with_metrics(pair_run, tmp_path / "single", change)
    assert predict.main([str(single), "a good film\ta bad plot", "bad acting\ta film", "--text_pairs"]) == 0
    captured = capsys.readouterr()
    assert warnings_of(captured) == [
        f"warning: {single} was trained on single texts ({trained_on}), not sentence pairs; each pair is "
        "classified as one input, [CLS] TEXT [SEP] PAIR [SEP], which it never saw in training: give single texts "
        "(without --text_pairs)"
    ], captured.err
    assert len(captured.out.splitlines()) == 2, captured.out


def test_pairs_or_single_texts_to_a_model_without_a_run_record_warn_nothing(pair_run, tmp_path, capsys):
    """Without metrics.json what the model was trained on is unknown: neither kind of input is warned about."""
    bare = with_metrics(pair_run, tmp_path / "bare", None)
    for inputs in (["a good film\ta bad plot", "--text_pairs"], ["a good film"]):
        assert predict.main([str(bare), *inputs]) == 0
        captured = capsys.readouterr()
        assert "warning" not in captured.err and len(captured.out.splitlines()) == 1, (inputs, captured)


@pytest.fixture
def hub(monkeypatch: pytest.MonkeyPatch, tmp_path: Path):
    """The Hub stand-in (tests/hub_standin.py, 127.0.0.1 only), online, with an empty Hub cache of this test's own."""
    import transformers.utils.hub
    from hub_standin import STANDIN_TOKEN, HubStandIn
    from huggingface_hub import constants

    with HubStandIn() as server:
        monkeypatch.setattr(constants, "ENDPOINT", server.url)
        template = f"{server.url}/{{repo_id}}/resolve/{{revision}}/{{filename}}"  # downloads' file URLs
        monkeypatch.setattr(constants, "HUGGINGFACE_CO_URL_TEMPLATE", template)
        # transformers' shared HfApi keeps the endpoint it was built with: rebuilt, it asks the stand-in
        monkeypatch.setattr(transformers.utils.hub, "_hf_api", None)
        monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "hub-cache"))
        monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
        monkeypatch.setattr(constants, "HF_TOKEN_PATH", str(tmp_path / "no-token-file"))
        monkeypatch.setenv("HF_TOKEN", STANDIN_TOKEN)
        yield server
        assert server.unhandled == [], f"client used endpoints the stand-in lacks: {server.unhandled}"


def publish(folder: Path, repo_id: str) -> None:
    """Upload `folder`'s model, tokenizer and (where there is one) metrics.json to the stand-in as `repo_id`."""
    from huggingface_hub import HfApi

    api = HfApi()
    api.create_repo(repo_id)
    api.upload_folder(folder_path=str(folder), repo_id=repo_id, ignore_patterns=["README.md", "*.png"])


def test_a_hub_models_run_record_is_read_online_and_offline_from_the_cache(pair_run, tmp_path, hub, capsys):
    """A Hub repo id's metrics.json says what it was trained on, as a local folder's does: read from the Hub, and
    with HF_HUB_OFFLINE=1 from the copy in the cache; a repo without one (no record) warns nothing and fails
    nothing."""
    from huggingface_hub import constants

    publish(pair_run, "org/pairs")
    publish(with_metrics(pair_run, tmp_path / "bare", None), "org/bare")
    pair_warning = (
        "warning: org/pairs was trained on sentence pairs (the columns 'sentence1' and 'sentence2'); each input is "
        "classified as a single text: pass --text_pairs and inputs TEXT<TAB>PAIR to give it pairs"
    )
    outputs = {}
    for offline in (False, True):  # online first: it fills the cache the offline run reads
        constants.HF_HUB_OFFLINE = offline  # the fixture's monkeypatch restores it
        served = len(hub.requests)
        assert predict.main(["org/pairs", "a good film"]) == 0
        captured = capsys.readouterr()
        assert warnings_of(captured) == [pair_warning], (offline, captured.err)
        outputs[offline] = captured.out
        assert predict.main(["org/pairs", "a good film\ta bad plot", "--text_pairs"]) == 0
        assert "warning" not in capsys.readouterr().err
        assert predict.main(["org/bare", "a good film"]) == 0
        captured = capsys.readouterr()
        assert "warning" not in captured.err and len(captured.out.splitlines()) == 1, (offline, captured)
        if offline:
            assert len(hub.requests) == served, hub.requests[served:]  # the cache answered
    assert outputs[True] == outputs[False], outputs
