"""CPU timing of HyperBF's two feedforward paths under `attn_implementation="sdpa"`: folded vs explicit.

The normalized RBF feedforward can run as one bias-folded attention call (head width max(R + 1, D) rounded up
to 8) or as the explicit two matrix products with a softmax between them; the model folds only up to the
fused CUDA kernels' head width (256). This script measures, on the CPU it runs on, whether that rule also
holds there: for each width it times the feedforward unit alone and whole models at the `digits` and `cifar`
presets, both paths in the same process, alternating the paths within every repeat so that drift on a shared
machine hits both alike, and reports medians.

    .venv/bin/python benchmarks/hyperbf_feedforward_paths.py [--repeats 15] [--threads 1] [--output PATH]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import torch

from energyformers.configuration.configuration_hyperbf import HyperBFConfig
from energyformers.modeling.modeling_hyperbf import (
    FUSED_ATTENTION_MAX_HEAD_DIM,
    HyperBFForImageClassification,
    HyperBFModel,
    _folded_width,
)

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

SEED = 0  # of every model's weights and inputs

# Feedforward widths D (R = D, K = 4·D, the defaults): folded widths from 72 to 776, across the 256 limit.
WIDTHS = [64, 128, 192, 248, 256, 384, 512, 768]
# Rows of the feedforward-only timing: batch 32 of the memo's 65 tokens (32²/4² patches + CLS).
UNIT_BATCH, UNIT_TOKENS = 32, 65
# Whole models: (label, preset, overrides, batch).
MODELS = [
    ("digits (D=64, 2 blocks)", "digits", {}, 64),
    ("cifar (D=768, 4 blocks)", "cifar", {}, 8),
]
PATHS = ("folded", "explicit")


def force_path(model: torch.nn.Module, path: str) -> None:
    """Every feedforward of `model` on `path`, whatever its width (the model's own rule chooses by width)."""
    for module in model.modules():
        if hasattr(module, "folds"):
            module.folds = path == "folded"


def timed(step: Callable[[], None]) -> float:
    start = time.perf_counter()
    step()
    return (time.perf_counter() - start) * 1e3


def inference_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        model.eval()
        with torch.no_grad():
            model(**inputs)

    return step


def train_step(model: torch.nn.Module, inputs: dict[str, torch.Tensor]) -> Callable[[], None]:
    def step() -> None:
        model.train()
        model.zero_grad(set_to_none=True)
        output = model(**inputs)
        output = output[0] if isinstance(output, tuple) else output
        output = output.logits if hasattr(output, "logits") else output
        output.float().pow(2).mean().backward()

    return step


class _FeedForwardOnly(torch.nn.Module):
    """The feedforward of a one-block `HyperBFModel`, alone."""

    def __init__(self, model: HyperBFModel) -> None:
        super().__init__()
        self.model = model

    def cached_centers(self) -> contextlib.AbstractContextManager:
        return self.model.cached_centers()

    def forward(self, hidden_states: torch.Tensor) -> torch.Tensor:
        return self.model.layers[0].feedforward(hidden_states)[0]


def compare(
    build: Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]], repeats: int
) -> dict[str, dict[str, float]]:
    """Median ms of inference and of a training step (forward + backward) per path, the paths alternating."""
    steps = {}
    with contextlib.ExitStack() as cached:
        for path in PATHS:
            for mode in ("inference", "train"):  # a model per mode
                model, inputs = build()
                force_path(model, path)
                if mode == "inference":  # as inference over many batches: the centers' work once
                    cached.enter_context(model.cached_centers())
                steps[(path, mode)] = (inference_step if mode == "inference" else train_step)(model, inputs)
        for step in steps.values():  # warm-up: allocator, thread pool, the eval cache of the centers
            step()
            step()
        samples: dict[tuple[str, str], list[float]] = {key: [] for key in steps}
        for _ in range(repeats):
            for key, step in steps.items():
                samples[key].append(timed(step))
    return {
        path: {mode: statistics.median(samples[(path, mode)]) for mode in ("inference", "train")}
        for path in PATHS
    }


