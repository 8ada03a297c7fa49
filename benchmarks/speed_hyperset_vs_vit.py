"""Hyper-SET vs HF ViT of the same width and depth: forward / training-step time, in one run.

ARCHITECTURE.md's FLOP budget: at d = 384, 224² images, patch 16, 12 iterations (Hyper-SET, M = d)
vs 12 layers (ViT, MLP 4d), Hyper-SET needs ≈ 4.9 GFLOP per image and ViT ≈ 9.2, so Hyper-SET should
be ≈ 1.8–1.9× faster. Runs are interleaved (A, B, A, B, ...) so machine load hits both alike; we
report medians and the ratio. Results go to benchmarks/results/speed_hyperset_vs_vit.md.

    python benchmarks/speed_hyperset_vs_vit.py [--batch 8] [--repeats 7] [--image 224]
"""

from __future__ import annotations

import argparse
import json
import platform
import statistics
import time
from pathlib import Path

import torch
from transformers import ViTConfig, ViTForImageClassification

from energyformers import HyperSetConfig, HyperSetForImageClassification

RESULTS = Path(__file__).parent / "results"


def build(image: int, patch: int, width: int, heads: int, depth: int) -> dict[str, torch.nn.Module]:
    torch.manual_seed(0)
    hyperset = HyperSetForImageClassification(
        HyperSetConfig.from_preset(
            "cifar10-small",
            image_size=image,
            patch_size=patch,
            hidden_size=width,
            num_attention_heads=heads,
            intermediate_size=width,
            num_iterations=depth,
        )
    )
    vit = ViTForImageClassification(
        ViTConfig(
            image_size=image,
            patch_size=patch,
            hidden_size=width,
            num_attention_heads=heads,
            num_hidden_layers=depth,
            intermediate_size=4 * width,
            num_labels=10,
            attn_implementation="sdpa",
        )
    )
    return {"hyperset": hyperset, "vit": vit}


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


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--image", type=int, default=224)
    parser.add_argument("--patch", type=int, default=16)
    parser.add_argument("--width", type=int, default=384)
    parser.add_argument("--heads", type=int, default=6)
    parser.add_argument("--depth", type=int, default=12, help="Hyper-SET iterations = ViT layers")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args()

    models = {
        name: m.to(args.device)
        for name, m in build(args.image, args.patch, args.width, args.heads, args.depth).items()
    }
    pixels = torch.randn(args.batch, 3, args.image, args.image, device=args.device)
    labels = torch.randint(0, 10, (args.batch,), device=args.device)
    rows = {}
    for mode in ("forward", "train_step"):
        times: dict[str, list[float]] = {name: [] for name in models}
        for model in models.values():  # warm-up
            time_once(model, pixels, labels, mode == "train_step")
        for _ in range(args.repeats):
            for name, model in models.items():
                times[name].append(time_once(model, pixels, labels, mode == "train_step"))
        rows[mode] = {name: statistics.median(t) for name, t in times.items()}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}

    RESULTS.mkdir(exist_ok=True)
    setting = (
        f"d={args.width}, heads={args.heads}, depth/iterations={args.depth}, image {args.image}², patch {args.patch}, "
        f"batch {args.batch}, {args.repeats} interleaved repeats, device {args.device} "
        f"({platform.processor() or platform.machine()}, torch {torch.__version__}, {torch.get_num_threads()} threads)"
    )
    lines = [
        "# Hyper-SET vs HF ViT (same width and depth)",
        "",
        f"Command: `python benchmarks/speed_hyperset_vs_vit.py --batch {args.batch} --repeats {args.repeats} "
        f"--image {args.image}`  ",
        f"Setting: {setting}",
        "",
        "| measure | Hyper-SET | ViT | ViT / Hyper-SET |",
        "|---|---|---|---|",
        f"| parameters | {params['hyperset']:,} | {params['vit']:,} | {params['vit'] / params['hyperset']:.2f} |",
    ]
    for mode, medians in rows.items():
        lines.append(
            f"| {mode} median (s / batch) | {medians['hyperset']:.4f} | {medians['vit']:.4f} | "
            f"{medians['vit'] / medians['hyperset']:.2f} |"
        )
    text = "\n".join(lines) + "\n"
    (RESULTS / "speed_hyperset_vs_vit.md").write_text(text)
    (RESULTS / "speed_hyperset_vs_vit.json").write_text(
        json.dumps({"setting": setting, "params": params, **rows}, indent=2)
    )
    print(text)


if __name__ == "__main__":
    main()
