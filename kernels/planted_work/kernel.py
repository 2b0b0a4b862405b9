"""A calibrated amount of work: the instrument that checks microscope's own latency verdicts.

``spin(x, iters)`` does exactly ``iters`` dependent multiply-adds per element, so the candidate
``spin(x, iters * (1 + p))`` is slower than the baseline by a known fraction ``p`` of the loop, and the
A/A candidate (``p = 0``) is the same work. On GPU the loop is one Triton kernel (no launch overheads
in the measurement); on CPU it is a torch loop of in-place multiply-adds on a small tensor.

``spin_planted`` is the nightly gate's target: the same answer after ``extra`` more iterations whose
result is thrown away (planted work that changes neither the output nor the memory), optionally with
every element scaled by ``1 + delta`` or ``1 - delta`` in turn (a planted numerics change). The signs
alternate so the error grows whatever the sign of the loop's own rounding bias: a uniform scale can
cancel that bias and *lower* the error. A separate kernel, so ``spin``'s calibrated cost never changes.
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


@triton.jit
def _spin_planted_kernel(x_ptr, out_ptr, n, iters, extra, delta, zero, BLOCK: tl.constexpr):
    offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
    mask = offs < n
    acc = tl.load(x_ptr + offs, mask=mask, other=0.0).to(tl.float32)
    junk = acc
    for _ in range(extra):
        junk = junk * 0.999 + 0.001
    for _ in range(iters):
        acc = acc * 0.999 + 0.001
    # zero is a run-time 0.0 the compiler cannot see through, so the planted loop is kept; the junk
    # stays finite, so junk * 0.0 is a zero and the answer is unchanged (no extra buffer either)
    sign = 1.0 - 2.0 * (offs % 2).to(tl.float32)  # +1, -1, +1, ... by element
    tl.store(out_ptr + offs, acc * (1.0 + delta * sign) + junk * zero, mask=mask)


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


def spin_planted(x: torch.Tensor, iters: int, extra: int = 0, delta: float = 0.0) -> torch.Tensor:
    """``spin(x, iters)`` with its elements scaled by ``1 + delta``, ``1 - delta``, ... in turn, after
    ``extra`` iterations whose result is discarded; no memory beyond ``spin``'s (the planted work must
    show as time only)."""
    if x.is_cuda:
        out = torch.empty_like(x, dtype=torch.float32)
        block = 1024
        _spin_planted_kernel[(triton.cdiv(x.numel(), block),)](x, out, x.numel(), iters, extra, delta, 0.0,
                                                                BLOCK=block)
        return out
    acc = x.to(torch.float32).clone()
    for _ in range(extra):
        acc.mul_(0.999).add_(0.001)
    if extra:
        acc.copy_(x)
    for _ in range(iters):
        acc.mul_(0.999).add_(0.001)
    if delta:  # in place on strided views: the plant must not show as memory either
        flat = acc.view(-1)
        flat[0::2].mul_(1.0 + delta)
        flat[1::2].mul_(1.0 - delta)
    return acc


def spin_reference(x: torch.Tensor, iters: int) -> torch.Tensor:
    """Closed form of the same recurrence: a^n x + (1 - a^n), with a = 0.999 (float64-exact)."""
    a = 0.999**iters
    return (x.to(torch.float64) * a + (1 - a)).to(torch.float32 if x.dtype != torch.float64 else torch.float64)
