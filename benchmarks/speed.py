"""Speed of each family against its baseline, measured side by side in one run.

* Hyper-SET (cifar10-small: d = 384, 6 heads, T = 12, M = d) vs HF ViT of the same width, heads and depth
  (MLP 4d). ARCHITECTURE.md's FLOP budget at 224²/16: ≈ 4.9 vs ≈ 9.2 GFLOP per image, so ≈ 1.8–1.9×.
* iMixer-S/16 (h_r = 2, n = 2) vs the vanilla MLP-Mixer-S/16 (the same trunk with n = 0, = timm's Mixer).
* HyperBF (memo CIFAR setting: D = 768, 4 heads, 4 blocks, 32²/4) vs HF ViT with the same width, heads,
  depth and MLP 4D.

Runs of a pair are interleaved (A, B, A, B, ...) so machine load hits both alike; the table reports
medians and the baseline / model ratio (> 1: the model is faster). Forward = inference mode; train step =
forward + backward. Results: benchmarks/results/speed.{md,json}.

    python benchmarks/speed.py [--batch 8] [--repeats 7] [--device cpu|cuda]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from collections.abc import Callable
from pathlib import Path

import torch
from transformers import ViTConfig, ViTForImageClassification

from energyformers import (
    HyperBFConfig,
    HyperBFForImageClassification,
    HyperSetConfig,
    HyperSetForImageClassification,
    IMixerConfig,
    IMixerForImageClassification,
)

RESULTS = Path(__file__).parent / "results"


def vit_like(width: int, heads: int, depth: int, image: int, patch: int) -> ViTForImageClassification:
    config = ViTConfig(
        image_size=image, patch_size=patch, hidden_size=width, num_attention_heads=heads, num_hidden_layers=depth,
        intermediate_size=4 * width, num_labels=10, attn_implementation="sdpa",
    )  # fmt: skip
    return ViTForImageClassification(config)


# name, model builder, baseline name, baseline builder, image side
PAIRS: list[tuple[str, Callable[[], torch.nn.Module], str, Callable[[], torch.nn.Module], int]] = [
    (
        "Hyper-SET cifar10-small (224²/16, T=12)",
        lambda: HyperSetForImageClassification(HyperSetConfig.from_preset("cifar10-small")),
        "ViT d=384, 6 heads, 12 layers",
        lambda: vit_like(384, 6, 12, 224, 16),
        224,
    ),
    (
        "iMixer-S/16 (h_r=2, n=2)",
        lambda: IMixerForImageClassification(IMixerConfig.from_preset("s16")),
        "MLP-Mixer-S/16 (n=0)",
        lambda: IMixerForImageClassification(IMixerConfig.from_preset("s16", fixed_point_iterations=0)),
        224,
    ),
    (
        "HyperBF cifar (32²/4, D=768, 4 blocks)",
        lambda: HyperBFForImageClassification(HyperBFConfig.from_preset("cifar")),
        "ViT D=768, 4 heads, 4 layers",
        lambda: vit_like(768, 4, 4, 32, 4),
        32,
    ),
]


def time_once(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, train: bool) -> float:
    start = time.perf_counter()
    if train:
        model.train()
        model(pixel_values=pixels, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
    else:
        model.eval()
        with torch.inference_mode():
            model(pixel_values=pixels)
    if pixels.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(
    models: dict[str, torch.nn.Module], pixels: torch.Tensor, repeats: int
) -> dict[str, dict[str, float]]:
    labels = torch.randint(0, 10, (pixels.shape[0],), device=pixels.device)
    medians = {}
    for mode in ("forward", "train_step"):
        times: dict[str, list[float]] = {name: [] for name in models}
        for model in models.values():  # warm-up
            time_once(model, pixels, labels, mode == "train_step")
        for _ in range(repeats):
            for name, model in models.items():
                times[name].append(time_once(model, pixels, labels, mode == "train_step"))
        medians[mode] = {name: statistics.median(t) for name, t in times.items()}
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else platform.machine()
    setting = (
        f"batch {args.batch}, {args.repeats} interleaved repeats after one warm-up, device {args.device} "
        f"({device_name}), torch {torch.__version__}, {torch.get_num_threads()} CPU threads, float32"
    )
    lines = [
        "# Speed: each family vs its baseline (same run)",
        "",
        f"Command: `python benchmarks/speed.py --batch {args.batch} --repeats {args.repeats} --device {args.device}`  ",
        f"Setting: {setting}",
        "",
        "| model | baseline | params (model / baseline) | forward s/batch (model / baseline) | ratio | "
        "train step s/batch (model / baseline) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    records = []
    for name, build, baseline_name, build_baseline, side in PAIRS:
        torch.manual_seed(0)
        models = {name: build().to(args.device), baseline_name: build_baseline().to(args.device)}
        pixels = torch.randn(args.batch, 3, side, side, device=args.device)
        medians = measure(models, pixels, args.repeats)
        params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
        fwd, step = medians["forward"], medians["train_step"]
        lines.append(
            f"| {name} | {baseline_name} | {params[name]:,} / {params[baseline_name]:,} | "
            f"{fwd[name]:.4f} / {fwd[baseline_name]:.4f} | {fwd[baseline_name] / fwd[name]:.2f} | "
            f"{step[name]:.4f} / {step[baseline_name]:.4f} | {step[baseline_name] / step[name]:.2f} |"
        )
        records.append({"model": name, "baseline": baseline_name, "params": params, **medians})
        print(lines[-1], flush=True)
    lines += ["", "ratio = baseline time / model time (> 1: the model is faster than its baseline)."]
    RESULTS.mkdir(exist_ok=True)
    text = "\n".join(lines) + "\n"
    (RESULTS / "speed.md").write_text(text)
    (RESULTS / "speed.json").write_text(json.dumps({"setting": setting, "pairs": records}, indent=2))
    print(text)


if __name__ == "__main__":
    main()
