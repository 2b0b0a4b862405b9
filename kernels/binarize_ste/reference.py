"""1-bit weights with the straight-through estimator, in plain PyTorch: the seed's ``StraightThroughEstimator``
made precise, and the bit packing the Triton kernel reads.

Binarization (XNOR-Net style): ``W_b = alpha * sign(W)`` with ``alpha`` the mean ``|W|`` of each output
row, so a row keeps its scale; ``sign(0) = +1``. The straight-through estimator passes the gradient of
``W_b`` to ``W`` unchanged where ``|W| <= 1`` and zeroes it beyond (the clipped STE); ``alpha`` is treated
as a constant. Packing: 32 signs per int32, column ``32 i + j`` in bit ``j`` of word ``i`` (1 = +1); K is
padded to a whole word with +1 columns, which multiply zero activations.
"""

from __future__ import annotations

import torch

WORD = 32


def row_scale(weight: torch.Tensor) -> torch.Tensor:
    """alpha per output row: the mean absolute weight (float32)."""
    return weight.float().abs().mean(dim=-1)


def binarize(weight: torch.Tensor) -> torch.Tensor:
    """``alpha * sign(W)`` in W's dtype, with sign(0) = +1."""
    signs = torch.where(weight >= 0, 1.0, -1.0)
    return (signs * row_scale(weight)[:, None]).to(weight.dtype)


class SignSTE(torch.autograd.Function):
    """Forward: ``binarize(W)``. Backward: the clipped straight-through estimator."""

    @staticmethod
    def forward(ctx, weight: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        ctx.save_for_backward(weight)
        return binarize(weight)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        (weight,) = ctx.saved_tensors
        return grad * (weight.abs() <= 1).to(grad.dtype)


def binary_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ binarize(W)^T + b``, differentiable through the straight-through estimator."""
    return torch.nn.functional.linear(x, SignSTE.apply(weight), bias)


def pack_signs(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(packed int32 (N, ceil(K / 32)), alpha float32 (N,)) of a (N, K) weight."""
    if weight.dim() != 2:
        raise ValueError(f"the weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if not torch.isfinite(weight).all():
        raise ValueError("the weight holds NaN/Inf values; binarization needs finite values")
    n, k = weight.shape
    words = -(-max(k, 1) // WORD)
    bits = torch.ones((n, words * WORD), dtype=torch.int64, device=weight.device)
    bits[:, :k] = (weight >= 0).to(torch.int64)
    shifts = torch.arange(WORD, device=weight.device, dtype=torch.int64)
    packed = (bits.view(n, words, WORD) << shifts).sum(dim=-1)
    packed = torch.where(packed >= 2**31, packed - 2**32, packed)  # the bit pattern as a signed int32
    return packed.to(torch.int32).contiguous(), row_scale(weight).contiguous()


def unpack_signs(packed: torch.Tensor, k: int) -> torch.Tensor:
    """The (N, K) signs (+1 / -1, float32) that ``pack_signs`` stored."""
    shifts = torch.arange(WORD, device=packed.device, dtype=torch.int64)
    bits = (packed.to(torch.int64)[..., None] >> shifts) & 1
    return (bits.reshape(packed.shape[0], -1)[:, :k] * 2 - 1).float()
