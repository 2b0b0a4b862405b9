"""SwiGLU whose saved inputs are int8, in two Triton kernels: the forward writes ``h = silu(g) * u`` and
the int8 copies of g and u in one pass over them; the backward reads the int8 copies and ``dh`` and
writes ``dg`` and ``du``, dequantizing in registers.

Why: the memory a training step holds is mostly saved activations, and SwiGLU's inputs are the widest of
them. Quantizing in a separate op would read g and u again and write the int8 copies; fused, the
forward reads each input twice (the row's absmax first, then the values, the second time mostly from
L2) and the backward never materializes a dequantized tensor.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.int8_rows import absmax_scale, inverse, quantized

from microscope.api import interpreting

from .reference import QMAX


@triton.jit
def _swiglu_fwd_kernel(G, U, H, QG, SG, QU, SU, R, C, SAVE: tl.constexpr, BLOCK_M: tl.constexpr,
                       BLOCK_C: tl.constexpr):
    """h = silu(g) * u; with SAVE, also the int8 copies of g and u and their row scales."""
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = rows[:, None] < R
    cols = tl.arange(0, BLOCK_C)
    if SAVE:
        sg = absmax_scale(G, rows, in_rows, C, C, BLOCK_M, BLOCK_C)
        su = absmax_scale(U, rows, in_rows, C, C, BLOCK_M, BLOCK_C)
        inv_g, inv_u = inverse(sg), inverse(su)
        tl.store(SG + rows, sg, mask=rows < R)
        tl.store(SU + rows, su, mask=rows < R)
    for c0 in range(0, C, BLOCK_C):
        mask = in_rows & (c0 + cols[None, :] < C)
        at = rows[:, None] * C + c0 + cols[None, :]
        g = tl.load(G + at, mask=mask, other=0.0).to(tl.float32)
        u = tl.load(U + at, mask=mask, other=0.0).to(tl.float32)
        h = g * tl.sigmoid(g) * u
        tl.store(H + at, h.to(H.dtype.element_ty), mask=mask)
        if SAVE:
            tl.store(QG + at, quantized(g, inv_g), mask=mask)
            tl.store(QU + at, quantized(u, inv_u), mask=mask)


@triton.jit
def _swiglu_bwd_kernel(DH, QG, SG, QU, SU, DG, DU, R, C, BLOCK_M: tl.constexpr, BLOCK_C: tl.constexpr):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    in_rows = rows[:, None] < R
    cols = tl.arange(0, BLOCK_C)
    sg = tl.load(SG + rows, mask=rows < R, other=0.0)[:, None]
    su = tl.load(SU + rows, mask=rows < R, other=0.0)[:, None]
    for c0 in range(0, C, BLOCK_C):
        mask = in_rows & (c0 + cols[None, :] < C)
        at = rows[:, None] * C + c0 + cols[None, :]
        dh = tl.load(DH + at, mask=mask, other=0.0).to(tl.float32)
        g = tl.load(QG + at, mask=mask, other=0).to(tl.float32) * sg
        u = tl.load(QU + at, mask=mask, other=0).to(tl.float32) * su
        s = tl.sigmoid(g)
        tl.store(DG + at, (dh * u * s * (1.0 + g * (1.0 - s))).to(DG.dtype.element_ty), mask=mask)
        tl.store(DU + at, (dh * g * s).to(DU.dtype.element_ty), mask=mask)


def _forward(g: torch.Tensor, u: torch.Tensor, save: bool) -> tuple[torch.Tensor, tuple[torch.Tensor, ...]]:
    """h, and (with ``save``) the int8 copies and row scales of g and u, from one Triton pass."""
    g2, u2 = g.reshape(-1, g.shape[-1]).contiguous(), u.reshape(-1, u.shape[-1]).contiguous()
    rows, cols = g2.shape
    h = torch.empty_like(g2)
    if save:
        qg, qu = (torch.empty(g2.shape, dtype=torch.int8, device=g.device) for _ in range(2))
        sg, su = (torch.empty(rows, dtype=torch.float32, device=g.device) for _ in range(2))
    else:  # nothing will run the backward (inference): no copies to write
        qg = qu = sg = su = h
    if rows and cols:
        grid, block_m, block_c = _launch(rows, cols)
        _swiglu_fwd_kernel[grid](g2, u2, h, qg, sg, qu, su, rows, cols, SAVE=save, BLOCK_M=block_m,
                                 BLOCK_C=block_c)
    return h.reshape(g.shape), ((qg, sg, qu, su) if save else ())


def _launch(rows: int, cols: int) -> tuple[tuple[int], int, int]:
    """(grid, BLOCK_M, BLOCK_C): the interpreter takes many rows a program (its cost is per program)."""
    if interpreting():
        block_m, block_c = 16, 64
    else:
        block_c = min(2048, triton.next_power_of_2(max(cols, 16)))
        block_m = max(1, 2048 // block_c)
    return (triton.cdiv(rows, block_m),), block_m, block_c


class Int8SwiGLU(torch.autograd.Function):
    """``silu(g) * u`` keeping int8 copies of g and u (and float32 row scales) for the backward, in Triton."""

    @staticmethod
    def forward(ctx, g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:  # noqa: ANN001
        h, saved = _forward(g, u, save=any(ctx.needs_input_grad))
        ctx.save_for_backward(*saved)
        ctx.shape, ctx.dtype = g.shape, g.dtype
        return h

    @staticmethod
    def backward(ctx, dh: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:  # noqa: ANN001
        qg, sg, qu, su = ctx.saved_tensors
        dh2 = dh.reshape(qg.shape).contiguous()
        dg, du = torch.empty_like(dh2, dtype=ctx.dtype), torch.empty_like(dh2, dtype=ctx.dtype)
        rows, cols = qg.shape
        if rows and cols:
            grid, block_m, block_c = _launch(rows, cols)
            _swiglu_bwd_kernel[grid](dh2, qg, sg, qu, su, dg, du, rows, cols, BLOCK_M=block_m, BLOCK_C=block_c)
        return dg.reshape(ctx.shape), du.reshape(ctx.shape)


def int8_saved_swiglu(g: torch.Tensor, u: torch.Tensor) -> torch.Tensor:
    """``silu(g) * u`` (any leading dims) whose backward keeps g and u in 8 bits; fp32, fp16 or bf16."""
    if g.shape != u.shape or g.dtype != u.dtype:
        raise ValueError(f"g and u must match: {tuple(g.shape)} {g.dtype} vs {tuple(u.shape)} {u.dtype}")
    if g.dtype not in (torch.float32, torch.float16, torch.bfloat16):
        raise TypeError(f"int8_saved_swiglu takes fp32, fp16 or bf16, got {g.dtype}")
    return Int8SwiGLU.apply(g, u)


__all__ = ["QMAX", "Int8SwiGLU", "int8_saved_swiglu"]
