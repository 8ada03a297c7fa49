"""An export publishes no path of the machine the run was trained on: its metrics.json and card show the run's
local paths (`--output_dir`, a local `--dataset` file, ...) by their names (`export.published_run_metrics`), while
the run folder's own metrics.json keeps them as typed."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest

from energyformers.training.card import provenance
from energyformers.training.export import export_model_dir, is_local_path, published_run_metrics

RUN_NAME = "hyperbf-reviews"
DATASET = "reviews.csv"
TEXTS = ["a good film", "a bad plot", "good acting and a good plot", "a bad film", "bad acting"]
# What changes from one run of the same command to the next: the measured times (metrics.json's runtimes and
# throughputs, the wall time), not the numbers the run computes.
TIMING_KEYS = re.compile(r"(runtime|_per_second|wall_time_s)$")


def train_run(machine: Path) -> Path:
    """A tiny HyperBF text run on `machine/data/reviews.csv` into `machine/runs/hyperbf-reviews`, both given as
    absolute paths, as a user types them."""
    from energyformers.training import train

    dataset = machine / "data" / DATASET
    dataset.parent.mkdir(parents=True)
    rows = [f"{TEXTS[i % 5]},{i % 2}" for i in range(40)]
    dataset.write_text("text,label\n" + "\n".join(rows) + "\n")
    run = machine / "runs" / RUN_NAME
    argv = [
        "--model", "hyperbf", "--dataset", str(dataset), "--output_dir", str(run),
        "--config", "hidden_size=16", "num_attention_heads=2", "num_hidden_layers=1", "--max_steps", "1",
        "--batch_size", "8", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
    ]  # fmt: skip
    assert train.main(argv) == 0, argv
    return run


def inspect_run(run: Path) -> None:
    """`energyformers inspect` of the run on its local dataset file, written into the run folder (as the card
    expects it), so its inspect.json records the absolute paths of the folder and of the dataset."""
    from energyformers.training import cli

    dataset = run.parent.parent / "data" / DATASET
    argv = [
        "inspect", run, "--dataset", dataset, "--max_samples", "8", "--output_dir", run, "--overwrite_output_dir",
    ]  # fmt: skip
    assert cli.main([*map(str, argv), "--num_threads", "1"]) == 0, argv


@pytest.fixture(scope="module")
def machines(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    """Two runs of one command on two "machines" (folders of different paths), each inspected and exported beside
    it; with the bytes of each run's metrics.json before its export."""
    found = []
    for name in ("alice", "bob"):
        machine = tmp_path_factory.mktemp(name)
        run = train_run(machine)
        inspect_run(run)
        recorded = (run / "metrics.json").read_bytes()
        exported = export_model_dir(run, machine / "hub" / RUN_NAME)
        found.append({"machine": machine, "run": run, "recorded": recorded, "exported": exported})
    return found


def without_timings(value: Any) -> Any:
    if isinstance(value, dict):
        return {k: without_timings(v) for k, v in value.items() if not TIMING_KEYS.search(k)}
    if isinstance(value, list):
        return [without_timings(item) for item in value]
    return value


def test_an_export_holds_no_path_of_the_training_machine(machines):
    for found in machines:
        assert (found["run"] / "inspect.json").is_file() and (found["exported"] / "inspect.json").is_file()
        for path in sorted(found["exported"].rglob("*")):
            if path.is_file():  # every file, weights and figures too
                data = path.read_bytes()
                assert str(found["machine"]).encode() not in data, (path.name, str(found["machine"]))
                assert str(found["machine"].parent).encode() not in data, (path.name, str(found["machine"]))


def test_the_card_and_metrics_name_the_local_folder_and_file_by_their_names(machines):
    exported = machines[0]["exported"]
    metrics = json.loads((exported / "metrics.json").read_text())
    command = metrics["recipe"]["command"]
    assert f"--dataset {DATASET} --output_dir {RUN_NAME} --config " in command, command
    assert metrics["arguments"]["run"]["output_dir"] == RUN_NAME, metrics["arguments"]["run"]
    assert metrics["dataset"] == metrics["arguments"]["data"]["dataset"] == DATASET, metrics["dataset"]
    assert metrics["local_paths"] == {"--dataset": DATASET, "--output_dir": RUN_NAME}, metrics["local_paths"]
    card = (exported / "README.md").read_text()
    assert f"* Command: `{command}`" in card, card
    said = "* Local paths of the machine it was trained on are shown by their names: "
    assert f"{said}`--dataset {DATASET}`, `--output_dir {RUN_NAME}`" in card, card
    assert f"* Data: **{DATASET}**. A local file or folder of the machine it was trained on" in card, card


