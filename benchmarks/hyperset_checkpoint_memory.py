"""Activation memory of Hyper-SET vs iterations T, with and without per-iteration gradient checkpointing.

Counts the bytes of the tensors autograd saves for backward (through `saved_tensors_hooks`, so it is
exact and device-independent) during one training forward of cifar10-small at 224²/16, and compares
with HF ViT of the same width at the same depth. Writes hyperset_checkpoint_memory.md into `--output_dir`
(default benchmarks/results), replacing it. About a minute on CPU.

    python benchmarks/hyperset_checkpoint_memory.py [--batch 2] [--output_dir DIR]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch
from transformers import ViTConfig, ViTForImageClassification

from energyformers import HyperSetConfig, HyperSetForImageClassification
from energyformers.training.setup import enable_activation_checkpointing

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

SEED = 0


def saved_bytes(model: torch.nn.Module, pixels: torch.Tensor, **kwargs) -> int:
    """Bytes of distinct storages autograd keeps for backward during one training forward."""
    storages: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        storages[storage.data_ptr()] = storage.nbytes()
        return tensor

    model.train()
    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = model(pixel_values=pixels, labels=torch.zeros(len(pixels), dtype=torch.long), **kwargs).loss
    loss.backward()
    return sum(storages.values())


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument(
        "--output_dir", type=Path, default=provenance.RESULTS, help="default benchmarks/results"
    )
    args = parser.parse_args(argv)
    if args.batch < 1:
        parser.error(f"--batch must be a positive integer, got {args.batch}")
    run = provenance.run_info(seed=SEED, argv=argv, script=__file__)
    torch.manual_seed(SEED)
    pixels = torch.randn(args.batch, 3, 224, 224)
    hyperset = HyperSetForImageClassification(HyperSetConfig.from_preset("cifar10-small"))
    checkpointed = HyperSetForImageClassification(HyperSetConfig.from_preset("cifar10-small"))
    enable_activation_checkpointing(checkpointed)
    lines = [
        "# Hyper-SET activation memory vs iterations (per-iteration gradient checkpointing)",
        "",
        *provenance.markdown_lines(run),
        "",
        f"Batch {args.batch}; bytes of the tensors autograd saves for backward in one training forward (224², patch 16, d = 384, 6 heads); "
        "weights saved for backward are included (once per storage). ViT: same width and heads, depth = T, MLP 4d.",
        "",
        "| T | Hyper-SET (MiB) | Hyper-SET, checkpointed (MiB) | ViT depth T (MiB) |",
        "|---|---|---|---|",
    ]
    for iterations in (4, 12, 24, 48):
        vit = ViTForImageClassification(
            ViTConfig(image_size=224, patch_size=16, hidden_size=384, num_attention_heads=6,
                      num_hidden_layers=iterations, intermediate_size=1536, num_labels=10)
        )  # fmt: skip
        row = [
            saved_bytes(hyperset, pixels, num_iterations=iterations),
            saved_bytes(checkpointed, pixels, num_iterations=iterations),
            saved_bytes(vit, pixels),
        ]
        lines.append(f"| {iterations} | " + " | ".join(f"{b / 2**20:.1f}" for b in row) + " |")
        print(lines[-1], flush=True)
    text = "\n".join(lines) + "\n"
    (provenance.output_dir(args.output_dir) / "hyperset_checkpoint_memory.md").write_text(text)
    print(text)


if __name__ == "__main__":
    main()
