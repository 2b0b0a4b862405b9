"""The candidate: axial attention through microscope's FlashAttention-2 Triton kernel, one launch per pass.

No new Triton kernel: each pass is a batch of short, independent sequences (rows, then columns), which is
exactly the shape ``microscope_kernels.flash_attn.kernel.flash_attention`` handles: (B, H*rows, cols, D) for
the row pass and (B, H*cols, rows, D) for the column pass, with its own backward through autograd. What a
dedicated kernel could still save is the column pass's transposing copies of q, k and the row output (and
the transpose back): a kernel reading columns with strided loads would skip them. That is left out until a
GPU profile shows the copies matter.
"""

from __future__ import annotations

import torch
from microscope_kernels.flash_attn.kernel import SUPPORTED_HEAD_DIMS, flash_attention

from .grid import axial

__all__ = ["SUPPORTED_HEAD_DIMS", "axial_attention"]


def _flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return flash_attention(q, k, v, causal=causal)


def axial_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
                    causal: bool = False) -> torch.Tensor:
    """Axial attention of (B, H, rows*cols, D) q, k, v (``grid.axial``), both passes through flash_attn's kernel.

    fp32, fp16 or bf16; D in flash_attn's ``SUPPORTED_HEAD_DIMS``; differentiable in q, k and v.
    """
    return axial(_flash, q, k, v, rows, cols, bool(causal))
