"""Interpreter-correct fp32 arithmetic for the rooms' Triton kernels: one dot-product helper (flash_attn,
int4_weight_only, sliding_window_attention) and one rounding helper."""

from __future__ import annotations

import triton
import triton.language as tl


@triton.jit
def mma(a, b, acc, INTERPRET: tl.constexpr, IEEE: tl.constexpr):
    """``a @ b (+ acc)`` in fp32: exact products for fp32 inputs (``IEEE``), tensor cores for fp16/bf16, and
    fp32 when interpreted (the interpreter's bf16 arithmetic is not IEEE-correct)."""
    if INTERPRET:
        return tl.dot(a.to(tl.float32), b.to(tl.float32), acc, input_precision="ieee")
    elif IEEE:
        return tl.dot(a, b, acc, input_precision="ieee")
    else:
        return tl.dot(a, b, acc)


@triton.jit
def round_to(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Round fp32 ``x`` to ``DTYPE`` to nearest even (the interpreter truncates to bf16: round the bits)."""
    if INTERPRET and DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    return x.to(DTYPE)
