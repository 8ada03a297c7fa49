"""iMixer as an implicit layer: fixed-point solvers and gradient modes on trained models.

* Accuracy and wall time vs tolerance for each solver, on trained iMixer folders (each with the dataset it
  was trained on): `unrolled` for n = 0..32 steps (the paper's solver; n = 0 is the vanilla-Mixer path on the
  same weights), `picard` and `anderson` (memory 5) for a range of relative tolerances, at most `--max_steps`
  steps. Steps = steps each block ran (the most any sample of a batch needed), mean over blocks and batches.
* Training memory and time per step for each gradient mode (`unrolled`, `implicit`, `phantom` with k = 1) at
  n = 2, 4, 8, all with the unrolled solver (the same n steps forward, so only the gradient differs), on the
  trained model's architecture with random inputs. Memory is measured two ways: the bytes autograd saves for
  the backward (saved-tensor hooks: exact, what grows with n), and the peak RSS increase of a fresh process
  over 5 training steps after a warm-up step (VmHWM, reset through /proc/self/clear_refs, minus the RSS at
  the reset: includes the allocator's behaviour and the backward's temporaries).

Writes imixer_solvers.{md,json} into `--output_dir` (default benchmarks/results), replacing them;
`--report_only` rewrites the md from the json there.

    OMP_WAIT_POLICY=PASSIVE python benchmarks/imixer_solvers.py \
        --model digits=/tmp/imixer-demo --model fashion_mnist=/tmp/imixer-fashion --max_test_samples 2000
"""

from __future__ import annotations

import argparse
import json
import logging
import statistics
import subprocess
import sys
import time
from pathlib import Path

import torch
from transformers import AutoImageProcessor

from energyformers import IMixerConfig, IMixerForImageClassification
from energyformers.modeling import modeling_imixer
from energyformers.training.data import load_data
from energyformers.training.processing import image_transform

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

SEED = 0  # the random inputs of the training-memory section
UNROLLED_STEPS = (0, 1, 2, 4, 8, 16, 32)
TOLERANCES = (1e-1, 3e-2, 1e-2, 1e-3, 1e-4, 1e-5)
GRADIENTS = ("unrolled", "implicit", "phantom")
TRAIN_STEPS = (2, 4, 8)


class _Warnings(logging.Handler):
    def __init__(self) -> None:
        super().__init__()
        self.count = 0

    def emit(self, record: logging.LogRecord) -> None:
        self.count += "diverged" in record.getMessage()


def test_batches(model_dir: str, dataset: str, limit: int | None, batch_size: int = 250) -> list[dict]:
    test = load_data(dataset)["test"]
    if limit is not None and len(test) > limit:
        test = test.select(range(limit))
    test = test.with_transform(image_transform(AutoImageProcessor.from_pretrained(model_dir)))
    batches = [test[i : i + batch_size] for i in range(0, len(test), batch_size)]
    return [{"pixel_values": b["pixel_values"], "labels": torch.as_tensor(b["labels"])} for b in batches]


@torch.inference_mode()
def evaluate(model, batches: list[dict], call: dict, repeats: int) -> dict:
    """Accuracy, steps and final relative residual (one pass with diagnostics), then wall time (no diagnostics)."""
    correct = total = 0
    steps, residual = [], []
    handler = _Warnings()
    modeling_imixer.logger.addHandler(handler)
    try:
        for batch in batches:
            out = model(pixel_values=batch["pixel_values"], output_fixed_point_residuals=True, **call)
            correct += int((out.logits.argmax(-1) == batch["labels"]).sum())
            total += len(batch["labels"])
            diagnostics = out.fixed_point_residuals
            steps.append(float(diagnostics.iterations.float().mean()))
            residual.append(float(diagnostics.final_relative_residuals.mean()))
        seconds, cpu_seconds = [], []
        for _ in range(repeats):
            begin, cpu_begin = time.perf_counter(), time.process_time()
            for batch in batches:
                model(pixel_values=batch["pixel_values"], **call)
            seconds.append(time.perf_counter() - begin)
            cpu_seconds.append(time.process_time() - cpu_begin)
    finally:
        modeling_imixer.logger.removeHandler(handler)
    return dict(
        accuracy=correct / total,
        steps=statistics.mean(steps),
        final_relative_residual=statistics.mean(residual),
        seconds=statistics.median(seconds),
        cpu_seconds=statistics.median(cpu_seconds),
        diverged_warnings=handler.count,
    )


