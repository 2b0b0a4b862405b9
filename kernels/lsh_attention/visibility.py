"""Which keys each query sees under LSH attention: the two rules, defined once for the kernel, the reference
and the recall measure.

Queries and keys are hashed **separately** with the same rotations (``hashing.py``) and each sorted by
(bucket, position) (``sorting.py``). Reformer shares one projection for Q and K so that one sort orders
both; the embedded model (and most models) project them separately, and sharing would leave the key
projection unused. Passing ``k = q`` gives Reformer's shared sort (without its normalized keys and
self-mask). In each hash round a query sees a **contiguous interval of the sorted keys**:

* ``chunk`` (Reformer): sorted queries and sorted keys are cut into chunks of ``chunk``; a query in chunk
  ``c`` sees key chunks ``c - 1`` and ``c`` (look one back; chunk 0 has no previous chunk, no wrap-around).
  Needs ``Sq == Sk``. With ``causal`` a key is also masked by original position (``j <= i``). This rule is
  **not causal-safe**: chunk boundaries in sorted order depend on how many *later* tokens fall in lower
  buckets, so which past keys a query sees changes when future tokens change.
* ``window`` (causal-safe): a query at position ``p`` in bucket ``b`` sees the last ``chunk`` keys of bucket
  ``b`` at positions ``<= p``. Every term depends only on positions ``<= p``, so no future token can change
  a query's keys: the rule the model-level arm uses. Causal only; queries are aligned to the last keys
  (``p = i + Sk - Sq``), so a decode step is the last row of a prefill.

Over ``n_hashes`` rounds a query sees the **union** of its intervals, and LSH attention is one softmax over
that union (duplicates counted once; the kernel divides a pair's weight by the number of rounds that see
it). A query that sees no key outputs zero.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .hashing import check_n_buckets, hash_vectors
from .sorting import sort_by_bucket

__all__ = ["RULES", "Intervals", "LSHSpec", "key_intervals", "scored_pairs", "visible_mask"]

RULES = ("chunk", "window")


@dataclass(frozen=True)
class LSHSpec:
    """The visibility rule's parameters, checked on construction (a clear message for a bad config value)."""

    n_buckets: int
    chunk: int
    causal: bool
    rule: str = "chunk"

    def __post_init__(self) -> None:
        check_n_buckets(self.n_buckets)
        if isinstance(self.chunk, bool) or not isinstance(self.chunk, int) or self.chunk < 1:
            raise ValueError(f"chunk must be a positive integer (keys per chunk or window), got {self.chunk!r}")
        if self.rule not in RULES:
            raise ValueError(f"rule must be one of {RULES}, got {self.rule!r}")
        if self.rule == "window" and not self.causal:
            raise ValueError("the window rule is causal (the last `chunk` keys of the query's bucket at or before "
                             "it); use rule 'chunk' for non-causal attention")


@dataclass(frozen=True)
class Intervals:
    """Per round, each query's interval of sorted keys, and the sorts that define them.

    ``start``/``end`` are (R, B, H, Sq) int64 indexed by query position, in sorted-key coordinates;
    ``qperm``/``kperm`` map sorted index -> position, ``krank`` position -> sorted index (R, B, H, S);
    ``q_buckets``/``k_buckets`` are the hashes (R, B, H, S).
    """

    start: torch.Tensor
    end: torch.Tensor
    qperm: torch.Tensor
    kperm: torch.Tensor
    krank: torch.Tensor
    q_buckets: torch.Tensor
    k_buckets: torch.Tensor


def key_intervals(spec: LSHSpec, q: torch.Tensor, k: torch.Tensor, rotations: torch.Tensor) -> Intervals:
    """Hash ``q`` (B, H, Sq, D) and ``k`` (B, H, Sk, D), sort both, and give every query its key interval."""
    sq, sk = q.shape[-2], k.shape[-2]
    if spec.rule == "chunk" and sq != sk:
        raise ValueError(f"the chunk rule pairs query chunk c with key chunks c-1 and c: it needs Sq == Sk, "
                         f"got Sq={sq}, Sk={sk}")
    qb = hash_vectors(q, rotations, spec.n_buckets)
    kb = hash_vectors(k, rotations, spec.n_buckets)
    qperm, qrank = sort_by_bucket(qb)
    kperm, krank = sort_by_bucket(kb)
    m = spec.chunk
    if spec.rule == "chunk":
        c = qrank // m
        start = ((c - 1) * m).clamp_min(0)
        end = ((c + 1) * m).clamp_max(sk)
    else:
        pos_k = torch.arange(sk, device=k.device)
        key_codes = (kb * sk + pos_k).gather(-1, kperm).contiguous()  # sorted: (bucket, position)
        pos_q = torch.arange(sk - sq, sk, device=q.device)
        end = torch.searchsorted(key_codes, (qb * sk + pos_q).contiguous(), right=True)
        first = torch.searchsorted(key_codes, (qb * sk).contiguous(), right=False)
        start = torch.maximum(first, end - m)
    return Intervals(start, end, qperm, kperm, krank, qb, kb)


def visible_mask(spec: LSHSpec, iv: Intervals, rows: slice | None = None) -> torch.Tensor:
    """(B, H, Sq, Sk) bool: query sees key in some round (and, causal, key position <= query position).

    ``rows`` restricts to a slice of query positions (a ground truth evaluated a slice at a time).
    """
    rows = rows if rows is not None else slice(None)
    start, end = iv.start[..., rows], iv.end[..., rows]
    sq_all, sk = iv.start.shape[-1], iv.krank.shape[-1]
    seen = torch.zeros((*start.shape[1:], sk), dtype=torch.bool, device=start.device)
    for r in range(start.shape[0]):
        kr = iv.krank[r].unsqueeze(-2)
        seen |= (kr >= start[r].unsqueeze(-1)) & (kr < end[r].unsqueeze(-1))
    if spec.causal:
        pos_q = torch.arange(sk - sq_all, sk, device=start.device)[rows]
        seen &= torch.arange(sk, device=start.device) <= pos_q.unsqueeze(-1)
    return seen


def scored_pairs(iv: Intervals) -> int:
    """(query, key) pairs the kernel scores: every round's interval lengths summed (duplicates across rounds
    and causally masked pairs included; that is the work it does)."""
    return int((iv.end - iv.start).clamp_min(0).sum())
