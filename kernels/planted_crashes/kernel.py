"""A deliberately wrong Triton kernel: every program stores one block far beyond its output."""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _oob_store(out_ptr, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    # 2**40 elements (4 TiB) past the end: no mask, and no GPU maps memory there
    tl.store(out_ptr + offs + 1099511627776, tl.zeros([BLOCK], tl.float32))


def out_of_bounds_store(x: torch.Tensor) -> torch.Tensor:
    out = torch.empty_like(x, dtype=torch.float32)
    _oob_store[(triton.cdiv(out.numel(), 256),)](out, out.numel(), BLOCK=256)
    return out
