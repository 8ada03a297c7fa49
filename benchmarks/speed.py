"""Speed of each family against its baseline, measured side by side in one run.

* Hyper-SET (cifar10-small: d = 384, 6 heads, T = 12, M = d) vs HF ViT of the same width, heads and depth
  (MLP 4d). The FLOP budget at 224²/16 (d = 384, 12 iterations / layers): ≈ 4.9 vs ≈ 9.2 GFLOP per image,
  so ≈ 1.8–1.9×.
* iMixer-S/16 (h_r = 2, n = 2) vs the vanilla MLP-Mixer-S/16 (the same trunk with n = 0, = timm's Mixer).
* HyperBF (memo CIFAR setting: D = 768, 4 heads, 4 blocks, 32²/4) vs HF ViT with the same width, heads,
  depth and MLP 4D.

Hyper-SET runs with each attention implementation this device has (`attn_implementation`: `eager`, the
materialised reference and the CPU default; `sdpa`, pure torch on `scaled_dot_product_attention`; `triton`, the
fused kernel, CUDA only). Runs of a pair are interleaved (A, B, A, B, ...) so machine load hits both alike; the
table reports medians and the baseline / model ratio (> 1: the model is faster). Forward = inference mode (HyperBF
inside `cached_centers()`, as a pipeline call and `energyformers evaluate` run it); train step = forward + backward.

`--attention-bound` adds a diagnostic row: Hyper-SET with the bi-softmax replaced by one SDPA call (the row softmax
alone: wrong maths, so not the model), the speed it would reach if its attention cost what ViT's does.

`--matmul-floor` (CPU) adds another: the time Hyper-SET spends in its matrix products alone (`aten::mm`, `addmm`,
`bmm`, `baddbmm` self time under `torch.profiler`, eager), against ViT's whole forward — the ratio if every other
operation (softmax, norms, gains, step-size chain, updates) cost nothing.

`--only` keeps the pairs whose model name contains one of the given strings (e.g. `--only attn=eager` while
iterating on Hyper-SET) and merges them into the speed.{md,json} already in `--output_dir`: the rows measured
now replace theirs, every other row is kept and marked with the run that measured it. Without `--only` the run
is complete and replaces both files.

`--compile-time` adds the time of the first call of `torch.compile(fullgraph=True)` (dynamo capture + backend
compile + one run) of Hyper-SET at T = 4 and T = 24, with the layer step a nested compile region (compiled once
and reused for every iteration, the model's code) and, for comparison, unrolled (the region removed). Results:
speed.{md,json} in `--output_dir` (default benchmarks/results).

    python benchmarks/speed.py [--batch 8] [--repeats 7] [--device cpu|cuda] [--num_threads N] [--compiled]
        [--attention-bound] [--matmul-floor] [--only NAME_PART ...] [--output_dir DIR]
        [--compile-time [--compile-backends aot_eager inductor] [--compile-variants region unrolled]]
"""

from __future__ import annotations

import argparse
import contextlib
import inspect
import json
import statistics
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import torch
import torch.nn.functional as F
from transformers import ViTForImageClassification

from energyformers import (
    HyperBFConfig,
    HyperBFForImageClassification,
    HyperSetConfig,
    HyperSetForImageClassification,
    IMixerConfig,
    IMixerForImageClassification,
    registry,
)
from energyformers.center_cache import centers_scope
from energyformers.modeling import modeling_hyperset

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

SEED = 0  # weights and inputs of every pair


def vit_like(width: int, heads: int, depth: int, image: int, patch: int) -> ViTForImageClassification:
    """The ViT baseline `--model vit` trains (`energyformers.registry.TRANSFORMERS_BASELINES["vit"]`: transformers'
    own classes), at the given size."""
    vit = registry.TRANSFORMERS_BASELINES["vit"]
    config = vit.config_class(
        image_size=image, patch_size=patch, hidden_size=width, num_attention_heads=heads, num_hidden_layers=depth,
        intermediate_size=4 * width, num_labels=10, attn_implementation="sdpa",
    )  # fmt: skip
    return vit.heads["AutoModelForImageClassification"](config)


def hyperset(attn_implementation: str, **overrides) -> HyperSetForImageClassification:
    config = HyperSetConfig.from_preset("cifar10-small", attn_implementation=attn_implementation, **overrides)
    return HyperSetForImageClassification(config)


