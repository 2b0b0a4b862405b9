"""The launch plan of the LSH kernels: index tensors and tile descriptors built from ``visibility.Intervals``.

In sorted query order every query's key interval has a non-decreasing start and end (both rules), so a tile
of consecutive sorted queries needs one contiguous range of sorted keys, and a tile of sorted keys is seen by
one contiguous range of sorted queries. A descriptor is four int32 numbers:

* query tiles (forward and dQ): ``(qa, qb, ka, kb)``: sorted queries ``[qa, qb)`` walk sorted keys from ``ka``
  to ``kb`` in steps of ``BLOCK_N``;
* key tiles (dK/dV): ``(ka, kb, qa, qb)``: sorted keys ``[ka, kb)`` walk sorted queries ``[qa, qb)``.

An empty descriptor (``qa == qb``) makes its program store nothing.

For the ``window`` rule the query tiles are cut **per bucket** and the key walk starts on a multiple of
``BLOCK_N`` counted from the bucket's first key. Then a query's row in its tile and its keys' lanes and
tiles depend only on ranks inside its bucket among earlier positions, so the floating-point work done for
a query (not only its set of keys) is the same whatever the later tokens are: the embedded model's
future-leak probe asks for bitwise equality. Tiles of the ``chunk`` rule are plain ``BLOCK_M`` slices of
the sorted order (that rule is not causal-safe anyway). Everything is a few tensor ops on the inputs' device,
with no host synchronisation: the number of window-rule tiles is bounded by ``cdiv(Sq, BLOCK_M) +
min(n_buckets, Sq)`` and the unused ones are empty.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from .sorting import bucket_counts
from .visibility import Intervals, LSHSpec

__all__ = ["Plan", "build_plan"]


@dataclass(frozen=True)
class Plan:
    """What the kernels read besides q, k, v: int32, rounds x (batch * heads) leading, contiguous."""

    qperm: torch.Tensor  # (R, BH, Sq) sorted query index -> position
    kperm: torch.Tensor  # (R, BH, Sk) sorted key index -> position
    krank: torch.Tensor  # (R, BH, Sk) key position -> sorted index
    start: torch.Tensor  # (R, BH, Sq) by query position: first sorted key seen
    end: torch.Tensor  # (R, BH, Sq) by query position: one past the last sorted key seen
    q_tiles: torch.Tensor  # (R, BH, NQ, 4) qa, qb, ka, kb
    k_tiles: torch.Tensor  # (R, BH, NK, 4) ka, kb, qa, qb

    @property
    def n_hashes(self) -> int:
        return self.qperm.shape[0]


def _flat(x: torch.Tensor) -> torch.Tensor:
    """(R, B, H, ...) -> (R, B*H, ...) int32, contiguous."""
    return x.reshape(x.shape[0], -1, *x.shape[3:]).to(torch.int32).contiguous()


def _at(x: torch.Tensor, index: torch.Tensor) -> torch.Tensor:
    return x.gather(-1, index.clamp(0, x.shape[-1] - 1))


def _chunk_query_tiles(start_s: torch.Tensor, end_s: torch.Tensor, block_m: int) -> torch.Tensor:
    sq = start_s.shape[-1]
    qa = torch.arange(0, sq, block_m, device=start_s.device).expand(*start_s.shape[:-1], -1)
    qb = (qa + block_m).clamp_max(sq)
    return torch.stack((qa, qb, _at(start_s, qa), _at(end_s, qb - 1)), dim=-1)


def _window_query_tiles(iv: Intervals, spec: LSHSpec, start_s: torch.Tensor, end_s: torch.Tensor,
                        block_m: int, block_n: int) -> torch.Tensor:
    sq = start_s.shape[-1]
    nb = spec.n_buckets
    counts = bucket_counts(iv.q_buckets, nb)  # (R, B, H, nb)
    q_first = counts.cumsum(-1) - counts
    k_counts = bucket_counts(iv.k_buckets, nb)
    k_first = k_counts.cumsum(-1) - k_counts
    tiles = (counts + block_m - 1) // block_m
    cum = tiles.cumsum(-1)
    n_tiles = -(-sq // block_m) + min(nb, sq)
    d = torch.arange(n_tiles, device=start_s.device).expand(*start_s.shape[:-1], -1).contiguous()
    b = torch.searchsorted(cum, d, right=True).clamp_max(nb - 1)
    t = d - (cum.gather(-1, b) - tiles.gather(-1, b))
    qa = q_first.gather(-1, b) + t * block_m
    qb = torch.minimum(qa + block_m, q_first.gather(-1, b) + counts.gather(-1, b))
    valid = d < cum[..., -1:]
    first_key = k_first.gather(-1, b)
    ka = first_key + (_at(start_s, qa) - first_key) // block_n * block_n
    kb = _at(end_s, qb - 1)
    zero = torch.zeros_like(qa)
    return torch.stack([torch.where(valid, x, zero) for x in (qa, qb, ka, kb)], dim=-1)


def _key_tiles(start_s: torch.Tensor, end_s: torch.Tensor, sk: int, block_n: int) -> torch.Tensor:
    ka = torch.arange(0, sk, block_n, device=start_s.device).expand(*start_s.shape[:-1], -1).contiguous()
    kb = (ka + block_n).clamp_max(sk)
    qa = torch.searchsorted(end_s, ka, right=True)  # first sorted query whose interval ends after ka
    qb = torch.searchsorted(start_s, (kb - 1).contiguous(), right=True)  # first one starting after kb - 1
    return torch.stack((ka, kb, qa, torch.maximum(qa, qb)), dim=-1)


def build_plan(spec: LSHSpec, iv: Intervals, block_m: int, block_n: int) -> Plan:
    """The kernels' index tensors and tile descriptors for ``BLOCK_M`` x ``BLOCK_N`` tiles."""
    start_s = iv.start.gather(-1, iv.qperm).contiguous()  # sorted query order: non-decreasing
    end_s = iv.end.gather(-1, iv.qperm).contiguous()
    if spec.rule == "window":
        q_tiles = _window_query_tiles(iv, spec, start_s, end_s, block_m, block_n)
    else:
        q_tiles = _chunk_query_tiles(start_s, end_s, block_m)
    k_tiles = _key_tiles(start_s, end_s, iv.krank.shape[-1], block_n)
    return Plan(_flat(iv.qperm), _flat(iv.kperm), _flat(iv.krank), _flat(iv.start), _flat(iv.end),
                _flat(q_tiles), _flat(k_tiles))
