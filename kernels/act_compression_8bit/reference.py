"""SwiGLU with its saved inputs in 8 bits, in plain PyTorch: the quantizer, and the autograd function the
Triton kernels must match.

SwiGLU's elementwise part, ``h = silu(g) * u``, keeps ``g`` and ``u`` (and autograd also keeps
``silu(g)``) for its backward: three hidden-sized tensors per MLP per layer, the largest activations of
a transformer. Here only int8 copies of ``g`` and ``u`` are kept, with one float32 scale per row
(``absmax / 127``, symmetric, rounded half away from zero): 1 byte per element instead of 2 or 4. The
forward output is exact; the backward computes the gradients from the dequantized inputs, so they
carry the rounding (at most half a step per element). A row holding NaN/Inf gets a NaN scale, so its
gradients are NaN, as the plain op's would be.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

QMAX = 127


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(q int8 of x's shape, scale float32 of x.shape[:-1]): symmetric int8 per row of the last dim."""
    x32 = x.float()
    scale = x32.abs().amax(dim=-1) / QMAX
    bad = ~torch.isfinite(x32).all(dim=-1)
    scale = torch.where(bad, torch.full_like(scale, float("nan")), scale)
    inv = torch.where(scale > 0, 1.0 / scale, torch.zeros_like(scale))
    v = torch.nan_to_num(x32 * inv[..., None], nan=0.0, posinf=0.0, neginf=0.0)
    q = torch.clamp(torch.sign(v) * torch.floor(v.abs() + 0.5), -QMAX, QMAX).to(torch.int8)
    return q, scale


def dequantize_rows(q: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """The values ``q * scale`` stand for, in ``dtype``."""
    return (q.float() * scale[..., None]).to(dtype)


def swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """The plain op: autograd keeps g, u and silu(g) in their own dtype for the backward."""
    return F.silu(g) * u


def swiglu_grads(dh: torch.Tensor, g: torch.Tensor, u: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(dg, du) of ``silu(g) * u`` in float32: ``dg = dh * u * s * (1 + g * (1 - s))``, ``du = dh * silu(g)``."""
    g32, u32, dh32 = g.float(), u.float(), dh.float()
    s = torch.sigmoid(g32)
    return dh32 * u32 * s * (1 + g32 * (1 - s)), dh32 * g32 * s


class EagerInt8SwiGLU(torch.autograd.Function):
    """``silu(g) * u`` keeping only int8 copies of g and u (and their row scales) for the backward."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        h = (F.silu(g.float()) * u.float()).to(g.dtype)
        if any(ctx.needs_input_grad):  # inference keeps nothing, so it quantizes nothing
            ctx.save_for_backward(*quantize_rows(g), *quantize_rows(u))
        ctx.dtypes = (g.dtype, u.dtype)
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        qg, sg, qu, su = ctx.saved_tensors
        dg, du = swiglu_grads(dh, dequantize_rows(qg, sg), dequantize_rows(qu, su))
        return dg.to(ctx.dtypes[0]), du.to(ctx.dtypes[1])


def eager_int8_swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` with its saved inputs in 8 bits, quantized in eager PyTorch."""
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"g and u must match: {tuple(g.shape)} {g.dtype} vs {tuple(u.shape)} {u.dtype}")
    return EagerInt8SwiGLU.apply(g, u)