def solver_section(name: str, model_dir: str, limit: int | None, max_steps: int, repeats: int) -> dict:
    model = IMixerForImageClassification.from_pretrained(model_dir).eval()
    batches = test_batches(model_dir, name, limit)
    rows = []
    for n in UNROLLED_STEPS:
        rows.append(
            dict(solver="unrolled", n=n, **evaluate(model, batches, dict(fixed_point_iterations=n), repeats))
        )
        print(name, rows[-1], flush=True)
    for solver in ("picard", "anderson"):
        for tolerance in TOLERANCES:
            call = dict(
                fixed_point_iterations=max_steps, fixed_point_solver=solver, fixed_point_tolerance=tolerance
            )
            rows.append(
                dict(
                    solver=solver, tolerance=tolerance, n=max_steps, **evaluate(model, batches, call, repeats)
                )
            )
            print(name, rows[-1], flush=True)
    with torch.inference_mode():
        bounds = model(pixel_values=batches[0]["pixel_values"][:1], output_fixed_point_residuals=True)
    config = model.config
    return dict(
        dataset=name,
        model_dir=model_dir,
        test_images=sum(len(b["labels"]) for b in batches),
        architecture=dict(
            hidden_size=config.hidden_size,
            num_hidden_layers=config.num_hidden_layers,
            tokens=config.num_tokens,
            token_mixing_size=config.token_mixing_size,
            contractive_size=config.contractive_size,
            trained_n=config.fixed_point_iterations,
            image_size=config.image_size,
            patch_size=config.patch_size,
        ),
        lipschitz_bounds=bounds.fixed_point_residuals.lipschitz_bounds.tolist(),
        rows=rows,
    )


# ---------------------------------------------------------------- training memory / time per step


def _train_inputs(config: IMixerConfig, batch: int) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(SEED)
    side = config.image_size if isinstance(config.image_size, int) else config.image_size[0]
    return dict(
        pixel_values=torch.randn(batch, config.num_channels, side, side, generator=g),
        labels=torch.randint(0, config.num_labels, (batch,), generator=g),
    )


def _model(model_dir: str) -> IMixerForImageClassification:
    return IMixerForImageClassification.from_pretrained(model_dir).train()


def saved_bytes(model, inputs: dict, gradient: str, n: int) -> int:
    total = 0

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal total
        total += tensor.numel() * tensor.element_size()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        loss = model(**inputs, fixed_point_iterations=n, fixed_point_gradient=gradient).loss
    loss.backward()
    model.zero_grad()
    return total


def step_seconds(model, inputs: dict, gradient: str, n: int, repeats: int) -> tuple[float, float]:
    """Median wall and CPU seconds of one training step (forward, backward, SGD step)."""
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    seconds, cpu_seconds = [], []
    for index in range(repeats + 2):  # two warm-up steps
        begin, cpu_begin = time.perf_counter(), time.process_time()
        model(**inputs, fixed_point_iterations=n, fixed_point_gradient=gradient).loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if index >= 2:
            seconds.append(time.perf_counter() - begin)
            cpu_seconds.append(time.process_time() - cpu_begin)
    return statistics.median(seconds), statistics.median(cpu_seconds)


