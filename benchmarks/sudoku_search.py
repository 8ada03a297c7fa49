"""Test-time search on Sudoku: board and blank-cell accuracy of a trained Hyper-SET with K perturbed trajectories
per puzzle, per selector, and what the search cost.

A trained `HyperSetForTokenClassification` Sudoku folder (`--model_dir`, e.g. written by `energyformers train
--model hyperset --dataset sudoku --preset sudoku ...`) is reloaded and run on the first `--n_test` puzzles of
the test split of each `--dataset` (`sudoku`: our 36–45-given puzzles; `sudoku-hard`: larsdoku, 21–29 givens):

* K = 1 is the plain forward (no search; every selector and σ give it).
* For each noise scale σ (`--noise`), K (`--trajectories`) and selector (`--selectors`), one call
  `model(input_ids, search_trajectories=K, search_noise=σ, search_seed=s, search_selector=...)`: K starts
  x₀ + σ·rms(x₀)·ε (trajectory 0 the plain start), run to the trained depth, one kept per puzzle by the lowest
  final energy (`energy`), the highest mean confidence (`confidence`) or a valid board, lowest energy among them
  (`sudoku`). The seed of a batch is `--seed` + its index, the same for every selector: the selectors choose
  among the very same trajectories.
* `oracle@K`: a puzzle counts if any of its K trajectories gives a valid board (the `sudoku` call's
  `search_valid_boards`; a valid board consistent with the givens of a uniquely solvable puzzle is its solution,
  and the result counts any valid board that differs from the given solution). It bounds what a selector can
  reach from these trajectories.
* Energies: per puzzle, the final energy of the chosen trajectory and the mean of the rejected ones; within
  puzzles that have both valid and invalid trajectories, whether the lowest energy is a valid one.
* Cost: wall time per puzzle (batched, `--num_threads` CPU threads or one GPU), the forward FLOPs per puzzle
  (counted by `torch.utils.flop_counter.FlopCounterMode` on one puzzle: K trajectories plus each one's final
  energy, the verifier) and iterations per puzzle (K × T × layers).

Writes `<output_dir>/sudoku_search.{md,json,png}` (default benchmarks/results/). `--smoke` checks the script end to
end in seconds (a tiny untrained model unless `--model_dir` is given, 8 puzzles, K = 1, 2, 4, σ = 0.3) and writes
`sudoku_search_smoke.{md,json,png}`, marked as not a measurement.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/sudoku_search.py --model_dir runs/sudoku-hyperset \\
        --dataset sudoku sudoku-hard --n_test 200 --num_threads 2
    .venv/bin/python benchmarks/sudoku_search.py --smoke --output_dir /tmp/search-smoke
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")  # before torch is imported (README: CPU threads)

RESULTS = provenance.RESULTS
DATASETS = ("sudoku", "sudoku-hard")
SELECTORS = ("energy", "confidence", "sudoku")
# σ is relative to each token's rms, so it is a fraction of the start's own scale: 0.1 nudges the start (the
# trajectories stay in the plain start's basin unless it is a narrow one), 0.3 moves it far enough that different
# fixed points are reached on a trained model, short of drowning the puzzle's embedding (σ = 1 is as much noise
# as signal, and the givens themselves would be blurred).
NOISES = (0.1, 0.3)
TRAJECTORIES = (1, 4, 16)


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument(
        "--model_dir", help="a trained HyperSetForTokenClassification Sudoku folder (required unless --smoke)"
    )
    p.add_argument("--dataset", nargs="+", default=list(DATASETS), help=f"one or more of {list(DATASETS)}")
    p.add_argument("--split", default="test", help="the puzzles' split (default test)")
    p.add_argument(
        "--n_test", type=int, default=None, help="first N puzzles of the split (default 200; smoke 8)"
    )
    p.add_argument(
        "--trajectories", type=int, nargs="+", default=None, help="K values (default 1 4 16; smoke 1 2 4)"
    )
    p.add_argument(
        "--noise", type=float, nargs="+", default=None, help="σ values (default 0.1 0.3; smoke 0.3)"
    )
    p.add_argument("--selectors", nargs="+", default=list(SELECTORS), help=f"of {list(SELECTORS)}")
    p.add_argument(
        "--num_iterations", type=int, default=None, help="iterations per layer (default: the trained T)"
    )
    p.add_argument("--seed", type=int, default=0, help="search seed of the first batch (batch i: seed + i)")
    p.add_argument(
        "--batch_size",
        type=int,
        default=256,
        help="trajectories per call (default 256): max(1, this // K) puzzles per call, so memory stays flat in K",
    )
    p.add_argument("--device", default="cpu", help="cpu (default) or cuda")
    p.add_argument("--num_threads", type=int, default=1, help="torch CPU threads (default 1)")
    p.add_argument(
        "--output_dir", default=str(RESULTS), help="where the .md/.json/.png go (default benchmarks/results)"
    )
    p.add_argument(
        "--smoke", action="store_true", help="check the script end to end in seconds (not a measurement)"
    )
    p.add_argument(
        "--notes", default=None, help="a paragraph appended to the .md (the reading of a real run)"
    )
    return p


def check_args(args: argparse.Namespace) -> None:
    """Errors naming the argument, its value and what is allowed, before anything is loaded."""

    def fail(message: str) -> None:
        raise SystemExit(f"sudoku_search.py: error: {message}")

    if args.model_dir is None and not args.smoke:
        fail("--model_dir is required (a trained Hyper-SET Sudoku folder); --smoke runs without one")
    if args.model_dir is not None and not Path(args.model_dir).is_dir():
        fail(f"--model_dir {args.model_dir}: no such folder")
    for name in args.dataset:
        if name not in DATASETS:
            fail(f"--dataset {name!r}: expected one or more of {list(DATASETS)}")
    for name in args.selectors:
        if name not in SELECTORS:
            fail(f"--selectors {name!r}: expected one or more of {list(SELECTORS)}")
    for k in args.trajectories:
        if k < 1:
            fail(f"--trajectories {k}: expected integers >= 1")
    if 1 not in args.trajectories:
        fail(
            f"--trajectories {' '.join(map(str, args.trajectories))}: include 1 (the plain forward, the baseline)"
        )
    for sigma in args.noise:
        if not math.isfinite(sigma) or sigma <= 0:
            fail(
                f"--noise {sigma}: expected finite numbers > 0 (K > 1 with σ = 0 repeats the same trajectory)"
            )
    if args.n_test < 1:
        fail(f"--n_test {args.n_test}: expected an integer >= 1")
    if args.batch_size < 1:
        fail(f"--batch_size {args.batch_size}: expected an integer >= 1")
    if args.num_threads < 1:
        fail(f"--num_threads {args.num_threads}: expected an integer >= 1")
    if args.num_iterations is not None and args.num_iterations < 1:
        fail(f"--num_iterations {args.num_iterations}: expected an integer >= 1")
    if args.seed < 0:
        fail(f"--seed {args.seed}: expected an integer >= 0")


def tiny_model(folder: Path) -> Path:
    """A small untrained Sudoku Hyper-SET (smoke mode without --model_dir): checks the script, measures nothing."""
    from energyformers import HyperSetConfig, HyperSetForTokenClassification

    config = HyperSetConfig(input_type="sequence", vocab_size=10, max_position_embeddings=81, hidden_size=16,
                            num_attention_heads=2, intermediate_size=16, num_iterations=2, num_labels=9,
                            id2label={i: str(i + 1) for i in range(9)},
                            label2id={str(i + 1): i for i in range(9)})  # fmt: skip
    import torch

    torch.manual_seed(0)
    HyperSetForTokenClassification(config).save_pretrained(folder)
    return folder


def load_model(model_dir: str | Path, device: str) -> Any:
    import transformers

    import energyformers  # noqa: F401  (registers the families with the Auto classes)

    config = transformers.AutoConfig.from_pretrained(model_dir)
    architecture = (config.architectures or [None])[0]
    if (
        config.model_type != "hyperset"
        or architecture != "HyperSetForTokenClassification"
        or config.num_labels != 9
    ):
        raise SystemExit(
            f"sudoku_search.py: error: --model_dir {model_dir}: expected a Hyper-SET Sudoku model "
            f"(HyperSetForTokenClassification, num_labels 9); got {config.model_type} {architecture}, num_labels "
            f"{config.num_labels}"
        )
    model = transformers.AutoModelForTokenClassification.from_pretrained(model_dir).to(device).eval()
    model.config.halting_tolerance = None  # every trajectory runs the same depth: the cost is K × T exactly
    return model


def puzzles(name: str, split: str, n: int) -> tuple[Any, Any]:
    """`(input_ids, labels)` `(N, 81)` long of the first `n` puzzles of a split (labels: digit − 1 on blanks,
    −100 on givens)."""
    import torch

    from energyformers.training.data import load_data

    data = load_data(name)
    if split not in data:
        raise SystemExit(f"sudoku_search.py: error: --split {split!r} is not in {name}; it has {list(data)}")
    rows = data[split].select(range(min(n, len(data[split]))))
    return torch.tensor(rows["input_ids"]), torch.tensor(rows["labels"])


def forward_flops(model: Any, input_ids: Any, **call: Any) -> int:
    """FLOPs of one call (torch's FlopCounterMode: matrix products and convolutions)."""
    from torch.utils.flop_counter import FlopCounterMode

    # not under no_grad: FlopCounterMode's module tracker trips on the graph Hyper-SET's iterations build there
    with FlopCounterMode(display=False) as counter:
        model(input_ids=input_ids, **call)
    return int(counter.get_total_flops())


def run_config(model: Any, inputs: Any, batch_size: int, seed: int, **search: Any) -> dict[str, Any]:
    """All batches with one search configuration (none: the plain forward); predictions, per-trajectory fields,
    and the wall time."""
    import torch

    keys = ("search_chosen", "search_energies", "search_confidences", "search_valid_boards")
    collected: dict[str, list] = {"predictions": [], **{k: [] for k in keys}}
    device = next(model.parameters()).device
    start = time.perf_counter()
    with torch.no_grad():
        # batch_size counts trajectories: K × B of them run in one forward
        per_call = max(1, batch_size // search.get("search_trajectories", 1))
        for index, batch in enumerate(inputs.split(per_call)):
            call = dict(search, search_seed=seed + index) if search else {}
            out = model(input_ids=batch.to(device), num_iterations=model.config.num_iterations, **call)
            collected["predictions"].append(out.logits.argmax(-1).cpu())
            for key in keys:
                value = getattr(out, key, None)
                if value is not None:
                    collected[key].append(value.cpu())
    seconds = time.perf_counter() - start
    result = {key: torch.cat(values) if values else None for key, values in collected.items()}
    result["seconds"] = seconds
    return result


def accuracies(predictions: Any, labels: Any) -> dict[str, Any]:
    blank = labels != -100
    right = (predictions == labels) & blank
    solved = right.sum(1) == blank.sum(1)
    return {
        "board_accuracy": float(solved.float().mean()),
        "blank_cell_accuracy": float(right.sum() / blank.sum().clamp_min(1)),
        "solved": solved,
    }


def energy_split(energies: Any, chosen: Any) -> dict[str, float]:
    """Mean over puzzles of the chosen trajectory's final energy and of the mean of its rejected ones, their mean
    difference and the share of puzzles whose chosen energy is below the rejected mean."""
    import torch

    k = energies.shape[1]
    mask = torch.nn.functional.one_hot(chosen, k).bool()
    mine = energies[mask]
    rejected = energies.masked_fill(mask, 0).sum(1) / (k - 1)
    difference = mine - rejected
    return {
        "chosen_energy_mean": float(mine.mean()),
        "rejected_energy_mean": float(rejected.mean()),
        "chosen_minus_rejected_mean": float(difference.mean()),
        "share_chosen_below_rejected": float((difference < 0).float().mean()),
    }


def verifier_quality(energies: Any, confidences: Any, valid: Any) -> dict[str, Any]:
    """Within puzzles that have both valid and invalid trajectories: how often the lowest energy (highest
    confidence) is a valid one, and the mean energy gap valid − invalid (negative: the energy prefers valid)."""

    mixed = valid.any(1) & ~valid.all(1)
    n = int(mixed.sum())
    if n == 0:
        return {"mixed_puzzles": 0}
    e, c, v = energies[mixed], confidences[mixed], valid[mixed]
    pick = lambda scores: v.gather(1, scores.argmin(1, keepdim=True)).float().mean()  # noqa: E731
    gap = (e * v).sum(1) / v.sum(1) - (e * ~v).sum(1) / (~v).sum(1)
    return {
        "mixed_puzzles": n,
        "lowest_energy_is_valid": float(pick(e)),
        "highest_confidence_is_valid": float(pick(-c)),
        "valid_share_of_trajectories": float(v.float().mean()),
        "energy_valid_minus_invalid_mean": float(gap.mean()),
    }


def evaluate_dataset(model: Any, name: str, args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from energyformers.modeling.modeling_hyperset import sudoku_boards_valid

    inputs, labels = puzzles(name, args.split, args.n_test)
    n = len(inputs)
    config = model.config
    T = config.num_iterations
    layers = config.num_hidden_layers
    one = inputs[:1].to(next(model.parameters()).device)
    plain_flops = forward_flops(model, one, num_iterations=T)
    plain = run_config(model, inputs, args.batch_size, args.seed)
    base = accuracies(plain["predictions"], labels)
    plain_valid = sudoku_boards_valid(inputs, torch.nn.functional.one_hot(plain["predictions"], 9).float())
    rows = [
        {
            "noise": None, "trajectories": 1, "selector": "none (plain forward)",
            "board_accuracy": base["board_accuracy"], "blank_cell_accuracy": base["blank_cell_accuracy"],
            "boards_gained": 0, "boards_lost": 0, "share_not_trajectory_0": 0.0,
            "valid_but_not_the_solution": int((plain_valid & ~base["solved"]).sum()),
            "seconds_per_puzzle": plain["seconds"] / n, "flops_per_puzzle": plain_flops,
            "iterations_per_puzzle": T * layers,
        }
    ]  # fmt: skip
    oracle, energies_of, verifiers, scatter = [], {}, [], {}
    for sigma in args.noise:
        for k in [k for k in args.trajectories if k > 1]:
            flops = forward_flops(model, one, num_iterations=T, search_trajectories=k, search_noise=sigma,
                                  search_seed=args.seed, search_selector="energy")  # fmt: skip
            valid = None
            for selector in args.selectors:
                out = run_config(model, inputs, args.batch_size, args.seed, search_trajectories=k,
                                 search_noise=sigma, search_selector=selector)  # fmt: skip
                acc = accuracies(out["predictions"], labels)
                chosen, energies = out["search_chosen"], out["search_energies"]
                board_valid = sudoku_boards_valid(
                    inputs, torch.nn.functional.one_hot(out["predictions"], 9).float()
                )
                row = {
                    "noise": sigma, "trajectories": k, "selector": selector,
                    "board_accuracy": acc["board_accuracy"], "blank_cell_accuracy": acc["blank_cell_accuracy"],
                    "boards_gained": int((acc["solved"] & ~base["solved"]).sum()),
                    "boards_lost": int((~acc["solved"] & base["solved"]).sum()),
                    "share_not_trajectory_0": float((chosen != 0).float().mean()),
                    "valid_but_not_the_solution": int((board_valid & ~acc["solved"]).sum()),
                    "seconds_per_puzzle": out["seconds"] / n, "flops_per_puzzle": flops,
                    "iterations_per_puzzle": k * T * layers,
                    **energy_split(energies, chosen),
                }  # fmt: skip
                rows.append(row)
                energies_of[(sigma, k, selector)] = (energies, chosen)
                if (
                    selector == "sudoku"
                ):  # the same trajectories as the other selectors'; only it marks valid boards
                    valid, trajectory_energies = out["search_valid_boards"], energies
                    confidences = out["search_confidences"]
            if valid is not None:
                oracle.append(
                    {"noise": sigma, "trajectories": k, "board_accuracy": float(valid.any(1).float().mean())}
                )
                verifiers.append(
                    {
                        "noise": sigma,
                        "trajectories": k,
                        **verifier_quality(trajectory_energies, confidences, valid),
                    }
                )
                if k == max(args.trajectories):
                    scatter[sigma] = {
                        "energy_minus_trajectory_0": (
                            trajectory_energies - trajectory_energies[:, :1]
                        ).tolist(),
                        "valid": valid.tolist(),
                    }
    histograms = {
        f"{selector} σ={sigma:g} K={k}": (e.gather(1, c[:, None])[:, 0] - (e.sum(1) - e.gather(1, c[:, None])[:, 0])
                                          / (k - 1)).tolist()
        for (sigma, k, selector), (e, c) in energies_of.items()
        if k == max(args.trajectories)
    }  # fmt: skip
    return {
        "dataset": name,
        "split": args.split,
        "num_puzzles": n,
        "givens_range": [int((inputs > 0).sum(1).min()), int((inputs > 0).sum(1).max())],
        "rows": rows,
        "oracle": oracle,
        "verifier": verifiers,
        "chosen_minus_rejected_energy": histograms,
        "scatter": {str(s): v for s, v in scatter.items()},
    }


# ----------------------------------------------------------------------------- reading, markdown, figure


def reading(section: dict[str, Any]) -> list[str]:
    """Plain sentences from the numbers: what each selector gained over the plain forward, and the headroom."""
    rows = section["rows"]
    base = rows[0]
    n = section["num_puzzles"]
    lines = []
    for selector in SELECTORS:
        mine = [r for r in rows[1:] if r["selector"] == selector]
        if not mine:
            continue
        best = max(mine, key=lambda r: (r["board_accuracy"], r["blank_cell_accuracy"]))
        delta = best["board_accuracy"] - base["board_accuracy"]
        net = best["boards_gained"] - best["boards_lost"]
        if net > 0:
            verdict = "helps"
        elif best["boards_gained"] == best["boards_lost"] == 0:
            verdict = "changes no board"
        else:
            verdict = "does not help"
        lines.append(
            f"`{selector}` {verdict}: best at σ = {best['noise']:g}, K = {best['trajectories']}: board accuracy "
            f"{best['board_accuracy']:.3f} ({delta:+.3f}; {best['boards_gained']} boards gained, "
            f"{best['boards_lost']} lost of {n}), blank-cell {best['blank_cell_accuracy']:.3f} "
            f"({best['blank_cell_accuracy'] - base['blank_cell_accuracy']:+.3f}), at "
            f"{best['seconds_per_puzzle'] / max(base['seconds_per_puzzle'], 1e-12):.1f}× the plain forward's time."
        )
        widest = [r for r in mine if r["trajectories"] == max(r["trajectories"] for r in mine)]
        lines[-1] += " At K = {}: {}.".format(
            widest[0]["trajectories"],
            "; ".join(
                f"σ = {r['noise']:g}: board {r['board_accuracy'] - base['board_accuracy']:+.3f}, blank-cell "
                f"{r['blank_cell_accuracy'] - base['blank_cell_accuracy']:+.3f}"
                for r in widest
            ),
        )
    if section["oracle"]:
        top = max(section["oracle"], key=lambda o: o["board_accuracy"])
        lines.append(
            f"Headroom: some trajectory gives a valid board for {top['board_accuracy']:.3f} of the puzzles at "
            f"σ = {top['noise']:g}, K = {top['trajectories']} (oracle), against {base['board_accuracy']:.3f} for "
            "the plain forward."
        )
    for entry in section["verifier"]:
        if entry.get("mixed_puzzles"):
            lines.append(
                f"σ = {entry['noise']:g}, K = {entry['trajectories']}: in the {entry['mixed_puzzles']} puzzles with "
                f"both valid and invalid trajectories, the lowest energy is a valid board in "
                f"{entry['lowest_energy_is_valid']:.0%}, the highest confidence in "
                f"{entry['highest_confidence_is_valid']:.0%} (valid share {entry['valid_share_of_trajectories']:.0%})."
            )
    return lines


def markdown(report: dict[str, Any]) -> str:
    smoke = report["smoke"]
    head = "# Test-time search on Sudoku: K trajectories per puzzle, per selector"
    if smoke:
        head = "# SMOKE RUN of benchmarks/sudoku_search.py: checks the script, NOT a measurement"
    lines = [head, "", *provenance.markdown_lines(report["run"]), ""]
    m = report["model"]
    lines += [
        f"Model: `{m['model_dir']}` (Hyper-SET, d = {m['hidden_size']}, T = {m['num_iterations']}, "
        f"{m['num_hidden_layers']} layer(s), {m['num_parameters']:,} parameters). "
        f"{report['environment']['device']}, {report['environment']['threads']} thread(s).",
        "",
        "K = 1 is the plain forward. σ is relative to each token's rms; trajectory 0 of every search is the plain "
        "start, and ties go to it. The selectors of one (σ, K) choose among the same trajectories (same seeds). "
        "Gained / lost: boards solved by the search and not by the plain forward, and the reverse. "
        "E chosen / rejected: mean final energy (Σ_layers E_ATTN + E_FF) of the chosen trajectory and of the mean "
        "of the rejected ones. FLOPs counted by torch's FlopCounterMode on one puzzle (matrix products; a search's "
        "include every trajectory's final energy, the verifier, computed once per layer), × the plain forward's.",
        "",
    ]
    for section in report["datasets"]:
        lines += [
            f"## {section['dataset']} ({section['split']} split, first {section['num_puzzles']} puzzles, "
            f"{section['givens_range'][0]}–{section['givens_range'][1]} givens)",
            "",
            "| σ | K | selector | board acc | blank-cell acc | gained / lost | not traj. 0 | E chosen | E rejected | "
            "s / puzzle | GFLOPs / puzzle | iterations / puzzle |",
            "|---|---|---|---|---|---|---|---|---|---|---|---|",
        ]
        base_flops = section["rows"][0]["flops_per_puzzle"]
        for r in section["rows"]:
            sigma = "–" if r["noise"] is None else f"{r['noise']:g}"
            energies = (
                f"{r['chosen_energy_mean']:.3f} | {r['rejected_energy_mean']:.3f}"
                if "chosen_energy_mean" in r
                else "– | –"
            )
            lines.append(
                f"| {sigma} | {r['trajectories']} | {r['selector']} | {r['board_accuracy']:.3f} | "
                f"{r['blank_cell_accuracy']:.3f} | {r['boards_gained']} / {r['boards_lost']} | "
                f"{r['share_not_trajectory_0']:.2f} | {energies} | {r['seconds_per_puzzle'] * 1e3:.2f} ms | "
                f"{r['flops_per_puzzle'] / 1e9:.4g} ({r['flops_per_puzzle'] / max(base_flops, 1):.1f}×) | "
                f"{r['iterations_per_puzzle']} |"
            )
        for o in section["oracle"]:
            lines.append(
                f"| {o['noise']:g} | {o['trajectories']} | oracle (any valid board) | {o['board_accuracy']:.3f} | "
                "| | | | | | | |"
            )
        lines += ["", "Reading (generated from the numbers above):", ""]
        lines += [f"* {line}" for line in reading(section)]
        lines.append("")
    lines += [f"![search]({report['figure']})", ""]
    if report.get("notes"):
        lines += [report["notes"], ""]
    return "\n".join(lines)


def plot(report: dict[str, Any], path: Path) -> None:
    import matplotlib
    import numpy as np

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    sections = report["datasets"]
    fig, axes = plt.subplots(len(sections), 4, figsize=(21, 4.4 * len(sections)), squeeze=False)
    colors = {"energy": "tab:blue", "confidence": "tab:orange", "sudoku": "tab:green"}
    styles = ("-", "--", ":", "-.")
    rng = np.random.default_rng(0)  # the vertical jitter of the scatter

    def legend(ax: Any) -> None:
        # a run with K = 1 only has no search curves, histograms or scatter: their panels stay without a legend
        # (matplotlib warns on a legend with nothing labelled in it)
        if ax.get_legend_handles_labels()[0]:
            ax.legend(fontsize=7)

    for row, section in zip(axes, sections):
        base = section["rows"][0]
        for ax, metric in zip(row[:2], ("board_accuracy", "blank_cell_accuracy")):
            tops = [base[metric]]
            curves = [
                (selector, sigma, style, colors[selector], f"{selector}, σ = {sigma:g}",
                 [(r["trajectories"], r[metric]) for r in section["rows"][1:]
                  if r["selector"] == selector and r["noise"] == sigma])
                for selector in SELECTORS for style, sigma in zip(styles, report["noise"])
            ]  # fmt: skip
            if metric == "board_accuracy":
                curves += [
                    ("oracle", sigma, style, "gray", f"oracle (any valid board), σ = {sigma:g}",
                     [(o["trajectories"], o[metric]) for o in section["oracle"] if o["noise"] == sigma])
                    for style, sigma in zip(styles, report["noise"])
                ]  # fmt: skip
            for _, _, style, color, label, points in curves:
                if points:
                    points = [(1, base[metric]), *points]
                    tops += [v for _, v in points]
                    ax.plot(*zip(*points), style, marker="o", ms=4, color=color, label=label)
            ax.set_ylim(-0.02, min(1.02, max(0.1, 1.15 * max(tops))))
            ax.set_xscale("log", base=2)
            ax.set_xticks(report["trajectories"], [str(k) for k in report["trajectories"]])
            ax.set_xlabel("trajectories K (1: the plain forward)")
            ax.set_ylabel(metric.replace("_", " "))
            ax.set_title(
                f"{section['dataset']}: {metric.replace('_', ' ')} vs K ({section['num_puzzles']} puzzles)"
            )
            legend(ax)

        ax = row[2]
        for label, values in section["chosen_minus_rejected_energy"].items():
            ax.hist(values, bins=30, histtype="step", lw=1.4, label=label,
                    color=colors[label.split()[0]], ls="-" if f"σ={report['noise'][0]:g}" in label else "--")  # fmt: skip
        ax.axvline(0, color="black", lw=0.8)
        ax.set_xlabel("E(chosen) − mean E(rejected), per puzzle")
        ax.set_ylabel("puzzles")
        ax.set_title(f"chosen vs rejected final energy (K = {max(report['trajectories'])})")
        legend(ax)

        ax = row[3]
        for sigma, data in section["scatter"].items():
            energies = [e for puzzle in data["energy_minus_trajectory_0"] for e in puzzle[1:]]
            valid = [v for puzzle in data["valid"] for v in puzzle[1:]]
            marker = "o" if sigma == str(report["noise"][0]) else "^"
            for flag, color, name in ((False, "tab:red", "invalid"), (True, "tab:green", "valid")):
                xs = [e for e, v in zip(energies, valid) if v == flag]
                ys = (1.0 if flag else 0.0) + rng.uniform(-0.25, 0.25, len(xs))
                ax.scatter(xs, ys, s=8, alpha=0.3, color=color, marker=marker,
                           label=f"{name} board, σ = {sigma}")  # fmt: skip
        ax.axvline(0, color="black", lw=0.8)
        ax.set_yticks([0, 1], ["invalid", "valid"])
        ax.set_ylim(-0.5, 1.5)
        ax.set_xlabel("E(trajectory) − E(trajectory 0), per perturbed trajectory")
        ax.set_title(f"does lower energy mean a valid board? (K = {max(report['trajectories'])})")
        legend(ax)
    title = "Hyper-SET test-time search on Sudoku"
    if report["smoke"]:
        title = "SMOKE RUN (not a measurement): " + title
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


# ----------------------------------------------------------------------------- main


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = build_parser().parse_args(argv)
    if args.n_test is None:
        args.n_test = 8 if args.smoke else 200
    if args.trajectories is None:
        args.trajectories = [1, 2, 4] if args.smoke else list(TRAJECTORIES)
    if args.noise is None:
        args.noise = [0.3] if args.smoke else list(NOISES)
    args.trajectories = sorted(set(args.trajectories))
    check_args(args)

    import torch

    # `--num_threads` is this run's: a caller that runs main in-process (a notebook, a test) gets its own count back
    threads = torch.get_num_threads()
    torch.set_num_threads(args.num_threads)
    try:
        return run(args, argv)
    finally:
        torch.set_num_threads(threads)


def run(args: argparse.Namespace, argv: list[str] | None) -> dict[str, Any]:
    """The benchmark for checked `args` (`argv` is only recorded in the report); `main` has set torch's threads."""
    import torch

    with tempfile.TemporaryDirectory() as scratch:
        model_dir = args.model_dir or tiny_model(Path(scratch) / "tiny-sudoku-hyperset")
        model = load_model(model_dir, args.device)
        if args.num_iterations is not None:
            model.config.num_iterations = args.num_iterations
        config = model.config
        device = torch.cuda.get_device_name(args.device) if args.device.startswith("cuda") else None
        run_info = provenance.run_info(seed=args.seed, argv=argv, script=__file__, device=device)
        report: dict[str, Any] = {
            "run": run_info,
            "smoke": args.smoke,
            "model": {
                "model_dir": str(args.model_dir or "tiny untrained model (smoke)"),
                "hidden_size": config.hidden_size,
                "num_iterations": config.num_iterations,
                "num_hidden_layers": config.num_hidden_layers,
                "num_parameters": sum(p.numel() for p in model.parameters()),
            },
            "noise": args.noise,
            "trajectories": args.trajectories,
            "selectors": args.selectors,
            "seed": args.seed,
            "batch_size": args.batch_size,
            "environment": {
                "device": args.device if args.device != "cpu" else f"CPU ({platform.machine()})",
                "threads": args.num_threads,
            },
            "datasets": [],
        }
        start = time.perf_counter()
        for name in args.dataset:
            report["datasets"].append(evaluate_dataset(model, name, args))
            print(f"{name}: done ({time.perf_counter() - start:.0f} s)", flush=True)
    report["wall_time_s"] = round(time.perf_counter() - start, 2)
    report["notes"] = args.notes
    stem = "sudoku_search_smoke" if args.smoke else "sudoku_search"
    output = Path(args.output_dir)
    output.mkdir(parents=True, exist_ok=True)
    report["figure"] = f"{stem}.png"
    report["reading"] = {section["dataset"]: reading(section) for section in report["datasets"]}
    plot(report, output / f"{stem}.png")
    (output / f"{stem}.json").write_text(json.dumps(report, indent=1) + "\n", encoding="utf-8")
    (output / f"{stem}.md").write_text(markdown(report), encoding="utf-8")
    for suffix in ("md", "json", "png"):
        print(output / f"{stem}.{suffix}")
    return report


if __name__ == "__main__":
    main()
