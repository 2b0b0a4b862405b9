"""How many sequences of a mixed-length workload fit in a KV-cache memory budget, contiguous vs paged.

This is the claim "max concurrency 3 -> 27" made countable: sequences arrive in order and are admitted
until the next one does not fit. A contiguous cache reserves ``max_len`` token slots per sequence (a
server cannot know in advance how long a sequence will grow); a paged cache takes blocks from the
real ``BlockAllocator`` for the tokens a sequence holds. Fragmentation is the reserved-but-unused share
of the reserved bytes. The figures depend on the workload's lengths, so the workload is an input; the
plugin reports them per case (``PagedAttention.figures``).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from microscope_kernels.paged_attention.allocator import BlockAllocator, PoolExhausted

#: Length distributions of ``mixed_workload``: uniform on [1, max_len], or log-uniform (most
#: sequences short, a few long, as in chat traffic).
DISTRIBUTIONS = ("uniform", "loguniform")


@dataclass(frozen=True)
class CacheLayout:
    """What one cached token costs: K and V, every layer and head, in ``dtype``; paged in blocks."""

    heads: int
    head_dim: int
    dtype: torch.dtype
    block_size: int
    layers: int = 1

    def __post_init__(self) -> None:
        if min(self.heads, self.head_dim, self.block_size, self.layers) < 1:
            raise ValueError(f"heads, head_dim, block_size and layers must be >= 1, got {self}")

    @property
    def token_bytes(self) -> int:
        return 2 * self.layers * self.heads * self.head_dim * self.dtype.itemsize

    @property
    def block_bytes(self) -> int:
        return self.block_size * self.token_bytes


@dataclass(frozen=True)
class Admission:
    """Sequences admitted by one layout, and the bytes it reserved for them and the bytes they fill."""

    admitted: int
    reserved_bytes: int
    used_bytes: int

    @property
    def fragmentation(self) -> float:
        """Reserved but unused bytes / reserved bytes (0 when nothing is reserved)."""
        return (self.reserved_bytes - self.used_bytes) / self.reserved_bytes if self.reserved_bytes else 0.0


@dataclass(frozen=True)
class Capacity:
    contiguous: Admission
    paged: Admission

    @property
    def concurrency_ratio(self) -> float:
        """Paged over contiguous admitted sequences (inf when the contiguous cache admits none)."""
        return self.paged.admitted / self.contiguous.admitted if self.contiguous.admitted else math.inf

    @property
    def fragmentation_change(self) -> float:
        """Relative change of fragmentation, paged vs contiguous (-0.82 reads "-82%")."""
        base = self.contiguous.fragmentation
        return self.paged.fragmentation / base - 1.0 if base else 0.0


def mixed_workload(requests: int, max_len: int, seed: int, dist: str = "uniform") -> list[int]:
    """``requests`` seeded sequence lengths in [1, max_len] from ``dist`` (one of ``DISTRIBUTIONS``)."""
    if dist not in DISTRIBUTIONS:
        raise ValueError(f"dist must be one of {DISTRIBUTIONS}, got {dist!r}")
    if requests < 0 or max_len < 1:
        raise ValueError(f"need requests >= 0 and max_len >= 1, got {requests} and {max_len}")
    u = torch.rand(requests, generator=torch.Generator().manual_seed(seed), dtype=torch.float64)
    if dist == "uniform":
        lengths = torch.floor(u * max_len) + 1
    else:
        lengths = torch.floor(torch.exp(u * math.log(max_len + 1)))
    return [int(n) for n in lengths.clamp(1, max_len)]


def capacity(budget_bytes: int, layout: CacheLayout, lengths: Sequence[int], max_len: int | None = None) -> Capacity:
    """Admit ``lengths`` in arrival order into ``budget_bytes`` of cache, contiguous and paged, each
    until the next sequence does not fit. ``max_len`` (each contiguous reservation) defaults to the
    longest length of the workload."""
    lengths = [int(n) for n in lengths]
    if any(n < 1 for n in lengths) or budget_bytes < 0:
        raise ValueError("lengths must be >= 1 and the budget >= 0 bytes")
    max_len = max(lengths, default=1) if max_len is None else max_len
    if lengths and max(lengths) > max_len:
        raise ValueError(f"a sequence of {max(lengths)} tokens exceeds max_len={max_len}")
    per_sequence = max_len * layout.token_bytes
    fit = min(len(lengths), budget_bytes // per_sequence)
    contiguous = Admission(fit, fit * per_sequence, sum(lengths[:fit]) * layout.token_bytes)
    allocator = BlockAllocator(budget_bytes // layout.block_bytes, layout.block_size)
    admitted = 0
    for seq, n in enumerate(lengths):
        try:
            allocator.append(seq, n)
        except PoolExhausted:
            break
        admitted += 1
    reserved = (allocator.num_blocks - allocator.free_blocks) * layout.block_bytes
    paged = Admission(admitted, reserved, sum(lengths[:admitted]) * layout.token_bytes)
    return Capacity(contiguous, paged)
