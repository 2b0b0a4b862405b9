"""The two cache layouts the room compares, built from the same tokens.

Contiguous: K and V as (B, H, T, D), each sequence reserving ``T`` (the longest length served)
token slots whatever its own length. Paged: a pool of physical blocks (num_blocks, H, block_size, D)
per K and V, where each head's block of ``block_size`` tokens is one contiguous run of memory, and an
int32 block table (B, max_blocks) mapping each sequence's logical block j to its physical block.

Slots of a paged block past its sequence's length are NaN: the kernel must never read them (a read
would poison the output), while the contiguous layout's padding stays finite for the eager reference,
which masks the scores but still multiplies the padding's V by a zero weight.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from microscope_kernels.paged_attention.allocator import BlockAllocator, blocks_for


def _lengths(seq_lens: Sequence[int] | torch.Tensor) -> list[int]:
    """Lengths as host ints (one device sync for a GPU tensor: cache building is not a decode step)."""
    values = seq_lens.tolist() if isinstance(seq_lens, torch.Tensor) else [int(n) for n in seq_lens]
    if any(n < 1 for n in values):
        raise ValueError(f"every sequence needs at least one token, got lengths {values}")
    return values


def paged_from_contiguous(k: torch.Tensor, v: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor,
                          block_size: int, order: torch.Tensor | None = None
                          ) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Copy the first ``seq_lens[b]`` tokens of each sequence of a (B, H, T, D) cache into a pool of
    exactly the blocks they need; returns (k_pool, v_pool, block_table).

    ``order`` (a permutation of the pool's block ids) is the allocator's free-list order: a shuffled
    one scatters every sequence over the pool, as a long-running server's churn does.
    """
    lens = _lengths(seq_lens)
    b, h, t, d = k.shape
    if len(lens) != b or max(lens) > t:
        raise ValueError(f"seq_lens {lens} do not fit a cache of batch {b} and {t} tokens")
    counts = [blocks_for(n, block_size) for n in lens]
    allocator = BlockAllocator(sum(counts), block_size, None if order is None else order.tolist())
    for seq, n in enumerate(lens):
        allocator.append(seq, n)
    width = blocks_for(t, block_size)
    table = allocator.block_table(range(b), width)
    positions = torch.arange(width * block_size, device=k.device)
    valid = positions[None, :] < torch.tensor(lens, device=k.device)[:, None]  # (B, width * block_size)
    used = torch.arange(width)[None, :] < torch.tensor(counts)[:, None]  # (B, width), on the host
    physical = table[used].long().to(k.device)
    pools = []
    for x in (k, v):
        padded = x.new_full((b, h, width * block_size, d), float("nan"))
        padded[:, :, :t] = x
        padded.masked_fill_(~valid[:, None, :, None], float("nan"))
        blocks = padded.view(b, h, width, block_size, d).transpose(1, 2)  # (B, width, H, block, D)
        pool = x.new_empty((allocator.num_blocks, h, block_size, d))
        pool[physical] = blocks[used.to(k.device)]
        pools.append(pool)
    return pools[0], pools[1], table.to(k.device)


def token_positions(seq_lens: Sequence[int], device: str | torch.device) -> tuple[torch.Tensor, torch.Tensor]:
    """For packed tokens (sequence 0's, then sequence 1's, ...): each token's sequence and position."""
    lens = torch.tensor(list(seq_lens), device=device)
    seq = torch.repeat_interleave(torch.arange(len(seq_lens), device=device), lens)
    starts = torch.cumsum(lens, 0) - lens
    return seq, torch.arange(seq.numel(), device=device) - starts[seq]


def pack(x: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor) -> torch.Tensor:
    """The first ``seq_lens[b]`` tokens of each sequence of a (B, H, T, D) cache, packed: (N, H, D)."""
    seq, pos = token_positions(_lengths(seq_lens), x.device)
    return x[seq, :, pos]


def contiguous_from_packed(k_new: torch.Tensor, v_new: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor,
                           max_len: int) -> tuple[torch.Tensor, torch.Tensor]:
    """A contiguous cache reserving ``max_len`` slots per sequence, holding the packed tokens."""
    lens = _lengths(seq_lens)
    if max(lens) > max_len:
        raise ValueError(f"a sequence of {max(lens)} tokens does not fit a contiguous cache of {max_len}")
    seq, pos = token_positions(lens, k_new.device)
    out = []
    for x in (k_new, v_new):
        cache = x.new_zeros((len(lens), x.shape[1], max_len, x.shape[2]))
        cache[seq, :, pos] = x
        out.append(cache)
    return out[0], out[1]


def paged_from_packed(k_new: torch.Tensor, v_new: torch.Tensor, seq_lens: Sequence[int] | torch.Tensor,
                      block_size: int, max_len: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """A paged cache of exactly the blocks the packed tokens need (the allocator places them);
    returns (k_pool, v_pool, block_table) with ``blocks_for(max_len)`` table columns."""
    lens = _lengths(seq_lens)
    allocator = BlockAllocator(sum(blocks_for(n, block_size) for n in lens), block_size)
    for seq, n in enumerate(lens):
        allocator.append(seq, n)
    table = allocator.block_table(range(len(lens)), blocks_for(max_len, block_size), device=k_new.device)
    seq, pos = token_positions(lens, k_new.device)
    physical = table[seq, pos // block_size].long()
    slot = pos % block_size
    pools = []
    for x in (k_new, v_new):
        pool = x.new_full((allocator.num_blocks, x.shape[1], block_size, x.shape[2]), float("nan"))
        pool[physical, :, slot] = x
        pools.append(pool)
    return pools[0], pools[1], table