def hyperset_pairs(device: str) -> list[tuple]:
    """One pair per attention implementation that runs on `device` (the fused kernel: CUDA with Triton)."""
    names = ["eager", "sdpa"]
    if device == "cuda" and "triton" in modeling_hyperset.ALL_ATTENTION_FUNCTIONS:
        names.append("triton")
    return [
        (
            f"Hyper-SET cifar10-small (224²/16, T=12), attn={name}",
            lambda name=name: hyperset(name),
            "ViT d=384, 6 heads, 12 layers",
            lambda: vit_like(384, 6, 12, 224, 16),
            224,
        )
        for name in names
    ]


class SingleSdpaAttention(torch.nn.Module):
    """Hyper-SET with its bi-softmax replaced by ONE `scaled_dot_product_attention` call (the row softmax alone):
    not the model, a bound — the time Hyper-SET would take if its attention cost what ViT's does, everything else
    (projections, norms, step-size network, feedforward, updates) unchanged. `--attention-bound` adds it."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.model = model

    @staticmethod
    def row_only(q, k, v, keep):
        return F.scaled_dot_product_attention(q, k, v, scale=1.0), None

    def forward(self, **inputs):
        table = modeling_hyperset.ALL_ATTENTION_FUNCTIONS
        original, table["eager"] = table["eager"], self.row_only
        try:
            return self.model(**inputs)
        finally:
            table["eager"] = original


# name, model builder, baseline name, baseline builder, image side (Hyper-SET's pairs: `hyperset_pairs`)
PAIRS: list[tuple[str, Callable[[], torch.nn.Module], str, Callable[[], torch.nn.Module], int]] = [
    (
        "iMixer-S/16 (h_r=2, n=2)",
        lambda: IMixerForImageClassification(IMixerConfig.from_preset("s16")),
        "MLP-Mixer-S/16 (n=0)",
        lambda: IMixerForImageClassification(IMixerConfig.from_preset("s16", fixed_point_iterations=0)),
        224,
    ),
    (
        "HyperBF cifar (32²/4, D=768, 4 blocks)",
        lambda: HyperBFForImageClassification(HyperBFConfig.from_preset("cifar")),
        "ViT D=768, 4 heads, 4 layers",
        lambda: vit_like(768, 4, 4, 32, 4),
        32,
    ),
]


def time_once(model: torch.nn.Module, pixels: torch.Tensor, labels: torch.Tensor, train: bool) -> float:
    start = time.perf_counter()
    if train:
        model.train()
        model(pixel_values=pixels, labels=labels).loss.backward()
        model.zero_grad(set_to_none=True)
    else:
        model.eval()
        with torch.inference_mode():
            model(pixel_values=pixels)
    if pixels.is_cuda:
        torch.cuda.synchronize()
    return time.perf_counter() - start


def measure(
    models: dict[str, torch.nn.Module],
    pixels: torch.Tensor,
    repeats: int,
    modes: tuple[str, ...] = ("forward", "train_step"),
) -> dict[str, dict[str, float]]:
    labels = torch.randint(0, 10, (pixels.shape[0],), device=pixels.device)
    medians = {}
    for mode in modes:
        times: dict[str, list[float]] = {name: [] for name in models}
        with contextlib.ExitStack() as scopes:
            # inference as a pipeline call or an evaluation runs it: HyperBF's centers cached across calls
            if mode == "forward":
                for model in models.values():
                    scopes.enter_context(centers_scope(model))
            for model in models.values():  # warm-up (fills the cache)
                time_once(model, pixels, labels, mode == "train_step")
            for _ in range(repeats):
                for name, model in models.items():
                    times[name].append(time_once(model, pixels, labels, mode == "train_step"))
        medians[mode] = {name: statistics.median(t) for name, t in times.items()}
    return medians


MATMUL_OPS = ("aten::mm", "aten::addmm", "aten::bmm", "aten::baddbmm")


def matmul_floor(
    build: Callable[[], torch.nn.Module],
    build_baseline: Callable[[], torch.nn.Module],
    pixels: torch.Tensor,
    repeats: int,
) -> dict[str, float]:
    """Medians over interleaved repeats: the model's forward, the seconds of it spent in matrix products (profiler
    self time of `MATMUL_OPS`, one profiled forward per repeat) and the baseline's forward (inference mode, CPU)."""
    from torch.profiler import ProfilerActivity, profile

    model, baseline = build().eval(), build_baseline().eval()
    times: dict[str, list[float]] = {"model": [], "matmul": [], "baseline": []}
    with torch.inference_mode():
        model(pixel_values=pixels), baseline(pixel_values=pixels)  # warm-up
        for _ in range(repeats):
            for key, net in (("model", model), ("baseline", baseline)):
                start = time.perf_counter()
                net(pixel_values=pixels)
                times[key].append(time.perf_counter() - start)
            with profile(activities=[ProfilerActivity.CPU]) as prof:
                model(pixel_values=pixels)
            events = prof.key_averages()
            times["matmul"].append(sum(e.self_cpu_time_total for e in events if e.key in MATMUL_OPS) / 1e6)
    return {key: statistics.median(values) for key, values in times.items()}


