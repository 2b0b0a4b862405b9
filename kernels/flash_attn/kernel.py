"""FlashAttention-2 forward and backward in Triton, tuned for Hopper, runnable through the CPU interpreter.

Layout: ``q`` is (B, H, Sq, D), ``k`` and ``v`` are (B, H, Sk, D). Every (batch, head) pair is one row block
of a flattened (B*H*S, D) matrix, so a program addresses its head by a row offset. That is what lets the
Hopper path read tiles through TMA tensor descriptors built in the kernel (one 2-D descriptor per tensor).
A tile that runs past its head reads the next head's rows there (zeros past the tensor's end); those rows
are masked out of every result, so they matter only if they hold inf/NaN, which would already poison that
other head's own output.

Causal masking is aligned bottom-right as in FlashAttention-2: query ``i`` sees keys ``j <= i + Sk - Sq``.
With ``Sq == Sk`` that is ordinary causal attention; with ``Sq < Sk`` it is chunked prefill (the last ``Sq``
queries of a ``Sk`` long sequence); with ``Sq > Sk`` the first ``Sq - Sk`` queries see no key at all, and
their output (and gradient) is zero, as in FlashAttention-2 and PyTorch's SDPA.

Forward (per program: ``BLOCK_M`` queries of one head):
    online softmax over ``BLOCK_N``-key tiles, in base 2: ``log2(e) * sm_scale`` is folded into one scale,
    so each score costs one FMA and one ``exp2``. The key range is split in two loops: tiles every query of
    the block sees completely (no mask arithmetic at all), then the few tiles that need the causal or the
    sequence-end mask; without causal mask and with whole tiles the second loop is not compiled, which lets
    Triton warp-specialize the first (TMA loads in their own warps). With ``split`` the masked tiles run in a
    second launch instead, so the first is warp-specializable for causal attention too. Optionally
    (``LAZY``) the accumulator is rescaled only when a row max grew by more than 2^8. Saves O and the per-row
    log-sum-exp (base 2).
Backward (FA2): ``delta = rowsum(dO * O)``; one kernel per ``BLOCK_N`` keys accumulates dK and dV over the
    queries that see them; one kernel per ``BLOCK_M`` queries accumulates dQ. Both recompute P from the saved
    log-sum-exp, so nothing of size Sq x Sk is ever stored, and neither needs atomics. With ``dq="atomic"``
    the dK/dV kernel instead adds each tile pair's dS K into a zeroed fp32 dQ buffer (a TMA bulk reduction
    on Hopper, pointer atomics elsewhere): 5 GEMMs per tile pair instead of 7, one more fp32 buffer of
    dQ's size, and a summation order that varies between runs.

On a GPU every kernel is autotuned over tile sizes, pipeline depth, warps and those two options, keyed on the
power-of-two buckets of Sq and Sk, the head dim, causal, whole tiles, the dtype and the load path, except
where a tuned table for this GPU and Triton (``tuned.py``, ``tuned/*.json``) lists the key. Knobs:
``MICROSCOPE_FLASH_TMA=0/1`` forces pointer or TMA loads (default: TMA for fp16/bf16 on sm_90+), and
``MICROSCOPE_FLASH_NO=WARP_SPEC,LAZY`` drops candidates using those features. Under the Triton interpreter a
fixed small configuration is used instead, and dot operands are rounded to their storage dtype and then
multiplied in fp32, because the interpreter's bf16 arithmetic is not IEEE-correct; that is the same math as
a bf16 tensor-core dot with fp32 accumulation.
"""
from __future__ import annotations

import itertools
import logging
import math
import os
from typing import NamedTuple

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import timer
from microscope_kernels.fp32_dot import mma as _mma
from microscope_kernels.fp32_dot import round_to as _cast

from microscope.api import interpreting

from . import tuned

__all__ = [
    "SUPPORTED_HEAD_DIMS",
    "TUNERS",
    "OMIT_STAGES",
    "FlashAttentionFn",
    "flash_attention",
    "precompile",
    "skip_candidate",
    "tuned_configs",
]

_LOG = logging.getLogger(__name__)
#: Head dims the kernels are built and tuned for.
SUPPORTED_HEAD_DIMS = (32, 64, 128, 256)

_LOG2E = tl.constexpr(1.4426950408889634)  # exp(x * scale) == exp2(x * scale * log2(e))
_TMA_ENV = "MICROSCOPE_FLASH_TMA"
_NO_ENV = "MICROSCOPE_FLASH_NO"

# Integer arguments that only bound loops or masks: specializing on their divisibility would recompile the
# kernels for every new sequence length without making them faster.
_NO_SPECIALIZE = ["BH", "Sq", "Sk", "SQ_BUCKET", "SK_BUCKET"]


# ----------------------------------------------------------------------------------------------------------
# Shared device helpers
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _source(base, head_row0, rows_total, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr, USE_TMA: tl.constexpr):
    """What ``_load_tile`` reads: a TMA descriptor over the flattened tensor, or the head's base pointer."""
    if USE_TMA:
        return tl.make_tensor_descriptor(base, shape=[rows_total, HEAD_DIM], strides=[HEAD_DIM, 1],
                                         block_shape=[BLOCK, HEAD_DIM])
    else:
        return base + head_row0.to(tl.int64) * HEAD_DIM


@triton.jit
def _load_tile(src, head_row0, start, n_valid, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
               USE_TMA: tl.constexpr, MASKED: tl.constexpr):
    """Rows ``[start, start + BLOCK)`` of one head's (S, HEAD_DIM) matrix.

    Through TMA, rows past the head's end come from the next head (or are zero past the tensor's end); callers
    mask them out of every result. Through pointers, ``MASKED`` tiles read zeros there instead.
    """
    if USE_TMA:
        return src.load([head_row0 + start, 0])
    else:
        rows = start + tl.arange(0, BLOCK)
        ptrs = src + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        if MASKED:
            return tl.load(ptrs, mask=rows[:, None] < n_valid, other=0.0)
        else:
            return tl.load(ptrs)


@triton.jit
def _store_tile(base, head_row0, start, n_valid, value, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr):
    """Store rows ``[start, start + BLOCK)`` of one head, dropping rows past ``n_valid``."""
    rows = start + tl.arange(0, BLOCK)
    head = base + head_row0.to(tl.int64) * HEAD_DIM
    ptrs = head + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    tl.store(ptrs, value, mask=rows[:, None] < n_valid)


