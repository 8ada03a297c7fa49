"""Sudoku accuracy vs test-time iterations: Hyper-SET and the looped-Transformer baseline (paper Fig. 3), each
trained with the loss on the last iteration only (the paper's) and with deep supervision over the iterations.

Every run is trained on the same hard puzzles (`--dataset sudoku-hard`: larsdoku 4.0.0, 21–29 givens) with the
same budget (steps, batch, AdamW betas, weight decay, lr and cosine schedule, gradient clipping, seed: the same
initial weights per model) through the real training CLI (`python -m energyformers.training.train`, i.e.
exactly the `energyformers train ...` command recorded in the results; `--max_parallel` runs at once, one thread
each), only `--deep_supervision` differing (`--supervision last,all`). Each run logs its training loss every
`--logging_steps` and its validation blank-cell accuracy at T/2, T, 2T, 4T every `--eval_steps` (the curve that
shows the plateau and its end); the plateau exit here is `plateau_exit`: the first logged step where the mean of
the last 5 logged training losses is below ln 9 - 0.05 (not `energyformers inspect`'s `plateau_exit_step`, see
`plateau_exit`). Then each saved folder is reloaded and evaluated on a fixed test subset
(the first N puzzles of the sudoku-hard test split) at depths T/3 … 4T: blank-cell accuracy (the fraction of
blank cells predicted right) and board accuracy (every blank of the puzzle right), one forward pass, argmax per
cell. Writes `<--results>.{md,json,png}` (default benchmarks/results/sudoku_depth), with the spec's targets
marked met or missed; the .md embeds the .png by the name it is written under.

CPU (the default; a REDUCED model and budget: d = 64, H = 8, T = 8, 300 steps of batch 16; four runs):

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sudoku_depth.py --work_dir runs/sudoku-depth --reuse

(`--reuse`: a folder of `--work_dir` whose metrics.json records exactly the planned command is not trained again,
and its depth evaluation on the same puzzles is read back: the runs can be split over processes with `--models`
and `--supervision`, then evaluated together.)

GPU recipe at paper size (d = 768, H = 12, M = 4d, T = 24 via `--preset sudoku`; AdamW β = (0, 0.95), weight
decay 0.1, lr 1e-4 cosine, clip 1.0, batch 16, 200 epochs on 10,000 hard puzzles, torch.compile, bf16): one
command per model, the same flags, then the depth evaluation of the two saved folders on the full test split:

    energyformers train --model hyperset --dataset sudoku-hard --preset sudoku --max_train_samples 10000 \\
        --epochs 200 --batch_size 16 --lr 1e-4 --lr_scheduler_type cosine --weight_decay 0.1 \\
        --max_grad_norm 1.0 --adam_beta1 0 --adam_beta2 0.95 --bf16 --torch_compile --seed 42 \\
        --output_dir runs/sudoku-hyperset
    energyformers train --model looped-transformer ...same flags... --output_dir runs/sudoku-looped
    python benchmarks/sudoku_depth.py --hyperset_dir runs/sudoku-hyperset --looped_dir runs/sudoku-looped \\
        --n_test 10000

or all three in one: `python benchmarks/sudoku_depth.py --paper` (trains both with exactly those flags into
`--work_dir`, default runs/, then evaluates).
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shlex
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (README: CPU threads)

RESULTS = provenance.RESULTS
REPO = Path(__file__).resolve().parents[1]
FACTORS = (1 / 3, 1 / 2, 2 / 3, 1, 3 / 2, 2, 3, 4)  # test-time depth as a multiple of the trained T
MODELS = {"hyperset": "Hyper-SET", "looped-transformer": "looped Transformer"}

# The paper's Sudoku recipe (Table 4 / the authors' notebook): identical for both models.
PAPER_FLAGS = [
    "--dataset", "sudoku-hard", "--preset", "sudoku", "--max_train_samples", "10000",
    "--epochs", "200", "--batch_size", "16", "--lr", "1e-4", "--lr_scheduler_type", "cosine",
    "--weight_decay", "0.1", "--max_grad_norm", "1.0", "--adam_beta1", "0", "--adam_beta2", "0.95",
    "--bf16", "--torch_compile", "--seed", "42",
]  # fmt: skip


SUPERVISION = ("last", "all", "every", "random")  # --deep_supervision of the training CLI
# Plateau exit: the first logged step where the mean training loss of the last PLATEAU_WINDOW logging points
# falls below ln 9 - PLATEAU_MARGIN (ln 9 = 2.197: the loss of a uniform guess over the 9 digits).
PLATEAU_MARGIN = 0.05
PLATEAU_WINDOW = 5
LN9 = math.log(9)
ACCURACY_EXIT = 0.13  # the accuracy exit: 2 points over chance (1/9 = 0.111) at T on validation


def eval_depths(T: int) -> list[int]:
    """The depths logged during training (`--eval_iterations`): T/2, T, 2T, 4T."""
    return sorted({max(1, T // 2), T, 2 * T, 4 * T})


def reduced_flags(args: argparse.Namespace, threads: int) -> list[str]:
    """The CPU budget: the paper's preset and optimiser, a reduced width/depth/data/steps and a higher lr; the
    training loss logged every `--logging_steps` and the validation accuracy at T/2, T, 2T, 4T every
    `--eval_steps` (the curve that shows when the plateau ends)."""
    d, T = args.hidden_size, args.iterations
    return [
        "--dataset", "sudoku-hard", "--preset", "sudoku",
        "--config", f"hidden_size={d}", f"num_attention_heads={args.heads}", f"intermediate_size={4 * d}",
        f"num_iterations={T}", f"initializer_range={args.initializer_range}",
        "--max_train_samples", str(args.n_train), "--max_eval_samples", "256",
        "--max_test_samples", str(args.n_test),
        "--max_steps", str(args.steps), "--batch_size", str(args.batch_size), "--lr", str(args.lr),
        "--lr_scheduler_type", "cosine", "--weight_decay", "0.1", "--max_grad_norm", "1.0",
        "--adam_beta1", "0", "--adam_beta2", "0.95", "--seed", str(args.seed),
        "--save_strategy", "no", "--num_threads", str(threads), "--disable_tqdm", "--num_predictions", "0",
        "--logging_steps", str(args.logging_steps), "--eval_strategy", "steps", "--eval_steps",
        str(args.eval_steps), "--eval_iterations", *map(str, eval_depths(T)),
    ]  # fmt: skip


def supervision_flags(supervision: str, weights: str) -> list[str]:
    """The deep-supervision flags of one run ('last' is the paper's loss: no weights to pass)."""
    flags = ["--deep_supervision", supervision]
    # uniform is the config's default: named only when another weighting is asked for
    return (
        flags
        if supervision == "last" or weights == "uniform"
        else [*flags, "--deep_supervision_weights", weights]
    )


def run_key(model: str, supervision: str) -> str:
    return f"{model}-{supervision}"


def train_models(
    plan: dict[str, list[str]], work: Path, max_parallel: int, overwrite: bool, reuse: bool
) -> dict:
    """`energyformers train ARGV --output_dir WORK/sudoku-KEY` for each run of `plan` (key -> argv without the
    output folder), each in its own process (`python -m energyformers.training.train`, the CLI's module), at most
    `max_parallel` at once; their output is printed line by line with the run as prefix. With `reuse`, a folder
    whose metrics.json records exactly this command is kept instead of trained again (its recorded wall time is
    reported)."""
    import subprocess
    import threading

    finished: dict[str, float] = {}
    out: dict[str, dict] = {}

    def pump(name: str, proc) -> None:
        for line in proc.stdout:
            line = line.rstrip()
            if line:
                print(f"[{name}] {line}", flush=True)
        proc.wait()
        finished[name] = time.time()

    todo = []
    for key, flags in plan.items():
        argv = [*flags, "--output_dir", str(work / f"sudoku-{key}")]
        argv += ["--overwrite_output_dir"] if overwrite else []
        command = "energyformers train " + shlex.join(argv)
        metrics_file = work / f"sudoku-{key}" / "metrics.json"
        if reuse and metrics_file.is_file():
            metrics = json.loads(metrics_file.read_text())
            if metrics.get("recipe", {}).get("command") == command:
                print(f"[sudoku_depth] {key}: reusing {metrics_file.parent} (same command)", flush=True)
                out[key] = {"command": command, "seconds": metrics.get("wall_time_s"), "reused": True}
                continue
        todo.append((key, argv, command))

    running: dict[str, tuple] = {}

    def wait_one() -> None:
        while True:
            for key, (command, proc, reader, started) in list(running.items()):
                if not reader.is_alive():
                    reader.join()
                    del running[key]
                    if proc.returncode != 0:
                        raise SystemExit(f"training {key} failed with status {proc.returncode}")
                    seconds = finished[key] - started
                    print(f"[sudoku_depth] {key} trained in {seconds:.0f} s", flush=True)
                    out[key] = {"command": command, "seconds": round(seconds, 1)}
                    return
            time.sleep(0.5)

    for key, argv, command in todo:
        while len(running) >= max_parallel:
            wait_one()
        print(f"[sudoku_depth] training {key}: {command}", flush=True)
        started = time.time()
        proc = subprocess.Popen(
            [sys.executable, "-m", "energyformers.training.train", *argv],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=REPO,
            env={**os.environ, "PYTHONUNBUFFERED": "1"},  # progress lines as they come
        )
        reader = threading.Thread(target=pump, args=(key, proc), daemon=True)
        reader.start()
        running[key] = (command, proc, reader, started)
    while running:
        wait_one()
    return {key: out[key] for key in plan}


def plateau_exit(
    log_history: list[dict], margin: float = PLATEAU_MARGIN, window: int = PLATEAU_WINDOW
) -> int | None:
    """The first logged step where the mean of the last `window` logged training losses is below ln 9 - margin
    (None: never in the run). The mean over a window keeps one lucky batch from counting as the exit.

    This is the benchmarks' own definition (sudoku_depth.py and sudoku_easy.py), and it differs from
    `energyformers.training.evaluation.plateau_exit_step`, which `energyformers inspect` reports: that one takes
    the first log below the threshold whose next `PLATEAU_CONSECUTIVE` - 1 logs are below it too (no averaging),
    so on the same log history the two can name different steps (the trailing mean reaches the threshold later
    after a sharp drop, earlier when single logs straddle it).
    """
    losses = [(h["step"], h["loss"]) for h in log_history if "loss" in h]
    for i in range(window - 1, len(losses)):
        if sum(loss for _, loss in losses[i - window + 1 : i + 1]) / window < LN9 - margin:
            return losses[i][0]
    return None


def accuracy_exit(curve: dict[str, list], threshold: float) -> int | None:
    """The first evaluation step where the validation blank-cell accuracy at the trained depth is >= threshold."""
    return next((step for step, blank, _ in curve["trained"] if blank >= threshold), None)


def eval_curve(log_history: list[dict], T: int) -> dict[str, list]:
    """Validation accuracy logged during training: {depth: [[step, blank-cell, board], ...]} for the depths of
    `--eval_iterations` (logged as an entry of their own beside the evaluation's), and "trained" (the head at T,
    the run's own eval_* metrics)."""
    curve: dict[str, list] = {}
    prefix = "eval_blank_cell_accuracy_iterations_"
    for h in log_history:
        if "eval_blank_cell_accuracy" in h:
            curve.setdefault("trained", []).append(
                [h["step"], h["eval_blank_cell_accuracy"], h.get("eval_board_accuracy")]
            )
        for key, value in h.items():
            if key.startswith(prefix):
                depth = key.removeprefix(prefix)
                board = h.get(f"eval_board_accuracy_iterations_{depth}")
                curve.setdefault(depth, []).append([h["step"], value, board])
    return curve


def test_subset(n: int, dataset: str = "sudoku-hard"):
    """The first n puzzles of the test split of `dataset` (fixed: sudoku-hard's is a seed-0 split of the
    collection, sudoku's the seed-0 generator's)."""
    import numpy as np
    import torch

    from energyformers.training.data import load_data

    test = load_data(dataset)["test"]
    test = test.select(range(min(n, len(test)))).with_format(None)
    x = torch.tensor(np.asarray(test["input_ids"]), dtype=torch.long)
    y = torch.tensor(np.asarray(test["labels"]), dtype=torch.long)
    return x, y


def evaluate(model, x, y, num_iterations: int, batch_size: int, device) -> dict:
    """Blank-cell and board accuracy of one forward pass with `num_iterations` iterations."""
    import torch

    hits = blanks = solved = 0
    with torch.inference_mode():
        for xb, yb in zip(x.split(batch_size), y.split(batch_size)):
            xb, yb = xb.to(device), yb.to(device)
            pred = model(input_ids=xb, num_iterations=num_iterations).logits.argmax(-1)
            blank = yb != -100
            right = (pred == yb) & blank
            hits += int(right.sum())
            blanks += int(blank.sum())
            solved += int((right.sum(1) == blank.sum(1)).sum())
    return {"blank_cell_accuracy": hits / blanks, "board_accuracy": solved / len(x)}


EVAL_CACHE = (
    "sudoku_depth_eval.json"  # a folder's depth evaluation, reused by --reuse for the same test subset
)


def evaluate_folder(path: Path, x, y, batch_size: int, device, reuse: bool = False) -> dict:
    import hashlib

    import torch
    from transformers import AutoModelForTokenClassification

    import energyformers  # noqa: F401  (registers the Auto classes)

    model = AutoModelForTokenClassification.from_pretrained(path).to(device).eval()
    trained = model.config.num_iterations
    depths = sorted({max(1, round(f * trained)) for f in FACTORS})
    # the cache key: the weights file and the exact test subset (a retrained folder or other puzzles miss it)
    weights = path / "model.safetensors"
    key = hashlib.sha256(
        (weights.read_bytes() if weights.is_file() else b"") + x.numpy().tobytes() + y.numpy().tobytes()
    ).hexdigest()
    cache_file = path / EVAL_CACHE
    cached = json.loads(cache_file.read_text()) if reuse and cache_file.is_file() else {}
    rows = {}
    for depth in depths:
        if cached.get("key") == key and str(depth) in cached.get("depths", {}):
            rows[depth] = cached["depths"][str(depth)]
            print(f"[sudoku_depth] {path.name} T'={depth}: reused from {EVAL_CACHE}", flush=True)
            continue
        start = time.time()
        rows[depth] = evaluate(model, x, y, depth, batch_size, device)
        print(
            f"[sudoku_depth] {model.config.model_type} T'={depth:>3} ({depth / trained:.2f}T): blank-cell "
            f"{rows[depth]['blank_cell_accuracy']:.4f}  board {rows[depth]['board_accuracy']:.4f}  "
            f"({time.time() - start:.0f} s)",
            flush=True,
        )
    cache_file.write_text(
        json.dumps({"key": key, "depths": {str(d): r for d, r in rows.items()}}, indent=2) + "\n"
    )
    metrics_file = path / "metrics.json"
    metrics = json.loads(metrics_file.read_text()) if metrics_file.is_file() else {}
    history = metrics.get("log_history") or []
    del torch
    return {
        "supervision": model.config.deep_supervision,
        "plateau_exit_step": plateau_exit(history),
        "training_loss": [[h["step"], h["loss"]] for h in history if "loss" in h],
        "eval_curve": eval_curve(history, trained),
        "model_type": model.config.model_type,
        "folder": str(path),
        "trained_iterations": trained,
        "num_parameters": sum(p.numel() for p in model.parameters()),
        "config": {
            k: getattr(model.config, k, None)
            for k in (
                "hidden_size",
                "num_attention_heads",
                "intermediate_size",
                "num_iterations",
                "iteration_conditioning",
                "step_size_condition",
                "qkv_norm",
                "iteration_sampling",
                "initializer_range",
                "deep_supervision",
                "deep_supervision_weights",
            )
        },
        "recipe": metrics.get("recipe"),
        "train_metrics": metrics.get("train"),
        "cli_test_metrics": metrics.get("test"),
        "depths": {str(d): r for d, r in rows.items()},
    }


STYLES = {  # (colour, line style): colour = model, solid = deep supervision, dashed = last only
    "hyperset": "tab:blue",
    "looped-transformer": "tab:orange",
}


def label(res: dict) -> str:
    return f"{MODELS[res['model_type']]}, {res['supervision']}"


def style(res: dict) -> dict:
    return {
        "color": STYLES.get(res["model_type"], "tab:gray"),
        "linestyle": "--" if res["supervision"] == "last" else "-",
        "marker": "s" if res["supervision"] == "last" else "o",
        "markersize": 4,
    }


def plot(results: dict, path: Path, title: str) -> None:
    """Four panels: test blank-cell and board accuracy vs test-time iterations (after training); the training
    loss vs step with each run's plateau exit; validation blank-cell accuracy at T vs step (during training)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(2, 2, figsize=(11, 7.6))
    trained = {res["trained_iterations"] for res in results.values()}
    ticks = sorted({int(d) for res in results.values() for d in res["depths"]})
    for res in results.values():
        depths = [int(d) for d in res["depths"]]
        for ax, metric in zip(axes[0], ("blank_cell_accuracy", "board_accuracy")):
            ax.plot(depths, [res["depths"][str(d)][metric] for d in depths], label=label(res), **style(res))
    axes[0][0].axhline(1 / 9, color="black", linestyle="-.", linewidth=0.8, label="chance 1/9")
    for ax, name in zip(axes[0], ("test blank-cell accuracy", "test board accuracy")):
        for T in trained:
            ax.axvline(T, color="gray", linestyle=":", linewidth=1.2, label=f"trained T = {T}")
        ax.set_xlabel("test-time iterations")
        ax.set_ylabel(name)
        ax.set_xscale("log", base=2)
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        low, high = ax.get_ylim()
        if high - low < 0.02:  # a flat curve (e.g. no board solved): show [0, 0.05], not a band around it
            low, high = min(low, -0.002), max(high, 0.05)
        ax.set_ylim(max(low, -0.005), high + 0.3 * (high - low))  # headroom for the legend
    loss_ax, curve_ax = axes[1]
    for res in results.values():
        if res.get("training_loss"):
            steps, losses = zip(*res["training_loss"])
            kw = style(res) | {"marker": None}
            loss_ax.plot(steps, losses, label=label(res), linewidth=1.0, **kw)
            if res.get("plateau_exit_step") is not None:
                loss_ax.axvline(
                    res["plateau_exit_step"], color=kw["color"], linestyle=kw["linestyle"], alpha=0.6
                )
        trained_curve = (res.get("eval_curve") or {}).get("trained")
        if trained_curve:
            curve_ax.plot(
                [c[0] for c in trained_curve], [c[1] for c in trained_curve], label=label(res), **style(res)
            )
    loss_ax.axhline(LN9, color="black", linestyle="-.", linewidth=0.8, label="ln 9 (chance)")
    loss_ax.axhline(
        LN9 - PLATEAU_MARGIN, color="gray", linestyle=":", linewidth=0.8, label="plateau exit level"
    )
    loss_ax.set_xlabel("training step (vertical lines: plateau exit)")
    loss_ax.set_ylabel("training loss (deep supervision: mean over iterations)")
    loss_ax.set_ylim(top=LN9 + 0.25)
    curve_ax.axhline(1 / 9, color="black", linestyle="-.", linewidth=0.8, label="chance 1/9")
    curve_ax.set_xlabel("training step")
    curve_ax.set_ylabel("validation blank-cell accuracy at trained T")
    for ax in axes.flat:
        ax.grid(alpha=0.3)
        ax.legend(loc="best", fontsize=7, ncol=2)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def depth_factor(d: int, T: int) -> str:
    f = d / T
    return f"{f:g}T" if f == int(f) else f"{f:.2f}T"


def targets(results: dict) -> list[dict]:
    """The spec's three targets for the reduced CPU run, each with its numbers and met / missed (None: the runs
    needed for it are not in `results`)."""
    hs_last, hs_ds = results.get("hyperset-last"), results.get("hyperset-all")
    lt_ds = results.get("looped-transformer-all")
    out = []
    if hs_last and hs_ds:
        a, b = hs_last["plateau_exit_step"], hs_ds["plateau_exit_step"]
        steps = hs_ds["budget_steps"]
        if b is None:
            met, text = False, f"deep-supervised Hyper-SET never left the plateau in {steps} steps"
        elif a is None:
            # last-only never left it: the true ratio is at least budget / b
            met = steps / b >= 3
            text = f"last-only never left it in {steps} steps, deep-supervised at step {b}: ratio > {steps / b:.1f}"
        else:
            met, text = a / b >= 3, f"last-only at step {a}, deep-supervised at step {b}: ratio {a / b:.2f}"
        out.append(
            {
                "target": "deep-supervised Hyper-SET leaves the plateau >= 3x sooner than last-only",
                "met": met,
                "numbers": text,
            }
        )
    # with deep-supervised Hyper-SET still on the plateau, "within 2 points" and "no fall" hold for a model that has
    # learned nothing: they are marked vacuous
    vacuous = bool(hs_ds) and hs_ds["plateau_exit_step"] is None
    if hs_ds and lt_ds:
        T = str(hs_ds["trained_iterations"])
        a = hs_ds["depths"][T]["blank_cell_accuracy"]
        b = lt_ds["depths"][T]["blank_cell_accuracy"]
        out.append(
            {
                "target": "deep-supervised Hyper-SET within 2 points of the deep-supervised looped Transformer "
                "(blank-cell accuracy at T)",
                "met": a >= b - 0.02,
                "vacuous": vacuous,
                "numbers": f"Hyper-SET {a:.4f}, looped {b:.4f}: {100 * (a - b):+.1f} points",
            }
        )
    if hs_ds:
        T = hs_ds["trained_iterations"]
        a = hs_ds["depths"][str(T)]["blank_cell_accuracy"]
        b = hs_ds["depths"][str(4 * T)]["blank_cell_accuracy"]
        worst = min(r["blank_cell_accuracy"] for d, r in hs_ds["depths"].items() if int(d) >= T)
        out.append(
            {
                "target": "deep-supervised Hyper-SET: blank-cell accuracy does not fall from T to 4T",
                "met": worst >= a - 0.005,  # half a point: the sampling noise of ~20k test blanks
                "vacuous": vacuous,
                "numbers": f"T {a:.4f}, 4T {b:.4f}, lowest in [T, 4T] {worst:.4f}",
            }
        )
    return out


def write_markdown(out: dict, path: Path) -> None:
    results = out["results"]
    first = next(iter(results.values()))
    T = first["trained_iterations"]
    depths = sorted({int(d) for res in results.values() for d in res["depths"]})
    shown = [d for d in depths if d in {T // 2, T, 2 * T, 3 * T, 4 * T}]
    reduced = out["mode"] == "reduced"
    lines = [
        "# Sudoku (hard puzzles): accuracy vs test-time iterations, Hyper-SET vs looped Transformer, last-only vs "
        "deep supervision",
        "",
        "## GPU recipe at paper size (not run here)",
        "",
        "d = 768, H = 12, M = 4d, T = 24 (`--preset sudoku`), AdamW β = (0, 0.95), weight decay 0.1, lr 1e-4 cosine "
        "(CLI default warm-up 5 %), gradient clip 1.0, batch 16, 200 epochs on 10,000 sudoku-hard training puzzles "
        "(125,000 steps), `torch.compile`, bf16 — one command per model, then the depth evaluation of the two folders:",
        "",
        "```bash",
        "energyformers train --model hyperset "
        + shlex.join(PAPER_FLAGS)
        + " --output_dir runs/sudoku-hyperset",
        "energyformers train --model looped-transformer "
        + shlex.join(PAPER_FLAGS)
        + " --output_dir runs/sudoku-looped",
        "python benchmarks/sudoku_depth.py --hyperset_dir runs/sudoku-hyperset --looped_dir runs/sudoku-looped --n_test 10000",
        "```",
        "",
        "(`python benchmarks/sudoku_depth.py --paper --supervision last` runs all three; add `all` to the list for the "
        "deep-supervised pair.) Both training commands were checked to start and run on CPU with `--max_steps 2 "
        "--max_eval_samples 16 --max_test_samples 16` appended (bf16 and `torch.compile` included and working on CPU; "
        "Hyper-SET 4,211,776 and looped Transformer 7,156,992 parameters at this size). 125,000 steps in ~80 min means "
        "~26 steps/s: an estimate from the spec, not measured here (no GPU).",
        "",
        "## Measured here"
        + (": a REDUCED model on a CPU budget, last-only vs deep supervision" if reduced else ""),
        "",
    ]
    if reduced:
        b = out["budget"]
        lines += [
            f"**A reduced model on a CPU budget, not the paper's setting**: d = {b['hidden_size']}, H = {b['heads']}, "
            f"M = 4d, T = {T}, initializer_range {b['initializer_range']:g}, {b['n_train']:,} training puzzles, "
            f"{b['steps']} steps at batch {b['batch_size']} (≈ {b['steps'] * b['batch_size'] / b['n_train']:.1f} "
            f"epochs), lr {b['lr']:g} cosine; otherwise the paper's optimiser (AdamW β = (0, 0.95), weight decay 0.1, "
            "clip 1.0) and the `sudoku` preset's options. The four runs share data, seed, initial weights (per model) "
            "and every flag but `--deep_supervision` (`last`: the loss on the last iteration, the paper's; `all`: "
            f"the mean of the losses of all {T} iterations, uniform weights).",
            "",
        ]
    lines += [
        *(provenance.markdown_lines(out["run"]) if "run" in out else [f"Command: `{out['command']}`"]),
        "",
        f"* Machine: {out['machine']}; total wall time {out['wall_time_s'] / 60:.1f} min.",
    ]
    if out.get("training"):
        lines.append(
            "* Wall time of each training run (data loading, the evaluations during training and the CLI's final "
            "evaluation included): "
            + ", ".join(
                f"{label(results[k])} {v['seconds'] / 60:.1f} min"
                for k, v in out["training"].items()
                if v.get("seconds")
            )
            + "."
        )
        cmd = next(iter(out["training"].values()))["command"]
        lines.append(
            f"* Training command of the first run: `{cmd}`; the others differ in `--model` and `--deep_supervision` only."
        )
    lines += [
        f"* Test subset: the first {out['n_test']:,} puzzles of the sudoku-hard test split (21–29 givens); one forward "
        "pass, argmax per blank cell; blank-cell chance ≈ 0.11.",
        f"* **Plateau exit** (training loss): the first logged step (every {out.get('logging_steps', '?')} steps) "
        f"where the mean of the last {PLATEAU_WINDOW} logged training losses is below ln 9 − {PLATEAU_MARGIN} = "
        f"{LN9 - PLATEAU_MARGIN:.3f}. With deep supervision the training loss is the mean over all iterations, "
        "early ones included, so this is a late (conservative) exit for the deep-supervised runs. **Accuracy "
        "exit** (second definition, from the validation curve logged every "
        f"{out.get('eval_steps', '?')} steps): the first evaluation where blank-cell accuracy at T reaches "
        f"{ACCURACY_EXIT:.2f} (chance 0.11).",
        "",
        "| run | parameters | plateau exit (loss) | accuracy exit | final train loss (mean of the run) | "
        + " | ".join(f"blank-cell {depth_factor(d, T)}" for d in shown)
        + " | "
        + " | ".join(f"board {depth_factor(d, T)}" for d in shown)
        + " |",
        "|---|---|---|---|---|" + "---|" * (2 * len(shown)),
    ]
    for res in results.values():
        exit_loss = res.get("plateau_exit_step")
        exit_acc = accuracy_exit(res["eval_curve"], ACCURACY_EXIT) if res.get("eval_curve") else None
        train_loss = (res.get("train_metrics") or {}).get("train_loss")
        never = lambda step: "never" if step is None else str(step)  # noqa: E731
        loss_text = "—" if train_loss is None else f"{train_loss:.3f}"
        lines.append(
            f"| {label(res)} | {res['num_parameters']:,} | {never(exit_loss)} | {never(exit_acc)} | {loss_text} | "
        )
        lines[-1] += " | ".join(f"{res['depths'][str(d)]['blank_cell_accuracy']:.4f}" for d in shown) + " | "
        lines[-1] += " | ".join(f"{res['depths'][str(d)]['board_accuracy']:.4f}" for d in shown) + " |"
    lines += ["", "All depths evaluated (blank-cell / board):", ""]
    lines += ["| iterations | " + " | ".join(label(r) for r in results.values()) + " |"]
    lines += ["|---|" + "---|" * len(results)]
    for d in depths:
        mark = " (trained)" if d == T else ""
        lines.append(
            f"| {d} ({depth_factor(d, T)}){mark} | "
            + " | ".join(
                f"{r['depths'][str(d)]['blank_cell_accuracy']:.4f} / {r['depths'][str(d)]['board_accuracy']:.4f}"
                for r in results.values()
            )
            + " |"
        )
    curves = {k: r["eval_curve"] for k, r in results.items() if r.get("eval_curve")}
    if curves:
        lines += [
            "",
            "Validation blank-cell accuracy logged during training (256 validation puzzles; T/2, T, 2T, 4T per run, "
            "`eval_blank_cell_accuracy_iterations_<t>` in each run's metrics.json):",
            "",
        ]
        depth_keys = [k for k in sorted({k for c in curves.values() for k in c if k != "trained"}, key=int)]
        header = ["step"] + [
            f"{label(results[k])} {depth_factor(int(t), T)}" for k in curves for t in depth_keys
        ]
        lines += ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
        steps = sorted({c[0] for cv in curves.values() for c in cv.get("trained", [])})
        for step in steps:
            row = [str(step)]
            for cv in curves.values():
                for t in depth_keys:
                    hit = next((c[1] for c in cv.get(t, []) if c[0] == step), None)
                    row.append("—" if hit is None else f"{hit:.3f}")
            lines.append("| " + " | ".join(row) + " |")
    checks = targets(results) if reduced else []
    if checks:
        lines += ["", "### The spec's targets", ""]
        for c in checks:
            verdict = "**met**" if c["met"] else "**missed**"
            if c.get("vacuous") and c["met"]:
                verdict = (
                    "**met only vacuously** (deep-supervised Hyper-SET never left the plateau: near chance)"
                )
            lines.append(f"* {verdict}: {c['target']} — {c['numbers']}.")
    lines += ["", f"![accuracy vs iterations and the plateau exit]({path.with_suffix('.png').name})", ""]
    if out.get("notes"):
        lines += [out["notes"], ""]
    path.write_text("\n".join(lines) + "\n")


def parse_supervision(text: str) -> list[str]:
    modes = [m.strip() for m in text.split(",") if m.strip()]
    bad = [m for m in modes if m not in SUPERVISION]
    if not modes or bad or len(set(modes)) != len(modes):
        raise SystemExit(
            f"--supervision {text!r}: expected a comma-separated list of distinct modes from {list(SUPERVISION)}"
        )
    return modes


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--hyperset_dir", default=None, help="evaluate this trained folder (no training)")
    parser.add_argument("--looped_dir", default=None, help="evaluate this trained folder (no training)")
    parser.add_argument("--paper", action="store_true", help="train at paper size (GPU), then evaluate")
    parser.add_argument(
        "--work_dir", default=None, help="where trained folders go (default: a temp dir; runs/ with --paper)"
    )
    parser.add_argument(
        "--supervision",
        default="last,all",
        help=f"--deep_supervision of the runs, comma-separated (each model once per mode; from {SUPERVISION})",
    )
    parser.add_argument(
        "--models",
        default=",".join(MODELS),
        help=f"the models trained, comma-separated (from {list(MODELS)}; e.g. one per process to split the work, "
        "then all with --reuse)",
    )
    parser.add_argument(
        "--supervision_weights",
        default="uniform",
        choices=("uniform", "linear"),
        help="--deep_supervision_weights of the deep-supervised runs",
    )
    parser.add_argument(
        "--reuse",
        action="store_true",
        help="keep a folder of --work_dir whose metrics.json records exactly the planned command (no retraining)",
    )
    g = parser.add_argument_group("reduced CPU budget (ignored with --paper or existing folders)")
    g.add_argument("--hidden_size", type=int, default=64)
    g.add_argument("--heads", type=int, default=8)
    g.add_argument("--iterations", type=int, default=8)
    g.add_argument("--n_train", type=int, default=8000)
    g.add_argument("--steps", type=int, default=300)
    g.add_argument("--batch_size", type=int, default=16)
    g.add_argument("--lr", type=float, default=3e-3)
    # 0.2, ten times the usual 0.02: at 0.02 the reduced model's last-iteration loss stays on the ln 9 (chance)
    # plateau for the whole CPU budget
    g.add_argument("--initializer_range", type=float, default=0.2)
    g.add_argument("--seed", type=int, default=42)
    g.add_argument("--logging_steps", type=int, default=10, help="training-loss logging interval")
    g.add_argument("--eval_steps", type=int, default=50, help="validation interval (accuracy at T/2 … 4T)")
    g.add_argument(
        "--threads", type=int, default=2, help="torch threads of each run when --max_parallel is 1"
    )
    g.add_argument(
        "--max_parallel",
        type=int,
        default=2,
        help="training runs at once (CPU: each with 1 thread; --paper always trains one after the other)",
    )
    parser.add_argument("--n_test", type=int, default=1000, help="first N puzzles of the test split")
    parser.add_argument("--eval_batch_size", type=int, default=250)
    parser.add_argument("--notes", default=None, help="a paragraph appended to the .md")
    parser.add_argument(
        "--results", default=str(RESULTS / "sudoku_depth"), help="path stem of .md/.json/.png"
    )
    parser.add_argument(
        "--render_only", action="store_true", help="rewrite .md/.png from the existing .json (notes: --notes)"
    )
    args = parser.parse_args(argv)
    supervision = parse_supervision(args.supervision)
    models = [m.strip() for m in args.models.split(",") if m.strip()]
    if not models or any(m not in MODELS for m in models):
        parser.error(f"--models {args.models!r}: expected a comma-separated list from {list(MODELS)}")
    for name in (
        "steps",
        "iterations",
        "hidden_size",
        "heads",
        "batch_size",
        "n_train",
        "n_test",
        "max_parallel",
        "threads",
    ):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1; got {getattr(args, name)}")
    if args.iterations < 2:
        parser.error(f"--iterations must be >= 2 (T/2 is evaluated); got {args.iterations}")
    start = time.time()
    run = provenance.run_info(seed=args.seed, argv=argv, script=__file__)
    if args.render_only:
        stem = Path(args.results)
        out = json.loads(stem.with_suffix(".json").read_text())
        out["notes"] = args.notes or out.get("notes")
        out["targets"] = targets(out["results"]) if out["mode"] == "reduced" else None
        stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
        render(out, stem)
        return

    import tempfile

    import torch

    given = {"hyperset": args.hyperset_dir, "looped-transformer": args.looped_dir}
    # `--threads` is this run's: a caller that runs main in-process (a notebook, a test) gets its own count back
    caller_threads = torch.get_num_threads()
    torch.set_num_threads(args.threads)
    try:
        if args.work_dir or args.paper or any(given.values()):
            benchmark(args, given, models, supervision, run, start, Path(args.work_dir or "runs"))
            return
        # No --work_dir: the trained folders are this run's scratch, removed once evaluated or when the run fails
        scratch = Path(tempfile.mkdtemp(prefix="sudoku-depth-"))
        try:
            benchmark(args, given, models, supervision, run, start, scratch)
        finally:
            shutil.rmtree(scratch, ignore_errors=True)
    finally:
        torch.set_num_threads(caller_threads)


def benchmark(
    args: argparse.Namespace,
    given: dict[str, str | None],
    models: list[str],
    supervision: list[str],
    run: dict,
    start: float,
    work: Path,
) -> None:
    """Train (into `work`, unless `given` names both folders), evaluate and write the results of checked `args`."""
    import torch

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    training = {}
    mode = "existing"
    if all(given.values()):
        folders = given
    elif any(given.values()):
        raise SystemExit("give both --hyperset_dir and --looped_dir, or neither (then both are trained)")
    else:
        mode = "paper" if args.paper else "reduced"
        parallel = 1 if args.paper else args.max_parallel  # one GPU: one run at a time
        threads = 1 if parallel > 1 else args.threads
        base = PAPER_FLAGS if args.paper else reduced_flags(args, threads)
        plan = {
            run_key(m, sup): ["--model", m, *base, *supervision_flags(sup, args.supervision_weights)]
            for m in models
            for sup in supervision
        }
        training = train_models(plan, work, parallel, overwrite=not args.paper, reuse=args.reuse)
        folders = {key: str(work / f"sudoku-{key}") for key in plan}

    x, y = test_subset(args.n_test)
    print(f"[sudoku_depth] evaluating on {len(x)} test puzzles ({device})", flush=True)
    results = {}
    for key, folder in folders.items():
        res = evaluate_folder(Path(folder), x, y, args.eval_batch_size, device, reuse=args.reuse)
        res["budget_steps"] = (res.get("recipe") or {}).get("global_step") or args.steps
        if not key.startswith(res["model_type"]):
            raise SystemExit(f"{folder} holds a {res['model_type']!r} model, expected {key!r}")
        results[key if mode != "existing" else run_key(res["model_type"], res["supervision"])] = res

    machine = (
        f"{torch.cuda.get_device_name(0)} ({provenance.machine()})"
        if device.type == "cuda"
        else f"{provenance.machine()}, CPU only"
        + (
            f", at most {args.max_parallel} trainings at once with 1 torch thread each"
            if training and args.max_parallel > 1
            else f", {args.threads} torch threads"
        )
    )
    out = {
        "mode": mode,
        "run": run,
        "command": run["command"],
        "machine": machine,
        "torch": torch.__version__,
        "budget": {
            k: getattr(args, k)
            for k in (
                "hidden_size",
                "heads",
                "iterations",
                "initializer_range",
                "n_train",
                "steps",
                "batch_size",
                "lr",
                "seed",
                "max_parallel",
                "supervision",
                "supervision_weights",
            )
        }
        if mode == "reduced"
        else None,
        "logging_steps": args.logging_steps,
        "eval_steps": args.eval_steps,
        "plateau_exit_definition": f"first logged step where the mean of the last {PLATEAU_WINDOW} logged "
        f"training losses < ln 9 - {PLATEAU_MARGIN}",
        "paper_recipe": {
            "hyperset": "energyformers train --model hyperset "
            + shlex.join(PAPER_FLAGS)
            + " --output_dir runs/sudoku-hyperset",
            "looped-transformer": "energyformers train --model looped-transformer "
            + shlex.join(PAPER_FLAGS)
            + " --output_dir runs/sudoku-looped",
        },
        "n_test": len(x),
        "training": training,
        "results": results,
        "targets": targets(results) if mode == "reduced" else None,
        "notes": args.notes,
        "wall_time_s": round(time.time() - start, 1),
    }
    stem = Path(args.results)
    stem.parent.mkdir(parents=True, exist_ok=True)
    stem.with_suffix(".json").write_text(json.dumps(out, indent=2) + "\n")
    render(out, stem)


def render(out: dict, stem: Path) -> None:
    """The .md and .png of a results dict (also `--render_only`: from the .json, without running anything)."""
    T = next(iter(out["results"].values()))["trained_iterations"]
    size = "reduced model, CPU budget" if out["mode"] == "reduced" else f"{out['mode']} models"
    plot(
        out["results"],
        stem.with_suffix(".png"),
        f"Sudoku (sudoku-hard, first {out['n_test']:,} test puzzles): accuracy vs iterations, trained T = {T} "
        f"({size})",
    )
    write_markdown(out, stem.with_suffix(".md"))
    print(stem.with_suffix(".md").read_text(), flush=True)


if __name__ == "__main__":
    main()
