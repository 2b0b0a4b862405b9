"""Dynamic int8 Linear in Triton: activations quantized per token, an int8 x int8 -> int32 GEMM against
the per-channel int8 weight, and the dequantization (both scales) and bias fused into its epilogue.

Why: a Linear's weight read and its multiply-adds both shrink. The weight is quantized once, offline
(``reference.quantize_per_channel``); each call quantizes its activations in one kernel
(``quantize_rows``: a row's absmax, then ``round(x * 127 / absmax)``, from one read of the row where it
fits in registers) and runs one GEMM whose accumulator is exact int32, so the only errors are the two
roundings to int8. The epilogue turns the int32 tile into
``acc * x_scale[m] * w_scale[n] + bias[n]`` in the output dtype, so no int32 or float32 (M, N)
intermediate ever reaches memory. Decode calls (a few rows) may quantize inside the GEMM instead: one launch,
the same int8 values, at the price of each program reading its rows of x twice (once for their absmax); either
call may also take half-width tiles, twice the programs. Which of the four whole calls a decode shape takes is
timed once on the GPU (``path_choice``).

Prefill calls (more rows) have two GEMMs of the same arithmetic: one loading its tiles with pointers
(asynchronous copies, a mask per tile), one reading them through tensor descriptors (on Hopper each tile is
one TMA copy, zero-filled past the edges) whose candidates also include a persistent grid, one program per SM
taking output tiles in turn. Which one a shape takes is timed once on the GPU, each autotuned first.

A NaN or Inf in an activation row makes that row's scale NaN, so its outputs are NaN rather than
silently finite. Under the Triton interpreter small fixed blocks are used.
"""

from __future__ import annotations

import functools

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.direct_launch import BoundLaunch, DirectLauncher, cdiv, next_power_of_2
from microscope_kernels.input_checks import check_float_input, checked_bias
from microscope_kernels.int8_rows import absmax_scale, inverse, quantized
from microscope_kernels.path_choice import fastest_path
from microscope_kernels.sm_count import sm_count
from triton.tools.tensor_descriptor import TensorDescriptor

from microscope.api import interpreting

QMAX = 127


