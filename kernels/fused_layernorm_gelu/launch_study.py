"""Launch-choice study of the fused forward on the GPU
(``python -m microscope_kernels.fused_layernorm_gelu.launch_study``).

Why: at 16384x4096 the forward reached 90% of a same-size copy but 84% of the 1 GiB copy. This
times, side by side and in interleaved rounds (a GPU transient then moves a round of every variant,
not one variant), the launch choices that could close that gap: the persistent grid's size (a full
wave, or the fewest programs that keep the same tiles per program so no program walks one tile more
than the others), cache hints (stream ``x`` in with ``evict_first``, write ``y`` with ``.cs``) and
rows per tile (``--study grid-and-hints``); the bytes each SM keeps in flight, through the prefetch
depth and a register cap that lets more programs reside (``--study registers``), or through the
compiler's shared-memory pipeline (``--study stages``); or rows read through TMA into a
shared-memory pipeline, written back with ordinary stores or TMA stores (``--study tma``,
``tma_forward.py``). It prints one table per shape, copies of the same size and of 1 GiB included.
"""

from __future__ import annotations

import argparse
import functools
import itertools
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
import triton
from microscope_kernels.fused_layernorm_gelu.kernel import ForwardPlan, _consts, _fwd_kernel, _resident_programs
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager
from microscope_kernels.fused_layernorm_gelu.tma_forward import _fwd_tma_kernel, descriptors
from microscope_kernels.safe_softmax.bench import gpu_header, gpu_state, interleaved_medians

from microscope.api import DTYPES

SHAPES = ((16384, 4096), (65536, 8192))


@dataclass(frozen=True)
class Launch:
    """One launch choice of the forward kernel (inference call, tanh GeLU)."""

    block_m: int = 1
    warps: int = 4
    prefetch: int = 1  # tiles loaded into registers ahead of the one being computed
    maxnreg: int | None = None  # ptxas register cap: fewer registers, more resident programs
    balanced: bool = False  # grid shrunk so every program walks the same number of tiles
    hints: bool = False  # evict_first on the x loads, .cs (streaming) on the y stores
    stages: int = 1  # > 1 (with prefetch 0): the compiler pipelines the x loads through shared memory
    tma: bool = False  # rows read by TMA (tma_forward.py), ``stages`` deep; prefetch, hints unused
    tma_store: bool = False  # with ``tma``: y written back by TMA stores too


def grid_and_hints() -> list[Launch]:
    """The first study (2026-12-03 07:56 UTC): grid size, cache hints, rows per tile."""
    return [Launch(block_m, warps, 1, None, balanced, hints)
            for block_m, warps, balanced, hints in itertools.product((1, 2), (4, 8), (False, True), (False, True))]


def registers() -> list[Launch]:
    """The second: bytes in flight per SM, by prefetch depth and by a register cap that lets more
    programs reside (at the price of spills where the cap is below what the kernel needs)."""
    return [Launch(1, warps, prefetch, maxnreg)
            for warps, prefetch, maxnreg in itertools.product((4, 8), (1, 2), (None, 128, 96, 80, 64))]


def stages() -> list[Launch]:
    """The third: the compiler's shared-memory pipeline at 2-5 tiles deep, beside the register
    prefetch; shared memory holds the tiles in flight, so they cost no registers."""
    return [Launch(1, warps, 1) for warps in (4, 8)] + [
        Launch(1, warps, 0, stages=depth) for warps, depth in itertools.product((4, 8), (2, 3, 4, 5))]


def tma() -> list[Launch]:
    """The fourth: TMA reads (a one-thread bulk copy into shared memory, ``stages`` rows deep at
    no register cost) beside the shipped register prefetch, with ordinary or TMA stores."""
    return [Launch(1, warps, 1) for warps in (4, 8)] + [
        Launch(1, warps, 0, stages=depth, tma=True, tma_store=tma_store)
        for warps, depth, tma_store in itertools.product((4, 8), (2, 3, 4), (False, True))]


STUDIES = {"grid-and-hints": grid_and_hints, "registers": registers, "stages": stages, "tma": tma}


