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

GROUPS = (32, 64, 128)


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

    def nbytes(self) -> int:
        """Bytes a kernel reads for the weight: the packed values, the scales and the zero points."""
        return int(self.packed.numel() + 4 * self.scale.numel() + 4 * self.zero.numel())


def quantize_int4(weight: torch.Tensor, group: int = 128) -> Int4Weight:
    """Round-to-nearest group-wise asymmetric 4-bit quantization of a (N, K) weight."""
    if group not in GROUPS:
        raise ValueError(f"group {group}: one of {', '.join(map(str, GROUPS))}")
    if weight.dim() != 2:
        raise ValueError(f"the weight must be 2-D (N, K), got shape {tuple(weight.shape)}")
    if not torch.isfinite(weight).all():
        raise ValueError(f"the weight holds {int((~torch.isfinite(weight)).sum())} NaN/Inf value(s); "
                         "4-bit quantization needs finite values")
    n, k = weight.shape
    kp = -(-max(k, 1) // group) * group
    w = torch.zeros((n, kp), device=weight.device, dtype=torch.float32)
    w[:, :k] = weight.float()
    groups = w.view(n, kp // group, group)
    lo = groups.amin(dim=-1).clamp(max=0.0)
    hi = groups.amax(dim=-1).clamp(min=0.0)
    scale = (hi - lo) / 15.0
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))
    zero = torch.clamp(torch.floor(-lo / scale + 0.5), 0, 15)
    q = torch.clamp(torch.floor(groups / scale[..., None] + 0.5) + zero[..., None], 0, 15).to(torch.uint8)
    q = q.view(n, kp)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).contiguous()
    return Int4Weight(packed, scale.contiguous(), zero.contiguous(), k, group)


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
