"""Group-wise 4-bit weights in plain PyTorch: round-to-nearest quantization (the reference quantizer),
packing two values per byte, and the dequantized Linear the Triton kernel must equal.

Layout (GPTQ/AWQ-style, per output channel ``n``): K is split into groups of ``group`` columns; each
group has a float32 scale and an integer zero point in [0, 15], and ``q = clamp(round(w / scale) + zero,
0, 15)`` covers the group's [min, max] (with 0 inside it). Two 4-bit values share a byte: column ``2j`` in
the low nibble, ``2j + 1`` in the high one. K is padded with zeros to a whole number of groups, so any K
works; the padding multiplies zero activations.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from microscope.api import interpreting

GROUPS = (32, 64, 128)
#: GPTQ's lazy-update block: columns within it update each other at once, later columns once per block.
GPTQ_BLOCK = 128


@dataclass(frozen=True)
class Int4Weight:
    """A packed (N, K) weight: ``packed`` uint8 (N, Kp / 2), ``scale`` and ``zero`` float32 (N, Kp / group)."""

    packed: torch.Tensor
    scale: torch.Tensor
    zero: torch.Tensor
    k: int  # the original K (Kp is k rounded up to a whole group)
    group: int

    @property
    def n(self) -> int:
        return int(self.packed.shape[0])

    @property
    def words(self) -> torch.Tensor:
        """``packed`` as int32 words of eight values (N, Kp / 8), the same memory (Kp / 2 bytes a row is a
        multiple of 16)."""
        return self.packed.contiguous().view(torch.int32)

    def nbytes(self) -> int:
        """Bytes a kernel reads for the weight: the packed values, the scales and the zero points."""
        return int(self.packed.numel() + 4 * self.scale.numel() + 4 * self.zero.numel())


def _check(weight: torch.Tensor, group: int) -> None:
    if group not in GROUPS:
        raise ValueError(f"group {group}: one of {', '.join(map(str, GROUPS))}")
    if weight.dim() != 2:
        raise ValueError(f"the weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if not torch.isfinite(weight).all():
        raise ValueError(f"the weight holds {int((~torch.isfinite(weight)).sum())} NaN/Inf value(s); "
                         "4-bit quantization needs finite values")


def _padded(weight: torch.Tensor, group: int) -> torch.Tensor:
    """The weight in float32, K padded with zeros to a whole number of groups."""
    n, k = weight.shape
    kp = -(-max(k, 1) // group) * group
    w = torch.zeros((n, kp), device=weight.device, dtype=torch.float32)
    w[:, :k] = weight.float()
    return w


def group_params(values: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(scale, zero point) per row of ``values`` (..., group): the 16 levels cover [min, max] with 0 inside."""
    lo = values.amin(dim=-1).clamp(max=0.0)
    hi = values.amax(dim=-1).clamp(min=0.0)
    # a tensor divisor: torch on a GPU multiplies by a Python number's reciprocal (a last bit apart from dividing)
    scale = (hi - lo) / torch.full((), 15.0, device=values.device)
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    return scale, torch.clamp(torch.floor(-lo / scale + 0.5), 0, 15)


def round_to_levels(values: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor) -> torch.Tensor:
    """The 4-bit values (float, 0..15) of ``values`` under per-row ``scale`` and ``zero``."""
    return torch.clamp(torch.floor(values / scale[..., None] + 0.5) + zero[..., None], 0, 15)


def _packed(q: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, k: int, group: int) -> Int4Weight:
    q = q.to(torch.uint8)
    return Int4Weight((q[:, 0::2] | (q[:, 1::2] << 4)).contiguous(), scale.contiguous(), zero.contiguous(), k, group)


