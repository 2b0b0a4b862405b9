"""What both int8 split kernels read first and write last: the query, the partial results.

Both kernels split q and the output by channel residue (word w of a token holds channels 4w..4w+3,
so tile j holds channels 4w + j), fold a per-channel K scale into q once, and hand the merge kernel
the same partial layout. One copy keeps the two kernels' contracts from drifting apart.
"""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def load_query_tiles(Q, K_SCALE, bh, stride_qbh, stride_ksbh, w, PER_TOKEN: tl.constexpr):
    """q of one batch*head as four fp32 tiles (channels 4w + j), times the per-channel K scales
    when the cache has them (a per-token K scale multiplies the scores instead)."""
    q_ptr = Q + bh * stride_qbh + w * 4
    q0 = tl.load(q_ptr).to(tl.float32)
    q1 = tl.load(q_ptr + 1).to(tl.float32)
    q2 = tl.load(q_ptr + 2).to(tl.float32)
    q3 = tl.load(q_ptr + 3).to(tl.float32)
    if not PER_TOKEN:
        ks_ptr = K_SCALE + bh * stride_ksbh + w * 4
        q0 = q0 * tl.load(ks_ptr)
        q1 = q1 * tl.load(ks_ptr + 1)
        q2 = q2 * tl.load(ks_ptr + 2)
        q3 = q3 * tl.load(ks_ptr + 3)
    return q0, q1, q2, q3


@triton.jit
def store_partial(PART_ACC, PART_ML, bh, split, num_splits, w, acc0, acc1, acc2, acc3, m_i, l_vec,
                  D: tl.constexpr):
    """One split's unnormalized output (each accumulator summed over its rows) and its running max
    and sum (base 2), where the merge kernel reads them."""
    part = bh * num_splits + split
    out_ptr = PART_ACC + part * D + w * 4
    tl.store(out_ptr, tl.sum(acc0, axis=0))
    tl.store(out_ptr + 1, tl.sum(acc1, axis=0))
    tl.store(out_ptr + 2, tl.sum(acc2, axis=0))
    tl.store(out_ptr + 3, tl.sum(acc3, axis=0))
    tl.store(PART_ML + part * 2, m_i)
    tl.store(PART_ML + part * 2 + 1, tl.sum(l_vec, axis=0))
