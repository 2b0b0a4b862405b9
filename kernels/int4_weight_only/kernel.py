"""A weight-only 4-bit Linear in Triton: the packed weight is unpacked and dequantized in registers.

Why: at decode (M of 1 to 16 rows) a Linear reads its whole weight to do little arithmetic with it, so
its time is the weight's bytes over the memory bandwidth; 4-bit weights with a float32 scale and zero
point per group of 32-128 columns are ~0.27x the bytes of bf16. Each program loads a tile of packed
bytes, splits the low and high nibbles and interleaves them back into column order (``2j``, ``2j + 1``),
applies its group's ``(q - zero) * scale`` and runs one dot product with a contiguous tile of the
activations: no dequantized weight is ever written to memory. The tile's K extent divides the group (one
scale and zero point per output channel) or spans whole groups (one per group and channel, broadcast).

At decode the GEMM has a second form, autotuned beside the first: the weight tile is the dot's left operand
and x's tile its right (the product comes out transposed), the weight read as int32 words whose eight values
each take a constant shift and one AND-OR into ``1 + q / 16``: no nibbles are interleaved across registers and
no float is subtracted, about a fifth fewer instructions a tile at the decode GEMM's larger tiles. A third form
(bf16) makes the weight in bf16 with packed arithmetic: two values take one LOP3, one packed add and one packed
multiply (inline PTX; the same roundings in float32 under the interpreter).

Decode shapes have few output tiles to keep every SM streaming weights, so K may be split across
programs that add their partial sums into a float32 buffer (``SPLIT_K``; atomics, so the last bits of
a sum depend on the order the programs finish), at the price of zeroing it and casting it. On a GPU the
tile sizes, pipeline depth, warps and split are autotuned per shape, and whether to split at all is
decided by timing both whole calls once.

One- to four-row calls in bf16/fp16 have a third path that uses no tensor cores: each program takes one
row of x and a tile of output channels, reads the weight as int32 words of eight values, multiplies each
value with x's matching column, sums each word's eight products, and applies the group's scale and zero point
once per word, ``scale * (sum(q * x) - zero * sum(x))``: no tile is rearranged for a matrix unit. Each
thread keeps one float32 sum per word it holds, and these are added up once, after the last tile: summing
across a group's words in every tile took one cross-lane shuffle per two words. Triton software-pipelines
only loads that feed a dot, so a plain loop waits for each tile's loads and then does its arithmetic; the
candidates also take the next tile into registers before the current one's arithmetic, or have Triton's
pipeliner stream tiles through shared memory.

Both kernels turn 4-bit values into floats with integer operations, not with int-to-float conversions: those
run at a quarter of the FP32 rate on Hopper and, one per weight, cost a decode call more time than reading the
weight. The GEMM makes q itself (``_nibble_floats``, one add more). The vector kernel, whose instructions take
longer to issue than its bytes take to read, makes 1 + q / 16 (``_nibble_sixteenths``, a shift and an AND-OR)
and takes the ones back out with the word's sum of x, which it needs for the zero point anyway.

Prefill shapes (many rows) are compute-bound, where dequantizing inside the GEMM's inner loop costs the
tensor cores their pace: there the fused GEMM is timed against a second path, a Triton kernel that
writes the dequantized weight in x's dtype once per call followed by the vendor GEMM (``F.linear``), and
the faster whole call is kept per shape.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.direct_launch import BoundLaunch, DirectLauncher, cdiv, next_power_of_2
from microscope_kernels.fp32_dot import mma, round_to
from microscope_kernels.input_checks import check_float_input, checked_bias
from microscope_kernels.path_choice import fastest_path

from microscope.api import interpreting

from .reference import Int4Weight


@triton.jit
def _dequant_shift(zero, scale, IEEE: tl.constexpr):
    """What the dequantization subtracts or adds: float32 weights keep the reference's ``(q - zero) * scale``
    (the zero point itself); narrower ones, rounded anyway, take ``q * scale + (-zero * scale)``, one
    multiply-add."""
    if IEEE:
        return zero
    else:
        return -zero * scale


@triton.jit
def _int4_gemm_kernel(X, P, S, Z, BIAS, C, M, N, K, KP, GROUPS, stride_xm, stride_pn, stride_cm, M_BUCKET,
                      NIBBLE_MASK, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr,
                      BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, INTERPRET: tl.constexpr,
                      IEEE: tl.constexpr, WEIGHT_LEFT: tl.constexpr = False, PACKED: tl.constexpr = False):
    """C = X @ dequant(P)^T (+ BIAS). With SPLIT_K > 1, C is a zeroed float32 buffer the programs add into.
    ``WEIGHT_LEFT`` takes the weight tile as the dot's left operand (``_weight_left_sums``), a decode form;
    ``PACKED`` with it makes the weight tile in x's dtype by packed arithmetic (``_packed_sums``)."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tiles = KP // BLOCK_K
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, tiles)
    if PACKED:
        acc = tl.trans(_packed_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last,
                                    NIBBLE_MASK, GROUP, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET))
    elif WEIGHT_LEFT:
        acc = tl.trans(_weight_left_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last,
                                         NIBBLE_MASK, GROUP, BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET, IEEE))
    else:
        acc = _weight_right_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last, GROUP,
                                 BLOCK_M, BLOCK_N, BLOCK_K, INTERPRET, IEEE)
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    if SPLIT_K == 1:
        tl.store(C + rm[:, None] * stride_cm + rn[None, :], acc.to(C.dtype.element_ty), mask=mask)
    else:
        tl.atomic_add(C + rm[:, None] * stride_cm + rn[None, :], acc, mask=mask, sem="relaxed")


