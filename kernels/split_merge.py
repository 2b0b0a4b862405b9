"""The merge step of split-K (flash-decoding) attention, shared by the decode rooms (int8_kv_cache,
paged_attention): each split left an unnormalized fp32 output and its running max and sum (base 2)."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def merged_output(PART_ACC, PART_ML, bh, num_splits, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """The normalized fp32 output (D,) of batch*head ``bh``: each split rescaled by 2^(m_s - max m),
    summed, divided by the rescaled sum. An empty split (m = -inf) gets weight 0."""
    s = tl.arange(0, BLOCK_S)
    d = tl.arange(0, D)
    ok = s < num_splits
    part = bh * num_splits + s
    m = tl.load(PART_ML + part * 2, mask=ok, other=-float("inf"))
    weight = tl.where(ok, tl.exp2(m - tl.max(m, axis=0)), 0.0)
    total = tl.sum(weight * tl.load(PART_ML + part * 2 + 1, mask=ok, other=0.0), axis=0)
    acc = tl.load(PART_ACC + part[:, None] * D + d[None, :], mask=ok[:, None], other=0.0)
    return tl.sum(acc * weight[:, None], axis=0) / total
