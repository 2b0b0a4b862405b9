"""A calibrated amount of work: the instrument that checks microscope's own latency verdicts.

``spin(x, iters)`` does exactly ``iters`` dependent multiply-adds per element, so the candidate
``spin(x, iters * (1 + p))`` is slower than the baseline by a known fraction ``p`` of the loop, and the
A/A candidate (``p = 0``) is the same work. On GPU the loop is one Triton kernel (no launch overheads
in the measurement); on CPU it is a torch loop of in-place multiply-adds on a small tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl


@triton.jit
def _spin_kernel(x_ptr, out_ptr, n, iters, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    for _ in range(iters):
        acc = acc * 0.999 + 0.001  # a dependent chain: the compiler cannot shorten it
    tl.store(out_ptr + offs, acc, mask=mask)


def spin(x: torch.Tensor, iters: int) -> torch.Tensor:
    """``iters`` dependent multiply-adds on every element of ``x`` (float32 result)."""
    if x.is_cuda:
        out = torch.empty_like(x, dtype=torch.float32)
        block = 1024
        _spin_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), iters, BLOCK=block)
        return out
    acc = x.to(torch.float32).clone()
    for _ in range(iters):
        acc.mul_(0.999).add_(0.001)
    return acc


def spin_reference(x: torch.Tensor, iters: int) -> torch.Tensor:
    """Closed form of the same recurrence: a^n x + (1 - a^n), with a = 0.999 (float64-exact)."""
    a = 0.999**iters
    return (x.to(torch.float64) * a + (1 - a)).to(torch.float32 if x.dtype != torch.float64 else torch.float64)