def test_the_exported_inspect_report_names_the_model_and_the_dataset_by_their_names(machines, tmp_path):
    """The copy of inspect.json names the model by the exported folder's name, else by its Hub id, and the local
    dataset by its file name; the run folder's own report keeps the paths inspect recorded."""
    found = machines[0]
    local = json.loads((found["run"] / "inspect.json").read_text())
    assert local["model_dir"] == str(found["run"]), local["model_dir"]
    assert local["accuracy"]["dataset"] == str(found["machine"] / "data" / DATASET), local["accuracy"]
    published = json.loads((found["exported"] / "inspect.json").read_text())
    assert published["model_dir"] == RUN_NAME, published["model_dir"]
    assert published["accuracy"]["dataset"] == DATASET, published["accuracy"]
    assert published["inputs"] == f"{DATASET} (test, first batch)", published["inputs"]
    named = export_model_dir(found["run"], tmp_path / RUN_NAME, repo_id="org/hyperbf-reviews")
    model_dir = json.loads((named / "inspect.json").read_text())["model_dir"]
    assert model_dir == "org/hyperbf-reviews", model_dir


def test_the_run_folders_own_metrics_json_keeps_the_paths_as_typed(machines):
    for found in machines:
        text = (found["run"] / "metrics.json").read_bytes()
        assert text == found["recorded"], found["run"]
        metrics = json.loads(text)
        assert metrics["arguments"]["run"]["output_dir"] == str(found["run"]), metrics["arguments"]["run"]
        assert metrics["dataset"] == str(found["machine"] / "data" / DATASET), metrics["dataset"]
        assert "local_paths" not in metrics, metrics["local_paths"]


def test_runs_trained_in_different_folders_publish_the_same_card_and_metrics(machines):
    first, second = (found["exported"] for found in machines)
    metrics = [
        without_timings(json.loads((folder / "metrics.json").read_text())) for folder in (first, second)
    ]
    differing = sorted(
        key for key in metrics[0].keys() | metrics[1].keys() if metrics[0].get(key) != metrics[1].get(key)
    )
    assert differing == [], {key: (metrics[0].get(key), metrics[1].get(key)) for key in differing}
    reports = [(folder / "inspect.json").read_bytes() for folder in (first, second)]
    assert reports[0] == reports[1], [
        (a, b) for a, b in zip(reports[0].decode().splitlines(), reports[1].decode().splitlines()) if a != b
    ]
    cards = [re.sub(r"\* Wall time \(s\): .*", "", (f / "README.md").read_text()) for f in (first, second)]
    assert cards[0] == cards[1], [
        (a, b) for a, b in zip(cards[0].splitlines(), cards[1].splitlines()) if a != b
    ]


def test_an_export_of_an_export_publishes_the_same_metrics(machines, tmp_path):
    """What an export shows by its name stays known as local (the card still says so) when it is exported again,
    as `push` of an exported folder does."""
    exported = machines[0]["exported"]
    again = export_model_dir(exported, tmp_path / RUN_NAME)
    assert (again / "metrics.json").read_bytes() == (exported / "metrics.json").read_bytes()
    assert (again / "README.md").read_text() == (exported / "README.md").read_text()


@pytest.mark.parametrize(
    ("value", "local"),
    [
        ("sudoku", False),  # a built-in
        ("org/name", False),  # a Hub id
        ("data.csv", False),  # a file where the command ran: nothing of the machine beyond it
        ("runs/base", False),
        ("/home/alice/data.csv", True),
        ("~/data.csv", True),
        ("./data.csv", True),
        ("../data.csv", True),
        ("home/alice/data.csv", True),  # more parts than a Hub id has
        ("C:\\Users\\alice\\data.csv", True),
        ("hf://datasets/org/name", False),
    ],
)
def test_which_recorded_values_are_local_paths(value, local):
    assert is_local_path(value) == local, value