def feedforward_unit(width: int) -> Callable[[], tuple[torch.nn.Module, dict[str, torch.Tensor]]]:
    def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        torch.manual_seed(SEED)
        config = HyperBFConfig(hidden_size=width, num_attention_heads=4, num_hidden_layers=1)
        model = HyperBFModel(config)
        hidden = torch.nn.functional.layer_norm(torch.randn(UNIT_BATCH, UNIT_TOKENS, width), (width,))
        return _FeedForwardOnly(model), {"hidden_states": hidden}

    return build


def whole_model(preset: str, overrides: dict, batch: int) -> Callable[[], tuple[torch.nn.Module, dict]]:
    def build() -> tuple[torch.nn.Module, dict[str, torch.Tensor]]:
        torch.manual_seed(SEED)
        config = HyperBFConfig.from_preset(preset, **overrides)
        model = HyperBFForImageClassification(config)
        side = config.image_size
        pixels = torch.randn(batch, config.num_channels, side, side)
        return model, {"pixel_values": pixels}

    return build


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=15)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--output", type=Path, default=Path(__file__).parent / "results" / "hyperbf_feedforward_paths.md"
    )
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.threads < 1:
        parser.error(f"--repeats and --threads must be >= 1; got {args.repeats} and {args.threads}")
    torch.set_num_threads(args.threads)
    run = provenance.run_info(seed=SEED, argv=argv, script=__file__)

    unit_rows = []
    for width in WIDTHS:
        result = compare(feedforward_unit(width), args.repeats)
        unit_rows.append((width, result))
        print(width, result, flush=True)
    model_rows = []
    for label, preset, overrides, batch in MODELS:
        result = compare(whole_model(preset, overrides, batch), args.repeats)
        model_rows.append((label, batch, result))
        print(label, result, flush=True)

    def ratio(result: dict, mode: str) -> str:
        return f"{result['explicit'][mode] / result['folded'][mode]:.2f}"

    lines = [
        "# HyperBF feedforward under sdpa: folded vs explicit, CPU",
        "",
        *provenance.markdown_lines(run),
        "",
        f"{args.threads} torch thread(s). Median of {args.repeats} repeats after 2 warm-up calls; the two paths alternate within every repeat, in "
        "one process. float32. Inference: eval mode without autograd inside `cached_centers()` (both paths "
        "keep what they compute from the centers across calls); train: one forward and backward, no optimiser step. Ratio = explicit ms / folded ms "
        "(> 1: folding is faster). The model folds at folded widths "
        f"<= {FUSED_ATTENTION_MAX_HEAD_DIM} (see docs/hyperbf.md).",
        "",
        f"Feedforward unit alone, {UNIT_BATCH}×{UNIT_TOKENS} tokens, R = D, K = 4·D:",
        "",
        "| D | folded width | folded inf ms | explicit inf ms | ratio | folded train ms | explicit train ms | ratio |",
        "|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for width, result in unit_rows:
        f, e = result["folded"], result["explicit"]
        lines.append(
            f"| {width} | {_folded_width(width + 1, width)} | {f['inference']:.2f} | {e['inference']:.2f} | "
            f"{ratio(result, 'inference')} | {f['train']:.2f} | {e['train']:.2f} | {ratio(result, 'train')} |"
        )
    lines += [
        "",
        "Whole `HyperBFForImageClassification` (sdpa attention in both rows; only the feedforward differs):",
        "",
        "| model | batch | folded inf ms | explicit inf ms | ratio | folded train ms | explicit train ms | ratio |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for label, batch, result in model_rows:
        f, e = result["folded"], result["explicit"]
        lines.append(
            f"| {label} | {batch} | {f['inference']:.2f} | {e['inference']:.2f} | {ratio(result, 'inference')} | "
            f"{f['train']:.2f} | {e['train']:.2f} | {ratio(result, 'train')} |"
        )
    args.output.write_text("\n".join(lines) + "\n")
    raw = {
        "run": run,
        "units": {str(w): r for w, r in unit_rows},
        "models": {label: {"batch": b, **r} for label, b, r in model_rows},
    }
    args.output.with_suffix(".json").write_text(json.dumps(raw, indent=1) + "\n")
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
