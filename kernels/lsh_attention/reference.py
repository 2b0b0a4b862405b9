"""LSH attention done densely: the same buckets and intervals, as a (Sq, Sk) mask on eager attention.

Called on float64 inputs it is the ground truth the kernel is judged against (the hashes are computed in
float64 from the same values, so both see the same keys); called in a variant's own dtype it measures the
error plain PyTorch makes there, which calibrates the tolerance. It materializes the union mask and
B*H*Sq*Sk scores: the quadratic cost the kernel avoids. ``full_attention`` is the unbucketed softmax the
recall measure and the speed peers compare with.
"""

from __future__ import annotations

import math

import torch

from .visibility import LSHSpec, key_intervals, visible_mask

__all__ = ["full_attention", "lsh_attention_reference", "masked_softmax_attention"]


def masked_softmax_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seen: torch.Tensor,
                             scale: float) -> torch.Tensor:
    """``softmax(q k^T * scale, masked by seen) v`` in q's dtype; rows that see no key give 0.

    Such rows are computed unmasked and then zeroed, so that their softmax is finite and their (zero)
    gradient never turns into NaN on the way to q and k.
    """
    # reads B*H*(Sq+Sk)*D, writes B*H*Sq*Sk
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    empty = ~seen.any(dim=-1, keepdim=True)
    # reads and writes B*H*Sq*Sk
    scores = scores.masked_fill(~(seen | empty), float("-inf"))
    probs = torch.softmax(scores, dim=-1).masked_fill(empty, 0.0)
    # reads B*H*Sq*Sk + B*H*Sk*D, writes B*H*Sq*D
    return torch.matmul(probs, v)


def lsh_attention_reference(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor,
                            n_buckets: int, chunk: int, causal: bool = False, rule: str = "chunk",
                            sm_scale: float | None = None, rows_per_step: int | None = None) -> torch.Tensor:
    """The kernel's math with a dense mask; arguments as ``kernel.lsh_attention``.

    ``rows_per_step`` evaluates that many query rows at a time (the same math, for a ground truth whose
    scores would not fit at once).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=bool(causal), rule=rule)
    iv = key_intervals(spec, q, k, rotations)
    sq = q.shape[-2]
    step = sq if rows_per_step is None else rows_per_step
    return torch.cat([masked_softmax_attention(q[..., r0:r0 + step, :], k, v,
                                               visible_mask(spec, iv, slice(r0, r0 + step)), scale)
                      for r0 in range(0, sq, step)], dim=-2)


def full_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None) -> torch.Tensor:
    """Plain softmax attention over every key (causal: bottom-right aligned, as the kernels)."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    sq, sk = q.shape[-2], k.shape[-2]
    seen = torch.ones((sq, sk), dtype=torch.bool, device=q.device)
    if causal:
        seen = seen.tril(diagonal=sk - sq)
    return masked_softmax_attention(q, k, v, seen, scale)
