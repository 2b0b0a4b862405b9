"""What a user would run instead of the LSH kernel, behind the kernel's signature.

* ``sdpa_masked``: the same LSH attention as SDPA with the dense union mask (what one writes first): the
  same math, so it is held to the same accuracy check.
* ``sdpa_full`` and ``flash_full``: **full** attention over every key (torch SDPA; microscope's FA2 Triton
  kernel). Different math: the plugin declares them speed-only peers (``checked=False``), the "speed vs full
  attention" comparators; the LSH arguments are accepted and ignored.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from microscope_kernels.flash_attn.kernel import SUPPORTED_HEAD_DIMS as FLASH_HEAD_DIMS
from microscope_kernels.flash_attn.kernel import flash_attention

from .visibility import LSHSpec, key_intervals, visible_mask

__all__ = ["FLASH_HEAD_DIMS", "flash_full", "sdpa_full", "sdpa_masked"]


def sdpa_masked(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor, n_buckets: int,
                chunk: int, causal: bool = False, rule: str = "chunk", sm_scale: float | None = None) -> torch.Tensor:
    """SDPA with the dense (B, H, Sq, Sk) union mask; rows that see no key are run unmasked and zeroed (fused
    backends do not promise zeros for a fully masked row, and a NaN there would reach the gradients)."""
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=bool(causal), rule=rule)
    seen = visible_mask(spec, key_intervals(spec, q, k, rotations))
    empty = ~seen.any(dim=-1, keepdim=True)
    out = F.scaled_dot_product_attention(q, k, v, attn_mask=seen | empty, scale=sm_scale)
    return out.masked_fill(empty, 0.0)


def sdpa_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor | None = None,
              n_buckets: int = 1, chunk: int = 1, causal: bool = False, rule: str = "chunk",
              sm_scale: float | None = None) -> torch.Tensor:
    """Full attention through torch SDPA (PyTorch picks the fused backend); the LSH arguments are ignored."""
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("sdpa_full: causal needs Sq == Sk (SDPA aligns the causal mask top-left)")
    return F.scaled_dot_product_attention(q, k, v, is_causal=bool(causal), scale=sm_scale)


def flash_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor | None = None,
               n_buckets: int = 1, chunk: int = 1, causal: bool = False, rule: str = "chunk",
               sm_scale: float | None = None) -> torch.Tensor:
    """Full attention through microscope's FlashAttention-2 Triton kernel; the LSH arguments are ignored."""
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else sm_scale
    return flash_attention(q, k, v, causal=bool(causal), sm_scale=scale)
