"""iMixer fixed-point convergence and HyperBF kernel widths on trained models, from their demo runs.

* iMixer (`runs/demo-imixer`, trained with n fixed-point iterations): relative residual
  ‖x_a − x_{a−1}‖ / ‖x_{a−1}‖ per iteration a (mean over blocks and the test set) when the solve is run
  longer than trained, and test accuracy for n = 0..N at test time; the vanilla solve-free path (n = 0)
  is the MLP-Mixer baseline on the same weights.
* HyperBF (`runs/demo-hyperbf`): learned attention σ per head and feedforward σ per layer vs their
  initial values (memo 143 observes that attention units learn a smaller σ than feedforward units).

Writes trained_diagnostics.{md,json} into `--output_dir` (default benchmarks/results), replacing them.

    make demo MODEL=imixer; make demo MODEL=hyperbf   # the two model folders
    python benchmarks/trained_diagnostics.py --imixer runs/demo-imixer --hyperbf runs/demo-hyperbf
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import torch
from transformers import AutoImageProcessor

from energyformers import HyperBFConfig, HyperBFForImageClassification, IMixerForImageClassification
from energyformers.training.data import load_data
from energyformers.training.processing import image_transform

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package


def training_command(model_dir: str | Path) -> str | None:
    """The command that trained the model in `model_dir`, as `energyformers train` records it in metrics.json."""
    metrics = Path(model_dir) / "metrics.json"
    if not metrics.is_file():
        return None
    return (json.loads(metrics.read_text(encoding="utf-8")).get("recipe") or {}).get("command")


def trained_by_line(model_dir: str) -> str:
    command = training_command(model_dir)
    if command is None:
        return f"`{model_dir}` records no training command (no `metrics.json` from `energyformers train`)."
    return f"Trained with `{command}` (its `metrics.json`)."


def test_batches(model_dir: str, dataset: str, batch_size: int = 256) -> list[dict[str, torch.Tensor]]:
    test = load_data(dataset)["test"].with_transform(
        image_transform(AutoImageProcessor.from_pretrained(model_dir))
    )
    batches = [test[i : i + batch_size] for i in range(0, len(test), batch_size)]
    return [{"pixel_values": b["pixel_values"], "labels": torch.as_tensor(b["labels"])} for b in batches]


@torch.inference_mode()
def imixer_section(model_dir: str, dataset: str, longest: int) -> tuple[list[str], dict]:
    model = IMixerForImageClassification.from_pretrained(model_dir).eval()
    trained = model.config.fixed_point_iterations
    batches = test_batches(model_dir, dataset)
    accuracy, residuals = {}, None
    for n in range(longest + 1):
        correct, total, summed = 0, 0, torch.zeros(n)
        for batch in batches:
            out = model(
                pixel_values=batch["pixel_values"],
                fixed_point_iterations=n,
                output_fixed_point_residuals=True,
            )
            correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
            if n:
                summed += out.fixed_point_residuals.relative_residuals.mean(0) * len(batch["labels"])
        accuracy[n] = correct / total
        residuals = summed / total
    lines = [
        f"## iMixer: fixed-point solve on `{model_dir}` (trained with n = {trained}; `{dataset}` test split)",
        "",
        trained_by_line(model_dir),
        "",
        f"Relative residual per iteration a (mean over blocks and test images), solving for {longest} iterations:",
        "",
        "| a | " + " | ".join(str(a) for a in range(1, longest + 1)) + " |",
        "|---|" + "---|" * longest,
        "| ‖x_a − x_{a−1}‖ / ‖x_{a−1}‖ | " + " | ".join(f"{r:.2e}" for r in residuals.tolist()) + " |",
        "",
        "Test accuracy with n fixed-point iterations at test time (n = 0 drops the solve: the vanilla Mixer path):",
        "",
        "| n | " + " | ".join(str(n) for n in accuracy) + " |",
        "|---|" + "---|" * len(accuracy),
        "| accuracy | " + " | ".join(f"{a:.4f}" for a in accuracy.values()) + " |",
    ]
    data = {
        "model_dir": model_dir,
        "dataset": dataset,
        "training_command": training_command(model_dir),
        "trained_fixed_point_iterations": trained,
        "relative_residuals": residuals.tolist(),
        "accuracy": accuracy,
    }
    return lines, data


@torch.no_grad()
def hyperbf_section(model_dir: str) -> tuple[list[str], dict]:
    model = HyperBFForImageClassification.from_pretrained(model_dir).eval()
    fresh = HyperBFForImageClassification(HyperBFConfig.from_pretrained(model_dir))
    lines = [
        f"## HyperBF: learned kernel widths on `{model_dir}`",
        "",
        trained_by_line(model_dir),
        "",
        "| layer | attention σ per head (init) | attention σ per head (trained) | feedforward σ (init) | feedforward σ (trained) |",
        "|---|---|---|---|---|",
    ]
    layers = []
    for index, (trained, initial) in enumerate(zip(model.hyperbf.layers, fresh.hyperbf.layers)):
        sigmas = {
            "attention_init": initial.attention.sigma().flatten().tolist(),
            "attention_trained": trained.attention.sigma().flatten().tolist(),
            "feedforward_init": initial.feedforward.sigma().flatten().tolist(),
            "feedforward_trained": trained.feedforward.sigma().flatten().tolist(),
        }
        layers.append(sigmas)

        def fmt(t: torch.Tensor) -> str:
            return ", ".join(f"{v:.2f}" for v in t.flatten().tolist()[:8])

        lines.append(
            f"| {index} | {fmt(initial.attention.sigma())} | {fmt(trained.attention.sigma())} | "
            f"{fmt(initial.feedforward.sigma())} | {fmt(trained.feedforward.sigma())} |"
        )
    return lines, {
        "model_dir": model_dir,
        "training_command": training_command(model_dir),
        "sigma_per_layer": layers,
    }


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--imixer", default="runs/demo-imixer")
    parser.add_argument("--hyperbf", default="runs/demo-hyperbf")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument(
        "--longest", type=int, default=8, help="most fixed-point iterations evaluated for iMixer"
    )
    parser.add_argument(
        "--output_dir", type=Path, default=provenance.RESULTS, help="default benchmarks/results"
    )
    args = parser.parse_args(argv)
    if args.longest < 1:
        parser.error(f"--longest must be a positive integer, got {args.longest}")
    # evaluation only (eval mode, fixed data order): no randomness; the models' training seeds are their own
    run = provenance.run_info(seed=None, argv=argv, script=__file__)
    lines = ["# Diagnostics of trained iMixer and HyperBF models", "", *provenance.markdown_lines(run), ""]
    imixer_lines, imixer = imixer_section(args.imixer, args.dataset, args.longest)
    hyperbf_lines, hyperbf = hyperbf_section(args.hyperbf)
    lines += [*imixer_lines, "", *hyperbf_lines]
    text = "\n".join(lines) + "\n"
    results = provenance.output_dir(args.output_dir)
    (results / "trained_diagnostics.json").write_text(
        json.dumps({"run": run, "imixer": imixer, "hyperbf": hyperbf}, indent=2)
    )
    (results / "trained_diagnostics.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
