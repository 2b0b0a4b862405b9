"""Magnitude sparsity in plain PyTorch: the seed's mask ``|w| > threshold`` at a target sparsity, the 2:4
pattern (two of every four consecutive input columns kept), and whole-block pruning, plus the block
index the Triton kernel walks.

Unstructured masks keep the most weights for a given sparsity but leave no block of zeros to skip; 2:4 is
what sparse tensor cores run; blocks (``BLOCK`` x ``BLOCK`` tiles pruned by their norm) are what a plain
tiled GEMM can skip.
"""

from __future__ import annotations

import torch

PATTERNS = ("unstructured", "2:4", "block")
BLOCK = 32


def magnitude_mask(weight: torch.Tensor, sparsity: float) -> torch.Tensor:
    """Keep the ``1 - sparsity`` largest ``|w|`` (the seed's ``|w| > threshold``, threshold the quantile)."""
    if not 0 <= sparsity < 1:
        raise ValueError(f"sparsity {sparsity}: a fraction in [0, 1)")
    flat = weight.detach().abs().flatten().float()
    drop = int(sparsity * flat.numel())
    if drop == 0:
        return torch.ones_like(weight, dtype=torch.bool)
    threshold = flat.kthvalue(drop).values
    return weight.detach().abs() > threshold


def two_four_mask(weight: torch.Tensor) -> torch.Tensor:
    """In every group of 4 consecutive input columns keep the 2 of largest ``|w|`` (K a multiple of 4)."""
    n, k = weight.shape
    if k % 4:
        raise ValueError(f"the 2:4 pattern needs K a multiple of 4, got K={k}")
    groups = weight.detach().abs().float().view(n, k // 4, 4)
    keep = groups.topk(2, dim=-1).indices
    mask = torch.zeros_like(groups, dtype=torch.bool).scatter_(-1, keep, True)
    return mask.view(n, k)


def block_mask(weight: torch.Tensor, sparsity: float, block: int = BLOCK) -> torch.Tensor:
    """Zero whole ``block`` x ``block`` tiles: the ``sparsity`` share of tiles with the smallest norm."""
    n, k = weight.shape
    bn, bk = -(-n // block), -(-k // block)
    padded = torch.zeros((bn * block, bk * block), device=weight.device)
    padded[:n, :k] = weight.detach().float()
    norms = padded.view(bn, block, bk, block).pow(2).sum(dim=(1, 3))
    keep = magnitude_mask(norms, sparsity) if sparsity > 0 else torch.ones_like(norms, dtype=torch.bool)
    return keep.repeat_interleave(block, 0).repeat_interleave(block, 1)[:n, :k]


def mask_for(weight: torch.Tensor, pattern: str, sparsity: float = 0.5) -> torch.Tensor:
    """The mask of ``pattern`` (one of ``PATTERNS``); 2:4 is 50% by construction."""
    if pattern == "unstructured":
        return magnitude_mask(weight, sparsity)
    if pattern == "2:4":
        return two_four_mask(weight)
    if pattern == "block":
        return block_mask(weight, sparsity)
    raise ValueError(f"pattern {pattern!r}: one of {', '.join(PATTERNS)}")


def nonzero_blocks(weight: torch.Tensor, block_n: int, block_k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """For each ``block_n``-row strip of the weight, the K-block indices holding a nonzero: (index int32
    (strips, K blocks), the occupied ones first in order, count int32 (strips,)). The width is fixed by
    the shape, so weights of one shape give indices of one shape."""
    n, k = weight.shape
    sn, sk = -(-n // block_n), -(-k // block_k)
    padded = torch.zeros((sn * block_n, sk * block_k), device=weight.device, dtype=torch.bool)
    padded[:n, :k] = weight != 0
    occupied = padded.view(sn, block_n, sk, block_k).any(dim=3).any(dim=1)  # (strips, K blocks)
    count = occupied.sum(dim=1).to(torch.int32)
    order = torch.argsort((~occupied).to(torch.int8), dim=1, stable=True)  # occupied blocks first, in order
    return order.to(torch.int32).contiguous(), count.contiguous()
