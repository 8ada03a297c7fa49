"""Recurrent depth that extrapolates: Hyper-SET test accuracy vs test-time iterations, per training variant.

Each variant trains Hyper-SET through the real CLI training code (`energyformers.training.train.main`, i.e.
`energyformers train --model hyperset --dataset digits ...` with the CLI's default digits config, T = 4, plus
the variant's `--config` overrides), in its own subprocess; the saved folder is reloaded and its test
accuracy measured at T/2, T, 2T, 4T, 10T (and 100T with `--long`), with and without adaptive halting
(`halting_tolerance`, at most 10T iterations). On the CLI-default model it also picks ε for halting (fewest
mean iterations with accuracy within 0.5 point of fixed-T accuracy) and times halting against fixed T at
batch 256 on CPU (median of `--repeats`, interleaved, same process).

Variants: `iteration_conditioning` (`sinusoidal` vs `none`) × depth sampling (fixed, uniform, Poisson-log-normal)
with the paper's dynamics (`input_anchor=0`), the same with the anchor energy (`input_anchor`, the CLI default
0.5 with depth ~ U[2, 12]), and *experiments* (`x-...`, marked "experiment") that need a model change the
package does not have: they are prototyped by monkeypatching inside that variant's worker process only.

Writes recurrent_depth{_<dataset>}.{md,json,png} into `--output_dir` (default benchmarks/results), replacing
the files of that name there; the .md embeds the .png by the name it is written under.

    python benchmarks/recurrent_depth.py --long            # digits, also evaluated at 100T
    python benchmarks/recurrent_depth.py --dataset fashion_mnist \\
        --variants default,none-fixed,anchor0.5-fixed --max_train_samples 10000 --max_test_samples 2000 \\
        --epochs 4 --extra_seeds ''
"""

from __future__ import annotations

import argparse
import json
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (README: CPU threads)

RESULTS = provenance.RESULTS
REPO = Path(__file__).resolve().parents[1]
TARGET_POINTS = 1.0  # the recurrent-depth target: accuracy at 2T, 4T, 10T at most this many points below T
FACTORS = (0.5, 1, 2, 4, 10, 100)  # test-time depth as a multiple of the trained T (100T only with --long)
TABLE_EPSILONS = (0.1, 0.03, 0.01)  # halting tolerances shown for every variant (max 10T)
SEARCH_EPSILONS = (0.3, 0.2, 0.1, 0.05, 0.03, 0.01, 0.003)  # searched on the default model (max T and 10T)

# The paper's dynamics (the package config's defaults): no anchor energy, fixed depth.
PAPER = {"input_anchor": 0.0, "iteration_sampling": "fixed", "min_iterations": None, "max_iterations": None}


def _uniform(low: int, high: int) -> dict:
    return {"iteration_sampling": "uniform", "min_iterations": low, "max_iterations": high}


