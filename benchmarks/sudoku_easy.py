"""Easy Sudoku on a CPU budget: a deep-supervised Hyper-SET trained for a fixed wall time on our generated
puzzles (`--dataset sudoku`: 36–45 givens, every puzzle proven unique), then evaluated at T/2 … 4T iterations on
the easy test split and on hard puzzles (`sudoku-hard` test split, 21–29 givens): easy → hard with more
iterations is what recurrent depth is for.
`--model looped-transformer` trains the paper's baseline instead, with the same setting (width, heads,
iterations, data, optimiser, deep supervision, evaluation depths).

Short probes first (`--stage probes`: each setting of `PROBES` for the same number of steps, its validation
accuracy at T recorded), then the main run (`--stage main`: the chosen setting, `--max_steps` with a wall-time cap
of `--minutes`, into `--output_dir`, which is kept for test-time search), then the evaluation and the result files
`<--results>.{md,json,png}` (default benchmarks/results/sudoku_easy; the .md embeds the .png by the name it is
written under). Every training goes through the real training CLI
(`energyformers.training.train.main`, i.e. the `energyformers train ...` command recorded in the results) with
one torch thread; a wall-time cap is a `TrainerCallback` that stops training after the step that crosses it (the
CLI's final evaluation, test and save then run as usual).

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sudoku_easy.py            # probes, main run, results
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sudoku_easy.py --stage probes --probes ds-init0.2
    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sudoku_easy.py --stage main   # uses the probes on disk
"""

from __future__ import annotations

import argparse
import json
import shlex
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (README: CPU threads)
import sudoku_depth  # noqa: E402  (after the environment default) the shared evaluation and `plateau_exit`

RESULTS = Path(__file__).parent / "results"
REPO = Path(__file__).resolve().parents[1]
FACTORS = (1 / 2, 1, 3 / 2, 2, 3, 4)  # test-time depth as a multiple of the trained T


def model_flags(hidden_size: int, heads: int, iterations: int, initializer_range: float) -> list[str]:
    return [
        "--config", f"hidden_size={hidden_size}", f"num_attention_heads={heads}",
        f"intermediate_size={4 * hidden_size}", f"num_iterations={iterations}",
        f"initializer_range={initializer_range}",
    ]  # fmt: skip


# The probes: one change at a time from the first (the reduced sudoku-hard setting of sudoku_depth.py with deep
# supervision over all iterations and the symmetry augmentation, the paper's β1 = 0). A setting's optional keys
# are read by `train_flags`.
# the setting the probes chose (sudoku_easy.md's main run), and what the random-depth runs add to it
WINNER: dict = {
    "model": (64, 2, 8, 0.2),
    "lr": 1e-2,
    "supervision": "all",
    "beta1": 0.9,
    "batch_size": 16,
    "config": {"position_embedding_type": "sincos-2d"},
}
ANCHORED = {"position_embedding_type": "sincos-2d", "input_anchor": 0.5}
RANDOM_DEPTH = ["--iteration_sampling", "uniform", "--min_iterations", "4", "--max_iterations", "12"]
PROBES: dict[str, dict] = {
    "ds-init0.2": {"model": (64, 8, 8, 0.2), "lr": 3e-3, "supervision": "all"},
    "ds-init0.02": {"model": (64, 8, 8, 0.02), "lr": 3e-3, "supervision": "all"},
    "last-init0.2": {"model": (64, 8, 8, 0.2), "lr": 3e-3, "supervision": "last"},
    "ds-T16": {"model": (64, 8, 16, 0.2), "lr": 3e-3, "supervision": "all"},
    "ds-d128": {"model": (128, 8, 8, 0.2), "lr": 2e-3, "supervision": "all"},
    # the second round (first steps of the main run's schedule): standard Adam β1, then one more change each
    "b1-0.9": {"model": (64, 8, 8, 0.2), "lr": 3e-3, "supervision": "all", "beta1": 0.9},
    "b1-lr1e-2": {"model": (64, 8, 8, 0.2), "lr": 1e-2, "supervision": "all", "beta1": 0.9},
    "b1-H2": {"model": (64, 2, 8, 0.2), "lr": 3e-3, "supervision": "all", "beta1": 0.9},
    "b1-sincos": {
        "model": (64, 8, 8, 0.2),
        "lr": 3e-3,
        "supervision": "all",
        "beta1": 0.9,
        "config": {"position_embedding_type": "sincos-2d"},
    },
    "b1-H2-lr1e-2": {"model": (64, 2, 8, 0.2), "lr": 1e-2, "supervision": "all", "beta1": 0.9},
    "b1-H1-lr1e-2": {"model": (64, 1, 8, 0.2), "lr": 1e-2, "supervision": "all", "beta1": 0.9},
    "b1-H2-lr2e-2": {"model": (64, 2, 8, 0.2), "lr": 2e-2, "supervision": "all", "beta1": 0.9},
    "b1-H2-lr1e-2-sincos": {
        "model": (64, 2, 8, 0.2),
        "lr": 1e-2,
        "supervision": "all",
        "beta1": 0.9,
        "config": {"position_embedding_type": "sincos-2d"},
    },
    "b1-d128-H4-lr1e-2": {"model": (128, 4, 8, 0.2), "lr": 1e-2, "supervision": "all", "beta1": 0.9},
    "b1-H2-lr1e-2-b16": {
        "model": (64, 2, 8, 0.2),
        "lr": 1e-2,
        "supervision": "all",
        "beta1": 0.9,
        "batch_size": 16,
    },
    # the best two changes together, for the steps a d = 128 probe takes in the same wall time
    "b1-H2-lr1e-2-sincos-b16": WINNER,
    # the winner trained at random depth (mean T, so the same mean cost per step) with the input anchor, the
    # combination that kept digit accuracy flat far past T in recurrent_depth.py: does it think longer here?
    "b1-H2-lr1e-2-sincos-b16-anchor0.5-U4-12": {**WINNER, "config": ANCHORED, "flags": RANDOM_DEPTH},
    # the two changes of the setting above one at a time
    "b1-H2-lr1e-2-sincos-b16-anchor0.5": {**WINNER, "config": ANCHORED},
    "b1-H2-lr1e-2-sincos-b16-U4-12": {**WINNER, "flags": RANDOM_DEPTH},
}


