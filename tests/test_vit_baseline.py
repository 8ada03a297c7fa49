"""transformers' own ViT as the papers' image baseline (`--model vit`): both training loops, its CLI size and
learning rate, reloading and prediction through transformers' Auto classes, the refusal of text data, release and
the benchmarks' model selection. Nothing of ViT is registered by this package: it is transformers' model type.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import transformers

from energyformers import auto_registration, registry
from energyformers.training import accelerate_loop, predict, release, setup, train
from energyformers.training.data import load_data

LOOPS = {"train": train.main, "train-accelerate": accelerate_loop.main}
TINY = ["--max_steps", "2", "--batch_size", "8", "--num_threads", "1", "--disable_tqdm"]
TINY += ["--num_predictions", "0", "--max_train_samples", "16", "--max_eval_samples", "8"]
TINY += ["--max_test_samples", "8"]


def cli_image_parameters(model_type: str) -> int:
    """Parameters of the model `energyformers train --model M --dataset digits` builds (10 labels, 16² inputs)."""
    fields = {**setup.cli_preset(model_type, "image"), "image_size": 16, "patch_size": 2, "num_labels": 10}
    family = setup.model_registry()[model_type]
    config = family.config_class(input_type="image", num_channels=3, **fields)
    model = family.heads["AutoModelForImageClassification"](config)
    return sum(p.numel() for p in model.parameters())


def test_vit_is_transformers_own_model_and_is_not_registered_by_us():
    vit = setup.model_registry()["vit"]
    assert vit.config_class is transformers.ViTConfig
    assert vit.heads["AutoModelForImageClassification"] is transformers.ViTForImageClassification
    assert "vit" not in registry.BASELINES and "vit" not in auto_registration.AUTO_HEADS
    # transformers' own mapping is untouched: the Auto classes resolve "vit" to its classes
    assert type(transformers.AutoConfig.for_model("vit")) is transformers.ViTConfig
    assert sorted(release.BASELINE_DATASETS) == sorted(registry.TRANSFORMERS_BASELINES)


def test_cli_vit_is_parameter_matched_to_the_cli_hyperset():
    hyperset, vit = cli_image_parameters("hyperset"), cli_image_parameters("vit")
    # the counts docs/training.md quotes; "matched": within 5 % of each other
    assert (hyperset, vit) == (69_890, 72_778), (hyperset, vit)
    assert abs(vit - hyperset) / hyperset < 0.05, (hyperset, vit)


def test_each_model_has_its_own_default_learning_rate():
    from energyformers.training.arguments import parse_arguments

    def lr(*argv: str) -> float:
        return setup.default_learning_rate(parse_arguments(["--output_dir", "x", *argv], train.PROG, ""))

    # the measured choice of docs/training.md ("Default learning rates")
    assert lr("--model", "vit") == setup.NEW_MODEL_LEARNING_RATE["vit"] == 3e-3
    assert lr("--model", "hyperset") == lr() == 3e-3
    assert lr("--model", "vit", "--lr", "1e-3") == 1e-3  # an explicit flag wins
    assert lr("--model", "vit", "--from_pretrained", "x") == 5e-4  # fine-tuning: the CLI's fine-tuning rate


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_vit_trains_in_both_loops_reloads_with_auto_classes_and_predicts(tmp_path, capsys, loop):
    out = tmp_path / "vit"
    assert LOOPS[loop](["--model", "vit", "--dataset", "digits", *TINY, "--output_dir", str(out)]) == 0
    metrics = json.loads((out / "metrics.json").read_text())
    assert metrics["model"] == "vit" and metrics["recipe"]["global_step"] == 2, metrics["recipe"]
    assert metrics["recipe"]["learning_rate"] == 3e-3, metrics["recipe"]
    config = json.loads((out / "config.json").read_text())
    assert config["model_type"] == "vit" and config["architectures"] == ["ViTForImageClassification"]
    assert "auto_map" not in config  # transformers' own class: no remote code, no registration
    model = transformers.AutoModelForImageClassification.from_pretrained(out)
    assert type(model) is transformers.ViTForImageClassification
    assert sum(p.numel() for p in model.parameters()) == 72_778

    image = tmp_path / "digit.png"
    load_data("digits")["test"][0]["image"].save(image)
    capsys.readouterr()
    assert predict.main([str(out), str(image), "--json"]) == 0
    answer = json.loads(capsys.readouterr().out.strip().splitlines()[-1])["predictions"][0]
    assert answer["label"] in model.config.label2id, answer
    # the prediction is the reloaded model's own: same top label as a direct forward of the processed image
    processor = transformers.AutoImageProcessor.from_pretrained(out, backend="pil")
    with torch.no_grad():
        logits = model(
            **processor(images=[load_data("digits")["test"][0]["image"].convert("RGB")], return_tensors="pt")
        ).logits
    assert model.config.id2label[int(logits.argmax())] == answer["label"], (logits, answer)


@pytest.mark.parametrize("loop", sorted(LOOPS))
def test_vit_on_text_data_is_a_usage_error_before_anything_is_written(tmp_path, capsys, loop):
    data = tmp_path / "reviews.csv"
    data.write_text("text,label\n" + "a good film,1\na bad film,0\n" * 20)
    runs = tmp_path / "runs"
    runs.mkdir()
    argv = ["--model", "vit", "--dataset", str(data), *TINY, "--output_dir", str(runs / "m")]
    assert LOOPS[loop](argv) == 2
    err = capsys.readouterr().err
    assert (
        f"--model vit is an image model and --dataset {data} is a dataset for text-classification" in err
    ), err
    assert list(runs.iterdir()) == []


def test_release_trains_the_vit_baseline_on_image_datasets_only_and_never_exports_it(tmp_path, capsys):
    runs, dist = tmp_path / "runs", tmp_path / "dist"
    argv = ["--models", "hyperset", "--baselines", "vit", "--dry_run", "--runs_dir", str(runs)]
    assert release.main([*argv, "--dist_dir", str(dist), "--", "--max_steps", "2"]) == 0
    planned = capsys.readouterr().out.splitlines()
    vit = [line for line in planned if "--model vit" in line]
    assert [line.split("--dataset ")[1].split()[0] for line in vit] == ["digits", "fashion_mnist"], planned
    assert len(planned) == 3 + 2 and not runs.exists() and not dist.exists()


def test_release_points_a_baseline_given_as_a_model_to_the_baselines_flag(tmp_path, capsys):
    assert release.main(["--models", "vit", "--runs_dir", str(tmp_path / "runs"), "--dry_run"]) == 2
    assert "vit is a baseline: pass --baselines vit" in capsys.readouterr().err


def test_the_benchmarks_pick_the_registry_vit():
    import importlib.util

    spec = importlib.util.spec_from_file_location(
        "speed", Path(__file__).resolve().parents[1] / "benchmarks" / "speed.py"
    )
    speed = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(speed)
    model = speed.vit_like(32, 2, 1, 16, 4)
    assert type(model) is registry.TRANSFORMERS_BASELINES["vit"].heads["AutoModelForImageClassification"]