def _status_bytes(field: str) -> int:
    """A `/proc/self/status` memory field (VmRSS, VmHWM) in bytes."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) * 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def memory_worker(model_dir: str, batch: int, gradient: str, n: int) -> None:
    """Runs in a fresh process: peak RSS increase over 5 training steps (after one warm-up step), as JSON."""
    torch.set_num_threads(1)
    model = _model(model_dir)
    inputs = _train_inputs(model.config, batch)
    model(**inputs, fixed_point_iterations=n, fixed_point_gradient=gradient).loss.backward()
    model.zero_grad()
    Path("/proc/self/clear_refs").write_text("5")  # Linux: reset the peak RSS (VmHWM) to the current RSS
    before = _status_bytes("VmRSS")
    for _ in range(5):
        model(**inputs, fixed_point_iterations=n, fixed_point_gradient=gradient).loss.backward()
        model.zero_grad()
    print(json.dumps(dict(peak_rss_increase=_status_bytes("VmHWM") - before)))


def training_section(model_dir: str, batch: int, repeats: int) -> dict:
    model = _model(model_dir)
    inputs = _train_inputs(model.config, batch)
    rows = []
    for n in TRAIN_STEPS:
        for gradient in GRADIENTS:
            worker = subprocess.run(
                [sys.executable, __file__, "--memory_worker", model_dir, str(batch), gradient, str(n)],
                capture_output=True,
                text=True,
            )
            if worker.returncode:
                print(worker.stderr[-2000:], file=sys.stderr)
                measured = dict(peak_rss_increase=None)
            else:
                measured = json.loads(worker.stdout.strip().splitlines()[-1])
            rows.append(
                dict(
                    n=n,
                    gradient=gradient,
                    saved_bytes=saved_bytes(model, inputs, gradient, n),
                    seconds=step_seconds(model, inputs, gradient, n, 3 * repeats),
                    **measured,
                )
            )
            print(rows[-1], flush=True)
    return dict(model_dir=model_dir, batch=batch, rows=rows)


# ---------------------------------------------------------------- report


def report(args: argparse.Namespace, results: dict) -> str:
    if "run" in results:
        header = [*provenance.markdown_lines(results["run"]), ""]
    else:  # a json written before the run header existed: what it recorded
        header = [f"Command: `{results['command']}` — {results['machine']}.", ""]
    lines = [
        "# iMixer fixed-point solvers and gradient modes",
        "",
        *header,
        f"{args.num_threads} torch thread(s), no GPU; {results['minutes']:.1f} min in total. Times are medians of "
        f"{args.repeats} passes over the test set ({3 * args.repeats} training steps): CPU time (process time) is "
        "the robust number, wall time also counts whatever else the machine ran. Compare rows within a table, not "
        "across runs.",
        "",
    ]
    for section in results["solvers"]:
        arch = section["architecture"]
        lines += [
            f"## Solvers on `{section['model_dir']}` ({section['dataset']}, {section['test_images']} test images)",
            "",
            *_training_note(section["model_dir"]),
            f"Model: D = {arch['hidden_size']}, {arch['num_hidden_layers']} blocks, S = {arch['tokens']} tokens "
            f"({arch['image_size']}² images, patch {arch['patch_size']}), D_S = {arch['token_mixing_size']}, "
            f"N_h = {arch['contractive_size']}, trained with the unrolled solver at n = {arch['trained_n']}. "
            "Lipschitz bound s²·σ(W₁)·σ(W₂) of F per block (GELU s = 1.1289, exact σ of the normalised weights): "
            + ", ".join(f"{b:.3f}" for b in section["lipschitz_bounds"])
            + ".",
            "",
            "| solver | tolerance | max steps | accuracy | steps (mean) | final rel. residual | CPU s | wall s | "
            "divergence warnings |",
            "|---|---|---|---|---|---|---|---|---|",
        ]
        for row in section["rows"]:
            tolerance = f"{row['tolerance']:g}" if "tolerance" in row else "—"
            lines.append(
                f"| {row['solver']} | {tolerance} | {row['n']} | {row['accuracy']:.4f} | {row['steps']:.2f} | "
                f"{row['final_relative_residual']:.2e} | {row['cpu_seconds']:.2f} | {row['seconds']:.2f} | "
                f"{row['diverged_warnings']} |"
            )
        lines.append("")
    training = results["training"]
    lines += [
        f"## Training memory and time per step by gradient mode (`{training['model_dir']}` architecture, "
        f"batch {training['batch']}, random inputs)",
        "",
        "All with the unrolled solver (n steps forward). `implicit`: n − 1 steps without a graph, one with, and the "
        "adjoint fixed point solved with n unrolled steps in the backward; `phantom`: k = 1, damping 1 (the last "
        "step carries the graph). Saved = bytes autograd keeps for the backward (saved-tensor hooks); peak RSS = "
        "increase of a fresh process's peak RSS (VmHWM after a reset through /proc/self/clear_refs) over 5 "
        "training steps that follow a warm-up step.",
        "",
        "| n | gradient | saved for backward (MiB) | peak RSS increase (MiB) | CPU ms per step | wall ms per step |",
        "|---|---|---|---|---|---|",
    ]
    for row in training["rows"]:
        peak = "failed" if row["peak_rss_increase"] is None else f"{row['peak_rss_increase'] / 2**20:.1f}"
        wall, cpu = row["seconds"]
        lines.append(
            f"| {row['n']} | {row['gradient']} | {row['saved_bytes'] / 2**20:.1f} | {peak} | "
            f"{1000 * cpu:.0f} | {1000 * wall:.0f} |"
        )
    lines.append("")
    return "\n".join(lines)


def _training_note(model_dir: str) -> list[str]:
    """How the model folder was trained, from the `metrics.json` that `energyformers train` writes."""
    path = Path(model_dir) / "metrics.json"
    if not path.exists():
        return []
    metrics = json.loads(path.read_text())
    recipe, test = metrics.get("recipe", {}), metrics.get("test", {})
    return [
        f"Trained with `{recipe.get('command')}` ({metrics.get('num_parameters'):,} parameters, "
        f"{recipe.get('epochs')} epochs, {metrics.get('wall_time_s', 0):.0f} s; test accuracy "
        f"{float(test.get('accuracy', 'nan')):.4f} on its own test split).",
        "",
    ]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", action="append", default=[], help="DATASET=MODEL_DIR (repeatable)")
    parser.add_argument("--max_test_samples", type=int, default=None)
    parser.add_argument("--max_steps", type=int, default=50, help="step cap of the tolerance solvers")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--train_batch", type=int, default=64)
    parser.add_argument("--num_threads", type=int, default=1)
    parser.add_argument("--memory_worker", nargs=4, metavar=("MODEL_DIR", "BATCH", "GRADIENT", "N"))
    parser.add_argument("--report_only", action="store_true", help="rewrite the md from the saved json")
    parser.add_argument(
        "--output_dir", type=Path, default=provenance.RESULTS, help="default benchmarks/results"
    )
    args = parser.parse_args(argv)
    if args.report_only:
        results = json.loads((args.output_dir / "imixer_solvers.json").read_text())
        (args.output_dir / "imixer_solvers.md").write_text(
            report(argparse.Namespace(**results["args"]), results)
        )
        return
    if args.memory_worker:
        model_dir, batch, gradient, n = args.memory_worker
        memory_worker(model_dir, int(batch), gradient, int(n))
        return
    bad = [spec for spec in args.model if "=" not in spec]
    if not args.model or bad:
        parser.error(f"--model takes DATASET=MODEL_DIR and is required at least once, got {args.model}")
    torch.set_num_threads(args.num_threads)
    begin = time.perf_counter()
    models = [spec.split("=", 1) for spec in args.model]
    results = dict(
        args=dict(num_threads=args.num_threads, repeats=args.repeats),
        run=provenance.run_info(seed=SEED, argv=argv, script=__file__),
        solvers=[
            solver_section(name, folder, args.max_test_samples, args.max_steps, args.repeats)
            for name, folder in models
        ],
        training=training_section(models[0][1], args.train_batch, args.repeats),
    )
    results["minutes"] = (time.perf_counter() - begin) / 60
    folder = provenance.output_dir(args.output_dir)
    (folder / "imixer_solvers.json").write_text(json.dumps(results, indent=1) + "\n")
    (folder / "imixer_solvers.md").write_text(report(args, results))
    print(report(args, results))


if __name__ == "__main__":
    main()