# name → (description, --config overrides on top of the CLI's digits default, experiment patch or None)
VARIANTS: dict[str, tuple[str, dict, str | None]] = {
    "default": ("**CLI default**: time-invariant, input_anchor 0.5, depth ~ U[2, 12]", {}, None),
    "sinusoidal-fixed": (
        "t-conditioned c_t (ablation), fixed T",
        {**PAPER, "iteration_conditioning": "sinusoidal"},
        None,
    ),
    "sinusoidal-uniform": (
        "t-conditioned c_t, depth ~ U[2, 6] (mean T)",
        {**PAPER, "iteration_conditioning": "sinusoidal", **_uniform(2, 6)},
        None,
    ),
    "none-fixed": ("time-invariant, fixed T (the paper's dynamics)", PAPER, None),
    "none-uniform": ("time-invariant, depth ~ U[2, 6] (mean T)", {**PAPER, **_uniform(2, 6)}, None),
    "none-uniform-2-12": ("time-invariant, depth ~ U[2, 12]", {**PAPER, **_uniform(2, 12)}, None),
    "none-poisson": (
        "time-invariant, depth 1 + Poisson(log-normal), mean T, in [1, 4T]",
        {**PAPER, "iteration_sampling": "poisson-lognormal"},
        None,
    ),
    "none-uniform-2-40-bp4": (
        "time-invariant, depth ~ U[2, 40], backprop through the last 4",
        {**PAPER, **_uniform(2, 40), "backprop_iterations": 4},
        None,
    ),
    "anchor0.5-fixed": ("input_anchor 0.5, fixed T", {**PAPER, "input_anchor": 0.5}, None),
    "anchor0.5-uniform": (
        "input_anchor 0.5, depth ~ U[2, 6] (mean T)",
        {"input_anchor": 0.5, **_uniform(2, 6)},
        None,
    ),
    "anchor0.3-uniform-2-12": ("input_anchor 0.3, depth ~ U[2, 12]", {"input_anchor": 0.3}, None),
    "anchor1-uniform-2-12": (
        "input_anchor 1 (x_t+1 = x_0 + update), depth ~ U[2, 12]",
        {"input_anchor": 1.0},
        None,
    ),
    "x-stayput-1": ("paper's dynamics + stay-put loss ‖x_T+1 − x_T‖²/‖x_T‖²", PAPER, "stayput:1"),
    "x-tanh-0.25": ("paper's dynamics, step sizes bounded 0.25·tanh(·/0.25)", PAPER, "tanh:0.25"),
    "x-pos-0.5": ("paper's dynamics, step sizes in (0, 0.5): 0.5·sigmoid(·)", PAPER, "pos:0.5"),
}
SEED_VARIANTS = (
    "default",
    "none-fixed",
    "anchor0.5-fixed",
    "anchor0.5-uniform",
)  # also run with --extra_seeds


# --------------------------------------------------------------------------- experiment patches


def apply_patch(spec: str | None) -> None:
    """Monkeypatch the model for an experiment (worker process only). `spec` = "kind:value".

    * ``tanh:A`` — step sizes bounded: α = A·tanh(α̃/A), γ = A·tanh(γ̃/A) (identity at init kept).
    * ``pos:A`` — step sizes in (0, A): A·sigmoid(·), so each update is a descent direction of its energy
      (A/2 at init instead of the identity start).
    * ``stayput:λ`` — training loss + λ · mean ‖x_{T+1} − x_T‖² / ‖x_T‖² (one extra iteration of the same map),
      asking the trained depth to be a fixed point.
    """
    if not spec:
        return
    import torch

    from energyformers.modeling import modeling_hyperset as mh

    kind, _, value = spec.partition(":")
    value = float(value)
    if kind in ("tanh", "pos"):
        original = mh.HyperSetStepSizes.forward

        def step_sizes(self, iteration_condition, state):
            alpha, gamma = original(self, iteration_condition, state)
            if kind == "tanh":
                return value * torch.tanh(alpha / value), value * torch.tanh(gamma / value)
            return value * torch.sigmoid(alpha), value * torch.sigmoid(gamma)

        mh.HyperSetStepSizes.forward = step_sizes
    elif kind == "stayput":
        original = mh.HyperSetForImageClassification.forward

        # explicit keywords: Trainer hands extra loss kwargs to a forward that takes **kwargs
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
            )
            if not (self.training and labels is not None):
                return original(
                    self, output_hidden_states=output_hidden_states, return_dict=return_dict, **kwargs
                )
            out = original(self, output_hidden_states=True, return_dict=True, **kwargs)
            backbone = self.hyperset
            states = out.hidden_states
            last = states[-1]
            source = states[0] if backbone.config.step_size_condition == "input" else last
            condition = backbone.step_sizes.iteration_conditions(len(states), last)[-1]  # c_{T+1}
            following, _ = backbone.layers[-1](last, condition, source, backbone.step_sizes, None, states[0])
            change = (following - last).flatten(1).pow(2).sum(1) / last.flatten(1).pow(2).sum(1)
            out.loss = out.loss + value * change.mean()
            out.hidden_states = None
            return out

        mh.HyperSetForImageClassification.forward = forward
    else:
        raise ValueError(f"unknown experiment patch {spec!r}")


# --------------------------------------------------------------------------- worker: train + evaluate one run


