"""Sliding-window / BigBird attention in Triton: FlashAttention-2's online softmax over the listed tiles only.

Layout: ``q`` is (B, H, Sq, D), ``k`` and ``v`` are (B, H, Sk, D), ``Sq <= Sk`` with queries aligned to the
last keys (``mask.py`` defines the mask: window, global tokens, random blocks, causal).

Before the launch, ``mask.tile_classes`` sorts every (query tile, key tile) pair into skipped, whole or
masked, and ``mask.tile_lists`` turns that into a list of key tiles per query tile (whole ones first).
Each forward program walks its list: whole tiles with no mask arithmetic at all, then the few masked tiles
(window edges, sequence ends, random blocks that do not fill a tile) with the token predicate evaluated in
registers. So the work per query is proportional to the keys it sees (about ``2 * window`` plus the globals
and random blocks), not to ``Sk``. Building the lists costs a handful of small tensor ops on the same device
and never waits for the GPU (the lists are as wide as the key axis). Without random blocks the lists
depend on the shapes alone, so small grids keep theirs between calls (``_mask_tiles``): a model's layers,
training steps and repeated decode lengths then launch the attention kernel and nothing else.

Backward (FA2): ``delta = rowsum(dO * O)``; one program per key tile accumulates dK and dV over the query
tiles of the transposed lists; one program per query tile accumulates dQ over the forward's lists. P is
recomputed from the saved base-2 log-sum-exp; nothing of size Sq x Sk is stored and no atomics are needed.

A query that sees no key outputs zero and gets LSE = +inf, so its P, and its gradients, are zero too.

Tiles are chosen per dtype, head dim and BigBird block (one tiling serves all three kernels, so one class
matrix serves forward and backward); on a GPU the warps and pipeline depth are autotuned per kernel. Under
the Triton interpreter a fixed small tiling is used and dot operands are rounded to their storage dtype and
multiplied in fp32 (``microscope_kernels.fp32_dot``), the same math as a tensor-core dot with fp32
accumulation.
"""
from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from microscope_kernels.attention_inputs import check_qkv
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.fp32_dot import mma as _mma
from microscope_kernels.fp32_dot import round_to as _round

from microscope.api import interpreting

from .mask import MaskSpec, TileLists, block_pairs, n_blocks, tile_classes, tile_lists

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "SlidingWindowAttentionFn",
    "precompile",
    "sliding_window_attention",
    "tiles_for",
]

#: Head dims the kernels are built for.
SUPPORTED_HEAD_DIMS = (32, 64, 128)
_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x * scale) == exp2(x * scale * log2(e))
# Integers that only bound loops, masks and indices: specializing on them would recompile for every length.
_NO_SPECIALIZE = ["Sq", "Sk", "OFF", "window", "G", "B", "NB", "LIST_W"]


