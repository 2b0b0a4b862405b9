"""Forced launch choices of the fused forward, for launch studies run as config sweeps.

The shipped forward tunes its launch plan per shape class (``kernel.forward_plans``). A study times
other choices beside it, in the same interleaved rounds: rows per tile (``block_m``), a register cap
that lets more programs reside (``maxnreg``), a grid shrunk so every program walks the same number
of tiles (``balanced``), cache hints, the compiler's shared-memory pipeline (``stages``), or rows read
through TMA (``tma_forward.py``, sm_90+). ``ablations/fused_layernorm_gelu.yaml``'s ``launch_*``
profiles sweep them; the results that decided the shipped plans are in the README.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import triton
from microscope_kernels.direct_launch import cdiv

from .kernel import ForwardPlan, _consts, _fwd_kernel, _on_gpu_device, _resident_programs, _sm_count

_PER_SM: dict[tuple, int] = {}


@dataclass(frozen=True)
class Launch:
    """One persistent launch of the forward (inference call: no statistics are kept for a backward)."""

    block_m: int = 1
    warps: int = 4
    prefetch: int = 1  # tiles loaded into registers ahead of the one being computed
    maxnreg: int = 0  # ptxas register cap (0: none): fewer registers, more resident programs
    balanced: bool = False  # grid shrunk so every program walks the same number of tiles
    hints: bool = False  # evict_first on the x loads, .cs (streaming) on the y stores
    stages: int = 1  # > 1 (with prefetch 0): the compiler pipelines the x loads through shared memory
    tma: bool = False  # rows read by TMA (tma_forward.py), ``stages`` deep; prefetch and hints unused
    tma_store: bool = False  # with ``tma``: y written back by TMA stores too


def forward(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, eps: float, approximate: str,
            launch: Launch) -> torch.Tensor:
    """``gelu(layer_norm(x))`` over the last dim of a 2-D ``x``, launched exactly as ``launch`` says."""
    if x.dim() != 2:
        raise ValueError(f"a forced launch takes 2-D rows, got shape {tuple(x.shape)}")
    m, n = x.shape
    y = torch.empty_like(x)
    stats = torch.empty((2, m), device=x.device, dtype=torch.float32)
    options = {"num_warps": launch.warps, **({"maxnreg": launch.maxnreg} if launch.maxnreg else {})}
    if launch.tma:
        from .tma_forward import _fwd_tma_kernel, descriptors

        shipped = _consts(n, approximate, x.device)
        kernel = _fwd_tma_kernel
        consts = {"BLOCK_N": n, "APPROX_TANH": shipped["APPROX_TANH"], "FAST": shipped["FAST"],
                  "STAGES": launch.stages, "TMA_STORE": launch.tma_store}
        args = (*descriptors(x, y), weight, bias, y, stats, m, n, y.stride(0), eps)
        row_blocks = m
    else:
        plan = ForwardPlan(launch.warps, persistent=True, prefetch=launch.prefetch, stages=launch.stages,
                           stream_hints=launch.hints)
        kernel = _fwd_kernel
        consts = {**_consts(n, approximate, x.device), "BLOCK_M": launch.block_m, **plan.consts()}
        args = (x, weight, bias, y, stats, m, n, x.stride(0), y.stride(0), eps)
        row_blocks = cdiv(m, launch.block_m)
    programs = _programs(kernel, args, consts, options, row_blocks, launch, x.device, x.dtype)
    kernel[(programs,)](*args, **consts, **options)
    return y


def _programs(kernel: triton.JITFunction, args: tuple, consts: dict, options: dict, row_blocks: int,
              launch: Launch, device: torch.device, dtype: torch.dtype) -> int:
    """One wave of resident programs (from the compiled kernel's occupancy), or 4 under the interpreter."""
    if not _on_gpu_device(device):
        programs = max(1, min(4, row_blocks))
    else:
        index = device.index if device.index is not None else torch.cuda.current_device()
        key = (kernel.fn.__name__, tuple(sorted(consts.items())), tuple(sorted(options.items())), index, dtype)
        if key not in _PER_SM:  # compiling once per specialization: later calls pay nothing
            _PER_SM[key] = _resident_programs(kernel.warmup(*args, **consts, **options, grid=(1,)), launch.warps,
                                              index)
        programs = min(row_blocks, _PER_SM[key] * _sm_count(index))
    if launch.balanced:
        programs = cdiv(row_blocks, cdiv(row_blocks, programs))
    return programs
