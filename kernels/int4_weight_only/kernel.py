"""A weight-only 4-bit Linear in Triton: the packed weight is unpacked and dequantized in registers.

Why: at decode (M of 1 to 16 rows) a Linear reads its whole weight to do little arithmetic with it, so
its time is the weight's bytes over the memory bandwidth; 4-bit weights with a float32 scale and zero
point per group of 32-128 columns are ~0.27x the bytes of bf16. Each program loads a tile of packed
bytes, splits the low and high nibbles (columns ``2j`` and ``2j + 1``), applies its group's
``(q - zero) * scale`` and multiplies with the activations' even and odd columns: two dot products per
tile, no dequantized weight ever written to memory. The tile's K extent divides the group, so one scale
and zero point per output channel cover it.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.fp32_dot import mma

from microscope.api import interpreting

from .reference import Int4Weight


@triton.jit
def _int4_gemm_kernel(X, P, S, Z, BIAS, C, M, N, K, KP, GROUPS, stride_xm, stride_pn, stride_cm,
                      GROUP: tl.constexpr, HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                      BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    j = tl.arange(0, BLOCK_K // 2)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, KP, BLOCK_K):
        packed = tl.load(P + rn[None, :] * stride_pn + (k0 // 2 + j)[:, None], mask=rn[None, :] < N, other=0)
        g = k0 // GROUP
        scale = tl.load(S + rn * GROUPS + g, mask=rn < N, other=0.0)[None, :]
        zero = tl.load(Z + rn * GROUPS + g, mask=rn < N, other=0.0)[None, :]
        w_even = ((packed & 0xF).to(tl.float32) - zero) * scale
        w_odd = ((packed >> 4).to(tl.float32) - zero) * scale
        cols = k0 + 2 * j
        a_even = tl.load(X + rm[:, None] * stride_xm + cols[None, :],
                         mask=(rm[:, None] < M) & (cols[None, :] < K), other=0.0)
        a_odd = tl.load(X + rm[:, None] * stride_xm + cols[None, :] + 1,
                        mask=(rm[:, None] < M) & (cols[None, :] + 1 < K), other=0.0)
        acc = mma(a_even, w_even.to(a_even.dtype), acc, INTERPRET, IEEE)
        acc = mma(a_odd, w_odd.to(a_odd.dtype), acc, INTERPRET, IEEE)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :], acc.to(C.dtype.element_ty), mask=mask)


def _blocks(m: int, group: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps); BLOCK_K divides the group."""
    if interpreting():
        return 16, 32, min(group, 32), 4
    if m <= 16:
        return 16, 64, min(group, 128), 4
    return 64, 128, min(group, 64), 8


def int4_linear(x: torch.Tensor, weight: Int4Weight, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` with W stored as group-wise 4-bit values (``reference.quantize_int4``); x's dtype
    out, x of shape (..., K)."""
    if x.shape[-1] != weight.k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {weight.k}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, weight.k).contiguous()
    m, n = x2.shape[0], weight.n
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out.reshape(*lead, n)
    kp = weight.packed.shape[1] * 2
    bm, bn, bk, warps = _blocks(m, weight.group)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _int4_gemm_kernel[grid](x2, weight.packed, weight.scale, weight.zero, bias if bias is not None else weight.scale,
                            out, m, n, weight.k, kp, weight.scale.shape[1], x2.stride(0), weight.packed.stride(0),
                            out.stride(0), GROUP=weight.group, HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn,
                            BLOCK_K=bk, INTERPRET=interpreting(), IEEE=x.dtype == torch.float32, num_warps=warps)
    return out.reshape(*lead, n)
