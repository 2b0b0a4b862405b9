"""LayerNorm + GeLU in one Triton pass, forward and backward.

Why fuse: eager ``F.gelu(F.layer_norm(x))`` reads ``x``, writes the normalized tensor, reads it back
and writes the activation: four trips through HBM for an operation that needs two (read ``x``, write
``y``). Both ops are bandwidth-bound, so the fused kernel's ceiling is ~2x eager. The backward needs
``x``, ``dy`` and writes ``dx`` (three trips) if it recomputes the normalized value and the GeLU input
from the two per-row statistics saved by the forward, instead of saving the activations.

Layout of the work:

* both directions walk tiles of ``BLOCK_M`` whole rows (``BLOCK_N >= N``) with a stride of the grid
  size. The backward runs a persistent grid of exactly one wave (sized from the compiled kernel's
  register use) and prefetches the next tile while it computes the current one. The forward times
  three plans once per shape class: one program per tile, that persistent walk, or a persistent walk
  whose loads the compiler pipelines through shared memory (``ForwardPlan``).
* forward: statistics in fp32 with a centered (two-pass over registers) variance, so large offsets
  do not cancel; GeLU with folded constants (and approximate ex2/rcp on the GPU) so the kernel stays
  bandwidth-bound rather than instruction-bound.
* backward: each program keeps its share of ``dweight``/``dbias`` in fp32 registers and writes one
  partial row; a second small kernel sums the partials in a fixed order. No atomics, so gradients
  are bitwise reproducible.

All arithmetic happens in fp32 after the load (``.to(tl.float32)``), which is also what keeps the
kernels correct under the Triton CPU interpreter, whose bf16 arithmetic is unreliable.
"""

from __future__ import annotations

import functools
import logging
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.language as tl
import triton.testing
from microscope_kernels.direct_launch import DirectLauncher, cdiv, next_power_of_2
from microscope_kernels.input_checks import check_float_input

from microscope.api import interpreting

#: Rows longer than this would not fit one program's registers (the tile holds the whole row).
MAX_COLS = 65536
#: The forward plan each shape class keeps, with every plan's time (a worker's log shows it).
_LOG = logging.getLogger(__name__)

# GeLU, tanh form: gelu(y) = y * sigmoid(2u) with u = sqrt(2/pi) * (y + 0.044715 y^3), because
# 0.5 * (1 + tanh(u)) == sigmoid(2u). With exp2 the whole exponent is y * (A + B * y^2):
_TANH_C0 = math.sqrt(2.0 / math.pi)
_TANH_C1 = 0.044715
_EXP2_A = tl.constexpr(-2.0 * math.log2(math.e) * _TANH_C0)
_EXP2_B = tl.constexpr(-2.0 * math.log2(math.e) * _TANH_C0 * _TANH_C1)
_DU_A = tl.constexpr(_TANH_C0)  # du/dy = A' + B' * y^2
_DU_B = tl.constexpr(3.0 * _TANH_C0 * _TANH_C1)
_INV_SQRT2 = tl.constexpr(1.0 / math.sqrt(2.0))
_INV_SQRT_2PI = tl.constexpr(1.0 / math.sqrt(2.0 * math.pi))

APPROXIMATIONS = ("tanh", "none")