def _test_batches(model_dir: Path, dataset: str, max_test: int | None, batch_size: int) -> list:
    import torch
    from transformers import AutoImageProcessor

    from energyformers.training.data import load_data
    from energyformers.training.processing import image_transform

    test = load_data(dataset, seed=0)["test"]  # the CLI's split (seed 0), first N like --max_test_samples
    if max_test is not None:
        test = test.select(range(min(max_test, len(test))))
    test = test.with_transform(image_transform(AutoImageProcessor.from_pretrained(model_dir)))
    batches = []
    for i in range(0, len(test), batch_size):
        rows = test[i : i + batch_size]
        batches.append((rows["pixel_values"], torch.as_tensor(rows["labels"])))
    return batches


def _evaluate(model, batches, num_iterations: int, tolerance: float | None = None) -> tuple[float, float]:
    """(test accuracy, mean iterations used per sample)."""
    import torch

    correct = total = 0
    used = 0.0
    with torch.inference_mode():
        for pixels, labels in batches:
            out = model(pixel_values=pixels, num_iterations=num_iterations, halting_tolerance=tolerance)
            correct += int((out.logits.argmax(-1) == labels).sum())
            total += len(labels)
            counts = out.iterations_used
            used += float(counts.sum()) if counts is not None else num_iterations * len(labels)
    return correct / total, used / total


def _diagnostics(model, batches, trained: int) -> dict:
    """Relative state change at T, 2T, 10T, ‖x_10T‖/‖x_T‖ and step-size statistics at T (first test batch)."""
    import torch

    backbone = model.base_model
    stats = {}
    with torch.inference_mode():
        states = backbone(
            pixel_values=batches[0][0], num_iterations=10 * trained, output_hidden_states=True
        ).hidden_states
        for k in (trained, 2 * trained, 10 * trained):
            change = (states[k] - states[k - 1]).flatten(1).norm(dim=1) / states[k - 1].flatten(1).norm(dim=1)
            stats[f"rel_change_at_{k}"] = float(change.mean())
        ratio = states[10 * trained].flatten(1).norm(dim=1) / states[trained].flatten(1).norm(dim=1)
        stats["state_norm_ratio_10T_over_T"] = float(ratio.mean())
        condition = backbone.step_sizes.iteration_conditions(trained, states[0])[trained - 1]
        source = states[0] if backbone.config.step_size_condition == "input" else states[trained - 1]
        alpha, gamma = backbone.step_sizes(condition, source)
        stats.update(
            mean_abs_alpha=float(alpha.abs().mean()),
            mean_abs_gamma=float(gamma.abs().mean()),
            frac_negative_alpha=float((alpha < 0).float().mean()),
            frac_negative_gamma=float((gamma < 0).float().mean()),
        )
    return stats


def _choose_epsilon(per_epsilon: dict, reference: float) -> float | None:
    """The ε with the fewest mean iterations whose accuracy is within 0.5 point of `reference`."""
    ok = [(used, -eps, eps) for eps, (acc, used) in per_epsilon.items() if acc >= reference - 0.005 - 1e-9]
    return min(ok)[2] if ok else None


def _time_forwards(model, pixels, calls: dict, repeats: int) -> dict:
    """Median wall-clock seconds of each named forward (kwargs), interleaved, after one warm-up round."""
    import torch

    times = {name: [] for name in calls}
    used = {}
    with torch.inference_mode():
        for round_ in range(repeats + 1):
            for name, kwargs in calls.items():
                start = time.perf_counter()
                out = model(pixel_values=pixels, **kwargs)
                if round_:
                    times[name].append(time.perf_counter() - start)
                counts = out.iterations_used
                used[name] = float(counts.float().mean()) if counts is not None else kwargs["num_iterations"]
    return {
        name: {"seconds": statistics.median(t), "mean_iterations": used[name]} for name, t in times.items()
    }


def worker(args: argparse.Namespace) -> None:
    """Train and measure one variant (the driver's subprocess). The trained model folder is scratch, removed
    however the run ends: what is kept is the JSON written to `args.json`."""
    with tempfile.TemporaryDirectory(prefix=f"recurrent-depth-{args.worker}-") as scratch:
        _train_and_measure(args, Path(scratch))


