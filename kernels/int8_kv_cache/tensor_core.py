"""The int8 decode split kernel with both products on tensor cores (``products="dot"``).

Why: the CUDA-core kernel (``kernel.py``) spends ~13 instructions per int32 word of K or V (unpack,
four float subtractions, four FMAs), and its accumulators are (BLOCK_T, D) fp32 tiles, so registers
limit its token block (64 on the H200). Here four bytes become fp16 values in 5 instructions, the
products run on tensor cores, and the accumulator is (16, D) whatever the token block, so blocks of
64-256 tokens stream through a deep shared-memory pipeline.

Measured on the H200 (README): once both kernels read through TMA descriptors, this one is 4-14%
slower than the CUDA-core kernel (the autotuners' own best timings, 15:04 run). It holds 168
registers, so only 3 programs fit per SM, and it stalls on loads. It is therefore an option, not
the default.

How, exactly:
- A byte ``q`` becomes the fp16 value ``q`` in 5 instructions per word of four: bits 0x6400 |
  (q + 128) encode 1152 + q (fp16 has an integer ulp on [1024, 2048)), and one packed subtraction
  per two values takes 1152 off, exactly. (Leaving the bias in and subtracting ``1152 * sum(q)``
  after the dot saves 2 instructions per word, but costs fp32 inputs 14x eager's error: the dot
  then sums terms ~1000x larger than its result.)
- A tensor-core dot needs at least 16 rows, and a decode step has one query. The 16-row operand holds
  the fp32 vector as fp16 ``hi`` in row 0 and the remainder ``lo = x - hi`` in row 1 (zeros below), so
  rows 0 + 1 of the product carry the fp32 vector to ~2^-22, not fp16's 2^-11. The spare rows cost
  nothing: tensor cores are otherwise idle in a memory-bound kernel.
- fp16's range: q is scaled by a power of two to [1, 2) before the split (undone on the scores), and
  with per-token V scales each block's ``p * v_scale`` is too, so tiny scales never go subnormal.
"""

from __future__ import annotations

import triton
import triton.language as tl
from microscope_kernels.int8_kv_cache.descriptors import fit_descriptor_blocks
from microscope_kernels.int8_kv_cache.split_io import load_query_tiles, store_partial


