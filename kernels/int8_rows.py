"""Symmetric per-row int8 in Triton, for the rooms that quantize rows (int8_linear, act_compression_8bit).

``scale = absmax / 127`` per row (NaN where the row holds NaN/Inf), values rounded half away from zero,
and the reciprocal IEEE-rounded as torch's ``1 / scale`` is (a GPU's fast reciprocal moves ties).
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def absmax_scale(X, rows, in_rows, C, stride, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    """Per row of ``X`` (``C`` columns): absmax / 127, NaN where the row holds NaN/Inf."""
    cols = tl.arange(0, BLOCK_C)
    amax = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.float32)
    bad = tl.zeros([BLOCK_M, BLOCK_C], dtype=tl.int32)
    for c0 in range(0, C, BLOCK_C):
        mask = in_rows & (c0 + cols[None, :] < C)
        x = tl.load(X + rows[:, None] * stride + c0 + cols[None, :], mask=mask, other=0.0).to(tl.float32)
        amax = tl.maximum(amax, tl.abs(x))
        bad += ((x != x) | (tl.abs(x) == float("inf"))).to(tl.int32)
    scale = tl.max(amax, axis=1) / 127.0
    return tl.where(tl.sum(bad, axis=1) > 0, float("nan"), scale)


@triton.jit
def inverse(scale):
    """1 / scale, IEEE-rounded; 0 for an all-zero row (which then quantizes to zeros)."""
    one = tl.full(scale.shape, 1.0, tl.float32)
    return tl.where(scale > 0, tl.div_rn(one, tl.maximum(scale, 1e-30)), 0.0)


@triton.jit
def quantized(x, inv):
    """int8 of x * inv, rounded half away from zero; NaN/Inf (their row's scale is NaN) become 0."""
    v = x * inv[:, None]
    v = tl.where((v != v) | (tl.abs(v) == float("inf")), 0.0, v)
    q = tl.where(v >= 0, tl.floor(v + 0.5), -tl.floor(-v + 0.5))
    return tl.minimum(tl.maximum(q, -127.0), 127.0).to(tl.int8)