def _thunks(launches: list[Launch], x: torch.Tensor, w: torch.Tensor, b: torch.Tensor, y: torch.Tensor
            ) -> dict[str, Callable[[], None]]:
    """label -> thunk launching the forward with that choice; the label states the compiled
    kernel's registers, spills and the one-wave grid they allow. Each variant runs once first and
    prints its largest error against fp32 eager, so no broken variant is timed unnoticed."""
    m, n = x.shape
    block_n = triton.next_power_of_2(n)
    stats = torch.empty((2, m), device=x.device, dtype=torch.float32)
    expected = layernorm_gelu_eager(x.float(), w.float(), b.float(), 1e-5, "tanh")  # each variant checked
    thunks: dict[str, Callable[[], None]] = {}
    for launch in launches:
        if launch.block_m * block_n // (32 * launch.warps) > 64:
            continue
        try:
            kernel, args, consts = (_tma_call if launch.tma else _call)(launch, x, w, b, y, stats)
            options = {"num_warps": launch.warps, **({"maxnreg": launch.maxnreg} if launch.maxnreg else {})}
            compiled = kernel.warmup(*args, **consts, **options, grid=(1,))
        except Exception as exc:  # a variant this Triton cannot build is reported, not fatal
            print(f"   {launch}: does not compile: {type(exc).__name__}: {str(exc)[:200]}")
            continue
        per_sm = _resident_programs(compiled, launch.warps, x.device.index or 0)
        row_blocks = triton.cdiv(m, launch.block_m)
        programs = min(row_blocks, per_sm * torch.cuda.get_device_properties(x.device).multi_processor_count)
        if launch.balanced:
            programs = triton.cdiv(row_blocks, triton.cdiv(row_blocks, programs))
        if launch.tma:
            how = f"TMA {launch.stages} stages{', TMA stores' if launch.tma_store else ''}"
        else:
            how = f"{launch.stages} stages" if launch.stages > 1 else f"prefetch {launch.prefetch}"
        label = (f"{launch.block_m}r {launch.warps}w {how} smem {compiled.metadata.shared // 1024} KiB "
                 f"regs {compiled.n_regs}{f' (cap {launch.maxnreg})' if launch.maxnreg else ''} "
                 f"spills {compiled.n_spills} {programs} programs{' balanced' if launch.balanced else ''}"
                 f"{' hints' if launch.hints else ''}")
        thunks[label] = functools.partial(_launch, kernel, programs, args, consts, options)
        y.zero_()
        thunks[label]()
        print(f"   {label}: max |y - fp32 eager| {float((y.float() - expected).abs().max()):.3g}")
    return thunks


def _call(launch: Launch, x, w, b, y, stats) -> tuple[triton.JITFunction, tuple, dict]:
    """The shipped kernel's arguments and constants for ``launch``."""
    m, n = x.shape
    plan = ForwardPlan(launch.warps, persistent=True, prefetch=launch.prefetch, stages=launch.stages,
                       stream_hints=launch.hints)
    consts = {**_consts(n, "tanh", x.device), "BLOCK_M": launch.block_m, **plan.consts()}
    return _fwd_kernel, (x, w, b, y, stats, m, n, x.stride(0), y.stride(0), 1e-5), consts


def _tma_call(launch: Launch, x, w, b, y, stats) -> tuple[triton.JITFunction, tuple, dict]:
    """The TMA variant's arguments and constants for ``launch``."""
    m, n = x.shape
    shipped = _consts(n, "tanh", x.device)
    consts = {"BLOCK_N": n, "APPROX_TANH": shipped["APPROX_TANH"], "FAST": shipped["FAST"],
              "STAGES": launch.stages, "TMA_STORE": launch.tma_store}
    return _fwd_tma_kernel, (*descriptors(x, y), w, b, y, stats, m, n, y.stride(0), 1e-5), consts


def _launch(kernel: triton.JITFunction, programs: int, args: tuple, consts: dict, options: dict) -> None:
    kernel[(programs,)](*args, **consts, **options)


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--study", default="stages", choices=sorted(STUDIES))
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    gpu_header(f"fused_layernorm_gelu forward launch study ({args.study}), {args.dtype}, tanh")
    big_src = torch.empty(2**30, dtype=torch.uint8, device="cuda")
    big_dst = torch.empty_like(big_src)
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        w = (1 + 0.1 * torch.randn(n, device="cuda")).to(dtype)
        b = (0.1 * torch.randn(n, device="cuda")).to(dtype)
        y = torch.empty_like(x)
        copy_dst = torch.empty_like(x)
        thunks = {"copy, same size": functools.partial(copy_dst.copy_, x),
                  "copy, 1 GiB": functools.partial(big_dst.copy_, big_src),
                  **_thunks(STUDIES[args.study](), x, w, b, y)}
        timed = interleaved_medians(thunks, rounds=args.rounds)
        nbytes = {label: 2 * (2**30 if label == "copy, 1 GiB" else x.numel() * x.element_size()) for label in thunks}
        same = timed["copy, same size"]
        big = timed["copy, 1 GiB"]
        same_gbps = nbytes["copy, same size"] / same[0] / 1e6 if same else float("nan")
        big_gbps = nbytes["copy, 1 GiB"] / big[0] / 1e6 if big else float("nan")
        print(f"\nforward {m}x{n} ({args.rounds} interleaved rounds; {gpu_state()})")
        print(f"{'variant':<72} {'ms':>8} {'min':>8} {'max':>8} {'GB/s':>6} {'of 1GiB copy':>13} {'of same-size':>13}")
        for label, result in timed.items():
            if result is None:
                print(f"{label:<72} FAILED")
                continue
            med, low, high = result
            gbps = nbytes[label] / med / 1e6
            print(f"{label:<72} {med:8.4f} {low:8.4f} {high:8.4f} {gbps:6.0f} {gbps / big_gbps:13.1%} "
                  f"{gbps / same_gbps:13.1%}")
        del x, y, copy_dst
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