def _train_and_measure(args: argparse.Namespace, workdir: Path) -> None:
    import torch

    torch.set_num_threads(args.num_threads)
    description, overrides, patch = VARIANTS[args.worker]
    apply_patch(patch)
    from energyformers import HyperSetForImageClassification
    from energyformers.training import train

    argv = ["--model", "hyperset", "--dataset", args.dataset, "--output_dir", str(workdir / "model")]
    if args.epochs is not None:
        argv += ["--epochs", f"{args.epochs:g}"]
    for flag in ("max_train_samples", "max_test_samples"):
        if getattr(args, flag) is not None:
            argv += [f"--{flag}", str(getattr(args, flag))]
    argv += ["--seed", str(args.seed), "--num_threads", str(args.num_threads), "--disable_tqdm"]
    argv += ["--num_predictions", "0"]
    if overrides:
        argv += ["--config", *(f"{k}={json.dumps(v)}" for k, v in overrides.items())]
    start = time.time()
    status = train.main(argv)
    train_seconds = time.time() - start
    if status != 0:
        raise SystemExit(f"training {args.worker} failed with status {status}")

    model = HyperSetForImageClassification.from_pretrained(workdir / "model").eval()
    trained = model.config.num_iterations
    batches = _test_batches(workdir / "model", args.dataset, args.max_test_samples, 256)
    factors = FACTORS if args.long else FACTORS[:-1]
    depths = sorted({max(1, round(f * trained)) for f in factors})
    accuracy = {d: _evaluate(model, batches, d)[0] for d in depths}
    epsilons = SEARCH_EPSILONS if args.time_halting else TABLE_EPSILONS
    halting = {
        limit: {eps: _evaluate(model, batches, limit, eps) for eps in epsilons}
        for limit in ((trained, 10 * trained) if args.time_halting else (10 * trained,))
    }
    config = model.config
    result = {
        "variant": args.worker,
        "seed": args.seed,
        "description": description,
        "experiment": patch,
        "config_overrides": overrides,
        "effective_config": {
            k: getattr(config, k)
            for k in (
                "iteration_conditioning",
                "input_anchor",
                "iteration_sampling",
                "iteration_range",
                "backprop_iterations",
                "num_iterations",
            )
        },
        "command": "energyformers train "
        + shlex.join(argv).replace(f" --output_dir {workdir / 'model'}", ""),
        "trained_iterations": trained,
        "train_seconds": round(train_seconds, 1),
        "test_size": sum(len(b[1]) for b in batches),
        "accuracy": accuracy,
        "halting": {limit: {str(e): list(v) for e, v in per.items()} for limit, per in halting.items()},
        "diagnostics": _diagnostics(model, batches, trained),
    }
    if args.time_halting:
        pixels = torch.cat([b[0] for b in batches])[:256]
        eps_short = _choose_epsilon(halting[trained], accuracy[trained])
        eps_long = _choose_epsilon(halting[10 * trained], accuracy[trained])
        calls = {"fixed T": {"num_iterations": trained}, "fixed 10T": {"num_iterations": 10 * trained}}
        if eps_short is not None:
            calls[f"halting ε={eps_short:g}, max T"] = {
                "num_iterations": trained,
                "halting_tolerance": eps_short,
            }
        if eps_long is not None:
            calls[f"halting ε={eps_long:g}, max 10T"] = {
                "num_iterations": 10 * trained,
                "halting_tolerance": eps_long,
            }
        result["halting_timing"] = {
            "epsilon_max_T": eps_short,
            "epsilon_max_10T": eps_long,
            "batch_size": len(pixels),
            "repeats": args.repeats,
            "forwards": _time_forwards(model, pixels, calls, args.repeats),
        }
    Path(args.json).write_text(json.dumps(result, indent=2))
    print(json.dumps({k: result[k] for k in ("variant", "seed", "accuracy", "train_seconds")}), flush=True)


# --------------------------------------------------------------------------- driver


