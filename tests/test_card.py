"""The model card (`training/card.py`, `model_cards/`): what it says of each kind of run, and that its code runs.

Run folders here are real `energyformers train` runs of tiny models on a few generated Sudoku puzzles
(`card_fixtures.py`); the card's snippets are executed on the exported folder, the repo id replaced by its path.
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import re
from collections.abc import Iterator
from pathlib import Path

import pytest
import torch
from card_fixtures import MIM_SIDE, build_mim_folder, python_blocks, tiny_sudoku, train_sudoku_run
from datasets import Dataset, DatasetDict
from fixtures import hyperset_config
from huggingface_hub import ModelCard

from energyformers import HyperSetForImageClassification, HyperSetForSequenceClassification
from energyformers.training.arguments import parse_arguments
from energyformers.training.card import find_template, read_sections
from energyformers.training.export import export_model_dir
from energyformers.training.run_folder import RunResult, run_metrics

REPO = "org/hyperset-sudoku"


@pytest.fixture(scope="module")
def sudoku_runs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Path]]:
    """The run folder of a Hyper-SET Sudoku run, its export (remote code, `REPO` in the snippets) and the run folder
    of the looped-Transformer baseline on the same puzzles."""
    root = tmp_path_factory.mktemp("sudoku")
    with tiny_sudoku(root / "cache"):
        run = train_sudoku_run(root / "hyperset-sudoku")
        yield {
            "run": run,
            "export": export_model_dir(run, root / "export", repo_id=REPO),
            "looped": train_sudoku_run(root / "looped-transformer-sudoku", model="looped-transformer"),
        }


@pytest.mark.parametrize("folder", ["run", "export"])
def test_sudoku_card_reports_the_sudoku_metrics_and_speaks_of_puzzles(sudoku_runs, folder):
    """The run's blank-cell and board accuracy are the card's model-index results and its table; no language (the
    inputs are digits), and none of the text classifier's or the image benchmarks' wording."""
    card = ModelCard.load(sudoku_runs[folder] / "README.md")
    test = json.loads((sudoku_runs["run"] / "metrics.json").read_text())["test"]
    results = {
        (r.metric_name, r.metric_type, r.dataset_split): r.metric_value for r in card.data.eval_results or []
    }
    expected = {
        ("blank-cell accuracy", "accuracy", "test"): test["blank_cell_accuracy"],
        ("board accuracy", "accuracy", "test"): test["board_accuracy"],
    }
    assert results == expected, (results, expected)
    assert card.data.language is None and card.data.metrics == ["accuracy"], card.data
    text = card.text
    row = f"| test | {test['blank_cell_accuracy']:.4f} | {test['board_accuracy']:.4f} |"
    assert "| dataset | split | blank-cell accuracy | board accuracy |" in text and row in text, text
    for wrong in ("No evaluation was recorded", "text classifier", "unknown token", "CIFAR", "macro F1"):
        assert wrong not in text, (wrong, text)
    assert "Palm et al." in text and "81 cells" in text, text
    # no --preset: the run built the family's `cli-sequence` preset (with --config on top), and the card says so
    preset = [line for line in text.splitlines() if line.startswith("* Preset:")]
    assert preset == ["* Preset: cli-sequence"], preset


def test_sudoku_card_snippets_run_on_the_exported_folder(sudoku_runs):
    """Both loading blocks of the exported card run; the remote-code one fills the example puzzle's blanks with the
    pipeline's digits and keeps its givens."""
    folder = sudoku_runs["export"]
    blocks = [
        b.replace(f'"{REPO}"', repr(str(folder))) for b in python_blocks((folder / "README.md").read_text())
    ]
    assert len(blocks) == 2, blocks
    exec(blocks[0], {})  # with the package
    printed = io.StringIO()
    with contextlib.redirect_stdout(printed):
        exec(blocks[1], {})  # the repository's own code (in this process the package is importable too)
    board = printed.getvalue().strip()
    puzzle = re.search(r'puzzle = "(\d{81})"', blocks[1]).group(1)
    assert len(board) == 81 and set(board) <= set("123456789"), board
    assert all(cell == given for cell, given in zip(board, puzzle) if given != "0"), (puzzle, board)


def citation(card_text: str) -> str:
    """The card's BibTeX block."""
    return re.search(r"```bibtex\n(.*?)```", card_text, flags=re.S).group(1).strip()


