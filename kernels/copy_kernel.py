"""A device-to-device copy as a Triton kernel: the copy yardstick for timings from CUDA graphs.

Why not ``dst.copy_(src)``: captured into a CUDA graph, torch's copy becomes a memcpy node, which
the H200 ran at 2.77 TB/s against 4.25 TB/s for the same copy launched as a kernel outside a graph
(2026-12-03). A kernel timed from graph replays must be quoted against a copy that is a kernel too.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: bytes each program moves: 32 KiB, 16-byte words, 8 per thread at 8 warps
BLOCK_BYTES = 32768


@triton.jit
def _copy_kernel(SRC, DST, n, BLOCK: tl.constexpr):
    offs = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    tl.store(DST + offs, tl.load(SRC + offs, mask=mask), mask=mask)


def triton_copy(src: torch.Tensor, dst: torch.Tensor) -> None:
    """``dst[:] = src`` for two contiguous tensors of the same size in bytes, in 4-byte words where
    the size allows (the compiler then moves 16 bytes per access)."""
    if not (src.is_contiguous() and dst.is_contiguous()):
        raise ValueError("triton_copy needs contiguous tensors; call .contiguous() first")
    nbytes = src.numel() * src.element_size()
    if nbytes != dst.numel() * dst.element_size():
        raise ValueError(f"triton_copy: {nbytes} bytes in src but {dst.numel() * dst.element_size()} in dst")
    word = torch.int32 if nbytes % 4 == 0 else torch.uint8
    s = src.reshape(-1).view(torch.uint8).view(word)
    d = dst.reshape(-1).view(torch.uint8).view(word)
    block = BLOCK_BYTES // s.element_size()
    _copy_kernel[(triton.cdiv(s.numel(), block),)](s, d, s.numel(), BLOCK=block, num_warps=8)