def test_a_local_checkpoint_is_named_as_a_local_folder_wherever_the_export_is_made(tmp_path):
    """`--from_pretrained /abs/folder` and `--flag=PATH` are shown by their names; the card calls the checkpoint a
    local folder although no folder of that name exists where it is rendered (not a Hub link)."""
    base = "/home/alice/runs/hyperbf-base"
    metrics = {
        "dataset": "sudoku",
        "recipe": {
            "command": f"energyformers train --from_pretrained={base} --dataset sudoku --output_dir /home/alice/out",
            "from_pretrained": base,
            "resumed_from": "/home/alice/.out.work/checkpoint-3",
        },
        "arguments": {"model": {"from_pretrained": base}, "run": {"output_dir": "/home/alice/out"}},
        "warnings": [f"{base}: its tokenizer is kept"],
    }
    published = published_run_metrics(metrics)
    assert published["recipe"] == {
        "command": "energyformers train --from_pretrained=hyperbf-base --dataset sudoku --output_dir out",
        "from_pretrained": "hyperbf-base",
        "resumed_from": "checkpoint-3",
    }, published["recipe"]
    assert published["warnings"] == ["hyperbf-base: its tokenizer is kept"], published["warnings"]
    assert "/home/alice" not in json.dumps(published), published
    assert provenance(published, "`sudoku`") == (
        "This model is a fine-tuned version of `hyperbf-base` on `sudoku`."
    ), provenance(published, "`sudoku`")


def test_the_output_dir_is_shown_by_its_name_also_when_short_and_relative():
    """`--output_dir` is the run folder whatever its spelling: a short relative one (`runs/base`, which as another
    path argument would be published as typed) is shown by its name too, while a short `--dataset` is kept."""
    metrics = {
        "dataset": "data.csv",
        "recipe": {"command": "energyformers train --dataset data.csv --output_dir runs/base"},
        "arguments": {"data": {"dataset": "data.csv"}, "run": {"output_dir": "runs/base"}},
    }
    published = published_run_metrics(metrics)
    command = published["recipe"]["command"]
    assert command == "energyformers train --dataset data.csv --output_dir base", command
    arguments = published["arguments"]
    assert arguments == {"data": {"dataset": "data.csv"}, "run": {"output_dir": "base"}}, arguments
    assert published["local_paths"] == {"--output_dir": "base"}, published["local_paths"]


def test_column_names_and_other_names_are_kept_as_recorded():
    """Only the path-valued arguments (`--dataset`, `--from_pretrained`, `--output_dir`, ...) are spelled as paths;
    a column name, a metric name or a `--config` value with several `/` parts is a name and is published as
    recorded (in the arguments, the columns read and the command), while an absolute path anywhere else is still
    shown by its name; a column name is kept even when spelled as one."""
    column, label, metric = "reviews/2024/body", "/labels/by/annotator", "eval/top/accuracy"
    override = "hub_name=org/sub/model"
    argv = [
        "--dataset", "/home/alice/data/reviews.csv", "--text_column", column, f"--label_column={label}",
        "--metric_for_best_model", metric, "--config", override, "hidden_size=16", "--output_dir", "runs/a/b",
    ]  # fmt: skip
    metrics = {
        "dataset": "/home/alice/data/reviews.csv",
        "recipe": {
            "command": "energyformers train " + " ".join(argv),
            "config_overrides": {"hub_name": "org/sub/model"},
        },
        "arguments": {
            "model": {"config": [override, "hidden_size=16"]},
            "data": {"dataset": "/home/alice/data/reviews.csv", "text_column": column, "label_column": label},
            "run": {"output_dir": "runs/a/b", "metric_for_best_model": metric},
        },
        "columns": {"text_column": column, "label_column": label},
        "warnings": ["/home/alice/data/extra.csv"],
    }
    published = published_run_metrics(metrics)
    command = published["recipe"]["command"]
    assert command == (
        f"energyformers train --dataset reviews.csv --text_column {column} --label_column={label} "
        f"--metric_for_best_model {metric} --config {override} hidden_size=16 --output_dir b"
    ), command
    arguments = published["arguments"]
    data = arguments["data"]
    assert data == {"dataset": "reviews.csv", "text_column": column, "label_column": label}, data
    assert arguments["run"] == {"output_dir": "b", "metric_for_best_model": metric}, arguments
    assert arguments["model"] == {"config": [override, "hidden_size=16"]}, arguments
    assert published["columns"] == metrics["columns"], published["columns"]
    assert published["recipe"]["config_overrides"] == {"hub_name": "org/sub/model"}, published["recipe"]
    local = published["local_paths"]
    assert local == {"--dataset": "reviews.csv", "--output_dir": "b"}, local
    assert published["warnings"] == ["extra.csv"], published["warnings"]


def test_a_token_in_a_command_shlex_cannot_split_is_redacted_too():
    """A hand-edited command with an unbalanced quote (not what `train` records) is published with its paths as
    quoted above, and still without its token."""
    metrics = {"recipe": {"command": "energyformers train --hub_token hf_SECRET --run_name 'it"}}
    command = published_run_metrics(metrics)["recipe"]["command"]
    assert command == "energyformers train --hub_token <HUB_TOKEN> --run_name 'it", command