@triton.jit
def _quantize_rows_kernel(X, Q, S, M, K, stride_x, stride_q, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                          ONE_PASS: tl.constexpr):
    """BLOCK_M rows per program: absmax per row (NaN-aware), then q = round half away from zero. With
    ``ONE_PASS`` (K <= BLOCK_K) each row is read once and quantized from registers; else read twice."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_K)
    in_rows = rows[:, None] < M
    if ONE_PASS:
        mask = in_rows & (cols[None, :] < K)
        x = tl.load(X + rows[:, None] * stride_x + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        bad = tl.sum(((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32), axis=1)
        scale = tl.where(bad > 0, float("nan"), tl.max(tl.abs(x), axis=1) / 127.0)
        tl.store(Q + rows[:, None] * stride_q + cols[None, :], quantized(x, inverse(scale)), mask=mask)
    else:
        scale = absmax_scale(X, rows, in_rows, K, stride_x, BLOCK_M, BLOCK_K)
        inv = inverse(scale)
        for k0 in range(0, K, BLOCK_K):
            mask = in_rows & (k0 + cols[None, :] < K)
            x = tl.load(X + rows[:, None] * stride_x + k0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
            tl.store(Q + rows[:, None] * stride_q + k0 + cols[None, :], quantized(x, inv), mask=mask)
    tl.store(S + rows, scale, mask=rows < M)


#: The longest row a GPU program quantizes from registers in one read (32 float32 values per thread at 8 warps).
ONE_PASS_COLUMNS = 8192


@triton.jit
def _int8_gemm_kernel(A, B, C, SA, SB, BIAS, M, N, K, stride_am, stride_bn, stride_cm, M_BUCKET,
                      HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr, EVEN_K: tl.constexpr):
    """C[m, n] = (sum_k A[m, k] B[n, k]) * SA[m] * SB[n] (+ BIAS[n]): exact int32 accumulation.

    ``M_BUCKET`` only keys the autotuner; ``EVEN_K`` (K a multiple of BLOCK_K) drops the K mask."""
    pid_m, pid_n = _grouped_tile(tl.program_id(0), tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N), GROUP_M)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            a = tl.load(A + rm[:, None] * stride_am + kk[None, :], mask=rm[:, None] < M, other=0)
            b = tl.load(B + rn[None, :] * stride_bn + kk[:, None], mask=rn[None, :] < N, other=0)
        else:
            a = tl.load(A + rm[:, None] * stride_am + kk[None, :], mask=(rm[:, None] < M) & (kk[None, :] < K),
                        other=0)
            b = tl.load(B + rn[None, :] * stride_bn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K),
                        other=0)
        acc = tl.dot(a, b, acc, out_dtype=tl.int32)
    _store_rescaled(C, acc, tl.load(SA + rm, mask=rm < M, other=0.0), SB, BIAS, rm, rn, M, N, stride_cm, HAS_BIAS)


@triton.jit
def _int8_gemm_tma_kernel(A, B, C, SA, SB, BIAS, M, N, K, stride_cm, M_BUCKET, HAS_BIAS: tl.constexpr,
                          BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr,
                          PROGRAMS_PER_SM: tl.constexpr, FLATTEN: tl.constexpr):
    """``_int8_gemm_kernel`` with A (M, K) and B (N, K) read through tensor descriptors (the Hopper copy engine,
    TMA: a tile's load is one instruction, its out-of-bounds part zero-filled, so no K mask) and, with a grid
    smaller than the tile count (``PROGRAMS_PER_SM`` > 0 sizes it), each program taking tiles until none are
    left. ``FLATTEN`` has Triton pipeline across a program's tiles, so the next tile's loads start during this
    one's epilogue."""
    grid_m, grid_n = tl.cdiv(M, BLOCK_M), tl.cdiv(N, BLOCK_N)
    k_tiles = tl.cdiv(K, BLOCK_K)
    for tile in tl.range(tl.program_id(0), grid_m * grid_n, tl.num_programs(0), flatten=FLATTEN):
        pid_m, pid_n = _grouped_tile(tile, grid_m, grid_n, GROUP_M)
        acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
        for kt in range(k_tiles):
            a = A.load([pid_m * BLOCK_M, kt * BLOCK_K])
            b = B.load([pid_n * BLOCK_N, kt * BLOCK_K])
            acc = tl.dot(a, b.T, acc, out_dtype=tl.int32)
        rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
        rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
        _store_rescaled(C, acc, tl.load(SA + rm, mask=rm < M, other=0.0), SB, BIAS, rm, rn, M, N, stride_cm,
                        HAS_BIAS)


@triton.jit
def _grouped_tile(tile, grid_m, grid_n, GROUP_M: tl.constexpr):
    """(pid_m, pid_n) of output tile ``tile`` in grouped order: GROUP_M rows of tiles at a time, column by
    column, so that programs running together share their A and B tiles in L2."""
    group = tile // (GROUP_M * grid_n)
    first_m = group * GROUP_M
    size_m = tl.minimum(grid_m - first_m, GROUP_M)
    return first_m + (tile % (GROUP_M * grid_n)) % size_m, (tile % (GROUP_M * grid_n)) // size_m


@triton.jit
def _int8_decode_kernel(X, B, C, SB, BIAS, M, N, K, stride_xm, stride_bn, stride_cm, HAS_BIAS: tl.constexpr,
                        BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, EVEN_K: tl.constexpr):
    """The quantize pass and the GEMM in one launch, for decode rows: each program takes its rows' scales (an
    absmax over all of K: a few KB read again from cache) and quantizes each x tile as it loads it, to the int8
    values ``quantize_rows`` writes. A decode call is then one launch instead of two, and its host time,
    not the GPU's, is what a decode step at these sizes waits on."""
    rm = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = tl.program_id(1) * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    in_rows = rm[:, None] < M
    sa = absmax_scale(X, rm, in_rows, K, stride_xm, BLOCK_M, BLOCK_K)
    inv = inverse(sa)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.int32)
    for k0 in range(0, K, BLOCK_K):
        kk = k0 + rk
        if EVEN_K:
            x = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=in_rows, other=0.0)
            b = tl.load(B + rn[None, :] * stride_bn + kk[:, None], mask=rn[None, :] < N, other=0)
        else:
            x = tl.load(X + rm[:, None] * stride_xm + kk[None, :], mask=in_rows & (kk[None, :] < K), other=0.0)
            b = tl.load(B + rn[None, :] * stride_bn + kk[:, None], mask=(rn[None, :] < N) & (kk[:, None] < K),
                        other=0)
        acc = tl.dot(quantized(x.to(tl.float32), inv), b, acc, out_dtype=tl.int32)
    _store_rescaled(C, acc, sa, SB, BIAS, rm, rn, M, N, stride_cm, HAS_BIAS)


