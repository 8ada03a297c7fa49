"""`energyformers train` (Trainer CLI) and `energyformers predict`: short CI versions of the end-to-end checks.

Every family in `energyformers.FAMILIES` trains for two steps on a tiny subset of an image and a text
dataset, and the saved folder reloads through `pipeline` in this process and in a fresh one. Runs go
in-process through `train.main(argv)` (no interpreter start-up per run), except the SIGTERM one.
"""

from __future__ import annotations

import importlib.metadata
import json
import os
import platform
import subprocess
import sys
import textwrap
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pytest
import torch
from fixtures import (
    TINY_SPLITS,
    assert_close_to_scale,
    cli_architecture,
    cli_config,
    labelled,
    require_dataset,
    rounding,
    run_stopped_runs,
)
from PIL import Image
from safetensors.torch import load_file
from transformers import AutoConfig, AutoModelForImageClassification, pipeline

import energyformers
from energyformers.training import predict, train
from energyformers.training.arguments import UsageError, parse_overrides
from energyformers.training.data import load_data

FAMILIES = sorted(energyformers.FAMILIES)
QUICK = ["--max_steps", "2", "--per_device_train_batch_size", "8", "--num_threads", "1", "--disable_tqdm"]
SUBSET = [*TINY_SPLITS, "--num_predictions", "2"]
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1", "TOKENIZERS_PARALLELISM": "false"}


def run_cli(*argv: str) -> int:
    return train.main([str(a) for a in argv])


def dataset_or_skip(name: str) -> str:
    require_dataset(name)
    return name


@pytest.fixture(scope="module")
def trained(tmp_path_factory: pytest.TempPathFactory):
    """(family, modality) → output folder of a 2-step run; trained lazily, once per module."""
    root = tmp_path_factory.mktemp("train_cli")
    cache: dict[tuple[str, str], Path] = {}

    def get(family: str, modality: str) -> Path:
        if (family, modality) not in cache:
            dataset = "digits" if modality == "image" else dataset_or_skip("rotten_tomatoes")
            out = root / f"{family}-{modality}"
            extra = ["--vocab_size", "300", "--max_length", "32"] if modality == "text" else []
            rc = run_cli(
                "--model", family, "--dataset", dataset, "--output_dir", out,
                "--config", *cli_config(family), *QUICK, *SUBSET, *extra,
            )  # fmt: skip
            assert rc == 0
            cache[family, modality] = out
        return cache[family, modality]

    return get


# ----------------------------------------------------------------------------------- outputs


@pytest.mark.parametrize("modality", ["image", "text"])
@pytest.mark.parametrize("family", FAMILIES)
def test_output_folder_is_complete(trained, family: str, modality: str) -> None:
    out = trained(family, modality)
    files = {p.name for p in out.iterdir()}
    processor = (
        {"preprocessor_config.json"} if modality == "image" else {"tokenizer.json", "tokenizer_config.json"}
    )
    assert {
        "config.json",
        "model.safetensors",
        "metrics.json",
        "training_curve.png",
        "README.md",
    } | processor <= files
    assert not any(name.endswith((".bin", ".pt", ".pth", ".pkl")) for name in files)  # no pickles
    assert not out.with_name(out.name + ".checkpoints").exists()  # work folder removed after success
    card = (out / "README.md").read_text()
    assert "model-index" in card and "trained from scratch" in card  # Trainer card with tasks + dataset tags


@pytest.mark.parametrize("modality", ["image", "text"])
@pytest.mark.parametrize("family", FAMILIES)
def test_metrics_json_schema(trained, family: str, modality: str) -> None:
    metrics = json.loads((trained(family, modality) / "metrics.json").read_text())
    # no --preset: the family's CLI preset of the input type, the --config sizes on top
    expected = "cli-image" if modality == "image" else "cli-sequence"
    assert metrics["model"] == family and metrics["preset"] == expected, (metrics["preset"], expected)
    assert metrics["task"] == ("image-classification" if modality == "image" else "text-classification")
    assert isinstance(metrics["num_parameters"], int) and metrics["num_parameters"] > 0
    recipe = metrics["recipe"]
    assert recipe["command"].startswith("energyformers train ") and recipe["max_steps"] == 2
    assert (
        recipe["global_step"] == 2
        and recipe["batch_size"] == 8
        and isinstance(recipe["learning_rate"], float)
    )
    epoch = metrics["train"]["epoch"]  # 2 steps of 8 of the 32 examples
    assert epoch == 0.5, metrics["train"]
    for split in ("eval", "test"):
        assert 0.0 <= metrics[split]["accuracy"] <= 1.0 and 0.0 <= metrics[split]["f1_macro"] <= 1.0
        # Trainer's `evaluate` returns the training state's epoch with the metrics (the validation split's
        # accuracy at each depth joined to them, for the recurrent-depth families, too)
        assert metrics[split].get("epoch") == epoch, (split, metrics[split])
    assert "train_loss" in metrics["train"] and metrics["wall_time_s"] > 0
    # the versions the numbers depend on (torchmetrics' SSIM changed between releases; tokenizers sets a text run's
    # ids, Pillow converts the images, scikit-learn carves splits), as installed here
    environment = metrics["environment"]
    recorded = ("energyformers", "torch", "transformers", "accelerate", "datasets", "torchmetrics", "kornia",
                "tokenizers", "pillow", "numpy", "scikit-learn")  # fmt: skip
    for package in recorded:
        assert environment["packages"][package] == importlib.metadata.version(package), (package, environment)
    assert environment["python"] == platform.python_version(), environment


