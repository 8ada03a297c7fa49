"""GPU speed of the three families against their baselines, in one run on whatever CUDA device is present.

Groups (model variants and their baseline, measured interleaved in the same process):

* Hyper-SET's bi-softmax attention alone (eager / sdpa / triton) vs one plain SDPA call of the same shape, at the
  two Hyper-SET shapes below (the shapes the fused kernel is tuned for);
* Hyper-SET `cifar10-small` (224²/16: 197 tokens, T = 12) vs HF `ViTForImageClassification` of the same width and
  heads and depth T (MLP 4d, SDPA);
* the same at patch 8 (785 tokens);
* HyperBF, the memo's CIFAR setting (`cifar` preset: D = 768, 4 heads, 4 blocks, 32²/4) vs ViT 768 × 4 heads ×
  4 layers (MLP 4D);
* iMixer-S/16 (n = 2) vs the same model with n = 0 (the MLP-Mixer);
* compile time: Hyper-SET `sudoku` (T = 24), no baseline.

Each family runs once per `attn_implementation` it accepts (Hyper-SET: eager / sdpa / triton, HyperBF: eager /
sdpa; a name the model rejects is recorded as skipped with transformers' message), each in eager mode,
`torch.compile`d and compiled with CUDA graphs (`mode="reduce-overhead"`: the fixed-T forward replayed as one
graph, CUDA only; a model with a graph break, which fails `fullgraph=True`, is measured with CUDA graphs between
its breaks and the row says why; the compiled modes measure fewer variants, `Variant.modes`: Hyper-SET's sdpa
implementation and the Sudoku group's other implementations run in eager mode only, and each group's compiled
passes come in the order of `Group.priority`, the T = 24 compile time first), for inference (`torch.inference_mode`, eval) and a training step (forward +
backward of the loss, train mode; no optimiser step). A model with `cached_centers` (HyperBF) is timed in inference
inside that block, as `energyformers.pipelines` and `energyformers evaluate` run it: what its centers give is computed
by the first call and reused by the timed ones, and its forward FLOPs leave that work out (compiled, the centers are
computed in every call: a compiled forward does not read the cache). Weights and inputs are bfloat16. Per variant
the table gives the median of `--repeats` interleaved calls (A, B, …, A, B, … so machine noise hits all alike)
after the first call and one warm-up call, throughput, the ratio baseline time / model time (> 1: the model is faster; same task and same
mode), the first-call time (with compilation for compiled variants), the peak memory of one call
above what was allocated before it (`torch.cuda.max_memory_allocated`), and FLOPs per image counted with
`torch.utils.flop_counter.FlopCounterMode` on the eager-implementation model (every matmul, convolution and
attention call, so iMixer's fixed-point iterations and power iterations count too). In the eager and compiled
modes (`--profile_modes`) one more call of every variant is profiled with `torch.profiler`: under each group's
table, the kernels that take the most device time and their total beside the call's median (the gap is launch
overhead), so a missed target comes with where its time goes.

    python benchmarks/gpu_speed.py                      # on a CUDA machine: results/gpu_speed.{json,md}
    python benchmarks/gpu_speed.py --device cpu --smoke # tiny configs, 1 repeat: checks the script, no numbers
    python benchmarks/gpu_speed.py --plan --resume benchmarks/results/gpu_speed.json  # what a run would measure

Without CUDA a real run exits with a message and writes nothing: CPU timings are benchmarks/speed.py's job, and
smoke-mode timings are not measurements (they go to `gpu_speed_smoke.{json,md}`, marked as such).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import gc
import json
import os
import platform
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

import torch
import torch.nn.functional as F
import transformers
from torch import nn
from torch.utils.flop_counter import FlopCounterMode
from transformers import (
    AutoModelForImageClassification,
    AutoModelForTokenClassification,
    ViTConfig,
    ViTForImageClassification,
)
from transformers.modeling_outputs import ImageClassifierOutput

import energyformers  # noqa: F401  (registers the families with the Auto classes)
from energyformers import HyperBFConfig, HyperSetConfig, IMixerConfig
from energyformers.center_cache import centers_scope
from energyformers.modeling.modeling_hyperset import ALL_ATTENTION_FUNCTIONS, check_attn_implementation

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package (benchmarks/gpu/run.sh runs it)

RESULTS = Path(__file__).parent / "results"
TASKS = ("inference", "train")
# "cuda-graphs": `torch.compile(mode="reduce-overhead")`, inductor with CUDA graphs over the fixed-T forward (every
# shape and the depth fixed, no host read inside the graph: the fullgraph tests in tests/test_compile.py); CUDA only
MODES = ("eager", "compiled", "cuda-graphs")


@dataclass
class Variant:
    """One model of a group: a builder (may raise ValueError: an attn_implementation the model rejects)."""

    name: str
    build: Callable[[], nn.Module]
    attn_implementation: str | None = None  # None: the model has no attention choice (or is the baseline)
    # raised when what the variant runs changes, so that --resume does not keep the old code's results
    revision: int = 0
    # the modes it is measured in (of those its group runs); a baseline runs in every mode of its group
    modes: tuple[str, ...] = MODES


@dataclass
class Group:
    name: str
    variants: list[Variant]
    baseline: Variant | None
    inputs: Callable[[int, torch.device], dict[str, torch.Tensor]]
    batch: int
    note: str = ""
    results: dict[str, Any] = field(default_factory=dict)
    modes: tuple[str, ...] = MODES
    # why some variants (or modes) are not measured, for the report beside `left_out()`
    left_out_why: str = ""
    # Order of the compiled and CUDA-graph passes (lowest first; eager goes over every group before them).
    # Compiles are slow and a run stopped by its time budget keeps what it measured (save() after every task), so
    # the most informative go first: the T = 24 compile time, then the model-vs-baseline ratios, the
    # attention-alone groups (a kernel against a kernel, which eager mode already measures) last.
    priority: int = 0
    # False: the compile workers (--compile_workers) never compile this group ahead of the main process, and
    # they start only after its compiled passes, so its first compiled call is measured cold and uncontended
    warm: bool = True

    def members(self, mode: str) -> list[Variant]:
        """The variants measured in `mode`, the baseline last; none when the group does not run `mode`."""
        if mode not in self.modes:
            return []
        variants = [variant for variant in self.variants if mode in variant.modes]
        return [*variants, *([self.baseline] if self.baseline else [])]

    def left_out(self) -> str:
        """What the group does not measure in which mode, for the report (empty when it measures everything)."""
        parts = [f"not measured in {mode} mode" for mode in MODES if mode not in self.modes]
        for variant in self.variants:
            missing = [mode for mode in self.modes if mode not in variant.modes]
            if missing:
                parts.append(f"{variant.name}: not in {' / '.join(missing)} mode")
        if not parts:
            return ""
        return "; ".join(parts) + (f" ({self.left_out_why})" if self.left_out_why else "")


def images(side: int, num_labels: int) -> Callable[[int, torch.device], dict[str, torch.Tensor]]:
    def make(batch: int, device: torch.device) -> dict[str, torch.Tensor]:
        return {
            "pixel_values": torch.randn(batch, 3, side, side, device=device),
            "labels": torch.randint(0, num_labels, (batch,), device=device),
        }

    return make


def attention_inputs(heads: int, tokens: int, head_dim: int) -> Callable[[int, torch.device], dict]:
    def make(batch: int, device: torch.device) -> dict[str, torch.Tensor]:
        hidden = F.normalize(torch.randn(batch, heads, tokens, head_dim, device=device), dim=-1)
        return {"hidden": hidden * head_dim**0.5, "labels": torch.zeros(batch, device=device)}  # RMS-normed z

    return make


def cells(length: int, vocab: int, num_labels: int) -> Callable[[int, torch.device], dict[str, torch.Tensor]]:
    def make(batch: int, device: torch.device) -> dict[str, torch.Tensor]:
        return {
            "input_ids": torch.randint(0, vocab, (batch, length), device=device),
            "labels": torch.randint(0, num_labels, (batch, length), device=device),
        }

    return make


def vit(width: int, heads: int, depth: int, image: int, patch: int, num_labels: int) -> Variant:
    config = ViTConfig(
        image_size=image, patch_size=patch, hidden_size=width, num_attention_heads=heads, num_hidden_layers=depth,
        intermediate_size=4 * width, num_labels=num_labels, attn_implementation="sdpa",
    )  # fmt: skip
    return Variant(f"ViT {width}×{heads}h×{depth} (sdpa)", lambda: ViTForImageClassification(config))


def family_variants(
    label: str,
    auto_class: type,
    config: Callable[[], transformers.PreTrainedConfig],
    implementations: tuple[str, ...],
    revisions: dict[str, int] | None = None,
    modes: dict[str, tuple[str, ...]] | None = None,
) -> list[Variant]:
    """One variant per attention implementation, built with `from_config(..., attn_implementation=name)`;
    `modes`: the modes of an implementation measured in fewer than all."""
    return [
        Variant(
            f"{label} ({name})",
            lambda name=name: auto_class.from_config(config(), attn_implementation=name),
            name,
            (revisions or {}).get(name, 0),
            (modes or {}).get(name, MODES),
        )
        for name in implementations
    ]


class AttentionAlone(nn.Module):
    """One attention call as a model, on Hyper-SET's inputs: z = x ⊙ g (a learned gain, so a training step
    differentiates q, k and v as in the model), q = z ⊙ c with the temperature folded into c, k = v = z; the loss
    of a training step is mean(out²). `function(q, k, v)` is a bi-softmax implementation (`keep` None) or one
    plain SDPA call of the same shape, the baseline the fused kernel is compared against."""

    def __init__(self, function: Callable, heads: int, head_dim: int) -> None:
        super().__init__()
        self.function = function
        self.input_gain = nn.Parameter(torch.ones(heads, 1, head_dim))
        self.gain = nn.Parameter(torch.full((heads, 1, head_dim), head_dim**-0.5))  # c with 1/√d_h folded in

    def forward(self, hidden: torch.Tensor, labels: torch.Tensor | None = None) -> ImageClassifierOutput:
        z = hidden * self.input_gain  # (B, H, N, d_h)
        out = self.function(z * self.gain, z, z)  # (B, H, N, d_h)
        loss = out.float().pow(2).mean() if labels is not None else None
        return ImageClassifierOutput(loss=loss, logits=out)


def bisoftmax_alone(name: str, heads: int, head_dim: int) -> Callable[[], nn.Module]:
    def build() -> nn.Module:
        # a ValueError where the implementation cannot run (triton without CUDA): the variant is recorded skipped
        check_attn_implementation(HyperSetConfig(), name)
        function = ALL_ATTENTION_FUNCTIONS[name]
        return AttentionAlone(lambda q, k, v: function(q, k, v, None)[0], heads, head_dim)

    return build


def one_sdpa_call(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
    """The baseline: plain softmax attention, scale 1 (the temperature is in q, as for the bi-softmax)."""
    return F.scaled_dot_product_attention(q, k, v, scale=1.0)


def per_optimizer_step_imixer(overrides: dict[str, Any]) -> Callable[[], nn.Module]:
    """iMixer-S/16 refining its spectral-norm estimates once per optimiser step instead of once per forward.

    The training step timed here has no optimiser step, so the weights never change: eager skips the power
    steps, compiled runs them and keeps the old estimates (a select, so the whole training forward is one graph
    and the cuda-graphs mode needs no split), so only the compiled rows time them.
    """

    def build() -> nn.Module:
        config = IMixerConfig.from_preset("s16", spectral_norm_schedule="per_optimizer_step", **overrides)
        if config.to_dict().get("spectral_norm_schedule") != "per_optimizer_step" or not hasattr(
            IMixerConfig(), "spectral_norm_schedule"
        ):  # an unknown keyword would silently become a plain attribute of the config
            raise ValueError("this IMixerConfig has no spectral_norm_schedule option")
        return AutoModelForImageClassification.from_config(config)

    return build


def groups(smoke: bool) -> list[Group]:
    """The benchmark groups; `smoke`: the same structure at tiny sizes (a CPU check of the script)."""
    if smoke:
        hyperset = dict(hidden_size=32, num_attention_heads=2, intermediate_size=32, num_iterations=2)
        side, coarse, fine, hyperbf_side = 32, 8, 4, 16
        hyperbf = dict(hidden_size=32, num_attention_heads=2, num_hidden_layers=2, image_size=16)
        imixer = dict(hidden_size=32, num_hidden_layers=2, image_size=32, patch_size=8)
        sudoku = dict(hidden_size=32, num_attention_heads=2, intermediate_size=32, num_iterations=4)
        batches = dict(coarse=2, fine=2, hyperbf=2, imixer=2, sudoku=2)
    else:
        hyperset, side, coarse, fine, hyperbf_side = {}, 224, 16, 8, 32
        hyperbf, imixer, sudoku = {}, {}, {}
        batches = dict(coarse=64, fine=16, hyperbf=256, imixer=64, sudoku=64)
    small = HyperSetConfig.from_preset("cifar10-small", **hyperset)
    iterations, width, heads = small.num_iterations, small.hidden_size, small.num_attention_heads
    depth = small.num_hidden_layers * iterations  # the ViT's depth: Hyper-SET's layer applications L·T
    bf = HyperBFConfig.from_preset("cifar", **hyperbf)
    sudoku_config = HyperSetConfig.from_preset("sudoku", **sudoku)
    hyperset_names = ("eager", "sdpa", "triton")
    hyperbf_names = ("eager", "sdpa")
    # Hyper-SET's sdpa implementation in eager mode only: the compiled modes measure its default (eager) and the
    # fused kernel (triton), the two a user would compile; sdpa, the slowest of the three in eager mode with the
    # most kernel launches per call, would only add compile time to the run's budget
    hyperset_modes = {"sdpa": ("eager",)}
    hyperset_revisions = dict.fromkeys(hyperset_names, 1)
    hyperset_why = (
        "the compiled modes measure the default implementation and the fused kernel; sdpa, the slowest in eager "
        "mode, is left out of them to spend the run's compile time on those two"
    )
    result = []
    head_dim = width // heads
    for key, patch in (("coarse", coarse), ("fine", fine)):
        tokens = (side // patch) ** 2 + 1
        result.append(
            Group(
                f"Bi-softmax attention alone, ({batches[key]}, {heads}, {tokens}, {head_dim}) vs one SDPA call",
                [
                    Variant(
                        f"bi-softmax ({name})",
                        bisoftmax_alone(name, heads, head_dim),
                        name,
                        modes=hyperset_modes.get(name, MODES),
                    )
                    for name in hyperset_names
                ],
                Variant("one SDPA call", lambda: AttentionAlone(one_sdpa_call, heads, head_dim)),
                attention_inputs(heads, tokens, head_dim),
                batches[key],
                note="target: the fused bi-softmax (triton) forward <= 3× one SDPA call of the same "
                "shape (ratio >= 0.33), forward + backward <= 3.5× (ratio >= 0.29)",
                left_out_why=hyperset_why,
                priority=5,  # a kernel against a kernel: eager mode measures the target
            )
        )
    for key, patch in (("coarse", coarse), ("fine", fine)):
        tokens = (side // patch) ** 2 + 1
        result.append(
            Group(
                f"Hyper-SET cifar10-small, {side}²/{patch} ({tokens} tokens, T={iterations})",
                family_variants(
                    "Hyper-SET",
                    AutoModelForImageClassification,
                    lambda patch=patch: HyperSetConfig.from_preset(
                        "cifar10-small", image_size=side, patch_size=patch, **hyperset
                    ),
                    hyperset_names,
                    hyperset_revisions,
                    hyperset_modes,
                ),
                vit(width, heads, depth, side, patch, 10),
                images(side, 10),
                batches[key],
                left_out_why=hyperset_why,
                priority={"coarse": 1, "fine": 3}[key],  # 197 tokens: the shape the fused kernel is tuned for
            )
        )
    result.append(
        Group(
            f"HyperBF cifar ({hyperbf_side}²/{bf.patch_size}, D={bf.hidden_size}, {bf.num_hidden_layers} blocks)",
            family_variants(
                "HyperBF",
                AutoModelForImageClassification,
                lambda: HyperBFConfig.from_preset("cifar", **hyperbf),
                hyperbf_names,
                revisions={"eager": 1, "sdpa": 2},
            ),
            vit(
                bf.hidden_size, bf.num_attention_heads, bf.num_hidden_layers, hyperbf_side, bf.patch_size, 10
            ),
            images(hyperbf_side, 10),
            batches["hyperbf"],
            priority=2,
        )
    )
    mixer = IMixerConfig.from_preset("s16", **imixer)
    result.append(
        Group(
            f"iMixer-S/16 (n={mixer.fixed_point_iterations}) vs Mixer (n=0)",
            [
                Variant("iMixer-S/16", lambda: AutoModelForImageClassification.from_config(mixer)),
                Variant("iMixer-S/16 (σ power steps per optimiser step)", per_optimizer_step_imixer(imixer)),
            ],
            Variant(
                "Mixer-S/16 (n=0)",
                lambda: AutoModelForImageClassification.from_config(
                    IMixerConfig.from_preset("s16", fixed_point_iterations=0, **imixer)
                ),
            ),
            images(mixer.image_size if isinstance(mixer.image_size, int) else mixer.image_size[0], 10),
            batches["imixer"],
            priority=4,
        )
    )
    result.append(
        Group(
            f"Hyper-SET sudoku (T={sudoku_config.num_iterations}): compile time",
            family_variants(
                "Hyper-SET sudoku",
                AutoModelForTokenClassification,
                lambda: HyperSetConfig.from_preset("sudoku", **sudoku),
                hyperset_names,
                hyperset_revisions,
                {"sdpa": ("eager",), "triton": ("eager",)},
            ),
            None,
            cells(sudoku_config.max_position_embeddings, sudoku_config.vocab_size, sudoku_config.num_labels),
            batches["sudoku"],
            note="target: compiling a T=24 model takes <= 30 s (first compiled call)",
            # no baseline to compare with, and the target is the first compiled call of the default
            # implementation: CUDA graphs and the other implementations compiled add nothing to it
            modes=("eager", "compiled"),
            left_out_why="the compile-time target is about the default implementation's first compiled call; "
            "with no baseline, CUDA graphs and the other implementations compiled add nothing to it",
            priority=0,  # the compile-time target: measured first
            # the target's first compiled call is a cold compile, measured without compile workers running
            warm=False,
        )
    )
    return result


# ------------------------------------------------------------------------------------------ measuring


def compile_runner(model: nn.Module, mode: str, backend: str, fullgraph: bool = True) -> Callable:
    """What `mode` calls: the model itself (eager), `torch.compile`d, or compiled with CUDA graphs (`fullgraph`
    False: CUDA graphs between graph breaks). The measurement and the compile workers both build their runners
    here: a worker's compile warms the main process's caches only for the identical graph and inductor config."""
    if mode == "compiled":
        return torch.compile(model, backend=backend, dynamic=False)
    if mode == "cuda-graphs":  # inductor's CUDA-graph trees replay the whole fixed-T forward
        return torch.compile(model, mode="reduce-overhead", fullgraph=fullgraph, dynamic=False)
    return model


def group_inputs(group: Group, batch: int, device: torch.device) -> dict[str, torch.Tensor]:
    """The group's inputs of one call, floating point in bfloat16 (the measurement's and the workers')."""
    torch.manual_seed(0)
    inputs = group.inputs(batch, device)
    return {k: v.to(torch.bfloat16) if v.is_floating_point() else v for k, v in inputs.items()}


