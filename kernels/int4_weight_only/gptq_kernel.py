"""One GPTQ block in a Triton kernel: the column-by-column loop of ``reference.gptq_block`` in one launch.

Why: GPTQ's columns are sequential, but its rows are independent. Run as PyTorch operations, each column
costs about a dozen kernel launches, for every column of every weight and again for every input set a
benchmark draws (building inputs took up to 35 s of the int4 bench's 57 s worker on the H200); here each
program keeps a tile of rows of the block in registers and walks the block's columns itself. Every operation
is the reference's, IEEE-rounded and in the same order (divisions ``div_rn``, no fused multiply-adds), so
the result is the reference's bit for bit.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

#: Rows per program (a 32 x 128 float32 tile: 32 registers a thread at 4 warps).
BLOCK_ROWS = 32


@triton.jit
def _gptq_block_kernel(W, U, Q, S, Z, E, N, WIDTH, GROUPS, b0, stride_w, stride_ur, stride_uc, stride_q,
                       stride_e, GROUP: tl.constexpr, BLOCK_N: tl.constexpr, BLOCK: tl.constexpr):
    """Columns ``b0 .. b0 + WIDTH`` of W for BLOCK_N rows: per group its scale and zero point (from its
    columns as updated so far), per column the 4-bit value, the error over U's diagonal, and that error
    spread over the block's later columns."""
    rows = tl.program_id(0) * BLOCK_N + tl.arange(0, BLOCK_N)
    cols = tl.arange(0, BLOCK)
    in_rows = rows < N
    tile = tl.load(W + rows[:, None] * stride_w + cols[None, :], mask=in_rows[:, None] & (cols[None, :] < WIDTH),
                   other=0.0)
    scale = tl.zeros((BLOCK_N,), dtype=tl.float32)
    zero = tl.zeros((BLOCK_N,), dtype=tl.float32)
    for j in range(0, WIDTH):
        if j % GROUP == 0:  # group_params over the group's columns
            group = (cols[None, :] >= j) & (cols[None, :] < j + GROUP)
            lo = tl.minimum(tl.min(tl.where(group, tile, float("inf")), axis=1), 0.0)
            hi = tl.maximum(tl.max(tl.where(group, tile, float("-inf")), axis=1), 0.0)
            scale = tl.div_rn(hi - lo, tl.full((BLOCK_N,), 15.0, tl.float32))
            scale = tl.where(scale > 0, scale, 1.0)
            zero = tl.minimum(tl.maximum(tl.floor(tl.div_rn(-lo, scale) + 0.5), 0.0), 15.0)
            g = (b0 + j) // GROUP
            tl.store(S + rows * GROUPS + g, scale, mask=in_rows)
            tl.store(Z + rows * GROUPS + g, zero, mask=in_rows)
        column = tl.sum(tl.where(cols[None, :] == j, tile, 0.0), axis=1)
        q = tl.minimum(tl.maximum(tl.floor(tl.div_rn(column, scale) + 0.5) + zero, 0.0), 15.0)
        tl.store(Q + rows * stride_q + j, q, mask=in_rows)
        diagonal = tl.load(U + j * (stride_ur + stride_uc))
        error = tl.div_rn(column - (q - zero) * scale, tl.full((BLOCK_N,), 1.0, tl.float32) * diagonal)
        tl.store(E + rows * stride_e + j, error, mask=in_rows)
        later = tl.load(U + j * stride_ur + cols * stride_uc, mask=(cols > j) & (cols < WIDTH), other=0.0)
        tile = tile - error[:, None] * later[None, :]


def gptq_block(wb: torch.Tensor, ub: torch.Tensor, q: torch.Tensor, scales: torch.Tensor, zeros: torch.Tensor,
               errors: torch.Tensor, b0: int, group: int) -> None:
    """``reference.gptq_block`` in one launch: fills ``q`` (n, width), the groups' ``scales`` and ``zeros``
    (n, groups) and ``errors`` (n, width); ``wb`` (n, width, row stride free) is read, not updated; ``ub``
    may be in either memory order (a Cholesky factor often comes column-major)."""
    n, width = wb.shape
    if n == 0 or width == 0:
        return
    if {wb.stride(1), q.stride(1), errors.stride(1)} != {1}:
        raise ValueError("gptq_block: wb, q and errors need contiguous rows (column stride 1)")
    block = triton.next_power_of_2(width)
    _gptq_block_kernel[(triton.cdiv(n, BLOCK_ROWS),)](
        wb, ub, q, scales, zeros, errors, n, width, scales.shape[1], b0, wb.stride(0), ub.stride(0), ub.stride(1),
        q.stride(0), errors.stride(0), GROUP=group, BLOCK_N=BLOCK_ROWS, BLOCK=block, num_warps=4,
        enable_fp_fusion=False)