def train_flags(
    setting: dict, steps: int, batch_size: int, seed: int, eval_steps: int, model: str = "hyperset"
) -> list[str]:
    """The CLI flags of one run: `model` (Hyper-SET, or the looped Transformer at the same width, heads and
    depth: the paper's side-by-side baseline), the `sudoku` preset, the paper's optimiser (AdamW β = (0, 0.95),
    weight decay 0.1, clip 1.0), cosine lr, deep supervision as `setting` says, the symmetry augmentation.
    `setting`'s optional keys change one part: `beta1` (AdamW β1), `batch_size` (replaces `batch_size`), `config`
    (more config fields, KEY: VALUE) and `flags` (more CLI flags, after the others)."""
    d, heads, T, init = setting["model"]
    extra = [f"{key}={json.dumps(value)}" for key, value in setting.get("config", {}).items()]
    return [
        "--model", model, "--dataset", "sudoku", "--preset", "sudoku",
        *model_flags(d, heads, T, init), *extra,
        "--deep_supervision", setting["supervision"], "--sudoku_augmentation",
        "--max_eval_samples", "256", "--max_test_samples", "1000",
        "--max_steps", str(steps), "--batch_size", str(setting.get("batch_size", batch_size)),
        "--lr", str(setting["lr"]),
        "--lr_scheduler_type", "cosine", "--weight_decay", "0.1", "--max_grad_norm", "1.0",
        "--adam_beta1", str(setting.get("beta1", 0)), "--adam_beta2", "0.95", "--seed", str(seed),
        "--save_strategy", "no", "--num_threads", "1", "--disable_tqdm", "--num_predictions", "0",
        "--logging_steps", "10", "--eval_strategy", "steps", "--eval_steps", str(eval_steps),
        "--eval_iterations", *map(str, sudoku_depth.eval_depths(T)), *setting.get("flags", []),
    ]  # fmt: skip


def describe(setting: dict) -> str:
    """One probe's setting in words, for the table of the .md."""
    d, heads, T, init = setting.get("model", ("?",) * 4)
    words = f"d={d}, H={heads}, T={T}, init {init}, lr {setting.get('lr')}, supervision {setting.get('supervision')}"
    words += f", β1 {setting.get('beta1', 0)}"
    if "batch_size" in setting:
        words += f", batch {setting['batch_size']}"
    words += "".join(f", {key}={value}" for key, value in setting.get("config", {}).items())
    return words + "".join(f" {flag}" for flag in setting.get("flags", []))


