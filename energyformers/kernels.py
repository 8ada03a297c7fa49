# Copyright 2026 The energyformers authors. Licensed under the Apache License, Version 2.0.
"""Fused bi-softmax attention in Triton (Hyper-SET's `attn_implementation="triton"`), forward and backward.

O = (R + C) v with S = q kᵀ (temperature folded into q), R = softmax of S over the keys (rows) and C = softmax
of S over the queries (columns), never materialising S:

* forward pass 1 (one program per key block): the column log-sum-exp ℓᶜⱼ = logsumexp_i S_ij, by an online
  reduction over the query blocks (scores only, no V);
* forward pass 2 (one program per query block): the usual online-softmax accumulator of the row part (FlashAttention)
  plus the column part Σ_j exp(S_ij − ℓᶜⱼ) v_j; stores O_R and ℓʳ for the backward;
* backward (FlashAttention-2 style, key blocks outside): dP = dO vᵀ, δʳᵢ = dO_i·O_R,i, δᶜⱼ = v_j·(Cᵀ dO)_j,
  dS = R ⊙ (dP − δʳ) + C ⊙ (dP − δᶜ), dv = (R + C)ᵀ dO, dk = dSᵀ q (per key block), dq = dS k (per query block).

Padding (`keep`, `(B, N)` bool, True = real token) follows the eager path exactly: padded keys leave the row
softmax, padded queries leave the column softmax, no token reads a padded key through either softmax, and a
sequence without real tokens gives zeros, never NaN.

The modeling file never imports this module (Hub remote code may import only torch and transformers): importing
`energyformers` registers `"triton"` through `BiSoftmaxAttentionInterface.register`, the public registration of
Hyper-SET's attention implementations, and the model looks it up by `config._attn_implementation`. Kernels are built on first use, so `TRITON_INTERPRET=1` (Triton's CPU interpreter, used by
the tests) may be set any time before the first call. Triton need not be installed: then `"triton"` is not
registered and requesting it raises a clear error.
"""

from __future__ import annotations

import functools
import importlib.util
import os
from typing import TYPE_CHECKING

import torch
from torch.autograd.function import FunctionCtx

from .modeling import modeling_hyperset

if TYPE_CHECKING:  # Triton is optional ([kernels]): imported where a kernel is built
    from triton.compiler import CompiledKernel

__all__ = [
    "KERNELS",
    "SHARED_MEMORY_LIMIT",
    "bisoftmax_backward",
    "bisoftmax_forward",
    "compile_ahead",
    "triton_bisoftmax_attention",
    "triton_unavailable_reason",
]


TRITON_INSTALLED = importlib.util.find_spec("triton") is not None


def _interpreting() -> bool:
    """Whether Triton runs kernels in its CPU interpreter here (read by Triton when it is imported)."""
    return os.environ.get("TRITON_INTERPRET", "0").lower() in ("1", "true", "on", "yes")


def triton_unavailable_reason(device: torch.device | str | None = None) -> str | None:
    """Why the fused kernel cannot run here (None: it can): Triton missing, or neither CUDA nor the interpreter.

    `device`: where the tensors live, when known; a CPU tensor needs `TRITON_INTERPRET=1` even on a CUDA machine.
    """
    if not TRITON_INSTALLED:
        return "Triton is not installed (pip install 'energyformers[kernels]' or pip install triton)"
    if _interpreting():
        return None
    on_cuda = torch.cuda.is_available() if device is None else torch.device(device).type == "cuda"
    if not on_cuda:
        return (
            "the fused kernel needs a CUDA device (or Triton's CPU interpreter, TRITON_INTERPRET=1, which is "
            "only for tests: it is very slow)"
        )
    return None


# The kernels are plain functions here, made `triton.jit` functions on first use (`_build`): the decorator reads
# TRITON_INTERPRET, which the tests set to run them on CPU. `tl` is bound by `_build` too (Triton is optional).
# Their pointer and integer arguments carry no type hints (`noqa: ANN001`): Triton reads a parameter's annotation
# as part of its kernel signature (`tl.constexpr`: a compile-time constant) and types the others at launch.
tl = None


def _dot(a, b, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):  # noqa: ANN001
    # DOT_FP32: the CPU interpreter's tl.dot gives garbage on bfloat16 tiles, so it multiplies them in float32
    if DOT_FP32:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), input_precision=PRECISION)
    return tl.dot(a, b, input_precision=PRECISION)