@pytest.mark.parametrize("family", FAMILIES)
def test_config_overrides_reach_the_saved_config(trained, family: str) -> None:
    config = json.loads((trained(family, "image") / "config.json").read_text())
    architecture = cli_architecture(family)
    assert {key: config[key] for key in architecture} == architecture
    assert config["id2label"] == {str(i): str(i) for i in range(10)}


@pytest.mark.parametrize("modality", ["image", "text"])
@pytest.mark.parametrize("family", FAMILIES)
def test_pipeline_reloads_in_process(trained, family: str, modality: str) -> None:
    out = trained(family, modality)
    if modality == "image":
        classify = pipeline("image-classification", model=str(out))
        inputs = [Image.fromarray(np.full((8, 8), 200, np.uint8)), Image.new("RGBA", (20, 12))]
    else:
        classify = pipeline("text-classification", model=str(out))
        inputs = ["a warm and funny film", "tedious " * 100]
    names = set(AutoConfig.from_pretrained(out).id2label.values())
    results = classify(inputs, top_k=len(names), **({"truncation": True} if modality == "text" else {}))
    # each score a float32 numpy softmax entry, exp(x − max) / Σ exp: the sum of the n rounded exponentials and
    # the n divisions round, so the scores add up to 1 within 2n float32 roundings (their float64 sum adds far less)
    bound = rounding(torch.float32, 2 * len(names))
    for result in results:
        assert {r["label"] for r in result} == names
        total = sum(r["score"] for r in result)
        assert abs(total - 1.0) <= bound, f"scores add up to {total!r}, not 1 within {bound:.2g}: {result}"