def train(argv: list[str], minutes: float | None, stop_at_step: int | None = None) -> dict:
    """Run the training CLI in this process; stop after the step that passes `minutes` of training, or after step
    `stop_at_step` (a probe that runs the first steps of a longer schedule)."""
    from transformers import TrainerCallback

    from energyformers.training import train as train_cli

    class WallTimeCap(TrainerCallback):
        def __init__(self, seconds: float) -> None:
            self.seconds, self.started, self.hit_at = seconds, None, None

        def on_train_begin(self, args, state, control, **kwargs):
            self.started = time.monotonic()

        def on_step_end(self, args, state, control, **kwargs):
            if (
                self.seconds is not None
                and time.monotonic() - self.started >= self.seconds
                and self.hit_at is None
            ):
                self.hit_at = state.global_step
                control.should_training_stop = True
            if stop_at_step is not None and state.global_step >= stop_at_step:
                control.should_training_stop = True

    cap = WallTimeCap(minutes * 60 if minutes else None) if minutes or stop_at_step else None
    print(f"[sudoku_easy] energyformers train {shlex.join(argv)}", flush=True)
    start = time.monotonic()
    code = train_cli.main(argv, callbacks=[cap] if cap else None)
    if code != 0:
        raise SystemExit(f"training failed with status {code}: energyformers train {shlex.join(argv)}")
    return {
        "command": "energyformers train " + shlex.join(argv),
        "seconds": round(time.monotonic() - start, 1),
        "training_seconds": round(time.monotonic() - cap.started, 1) if cap and cap.started else None,
        "stopped_by_wall_time_at_step": cap.hit_at if cap else None,
        "minutes_cap": minutes,
        "stop_at_step": stop_at_step,
    }


def summary(folder: Path) -> dict:
    """What a run folder's metrics.json says: the final validation/test accuracy, steps, the curve."""
    metrics = json.loads((folder / "metrics.json").read_text())
    history = metrics.get("log_history") or []
    config = json.loads((folder / "config.json").read_text())
    T = config["num_iterations"]
    return {
        "folder": str(folder),
        "model_type": config["model_type"],
        "command": metrics["recipe"]["command"],
        "global_step": metrics["recipe"]["global_step"],
        "schedule_steps": metrics["recipe"].get("max_steps"),
        "wall_time_s": metrics.get("wall_time_s"),
        "trained_iterations": T,
        "num_parameters": metrics.get("num_parameters"),
        "eval": metrics.get("eval"),
        "test": metrics.get("test"),
        "train_loss": (metrics.get("train") or {}).get("train_loss"),
        "plateau_exit_step": sudoku_depth.plateau_exit(history),
        "training_loss": [[h["step"], h["loss"]] for h in history if "loss" in h],
        "eval_curve": sudoku_depth.eval_curve(history, T),
    }


def evaluate_depths(folder: Path, n_test: int, batch_size: int) -> dict:
    """Blank-cell and board accuracy at T/2 … 4T on the first `n_test` puzzles of the easy and the hard test
    split."""
    import torch
    from transformers import AutoModelForTokenClassification

    import energyformers  # noqa: F401  (registers the Auto classes)

    model = AutoModelForTokenClassification.from_pretrained(folder).eval()
    T = model.config.num_iterations
    depths = sorted({max(1, round(f * T)) for f in FACTORS})
    out = {}
    for dataset in ("sudoku", "sudoku-hard"):
        x, y = sudoku_depth.test_subset(n_test, dataset)
        rows = {}
        for depth in depths:
            start = time.monotonic()
            rows[str(depth)] = sudoku_depth.evaluate(model, x, y, depth, batch_size, torch.device("cpu"))
            print(
                f"[sudoku_easy] {dataset} T'={depth} ({depth / T:g}T): blank-cell "
                f"{rows[str(depth)]['blank_cell_accuracy']:.4f} board {rows[str(depth)]['board_accuracy']:.4f} "
                f"({time.monotonic() - start:.0f} s)",
                flush=True,
            )
        out[dataset] = {"n_test": len(x), "depths": rows}
    return out


def model_name(run: dict) -> str:
    """The trained model's name in words; results written before runs recorded their model are Hyper-SET's."""
    return sudoku_depth.MODELS[run.get("model_type", "hyperset")]