@contextlib.contextmanager
def unrolled() -> Iterator[None]:
    """Hyper-SET's layer step without its nested compile region: dynamo inlines every iteration."""
    layer = modeling_hyperset.HyperSetLayer
    original = raw = layer.forward
    raw = inspect.unwrap(raw)
    while hasattr(raw, "__marked_compile_region_fn__"):  # torch's region wrapper keeps the function here
        raw = raw.__marked_compile_region_fn__
    layer.forward = raw
    try:
        yield
    finally:
        layer.forward = original


def compile_time(backend: str, depth: int, variant: str, device: str) -> float:
    """Seconds torch.compile adds to the first call (batch 1, inference): that call minus a compiled one."""
    import torch._inductor.config

    torch._inductor.config.force_disable_caches = True  # a cold compile each time, no reuse across depths
    torch.manual_seed(0)
    default = modeling_hyperset.DEFAULT_ATTN_IMPLEMENTATION
    model = hyperset(default, num_iterations=depth).to(device).eval()
    pixels = torch.randn(1, 3, 224, 224, device=device)
    seconds = []
    with unrolled() if variant == "unrolled" else contextlib.nullcontext(), torch.no_grad():
        torch._dynamo.reset()
        compiled = torch.compile(model, fullgraph=True, backend=backend)
        for _ in range(2):
            start = time.perf_counter()
            compiled(pixel_values=pixels)
            if device == "cuda":
                torch.cuda.synchronize()
            seconds.append(time.perf_counter() - start)
    return seconds[0] - seconds[1]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--repeats", type=int, default=7)
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    parser.add_argument("--compile-time", action="store_true", help="also time torch.compile at T = 4 and 24")
    parser.add_argument("--compile-backends", nargs="+", default=["aot_eager", "inductor"])
    parser.add_argument("--compile-variants", nargs="+", default=["region", "unrolled"])
    parser.add_argument("--compiled", action="store_true", help="also Hyper-SET vs ViT, both compiled")
    parser.add_argument(
        "--attention-bound",
        action="store_true",
        help="also Hyper-SET with its attention replaced by one SDPA call (a bound, not the model)",
    )
    parser.add_argument(
        "--matmul-floor",
        action="store_true",
        help="also Hyper-SET's time in matrix products alone vs ViT's forward (CPU; a bound, not the model)",
    )
    parser.add_argument(
        "--only", nargs="+", default=None, help="run only pairs whose name contains one of these"
    )
    parser.add_argument("--num_threads", type=int, default=None, help="torch CPU threads (default: torch's)")
    parser.add_argument(
        "--output_dir", type=Path, default=provenance.RESULTS, help="default benchmarks/results"
    )
    args = parser.parse_args(argv)
    if args.matmul_floor and args.device != "cpu":
        parser.error(f"--matmul-floor profiles CPU matrix products; got --device {args.device}, expected cpu")
    if args.num_threads is not None:
        torch.set_num_threads(args.num_threads)

    device_name = torch.cuda.get_device_name() if args.device == "cuda" else provenance.cpu_model()
    setting = (
        f"batch {args.batch}, {args.repeats} interleaved repeats after one warm-up, device {args.device} "
        f"({device_name}), {torch.get_num_threads()} CPU threads, float32"
    )
    run = provenance.run_info(
        seed=SEED, argv=argv, script=__file__, device=device_name if args.device != "cpu" else None
    )
    stamp = {"run": run, "setting": setting}
    records = []
    pairs = hyperset_pairs(args.device) + PAIRS
    if args.attention_bound:
        pairs.append(
            (
                "Hyper-SET cifar10-small, attention = one SDPA call (bound, not the model)",
                lambda: SingleSdpaAttention(hyperset("eager")),
                "ViT d=384, 6 heads, 12 layers",
                lambda: vit_like(384, 6, 12, 224, 16),
                224,
            )
        )
    if args.compiled:  # Hyper-SET's default attention, both models under torch.compile (inductor)
        default = modeling_hyperset.DEFAULT_ATTN_IMPLEMENTATION
        pairs.append(
            (
                f"Hyper-SET cifar10-small (224²/16, T=12), attn={default}, torch.compile",
                lambda: torch.compile(hyperset(default), fullgraph=True),
                "ViT d=384, 6 heads, 12 layers, torch.compile",
                lambda: torch.compile(vit_like(384, 6, 12, 224, 16), fullgraph=True),
                224,
            )
        )
    if args.only:
        kept = [pair for pair in pairs if any(part in pair[0] for part in args.only)]
        if not kept and not (args.matmul_floor or args.compile_time):
            parser.error(f"--only {args.only} matches no pair; the pairs are {[pair[0] for pair in pairs]}")
        pairs = kept
    for name, build, baseline_name, build_baseline, side in pairs:
        torch.manual_seed(SEED)
        models = {name: build().to(args.device), baseline_name: build_baseline().to(args.device)}
        pixels = torch.randn(args.batch, 3, side, side, device=args.device)
        # compiled pairs: inference only (compiling the backward too takes many minutes on CPU)
        compiled = "torch.compile" in name
        medians = measure(
            models, pixels, args.repeats, ("forward",) if compiled else ("forward", "train_step")
        )
        params = {k: sum(p.numel() for p in m.parameters()) for k, m in models.items()}
        records.append({"model": name, "baseline": baseline_name, "params": params, **medians, **stamp})
        print(table_row(records[-1]), flush=True)
    if args.matmul_floor:
        torch.manual_seed(SEED)
        name = "Hyper-SET cifar10-small (T=12, attn=eager), its matrix products alone (bound, not the model)"
        baseline_name = "ViT d=384, 6 heads, 12 layers"
        pixels = torch.randn(args.batch, 3, 224, 224)
        floor = matmul_floor(
            lambda: hyperset("eager"), lambda: vit_like(384, 6, 12, 224, 16), pixels, args.repeats
        )
        records.append({"model": name, "baseline": baseline_name, "matmul_floor": floor, **stamp})
        print(table_row(records[-1]), flush=True)
    compile_records = []
    if args.compile_time:
        compile_time("eager", 1, "region", args.device)  # one-off start-up (imports) outside the measurements
        for backend in args.compile_backends:
            for variant in args.compile_variants:
                seconds = {depth: compile_time(backend, depth, variant, args.device) for depth in (4, 24)}
                compile_records.append({"backend": backend, "variant": variant, "seconds": seconds, **stamp})
                print(compile_row(json.loads(json.dumps(compile_records[-1]))), flush=True)
    result = {"run": run, "setting": setting, "pairs": records, "compile_time": compile_records}
    folder = provenance.output_dir(args.output_dir)
    if args.only:
        result = merge(
            json.loads((folder / "speed.json").read_text()) if (folder / "speed.json").exists() else None,
            result,
        )
    result = json.loads(json.dumps(result))  # the same types whether a row was measured now or read back
    text = render(result)
    (folder / "speed.md").write_text(text)
    (folder / "speed.json").write_text(json.dumps(result, indent=2) + "\n")
    print(text)


