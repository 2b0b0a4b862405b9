"""A Linear with 1-bit weights in Triton: 32 signs per int32 word, expanded to +-1 in registers.

Why: a binarized weight is 1/16 of bf16's bytes, so a decode-shaped call (a few rows) is bound by reading
it and can be ~16x faster than bf16 in principle; materializing ``alpha * sign(W)`` in bf16 first (what a
user does with plain PyTorch) reads and writes the full-size weight. Each program loads a tile of words,
shifts every bit out (bit ``j`` of word ``i`` is column ``32 i + j``), multiplies the +-1 tile with the
activations in one dot product and applies the row scales ``alpha`` in the epilogue.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.fp32_dot import mma
from microscope_kernels.input_checks import check_float_input, checked_bias

from microscope.api import interpreting

from .reference import WORD, pack_signs


@triton.jit
def _binary_gemm_kernel(X, P, A, BIAS, C, M, N, K, WORDS, stride_xm, stride_pn, stride_cm,
                        HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK_K: tl.constexpr,
                        INTERPRET: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rw = tl.arange(0, BLOCK_K // 32)
    shifts = tl.arange(0, 32)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for k0 in range(0, WORDS * 32, BLOCK_K):
        w_at = k0 // 32 + rw
        words = tl.load(P + rn[None, :] * stride_pn + w_at[:, None], mask=(rn[None, :] < N) & (w_at[:, None] < WORDS),
                        other=-1)
        bits = (words[:, None, :] >> shifts[None, :, None]) & 1  # (BLOCK_K / 32, 32, BLOCK_N)
        signs = tl.reshape(bits, (BLOCK_K, BLOCK_N)).to(tl.float32) * 2.0 - 1.0
        a = tl.load(X + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & (k0 + rk[None, :] < K), other=0.0)
        acc = mma(a, signs.to(a.dtype), acc, INTERPRET, IEEE)
    out = acc * tl.load(A + rn, mask=rn < N, other=0.0)[None, :]
    if HAS_BIAS:
        out += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :], out.to(C.dtype.element_ty), mask=mask)


def _blocks(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps); BLOCK_K is a whole number of words."""
    if interpreting():  # large tiles: the interpreter's cost is per program and per op
        return 32, 64, 64, 4
    if m <= 16:
        return 16, 64, 256, 4
    return 64, 128, 64, 8


def binary_linear_packed(x: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor, k: int,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ (alpha * sign(W))^T + bias`` from ``reference.pack_signs``'s words; x (..., K), x's dtype out."""
    check_float_input("binary_linear", x)
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    if packed.dtype != torch.int32 or packed.dim() != 2 or packed.shape[1] * WORD < k:
        raise ValueError(f"packed must be int32 (N, ceil(K / 32)) for K={k}, got {packed.dtype} "
                         f"{tuple(packed.shape)}")
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    m, n = x2.shape[0], packed.shape[0]
    bias = checked_bias(bias, n, x.device)
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out.reshape(*lead, n)
    bm, bn, bk, warps = _blocks(m)
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _binary_gemm_kernel[grid](x2, packed, alpha.float().contiguous(), bias if bias is not None else alpha, out, m,
                              n, k, packed.shape[1], x2.stride(0), packed.stride(0), out.stride(0),
                              HAS_BIAS=bias is not None, BLOCK_M=bm, BLOCK_N=bn, BLOCK_K=bk,
                              INTERPRET=interpreting(), IEEE=x.dtype == torch.float32, num_warps=warps)
    return out.reshape(*lead, n)


def binary_linear_triton(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """Pack ``weight``'s signs and run the kernel: for tests and one-off calls (a model packs once)."""
    packed, alpha = pack_signs(weight)
    return binary_linear_packed(x, packed, alpha, weight.shape[1], bias)