@triton.jit
def _store_rescaled(C, acc, sa, SB, BIAS, rm, rn, M, N, stride_cm, HAS_BIAS: tl.constexpr):
    """The GEMMs' epilogue: ``acc * sa[m] * SB[n] (+ BIAS[n])`` in C's dtype."""
    sb = tl.load(SB + rn, mask=rn < N, other=0.0)
    out = acc.to(tl.float32) * sa[:, None] * sb[None, :]
    if HAS_BIAS:
        out += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :], out.to(C.dtype.element_ty), mask=mask)


_GEMM = triton.heuristics({"EVEN_K": lambda args: args["K"] % args["BLOCK_K"] == 0})(_int8_gemm_kernel)
#: Prefill-shaped GEMMs (M > 64) pick among these per (M bucket, N, K); 128 x 128 x 128 with 8 warps was
#: the fixed choice before, the others trade tile shape for pipeline depth (the 4-stage 128 x 256 x 128
#: tiles fill Hopper's 228 KB of shared memory: 48 KB a stage).
_LARGE_M_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk}, num_warps=warps, num_stages=stages)
    for bm, bn, bk, warps, stages in [(128, 128, 128, 8, 3), (128, 256, 128, 8, 3), (256, 128, 128, 8, 3),
                                      (128, 256, 64, 8, 4), (128, 128, 64, 4, 4), (128, 128, 128, 4, 4),
                                      (128, 256, 128, 8, 4), (256, 128, 128, 8, 4)]
]
_GEMM_LARGE_M = triton.autotune(_LARGE_M_CONFIGS, key=["M_BUCKET", "N", "K"], do_bench=bench_candidate)(_GEMM)


def _tma_blocks(nargs: dict) -> None:
    """Autotuner pre-hook: a candidate's tiles become the descriptors' blocks (a TMA copy moves one block)."""
    nargs["A"].block_shape = [nargs["BLOCK_M"], nargs["BLOCK_K"]]
    nargs["B"].block_shape = [nargs["BLOCK_N"], nargs["BLOCK_K"]]


#: The descriptor GEMM's candidates: the tiles of ``_LARGE_M_CONFIGS`` that did best, each with one program per
#: output tile, or one per SM taking tiles in turn, pipelined across tiles or not; not pipelined across tiles at
#: 256 x 128 x 128, where that takes 256 KiB of shared memory (sm_90, Triton 3.6 and 3.9), over the 227 KiB a
#: Hopper block may have (128 x 256 x 128 at 4 stages takes 224 KiB).
_TMA_CONFIGS = [
    triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "PROGRAMS_PER_SM": per_sm, "FLATTEN": flatten},
                  num_warps=warps, num_stages=stages, pre_hook=_tma_blocks)
    for bm, bn, bk, warps, stages in [(128, 256, 128, 8, 3), (128, 256, 128, 8, 4), (256, 128, 128, 8, 4),
                                      (128, 128, 128, 8, 4), (128, 256, 64, 8, 4)]
    for per_sm, flatten in [(0, False), (1, False), (1, True)]
    if not (flatten and bm == 256)
]
_GEMM_TMA = triton.autotune(_TMA_CONFIGS, key=["M_BUCKET", "N", "K"], do_bench=bench_candidate)(
    _int8_gemm_tma_kernel)
