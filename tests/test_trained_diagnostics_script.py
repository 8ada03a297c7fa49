"""benchmarks/trained_diagnostics.py records what it measured in a JSON beside its Markdown, with the run's
provenance and the command that trained each model (read from the model folder's metrics.json)."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from fixtures import hyperbf_config, imixer_config, loaded_script

from energyformers import HyperBFForImageClassification, IMixerForImageClassification
from energyformers.training.processing import build_image_processor

SCRIPT = Path(__file__).resolve().parents[1] / "benchmarks" / "trained_diagnostics.py"


def save(model: torch.nn.Module, folder: Path, command: str | None) -> Path:
    model.config.id2label = {i: str(i) for i in range(10)}
    model.config.label2id = {str(i): i for i in range(10)}
    model.eval().save_pretrained(folder)
    build_image_processor(model.config).save_pretrained(folder)
    if command is not None:
        (folder / "metrics.json").write_text(json.dumps({"recipe": {"command": command}}))
    return folder


def test_writes_json_with_run_results_and_training_commands(tmp_path):
    torch.manual_seed(0)
    command = "energyformers train --model imixer --dataset digits --output_dir runs/demo-imixer"
    imixer = save(
        IMixerForImageClassification(imixer_config("image", num_channels=3, num_labels=10)),
        tmp_path / "imixer",
        command,
    )
    hyperbf = save(
        HyperBFForImageClassification(hyperbf_config("image", num_labels=10)), tmp_path / "hyperbf", None
    )
    out = tmp_path / "out"
    with loaded_script(SCRIPT, "trained_diagnostics") as script:
        script.main(
            ["--imixer", str(imixer), "--hyperbf", str(hyperbf), "--longest", "2", "--output_dir", str(out)]
        )
    data = json.loads((out / "trained_diagnostics.json").read_text())
    assert {"run", "imixer", "hyperbf"} <= set(data), sorted(data)
    assert "git_commit" in data["run"] and "command" in data["run"], sorted(data["run"])
    assert data["imixer"]["training_command"] == command, data["imixer"]
    assert len(data["imixer"]["relative_residuals"]) == 2 and len(data["imixer"]["accuracy"]) == 3, data[
        "imixer"
    ]
    assert data["hyperbf"]["training_command"] is None and data["hyperbf"]["sigma_per_layer"], data["hyperbf"]
    text = (out / "trained_diagnostics.md").read_text()
    assert f"Trained with `{command}`" in text and "records no training command" in text, text
