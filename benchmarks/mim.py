"""Masked image modelling on CPU: Hyper-SET vs the looped Transformer (Table 2's baseline) at equal budget.

Both models are trained through the real CLI (`energyformers train --task masked-image-modeling`), each in its
own subprocess, two at a time with one thread each, on the same data (`digits`), the same VQ tokenizer (a patch
k-means codebook fitted once here and passed to both with `--tokenizer`), the same steps, batch, learning rate
and seed. Sizes are reduced from the paper's (d = 768, 1024 codes, 16 × 16 grid) to fit a CPU: the CLI's
`cli-mim` presets at a smaller width (stated in the results). The reloaded run folders are then measured on the
test split with the paper's 40 % masking (fixed masks): masked-token accuracy of one forward pass, MaskGIT
decoding (arccos schedule, seeded) and PSNR/SSIM of the decoded grid turned into pixels by the tokenizer;
accuracy and PSNR against decoding steps and against iterations beyond the trained T (T/2 … 4T); and a
picture of one decode sequence (`mim_decode.png`).

Writes benchmarks/results/mim.{md,json,png} and mim_decode.png.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/mim.py             # ~10 min on 2 shared cores
    .venv/bin/python benchmarks/mim.py --smoke --out /tmp/mim-smoke         # seconds: checks the script runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = Path(__file__).parent / "results"
MODELS = ("hyperset", "looped-transformer")
LABELS = {"hyperset": "Hyper-SET", "looped-transformer": "looped Transformer"}
DECODE_STEPS = (1, 4, 8, 12, 24)
DEPTH_FACTORS = (0.5, 1, 2, 4)  # test-time iterations as multiples of the trained T


def sizes(width: int, iterations: int) -> dict[str, list[str]]:
    """`--config` of each model: the `cli-mim` presets at `width` (Hyper-SET: dictionary M = d, as the paper's
    1/12/d row; the baseline: MLP 4d, as its 1/12/4d row), `iterations` iterations of one layer."""
    heads = max(1, width // 16)
    return {
        "hyperset": [
            f"hidden_size={width}",
            f"num_attention_heads={heads}",
            f"intermediate_size={width}",
            f"time_embedding_dim={width}",
            f"num_iterations={iterations}",
        ],
        "looped-transformer": [
            f"hidden_size={width}",
            f"num_attention_heads={heads}",
            f"intermediate_size={4 * width}",
            f"num_iterations={iterations}",
        ],
    }


def fit_tokenizer(folder: Path, codebook_size: int, seed: int, limits: list[str]) -> None:
    """The shared VQ tokenizer: fitted on the training images exactly as a run without `--tokenizer` fits it."""
    from energyformers.training.data import load_data, masked_image_data

    data = load_data("digits", seed=0)
    if "--max_train_samples" in limits:
        data["train"] = data["train"].select(range(int(limits[limits.index("--max_train_samples") + 1])))
    prepared = masked_image_data(
        data,
        None,
        codebook_size=codebook_size,
        patch_size=None,
        fit_samples=2000,
        eval_mask_ratio=0.4,
        seed=seed,
    )
    prepared.tokenizer.save_pretrained(folder)


def train_both(work: Path, args: argparse.Namespace, limits: list[str]) -> dict[str, float]:
    """Both trainings at once (2 processes × 1 thread); returns each one's wall time in seconds."""
    procs, started, walls = {}, {}, {}
    for model in MODELS:
        argv = [
            sys.executable, "-m", "energyformers", "train", "--task", "masked-image-modeling",
            "--dataset", "digits", "--model", model, "--tokenizer", str(work / "tokenizer"),
            "--config", *sizes(args.width, args.iterations)[model],
            "--max_steps", str(args.steps), "--batch_size", "64", "--learning_rate", str(args.lr),
            "--seed", str(args.seed), "--eval_strategy", "no", "--decode_steps", "8",
            "--num_threads", "1", "--num_predictions", "0", "--disable_tqdm",
            "--output_dir", str(work / model), "--overwrite_output_dir", *limits,
        ]  # fmt: skip
        log = (work / f"{model}.log").open("w")
        started[model] = time.time()
        procs[model] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    for model, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"training {model} failed; see {work / f'{model}.log'}")
        walls[model] = round(time.time() - started[model], 1)
    return walls