# torch's counters of the on-disk compile caches, read around a first compiled call: whether it compiled (misses)
# or loaded an earlier compile of the same graph (hits), e.g. one a compile worker made
CACHE_COUNTERS = (
    ("inductor", "fxgraph_cache_hit"),
    ("inductor", "fxgraph_cache_miss"),
    ("aot_autograd", "autograd_cache_hit"),
    ("aot_autograd", "autograd_cache_miss"),
)


def cache_counts() -> dict[str, int]:
    from torch._dynamo.utils import counters

    return {name: counters[kind][name] for kind, name in CACHE_COUNTERS}


def cache_change(before: dict[str, int]) -> dict[str, int]:
    """The counters that moved since `before` (empty for a backend without these caches, e.g. aot_eager)."""
    after = cache_counts()
    return {name: after[name] - before[name] for name in after if after[name] != before[name]}


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_function(
    model: nn.Module,
    callable_model: Callable,
    inputs: dict[str, torch.Tensor],
    task: str,
    graphs: bool = False,
) -> Callable:
    """One call of `task`: inference (eval, inference mode, no labels) or a training step (forward + backward).

    `graphs`: the model replays CUDA graphs; each call starts a new step, so the graph trees may reuse the previous
    call's output memory although several models' graphs are replayed in turn (torch's advice for such loops).
    """
    features = {k: v for k, v in inputs.items() if k != "labels"}
    new_step = torch.compiler.cudagraph_mark_step_begin if graphs else lambda: None

    def infer() -> None:
        new_step()
        with torch.inference_mode():
            callable_model(**features)

    def train() -> None:
        new_step()
        callable_model(**inputs).loss.backward()
        model.zero_grad(set_to_none=True)

    return infer if task == "inference" else train


