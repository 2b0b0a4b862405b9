"""The plain PyTorch "before": LayerNorm, then GeLU, as two eager ops.

Memory traffic of one forward over an (M, N) input with element size s (weights ignored, O(N)):

    F.layer_norm : read x (M*N*s)              write t = normalized x (M*N*s)
    F.gelu       : read t (M*N*s)              write y (M*N*s)
    total        : 4*M*N*s, against the 2*M*N*s a fused kernel needs (read x, write y)

Backward (autograd of the two ops): gelu backward reads dy and t, writes dt (3*M*N*s); layer_norm
backward reads dt and x, writes dx, and reduces dweight/dbias (>= 3*M*N*s): >= 6*M*N*s, against the
3*M*N*s of the fused backward (read x and dy, write dx), which recomputes t from two per-row floats.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F


def layernorm_gelu_eager(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, approximate: str = "tanh"
) -> torch.Tensor:
    """Eager LayerNorm then GeLU (two kernels, the normalized tensor round-trips through memory)."""
    return F.gelu(F.layer_norm(x, (x.shape[-1],), weight, bias, eps), approximate=approximate)