def test_baseline_card_cites_the_paper_it_reproduces_and_is_not_tagged_energy_based(sudoku_runs):
    """The looped Transformer is the Hyper-SET paper's baseline: its card cites that paper with the entry Hyper-SET's
    own card uses, and it is not tagged as an energy-based model (the families are)."""
    looped, family = (ModelCard.load(sudoku_runs[key] / "README.md") for key in ("looped", "run"))
    assert "energy-based" not in looped.data.tags and "looped-transformer" in looped.data.tags, (
        looped.data.tags
    )
    assert "energy-based" in family.data.tags, family.data.tags
    entry = read_sections(find_template("hyperset.md"))["citation"]
    assert entry.startswith("@misc{hu2025hyperset,"), entry
    assert citation(looped.text).endswith(entry) and citation(family.text) == entry, citation(looped.text)


@pytest.mark.parametrize("tokenizer_class", ["PatchKMeansTokenizer", "VQGANTokenizer"])
def test_mim_card_snippets_run_as_written(tokenizer_class, tmp_path, monkeypatch):
    """Every code block of an exported MIM card runs in a fresh namespace, given only an image file at the path it
    names: nothing is left for the reader to define (the first block builds the images it encodes)."""
    import huggingface_hub
    from PIL import Image

    folder = export_model_dir(
        build_mim_folder(tmp_path / "run", tokenizer_class), tmp_path / "export", repo_id="org/hyperset-mim"
    )
    monkeypatch.setattr(huggingface_hub, "snapshot_download", lambda repo_id: str(folder))
    monkeypatch.chdir(tmp_path)  # the pipeline block saves reconstruction.png into the working folder
    image = tmp_path / "image.png"
    # an image of another size and mode than the tokenizer's: the snippet converts and resizes it
    Image.radial_gradient("L").convert("RGB").save(image)
    text = (folder / "README.md").read_text()
    blocks = [
        block.replace('"org/hyperset-mim"', repr(str(folder))).replace("path/to/image.png", str(image))
        for block in python_blocks(text)
    ]
    assert len(blocks) == 4, blocks
    scopes = [{} for _ in blocks]
    for block, scope in zip(blocks, scopes):
        exec(
            block, scope
        )  # in this process the package is importable; the remote-code blocks load the folder's code
    channels = 1 if tokenizer_class == "PatchKMeansTokenizer" else 3
    reconstruction = scopes[0]["reconstruction"]
    assert reconstruction.shape == (1, channels, MIM_SIDE, MIM_SIDE), reconstruction.shape
    assert (tmp_path / "reconstruction.png").is_file()


def test_mim_card_names_every_generated_code_file_of_the_folder(tmp_path):
    """The card's list of files generated from the package sources is exactly the folder's Python files: the
    modeling code and the pipeline's (`pipeline_mim.py`, `mim.py`)."""
    folder = export_model_dir(build_mim_folder(tmp_path / "run", "PatchKMeansTokenizer"), tmp_path / "export")
    text = " ".join((folder / "README.md").read_text().split())  # the template wraps its sentences
    listed = re.search(r"((?:`\w+\.py`, )*`\w+\.py`) in this repository are generated", text)
    assert listed, text
    names = sorted(name.strip("`") for name in listed.group(1).split(", "))
    assert names == sorted(p.name for p in folder.glob("*.py")), (
        names,
        sorted(p.name for p in folder.glob("*.py")),
    )
    assert {"pipeline_mim.py", "mim.py"} <= set(names), names


def recorded_preset(argv: list[str], model: torch.nn.Module, task: str, columns: list[str]) -> str | None:
    """`metrics.json`'s "preset" of a run of `argv` that built `model` from data with `columns`."""
    args = parse_arguments([*argv, "--output_dir", "unused"], "energyformers train", "")
    data = DatasetDict({"train": Dataset.from_dict({column: [0] for column in columns})})
    result = RunResult(
        loop="train", args=args, model=model, data=data, task=task, epochs=1.0, learning_rate=1e-3,
        world_size=1, global_step=1, train={}, eval={}, test={}, log_history=[], start_time=0.0,
    )  # fmt: skip
    return run_metrics(result)["preset"]


