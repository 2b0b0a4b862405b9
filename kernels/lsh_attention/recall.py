"""Recall of LSH attention: how much of full attention's weight the buckets let a query see.

For each query, full softmax attention (float64) ranks every key it may see (causal: earlier ones); LSH
attention sees only the keys of its intervals. Two figures per bucket count:

* **top-k recall**: the share of the query's ``top_k`` heaviest keys (under full attention) that LSH
  attention sees, averaged over queries (a query with fewer than ``top_k`` keys counts the keys it has);
* **mass kept**: the full-attention weight on the keys LSH attention sees, averaged over queries (1.0 when it
  sees every key that matters, whatever their number).

``microscope run`` judges outputs against a float64 reference; it has no place for a plugin's own figure,
so recall is measured here, as a table over bucket counts:

    python -m microscope_kernels.lsh_attention.recall --seq 1024 --chunk 64 --buckets 2 4 8 16 32 64

Random Gaussian q and k give a nearly flat softmax (no key matters much); ``--data clustered`` draws tokens
around a few centroids, so each query has a set of keys it attends to, as trained attention does.
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch

from .hashing import draw_rotations
from .visibility import LSHSpec, key_intervals, scored_pairs, visible_mask

__all__ = ["DATA", "Recall", "main", "recall", "sample_qk", "sweep"]

#: Input kinds of ``sample_qk``.
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
           causal: bool = False, rule: str = "chunk", top_k: int = 8, sm_scale: float | None = None) -> Recall:
    """Recall figures of LSH attention on ``q`` (B, H, Sq, D), ``k`` (B, H, Sk, D); float64 throughout."""
    if isinstance(top_k, bool) or not isinstance(top_k, int) or top_k < 1:
        raise ValueError(f"top_k must be a positive integer, got {top_k!r}")
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=bool(causal), rule=rule)
    q, k = q.double(), k.double()
    sq, sk = q.shape[-2], k.shape[-2]
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    allowed = torch.ones((sq, sk), dtype=torch.bool, device=q.device)
    if causal:
        allowed = allowed.tril(diagonal=sk - sq)
    probs = torch.softmax((q @ k.transpose(-2, -1) * scale).masked_fill(~allowed, float("-inf")), dim=-1)
    iv = key_intervals(spec, q, k, rotations)
    seen = visible_mask(spec, iv)
    kk = min(top_k, sk)
    heaviest = probs.topk(kk, dim=-1).indices  # masked keys have weight 0: ranked last
    owed = allowed.sum(-1).clamp_max(kk)  # keys a query can have in its top-k
    ranked = torch.arange(kk, device=q.device) < owed.unsqueeze(-1)
    hits = (seen.gather(-1, heaviest) & ranked).sum(-1).double() / owed.double()
    return Recall(n_buckets=n_buckets, top_k_recall=float(hits.mean()),
                  mass_kept=float((probs * seen).sum(-1).mean()),
                  keys_seen=float(seen.sum(-1).double().mean()),
                  keys_scored=scored_pairs(iv) / (q.shape[0] * q.shape[1] * sq))


def sample_qk(data: str, batch: int, heads: int, seq: int, head_dim: int,
              gen: torch.Generator) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded q, k (float64): ``random`` iid normal, or ``clustered``: each token belongs to one of
    ``max(2, seq // 32)`` random centroids (norm about sqrt(head_dim)) and its q and k are the centroid plus
    half-size independent noise, so a query's heaviest keys are its cluster's."""
    if data not in DATA:
        raise ValueError(f"data must be one of {DATA}, got {data!r}")
    shape = (batch, heads, seq, head_dim)
    if data == "random":
        return (torch.randn(shape, generator=gen, dtype=torch.float64),
                torch.randn(shape, generator=gen, dtype=torch.float64))
    centroids = torch.randn((batch, heads, max(2, seq // 32), head_dim), generator=gen, dtype=torch.float64)
    member = torch.randint(0, centroids.shape[2], (batch, heads, seq), generator=gen)
    base = centroids.gather(2, member.unsqueeze(-1).expand(*member.shape, head_dim))
    return (base + 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64),
            base + 0.5 * torch.randn(shape, generator=gen, dtype=torch.float64))


def sweep(data: str, seq: int, head_dim: int, chunk: int, n_hashes: int, buckets: Sequence[int],
          causal: bool = False, rule: str = "chunk", top_k: int = 8, batch: int = 1, heads: int = 4,
          seed: int = 0) -> list[Recall]:
    """``recall`` at each bucket count on one seeded draw of q and k (each count its own rotations)."""
    gen = torch.Generator().manual_seed(seed)
    q, k = sample_qk(data, batch, heads, seq, head_dim, gen)
    return [recall(q, k, draw_rotations(n_hashes, head_dim, nb, gen), nb, chunk, causal, rule, top_k)
            for nb in buckets]


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--seq", type=int, default=1024)
    parser.add_argument("--head-dim", type=int, default=64)
    parser.add_argument("--heads", type=int, default=4, help="independent heads (more queries per figure)")
    parser.add_argument("--chunk", type=int, default=64, help="chunk length (chunk rule) or window (window rule)")
    parser.add_argument("--hashes", type=int, default=1, help="hash rounds")
    parser.add_argument("--buckets", type=int, nargs="+", default=[2, 4, 8, 16, 32, 64])
    parser.add_argument("--rule", choices=("chunk", "window"), default="chunk")
    parser.add_argument("--causal", action="store_true", help="causal attention (the window rule always is)")
    parser.add_argument("--data", choices=DATA, default="clustered")
    parser.add_argument("--top-k", type=int, default=8)
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    if min(args.seq, args.head_dim, args.heads, args.chunk, args.hashes, args.top_k) < 1:
        parser.error("seq, head dim, heads, chunk, hashes and top-k must be positive")
    causal = args.causal or args.rule == "window"
    try:
        rows = sweep(args.data, args.seq, args.head_dim, args.chunk, args.hashes, args.buckets, causal, args.rule,
                     args.top_k, heads=args.heads, seed=args.seed)
    except ValueError as exc:
        parser.error(str(exc))
    full = (args.seq + 1) / 2 if causal else args.seq
    print(f"{args.data} q/k, S {args.seq}, D {args.head_dim}, {args.heads} heads, rule {args.rule} "
          f"(chunk {args.chunk}), {args.hashes} hash round(s), {'causal' if causal else 'non-causal'}, seed "
          f"{args.seed}; full attention sees {full:g} keys per query")
    print(f"{'buckets':>8} {f'top-{args.top_k} recall':>15} {'mass kept':>10} {'keys seen':>10} {'keys scored':>12}")
    for r in rows:
        print(f"{r.n_buckets:>8} {r.top_k_recall:>15.3f} {r.mass_kept:>10.3f} {r.keys_seen:>10.1f} "
              f"{r.keys_scored:>12.1f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
