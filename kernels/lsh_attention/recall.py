"""Recall of LSH attention: how much of full attention's weight the buckets let a query see.

For each query, full softmax attention (float64) ranks every key it may see (causal: earlier ones); LSH
attention sees only the keys of its intervals. The figures (``Recall``):

* **top-k recall**: the share of the query's ``top_k`` heaviest keys (under full attention) that LSH
  attention sees, averaged over queries (a query with fewer than ``top_k`` keys counts the keys it has);
* **mass kept**: the full-attention weight on the keys LSH attention sees, averaged over queries (1.0 when it
  sees every key that matters, whatever their number).

The plugin records them per case as figures of a run (``LSHAttentionAblation.figures``); the ``recall``
profile of ``ablations/lsh_attention.yaml`` sweeps the bucket count. Random Gaussian q and k give a nearly
flat softmax (no key matters much); ``clustered_qk`` (the case parameter ``data: clustered``) draws tokens
around a few centroids, so each query has a set of keys it attends to, as trained attention does.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from microscope.api import randn

from .visibility import LSHSpec, key_intervals, scored_pairs, visible_mask

__all__ = ["DATA", "Recall", "clustered_qk", "recall"]

#: Kinds of q and k a case may draw (``data``): iid normal, or ``clustered_qk``.
DATA = ("random", "clustered")


@dataclass(frozen=True)
class Recall:
    """The recall figures of one configuration (means over every batch row, head and query)."""

    n_buckets: int
    top_k_recall: float
    mass_kept: float
    keys_seen: float  # keys in a query's union of intervals (causal: earlier ones only)
    keys_scored: float  # pairs the kernel scores per query: every round's interval, duplicates included


def recall(q: torch.Tensor, k: torch.Tensor, rotations: torch.Tensor, n_buckets: int, chunk: int,
           causal: bool = False, rule: str = "chunk", top_k: int = 8, sm_scale: float | None = None,
           rows_per_step: int | None = None) -> Recall:
    """Recall figures of LSH attention on ``q`` (B, H, Sq, D), ``k`` (B, H, Sk, D); float64 throughout.

    ``rows_per_step`` evaluates that many query rows at a time (the same figures, for a case whose float64
    (Sq, Sk) probabilities would not fit at once).
    """
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=bool(causal), rule=rule)
    q, k = q.double(), k.double()
    sq, sk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    iv = key_intervals(spec, q, k, rotations)
    kk = min(top_k, sk)
    step = sq if rows_per_step is None else max(1, rows_per_step)
    every = torch.ones((sq, sk), dtype=torch.bool, device=q.device)
    every = every.tril(diagonal=sk - sq) if causal else every
    hits = mass = seen_keys = 0.0
    for r0 in range(0, sq, step):
        rows = slice(r0, min(sq, r0 + step))
        allowed = every[rows]
        scores = q[..., rows, :] @ k.transpose(-2, -1) * scale
        probs = torch.softmax(scores.masked_fill(~allowed, float("-inf")), dim=-1)
        seen = visible_mask(spec, iv, rows)
        heaviest = probs.topk(kk, dim=-1).indices  # masked keys have weight 0: ranked last
        owed = allowed.sum(-1).clamp_max(kk)  # keys a query can have in its top-k
        ranked = torch.arange(kk, device=q.device) < owed.unsqueeze(-1)
        hits += float(((seen.gather(-1, heaviest) & ranked).sum(-1).double() / owed.double()).sum())
        mass += float((probs * seen).sum())
        seen_keys += float(seen.sum())
    queries = q.shape[0] * q.shape[1] * sq
    return Recall(n_buckets=n_buckets, top_k_recall=hits / queries, mass_kept=mass / queries,
                  keys_seen=seen_keys / queries, keys_scored=scored_pairs(iv) / queries)


def clustered_qk(shape: tuple[int, int, int, int], dtype: torch.dtype, gen: torch.Generator,
                 device: str) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded q, k of ``shape`` (B, H, S, D): each token belongs to one of ``max(2, S // 32)`` random
    centroids (norm about sqrt(D)) and its q and k are the centroid plus half-size independent noise, so a
    query's heaviest keys are its cluster's."""
    b, h, s, d = shape
    centroids = randn((b, h, max(2, s // 32), d), torch.float32, gen, device)
    member = torch.randint(0, centroids.shape[2], (b, h, s), generator=gen).to(device)
    base = centroids.gather(2, member.unsqueeze(-1).expand(b, h, s, d))
    return tuple((base + randn(shape, torch.float32, gen, device, scale=0.5)).to(dtype) for _ in range(2))