# ----------------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _visible(p, j, Sk, window, G, B, NB, PAIRS, CAUSAL: tl.constexpr, HAS_PAIRS: tl.constexpr):
    """``mask.visible`` on broadcastable query positions ``p`` and key indices ``j``, and ``j < Sk``."""
    d = p - j
    if CAUSAL:
        seen = (d >= 0) & (d < window)
    else:
        seen = (d > -window) & (d < window)
    seen = seen | (p < G) | (j < G)
    if HAS_PAIRS:
        qb = tl.minimum(p // B, NB - 1)
        kb = tl.minimum(j // B, NB - 1)
        seen = seen | (tl.load(PAIRS + qb * NB + kb) != 0)
    if CAUSAL:
        seen = seen & (j <= p)
    return seen & (j < Sk)


@triton.jit
def _rows(base, start, n_valid, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, MASKED: tl.constexpr):
    """Rows ``[start, start + BLOCK)`` of one head's (S, HEAD_DIM) matrix; ``MASKED`` reads zeros past
    ``n_valid`` (whole tiles lie inside the sequence and skip the mask)."""
    rows = start + tl.arange(0, BLOCK)
    ptrs = base + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    if MASKED:
        return tl.load(ptrs, mask=rows[:, None] < n_valid, other=0.0)
    else:
        return tl.load(ptrs)


@triton.jit
def _store_rows(base, start, n_valid, value, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    rows = start + tl.arange(0, BLOCK)
    ptrs = base + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(ptrs, value, mask=rows[:, None] < n_valid)


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr, CAUSAL: tl.constexpr,
              HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """One base-2 online-softmax step over keys ``[start_n, start_n + BLOCK_N)``."""
    k = _rows(k_base, start_n, Sk, BLOCK_N, HEAD_DIM, MASKED)
    s = _mma(q, tl.trans(k), None, INTERPRET, IEEE) * qk_scale
    if MASKED:
        j = start_n + tl.arange(0, BLOCK_N)
        seen = _visible(p[:, None], j[None, :], Sk, window, G, B, NB, PAIRS, CAUSAL, HAS_PAIRS)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = m_new
    alpha = tl.math.exp2(m_i - m_use)
    p_tile = tl.math.exp2(s - m_use[:, None])
    l_i = l_i * alpha + tl.sum(p_tile, 1)
    v = _rows(v_base, start_n, Sk, BLOCK_N, HEAD_DIM, MASKED)
    acc = _mma(_round(p_tile, DTYPE, INTERPRET), v, acc * alpha[:, None], INTERPRET, IEEE)
    return acc, l_i, m_new


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _swa_fwd(Q, K, V, Out, LSE, COUNT, FULL, INDEX, PAIRS, sm_scale, Sq, Sk, OFF, window, G, B, NB, LIST_W,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr):
    """O and base-2 LSE for ``BLOCK_M`` queries of one head, over the key tiles listed for them."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    q_base = Q + bh * Sq * HEAD_DIM
    k_base = K + bh * Sk * HEAD_DIM
    v_base = V + bh * Sk * HEAD_DIM
    offs_m = m0 + tl.arange(0, BLOCK_M)
    p = offs_m + OFF
    q = _rows(q_base, m0, Sq, BLOCK_M, HEAD_DIM, True)
    qk_scale = sm_scale * _LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    n_full = tl.load(FULL + pid_m)
    n_all = tl.load(COUNT + pid_m)
    row = INDEX + pid_m * LIST_W
    for t in range(0, n_full):
        start_n = tl.load(row + t) * BLOCK_N
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS,
                                  qk_scale, HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, HAS_PAIRS, INTERPRET, IEEE, False)
    for t in range(n_full, n_all):
        start_n = tl.load(row + t) * BLOCK_N
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS,
                                  qk_scale, HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, HAS_PAIRS, INTERPRET, IEEE, True)

    empty = l_i == 0.0  # saw no key: output 0, LSE = +inf so that the backward's P is 0 there
    l_safe = tl.where(empty, 1.0, l_i)
    tl.store(LSE + bh * Sq + offs_m, tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe)), mask=offs_m < Sq)
    _store_rows(Out + bh * Sq * HEAD_DIM, m0, Sq, _round(acc / l_safe[:, None], DTYPE, INTERPRET), BLOCK_M,
                HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["Sq"])
def _swa_bwd_delta(Out, DO, DELTA, Sq, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(dO * O)`` in fp32: the softmax-Jacobian term shared by the dQ and dK kernels."""
    bh = tl.program_id(1).to(tl.int64)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = bh * Sq * HEAD_DIM + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    rows = offs_m[:, None] < Sq
    o = tl.load(Out + offs, mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=rows, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * Sq + offs_m, tl.sum(o * do, 1), mask=offs_m < Sq)


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_base, do_base, lse_base, delta_base, start_m, j, Sq, Sk, OFF, window, G, B, NB,
               PAIRS, qk_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DTYPE: tl.constexpr,
               CAUSAL: tl.constexpr, HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr,
               MASKED: tl.constexpr):
    """Add queries ``[start_m, start_m + BLOCK_M)`` to dK, dV of one key tile (on transposed scores)."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _rows(q_base, start_m, Sq, BLOCK_M, HEAD_DIM, MASKED)
    do = _rows(do_base, start_m, Sq, BLOCK_M, HEAD_DIM, MASKED)
    if MASKED:  # LSE = +inf past Sq makes P = 0 for the rows that do not exist
        lse = tl.load(lse_base + offs_m, mask=offs_m < Sq, other=float("inf"))
        delta = tl.load(delta_base + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        lse = tl.load(lse_base + offs_m)
        delta = tl.load(delta_base + offs_m)
    s_t = _mma(k, tl.trans(q), None, INTERPRET, IEEE)
    p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
    if MASKED:
        seen = _visible((offs_m + OFF)[None, :], j[:, None], Sk, window, G, B, NB, PAIRS, CAUSAL, HAS_PAIRS)
        p_t = tl.where(seen, p_t, 0.0)
    dv = _mma(_round(p_t, DTYPE, INTERPRET), do, dv, INTERPRET, IEEE)
    dp_t = _mma(v, tl.trans(do), None, INTERPRET, IEEE)
    ds_t = p_t * (dp_t - delta[None, :])
    return _mma(_round(ds_t, DTYPE, INTERPRET), q, dk, INTERPRET, IEEE), dv


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _swa_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, COUNT, FULL, INDEX, PAIRS, sm_scale, Sq, Sk, OFF, window, G, B,
                  NB, LIST_W, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  CAUSAL: tl.constexpr, HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr):
    """dK, dV for ``BLOCK_N`` keys of one head, over the query tiles listed for them."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_n = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    n0 = pid_n * BLOCK_N
    q_base = Q + bh * Sq * HEAD_DIM
    do_base = DO + bh * Sq * HEAD_DIM
    kv_off = bh * Sk * HEAD_DIM
    k = _rows(K + kv_off, n0, Sk, BLOCK_N, HEAD_DIM, True)
    v = _rows(V + kv_off, n0, Sk, BLOCK_N, HEAD_DIM, True)
    j = n0 + tl.arange(0, BLOCK_N)
    qk_scale = sm_scale * _LOG2E
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    n_full = tl.load(FULL + pid_n)
    n_all = tl.load(COUNT + pid_n)
    col = INDEX + pid_n * LIST_W
    for t in range(0, n_full):
        start_m = tl.load(col + t) * BLOCK_M
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE + bh * Sq, DELTA + bh * Sq, start_m, j, Sq, Sk, OFF,
                            window, G, B, NB, PAIRS, qk_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, HAS_PAIRS,
                            INTERPRET, IEEE, False)
    for t in range(n_full, n_all):
        start_m = tl.load(col + t) * BLOCK_M
        dk, dv = _dkdv_tile(dk, dv, k, v, q_base, do_base, LSE + bh * Sq, DELTA + bh * Sq, start_m, j, Sq, Sk, OFF,
                            window, G, B, NB, PAIRS, qk_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, HAS_PAIRS,
                            INTERPRET, IEEE, True)

    _store_rows(DV + kv_off, n0, Sk, _round(dv, DTYPE, INTERPRET), BLOCK_N, HEAD_DIM)
    _store_rows(DK + kv_off, n0, Sk, _round(dk * sm_scale, DTYPE, INTERPRET), BLOCK_N, HEAD_DIM)


@triton.jit
def _dq_tile(dq, q, do, lse, delta, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr, CAUSAL: tl.constexpr,
             HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """Add keys ``[start_n, start_n + BLOCK_N)`` to dQ of one query tile."""
    k = _rows(k_base, start_n, Sk, BLOCK_N, HEAD_DIM, MASKED)
    v = _rows(v_base, start_n, Sk, BLOCK_N, HEAD_DIM, MASKED)
    s = _mma(q, tl.trans(k), None, INTERPRET, IEEE)
    p_tile = tl.math.exp2(s * qk_scale - lse[:, None])
    if MASKED:
        j = start_n + tl.arange(0, BLOCK_N)
        seen = _visible(p[:, None], j[None, :], Sk, window, G, B, NB, PAIRS, CAUSAL, HAS_PAIRS)
        p_tile = tl.where(seen, p_tile, 0.0)
    dp = _mma(do, tl.trans(v), None, INTERPRET, IEEE)
    ds = p_tile * (dp - delta[:, None])
    return _mma(_round(ds, DTYPE, INTERPRET), k, dq, INTERPRET, IEEE)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _swa_bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, COUNT, FULL, INDEX, PAIRS, sm_scale, Sq, Sk, OFF, window, G, B, NB,
                LIST_W, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                CAUSAL: tl.constexpr, HAS_PAIRS: tl.constexpr, INTERPRET: tl.constexpr):
    """dQ for ``BLOCK_M`` queries of one head, over the forward's key tiles."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_m = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    m0 = pid_m * BLOCK_M
    q_off = bh * Sq * HEAD_DIM
    k_base = K + bh * Sk * HEAD_DIM
    v_base = V + bh * Sk * HEAD_DIM
    offs_m = m0 + tl.arange(0, BLOCK_M)
    p = offs_m + OFF
    q = _rows(Q + q_off, m0, Sq, BLOCK_M, HEAD_DIM, True)
    do = _rows(DO + q_off, m0, Sq, BLOCK_M, HEAD_DIM, True)
    lse = tl.load(LSE + bh * Sq + offs_m, mask=offs_m < Sq, other=float("inf"))
    delta = tl.load(DELTA + bh * Sq + offs_m, mask=offs_m < Sq, other=0.0)
    qk_scale = sm_scale * _LOG2E
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    n_full = tl.load(FULL + pid_m)
    n_all = tl.load(COUNT + pid_m)
    row = INDEX + pid_m * LIST_W
    for t in range(0, n_full):
        start_n = tl.load(row + t) * BLOCK_N
        dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS, qk_scale,
                      HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, HAS_PAIRS, INTERPRET, IEEE, False)
    for t in range(n_full, n_all):
        start_n = tl.load(row + t) * BLOCK_N
        dq = _dq_tile(dq, q, do, lse, delta, k_base, v_base, start_n, p, Sk, window, G, B, NB, PAIRS, qk_scale,
                      HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, HAS_PAIRS, INTERPRET, IEEE, True)

    _store_rows(DQ + q_off, m0, Sq, _round(dq * sm_scale, DTYPE, INTERPRET), BLOCK_M, HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------
# Launch configuration
# ----------------------------------------------------------------------------------------------------------

#: Autotuned on a GPU: warps and pipeline depth only. The tiles are fixed per case (``tiles_for``) because
#: the tile lists are built for one tiling before the launch.
_CONFIGS = [triton.Config({}, num_warps=w, num_stages=s) for w in (4, 8) for s in (2, 3, 4)]
_KEY = ["HEAD_DIM", "BLOCK_M", "BLOCK_N", "CAUSAL", "HAS_PAIRS"]
_FWD = triton.autotune(_CONFIGS, key=_KEY, do_bench=bench_candidate)(_swa_fwd)
_DKDV = triton.autotune(_CONFIGS, key=_KEY, do_bench=bench_candidate)(_swa_bwd_dkdv)
_DQ = triton.autotune(_CONFIGS, key=_KEY, do_bench=bench_candidate)(_swa_bwd_dq)
#: Under the interpreter: small tiles, so tile edges fall inside windows, blocks and sequences (the tests
#: also run unequal ones).
_INTERPRET_TILES = (32, 32)


def tiles_for(dtype: torch.dtype, head_dim: int, block: int, has_pairs: bool) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N) of the kernels for a case.

    fp16/bf16: 128 x 64 (FA2's forward tile on Hopper), or 64 x 64 where random blocks of a size that is
    not a multiple of 128 would leave each 128-query tile half masked on every random block (a 64-query tile
    on a 64-aligned BigBird block is whole). fp32's exact dots run on CUDA cores: 32 x 32 spills least.
    """
    if interpreting():
        return _INTERPRET_TILES
    if dtype == torch.float32:
        return 32, 32
    if has_pairs and block % 128:
        return 64, 64
    return 128, 64


def _launch(tuner, grid, *args, **kwargs) -> None:
    if interpreting():
        tuner.fn[grid](*args, **kwargs)
    else:
        tuner[grid](*args, **kwargs)


def precompile(dtype: torch.dtype, head_dim: int, block: int, has_pairs: bool, causal: bool,
               device: torch.device | str, backward: bool = True,
               shard: tuple[int, int] = (0, 1)) -> list[tuple[str, str, str]]:
    """Compile, without running, the ``shard[0]``-th of ``shard[1]`` parts of the autotuning candidates a
    case of these constexprs will launch (candidate ``i`` goes to shard ``i % count``), into Triton's
    on-disk cache, so the autotuner of the run's own process finds every binary there.

    Returns (kernel, config, error) per candidate that failed to build; the autotuner prunes those itself
    (a config that needs more shared memory than the GPU has). Nothing to do under the interpreter.
    """
    if interpreting():
        return []
    block_m, block_n = tiles_for(dtype, head_dim, block, has_pairs)
    rows = torch.zeros((1, 1, block_m, head_dim), dtype=dtype, device=device)
    lse = torch.zeros((1, block_m), dtype=torch.float32, device=device)
    lists = torch.zeros((1, 1), dtype=torch.int32, device=device)
    spec = MaskSpec(window=1, causal=causal, block=block)
    mask = (*_mask_args(spec, _pair_bytes(None, torch.device(device)), 0.125, block_m, block_m), 1)  # LIST_W 1
    meta = _meta(spec, head_dim, block_m, block_n, has_pairs)
    launches = [(_FWD, (rows, rows, rows, rows, lse, lists, lists, lists, *mask))]
    if backward:
        launches += [(_DKDV, (rows, rows, rows, rows, rows, rows, lse, lse, lists, lists, lists, *mask)),
                     (_DQ, (rows, rows, rows, rows, rows, lse, lse, lists, lists, lists, *mask))]
    candidates = [(tuner, args, cfg) for tuner, args in launches for cfg in tuner.configs]
    failures = []
    for tuner, args, cfg in candidates[shard[0]::shard[1]]:
        try:
            tuner.fn.warmup(*args, grid=(1,), **meta, **cfg.all_kwargs())
        except Exception as exc:  # noqa: BLE001 - report every candidate that does not build
            failures.append((tuner.fn.__name__, str(cfg), f"{type(exc).__name__}: {str(exc)[:300]}"))
    return failures


#: Tile grids up to this many (query tile, key tile) pairs, without random blocks, keep their class matrix
#: and lists between calls (about 5 bytes a pair: at most 20 MB over the cache's 256 entries, below what a
#: worker counts as a leak).
CACHED_TILE_PAIRS = 1 << 14


def _mask_tiles(spec: MaskSpec, pairs: torch.Tensor | None, sq: int, sk: int, block_m: int, block_n: int,
                device: torch.device) -> tuple[torch.Tensor, TileLists]:
    """The class matrix and per-query-tile lists of a call: kept per shape where they depend on it alone."""
    if pairs is None and triton.cdiv(sq, block_m) * triton.cdiv(sk, block_n) <= CACHED_TILE_PAIRS:
        return _shape_tiles(spec, sq, sk, block_m, block_n, device)
    classes = tile_classes(spec, pairs, sq, sk, block_m, block_n, device=device)
    return classes, tile_lists(classes)


@functools.lru_cache(maxsize=256)
def _shape_tiles(spec: MaskSpec, sq: int, sk: int, block_m: int, block_n: int,
                 device: torch.device) -> tuple[torch.Tensor, TileLists]:
    """``_mask_tiles`` for a mask without random blocks, built once per shape: about twenty small tensor ops
    a call otherwise, which bound a one-token decode step. Read-only for every caller."""
    classes = tile_classes(spec, None, sq, sk, block_m, block_n, device=device)
    return classes, tile_lists(classes)


# ----------------------------------------------------------------------------------------------------------
# Autograd
# ----------------------------------------------------------------------------------------------------------


class SlidingWindowAttentionFn(torch.autograd.Function):
    """Autograd glue: the forward saves O, the log-sum-exp and the tile classes; backward recomputes P."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pairs: torch.Tensor | None,
                spec: MaskSpec, sm_scale: float) -> torch.Tensor:
        batch, heads, sq, head_dim = q.shape
        sk = k.shape[2]
        block_m, block_n = tiles_for(q.dtype, head_dim, spec.block, pairs is not None)
        classes, rows = _mask_tiles(spec, pairs, sq, sk, block_m, block_n, q.device)
        o = torch.empty_like(q)
        lse = torch.empty((batch * heads, sq), device=q.device, dtype=torch.float32)
        pair_bytes = _pair_bytes(pairs, q.device)
        ctx.spec, ctx.sm_scale, ctx.tiles, ctx.has_pairs = spec, sm_scale, (block_m, block_n), pairs is not None
        ctx.save_for_backward(q, k, v, o, lse, classes, rows.count, rows.full, rows.index, pair_bytes)
        if o.numel() == 0:  # no batch row or no head: nothing to launch
            return o
        _launch(_FWD, (triton.cdiv(sq, block_m), batch * heads), q, k, v, o, lse, rows.count, rows.full,
                rows.index, *_mask_args(spec, pair_bytes, sm_scale, sq, sk), rows.index.shape[1],
                **_meta(spec, head_dim, block_m, block_n, pairs is not None))
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse, classes, row_count, row_full, row_index, pair_bytes = ctx.saved_tensors
        spec, sm_scale, (block_m, block_n) = ctx.spec, ctx.sm_scale, ctx.tiles
        batch, heads, sq, head_dim = q.shape
        sk = k.shape[2]
        if q.numel() == 0:
            return torch.zeros_like(q), torch.zeros_like(k), torch.zeros_like(v), None, None, None
        do = do.contiguous()
        delta = torch.empty_like(lse)
        delta_block = 32 if interpreting() else 128
        _swa_bwd_delta[(triton.cdiv(sq, delta_block), batch * heads)](o, do, delta, sq, HEAD_DIM=head_dim,
                                                                      BLOCK_M=delta_block)
        cols = tile_lists(classes.T)
        dq, dk, dv = torch.empty_like(q), torch.empty_like(k), torch.empty_like(v)
        mask_args = _mask_args(spec, pair_bytes, sm_scale, sq, sk)
        meta = _meta(spec, head_dim, block_m, block_n, ctx.has_pairs)
        _launch(_DKDV, (triton.cdiv(sk, block_n), batch * heads), q, k, v, do, dk, dv, lse, delta, cols.count,
                cols.full, cols.index, *mask_args, cols.index.shape[1], **meta)
        _launch(_DQ, (triton.cdiv(sq, block_m), batch * heads), q, k, v, do, dq, lse, delta, row_count, row_full,
                row_index, *mask_args, row_index.shape[1], **meta)
        return dq, dk, dv, None, None, None


def _pair_bytes(pairs: torch.Tensor | None, device: torch.device) -> torch.Tensor:
    """The (n_blocks, n_blocks) pair matrix as bytes for the kernels, or a one-byte stand-in they never read."""
    if pairs is None:
        return torch.zeros(1, dtype=torch.uint8, device=device)
    return pairs.to(torch.uint8).contiguous()


def _mask_args(spec: MaskSpec, pair_bytes: torch.Tensor, sm_scale: float, sq: int, sk: int) -> tuple:
    """The kernels' arguments from ``PAIRS`` to ``NB``, in their order."""
    n_pair_blocks = pair_bytes.shape[0] if pair_bytes.dim() == 2 else 1
    return (pair_bytes, sm_scale, sq, sk, sk - sq, spec.window, spec.globals, spec.block, n_pair_blocks)


def _meta(spec: MaskSpec, head_dim: int, block_m: int, block_n: int, has_pairs: bool) -> dict:
    return {"HEAD_DIM": head_dim, "BLOCK_M": block_m, "BLOCK_N": block_n, "CAUSAL": spec.causal,
            "HAS_PAIRS": has_pairs, "INTERPRET": interpreting()}


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> None:
    check_qkv("sliding_window_attention", q, k, v, SUPPORTED_HEAD_DIMS)
    if not sm_scale > 0:
        raise ValueError(f"sm_scale must be positive (it is folded into a running max), got {sm_scale}")


def sliding_window_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: torch.Tensor | None = None,
                             window: int = 0, globals: int = 0, block: int = 64, causal: bool = False,
                             sm_scale: float | None = None) -> torch.Tensor:
    """Softmax attention restricted to ``mask.py``'s mask, visiting only the tiles the mask touches.

    Args:
        q: (B, H, Sq, D) queries; k, v: (B, H, Sk, D) with Sq <= Sk (queries are the last Sq positions).
            fp32, fp16 or bf16 (one dtype), D in ``SUPPORTED_HEAD_DIMS``; non-contiguous inputs are copied.
        pattern: (ceil(Sk / block), r) integer key-block indices per query block (BigBird's random blocks,
            -1 for none; ``mask.random_block_pattern`` draws one), or None.
        window: ``|p - j| < window`` (``0 <= p - j < window`` when causal); 0 sees no neighbour.
        globals: the first ``globals`` positions attend to, and are attended by, every position.
        block: BigBird block size of ``pattern``.
        causal: also require ``j <= p``.
        sm_scale: score scale, default ``1 / sqrt(D)``.

    Returns:
        (B, H, Sq, D) in the input dtype, zero for queries that see no key; differentiable in q, k and v.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    _check_inputs(q, k, v, scale)
    spec = MaskSpec(window=window, causal=bool(causal), globals=globals, block=block)
    sq, sk = q.shape[2], k.shape[2]
    if sq > sk or sq == 0:
        raise ValueError(f"need 1 <= Sq <= Sk (queries aligned to the last keys), got Sq={sq}, Sk={sk}")
    pairs = block_pairs(None if pattern is None else pattern.to(q.device), n_blocks(sk, block))
    return SlidingWindowAttentionFn.apply(q.contiguous(), k.contiguous(), v.contiguous(), pairs, spec, scale)