def plot(out: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    main = out["main"]
    T = main["trained_iterations"]
    fig, axes = plt.subplots(1, 3, figsize=(14, 4))
    styles = {
        "sudoku": ("tab:green", "o-", "easy (36–45 givens)"),
        "sudoku-hard": ("tab:red", "s--", "hard (21–29 givens)"),
    }
    for dataset, res in out["depths"].items():
        color, style, name = styles[dataset]
        depths = sorted(int(d) for d in res["depths"])
        for ax, metric in zip(axes[:2], ("blank_cell_accuracy", "board_accuracy")):
            ax.plot(
                depths,
                [res["depths"][str(d)][metric] for d in depths],
                style,
                color=color,
                label=f"{name} test",
            )
    for ax, name in zip(axes[:2], ("blank-cell accuracy", "board accuracy")):
        ax.axvline(T, color="gray", linestyle=":", label=f"trained T = {T}")
        ax.set_xlabel("test-time iterations")
        ax.set_ylabel(name)
        ax.set_xscale("log", base=2)
        ticks = sorted({int(d) for res in out["depths"].values() for d in res["depths"]})
        ax.set_xticks(ticks)
        ax.set_xticklabels([str(t) for t in ticks])
        ax.set_ylim(-0.02, 1.02)
    curve = main["eval_curve"]
    for depth in sorted((k for k in curve if k != "trained"), key=int):
        pts = curve[depth]
        axes[2].plot(
            [p[0] for p in pts], [p[1] for p in pts], marker=".", label=f"blank-cell, {int(depth) / T:g}T"
        )
    trained = curve.get("trained", [])
    axes[2].plot([p[0] for p in trained], [p[2] for p in trained], "k--", marker="x", label=f"board, T = {T}")
    axes[2].set_xlabel("training step")
    axes[2].set_ylabel("validation accuracy (256 easy puzzles)")
    for ax in axes:
        ax.grid(alpha=0.3)
        ax.legend(fontsize=8, loc="best")
    fig.suptitle(
        f"Easy Sudoku, deep-supervised {model_name(main)} ({main['num_parameters']:,} parameters, {main['global_step']} steps, "
        f"{(main['training'].get('training_seconds') or 0) / 60:.0f} min on 1 CPU thread)",
        fontsize=10,
    )
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def probe_lines(out: dict) -> list[str]:
    """The .md's probe section: how the probes ran, one row each (setting, steps, wall time, the curve)."""
    partial = any((p.get("schedule_steps") or 0) > p["global_step"] for p in out["probes"].values())
    lines = [
        "## Probes (choosing the settings)",
        "",
        "Each probe: the same flags as the main run but its own setting, "
        + (
            "the first steps of a longer cosine schedule, as the start of a main run (steps: n of the schedule's N)"
            if partial
            else f"{out['probe_steps']} steps"
        )
        + f" at batch {out['batch_size']} unless the setting says otherwise; validation (256 easy puzzles) "
        "along the way and at the end. Wall time: the whole command (data, training, validation, the test "
        "split), on shared cores.",
        "",
        "| probe | setting | steps | wall time | mean training loss | val blank-cell at T by step | "
        "val blank-cell at T | val board at T | plateau exit |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    order = list(PROBES)  # the order they were tried in; others after them
    ranked = sorted(
        out["probes"].items(), key=lambda item: order.index(item[0]) if item[0] in order else len(order)
    )
    for name, p in ranked:
        setting = describe(p.get("setting") or PROBES.get(name, {}))
        trained = (p.get("eval_curve") or {}).get("trained", [])
        along = ", ".join(f"{step}: {acc:.3f}" for step, acc, _ in trained[:-1]) or "–"
        lines.append(
            f"| {name} | {setting} | {p['global_step']}"
            + (f" of {p['schedule_steps']}" if (p.get("schedule_steps") or 0) > p["global_step"] else "")
            + f" | {(p['wall_time_s'] or 0) / 60:.1f} min | "
            f"{p['train_loss']:.3f} | {along} | {p['eval']['blank_cell_accuracy']:.4f} | "
            f"{p['eval']['board_accuracy']:.4f} | "
            f"{p['plateau_exit_step'] if p['plateau_exit_step'] is not None else 'never'} |"
        )
    lines.append("")
    return lines


def write_markdown(out: dict, path: Path) -> None:
    main = out["main"]
    T = main["trained_iterations"]
    tr = main["training"]
    lines = [
        f"# Easy Sudoku on a CPU budget: deep-supervised {model_name(main)}, easy → hard",
        "",
        *(provenance.markdown_lines(out["run"]) if "run" in out else [f"Command: `{out['command']}`"]),
        "",
        f"* Machine: {out['machine']}.",
        f"* Main run: `{main['command']}`",
        f"* Trained {main['global_step']} steps in {(tr.get('training_seconds') or 0) / 60:.1f} min of training "
        f"({tr['seconds'] / 60:.1f} min with data loading and the CLI's final evaluation); wall-time cap "
        f"{tr['minutes_cap']} min"
        + (
            f", which stopped it at step {tr['stopped_by_wall_time_at_step']} of the planned schedule"
            if tr.get("stopped_by_wall_time_at_step")
            else " (not reached: the planned steps finished first)"
        )
        + f". {main['num_parameters']:,} parameters. Saved model: `{main['folder']}` (git-ignored).",
        f"* Final validation (256 easy puzzles, at T = {T}): blank-cell {main['eval']['blank_cell_accuracy']:.4f}, "
        f"board {main['eval']['board_accuracy']:.4f}; mean training loss {main['train_loss']:.3f}; plateau exit "
        f"(`sudoku_depth.plateau_exit`, not `energyformers inspect`'s; see sudoku_depth.md): "
        + ("never" if main["plateau_exit_step"] is None else f"step {main['plateau_exit_step']}")
        + ".",
        "",
        "## Accuracy vs test-time iterations (one forward pass, argmax per blank cell)",
        "",
        "| iterations | easy blank-cell | easy board | hard blank-cell | hard board |",
        "|---|---|---|---|---|",
    ]
    easy, hard = out["depths"]["sudoku"], out["depths"]["sudoku-hard"]
    for d in sorted(int(k) for k in easy["depths"]):
        e, h = easy["depths"][str(d)], hard["depths"][str(d)]
        mark = " (trained)" if d == T else ""
        lines.append(
            f"| {d} ({d / T:g}T){mark} | {e['blank_cell_accuracy']:.4f} | {e['board_accuracy']:.4f} | "
            f"{h['blank_cell_accuracy']:.4f} | {h['board_accuracy']:.4f} |"
        )
    lines += [
        "",
        f"Easy: the first {easy['n_test']:,} puzzles of our generated test split; hard: the first {hard['n_test']:,} "
        "of the sudoku-hard test split.",
        "",
        f"![accuracy vs iterations]({path.with_suffix('.png').name})",
        "",
    ]
    best_board = max(r["board_accuracy"] for r in easy["depths"].values())
    at_T = easy["depths"][str(T)]["board_accuracy"]
    lines += [
        "## Targets",
        "",
        f"* Floor, board accuracy > 0 on the easy test split: {'**met**' if at_T > 0 else '**missed**'} "
        f"({at_T:.4f} at T; best over depths {best_board:.4f}).",
        f"* Target, board accuracy ≥ 50 %: {'**met**' if at_T >= 0.5 else '**missed**'} ({100 * at_T:.1f} % at T).",
        "",
    ]
    if out.get("probes"):
        lines += probe_lines(out)
    if out.get("notes"):
        lines += [out["notes"], ""]
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--stage", choices=("all", "probes", "main", "render"), default="all")
    parser.add_argument(
        "--probes", default=",".join(PROBES), help=f"comma-separated names from {list(PROBES)}"
    )
    parser.add_argument("--probe_steps", type=int, default=150, help="optimizer steps of each probe")
    parser.add_argument(
        "--probe_schedule_steps",
        type=int,
        default=None,
        help="the lr schedule's length in each probe, which stops after --probe_steps (e.g. the main run's "
        "--max_steps: a probe is then the first steps of that run); unset: --probe_steps",
    )
    parser.add_argument(
        "--probe_eval_steps", type=int, default=None, help="validation every N probe steps; unset: at the end"
    )
    parser.add_argument("--setting", default="ds-init0.2", help="the probe setting the main run uses")
    parser.add_argument(
        "--model",
        choices=list(sudoku_depth.MODELS),
        default="hyperset",
        help="the model the probes and the main run train, each with the setting's width, heads and depth",
    )
    parser.add_argument("--max_steps", type=int, default=1500, help="the main run's schedule length")
    parser.add_argument(
        "--minutes", type=float, default=30.0, help="wall-time cap of the main run's training"
    )
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--eval_steps", type=int, default=100)
    parser.add_argument("--seed", type=int, default=42)
    parser.add_argument("--n_test", type=int, default=1000, help="first N puzzles of each test split")
    parser.add_argument("--eval_batch_size", type=int, default=250)
    parser.add_argument("--work_dir", default="runs/sudoku-easy", help="probe folders go here")
    parser.add_argument(
        "--output_dir", default="runs/sudoku-easy/hyperset-ds", help="the main run's saved model"
    )
    parser.add_argument("--notes", default=None, help="a paragraph appended to the .md")
    parser.add_argument("--results", default=str(RESULTS / "sudoku_easy"), help="path stem of .md/.json/.png")
    args = parser.parse_args(argv)
    probes = [p.strip() for p in args.probes.split(",") if p.strip()]
    unknown = [p for p in probes if p not in PROBES]
    if unknown or not probes:
        parser.error(f"--probes {args.probes!r}: unknown {unknown}; expected names from {list(PROBES)}")
    if args.setting not in PROBES:
        parser.error(f"--setting {args.setting!r}: expected one of {list(PROBES)}")
    for name in ("probe_steps", "max_steps", "batch_size", "eval_steps", "n_test"):
        if getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1; got {getattr(args, name)}")
    for name in ("probe_schedule_steps", "probe_eval_steps"):
        if getattr(args, name) is not None and getattr(args, name) < 1:
            parser.error(f"--{name} must be an integer >= 1 (or unset); got {getattr(args, name)}")
    if args.probe_schedule_steps is not None and args.probe_schedule_steps < args.probe_steps:
        parser.error(
            f"--probe_schedule_steps must be >= --probe_steps ({args.probe_steps}); got {args.probe_schedule_steps}"
        )
    if args.minutes <= 0:
        parser.error(f"--minutes must be > 0; got {args.minutes}")
    # checked here: the training CLI would refuse a Hyper-SET-only field only after loading the data
    if args.model == "looped-transformer":
        from energyformers.configuration.configuration_looped_transformer import HYPERSET_ONLY_FIELDS

        used = (probes if args.stage in ("all", "probes") else []) + (
            [args.setting] if args.stage in ("all", "main") else []
        )
        for name in dict.fromkeys(used):
            only = sorted(set(PROBES[name].get("config", {})) & set(HYPERSET_ONLY_FIELDS))
            if only:
                parser.error(
                    f"--model looped-transformer with setting {name!r}: {only} are Hyper-SET options the looped "
                    "Transformer does not have; choose a setting without them"
                )
    work, stem = Path(args.work_dir), Path(args.results)
    run = provenance.run_info(seed=args.seed, argv=argv, script=__file__)

    if args.stage in ("all", "probes"):
        for name in probes:
            schedule = args.probe_schedule_steps or args.probe_steps
            flags = train_flags(
                PROBES[name],
                schedule,
                args.batch_size,
                args.seed,
                args.probe_eval_steps or args.probe_steps,
                args.model,
            )
            stop = args.probe_steps if schedule > args.probe_steps else None
            train([*flags, "--output_dir", str(work / f"probe-{name}"), "--overwrite_output_dir"], None, stop)
        if args.stage == "probes":
            return
    json_path = stem.with_suffix(".json")
    if args.stage == "render":
        out = json.loads(json_path.read_text())
        out["notes"] = args.notes or out.get("notes")
        if (Path(out["main"]["folder"]) / "metrics.json").is_file():  # the curves as this version reads them
            out["main"].update(summary(Path(out["main"]["folder"])))
    else:
        training = None
        if args.stage in ("all", "main"):
            flags = train_flags(
                PROBES[args.setting], args.max_steps, args.batch_size, args.seed, args.eval_steps, args.model
            )
            training = train(
                [*flags, "--output_dir", args.output_dir, "--overwrite_output_dir"], args.minutes
            )
        folder = Path(args.output_dir)
        main_run = summary(folder) | {"setting": args.setting, "training": training}
        found = {
            p.name.removeprefix("probe-"): p
            for p in sorted(work.glob("probe-*"))
            if (p / "metrics.json").is_file()
        }
        import torch

        out = {
            "run": run,
            "command": run["command"],
            "machine": f"{provenance.machine()} (at most two trainings at once), CPU only, 1 torch thread per "
            "training",
            "torch": torch.__version__,
            "batch_size": args.batch_size,
            "probe_steps": args.probe_steps,
            "probe_schedule_steps": args.probe_schedule_steps or args.probe_steps,
            "probes": {name: summary(path) | {"setting": PROBES.get(name)} for name, path in found.items()},
            "main": main_run,
            "depths": evaluate_depths(folder, args.n_test, args.eval_batch_size),
            "notes": args.notes,
        }
    stem.parent.mkdir(parents=True, exist_ok=True)
    json_path.write_text(json.dumps(out, indent=2) + "\n")
    plot(out, stem.with_suffix(".png"))
    write_markdown(out, stem.with_suffix(".md"))
    print(stem.with_suffix(".md").read_text(), flush=True)


if __name__ == "__main__":
    main()