def inference_scope(model: nn.Module, task: str) -> contextlib.AbstractContextManager:
    """Where `task`'s calls of `model` run: inference of a model with `cached_centers` (HyperBF) inside it, the scope
    a pipeline call or an evaluation gives it (what the centers give computed once, by the first call, then reused);
    everything else as it is."""
    return centers_scope(model) if task == "inference" else contextlib.nullcontext()


def timed(function: Callable, device: torch.device) -> float:
    synchronize(device)
    start = time.perf_counter()
    function()
    synchronize(device)
    return time.perf_counter() - start


def cuda_graphs_available(device: torch.device) -> bool:
    return device.type == "cuda"


def first_calls(entry: dict[str, Any], call: Callable, device: torch.device) -> None:
    """The first call (with compilation, for compiled runners), a warm-up, and the peak memory of a third."""
    entry["first_call_s"] = timed(call, device)
    timed(call, device)
    entry["peak_memory_bytes"] = peak_memory(call, device)


def peak_memory(function: Callable, device: torch.device) -> int | None:
    """Bytes allocated at the peak of one call above what was allocated before it (CUDA only)."""
    if device.type != "cuda":
        return None
    synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    before = torch.cuda.memory_allocated(device)
    function()
    synchronize(device)
    return torch.cuda.max_memory_allocated(device) - before


# operators (kernels on CUDA) kept per profiled call: in the JSON, and the first few in the markdown
PROFILE_ROWS, PROFILE_ROWS_SHOWN = 12, 5


def profile_call(function: Callable, device: torch.device) -> dict[str, Any]:
    """Where one call's time goes, from `torch.profiler`: on CUDA the kernels with the most device time (a
    kernel's time counted once, whichever operator or Triton launch issued it), else the operators with the most
    CPU self time. `total_ms` over all of them beside the call's measured median says how much of the call is
    device work and how much launch overhead (the gap)."""
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if device.type == "cuda" else [])]
    synchronize(device)
    with profile(activities=activities) as profiler:
        function()
        synchronize(device)
    averages = profiler.key_averages()
    clock, events = "cpu operators", [e for e in averages if e.device_type == DeviceType.CPU]
    kernels = [e for e in averages if e.device_type == DeviceType.CUDA]
    if kernels:
        clock, events = "cuda kernels", kernels
    elif device.type == "cuda":  # no kernel rows (a profiler without CUPTI): the operators' device time
        clock = "operators' cuda time"
    time_of = (
        (lambda e: e.self_device_time_total) if device.type == "cuda" else (lambda e: e.self_cpu_time_total)
    )
    events = [e for e in events if time_of(e) > 0]
    total = sum(time_of(e) for e in events)  # microseconds
    top = sorted(events, key=time_of, reverse=True)[:PROFILE_ROWS]
    return {
        "clock": clock,
        "total_ms": total / 1e3,
        "count": sum(e.count for e in events),
        "top": [
            {"name": e.key[:200], "ms": time_of(e) / 1e3, "share": time_of(e) / total, "calls": e.count}
            for e in top
        ],
    }


def call_flops(model: nn.Module, inputs: dict[str, torch.Tensor]) -> tuple[float, float]:
    """FLOPs of one forward (eval) and of one training step (train: forward + backward) on all of `inputs`; the
    forward of a model with `cached_centers` as it is timed, inside that block after a call that filled it."""
    features = {k: v for k, v in inputs.items() if k != "labels"}
    model.eval()
    with contextlib.ExitStack() as stack:
        if hasattr(model, "cached_centers"):  # the cache needs no_grad; HyperBF counts there
            stack.enter_context(torch.no_grad())
            stack.enter_context(inference_scope(model, "inference"))
            model(**features)
        # (the others not under no_grad: there its module tracker trips on some models)
        with FlopCounterMode(display=False) as counter:
            model(**features)
    forward = counter.get_total_flops()
    model.train()
    with FlopCounterMode(display=False) as counter:
        model(**inputs).loss.backward()
    model.zero_grad(set_to_none=True)
    return float(forward), float(counter.get_total_flops())


def count_flops(model: nn.Module, inputs: dict[str, torch.Tensor], batch: int) -> dict[str, float]:
    """FLOPs per sample of a forward and of a training step (forward + backward) in a call of `batch` samples.

    Counted at batches 1 and 2: the difference is the per-sample work, the rest is work done once per call whatever
    the batch (HyperBF's centre projection in a training step; its inference reuses it, `inference_scope`), shared
    by the `batch` samples, as in the timed calls. Exact where the
    count is affine in the batch, as for every matmul, convolution and attention call here."""
    one = call_flops(model, {k: v[:1] for k, v in inputs.items()})
    two = call_flops(model, {k: v[:2] for k, v in inputs.items()}) if batch > 1 else (2 * one[0], 2 * one[1])
    per_sample = {
        task: (two[i] - one[i]) + (2 * one[i] - two[i]) / batch for i, task in enumerate(("forward", "train"))
    }
    return {**per_sample, "batch": batch}


