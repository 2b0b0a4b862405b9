"""Eager attention with the dense sliding-window / BigBird mask: the readable ground truth.

Called on float64 inputs it is the reference every variant is judged against; called in a variant's own
dtype it measures how much error plain PyTorch makes there, which calibrates the tolerance. It materializes
the (Sq, Sk) mask and B*H*Sq*Sk scores and probabilities, whatever the window: that quadratic memory and
time is what the kernel's tile skipping removes.
"""

from __future__ import annotations

import math

import torch

from .mask import MaskSpec, block_pairs, dense_mask, n_blocks

__all__ = ["masked_attention", "spec_and_pairs"]


def spec_and_pairs(pattern: torch.Tensor | None, sk: int, window: int, globals: int, block: int,
                   causal: bool) -> tuple[MaskSpec, torch.Tensor | None]:
    """The variants' shared arguments as ``mask.py`` objects: the spec and the (n_blocks, n_blocks) pairs."""
    spec = MaskSpec(window=window, causal=bool(causal), globals=globals, block=block)
    return spec, block_pairs(pattern, n_blocks(sk, block))


def masked_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: torch.Tensor | None = None,
                     window: int = 0, globals: int = 0, block: int = 64, causal: bool = False,
                     sm_scale: float | None = None, rows_per_step: int | None = None) -> torch.Tensor:
    """``softmax(q @ k^T * sm_scale, masked) @ v`` in q's dtype, step by step; rows that see no key give 0.

    Shapes and mask arguments as ``kernel.sliding_window_attention``. ``rows_per_step`` evaluates that many
    query rows at a time (the same math, for a ground truth whose scores would not fit at once).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    sq, sk = q.shape[-2], k.shape[-2]
    spec, pairs = spec_and_pairs(None if pattern is None else pattern.to(q.device), sk, window, globals, block,
                                 causal)
    seen = dense_mask(spec, pairs, sq, sk, q.device)
    step = sq if rows_per_step is None else rows_per_step
    return torch.cat([_attend(q[..., r0:r0 + step, :], k, v, seen[r0:r0 + step], scale)
                      for r0 in range(0, sq, step)], dim=-2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor, scale: float) -> torch.Tensor:
    # reads B*H*(Sq+Sk)*D, writes B*H*Sq*Sk
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    # reads and writes B*H*Sq*Sk
    scores = scores.masked_fill(~seen, float("-inf"))
    probs = torch.softmax(scores, dim=-1)
    # softmax of an all -inf row is NaN; those queries attend to nothing. masked_fill's backward zeroes the
    # gradient there, so the NaN never reaches q or k.
    probs = probs.masked_fill(~seen.any(dim=-1, keepdim=True), 0.0)
    # reads B*H*Sq*Sk + B*H*Sk*D, writes B*H*Sq*D
    return torch.matmul(probs, v)