def _load_keep(keep_ptr, batch, offsets, length, HAS_MASK: tl.constexpr):  # noqa: ANN001
    # real tokens among `offsets`; masked scores use -1e30, not -inf, whose online max would give NaN
    inside = offsets < length
    if HAS_MASK:
        inside = inside & (tl.load(keep_ptr + batch * length + offsets, mask=inside, other=0) != 0)
    return inside


def _load_tile(ptr, base, rows, dims, length, head_dim):  # noqa: ANN001
    # (rows, dims) of one (batch, head) pair's (N, d_h) tensor at `base`; zeros past the sequence and past d_h
    mask = (rows[:, None] < length) & (dims[None, :] < head_dim)
    return tl.load(ptr + base + rows[:, None] * head_dim + dims[None, :], mask=mask, other=0.0)


def _load_stat(ptr, pair, offsets, length):  # noqa: ANN001
    # a float32 per-token statistic (ℓ or δ, `(B, H, N)`) of one (batch, head) pair; zeros past the sequence
    return tl.load(ptr + pair * length + offsets, mask=offsets < length, other=0.0)


def _column_lse_kernel(
    q_ptr, k_ptr, keep_ptr, lse_col_ptr, num_heads, length, head_dim,  # noqa: ANN001
    HAS_MASK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a block of keys j; ℓᶜⱼ = logsumexp over the real queries i of S_ij.
    block, pair = tl.program_id(0), tl.program_id(1)
    batch = pair // num_heads
    base = pair * length * head_dim
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = _load_tile(k_ptr, base, keys, dims, length, head_dim)
    running_max = tl.full([BLOCK_N], -1.0e30, tl.float32)
    running_sum = tl.zeros([BLOCK_N], tl.float32)
    for start in range(0, length, BLOCK_M):
        queries = start + tl.arange(0, BLOCK_M)
        q = _load_tile(q_ptr, base, queries, dims, length, head_dim)
        real_query = _load_keep(keep_ptr, batch, queries, length, HAS_MASK)
        scores = _dot(k, tl.trans(q), DOT_FP32, PRECISION)  # (BLOCK_N keys, BLOCK_M queries) = Sᵀ
        scores = tl.where(real_query[None, :], scores, -1.0e30)
        new_max = tl.maximum(running_max, tl.max(scores, 1))
        weights = tl.where(real_query[None, :], tl.exp(scores - new_max[:, None]), 0.0)
        running_sum = running_sum * tl.exp(running_max - new_max) + tl.sum(weights, 1)
        running_max = new_max
    # no real query at all: ℓᶜ is never read (C is zero there), store 0 rather than log(0)
    lse = tl.where(running_sum > 0, running_max + tl.log(tl.maximum(running_sum, 1e-30)), 0.0)
    tl.store(lse_col_ptr + pair * length + keys, lse, mask=keys < length)


def _forward_kernel(
    q_ptr, k_ptr, v_ptr, keep_ptr, lse_col_ptr, out_ptr, out_row_ptr, lse_row_ptr, num_heads, length,  # noqa: ANN001
    head_dim,  # noqa: ANN001
    HAS_MASK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a block of queries i; O_R by online softmax over the real keys, O_C with the stored ℓᶜ.
    block, pair = tl.program_id(0), tl.program_id(1)
    batch = pair // num_heads
    base = pair * length * head_dim
    queries = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_mask = (queries[:, None] < length) & (dims[None, :] < head_dim)
    q = _load_tile(q_ptr, base, queries, dims, length, head_dim)
    real_query = _load_keep(keep_ptr, batch, queries, length, HAS_MASK)
    running_max = tl.full([BLOCK_M], -1.0e30, tl.float32)
    running_sum = tl.zeros([BLOCK_M], tl.float32)
    row_acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    col_acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, length, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptr, base, keys, dims, length, head_dim)
        v = _load_tile(v_ptr, base, keys, dims, length, head_dim)
        real_key = _load_keep(keep_ptr, batch, keys, length, HAS_MASK)
        lse_col = _load_stat(lse_col_ptr, pair, keys, length)
        scores = _dot(q, tl.trans(k), DOT_FP32, PRECISION)  # (BLOCK_M, BLOCK_N)
        masked = tl.where(real_key[None, :], scores, -1.0e30)
        new_max = tl.maximum(running_max, tl.max(masked, 1))
        row = tl.where(real_key[None, :], tl.exp(masked - new_max[:, None]), 0.0)
        rescale = tl.exp(running_max - new_max)
        running_sum = running_sum * rescale + tl.sum(row, 1)
        row_acc = row_acc * rescale[:, None] + _dot(row.to(v.dtype), v, DOT_FP32, PRECISION)
        running_max = new_max
        both_real = real_query[:, None] & real_key[None, :]
        col = tl.where(both_real, tl.exp(tl.where(both_real, scores - lse_col[None, :], 0.0)), 0.0)
        col_acc += _dot(col.to(v.dtype), v, DOT_FP32, PRECISION)
    has_key = running_sum > 0
    out_row = row_acc / tl.where(has_key, running_sum, 1.0)[:, None]
    lse_row = tl.where(has_key, running_max + tl.log(tl.where(has_key, running_sum, 1.0)), 0.0)
    offsets = base + queries[:, None] * head_dim + dims[None, :]
    tl.store(out_ptr + offsets, (out_row + col_acc).to(out_ptr.dtype.element_ty), mask=q_mask)
    tl.store(out_row_ptr + offsets, out_row.to(out_row_ptr.dtype.element_ty), mask=q_mask)
    tl.store(lse_row_ptr + pair * length + queries, lse_row, mask=queries < length)


def _probabilities(
    q, k, lse_row, lse_col, real_query, real_key,  # noqa: ANN001
    DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
):  # fmt: skip
    # R and C of one (query block, key block) tile, zero where the eager path has zeros.
    scores = _dot(q, tl.trans(k), DOT_FP32, PRECISION)
    both_real = real_query[:, None] & real_key[None, :]
    row = tl.where(
        real_key[None, :], tl.exp(tl.where(real_key[None, :], scores - lse_row[:, None], 0.0)), 0.0
    )
    col = tl.where(both_real, tl.exp(tl.where(both_real, scores - lse_col[None, :], 0.0)), 0.0)
    return row, col


def _score_grad(row, col, grad, v, delta_row, delta_col, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr):  # noqa: ANN001
    # dS of one (query block, key block) tile: dP = dO vᵀ, dS = R ⊙ (dP − δʳ) + C ⊙ (dP − δᶜ)
    grad_p = _dot(grad, tl.trans(v), DOT_FP32, PRECISION).to(tl.float32)  # (BLOCK_M, BLOCK_N)
    return row * (grad_p - delta_row[:, None]) + col * (grad_p - delta_col[None, :])


def _column_delta_kernel(
    q_ptr, k_ptr, v_ptr, grad_ptr, keep_ptr, lse_col_ptr, delta_col_ptr, num_heads, length, head_dim,  # noqa: ANN001
    HAS_MASK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a block of keys j; δᶜⱼ = v_j · (Cᵀ dO)_j.
    block, pair = tl.program_id(0), tl.program_id(1)
    batch = pair // num_heads
    base = pair * length * head_dim
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    k = _load_tile(k_ptr, base, keys, dims, length, head_dim)
    v = _load_tile(v_ptr, base, keys, dims, length, head_dim)
    real_key = _load_keep(keep_ptr, batch, keys, length, HAS_MASK)
    lse_col = _load_stat(lse_col_ptr, pair, keys, length)
    acc = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, length, BLOCK_M):
        queries = start + tl.arange(0, BLOCK_M)
        q = _load_tile(q_ptr, base, queries, dims, length, head_dim)
        grad = _load_tile(grad_ptr, base, queries, dims, length, head_dim)
        real_query = _load_keep(keep_ptr, batch, queries, length, HAS_MASK)
        scores_t = _dot(k, tl.trans(q), DOT_FP32, PRECISION)  # (BLOCK_N, BLOCK_M) = Sᵀ
        both_real = real_key[:, None] & real_query[None, :]
        col_t = tl.where(both_real, tl.exp(tl.where(both_real, scores_t - lse_col[:, None], 0.0)), 0.0)
        acc += _dot(col_t.to(grad.dtype), grad, DOT_FP32, PRECISION)
    tl.store(delta_col_ptr + pair * length + keys, tl.sum(acc * v.to(tl.float32), 1), mask=keys < length)


def _key_grad_kernel(
    q_ptr, k_ptr, v_ptr, grad_ptr, keep_ptr, lse_row_ptr, lse_col_ptr, delta_row_ptr, delta_col_ptr,  # noqa: ANN001
    grad_k_ptr, grad_v_ptr, num_heads, length, head_dim,  # noqa: ANN001
    HAS_MASK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a block of keys j; dv_j = Σ_i (R + C)_ij dO_i and dk_j = Σ_i dS_ij q_i.
    block, pair = tl.program_id(0), tl.program_id(1)
    batch = pair // num_heads
    base = pair * length * head_dim
    keys = block * BLOCK_N + tl.arange(0, BLOCK_N)
    dims = tl.arange(0, BLOCK_D)
    kv_mask = (keys[:, None] < length) & (dims[None, :] < head_dim)
    k = _load_tile(k_ptr, base, keys, dims, length, head_dim)
    v = _load_tile(v_ptr, base, keys, dims, length, head_dim)
    real_key = _load_keep(keep_ptr, batch, keys, length, HAS_MASK)
    lse_col = _load_stat(lse_col_ptr, pair, keys, length)
    delta_col = _load_stat(delta_col_ptr, pair, keys, length)
    grad_k = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    grad_v = tl.zeros([BLOCK_N, BLOCK_D], tl.float32)
    for start in range(0, length, BLOCK_M):
        queries = start + tl.arange(0, BLOCK_M)
        q = _load_tile(q_ptr, base, queries, dims, length, head_dim)
        grad = _load_tile(grad_ptr, base, queries, dims, length, head_dim)
        real_query = _load_keep(keep_ptr, batch, queries, length, HAS_MASK)
        in_range = queries < length
        lse_row = _load_stat(lse_row_ptr, pair, queries, length)
        delta_row = _load_stat(delta_row_ptr, pair, queries, length)
        row, col = _probabilities(q, k, lse_row, lse_col, real_query, real_key, DOT_FP32, PRECISION)
        row = tl.where(in_range[:, None], row, 0.0)  # queries past the end read no key
        grad_v += _dot(tl.trans((row + col).to(grad.dtype)), grad, DOT_FP32, PRECISION)
        grad_s = _score_grad(row, col, grad, v, delta_row, delta_col, DOT_FP32, PRECISION)
        grad_k += _dot(tl.trans(grad_s.to(q.dtype)), q, DOT_FP32, PRECISION)
    offsets = base + keys[:, None] * head_dim + dims[None, :]
    tl.store(grad_k_ptr + offsets, grad_k.to(grad_k_ptr.dtype.element_ty), mask=kv_mask)
    tl.store(grad_v_ptr + offsets, grad_v.to(grad_v_ptr.dtype.element_ty), mask=kv_mask)


def _query_grad_kernel(
    q_ptr, k_ptr, v_ptr, grad_ptr, keep_ptr, lse_row_ptr, lse_col_ptr, delta_row_ptr, delta_col_ptr,  # noqa: ANN001
    grad_q_ptr, num_heads, length, head_dim,  # noqa: ANN001
    HAS_MASK: tl.constexpr, DOT_FP32: tl.constexpr, PRECISION: tl.constexpr,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_D: tl.constexpr,
):  # fmt: skip
    # One program: a block of queries i; dq_i = Σ_j dS_ij k_j.
    block, pair = tl.program_id(0), tl.program_id(1)
    batch = pair // num_heads
    base = pair * length * head_dim
    queries = block * BLOCK_M + tl.arange(0, BLOCK_M)
    dims = tl.arange(0, BLOCK_D)
    q_mask = (queries[:, None] < length) & (dims[None, :] < head_dim)
    q = _load_tile(q_ptr, base, queries, dims, length, head_dim)
    grad = _load_tile(grad_ptr, base, queries, dims, length, head_dim)
    real_query = _load_keep(keep_ptr, batch, queries, length, HAS_MASK)
    lse_row = _load_stat(lse_row_ptr, pair, queries, length)
    delta_row = _load_stat(delta_row_ptr, pair, queries, length)
    grad_q = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for start in range(0, length, BLOCK_N):
        keys = start + tl.arange(0, BLOCK_N)
        k = _load_tile(k_ptr, base, keys, dims, length, head_dim)
        v = _load_tile(v_ptr, base, keys, dims, length, head_dim)
        real_key = _load_keep(keep_ptr, batch, keys, length, HAS_MASK)
        lse_col = _load_stat(lse_col_ptr, pair, keys, length)
        delta_col = _load_stat(delta_col_ptr, pair, keys, length)
        row, col = _probabilities(q, k, lse_row, lse_col, real_query, real_key, DOT_FP32, PRECISION)
        grad_s = _score_grad(row, col, grad, v, delta_row, delta_col, DOT_FP32, PRECISION)
        grad_q += _dot(grad_s.to(k.dtype), k, DOT_FP32, PRECISION)
    offsets = base + queries[:, None] * head_dim + dims[None, :]
    tl.store(grad_q_ptr + offsets, grad_q.to(grad_q_ptr.dtype.element_ty), mask=q_mask)


_JIT_FUNCTIONS = (
    "_dot",
    "_load_keep",
    "_load_tile",
    "_load_stat",
    "_column_lse_kernel",
    "_forward_kernel",
    "_probabilities",
    "_score_grad",
    "_column_delta_kernel",
    "_key_grad_kernel",
    "_query_grad_kernel",
)


@functools.cache
def _build() -> None:
    """Replace the kernel functions of this module by their `triton.jit` versions (once, on first use).

    They call each other through the module's globals, so the jitted versions must live under the same names.
    """
    import triton
    import triton.language

    namespace = globals()
    namespace["tl"] = triton.language
    for name in _JIT_FUNCTIONS:
        namespace[name] = triton.jit(namespace[name])


KERNELS = ("column_lse", "forward", "column_delta", "key_grad", "query_grad")


def _launch_setup(q: torch.Tensor) -> tuple[dict[str, object], dict[str, object]]:
    """The kernels by name (built on first use) and the compile-time constants for tensors like `q`."""
    _build()
    namespace = globals()
    kernels = {name: namespace[f"_{name}_kernel"] for name in KERNELS}
    tf32 = torch.backends.cuda.matmul.allow_tf32
    return kernels, _constants(*q.shape[-2:], q.dtype, on_cuda=q.is_cuda, allow_tf32=tf32)


# (block side, warps) of a CUDA launch by operand kind and BLOCK_D (d_h rounded up to a power of 2): on sm_90 the
# largest block that compiles without register spills, then the warp count with fewer registers per thread; where
# every setting spills (exact float32 beyond d_h = 64), the fewest spilled bytes (benchmarks/kernel_resources.py)
_CUDA_TILES = {
    "16-bit": {16: (64, 8), 32: (64, 8), 64: (64, 8), 128: (32, 8), 256: (32, 8)},
    "tf32": {16: (64, 8), 32: (64, 8), 64: (32, 8), 128: (16, 8), 256: (16, 8)},
    "float32": {16: (16, 4), 32: (16, 4), 64: (16, 8), 128: (16, 8), 256: (16, 8)},
}


def _constants(
    length: int, head_dim: int, dtype: torch.dtype, on_cuda: bool, allow_tf32: bool
) -> dict[str, object]:
    """The kernels' compile-time constants (`tl.constexpr`) and warps for a launch on tensors of this shape and
    dtype. tl.dot needs block sides >= 16."""
    head_block = max(16, 1 << (head_dim - 1).bit_length())  # the next power of 2: tl.arange needs one
    # float32 products as torch's own matmuls: exact unless TF32 is allowed; bfloat16 ones on the tensor cores
    exact = dtype == torch.float32 and not allow_tf32
    if on_cuda:
        kind = "16-bit" if dtype.itemsize <= 2 else "float32" if exact else "tf32"
        block, warps = _CUDA_TILES[kind].get(head_block, (16, 8))  # beyond d_h = 256: the smallest tiles
    else:  # the interpreter runs any size; larger blocks mean fewer (slow) interpreted steps
        block, warps = (32 if length <= 64 else 64), 4
    block = 16 if length <= 16 else block
    return dict(
        DOT_FP32=not on_cuda,  # the CPU interpreter's tl.dot gives garbage on bfloat16 tiles
        PRECISION="ieee" if exact or not on_cuda else "tf32",
        BLOCK_M=block,
        BLOCK_N=block,
        BLOCK_D=head_block,
        num_warps=warps,
    )


def _blocks(length: int, block: int) -> int:
    return -(-length // block)


# CUDA's opt-in maximum of shared memory per block in bytes, by compute capability ×10 (CUDA C++ Programming Guide,
# technical specifications per compute capability): a kernel needing more fails to launch
SHARED_MEMORY_LIMIT = {80: 163 * 1024, 86: 99 * 1024, 89: 99 * 1024, 90: 227 * 1024}
_POINTER_TYPES = {torch.float32: "*fp32", torch.bfloat16: "*bf16", torch.float16: "*fp16"}


def compile_ahead(
    kernel: str,
    dtype: torch.dtype,
    length: int,
    head_dim: int,
    has_mask: bool = True,
    arch: int = 90,
    **overrides: object,
) -> CompiledKernel:
    """Compile one kernel for a CUDA GPU of compute capability `arch` (90: H100/H200, 80: A100) without a GPU.

    The same constants and launch options as a launch on `(B, H, length, head_dim)` tensors of `dtype` on CUDA
    (`overrides` replace them, e.g. `num_warps=4`); Triton's bundled `ptxas` assembles the result, so a kernel that
    would fail to compile on the GPU fails here. Needs a process without TRITON_INTERPRET (the tests use a
    subprocess); written against Triton 3.9's compile API. Returns Triton's compiled kernel (`.asm["cubin"]`;
    `.metadata.shared`: the bytes of shared memory a launch needs).
    """
    if kernel not in KERNELS:
        raise ValueError(f"kernel={kernel!r} is not one of {KERNELS}")
    if dtype not in _POINTER_TYPES:
        raise ValueError(f"dtype={dtype} is not one of {sorted(map(str, _POINTER_TYPES))}")
    import triton
    from triton.backends.compiler import GPUTarget
    from triton.compiler import ASTSource

    if _interpreting():
        # Triton's own library functions (tl.max, tl.sum, ...) are interpreted in such a process: nothing compiles
        raise RuntimeError(
            "compile_ahead compiles for a GPU, which Triton cannot do in a process where TRITON_INTERPRET=1 "
            "(its CPU interpreter) is set; call it in a process without TRITON_INTERPRET"
        )
    _build()
    function = globals()[f"_{kernel}_kernel"]
    sizes = {
        **_constants(length, head_dim, dtype, on_cuda=True, allow_tf32=False),
        "HAS_MASK": has_mask,
        **overrides,
    }
    options = {name: sizes.pop(name) for name in ("num_warps", "num_stages") if name in sizes}
    signature = {}
    for name in function.arg_names:
        if name in sizes:
            signature[name] = "constexpr"
        elif name == "keep_ptr":
            signature[name] = "*i8"
        elif name.startswith(("lse_", "delta_")):  # the float32 statistics
            signature[name] = "*fp32"
        elif name.endswith("_ptr"):
            signature[name] = _POINTER_TYPES[dtype]
        else:
            signature[name] = "i32"
    constants = {(function.arg_names.index(name),): value for name, value in sizes.items()}
    source = ASTSource(fn=function, signature=signature, constexprs=constants)
    return triton.compile(source, target=GPUTarget("cuda", arch, 32), options=options)


def _check_runnable(q: torch.Tensor) -> None:
    reason = triton_unavailable_reason(q.device)
    if reason is not None:
        raise ValueError(f'attn_implementation="triton" cannot run on {q.device}: {reason}.')


# Custom operators (not a bare autograd.Function): torch.compile(fullgraph=True) and torch.export keep them as one
# opaque node each, with shapes from the fake implementations below, instead of tracing into Triton's launcher.
@torch.library.custom_op("energyformers::bisoftmax_forward", mutates_args=())
def bisoftmax_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    """(R + C) v, plus O_R = R v, ℓʳ and ℓᶜ (`(B, H, N)` float32) for the backward."""
    _check_runnable(q)
    batch, heads, length, head_dim = q.shape
    q, k, v = q.contiguous(), k.contiguous(), v.contiguous()
    kernels, sizes = _launch_setup(q)
    # int8 mask (the kernels compare against 0); a dummy pointer when there is no padding
    mask = keep.to(torch.int8).contiguous() if keep is not None else q.new_empty(1, dtype=torch.int8)
    common = dict(num_heads=heads, length=length, head_dim=head_dim, HAS_MASK=keep is not None, **sizes)
    lse_col = q.new_empty(batch, heads, length, dtype=torch.float32)
    lse_row = torch.empty_like(lse_col)
    out, out_row = torch.empty_like(q), torch.empty_like(q)
    kernels["column_lse"][(_blocks(length, sizes["BLOCK_N"]), batch * heads)](q, k, mask, lse_col, **common)
    kernels["forward"][(_blocks(length, sizes["BLOCK_M"]), batch * heads)](
        q, k, v, mask, lse_col, out, out_row, lse_row, **common
    )
    return out, out_row, lse_row, lse_col


@bisoftmax_forward.register_fake
def _(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    lse = q.new_empty(q.shape[:-1], dtype=torch.float32)
    return torch.empty_like(q), torch.empty_like(q), lse, torch.empty_like(lse)


@torch.library.custom_op("energyformers::bisoftmax_backward", mutates_args=())
def bisoftmax_backward(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    out_row: torch.Tensor,
    lse_row: torch.Tensor,
    lse_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """dq, dk, dv of (R + C) v for the output gradient `grad_out`."""
    _check_runnable(q)
    batch, heads, length, head_dim = q.shape
    # tl.dot takes operands of one dtype: the output gradient in that of q, k, v
    q, k, v, grad_out = q.contiguous(), k.contiguous(), v.contiguous(), grad_out.to(q.dtype).contiguous()
    kernels, sizes = _launch_setup(q)
    mask = keep.to(torch.int8).contiguous() if keep is not None else q.new_empty(1, dtype=torch.int8)
    common = dict(num_heads=heads, length=length, head_dim=head_dim, HAS_MASK=keep is not None, **sizes)
    delta_row = (grad_out.float() * out_row.float()).sum(-1).contiguous()  # δʳᵢ = dO_i · O_R,i, (B, H, N)
    delta_col = torch.empty_like(delta_row)
    grad_q, grad_k, grad_v = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
    key_blocks = (_blocks(length, sizes["BLOCK_N"]), batch * heads)
    kernels["column_delta"][key_blocks](q, k, v, grad_out, mask, lse_col, delta_col, **common)
    kernels["key_grad"][key_blocks](
        q, k, v, grad_out, mask, lse_row, lse_col, delta_row, delta_col, grad_k, grad_v, **common
    )
    kernels["query_grad"][(_blocks(length, sizes["BLOCK_M"]), batch * heads)](
        q, k, v, grad_out, mask, lse_row, lse_col, delta_row, delta_col, grad_q, **common
    )
    return grad_q, grad_k, grad_v


@bisoftmax_backward.register_fake
def _(
    grad_out: torch.Tensor,
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    keep: torch.Tensor | None,
    out_row: torch.Tensor,
    lse_row: torch.Tensor,
    lse_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    return torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)


def _setup_context(
    ctx: FunctionCtx,
    inputs: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor | None],
    output: tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor],
) -> None:
    q, k, v, keep = inputs
    _, out_row, lse_row, lse_col = output
    ctx.save_for_backward(q, k, v, keep, out_row, lse_row, lse_col)


def _backward(
    ctx: FunctionCtx,
    grad_out: torch.Tensor,
    _grad_out_row: torch.Tensor,
    _grad_lse_row: torch.Tensor,
    _grad_lse_col: torch.Tensor,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, None]:
    # only the first output is used downstream; the others are saved statistics
    q, k, v, keep, out_row, lse_row, lse_col = ctx.saved_tensors
    grad_q, grad_k, grad_v = bisoftmax_backward(grad_out, q, k, v, keep, out_row, lse_row, lse_col)
    return grad_q, grad_k, grad_v, None


bisoftmax_forward.register_autograd(_backward, setup_context=_setup_context)


def triton_bisoftmax_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, keep: torch.Tensor | None
) -> tuple[torch.Tensor, None]:
    """Hyper-SET's attention-function signature: `(B, H, N, d_h)` output and no maps."""
    return bisoftmax_forward(q, k, v, keep)[0], None


# The optional `unavailable_reason(device) -> str | None` of BiSoftmaxAttentionInterface's protocol
# (modeling_hyperset): the model's checks read it to refuse "triton" with the reason before any launch.
triton_bisoftmax_attention.unavailable_reason = triton_unavailable_reason
if TRITON_INSTALLED:
    modeling_hyperset.BiSoftmaxAttentionInterface.register("triton", triton_bisoftmax_attention)