def quantize_int4(weight: torch.Tensor, group: int = 128) -> Int4Weight:
    """Round-to-nearest group-wise asymmetric 4-bit quantization of a (N, K) weight."""
    _check(weight, group)
    w = _padded(weight, group)
    n, kp = w.shape
    groups = w.view(n, kp // group, group)
    scale, zero = group_params(groups)
    return _packed(round_to_levels(groups, scale, zero).view(n, kp), scale, zero, weight.shape[1], group)


def quantize_gptq(weight: torch.Tensor, calibration: torch.Tensor, group: int = 128,
                  damp: float = 0.01) -> Int4Weight:
    """GPTQ-style 4-bit quantization: columns in order, each one's rounding error spread over the columns
    not yet quantized, weighted by the inverse Hessian ``H = X^T X`` of calibration activations X (n, K).

    Same layout as ``quantize_int4``; each group's scale and zero point come from its columns as updated
    when the group is reached. ``damp`` x mean(diag H) is added to the diagonal (dead input channels
    get 1), so a rank-deficient calibration set still factorizes.
    """
    _check(weight, group)
    if calibration.dim() != 2 or calibration.shape[1] != weight.shape[1]:
        raise ValueError(f"calibration activations must be (n, K={weight.shape[1]}), got {tuple(calibration.shape)}")
    x = calibration.to(device=weight.device, dtype=torch.float32)
    return quantize_gptq_hessian(weight, x.t() @ x / max(1, x.shape[0]), group, damp)


def quantize_gptq_hessian(weight: torch.Tensor, hessian: torch.Tensor, group: int = 128,
                          damp: float = 0.01) -> Int4Weight:
    """``quantize_gptq`` from the Hessian ``X^T X / n`` (K, K) itself: a model accumulates it over its
    calibration batches rather than keeping every activation row."""
    _check(weight, group)
    k = weight.shape[1]
    if tuple(hessian.shape) != (k, k):
        raise ValueError(f"the Hessian must be (K, K) = ({k}, {k}), got {tuple(hessian.shape)}")
    w = _padded(weight, group)
    n, kp = w.shape
    h = torch.zeros((kp, kp), device=w.device, dtype=torch.float32)
    h[:k, :k] = hessian.to(device=w.device, dtype=torch.float32)
    dead = torch.diagonal(h) == 0
    h[dead, dead] = 1.0
    w[:, dead] = 0.0
    h += damp * torch.diagonal(h).mean() * torch.eye(kp, device=w.device)
    u = torch.linalg.cholesky(torch.cholesky_inverse(torch.linalg.cholesky(h)), upper=True)
    q = torch.empty_like(w)
    scales = torch.empty((n, kp // group), device=w.device)
    zeros = torch.empty_like(scales)
    step = gptq_block
    if w.is_cuda and not interpreting():
        from .gptq_kernel import gptq_block as step  # the same loop in one launch per block
    block = max(group, GPTQ_BLOCK)  # a whole number of groups: a group's columns are in one block
    for b0 in range(0, kp, block):
        b1 = min(b0 + block, kp)
        errors = torch.empty((n, b1 - b0), device=w.device)
        step(w[:, b0:b1], u[b0:b1, b0:b1], q[:, b0:b1], scales, zeros, errors, b0, group)
        w[:, b1:] -= errors @ u[b0:b1, b1:]  # the block's errors reach the later columns in one product
    return _packed(q, scales, zeros, weight.shape[1], group)


def gptq_block(wb: torch.Tensor, ub: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               errors: torch.Tensor, b0: int, group: int) -> None:
    """GPTQ over the block of columns ``b0 .. b0 + width`` (whole groups): column by column, the group's
    scale and zero point when a group starts (from its columns as updated so far), the 4-bit value, its
    rounding error over the inverse Hessian factor's diagonal (``errors``), and that error spread over the
    block's later columns (``wb`` is updated in place)."""
    diagonal = torch.diagonal(ub)  # divided by as tensors: a true division on every device
    for j in range(wb.shape[1]):
        if (b0 + j) % group == 0:
            g = (b0 + j) // group
            scale, zero = group_params(wb[:, j : j + group])
            scales[:, g], zeros[:, g] = scale, zero
        column = wb[:, j]
        qj = round_to_levels(column[:, None], scale, zero)[:, 0]
        q[:, j] = qj
        error = errors[:, j]
        torch.div(column - (qj - zero) * scale, diagonal[j], out=error)
        wb[:, j + 1 :] -= error[:, None] * ub[j, j + 1 :]


def unpack(weight: Int4Weight) -> torch.Tensor:
    """The 4-bit values as uint8 (N, Kp), in column order."""
    low, high = weight.packed & 0xF, weight.packed >> 4
    return torch.stack((low, high), dim=-1).reshape(weight.n, -1)


def dequantize(weight: Int4Weight, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The (N, K) weight the 4-bit values stand for: ``(q - zero) * scale`` per group."""
    q = unpack(weight).float().view(weight.n, -1, weight.group)
    w = (q - weight.zero[..., None]) * weight.scale[..., None]
    return w.reshape(weight.n, -1)[:, : weight.k].to(dtype)


def int4_linear_reference(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None) -> torch.Tensor:
    """``x @ dequantize(W)^T + bias`` in float64: what the kernel computes, up to its own rounding."""
    out = x.double() @ dequantize(weight, torch.float64).t()
    return (out + bias.double() if bias is not None else out).to(x.dtype)