@triton.jit
def _add_tile(dst, head_row0, start, n_valid, value, BLOCK: tl.constexpr, HEAD_DIM: tl.constexpr,
              USE_TMA: tl.constexpr):
    """Add ``value`` (fp32) to rows ``[start, start + BLOCK)`` of one head in an fp32 buffer, atomically.

    ``dst`` is ``_source`` of that buffer. Through TMA the whole tile is one bulk reduction, rows past the
    head's end included: callers make those rows zero, so the next head's rows gain nothing but +0.
    """
    if USE_TMA:
        dst.atomic_add([head_row0 + start, 0], value)
    else:
        rows = start + tl.arange(0, BLOCK)
        ptrs = dst + rows[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
        tl.atomic_add(ptrs, value, mask=rows[:, None] < n_valid, sem="relaxed")


@triton.jit
def _key_range(m0, Sq, Sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """For queries ``[m0, m0 + BLOCK_M)``: (end of the key tiles all of them see whole, end of keys seen)."""
    if CAUSAL:
        off = Sk - Sq
        hi = tl.maximum(tl.minimum(Sk, m0 + BLOCK_M + off), 0)
        full = tl.maximum(tl.minimum(Sk, m0 + off + 1), 0)
    else:
        hi = Sk
        full = Sk
    return (full // BLOCK_N) * BLOCK_N, hi


@triton.jit
def _query_range(n0, Sq, Sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, CAUSAL: tl.constexpr):
    """For keys ``[n0, n0 + BLOCK_N)``: query-tile bounds (first seeing any, first seeing all, tail, end)."""
    end = tl.cdiv(Sq, BLOCK_M) * BLOCK_M
    if CAUSAL:
        off = Sk - Sq
        lo = tl.minimum((tl.maximum(n0 - off, 0) // BLOCK_M) * BLOCK_M, end)
        mid = tl.cdiv(tl.maximum(n0 + BLOCK_N - 1 - off, 0), BLOCK_M) * BLOCK_M
        mid = tl.minimum(tl.maximum(mid, lo), end)
    else:
        lo = 0
        mid = 0
    tail = tl.maximum(mid, (Sq // BLOCK_M) * BLOCK_M)
    return lo, mid, tail, end


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _fwd_tile(acc, l_i, m_i, q, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk, qk_scale,
              HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr, CAUSAL: tl.constexpr,
              USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr,
              LAZY: tl.constexpr, OMIT: tl.constexpr):
    """One online-softmax step over keys ``[start_n, start_n + BLOCK_N)``, in base 2.

    ``m_i`` is the reference max that ``acc`` and ``l_i`` are scaled by. The exact update moves it to the
    running max at every tile. ``LAZY`` (unmasked tiles) moves it only once some row's max has grown by more
    than 8: probabilities then stay below 2^8, harmless in fp32 and in the fp16/bf16 P operand, and the
    BLOCK_M x HEAD_DIM rescale of ``acc`` (as much FP32 work as computing P) is skipped on most tiles.
    ``OMIT`` (``OMIT_STAGES``: 0 none) leaves one stage out, for a speed-only study of what each costs.
    """
    k = _load_tile(k_src, kv_row0, start_n, Sk, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    s = _mma(q, tl.trans(k), None, INTERPRET, IEEE)
    if OMIT == 1:  # softmax: the raw scores are P; no max, exponentials, rescale or row sums
        p = s
        m_new = m_i
    elif MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < Sk
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (Sk - Sq))
        s = tl.where(visible, s * qk_scale, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        # A row that has seen no key yet keeps m = -inf; shift it by 0 so exp2 gives 0, not NaN.
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = _exp2(m_i - m_use, OMIT)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        p = _exp2(s - m_use[:, None], OMIT)
    elif LAZY:
        m_blk = tl.max(s, 1) * qk_scale
        if tl.max(m_blk - m_i, 0) > 8.0:
            m_up = tl.maximum(m_i, m_blk)
            alpha = _exp2(m_i - m_up, OMIT)
            acc = acc * alpha[:, None]
            l_i = l_i * alpha
            m_i = m_up
        m_new = m_i
        p = _exp2(s * qk_scale - m_new[:, None], OMIT)
    else:
        m_new = tl.maximum(m_i, tl.max(s, 1) * qk_scale)
        alpha = _exp2(m_i - m_new, OMIT)
        acc = acc * alpha[:, None]
        l_i = l_i * alpha
        p = _exp2(s * qk_scale - m_new[:, None], OMIT)
    if OMIT != 1:
        l_i = l_i + tl.sum(p, 1)
    if OMIT != 3:  # pv: P's row sums only, no PV GEMM nor V's tiles
        v = _load_tile(v_src, kv_row0, start_n, Sk, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
        acc = _mma(_cast(p, DTYPE, INTERPRET), v, acc, INTERPRET, IEEE)
    return acc, l_i, m_new


@triton.jit
def _exp2(x, OMIT: tl.constexpr):
    """``2 ** x``, or ``x`` itself where the study leaves the exponentials out (``OMIT`` 2)."""
    if OMIT == 2:
        return x
    else:
        return tl.math.exp2(x)


@triton.jit
def _fwd_operands(Q, K, V, bh, m0, BH, Sq, Sk, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr,
                  BLOCK_N: tl.constexpr, USE_TMA: tl.constexpr):
    """A forward program's head offsets, its query tile, and where its K and V tiles are read from."""
    q_row0 = bh * Sq
    kv_row0 = bh * Sk
    q_src = _source(Q, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, USE_TMA)
    k_src = _source(K, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    v_src = _source(V, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    q = _load_tile(q_src, q_row0, m0, Sq, BLOCK_M, HEAD_DIM, USE_TMA, True)
    return q_row0, kv_row0, q, k_src, v_src


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_fwd(Q, K, V, Out, LSE, sm_scale, BH, Sq, Sk, SQ_BUCKET, SK_BUCKET,
              HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERPRET: tl.constexpr,
              UNMASKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, WARP_SPEC: tl.constexpr,
              LAZY: tl.constexpr, OMIT: tl.constexpr = 0):
    """O and base-2 LSE for ``BLOCK_M`` queries of one head. ``SQ/SK_BUCKET`` only key the autotuner.

    ``UNMASKED`` compiles only the loop over the key tiles every query of the block sees whole, which Triton's
    warp specialization needs (it handles a kernel with a single loop only): either no tile needs a mask (no
    causal mask, Sk a multiple of every BLOCK_N), or ``_attn_fwd_rest`` adds the masked tiles afterwards.
    """
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1)
    pid_m = tl.program_id(0)
    if CAUSAL:  # the last query tiles see the most keys: start them first so the tail of the grid is short
        pid_m = tl.num_programs(0) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    q_row0, kv_row0, q, k_src, v_src = _fwd_operands(Q, K, V, bh, m0, BH, Sq, Sk, HEAD_DIM, BLOCK_M, BLOCK_N,
                                                     USE_TMA)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    qk_scale = sm_scale * _LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    n_full, hi = _key_range(m0, Sq, Sk, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WARP_SPEC):
        acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk, qk_scale,
                                  HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE, False, LAZY, OMIT)
    if not UNMASKED:
        for start_n in range(n_full, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk,
                                      qk_scale, HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                      True, False, OMIT)

    _fwd_finish(acc, l_i, m_i, Out, LSE, q_row0, m0, offs_m, Sq, BLOCK_M, HEAD_DIM, DTYPE, INTERPRET)


@triton.jit
def _fwd_finish(acc, l_i, m_i, Out, LSE, q_row0, m0, offs_m, Sq, BLOCK_M: tl.constexpr, HEAD_DIM: tl.constexpr,
                DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Normalize and store O and the base-2 LSE of one query block.

    Rows that saw no key (causal with Sq > Sk) output 0 and get LSE = +inf, so the backward's P is 0 there.
    """
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    lse = tl.where(empty, float("inf"), m_i + tl.math.log2(l_safe))
    tl.store(LSE + q_row0 + offs_m, lse, mask=offs_m < Sq)
    out = acc * (1.0 / l_safe)[:, None]
    _store_tile(Out, q_row0, m0, Sq, _cast(out, DTYPE, INTERPRET), BLOCK_M, HEAD_DIM)


@triton.jit(do_not_specialize=["BH", "Sq", "Sk"])
def _attn_fwd_rest(Q, K, V, Out, LSE, sm_scale, BH, Sq, Sk, HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr,
                   USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """The key tiles that need a mask (causal diagonal, Sk tail), added to what ``_attn_fwd`` with ``UNMASKED``
    and the same ``BLOCK_M``, ``BLOCK_N`` stored for the other tiles.

    The online softmax resumes exactly from a stored row: with the running max set to its LSE, the row's
    normalizer is 1 and its accumulator is O. A row with LSE = +inf has seen no key yet.
    """
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1)
    m0 = tl.program_id(0) * BLOCK_M
    n_full, hi = _key_range(m0, Sq, Sk, BLOCK_M, BLOCK_N, CAUSAL)
    if n_full < hi:
        q_row0, kv_row0, q, k_src, v_src = _fwd_operands(Q, K, V, bh, m0, BH, Sq, Sk, HEAD_DIM, BLOCK_M, BLOCK_N,
                                                         USE_TMA)
        offs_m = m0 + tl.arange(0, BLOCK_M)
        o_src = _source(Out, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, False)
        acc = _load_tile(o_src, q_row0, m0, Sq, BLOCK_M, HEAD_DIM, False, True).to(tl.float32)
        lse = tl.load(LSE + q_row0 + offs_m, mask=offs_m < Sq, other=float("inf"))
        seen = lse != float("inf")
        m_i = tl.where(seen, lse, float("-inf"))
        l_i = tl.where(seen, 1.0, 0.0)
        qk_scale = sm_scale * _LOG2E
        for start_n in range(n_full, hi, BLOCK_N):
            acc, l_i, m_i = _fwd_tile(acc, l_i, m_i, q, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk,
                                      qk_scale, HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                      True, False, 0)
        _fwd_finish(acc, l_i, m_i, Out, LSE, q_row0, m0, offs_m, Sq, BLOCK_M, HEAD_DIM, DTYPE, INTERPRET)


# ----------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=["Sq"])
def _attn_bwd_delta(Out, DO, DELTA, Sq, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr):
    """``delta = rowsum(dO * O)`` in fp32: the softmax-Jacobian term shared by the dQ and dK kernels."""
    bh = tl.program_id(1)
    offs_m = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    offs = (bh * Sq).to(tl.int64) * HEAD_DIM + offs_m[:, None] * HEAD_DIM + tl.arange(0, HEAD_DIM)[None, :]
    rows = offs_m[:, None] < Sq
    o = tl.load(Out + offs, mask=rows, other=0.0).to(tl.float32)
    do = tl.load(DO + offs, mask=rows, other=0.0).to(tl.float32)
    tl.store(DELTA + bh * Sq + offs_m, tl.sum(o * do, 1), mask=offs_m < Sq)


@triton.jit
def _dkdv_tile(dk, dv, k, v, q_src, do_src, dq_dst, LSE, DELTA, q_row0, start_m, offs_n, Sq, Sk, qk_scale,
               sm_scale, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, DTYPE: tl.constexpr, CAUSAL: tl.constexpr,
               USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr,
               DQ_ATOMIC: tl.constexpr):
    """Add queries ``[start_m, start_m + BLOCK_M)`` to dK, dV of one key tile (on transposed scores), and
    with ``DQ_ATOMIC`` this key tile's share of their dQ to the fp32 buffer behind ``dq_dst``."""
    offs_m = start_m + tl.arange(0, BLOCK_M)
    q = _load_tile(q_src, q_row0, start_m, Sq, BLOCK_M, HEAD_DIM, USE_TMA, MASKED)
    do = _load_tile(do_src, q_row0, start_m, Sq, BLOCK_M, HEAD_DIM, USE_TMA, MASKED)
    if MASKED:  # LSE = +inf past Sq makes P = 0 for the rows that do not exist
        lse = tl.load(LSE + q_row0 + offs_m, mask=offs_m < Sq, other=float("inf"))
        delta = tl.load(DELTA + q_row0 + offs_m, mask=offs_m < Sq, other=0.0)
    else:
        lse = tl.load(LSE + q_row0 + offs_m)
        delta = tl.load(DELTA + q_row0 + offs_m)
    s_t = _mma(k, tl.trans(q), None, INTERPRET, IEEE)
    p_t = tl.math.exp2(s_t * qk_scale - lse[None, :])
    if MASKED and CAUSAL:
        p_t = tl.where(offs_n[:, None] <= offs_m[None, :] + (Sk - Sq), p_t, 0.0)
    dv = _mma(_cast(p_t, DTYPE, INTERPRET), do, dv, INTERPRET, IEEE)
    dp_t = _mma(v, tl.trans(do), None, INTERPRET, IEEE)
    ds_t = _cast(p_t * (dp_t - delta[None, :]), DTYPE, INTERPRET)
    dk = _mma(ds_t, q, dk, INTERPRET, IEEE)
    if DQ_ATOMIC:  # rows past Sq have P = 0, so their share is exactly zero (what _add_tile needs)
        dq = _mma(tl.trans(ds_t), k, None, INTERPRET, IEEE)
        _add_tile(dq_dst, q_row0, start_m, Sq, dq * sm_scale, BLOCK_M, HEAD_DIM, USE_TMA and not INTERPRET)
    return dk, dv


@triton.jit
def _dkdv_program(Q, K, V, DO, DK, DV, DQ_ACC, LSE, DELTA, sm_scale, BH, Sq, Sk, HEAD_DIM: tl.constexpr,
                  CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, UNMASKED: tl.constexpr,
                  BLOCK_N: tl.constexpr, BLOCK_M: tl.constexpr, WARP_SPEC: tl.constexpr,
                  DQ_ATOMIC: tl.constexpr):
    """dK, dV for ``BLOCK_N`` keys of one head: K, V stay on chip while the queries seeing them stream by.

    ``UNMASKED`` (no causal mask, Sq a multiple of every BLOCK_M) compiles one loop over all queries, which
    Triton can warp-specialize; otherwise three loops: causal diagonal, unmasked middle, Sq tail.
    """
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1)
    n0 = tl.program_id(0) * BLOCK_N
    q_row0 = bh * Sq
    kv_row0 = bh * Sk
    q_src = _source(Q, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, USE_TMA)
    do_src = _source(DO, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, USE_TMA)
    # Triton's interpreter has no bulk reduction: there the TMA path adds dQ through pointers.
    TMA_ADD: tl.constexpr = USE_TMA and not INTERPRET
    if DQ_ATOMIC:
        dq_dst = _source(DQ_ACC, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, TMA_ADD)
    else:
        dq_dst = q_src
    k_src = _source(K, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    v_src = _source(V, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    k = _load_tile(k_src, kv_row0, n0, Sk, BLOCK_N, HEAD_DIM, USE_TMA, True)
    v = _load_tile(v_src, kv_row0, n0, Sk, BLOCK_N, HEAD_DIM, USE_TMA, True)
    offs_n = n0 + tl.arange(0, BLOCK_N)
    if DQ_ATOMIC:  # keys past Sk (another head's, through TMA) must add nothing to dQ
        k = tl.where(offs_n[:, None] < Sk, k, 0.0)
    qk_scale = sm_scale * _LOG2E
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)

    if UNMASKED:
        for start_m in tl.range(0, Sq, BLOCK_M, warp_specialize=WARP_SPEC):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, dq_dst, LSE, DELTA, q_row0, start_m, offs_n, Sq, Sk,
                                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                False, DQ_ATOMIC)
    else:
        # [lo, mid): the causal diagonal; [mid, tail): every query sees every key; [tail, end): past Sq.
        lo, mid, tail, end = _query_range(n0, Sq, Sk, BLOCK_M, BLOCK_N, CAUSAL)
        for start_m in range(lo, mid, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, dq_dst, LSE, DELTA, q_row0, start_m, offs_n, Sq, Sk,
                                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                True, DQ_ATOMIC)
        for start_m in range(mid, tail, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, dq_dst, LSE, DELTA, q_row0, start_m, offs_n, Sq, Sk,
                                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                False, DQ_ATOMIC)
        for start_m in range(tail, end, BLOCK_M):
            dk, dv = _dkdv_tile(dk, dv, k, v, q_src, do_src, dq_dst, LSE, DELTA, q_row0, start_m, offs_n, Sq, Sk,
                                qk_scale, sm_scale, HEAD_DIM, BLOCK_M, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE,
                                True, DQ_ATOMIC)

    _store_tile(DV, kv_row0, n0, Sk, _cast(dv, DTYPE, INTERPRET), BLOCK_N, HEAD_DIM)
    _store_tile(DK, kv_row0, n0, Sk, _cast(dk * sm_scale, DTYPE, INTERPRET), BLOCK_N, HEAD_DIM)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, sm_scale, BH, Sq, Sk, SQ_BUCKET, SK_BUCKET,
                   HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                   INTERPRET: tl.constexpr, UNMASKED: tl.constexpr, BLOCK_N: tl.constexpr,
                   BLOCK_M: tl.constexpr, WARP_SPEC: tl.constexpr):
    """dK, dV of ``BLOCK_N`` keys (``_dkdv_program``); dQ is left to ``_attn_bwd_dq``."""
    _dkdv_program(Q, K, V, DO, DK, DV, DK, LSE, DELTA, sm_scale, BH, Sq, Sk, HEAD_DIM, CAUSAL, USE_TMA, INTERPRET,
                  UNMASKED, BLOCK_N, BLOCK_M, WARP_SPEC, False)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_bwd_dkdvq(Q, K, V, DO, DK, DV, DQ_ACC, LSE, DELTA, sm_scale, BH, Sq, Sk, SQ_BUCKET, SK_BUCKET,
                    HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr,
                    INTERPRET: tl.constexpr, UNMASKED: tl.constexpr, BLOCK_N: tl.constexpr,
                    BLOCK_M: tl.constexpr, WARP_SPEC: tl.constexpr):
    """dK, dV of ``BLOCK_N`` keys, and their share of dQ added atomically to the zeroed fp32 ``DQ_ACC``:
    5 GEMMs per tile pair where the two-kernel backward runs 7, at the cost of an fp32 reduction per pair
    whose order varies from run to run."""
    _dkdv_program(Q, K, V, DO, DK, DV, DQ_ACC, LSE, DELTA, sm_scale, BH, Sq, Sk, HEAD_DIM, CAUSAL, USE_TMA,
                  INTERPRET, UNMASKED, BLOCK_N, BLOCK_M, WARP_SPEC, True)


@triton.jit
def _dq_tile(dq, q, do, lse, delta, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk, qk_scale,
             HEAD_DIM: tl.constexpr, BLOCK_N: tl.constexpr, DTYPE: tl.constexpr, CAUSAL: tl.constexpr,
             USE_TMA: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr, MASKED: tl.constexpr):
    """Add keys ``[start_n, start_n + BLOCK_N)`` to dQ of one query tile."""
    k = _load_tile(k_src, kv_row0, start_n, Sk, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    v = _load_tile(v_src, kv_row0, start_n, Sk, BLOCK_N, HEAD_DIM, USE_TMA, MASKED)
    s = _mma(q, tl.trans(k), None, INTERPRET, IEEE)
    p = tl.math.exp2(s * qk_scale - lse[:, None])
    if MASKED:
        offs_n = start_n + tl.arange(0, BLOCK_N)
        visible = offs_n[None, :] < Sk
        if CAUSAL:
            visible = visible & (offs_n[None, :] <= offs_m[:, None] + (Sk - Sq))
        p = tl.where(visible, p, 0.0)
    dp = _mma(do, tl.trans(v), None, INTERPRET, IEEE)
    ds = p * (dp - delta[:, None])
    return _mma(_cast(ds, DTYPE, INTERPRET), k, dq, INTERPRET, IEEE)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _attn_bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, sm_scale, BH, Sq, Sk, SQ_BUCKET, SK_BUCKET,
                 HEAD_DIM: tl.constexpr, CAUSAL: tl.constexpr, USE_TMA: tl.constexpr, INTERPRET: tl.constexpr,
                 UNMASKED: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 WARP_SPEC: tl.constexpr):
    """dQ for ``BLOCK_M`` queries of one head, walking the same key range as the forward."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1)
    pid_m = tl.program_id(0)
    if CAUSAL:
        pid_m = tl.num_programs(0) - 1 - pid_m
    m0 = pid_m * BLOCK_M
    q_row0 = bh * Sq
    kv_row0 = bh * Sk
    k_src = _source(K, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    v_src = _source(V, kv_row0, BH * Sk, BLOCK_N, HEAD_DIM, USE_TMA)
    offs_m = m0 + tl.arange(0, BLOCK_M)
    q_src = _source(Q, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, USE_TMA)
    do_src = _source(DO, q_row0, BH * Sq, BLOCK_M, HEAD_DIM, USE_TMA)
    q = _load_tile(q_src, q_row0, m0, Sq, BLOCK_M, HEAD_DIM, USE_TMA, True)
    do = _load_tile(do_src, q_row0, m0, Sq, BLOCK_M, HEAD_DIM, USE_TMA, True)
    lse = tl.load(LSE + q_row0 + offs_m, mask=offs_m < Sq, other=float("inf"))
    delta = tl.load(DELTA + q_row0 + offs_m, mask=offs_m < Sq, other=0.0)
    qk_scale = sm_scale * _LOG2E
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)

    n_full, hi = _key_range(m0, Sq, Sk, BLOCK_M, BLOCK_N, CAUSAL)
    for start_n in tl.range(0, n_full, BLOCK_N, warp_specialize=WARP_SPEC):
        dq = _dq_tile(dq, q, do, lse, delta, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk, qk_scale,
                      HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE, False)
    if not UNMASKED:
        for start_n in range(n_full, hi, BLOCK_N):
            dq = _dq_tile(dq, q, do, lse, delta, k_src, v_src, kv_row0, start_n, offs_m, Sq, Sk, qk_scale,
                          HEAD_DIM, BLOCK_N, DTYPE, CAUSAL, USE_TMA, INTERPRET, IEEE, True)

    _store_tile(DQ, q_row0, m0, Sq, _cast(dq * sm_scale, DTYPE, INTERPRET), BLOCK_M, HEAD_DIM)


# ----------------------------------------------------------------------------------------------------------
# Autotuning
# ----------------------------------------------------------------------------------------------------------


class Tile(NamedTuple):
    """One autotuning candidate shape: the kernel's outer tile (the forward's and dQ's BLOCK_M, dK/dV's
    BLOCK_N), its inner tile, pipeline depth, warps; whether it is tried plain (``ws=""``), plain and
    warp-specialized (``"+ws"``) or only warp-specialized (``"ws"``, where it spills without); and an
    optional register cap (``maxnreg``), which can let two programs share an SM."""

    outer: int
    inner: int
    stages: int
    warps: int
    ws: str = ""
    maxnreg: int | None = None


Tiles = dict[int, list[Tile]]
# fp16/bf16 candidates per head dim, chosen from ptxas reports of sm_90 builds (Triton 3.6 and 3.9): none
# spills more than a few hundred bytes (a plain 4-warp program holding two 128 x 128 fp32 accumulators spills
# kilobytes), plain 8 warps only where each warpgroup gets its own 64 rows, and 128 x 64 x 8 warps capped at
# 128 registers (122 used, no spill) with 98 KB of shared memory runs two programs per SM: one's softmax then
# overlaps the other's tensor-core work, which Triton does not do within a program.
_FWD_TILES: Tiles = {
    32: [Tile(128, 64, 3, 4, "+ws"), Tile(128, 128, 3, 8), Tile(64, 64, 4, 4, "+ws")],
    64: [Tile(128, 64, 3, 4, "+ws"), Tile(128, 64, 4, 4, "+ws"), Tile(128, 128, 2, 4, "ws"),
         Tile(128, 128, 3, 8), Tile(128, 128, 4, 8), Tile(128, 64, 2, 8), Tile(64, 64, 3, 4, "+ws")],
    128: [Tile(128, 64, 2, 4, "+ws"), Tile(128, 64, 3, 4, "+ws"), Tile(128, 64, 4, 4, "+ws"),
          Tile(128, 128, 2, 4, "ws"), Tile(128, 64, 3, 8), Tile(128, 64, 2, 8, maxnreg=128),
          Tile(128, 128, 2, 8), Tile(128, 128, 3, 8), Tile(64, 64, 3, 4, "+ws")],
    256: [Tile(64, 64, 2, 4), Tile(128, 64, 2, 8), Tile(64, 32, 3, 4)],
}
_DKDV_TILES: Tiles = {
    32: [Tile(128, 64, 3, 4), Tile(64, 64, 3, 4)],
    64: [Tile(128, 64, 3, 8), Tile(128, 32, 3, 4), Tile(64, 64, 3, 4)],
    128: [Tile(128, 32, 3, 8), Tile(128, 32, 2, 8), Tile(128, 64, 3, 8), Tile(64, 32, 3, 4, "+ws"),
          Tile(128, 64, 2, 4, "ws"), Tile(128, 32, 2, 4, "ws")],
    256: [Tile(64, 16, 2, 8), Tile(64, 32, 2, 8)],
}
# The dK/dV kernel that also adds dQ holds a BLOCK_M x D fp32 dQ share besides dK and dV, and its dQ GEMM
# runs on wgmma only with BLOCK_M >= 64; Triton 3.6's warp specialization does not build it (the pass fails
# on the bulk reduction). Its reductions move B*H*Sq*D*4 bytes per key tile, so wide key tiles (BLOCK_N 128)
# halve them. From ptxas reports of sm_90 builds (Triton 3.6, pointers 16-byte aligned as at a launch): no
# spill without causal mask but 32 bytes (D128 128 x 64); with it, up to 16 bytes, except D128 128 x 32
# (268) and 128 x 64 (896), and D256 (688 and more).
_DKDVQ_TILES: Tiles = {
    32: [Tile(128, 64, 3, 8), Tile(64, 64, 3, 4), Tile(64, 64, 3, 8)],
    64: [Tile(128, 64, 3, 8), Tile(64, 64, 3, 4), Tile(64, 64, 3, 8), Tile(128, 32, 3, 8)],
    128: [Tile(64, 64, 3, 8), Tile(64, 32, 3, 8), Tile(128, 64, 2, 8), Tile(128, 32, 3, 8), Tile(128, 16, 3, 8)],
    256: [Tile(64, 16, 2, 8), Tile(64, 32, 3, 8)],
}
_DQ_TILES: Tiles = {
    32: [Tile(128, 64, 3, 4), Tile(64, 64, 3, 4)],
    64: [Tile(128, 64, 3, 8), Tile(128, 128, 3, 8), Tile(64, 64, 3, 4)],
    128: [Tile(128, 64, 2, 8), Tile(128, 64, 3, 8), Tile(128, 128, 2, 8), Tile(64, 64, 3, 4, "+ws")],
    256: [Tile(64, 32, 2, 8), Tile(64, 64, 2, 8), Tile(64, 16, 2, 4)],
}
# Exact fp32 dots run on CUDA cores with operands in registers: only small tiles avoid spilling.
_FP32_FWD_TILES: Tiles = {
    32: [Tile(64, 32, 2, 8), Tile(32, 32, 2, 8)],
    64: [Tile(64, 32, 2, 8), Tile(32, 32, 2, 8)],
    128: [Tile(16, 16, 2, 4), Tile(32, 32, 2, 8)],
    256: [Tile(16, 16, 2, 4)],
}
_FP32_DKDV_TILES: Tiles = {
    32: [Tile(32, 16, 2, 4), Tile(32, 32, 2, 8)],
    64: [Tile(32, 16, 2, 4), Tile(32, 32, 2, 8)],
    128: [Tile(16, 16, 2, 4)],
    256: [Tile(16, 16, 2, 4)],
}
_FP32_DQ_TILES: Tiles = {
    32: [Tile(32, 32, 2, 8), Tile(64, 32, 2, 8)],
    64: [Tile(32, 32, 2, 8), Tile(64, 32, 2, 8)],
    128: [Tile(32, 32, 2, 8), Tile(32, 16, 2, 4)],
    256: [Tile(16, 16, 2, 4)],
}
#: The configuration used under the interpreter: small, and with unequal tiles so that the tile-boundary
#: arithmetic of the causal and tail masks is exercised the way a 128 x 64 GPU tile exercises it.
_INTERPRET_FWD = {"BLOCK_M": 32, "BLOCK_N": 16, "WARP_SPEC": False, "LAZY": False}
#: Forward stages a speed-only study may leave out (``flash_attention(omit=...)``), by their ``OMIT`` code:
#: the softmax (max, exponentials, rescale, row sums, mask), the exponentials alone, the PV GEMM (and V's
#: tiles). What a stage costs is the time leaving it out takes off. The QK^T GEMM is not among them: zero
#: scores in its place change the tile's register layout (255 registers and spills in an sm_90 build, and
#: no build at all in Triton 3.6's warp-specialized loop), so that launch timed something else.
OMIT_STAGES = ("none", "softmax", "exp2", "pv")
#: Forward launch keys the whole kernel has run for in this process (``_forward``'s stage study).
_TUNED_WHOLE: set[tuple] = set()
_INTERPRET_DKDV = {"BLOCK_N": 32, "BLOCK_M": 16, "WARP_SPEC": False}
_INTERPRET_DQ = {"BLOCK_M": 32, "BLOCK_N": 16, "WARP_SPEC": False}
_KEY = ["SQ_BUCKET", "SK_BUCKET", "HEAD_DIM", "CAUSAL", "USE_TMA", "UNMASKED"]
#: Every tile size divides this, so ``S % _WHOLE_TILES == 0`` means no tile along S is ever partial.
_WHOLE_TILES = 128
#: Candidates seen failing to build or run, as (kernel name, config string); pruned from tuning.
_UNBUILDABLE: set[tuple[str, str]] = set()


#: Autotuning timer: a 40 ms median separates candidates that differ by a few percent, at 1/3 Triton's default cost.
_bench_candidate = timer(10, 40)


def _shape_key(tile: Tile) -> tuple:
    return tile.outer, tile.inner, tile.stages, tile.warps, tile.maxnreg


def _all_tiles() -> set[tuple]:
    tables = (_FWD_TILES, _DKDV_TILES, _DKDVQ_TILES, _DQ_TILES, _FP32_FWD_TILES, _FP32_DKDV_TILES, _FP32_DQ_TILES)
    return {_shape_key(t) for table in tables for tiles in table.values() for t in tiles}


def _tile_configs(names: tuple[str, str], flags: tuple[str, ...]) -> list[triton.Config]:
    """Every tile of every table, crossed with every on/off combination of the boolean ``flags``."""
    configs = []
    for outer, inner, stages, warps, maxnreg in sorted(_all_tiles(), key=str):
        for values in itertools.product((False, True), repeat=len(flags)):
            kwargs = {names[0]: outer, names[1]: inner, **dict(zip(flags, values))}
            configs.append(triton.Config(kwargs, num_stages=stages, num_warps=warps, maxnreg=maxnreg))
    return configs


def _smem_bytes(outer: int, inner: int, stages: int, head_dim: int, itemsize: int) -> int:
    """Shared memory of one program: the resident outer tile plus a ring of two inner tiles per stage."""
    return (outer + 2 * stages * inner) * head_dim * itemsize


def _warp_specializable(cfg: triton.Config, kwargs: dict, dtype: torch.dtype) -> bool:
    """Where Triton's Hopper warp specialization applies: one loop (no causal or tail mask), TMA loads,
    tensor-core dots, 4 warps, and no data-dependent branch in the loop (LAZY)."""
    return bool(kwargs["UNMASKED"] and kwargs["USE_TMA"] and dtype != torch.float32 and cfg.num_warps == 4
                and not cfg.kwargs.get("LAZY"))


def _prune(table: Tiles, fp32_table: Tiles, names: tuple[str, str], kernel_name: str):
    """An ``early_config_prune`` keeping the tiles listed for this head dim and dtype.

    ``MICROSCOPE_FLASH_NO=WARP_SPEC,LAZY`` drops the candidates that turn those features on (for Triton
    builds that fail to compile them).
    """

    def prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
        dtype = named_args["Q"].dtype
        tiles = (fp32_table if dtype == torch.float32 else table)[kwargs["HEAD_DIM"]]
        modes = {_shape_key(t): t.ws for t in tiles}
        disabled = set(os.environ.get(_NO_ENV, "").split(","))
        kept = []
        for cfg in configs:
            tile = (cfg.kwargs[names[0]], cfg.kwargs[names[1]], cfg.num_stages, cfg.num_warps, cfg.maxnreg)
            if tile not in modes or _smem_bytes(*tile[:3], kwargs["HEAD_DIM"], dtype.itemsize) > 227 * 1024:
                continue
            if any(cfg.kwargs.get(flag) for flag in disabled) or (kernel_name, str(cfg)) in _UNBUILDABLE:
                continue
            ws = bool(cfg.kwargs.get("WARP_SPEC"))
            if ws and ("ws" not in modes[tile] or not _warp_specializable(cfg, kwargs, dtype)):
                continue
            # Measured on an H200 (PERF.md): lazy rescaling won only with pointer loads, never with TMA.
            if cfg.kwargs.get("LAZY") and kwargs["USE_TMA"]:
                continue
            if not ws and modes[tile] == "ws":
                continue
            kept.append(cfg)
        return kept

    return prune


_PRUNE_FWD = _prune(_FWD_TILES, _FP32_FWD_TILES, ("BLOCK_M", "BLOCK_N"), "_attn_fwd")
_PRUNE_DKDV = _prune(_DKDV_TILES, _FP32_DKDV_TILES, ("BLOCK_N", "BLOCK_M"), "_attn_bwd_dkdv")
_PRUNE_DQ = _prune(_DQ_TILES, _FP32_DQ_TILES, ("BLOCK_M", "BLOCK_N"), "_attn_bwd_dq")
_PRUNE_DKDVQ = _prune(_DKDVQ_TILES, _FP32_DKDV_TILES, ("BLOCK_N", "BLOCK_M"), "_attn_bwd_dkdvq")


def _autotuned(kernel, names: tuple[str, str], flags: tuple[str, ...], prune, key: list[str],
               reset_to_zero: list[str] | None = None):
    return triton.autotune(_tile_configs(names, flags), key=key, do_bench=_bench_candidate,
                           prune_configs_by={"early_config_prune": prune}, reset_to_zero=reset_to_zero)(kernel)


_FWD = _autotuned(_attn_fwd, ("BLOCK_M", "BLOCK_N"), ("WARP_SPEC", "LAZY"), _PRUNE_FWD, _KEY)
_DKDV = _autotuned(_attn_bwd_dkdv, ("BLOCK_N", "BLOCK_M"), ("WARP_SPEC",), _PRUNE_DKDV, _KEY)
_DQ = _autotuned(_attn_bwd_dq, ("BLOCK_M", "BLOCK_N"), ("WARP_SPEC",), _PRUNE_DQ, _KEY)
# Candidates add into DQ_ACC, so the autotuner zeroes it before each timing and before the real launch.
_DKDVQ = _autotuned(_attn_bwd_dkdvq, ("BLOCK_N", "BLOCK_M"), ("WARP_SPEC",), _PRUNE_DKDVQ, _KEY, ["DQ_ACC"])
#: The autotuners by kernel, for reports (each has ``.cache``: key -> chosen config).
TUNERS = {"fwd": _FWD, "bwd_dkdv": _DKDV, "bwd_dq": _DQ, "bwd_dkdvq": _DKDVQ}
_PRUNES = {_FWD: _PRUNE_FWD, _DKDV: _PRUNE_DKDV, _DQ: _PRUNE_DQ, _DKDVQ: _PRUNE_DKDVQ}
#: How the backward computes dQ (``flash_attention``'s ``dq``).
DQ_MODES = ("separate", "atomic")
#: Per launch key (``_launch_key``): the tuned table's configuration where today's pruning keeps it, else
#: None (autotune). Launch keys are tuples, cheap to build on every call; table keys are made on a miss.
_FROM_TABLE: dict[tuple, triton.Config | None] = {}
#: Launch keys whose autotuned choice this process already offered to ``tuned.record``.
_RECORDED: set[tuple] = set()


def tuned_configs() -> dict[str, dict[object, str]]:
    """The configuration used per tuning key: the autotuners' choices, and the tuned table's entries
    (by launch key: kernel, ``tuned.KEY_ARGS`` values, dtype) where a table served (empty under the
    interpreter)."""
    chosen = {name: {key: str(cfg) for key, cfg in tuner.cache.items()} for name, tuner in TUNERS.items()}
    for name, tuner in TUNERS.items():
        chosen[name].update({key: str(cfg) for key, cfg in _FROM_TABLE.items()
                             if cfg is not None and key[0] == tuner.fn.__name__})
    return chosen


def _launch_key(tuner, kwargs: dict, dtype: torch.dtype) -> tuple:
    return (tuner.fn.__name__, *(kwargs[name] for name in tuned.KEY_ARGS), dtype)


def _device_name(device: torch.device) -> str:
    return torch.cuda.get_device_name(device)


def _candidates(tuner, args: tuple, kwargs: dict) -> list[triton.Config]:
    """The autotuning candidates the pruning keeps for these launch arguments."""
    return _PRUNES[tuner](tuner.configs, dict(zip(tuner.arg_names, args)), **kwargs)


def _table_config(tuner, args: tuple, kwargs: dict, key: tuple) -> triton.Config | None:
    """The tuned table's candidate for launch key ``key``, if a table lists one still a candidate here."""
    if key not in _FROM_TABLE:
        if not _FROM_TABLE:
            _LOG.info("flash_attn: %s", tuned.describe(_device_name(args[0].device)))
        listed = tuned.lookup(_device_name(args[0].device), tuned.table_key(key[0], kwargs, key[-1]))
        _FROM_TABLE[key] = None if listed is None else next(
            (c for c in _candidates(tuner, args, kwargs)
             if (c.kwargs, c.num_warps, c.num_stages, c.maxnreg)
             == (listed.kwargs, listed.num_warps, listed.num_stages, listed.maxnreg)), None)
    return _FROM_TABLE[key]


# ----------------------------------------------------------------------------------------------------------
# Launchers
# ----------------------------------------------------------------------------------------------------------


def _use_tma(device: torch.device, dtype: torch.dtype, loads: str = "auto") -> bool:
    """TMA descriptors for fp16/bf16 on Hopper and newer; ``loads="tma"``/``"pointers"``, else
    ``MICROSCOPE_FLASH_TMA=1/0``, override (A/B studies, tests).

    fp32 keeps pointer loads: its exact dots run on CUDA cores, where TMA buys nothing.
    """
    if loads in ("tma", "pointers"):
        return loads == "tma"
    forced = os.environ.get(_TMA_ENV, "")
    if forced in ("0", "1"):
        return forced == "1"
    return (device.type == "cuda" and dtype != torch.float32 and not interpreting()
            and torch.cuda.get_device_capability(device)[0] >= 9)


def _set_tma_allocator() -> None:
    """Tensor descriptors built in a kernel need a little global scratch memory, from this allocator."""
    triton.set_allocator(lambda size, align, stream: torch.empty(size, dtype=torch.int8, device="cuda"))


def _bucket(n: int) -> int:
    return triton.next_power_of_2(max(n, 1))


def _common(q: torch.Tensor, k: torch.Tensor, causal: bool, use_tma: bool) -> dict:
    batch, heads, sq, head_dim = q.shape
    sk = k.shape[2]
    return {"BH": batch * heads, "Sq": sq, "Sk": sk, "SQ_BUCKET": _bucket(sq), "SK_BUCKET": _bucket(sk),
            "HEAD_DIM": head_dim, "CAUSAL": causal, "USE_TMA": use_tma, "INTERPRET": interpreting()}


def _unmasked(common: dict, along: str) -> dict:
    """``common`` plus whether no tile along ``along`` ("Sq" or "Sk") needs a mask: then a kernel that walks
    that axis compiles a single loop (the forward and dQ walk keys, dK/dV walks queries)."""
    return {**common, "UNMASKED": not common["CAUSAL"] and common[along] % _WHOLE_TILES == 0}


def _run(tuner, interpret_config: dict, grid, *args, **kwargs) -> dict:
    """Launch with the tuned table's configuration where it lists this key, else through the autotuner (and
    offer its choice to ``tuned.record``); under the interpreter, with the fixed small configuration.
    Returns the tile arguments the launch used."""
    if interpreting():
        tuner.fn[grid](*args, **kwargs, **interpret_config)
        return interpret_config
    if kwargs["USE_TMA"]:
        _set_tma_allocator()
    key = _launch_key(tuner, kwargs, args[0].dtype)
    cfg = _table_config(tuner, args, kwargs, key)
    if cfg is not None:
        tuner.fn[grid](*args, **kwargs, **cfg.all_kwargs())
        return cfg.kwargs
    tuner[grid](*args, **kwargs)
    if key not in _RECORDED:
        _RECORDED.add(key)
        tuned.record(_device_name(args[0].device), tuned.table_key(key[0], kwargs, key[-1]), tuner.best_config)
    return tuner.best_config.kwargs


def _rest_launch(block_m: int, block_n: int) -> dict:
    """Warps and stages of ``_attn_fwd_rest``, from ptxas reports of sm_90 builds (Triton 3.6): with 8 warps
    no bf16 tile of D32-D128 spills, where 4 warps spill at 128-row tiles; the fp32 tiles smaller than
    64 x 32 take 4."""
    return {"num_warps": 8 if block_m * block_n >= 64 * 32 else 4, "num_stages": 2}


def _forward(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
             loads: str = "auto", split: bool = False, omit: str = "none") -> tuple[torch.Tensor, torch.Tensor]:
    o = torch.empty_like(q)
    batch, heads, sq, _ = q.shape
    lse = torch.empty((batch * heads, sq), device=q.device, dtype=torch.float32)
    if o.numel() == 0:
        return o, lse
    common = _common(q, k, causal, _use_tma(q.device, q.dtype, loads))
    grid = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    whole = _unmasked(common, "Sk")
    if omit != "none":
        # the whole kernel runs first for its key (tuned table or autotuner), so that the launch leaving a
        # stage out takes its configuration (OMIT is no part of the autotuner's key) and differs by that alone
        key = _launch_key(_FWD, whole, q.dtype)
        if key not in _TUNED_WHOLE:
            _run(_FWD, _INTERPRET_FWD, grid, q, k, v, o, lse, sm_scale, **whole)
            _TUNED_WHOLE.add(key)
        _run(_FWD, _INTERPRET_FWD, grid, q, k, v, o, lse, sm_scale, **whole, OMIT=OMIT_STAGES.index(omit))
        return o, lse
    if not split or whole["UNMASKED"]:
        _run(_FWD, _INTERPRET_FWD, grid, q, k, v, o, lse, sm_scale, **whole)
        return o, lse
    tiles = _run(_FWD, _INTERPRET_FWD, grid, q, k, v, o, lse, sm_scale, **{**whole, "UNMASKED": True})
    block_m, block_n = tiles["BLOCK_M"], tiles["BLOCK_N"]
    _attn_fwd_rest[(triton.cdiv(sq, block_m), batch * heads)](
        q, k, v, o, lse, sm_scale, common["BH"], sq, common["Sk"], HEAD_DIM=common["HEAD_DIM"], CAUSAL=causal,
        USE_TMA=common["USE_TMA"], INTERPRET=common["INTERPRET"], BLOCK_M=block_m, BLOCK_N=block_n,
        **({} if interpreting() else _rest_launch(block_m, block_n)))
    return o, lse


def _backward(do: torch.Tensor, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, o: torch.Tensor,
              lse: torch.Tensor, causal: bool, sm_scale: float, loads: str = "auto",
              dq_mode: str = "separate") -> tuple[torch.Tensor, ...]:
    dk, dv = torch.empty_like(k), torch.empty_like(v)
    if q.numel() == 0:
        return torch.empty_like(q), dk.zero_(), dv.zero_()
    batch, heads, sq, head_dim = q.shape
    sk = k.shape[2]
    delta = torch.empty_like(lse)
    delta_block = 32 if interpreting() else 128
    _attn_bwd_delta[(triton.cdiv(sq, delta_block), batch * heads)](o, do, delta, sq, HEAD_DIM=head_dim,
                                                                    BLOCK_M=delta_block)
    common = _common(q, k, causal, _use_tma(q.device, q.dtype, loads))
    grid_kv = lambda meta: (triton.cdiv(sk, meta["BLOCK_N"]), batch * heads)  # noqa: E731
    grid_q = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    if dq_mode == "atomic":
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        _run(_DKDVQ, _INTERPRET_DKDV, grid_kv, q, k, v, do, dk, dv, dq_acc, lse, delta, sm_scale,
             **_unmasked(common, "Sq"))
        return dq_acc.to(q.dtype), dk, dv
    dq = torch.empty_like(q)
    _run(_DKDV, _INTERPRET_DKDV, grid_kv, q, k, v, do, dk, dv, lse, delta, sm_scale,
         **_unmasked(common, "Sq"))
    _run(_DQ, _INTERPRET_DQ, grid_q, q, k, v, do, dq, lse, delta, sm_scale, **_unmasked(common, "Sk"))
    return dq, dk, dv


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> None:
    if q.dim() != 4 or k.dim() != 4 or v.dim() != 4:
        raise ValueError(f"flash_attention expects (B, H, S, D) tensors, got q{tuple(q.shape)} "
                         f"k{tuple(k.shape)} v{tuple(v.shape)}")
    if k.shape != v.shape or q.shape[:2] != k.shape[:2] or q.shape[3] != k.shape[3]:
        raise ValueError(f"q (B, H, Sq, D) and k, v (B, H, Sk, D) disagree: q{tuple(q.shape)} "
                         f"k{tuple(k.shape)} v{tuple(v.shape)}")
    if q.shape[3] not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"flash_attention supports head dims {SUPPORTED_HEAD_DIMS}, got {q.shape[3]}")
    if not (q.dtype == k.dtype == v.dtype) or q.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise ValueError(f"flash_attention needs q, k, v of one dtype among fp32/fp16/bf16, got "
                         f"{q.dtype}, {k.dtype}, {v.dtype}")
    if not (q.device == k.device == v.device):
        raise ValueError(f"q, k, v are on different devices: {q.device}, {k.device}, {v.device}")
    if k.shape[2] == 0:
        raise ValueError("flash_attention needs at least one key (Sk >= 1)")
    if not sm_scale > 0:
        raise ValueError(f"sm_scale must be positive (it is folded into a running max), got {sm_scale}")


class FlashAttentionFn(torch.autograd.Function):
    """Autograd glue: the forward saves only O and the log-sum-exp (and its inputs); backward recomputes P."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, sm_scale: float,
                loads: str = "auto", dq: str = "separate", split: bool = False, omit: str = "none") -> torch.Tensor:
        o, lse = _forward(q, k, v, causal, sm_scale, loads, split, omit)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.causal, ctx.sm_scale, ctx.loads, ctx.dq, ctx.omit = causal, sm_scale, loads, dq, omit
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        if ctx.omit != "none":
            raise RuntimeError(f"flash_attention(omit={ctx.omit!r}) is a forward-only speed study: no backward")
        q, k, v, o, lse = ctx.saved_tensors
        dq, dk, dv = _backward(do.contiguous(), q, k, v, o, lse, ctx.causal, ctx.sm_scale, ctx.loads, ctx.dq)
        return dq, dk, dv, None, None, None, None, None, None


def flash_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, loads: str = "auto", dq: str = "separate",
                    split: bool = False, omit: str = "none") -> torch.Tensor:
    """Softmax attention ``softmax(q k^T * sm_scale [+ causal mask]) v`` without materializing the scores.

    Args:
        q: (B, H, Sq, D) queries; k, v: (B, H, Sk, D). fp32, fp16 or bf16 (one dtype), D in
            ``SUPPORTED_HEAD_DIMS``; any sequence lengths; non-contiguous inputs are copied to contiguous.
        causal: mask aligned bottom-right (query i sees keys j <= i + Sk - Sq); queries that see no key
            output zeros.
        sm_scale: score scale, default ``1 / sqrt(D)``; must be positive.
        loads: "auto" (TMA for fp16/bf16 on sm_90+), or "tma" / "pointers" to force one load path.
        dq: how the backward computes dQ: "separate" (a dQ kernel recomputing P: 7 GEMMs per tile pair,
            bit-reproducible) or "atomic" (the dK/dV kernel adds each tile's dQ share into an fp32 buffer:
            5 GEMMs, summation order varying between runs).
        split: run the forward's key tiles that need a mask (the causal diagonal, a partial last tile of Sk)
            in a second, small launch that resumes from the first's O and LSE, so that the first has a single
            loop Triton can warp-specialize; O is then rounded to the input dtype once more in between.
        omit: "none", or a forward stage to leave out (``OMIT_STAGES``) at the whole kernel's configuration:
            the output is wrong by design and there is no backward; only its time means something (what
            that stage costs).

    Returns:
        (B, H, Sq, D) in the input dtype; differentiable with respect to q, k and v.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    _check_inputs(q, k, v, scale)
    if loads not in ("auto", "tma", "pointers"):
        raise ValueError(f"loads={loads!r}: one of 'auto', 'tma', 'pointers'")
    if dq not in DQ_MODES:
        raise ValueError(f"dq={dq!r}: one of {', '.join(map(repr, DQ_MODES))}")
    if omit not in OMIT_STAGES:
        raise ValueError(f"omit={omit!r}: one of {', '.join(map(repr, OMIT_STAGES))}")
    return FlashAttentionFn.apply(q.contiguous(), k.contiguous(), v.contiguous(), bool(causal), scale, loads, dq,
                                  bool(split), omit)


def precompile(q: torch.Tensor, k: torch.Tensor, causal: bool, backward: bool = True,
               shard: tuple[int, int] = (0, 1), launch: bool = False,
               dq: str = "separate", split: bool = False) -> list[tuple[str, str, str]]:
    """Compile the autotuning candidates for q/k's dtype and head dim, ``causal``, the load path, the
    forward's ``split`` and the backward's ``dq`` mode (only the tuned table's configuration where it lists
    the key: ``tuned.py``).

    Compiling is most of a first call's cost. A benchmark can spread this over worker processes (candidate
    ``i`` goes to shard ``i % count``) so that the autotuner later finds every binary in Triton's on-disk
    cache. With ``launch``, each candidate also runs once on q/k (small, zero-filled) and is synchronized,
    so a candidate that faults or hangs on this GPU shows up in the worker rather than in the autotuner.
    Returns (kernel, config, error) per candidate that failed; this process's autotuners skip those, and
    other processes can be told with ``skip_candidate``.
    """
    if interpreting():
        return []
    common = _common(q, k, causal, _use_tma(q.device, q.dtype))
    if common["USE_TMA"]:
        _set_tma_allocator()
    batch, heads, sq, _ = q.shape
    sk = k.shape[2]
    v, o = torch.zeros_like(k), torch.zeros_like(q)
    lse = q.new_zeros(q.shape[:3], dtype=torch.float32)
    by_query = lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), batch * heads)  # noqa: E731
    by_key = lambda meta: (triton.cdiv(sk, meta["BLOCK_N"]), batch * heads)  # noqa: E731
    dk, dv = torch.zeros_like(k), torch.zeros_like(v)
    whole = _unmasked(common, "Sk")
    split = split and not whole["UNMASKED"]
    launches = [(_FWD, (q, k, v, o, lse, 0.125), {**whole, "UNMASKED": True} if split else whole, by_query)]
    if backward and dq == "atomic":
        dq_acc = torch.zeros(q.shape, device=q.device, dtype=torch.float32)
        launches.append((_DKDVQ, (q, k, v, o, dk, dv, dq_acc, lse, lse, 0.125), _unmasked(common, "Sq"), by_key))
    elif backward:
        launches += [(_DKDV, (q, k, v, o, dk, dv, lse, lse, 0.125), _unmasked(common, "Sq"), by_key),
                     (_DQ, (q, k, v, o, torch.zeros_like(q), lse, lse, 0.125), _unmasked(common, "Sk"), by_query)]
    candidates = [(tuner, args, kwargs, grid, cfg) for tuner, args, kwargs, grid in launches
                  for cfg in _to_compile(tuner, args, kwargs)]
    index, count = shard
    failures = []
    if backward and index == 0:  # the backward's small pre-pass (one binary per head dim and dtype)
        try:
            _attn_bwd_delta.warmup(o, o, lse, sq, HEAD_DIM=q.shape[-1], BLOCK_M=128, grid=(1,))
        except Exception as exc:  # noqa: BLE001 - reported like a candidate; the call compiles it instead
            failures.append(("_attn_bwd_delta", "BLOCK_M=128", f"{type(exc).__name__}: {str(exc)[:300]}"))
    for tuner, args, kwargs, grid, cfg in candidates[index::count]:
        try:
            tuner.fn.warmup(*args, grid=(1,), **kwargs, **cfg.all_kwargs())
            if launch:
                tuner.fn[grid](*args, **kwargs, **cfg.all_kwargs())
                torch.cuda.synchronize(q.device)
            if split and tuner is _FWD:  # the masked tiles' launch at this candidate's tiles
                tiles = {"BLOCK_M": cfg.kwargs["BLOCK_M"], "BLOCK_N": cfg.kwargs["BLOCK_N"]}
                rest_args = (q, k, v, o, lse, 0.125, common["BH"], sq, sk)
                rest_kwargs = {name: common[name] for name in ("HEAD_DIM", "CAUSAL", "USE_TMA", "INTERPRET")}
                _attn_fwd_rest.warmup(*rest_args, grid=(1,), **rest_kwargs, **tiles,
                                      **_rest_launch(tiles["BLOCK_M"], tiles["BLOCK_N"]))
        except Exception as exc:  # noqa: BLE001 - report every candidate that does not build or run
            skip_candidate(tuner.fn.__name__, str(cfg))
            failures.append((tuner.fn.__name__, str(cfg), f"{type(exc).__name__}: {str(exc)[:300]}"))
            launch = False  # a fault can leave this process's CUDA context unusable: compile only from here
    return failures


def _to_compile(tuner, args: tuple, kwargs: dict) -> list[triton.Config]:
    """The tuned table's configuration where it lists this key, else every autotuning candidate."""
    cfg = _table_config(tuner, args, kwargs, _launch_key(tuner, kwargs, args[0].dtype))
    return [cfg] if cfg is not None else _candidates(tuner, args, kwargs)


def skip_candidate(kernel_name: str, config: str) -> None:
    """Leave a candidate (as ``precompile`` reported it) out of this process's autotuning from now on."""
    _UNBUILDABLE.add((kernel_name, config))
    _FROM_TABLE.clear()
