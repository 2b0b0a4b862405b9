"""Max-subtracted ("safe") softmax over the last dim in one Triton pass, forward and backward.

Why it is safe: softmax(x) == softmax(x - max(x)), and after the shift every exponent is <= 0, so
exp never overflows whatever the logits' magnitude; the naive exp(x) / sum(exp(x)) overflows to inf
(then inf/inf = NaN) once a logit passes ~11.1 in fp16 and ~88.7 in bf16/fp32.

Why one pass is fast: a row tile lives in registers, so the max, the exponentials, their sum and
the normalized output need one read of x and one write of y (the bandwidth floor). Backward is
dx = y * (dy - sum(y * dy)): one read of y and dy, one write of dx.

Edge cases, by construction: masked entries (-inf) give exactly 0; a constant row gives 1/N; a
fully masked row gives zeros (not NaN), as PyTorch's internal ``_safe_softmax`` does for attention;
a row with a NaN or +inf logit is all NaN, as in ``torch.softmax``.
Rows longer than ``SINGLE_PASS_MAX_COLS`` take a chunked two-pass path (an online max/sum, then the
write), which reads x twice but never overflows either.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.input_checks import check_float_input
from microscope_kernels.sm_count import sm_count

from microscope.api import interpreting

#: Longest row that one program keeps in registers (32 warps x 64 fp32 values per thread).
SINGLE_PASS_MAX_COLS = 65536
#: Column chunk of the multi-pass path for longer rows.
CHUNK_COLS = 8192

_LOG2E = tl.constexpr(math.log2(math.e))


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2^x; ``FAST`` (GPU) is a bare ex2.approx.ftz (results below 2^-126 flush to 0, which for
    softmax weights is far below any dtype's resolution next to the row maximum's weight of 1)."""
    if FAST:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.exp2(x)
    return y


@triton.jit
def _tile_ptrs(PTR, rows, cols, stride):
    return PTR + rows.to(tl.int64)[:, None] * stride + cols[None, :]


@triton.jit
def _tile_mask(rows, cols, M, N, EVEN_N: tl.constexpr):
    """In-bounds mask; with ``EVEN_N`` only the (broadcast) row test remains, so loads stay
    16-byte vectors."""
    if EVEN_N:
        mask = (rows < M)[:, None]
    else:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
    return mask


