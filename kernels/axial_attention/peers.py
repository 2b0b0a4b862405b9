"""What a user would run instead, behind the candidate's signature.

* ``sdpa_axial``: the same axial attention with torch SDPA in both passes (same math: accuracy-checked).
* ``sdpa_full`` and ``flash_full``: **full** attention over all ``rows * cols`` tokens (torch SDPA;
  microscope's FA2 Triton kernel): what axial attention replaces. Different math: the plugin declares them
  speed-only peers (``checked=False``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from microscope_kernels.flash_attn.kernel import flash_attention

from .grid import axial, check_grid

__all__ = ["flash_full", "sdpa_axial", "sdpa_full"]


def _sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    return F.scaled_dot_product_attention(q, k, v, is_causal=causal)


def sdpa_axial(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
               causal: bool = False) -> torch.Tensor:
    """Axial attention with SDPA in both passes (PyTorch picks the backend)."""
    return axial(_sdpa, q, k, v, rows, cols, bool(causal))


def sdpa_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
              causal: bool = False) -> torch.Tensor:
    """Full attention over the whole sequence through SDPA (different math from axial attention)."""
    check_grid(q.shape[2], rows, cols)
    return _sdpa(q, k, v, bool(causal))


def flash_full(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
               causal: bool = False) -> torch.Tensor:
    """Full attention over the whole sequence through flash_attn's Triton kernel (different math)."""
    check_grid(q.shape[2], rows, cols)
    return flash_attention(q, k, v, causal=bool(causal))
