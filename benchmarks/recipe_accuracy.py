"""fashion_mnist test accuracy of the CLI's default model trained with and without a training recipe.

Each variant is one `energyformers train` subprocess on the same data, model, epochs and seed; only the recipe
(`--recipe NAME`, the presets of `energyformers.training.recipes.RECIPES`) or the extra flags of a
`--variant` differ. Flags given here (`--epochs`, `--batch_size` ...) are passed explicitly to every run, and an
explicit flag wins over the recipe's value for it (a 300-epoch paper schedule is not a CPU benchmark).
Test accuracy and wall time come from each run folder's `metrics.json`.

A recipe's warm-up and cooldown are counted in epochs (`deit`: 5 and 10 of 300). Left as they are, a run cut to
`--epochs 3` would warm up over all 3 epochs and then add 10 cooldown epochs at the floor lr (13 epochs in all).
So when `--epochs` shortens a recipe, every variant using that recipe gets `--warmup_epochs` and
`--cooldown_epochs` scaled by the same factor (`deit` at 3 epochs: 0.05 and 0.1), keeping the schedule's shape;
a variant that sets either flag itself keeps its own value. The flags added are shown in the report.

Writes benchmarks/results/recipe_accuracy.{md,json}.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/recipe_accuracy.py --recipe hyperset-ic \\
        --max_train_samples 10000 --max_test_samples 2000 --epochs 4 --seeds 0,1
    # a variant with explicit augmentation flags (name=flags), next to the recipe:
    .venv/bin/python benchmarks/recipe_accuracy.py --recipe hyperset-ic \\
        --variant "flip+crop+mixup=--horizontal_flip 0.5 --random_resized_crop_scale 0.35 --mixup_alpha 0.2"
    # the paper's baseline, transformers' ViT, on the same data (one command per model, each its default lr):
    .venv/bin/python benchmarks/recipe_accuracy.py --recipe '' --model vit --dataset digits --seeds 0,1,2
"""

from __future__ import annotations

import argparse
import json
import shlex
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

# before torch is imported, here and in the subprocesses
provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")

RESULTS = provenance.RESULTS
REPO = provenance.REPO
CLI = [sys.executable, "-m", "energyformers", "train"]


def cli_accepts(flag: str) -> bool:
    """Whether `energyformers train --help` lists `flag` (the recipe flags are wired by the training loop)."""
    help_text = subprocess.run([*CLI, "--help"], capture_output=True, text=True, cwd=REPO).stdout
    return flag in help_text.split()  # whole words: "--recipe" must not match "--recipes_dir" and the like


def parse_variants(args: argparse.Namespace) -> dict[str, list[str]]:
    """name → flags added to the common command: the baseline, the recipe, then each `--variant name=flags`."""
    variants = {"baseline": []}
    if args.recipe:
        variants[f"recipe {args.recipe}"] = ["--recipe", args.recipe]
    for item in args.variant:
        name, sep, flags = item.partition("=")
        # "run" is the JSON's key of the run's provenance, beside the variants
        if not sep or not name.strip() or name.strip() in {*variants, "run"}:
            raise SystemExit(
                f"--variant {item!r}: expected a new NAME=FLAGS, e.g. 'flip=--horizontal_flip 0.5'"
            )
        variants[name.strip()] = shlex.split(flags)
    return variants


def shortened_schedule(flags: list[str], epochs: float | None) -> list[str]:
    """`--warmup_epochs` / `--cooldown_epochs` scaled to `epochs` for a variant whose `--recipe` counts them
    over a longer run (none when the variant has no recipe, `epochs` is unset, or the variant sets the flag)."""
    if epochs is None or "--recipe" not in flags:
        return []
    from energyformers.training.recipes import RECIPES

    recipe = RECIPES[flags[flags.index("--recipe") + 1]]
    full = recipe.get("num_train_epochs")
    if not full or epochs >= full:
        return []
    added = []
    for key in ("warmup_epochs", "cooldown_epochs"):
        if key in recipe and f"--{key}" not in flags:
            added += [f"--{key}", f"{recipe[key] * epochs / full:g}"]
    return added


def common_flags(args: argparse.Namespace) -> list[str]:
    flags = ["--model", args.model, "--dataset", args.dataset, "--num_threads", str(args.num_threads)]
    flags += ["--disable_tqdm", "--num_predictions", "0"]
    for name in ("epochs", "max_train_samples", "max_test_samples", "batch_size", "max_steps"):
        value = getattr(args, name)
        if value is not None:
            flags += [f"--{name}", f"{value:g}" if isinstance(value, float) else str(value)]
    return flags


