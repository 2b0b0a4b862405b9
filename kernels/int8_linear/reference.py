"""Plain PyTorch int8 quantization: the seed's per-tensor affine scheme (the "before") and the symmetric
per-row scheme the Triton kernel implements, written out so tests can check the kernel step by step.

Per-tensor affine (``q = clamp(round(x / scale) + zero_point, -128, 127)``): one scale and zero point for
a whole tensor, so a few large values coarsen every other value's step. Per-row symmetric: one scale per
row (``absmax / 127``, zero point 0) for activations per token and weights per output channel.
Rounding is half away from zero in both, as the kernel rounds.
"""

from __future__ import annotations

import torch

QMIN, QMAX = -128, 127


def _round(v: torch.Tensor) -> torch.Tensor:
    return torch.sign(v) * torch.floor(v.abs() + 0.5)


def _check_finite(x: torch.Tensor, what: str) -> None:
    if not torch.isfinite(x).all():
        bad = int((~torch.isfinite(x)).sum())
        raise ValueError(f"{what} holds {bad} NaN/Inf value(s); int8 quantization needs finite values")


def quantize_per_tensor_affine(x: torch.Tensor) -> tuple[torch.Tensor, float, int]:
    """(q int8, scale, zero_point) over the whole tensor, covering [min(x, 0), max(x, 0)]."""
    _check_finite(x, "the tensor")
    lo, hi = min(float(x.min()), 0.0), max(float(x.max()), 0.0)
    scale = (hi - lo) / (QMAX - QMIN) or 1.0
    zero_point = int(max(QMIN, min(QMAX, round(QMIN - lo / scale))))
    q = torch.clamp(_round(x.double() / scale) + zero_point, QMIN, QMAX).to(torch.int8)
    return q, scale, zero_point


def affine_linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """The seed's int8 Linear: x and the weight each quantized per tensor (affine), dequantized, multiplied
    in float32; the result in x's dtype."""
    qx, sx, zx = quantize_per_tensor_affine(x)
    qw, sw, zw = quantize_per_tensor_affine(weight)
    xd = (qx.float() - zx) * sx
    wd = (qw.float() - zw) * sw
    out = torch.nn.functional.linear(xd, wd, None if bias is None else bias.float())
    return out.to(x.dtype)


def quantize_per_token(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (M, K), scale float32 (M,)): symmetric per row; an all-zero row gets scale 0 and q 0."""
    _check_finite(x, "the activations")
    return quantize_rows_eager(x)


def quantize_per_channel(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 (N, K), scale float32 (N,)) of a (N, K) weight: symmetric per output channel."""
    _check_finite(weight, "the weight")
    return quantize_rows_eager(weight)


def quantize_rows_eager(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric per-row int8 in eager PyTorch, without the finiteness check (a hot path: no host sync)."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1) / QMAX
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))  # x * (1 / scale), as the kernel does
    q = torch.clamp(_round(x32 * inv[:, None]), -QMAX, QMAX).to(torch.int8)
    return q, scale


def int8_linear_reference(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor,
                          bias: torch.Tensor | None) -> torch.Tensor:
    """What the Triton kernel computes, in PyTorch: per-token int8 activations, an exact int32 product
    with the per-channel int8 weight, rescaled by both scales, plus the bias; in x's dtype."""
    x_q, x_scale = quantize_rows_eager(x)
    # exact: |products| <= 127^2, so float64 sums integers exactly for any K below 5e11 (and runs on GPUs,
    # which have no int64 matmul)
    acc = x_q.double() @ w_q.double().t()
    out = acc * x_scale.double()[:, None] * w_scale.double()[None, :]
    if bias is not None:
        out = out + bias.double()
    return out.to(x.dtype)
