"""What the fused bi-softmax kernels need on a CUDA GPU, read from their compiled code (no GPU needed).

Each of the five kernels of `energyformers/kernels.py` is compiled for the given compute capability with Triton's
bundled `ptxas` (`kernels.compile_ahead`), for every block size and warp count below, and `cuobjdump` (also bundled)
reads each cubin's registers per thread, stack frame (register spills) and shared memory. The table says which
settings spill and marks the one a launch uses (`kernels._constants`): the launcher picks, per dtype and head
dimension, the largest block that compiles without spills. Whether that is also the fastest is measured on a GPU
(`benchmarks/gpu_speed.py`); this file only shows why those settings were chosen.

It has no short mode: every kernel × block size × warp count is one ptxas compile on the CPU (the wall time of the
committed run: benchmarks/results/kernel_resources.md).

    .venv/bin/python benchmarks/kernel_resources.py [--arch 90] [--output benchmarks/results/kernel_resources.md]
"""

from __future__ import annotations

import argparse
import itertools
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch
import triton

from energyformers import kernels

sys.path.insert(0, str(Path(__file__).parent))
import provenance  # after the path insert: the benchmarks folder is not a package

DTYPES = {  # label: (dtype, PRECISION of the float products)
    "bfloat16": (torch.bfloat16, "tf32"),  # tensor cores; the precision flag only concerns float32 operands
    "float32 (exact)": (torch.float32, "ieee"),  # torch's default: TF32 off
    "float32 (TF32 allowed)": (torch.float32, "tf32"),
}
HEAD_DIMS = (32, 64, 128, 192)  # presets: d_h 32 (MIM), 64 (image presets), 192 (Sudoku: 768 / 4 heads)
BLOCKS = (16, 32, 64)
WARPS = (4, 8)
LENGTH = 197  # a ViT-B/16 sequence; the block sizes, not the length, shape the compiled code


def resource_usage(cubin: bytes) -> dict[str, int]:
    """Registers per thread and stack bytes (spills) of a cubin, read by Triton's bundled cuobjdump."""
    tool = Path(triton.__file__).parent / "backends" / "nvidia" / "bin" / "cuobjdump"
    with tempfile.NamedTemporaryFile(suffix=".cubin") as file:
        file.write(cubin)
        file.flush()
        text = subprocess.run(
            [tool, "-res-usage", file.name], capture_output=True, text=True, check=True
        ).stdout
    return {key: int(re.search(rf"\b{key}:(\d+)", text).group(1)) for key in ("REG", "STACK")}


def measure(arch: int) -> list[dict[str, object]]:
    rows = []
    for (label, (dtype, precision)), head_dim in itertools.product(DTYPES.items(), HEAD_DIMS):
        chosen = kernels._constants(LENGTH, head_dim, dtype, on_cuda=True, allow_tf32=precision == "tf32")
        for block, warps in itertools.product(BLOCKS, WARPS):
            per_kernel, start = {}, time.perf_counter()
            failed = []
            for name in kernels.KERNELS:
                try:
                    compiled = kernels.compile_ahead(
                        name, dtype, LENGTH, head_dim, arch=arch, PRECISION=precision, BLOCK_M=block,
                        BLOCK_N=block, num_warps=warps,
                    )  # fmt: skip
                except Exception as error:  # a setting the compiler refuses is a row of the table too
                    failed.append(f"{name}: {type(error).__name__}: {str(error).splitlines()[0][:120]}")
                    continue
                per_kernel[name] = {
                    **resource_usage(compiled.asm["cubin"]),
                    "shared": compiled.metadata.shared,
                }
            usages = per_kernel.values()
            rows.append(
                dict(
                    dtype=label,
                    head_dim=head_dim,
                    block=block,
                    warps=warps,
                    chosen=(chosen["BLOCK_M"], chosen["num_warps"]) == (block, warps),
                    registers=max((usage["REG"] for usage in usages), default=0),
                    spill_bytes=max((usage["STACK"] for usage in usages), default=0),
                    spilling=[name for name, usage in per_kernel.items() if usage["STACK"]],
                    shared=max((usage["shared"] for usage in usages), default=0),
                    failed=failed,
                    seconds=time.perf_counter() - start,
                )
            )
            print({key: value for key, value in rows[-1].items() if key != "seconds"}, flush=True)
    return rows


def write_table(
    rows: list[dict[str, object]], arch: int, path: Path, seconds: float, run: dict[str, object]
) -> None:
    limit = kernels.SHARED_MEMORY_LIMIT.get(arch)
    lines = [
        f"# Fused bi-softmax kernels: registers, spills and shared memory, compiled for sm_{arch}",
        "",
        *provenance.markdown_lines(run),
        "",
        f"Triton {triton.__version__}; compiled for sm_{arch} on this CPU with Triton's bundled ptxas, no GPU; "
        f"{seconds:.0f} s. Each row: the five kernels compiled for length {LENGTH}, with padding; the largest "
        "registers per thread, stack frame (bytes of spilled registers per thread) and shared memory among them. "
        "**chosen**: the setting a launch uses (`energyformers/kernels.py`, `_constants`). Speed is measured by "
        "`benchmarks/gpu_speed.py` on a GPU, not here.",
        "",
        f"Shared memory limit per block on sm_{arch}: {limit if limit else 'unknown'} bytes.",
        "",
        "| dtype | d_h | block | warps | registers | spilled bytes | kernels that spill | shared bytes | chosen |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for row in rows:
        over = limit is not None and row["shared"] > limit
        lines.append(
            f"| {row['dtype']} | {row['head_dim']} | {row['block']} | {row['warps']} | {row['registers']} | "
            f"{row['spill_bytes']} | {', '.join(row['spilling']) or '—'} | "
            f"{row['shared']}{' (over the limit: the launch fails)' if over else ''} | "
            f"{'**chosen**' if row['chosen'] else ''} |"
        )
        lines += [f"|  |  |  |  | does not compile: {failure} |  |  |  |  |" for failure in row["failed"]]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(lines) + "\n")


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--arch", type=int, default=90, help="compute capability ×10 (90: H100/H200, 80: A100)"
    )
    parser.add_argument("--output", type=Path, default=Path("benchmarks/results/kernel_resources.md"))
    args = parser.parse_args(argv)
    if args.arch < 75:
        parser.error(f"--arch {args.arch}: Triton compiles for compute capability 75 and newer (e.g. 80, 90)")
    os.environ.setdefault(
        "TRITON_DEFAULT_FP_FUSION", "1"
    )  # Triton's current default, said aloud (no warning)
    run = provenance.run_info(seed=None, argv=argv, script=__file__)
    start = time.perf_counter()
    rows = measure(args.arch)
    write_table(rows, args.arch, args.output, time.perf_counter() - start, run)
    print(f"wrote {args.output}")


if __name__ == "__main__":
    main()