def measure_group(
    group: Group,
    args: argparse.Namespace,
    device: torch.device,
    on_task: Callable[[dict[str, Any], str, str], None] | None = None,
    known: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Measure `group` in `args.modes` × `args.tasks` (each variant in the modes it runs in); `on_task(record,
    mode, task)` once each (mode, task) is timed for every variant, and again once its profiles are added, so the
    caller can save it before the next step starts. `known`: the group's results so far, whose FLOP counts are taken
    as they are (the count runs the model in float32 once more, and it does not depend on the mode)."""
    dtype = torch.bfloat16
    batch = args.batch or group.batch
    inputs = group_inputs(group, batch, device)
    workers: CompileWorkers | None = getattr(args, "workers", None)
    measured = {mode: {variant.name for variant in group.members(mode)} for mode in args.modes}
    members = [
        variant
        for variant in [*group.variants, *([group.baseline] if group.baseline else [])]
        if any(variant.name in names for names in measured.values())
    ]
    counted = {  # a count of another batch size (or from before counts named theirs) is counted again
        name: entry["flops"]
        for name, entry in (known or {}).get("variants", {}).items()
        if (entry.get("flops") or {}).get("batch") == batch
    }
    models: dict[str, nn.Module] = {}
    record: dict[str, Any] = {"batch": batch, "note": group.note, "variants": {}}
    if group.left_out():
        record["left_out"] = group.left_out()
    for variant in members:
        entry = record["variants"].setdefault(
            variant.name,
            {
                "attn_implementation": variant.attn_implementation,
                "baseline": variant is group.baseline,
                **({"revision": variant.revision} if variant.revision else {}),
            },
        )
        try:
            torch.manual_seed(0)
            model = variant.build()
        except (
            ValueError,
            ImportError,
            RuntimeError,
        ) as error:  # a name the model rejects, or cannot run here
            entry["skipped"] = f"{type(error).__name__}: {error}"
            print(f"  skip {variant.name}: {entry['skipped']}", flush=True)
            continue
        entry["params"] = sum(p.numel() for p in model.parameters())
        if variant.name in counted:
            entry["flops"] = copy.deepcopy(counted[variant.name])
        elif variant.attn_implementation in (None, "eager"):  # the eager math is the FLOP reference
            entry["flops"] = count_flops(model.to(device), {k: v.float() if v.is_floating_point() else v
                                                              for k, v in inputs.items()}, batch)  # fmt: skip
        models[variant.name] = model.to(device=device, dtype=dtype)
    flops = {name: record["variants"][name].get("flops") for name in models}
    family_flops = next(
        (f for name, f in flops.items() if f and not record["variants"][name]["baseline"]), None
    )
    for name in models:  # every implementation of a family does the eager variant's arithmetic
        if not record["variants"][name]["baseline"] and "flops" not in record["variants"][name]:
            record["variants"][name]["flops"] = family_flops

    for mode in args.modes:
        runners: dict[str, Callable] = {}
        if mode == "cuda-graphs" and not cuda_graphs_available(device):
            print(f"  mode {mode}: skipped, needs CUDA", flush=True)
            continue
        if not measured[mode]:  # a mode the group does not run
            continue
        for name, model in models.items():
            if name not in measured[mode]:
                continue
            runners[name] = compile_runner(model, mode, args.compile_backend)
        breaks: dict[str, str] = {}  # cuda-graphs: variants whose graph break failed fullgraph=True, and why
        for task in args.tasks:
            # each model's inference scope (`inference_scope`), open over its first, timed and profiled calls
            with contextlib.ExitStack() as scopes:
                calls: dict[str, Callable] = {}
                # from now on this process compiles these itself: no worker starts them
                if workers is not None:
                    workers.begin(group.name, mode, task)
                for name, model in models.items():
                    if name not in runners:
                        continue
                    model.train(task == "train")
                    scopes.enter_context(inference_scope(model, task))
                    entry = record["variants"][name].setdefault(mode, {}).setdefault(task, {})
                    call = step_function(model, runners[name], inputs, task, graphs=mode == "cuda-graphs")
                    if workers is not None and mode != "eager":
                        # whether a worker finished this compile before the first call: its first_call_s then
                        # loads the worker's compile from the caches on disk (a warm-cache figure)
                        entry["warm_cache"] = workers.warmed(WarmItem(group.name, mode, name, task))
                    before = cache_counts()
                    try:
                        first_calls(entry, call, device)
                    except Exception as error:  # record it (out of memory, a compile failure) and go on
                        entry["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                        print(f"  {name} {mode} {task}: {entry['error']}", flush=True)
                        if mode != "cuda-graphs" or name in breaks:
                            continue
                        # a graph break fails fullgraph=True: measure CUDA graphs between the breaks, saying why
                        breaks[name] = entry.pop("error")
                        runners[name] = compile_runner(model, mode, args.compile_backend, fullgraph=False)
                        call = step_function(model, runners[name], inputs, task, graphs=True)
                        try:
                            first_calls(entry, call, device)
                        except Exception as error:
                            entry["error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
                            print(f"  {name} {mode} {task} (split graphs): {entry['error']}", flush=True)
                            continue
                    change = cache_change(before)
                    if mode != "eager" and change:
                        entry["compile_cache"] = change
                    if name in breaks:
                        entry["graph_break"] = breaks[name]
                    calls[name] = call
                # the compile workers are stopped (SIGSTOP) while this process times and profiles: no worker's CPU
                # work or GPU kernels run beside the timed calls (benchmarks/gpu/README.md, "Compile workers")
                pause = workers.paused() if workers is not None else contextlib.nullcontext()
                with pause:
                    timed_and_profiled(calls, record, args, mode, task, batch, device, on_task)
        del runners
        torch._dynamo.reset()
    add_ratios(record, group.baseline.name if group.baseline else None)
    del models
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return record


def timed_and_profiled(
    calls: dict[str, Callable],
    record: dict[str, Any],
    args: argparse.Namespace,
    mode: str,
    task: str,
    batch: int,
    device: torch.device,
    on_task: Callable[[dict[str, Any], str, str], None] | None,
) -> None:
    """The interleaved timed repeats of `calls` (their first calls done), their medians into `record`, then one
    profiled call each (in `args.profile_modes`); `on_task` after the timings and again after the profiles."""
    times: dict[str, list[float]] = {name: [] for name in calls}
    for _ in range(args.repeats):
        for name, call in calls.items():  # each model keeps the train/eval mode set above
            times[name].append(timed(call, device))
    for name, samples in times.items():
        entry = record["variants"][name][mode][task]
        entry["median_s"] = statistics.median(samples)
        entry["samples_per_s"] = batch / entry["median_s"]
        print(f"  {name:40s} {mode:8s} {task:9s} {1e3 * entry['median_s']:9.2f} ms", flush=True)
    if on_task is not None:  # the timings saved before the profiles: a stop while profiling keeps them
        on_task(record, mode, task)
    profiled = calls if mode in args.profile_modes else {}
    for name, call in profiled.items():
        entry = record["variants"][name][mode][task]
        try:  # one more call, profiled: what the measured time is made of
            entry["profile"] = profile_call(call, device)
        except Exception as error:  # a profiler that cannot run here costs the profile, not the run
            entry["profile_error"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
    if on_task is not None and profiled:
        on_task(record, mode, task)  # again, with the profiles


def add_ratios(record: dict[str, Any], baseline: str | None) -> None:
    """ratio = baseline median / model median, same task and mode; `best` compares best mode with best mode."""
    if baseline is None:
        return
    base = record["variants"][baseline]
    for entry in record["variants"].values():
        if entry.get("baseline") or "skipped" in entry:
            continue
        for mode in MODES:
            for task in TASKS:
                own, other = entry.get(mode, {}).get(task, {}), base.get(mode, {}).get(task, {})
                if "median_s" in own and "median_s" in other:
                    own["ratio"] = other["median_s"] / own["median_s"]
    for task in TASKS:

        def best(entry: dict[str, Any], task: str = task) -> float | None:
            values = [entry.get(m, {}).get(task, {}).get("median_s") for m in MODES]
            values = [v for v in values if v is not None]
            return min(values) if values else None

        base_best = best(base)
        model_best = [
            best(e) for e in record["variants"].values() if not e.get("baseline") and "skipped" not in e
        ]
        model_best = [v for v in model_best if v is not None]
        if base_best is not None and model_best:
            record.setdefault("best_ratio", {})[task] = base_best / min(model_best)


# ------------------------------------------------------------------------------------------ compile workers


class WarmItem(NamedTuple):
    """One first compiled call a compile worker makes ahead of the main process."""

    group: str
    mode: str
    variant: str
    task: str

    def describe(self) -> str:
        return f"{self.group} / {self.mode} / {self.variant} / {self.task}"


def warm_items(passes: list[Pass], device: torch.device) -> list[WarmItem]:
    """The first compiled calls the run's compiled and CUDA-graph passes will make, in the order the main process
    makes them (pass by pass in priority order; within a pass, inference then training, variant by variant), so
    the workers warm first what the budget reaches first. Groups with `warm` False are left out."""
    items = []
    for mode, group, _, tasks in passes:
        if mode == "eager" or not group.warm or (mode == "cuda-graphs" and not cuda_graphs_available(device)):
            continue
        items += [WarmItem(group.name, mode, v.name, task) for task in tasks for v in group.members(mode)]
    return items


def default_compile_workers() -> int:
    """Half the CPU cores this process may use, at most 8: compiling is CPU-bound, and the main process keeps cores
    for itself."""
    return min(8, len(os.sched_getaffinity(0)) // 2)


def worker_command(args: argparse.Namespace, index: int) -> list[str]:
    """The command line of compile worker `index`: this script in its worker mode, with the run's settings that
    decide the graphs it compiles (the groups' sizes, batch, backend, device)."""
    return [
        sys.executable,
        str(Path(__file__).resolve()),
        "--compile_worker",
        str(index),
        "--compile_workers",
        str(args.compile_workers),
        "--device",
        args.device,
        "--compile_backend",
        args.compile_backend,
        *(["--smoke"] if args.smoke else []),
        *(["--batch", str(args.batch)] if args.batch else []),
    ]


class CompileWorkers:
    """`count` worker processes that make the first compiled call of the run's compiled passes ahead of the main
    process, filling inductor's caches on disk (FX graph, AOTAutograd, Triton) that the main process's own
    compile of the same (variant, task) then loads.

    The items are handed out one at a time from one queue in priority order (a free worker takes the next), and
    an item is not handed out once the main process has begun its (group, mode, task): the main process never
    waits for a worker, it compiles cold what is not warmed yet. Each worker's result (its own first-call
    seconds, cold, or the error) comes back on its stdout; only the main process writes result files. A worker
    that fails an item reports it on stderr (run.log) and goes on; one that dies leaves its share to the others.
    """

    def __init__(self, count: int, items: list[WarmItem], command: Callable[[int], list[str]]) -> None:
        self.count = count
        self.results: dict[WarmItem, dict[str, Any]] = {}
        self._queue = deque(items)
        self._begun: set[tuple[str, str, str]] = set()
        self._running: set[WarmItem] = set()
        self._lock = threading.Lock()
        self._command = command
        self._processes: list[subprocess.Popen] = []
        self._threads: list[threading.Thread] = []

    def start(self) -> None:
        # one compile thread per worker (no subprocess pool): N workers use about N cores, and a SIGSTOP to the
        # worker stops all of its compiling
        env = {**os.environ, "TORCHINDUCTOR_COMPILE_THREADS": "1", "PYTHONUNBUFFERED": "1"}
        for index in range(self.count):
            process = subprocess.Popen(
                self._command(index), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, text=True
            )
            self._processes.append(process)
            thread = threading.Thread(target=self._feed, args=(index, process), daemon=True)
            thread.start()
            self._threads.append(thread)
        print(
            f"compile workers: {self.count} started, {len(self._queue)} first compiled calls to warm",
            flush=True,
        )

    def _next(self) -> WarmItem | None:
        with self._lock:
            while self._queue:
                item = self._queue.popleft()
                if (item.group, item.mode, item.task) not in self._begun:
                    self._running.add(item)
                    return item
        return None

    def idle(self) -> bool:
        """Whether no worker has more to do: every item handed out has its result, and no item is left or no
        worker is left to take it."""
        # no caller in the benchmark: tests/test_gpu_speed_smoke.py waits on it to make the worker race deterministic
        with self._lock:
            left = bool(self._queue) and any(thread.is_alive() for thread in self._threads)
            return not self._running and not left

    def _feed(self, index: int, process: subprocess.Popen) -> None:
        """Hand worker `index` one item at a time and collect its results, until the queue is empty."""
        item = None
        try:
            while (item := self._next()) is not None:
                process.stdin.write(json.dumps(item._asdict()) + "\n")
                process.stdin.flush()
                line = process.stdout.readline()
                if not line:
                    raise EOFError("it exited")
                with self._lock:
                    self.results[item] = json.loads(line)
                    self._running.discard(item)
            process.stdin.close()  # the worker exits at the end of its input
        except (OSError, EOFError, ValueError) as error:
            if process.poll() is None and item is not None:
                time.sleep(0.5)  # a worker dying: let its exit status arrive
            what = f"while warming {item.describe()}" if item is not None else ""
            print(
                f"[compile worker {index}] stopped {what} ({type(error).__name__}: {error}; exit status "
                f"{process.poll()}); the other workers and the main process go on",
                file=sys.stderr,
                flush=True,
            )
            if item is not None:
                with self._lock:
                    self.results.setdefault(item, {"error": f"the worker stopped ({type(error).__name__})"})
                    self._running.discard(item)

    def begin(self, group: str, mode: str, task: str) -> None:
        """The main process begins (group, mode, task): its items are no longer handed to a worker."""
        with self._lock:
            self._begun.add((group, mode, task))

    def warmed(self, item: WarmItem) -> bool:
        with self._lock:
            return "first_call_s" in self.results.get(item, {})

    def _signal(self, number: int) -> None:
        for process in self._processes:
            if process.poll() is None:
                with contextlib.suppress(ProcessLookupError):
                    process.send_signal(number)

    @contextlib.contextmanager
    def paused(self) -> Iterator[None]:
        """The workers stopped (SIGSTOP) inside the block and continued after it: the main process times and
        profiles with no worker running on the CPU or launching on the GPU. Stopping is instant, so the main
        process waits for nothing; a stopped worker's item just takes longer."""
        self._signal(signal.SIGSTOP)
        try:
            yield
        finally:
            self._signal(signal.SIGCONT)

    def annotate(self, records: dict[str, Any], run: int) -> None:
        """Put each worker result beside the main process's measurement of the same item (this run's), as
        `worker`: the worker's own cold first-call seconds and how many workers were compiling, or its error."""
        with self._lock:
            results = dict(self.results)
        for item, result in results.items():
            timing = (
                records.get(item.group, {}).get("variants", {}).get(item.variant, {}).get(item.mode, {})
            ).get(item.task)
            if timing is not None and timing.get("run") == run:
                timing["worker"] = result

    def stop(self) -> None:
        """End the workers (at the end of the run, or when it is stopped): continued, terminated, killed."""
        self._signal(signal.SIGCONT)
        self._signal(signal.SIGTERM)
        for process in self._processes:
            try:
                process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        for thread in self._threads:
            thread.join(timeout=5)


def die_with_parent() -> None:
    """Ask Linux to kill this process when its parent dies (prctl PR_SET_PDEATHSIG): a worker never outlives the
    main process, whatever stopped it (the stage's timeout kills the process group too)."""
    if not sys.platform.startswith("linux"):
        return
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # 1: PR_SET_PDEATHSIG


def compile_worker(args: argparse.Namespace) -> None:
    """The worker mode (--compile_worker INDEX): read items (JSON lines) from stdin, make each one's first
    compiled call exactly as the measurement does, and write the result (JSON line) to the original stdout."""
    die_with_parent()
    if os.getppid() == 1:  # the parent died before the request took effect
        return
    protocol = os.fdopen(os.dup(1), "w", buffering=1)
    os.dup2(2, 1)  # anything else printed goes to stderr (run.log), not into the results
    device = torch.device(args.device)
    if device.type == "cuda":  # the workers together at most half the device: the main process keeps the rest
        torch.cuda.set_per_process_memory_fraction(0.5 / args.compile_workers, device)
    definitions = {group.name: group for group in groups(args.smoke)}
    for line in sys.stdin:
        item = WarmItem(**json.loads(line))
        protocol.write(json.dumps(warm_one(item, definitions, args, device)) + "\n")


def warm_one(
    item: WarmItem, definitions: dict[str, Group], args: argparse.Namespace, device: torch.device
) -> dict[str, Any]:
    """One item's first compiled call, as `measure_group` makes it (same model, inputs, dtype, train/eval mode,
    runner and call); the model is freed afterwards. A failure is reported on stderr and returned, never raised."""
    result: dict[str, Any] = {"workers": args.compile_workers}
    model = runner = call = None
    stack = contextlib.ExitStack()
    try:
        group = definitions[item.group]
        variant = next(v for v in group.members(item.mode) if v.name == item.variant)
        inputs = group_inputs(group, args.batch or group.batch, device)
        try:
            torch.manual_seed(0)
            model = variant.build().to(device=device, dtype=torch.bfloat16)
        except (ValueError, ImportError, RuntimeError) as error:  # skipped by the measurement as well
            return {**result, "skipped": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"}
        model.train(item.task == "train")
        stack.enter_context(inference_scope(model, item.task))  # as the measurement calls it
        graphs = item.mode == "cuda-graphs"
        runner = compile_runner(model, item.mode, args.compile_backend)
        call = step_function(model, runner, inputs, item.task, graphs=graphs)
        before = cache_counts()
        try:
            result["first_call_s"] = timed(call, device)
        except Exception as error:
            if not graphs:
                raise
            # as the measurement does: a graph break fails fullgraph=True, so CUDA graphs between the breaks
            result["graph_break"] = f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"
            torch._dynamo.reset()
            runner = compile_runner(model, item.mode, args.compile_backend, fullgraph=False)
            call = step_function(model, runner, inputs, item.task, graphs=True)
            result["first_call_s"] = timed(call, device)
        result["compile_cache"] = cache_change(before)
        print(f"[compile worker {args.compile_worker}] warmed {item.describe()}: {result['first_call_s']:.1f} s",
              file=sys.stderr, flush=True)  # fmt: skip
    except Exception as error:
        result["error"] = f"{type(error).__name__}: {(str(error).splitlines() or [''])[0][:300]}"
        print(
            f"[compile worker {args.compile_worker}] {item.describe()}: failed, not warmed ({result['error']})",
            file=sys.stderr,
            flush=True,
        )
    finally:
        stack.close()
        del model, runner, call
        torch._dynamo.reset()
        gc.collect()
        if device.type == "cuda":
            torch.cuda.empty_cache()
    return result


# ------------------------------------------------------------------------------------------ report


def environment(device: torch.device) -> dict[str, Any]:
    try:
        import triton

        triton_version = triton.__version__
    except ImportError:
        triton_version = None
    return {
        "device": torch.cuda.get_device_name(device)
        if device.type == "cuda"
        else f"CPU ({platform.machine()})",
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "triton": triton_version,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }


def _cell(entry: dict[str, Any], key: str, scale: float = 1.0, fmt: str = "{:.2f}") -> str:
    value = entry.get(key)
    return "–" if value is None else fmt.format(value * scale)


# What a run records of provenance.run_info beside its number, start ("started": run_info's date), command,
# repeats and compile workers (runs recorded before they did so lack them)
RUN_INFO_KEYS = ("git_commit", "torch", "transformers", "python", "machine", "device", "seed")


def run_line(run: dict[str, Any]) -> str:
    started = run.get("started") or "date not recorded"
    commit = f", commit {run['git_commit'] or 'unknown'}" if "git_commit" in run else ""
    workers = f", {run['compile_workers']} compile workers" if run.get("compile_workers") else ""
    return (
        f"run {run['run']} ({started}{commit}): `{run.get('command')}`, repeats {run.get('repeats')}{workers}"
    )


def worker_cell(timing: dict[str, Any]) -> str:
    """A compile worker's own first call of the item: its seconds (cold), `failed`, or `–` (none made)."""
    worker = timing.get("worker") or {}
    if "first_call_s" in worker:
        return f"{worker['first_call_s']:.2f}"
    return "failed" if "error" in worker else "–"


def first_call_cell(timing: dict[str, Any]) -> str:
    """The main process's first call; `(w)` where a compile worker had compiled the item before it."""
    return _cell(timing, "first_call_s") + (" (w)" if timing.get("warm_cache") else "")


def markdown(report: dict[str, Any]) -> str:
    env = report["environment"]
    runs = report.get("runs") or []
    several = len(runs) > 1  # then each row says which run measured it
    repeats = {run.get("repeats") for run in runs} or {report["repeats"]}
    if report["smoke"]:
        title = "# gpu_speed.py SMOKE RUN — tiny configs, checks the script; these are not measurements"
    elif several:
        title = f"# GPU speed: each family vs its baseline ({len(runs)} runs on one device)"
    else:
        title = "# GPU speed: each family vs its baseline (one run)"
    if several:  # a later run (--resume) measured only what the earlier ones had not
        header = [
            "Runs, each measuring what the earlier ones had not (the tables' run column says which measured a row):",
            "",
            *(f"- {run_line(run)}" for run in runs),
            "",
        ]
    elif runs and "git_commit" in runs[0]:
        workers = runs[0].get("compile_workers")
        command, details = provenance.markdown_lines({**runs[0], "date": runs[0]["started"]})
        header = [command, details + "  ", *([f"Compile workers: {workers}.  "] if workers else [])]
    elif runs:
        workers = runs[0].get("compile_workers")
        header = [
            f"Command: `{runs[0]['command']}` ({runs[0]['started'] or 'date not recorded'})"
            + (f", {workers} compile workers" if workers else "")
            + "  "
        ]
    else:
        header = [f"Command: `{report['command']}`  "]
    lines = [
        title,
        "",
        *header,
        f"Device: {env['device']}; torch {env['torch']} (CUDA {env['cuda']}), triton {env['triton']}, "
        f"transformers {env['transformers']}  ",
        "Setting: bfloat16 weights and inputs; median of "
        + (f"{next(iter(repeats))}" if len(repeats) == 1 else "each run's number of")
        + f" interleaved repeats after the first call and one warm-up; compile backend "
        f"`{report['compile_backend']}`; train = forward + backward (no optimiser step).",
        "",
        "HyperBF inference runs inside `model.cached_centers()`, as a pipeline call and `energyformers evaluate` run "
        "it: what its centers give is computed by the first call and reused by the timed ones (compiled, every call "
        "computes it), and its forward GFLOP/sample leave that work out.",
        "",
        "ratio = baseline time / model time, same task and mode (> 1: the model is faster). "
        "first call includes compilation. peak = `max_memory_allocated` of one call above what was allocated "
        "before it. GFLOP/sample: `FlopCounterMode`, eager implementation, forward / training step, per sample of "
        "a call of the group's batch (work done once per call, such as HyperBF's centre projection in a training "
        "step, shared by its samples).",
        "",
    ]  # fmt: skip
    timings = [
        timing
        for group in report["groups"].values()
        for entry in group["variants"].values()
        for mode in MODES
        for timing in entry.get(mode, {}).values()
    ]
    if any("worker" in timing or "warm_cache" in timing for timing in timings):
        lines += [
            'Compile workers (`--compile_workers`; benchmarks/gpu/README.md, "Compile workers"): once the eager '
            "passes and the compile-time group are done, worker processes make the compiled passes' first "
            "compiled calls ahead of the measuring process, in priority order, filling inductor's caches on disk. "
            "**first call s** is the measuring process's own first call: marked (w) where a worker had compiled "
            "the same variant and task before it, so it is a warm-cache figure (tracing and loading the compiled "
            "graph), not a compile time; unmarked, it compiled cold, beside the running workers. **worker first "
            "call s** is the worker's own first call, a cold compile made while up to the run's other workers "
            "compiled too (– where no worker made it). The compile-time group (T = 24) is never warmed: its "
            "first call is cold and made before any worker starts.",
            "",
        ]
    for name, group in report["groups"].items():
        lines += [f"## {name}", "", f"batch {group['batch']}. {group['note']}".rstrip(), ""]
        if group.get("left_out"):  # a variant not measured in a mode has no row for it
            lines += [f"Not measured: {group['left_out']}.", ""]
        if "best_ratio" in group:
            best = ", ".join(f"{task} {ratio:.2f}×" for task, ratio in group["best_ratio"].items())
            lines += [f"Best mode of the family vs best mode of the baseline: {best}.", ""]
        warmed = any(  # the group has figures of compile workers: their column
            "worker" in timing
            for entry in group["variants"].values()
            for mode in MODES
            for timing in entry.get(mode, {}).values()
        )
        lines += [
            "| variant | mode | inference ms | samples/s | ratio | train ms | samples/s | ratio | "
            "first call s (inf / train) | "
            + ("worker first call s (inf / train) | " if warmed else "")
            + "peak MiB (inf / train) | GFLOP/sample (fwd / train) |"
            + (" run (inf / train) |" if several else ""),
            "|---|---|---|---|---|---|---|---|---|---|---|"
            + ("---|" if several else "")
            + ("---|" if warmed else ""),
        ]
        for variant, entry in group["variants"].items():
            if "skipped" in entry:
                lines.append(
                    f"| {variant} | skipped: {entry['skipped'][:160]} |" + " |" * (9 + several + warmed)
                )
                continue
            flops = entry.get("flops") or {}
            gflop = "–" if not flops else f"{flops['forward'] / 1e9:.3g} / {flops['train'] / 1e9:.3g}"
            for mode in MODES:
                if mode not in entry:
                    continue
                inf, train = entry[mode].get("inference", {}), entry[mode].get("train", {})
                error = inf.get("error") or train.get("error")
                split = inf.get("graph_break") or train.get("graph_break")
                peak = " / ".join(
                    "–" if e.get("peak_memory_bytes") is None else f"{e['peak_memory_bytes'] / 2**20:.0f}"
                    for e in (inf, train)
                )
                first = f"{first_call_cell(inf)} / {first_call_cell(train)}"
                if warmed:
                    first += f" | {worker_cell(inf)} / {worker_cell(train)}"
                lines.append(
                    f"| {variant} | {mode} | {_cell(inf, 'median_s', 1e3)} | "
                    f"{_cell(inf, 'samples_per_s', fmt='{:.0f}')} | {_cell(inf, 'ratio')} | "
                    f"{_cell(train, 'median_s', 1e3)} | {_cell(train, 'samples_per_s', fmt='{:.0f}')} | "
                    f"{_cell(train, 'ratio')} | {first} | {peak} | "
                    f"{gflop} |"
                    + (f" {run_cell(inf, train)} |" if several else "")
                    + (f" error: {error[:160]}" if error else "")
                    + (f" graph break, so CUDA graphs between breaks: {split[:160]}" if split else "")
                )
        lines += ["", *profile_lines(group, several)]
    return "\n".join(lines)


def run_cell(inference: dict[str, Any], train: dict[str, Any]) -> str:
    """The run that measured a row: one number when both tasks come from it, else inference / train."""
    runs = [str(timing.get("run", "–")) for timing in (inference, train)]
    return runs[0] if runs[0] == runs[1] else " / ".join(runs)


def profile_lines(group: dict[str, Any], several_runs: bool = False) -> list[str]:
    """The group's profiles as a list: per variant, mode and task the largest shares of one profiled call
    (`several_runs`: each says its run)."""
    lines = []
    for variant, entry in group["variants"].items():
        for mode in MODES:
            for task in TASKS:
                timing = entry.get(mode, {}).get(task, {})
                if "profile_error" in timing:
                    lines.append(f"- {variant}, {mode}, {task}: no profile ({timing['profile_error'][:160]})")
                if "profile" not in timing:
                    continue
                profile = timing["profile"]
                top = "; ".join(
                    f"{row['share']:.0%} `{row['name'][:70]}` ({row['calls']}×)"
                    for row in profile["top"][:PROFILE_ROWS_SHOWN]
                )
                run = f" (run {timing.get('run', '–')})" if several_runs else ""
                lines.append(
                    f"- {variant}, {mode}, {task}{run}: {profile['total_ms']:.2f} ms in {profile['count']} "
                    f"{profile['clock']} (call median {_cell(timing, 'median_s', 1e3)} ms): {top}"
                )
    if not lines:
        return []
    heading = (
        "Where the time goes: one more call of each, profiled (`torch.profiler`); the largest shares of the "
        "kernels' device time on CUDA (of the operators' CPU self time without CUDA). A total well below the "
        "call's median is time the GPU waits for launches."
    )
    return [heading, "", *lines, ""]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument(
        "--device", default="cuda", help="cuda (default; a real run needs it) or cpu (--smoke only)"
    )
    parser.add_argument(
        "--smoke", action="store_true", help="tiny configs, 1 repeat: check the script end to end"
    )
    parser.add_argument(
        "--repeats", type=int, default=None, help="interleaved timed calls (default 20; smoke 1)"
    )
    parser.add_argument(
        "--batch", type=int, default=None, help="one batch size for every group (default per group)"
    )
    parser.add_argument(
        "--modes", nargs="+", choices=MODES, default=list(MODES), help="cuda-graphs runs on CUDA only"
    )
    parser.add_argument("--tasks", nargs="+", choices=TASKS, default=list(TASKS))
    parser.add_argument(
        "--groups", nargs="+", default=None, help="only groups whose name contains one of these"
    )
    parser.add_argument(
        "--compile_backend",
        default=None,
        help="torch.compile backend (default inductor; smoke: aot_eager — AOT autograd without codegen, so the compiled training step is traced as under inductor; plain eager cannot differentiate the reused iteration region)",
    )
    parser.add_argument(
        "--profile_modes",
        nargs="*",
        choices=MODES,
        default=["eager", "compiled"],
        help="modes in which one more call of every variant is profiled (torch.profiler: where the time goes); "
        "none: --profile_modes with no value. CUDA graphs replay as one launch, so their profile says little",
    )
    parser.add_argument("--output_dir", type=Path, default=RESULTS)
    parser.add_argument(
        "--plan",
        action="store_true",
        help="print the passes (mode, group, tasks, variants) this run would measure, in order, and exit without "
        "measuring or writing; with --resume, as on the device and software that file was measured on",
    )
    parser.add_argument(
        "--resume",
        type=Path,
        default=None,
        metavar="GPU_SPEED_JSON",
        help="an earlier run's gpu_speed.json: what it measured (on the same device, torch, CUDA, Triton and "
        "transformers; smoke with smoke) is kept as it is and not measured again; the output has both, each row "
        "marked with its run. A file of another device or software is ignored, saying why",
    )
    parser.add_argument(
        "--compile_workers",
        type=compile_workers_value,
        default=None,
        metavar="N",
        help="processes that make the compiled passes' first compiled calls ahead of this one, in priority "
        "order, so that its own compiles load them from inductor's caches on disk (started once the eager "
        "passes and the compile-time group's cold compile are done; benchmarks/gpu/README.md, 'Compile "
        f"workers'); 0: none. Default: half the CPU cores, at most 8 (here {default_compile_workers()}); smoke: 0",
    )
    # the worker mode, started by the run itself (CompileWorkers), not by hand
    parser.add_argument("--compile_worker", type=int, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.compile_workers is None:
        args.compile_workers = 0 if args.smoke else default_compile_workers()
    if args.repeats is None:
        args.repeats = 1 if args.smoke else 20
    if args.compile_backend is None:
        args.compile_backend = "aot_eager" if args.smoke else "inductor"
    for name, value in (("--repeats", args.repeats), ("--batch", args.batch)):
        if value is not None and value < 1:
            parser.error(f"{name} must be an integer >= 1; got {value}")
    args.previous = None
    if args.resume is not None:  # read before any work: a bad file stops the run, not its last step
        try:
            args.previous = json.loads(args.resume.read_text())
        except (OSError, UnicodeDecodeError, json.JSONDecodeError) as error:
            parser.error(
                f"--resume {args.resume}: cannot read it ({type(error).__name__}: {error}); give the "
                "gpu_speed.json (or gpu_speed_smoke.json) an earlier run of this script wrote"
            )
        problem = resume_problem(args.previous)
        if problem:
            parser.error(
                f"--resume {args.resume}: not a result of this script ({problem}); give the gpu_speed.json "
                "(or gpu_speed_smoke.json) an earlier run of this script wrote"
            )
    return args


def compile_workers_value(text: str) -> int:
    """--compile_workers: an integer >= 0 (argparse names the flag and the value when this raises)."""
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"must be an integer >= 0 (0: no compile workers); got {text!r}"
        ) from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be an integer >= 0 (0: no compile workers); got {value}")
    return value


def resume_problem(previous: Any) -> str | None:
    """What makes `previous` (JSON read for --resume) unusable as an earlier result, or None."""
    if not isinstance(previous, dict):
        return f"a JSON {type(previous).__name__}, not an object"
    if not isinstance(previous.get("environment"), dict) or "device" not in previous["environment"]:
        return "no environment with a device"
    if not isinstance(previous.get("groups"), dict):
        return "no groups"
    for name, group in previous["groups"].items():
        if not isinstance(group, dict) or not isinstance(group.get("variants"), dict):
            return f"group {name!r} has no variants"
        for variant, entry in group["variants"].items():
            modes = [entry.get(mode, {}) for mode in MODES] if isinstance(entry, dict) else [None]
            if not all(isinstance(m, dict) and all(isinstance(t, dict) for t in m.values()) for m in modes):
                return f"group {name!r}, variant {variant!r}: not an object of modes and tasks"
    runs = previous.get("runs", [])
    if not isinstance(runs, list) or not all(
        isinstance(r, dict) and isinstance(r.get("run"), int) for r in runs
    ):
        return "runs is not a list of numbered runs"
    return None


def print_plan(args: argparse.Namespace) -> list[Pass]:
    """--plan: the passes a run with these arguments would do, printed; nothing is measured or written."""
    definitions = groups(args.smoke)
    report: dict[str, Any] = {"groups": {}, "runs": []}
    if args.previous is not None:
        adopt(report, args.previous, definitions, args.batch, args.resume)
    selected = [g for g in definitions if not args.groups or any(p in g.name for p in args.groups)]
    passes = plan_passes(selected, args.modes, args.tasks, report["groups"])
    workers = args.compile_workers
    print("passes in order (mode, group: tasks to measure [kept]; variants measured):")
    for number, (mode, group, kept, tasks) in enumerate(passes, start=1):
        names = ", ".join(variant.name for variant in group.members(mode))
        todo = ", ".join(tasks) or "nothing"
        print(f"{number:2d}. {mode} {group.name}: {todo}" + (f" [kept: {', '.join(kept)}]" if kept else ""))
        if tasks:
            print(f"      {names}")
        if tasks and mode != "eager" and workers:
            print(
                f"      warmed ahead by the compile workers ({workers})"
                if group.warm
                else "      not warmed: compiled cold by this process before the compile workers start"
            )
    if workers:
        # (the CUDA-graph items are warmed on CUDA only, as those passes run there only)
        items = warm_items(passes, torch.device("cuda"))
        print(f"compile workers: {workers}, warming {len(items)} first compiled calls in this order:")
        for number, item in enumerate(items, start=1):
            print(f"  {number:2d}. {item.describe()}")
    else:
        print("compile workers: none (--compile_workers 0): every compile is made by this process")
    return passes


def main(argv: list[str] | None = None) -> dict[str, Any] | list[Pass]:
    args = parse_args(argv)
    if args.compile_worker is not None:
        compile_worker(args)
        return {}
    if args.plan:
        return print_plan(args)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise SystemExit(
            "gpu_speed.py: no CUDA device is available (torch.cuda.is_available() is False), so nothing was "
            "measured and no result was written. Run it on a machine with a GPU; to check the script on CPU "
            "use --device cpu --smoke (CPU timings: benchmarks/speed.py)."
        )
    if device.type != "cuda" and not args.smoke:
        raise SystemExit(
            f"gpu_speed.py: --device {args.device} is only for --smoke (a check of the script, not a "
            "measurement); CPU timings are benchmarks/speed.py's job."
        )
    env = environment(device)
    info = provenance.run_info(seed=0, argv=argv, script=__file__, device=env["device"])
    report: dict[str, Any] = {
        "command": info["command"],
        "smoke": args.smoke,
        "environment": env,
        "repeats": args.repeats,
        "compile_backend": args.compile_backend,
        "dtype": "bfloat16",
        "runs": [],
        "groups": {},
    }
    definitions = groups(args.smoke)
    if args.previous is not None:
        reason = resume_mismatch(args.previous, report)
        if reason:
            print(f"--resume {args.resume}: ignored, nothing is kept from it: {reason}", flush=True)
        else:
            adopt(report, args.previous, definitions, args.batch, args.resume)
    run = max((r["run"] for r in report["runs"]), default=0) + 1
    this_run = {
        "run": run,
        "started": info["date"],
        "command": report["command"],
        "repeats": args.repeats,
        **{key: info[key] for key in RUN_INFO_KEYS},
        "compile_workers": 0,  # how many were started (none when nothing was left to warm)
    }
    report["run"] = run
    selected = [
        group
        for group in definitions
        if not args.groups or any(pattern in group.name for pattern in args.groups)
    ]
    stem = "gpu_speed_smoke" if args.smoke else "gpu_speed"
    order = [group.name for group in definitions]
    passes = plan_passes(selected, args.modes, args.tasks, report["groups"])
    pending = [(group.name, mode, task) for mode, group, _, tasks in passes for task in tasks]

    items = warm_items(passes, device) if args.compile_workers else []
    # the workers start before the first pass after every eager pass and every pass of a group kept cold
    # (Group.warm False: the T = 24 compile time, first in priority order), so those run without them
    cold = [n for n, p in enumerate(passes) if p.tasks and (p.mode == "eager" or not p.group.warm)]
    start_at = max(cold, default=-1) + 1
    workers: CompileWorkers | None = None

    def save() -> None:
        report["complete"] = not pending
        if workers is not None:
            workers.annotate(report["groups"], run)
        write_report(report, args.output_dir, stem, pending, order)

    def on_task(group: Group, record: dict[str, Any], mode: str, task: str) -> None:
        if this_run not in report["runs"]:  # a run joins the list with its first measurement
            report["runs"].append(this_run)
        merge_task(report["groups"], group, record, mode, task, run)
        if (group.name, mode, task) in pending:  # (a task is saved again once its profiles are added)
            pending.remove((group.name, mode, task))
        save()  # after every (group, mode, task): a run stopped by its budget keeps what it measured

    def measure_pass(mode: str, group: Group, kept: list[str], tasks: list[str]) -> None:
        if kept:
            runs = sorted({runs_of(report["groups"][group.name], mode, task) for task in kept})
            print(
                f"{group.name} [{mode}]: {', '.join(kept)} kept from run {', '.join(runs)} (--resume)",
                flush=True,
            )
        if not tasks:
            return
        print(f"{group.name} [{mode}]" + (f": {', '.join(tasks)}" if kept else ""), flush=True)
        pass_args = argparse.Namespace(**{**vars(args), "modes": [mode], "tasks": tasks})
        # the FLOPs counted by an earlier pass (of this run or a kept one) are not counted again
        measure_group(
            group, pass_args, device, functools.partial(on_task, group), report["groups"].get(group.name)
        )
        # a mode this device cannot run (CUDA graphs without CUDA) is passed over, not left pending
        pending[:] = [p for p in pending if p[:2] != (group.name, mode)]

    cache_dir = None
    if items and "TORCHINDUCTOR_CACHE_DIR" not in os.environ:
        # one cache folder for this run, shared with the workers, and new: cold compiles are cold
        cache_dir = tempfile.mkdtemp(prefix="gpu-speed-inductor-")
        os.environ["TORCHINDUCTOR_CACHE_DIR"] = cache_dir
    try:
        for number, (mode, group, kept, tasks) in enumerate(passes):
            if number == start_at and items:
                workers = CompileWorkers(
                    min(args.compile_workers, len(items)), items, functools.partial(worker_command, args)
                )
                this_run["compile_workers"] = workers.count
                if tasks:  # this process compiles the pass's first task at once: no worker starts it too
                    workers.begin(group.name, mode, tasks[0])
                workers.start()
            args.workers = workers
            measure_pass(mode, group, kept, tasks)
    finally:
        if workers is not None:
            workers.stop()
        if cache_dir is not None:
            del os.environ["TORCHINDUCTOR_CACHE_DIR"]
            shutil.rmtree(cache_dir, ignore_errors=True)
    save()
    print(f"wrote {args.output_dir / stem}.{{json,md}}")
    return report


class Pass(NamedTuple):
    """One (mode, group) of a run: the tasks kept from an earlier run and the tasks to measure."""

    mode: str
    group: Group
    kept: list[str]
    tasks: list[str]


def plan_passes(
    selected: list[Group], modes: list[str], tasks: list[str], records: dict[str, Any]
) -> list[Pass]:
    """The run's passes in order: eager over every group first (a run stopped by its time budget, see
    benchmarks/gpu/run.sh, has every group's eager numbers before any compilation, the slow part, begins), then
    each group's compiled and CUDA-graph passes, group after group by `Group.priority` (the groups' order where
    equal). A group's modes come in the order of `modes`; a mode the group does not run has no pass. `records`:
    the results so far (resumed), whose measured tasks are `kept`."""
    eager = [mode for mode in modes if mode == "eager"]
    others = [mode for mode in modes if mode != "eager"]
    order = [(mode, group) for mode in eager for group in selected]
    ranked = sorted(selected, key=lambda group: group.priority)  # sorted() is stable: ties keep their order
    order += [(mode, group) for group in ranked for mode in others]
    passes = []
    for mode, group in order:
        if mode not in group.modes:
            continue
        kept = [task for task in tasks if task_measured(records.get(group.name), group, mode, task)]
        passes.append(Pass(mode, group, kept, [task for task in tasks if task not in kept]))
    return passes


# The environment fields a kept measurement must share with the run that adds to it: the machine and the
# software whose speed is measured (the Python version is recorded per run, not compared).
RESUME_KEYS = ("device", "torch", "cuda", "triton", "transformers")


def resume_mismatch(previous: dict[str, Any], report: dict[str, Any]) -> str | None:
    """Why `previous` (an earlier gpu_speed.json) cannot be continued by this run, or None when it can."""
    if bool(previous.get("smoke")) != report["smoke"]:
        kinds = ("a smoke run (tiny configs, not measurements)", "a measurement")
        return f"it is from {kinds[not previous.get('smoke')]}, this run is {kinds[not report['smoke']]}"
    differences = [
        f"{key} {previous['environment'][key]!r} there, {report['environment'].get(key)!r} here"
        for key in RESUME_KEYS
        if key in previous["environment"] and previous["environment"][key] != report["environment"].get(key)
    ]
    for key in ("dtype", "compile_backend"):
        if key in previous and previous[key] != report[key]:
            differences.append(f"{key} {previous[key]!r} there, {report[key]!r} here")
    if differences:
        return "it was measured on another machine or software (" + "; ".join(differences) + ")"
    return None


def adopt(
    report: dict[str, Any],
    previous: dict[str, Any],
    definitions: list[Group],
    batch: int | None,
    path: Path,
) -> None:
    """Take `previous`'s runs and groups into `report` (a group measured at another batch size is left out)."""
    runs = previous.get("runs")
    if not runs:  # a file from before runs were recorded: one run, undated
        runs = [
            {
                "run": 1,
                "started": None,
                "command": previous.get("command"),
                "repeats": previous.get("repeats"),
            }
        ]
    report["runs"] = copy.deepcopy(runs)
    batches = {group.name: batch or group.batch for group in definitions}
    for name, group in previous["groups"].items():
        if name in batches and group.get("batch") != batches[name]:
            print(
                f"--resume {path}: {name}: not kept, measured at batch {group.get('batch')}, "
                f"this run's batch is {batches[name]}",
                flush=True,
            )
            continue
        group = report["groups"][name] = copy.deepcopy(group)
        defined = {
            variant.name: variant
            for definition in definitions
            if definition.name == name
            for variant in [*definition.variants, *([definition.baseline] if definition.baseline else [])]
        }
        for variant_name in list(group["variants"] if defined else []):  # a group not run now stays as it is
            variant, recorded = defined.get(variant_name), group["variants"][variant_name].get("revision", 0)
            if variant is None or variant.revision != recorded:
                why = (
                    "no longer measured"
                    if variant is None
                    else f"revision {recorded}, now {variant.revision}"
                )
                print(f"--resume {path}: {name}: {variant_name} not kept ({why})", flush=True)
                del group["variants"][variant_name]
        for entry in group["variants"].values():
            for mode in MODES:
                for timing in entry.get(mode, {}).values():
                    timing.setdefault("run", runs[0]["run"])


def task_measured(record: dict[str, Any] | None, group: Group, mode: str, task: str) -> bool:
    """Whether `record` (the group's results so far) has `task` in `mode` for every variant of `group`: a time or
    the error that stopped it, or the variant skipped. The variants of one task are timed interleaved, so a task
    is kept or measured again as a whole."""
    if record is None:
        return False
    for variant in group.members(mode):  # a variant not measured in `mode` has nothing to keep there
        entry = record["variants"].get(variant.name)
        if entry is None:
            return False
        timing = entry.get(mode, {}).get(task, {})
        if "skipped" not in entry and "median_s" not in timing and "error" not in timing:
            return False
    return True


def runs_of(record: dict[str, Any], mode: str, task: str) -> str:
    """The run (or runs) that measured `task` in `mode` in a group's record, as text."""
    runs = {
        entry[mode][task]["run"]
        for entry in record["variants"].values()
        if "run" in entry.get(mode, {}).get(task, {})
    }
    return "/".join(str(r) for r in sorted(runs)) or "?"


def merge_task(
    records: dict[str, Any], group: Group, record: dict[str, Any], mode: str, task: str, run: int
) -> None:
    """Put `task` in `mode` of `record` (one group's measurements) into `records`, marked as `run`'s, over what
    was there for that task and mode, and recompute the group's ratios over all modes."""
    target = records.setdefault(
        group.name, {"batch": record["batch"], "note": record["note"], "variants": {}}
    )
    target.update(batch=record["batch"], note=record["note"])
    target.pop("left_out", None)  # as the definitions say now
    if record.get("left_out"):
        target["left_out"] = record["left_out"]
    for name, entry in record["variants"].items():
        kept = target["variants"].setdefault(name, {})
        if "skipped" not in entry:
            kept.pop("skipped", None)
        kept.update({key: copy.deepcopy(value) for key, value in entry.items() if key not in MODES})
        timing = entry.get(mode, {}).get(task)
        if timing is not None:  # a copy: the next task's measuring goes on in `record`
            kept.setdefault(mode, {})[task] = {**copy.deepcopy(timing), "run": run}
    add_ratios(target, group.baseline.name if group.baseline else None)


def write_report(
    report: dict[str, Any],
    output_dir: Path,
    stem: str,
    pending: list[tuple[str, str, str]],
    order: list[str],
) -> None:
    """`stem`.json and `stem`.md in `output_dir`, each replaced in one step (a reader never sees half a file).

    Groups in the order of `order` (the script's), then any other groups a resumed file brought."""
    report["groups"] = dict(
        sorted(
            report["groups"].items(),
            key=lambda item: order.index(item[0]) if item[0] in order else len(order),
        )
    )
    output_dir.mkdir(parents=True, exist_ok=True)
    text = markdown(report)
    if pending:
        waiting: dict[tuple[str, str], list[str]] = {}
        for name, mode, task in pending:
            waiting.setdefault((name, mode), []).append(task)
        text += (
            "\n**Incomplete run**: not measured (the run stopped first): "
            + "; ".join(f"{name} [{mode}: {', '.join(tasks)}]" for (name, mode), tasks in waiting.items())
            + ".\n"
        )
    for suffix, content in (("json", json.dumps(report, indent=2) + "\n"), ("md", text)):
        partial = output_dir / f".{stem}.{suffix}.partial"
        partial.write_text(content)
        partial.replace(output_dir / f"{stem}.{suffix}")


if __name__ == "__main__":
    main()