@triton.jit
def _weight_right_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last, GROUP: tl.constexpr,
                       BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr,
                       IEEE: tl.constexpr):
    """The (BLOCK_M, BLOCK_N) sums over K tiles ``first`` to ``last`` of x times the dequantized weight, the
    weight as the dot's right operand: its bytes' nibbles interleaved into column order in registers."""
    rk = tl.arange(0, BLOCK_K)
    j = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        packed = tl.load(P + rn[None, :] * stride_pn + (k0 // 2 + j)[:, None], mask=rn[None, :] < N, other=0)
        packed = packed.to(tl.int32)
        # (BLOCK_K / 2, BLOCK_N) bytes -> (BLOCK_K, BLOCK_N) values in column order: low nibble first
        q = _nibble_floats(tl.reshape(tl.permute(tl.join(packed, packed >> 4), (0, 2, 1)), (BLOCK_K, BLOCK_N)))
        if BLOCK_K > GROUP:  # several groups per tile: each row of the tile takes its group's scale and zero
            g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            scale = tl.load(S + rn[None, :] * GROUPS + g[:, None], mask=rn[None, :] < N, other=0.0)
            zero = tl.load(Z + rn[None, :] * GROUPS + g[:, None], mask=rn[None, :] < N, other=0.0)
            shift = _dequant_shift(zero, scale, IEEE)
            scale = tl.reshape(tl.broadcast_to(scale[:, None, :], (BLOCK_K // GROUP, GROUP, BLOCK_N)),
                               (BLOCK_K, BLOCK_N))
            shift = tl.reshape(tl.broadcast_to(shift[:, None, :], (BLOCK_K // GROUP, GROUP, BLOCK_N)),
                               (BLOCK_K, BLOCK_N))
        else:
            g = k0 // GROUP
            scale = tl.load(S + rn * GROUPS + g, mask=rn < N, other=0.0)[None, :]
            zero = tl.load(Z + rn * GROUPS + g, mask=rn < N, other=0.0)[None, :]
            shift = _dequant_shift(zero, scale, IEEE)
        a = tl.load(X + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & (k0 + rk[None, :] < K), other=0.0)
        if IEEE:  # the float32 weight the reference computes, bit for bit
            w = ((q - shift) * scale).to(a.dtype)
        else:  # rounded to bf16/fp16 anyway: (q - zero) * scale as one multiply-add
            w = (q * scale + shift).to(a.dtype)
        acc = mma(a, w, acc, INTERPRET, IEEE)
    return acc


@triton.jit
def _weight_left_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last, NIBBLE_MASK,
                      GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                      INTERPRET: tl.constexpr, IEEE: tl.constexpr):
    """``_weight_right_sums`` transposed, (BLOCK_N, BLOCK_M): the weight tile (channels, K) is the dot's left
    operand and x's tile (K, rows) its right. The weight is read as int32 words of eight values along K, each
    unpacked by a constant shift and one AND-OR (``_words_in_column_order``): no nibbles are interleaved
    across registers and no float is subtracted. Fewer instructions a tile than the right-operand form (sm_90,
    Triton 3.6, 16 x 64 x 256: 797 against 986; on Hopper, from 64 channels, a warpgroup MMA with the weight staged
    through shared memory into registers)."""
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        words = _weight_words(P, stride_pn, rn, N, k0, BLOCK_K)
        q16 = _words_in_column_order(words, NIBBLE_MASK)  # 1 + q / 16
        if BLOCK_K > GROUP:  # several groups per tile: each column of the tile takes its group's scale and zero
            g = k0 // GROUP + tl.arange(0, BLOCK_K // GROUP)
            scale = tl.load(S + rn[:, None] * GROUPS + g[None, :], mask=rn[:, None] < N, other=0.0)
            zero = tl.load(Z + rn[:, None] * GROUPS + g[None, :], mask=rn[:, None] < N, other=0.0)
            scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                               (BLOCK_N, BLOCK_K))
            zero = tl.reshape(tl.broadcast_to(zero[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)),
                              (BLOCK_N, BLOCK_K))
        else:
            g = k0 // GROUP
            scale = tl.load(S + rn * GROUPS + g, mask=rn < N, other=0.0)[:, None]
            zero = tl.load(Z + rn * GROUPS + g, mask=rn < N, other=0.0)[:, None]
        xt = tl.load(X + rm[None, :] * stride_xm + (k0 + rk)[:, None],
                     mask=(rm[None, :] < M) & (k0 + rk[:, None] < K), other=0.0)
        if IEEE:  # 16 (1 + q/16) - (16 + zero) is q - zero exactly: the reference's float32 weight, bit for bit
            wt = ((q16 * 16.0 - (16.0 + zero)) * scale).to(xt.dtype)
        else:  # rounded to bf16/fp16 anyway: one multiply-add, 16 scale (1 + q/16) - (16 + zero) scale
            wt = (q16 * (16.0 * scale) - (16.0 + zero) * scale).to(xt.dtype)
        acc = mma(wt, xt, acc, INTERPRET, IEEE)
    return acc


@triton.jit
def _weight_words(P, stride_pn, rn, N, k0, BLOCK_K: tl.constexpr):
    """The packed weight's K tile from column ``k0`` for channels ``rn``, as (channels, BLOCK_K / 8) int32 words of
    eight 4-bit values (value j of a word at bits 4 j); zeros past channel N."""
    w = tl.arange(0, BLOCK_K // 8)
    words = P.to(tl.pointer_type(tl.int32)) + rn[:, None] * (stride_pn // 4) + (k0 // 8 + w)[None, :]
    return tl.load(words, mask=rn[:, None] < N, other=0)


@triton.jit
def _packed_sums(X, P, S, Z, M, N, K, GROUPS, stride_xm, stride_pn, rm, rn, first, last, NIBBLE_MASK,
                 GROUP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                 INTERPRET: tl.constexpr):
    """``_weight_left_sums`` for bf16 x with the weight made in bf16 by packed arithmetic (``_packed_weights``):
    two values a LOP3, a packed add and a packed multiply, about half the loop's instructions a weight of the
    float32 forms. The tile's columns are in pair order and x's rows are permuted to match, so the sum over K is
    the same sum."""
    G: tl.constexpr = (BLOCK_K + GROUP - 1) // GROUP  # groups a tile spans (a tile within a group: one)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_N, BLOCK_M), dtype=tl.float32)
    for t in range(first, last):
        k0 = t * BLOCK_K
        words = _weight_words(P, stride_pn, rn, N, k0, BLOCK_K)
        g = k0 // GROUP + tl.arange(0, G)  # the tile's groups: one, or several whole ones
        scale = tl.load(S + rn[:, None] * GROUPS + g[None, :], mask=rn[:, None] < N, other=0.0)
        zero = tl.load(Z + rn[:, None] * GROUPS + g[None, :], mask=rn[:, None] < N, other=0.0)
        xt = tl.load(X + rm[None, :] * stride_xm + (k0 + rk)[:, None],
                     mask=(rm[None, :] < M) & (k0 + rk[:, None] < K), other=0.0)
        # x's rows in pair order: column 8 w + 4 i + 2 l + k to position 8 w + 4 l + 2 k + i
        xt = tl.reshape(tl.permute(tl.reshape(xt, (BLOCK_K // 8, 2, 2, 2, BLOCK_M)), (0, 2, 3, 1, 4)),
                        (BLOCK_K, BLOCK_M))
        wt = _packed_weights(words, zero, scale, xt.dtype, INTERPRET)
        if INTERPRET:  # exact products and float32 sums, as the tensor cores give them
            acc = tl.dot(wt.to(tl.float32), xt.to(tl.float32), acc, input_precision="ieee")
        else:
            acc = tl.dot(wt, xt, acc)
    return acc


def _packed_weights_asm() -> tl.constexpr:
    """The PTX of ``_packed_weights``: $8 the word, $9 -(128 + zero) and $10 the scale in bf16; $0-$7 its values."""
    lop3 = "lop3.b32 t{i}, {src}, 0x000F000F, 0x43004300, 0xEA;"  # (src & 0x000F000F) | (128, 128)
    lines = [lop3.format(i=0, src="$8")]
    for i in (1, 2, 3):
        lines += [f"shr.u32 q, $8, {4 * i};", lop3.format(i=i, src="q")]
    lines += [f"fma.rn.bf16x2 t{i}, t{i}, one, z;" for i in range(4)]  # 128 + q - (128 + zero): q - zero, exactly
    lines += [f"fma.rn.bf16x2 t{i}, t{i}, s, nz;" for i in range(4)]  # (q - zero) * scale, rounded once
    lines += [f"mov.b32 {{${i}, ${i + 4}}}, t{i};" for i in range(4)]  # t_i holds values i (low) and i + 4
    return tl.constexpr("{ .reg .b32 q, t0, t1, t2, t3, z, s, one, nz; mov.b32 z, {$9, $9}; mov.b32 s, {$10, $10}; "
                        "mov.b32 one, 0x3F803F80; mov.b32 nz, 0x80008000; " + " ".join(lines) + " }")


_PACKED_WEIGHTS = _packed_weights_asm()


@triton.jit
def _packed_weights(words, zero, scale, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """(N, W) int32 words of eight 4-bit values, with the (N, G) integer zero points and scales of the G groups
    they span -> (N, 8 W) ``(q - zero) * scale`` in bf16: the scale rounded to bf16, then the product, so within
    one more rounding of the reference's weight. Columns in pair order: value j of word w at column 8 w + p with
    j = 2 l + k + 4 i for p = 4 l + 2 k + i, so that each 32-bit register of a dot operand holds values i and
    i + 4 of a word. On a GPU one LOP3 puts those two, 16 bits apart, into the mantissas of the pair (128, 128)
    (bf16's unit in the last place there is 1), one packed add takes 128 + zero off both, exactly, and one packed
    multiply scales them: no value is moved between registers. The interpreter computes the same roundings in
    float32 (``round_to``). Not fp16: its range would round small scales to subnormals."""
    tl.static_assert(DTYPE == tl.bfloat16, "the packed form is for bf16")
    if INTERPRET:
        s = _per_word(round_to(scale, DTYPE, INTERPRET).to(tl.float32), words.shape[1])
        z = _per_word(zero, words.shape[1])
        v0 = round_to((((words >> 0) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v1 = round_to((((words >> 4) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v2 = round_to((((words >> 8) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v3 = round_to((((words >> 12) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v4 = round_to((((words >> 16) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v5 = round_to((((words >> 20) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v6 = round_to((((words >> 24) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
        v7 = round_to((((words >> 28) & 0xF).to(tl.float32) - z) * s, DTYPE, INTERPRET)
    else:
        v0, v1, v2, v3, v4, v5, v6, v7 = tl.inline_asm_elementwise(
            _PACKED_WEIGHTS, "=h,=h,=h,=h,=h,=h,=h,=h,r,h,h",
            [words, _per_word((-(128.0 + zero)).to(tl.bfloat16), words.shape[1]),
             _per_word(scale.to(tl.bfloat16), words.shape[1])],
            dtype=(tl.bfloat16,) * 8, is_pure=True, pack=1)
    # join(a, b) adds a last axis of two; position 4 l + 2 k + i takes value 2 l + k + 4 i
    eight = tl.join(tl.join(tl.join(v0, v2), tl.join(v1, v3)), tl.join(tl.join(v4, v6), tl.join(v5, v7)))
    return tl.reshape(eight, (words.shape[0], words.shape[1] * 8))


@triton.jit
def _per_word(x, W: tl.constexpr):
    """(N, G) values of G groups -> (N, W) values of their W words, W / G words a group."""
    return tl.reshape(tl.broadcast_to(x[:, :, None], (x.shape[0], x.shape[1], W // x.shape[1])), (x.shape[0], W))


@triton.jit
def _words_in_column_order(words, NIBBLE_MASK):
    """(N, W) int32 words of eight 4-bit values -> (N, 8 W) floats ``1 + q / 16``, value j of word w at column
    8 w + j. Each value takes a constant shift and one AND-OR (``_nibble_sixteenths``); the nested joins put the
    eight in order within a thread's registers, so the reshape moves nothing."""
    v0 = _nibble_sixteenths(words, 0, NIBBLE_MASK)
    v1 = _nibble_sixteenths(words, 4, NIBBLE_MASK)
    v2 = _nibble_sixteenths(words, 8, NIBBLE_MASK)
    v3 = _nibble_sixteenths(words, 12, NIBBLE_MASK)
    v4 = _nibble_sixteenths(words, 16, NIBBLE_MASK)
    v5 = _nibble_sixteenths(words, 20, NIBBLE_MASK)
    v6 = _nibble_sixteenths(words, 24, NIBBLE_MASK)
    v7 = _nibble_sixteenths(words, 28, NIBBLE_MASK)
    # join(a, b) adds a last axis of two; three levels index value 4 i + 2 j + l, in column order
    eight = tl.join(tl.join(tl.join(v0, v4), tl.join(v2, v6)), tl.join(tl.join(v1, v5), tl.join(v3, v7)))
    return tl.reshape(eight, (words.shape[0], words.shape[1] * 8))


@triton.jit
def _int4_vector_kernel(X, W32, S, Z, BIAS, C, M, N, K, KP, GROUPS, stride_xm, stride_wn, stride_cm, M_BUCKET,
                        NIBBLE_MASK, GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_N: tl.constexpr,
                        BLOCK_K: tl.constexpr, SPLIT_K: tl.constexpr, STAGES: tl.constexpr = 1,
                        PREFETCH: tl.constexpr = False):
    """C[m] = dequant(W) @ X[m] (+ BIAS) for the row ``m`` of this program, on CUDA cores, scale and zero
    point applied per word. The packed weight is read as int32 words of eight values (``W32``, column
    ``8 w + j`` at bits ``4 j``), loaded as (channels, groups, words of a group) and unpacked by
    ``_nibble_sixteenths``; the scaled sums stay per (channel, group, word) until the loop ends, so no tile
    reduces across lanes.

    A plain loop waits for each tile's loads before its arithmetic: Triton pipelines only loads that feed a
    dot, so nothing overlaps unless asked. ``STAGES`` > 1 has Triton's pipeliner stream tiles ahead through
    shared memory (asynchronous copies); ``PREFETCH`` loads the next tile into registers before the current
    one's arithmetic."""
    pid_m, pid_n, pid_k = tl.program_id(0), tl.program_id(1), tl.program_id(2)
    G: tl.constexpr = BLOCK_K // GROUP
    WG: tl.constexpr = GROUP // 8
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    tiles = KP // BLOCK_K
    per_split = tl.cdiv(tiles, SPLIT_K)
    first = pid_k * per_split
    last = tl.minimum(first + per_split, tiles)
    x_row = X + pid_m * stride_xm
    acc = tl.zeros((BLOCK_N, G, WG), dtype=tl.float32)
    if PREFETCH:
        live = (first < last).to(tl.int32)  # a program of no tile loads nothing: its bounds are zero
        words_next, x_next, scale_next, zero_next = _vector_loads(W32, x_row, S, Z, first, rn, N * live, K * live,
                                                                  GROUPS, stride_wn, G, WG)
        for t in range(first, last):
            words, x, scale, zero = words_next, x_next, scale_next, zero_next
            live = (t + 1 < last).to(tl.int32)  # past the program's last tile: nothing
            words_next, x_next, scale_next, zero_next = _vector_loads(W32, x_row, S, Z, t + 1, rn, N * live,
                                                                      K * live, GROUPS, stride_wn, G, WG)
            acc = _vector_accumulate(acc, words, x, scale, zero, NIBBLE_MASK)
    else:
        for t in tl.range(first, last, num_stages=STAGES):
            words, x, scale, zero = _vector_loads(W32, x_row, S, Z, t, rn, N, K, GROUPS, stride_wn, G, WG)
            acc = _vector_accumulate(acc, words, x, scale, zero, NIBBLE_MASK)
    acc = tl.sum(tl.sum(acc, axis=2), axis=1)  # (BLOCK_N,): across lanes once, after the last tile
    if HAS_BIAS:
        if pid_k == 0:
            acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)
    if SPLIT_K == 1:
        tl.store(C + pid_m * stride_cm + rn, acc.to(C.dtype.element_ty), mask=rn < N)
    else:
        tl.atomic_add(C + pid_m * stride_cm + rn, acc, mask=rn < N, sem="relaxed")


@triton.jit
def _vector_loads(W32, x_row, S, Z, t, rn, n_bound, k_bound, GROUPS, stride_wn, G: tl.constexpr, WG: tl.constexpr):
    """The vector kernel's tile ``t``: words (channels, G, WG), x (G, WG, 8) in its own dtype, scale and zero
    (channels, G); zeros for channels from ``n_bound`` and columns from ``k_bound`` on (bounds of zero: a
    prefetch past a program's last tile, which loads nothing)."""
    rows = rn[:, None] < n_bound
    g = t * G + tl.arange(0, G)
    word = g[:, None] * WG + tl.arange(0, WG)[None, :]  # (G, WG): the tile's words in a row
    words = tl.load(W32 + rn[:, None, None] * stride_wn + word[None, :, :], mask=rows[:, :, None], other=0)
    col = 8 * word[:, :, None] + tl.arange(0, 8)[None, None, :]  # (G, WG, 8): the column of every value
    x = tl.load(x_row + col, mask=col < k_bound, other=0.0)
    scale = tl.load(S + rn[:, None] * GROUPS + g[None, :], mask=rows, other=0.0)
    zero = tl.load(Z + rn[:, None] * GROUPS + g[None, :], mask=rows, other=0.0)
    return words, x, scale, zero


@triton.jit
def _vector_accumulate(acc, words, x, scale, zero, NIBBLE_MASK):
    """``acc`` (channels, G, WG) plus one tile's scaled sums, one per word: ``16 scale * sum((1 + q/16) x) -
    scale (16 + zero) * sum(x)`` over the word's eight values, which is ``scale * sum((q - zero) x)``."""
    x = x.to(tl.float32)
    x0, x1, x2, x3, x4, x5, x6, x7 = _split8(x)  # (G, WG) each: the x of value j of every word
    part = _nibble_sixteenths(words, 0, NIBBLE_MASK) * x0[None, :, :]
    part += _nibble_sixteenths(words, 4, NIBBLE_MASK) * x1[None, :, :]
    part += _nibble_sixteenths(words, 8, NIBBLE_MASK) * x2[None, :, :]
    part += _nibble_sixteenths(words, 12, NIBBLE_MASK) * x3[None, :, :]
    part += _nibble_sixteenths(words, 16, NIBBLE_MASK) * x4[None, :, :]
    part += _nibble_sixteenths(words, 20, NIBBLE_MASK) * x5[None, :, :]
    part += _nibble_sixteenths(words, 24, NIBBLE_MASK) * x6[None, :, :]
    part += _nibble_sixteenths(words, 28, NIBBLE_MASK) * x7[None, :, :]
    # (G, WG): each word's sum of x, summed where x was loaded (a thread or two a word) and then moved, not summed
    # again by every thread that holds the word for some channel
    x_word = tl.sum(x, axis=2)
    a = (16.0 * scale)[:, :, None]
    b = (scale * (16.0 + zero))[:, :, None]
    return acc + a * part - b * x_word[None, :, :]


@triton.jit
def _split8(x):
    """A (..., 8) tensor as its eight (...) slices, in order."""
    even, odd = tl.split(tl.reshape(x, x.shape[:-1] + [4, 2]))  # j = 0, 2, 4, 6 and 1, 3, 5, 7
    x04, x26 = tl.split(tl.reshape(even, even.shape[:-1] + [2, 2]))
    x15, x37 = tl.split(tl.reshape(odd, odd.shape[:-1] + [2, 2]))
    x0, x4 = tl.split(x04)
    x2, x6 = tl.split(x26)
    x1, x5 = tl.split(x15)
    x3, x7 = tl.split(x37)
    return x0, x1, x2, x3, x4, x5, x6, x7


@triton.jit
def _nibble_sixteenths(words, SHIFT: tl.constexpr, NIBBLE_MASK):
    """1 + q / 16 as a float32, exactly, for the 4-bit value q at bits SHIFT..SHIFT+3 of each int32: q moved
    into the top four mantissa bits of 1.0. A shift and one AND-OR per value, and the product with x is one
    multiply-add: the vector kernel's instructions take longer to issue than its bytes take to read.
    ``NIBBLE_MASK`` is bits 19-22, the module's constant of that name passed in as a kernel argument."""
    if SHIFT <= 19:
        moved = words << (19 - SHIFT)
    else:
        moved = words >> (SHIFT - 19)
    return ((moved & NIBBLE_MASK) | 0x3F800000).to(tl.float32, bitcast=True)


@triton.jit
def _nibble_floats(bits):
    """The low four bits of each int32 as a float32, exactly, without an int-to-float conversion (a
    quarter-rate instruction that bounded the decode kernels): OR-ed into the mantissa of 2^23, minus 2^23."""
    return ((bits & 0xF) | 0x4B000000).to(tl.float32, bitcast=True) - 8388608.0


@triton.jit
def _int4_dequant_kernel(P, S, Z, W, N, K, KP, GROUPS, stride_pn, stride_wn, GROUP: tl.constexpr,
                         BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr):
    """W = (q - zero) * scale in float32, stored in W's dtype: the reference's ``dequantize``, bit for bit.
    BLOCK_K spans whole groups, so each row of a tile takes BLOCK_K / GROUP scales and zero points."""
    pid_n, pid_k = tl.program_id(0), tl.program_id(1)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = pid_k * (BLOCK_K // 2) + tl.arange(0, BLOCK_K // 2)
    rows = rn[:, None] < N
    packed = tl.load(P + rn[:, None] * stride_pn + j[None, :], mask=rows & (j[None, :] < KP // 2), other=0)
    # (BLOCK_N, BLOCK_K / 2) bytes -> (BLOCK_N, BLOCK_K) values, low nibble first: column order
    q = tl.reshape(tl.join(packed & 0xF, packed >> 4), (BLOCK_N, BLOCK_K)).to(tl.float32)
    g = pid_k * (BLOCK_K // GROUP) + tl.arange(0, BLOCK_K // GROUP)
    where = rn[:, None] * GROUPS + g[None, :]
    in_k = rows & (g[None, :] < GROUPS)
    scale = tl.load(S + where, mask=in_k, other=0.0)
    zero = tl.load(Z + where, mask=in_k, other=0.0)
    scale = tl.reshape(tl.broadcast_to(scale[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)), (BLOCK_N, BLOCK_K))
    zero = tl.reshape(tl.broadcast_to(zero[:, :, None], (BLOCK_N, BLOCK_K // GROUP, GROUP)), (BLOCK_N, BLOCK_K))
    w = (q - zero) * scale
    rk = pid_k * BLOCK_K + tl.arange(0, BLOCK_K)
    tl.store(W + rn[:, None] * stride_wn + rk[None, :], w.to(W.dtype.element_ty), mask=rows & (rk[None, :] < K))


#: The dequantizing kernel's tile: 32 output channels by 256 columns (8 to 2 groups), 4 warps.
DEQUANT_BLOCK_N, DEQUANT_BLOCK_K = 32, 256


def _dequant_args(weight_packed: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, out: torch.Tensor,
                  n: int, k: int, group: int) -> tuple[tuple, dict, tuple[int, int]]:
    """The dequantizing kernel's arguments, constants and grid for an (n, k) weight in groups of ``group``."""
    kp = weight_packed.shape[1] * 2
    block_k = max(DEQUANT_BLOCK_K, group)
    args = (weight_packed, scale, zero, out, n, k, kp, scale.shape[1], weight_packed.stride(0), out.stride(0))
    return args, {"GROUP": group, "BLOCK_N": DEQUANT_BLOCK_N, "BLOCK_K": block_k}, (
        cdiv(n, DEQUANT_BLOCK_N), cdiv(kp, block_k))


def dequantize_triton(weight: Int4Weight, dtype: torch.dtype) -> torch.Tensor:
    """The (N, K) weight in ``dtype``, written by one Triton kernel: equal to ``reference.dequantize``."""
    out = torch.empty((weight.n, weight.k), device=weight.packed.device, dtype=dtype)
    if weight.n and weight.k:
        args, consts, grid = _dequant_args(weight.packed, weight.scale, weight.zero, out, weight.n, weight.k,
                                           weight.group)
        _LAUNCH_DEQUANT(grid, *args, **consts, num_warps=4)
    return out


#: Rows up to this count take the decode path (split K, float32 buffer); more, the prefill path.
DECODE_ROWS = 64


def _configs(decode: bool) -> list[triton.Config]:
    """The autotuning candidates of one path: tiles, splits of K (decode only), pipeline depth, warps.

    Decode streams the whole weight for a few rows, so its candidates range over how many bytes each
    program keeps in flight: narrow column tiles with long K tiles (several groups each) as well as wide
    ones, and splits of K for more programs; tiles of 32 channels and more also in the weight-left form."""
    if decode:
        shapes = [(16, bn, bk, split, 3, 4, left, False) for bn in (16, 32, 64, 128) for bk in (32, 64, 128, 256, 512)
                  for split in (1, 2, 4, 8) for left in (False, True)
                  if bn * bk <= 128 * 128 and (bk > 32 or split == 1) and (bn >= 32 or not left)]
        # the packed form (bf16): about half the instructions a weight of the float32 forms from 64 channels (a
        # warpgroup MMA; 32-channel tiles take mma.sync and gain little)
        shapes += [(16, bn, bk, split, 3, 4, True, True) for bn in (64, 128) for bk in (64, 128, 256, 512)
                   for split in (1, 2, 4, 8) if bn * bk <= 128 * 256 and (bk > 64 or split == 1)]
    else:
        shapes = [(128, bn, bk, 1, stages, warps, False, False) for bn in (64, 128) for bk in (32, 64)
                  for stages in (3, 4) for warps in (4, 8)]
    return [triton.Config({"BLOCK_M": bm, "BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "WEIGHT_LEFT": left,
                           "PACKED": packed}, num_stages=stages, num_warps=warps)
            for bm, bn, bk, split, stages, warps, left, packed in shapes]


#: Rows up to this count (bf16/fp16) also time the vector path: one program per row re-reads the weight.
VECTOR_ROWS = 4


def _vector_configs() -> list[triton.Config]:
    """The vector path's candidates: channels per program, K per tile (whole groups: one group-wide tile for
    every group, so some candidate fits any K), splits of K, and the loop's form: plain, or, for tiles of 4096
    values and more, the next tile prefetched into registers or pipelined three stages deep (four as well from
    8192 values: few programs over a long K keep more tiles in flight)."""
    tiles = [(bn, bk) for bn in (16, 32, 64) for bk in (32, 64, 128, 256, 512, 1024) if bn * bk <= 16384]

    def forms(values: int) -> list[tuple[int, bool]]:
        if values < 4096:
            return [(1, False)]
        return [(1, False), (1, True), (3, False)] + ([(4, False)] if values >= 8192 else [])

    return [triton.Config({"BLOCK_N": bn, "BLOCK_K": bk, "SPLIT_K": split, "STAGES": stages, "PREFETCH": prefetch},
                          num_stages=stages, num_warps=4)
            for bn, bk in tiles for split in (1, 4, 8) for stages, prefetch in forms(bn * bk)]


def fits(block_k: int, group: int, kp: int) -> bool:
    """Whether a K tile works for a group and padded K: it divides the group (one scale per column) or is a
    whole number of groups, and the tiles cover K exactly."""
    return (group % block_k == 0 or block_k % group == 0) and kp % block_k == 0


def _prune(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Tiles that fit the group and K (``fits``); splits that leave each program at least two K tiles (a
    split of 1 always stays); the packed form only for bf16 x (a call without x offers none)."""
    group, kp = kwargs["GROUP"], named_args["KP"]
    bf16 = getattr(named_args.get("X"), "dtype", None) == torch.bfloat16
    return [c for c in configs if fits(c.kwargs["BLOCK_K"], group, kp)
            and (c.kwargs["SPLIT_K"] == 1 or kp // c.kwargs["BLOCK_K"] >= 2 * c.kwargs["SPLIT_K"])
            and (bf16 or not c.kwargs.get("PACKED"))]


def _prune_vector(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """The vector path's tiles span whole groups (``_prune`` for the rest)."""
    return _prune([c for c in configs if c.kwargs["BLOCK_K"] % kwargs["GROUP"] == 0], named_args, **kwargs)


_KEY = ["M_BUCKET", "N", "K", "GROUP"]
_PRUNE = {"early_config_prune": _prune}
#: Decode in two paths: one program per output tile writing x's dtype (one launch), or K split over
#: programs adding into a zeroed float32 buffer (three launches: zero, GEMM, cast). ``fastest_path`` times both.
_DECODE_DIRECT = triton.autotune([c for c in _configs(True) if c.kwargs["SPLIT_K"] == 1], key=_KEY,
                                 do_bench=bench_candidate, prune_configs_by=_PRUNE)(_int4_gemm_kernel)
_DECODE_SPLIT = triton.autotune([c for c in _configs(True) if c.kwargs["SPLIT_K"] > 1], key=_KEY, reset_to_zero=["C"],
                                do_bench=bench_candidate, prune_configs_by=_PRUNE)(_int4_gemm_kernel)
_PREFILL = triton.autotune(_configs(False), key=_KEY, do_bench=bench_candidate, prune_configs_by=_PRUNE)(
    _int4_gemm_kernel)
_VECTOR_DIRECT = triton.autotune([c for c in _vector_configs() if c.kwargs["SPLIT_K"] == 1], key=_KEY,
                                 do_bench=bench_candidate, prune_configs_by={"early_config_prune": _prune_vector})(
    _int4_vector_kernel)
_VECTOR_SPLIT = triton.autotune([c for c in _vector_configs() if c.kwargs["SPLIT_K"] > 1], key=_KEY,
                                reset_to_zero=["C"], do_bench=bench_candidate,
                                prune_configs_by={"early_config_prune": _prune_vector})(_int4_vector_kernel)
#: Launches skip Triton's per-call dispatch after the first call per specialization (direct_launch.py): a
#: decode step calls every Linear of a model, each a few microseconds of GPU time at the embedded model's size.
_LAUNCH = {tuner: DirectLauncher(tuner) for tuner in (_DECODE_DIRECT, _DECODE_SPLIT, _PREFILL, _VECTOR_DIRECT,
                                                      _VECTOR_SPLIT)}
_LAUNCH_DEQUANT = DirectLauncher(_int4_dequant_kernel)
#: (rows bucket, N, K, group, dtype, bias) -> the path whose whole call was the faster on this GPU.
_FASTEST: dict[tuple, str] = {}
#: (that key, path, rows, packed row stride, device) -> the path's GEMM bound to its compiled kernel and grid
#: (``DirectLauncher.bind``): a decode step calls every Linear of a model, a few microseconds of GPU time each.
_BOUND: dict[tuple, Callable[..., torch.Tensor]] = {}
#: The configuration under the interpreter: tiles large enough to keep the interpreter's per-program cost
#: down, a split of K so the split path is exercised on CPU too (decode calls take the weight-left form, in
#: bf16 its packed form).
_INTERPRET = {"BLOCK_M": 32, "BLOCK_N": 64, "SPLIT_K": 2}


def _splits(tuner, prune, kp: int, group: int) -> bool:  # noqa: ANN001 - an autotuner and its prune rule
    """Whether a split-K path has a candidate for this padded K and group (a K of a few groups leaves every
    split with less than two tiles a program); under the interpreter the fixed split always fits."""
    return interpreting() or _has_split(tuner, prune, kp, group)


@functools.cache
def _has_split(tuner, prune, kp: int, group: int) -> bool:  # noqa: ANN001 - as _splits
    """``_splits`` on a GPU, kept per shape: pruning the candidate list costs ~10 us of host time, and a decode
    step calls every Linear of a model."""
    return bool(prune(tuner.configs, {"KP": kp}, GROUP=group))


def _gemm_out(x2: torch.Tensor, n: int, split: bool) -> torch.Tensor:
    """The GEMM's output: x's dtype, or a zeroed float32 buffer that the split-K programs add into."""
    if split:
        return torch.zeros((x2.shape[0], n), device=x2.device, dtype=torch.float32)
    return torch.empty((x2.shape[0], n), device=x2.device, dtype=x2.dtype)


#: Bits 19-22, where ``_nibble_sixteenths`` moves each 4-bit value: passed to the vector kernel as an argument,
#: not written as a literal, so that the compiler keeps it in a register; the ptxas of Triton 3.6 then makes the
#: AND with it and the OR with 1.0 one LOP3 per value (two with the literal: the loop of a 16 x 512 tile, sm_90,
#: 440 -> 377 instructions).
NIBBLE_MASK = 0x00780000


def _gemm_args(x2: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None, out: torch.Tensor,
               vector: bool) -> tuple:
    """The runtime arguments of both GEMM kernels, in their signature's order."""
    m = x2.shape[0]
    packed = weight.words if vector else weight.packed  # the vector kernel reads int32 words
    return (x2, packed, weight.scale, weight.zero, bias if bias is not None else weight.scale, out, m,
            out.shape[1], weight.k, weight.packed.shape[1] * 2, weight.scale.shape[1], x2.stride(0), packed.stride(0),
            out.stride(0), next_power_of_2(m), NIBBLE_MASK)


def _gemm(x2: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None, *, vector: bool, split: bool,
          bind: tuple | None = None) -> torch.Tensor:
    """One launch of the tensor-core GEMM (``vector`` False) or the vector kernel, autotuned on a GPU; the
    split path adds into a zeroed float32 buffer, cast to x's dtype after. With ``bind`` (a key fixing every
    argument but the tensors), later calls of that key go straight to the compiled kernel (``_BOUND``)."""
    m, n = x2.shape[0], weight.n
    out = _gemm_out(x2, n, split)
    args = _gemm_args(x2, weight, bias, out, vector)
    flags = {"GROUP": weight.group, "HAS_BIAS": bias is not None}
    if not vector:
        flags["IEEE"] = x2.dtype == torch.float32
    if interpreting():
        # group 32: tiles of two groups where K allows, so that path is interpreted too
        kp = weight.packed.shape[1] * 2
        two_groups = weight.group < 64 and kp % (2 * weight.group) == 0
        cfg = {**_INTERPRET, "SPLIT_K": _INTERPRET["SPLIT_K"] if split else 1,
               "BLOCK_K": 2 * weight.group if two_groups else min(weight.group, 64)}
        if vector:
            del cfg["BLOCK_M"]
            cfg["PREFETCH"] = True
            cfg["BLOCK_K"] = 2 * weight.group if kp % (2 * weight.group) == 0 else weight.group
            _int4_vector_kernel[(m, triton.cdiv(n, cfg["BLOCK_N"]), cfg["SPLIT_K"])](*args, **flags, **cfg)
        else:
            grid = (triton.cdiv(m, cfg["BLOCK_M"]), triton.cdiv(n, cfg["BLOCK_N"]), cfg["SPLIT_K"])
            decode = m <= DECODE_ROWS
            _int4_gemm_kernel[grid](*args, **flags, **cfg, INTERPRET=True, WEIGHT_LEFT=decode,
                                    PACKED=decode and x2.dtype == torch.bfloat16)
    else:
        def grid(meta: dict) -> tuple[int, int, int]:
            rows = m if vector else cdiv(m, meta["BLOCK_M"])
            return rows, cdiv(n, meta["BLOCK_N"]), meta["SPLIT_K"]

        if vector:
            launcher = _LAUNCH[_VECTOR_SPLIT if split else _VECTOR_DIRECT]
        else:
            flags["INTERPRET"] = False
            launcher = _LAUNCH[(_DECODE_SPLIT if split else _DECODE_DIRECT) if m <= DECODE_ROWS else _PREFILL]
        launcher(grid, *args, **flags)
        if bind is not None:
            bound = launcher.bind(grid, *args, **flags)
            if bound is not None:
                _BOUND[bind] = functools.partial(_bound_gemm, bound, vector=vector, split=split)
    return out if out.dtype == x2.dtype else out.to(x2.dtype)


def _bound_gemm(launch: BoundLaunch, x2: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None, *,
                vector: bool, split: bool) -> torch.Tensor:
    """``_gemm`` for a shape whose kernel, config and grid are known: the output, the arguments, one launch."""
    out = _gemm_out(x2, weight.n, split)
    launch(*_gemm_args(x2, weight, bias, out, vector))
    return out if out.dtype == x2.dtype else out.to(x2.dtype)


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` with W stored as group-wise 4-bit values (``reference.quantize_int4``); x's dtype
    out, x of shape (..., K)."""
    check_float_input("int4_linear", x)
    if x.shape[-1] != weight.k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {weight.k}")
    bias = checked_bias(bias, weight.n, x.device)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight.k).contiguous()
    m, n = x2.shape[0], weight.n
    if m == 0 or n == 0:
        return torch.empty((*lead, n), device=x.device, dtype=x.dtype)
    key = (next_power_of_2(m), n, weight.k, weight.group, x.dtype, bias is not None)
    path = _FASTEST.get(key)  # once known, only that path is called: a decode step is short on host time
    if path is None:
        paths = offered_paths(x2, weight, bias)
        # not timed under the interpreter: the first path unless set
        path = next(iter(paths)) if interpreting() else fastest_path(_FASTEST, key, paths, "int4_linear")
    elif m <= DECODE_ROWS:  # decode: the path's kernel, config and grid are fixed by the exact shape from here on
        bind = (key, path, m, weight.packed.stride(0), x2.device)
        bound = _BOUND.get(bind)
        if bound is not None:
            return bound(x2, weight, bias).reshape(*lead, n)
        return _PATHS[path](x2, weight, bias, bind=bind).reshape(*lead, n)  # the interpreter binds nothing
    return _PATHS[path](x2, weight, bias).reshape(*lead, n)


def offered_paths(x2: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> dict:
    """Name -> a call computing ``x2 @ W^T + bias`` (x2 of shape (M, K)), for every path ``int4_linear`` may
    take at this shape: the fused GEMM and dequantize-then-matmul for prefill; for decode the direct GEMM, its
    split-K form where the autotuner has a candidate, and the vector kernel (with its split) for up to
    ``VECTOR_ROWS`` bf16/fp16 rows."""
    m = x2.shape[0]
    kp = weight.packed.shape[1] * 2
    if m > DECODE_ROWS:
        names = ["fused", "dequant"]
    else:
        names = ["split", "direct"] if _splits(_DECODE_SPLIT, _prune, kp, weight.group) else ["direct"]
        if m <= VECTOR_ROWS and x2.dtype != torch.float32:  # float32 keeps the reference's per-element weight
            names.append("vector")
            if _splits(_VECTOR_SPLIT, _prune_vector, kp, weight.group):
                names.append("vector_split")
    return {name: functools.partial(_PATHS[name], x2, weight, bias) for name in names}


def _dequant_then_linear(x2: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """The prefill path's alternative: the weight dequantized by one Triton kernel, then the vendor GEMM."""
    return torch.nn.functional.linear(x2, dequantize_triton(weight, x2.dtype), bias)


#: Each path's call ``(x2, weight, bias) -> x2 @ W^T + bias``, by the names ``offered_paths`` gives.
_PATHS = {
    "fused": functools.partial(_gemm, vector=False, split=False),
    "dequant": _dequant_then_linear,
    "direct": functools.partial(_gemm, vector=False, split=False),
    "split": functools.partial(_gemm, vector=False, split=True),
    "vector": functools.partial(_gemm, vector=True, split=False),
    "vector_split": functools.partial(_gemm, vector=True, split=True),
}


def precompile(m: int, n: int, k: int, group: int, dtype: torch.dtype, has_bias: bool,
               shard: tuple[int, int] = (0, 1)) -> None:
    """Compile, without launching, this shard's part of the autotuning candidates ``int4_linear`` will try
    for (m, n, k, group, dtype), so that a run's worker processes compile them side by side (candidate
    ``i`` goes to shard ``i % count``) rather than one by one in the first call."""
    if interpreting():
        return
    device = "cuda"
    kp = -(-k // group) * group
    x = torch.zeros((1, k), device=device, dtype=dtype)
    packed = torch.zeros((1, kp // 2), device=device, dtype=torch.uint8)
    words = packed.view(torch.int32)
    scale = torch.zeros((1, kp // group), device=device, dtype=torch.float32)
    decode = m <= DECODE_ROWS
    tensor_flags = {"GROUP": group, "HAS_BIAS": has_bias, "IEEE": dtype == torch.float32, "INTERPRET": False}
    tuners = [(_DECODE_DIRECT, tensor_flags), (_DECODE_SPLIT, tensor_flags)] if decode else [(_PREFILL, tensor_flags)]
    if m <= VECTOR_ROWS and dtype != torch.float32:
        tuners += [(_VECTOR_DIRECT, {"GROUP": group, "HAS_BIAS": has_bias}),
                   (_VECTOR_SPLIT, {"GROUP": group, "HAS_BIAS": has_bias})]
    jobs = []
    for tuner, flags in tuners:
        out = torch.zeros((1, 1), device=device,
                          dtype=torch.float32 if tuner in (_DECODE_SPLIT, _VECTOR_SPLIT) else dtype)
        # the integer arguments' values matter only through Triton's specialization (divisible by 16, equal to 1)
        vector = tuner in (_VECTOR_DIRECT, _VECTOR_SPLIT)
        args = (x, words if vector else packed, scale, scale, x if has_bias else scale, out, m, n, k, kp, kp // group,
                k, kp // 8 if vector else kp // 2, n, triton.next_power_of_2(m), NIBBLE_MASK)
        prune = _prune_vector if vector else _prune
        jobs += [(tuner, args, flags, cfg) for cfg in prune(tuner.configs, dict(zip(tuner.arg_names, args)), **flags)]
    index, count = shard
    for tuner, args, flags, cfg in jobs[index::count]:
        tuner.fn.warmup(*args, grid=(1,), **flags, **cfg.all_kwargs())
    if not decode and index == count - 1:  # the prefill path's second kernel (the last shard has the fewest jobs)
        out = torch.empty((1, k), device=device, dtype=dtype)  # its row stride is the call's (k)
        args, consts, _ = _dequant_args(packed, scale, scale, out, n, k, group)
        _int4_dequant_kernel.warmup(*args, **consts, grid=(1,), num_warps=4)
