"""How many sequences of a mixed-length workload fit in a KV-cache memory budget, contiguous vs paged.

This is the claim "max concurrency 3 -> 27" made countable: sequences arrive in order and are admitted
until the next one does not fit. A contiguous cache reserves ``max_len`` token slots per sequence (a
server cannot know in advance how long a sequence will grow); a paged cache takes blocks from the
real ``BlockAllocator`` for the tokens a sequence holds. Fragmentation is the reserved-but-unused share
of the reserved bytes. The figures depend on the workload's lengths, so the workload is an input:

    python -m microscope_kernels.paged_attention.capacity --budget-gib 16 --max-len 8192 --dist uniform
"""

from __future__ import annotations

import argparse
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
from microscope_kernels.paged_attention.allocator import BlockAllocator, PoolExhausted

from microscope.api import DTYPES

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


def report(budget_bytes: int, layout: CacheLayout, lengths: Sequence[int], max_len: int,
           block_sizes: Sequence[int]) -> list[str]:
    """The capacity table as text lines: the contiguous layout, then paged at each block size."""
    lines = []
    for block in block_sizes:
        paged_layout = CacheLayout(layout.heads, layout.head_dim, layout.dtype, block, layout.layers)
        result = capacity(budget_bytes, paged_layout, lengths, max_len)
        if not lines:
            c = result.contiguous
            lines.append(f"contiguous ({max_len} slots each): {c.admitted} admitted, "
                         f"fragmentation {c.fragmentation:.1%}")
        p = result.paged
        lines.append(f"paged, block {block}: {p.admitted} admitted (x{result.concurrency_ratio:.2f}), "
                     f"fragmentation {p.fragmentation:.1%} ({result.fragmentation_change:+.1%})")
    return lines


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--budget-gib", type=float, default=16.0, help="KV-cache memory budget (GiB)")
    parser.add_argument("--layers", type=int, default=32)
    parser.add_argument("--heads", type=int, default=32)
    parser.add_argument("--head-dim", type=int, default=128)
    parser.add_argument("--dtype", choices=[n for n in DTYPES if n != "fp64"], default="bf16")
    parser.add_argument("--blocks", type=int, nargs="+", default=[16, 32, 64, 128], help="paged block sizes")
    parser.add_argument("--max-len", type=int, default=8192, help="longest sequence; each contiguous reservation")
    parser.add_argument("--requests", type=int, default=1024, help="sequences in the workload")
    parser.add_argument("--dist", choices=DISTRIBUTIONS, default="uniform")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)
    numbers = (args.layers, args.heads, args.head_dim, args.max_len, args.requests, *args.blocks)
    if args.budget_gib <= 0 or min(numbers) < 1:
        parser.error("the budget, layers, heads, head dim, max length, requests and block sizes must be positive")
    layout = CacheLayout(args.heads, args.head_dim, DTYPES[args.dtype], args.blocks[0], args.layers)
    lengths = mixed_workload(args.requests, args.max_len, args.seed, args.dist)
    budget = int(args.budget_gib * 2**30)
    print(f"budget {args.budget_gib:g} GiB; {args.layers} layers x {args.heads} heads x {args.head_dim} dims "
          f"{args.dtype} ({layout.token_bytes / 2**10:g} KiB per token); {args.requests} requests, lengths "
          f"{args.dist} on [1, {args.max_len}] (seed {args.seed}, mean {sum(lengths) / max(len(lengths), 1):.0f})")
    for line in report(budget, layout, lengths, args.max_len, args.blocks):
        print(line)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
