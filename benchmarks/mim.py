"""Masked image modelling on CPU: Hyper-SET vs the looped Transformer (Table 2's baseline) at equal budget.

Both models are trained through the real CLI (`energyformers train --task masked-image-modeling`), each in its
own subprocess, two at a time with one thread each, on the same data (`digits`), the same VQ tokenizer (a patch
k-means codebook fitted once here, with the first seed, and passed to every run with `--tokenizer`), the same
steps, batch and learning rate, each model trained once per seed of `--seeds` (the training seed; the test masks
and the decoding seed stay fixed, so the seeds vary the training only). Sizes are reduced from the paper's
(d = 768, 1024 codes, 16 × 16 grid) to fit a CPU: the CLI's `cli-mim` presets at a smaller width (stated in the
results). The reloaded run folders are then measured on the
test split with the paper's 40 % masking (fixed masks): masked-token accuracy of one forward pass, MaskGIT
decoding (arccos schedule, seeded) and PSNR/SSIM of the decoded grid turned into pixels by the tokenizer;
accuracy and PSNR against decoding steps and against iterations beyond the trained T (T/2 … 4T); and a
picture of one decode sequence by the first seed's Hyper-SET (`mim_decode.png`). The results give every seed's
numbers, their mean ± sample standard deviation, and the Hyper-SET − looped differences paired by seed.

Writes mim.{md,json,png} and mim_decode.png into `--output_dir` (alias `--out`; default benchmarks/results),
replacing them. `--smoke` (tiny models, two steps; about three minutes on two cores) checks the script end to end
and writes mim_smoke.{md,json,png} and mim_smoke_decode.png instead, marked as not a measurement, so it never
replaces the committed results.

    python benchmarks/mim.py --seeds 0 1 2                      # the result file records its wall time
    python benchmarks/mim.py --smoke --output_dir /tmp/mim-smoke
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (README: CPU threads)

RESULTS = provenance.RESULTS
SMOKE_MARK = "SMOKE RUN (smoke, not a measurement)"
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


def train_both(work: Path, seed: int, args: argparse.Namespace, limits: list[str]) -> dict[str, float]:
    """Both trainings of one seed at once (2 processes × 1 thread) into `work/seed-<seed>/<model>`; returns each
    one's wall time in seconds."""
    folder = work / f"seed-{seed}"
    folder.mkdir(parents=True, exist_ok=True)
    procs, started, walls = {}, {}, {}
    for model in MODELS:
        argv = [
            sys.executable, "-m", "energyformers", "train", "--task", "masked-image-modeling",
            "--dataset", "digits", "--model", model, "--tokenizer", str(work / "tokenizer"),
            "--config", *sizes(args.width, args.iterations)[model],
            "--max_steps", str(args.steps), "--batch_size", "64", "--learning_rate", str(args.lr),
            "--seed", str(seed), "--eval_strategy", "no", "--decode_steps", "8",
            "--num_threads", "1", "--num_predictions", "0", "--disable_tqdm",
            "--output_dir", str(folder / model), "--overwrite_output_dir", *limits,
        ]  # fmt: skip
        log = (folder / f"{model}.log").open("w")
        started[model] = time.time()
        procs[model] = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env={**os.environ})
    for model, proc in procs.items():
        if proc.wait() != 0:
            raise SystemExit(f"training {model} (seed {seed}) failed; see {folder / f'{model}.log'}")
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