#: Under the interpreter: small tiles, and three programs, so each takes several tiles in turn.
_INTERPRET_TMA = {"BLOCK_M": 32, "BLOCK_N": 64, "BLOCK_K": 64, "FLATTEN": False}
_INTERPRET_PROGRAMS = 3
#: (M bucket, N, K, out dtype, bias, device) -> the faster prefill GEMM on this GPU: ``pointers`` or ``tma``.
_LARGE_PATH: dict[tuple, str] = {}

#: Rows up to this count (decode) take the GEMM with fixed blocks; more, the autotuned one.
DECODE_ROWS = 64
#: Launches skip Triton's per-call dispatch after the first call per specialization (direct_launch.py).
_LAUNCH_QUANTIZE = DirectLauncher(_quantize_rows_kernel)
_LAUNCH_GEMM = DirectLauncher(_int8_gemm_kernel)
_LAUNCH_DECODE = DirectLauncher(_int8_decode_kernel)
#: (rows, N, K, dtype, bias, device) -> the launch of a decode call, bound to its compiled kernel and grid
#: (``DirectLauncher.bind``): a model's decode step calls every Linear, a few microseconds of GPU each.
_BOUND: dict[tuple, BoundLaunch] = {}
#: That key -> the decode call that was the fastest on this GPU, a name of ``_DECODE_PATHS``.
_DECODE_PATH: dict[tuple, str] = {}


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (M, K), scale float32 (M,)) of a 2-D tensor, symmetric per row, in one Triton pass."""
    if x.dim() != 2:
        raise ValueError(f"quantize_rows takes a 2-D tensor, got shape {tuple(x.shape)}")
    x = x.contiguous()
    m, k = x.shape
    q = torch.empty((m, k), device=x.device, dtype=torch.int8)
    scale = torch.empty((m,), device=x.device, dtype=torch.float32)
    if m:
        # the interpreter pays per program, so it takes many rows at once; a GPU one row per program, the
        # whole row at once where it fits
        if interpreting():
            rows, block, warps = 32, 64, 4
        else:
            rows, block = 1, min(ONE_PASS_COLUMNS, next_power_of_2(max(k, 16)))
            warps = 8 if block >= 4096 else 4
        _LAUNCH_QUANTIZE((cdiv(m, rows),), x, q, scale, m, k, x.stride(0), q.stride(0), BLOCK_M=rows,
                         BLOCK_K=block, ONE_PASS=k <= block, num_warps=warps)
    return q, scale


def _blocks(m: int, narrow: bool = False) -> tuple[int, int, int, int] | None:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps) for decode-shaped M and under the interpreter; None: autotune.
    ``narrow``: half the columns a program, so twice the programs (at N=8192 and M <= 16 the wide tiles make one
    4-warp program a SM, too few loads in flight to stream the weight at the copy rate)."""
    if interpreting():  # large tiles: the interpreter's cost is per program and per op, not per element
        bm, bn, bk = 32, 64, 64
    elif m <= 16:
        bm, bn, bk = 16, 64, 256
    elif m <= DECODE_ROWS:
        bm, bn, bk = 64, 128, 128
    else:
        return None
    return bm, bn // 2 if narrow else bn, bk, 4


def _fixed_consts(m: int, k: int, has_bias: bool, narrow: bool = False) -> dict | None:
    """The constants of both GEMM kernels with fixed blocks (decode rows, the interpreter); None: autotuned."""
    fixed = _blocks(m, narrow)
    if fixed is None:
        return None
    bm, bn, bk, warps = fixed
    return {"HAS_BIAS": has_bias, "BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "EVEN_K": k % bk == 0,
            "num_warps": warps}