def merge(previous: dict | None, measured: dict) -> dict:
    """`--only`: the previous results with the rows measured now replacing theirs (same model name, or same
    backend and variant for compile times) and every other row kept, with the run that measured it."""
    if previous is None:
        return measured
    legacy = {"setting": previous.get("setting")}  # rows written before each row carried its run
    if "run" in previous:
        legacy["run"] = previous["run"]

    def stamped(row: dict) -> dict:
        return row if "run" in row or "setting" in row else {**row, **legacy}

    def combine(old: list[dict], new: list[dict], key) -> list[dict]:
        fresh = {key(row): row for row in new}
        rows = [fresh.pop(key(row), None) or stamped(row) for row in old]
        return rows + list(fresh.values())

    return {
        "run": measured["run"],
        "setting": measured["setting"],
        "pairs": combine(previous.get("pairs", []), measured["pairs"], lambda r: r["model"]),
        "compile_time": combine(
            previous.get("compile_time", []), measured["compile_time"], lambda r: (r["backend"], r["variant"])
        ),
    }


def table_row(record: dict) -> str:
    """One row of the speed table, for a measured pair or the matrix-product floor."""
    name, baseline = record["model"], record["baseline"]
    if "matmul_floor" in record:
        floor = record["matmul_floor"]
        return (
            f"| {name} | {baseline} | — | {floor['matmul']:.4f} / {floor['baseline']:.4f} | "
            f"{floor['baseline'] / floor['matmul']:.2f} | — | — |"
        )
    params, fwd, step = record["params"], record["forward"], record.get("train_step")
    steps = "— | —" if step is None else (
        f"{step[name]:.4f} / {step[baseline]:.4f} | {step[baseline] / step[name]:.2f}"
    )  # fmt: skip
    return (
        f"| {name} | {baseline} | {params[name]:,} / {params[baseline]:,} | "
        f"{fwd[name]:.4f} / {fwd[baseline]:.4f} | {fwd[baseline] / fwd[name]:.2f} | {steps} |"
    )


