"""One dot-product helper for the rooms' Triton kernels that accumulate in fp32 (flash_attn, int4_weight_only)."""

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