def measure(
    folder: Path,
    steps: tuple[int, ...],
    factors: tuple[float, ...],
    limit: int | None,
    perceptual: dict[str, str | None] | None = None,
) -> dict:
    """Test-split measurements of one reloaded run folder (fixed 40 % masks, seeded decoding); LPIPS / FID of the
    24-step reconstructions (the paper's evaluation) where `perceptual` names their local weight files."""
    import torch
    import transformers

    from energyformers.mim import PatchKMeansTokenizer
    from energyformers.training.data import load_data, masked_image_data
    from energyformers.training.evaluation import masked_image_metrics

    model = transformers.AutoModelForMaskedImageModeling.from_pretrained(folder).eval()
    tokenizer = PatchKMeansTokenizer.from_pretrained(folder)
    data = load_data("digits", seed=0)
    prepared = masked_image_data(
        data, tokenizer, codebook_size=0, patch_size=None, fit_samples=0, eval_mask_ratio=0.4, seed=0
    )
    n = len(prepared.codes["test"]) if limit is None else min(limit, len(prepared.codes["test"]))
    inputs, codes, pixels = (
        prepared.eval_inputs["test"][:n],
        prepared.codes["test"][:n],
        prepared.pixels["test"][:n],
    )
    masked = inputs == model.mask_token_id

    def one_pass(iterations: int | None) -> float:
        with torch.no_grad():
            predicted = model(inputs, num_iterations=iterations).logits.argmax(-1)
        return float((predicted == codes)[masked].float().mean())

    trained = model.config.num_iterations
    result = {
        "num_parameters": model.num_parameters(),
        "trained_iterations": trained,
        "test_images": n,
        "masked_token_accuracy": one_pass(None),
        "decode_24": masked_image_metrics(
            model, inputs, codes, pixels, tokenizer, 24, seed=0, **(perceptual or {})
        ),
        "by_decode_steps": {
            s: masked_image_metrics(model, inputs, codes, pixels, tokenizer, s, seed=0) for s in steps
        },
        "by_iterations": {},
    }
    for factor in factors:
        t = max(1, round(factor * trained))
        decoded = masked_image_metrics(model, inputs, codes, pixels, tokenizer, 8, seed=0, num_iterations=t)
        result["by_iterations"][t] = {"masked_token_accuracy": one_pass(t), **decoded}
    return result