def compile_row(record: dict) -> str:
    seconds = {int(k): v for k, v in record["seconds"].items()}
    label = "one nested compile region" if record["variant"] == "region" else "unrolled"
    return f"| {record['backend']} | {label} | {seconds[4]:.1f} | {seconds[24]:.1f} | {seconds[24] / seconds[4]:.2f} |"


def render(result: dict) -> str:
    """speed.md from speed.json: the latest run's header, then every row; rows kept from an earlier run (a
    `--only` rerun merged into them) are marked with a number that names that run below the table."""
    earlier: list[dict] = []

    def mark(row: dict) -> str:
        if row.get("run") == result["run"] and row.get("setting") == result["setting"]:
            return ""
        origin = {"run": row.get("run"), "setting": row.get("setting")}
        if origin not in earlier:
            earlier.append(origin)
        return f" [{earlier.index(origin) + 1}]"

    lines = [
        "# Speed: each family vs its baseline (same run)",
        "",
        *provenance.markdown_lines(result["run"]),
        f"Setting: {result['setting']}",
        "",
        "| model | baseline | params (model / baseline) | forward s/batch (model / baseline) | ratio | "
        "train step s/batch (model / baseline) | ratio |",
        "|---|---|---|---|---|---|---|",
    ]
    for row in result["pairs"]:
        cells = table_row(row)
        lines.append(cells.replace(f"| {row['model']} |", f"| {row['model']}{mark(row)} |", 1))
    lines += ["", "ratio = baseline time / model time (> 1: the model is faster than its baseline)."]
    lines += [f"{row['model']}: {row['note']}." for row in result["pairs"] if row.get("note")]
    for row in result["pairs"]:
        if "matmul_floor" in row:
            floor = row["matmul_floor"]
            lines.append(
                f"Matrix products: {floor['matmul']:.4f} s of Hyper-SET's {floor['model']:.4f} s forward "
                f"({100 * floor['matmul'] / floor['model']:.0f}%; forward ratio in that run "
                f"{floor['baseline'] / floor['model']:.2f})."
            )
    if "device cpu" in result["setting"]:
        lines.append(
            "On a CPU that runs other work the absolute times are noisy; the ratios, from interleaved runs, less so."
        )
    if result["compile_time"]:
        lines += [
            "",
            "## torch.compile time of Hyper-SET cifar10-small (first call minus a compiled one; batch 1, fullgraph, "
            "cold caches)",
            "",
            "| backend | layer step | T = 4 (s) | T = 24 (s) | T=24 / T=4 |",
            "|---|---|---|---|---|",
        ]
        for row in result["compile_time"]:
            cells = compile_row(row)
            lines.append(cells.replace(f"| {row['backend']} |", f"| {row['backend']}{mark(row)} |", 1))
    if earlier:
        lines += ["", "Rows kept from earlier runs (a later `--only` rerun replaced only its own rows):", ""]
        for index, origin in enumerate(earlier, 1):
            run = origin["run"]
            source = (
                f"`{run['command']}` ({run['date']}, commit {run['git_commit'] or 'unknown'}, torch {run['torch']})"
                if run
                else "a run that did not record its command"
            )
            lines.append(f"* [{index}] {source}; setting: {origin['setting']}")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    main()
