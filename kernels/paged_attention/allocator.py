"""A paged KV cache's block allocator: a free list over a fixed pool of physical blocks.

Why blocks: a contiguous cache must reserve a sequence's maximum length up front, so every sequence
that finishes short leaves most of its reservation unused. A paged cache hands out fixed-size blocks
of ``block_size`` tokens as a sequence grows, so at most one partly filled block per sequence is
wasted, and a finished sequence's blocks go straight back to the pool for the next one.

The allocator owns only bookkeeping (which physical block belongs to which sequence, and how many
tokens each sequence holds); the K/V tensors live in a pool the caller indexes with ``block_table``.
"""

from __future__ import annotations

from collections.abc import Hashable, Iterable, Sequence

import torch

#: Block-table entry past a sequence's last block. Kernels never read it (they stop at the length).
SENTINEL = -1


class PoolExhausted(RuntimeError):
    """The pool has fewer free blocks than a request needs; nothing was allocated."""


def blocks_for(tokens: int, block_size: int) -> int:
    """Blocks that hold ``tokens`` tokens: ceil(tokens / block_size)."""
    return -(-tokens // block_size)


class BlockAllocator:
    """Hands out physical block ids from a free list, per sequence, and takes them back.

    A request that needs more blocks than are free raises ``PoolExhausted`` before it changes any
    state, so a serving loop can refuse (or preempt) a sequence without repairing half an allocation.
    Freed blocks are reused last-in first-out, as a real pool's recently touched blocks would be.
    """

    def __init__(self, num_blocks: int, block_size: int, order: Iterable[int] | None = None) -> None:
        """``order``: the free list's initial order (a permutation of ``range(num_blocks)``), to start
        from a scattered pool as after hours of churn; default ascending."""
        if num_blocks < 0 or block_size < 1:
            raise ValueError(f"need num_blocks >= 0 and block_size >= 1, got {num_blocks} and {block_size}")
        initial = list(range(num_blocks)) if order is None else [int(b) for b in order]
        if sorted(initial) != list(range(num_blocks)):
            raise ValueError(f"order must be a permutation of range({num_blocks})")
        self.num_blocks = num_blocks
        self.block_size = block_size
        self._free = initial[::-1]  # a stack: pop() hands out initial[0] first
        self._blocks: dict[Hashable, list[int]] = {}
        self._lengths: dict[Hashable, int] = {}

    @property
    def free_blocks(self) -> int:
        return len(self._free)

    @property
    def sequences(self) -> list[Hashable]:
        return list(self._blocks)

    def blocks(self, seq: Hashable) -> list[int]:
        """The physical blocks of ``seq`` in logical order (a copy)."""
        return list(self._blocks[self._known(seq)])

    def length(self, seq: Hashable) -> int:
        return self._lengths[self._known(seq)]

    def append(self, seq: Hashable, tokens: int = 1) -> list[int]:
        """Add ``tokens`` tokens to ``seq`` (a new sequence starts empty); returns the blocks newly
        allocated for them (none when they fit in the last block's free slots)."""
        if tokens < 0:
            raise ValueError(f"cannot append {tokens} tokens")
        have = self._blocks.get(seq, [])
        length = self._lengths.get(seq, 0) + tokens
        need = blocks_for(length, self.block_size) - len(have)
        if need > len(self._free):
            raise PoolExhausted(f"block pool exhausted: sequence {seq!r} needs {need} more block(s) of "
                                f"{self.block_size} tokens to reach {length} tokens, {len(self._free)} of "
                                f"{self.num_blocks} are free; free a finished sequence or grow the pool")
        new = [self._free.pop() for _ in range(need)]
        self._blocks[seq] = have + new
        self._lengths[seq] = length
        return new

    def free(self, seq: Hashable) -> list[int]:
        """Return every block of the finished sequence ``seq`` to the pool; returns them."""
        blocks = self._blocks.pop(self._known(seq))
        del self._lengths[seq]
        self._free.extend(reversed(blocks))
        return blocks

    def block_table(self, seqs: Sequence[Hashable], max_blocks: int | None = None,
                    device: str | torch.device = "cpu") -> torch.Tensor:
        """int32 (len(seqs), max_blocks): row i lists seq i's physical blocks, then ``SENTINEL``.
        ``max_blocks`` defaults to the longest row; a shorter width is an error, not a truncation."""
        rows = [self._blocks[self._known(s)] for s in seqs]
        width = max((len(r) for r in rows), default=0) if max_blocks is None else max_blocks
        longest = max((len(r) for r in rows), default=0)
        if longest > width:
            raise ValueError(f"a sequence holds {longest} blocks, more than max_blocks={width}")
        table = torch.full((len(rows), width), SENTINEL, dtype=torch.int32)
        for i, row in enumerate(rows):
            table[i, :len(row)] = torch.tensor(row, dtype=torch.int32)
        return table.to(device)

    def _known(self, seq: Hashable) -> Hashable:
        if seq not in self._blocks:
            raise KeyError(f"no sequence {seq!r} in the pool (it holds {len(self._blocks)} sequence(s))")
        return seq
