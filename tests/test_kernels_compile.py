"""The fused bi-softmax kernels compile for CUDA GPUs, checked here without one (`kernels.compile_ahead`).

The other kernel tests run Triton's CPU interpreter, which accepts code the GPU compiler refuses (a helper called
as a plain Python function, for one). Here each kernel goes through Triton's real compiler down to a cubin for
sm_90 (H100/H200) or sm_80 (A100), with the constants and launch options a CUDA launch uses, and its shared memory
must fit the GPU's. Triton cannot compile in a process that interprets (TRITON_INTERPRET=1, set by conftest.py),
so the compiling runs in subprocesses (two at once), started once per test module.

CI compiles the launches the GPU run makes (`benchmarks/gpu/run.sh`: bfloat16 and exact float32 at d_h = 64, short
sequences, the Sudoku preset's d_h = 192); `-m slow` compiles every dtype × head dimension × padding × GPU.
"""

from __future__ import annotations

import importlib.util
import itertools
import json
import os
import sys

import pytest
import torch
from fixtures import run_at_once

from energyformers import kernels
from energyformers.kernels import KERNELS, SHARED_MEMORY_LIMIT

pytestmark = pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")


# (dtype, length, head_dim, padded, arch): what the GPU run launches
GPU_RUN = [
    ("bfloat16", 197, 64, True, 90),  # gpu_speed.py: ViT-B/16 tokens, bf16
    ("bfloat16", 197, 64, False, 90),
    ("float32", 17, 64, True, 90),  # the attention tests' float32 cases (exact products)
    ("bfloat16", 9, 32, True, 90),  # length <= 16: the smallest block
    ("bfloat16", 81, 192, True, 90),  # Sudoku preset: 81 cells, 768 / 4 heads
]
EVERY = [
    config
    for config in itertools.product(("bfloat16", "float16", "float32"), (197,), (16, 32, 64, 128, 192), (True, False), (80, 90))
    if config not in GPU_RUN
]  # fmt: skip

COMPILE = """
import json, sys, torch
from energyformers import kernels
results = {}
for dtype, length, head_dim, padded, arch, name in json.loads(sys.argv[1]):
    key = f"{dtype}-N{length}-d{head_dim}-{'padded' if padded else 'dense'}-sm{arch}-{name}"
    try:
        compiled = kernels.compile_ahead(name, getattr(torch, dtype), length, head_dim, padded, arch)
        results[key] = {"shared": compiled.metadata.shared, "cubin_bytes": len(compiled.asm["cubin"])}
    except Exception as error:  # reported by the test that reads it, with the compiler's message
        results[key] = {"error": f"{type(error).__name__}: {error}"}
print(json.dumps(results))
"""


def compile_all(configs: list[tuple], cache_dir: str, processes: int = 2) -> dict[str, dict]:
    """Every kernel of every config compiled ahead, split over `processes` subprocesses that run at once (each
    compile is one thread: with two, both cores of a small CI machine work). The (config, kernel) pairs are dealt
    out one by one, so each process gets some of every config's kernels: a large head dimension compiles several
    times slower than a small one, and whole configs would leave one process waiting for the other."""
    env = {key: value for key, value in os.environ.items() if key != "TRITON_INTERPRET"}
    env.update(TRITON_DEFAULT_FP_FUSION="1")
    jobs = [[*config, kernel] for config in configs for kernel in KERNELS]
    commands = {
        i: {
            "args": [sys.executable, "-c", COMPILE, json.dumps(jobs[i::processes])],
            "env": {**env, "TRITON_CACHE_DIR": os.path.join(cache_dir, str(i))},
        }
        for i in range(min(processes, len(jobs)))
    }
    results: dict[str, dict] = {}
    for done in run_at_once(commands, timeout=1200).values():
        assert done.returncode == 0, (
            f"the compiling subprocess failed (exit {done.returncode}):\n{done.stderr[-4000:]}"
        )
        results.update(json.loads(done.stdout.strip().splitlines()[-1]))
    return results


@pytest.fixture(scope="module")
def gpu_run_builds(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return compile_all(GPU_RUN, str(tmp_path_factory.mktemp("triton-cache")))


@pytest.fixture(scope="module")
def every_build(tmp_path_factory: pytest.TempPathFactory) -> dict[str, dict]:
    return compile_all(EVERY, str(tmp_path_factory.mktemp("triton-cache")))


def check_build(builds: dict[str, dict], config: tuple, kernel: str) -> None:
    dtype, length, head_dim, padded, arch = config
    key = f"{dtype}-N{length}-d{head_dim}-{'padded' if padded else 'dense'}-sm{arch}-{kernel}"
    build = builds[key]
    assert "error" not in build, f"{key} does not compile for sm_{arch}: {build['error']}"
    assert build["cubin_bytes"] > 0, f"{key}: an empty cubin"
    assert build["shared"] <= SHARED_MEMORY_LIMIT[arch], (
        f"{key} needs {build['shared']} bytes of shared memory per block; sm_{arch} has {SHARED_MEMORY_LIMIT[arch]}"
    )


@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize(
    "config", GPU_RUN, ids=lambda c: f"{c[0]}-N{c[1]}-d{c[2]}-{'padded' * c[3]}-sm{c[4]}"
)
def test_the_gpu_runs_launches_compile_for_the_gpu(gpu_run_builds: dict, config: tuple, kernel: str) -> None:
    check_build(gpu_run_builds, config, kernel)


@pytest.mark.slow
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("config", EVERY, ids=lambda c: f"{c[0]}-d{c[2]}-{'padded' * c[3]}-sm{c[4]}")
def test_every_dtype_head_dim_and_gpu_compiles(every_build: dict, config: tuple, kernel: str) -> None:
    check_build(every_build, config, kernel)


def test_compiling_in_an_interpreting_process_is_refused_with_the_reason(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setenv(
        "TRITON_INTERPRET", "1"
    )  # conftest.py sets it where there is no CUDA; a GPU machine does not
    with pytest.raises(RuntimeError, match="TRITON_INTERPRET"):
        kernels.compile_ahead("forward", torch.bfloat16, 197, 64)


@pytest.mark.parametrize(
    "kwargs, message",
    [
        (dict(kernel="fused"), r"kernel='fused' is not one of \('column_lse'"),
        (dict(dtype="bfloat16"), r"dtype=bfloat16 is not one of"),
    ],
)
def test_compile_ahead_names_a_bad_argument(kwargs: dict, message: str) -> None:
    arguments = dict(kernel="forward", dtype=torch.bfloat16, length=197, head_dim=64) | kwargs
    with pytest.raises(ValueError, match=message):
        kernels.compile_ahead(**arguments)