def main() -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--dataset", default="digits")
    parser.add_argument("--variants", default=",".join(VARIANTS), help=f"comma list of {list(VARIANTS)}")
    parser.add_argument("--epochs", type=float, default=None, help="default: the CLI's (12 for images)")
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--max_test_samples", type=int, default=None)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument(
        "--extra_seeds",
        default="43,44",
        help=f"more seeds for {list(SEED_VARIANTS)} (comma list; '' for none)",
    )
    parser.add_argument("--num_threads", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=7, help="timing repeats (median)")
    parser.add_argument("--long", action="store_true", help="also evaluate 100T")
    parser.add_argument(
        "--cache",
        default=None,
        help="keep the per-run JSON results in this folder and reuse those found there "
        "(default: a temporary folder, removed at the end)",
    )
    parser.add_argument("--no_write", action="store_true", help="print only; do not write results")
    parser.add_argument(
        "--output_dir",
        type=Path,
        default=RESULTS,
        help="where the .md/.json/.png go (default benchmarks/results)",
    )
    parser.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--json", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--time_halting", action="store_true", help=argparse.SUPPRESS)
    parser.add_argument("--replot", action="store_true", help="redraw the PNG from the written JSON only")
    parser.add_argument(
        "--rerender",
        action="store_true",
        help="rewrite the .md from the written JSON only (its recorded run and timings), e.g. after a report change",
    )
    args = parser.parse_args()
    if args.worker:
        worker(args)
        return
    if args.replot:
        plot(args, json.loads((args.output_dir / f"{_stem(args)}.json").read_text())["runs"])
        return
    if args.rerender:
        recorded = json.loads((args.output_dir / f"{_stem(args)}.json").read_text())
        report = build_report(args, recorded["runs"], recorded["total_seconds"], recorded["run"])
        (args.output_dir / f"{_stem(args)}.md").write_text(report)
        return

    names = [n for n in args.variants.split(",") if n]
    unknown = [n for n in names if n not in VARIANTS]
    if unknown:
        raise SystemExit(f"unknown variants {unknown}; choose from {list(VARIANTS)}")
    extra = [int(s) for s in args.extra_seeds.split(",") if s]
    runs = [(n, args.seed) for n in names] + [(n, s) for s in extra for n in names if n in SEED_VARIANTS]
    cache = Path(args.cache or tempfile.mkdtemp(prefix="recurrent-depth-"))
    cache.mkdir(parents=True, exist_ok=True)
    passthrough = [
        "--dataset",
        args.dataset,
        "--num_threads",
        str(args.num_threads),
        "--repeats",
        str(args.repeats),
    ]
    if args.long:
        passthrough.append("--long")
    for flag in ("epochs", "max_train_samples", "max_test_samples"):
        if getattr(args, flag) is not None:
            passthrough += [f"--{flag}", f"{getattr(args, flag):g}"]
    start = time.time()
    results: dict[str, dict] = {}
    try:
        for name, seed in runs:
            key = name if seed == args.seed else f"{name}@{seed}"
            path = cache / f"{args.dataset}-{name}-{seed}.json"
            if not (args.cache and path.is_file()):
                command = [sys.executable, __file__, "--worker", name, "--seed", str(seed)]
                command += ["--json", str(path)]
                if name == "default" and seed == args.seed:
                    command.append("--time_halting")
                print(f"[{time.time() - start:6.0f} s] {key}", flush=True)
                run_start = time.time()
                subprocess.run(command + passthrough, check=True, cwd=REPO)
                result = json.loads(path.read_text())
                result["run_seconds"] = round(
                    time.time() - run_start, 1
                )  # training + evaluation, this process tree
                path.write_text(json.dumps(result, indent=2))
            results[key] = json.loads(path.read_text())
    finally:
        if not args.cache:  # runs kept only where the user asked for them (--cache)
            shutil.rmtree(cache, ignore_errors=True)
    # total compute of the runs (also those reused from --cache); this invocation's time if a run lacks it
    timed = [r.get("run_seconds") for r in results.values()]
    total = sum(timed) if all(timed) else time.time() - start
    run = provenance.run_info(seed=[args.seed, *extra])
    report = build_report(args, results, total, run)
    print(report)
    if not args.no_write:
        write_results(args, results, report, total, run)