@triton.jit
def _softmax_fwd_kernel(
    X, Y, M, N, stride_x, stride_y, M_BUCKET,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr, FAST: tl.constexpr,
    PROGRAMS_PER_SM: tl.constexpr,
):
    """Walks row tiles with a stride of the grid size, loading the next tile before computing the
    current one. With one program per tile (``PROGRAMS_PER_SM = 0``) the loop runs once; with a
    persistent grid (``PROGRAMS_PER_SM`` programs per SM) the prefetch overlaps each tile's HBM
    read with the previous tile's reductions and store. ``M_BUCKET`` only keys the autotuner."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    rows = pid * BLOCK_M + tl.arange(0, BLOCK_M)
    x_next = tl.load(_tile_ptrs(X, rows, cols, stride_x), mask=_tile_mask(rows, cols, M, N, EVEN_N),
                     other=-float("inf"))
    for block in range(pid, tl.cdiv(M, BLOCK_M), step):
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        x = x_next.to(tl.float32)
        if PROGRAMS_PER_SM > 0:
            later = rows + step * BLOCK_M
            x_next = tl.load(_tile_ptrs(X, later, cols, stride_x), mask=_tile_mask(later, cols, M, N, EVEN_N),
                             other=-float("inf"))
        row_max = tl.max(x, axis=1)
        row_max = tl.where(row_max == -float("inf"), 0.0, row_max)  # fully masked row: all weights 0
        e = _exp2((x - row_max[:, None]) * _LOG2E, FAST)  # subtract first: exact near the max
        # total >= 1 (the max contributes 2^0) unless the row is fully masked (total = 0, e = 0); a NaN
        # total (a NaN or +inf logit) must stay NaN, as torch.softmax's row does, not be clamped to 1
        inv = 1.0 / tl.maximum(tl.sum(e, axis=1), 1.0, propagate_nan=tl.PropagateNan.ALL)
        tl.store(_tile_ptrs(Y, rows, cols, stride_y), (e * inv[:, None]).to(Y.dtype.element_ty),
                 mask=_tile_mask(rows, cols, M, N, EVEN_N))


@triton.jit
def _softmax_bwd_kernel(
    Y, DY, DX, M, N, stride_y, stride_dy, stride_dx,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
):
    rows = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    mask = _tile_mask(rows, cols, M, N, EVEN_N)
    y = tl.load(_tile_ptrs(Y, rows, cols, stride_y), mask=mask, other=0.0).to(tl.float32)
    dy = tl.load(_tile_ptrs(DY, rows, cols, stride_dy), mask=mask, other=0.0).to(tl.float32)
    dot = tl.sum(y * dy, axis=1)
    dx = y * (dy - dot[:, None])
    tl.store(_tile_ptrs(DX, rows, cols, stride_dx), dx.to(DX.dtype.element_ty), mask=mask)


@triton.jit
def _softmax_fwd_chunked_kernel(
    X, Y, N, stride_x, stride_y, CHUNK: tl.constexpr, FAST: tl.constexpr,
):
    """One row per program, any length: an online max/sum over chunks, then a second read to write.

    Each chunk's running sum is rescaled by 2^(old_max - new_max) <= 1 when the max grows, so no
    intermediate ever exceeds the chunk's element count.
    """
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CHUNK)
    run_max = tl.full((CHUNK,), -float("inf"), tl.float32)
    run_sum = tl.zeros((CHUNK,), tl.float32)
    for start in range(0, N, CHUNK):
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < N, other=-float("inf"))
        x = x.to(tl.float32)
        new_max = tl.maximum(run_max, x)
        safe_max = tl.where(new_max == -float("inf"), 0.0, new_max)
        run_sum = (run_sum * _exp2((run_max - safe_max) * _LOG2E, FAST)
                   + _exp2((x - safe_max) * _LOG2E, FAST))
        run_max = new_max
    row_max = tl.max(run_max, axis=0)
    row_max = tl.where(row_max == -float("inf"), 0.0, row_max)
    inv = 1.0 / tl.maximum(tl.sum(run_sum * _exp2((run_max - row_max) * _LOG2E, FAST), axis=0), 1.0,
                           propagate_nan=tl.PropagateNan.ALL)
    for start in range(0, N, CHUNK):
        x = tl.load(X + row * stride_x + start + cols, mask=start + cols < N, other=-float("inf"))
        y = _exp2((x.to(tl.float32) - row_max) * _LOG2E, FAST) * inv
        tl.store(Y + row * stride_y + start + cols, y.to(Y.dtype.element_ty), mask=start + cols < N)


@triton.jit
def _softmax_bwd_chunked_kernel(
    Y, DY, DX, N, stride_y, stride_dy, stride_dx, CHUNK: tl.constexpr,
):
    """One row per program, any length: sum(y * dy) over chunks, then dx = y * (dy - sum)."""
    row = tl.program_id(0).to(tl.int64)
    cols = tl.arange(0, CHUNK)
    acc = tl.zeros((CHUNK,), tl.float32)
    for start in range(0, N, CHUNK):
        ok = start + cols < N
        y = tl.load(Y + row * stride_y + start + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + start + cols, mask=ok, other=0.0).to(tl.float32)
        acc += y * dy
    dot = tl.sum(acc, axis=0)
    for start in range(0, N, CHUNK):
        ok = start + cols < N
        y = tl.load(Y + row * stride_y + start + cols, mask=ok, other=0.0).to(tl.float32)
        dy = tl.load(DY + row * stride_dy + start + cols, mask=ok, other=0.0).to(tl.float32)
        tl.store(DX + row * stride_dx + start + cols, (y * (dy - dot)).to(DX.dtype.element_ty), mask=ok)


# -- launch configuration --------------------------------------------------------------------------
def _tile_configs(programs_per_sm: tuple[int, ...] = ()) -> list[triton.Config]:
    """Tiles of 1..16 rows on 4..32 warps; for each of ``programs_per_sm`` too, if given."""
    extra = [{"PROGRAMS_PER_SM": p} for p in programs_per_sm] or [{}]
    return [triton.Config({"BLOCK_M": m, **e}, num_warps=w) for m in (1, 2, 4, 8, 16) for w in (4, 8, 16, 32)
            for e in extra]


def _prune_tiles(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """Keep tiles of 8..64 fp32 values per thread and at most 16K elements.

    Fewer values per thread leave too few bytes in flight per SM to cover HBM latency; more spill
    registers. Several rows per tile only where rows are short (a 1K-column row is 2 KB in bf16).
    """
    block_n = {**named_args, **kwargs}["BLOCK_N"]
    keep = [c for c in configs
            if 8 <= c.kwargs["BLOCK_M"] * block_n // (32 * c.num_warps) <= 64
            and c.kwargs["BLOCK_M"] * block_n <= max(block_n, 16384)]
    return keep or [c for c in configs if c.kwargs["BLOCK_M"] == 1 and c.num_warps == 32]


#: Forward: one program per tile (0) or a persistent grid of 1, 2 or 4 programs per SM; which wins
#: depends on the row count too (waves of short rows vs a long tail of few long rows), hence M_BUCKET.
_fwd_tuned = triton.autotune(configs=_tile_configs(programs_per_sm=(0, 1, 2, 4)), key=["N", "M_BUCKET", "EVEN_N"],
                             prune_configs_by={"early_config_prune": _prune_tiles}, do_bench=bench_candidate)(
    _softmax_fwd_kernel)
_bwd_tuned = triton.autotune(configs=_tile_configs(), key=["N", "BLOCK_N", "EVEN_N"],
                             prune_configs_by={"early_config_prune": _prune_tiles}, do_bench=bench_candidate)(
    _softmax_bwd_kernel)


def compile_jobs(m: int, n: int, dtype: torch.dtype, backward: bool,
                 device: str = "cuda") -> list[tuple[triton.runtime.Autotuner, tuple, dict, triton.Config]]:
    """Every autotuning candidate ``safe_softmax`` times for an (m, n) input of ``dtype`` (and its backward's):
    (tuner, arguments, constants, config), in a fixed order. The integer arguments are the call's own
    (Triton specializes them on being 1 or a multiple of 16); the tensors only carry their dtype."""
    if n > SINGLE_PASS_MAX_COLS or m == 0 or n == 0:
        return []  # the chunked path: one kernel, compiled on first use
    x = torch.empty((1, n), device=device, dtype=dtype)
    block_n = triton.next_power_of_2(n)
    consts = {"BLOCK_N": block_n, "EVEN_N": n == block_n}
    kernels = [(_fwd_tuned, (x, x, m, n, n, n, m.bit_length()), {**consts, "FAST": True})]
    if backward:
        kernels.append((_bwd_tuned, (x, x, x, m, n, n, n, n), consts))
    return [(tuner, args, flags, cfg) for tuner, args, flags in kernels
            for cfg in _prune_tiles(tuner.configs, {}, **flags)]


def precompile(m: int, n: int, dtype: torch.dtype, backward: bool, shard: tuple[int, int] = (0, 1)) -> None:
    """Compile, without launching, shard ``shard[0]`` of ``shard[1]`` of ``compile_jobs`` (candidate ``i``
    where ``i % shard[1] == shard[0]``): a run's precompile processes compile them side by side, where the
    first call compiled them one by one (110 kernels, 20 s of the H200 bench profile's 44.5 s runner)."""
    if interpreting():
        return
    index, count = shard
    for tuner, args, consts, cfg in compile_jobs(m, n, dtype, backward)[index::count]:
        tuner.fn.warmup(*args, grid=(1,), **consts, **cfg.all_kwargs())


def tuned_forward_configs() -> dict[tuple, str]:
    """The forward's autotuned choice per key (N, M_BUCKET, EVEN_N, dtypes...), for bench reports."""
    return {key: str(config) for key, config in _fwd_tuned.cache.items()}


def _on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and not interpreting()


def _interpreter_block_m(block_n: int) -> int:
    """Under the interpreter every program is a Python round trip: stack rows into ~8K tiles."""
    return max(1, 8192 // block_n)


def _output_buffer(like: torch.Tensor) -> torch.Tensor:
    """Where the kernel writes its result. The CPU interpreter converts fp32 to bf16 by truncation
    (round-toward-zero, about 2x the error of the GPU's round-to-nearest), so under it bf16 results
    are written in fp32 and rounded by torch; ``_finish`` casts back."""
    if interpreting() and like.dtype == torch.bfloat16:
        return torch.empty(like.shape, device=like.device, dtype=torch.float32)
    return torch.empty_like(like)


def _finish(out: torch.Tensor, dtype: torch.dtype, shape: torch.Size) -> torch.Tensor:
    return out.to(dtype).view(shape)


def _rows(t: torch.Tensor) -> torch.Tensor:
    t2 = t.reshape(math.prod(t.shape[:-1]), t.shape[-1])  # not -1: rows of no columns are a shape too
    return t2 if t2.stride(-1) == 1 else t2.contiguous()


# -- launchers ------------------------------------------------------------------------------------
def softmax_forward(x: torch.Tensor, max_single_pass_cols: int = SINGLE_PASS_MAX_COLS) -> torch.Tensor:
    """Launch the forward over the last dim; ``max_single_pass_cols`` (tests) forces the chunked path."""
    check_float_input("safe_softmax", x)
    x2 = _rows(x)
    m, n = x2.shape
    y = _output_buffer(x2)
    if m == 0 or n == 0:
        return _finish(y, x.dtype, x.shape)
    if n > max_single_pass_cols:
        chunk = min(CHUNK_COLS, triton.next_power_of_2(max_single_pass_cols))
        _softmax_fwd_chunked_kernel[(m,)](x2, y, n, x2.stride(0), y.stride(0), CHUNK=chunk,
                                          FAST=_on_gpu(x), num_warps=8)
        return _finish(y, x.dtype, x.shape)
    block_n = triton.next_power_of_2(n)
    args = (x2, y, m, n, x2.stride(0), y.stride(0), m.bit_length())
    if _on_gpu(x):
        sms = sm_count(x.device)

        def grid(meta: dict) -> tuple[int]:
            tiles = triton.cdiv(m, meta["BLOCK_M"])
            per_sm = meta["PROGRAMS_PER_SM"]
            return (min(tiles, sms * per_sm) if per_sm else tiles,)

        _fwd_tuned[grid](*args, BLOCK_N=block_n, EVEN_N=n == block_n, FAST=True)
    else:
        block_m = _interpreter_block_m(block_n)
        # a persistent grid of 2 programs: the interpreter walks the prefetching loop too
        _softmax_fwd_kernel[(min(2, triton.cdiv(m, block_m)),)](
            *args, BLOCK_M=block_m, BLOCK_N=block_n, EVEN_N=n == block_n, FAST=False, PROGRAMS_PER_SM=1,
            num_warps=4)
    return _finish(y, x.dtype, x.shape)


def softmax_backward(y: torch.Tensor, dy: torch.Tensor,
                     max_single_pass_cols: int = SINGLE_PASS_MAX_COLS) -> torch.Tensor:
    """dx = y * (dy - sum(y * dy)) over the last dim."""
    if dy.shape != y.shape:
        raise ValueError(f"dy must have y's shape {tuple(y.shape)}, got {tuple(dy.shape)}")
    y2, dy2 = _rows(y), _rows(dy)
    m, n = y2.shape
    dx = _output_buffer(y2)
    if m == 0 or n == 0:
        return _finish(dx, y.dtype, y.shape)
    if n > max_single_pass_cols:
        chunk = min(CHUNK_COLS, triton.next_power_of_2(max_single_pass_cols))
        _softmax_bwd_chunked_kernel[(m,)](y2, dy2, dx, n, y2.stride(0), dy2.stride(0), dx.stride(0),
                                          CHUNK=chunk, num_warps=8)
        return _finish(dx, y.dtype, y.shape)
    block_n = triton.next_power_of_2(n)
    args = (y2, dy2, dx, m, n, y2.stride(0), dy2.stride(0), dx.stride(0))
    if _on_gpu(y):
        grid = lambda meta: (triton.cdiv(m, meta["BLOCK_M"]),)  # noqa: E731
        _bwd_tuned[grid](*args, BLOCK_N=block_n, EVEN_N=n == block_n)
    else:
        block_m = _interpreter_block_m(block_n)
        _softmax_bwd_kernel[(triton.cdiv(m, block_m),)](
            *args, BLOCK_M=block_m, BLOCK_N=block_n, EVEN_N=n == block_n, num_warps=4)
    return _finish(dx, y.dtype, y.shape)


class _SafeSoftmax(torch.autograd.Function):
    """Saves only the output: the backward needs y, not x."""

    @staticmethod
    def forward(ctx, x, max_single_pass_cols):  # type: ignore[override]
        y = softmax_forward(x, max_single_pass_cols)
        ctx.save_for_backward(y)
        ctx.max_single_pass_cols = max_single_pass_cols
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        (y,) = ctx.saved_tensors
        return softmax_backward(y, dy, ctx.max_single_pass_cols), None


def safe_softmax(x: torch.Tensor, max_single_pass_cols: int = SINGLE_PASS_MAX_COLS) -> torch.Tensor:
    """Softmax over the last dim, overflow-free for any logits, in one Triton pass.

    ``max_single_pass_cols`` is the row length above which the chunked two-pass path is used; it
    only exists so that tests can exercise that path on small rows.
    """
    if torch.is_grad_enabled() and x.requires_grad:
        return _SafeSoftmax.apply(x, max_single_pass_cols)
    return softmax_forward(x, max_single_pass_cols)