def run(command: list[str], output_dir: Path) -> dict:
    start = time.time()
    subprocess.run(command, check=True, cwd=REPO)
    metrics = json.loads((output_dir / "metrics.json").read_text())
    return {
        "test_accuracy": metrics["test"]["accuracy"],
        "eval_accuracy": metrics.get("eval", {}).get("accuracy"),
        "train_loss": metrics.get("train", {}).get("train_loss"),
        "wall_s": round(time.time() - start, 1),
        # the run folder is temporary: name it by its flag's role, not its path
        "command": shlex.join(["energyformers", "train", *command[len(CLI) :]]).replace(
            str(output_dir), "RUN"
        ),
        "recipe": metrics.get("recipe", {}),
    }


def build_report(
    args: argparse.Namespace, results: dict[str, list[dict]], total: float, run_info: dict
) -> str:
    lines = [
        f"# {args.dataset} test accuracy with and without a training recipe ({args.model}, CLI default model)",
        "",
        *provenance.markdown_lines(run_info),
        "",
        f"{sum(len(r) for r in results.values())} training runs, {total / 60:.1f} min, {args.num_threads} torch "
        "thread(s) each.",
        "",
        "| variant | flags | test accuracy (mean ± sd over seeds) | per seed | wall s / run |",
        "|---|---|---|---|---|",
    ]
    for name, runs in results.items():
        accs = [r["test_accuracy"] for r in runs]
        spread = f" ± {statistics.stdev(accs):.4f}" if len(accs) > 1 else ""
        flags = shlex.join(runs[0]["flags"]) or "—"
        per_seed = ", ".join(f"{a:.4f}" for a in accs)
        wall = statistics.mean(r["wall_s"] for r in runs)
        lines.append(
            f"| {name} | `{flags}` | {statistics.mean(accs):.4f}{spread} | {per_seed} | {wall:.0f} |"
        )
    lines += ["", "Commands (first seed):", ""]
    lines += [f"* {name}: `{runs[0]['command']}`" for name, runs in results.items()]
    return "\n".join(lines) + "\n"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--recipe", default="hyperset-ic", help="recipe compared with the baseline ('' = none)"
    )
    parser.add_argument(
        "--variant", action="append", default=[], metavar="NAME=FLAGS", help="extra variant (repeatable)"
    )
    parser.add_argument(
        "--model",
        default="hyperset",
        help="what `energyformers train --model` takes: a family, the looped-transformer baseline or transformers' "
        "`vit` (the CLI's default config and learning rate for it)",
    )
    parser.add_argument("--dataset", default="fashion_mnist")
    parser.add_argument("--seeds", default="0", help="comma-separated training seeds")
    parser.add_argument("--epochs", type=float, default=None, help="passed to every run (default: the CLI's)")
    parser.add_argument("--batch_size", type=int, default=None)
    parser.add_argument("--max_steps", type=int, default=None, help="short smoke runs")
    parser.add_argument("--max_train_samples", type=int, default=None)
    parser.add_argument("--max_test_samples", type=int, default=None)
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--dry_run", action="store_true", help="print the commands; train nothing")
    parser.add_argument("--no_write", action="store_true", help="print only; do not write results/")
    args = parser.parse_args()

    from energyformers.training.setup import model_registry

    if args.model not in model_registry():
        raise SystemExit(f"--model {args.model!r}: unknown; expected one of {sorted(model_registry())}")
    variants = parse_variants(args)
    variants = {name: [*flags, *shortened_schedule(flags, args.epochs)] for name, flags in variants.items()}
    seeds = [int(s) for s in args.seeds.split(",") if s.strip()]
    if not seeds:
        raise SystemExit(f"--seeds {args.seeds!r}: give at least one integer seed")
    needed = {flag for flags in variants.values() for flag in flags if flag.startswith("--")}
    missing = [] if args.dry_run else sorted(flag for flag in needed if not cli_accepts(flag))
    if missing:
        raise SystemExit(
            f"energyformers train does not accept {missing} yet (the training loop has not wired the recipe "
            "flags); nothing was run"
        )
    run_info = provenance.run_info(seed=seeds)
    start = time.time()
    results: dict[str, list[dict]] = {name: [] for name in variants}
    with tempfile.TemporaryDirectory(prefix="recipe-accuracy-") as workdir:
        # Seeds outermost: an interrupted benchmark still has every variant of the first seed.
        for seed in seeds:
            for name, flags in variants.items():
                out = Path(workdir) / f"{name.replace(' ', '_')}-{seed}"
                command = [*CLI, "--output_dir", str(out), "--seed", str(seed), *flags, *common_flags(args)]
                if args.dry_run:
                    print(shlex.join(command))
                    continue
                print(f"[{time.time() - start:6.0f} s] {name}, seed {seed}", flush=True)
                results[name].append({"seed": seed, "flags": flags, **run(command, out)})
    if args.dry_run:
        return
    total = time.time() - start
    report = build_report(args, results, total, run_info)
    print(report)
    if not args.no_write:
        RESULTS.mkdir(exist_ok=True)
        (RESULTS / "recipe_accuracy.md").write_text(report)
        (RESULTS / "recipe_accuracy.json").write_text(
            json.dumps({"run": run_info, **results}, indent=2) + "\n"
        )


if __name__ == "__main__":
    main()