@pytest.mark.parametrize(
    ("argv", "family", "input_type", "task", "expected"),
    [
        (["--dataset", "digits"], "hyperset", "image", "image-classification", "cli-image"),
        (["--dataset", "rotten_tomatoes"], "hyperset", "sequence", "text-classification", "cli-sequence"),
        (["--model", "vit", "--dataset", "digits"], "vit", "image", "image-classification", "cli-image"),
        (["--dataset", "digits", "--task", "mim"], "hyperset", "sequence", "masked-image-modeling", "cli-mim"),
        (["--dataset", "digits", "--preset", "cifar10-s"], "hyperset", "image", "image-classification", "cifar10-s"),
        (
            ["--dataset", "digits", "--from_pretrained", "runs/demo-hyperset"],
            "hyperset", "image", "image-classification", "from runs/demo-hyperset's config",
        ),
    ],
)  # fmt: skip
def test_metrics_record_the_preset_the_model_was_built_from(argv, family, input_type, task, expected):
    """Without `--preset` the CLI builds the family's `cli-<input type>` preset (`cli-mim` for masked image
    modelling): metrics.json, and the card's "Preset:" line rendered from it, name that preset, not "none"."""
    torch.manual_seed(0)
    if family == "vit":
        from transformers import ViTConfig, ViTForImageClassification

        config = ViTConfig(hidden_size=8, num_hidden_layers=1, num_attention_heads=2, intermediate_size=8,
                           image_size=4, patch_size=2, num_labels=2)  # fmt: skip
        model = ViTForImageClassification(config)
    else:
        head = HyperSetForImageClassification if input_type == "image" else HyperSetForSequenceClassification
        model = head(hyperset_config(input_type))
    columns = ["image", "label"] if input_type == "image" else ["text", "label"]
    preset = recorded_preset(argv, model, task, columns)
    assert preset == expected, f"{argv}: recorded preset {preset!r}, expected {expected!r}"


# ------------------------------------------------------------------------------------------ sentence pairs

PAIR_REPO = "org/hyperbf-pairs"
PAIR_TEXTS = ["a good film", "a bad plot", "good acting and a good plot", "a bad film", "bad acting"]


