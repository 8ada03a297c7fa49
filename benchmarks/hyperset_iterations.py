"""What recurrent depth buys: Hyper-SET energies per iteration and accuracy vs test-time iterations.

Takes a trained Hyper-SET image classifier folder (e.g. the output of `make demo`), runs the test split
of its dataset with `output_energies=True` at the trained depth and at other iteration counts, and
writes hyperset_iterations.{md,json,png} into `--output_dir` (default benchmarks/results), replacing them:

* mean E_ATTN, E_FF, effective rank and pairwise angle per iteration t = 0..T' (T' = the largest
  iteration count evaluated, beyond the trained T);
* test accuracy for each iteration count (test-time depth extrapolation).

The plots mark the depths the model was trained at as `energyformers inspect` does: the fixed T, or the range
`iteration_sampling` drew from (`config.iteration_range`) for a model trained at sampled depth. The results name
the model's training command where its folder records one (`metrics.json`, written by `energyformers train`).

    python benchmarks/hyperset_iterations.py runs/demo-hyperset --dataset digits
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import torch
from transformers import AutoImageProcessor

from energyformers import HyperSetForImageClassification
from energyformers.training.data import load_data
from energyformers.training.processing import image_transform

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

# The model's configuration fields that decide how its iterations behave, recorded with the results.
DYNAMICS_FIELDS = (
    "num_iterations",
    "iteration_conditioning",
    "step_size_condition",
    "input_anchor",
    "iteration_sampling",
    "min_iterations",
    "max_iterations",
    "backprop_iterations",
)


def trained_range(config: Any) -> tuple[int, int]:
    """(smallest, largest) depth the model's training forwards ran: (T, T) at fixed depth, the range
    `iteration_sampling` drew from otherwise."""
    if getattr(config, "iteration_sampling", "fixed") == "fixed":
        return config.num_iterations, config.num_iterations
    return config.iteration_range


def training_command(model_dir: str | Path) -> str | None:
    """The command that trained the model in `model_dir`, as `energyformers train` records it in metrics.json."""
    metrics = Path(model_dir) / "metrics.json"
    if not metrics.is_file():
        return None
    return (json.loads(metrics.read_text(encoding="utf-8")).get("recipe") or {}).get("command")


def mark_trained(ax: Any, trained: int, low: int, high: int, label: bool) -> None:
    """The trained depth T as a dashed line; the sampled range [low, high] shaded when training drew the depth."""
    if low == high:
        ax.axvline(trained, color="grey", linestyle="--", label=f"trained T = {trained}" if label else None)
        return
    ax.axvspan(
        low,
        high,
        color="tab:green",
        alpha=0.12,
        lw=0,
        label=f"trained depths {low}–{high}" if label else None,
    )
    ax.axvline(trained, color="grey", linestyle="--", label=f"T = {trained} (eval mode)" if label else None)


@torch.inference_mode()
def evaluate(model, batches, num_iterations: int) -> tuple[float, dict[str, torch.Tensor]]:
    correct, total, sums = 0, 0, {}
    for batch in batches:
        out = model(pixel_values=batch["pixel_values"], num_iterations=num_iterations, output_energies=True)
        correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
        total += len(batch["labels"])
        for name, value in out.energies.items():  # (B, L, T + 1[, H]) → summed over the batch
            sums[name] = sums.get(name, 0) + value.sum(0)
    return correct / total, {name: value / total for name, value in sums.items()}


def depth_note(t: int, trained: int, low: int, high: int) -> str:
    """The table's mark of iteration t: the trained T at fixed depth; at sampled depth T (eval mode) and the ends
    of the trained range."""
    if low == high:
        return " (trained T)" if t == trained else ""
    notes = [
        note
        for note, at in (("trained min", low), ("T, eval mode", trained), ("trained max", high))
        if t == at
    ]
    return f" ({', '.join(notes)})" if notes else ""


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("model_dir")
    parser.add_argument("--dataset", default="digits")
    parser.add_argument(
        "--max_factor", type=float, default=3.0, help="evaluate up to this multiple of the trained T"
    )
    parser.add_argument("--batch_size", type=int, default=256)
    parser.add_argument(
        "--output_dir", type=Path, default=provenance.RESULTS, help="default benchmarks/results"
    )
    args = parser.parse_args(argv)
    if args.max_factor <= 1:
        parser.error(
            f"--max_factor must be greater than 1 (a multiple of the trained T), got {args.max_factor:g}"
        )
    # evaluation is deterministic (eval mode, fixed data order); the seed the model was trained with is its own
    run = provenance.run_info(seed=None, argv=argv, script=__file__)

    model = HyperSetForImageClassification.from_pretrained(args.model_dir).eval()
    trained = model.config.num_iterations
    low, high = trained_range(model.config)
    test = load_data(args.dataset)["test"].with_transform(
        image_transform(AutoImageProcessor.from_pretrained(args.model_dir))
    )
    batches = [test[i : i + args.batch_size] for i in range(0, len(test), args.batch_size)]
    batches = [{"pixel_values": b["pixel_values"], "labels": torch.as_tensor(b["labels"])} for b in batches]

    longest = max(high + 1, round(args.max_factor * trained))  # past every depth training ran
    counts = sorted(
        {1, max(1, trained // 2), trained, 2 * trained, longest}
        | set(range(1, longest + 1, max(1, trained // 4)))
    )
    accuracy = {}
    for count in counts:
        accuracy[count], energies = evaluate(model, batches, count)
        if count == longest:
            trajectory = energies
    layer = model.config.num_hidden_layers - 1  # the last layer's trajectory
    curves = {
        "attention_energy": trajectory["attention_energy"][layer].tolist(),
        "feedforward_energy": trajectory["feedforward_energy"][layer].tolist(),
        "effective_rank": trajectory["effective_rank"][layer].mean(-1).tolist(),
        "average_angle": trajectory["average_angle"][layer].mean(-1).tolist(),
    }

    results = provenance.output_dir(args.output_dir)
    dynamics = {k: getattr(model.config, k) for k in DYNAMICS_FIELDS if hasattr(model.config, k)}
    trained_by = training_command(args.model_dir)
    fig, axes = plt.subplots(1, 5, figsize=(20, 3.6))
    for index, (ax, (name, values)) in enumerate(zip(axes, curves.items())):
        ax.plot(range(len(values)), values, marker=".")
        mark_trained(ax, trained, low, high, label=index == 0)
        ax.set_title(name.replace("_", " "))
        ax.set_xlabel("iteration t")
    axes[0].legend()
    axes[-1].plot(list(accuracy), list(accuracy.values()), marker="o")
    mark_trained(axes[-1], trained, low, high, label=False)
    axes[-1].set_title(f"test accuracy ({args.dataset})")
    axes[-1].set_xlabel("iterations at test time")
    fig.tight_layout()
    fig.savefig(results / "hyperset_iterations.png", dpi=110)

    (results / "hyperset_iterations.json").write_text(
        json.dumps(
            {
                "run": run,
                "model_config": dynamics,
                "model_training_command": trained_by,
                "trained_iterations": trained,
                "trained_iteration_range": [low, high],
                "accuracy": accuracy,
                "curves": curves,
            },
            indent=2,
        )
    )
    lines = [
        "# Hyper-SET: energy per iteration and test-time depth",
        "",
        *provenance.markdown_lines(run),
        "",
        f"Model `{args.model_dir}`: "
        + ", ".join(f"{k} = {v}" for k, v in dynamics.items())
        + (f"; trained at depths {low}–{high}" if low != high else "")
        + "; test split of "
        f"`{args.dataset}`, {sum(len(b['labels']) for b in batches)} images, evaluated in eval mode (no sampling). "
        "Plot: [`hyperset_iterations.png`](hyperset_iterations.png).",
        "",
        (
            f"Model trained with `{trained_by}` (its `metrics.json`)."
            if trained_by
            else f"`{args.model_dir}` records no training command (no `metrics.json` from `energyformers train`)."
        ),
        "",
        "| iterations at test time | " + " | ".join(str(c) for c in accuracy) + " |",
        "|---|" + "---|" * len(accuracy),
        "| test accuracy | " + " | ".join(f"{a:.4f}" for a in accuracy.values()) + " |",
        "",
        f"Mean over the test set, last layer, running {longest} iterations (t = 0 is the embedded input):",
        "",
        "| t | E_ATTN | E_FF | effective rank (mean over heads) | mean angle (deg) |",
        "|---|---|---|---|---|",
    ]
    for t in range(len(curves["attention_energy"])):
        lines.append(
            f"| {t}{depth_note(t, trained, low, high)} | {curves['attention_energy'][t]:.2f} | "
            f"{curves['feedforward_energy'][t]:.3f} | {curves['effective_rank'][t]:.3f} | {curves['average_angle'][t]:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    (results / "hyperset_iterations.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
