"""The bias argument of the Linear-shaped Triton kernels (int8, int4, binarized, block-sparse).

The kernels read ``bias[n]`` at offset ``n`` from its pointer, so a bias of another length would read past
it or stop short, and a strided view would give other elements: both are refused or made contiguous here,
as ``F.linear`` refuses a bias that does not match its weight.
"""

from __future__ import annotations

import torch


def checked_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor | None:
    """``bias`` as the kernels read it (contiguous, on ``device``), or a ValueError saying why it cannot be."""
    if bias is None:
        return None
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) for a weight of {n} output features, got {tuple(bias.shape)}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device}, the input on {device}")
    return bias.contiguous()
