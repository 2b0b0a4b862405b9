"""The "before" (naive softmax), the peer (torch.softmax) and the float64 ground truth.

Memory traffic of one forward over an (M, N) input with element size s:

    naive  : exp(x)            read x (M*N*s)    write e (M*N*s)
             e.sum(-1)         read e (M*N*s)    write M sums
             e / sum           read e (M*N*s)    write y (M*N*s)
             total ~5*M*N*s, and it overflows: exp(x) is inf for x > ~11.1 (fp16) or ~88.7 (bf16, fp32)
    fused  : read x, write y   2*M*N*s (max, exponentials and sum stay in registers)

Backward: autograd of the naive version reads and writes several M*N temporaries; the fused one
reads y and dy and writes dx (3*M*N*s).
"""

from __future__ import annotations

import torch


def naive_softmax(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)) without the max shift: the textbook formula that overflows."""
    e = torch.exp(x)
    return e / e.sum(dim=-1, keepdim=True)


def torch_softmax(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax over the last dim (max-shifted internally): what users call today."""
    return torch.softmax(x, dim=-1)


def safe_softmax_reference(x: torch.Tensor) -> torch.Tensor:
    """The true softmax (evaluate in float64): max-shifted, fully masked rows -> zeros.

    Differentiable, so the harness can take float64 gradients through it.
    """
    row_max = x.amax(dim=-1, keepdim=True)
    row_max = torch.where(torch.isfinite(row_max), row_max, torch.zeros_like(row_max)).detach()
    e = torch.exp(x - row_max)
    total = e.sum(dim=-1, keepdim=True)
    return e / torch.where(total > 0, total, torch.ones_like(total))
