"""Eager attention: the readable ground truth for the flash-attention kernel and its peers.

Called on float64 inputs it is the reference every variant is judged against; called in a variant's own
dtype it measures how much error plain PyTorch makes there, which calibrates the tolerance.

Memory traffic (elements, one forward, B*H heads, ignoring caches), which is what a fused kernel removes:

* ``scores = q @ k^T * scale``: reads B*H*(Sq + Sk)*D, writes B*H*Sq*Sk (the scale is fused into the GEMM
  epilogue on GPU at best, else one more read and write of B*H*Sq*Sk);
* causal mask: reads and writes B*H*Sq*Sk;
* softmax: reads B*H*Sq*Sk, writes B*H*Sq*Sk (max, exp, sum and divide fused in one kernel);
* ``probs @ v``: reads B*H*Sq*Sk + B*H*Sk*D, writes B*H*Sq*D.

So about 4-6 passes over a B*H*Sq*Sk tensor against 2*B*H*(Sq + Sk)*D elements of real input and output;
the backward keeps ``probs`` alive for autograd (B*H*Sq*Sk of activation memory) and reads it twice more.
FlashAttention keeps each score tile on chip and touches only q, k, v, o (and one float per query).
"""

from __future__ import annotations

import math

import torch

__all__ = ["causal_visible", "eager_attention"]


def causal_visible(sq: int, sk: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(Sq, Sk) bool mask, True where query i may see key j: ``j <= i + Sk - Sq`` (bottom-right aligned).

    This is FlashAttention-2's convention: the last query sees every key, as when the queries are the last Sq
    tokens of a Sk-token sequence (chunked prefill). For Sq == Sk it is the usual lower triangle.
    """
    rows = torch.arange(sq, device=device)[:, None]
    cols = torch.arange(sk, device=device)[None, :]
    return cols <= rows + (sk - sq)


def eager_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                    sm_scale: float | None = None, rows_per_step: int | None = None) -> torch.Tensor:
    """``softmax(q @ k^T * sm_scale [masked]) @ v`` in q's dtype, step by step.

    Shapes: q (B, H, Sq, D), k and v (B, H, Sk, D). ``sm_scale`` defaults to 1/sqrt(D). With ``causal``,
    queries that see no key (Sq > Sk) output zeros, as FlashAttention-2 and SDPA do, and get zero gradient.
    ``rows_per_step`` evaluates that many query rows at a time (the same math, for a float64 truth whose
    scores would not fit at once).
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    sq = q.shape[-2]
    visible = causal_visible(sq, k.shape[-2], q.device) if causal else None
    step = max(1, sq if rows_per_step is None else rows_per_step)
    outs = [_attend(q[..., r0:r0 + step, :], k, v, None if visible is None else visible[r0:r0 + step], scale)
            for r0 in range(0, max(sq, 1), step)]
    return outs[0] if len(outs) == 1 else torch.cat(outs, dim=-2)


def _attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, visible: torch.Tensor | None,
            scale: float) -> torch.Tensor:
    """Eager attention of a block of query rows; ``visible`` is their rows of the causal mask (None: no mask)."""
    # reads B*H*(Sq+Sk)*D, writes B*H*Sq*Sk
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if visible is None:
        # reads B*H*Sq*Sk, writes B*H*Sq*Sk
        probs = torch.softmax(scores, dim=-1)
    else:
        # reads and writes B*H*Sq*Sk
        scores = scores.masked_fill(~visible, float("-inf"))
        probs = torch.softmax(scores, dim=-1)
        sees_nothing = ~visible.any(dim=-1, keepdim=True)
        if bool(sees_nothing.any()):
            # softmax of an all -inf row is NaN; those queries attend to nothing. masked_fill's backward
            # zeroes the gradient there, so the NaN never reaches q or k.
            probs = probs.masked_fill(sees_nothing, 0.0)
    # reads B*H*Sq*Sk + B*H*Sk*D, writes B*H*Sq*D
    return torch.matmul(probs, v)
