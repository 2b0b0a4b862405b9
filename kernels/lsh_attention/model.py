"""Model level: the embedded model's attention swapped for causal-safe LSH attention in every block, through
the per-block swap point ``block.attn.attn_fn``.

The model is a causal LM, and Reformer's chunk rule is not causal-safe (see ``visibility.py``), so the arm
uses the ``window`` rule: per hash round, a query sees the last ``window`` keys of its own bucket at or
before it. Defaults: 8 buckets, 2 rounds, ``window = context // 8``, so a query scores at most
``context / 4`` keys (the key budget of sliding_window_attention's window arm). Each block draws its
rotations once, when patched, from a fixed seed and its index (Reformer redraws them every step; fixed
rotations keep evaluation deterministic and a decode step equal to its prefill).
"""

from __future__ import annotations

import torch

from microscope.api import Transformer

from .hashing import draw_rotations
from .kernel import SUPPORTED_HEAD_DIMS, lsh_attention
from .reference import lsh_attention_reference

__all__ = ["LSHAttention", "use_lsh_attention", "window_for"]

#: Seed of the blocks' rotations (block i uses ``_ROTATION_SEED + i``).
_ROTATION_SEED = 2024


def window_for(context: int, n_buckets: int) -> int:
    """Keys per bucket window: the context shared among the buckets (at least one)."""
    return max(1, context // n_buckets)


class LSHAttention:
    """An ``attn_fn`` (``microscope.workloads.attention`` contract) running causal LSH attention.

    The model passes ``causal=True`` with as many queries as keys (training, evaluation, prefill) and
    ``causal=False`` for a one-token decode step over the cache; both are the causal window rule here, with the
    decode query aligned to the last key, so it sees what it saw as the last row of a prefill.

    ``eager=True`` computes the same buckets and mask with ``reference.lsh_attention_reference`` in plain
    PyTorch: trainable for hundreds of steps on a CPU, where the interpreted kernel is not.
    """

    def __init__(self, rotations: torch.Tensor, n_buckets: int, window: int, eager: bool = False) -> None:
        self.rotations = rotations
        self.n_buckets = n_buckets
        self.window = window
        self.eager = eager

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        if self.rotations.device != q.device:
            self.rotations = self.rotations.to(q.device)
        attend = lsh_attention_reference if self.eager else lsh_attention
        return attend(q, k, v, self.rotations, self.n_buckets, self.window, causal=True, rule="window")

    def __repr__(self) -> str:
        return (f"LSHAttention(n_buckets={self.n_buckets}, n_hashes={self.rotations.shape[0]}, "
                f"window={self.window}{', eager' if self.eager else ''})")


def use_lsh_attention(model: Transformer, n_buckets: int = 8, n_hashes: int = 2, window: int | None = None,
                      eager: bool = False) -> None:
    """Every block attends through causal LSH attention with its own seeded rotations (``eager`` as
    ``LSHAttention``'s)."""
    head_dim = model.cfg.head_dim
    if not eager and head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the LSH kernel supports head dims {SUPPORTED_HEAD_DIMS}; this model's is {head_dim} "
                         f"(set workload.model d_model / n_heads)")
    window = window_for(model.cfg.context, n_buckets) if window is None else window
    for i, block in enumerate(model.blocks):
        rotations = draw_rotations(n_hashes, head_dim, n_buckets, torch.Generator().manual_seed(_ROTATION_SEED + i))
        block.attn.attn_fn = LSHAttention(rotations, n_buckets, window, eager)
