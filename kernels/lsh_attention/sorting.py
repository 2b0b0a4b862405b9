"""Tokens sorted by bucket: the order in which LSH attention's neighbours are contiguous.

The sort key is ``(bucket, position)``: a stable sort by bucket, so inside a bucket tokens keep their
sequence order (what makes causal masking and the causal-safe ``window`` rule cheap). The permutation is an
index tensor; nothing is copied until a caller gathers with it.
"""

from __future__ import annotations

import torch

__all__ = ["bucket_counts", "permute", "sort_by_bucket", "unpermute"]


def sort_by_bucket(buckets: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(perm, rank)`` of ``buckets`` (..., S) in (bucket, position) order, both int64 (..., S).

    ``perm[..., r]`` is the position of the ``r``-th token in sorted order; ``rank`` is its inverse
    (``rank[..., perm[..., r]] == r``), the sorted index of each position.
    """
    s = buckets.shape[-1]
    pos = torch.arange(s, device=buckets.device)
    perm = torch.argsort(buckets * s + pos, dim=-1)  # unique codes: the order is fully determined
    rank = torch.empty_like(perm).scatter_(-1, perm, pos.expand_as(perm).contiguous())
    return perm, rank


def bucket_counts(buckets: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """Tokens per bucket, int64 (..., n_buckets)."""
    counts = torch.zeros((*buckets.shape[:-1], n_buckets), dtype=torch.int64, device=buckets.device)
    return counts.scatter_add_(-1, buckets, torch.ones_like(buckets))


def permute(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """Rows of ``x`` (..., S, D) in the order ``perm`` (..., S) lists them (sorted order)."""
    return x.gather(-2, perm.unsqueeze(-1).expand(*perm.shape, x.shape[-1]))


def unpermute(x: torch.Tensor, perm: torch.Tensor) -> torch.Tensor:
    """The inverse of ``permute``: rows of sorted ``x`` back at their positions."""
    return torch.empty_like(x).scatter_(-2, perm.unsqueeze(-1).expand(*perm.shape, x.shape[-1]), x)
