"""The fused forward with its rows read through TMA (Hopper's tensor memory accelerator): a study
variant, timed by the ``launch_tma`` profile (``launches.py``) beside the shipped kernel.

Why try it: the shipped forward reads each row with ordinary vector loads into registers, so the
bytes a program keeps in flight are bounded by its registers (the prefetched row). A TMA read is
issued by one thread into shared memory and completes on an mbarrier; the compiler's pipeliner keeps
``STAGES`` rows in flight per program at no register cost, the way a copy kernel keeps the memory
system busy. Each row is loaded as a (1, N) block; the compiler splits it into as many TMA boxes as
the hardware's box limits need. The GeLU and the statistics are the shipped kernel's.

GPU only (sm_90+): tensor descriptors need Hopper; rows must be whole blocks (``N`` a power of two),
which the study's shapes are.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.fused_layernorm_gelu.kernel import _gelu
from triton.tools.tensor_descriptor import TensorDescriptor


@triton.jit
def _fwd_tma_kernel(
    x_desc, y_desc, W, B, Y, STATS,
    M, N, stride_y, eps,
    BLOCK_N: tl.constexpr, APPROX_TANH: tl.constexpr, FAST: tl.constexpr,
    STAGES: tl.constexpr, TMA_STORE: tl.constexpr,
):
    """Persistent walk over rows; row ``r``'s read is issued ``STAGES - 1`` iterations ahead."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(W + cols).to(tl.float32)[None, :]
    b = tl.load(B + cols).to(tl.float32)[None, :]
    for row in tl.range(pid, M, step, num_stages=STAGES):
        x = x_desc.load([row, 0]).to(tl.float32)  # (1, BLOCK_N)
        mean = tl.sum(x, axis=1) / N
        xc = x - mean[:, None]
        rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        y = _gelu(xc * rstd[:, None] * w + b, APPROX_TANH, FAST).to(Y.dtype.element_ty)
        rows = row + tl.arange(0, 1)
        if TMA_STORE:
            y_desc.store([row, 0], y)
        else:
            tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y)
        tl.store(STATS + rows, mean)
        tl.store(STATS + M + rows, rstd)


def descriptors(x: torch.Tensor, y: torch.Tensor) -> tuple[TensorDescriptor, TensorDescriptor]:
    """One-row block descriptors of ``x`` and ``y`` (2-D, unit column stride, N a power of two)."""
    n = x.shape[1]
    if n & (n - 1):
        raise ValueError(f"the TMA study variant needs a power-of-two row length, got {n}")
    return TensorDescriptor.from_tensor(x, [1, n]), TensorDescriptor.from_tensor(y, [1, n])
