"""Argument checks shared by the row and Linear-shaped Triton kernels (softmax, LayerNorm+GeLU, int8, int4,
binarized, block-sparse): what they cannot compute is refused with a message rather than computed wrong.

The kernels compute in float32 from fp32/fp16/bf16 inputs, so a float64 input would come back in float64
with float32's precision and an integer one as truncated probabilities or sums. They read ``bias[n]`` at
offset ``n`` from its pointer, so a bias of another length would be read past its end or stop short, and a
strided view would give other elements: such a bias is refused or made contiguous here, as ``F.linear``
refuses a bias that does not match its weight.
"""

from __future__ import annotations

import torch

FLOAT_DTYPES = (torch.float32, torch.float16, torch.bfloat16)


def check_float_input(kernel: str, x: torch.Tensor) -> None:
    """A ValueError unless ``x`` is fp32, fp16 or bf16 with at least one dimension."""
    if x.dtype not in FLOAT_DTYPES:
        raise ValueError(f"{kernel} takes float32, float16 or bfloat16 input, got {x.dtype}; cast it first "
                         "(e.g. x.float())")
    if x.dim() == 0:
        raise ValueError(f"{kernel} needs at least one dimension, got a 0-d tensor")


def checked_bias(bias: torch.Tensor | None, n: int, device: torch.device) -> torch.Tensor | None:
    """``bias`` as the kernels read it (contiguous, on ``device``), or a ValueError saying why it cannot be."""
    if bias is None:
        return None
    if tuple(bias.shape) != (n,):
        raise ValueError(f"bias must have shape ({n},) for a weight of {n} output features, got {tuple(bias.shape)}")
    if bias.device != device:
        raise ValueError(f"bias is on {bias.device}, the input on {device}")
    return bias.contiguous()
