"""Softmax attention on the same q, k, v: what a user keeps if linear attention does not pay off.

These peers compute **different math** (exact softmax attention, not a kernel approximation of it), so the
plugin declares them speed-only (``checked=False``): timed beside the linear kernel, never held to its
ground truth, and eligible as the fastest peer, which is how the bench profile reads the sequence length at
which the linear kernel overtakes FlashAttention.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from microscope_kernels.flash_attn.kernel import SUPPORTED_HEAD_DIMS as FLASH_HEAD_DIMS
from microscope_kernels.flash_attn.kernel import flash_attention
from microscope_kernels.flash_attn.peers import PEERS as FLASH_PEERS

from microscope.api import Case

__all__ = ["flash_attn_softmax", "sdpa_flash_softmax", "softmax_supports"]


def sdpa_flash_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       **_: object) -> torch.Tensor:
    """Exact softmax attention through SDPA's FlashAttention-2 backend (the feature-map inputs are unused)."""
    return FLASH_PEERS["sdpa_flash"].fn(q, k, v, causal)


def flash_attn_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       **_: object) -> torch.Tensor:
    """Exact softmax attention through microscope's FlashAttention-2 Triton kernel (``kernels/flash_attn``)."""
    return flash_attention(q, k, v, causal)


def softmax_supports(name: str) -> Callable[[Case, str], str | None]:
    """``supports`` of a softmax peer: the backend's own rule (SDPA's flash backend needs a CUDA GPU; the
    FA2 Triton kernel runs wherever Triton does, the interpreter included)."""

    def supports(case: Case, device: str) -> str | None:
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        if name == "flash_attn":
            return None if case["head_dim"] in FLASH_HEAD_DIMS else f"head_dim not in {FLASH_HEAD_DIMS}"
        return FLASH_PEERS[name].supports(shape, shape, case.dtype, device, case["causal"])

    return supports
