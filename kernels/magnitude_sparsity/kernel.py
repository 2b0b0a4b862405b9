"""A Linear over a block-sparse weight in Triton: each program walks only the K blocks of its output strip
that hold a nonzero.

Why: a dense GEMM over a weight with half its tiles zero does the full work; skipping zero tiles does
half. The index of nonzero K blocks per strip of ``BLOCK_N`` output rows is built once, when the mask is
set (``reference.nonzero_blocks``), so the kernel's loop length is that strip's count. Unstructured or 2:4
masks leave almost no tile empty: this kernel is for block-pruned weights; 2:4 belongs to sparse tensor
cores (torch's semi-structured sparse tensors, the room's peer).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.fp32_dot import mma
from microscope_kernels.input_checks import check_float_input, checked_bias

from microscope.api import interpreting

from .reference import nonzero_blocks


@triton.jit
def _block_sparse_kernel(X, W, IDX, CNT, BIAS, C, M, N, K, MAX_COUNT, stride_xm, stride_wn, stride_cm,
                         HAS_BIAS: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, INTERPRET: tl.constexpr, IEEE: tl.constexpr):
    pid_m, pid_n = tl.program_id(0), tl.program_id(1)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    rk = tl.arange(0, BLOCK_K)
    acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    for t in range(0, tl.load(CNT + pid_n)):
        k0 = tl.load(IDX + pid_n * MAX_COUNT + t) * BLOCK_K
        a = tl.load(X + rm[:, None] * stride_xm + (k0 + rk)[None, :],
                    mask=(rm[:, None] < M) & (k0 + rk[None, :] < K), other=0.0)
        w = tl.load(W + rn[None, :] * stride_wn + (k0 + rk)[:, None],
                    mask=(rn[None, :] < N) & (k0 + rk[:, None] < K), other=0.0)
        acc = mma(a, w, acc, INTERPRET, IEEE)
    if HAS_BIAS:
        acc += tl.load(BIAS + rn, mask=rn < N, other=0.0).to(tl.float32)[None, :]
    mask = (rm[:, None] < M) & (rn[None, :] < N)
    tl.store(C + rm[:, None] * stride_cm + rn[None, :], acc.to(C.dtype.element_ty), mask=mask)


def tiles(m: int) -> tuple[int, int, int, int]:
    """(BLOCK_M, BLOCK_N, BLOCK_K, warps); BLOCK_N and BLOCK_K are 32, the pruning block."""
    if interpreting():
        return 32, 32, 32, 4
    return (16 if m <= 16 else 64), 32, 32, 4


def block_index(weight: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The nonzero-K-block index of a (masked) weight for the kernel's tiles (built once per mask)."""
    _, block_n, block_k, _ = tiles(1)
    return nonzero_blocks(weight, block_n, block_k)


def block_sparse_linear(x: torch.Tensor, weight: torch.Tensor, index: torch.Tensor, count: torch.Tensor,
                        bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` reading only the K blocks ``index``/``count`` list per output strip of W."""
    check_float_input("block_sparse_linear", x)
    n, k = weight.shape
    if x.shape[-1] != k:
        raise ValueError(f"x has {x.shape[-1]} features, the weight {k}")
    bias = checked_bias(bias, n, x.device)
    lead = x.shape[:-1]
    x2 = x.reshape(-1, k).contiguous()
    m = x2.shape[0]
    out = torch.empty((m, n), device=x.device, dtype=x.dtype)
    if m == 0 or n == 0:
        return out.reshape(*lead, n)
    bm, bn, bk, warps = tiles(m)
    if count.numel() != triton.cdiv(n, bn):
        raise ValueError(f"the block index has {count.numel()} strips; this weight needs {triton.cdiv(n, bn)}")
    w = weight.contiguous()
    grid = (triton.cdiv(m, bm), triton.cdiv(n, bn))
    _block_sparse_kernel[grid](x2, w, index, count, bias if bias is not None else w, out, m, n, k, index.shape[1],
                               x2.stride(0), w.stride(0), out.stride(0), HAS_BIAS=bias is not None, BLOCK_M=bm,
                               BLOCK_N=bn, BLOCK_K=bk, INTERPRET=interpreting(), IEEE=x.dtype == torch.float32,
                               num_warps=warps)
    return out.reshape(*lead, n)