@pytest.fixture(scope="module")
def text_exports(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Exports (remote code, `PAIR_REPO` in the snippets) of two tiny HyperBF text runs on one sentence-pair CSV:
    "pairs" read `sentence1` and `sentence2` as run_glue does (no column flag: detected), "single" only
    `sentence1`."""
    from energyformers.training import train

    root = tmp_path_factory.mktemp("pairs")
    dataset = root / "pairs.csv"
    rows = [f"{PAIR_TEXTS[i % 5]},{PAIR_TEXTS[(i + 2) % 5]},{i % 2}" for i in range(40)]
    dataset.write_text("sentence1,sentence2,label\n" + "\n".join(rows) + "\n")
    folders = {}
    for name, columns in (("pairs", []), ("single", ["--text_column", "sentence1"])):
        run = root / f"run-{name}"
        argv = [
            "--model", "hyperbf", "--dataset", str(dataset), *columns, "--output_dir", str(run),
            "--config", "hidden_size=16", "num_attention_heads=2", "num_hidden_layers=1", "--max_steps", "1",
            "--batch_size", "8", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
        ]  # fmt: skip
        assert train.main(argv) == 0, argv
        folders[name] = export_model_dir(run, root / f"export-{name}", repo_id=PAIR_REPO)
    return folders


def test_a_sentence_pair_models_card_shows_the_pair_call_and_a_single_text_models_card_does_not(text_exports):
    """The card of a model trained on pairs passes both texts to the pipeline, as its training encoded them, and
    says so; the card of a single-text model on the same data keeps the single call. Both blocks run."""
    pair_call = 'print(pipe({"text": "a gripping, well acted film", "text_pair": "the acting is good"}))'
    single_call = 'print(pipe("a gripping, well acted film"))'
    said = "It classifies sentence pairs (the columns `sentence1` and `sentence2` of its training data)"
    for name, shown, hidden in (("pairs", pair_call, single_call), ("single", single_call, pair_call)):
        folder = text_exports[name]
        text = (folder / "README.md").read_text()
        blocks = [b.replace(f'"{PAIR_REPO}"', repr(str(folder))) for b in python_blocks(text)]
        assert len(blocks) == 2 and shown in blocks[1] and hidden not in text, (name, blocks)
        assert (said in text) == (name == "pairs"), (name, text)
        exec(blocks[0], {})  # with the package
        printed = io.StringIO()
        with contextlib.redirect_stdout(printed):
            exec(blocks[1], {})  # the repository's own code (in this process the package is importable too)
        # one prediction of one of the two labels: transformers' pipeline gives a pair's as a dict, a text's in a list
        output = ast.literal_eval(printed.getvalue().strip())
        predictions = [output] if name == "pairs" else output
        assert [p["label"] for p in predictions] in (["0"], ["1"]), (name, output)
    # what the pair card reads: the run's record of the columns it read
    assert json.loads((text_exports["pairs"] / "metrics.json").read_text())["columns"] == {
        "text_column": "sentence1",
        "text_pair_column": "sentence2",
        "label_column": "label",
    }


@pytest.mark.parametrize(
    ("columns", "expected"),
    [
        ('"sentence2"', 'columns="sentence2" is not an object'),
        ('{"text_pair_column": 2}', "columns holds a value"),
    ],
)
def test_a_metrics_record_of_columns_of_the_wrong_shape_is_refused_naming_the_file(
    tmp_path, columns, expected
):
    from energyformers.training.card import read_run_metrics

    path = tmp_path / "metrics.json"
    path.write_text(f'{{"columns": {columns}}}')
    with pytest.raises(ValueError, match=re.escape(f"{path}: ")) as refused:
        read_run_metrics(path)
    assert expected in str(refused.value), str(refused.value)


@pytest.mark.parametrize(
    ("dataset", "local_paths", "expected"),
    [
        ("pairs.csv", {"--dataset": "pairs.csv"}, "hyperbf-pairs"),  # a local file as an export names it
        ("/home/alice/data/reviews.tsv", {}, "hyperbf-reviews"),  # as the run folder recorded it
        ("/home/alice/data/reviews", {}, "hyperbf-reviews"),  # a local folder: its name
        ("rotten_tomatoes", {}, "hyperbf-rotten_tomatoes"),  # built-in
        ("stanfordnlp/imdb", {}, "hyperbf-imdb"),  # a Hub dataset id: its repository's name
    ],
)
def test_the_default_model_name_shows_a_local_data_file_by_its_stem(
    text_exports, dataset, local_paths, expected
):
    """Without a repo id or a run name, the card names the model `<model>-<dataset>`:
    a local data file by its stem (no `.csv`), a local folder by its name, a Hub dataset by its repository's name (a
    model name holds no "/"), a built-in as given."""
    from energyformers.training.export import inspect_model_dir, render_model_card

    info = inspect_model_dir(text_exports["single"])
    assert info.get("name") is None, info.get("name")
    metrics = {k: v for k, v in info["metrics"].items() if k != "local_paths"}
    metrics.update({"dataset": dataset, **({"local_paths": local_paths} if local_paths else {})})
    card = render_model_card({**info, "metrics": metrics}, num_parameters=1)
    assert card.data.model_name == expected, (dataset, card.data.model_name)


# Labels a dataset may hold (class folder names, CSV values) that raw would add Markdown or HTML to the card: a
# heading and a link, an HTML tag, a line of its own, backticks
HOSTILE_LABELS = {
    0: "cat",
    1: "dog** ## **[Download the verified weights](https://evil.example)",
    2: "<img src=x onerror=alert(1)>",
    3: "ok\n## Verified by Hugging Face\n[Download](https://evil.example/x.exe)",
    4: "a `quoted` ``name``",
    5: " cat ",  # Markdown strips one space at each end of a code span that starts and ends with one
}


def test_labels_are_shown_as_typed_and_add_no_markdown_or_html_to_the_card(tmp_path):
    """Each label of the card's "with labels:" sentence is a code span: read by a CommonMark parser, the card has
    the blocks of a card with plain labels (no heading, HTML block or paragraph of the labels' own), and the
    labels' sentence holds their exact text as code and nothing else of theirs (no link, HTML, line break)."""
    from markdown_it import MarkdownIt  # CommonMark, as the Hub renders cards (transformers -> typer -> rich)
    from test_export import build_model_dir

    from energyformers import FAMILIES
    from energyformers.training.export import inspect_model_dir, render_model_card

    model_type = sorted(FAMILIES)[0]
    parsed = {}
    for name, labels in (("hostile", HOSTILE_LABELS), ("plain", {i: f"label{i}" for i in HOSTILE_LABELS})):
        folder = build_model_dir(
            tmp_path / name, model_type, "AutoModelForImageClassification", "image", labels=labels
        )
        text = str(render_model_card(inspect_model_dir(folder), num_parameters=1))
        parsed[name] = MarkdownIt("commonmark").parse(text)
    blocks = {name: [t.type for t in tokens] for name, tokens in parsed.items()}
    assert blocks["hostile"] == blocks["plain"], blocks
    sentence = {
        name: next(t for t in tokens if t.type == "inline" and "with labels:" in t.content).children or []
        for name, tokens in parsed.items()
    }
    kinds = {name: [c.type for c in children] for name, children in sentence.items()}
    assert kinds["hostile"] == kinds["plain"], kinds  # the labels add no link, HTML, emphasis or line break
    code = {
        name: [c.content for c in children if c.type == "code_inline"] for name, children in sentence.items()
    }
    shown = [hostile for hostile, plain in zip(*code.values()) if plain.startswith("label")]
    escaped = [label.replace("\n", "\\n") for label in HOSTILE_LABELS.values()]
    assert shown == escaped, (shown, escaped)
