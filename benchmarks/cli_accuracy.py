"""Test accuracy of the CLI's default models: Hyper-SET, iMixer and HyperBF on fashion_mnist and rotten_tomatoes.

Each row is one `energyformers train --model FAMILY --dataset DATASET --epochs N --seed 42` subprocess with every
other flag left at the CLI's default (the model is the CLI's small config of the family, as a user gets it), in a
temporary run folder. Test accuracy, macro-F1, the parameter count and the run's wall time come from that folder's
`metrics.json`; the model's `config.json` is kept in the JSON. Every row records its own run (`"run"`:
benchmarks/provenance.py's date, command, commit, versions, machine and seed), torch thread count and load average,
because `--rows` reruns only some rows and merges them into the existing result file (rows measured elsewhere keep
their own record).
The result files are rewritten after every row, so an interrupted run keeps the rows it finished.

Writes `<output_dir>/cli_accuracy.{md,json}` (default benchmarks/results/). `--smoke` checks the script end to end
(128 / 64 / 64 examples, 1 epoch) and writes `cli_accuracy_smoke.{md,json}` instead, marked as not a measurement.

    OMP_WAIT_POLICY=PASSIVE .venv/bin/python benchmarks/cli_accuracy.py  # all six rows, one full training each
    .venv/bin/python benchmarks/cli_accuracy.py --rows hyperset-rotten_tomatoes,imixer-rotten_tomatoes
    .venv/bin/python benchmarks/cli_accuracy.py --dry_run                        # print the commands
    .venv/bin/python benchmarks/cli_accuracy.py --smoke --rows hyperbf-rotten_tomatoes --output_dir /tmp/acc
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

# before torch is imported, here and in the subprocesses
provenance.setdefault_env("OMP_WAIT_POLICY", "PASSIVE")

# after the environment default: the CLI command and its subprocess runner are shared
from recipe_accuracy import CLI, RESULTS, run  # noqa: E402

FAMILY = {"hyperset": "Hyper-SET", "imixer": "iMixer", "hyperbf": "HyperBF"}
# (family, dataset, epochs): the rows of the table this script writes (benchmarks/results/cli_accuracy.md), in order
ROWS = [
    ("hyperset", "fashion_mnist", 5),
    ("imixer", "fashion_mnist", 3),
    ("hyperbf", "fashion_mnist", 5),
    ("hyperset", "rotten_tomatoes", 5),
    ("imixer", "rotten_tomatoes", 5),
    ("hyperbf", "rotten_tomatoes", 5),
]
ROW_IDS = [f"{model}-{dataset}" for model, dataset, _ in ROWS]
SEED = 42
SMOKE_FLAGS = ["--max_train_samples", "128", "--max_eval_samples", "64", "--max_test_samples", "64"]
# config.json entries that say nothing about the model measured (label names, the writer's version)
CONFIG_NOISE = {"id2label", "label2id", "architectures", "transformers_version", "auto_map"}


def row_command(
    model: str, dataset: str, epochs: int, args: argparse.Namespace, output_dir: Path
) -> list[str]:
    """The `energyformers train` command of one row; only epochs, seed and threads are set, the rest is default.

    `--disable_tqdm` and `--num_predictions 0` change only what is printed and the card's examples, not training.
    """
    flags = ["--model", model, "--dataset", dataset, "--epochs", str(1 if args.smoke else epochs)]
    flags += [
        "--seed",
        str(SEED),
        "--num_threads",
        str(args.num_threads),
        "--disable_tqdm",
        "--num_predictions",
        "0",
    ]
    if args.smoke:
        flags += SMOKE_FLAGS
    return [*CLI, *flags, "--output_dir", str(output_dir)]


def upgraded(row: dict[str, Any]) -> dict[str, Any]:
    """A row of a file written before rows recorded `"run"`, in today's shape (its benchmark command was not
    recorded)."""
    if "run" in row:
        return row
    flat = ("date", "git_commit", "python", "torch", "transformers", "cpu", "usable_cores")
    old = {key: row[key] for key in flat}
    rest = {key: value for key, value in row.items() if key not in flat}
    machine = f"{old['cpu']}, {old['usable_cores']} cores available"
    run_info = {**{key: old[key] for key in flat[:5]}, "command": "not recorded", "machine": machine}
    return {**rest, "run": {**run_info, "seed": row["seed"]}}


def measure(model: str, dataset: str, epochs: int, args: argparse.Namespace, workdir: Path) -> dict[str, Any]:
    """Train one row in `workdir` and read its numbers back from the run folder."""
    output_dir = workdir / f"{model}-{dataset}"
    record = {"id": f"{model}-{dataset}", "model": model, "dataset": dataset, "seed": SEED}
    # per row: `--rows` merges rows of different runs
    record["run"] = provenance.run_info(seed=SEED, argv=args.argv, script=__file__)
    record.update(
        num_threads=args.num_threads,
        omp_wait_policy=os.environ.get("OMP_WAIT_POLICY"),
        load_average_at_start=[round(x, 2) for x in os.getloadavg()],
    )
    result = run(row_command(model, dataset, epochs, args, output_dir), output_dir)
    metrics = json.loads((output_dir / "metrics.json").read_text())
    config = json.loads((output_dir / "config.json").read_text())
    record.update(
        command=result["command"],
        epochs=metrics["recipe"]["epochs"],
        num_parameters=metrics["num_parameters"],
        test_accuracy=metrics["test"]["accuracy"],
        test_f1_macro=metrics["test"]["f1_macro"],
        eval_accuracy=metrics["eval"].get("accuracy"),
        train_loss=metrics["train"].get("train_loss"),
        learning_rate=metrics["recipe"]["learning_rate"],
        batch_size=metrics["recipe"]["batch_size"],
        data=metrics["data"],
        wall_time_s=metrics["wall_time_s"],  # the run's own clock: model, data, training, evaluation, saving
        process_wall_s=result["wall_s"],  # the subprocess, with interpreter start-up and imports
        load_average_at_end=[round(x, 2) for x in os.getloadavg()],
        warnings=metrics["warnings"],
        config={k: v for k, v in config.items() if k not in CONFIG_NOISE},
    )
    return record


def build_report(report: dict[str, Any]) -> str:
    rows = report["rows"]
    if report["smoke"]:
        head = [
            "# SMOKE RUN of benchmarks/cli_accuracy.py: checks the script, NOT a measurement",
            "",
            f"1 epoch on {' / '.join(SMOKE_FLAGS[1::2])} train / validation / test examples; the numbers below "
            "say nothing about the models.",
        ]
    else:
        head = [
            "# Test accuracy of the CLI's default models (`energyformers train`, seed 42)",
            "",
            "One `energyformers train` run per row, every flag but `--model`, `--dataset`, `--epochs`, `--seed` and "
            "`--num_threads` at the CLI's default; numbers from the run folder's `metrics.json`. Wall time is the "
            "run's own (data, training, evaluation, saving) on a shared machine: the load average is recorded "
            "per row.",
        ]
    lines = [*head, "", "Written by `python benchmarks/cli_accuracy.py`.", ""]
    lines += [
        "| family | dataset | epochs | params | test acc | macro-F1 | wall s |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {FAMILY[r['model']]} | {r['dataset']} | {r['epochs']:g} | {r['num_parameters']:,} | "
            f"{r['test_accuracy']:.4f} | {r['test_f1_macro']:.4f} | {r['wall_time_s']:.0f} |"
        )
    if report["missing"]:
        missing = ",".join(report["missing"])
        lines += [
            "",
            f"Not measured in this file: {missing} (`python benchmarks/cli_accuracy.py --rows {missing}`).",
        ]
    lines += ["", "## Runs", ""]
    for r in rows:
        validation = "none" if r["eval_accuracy"] is None else f"{r['eval_accuracy']:.4f}"
        command, details = provenance.markdown_lines(r["run"])
        lines += [
            f"* {r['id']}: `{r['command']}`",
            f"  {command}",
            f"  {details} {r['num_threads']} torch "
            f"thread(s), OMP_WAIT_POLICY={r['omp_wait_policy']}, load average "
            f"{r['load_average_at_start'][0]:.1f} at start and {r['load_average_at_end'][0]:.1f} at end; "
            f"lr {r['learning_rate']:g}, batch {r['batch_size']}, train loss {r['train_loss']:.4f}, "
            f"validation accuracy {validation}.",
        ]
    return "\n".join(lines) + "\n"


def write(report: dict[str, Any], output_dir: Path, stem: str) -> None:
    """Both files, each replaced in one step (a run killed mid-write keeps the previous complete file)."""
    output_dir.mkdir(parents=True, exist_ok=True)
    for suffix, text in ((".json", json.dumps(report, indent=2) + "\n"), (".md", build_report(report))):
        tmp = output_dir / f".{stem}{suffix}.tmp"
        tmp.write_text(text)
        tmp.replace(output_dir / f"{stem}{suffix}")


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--rows",
        default=",".join(ROW_IDS),
        help=f"comma-separated subset of {', '.join(ROW_IDS)}, run in that order (default: all, the table's order)",
    )
    parser.add_argument("--output_dir", type=Path, default=RESULTS, help="where the result files go")
    parser.add_argument(
        "--num_threads",
        type=int,
        default=1,
        help="torch threads per run (1: the CLI's advice on a busy machine)",
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny subsets, 1 epoch: checks the script, measures nothing"
    )
    parser.add_argument("--dry_run", action="store_true", help="print the commands; train nothing")
    args = parser.parse_args(argv)
    args.argv = argv  # recorded in each row's run (None: sys.argv)
    args.rows = [r.strip() for r in args.rows.split(",") if r.strip()]
    unknown = [r for r in args.rows if r not in ROW_IDS]
    if unknown or not args.rows:
        parser.error(
            f"--rows {','.join(unknown) or repr('')}: expected a comma-separated subset of {','.join(ROW_IDS)}"
        )
    if len(set(args.rows)) != len(args.rows):
        parser.error(f"--rows {','.join(args.rows)}: a row is named twice")
    if args.num_threads < 1:
        parser.error(f"--num_threads {args.num_threads}: expected an integer >= 1")
    return args


def main(argv: list[str] | None = None) -> dict[str, Any]:
    args = parse_args(argv)
    selected = [
        ROWS[ROW_IDS.index(row_id)] for row_id in args.rows
    ]  # in the order given; reported in the table's
    if args.dry_run:
        for model, dataset, epochs in selected:
            command = row_command(model, dataset, epochs, args, Path("RUN"))
            print(shlex.join(["energyformers", "train", *command[len(CLI) :]]))  # as the results record it
        return {}
    stem = "cli_accuracy_smoke" if args.smoke else "cli_accuracy"
    # a measurement merges into the existing file (rows not rerun keep their record); a smoke run starts fresh
    existing = args.output_dir / f"{stem}.json"
    kept = (
        {}
        if args.smoke or not existing.exists()
        else {r["id"]: upgraded(r) for r in json.loads(existing.read_text())["rows"]}
    )
    report: dict[str, Any] = {"benchmark": "cli_accuracy", "smoke": args.smoke, "rows": [], "missing": []}
    start = time.time()
    failed = []
    with tempfile.TemporaryDirectory(prefix="cli-accuracy-") as workdir:
        for model, dataset, epochs in selected:
            row_id = f"{model}-{dataset}"
            print(f"[{time.time() - start:6.0f} s] {row_id}, {epochs} epoch(s)", flush=True)
            try:
                kept[row_id] = measure(model, dataset, epochs, args, Path(workdir))
            except subprocess.CalledProcessError as error:
                # keep going: the other rows are independent, and the failure is named in the summary
                failed.append(row_id)
                print(f"{row_id} failed (exit status {error.returncode}); it is left out", flush=True)
                continue
            report["rows"] = [kept[i] for i in ROW_IDS if i in kept]
            report["missing"] = [i for i in ROW_IDS if i not in kept]
            write(report, args.output_dir, stem)
    report["rows"] = [kept[i] for i in ROW_IDS if i in kept]
    report["missing"] = [i for i in ROW_IDS if i not in kept]
    if report["rows"]:
        print(build_report(report))
    if failed:
        raise SystemExit(f"rows that failed: {', '.join(failed)}")
    return report


if __name__ == "__main__":
    main()