def _label(factor: float) -> str:
    return {0.5: "T/2", 1: "T"}.get(factor, f"{factor:g}T")


def _seed_groups(results: dict) -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = {}
    for key, r in results.items():
        groups.setdefault(key.split("@")[0], []).append(r)
    return groups


def target_line(group: list[dict], trained: int) -> str:
    """The recurrent-depth target on the default's seeds: accuracy at 2T, 4T and 10T within `TARGET_POINTS` of T,
    judged on the seed mean and on each seed, with the margin by which it is met or missed."""

    def drop(accuracies: list[dict]) -> float:  # worst drop of the mean accuracy, in points
        mean = {d: statistics.mean(a[str(d)] for a in accuracies) for d in (1, 2, 4, 10)}
        return round(
            max(mean[1] - mean[k] for k in (2, 4, 10)) * 100, 6
        )  # a drop of exactly 1.0 point is met

    accuracies = [{str(k): r["accuracy"][str(k * trained)] for k in (1, 2, 4, 10)} for r in group]
    on_mean = drop(accuracies)
    missed = [(r["seed"], drop([a])) for r, a in zip(group, accuracies) if drop([a]) > TARGET_POINTS]
    verdict = "met" if on_mean <= TARGET_POINTS else f"MISSED by {on_mean - TARGET_POINTS:.1f} points"
    per_seed = (
        "met on every seed"
        if not missed
        else "missed on "
        + ", ".join(f"seed {seed} by {points - TARGET_POINTS:.1f} points" for seed, points in missed)
    )
    return (
        f"Target (accuracy at 2T, 4T and 10T within {TARGET_POINTS:g} point of T), `default`: {verdict} on the mean "
        f"of the {len(group)} seeds (worst drop {on_mean:.1f} points); {per_seed}."
    )