def depth_schedule(folder: Path) -> dict:
    """How a saved run drew its training depths: the sampling, the range it drew from, the anchor energy's λ."""
    import transformers

    config = transformers.AutoConfig.from_pretrained(folder)
    return {
        "iteration_sampling": config.iteration_sampling,
        "iteration_range": list(config.iteration_range),
        "input_anchor": getattr(config, "input_anchor", None),  # Hyper-SET only
    }


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
    fig.suptitle(f"MaskGIT decoding by {folder.name}, {folder.parent.name} (digits test images)", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def aggregate(runs: list[dict], statistic: Callable[[list[float]], float | None]) -> dict:
    """`statistic` of every number across the runs, key by key (the runs share one layout)."""
    return {
        key: aggregate([run[key] for run in runs], statistic)
        if isinstance(value, dict)
        else statistic([float(run[key]) for run in runs])
        for key, value in runs[0].items()
    }


def sample_std(values: list[float]) -> float | None:
    """The sample standard deviation (n − 1); none from one value, where spread is not measured."""
    return statistics.stdev(values) if len(values) > 1 else None


METRIC_KEYS = ("masked_token_accuracy", "decode_24", "by_decode_steps", "by_iterations")


def summarize(per_seed: dict[int, dict]) -> dict:
    """One model's entry: the facts every seed shares, each seed's measurements, their mean and sample std."""
    runs = list(per_seed.values())
    shared = {key: runs[0][key] for key in ("num_parameters", "trained_iterations", "test_images")}
    for seed, run in per_seed.items():  # same config and test split for every seed: a mismatch is a bug here
        if any(run[key] != value for key, value in shared.items()):
            raise RuntimeError(f"seed {seed}: { ({k: run[k] for k in shared}) } differs from {shared}")
    metrics = [{key: run[key] for key in METRIC_KEYS} for run in runs]
    return {
        **shared,
        "per_seed": per_seed,
        "mean": aggregate(metrics, statistics.fmean),
        "std": aggregate(metrics, sample_std),
    }


def paired_differences(models: dict) -> dict[str, dict[int, float]]:
    """Hyper-SET − looped Transformer of the 24-step PSNR and decoded-token accuracy, seed by seed: both models of
    a seed share its training seed, so the pairs remove what the seed does to both."""
    h, b = models["hyperset"]["per_seed"], models["looped-transformer"]["per_seed"]
    return {
        name: {seed: h[seed]["decode_24"][name] - b[seed]["decode_24"][name] for seed in h}
        for name in ("psnr", "decoded_token_accuracy")
    }


def plot(results: dict, path: Path) -> None:
    """Per-model mean curves over the seeds, each seed's range shaded."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (left, middle, right) = plt.subplots(1, 3, figsize=(12, 3.4))

    def band(ax, x: list[int], runs: list[dict], key: str, metric: str, label: str) -> None:
        ys = [[run[key][t][metric] for t in x] for run in runs]
        mean = [statistics.fmean(column) for column in zip(*ys)]
        (line,) = ax.plot(x, mean, "o-", label=label, ms=4)
        ax.fill_between(
            x, [min(c) for c in zip(*ys)], [max(c) for c in zip(*ys)], color=line.get_color(), alpha=0.2
        )

    n = len(results["seeds"])
    for model in MODELS:
        r = results["models"][model]
        runs = list(r["per_seed"].values())
        label = LABELS[model]
        steps = sorted(int(s) for s in runs[0]["by_decode_steps"])
        band(left, steps, runs, "by_decode_steps", "decoded_token_accuracy", label)
        band(middle, steps, runs, "by_decode_steps", "psnr", label)
        depths = sorted(int(t) for t in runs[0]["by_iterations"])
        band(right, depths, runs, "by_iterations", "masked_token_accuracy", label)
        right.axvline(r["trained_iterations"], color="grey", lw=0.5)
    bound = results["models"]["hyperset"]["mean"]["decode_24"]["tokenizer_psnr"]
    middle.axhline(bound, color="grey", ls="--", lw=0.8, label="tokenizer bound")
    left.set(xlabel="decoding steps", ylabel="decoded-token accuracy (masked)", title="vs decoding steps")
    middle.set(xlabel="decoding steps", ylabel="PSNR (dB)", title="reconstruction PSNR")
    right.set(xlabel="iterations at test time (trained T: grey)", ylabel="masked-token accuracy (1 pass)")
    right.set_title("vs iterations beyond T")
    for ax in (left, middle, right):
        ax.legend(fontsize=7)
    if n > 1:
        fig.suptitle(f"means over {n} training seeds; shaded: the range of the seeds", fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def pm(mean: float, std: float | None, digits: int) -> str:
    """`mean ± std` at `digits` decimals; the mean alone where one seed gives no spread."""
    return f"{mean:.{digits}f}" if std is None else f"{mean:.{digits}f} ± {std:.{digits}f}"


def markdown(results: dict) -> str:
    s, seeds = results["setup"], results["seeds"]
    n = len(seeds)
    walls = ", ".join(
        f"{LABELS[m]} {statistics.fmean(w[m] for w in s['train_wall_s'].values()):.0f} s" for m in MODELS
    )
    over = f"mean ± sample std over n = {n} seeds" if n > 1 else f"one seed (n = 1, seed {seeds[0]})"

    def schedule(d: dict) -> str:
        low, high = d["iteration_range"]
        drawn = (
            f"T = {low}"
            if d["iteration_sampling"] == "fixed"
            else f"{d['iteration_sampling']} in [{low}, {high}]"
        )
        return drawn + (f", anchor λ = {d['input_anchor']:g}" if d["input_anchor"] else "")

    depths = (
        "; ".join(
            f"{LABELS[m]} {schedule(s['depth_schedule'][m])}"
            for m in MODELS
            if m in s.get("depth_schedule", {})
        )
        or "as configured"
    )
    names = output_names(s["smoke"])
    title = "Masked image modelling on CPU: Hyper-SET vs the looped Transformer"
    run = results.get("run")
    header = (
        [*provenance.markdown_lines(run), ""]
        if run
        else [f"Generated by `benchmarks/mim.py` on {s['machine']} ({s['cores']}).", ""]
    )
    lines = [
        f"# {SMOKE_MARK}: {title}" if s["smoke"] else f"# {title}",
        "",
        *header,
        f"Wall time {s['wall_time_s']:.0f} s (the two trainings of a seed run at once, one thread each; per training, mean over seeds: {walls}).",
        "",
        f"Equal budget: `digits` (16 × 16, {s['train_images']} training images), one VQ tokenizer for every run "
        f"(patch k-means fitted with seed {seeds[0]}, {s['codebook_size']} codes of 2 × 2 patches, an 8 × 8 grid "
        f"of 64 codes), {s['steps']} steps of batch 64, lr {s['lr']}, training seeds {', '.join(map(str, seeds))} "
        "(each model trained once per seed), the paper's masking (r ~ U[0, 0.4] per image, fresh per batch). "
        f"Reduced sizes (the paper: d = 768, 1024 codes, 16 × 16 grid): width {s['width']}, one layer × "
        f"T = {s['iterations']}; Hyper-SET with dictionary M = d (the paper's 1/T/d row) and "
        f"iteration_conditioning='{s['hyperset_iteration_conditioning']}' (the paper: 'sinusoidal-no-mlp'), the "
        f"baseline with MLP 4d (its 1/T/4d row). Training depth: {depths}. Test split: fixed 40 % masks on "
        f"{results['models']['hyperset']['test_images']} images, MaskGIT decoding with the arccos schedule, seed 0 "
        "(the same for every training seed).",
        "",
        f"24 decoding steps, {over}:",
        "",
        "| model | parameters | n | masked-token acc. (1 pass) | decoded-token acc. (24 steps) | PSNR (dB) | SSIM | tokenizer bound PSNR / SSIM |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for model in MODELS:
        r = results["models"][model]
        mean, std = r["mean"], r["std"]
        d, e = mean["decode_24"], std["decode_24"]
        lines.append(
            f"| {LABELS[model]} | {r['num_parameters']:,} | {n} | "
            f"{pm(mean['masked_token_accuracy'], std['masked_token_accuracy'], 3)} | "
            f"{pm(d['decoded_token_accuracy'], e['decoded_token_accuracy'], 3)} | {pm(d['psnr'], e['psnr'], 2)} | "
            f"{pm(d['ssim'], e['ssim'], 3)} | {d['tokenizer_psnr']:.2f} / {d['tokenizer_ssim']:.3f} |"
        )
    differences = results["hyperset_minus_looped"]
    lines += [
        "",
        f"Hyper-SET − looped per seed (24 steps; {'seeds' if n > 1 else 'seed'} {', '.join(map(str, seeds))}): "
        "PSNR "
        + ", ".join(f"{differences['psnr'][seed]:+.2f}" for seed in seeds)
        + " dB; decoded-token accuracy "
        + ", ".join(f"{differences['decoded_token_accuracy'][seed]:+.3f}" for seed in seeds)
        + ".",
    ]
    perceptual = [m for m in ("lpips", "fid") if m in results["models"]["hyperset"]["mean"]["decode_24"]]
    if perceptual:
        lines += [
            "",
            f"{' and '.join(m.upper() for m in perceptual)} of the 24-step reconstructions ({over}; weights: "
            f"{', '.join(s[f'{m}_weights'] for m in perceptual)}); the tokenizer's own in brackets:",
            "",
        ]
        for model in MODELS:
            d, e = results["models"][model]["mean"]["decode_24"], results["models"][model]["std"]["decode_24"]
            values = ", ".join(
                f"{m.upper()} {pm(d[m], e[m], 4)} ({d[f'tokenizer_{m}']:.4g})" for m in perceptual
            )
            lines.append(f"* {LABELS[model]}: {values}")
    average = f"means over the {n} seeds" if n > 1 else "one seed"

    def table(by: str, column: str, accuracy: str) -> list[str]:
        # a row a model: its mean `accuracy` / PSNR at each setting of `by` (`column` heads a setting's column)
        settings = sorted(int(x) for x in results["models"]["hyperset"]["mean"][by])
        rows = [
            "| model | " + " | ".join(column.format(x) for x in settings) + " |",
            "|---|" + "---:|" * len(settings),
        ]
        for model in MODELS:
            r = results["models"][model]["mean"][by]
            cells = (f"{r[x][accuracy]:.3f} / {r[x]['psnr']:.2f}" for x in settings)
            rows.append(f"| {LABELS[model]} | " + " | ".join(cells) + " |")
        return rows

    lines += ["", f"Decoded-token accuracy / PSNR against decoding steps ({average}):", ""]
    lines += table("by_decode_steps", "{} steps", "decoded_token_accuracy")
    lines += [
        "",
        f"Masked-token accuracy (1 pass) / PSNR (8 decoding steps) against test-time iterations ({average}):",
        "",
    ]
    lines += table("by_iterations", "T = {}", "masked_token_accuracy")
    lines += [
        "",
        f"![accuracy and PSNR]({names['png']})",
        "",
        f"![decode sequence by the seed-{seeds[0]} Hyper-SET]({names['decode']})",
        "",
        *results["reading"],
        "",
    ]
    return "\n".join(lines)


def held(differences: list[float]) -> int:
    """+1 where every difference is positive, −1 where every one is negative, 0 where the sign changes."""
    return 1 if all(d > 0 for d in differences) else -1 if all(d < 0 for d in differences) else 0


def comparison(results: dict) -> str:
    """The headline bullet: the paired differences, and whether their sign held on every seed."""
    seeds = results["seeds"]
    n = len(seeds)
    h, b = results["models"]["hyperset"], results["models"]["looped-transformer"]
    hm, bm = h["mean"]["decode_24"], b["mean"]["decode_24"]
    differences = {name: list(d.values()) for name, d in results["hyperset_minus_looped"].items()}
    params = f"with {h['num_parameters']:,} vs {b['num_parameters']:,} parameters"
    if n == 1:
        d = {name: values[0] for name, values in differences.items()}
        return (
            f"* One seed ({seeds[0]}): Hyper-SET vs the looped Transformer at 24 decoding steps, PSNR "
            f"{hm['psnr']:.2f} vs {bm['psnr']:.2f} dB ({d['psnr']:+.2f}), decoded-token accuracy "
            f"{hm['decoded_token_accuracy']:.3f} vs {bm['decoded_token_accuracy']:.3f} "
            f"({d['decoded_token_accuracy']:+.3f}), {params}. One seed measures no spread: whether another seed "
            "keeps these signs is not known from this run (`--seeds 0 1 2` measures it)."
        )
    names = {"psnr": ("PSNR", 2, " dB"), "decoded_token_accuracy": ("decoded-token accuracy", 3, "")}
    parts = []
    for name, (title, digits, unit) in names.items():
        d = differences[name]
        wins = sum(x > 0 for x in d)
        parts.append(
            f"{title} {statistics.fmean(d):+.{digits}f}{unit} on average (per seed {min(d):+.{digits}f} … "
            f"{max(d):+.{digits}f}{unit}; Hyper-SET higher on {wins} of {n} seeds)"
        )
    text = f"* Hyper-SET − looped Transformer at 24 decoding steps, paired by seed: {'; '.join(parts)}. "
    signs = {name: held(differences[name]) for name in names}
    if signs["psnr"] == signs["decoded_token_accuracy"] != 0:
        better = "Hyper-SET" if signs["psnr"] > 0 else "the looped Transformer"
        text += (
            f"The sign held on every seed for both: at this budget {better} reconstructs better ({params}); "
            f"{n} seeds are a small sample, so the size of the gap is less certain than its sign."
        )
    elif 0 not in signs.values():
        text += "Each sign held on every seed, but the two metrics rank the models differently."
    else:
        changed = [names[name][0] for name, sign in signs.items() if sign == 0]
        plural = "differences" if len(changed) > 1 else "difference"
        text += (
            f"The sign of the {' and '.join(changed)} {plural} did not hold on every seed: at this budget which "
            f"model is ahead on {' and '.join(changed)} depends on the training seed."
        )
    spread = ", ".join(
        f"{LABELS[m]} {results['models'][m]['std']['decode_24']['psnr']:.2f} dB" for m in MODELS
    )
    return text + f" Seed-to-seed std of the PSNR: {spread}."


def reading(results: dict) -> list[str]:
    """What these numbers can and cannot show."""
    h = results["models"]["hyperset"]["mean"]
    perceptual = "lpips" in h["decode_24"] or "fid" in h["decode_24"]
    return [
        "## Reading",
        "",
        comparison(results),
        "* The tokenizer caps every number: a patch k-means codebook decodes a code to its centroid, so even the "
        f"true codes give only {h['decode_24']['tokenizer_psnr']:.2f} dB, and no decoded grid exceeds that. The PSNR "
        "here measures how often the model picks the right 2 × 2 patch average on tiny digits; it is not "
        "comparable with the paper's VQGAN PSNR on ImageNet (≈ 16 dB there at 256 × 256)"
        + (
            "; neither are LPIPS / FID on 16 × 16 digits."
            if perceptual
            else ", and FID / LPIPS were not computed (no --lpips_weights / --fid_weights given)."
        ),
        "* Digits are mostly background: the background code is a large share of the masked positions, and "
        "predicting it is most of any model's hits; the differences between models sit in the strokes.",
        "* MaskGIT decoding samples codes (temperature 1, Gumbel noise 4.5 annealed), so a decoded grid can be "
        "less accurate than the one-pass argmax; more steps help only where the model's confidence ranks "
        "tokens usefully.",
    ]


def seed_list(args: argparse.Namespace, parser: argparse.ArgumentParser) -> list[int]:
    """The training seeds: `--seeds`, or `--seed N` as one seed, or the default (two in a smoke run, else three);
    checked before any work starts."""
    if args.seed is not None:
        seeds, flag = [args.seed], "--seed"
    elif args.seeds is not None:
        seeds, flag = args.seeds, "--seeds"
    else:
        return [0, 1] if args.smoke else [0, 1, 2]
    given = " ".join(map(str, seeds))
    if len(set(seeds)) != len(seeds):
        parser.error(f"{flag} {given}: each seed at most once (a repeated seed trains the same run twice)")
    if any(not 0 <= seed < 2**32 for seed in seeds):
        parser.error(f"{flag} {given}: seeds must be integers in [0, 2**32) (numpy's seed range)")
    return seeds


def output_names(smoke: bool) -> dict[str, str]:
    """The result file names: `mim.*` for a measurement, `mim_smoke.*` for a smoke run, so that checking the
    script never replaces the committed results."""
    stem = "mim_smoke" if smoke else "mim"
    return {"md": f"{stem}.md", "json": f"{stem}.json", "png": f"{stem}.png", "decode": f"{stem}_decode.png"}


def parse_arguments(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line, checked before any work starts: `seeds` resolved to the list of training seeds."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--output_dir", "--out", dest="out", type=Path, default=RESULTS, help="default benchmarks/results"
    )
    parser.add_argument("--work", type=Path, default=None, help="run folders (default: <out>/.mim-runs)")
    parser.add_argument("--steps", type=int, default=150)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--iterations", type=int, default=6)
    parser.add_argument("--codebook_size", type=int, default=64)
    parser.add_argument("--lr", type=float, default=3e-3)
    seeding = parser.add_mutually_exclusive_group()
    seeding.add_argument(
        "--seeds",
        type=int,
        nargs="+",
        default=None,
        help="training seeds, each model trained once per seed (default: 0 1 2; with --smoke 0 1)",
    )
    seeding.add_argument("--seed", type=int, default=None, help="one training seed: the same as --seeds SEED")
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
    args.seeds = seed_list(args, parser)
    from energyformers.mim import check_perceptual_weights

    try:  # before any training; the message names the flag and its value itself (flags=True)
        check_perceptual_weights(args.lpips_weights, args.fid_weights, flags=True)
    except (OSError, ValueError, ImportError) as err:
        parser.error(str(err))
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_arguments(argv)
    seeds = args.seeds
    run = provenance.run_info(seed=seeds, argv=argv, script=__file__)
    names = output_names(args.smoke)
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
    fit_tokenizer(work / "tokenizer", args.codebook_size, seeds[0], limits)
    walls, per_seed = {}, {model: {} for model in MODELS}
    for seed in seeds:
        walls[seed] = train_both(work, seed, args, limits)
        for model in MODELS:
            per_seed[model][seed] = measure(
                work / f"seed-{seed}" / model, steps, factors, test_limit, perceptual
            )
    first = work / f"seed-{seeds[0]}"
    results = {"seeds": seeds, "models": {m: summarize(per_seed[m]) for m in MODELS}}
    results["hyperset_minus_looped"] = paired_differences(results["models"])
    decode_picture(first / "hyperset", args.out / names["decode"], count=2 if args.smoke else 3)
    train_arguments = json.loads((first / "hyperset" / "metrics.json").read_text())["arguments"]
    results["run"] = run
    results["setup"] = {
        "torch_threads_per_training": 1,
        "steps": args.steps,
        "width": args.width,
        "iterations": args.iterations,
        "codebook_size": args.codebook_size,
        "lr": args.lr,
        "seeds": seeds,
        "tokenizer_seed": seeds[0],
        "train_images": 64 if args.smoke else 1293,
        "train_wall_s": walls,
        "wall_time_s": round(time.time() - start, 1),
        "smoke": args.smoke,
        **perceptual,
        "train_arguments": train_arguments,
        # the step sizes' dependence on t decides how accuracy holds past the trained T (the depth table)
        "hyperset_iteration_conditioning": json.loads((first / "hyperset" / "config.json").read_text())[
            "iteration_conditioning"
        ],
        # so do the training depths and the anchor energy (each model's saved config)
        "depth_schedule": {model: depth_schedule(first / model) for model in MODELS},
    }
    results["reading"] = reading(results)
    (args.out / names["json"]).write_text(json.dumps(results, indent=2) + "\n")
    (args.out / names["md"]).write_text(markdown(results))
    plot(results, args.out / names["png"])
    print(markdown(results))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
