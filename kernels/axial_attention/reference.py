"""Axial attention in plain PyTorch (matmul, softmax, matmul per pass): the baseline and, in float64, the
ground truth; and plain full attention over the whole sequence, which axial attention replaces.

Each pass materializes its (L, L) scores for every row or column sequence: B*H*S*(rows + cols) scores in all,
against B*H*S^2 for full attention.
"""

from __future__ import annotations

import math

import torch

from .grid import axial

__all__ = ["axial_attention_reference", "eager_attention", "full_attention_reference"]


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
                    sm_scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * scale [+ causal mask]) v`` over (B, H, L, D) tensors, in q's dtype."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    # reads B*H*2*L*D, writes B*H*L*L
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        length = q.shape[-2]
        future = torch.ones(length, length, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(future, float("-inf"))
    # reads B*H*L*L + B*H*L*D, writes B*H*L*D
    return torch.matmul(torch.softmax(scores, dim=-1), v)


def axial_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
                              causal: bool = False) -> torch.Tensor:
    """Axial attention (``grid.axial``) with eager attention in both passes."""
    return axial(eager_attention, q, k, v, rows, cols, causal)


def full_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int | None = None,
                             cols: int | None = None, causal: bool = False) -> torch.Tensor:
    """Eager attention over the whole sequence (the grid arguments are accepted and ignored)."""
    return eager_attention(q, k, v, causal)