def build_report(args: argparse.Namespace, results: dict, total: float, run: dict) -> str:
    first = next(iter(results.values()))
    trained = first["trained_iterations"]
    factors = [f for f in FACTORS if str(max(1, round(f * trained))) in first["accuracy"]]
    depths = [str(max(1, round(f * trained))) for f in factors]
    labels = [f"{_label(f)} = {d}" for f, d in zip(factors, depths)]
    main_runs = {k: r for k, r in results.items() if "@" not in k}
    t = str(trained)

    def drop(acc: dict) -> float:
        return max(acc[t] - acc[str(k * trained)] for k in (2, 4, 10)) * 100

    lines = [
        f"# Recurrent depth: Hyper-SET test accuracy vs test-time iterations ({args.dataset})",
        "",
        *provenance.markdown_lines(run),
        "",
        f"{len(results)} training runs, {total / 60:.0f} min in total, {args.num_threads} torch threads each, "
        f"no GPU. Each run trains the CLI's default Hyper-SET for `{args.dataset}` (`energyformers train --model "
        f"hyperset --dataset {args.dataset}`: d = 128, 4 heads, T = {trained}, mean pooling, seed {args.seed}"
        + (f", {args.epochs:g} epochs" if args.epochs else ", the CLI's 12 epochs at lr 3e-3")
        + (f", the first {args.max_train_samples} training images" if args.max_train_samples else "")
        + f") with the variant's `--config`, reloads it and evaluates the {first['test_size']} test images"
        + (f" (the first {args.max_test_samples})" if args.max_test_samples else "")
        + f". Plot: [`{_stem(args)}.png`]({_stem(args)}.png). On {first['test_size']} images one point is "
        f"{first['test_size'] / 100:.1f} images.",
        "",
        f"## Test accuracy vs iterations at test time (seed {args.seed})",
        "",
        "| variant | " + " | ".join(labels) + " | worst drop at 2T/4T/10T vs T (points) |",
        "|---|" + "---|" * (len(labels) + 1),
    ]
    for name, r in main_runs.items():
        acc = r["accuracy"]
        tag = " (experiment)" if r["experiment"] else ""
        lines.append(
            f"| `{name}`{tag}: {r['description']} | "
            + " | ".join(f"{acc[d]:.4f}" if d in acc else "—" for d in depths)
            + f" | {drop(acc):.1f} |"
        )
    groups = {n: g for n, g in _seed_groups(results).items() if len(g) > 1}
    if groups:
        seeds = sorted({r["seed"] for g in groups.values() for r in g})
        lines += [
            "",
            f"## Seed spread (seeds {', '.join(map(str, seeds))}): mean ± standard deviation",
            "",
            "| variant | " + " | ".join(labels[:5]) + " | worst drop 2T–10T (points), per seed |",
            "|---|" + "---|" * 6,
        ]
        for name, group in groups.items():
            cells = []
            for d in depths[:5]:
                values = [r["accuracy"][d] for r in group]
                cells.append(f"{statistics.mean(values):.4f} ± {statistics.stdev(values):.4f}")
            drops = ", ".join(f"{drop(r['accuracy']):.1f}" for r in group)
            lines.append(f"| `{name}` | " + " | ".join(cells) + f" | {drops} |")
        if "default" in groups:
            lines += ["", target_line(groups["default"], trained)]
    lines += [
        "",
        f"## Adaptive halting (state criterion), at most 10T = {10 * trained} iterations",
        "",
        "Test accuracy / mean iterations used per sample (a model whose state converges stops early; one whose "
        "state keeps moving runs to the maximum and inherits its 10T accuracy).",
        "",
        "| variant | fixed T | " + " | ".join(f"ε = {e:g}" for e in TABLE_EPSILONS) + " |",
        "|---|---|" + "---|" * len(TABLE_EPSILONS),
    ]
    for name, r in main_runs.items():
        per = r["halting"][str(10 * trained)]
        lines.append(
            f"| `{name}` | {r['accuracy'][t]:.4f} / {trained} | "
            + " | ".join(f"{per[str(e)][0]:.4f} / {per[str(e)][1]:.1f}" for e in TABLE_EPSILONS)
            + " |"
        )
    default = main_runs.get("default")
    if default and "halting_timing" in default:
        timing = default["halting_timing"]
        lines += [
            "",
            "### Halting on the CLI-default model: ε search and wall clock",
            "",
            "| max iterations | " + " | ".join(f"ε = {e:g}" for e in SEARCH_EPSILONS) + " |",
            "|---|" + "---|" * len(SEARCH_EPSILONS),
        ]
        for limit, per in default["halting"].items():
            lines.append(
                f"| {limit} | "
                + " | ".join(f"{per[str(e)][0]:.4f} / {per[str(e)][1]:.2f}" for e in SEARCH_EPSILONS)
                + " |"
            )
        fixed = timing["forwards"]["fixed T"]["seconds"]
        lines += [
            "",
            f"ε is the one with the fewest mean iterations whose accuracy is within 0.5 point of the fixed-T accuracy "
            f"{default['accuracy'][t]:.4f}: ε = {timing['epsilon_max_T']} with at most T, ε = "
            f"{timing['epsilon_max_10T']} with at most 10T. One forward of a batch of {timing['batch_size']} test "
            f"images on this CPU (median of {timing['repeats']}, interleaved, same process):",
            "",
            "| forward | mean iterations (this batch) | wall clock (ms) | vs fixed T |",
            "|---|---|---|---|",
        ]
        for name, f in timing["forwards"].items():
            lines.append(
                f"| {name} | {f['mean_iterations']:.2f} | {f['seconds'] * 1000:.0f} | "
                f"{f['seconds'] / fixed:.2f}× |"
            )
    lines += [
        "",
        "## Diagnostics (first test batch)",
        "",
        "Relative state change ‖x_t − x_t−1‖/‖x_t−1‖ at T, 2T, 10T; state-norm ratio ‖x_10T‖/‖x_T‖; mean |α|, |γ| at "
        "iteration T and the fraction of negative entries (ascent steps on that energy); training seconds.",
        "",
        "| variant | change at T | at 2T | at 10T | ‖x_10T‖/‖x_T‖ | mean abs α | mean abs γ | α < 0 | γ < 0 | train s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for name, r in main_runs.items():
        d = r["diagnostics"]
        lines.append(
            f"| `{name}` | {d[f'rel_change_at_{trained}']:.4f} | {d[f'rel_change_at_{2 * trained}']:.4f} | "
            f"{d[f'rel_change_at_{10 * trained}']:.4f} | {d['state_norm_ratio_10T_over_T']:.2f} | "
            f"{d['mean_abs_alpha']:.3f} | {d['mean_abs_gamma']:.3f} | {d['frac_negative_alpha']:.2f} | "
            f"{d['frac_negative_gamma']:.2f} | {r['train_seconds']:.0f} |"
        )
    lines += ["", "## Training commands", ""]
    for name, r in main_runs.items():
        patch = f" + experiment patch `{r['experiment']}` (`apply_patch`)" if r["experiment"] else ""
        lines.append(f"* `{name}`: `{r['command']}`{patch}")
    return "\n".join(lines) + "\n"


def _stem(args: argparse.Namespace) -> str:
    return "recurrent_depth" if args.dataset == "digits" else f"recurrent_depth_{args.dataset}"


def write_results(args: argparse.Namespace, results: dict, report: str, total: float, run: dict) -> None:
    folder = provenance.output_dir(args.output_dir)
    stem = _stem(args)
    (folder / f"{stem}.md").write_text(report)
    payload = {"run": run, "argv": sys.argv[1:], "total_seconds": round(total, 1), "runs": results}
    (folder / f"{stem}.json").write_text(json.dumps(payload, indent=2) + "\n")

    plot(args, results)


def plot(args: argparse.Namespace, results: dict) -> None:
    """Accuracy vs test-time iterations, one panel without and one with the anchor energy."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    trained = next(iter(results.values()))["trained_iterations"]
    groups = _seed_groups(results)
    anchored = {n: g for n, g in groups.items() if g[0]["effective_config"]["input_anchor"] > 0}
    plain = {n: g for n, g in groups.items() if n not in anchored}
    panels = [
        ("paper's dynamics (input_anchor = 0)", plain),
        ("with the anchor energy (input_anchor > 0)", anchored),
    ]
    panels = [p for p in panels if p[1]]
    # own y axes: the anchored runs differ by a few points, which a shared 0.1–1 axis would flatten
    fig, axes = plt.subplots(1, len(panels), figsize=(7.5 * len(panels), 5.8), squeeze=False)
    for ax, (title, group) in zip(axes[0], panels):
        for index, (name, runs) in enumerate(group.items()):
            depths = sorted(int(d) for d in runs[0]["accuracy"])
            values = [[r["accuracy"][str(d)] for r in runs] for d in depths]
            mean = [statistics.mean(v) for v in values]
            label = name + (f" (mean, min–max of {len(runs)} seeds)" if len(runs) > 1 else "")
            err = [[m - min(v) for m, v in zip(mean, values)], [max(v) - m for m, v in zip(mean, values)]]
            ax.errorbar(
                depths,
                mean,
                yerr=err if len(runs) > 1 else None,
                color="black" if name == "default" else plt.cm.tab10(index % 10),
                marker="o",
                linestyle="--" if runs[0]["experiment"] else "-",
                linewidth=2.8 if name == "default" else 1.3,
                capsize=3,
                label=label,
            )
        ax.axvline(trained, color="grey", linestyle=":", label=f"trained T = {trained}")
        ax.set_xscale("log", base=2)
        ax.set_xticks(depths, [f"{d}\n({_label(d / trained)})" for d in depths])
        ax.minorticks_off()
        ax.set_xlabel("iterations at test time (log scale)", labelpad=8)
        ax.set_ylabel("test accuracy")
        ax.set_title(title)
        ax.grid(alpha=0.3)
        ax.legend(loc="upper center", bbox_to_anchor=(0.5, -0.24), ncol=2, fontsize=8)
    fig.suptitle(f"Hyper-SET on {args.dataset} (trained T = {trained}): accuracy vs test-time depth")
    fig.tight_layout()
    fig.savefig(provenance.output_dir(args.output_dir) / f"{_stem(args)}.png", dpi=110, bbox_inches="tight")
    plt.close(fig)


if __name__ == "__main__":
    main()
