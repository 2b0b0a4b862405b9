"""What a user would pick instead of the Triton kernel, behind the kernel's signature.

* ``flex``: ``torch.compile``d flex_attention with a ``BlockMask`` built per call from the same inputs: the
  block structure from ``mask.tile_classes`` at flex's 128 x 128 blocks (partial blocks in ``kv_indices``,
  whole ones in ``full_kv_indices``) and ``mask.visible`` as its ``mask_mod``. So flex skips the same
  blocks the kernel skips, from the same definition, and pays for building its block structure per call
  just as the kernel does: both keep theirs per shape for a mask without random blocks on a small grid.
* ``sdpa_masked``: ``F.scaled_dot_product_attention`` with the dense boolean mask: what one writes first.

Each peer comes with a ``supports`` rule that returns why it cannot run a case (None when it can), so a
report says "n/a: reason" instead of timing something else.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from .kernel import CACHED_TILE_PAIRS
from .mask import FULL, PARTIAL, dense_mask, tile_classes, tile_lists, visible
from .reference import spec_and_pairs

__all__ = ["FLEX_BLOCK", "PEERS", "Peer", "flex_attention_compiled", "flex_block_mask", "sdpa_masked"]

#: flex_attention's default block size (both axes).
FLEX_BLOCK = 128
_HALF = (torch.float16, torch.bfloat16)


@functools.cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    # static shapes: each length hits the graph the precompile step warmed (see flash_attn/peers.py)
    return torch.compile(flex_attention, dynamic=False)


def flex_block_mask(pattern: torch.Tensor | None, sq: int, sk: int, window: int, globals: int, block: int,
                    causal: bool, device: torch.device | str):
    """flex_attention's ``BlockMask`` of the mask: ``mask.py``'s tile classes and predicate, no dense mask."""
    from torch.nn.attention.flex_attention import BlockMask

    spec, pairs = spec_and_pairs(pattern, sk, window, globals, block, causal)
    classes = tile_classes(spec, pairs, sq, sk, FLEX_BLOCK, FLEX_BLOCK, device=device)
    partial = tile_lists(torch.where(classes == PARTIAL, classes, 0))
    full = tile_lists(torch.where(classes == FULL, classes, 0))
    off = sk - sq

    def mask_mod(b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - flex_attention's signature
        return visible(spec, pairs, q_idx + off, kv_idx)

    return BlockMask.from_kv_blocks(partial.count[None, None], partial.index[None, None],
                                    full.full[None, None], full.index[None, None], BLOCK_SIZE=FLEX_BLOCK,
                                    mask_mod=mask_mod, seq_lengths=(sq, sk))


@functools.lru_cache(maxsize=256)
def _shape_block_mask(sq: int, sk: int, window: int, globals: int, block: int, causal: bool,
                      device: torch.device):
    """``flex_block_mask`` of a mask without random blocks, built once per shape, as the kernel keeps its
    tile lists (``kernel._shape_tiles``)."""
    return flex_block_mask(None, sq, sk, window, globals, block, causal, device)


def flex_attention_compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: torch.Tensor | None = None,
                            window: int = 0, globals: int = 0, block: int = 64, causal: bool = False,
                            sm_scale: float | None = None) -> torch.Tensor:
    """``torch.compile``d flex_attention over ``flex_block_mask``; the recompile limit is raised for the
    call so that a sweep over a dozen shapes and masks does not fall back to the unfused eager path."""
    sq, sk = q.shape[-2], k.shape[-2]
    if pattern is None and -(-sq // FLEX_BLOCK) * -(-sk // FLEX_BLOCK) <= CACHED_TILE_PAIRS:
        block_mask = _shape_block_mask(sq, sk, window, globals, block, causal, q.device)
    else:
        block_mask = flex_block_mask(pattern, sq, sk, window, globals, block, causal, q.device)
    with torch._dynamo.config.patch(cache_size_limit=256):
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=sm_scale)


def sdpa_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, pattern: torch.Tensor | None = None,
                window: int = 0, globals: int = 0, block: int = 64, causal: bool = False,
                sm_scale: float | None = None) -> torch.Tensor:
    """SDPA with the dense (Sq, Sk) boolean mask (PyTorch picks the backend: one that takes a mask)."""
    spec, pairs = spec_and_pairs(None if pattern is None else pattern.to(q.device), k.shape[-2], window, globals,
                                 block, causal)
    mask = dense_mask(spec, pairs, q.shape[-2], k.shape[-2], q.device)
    return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)


# -- supports rules: (head_dim, dtype, device, may_have_empty_rows) -> reason or None -----------------------


def _needs_cuda(device: str) -> str | None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device (flex_attention is compiled to a Triton kernel by Inductor)"
    return None


def _supports_flex(head_dim: int, dtype: torch.dtype, device: str, may_have_empty_rows: bool) -> str | None:
    if dtype not in (torch.float32, *_HALF):
        return "flex_attention needs fp32, fp16 or bf16"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return "flex_attention needs a power-of-two head dim >= 16"
    return _needs_cuda(device)


def _supports_sdpa(head_dim: int, dtype: torch.dtype, device: str, may_have_empty_rows: bool) -> str | None:
    if may_have_empty_rows and torch.device(device).type == "cuda":
        return ("window 0 without global tokens leaves rows that see no key, which SDPA's fused CUDA "
                "backends are not documented to return as zeros")
    return None


@dataclass(frozen=True)
class Peer:
    """A peer implementation and the check that says when it cannot run a case."""

    name: str
    fn: Callable[..., torch.Tensor]
    supports: Callable[[int, torch.dtype, str, bool], str | None]


#: The peers by short name, in the order a report lists them.
PEERS: dict[str, Peer] = {
    p.name: p for p in (Peer("flex", flex_attention_compiled, _supports_flex),
                        Peer("sdpa_masked", sdpa_masked, _supports_sdpa))
}