@triton.jit
def _exp2(x, FAST: tl.constexpr):
    """2^x. ``FAST`` (GPU only) skips the denormal fix-up code of the default lowering: a result
    below 2^-126 flushes to 0, which changes nothing here since it is only ever added to 1."""
    if FAST:
        y = tl.inline_asm_elementwise("ex2.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = tl.exp2(x)
    return y


@triton.jit
def _reciprocal(x, FAST: tl.constexpr):
    """1/x; ``FAST`` (GPU only) is one MUFU.RCP (1 ulp) instead of the IEEE-range division code."""
    if FAST:
        y = tl.inline_asm_elementwise("rcp.approx.ftz.f32 $0, $1;", "=r,r", [x], dtype=tl.float32,
                                      is_pure=True, pack=1)
    else:
        y = 1.0 / x
    return y


@triton.jit
def _gelu(y, APPROX_TANH: tl.constexpr, FAST: tl.constexpr):
    """GeLU of an fp32 tile; overflow-free for any finite ``y`` (2^big -> inf, 1/inf = 0).

    The op is bandwidth-bound only while its instruction count per element stays small (at
    ~29 instructions per element a 4-warp kernel is issue-bound on H200), hence the folded constants.
    Tensors stay on the left of every product with a module constant: the interpreter mishandles
    ``constexpr * tensor``.
    """
    if APPROX_TANH:
        out = y * _reciprocal(1.0 + _exp2(y * (y * y * _EXP2_B + _EXP2_A), FAST), FAST)
    else:
        out = y * 0.5 * (1.0 + tl.math.erf(y * _INV_SQRT2))
    return out


@triton.jit
def _gelu_grad(y, APPROX_TANH: tl.constexpr, FAST: tl.constexpr):
    """d gelu(y) / dy of an fp32 tile: s + 2 y s (1 - s) du/dy for the tanh form, s = sigmoid(2u)."""
    if APPROX_TANH:
        y2 = y * y
        s = _reciprocal(1.0 + _exp2(y * (y2 * _EXP2_B + _EXP2_A), FAST), FAST)
        ys = y * s
        grad = (ys - ys * s) * (y2 * (2.0 * _DU_B) + 2.0 * _DU_A) + s  # three FMAs after y*s
    else:
        grad = 0.5 * (1.0 + tl.math.erf(y * _INV_SQRT2)) + y * tl.exp(y * y * -0.5) * _INV_SQRT_2PI
    return grad


@triton.jit
def _row_tile(PTR, block, stride, M, N, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
              POLICY: tl.constexpr):
    """Load rows [block*BLOCK_M, +BLOCK_M) as stored (no upcast yet: a prefetched tile stays packed)."""
    rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = tl.arange(0, BLOCK_N)
    return tl.load(PTR + rows.to(tl.int64)[:, None] * stride + cols[None, :],
                   mask=_tile_mask(rows, cols, M, N, EVEN_N), other=0.0, eviction_policy=POLICY)


@triton.jit
def _tile_mask(rows, cols, M, N, EVEN_N: tl.constexpr):
    """In-bounds mask of a (rows x cols) tile; with ``EVEN_N`` the column test is compiled out, so
    the loads stay 16-byte vectors with one predicate per row."""
    if EVEN_N:
        mask = (rows < M)[:, None]  # broadcast along the row by load/store
    else:
        mask = (rows < M)[:, None] & (cols < N)[None, :]
    return mask


@triton.jit
def _fwd_kernel(
    X, W, B, Y, STATS,
    M, N, stride_x, stride_y, eps,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
    APPROX_TANH: tl.constexpr, FAST: tl.constexpr,
    PREFETCH: tl.constexpr, STAGES: tl.constexpr, POLICY: tl.constexpr, STORE_CACHE: tl.constexpr,
):
    """Each program keeps weight/bias in fp32 registers and walks row tiles with a stride of the
    grid size. How the next tile's HBM read overlaps this one's math is a launch choice
    (``forward_plans``): with one program per tile the loop runs once and other programs cover the
    latency; on a persistent grid either ``PREFETCH`` loads the next tile(s) into registers before
    computing the current one, or ``STAGES`` > 1 lets the compiler pipeline the loads through shared
    memory that many tiles deep.

    Every call writes each row's mean and rstd to ``STATS`` (rows ``[0, M)`` and ``[M, 2M)``), which
    the backward reads: 8 bytes a row beside the row's own 2*N*s. Inference calls write them too,
    so that inference and training run one compiled kernel and return the same bits (with the
    stores compiled out, the inference kernel's output differed in the last bit on the H200)."""
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    b = tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    if PREFETCH >= 1:
        x_next = _row_tile(X, pid, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, POLICY)
    if PREFETCH == 2:
        x_next2 = _row_tile(X, pid + step, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, POLICY)
    for block in tl.range(pid, tl.cdiv(M, BLOCK_M), step, num_stages=STAGES):
        if PREFETCH == 2:
            x = x_next.to(tl.float32)
            x_next = x_next2
            x_next2 = _row_tile(X, block + 2 * step, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, POLICY)
        elif PREFETCH == 1:
            x = x_next.to(tl.float32)
            x_next = _row_tile(X, block + step, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, POLICY)
        else:
            x = _row_tile(X, block, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, POLICY).to(tl.float32)
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        mean = tl.sum(x, axis=1) / N
        xc = x - mean[:, None]
        if not EVEN_N:
            xc = tl.where((cols < N)[None, :], xc, 0.0)
        rstd = tl.math.rsqrt(tl.sum(xc * xc, axis=1) / N + eps)
        y = _gelu(xc * rstd[:, None] * w + b, APPROX_TANH, FAST)
        tl.store(Y + rows.to(tl.int64)[:, None] * stride_y + cols[None, :], y.to(Y.dtype.element_ty),
                 mask=_tile_mask(rows, cols, M, N, EVEN_N), cache_modifier=STORE_CACHE)
        tl.store(STATS + rows, mean, mask=rows < M)
        tl.store(STATS + M + rows, rstd, mask=rows < M)


@triton.jit
def _bwd_kernel(
    X, W, B, DY, DX, MEAN, RSTD, DW_PART, DB_PART,
    M, N, stride_x, stride_dy, stride_dx,
    BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, EVEN_N: tl.constexpr,
    APPROX_TANH: tl.constexpr, FAST: tl.constexpr,
):
    """dx per row, and this program's partial sums of dweight/dbias (one row of DW_PART/DB_PART).

    With z = xhat * w + b and g = dy * gelu'(z):  dbias += g, dweight += g * xhat, and
    dx = rstd * (g*w - xhat * mean(g*w*xhat) - mean(g*w)).
    """
    pid = tl.program_id(0)
    step = tl.num_programs(0)
    cols = tl.arange(0, BLOCK_N)
    w = tl.load(W + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    b = tl.load(B + cols, mask=cols < N, other=0.0).to(tl.float32)[None, :]
    dw_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    db_acc = tl.zeros((BLOCK_M, BLOCK_N), dtype=tl.float32)
    x_next = _row_tile(X, pid, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, "")
    dy_next = _row_tile(DY, pid, stride_dy, M, N, BLOCK_M, BLOCK_N, EVEN_N, "")
    for block in range(pid, tl.cdiv(M, BLOCK_M), step):
        x = x_next.to(tl.float32)
        dy = dy_next.to(tl.float32)
        x_next = _row_tile(X, block + step, stride_x, M, N, BLOCK_M, BLOCK_N, EVEN_N, "")
        dy_next = _row_tile(DY, block + step, stride_dy, M, N, BLOCK_M, BLOCK_N, EVEN_N, "")
        rows = block * BLOCK_M + tl.arange(0, BLOCK_M)
        row_ok = rows < M
        mean = tl.load(MEAN + rows, mask=row_ok, other=0.0)[:, None]
        rstd = tl.load(RSTD + rows, mask=row_ok, other=0.0)[:, None]
        xhat = (x - mean) * rstd  # centered first: x*rstd - mean*rstd would cancel for large offsets
        if not EVEN_N:
            xhat = tl.where((cols < N)[None, :], xhat, 0.0)
        g = dy * _gelu_grad(xhat * w + b, APPROX_TANH, FAST)
        dw_acc += g * xhat
        db_acc += g
        gw = g * w
        c1 = (tl.sum(gw * xhat, axis=1) / N)[:, None]
        c2 = (tl.sum(gw, axis=1) / N)[:, None]
        dx = gw * rstd - (xhat * (c1 * rstd) + c2 * rstd)  # two FMAs per element
        tl.store(DX + rows.to(tl.int64)[:, None] * stride_dx + cols[None, :], dx.to(DX.dtype.element_ty),
                 mask=_tile_mask(rows, cols, M, N, EVEN_N))
    tl.store(DW_PART + pid * N + cols, tl.sum(dw_acc, axis=0), mask=cols < N)
    tl.store(DB_PART + pid * N + cols, tl.sum(db_acc, axis=0), mask=cols < N)


@triton.jit
def _sum_partials_kernel(
    DW_PART, DB_PART, DW, DB, P, N,
    BLOCK_P: tl.constexpr, BLOCK_C: tl.constexpr,
):
    """Column sums of the (P, N) partial buffers in a fixed order: the deterministic reduction."""
    cols = tl.program_id(0) * BLOCK_C + tl.arange(0, BLOCK_C)
    col_ok = cols < N
    dw = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    db = tl.zeros((BLOCK_P, BLOCK_C), dtype=tl.float32)
    for p0 in range(0, P, BLOCK_P):
        parts = p0 + tl.arange(0, BLOCK_P)
        mask = (parts < P)[:, None] & col_ok[None, :]
        offs = parts[:, None] * N + cols[None, :]
        dw += tl.load(DW_PART + offs, mask=mask, other=0.0)
        db += tl.load(DB_PART + offs, mask=mask, other=0.0)
    tl.store(DW + cols, tl.sum(dw, axis=0).to(DW.dtype.element_ty), mask=col_ok)
    tl.store(DB + cols, tl.sum(db, axis=0).to(DB.dtype.element_ty), mask=col_ok)


# -- launch configuration --------------------------------------------------------------------------
def _tile_shape(block_n: int) -> tuple[int, int]:
    """(BLOCK_M, num_warps) for rows padded to ``block_n``, from first principles.

    * ~16 fp32 values per thread per live tile: the backward keeps x, dy, two gradient accumulators
      and temporaries live at once, and 16 keeps it under ~128 registers (H200: 4+ resident 8-warp
      programs). So 4096 -> 8 warps, 8192 -> 16 warps, up to the 32-warp cap (64K -> 64 per thread).
    * Rows shorter than 2048 are stacked (BLOCK_M rows per tile) so each tile still moves >= 4 KB.
    """
    block_m = max(1, 2048 // block_n)
    warps = max(4, min(32, block_m * block_n // 512))
    return block_m, warps


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def _resident_programs(compiled: triton.compiler.CompiledKernel, num_warps: int, device_index: int) -> int:
    """Programs of ``compiled`` one SM holds at once, from its real register and shared-memory use.

    The persistent grids are exactly one wave of these: no program waits for a second wave, and a
    partial second wave (up to 25% lost on a 1.5-wave grid) cannot happen.
    """
    props = torch.cuda.get_device_properties(device_index)
    regs_per_sm = getattr(props, "regs_per_multiprocessor", 65536)
    threads_per_sm = getattr(props, "max_threads_per_multi_processor", 2048)
    smem_per_sm = getattr(props, "shared_memory_per_multiprocessor", 228 * 1024)
    threads = 32 * num_warps
    compiled._init_handles()
    regs_per_warp = -(-max(1, compiled.n_regs) * 32 // 256) * 256  # allocated per warp, 256 at a time
    by_regs = regs_per_sm // (regs_per_warp * num_warps)
    by_smem = smem_per_sm // max(1, compiled.metadata.shared)
    return max(1, min(by_regs, by_smem, threads_per_sm // threads))


_PROGRAMS_PER_SM: dict[tuple, int] = {}


def _persistent_grid(kernel: triton.JITFunction, args: tuple, consts: dict, row_blocks: int,
                     warps: int, device: torch.device) -> int:
    """Programs of a one-wave persistent grid for ``kernel`` (GPU), or 4 (interpreter).

    The occupancy comes from compiling the kernel once (``warmup``) and is cached per
    specialization, so later calls pay nothing. The backward needs the grid size before launching,
    to size its partial-sum buffers.
    """
    if not _on_gpu_device(device):
        return max(1, min(4, row_blocks))
    index = device.index if device.index is not None else torch.cuda.current_device()
    key = (kernel.fn.__name__, tuple(sorted(consts.items())), warps, index, args[0].dtype)
    if key not in _PROGRAMS_PER_SM:
        compiled = kernel.warmup(*args, **consts, num_warps=warps, grid=(1,))
        _PROGRAMS_PER_SM[key] = _resident_programs(compiled, warps, index)
    return max(1, min(_sm_count(index) * _PROGRAMS_PER_SM[key], row_blocks))


@dataclass(frozen=True)
class ForwardPlan:
    """One way to launch the forward: warps per program, and how a tile's HBM read is overlapped.

    ``persistent=False`` is one program per tile (other resident programs hide the latency);
    ``persistent=True`` is one wave of programs walking tiles, overlapping by a register ``prefetch``
    of the next tile (or the next two) or by the compiler's shared-memory pipeline of ``stages``
    tiles. ``stream_hints`` marks the loads ``evict_first`` and the stores ``.cs`` (streaming).
    Prefetching two tiles and the hints lost on the H200 (the launch studies, README) and are
    not among the tuned plans; they stay launchable so the study can be re-run
    (``--profile bench,launch,launch_registers``).
    """

    warps: int
    persistent: bool
    prefetch: int = 0
    stages: int = 1
    stream_hints: bool = False

    def consts(self) -> dict:
        return {"PREFETCH": self.prefetch, "STAGES": self.stages,
                "POLICY": "evict_first" if self.stream_hints else "",
                "STORE_CACHE": ".cs" if self.stream_hints else ""}

    def __str__(self) -> str:
        ahead = "register prefetch" if self.prefetch == 1 else f"register prefetch of {self.prefetch} tiles"
        how = (ahead if self.prefetch else f"{self.stages}-stage pipeline") if self.persistent \
            else "one program per tile"
        hints = ", streaming hints" if self.stream_hints else ""
        return f"{self.warps} warps, {'persistent, ' if self.persistent else ''}{how}{hints}"


@functools.cache
def forward_plans(n: int) -> tuple[ForwardPlan, ...]:
    """The candidates the GPU forward is timed over for rows of ``n`` elements: warp counts that
    keep 8..64 fp32 values per thread of the tile, each with the three ways of overlapping loads.
    Which wins depends on the row length and on the row count (a 16K-row tensor is ~1 wave's
    ramp-up and tail, a 64K-row one is not), which is why the choice is measured per shape class
    rather than derived."""
    block_n = triton.next_power_of_2(n)
    tile = _tile_shape(block_n)[0] * block_n
    warps = [w for w in (4, 8, 16, 32) if 8 <= tile // (32 * w) <= 64] or [_tile_shape(block_n)[1]]
    return tuple(plan for w in warps for plan in (ForwardPlan(w, persistent=False),
                                                  ForwardPlan(w, persistent=True, prefetch=1),
                                                  ForwardPlan(w, persistent=True, stages=3)))


#: The interpreter's plan: persistent with the register prefetch, so CPU runs walk the loop too.
INTERPRETER_PLAN = ForwardPlan(4, persistent=True, prefetch=1)

_FWD_PLANS: dict[tuple, ForwardPlan] = {}


def _tuned_plan(key: tuple, plans: Sequence[ForwardPlan], launch: Callable[[ForwardPlan], None]) -> ForwardPlan:
    """The fastest of ``plans`` under ``triton.testing.do_bench``, measured once per shape class on
    the GPU and cached. The forward is pure, so re-running it while timing is harmless.

    The key leaves out whether the call returns statistics: an inference call and a training call
    of one shape must run the same plan, because plans differ in warps, hence possibly in reduction
    order, and the inference output must be the training output's bits."""
    if key not in _FWD_PLANS:
        if len(plans) == 1:
            _FWD_PLANS[key] = plans[0]
        else:
            times = {plan: triton.testing.do_bench(functools.partial(launch, plan), warmup=10, rep=40)
                     for plan in plans}
            _FWD_PLANS[key] = min(times, key=times.get)
            timed = ", ".join(f"{plan} {ms * 1000:.1f} us" for plan, ms in times.items())
            _LOG.info(f"fused_layernorm_gelu forward {key}: plan {_FWD_PLANS[key]} ({timed})")
    return _FWD_PLANS[key]


def tuned_forward_plans() -> dict[tuple, str]:
    """The forward's measured choice per shape class (cols, row-count bucket, dtype, ...), for benches."""
    return {key: str(plan) for key, plan in _FWD_PLANS.items()}


# -- launchers ------------------------------------------------------------------------------------
#: After the first call per specialization these skip Triton's per-call dispatch, one part of the
#: host time per call: a whole inference call cost 83-98 us of host time on the H200 machines
#: (eager: 19-24 us), about the 16384x4096 forward's ~76 us on the GPU (README, "Host time").
_LAUNCH_FWD = DirectLauncher(_fwd_kernel)
_LAUNCH_BWD = DirectLauncher(_bwd_kernel)
_LAUNCH_SUM = DirectLauncher(_sum_partials_kernel)


def _result(like: torch.Tensor) -> torch.Tensor:
    """Where a kernel writes a result. The CPU interpreter converts fp32 to bf16 by truncation
    (about 2x the error of the GPU's round-to-nearest), so under it bf16 results are written in fp32
    and rounded by torch afterwards (``.to(dtype)``, a no-op otherwise)."""
    if interpreting() and like.dtype == torch.bfloat16:
        return torch.empty(like.shape, device=like.device, dtype=torch.float32)
    return torch.empty_like(like)


def _as_rows(x: torch.Tensor) -> torch.Tensor:
    """``x`` as (rows, cols) with unit column stride; a 2-D input that already is one is returned as
    is (each torch call costs ~10 us of host time on the H200 machine, see ``_LAUNCH_FWD``)."""
    if x.dim() == 2 and x.stride(1) == 1:
        return x
    x2 = x.reshape(-1, x.shape[-1])
    return x2 if x2.stride(-1) == 1 else x2.contiguous()


def _as_input(result: torch.Tensor, like: torch.Tensor) -> torch.Tensor:
    """``result`` in ``like``'s dtype and shape, without a torch call where it already is."""
    if result.dtype != like.dtype:
        result = result.to(like.dtype)
    return result if result.shape == like.shape else result.view(like.shape)


def _check(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str) -> None:
    check_float_input("layernorm_gelu", x)
    if approximate not in APPROXIMATIONS:
        raise ValueError(f"approximate must be one of {APPROXIMATIONS}, got {approximate!r}")
    n = x.shape[-1]
    if n > MAX_COLS:
        raise ValueError(f"rows of {n} elements exceed the one-row-per-program limit of {MAX_COLS}")
    if weight.shape != (n,) or bias.shape != (n,):
        raise ValueError(f"weight and bias must have shape ({n},), got "
                         f"{tuple(weight.shape)}, {tuple(bias.shape)}")
    if weight.device != x.device or bias.device != x.device:
        raise ValueError(f"weight and bias must be on the input's device {x.device}, got {weight.device}, "
                         f"{bias.device}")


def _consts(n: int, approximate: str, device: torch.device) -> dict:
    """Compile-time flags shared by both kernels; under the interpreter rows are stacked into
    large tiles (each program costs a Python round trip there) and the inline-PTX math is off.
    The dict is cached and shared: callers copy it before adding to it."""
    return _consts_for(n, approximate, _on_gpu_device(device))


@functools.cache
def _consts_for(n: int, approximate: str, on_gpu: bool) -> dict:
    block_n = triton.next_power_of_2(n)
    block_m = _tile_shape(block_n)[0] if on_gpu else max(1, 8192 // block_n)
    return {"BLOCK_M": block_m, "BLOCK_N": block_n, "EVEN_N": n == block_n,
            "APPROX_TANH": approximate == "tanh", "FAST": on_gpu}


def _on_gpu_device(device: torch.device) -> bool:
    return device.type == "cuda" and not interpreting()


def layernorm_gelu_forward(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str, store_stats: bool,
    plan: ForwardPlan | None = None,
) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """Launch the forward; returns ``(y, mean, rstd)`` (the statistics only when ``store_stats``;
    the kernel writes them either way, see ``_fwd_kernel``).

    ``plan`` forces a launch plan (tests, benches); by default the GPU times ``forward_plans`` once
    per shape class and the interpreter uses ``INTERPRETER_PLAN``."""
    x2 = _as_rows(x)
    m, n = x2.shape
    y = _result(x2)
    stats = torch.empty((2, m), device=x.device, dtype=torch.float32)  # mean, rstd
    consts = _consts(n, approximate, x.device)
    args = (x2, weight, bias, y, stats, m, n, x2.stride(0), y.stride(0), eps)
    row_blocks = -(-m // consts["BLOCK_M"])

    def launch(chosen: ForwardPlan) -> None:
        plan_consts = {**consts, **chosen.consts()}
        programs = row_blocks
        if chosen.persistent:
            programs = _persistent_grid(_fwd_kernel, args, plan_consts, row_blocks, chosen.warps, x.device)
        _LAUNCH_FWD((programs,), *args, **plan_consts, num_warps=chosen.warps)

    if plan is None and _on_gpu_device(x.device):
        key = (n, m.bit_length(), x.dtype, approximate, x.device)
        plan = _tuned_plan(key, forward_plans(n), launch)
    launch(plan or INTERPRETER_PLAN)
    if store_stats:
        mean, rstd = stats
        return _as_input(y, x), mean, rstd
    return _as_input(y, x), None, None


def layernorm_gelu_backward(
    dy: torch.Tensor, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
    mean: torch.Tensor, rstd: torch.Tensor, approximate: str,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Launch the backward: returns ``(dx, dweight, dbias)``."""
    x2 = _as_rows(x)
    dy2 = _as_rows(dy)
    m, n = x2.shape
    dx = _result(x2)
    consts = _consts(n, approximate, x.device)
    warps = _tile_shape(consts["BLOCK_N"])[1]
    row_blocks = -(-m // consts["BLOCK_M"])
    tail = (m, n, x2.stride(0), dy2.stride(0), dx.stride(0))
    # the fp32 statistics stand in for the (not yet allocated) fp32 partial buffers: same signature
    programs = _persistent_grid(_bwd_kernel, (x2, weight, bias, dy2, dx, mean, rstd, mean, rstd, *tail),
                                  consts, row_blocks, warps, x.device)
    dw_part = torch.empty((programs, n), device=x.device, dtype=torch.float32)
    db_part = torch.empty((programs, n), device=x.device, dtype=torch.float32)
    _LAUNCH_BWD((programs,), x2, weight, bias, dy2, dx, mean, rstd, dw_part, db_part, *tail,
                **consts, num_warps=warps)
    dw = _result(weight)
    db = _result(bias)
    # 32 columns (128 B rows of partials) per program: N/32 programs share the (programs x N)
    # buffers, and up to 256 partial rows per load keep each program's reads in one wave.
    block_c = min(32, consts["BLOCK_N"])
    _LAUNCH_SUM((cdiv(n, block_c),), dw_part, db_part, dw, db, programs, n,
                BLOCK_P=min(256, next_power_of_2(programs)), BLOCK_C=block_c, num_warps=8)
    return _as_input(dx, x), _as_input(dw, weight), _as_input(db, bias)


def compile_jobs(m: int, n: int, dtype: torch.dtype, approximate: str, eps: float, backward: bool,
                 device: torch.device | None = None) -> list[Callable[[], object]]:
    """Every kernel build ``layernorm_gelu`` makes for an (m, n) input of ``dtype``, one thunk each: the
    forward of each tuned plan, then (``backward``) the backward with the column sums of its partials
    (their grid comes from the backward's occupancy). Tensors carry only dtypes; the integer arguments are
    the call's own, which Triton specializes on being 1 or a multiple of 16."""
    device = device or torch.device("cuda", torch.cuda.current_device())
    x = torch.empty((1, n), device=device, dtype=dtype)
    weight = torch.empty((n,), device=device, dtype=dtype)
    stats = torch.empty((2, m), device=device, dtype=torch.float32)  # the call's layout: rstd's alignment
    part = torch.empty((1, n), device=device, dtype=torch.float32)
    consts = _consts(n, approximate, device)
    forward = (x, weight, weight, x, stats, m, n, n, n, eps)
    jobs: list[Callable[[], object]] = [
        functools.partial(_fwd_kernel.warmup, *forward, **consts, **plan.consts(), num_warps=plan.warps, grid=(1,))
        for plan in forward_plans(n)]

    def backward_kernels() -> None:
        warps = _tile_shape(consts["BLOCK_N"])[1]
        sizing = (x, weight, weight, x, x, stats[0], stats[1], stats[0], stats[1], m, n, n, n, n)
        programs = _persistent_grid(_bwd_kernel, sizing, consts, -(-m // consts["BLOCK_M"]), warps, device)
        _bwd_kernel.warmup(*sizing[:7], part, part, *sizing[9:], **consts, num_warps=warps, grid=(1,))
        block_c = min(32, consts["BLOCK_N"])
        _sum_partials_kernel.warmup(part, part, weight, weight, programs, n,
                                    BLOCK_P=min(256, triton.next_power_of_2(programs)), BLOCK_C=block_c,
                                    num_warps=8, grid=(1,))

    return jobs + [backward_kernels] * backward


def precompile(m: int, n: int, dtype: torch.dtype, approximate: str, eps: float, backward: bool,
               shard: tuple[int, int] = (0, 1)) -> None:
    """Build, without launching, shard ``shard[0]`` of ``shard[1]`` of ``compile_jobs`` (job ``i`` where
    ``i % shard[1] == shard[0]``): a run's precompile processes build them side by side, where the first
    call built them one by one (4.4-5.5 s a case in the H200 bench profile)."""
    if interpreting():
        return
    index, count = shard
    for job in compile_jobs(m, n, dtype, approximate, eps, backward)[index::count]:
        job()


class _LayerNormGelu(torch.autograd.Function):
    """Autograd glue: saves ``x`` and two fp32 statistics per row, nothing of the size of ``y``."""

    @staticmethod
    def forward(ctx, x, weight, bias, eps, approximate, plan=None):  # type: ignore[override]
        y, mean, rstd = layernorm_gelu_forward(x, weight, bias, eps, approximate, store_stats=True, plan=plan)
        ctx.save_for_backward(x, weight, bias, mean, rstd)
        ctx.approximate = approximate
        return y

    @staticmethod
    def backward(ctx, dy):  # type: ignore[override]
        x, weight, bias, mean, rstd = ctx.saved_tensors
        dx, dw, db = layernorm_gelu_backward(dy, x, weight, bias, mean, rstd, ctx.approximate)
        return dx, dw, db, None, None, None


def layernorm_gelu(
    x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float = 1e-5, approximate: str = "tanh",
    plan: ForwardPlan | None = None,
) -> torch.Tensor:
    """``gelu(layer_norm(x, weight, bias, eps), approximate)`` over the last dim, fused in Triton.

    Inference calls (no grad needed) skip saving the statistics; training calls go through autograd.
    ``plan`` forces the forward's launch plan (a launch study), else the tuned one is used.
    """
    _check(x, weight, bias, approximate)
    weight, bias = weight.contiguous(), bias.contiguous()  # the kernels read them at unit stride
    needs_grad = torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias))
    if needs_grad:
        return _LayerNormGelu.apply(x, weight, bias, eps, approximate, plan)
    return layernorm_gelu_forward(x, weight, bias, eps, approximate, store_stats=False, plan=plan)[0]