@triton.jit
def _unpack_int8x4_f16(words, PTX_DEQUANT: tl.constexpr):
    """int32 words holding four int8 each -> four fp16 tiles holding byte j of every word, exactly.

    ``PTX_DEQUANT`` (GPU): per word 1 LOP3 + 2 PRMT + 2 HSUB2. xor 0x80 makes q the unsigned byte
    128 + q; each PRMT builds two halves [byte, 0x64], i.e. 1024 + 128 + q (fp16 has an integer ulp
    on [1024, 2048)); each HSUB2 takes 1152 off two of them, exactly. Otherwise a portable
    int -> fp16 conversion, also what the CPU interpreter runs.
    """
    if PTX_DEQUANT:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t, lo, hi, bias;
            xor.b32 t, $4, 0x80808080;
            prmt.b32 lo, t, 0x64646464, 0x4140;
            prmt.b32 hi, t, 0x64646464, 0x4342;
            mov.b32 bias, 0x64806480;
            sub.f16x2 lo, lo, bias;
            sub.f16x2 hi, hi, bias;
            mov.b32 {$0, $1}, lo;
            mov.b32 {$2, $3}, hi;
            }""",
            constraints="=h,=h,=h,=h,r", args=[words],
            dtype=(tl.float16, tl.float16, tl.float16, tl.float16), is_pure=True, pack=1)
    else:
        b0 = ((words << 24) >> 24).to(tl.float16)  # arithmetic shifts sign-extend byte j
        b1 = ((words << 16) >> 24).to(tl.float16)
        b2 = ((words << 8) >> 24).to(tl.float16)
        b3 = (words >> 24).to(tl.float16)
    return b0, b1, b2, b3


@triton.jit
def _hi_lo_rows(x, rows):
    """An fp32 vector as a (16, len) fp16 dot operand: row 0 = fp16(x), row 1 = fp16(x - row 0), zeros
    below, so rows 0 + 1 of a product carry x to ~2^-22."""
    hi = x.to(tl.float16)
    lo = (x - hi.to(tl.float32)).to(tl.float16)
    first = rows[:, None] == 0
    second = rows[:, None] == 1
    return tl.where(first, hi[None, :], tl.where(second, lo[None, :], tl.zeros_like(hi)[None, :]))


@triton.jit
def _pow2_unit(x_max):
    """2^-floor(log2(x_max)): brings a vector whose largest magnitude is ``x_max`` to [1, 2).

    The exponent is held to [-126, 126] so the unit and its reciprocal stay finite normal numbers.
    Unclamped, a block whose largest weight was subnormal (its scores ~126 or more below the running
    max, base 2) got an infinite unit, and inf * 0 turned the whole output into NaN. Weights that
    small are below 2^-126 of the running sum, so what the fp16 operand then drops does not show.
    """
    return tl.where(x_max > 0, tl.exp2(tl.clamp(-tl.floor(tl.log2(x_max)), -126.0, 126.0)), 1.0)


@triton.jit
def decode_split_int8_dot_kernel(
    Q, K_DESC, V_DESC, K_SCALE, KS_DESC, VS_DESC, PART_ACC, PART_ML,
    T, split_len, num_splits, qk_scale,
    stride_qbh, stride_ksbh, stride_vsbh,
    D: tl.constexpr, BLOCK_T: tl.constexpr, PER_TOKEN: tl.constexpr, PTX_DEQUANT: tl.constexpr,
    STAGES: tl.constexpr,
):
    """One (split, batch*head) over the int8 cache, both products as tensor-core dots.

    Same contract as ``kernel._decode_split_int8_kernel``: writes the split's unnormalized output and
    its running max and sum (base 2). K and V are read as int32 words through tensor descriptors over
    (batch*heads, T, D/4) with (1, BLOCK_T, D/4) blocks: the TMA unit copies each block to shared
    memory, so no thread computes an address or a mask per element, and tokens past T read as zero.
    Word w of a token holds channels 4w..4w+3, so the four unpacked tiles pair with q and the output
    split the same way.
    """
    split = tl.program_id(0)
    head = tl.program_id(1)
    bh = head.to(tl.int64)
    w = tl.arange(0, D // 4)
    offs_t = tl.arange(0, BLOCK_T)
    rows = tl.arange(0, 16)
    q0, q1, q2, q3 = load_query_tiles(Q, K_SCALE, bh, stride_qbh, stride_ksbh, w, PER_TOKEN)
    q_max = tl.maximum(tl.maximum(tl.max(tl.abs(q0), axis=0), tl.max(tl.abs(q1), axis=0)),
                       tl.maximum(tl.max(tl.abs(q2), axis=0), tl.max(tl.abs(q3), axis=0)))
    q_unit = _pow2_unit(q_max)
    qm0 = _hi_lo_rows(q0 * q_unit, rows)
    qm1 = _hi_lo_rows(q1 * q_unit, rows)
    qm2 = _hi_lo_rows(q2 * q_unit, rows)
    qm3 = _hi_lo_rows(q3 * q_unit, rows)
    score_scale = qk_scale / q_unit  # qk_scale = sm_scale * log2(e)
    t_start = split * split_len
    t_end = tl.minimum(t_start + split_len, T)
    ks_start = head * stride_ksbh  # per-token scales: flat 1-D descriptors
    vs_start = head * stride_vsbh
    m_i = -float("inf")
    l_vec = tl.zeros((BLOCK_T,), tl.float32)
    acc0 = tl.zeros((16, D // 4), tl.float32)
    acc1 = tl.zeros((16, D // 4), tl.float32)
    acc2 = tl.zeros((16, D // 4), tl.float32)
    acc3 = tl.zeros((16, D // 4), tl.float32)
    for t0 in tl.range(t_start, t_end, BLOCK_T, num_stages=STAGES):
        t = t0 + offs_t
        ok = t < t_end
        k_raw = K_DESC.load([head, t0, 0]).reshape(BLOCK_T, D // 4)
        v_raw = V_DESC.load([head, t0, 0]).reshape(BLOCK_T, D // 4)
        k0, k1, k2, k3 = _unpack_int8x4_f16(k_raw, PTX_DEQUANT)
        st = tl.dot(qm0, tl.trans(k0))
        st = tl.dot(qm1, tl.trans(k1), st)
        st = tl.dot(qm2, tl.trans(k2), st)
        st = tl.dot(qm3, tl.trans(k3), st)
        s = tl.sum(st, axis=0) * score_scale  # rows 0 + 1; the rest are zero
        if PER_TOKEN:
            s = s * tl.where(ok, KS_DESC.load([ks_start + t0]), 0.0)
        s = tl.where(ok, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))  # finite: token t0 is always in range
        if m_new > m_i:  # lazy rescale, only when the running max grows
            alpha = tl.exp2(m_i - m_new)
            acc0, acc1, acc2, acc3 = acc0 * alpha, acc1 * alpha, acc2 * alpha, acc3 * alpha
            l_vec = l_vec * alpha
            m_i = m_new
        p = tl.exp2(s - m_i)
        l_vec += p
        v0, v1, v2, v3 = _unpack_int8x4_f16(v_raw, PTX_DEQUANT)
        if PER_TOKEN:
            pv = p * tl.where(ok, VS_DESC.load([vs_start + t0]), 0.0)  # past T: a buffer's unwritten spare
            p_unit = _pow2_unit(tl.max(pv, axis=0))
            pm = _hi_lo_rows(pv * p_unit, rows)
            inv_unit = 1.0 / p_unit  # a power of two: exact
            acc0 += tl.dot(pm, v0) * inv_unit
            acc1 += tl.dot(pm, v1) * inv_unit
            acc2 += tl.dot(pm, v2) * inv_unit
            acc3 += tl.dot(pm, v3) * inv_unit
        else:
            pm = _hi_lo_rows(p, rows)
            acc0 = tl.dot(pm, v0, acc0)
            acc1 = tl.dot(pm, v1, acc1)
            acc2 = tl.dot(pm, v2, acc2)
            acc3 = tl.dot(pm, v3, acc3)
    store_partial(PART_ACC, PART_ML, bh, split, num_splits, w, acc0, acc1, acc2, acc3, m_i, l_vec, D)


#: (BLOCK_T, num_warps, STAGES). The accumulator is (16, D) fp32 whatever the block, so blocks of up
#: to 256 tokens fit; shared memory holds STAGES x BLOCK_T x D x 2 bytes of packed K and V (128 x 128
#: x 2 x 4 = 128 KB at the deepest).
_DOT_SHAPES = ((32, 4, 3), (32, 4, 4), (64, 4, 2), (64, 4, 3), (64, 4, 4), (128, 4, 2), (128, 4, 3),
               (128, 8, 3), (128, 8, 4), (256, 8, 2))
DOT_CONFIGS = [triton.Config({"BLOCK_T": bt, "STAGES": stages}, num_warps=warps, pre_hook=fit_descriptor_blocks)
               for bt, warps, stages in _DOT_SHAPES]
#: The smallest head_dim the dot kernel takes: each of the four channel tiles is a dot's K of >= 16.
MIN_DOT_HEAD_DIM = 64