def _weight_args(w_q: torch.Tensor, w_scale: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The weight and its scales as both GEMM kernels read them: contiguous, the scales float32."""
    return w_q.contiguous(), w_scale.to(torch.float32).contiguous()


def int8_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out_dtype: torch.dtype, *, narrow: bool = False) -> torch.Tensor:
    """``(x_q @ w_q^T) * x_scale[:, None] * w_scale[None, :] + bias`` in ``out_dtype``, from int8 (M, K)
    activations with per-row float32 scales and an int8 (N, K) weight with per-channel scales: the GEMM
    and its fused epilogue alone, for callers that already hold quantized activations. ``narrow``: decode rows
    take half-width tiles (``_blocks``)."""
    m, k = x_q.shape
    n = w_q.shape[0]
    out = torch.empty((m, n), device=x_q.device, dtype=out_dtype)
    if m == 0 or n == 0:
        return out
    x_q, x_scale = x_q.contiguous(), x_scale.to(torch.float32).contiguous()
    w_q, w_scale = _weight_args(w_q, w_scale)
    operands = (x_q, x_scale, w_q, w_scale, bias, out)
    if m <= DECODE_ROWS or not _tma_fits(x_q, w_q):
        _pointer_gemm(*operands, narrow=narrow)
        return out
    key = (next_power_of_2(m), n, k, out_dtype, bias is not None, x_q.device)
    path = _LARGE_PATH.get(key)
    if path is None:
        if interpreting():  # not timed: the pointer GEMM, whose equality to the descriptor GEMM the tests check
            path = "pointers"
        else:
            paths = {"pointers": functools.partial(_pointer_gemm, *operands),
                     "tma": functools.partial(_tma_gemm, *operands)}
            path = fastest_path(_LARGE_PATH, key, paths, "int8_gemm")
    (_tma_gemm if path == "tma" else _pointer_gemm)(*operands)
    return out


def _pointer_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                  bias: torch.Tensor | None, out: torch.Tensor, narrow: bool = False) -> None:
    """``int8_gemm`` into ``out`` by ``_int8_gemm_kernel`` (pointer loads): fixed blocks for decode rows and
    under the interpreter (``narrow``: half-width ones), autotuned otherwise."""
    (m, k), n = x_q.shape, w_q.shape[0]
    args = (x_q, w_q, out, x_scale, w_scale, bias if bias is not None else w_scale, m, n, k,
            x_q.stride(0), w_q.stride(0), out.stride(0), next_power_of_2(m))
    consts = _fixed_consts(m, k, bias is not None, narrow)
    if consts is None:
        grid = lambda meta: (cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"]),)  # noqa: E731
        _GEMM_LARGE_M[grid](*args, HAS_BIAS=bias is not None, GROUP_M=8)
    else:
        _LAUNCH_GEMM((cdiv(m, consts["BLOCK_M"]) * cdiv(n, consts["BLOCK_N"]),), *args, **consts, GROUP_M=8)


def _tma_fits(x_q: torch.Tensor, w_q: torch.Tensor) -> bool:
    """Whether the descriptor GEMM can take these operands: a GPU with TMA (Hopper on) or the interpreter,
    rows of a multiple of 16 bytes and 16-byte aligned starts (what a descriptor needs)."""
    if x_q.shape[1] % 16 or x_q.data_ptr() % 16 or w_q.data_ptr() % 16:
        return False
    return interpreting() or (x_q.is_cuda and torch.cuda.get_device_capability(x_q.device)[0] >= 9)


def _tma_gemm(x_q: torch.Tensor, x_scale: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
              bias: torch.Tensor | None, out: torch.Tensor) -> None:
    """``int8_gemm`` into ``out`` by ``_int8_gemm_tma_kernel``: autotuned on a GPU (the pre-hook sets the
    descriptors' blocks), small fixed tiles and a persistent grid under the interpreter."""
    (m, k), n = x_q.shape, w_q.shape[0]
    a = TensorDescriptor.from_tensor(x_q, [_INTERPRET_TMA["BLOCK_M"], _INTERPRET_TMA["BLOCK_K"]])
    b = TensorDescriptor.from_tensor(w_q, [_INTERPRET_TMA["BLOCK_N"], _INTERPRET_TMA["BLOCK_K"]])
    args = (a, b, out, x_scale, w_scale, bias if bias is not None else w_scale, m, n, k, out.stride(0),
            next_power_of_2(m))
    if interpreting():
        _int8_gemm_tma_kernel[(_INTERPRET_PROGRAMS,)](*args, HAS_BIAS=bias is not None, GROUP_M=8,
                                                       PROGRAMS_PER_SM=1, **_INTERPRET_TMA)
        return
    _GEMM_TMA[functools.partial(_tma_grid, m, n, x_q.device)](*args, HAS_BIAS=bias is not None, GROUP_M=8)


def _tma_grid(m: int, n: int, device: torch.device, meta: dict) -> tuple[int]:
    """The descriptor GEMM's programs for a config ``meta``: one per output tile, or ``PROGRAMS_PER_SM`` per SM
    where there are more tiles than that."""
    tiles = cdiv(m, meta["BLOCK_M"]) * cdiv(n, meta["BLOCK_N"])
    per_sm = meta["PROGRAMS_PER_SM"]
    return (min(tiles, per_sm * sm_count(device)) if per_sm else tiles,)


def int8_linear(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` with x quantized per token and W given as int8 (N, K) with per-channel
    ``w_scale`` (N,): one quantize pass and one GEMM with a fused dequant epilogue; x's dtype out. Decode
    rows (up to ``DECODE_ROWS``) may take both in one launch (``_int8_decode_kernel``), with the same int8
    values, and either call half-width tiles, whichever whole call is the fastest on the GPU.

    x may have leading batch dims (..., K); the weight comes from ``reference.quantize_per_channel``.
    """
    if w_q.dtype != torch.int8 or w_q.dim() != 2:
        raise TypeError(f"w_q must be a 2-D int8 tensor (N, K), got {w_q.dtype} of shape {tuple(w_q.shape)}")
    check_float_input("int8_linear", x)
    n, k = w_q.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    bias = checked_bias(bias, n, x.device)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k)
    m = x2.shape[0]
    if m == 0 or n == 0:
        return torch.empty((*lead, n), device=x.device, dtype=x.dtype)
    if m > DECODE_ROWS:
        return _two_launches(x2, w_q, w_scale, bias).reshape(*lead, n)
    key = (m, n, k, x.dtype, bias is not None, x.device)
    bound = _BOUND.get(key)  # a decode shape's later calls: straight to the kernel its first call compiled
    if bound is not None:
        x2 = x2.contiguous()
        out = torch.empty((m, n), device=x.device, dtype=x.dtype)
        bound(*_decode_args(x2, w_q, w_scale, bias, out, m, n, k))
        return out.reshape(*lead, n)
    path = _DECODE_PATH.get(key)
    if path is None:
        if interpreting():  # not timed: the one launch, whose equality to the two launches the tests check
            path = "one_launch"
        else:
            paths = {name: functools.partial(call, x2, w_q, w_scale, bias) for name, call in _DECODE_PATHS.items()}
            path = fastest_path(_DECODE_PATH, key, paths, "int8_linear")
    return _DECODE_PATHS[path](x2, w_q, w_scale, bias, bind=key).reshape(*lead, n)


def _two_launches(x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                  bind: tuple | None = None, narrow: bool = False) -> torch.Tensor:
    """The quantize pass, then the GEMM with its epilogue: (M, K) in, (M, N) in x's dtype out; ``narrow`` (decode
    rows): the GEMM's half-width tiles. Two launches are not bound as one: ``bind`` is unused."""
    x_q, x_scale = quantize_rows(x2)
    return int8_gemm(x_q, x_scale, w_q, w_scale, bias, x2.dtype, narrow=narrow)


def _decode_args(x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                 out: torch.Tensor, m: int, n: int, k: int) -> tuple:
    """``_int8_decode_kernel``'s runtime arguments, in its signature's order, for an (m, k) contiguous x2 and
    an (n, k) weight (the sizes passed in: this runs on every decode call)."""
    w_q, w_scale = _weight_args(w_q, w_scale)
    return (x2, w_q, out, w_scale, bias if bias is not None else w_scale, m, n, k, x2.stride(0), w_q.stride(0),
            out.stride(0))


def _one_launch(x2: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor | None,
                bind: tuple | None = None, narrow: bool = False) -> torch.Tensor:
    """Decode rows quantized inside the GEMM (``_int8_decode_kernel``; ``narrow``: half-width tiles); with ``bind``
    (the shape's key), later calls of that key go straight to the compiled kernel (``_BOUND``)."""
    x2 = x2.contiguous()
    m, k = x2.shape
    n = w_q.shape[0]
    out = torch.empty((m, n), device=x2.device, dtype=x2.dtype)
    args = _decode_args(x2, w_q, w_scale, bias, out, m, n, k)
    consts = _fixed_consts(m, k, bias is not None, narrow)
    grid = (cdiv(m, consts["BLOCK_M"]), cdiv(n, consts["BLOCK_N"]))
    _LAUNCH_DECODE(grid, *args, **consts)
    if bind is not None:
        bound = _LAUNCH_DECODE.bind(grid, *args, **consts)
        if bound is not None:  # None under the interpreter
            _BOUND[bind] = bound
    return out


#: The ways of making a decode call, by the names ``_DECODE_PATH`` holds: two launches or one, each with the wide
#: or the half-width tiles; the first is the fallback should another fail to build on a GPU.
_DECODE_PATHS = {"two_launches": _two_launches, "one_launch": _one_launch,
                 "two_launches_narrow": functools.partial(_two_launches, narrow=True),
                 "one_launch_narrow": functools.partial(_one_launch, narrow=True)}


def precompile(m: int, n: int, k: int, dtype: torch.dtype, has_bias: bool, shard: tuple[int, int] = (0, 1)) -> None:
    """Compile, without launching, this shard's part of what an (m, k) x (n, k) call with ``dtype`` out may run:
    for prefill rows the autotuning candidates of both GEMMs (pointer loads, descriptors), for decode rows the
    GEMM and the one-launch kernel with wide and half-width tiles. A run's worker processes so compile them side
    by side (job ``i`` goes to shard ``i % count``) rather than one by one in the first call."""
    if interpreting():
        return
    device = torch.device("cuda", torch.cuda.current_device())
    x_q = torch.zeros((1, k), device=device, dtype=torch.int8)
    scale = torch.zeros((1,), device=device, dtype=torch.float32)
    out = torch.zeros((1, 1), device=device, dtype=dtype)
    bias = torch.zeros((1,), device=device, dtype=dtype) if has_bias else scale
    # the integer arguments' values matter only through Triton's specialization (divisible by 16, equal to 1)
    gemm_args = (x_q, x_q, out, scale, scale, bias, m, n, k, k, k, n, next_power_of_2(m))
    jobs: list[tuple[triton.JITFunction, tuple, dict]] = []
    if m <= DECODE_ROWS:
        x = torch.zeros((1, k), device=device, dtype=dtype)
        for narrow in (False, True):
            consts = _fixed_consts(m, k, has_bias, narrow)
            jobs.append((_int8_gemm_kernel, gemm_args, {**consts, "GROUP_M": 8}))
            jobs.append((_int8_decode_kernel, (x, x_q, out, scale, bias, m, n, k, k, k, n), consts))
    else:
        common = {"HAS_BIAS": has_bias, "GROUP_M": 8}
        jobs += [(_int8_gemm_kernel, gemm_args, {**common, "EVEN_K": k % cfg.kwargs["BLOCK_K"] == 0,
                                                 **cfg.all_kwargs()}) for cfg in _LARGE_M_CONFIGS]
        if _tma_fits(x_q, x_q):
            for cfg in _TMA_CONFIGS:
                a = TensorDescriptor.from_tensor(x_q, [cfg.kwargs["BLOCK_M"], cfg.kwargs["BLOCK_K"]])
                b = TensorDescriptor.from_tensor(x_q, [cfg.kwargs["BLOCK_N"], cfg.kwargs["BLOCK_K"]])
                jobs.append((_int8_gemm_tma_kernel, (a, b, out, scale, scale, bias, m, n, k, n, next_power_of_2(m)),
                             {**common, **cfg.all_kwargs()}))
    index, count = shard
    for kernel, args, kwargs in jobs[index::count]:
        kernel.warmup(*args, grid=(1,), **kwargs)
