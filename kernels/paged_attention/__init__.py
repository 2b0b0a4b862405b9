"""Paged KV cache: a block allocator, a block-table Triton decode kernel (capacity counts: capacity.py, reported by the
plugin's figures; README.md)."""

from microscope_kernels.paged_attention.allocator import SENTINEL, BlockAllocator, PoolExhausted, blocks_for
from microscope_kernels.paged_attention.kernel import PAGE_SIZES, paged_decode_attention
from microscope_kernels.paged_attention.reference import eager_decode_attention, sdpa_decode_attention

__all__ = [
    "PAGE_SIZES",
    "SENTINEL",
    "BlockAllocator",
    "PoolExhausted",
    "blocks_for",
    "eager_decode_attention",
    "paged_decode_attention",
    "sdpa_decode_attention",
]
