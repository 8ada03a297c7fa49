"""Recurrent depth that extrapolates: Hyper-SET accuracy vs test-time iterations, per training variant.

Trains Hyper-SET through the real CLI training code (`energyformers.training.train.run`, i.e. exactly
`energyformers train --model hyperset --dataset digits ...` with the CLI's default digits config, T = 4)
once per variant, reloads the saved folder and evaluates test accuracy at T/2, T, 2T, 4T, 10T and 100T
iterations, with and without adaptive halting (`halting_tolerance`, max = the evaluated depth). Then, on the
default model, it picks the largest ε whose accuracy at max T is within 0.5 point of fixed-T accuracy and
times halting against fixed T at batch 256 (median of several repeats, same process).

Variants are `iteration_conditioning` (`sinusoidal` vs `none`) × `iteration_sampling` (fixed vs random
depth), plus *experiments* (marked `experiment` in the tables) that need a model change the package does not
have yet; they are prototyped here by monkeypatching `HyperSetStepSizes` / the classifier inside the worker
process that trains and evaluates that variant (each variant runs in its own subprocess, so no patch leaks).

Writes benchmarks/results/recurrent_depth{_<dataset>}.{md,json,png}.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recurrent_depth.py                  # digits, all
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recurrent_depth.py --dataset fashion_mnist \\
        --variants none-fixed,none-uniform --max_train_samples 10000 --max_test_samples 2000 --epochs 4
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
FACTORS = (0.5, 1, 2, 4, 10, 100)  # test-time depth as a multiple of the trained T (100T: --long)
HALTING_EPSILONS = (0.3, 0.1, 0.03, 0.01, 0.003)  # evaluated with max 10T

# name → (description, CLI --config overrides, extra CLI flags, experiment patch or None)
VARIANTS: dict[str, tuple[str, dict, list[str], str | None]] = {
    "sinusoidal-fixed": (
        "t-conditioned c_t (ablation), fixed T",
        {"iteration_conditioning": "sinusoidal"},
        [],
        None,
    ),
    "sinusoidal-uniform": (
        "t-conditioned c_t, depth ~ U[T/2, 3T/2]",
        {"iteration_conditioning": "sinusoidal", "iteration_sampling": "uniform"},
        [],
        None,
    ),
    "none-fixed": ("**default**: time-invariant c, fixed T", {}, [], None),
    "none-uniform": (
        "time-invariant, depth ~ U[T/2, 3T/2] (default range)",
        {"iteration_sampling": "uniform"},
        [],
        None,
    ),
    "none-uniform-2-12": (
        "time-invariant, depth ~ U[2, 12]",
        {"iteration_sampling": "uniform", "min_iterations": 2, "max_iterations": 12},
        [],
        None,
    ),
    "none-uniform-2-40-bp4": (
        "time-invariant, depth ~ U[2, 40], backprop through the last 4",
        {
            "iteration_sampling": "uniform",
            "min_iterations": 2,
            "max_iterations": 40,
            "backprop_iterations": 4,
        },
        [],
        None,
    ),
    "none-poisson": (
        "time-invariant, depth ~ 1 + Poisson(lognormal), mean T, ≤ 4T",
        {"iteration_sampling": "poisson-lognormal"},
        [],
        None,
    ),
}

# Experiments: model changes prototyped by patching (see `apply_patch`). Added to VARIANTS below.
EXPERIMENTS: dict[str, tuple[str, dict, list[str], str]] = {
    "x-stayput-0.1": ("+ stay-put loss 0.1·‖x_{T+1} − x_T‖²/‖x_T‖²", {}, [], "stayput:0.1"),
    "x-stayput-1": ("+ stay-put loss 1·‖x_{T+1} − x_T‖²/‖x_T‖²", {}, [], "stayput:1"),
    "x-tanh-0.25": ("step sizes bounded: 0.25·tanh(·/0.25)", {}, [], "tanh:0.25"),
    "x-pos-0.5": ("step sizes in (0, 0.5): 0.5·sigmoid(·) (descent directions)", {}, [], "pos:0.5"),
    "x-anchor-0.1": ("+ anchor energy (0.1/2)‖x − x_0‖²", {}, [], "anchor:0.1"),
    "x-anchor-0.3": ("+ anchor energy (0.3/2)‖x − x_0‖²", {}, [], "anchor:0.3"),
    "x-decay-0.1": ("+ decay energy (0.1/2)‖x‖²", {}, [], "decay:0.1"),
    "x-anchor-0.3-uniform-2-12": (
        "anchor 0.3 + depth ~ U[2, 12]",
        {"iteration_sampling": "uniform", "min_iterations": 2, "max_iterations": 12},
        [],
        "anchor:0.3",
    ),
    "x-anchor-0.3-uniform-2-40-bp4": (
        "anchor 0.3 + depth ~ U[2, 40], backprop through the last 4",
        {
            "iteration_sampling": "uniform",
            "min_iterations": 2,
            "max_iterations": 40,
            "backprop_iterations": 4,
        },
        [],
        "anchor:0.3",
    ),
    "x-anchor-0.5-uniform-2-12": (
        "anchor 0.5 + depth ~ U[2, 12]",
        {"iteration_sampling": "uniform", "min_iterations": 2, "max_iterations": 12},
        [],
        "anchor:0.5",
    ),
    "x-anchor-1-uniform-2-12": (
        "anchor 1 (x_{t+1} = x_0 + update) + depth ~ U[2, 12]",
        {"iteration_sampling": "uniform", "min_iterations": 2, "max_iterations": 12},
        [],
        "anchor:1",
    ),
    "x-anchor-0.3-stayput-1-uniform-2-12": (
        "anchor 0.3 + stay-put loss 1 + depth ~ U[2, 12]",
        {"iteration_sampling": "uniform", "min_iterations": 2, "max_iterations": 12},
        [],
        "anchor:0.3+stayput:1",
    ),
    "x-poisson-stayput-0.1": (
        "poisson-lognormal depth + stay-put loss 0.1",
        {"iteration_sampling": "poisson-lognormal"},
        [],
        "stayput:0.1",
    ),
}


# --------------------------------------------------------------------------- experiment patches


def apply_patch(spec: str | None) -> None:
    """Monkeypatch the model for an experiment (worker process only). `spec` = "kind:arg,arg".

    * ``tanh:A`` — step sizes bounded, α = A·tanh(α̃/A), γ = A·tanh(γ̃/A) (identity at init kept).
    * ``pos:A`` — step sizes in (0, A): A·sigmoid(·) (each update a descent direction of its energy;
      A/2 at init, no identity start).
    * ``anchor:λ`` — every iteration also descends (λ/2)‖x − x_0‖² (x_0 = the embedded input):
      x_{t+1} = layer(x_t) − λ(x_t − x_0). The energy becomes coercive, so the state stays bounded and has a
      fixed point; identity at init is kept (x_t = x_0 when α = γ = 0). ``decay:λ``: the same towards 0.
    * ``stayput:λ`` — training loss + λ · mean over samples of ‖x_{T+1} − x_T‖² / ‖x_T‖² (one extra
      iteration of the same map; it asks the trained depth to be a fixed point).
    """
    if not spec:
        return
    if "+" in spec:
        for part in spec.split("+"):
            apply_patch(part)
        return
    import torch
    import torch.nn.functional as F

    from energyformers.modeling import modeling_hyperset as mh

    kind, _, arg = spec.partition(":")
    values = [float(v) for v in arg.split(",") if v]
    if kind == "tanh":
        (bound,) = values
        original = mh.HyperSetStepSizes.forward

        def forward(self, iteration_condition, state):
            alpha, gamma = original(self, iteration_condition, state)
            return bound * torch.tanh(alpha / bound), bound * torch.tanh(gamma / bound)

        mh.HyperSetStepSizes.forward = forward
    elif kind == "pos":
        (bound,) = values
        original = mh.HyperSetStepSizes.forward

        def forward(self, iteration_condition, state):
            alpha, gamma = original(self, iteration_condition, state)
            return bound * torch.sigmoid(alpha), bound * torch.sigmoid(gamma)

        mh.HyperSetStepSizes.forward = forward
    elif kind == "stayput":
        (weight,) = values
        original = mh.HyperSetForImageClassification.forward

        # explicit keywords: Trainer passes extra loss kwargs to a forward that takes **kwargs
        def forward(
            self,
            pixel_values=None,
            labels=None,
            num_iterations=None,
            backprop_iterations=None,
            halting_tolerance=None,
            halting_criterion=None,
            output_attentions=None,
            output_hidden_states=None,
            output_energies=None,
            return_dict=None,
        ):
            kwargs = dict(
                pixel_values=pixel_values,
                labels=labels,
                num_iterations=num_iterations,
                backprop_iterations=backprop_iterations,
                halting_tolerance=halting_tolerance,
                halting_criterion=halting_criterion,
                output_attentions=output_attentions,
                output_energies=output_energies,
                return_dict=return_dict,
            )
            if not (self.training and labels is not None):
                return original(self, output_hidden_states=output_hidden_states, **kwargs)
            out = original(self, output_hidden_states=True, **{**kwargs, "return_dict": True})
            backbone = self.hyperset
            states = out.hidden_states
            last = states[-1]
            source = states[0] if backbone.config.step_size_condition == "input" else last
            condition = backbone.step_sizes.iteration_conditions(len(states), last)[-1]  # c_{T+1}
            nxt, _ = backbone.layers[-1](last, condition, source, backbone.step_sizes, None)
            change = (nxt - last).flatten(1).pow(2).sum(1) / last.flatten(1).pow(2).sum(1)
            out.loss = out.loss + weight * change.mean()
            out.hidden_states = None
            return out

        mh.HyperSetForImageClassification.forward = forward
    elif kind in ("anchor", "decay"):
        (weight,) = values
        _patch_anchor(mh, weight, to_input=kind == "anchor")
    else:
        raise ValueError(f"unknown experiment patch {spec!r}")
    del F


def _patch_anchor(mh, weight: float, to_input: bool) -> None:
    """`anchor` / `decay` patches: the embeddings stash x_0; the layer adds −λ(x_t − x_0) (or −λ x_t).

    Adaptive halting works on a shrinking batch, so its loop is reproduced here to index x_0 by the samples
    still iterating (same logic as `HyperSetModel._iterate_until_halted`).
    """
    import torch

    stash: dict = {}
    embed_forward = mh.HyperSetEmbeddings.forward
    layer_forward = mh.HyperSetLayer.forward

    def embeddings(self, *args, **kwargs):
        tokens, keep = embed_forward(self, *args, **kwargs)
        stash["anchor"], stash["active"] = tokens, None
        return tokens, keep

    def layer(self, hidden_states, iteration_condition, condition_source, step_sizes, keep=None):
        updated, probs = layer_forward(
            self, hidden_states, iteration_condition, condition_source, step_sizes, keep
        )
        if not to_input:
            return updated - weight * hidden_states, probs
        anchor = stash["anchor"] if stash["active"] is None else stash["anchor"][stash["active"]]
        return updated - weight * (hidden_states - anchor), probs

    def iterate_until_halted(
        self, layer_, hidden_states, embedded, keep, real_tokens, iteration_conditions, tolerance, criterion
    ):
        assert criterion == "state"
        batch = hidden_states.shape[0]
        active = torch.arange(batch, device=hidden_states.device)
        used = torch.zeros(batch, dtype=torch.long, device=hidden_states.device)
        for condition in iteration_conditions:
            current, tokens = hidden_states[active], real_tokens[active]
            source = embedded[active] if self.config.step_size_condition == "input" else current
            stash["active"] = active
            updated, _ = layer_(
                current, condition, source, self.step_sizes, None if keep is None else keep[active]
            )
            hidden_states = hidden_states.index_copy(0, active, updated)
            used[active] += 1
            weights = tokens.unsqueeze(-1).to(updated.dtype)
            change = ((updated - current) * weights).flatten(1).norm(dim=1)
            change = change / (current * weights).flatten(1).norm(dim=1).clamp_min(
                torch.finfo(change.dtype).tiny
            )
            active = active[change >= tolerance]
            if active.numel() == 0:
                break
        stash["active"] = None
        return hidden_states, used

    mh.HyperSetEmbeddings.forward = embeddings
    mh.HyperSetLayer.forward = layer
    mh.HyperSetModel._iterate_until_halted = iterate_until_halted


# --------------------------------------------------------------------------- worker: train + evaluate one variant


def _test_batches(model_dir: Path, dataset: str, max_test: int | None, batch_size: int):
    import torch
    from transformers import AutoImageProcessor

    from energyformers.training.data import load_data
    from energyformers.training.processing import image_transform

    test = load_data(dataset, seed=0)["test"]
    if max_test is not None:
        test = test.select(range(min(max_test, len(test))))
    test = test.with_transform(image_transform(AutoImageProcessor.from_pretrained(model_dir)))
    batches = []
    for i in range(0, len(test), batch_size):
        b = test[i : i + batch_size]
        batches.append((b["pixel_values"], torch.as_tensor(b["labels"])))
    return batches


def _evaluate(model, batches, num_iterations: int, tolerance: float | None = None) -> tuple[float, float]:
    """(accuracy, mean iterations used) over the test batches."""
    import torch

    correct = total = 0
    used = 0.0
    with torch.inference_mode():
        for pixels, labels in batches:
            out = model(pixel_values=pixels, num_iterations=num_iterations, halting_tolerance=tolerance)
            correct += int((out.logits.argmax(-1) == labels).sum())
            total += len(labels)
            used += (
                float(out.iterations_used.sum())
                if out.iterations_used is not None
                else num_iterations * len(labels)
            )
    return correct / total, used / total


def _diagnostics(model, batches, trained: int) -> dict:
    """Mean |α|, |γ| at the trained depth and the relative state change at T, 2T, 10T (first test batch)."""
    import torch

    pixels = batches[0][0]
    backbone = model.base_model
    stats = {}
    with torch.inference_mode():
        out = backbone(pixel_values=pixels, num_iterations=10 * trained, output_hidden_states=True)
        states = out.hidden_states
        for k in (trained, 2 * trained, 10 * trained):
            change = (states[k] - states[k - 1]).flatten(1).norm(dim=1) / states[k - 1].flatten(1).norm(dim=1)
            stats[f"rel_change_at_{k}"] = float(change.mean())
        stats["state_norm_ratio_10T_over_T"] = float(
            (states[10 * trained].flatten(1).norm(dim=1) / states[trained].flatten(1).norm(dim=1)).mean()
        )
        condition = backbone.step_sizes.iteration_conditions(trained, states[0])[trained - 1]
        source = states[0] if backbone.config.step_size_condition == "input" else states[trained - 1]
        alpha, gamma = backbone.step_sizes(condition, source)
        stats["mean_abs_alpha"] = float(alpha.abs().mean())
        stats["mean_abs_gamma"] = float(gamma.abs().mean())
        stats["frac_negative_alpha"] = float((alpha < 0).float().mean())
        stats["frac_negative_gamma"] = float((gamma < 0).float().mean())
    return stats


def _time_halting(model, batch, num_iterations: int, tolerance: float, repeats: int) -> dict:
    """Median wall-clock of one forward at batch len(batch): fixed T vs halting (max 10T), interleaved."""
    import torch

    fixed, halted = [], []
    with torch.inference_mode():
        for _ in range(2):  # warm-up
            model(pixel_values=batch, num_iterations=num_iterations)
            model(pixel_values=batch, num_iterations=10 * num_iterations, halting_tolerance=tolerance)
        for _ in range(repeats):
            start = time.perf_counter()
            model(pixel_values=batch, num_iterations=num_iterations)
            fixed.append(time.perf_counter() - start)
            start = time.perf_counter()
            out = model(pixel_values=batch, num_iterations=10 * num_iterations, halting_tolerance=tolerance)
            halted.append(time.perf_counter() - start)
    return {
        "batch_size": len(batch),
        "repeats": repeats,
        "fixed_T_s": statistics.median(fixed),
        "halting_max_10T_s": statistics.median(halted),
        "halting_mean_iterations": float(out.iterations_used.float().mean()),
    }


def worker(args: argparse.Namespace) -> None:
    import torch

    torch.set_num_threads(args.num_threads)
    description, overrides, flags, patch = ALL_VARIANTS[args.worker]
    apply_patch(patch)
    from energyformers import HyperSetForImageClassification
    from energyformers.training import train

    workdir = Path(tempfile.mkdtemp(prefix=f"rd-{args.worker}-"))
    argv = [
        "--model", "hyperset", "--dataset", args.dataset,
        "--output_dir", str(workdir / "model"),
        "--num_threads", str(args.num_threads), "--seed", str(args.seed),
        "--disable_tqdm", "--num_predictions", "0",
    ]  # fmt: skip
    if args.epochs is not None:
        argv += ["--epochs", str(args.epochs)]
    if args.max_train_samples is not None:
        argv += ["--max_train_samples", str(args.max_train_samples)]
    if args.max_test_samples is not None:
        argv += ["--max_test_samples", str(args.max_test_samples)]
    argv += flags
    if overrides:
        argv += ["--config", *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]
    start = time.time()
    status = train.run(argv)
    train_seconds = time.time() - start
    if status != 0:
        raise SystemExit(f"training {args.worker} failed with status {status}")

    model = HyperSetForImageClassification.from_pretrained(workdir / "model").eval()
    trained = model.config.num_iterations
    batches = _test_batches(workdir / "model", args.dataset, args.max_test_samples, 256)
    factors = FACTORS if args.long else FACTORS[:-1]
    depths = sorted({max(1, round(f * trained)) for f in factors})
    accuracy = {d: _evaluate(model, batches, d)[0] for d in depths}
    halting = {eps: {10 * trained: _evaluate(model, batches, 10 * trained, eps)} for eps in HALTING_EPSILONS}
    result = {
        "variant": args.worker,
        "description": description,
        "experiment": patch,
        "config_overrides": overrides,
        "command": "energyformers train " + shlex.join(argv),
        "trained_iterations": trained,
        "train_seconds": round(train_seconds, 1),
        "test_size": sum(len(b[1]) for b in batches),
        "accuracy": accuracy,
        "halting": {str(e): {str(d): list(v) for d, v in per.items()} for e, per in halting.items()},
        "diagnostics": _diagnostics(model, batches, trained),
    }
    if args.time_halting:
        # ε: the largest whose accuracy at max 10T stays within 0.5 point of the fixed-T accuracy
        ok = [e for e in HALTING_EPSILONS if halting[e][10 * trained][0] >= accuracy[trained] - 0.005]
        if ok:
            eps = max(ok)
            batch = torch.cat([b[0] for b in batches])[:256]
            result["halting_timing"] = {
                "epsilon": eps,
                "accuracy_fixed_T": accuracy[trained],
                "accuracy_halting": halting[eps][10 * trained][0],
                "mean_iterations_test_set": halting[eps][10 * trained][1],
                **_time_halting(model, batch, trained, eps, args.repeats),
            }
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("variant", "accuracy", "train_seconds")}), flush=True)


# --------------------------------------------------------------------------- driver


ALL_VARIANTS = {**VARIANTS, **EXPERIMENTS}


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(ALL_VARIANTS)}")
    parser.add_argument("--epochs", type=float, default=None, help="default: the CLI's (12 for images)")
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--max_test_samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--num_threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7, help="timing repeats (median)")
    parser.add_argument("--long", action="store_true", help="also evaluate 100T (slow)")
    parser.add_argument("--cache", default=None, help="reuse per-variant JSON results found in this folder")
    parser.add_argument("--no_write", action="store_true", help="print only; do not write results/")
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--time_halting", action="store_true", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return

    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in ALL_VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(ALL_VARIANTS)}")
    cache = Path(args.cache or tempfile.mkdtemp(prefix="recurrent-depth-"))
    cache.mkdir(parents=True, exist_ok=True)
    start = time.time()
    results = {}
    passthrough = [
        "--dataset", args.dataset, "--seed", str(args.seed), "--num_threads", str(args.num_threads),
        "--repeats", str(args.repeats),
    ]  # fmt: skip
    if args.long:
        passthrough.append("--long")
    for flag in ("epochs", "max_train_samples", "max_test_samples"):
        if getattr(args, flag) is not None:
            passthrough += [f"--{flag}", str(getattr(args, flag))]
    for name in names:
        path = cache / f"{args.dataset}-{name}.json"
        if not (args.cache and path.is_file()):
            command = [sys.executable, __file__, "--worker", name, "--json", str(path), *passthrough]
            if name == "none-fixed":
                command.append("--time_halting")
            print(f"[{time.time() - start:6.0f} s] {name}", flush=True)
            subprocess.run(command, check=True, cwd=REPO)
        results[name] = json.loads(path.read_text())
    total = time.time() - start
    report = build_report(args, results, total)
    print(report)
    if not args.no_write:
        write_results(args, results, report, total)


def _fmt(value: float) -> str:
    return f"{value:.4f}"


def build_report(args: argparse.Namespace, results: dict, total: float) -> str:
    first = next(iter(results.values()))
    trained = first["trained_iterations"]
    factors = [f for f in FACTORS if str(max(1, round(f * trained))) in first["accuracy"]]
    depths = [str(max(1, round(f * trained))) for f in factors]
    labels = [f"{'T/2' if f == 0.5 else ('T' if f == 1 else f'{f}T')} = {d}" for f, d in zip(factors, depths)]
    argv = [a for a in sys.argv[1:] if not a.startswith("--cache")]
    lines = [
        f"# Recurrent depth: Hyper-SET test accuracy vs test-time iterations ({args.dataset})",
        "",
        f"Command: `OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recurrent_depth.py {shlex.join(argv)}`"
        f" — total {total / 60:.1f} min on {platform.machine()} CPU ({os.cpu_count()} cores, "
        f"{args.num_threads} torch threads, shared), torch {_torch_version()}. Each row trains the CLI's default "
        f"Hyper-SET on `{args.dataset}` (T = {trained}, seed {args.seed}"
        + (f", {args.epochs:g} epochs" if args.epochs else ", the CLI's 12 epochs")
        + (f", first {args.max_train_samples} training samples" if args.max_train_samples else "")
        + f") with the variant's `--config`, then evaluates the {first['test_size']} test images. "
        "Plot: `" + _stem(args) + ".png`.",
        "",
        "| variant | " + " | ".join(labels) + " | max drop 2T–10T vs T (points) |",
        "|---|" + "---|" * (len(labels) + 1),
    ]
    for name, r in results.items():
        acc = {d: r["accuracy"].get(d, float("nan")) for d in depths}
        drop = max(acc[str(trained)] - acc[str(k * trained)] for k in (2, 4, 10)) * 100
        tag = " (experiment)" if r["experiment"] else ""
        lines.append(
            f"| `{name}`{tag}: {r['description']} | "
            + " | ".join(_fmt(acc[d]) for d in depths)
            + f" | {drop:+.1f} |"
        )
    lines += [
        "",
        f"With adaptive halting (`halting_tolerance=ε`, state criterion) and at most 10T = {10 * trained} "
        "iterations: test accuracy / mean iterations used.",
        "",
        "| variant | " + " | ".join(f"ε = {e:g}" for e in HALTING_EPSILONS) + " |",
        "|---|" + "---|" * len(HALTING_EPSILONS),
    ]
    for name, r in results.items():
        cells = [r["halting"][str(e)][str(10 * trained)] for e in HALTING_EPSILONS]
        lines.append(f"| `{name}` | " + " | ".join(f"{a:.4f} / {n:.1f}" for a, n in cells) + " |")
    lines += [
        "",
        "Diagnostics (first test batch): relative state change ‖x_t − x_{t−1}‖/‖x_{t−1}‖ at T, 2T, 10T; "
        "‖x_10T‖/‖x_T‖; mean |α|, |γ| at iteration T and the fraction of negative α, γ (ascent steps).",
        "",
        "| variant | change at T | 2T | 10T | norm ratio | mean abs α | mean abs γ | α < 0 | γ < 0 | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in results.items():
        d = r["diagnostics"]
        lines.append(
            f"| `{name}` | {d[f'rel_change_at_{trained}']:.4f} | {d[f'rel_change_at_{2 * trained}']:.4f} | "
            f"{d[f'rel_change_at_{10 * trained}']:.4f} | {d['state_norm_ratio_10T_over_T']:.2f} | "
            f"{d['mean_abs_alpha']:.3f} | {d['mean_abs_gamma']:.3f} | {d['frac_negative_alpha']:.2f} | "
            f"{d['frac_negative_gamma']:.2f} | {r['train_seconds']:.0f} |"
        )
    timing = results.get("none-fixed", {}).get("halting_timing")
    if timing:
        saving = 1 - timing["halting_max_10T_s"] / timing["fixed_T_s"]
        lines += [
            "",
            f"**Adaptive halting on the default model** (`none-fixed`): ε = {timing['epsilon']:g} (the largest "
            f"of {list(HALTING_EPSILONS)} within 0.5 point of fixed-T accuracy at max 10T): test accuracy "
            f"{timing['accuracy_halting']:.4f} vs {timing['accuracy_fixed_T']:.4f} at fixed T = {trained}, "
            f"mean iterations used {timing['mean_iterations_test_set']:.2f}. Wall clock of one forward at batch "
            f"{timing['batch_size']} on CPU (median of {timing['repeats']}, interleaved, same process): fixed T "
            f"{timing['fixed_T_s'] * 1000:.0f} ms, halting with max 10T {timing['halting_max_10T_s'] * 1000:.0f} ms "
            f"({timing['halting_mean_iterations']:.2f} iterations on that batch; {saving:+.0%} saving vs fixed T).",
        ]
    lines += ["", "Training commands (run in-process through `energyformers.training.train.run`):", ""]
    for name, r in results.items():
        patch = f"  # + experiment patch `{r['experiment']}` (see `apply_patch`)" if r["experiment"] else ""
        lines.append(
            f"* `{name}`: `{r['command'].replace(' --output_dir ' + _outdir(r['command']), '')}`{patch}"
        )
    return "\n".join(lines) + "\n"


def _outdir(command: str) -> str:
    parts = shlex.split(command)
    return parts[parts.index("--output_dir") + 1]


def _torch_version() -> str:
    import torch

    return torch.__version__


def _stem(args: argparse.Namespace) -> str:
    return "recurrent_depth" if args.dataset == "digits" else f"recurrent_depth_{args.dataset}"


def write_results(args: argparse.Namespace, results: dict, report: str, total: float) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    RESULTS.mkdir(exist_ok=True)
    stem = _stem(args)
    (RESULTS / f"{stem}.md").write_text(report)
    (RESULTS / f"{stem}.json").write_text(
        json.dumps({"argv": sys.argv[1:], "total_seconds": round(total, 1), "variants": results}, indent=2)
    )
    trained = next(iter(results.values()))["trained_iterations"]
    fig, ax = plt.subplots(figsize=(8.5, 5))
    for name, r in results.items():
        depths = sorted(int(d) for d in r["accuracy"])
        style = "--" if r["experiment"] else "-"
        ax.plot(depths, [r["accuracy"][str(d)] for d in depths], style, marker="o", label=name)
    ax.axvline(trained, color="grey", linestyle=":", label=f"trained T = {trained}")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("iterations at test time (log scale)")
    ax.set_ylabel("test accuracy")
    ax.set_title(f"Hyper-SET on {args.dataset}: accuracy vs test-time depth per training variant")
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.01, 0.5), fontsize=8)
    fig.tight_layout()
    fig.savefig(RESULTS / f"{stem}.png", dpi=110)
    plt.close(fig)


if __name__ == "__main__":
    main()
