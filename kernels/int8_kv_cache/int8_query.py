"""Scores as int8 dot products: the query quantized to int8, four products per instruction.

Why: the CUDA-core kernel is issue-bound, not bandwidth-bound (Nsight, H200: 82% of issue slots).
Per int32 word of K (four int8 channels) the float path issues 1 LOP3 + 4 PRMT to unpack, 4 FSUB
to remove the magic bias and 4 FMA: 13 instructions. With the query in int8 too, one DP4A (four
int8 products summed into int32, exact) does the same word's work. The K cache is then never
converted to float: the score is (integer dot product) x (query step) x (key scale).

What it costs: the query carries a rounding error of up to half its step, ``max|q| / 127`` per
(batch, head), as each K value already does. The same trade is made by SageAttention (Zhang et al.,
ICLR 2025), which quantizes Q and K to int8 for the QK^T products. The accuracy cost is measured
against float64 in ``tests/kernels/test_int8_kv_cache.py`` and in the bench's correctness check,
and at model level as the perplexity change.

Exactness between the kernel and ``quantize_query`` (the torch twin that tests and references
use): both compute the step and the quotient with correctly rounded fp32 division and round half
up with ``floor(x + 0.5)``, so GPU, interpreter and torch agree bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Largest magnitude of a quantized query element (symmetric, as the cache).
QMAX = 127


@triton.jit
def _to_int8(x, step):
    """round(x / step) held to [-127, 127], as int32 (see ``quantize_query``)."""
    r = tl.floor(tl.math.div_rn(x, step) + 0.5)
    return tl.minimum(tl.maximum(r, -127.0), 127.0).to(tl.int32)


@triton.jit
def quantize_query_tiles(q0, q1, q2, q3):
    """Four fp32 query tiles (channels 4w + j) -> the int8 values as int32 tiles, the same values
    packed four to a word (byte j = channel 4w + j, the cache's layout) and the step."""
    amax = tl.maximum(tl.maximum(tl.max(tl.abs(q0), axis=0), tl.max(tl.abs(q1), axis=0)),
                      tl.maximum(tl.max(tl.abs(q2), axis=0), tl.max(tl.abs(q3), axis=0)))
    step = tl.where(amax > 0, tl.math.div_rn(amax, 127.0), 1.0)  # an all-zero query: any step, all zeros
    i0, i1, i2, i3 = _to_int8(q0, step), _to_int8(q1, step), _to_int8(q2, step), _to_int8(q3, step)
    word = (i0 & 0xFF) | ((i1 & 0xFF) << 8) | ((i2 & 0xFF) << 16) | (i3 << 24)
    return i0, i1, i2, i3, word, step


@triton.jit
def int8_dot_words(k_words, q_word, i0, i1, i2, i3, PTX: tl.constexpr):
    """Per word of a (BLOCK_T, D/4) int32 tile: the sum of its four int8 bytes times the query's
    (exact, int32). ``PTX``: one ``dp4a`` per word. Otherwise sign-extending shifts and integer
    multiply-adds with the same result (what the CPU interpreter runs)."""
    if PTX:
        return tl.inline_asm_elementwise(
            asm="dp4a.s32.s32 $0, $1, $2, $3;", constraints="=r,r,r,r",
            args=[k_words, q_word[None, :], tl.zeros_like(k_words)], dtype=tl.int32, is_pure=True, pack=1)
    return (((k_words << 24) >> 24) * i0[None, :] + ((k_words << 16) >> 24) * i1[None, :]
            + ((k_words << 8) >> 24) * i2[None, :] + (k_words >> 24) * i3[None, :])


def quantize_query(q: torch.Tensor, k_scale: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """The kernel's int8 query, bit for bit: ``(values (B, H, D) int32, step (B, H) fp32)``.

    ``k_scale`` (B, H, D): per-channel K scales, folded into q before quantizing (as the kernel does);
    None for a per-token cache. The kernel's scores are ``values . k_int8 * step`` (times the token's
    K scale for a per-token cache, and the softmax scale).
    """
    x = q.float()
    if k_scale is not None:
        x = x * k_scale.float()
    amax = x.abs().amax(dim=-1)
    step = torch.where(amax > 0, amax / QMAX, torch.ones_like(amax))
    values = torch.floor(x / step.unsqueeze(-1) + 0.5).clamp_(-QMAX, QMAX).to(torch.int32)
    return values, step
