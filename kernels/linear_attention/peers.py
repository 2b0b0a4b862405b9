"""Softmax attention on the same q, k, v: what a user keeps if linear attention does not pay off.

These peers compute **different math** (exact softmax attention, not a kernel approximation of it), so
their outputs are never held to the linear-attention ground truth. They are speed-only comparators: each
refuses every device but a CUDA GPU, and only the ``bench`` profile of ``ablations/linear_attention.yaml``
(where the accuracy dimension is off) selects them, to read the sequence length at which the linear
kernel overtakes FlashAttention. The harness has no per-variant "speed only" flag; the README names it as
the seam a cleaner version would use.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from microscope_kernels.flash_attn.kernel import SUPPORTED_HEAD_DIMS as FLASH_HEAD_DIMS
from microscope_kernels.flash_attn.kernel import flash_attention
from microscope_kernels.flash_attn.peers import PEERS as FLASH_PEERS

from microscope.api import Case

__all__ = ["SPEED_ONLY", "flash_attn_softmax", "sdpa_flash_softmax", "softmax_supports"]

#: Why these peers never run where outputs are compared.
SPEED_ONLY = ("softmax attention is different math from linear attention: a speed-only peer, run on a CUDA GPU "
              "by the bench profile (accuracy off)")


def sdpa_flash_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       **_: object) -> torch.Tensor:
    """Exact softmax attention through SDPA's FlashAttention-2 backend (the feature-map inputs are unused)."""
    return FLASH_PEERS["sdpa_flash"].fn(q, k, v, causal)


def flash_attn_softmax(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                       **_: object) -> torch.Tensor:
    """Exact softmax attention through microscope's FlashAttention-2 Triton kernel (``kernels/flash_attn``)."""
    return flash_attention(q, k, v, causal)


def softmax_supports(name: str) -> Callable[[Case, str], str | None]:
    """``supports`` of a softmax peer: a CUDA GPU (``SPEED_ONLY``), then the backend's own rule."""

    def supports(case: Case, device: str) -> str | None:
        if torch.device(device).type != "cuda" or not torch.cuda.is_available():
            return SPEED_ONLY
        shape = (case["batch"], case["heads"], case["seq"], case["head_dim"])
        if name == "flash_attn":
            return None if case["head_dim"] in FLASH_HEAD_DIMS else f"head_dim not in {FLASH_HEAD_DIMS}"
        return FLASH_PEERS[name].supports(shape, shape, case.dtype, device, case["causal"])

    return supports