def decode_picture(folder: Path, path: Path, count: int = 3, steps: int = 8) -> None:
    """Original, tokenized, 40 %-masked, the grid after several decoding steps and the final grid, in pixels."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import torch
    import transformers

    from energyformers.mim import PatchKMeansTokenizer
    from energyformers.training.data import load_data, masked_image_data

    model = transformers.AutoModelForMaskedImageModeling.from_pretrained(folder).eval()
    tokenizer = PatchKMeansTokenizer.from_pretrained(folder)
    data = load_data("digits", seed=0)
    prepared = masked_image_data(
        data, tokenizer, codebook_size=0, patch_size=None, fit_samples=0, eval_mask_ratio=0.4, seed=0
    )
    inputs = prepared.eval_inputs["test"][:count]
    out = model.decode(inputs, steps=steps, seed=0)
    p, (rows, columns) = tokenizer.patch_size, tokenizer.grid

    def pixels(grid: torch.Tensor) -> torch.Tensor:
        """Codes → pixels, still-masked patches drawn mid-grey with a dark cross-hatch-free fill (0.5)."""
        hidden = grid == model.mask_token_id
        image = tokenizer.decode(grid.masked_fill(hidden, 0))
        cover = hidden.view(-1, 1, rows, 1, columns, 1).expand(-1, 1, rows, p, columns, p)
        return image.masked_fill(cover.reshape(image.shape), 0.5)

    shown = [1, 2, 4, 6] if steps >= 6 else list(range(1, steps))
    panels = [
        ("original", prepared.pixels["test"][:count]),
        ("tokenized", tokenizer.decode(prepared.codes["test"][:count])),
    ]
    panels += [("40 % masked", pixels(inputs))]
    panels += [(f"after step {s}", pixels(out.sequences[s])) for s in shown]
    panels += [(f"final ({steps} steps)", pixels(out.codes))]
    fig, axes = plt.subplots(count, len(panels), figsize=(1.4 * len(panels), 1.5 * count))
    for row in range(count):
        for column, (title, images) in enumerate(panels):
            ax = axes[row, column]
            ax.imshow(images[row, 0].clamp(0, 1).numpy(), cmap="gray", vmin=0, vmax=1)
            ax.set_xticks([])
            ax.set_yticks([])
            if row == 0:
                ax.set_title(title, fontsize=7)
    fig.suptitle(f"MaskGIT decoding by {folder.name} (digits test images)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def plot(results: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.4))
    for model in MODELS:
        r = results["models"][model]
        steps = sorted(int(s) for s in r["by_decode_steps"])
        left.plot(
            steps,
            [r["by_decode_steps"][s]["decoded_token_accuracy"] for s in steps],
            "o-",
            label=LABELS[model],
        )
        middle.plot(steps, [r["by_decode_steps"][s]["psnr"] for s in steps], "o-", label=LABELS[model])
        depths = sorted(int(t) for t in r["by_iterations"])
        right.plot(
            depths,
            [r["by_iterations"][t]["masked_token_accuracy"] for t in depths],
            "o-",
            label=LABELS[model],
        )
        right.axvline(r["trained_iterations"], color="grey", lw=0.5)
    bound = results["models"]["hyperset"]["decode_24"]["tokenizer_psnr"]
    middle.axhline(bound, color="grey", ls="--", lw=0.8, label="tokenizer bound")
    left.set(xlabel="decoding steps", ylabel="decoded-token accuracy (masked)", title="vs decoding steps")
    middle.set(xlabel="decoding steps", ylabel="PSNR (dB)", title="reconstruction PSNR")
    right.set(xlabel="iterations at test time (trained T: grey)", ylabel="masked-token accuracy (1 pass)")
    right.set_title("vs iterations beyond T")
    for ax in (left, middle, right):
        ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def markdown(results: dict) -> str:
    s = results["setup"]
    lines = [
        "# Masked image modelling on CPU: Hyper-SET vs the looped Transformer",
        "",
        f"Generated by `benchmarks/mim.py` on {s['machine']} ({s['cores']}); wall time {s['wall_time_s']:.0f} s "
        f"(trainings run two at a time, one thread each: {', '.join(f'{LABELS[m]} {w:.0f} s' for m, w in s['train_wall_s'].items())}).",
        "",
        f"Equal budget: `digits` (16 × 16, {s['train_images']} training images), one VQ tokenizer for both (patch "
        f"k-means, {s['codebook_size']} codes of 2 × 2 patches, an 8 × 8 grid of 64 codes), {s['steps']} steps of "
        f"batch 64, lr {s['lr']}, seed {s['seed']}, the paper's masking (r ~ U[0, 0.4] per image, fresh per batch). "
        f"Reduced sizes (the paper: d = 768, 1024 codes, 16 × 16 grid): width {s['width']}, one layer × "
        f"T = {s['iterations']}; Hyper-SET with dictionary M = d (the paper's 1/T/d row), the baseline with MLP 4d "
        "(its 1/T/4d row). Test split: fixed 40 % masks on "
        f"{results['models']['hyperset']['test_images']} images, MaskGIT decoding with the arccos schedule, seed 0.",
        "",
        "| model | parameters | masked-token acc. (1 pass) | decoded-token acc. (24 steps) | PSNR (dB) | SSIM | tokenizer bound PSNR / SSIM |",
        "|---|---:|---:|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        r = results["models"][model]
        d = r["decode_24"]
        lines.append(
            f"| {LABELS[model]} | {r['num_parameters']:,} | {r['masked_token_accuracy']:.3f} | "
            f"{d['decoded_token_accuracy']:.3f} | {d['psnr']:.2f} | {d['ssim']:.3f} | "
            f"{d['tokenizer_psnr']:.2f} / {d['tokenizer_ssim']:.3f} |"
        )
    perceptual = [m for m in ("lpips", "fid") if m in results["models"]["hyperset"]["decode_24"]]
    if perceptual:
        lines += [
            "",
            f"{' and '.join(m.upper() for m in perceptual)} of the 24-step reconstructions (weights: "
            f"{', '.join(s[f'{m}_weights'] for m in perceptual)}); the tokenizer's own in brackets:",
            "",
        ]
        for model in MODELS:
            d = results["models"][model]["decode_24"]
            values = ", ".join(f"{m.upper()} {d[m]:.4g} ({d[f'tokenizer_{m}']:.4g})" for m in perceptual)
            lines.append(f"* {LABELS[model]}: {values}")
    lines += ["", "Decoded-token accuracy / PSNR against decoding steps:", ""]
    steps = sorted(int(x) for x in results["models"]["hyperset"]["by_decode_steps"])
    lines += ["| model | " + " | ".join(f"{x} steps" for x in steps) + " |", "|---|" + "---:|" * len(steps)]
    for model in MODELS:
        r = results["models"][model]["by_decode_steps"]
        lines.append(
            f"| {LABELS[model]} | "
            + " | ".join(f"{r[x]['decoded_token_accuracy']:.3f} / {r[x]['psnr']:.2f}" for x in steps)
            + " |"
        )
    lines += [
        "",
        "Masked-token accuracy (1 pass) / PSNR (8 decoding steps) against test-time iterations:",
        "",
    ]
    depths = sorted(int(x) for x in results["models"]["hyperset"]["by_iterations"])
    lines += ["| model | " + " | ".join(f"T = {x}" for x in depths) + " |", "|---|" + "---:|" * len(depths)]
    for model in MODELS:
        r = results["models"][model]["by_iterations"]
        lines.append(
            f"| {LABELS[model]} | "
            + " | ".join(f"{r[x]['masked_token_accuracy']:.3f} / {r[x]['psnr']:.2f}" for x in depths)
            + " |"
        )
    lines += [
        "",
        "![accuracy and PSNR](mim.png)",
        "",
        "![decode sequence](mim_decode.png)",
        "",
        *results["reading"],
        "",
    ]
    return "\n".join(lines)


def reading(results: dict) -> list[str]:
    """What these numbers can and cannot show."""
    h, b = results["models"]["hyperset"], results["models"]["looped-transformer"]
    better = "Hyper-SET" if h["decode_24"]["psnr"] > b["decode_24"]["psnr"] else "the looped Transformer"
    return [
        "## Reading",
        "",
        f"* At this budget {better} reconstructs better (PSNR {h['decode_24']['psnr']:.2f} vs "
        f"{b['decode_24']['psnr']:.2f} dB, decoded-token accuracy {h['decode_24']['decoded_token_accuracy']:.3f} vs "
        f"{b['decode_24']['decoded_token_accuracy']:.3f}), with {h['num_parameters']:,} vs "
        f"{b['num_parameters']:,} parameters. One seed and a short CPU run: a difference of a few hundredths "
        "is within what another seed could change.",
        "* The tokenizer caps every number: a patch k-means codebook decodes a code to its centroid, so even the "
        f"true codes give only {h['decode_24']['tokenizer_psnr']:.2f} dB, and no decoded grid exceeds that. The PSNR "
        "here measures how often the model picks the right 2 × 2 patch average on tiny digits; it is not "
        "comparable with the paper's VQGAN PSNR on ImageNet (≈ 16 dB there at 256 × 256), and FID / LPIPS are "
        "not computed (their network weights are not available offline).",
        "* Digits are mostly background: the background code is a large share of the masked positions, and "
        "predicting it is most of any model's hits; the differences between models sit in the strokes.",
        "* MaskGIT decoding samples codes (temperature 1, Gumbel noise 4.5 annealed), so a decoded grid can be "
        "less accurate than the one-pass argmax; more steps help only where the model's confidence ranks "
        "tokens usefully.",
    ]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, default=RESULTS)
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: <out>/.mim-runs)")
    parser.add_argument("--steps", type=int, default=600)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--codebook_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--smoke", action="store_true", help="a few steps of tiny models: checks the script")
    parser.add_argument(
        "--lpips_weights",
        default=None,
        help="also LPIPS: a local torchvision backbone file (see docs/mim.md)",
    )
    parser.add_argument(
        "--fid_weights", default=None, help="also FID: a local Inception file (see docs/mim.md)"
    )
    args = parser.parse_args(argv)
    from energyformers.mim import check_perceptual_weights

    for name in (
        "lpips_weights",
        "fid_weights",
    ):  # before any training, one flag at a time so the error names it
        try:
            check_perceptual_weights(
                **{"lpips_weights": None, "fid_weights": None, name: getattr(args, name)}
            )
        except (OSError, ValueError, ImportError) as err:
            parser.error(f"--{name} {getattr(args, name)}: {err}")
    perceptual = {"lpips_weights": args.lpips_weights, "fid_weights": args.fid_weights}
    limits, test_limit, steps, factors = [], None, DECODE_STEPS, DEPTH_FACTORS
    if args.smoke:
        args.steps, args.width, args.iterations, args.codebook_size = 2, 16, 2, 16
        limits = ["--max_train_samples", "64", "--max_eval_samples", "16", "--max_test_samples", "16"]
        test_limit, steps, factors = 8, (1, 2), (0.5, 1, 2)
    start = time.time()
    args.out.mkdir(parents=True, exist_ok=True)
    work = args.work or args.out / ".mim-runs"
    work.mkdir(parents=True, exist_ok=True)
    fit_tokenizer(work / "tokenizer", args.codebook_size, args.seed, limits)
    walls = train_both(work, args, limits)
    results = {"models": {m: measure(work / m, steps, factors, test_limit, perceptual) for m in MODELS}}
    decode_picture(work / "hyperset", args.out / "mim_decode.png", count=2 if args.smoke else 3)
    train_images = json.loads((work / "hyperset" / "metrics.json").read_text())["arguments"]
    results["setup"] = {
        "machine": f"{platform.machine()} CPU, torch threads 1 per training",
        "cores": "2 cores shared with other work",
        "steps": args.steps,
        "width": args.width,
        "iterations": args.iterations,
        "codebook_size": args.codebook_size,
        "lr": args.lr,
        "seed": args.seed,
        "train_images": 64 if args.smoke else 1293,
        "train_wall_s": walls,
        "wall_time_s": round(time.time() - start, 1),
        "smoke": args.smoke,
        **perceptual,
        "train_arguments": train_images,
    }
    results["reading"] = reading(results)
    (args.out / "mim.json").write_text(json.dumps(results, indent=2) + "\n")
    (args.out / "mim.md").write_text(markdown(results))
    plot(results, args.out / "mim.png")
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