def test_pipeline_reloads_in_a_fresh_process(trained) -> None:
    folders = {f"{family}-{m}": str(trained(family, m)) for family in FAMILIES for m in ("image", "text")}
    code = textwrap.dedent(
        """
        import json, sys
        import energyformers  # registration is what makes the folders loadable
        from PIL import Image
        from transformers import pipeline
        out = {}
        for name, folder in json.loads(sys.argv[1]).items():
            task = "image-classification" if name.endswith("image") else "text-classification"
            x = Image.new("L", (8, 8), 128) if task.startswith("image") else "a fine film"
            out[name] = pipeline(task, model=folder)(x)[0]["label"]
        print(json.dumps(out))
        """
    )
    proc = subprocess.run(
        [sys.executable, "-c", code, json.dumps(folders)],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    labels = json.loads(proc.stdout.strip().splitlines()[-1])
    assert set(labels) == set(folders)
    for name, label in labels.items():
        assert label in AutoConfig.from_pretrained(folders[name]).id2label.values()


def test_predict_cli_images_and_texts(trained, tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    image_dir, text_dir = trained("hyperset", "image"), trained("hyperset", "text")
    capsys.readouterr()  # the fixture's training output when this test is the first to need the runs
    Image.new("P", (8, 8)).save(tmp_path / "a.png")  # palette mode: converted to RGB
    Image.fromarray(np.arange(64, dtype=np.uint8).reshape(8, 8)).save(tmp_path / "b.png")
    assert predict.main([str(image_dir), str(tmp_path / "a.png"), str(tmp_path / "b.png"), "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [line["input"] for line in lines] == [str(tmp_path / "a.png"), str(tmp_path / "b.png")]
    assert all(line["predictions"][0]["label"] in {str(i) for i in range(10)} for line in lines)
    assert predict.main([str(text_dir), "a great movie", "dull", "--top_k", "2", "--json"]) == 0
    lines = [json.loads(line) for line in capsys.readouterr().out.strip().splitlines()]
    assert [{p["label"] for p in line["predictions"]} for line in lines] == [{"neg", "pos"}] * 2
    assert predict.main([str(image_dir), str(tmp_path / "missing.png")]) == 2


# ----------------------------------------------------------------------------------- fine-tuning


def write_two_class_imagefolder(root: Path) -> Path:
    """digits 0 vs 1 as PNG files in class folders, in assorted PIL modes (L, RGB, RGBA, P, I;16)."""
    data = load_data("digits")["train"]
    modes = ["L", "RGB", "RGBA", "P", "I;16"]
    count = {"zero": 0, "one": 0}
    for row in data:
        name = {0: "zero", 1: "one"}.get(row["label"])
        if name is None or count[name] >= 15:
            continue
        image = row["image"].convert("L")
        mode = modes[count[name] % len(modes)]
        image = image.convert("I;16") if mode == "I;16" else image.convert(mode)
        (root / name).mkdir(parents=True, exist_ok=True)
        image.save(root / name / f"{count[name]}.png")
        count[name] += 1
    return root


def test_finetune_ten_class_checkpoint_onto_two_class_imagefolder(trained, tmp_path: Path) -> None:
    source = trained("hyperset", "image")
    folder = write_two_class_imagefolder(tmp_path / "zero_one")
    out = tmp_path / "finetuned"
    assert run_cli("--from_pretrained", source, "--dataset", folder, "--output_dir", out, *QUICK) == 0
    config = AutoConfig.from_pretrained(out)
    assert sorted(config.id2label.values()) == ["one", "zero"]
    model = AutoModelForImageClassification.from_pretrained(out)
    base = AutoModelForImageClassification.from_pretrained(source)
    assert model.classifier.weight.shape[0] == 2 and base.classifier.weight.shape[0] == 10
    # the backbone starts from the checkpoint: still close to it after two small steps
    name = next(n for n, _ in base.named_parameters() if not n.startswith("classifier"))
    delta = (model.state_dict()[name] - base.state_dict()[name]).abs().max().item()
    assert delta < 0.05
    assert json.loads((out / "metrics.json").read_text())["recipe"]["from_pretrained"] == str(source)
    assert f"fine-tuned version of `{source.name}`" in (out / "README.md").read_text()


# ----------------------------------------------------------------------------------- accumulation, resume


def test_gradient_accumulation_gives_the_same_loss_and_weights(tmp_path: Path) -> None:
    common = ["--dataset", "digits", "--config", *cli_config("hyperset"), *SUBSET, "--max_steps", "3"]
    common += ["--num_threads", "1", "--disable_tqdm", "--warmup_steps", "0"]
    common += ["--iteration_sampling", "fixed"]  # random depth would draw one depth per micro-batch
    assert run_cli(*common, "--output_dir", tmp_path / "full", "--per_device_train_batch_size", "8") == 0
    acc = ["--per_device_train_batch_size", "4", "--gradient_accumulation_steps", "2"]
    assert run_cli(*common, "--output_dir", tmp_path / "accumulated", *acc) == 0
    losses = [
        json.loads((tmp_path / d / "metrics.json").read_text())["train"]["train_loss"]
        for d in ("full", "accumulated")
    ]
    # not 2× (the accepts_loss_kwargs trap): the mean of 3 float32 losses, each a mean over the same 8 samples
    # summed in another order, after weights that differ by rounding (above): 64 roundings, relative
    assert losses[1] == pytest.approx(losses[0], rel=rounding(torch.float32, 64))
    a, b = (load_file(tmp_path / d / "model.safetensors") for d in ("full", "accumulated"))
    for key in a:
        # 3 Adam steps from a gradient whose batch mean is summed as 8 or as 2 × 4 samples: the weights' own
        # roundings plus the update's, which Adam passes on relative to lr < 1; 64 roundings of the weights' scale
        assert_close_to_scale(b[key], a[key], rounding(torch.float32, 64), key)


KILL_AFTER_FIRST_SAVE = """
import os, signal, sys
from transformers import TrainerCallback
from energyformers.training import train

class KillAfterFirstSave(TrainerCallback):
    def on_save(self, args, state, control, **kwargs):
        if not os.environ.get("KILLED"):
            os.environ["KILLED"] = "1"
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal, delivered right after checkpoint-N is on disk

sys.exit(train.main(sys.argv[1:], callbacks=[KillAfterFirstSave()]))
"""


def test_resume_after_sigterm_matches_an_uninterrupted_run(tmp_path: Path) -> None:
    common = ["--dataset", "digits", "--config", *cli_config("hyperset"), *SUBSET, "--max_steps", "8"]
    common += ["--per_device_train_batch_size", "8", "--save_strategy", "steps", "--save_steps", "3"]
    common += ["--eval_strategy", "no", "--num_threads", "1", "--disable_tqdm"]
    assert run_cli(*common, "--output_dir", tmp_path / "straight") == 0

    out = tmp_path / "interrupted"
    script = tmp_path / "kill.py"
    script.write_text(KILL_AFTER_FIRST_SAVE)
    argv = [sys.executable, str(script), *map(str, common), "--output_dir", str(out)]
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=300)
    assert proc.returncode == 128 + 15, proc.stderr[-3000:]
    assert "--resume" in proc.stderr
    assert not out.exists()  # nothing half-written where the model goes
    checkpoints = sorted(p.name for p in out.with_name("interrupted.checkpoints").glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-3", "checkpoint-4"]  # periodic save, then the SIGTERM save

    assert run_cli(*common, "--output_dir", out) == 2  # refuses to silently restart over a killed run
    assert run_cli(*common, "--output_dir", out, "--resume") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["global_step"] == 8 and metrics["recipe"]["resumed_from"].endswith(
        "checkpoint-4"
    )
    a, b = load_file(tmp_path / "straight" / "model.safetensors"), load_file(out / "model.safetensors")
    for key in a:
        # exact: the same seed, restored optimizer, scheduler and RNG state and data order, one thread: the same
        # float operations in the same order as the uninterrupted run
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))


# One process runs the stopped runs of every case of the test below, one after the other (each a fresh process's
# worth of imports otherwise). argv[1]: a JSON list of [during, argv]: "training", SIGTERM while step 2 trains, or
# "evaluation", after the first batch of an evaluation; argv[2]: a file for each run's exit status and the global
# steps of every evaluation batch predicted and of every checkpoint save. Each run's output follows a line
# `===== <index>` on stderr.
STOP_AROUND_AN_EVALUATION = """
import json, os, signal, sys
from transformers import Trainer, TrainerCallback
from energyformers.training import train

predicted, during = [], [None]
prediction_step = Trainer.prediction_step

def record_prediction_step(self, *args, **kwargs):
    # here, not in a callback's on_prediction_step: the stop callback raises there first, after the batch ran
    predicted.append(self.state.global_step)
    return prediction_step(self, *args, **kwargs)

Trainer.prediction_step = record_prediction_step

class StopAtStep2(TrainerCallback):
    def __init__(self):
        self.saves, self.step_2_learning_rate = [], None

    def on_step_begin(self, args, state, control, **kwargs):
        if state.global_step == 1:  # the rate step 2 trains with, as a logging step at 2 would log it
            self.step_2_learning_rate = kwargs["optimizer"].param_groups[0]["lr"]
        if during[0] == "training" and state.global_step == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # a real signal

    def on_prediction_step(self, args, state, control, **kwargs):
        if during[0] == "evaluation" and len(predicted) == 1:
            os.kill(os.getpid(), signal.SIGTERM)

    def on_save(self, args, state, control, **kwargs):
        self.saves.append(state.global_step)

records = []
for index, (name, argv) in enumerate(json.loads(sys.argv[1])):
    predicted.clear()
    during[0] = name
    print(f"===== {index}", file=sys.stderr, flush=True)
    stop = StopAtStep2()
    status = train.main(argv, callbacks=[stop])
    sys.stderr.flush()
    records.append(
        {"status": status, "predicted": list(predicted), "saves": stop.saves,
         "learning_rate": stop.step_2_learning_rate}
    )
open(sys.argv[2], "w").write(json.dumps(records))
"""


@pytest.fixture(scope="module")
def uninterrupted(tmp_path_factory: pytest.TempPathFactory) -> Callable[[list[str]], Path]:
    """The output folder of an uninterrupted run of `argv` (without `--output_dir`), trained once per module for
    each argv: the stop tests of one cadence (a stop in training, in an evaluation) compare with the same run."""
    runs: dict[tuple[str, ...], Path] = {}

    def run(argv: list[str]) -> Path:
        key = tuple(map(str, argv))
        if key not in runs:
            out = tmp_path_factory.mktemp("uninterrupted") / "straight"
            assert run_cli(*key, "--output_dir", out) == 0
            runs[key] = out
        return runs[key]

    return run


# every 2 steps of 6; or by epoch (the CLI's default without --max_steps): 32 samples, 4 steps an epoch, 2 epochs
BY_STEPS = ["--max_steps", "6", "--eval_strategy", "steps", "--eval_steps", "2", "--save_steps", "4"]
BY_EPOCH = ["--num_train_epochs", "2", "--eval_strategy", "epoch", "--save_strategy", "epoch"]


# (during, cadence, the global steps of the evaluation batches predicted, --load_best_model_at_end) by case
STOP_CASES = {
    "training": ("training", BY_STEPS, [], False),
    "evaluation": ("evaluation", BY_STEPS, [2, 2], False),  # the batch that asks, then stops
    "evaluation-best-model": ("evaluation", BY_STEPS, [2, 2], True),
    "training-mid-epoch": ("training", BY_EPOCH, [], False),
    "evaluation-ema": ("evaluation", [*BY_STEPS, "--ema_decay", "0.9"], [2, 2], False),
}


def stop_argv(cadence: list[str], best: bool) -> list[str]:
    """The command line (without --output_dir) of a stop case's runs."""
    argv = ["--dataset", "digits", "--config", *cli_config("hyperset"), *SUBSET, *cadence]
    argv += ["--per_device_train_batch_size", "8", "--per_device_eval_batch_size", "4"]  # 4 prediction steps
    argv += ["--logging_steps", "3"]
    argv += ["--load_best_model_at_end"] if best else []
    return [*argv, "--num_threads", "1", "--disable_tqdm"]


@pytest.fixture(scope="module")
def stopped_runs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[dict, str, Path]]:
    """case -> (the record, the part of stderr and the output folder of its stopped run), every case's run in one
    process. Each run is one test's: the test resumes it in place."""
    root = tmp_path_factory.mktemp("stopped")
    outs = {case: root / case / "run" for case in STOP_CASES}
    plan = [
        [during, [*stop_argv(cadence, best), "--output_dir", str(outs[case])]]
        for case, (during, cadence, _, best) in STOP_CASES.items()
    ]
    runs = run_stopped_runs(STOP_AROUND_AN_EVALUATION, plan, root, ENV, timeout=1200)
    return {
        case: (record, stderr, outs[case]) for case, (record, stderr) in zip(STOP_CASES, runs, strict=True)
    }


@pytest.mark.parametrize("case", STOP_CASES)
def test_a_stop_at_an_evaluation_step_does_not_wait_for_the_evaluation(
    tmp_path: Path,
    stopped_runs: dict[str, tuple[dict, str, Path]],
    uninterrupted: Callable[[list[str]], Path],
    case: str,
) -> None:
    """SIGTERM during the step before an evaluation, or during the evaluation (which on a CPU can outlast many
    training steps): the evaluation does not start, or ends at its next prediction step; the step just trained is
    checkpointed once, without metrics of an abandoned evaluation, and the run resumes from it to the uninterrupted
    run's weights and whole-run training loss; the stop step (2) is not a logging step (every 3), yet its
    checkpoint ends a logged window, as every checkpoint's does. By epoch: Trainer ends the epoch after the stop
    step and asks for the epoch's evaluation and checkpoint, which must not run. `--load_best_model_at_end`:
    Trainer looks up the best-model metric of every evaluation, a cut-short one too (the abandoned step cannot be
    the best, so the weights may differ there). `--ema_decay`: the evaluation cut short was scoring the averaged
    weights, and the checkpoint still holds the live ones."""
    _, cadence, expected_batches, best = STOP_CASES[case]
    argv = stop_argv(cadence, best)
    recorded, stderr, out = stopped_runs[case]
    assert recorded["status"] == 128 + 15, stderr[-3000:]
    assert "stopped by SIGTERM at step 2" in stderr and "--resume" in stderr, stderr[-3000:]
    assert recorded["predicted"] == expected_batches, (
        f"evaluation batches predicted (their global steps) {recorded['predicted']}, expected {expected_batches}"
    )
    assert recorded["saves"] == [2], (
        f"checkpoint saves (their global steps) {recorded['saves']}, expected [2]"
    )
    work = out.with_name("run.checkpoints")
    checkpoints = sorted(p.name for p in work.glob("checkpoint-*"))
    assert checkpoints == ["checkpoint-2"], checkpoints
    history = json.loads((work / "checkpoint-2" / "trainer_state.json").read_text())["log_history"]
    assert not [entry for entry in history if any(key.startswith("eval_") for key in entry)], history
    logged = [entry for entry in history if "loss" in entry]
    assert [entry["step"] for entry in logged] == [2], (
        f"training losses logged at {logged}; expected one, at the stop's checkpoint step 2"
    )
    # the row a logging step at 2 would write: step 2's learning rate (not the next step's) and gradient norm
    assert logged[0]["learning_rate"] == recorded["learning_rate"] and "grad_norm" in logged[0], (
        f"logged {logged[0]}; step 2 trained with learning rate {recorded['learning_rate']}"
    )

    assert run_cli(*argv, "--output_dir", out, "--resume") == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["recipe"]["resumed_from"].endswith("checkpoint-2"), metrics["recipe"]
    if best:
        return
    straight_dir = uninterrupted(argv)
    a, b = load_file(straight_dir / "model.safetensors"), load_file(out / "model.safetensors")
    for key in a:  # exact, as after a stop between evaluations (`test_resume_after_sigterm_matches_...`)
        torch.testing.assert_close(b[key], a[key], atol=0, rtol=0, msg=labelled(key))
    straight = json.loads((straight_dir / "metrics.json").read_text())["train"]["train_loss"]
    # the same float32 step losses (the same weights), summed in other windows: one rounding each of at most 8
    # steps' sums of about 2.3, and the float64 arithmetic of `whole_run_train_loss` on them
    assert metrics["train"]["train_loss"] == pytest.approx(straight, rel=rounding(torch.float32, 8)), (
        f"whole-run train loss resumed {metrics['train']['train_loss']} vs uninterrupted {straight}"
    )


def built_run(argv: list[str]):
    """`(args, Built)` of `argv` as `train.run` has them when it records / checks a resume."""
    from accelerate import PartialState

    from energyformers.training.setup import build

    args = train.parse([*argv, "--output_dir", "unused", "--num_threads", "1"])
    return args, build(args, PartialState())


def interrupted_run(tmp_path: Path, argv: list[str], record: bool = True) -> tuple[Path, Path]:
    """(output folder, checkpoint) of a run of `argv` stopped after its step-5 checkpoint: the work folder as
    Trainer and `train.run` leave it (trainer_state.json, the checkpoint's config.json, `RUN_ARGUMENTS_FILE`)."""
    from energyformers.training.setup import record_run_arguments

    out = tmp_path / "run"
    work = tmp_path / "run.checkpoints"
    checkpoint = work / "checkpoint-5"
    checkpoint.mkdir(parents=True)
    (checkpoint / "trainer_state.json").write_text(json.dumps({"global_step": 5}))
    model = argv[argv.index("--model") + 1]
    (checkpoint / "config.json").write_text(json.dumps({"model_type": model}))
    if record:
        record_run_arguments(*built_run(argv), work)
    return out, checkpoint


RESUMED = ["--dataset", "digits", "--config", "hidden_size=32", "num_attention_heads=4", "--max_steps", "10"]


@pytest.mark.parametrize(
    ("changed", "message"),
    [
        (
            ["--model", "hyperset"],
            "has --model hyperset but the checkpoints in {work} were trained with --model hyperbf",
        ),
        (["--model", "hyperbf", "--dataset", "rotten_tomatoes"], "--dataset rotten_tomatoes"),
        (
            ["--model", "hyperbf", "--config", "hidden_size=64", "num_attention_heads=4"],
            # the fields the run built differently, the derived sizes too
            "has config hidden_size=64, config num_centers=256, config rbf_projection_dim=64 but the checkpoints "
            "in {work} were trained with config hidden_size=32, config num_centers=128, config "
            "rbf_projection_dim=32;",
        ),
    ],
    ids=["model", "dataset", "config"],
)
def test_resume_refuses_another_model_or_data_before_loading(
    tmp_path: Path, capsys, changed, message
) -> None:
    out, checkpoint = interrupted_run(tmp_path, ["--model", "hyperbf", *RESUMED])
    argv = [*RESUMED, *changed, "--resume", "--output_dir", out, "--num_threads", "1"]
    assert run_cli(*argv) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("energyformers train: error: --resume: "), err
    assert message.format(work=checkpoint.parent) in err, err
    assert sorted(p.name for p in checkpoint.iterdir()) == ["config.json", "trainer_state.json"]


def test_resume_allows_another_schedule_and_reads_old_checkpoints_family(tmp_path: Path, capsys) -> None:
    from energyformers.training.setup import check_resume_arguments

    argv = ["--model", "hyperbf", *RESUMED]
    _out, checkpoint = interrupted_run(tmp_path, argv)
    # the order of --config items, the learning rate and the step count are not the model's
    later = [
        "--model",
        "hyperbf",
        *RESUMED[:3],
        "num_attention_heads=4",
        "hidden_size=32",
        "--max_steps",
        "20",
        "--learning_rate",
        "1e-4",
    ]
    check_resume_arguments(*built_run(later), checkpoint.parent, checkpoint)
    # checkpoints written without the record: the family in the checkpoint's config.json still decides
    old_out, _ = interrupted_run(tmp_path / "old", argv, record=False)
    assert (
        run_cli(*RESUMED, "--model", "hyperset", "--resume", "--output_dir", old_out, "--num_threads", "1")
        == 2
    )
    err = capsys.readouterr().err
    assert "has --model hyperset but the checkpoints" in err and "--model hyperbf" in err, err


@pytest.mark.parametrize(
    ("before", "now"),
    [
        (["--preset", "cli-image"], []),  # the preset a 32×32 image run gets anyway
        (["--vocab_size", "100", "--max_length", "64"], []),  # text-only flags on an image run
        (["--image_column", "image", "--label_column", "label"], []),  # the columns detection picks
    ],
    ids=["preset", "text-flags-on-images", "columns"],
)
def test_resume_compares_what_was_built_not_the_flags_as_typed(tmp_path: Path, before, now) -> None:
    """Flags that build the same model on the same data are the same run: a resume is allowed either way round."""
    from energyformers.training.setup import check_resume_arguments, record_run_arguments

    # a local folder (built-ins have fixed columns) of 32×32 images: the size the cli-image preset is made for,
    # so the geometry derived from the data without --preset is the preset's (8×8 digits would get 16×16)
    images = load_data("digits")["train"].select(range(40))
    dataset = tmp_path / "digits32"
    images.map(lambda row: {"image": row["image"].convert("L").resize((32, 32))}).save_to_disk(str(dataset))
    common = [
        "--model",
        "hyperbf",
        "--dataset",
        str(dataset),
        "--config",
        "hidden_size=32",
        "num_attention_heads=4",
    ]
    for first, second in ((before, now), (now, before)):
        work = tmp_path / f"work-{len(first)}"
        checkpoint = work / "checkpoint-5"
        checkpoint.mkdir(parents=True)
        record_run_arguments(*built_run([*common, *first]), work)
        check_resume_arguments(*built_run([*common, *second]), work, checkpoint)


def test_resume_refuses_another_column_of_a_local_dataset(tmp_path: Path) -> None:
    """The columns after detection are compared: another input column of the same folder is another run."""
    from energyformers.training.setup import check_resume_arguments, record_run_arguments

    digits = load_data("digits")["train"].select(range(40))
    mirrored = digits.map(lambda row: {"mirrored": row["image"].transpose(Image.Transpose.FLIP_LEFT_RIGHT)})
    folder = tmp_path / "two_views"
    mirrored.save_to_disk(str(folder))
    common = [
        "--model",
        "hyperbf",
        "--dataset",
        str(folder),
        "--config",
        "hidden_size=32",
        "num_attention_heads=4",
    ]
    work = tmp_path / "work"
    (work / "checkpoint-5").mkdir(parents=True)
    record_run_arguments(*built_run(common), work)
    with pytest.raises(UsageError) as caught:
        check_resume_arguments(
            *built_run([*common, "--image_column", "mirrored"]), work, work / "checkpoint-5"
        )
    assert "has --image_column mirrored but" in str(caught.value), caught.value
    assert "trained with --image_column image" in str(caught.value), caught.value


def test_resume_checks_old_accelerate_checkpoints_by_their_weights(tmp_path: Path) -> None:
    """An Accelerate `step_N/` folder written before the run record holds no config.json: the tensor names and
    shapes of its model.safetensors decide, so another family (or size) is refused and the same model resumes."""
    from safetensors.torch import save_model

    from energyformers.training.setup import check_resume_arguments

    common = ["--dataset", "digits", "--config", "hidden_size=32", "num_attention_heads=4"]
    args, built = built_run(["--model", "hyperbf", *common])
    step = tmp_path / "run.checkpoints" / "step_5"
    step.mkdir(parents=True)
    save_model(built.model, str(step / "model.safetensors"))  # as `Accelerator.save_state` writes it
    check_resume_arguments(args, built, step.parent, step)
    for changed in (["--model", "hyperset", *common], ["--model", "hyperbf", *common, "hidden_size=64"]):
        with pytest.raises(
            UsageError, match=r"--resume: the checkpoint .*step_5 holds another model"
        ) as caught:
            check_resume_arguments(*built_run(changed), step.parent, step)
        assert "has shape" in str(caught.value), caught.value


# ----------------------------------------------------------------------------------- bad input


def write_csv(path: Path, rows: list[str]) -> Path:
    path.write_text("\n".join(rows) + "\n")
    return path


BAD_INPUTS = {
    "unknown dataset": (
        lambda tmp: ["--dataset", "no_such_dataset_xyz"],
        "unknown dataset 'no_such_dataset_xyz'",
    ),
    "missing path": (lambda tmp: ["--dataset", str(tmp / "nope")], "does not exist"),
    "missing column": (
        lambda tmp: [
            "--dataset",
            write_csv(tmp / "d.csv", ["text,label"] + ["good,1", "bad,0"] * 5),
            "--label_column",
            "stars",
        ],
        "--label_column 'stars' is not a column",
    ),
    "string labels": (
        lambda tmp: ["--dataset", write_csv(tmp / "d.csv", ["text,label"] + ["good,pos", "bad,neg"] * 5)],
        "expected integer class ids or a ClassLabel",
    ),
    "float labels": (
        lambda tmp: ["--dataset", write_csv(tmp / "d.csv", ["text,label"] + ["good,0.5", "bad,1.5"] * 5)],
        "expected integer class ids or a ClassLabel",
    ),
    "empty dataset": (lambda tmp: ["--dataset", write_csv(tmp / "d.csv", ["text,label"])], "empty"),
    "unknown config key": (lambda tmp: ["--config", "no_such_field=[1,2"], "no_such_field"),
    "bad config value": (lambda tmp: ["--config", "hidden_size=-3"], "hidden_size"),
    "image config on text": (
        lambda tmp: [
            "--dataset",
            write_csv(tmp / "d.csv", ["text,label"] + ["good,1", "bad,0"] * 5),
            "--config",
            "input_type=image",
        ],
        "input_type",
    ),
    "unknown family": (lambda tmp: ["--model", "resnet"], "--model 'resnet' is not available"),
    # a built-in dataset reads its own columns: the flag is refused as `evaluate` refuses it, not ignored
    "column flag on a built-in dataset": (
        lambda tmp: ["--dataset", "digits", "--image_column", "img"],
        "--image_column img: --dataset digits is a built-in dataset with its own columns",
    ),
    "label column on a built-in dataset": (
        lambda tmp: ["--dataset", "rotten_tomatoes", "--label_column", "stars"],
        "--label_column stars: --dataset rotten_tomatoes is a built-in dataset with its own columns",
    ),
    "pair column on a built-in dataset": (
        lambda tmp: ["--dataset", "rotten_tomatoes", "--text_pair_column", "title"],
        "--text_pair_column title: --dataset rotten_tomatoes is a built-in dataset with its own columns",
    ),
    "resume without checkpoint": (lambda tmp: ["--resume"], "no checkpoint"),
    "attention the family lacks": (
        lambda tmp: ["--model", "imixer", "--attn_implementation", "sdpa"],
        "--attn_implementation sdpa: imixer models take one of eager",
    ),
    "attention in --config": (
        lambda tmp: ["--config", "attn_implementation=flex_attention"],
        "--attn_implementation flex_attention: hyperset models take one of eager, sdpa, triton",
    ),
    "attention twice": (
        lambda tmp: ["--attn_implementation", "eager", "--config", "attn_implementation=sdpa"],
        "--attn_implementation eager and --config attn_implementation=sdpa disagree",
    ),
}


@pytest.mark.parametrize("case", sorted(BAD_INPUTS))
def test_bad_input_fails_before_training_and_writes_nothing(case: str, tmp_path: Path, capsys) -> None:
    make_args, message = BAD_INPUTS[case]
    data_dir = tmp_path / "data"
    data_dir.mkdir()
    out = tmp_path / "runs" / "model"
    rc = run_cli(*make_args(data_dir), "--output_dir", out, *QUICK)
    err = capsys.readouterr().err
    assert rc == 2
    assert message in err
    assert not (tmp_path / "runs").exists() or not any((tmp_path / "runs").iterdir())


def test_existing_output_folder_is_left_untouched(tmp_path: Path, capsys) -> None:
    out = tmp_path / "model"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert run_cli("--output_dir", out, *QUICK) == 2
    assert "--overwrite_output_dir" in capsys.readouterr().err
    assert [p.name for p in out.iterdir()] == ["keep.txt"]


def test_config_override_values_are_json() -> None:
    parsed = parse_overrides(["a=3", "b=0.5", "c=true", "d=[16,16]", "e=mean", 'f="7"'])
    assert parsed == {"a": 3, "b": 0.5, "c": True, "d": [16, 16], "e": "mean", "f": "7"}
    with pytest.raises(UsageError, match="KEY=VALUE"):
        parse_overrides(["hidden_size"])


# ----------------------------------------------------------------------------------- attention implementation


def default_and_other_attention(family: str) -> tuple[str, str]:
    """The implementation a new tiny model of `family` gets by default, and another one it accepts."""
    from transformers import AutoConfig, AutoModelForImageClassification

    config = AutoConfig.for_model(family, **cli_architecture(family))
    default = AutoModelForImageClassification.from_config(config).config._attn_implementation
    return default, next(name for name in ("eager", "sdpa") if name != default)


@pytest.mark.parametrize("form", ["flag", "config"])
@pytest.mark.parametrize("loop", ["train", "train-accelerate"])
def test_attn_implementation_reaches_the_trained_model(
    loop: str, form: str, tmp_path: Path, monkeypatch
) -> None:
    from energyformers.training import accelerate_loop, setup

    _, asked = default_and_other_attention("hyperset")  # not the default: a dropped flag would not pass
    built = []

    def recording_build(*args, **kwargs):
        built.append(setup_build(*args, **kwargs))
        return built[-1]

    setup_build = setup.build
    monkeypatch.setattr(setup, "build", recording_build)
    # one --config list (a second --config would replace the first)
    config = [*cli_config("hyperset"), *([f"attn_implementation={asked}"] if form == "config" else [])]
    chosen = ["--attn_implementation", asked] if form == "flag" else []
    main = train.main if loop == "train" else accelerate_loop.main
    argv = ["--model", "hyperset", "--dataset", "digits", "--output_dir", tmp_path / "out"]
    argv += ["--config", *config, *chosen, *QUICK, *SUBSET]
    assert main([str(a) for a in argv]) == 0
    assert [b.model.config._attn_implementation for b in built] == [asked]


def test_attn_implementation_table_matches_what_each_family_accepts() -> None:
    """`ATTN_IMPLEMENTATIONS` (checked before torch loads) against the models' own answer to `from_config`."""
    from transformers import AutoConfig, AutoModelForImageClassification

    from energyformers.training.arguments import ATTN_IMPLEMENTATIONS

    assert set(ATTN_IMPLEMENTATIONS) == set(energyformers.FAMILIES) | set(energyformers.BASELINES)
    for family, allowed in ATTN_IMPLEMENTATIONS.items():
        architecture = cli_architecture(family) if family in energyformers.FAMILIES else {}
        config = AutoConfig.for_model(family, **architecture, image_size=8, patch_size=2)
        for name in ("eager", "sdpa", "flash_attention_2", "flex_attention", "triton"):
            try:
                got = AutoModelForImageClassification.from_config(config, attn_implementation=name)
            except ValueError as err:
                # listed but needs CUDA / Triton: refused for this machine, not for the family
                assert name not in allowed or "cannot run here" in str(err), (family, name, str(err))
            else:
                assert name in allowed and got.config._attn_implementation == name, (family, name)


def test_predict_passes_attn_implementation(trained, tmp_path: Path, monkeypatch, capsys) -> None:
    folder = trained("hyperset", "image")
    Image.new("RGB", (8, 8)).save(tmp_path / "a.png")
    _, asked = default_and_other_attention("hyperset")
    seen = []
    check = predict.check_depth_arguments
    monkeypatch.setattr(
        predict,
        "check_depth_arguments",
        lambda model, depth: (seen.append(model.config._attn_implementation), check(model, depth)),
    )
    assert predict.main([str(folder), str(tmp_path / "a.png"), "--attn_implementation", asked]) == 0
    assert seen == [asked]
    capsys.readouterr()
    assert (
        predict.main([str(folder), str(tmp_path / "a.png"), "--attn_implementation", "flash_attention_2"])
        == 2
    )
    err = capsys.readouterr().err.strip()
    assert (
        err
        == "energyformers predict: error: --attn_implementation flash_attention_2: hyperset models take one of eager, sdpa, triton"
    ), err
