"""The compiler's resource report for flash_attn's kernels on Hopper (sm_90), built on any machine, GPU or not.

Every autotuning candidate the pruning keeps for a head dim, dtype and mask is compiled by this Triton for an
sm_90 target and assembled by the ``ptxas`` Triton ships. Registers and spills decide which tiles are worth
offering the autotuner, and a build that fails shows up here rather than in a GPU run. Pointers are taken as
16-byte aligned and integers as unaligned, as Triton specializes them at a launch of these kernels.

    python -m microscope_kernels.flash_attn.resources --head-dim 128 --dtype bf16
"""

from __future__ import annotations

import argparse
import os
import re
import subprocess
import tempfile
from dataclasses import dataclass

import torch
import triton
from triton.backends.compiler import GPUTarget
from triton.compiler import ASTSource

from . import kernel as fa

__all__ = ["Resources", "candidates", "compile_report", "main"]

TARGET = GPUTarget("cuda", 90, 32)
_FP32_ARGS = {"LSE", "DELTA", "DQ_ACC", "sm_scale"}
_TYPES = {torch.float16: "fp16", torch.bfloat16: "bf16", torch.float32: "fp32"}


@dataclass(frozen=True)
class Resources:
    """What ptxas reports for one build (``error`` set, and the rest zero, when it does not build)."""

    registers: int = 0
    spill_bytes: int = 0
    shared_bytes: int = 0
    wgmma: bool = False  # Hopper's asynchronous tensor-core instructions
    warp_specialized: bool = False  # producer/consumer warps (setmaxnreg)
    error: str | None = None


def _ptxas() -> str:
    """The ptxas this Triton assembles sm_90 kernels with (its PTX version matches that one's)."""
    from triton.backends.nvidia.compiler import get_ptxas

    return get_ptxas(TARGET.arch).path


def compile_report(fn, dtype: torch.dtype, constexprs: dict, num_warps: int, num_stages: int,
                   maxnreg: int | None = None) -> Resources:
    """Build ``fn`` (a flash_attn ``@triton.jit`` kernel) for sm_90 with these constants and launch options."""
    if not isinstance(fn, triton.runtime.JITFunction):
        raise RuntimeError("flash_attn's kernels were imported under TRITON_INTERPRET=1, which makes them "
                           "interpreter functions: run the resource report without it")
    element = _TYPES[dtype]
    # constants the kernel defaults (a study's switches, off) unless the caller sets them
    constexprs = {**{p.name: p.default for p in fn.params if p.is_constexpr and p.has_default}, **constexprs}
    signature, attrs = {}, {}
    for index, param in enumerate(fn.params):
        if param.is_constexpr:
            continue
        if param.name == "sm_scale":
            signature[param.name] = "fp32"
        elif param.name in fa._NO_SPECIALIZE:  # lengths and buckets: the only integer arguments
            signature[param.name] = "i32"
        else:
            signature[param.name] = "*fp32" if param.name in _FP32_ARGS else f"*{element}"
            attrs[(index,)] = [["tt.divisibility", 16]]
    options = {"num_warps": num_warps, "num_stages": num_stages, **({"maxnreg": maxnreg} if maxnreg else {})}
    try:
        built = triton.compile(ASTSource(fn, signature, constexprs, attrs), target=TARGET, options=options)
    except Exception as exc:  # noqa: BLE001 - a candidate that does not build is a row of the report
        return Resources(error=f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:120]}")
    ptx = built.asm["ptx"]
    with tempfile.TemporaryDirectory() as folder:
        path = os.path.join(folder, "kernel.ptx")
        with open(path, "w") as handle:
            handle.write(ptx)
        done = subprocess.run([_ptxas(), "-arch=sm_90a", "-v", path, "-o", os.path.join(folder, "kernel.cubin")],
                              capture_output=True, text=True, check=False)
    info = done.stderr
    if done.returncode != 0:
        return Resources(error=f"ptxas: {info.strip().splitlines()[0][:120] if info.strip() else done.returncode}")

    def number(pattern: str) -> int:
        found = re.search(pattern, info)
        return int(found.group(1)) if found else 0

    return Resources(registers=number(r"Used (\d+) registers"), spill_bytes=number(r"(\d+) bytes spill stores"),
                     shared_bytes=int(built.metadata.shared), wgmma="wgmma.mma_async" in ptx,
                     warp_specialized="setmaxnreg" in ptx)


def candidates(head_dim: int, dtype: torch.dtype, causal: bool, unmasked: bool,
               kernels: tuple[str, ...] | None = None) -> list[tuple[str, object, dict, triton.Config]]:
    """(kernel name, kernel, constants, config) for every candidate the pruning keeps, per autotuned kernel
    (those named in ``kernels``, else all); for a causal ``unmasked`` (split) forward, also the launch that adds
    the masked tiles, ``_attn_fwd_rest``, once per tile size of the candidates."""
    flags = {"HEAD_DIM": head_dim, "CAUSAL": causal, "USE_TMA": dtype != torch.float32, "INTERPRET": False,
             "UNMASKED": unmasked}
    rows, rest_tiles = [], set()
    for tuner in fa.TUNERS.values():
        if kernels is not None and tuner.fn.__name__ not in kernels:
            continue
        for cfg in fa._PRUNES[tuner](tuner.configs, {"Q": torch.empty(0, dtype=dtype)}, **flags):
            rows.append((tuner.fn.__name__, tuner.fn, {**flags, **cfg.kwargs}, cfg))
            tiles = {"BLOCK_M": cfg.kwargs["BLOCK_M"], "BLOCK_N": cfg.kwargs["BLOCK_N"]}
            if tuner is fa._FWD and causal and unmasked and tuple(tiles.values()) not in rest_tiles:
                rest_tiles.add(tuple(tiles.values()))
                launch = fa._rest_launch(tiles["BLOCK_M"], tiles["BLOCK_N"])
                rest = {name: flags[name] for name in ("HEAD_DIM", "CAUSAL", "USE_TMA", "INTERPRET")}
                rows.append(("_attn_fwd_rest", fa._attn_fwd_rest, {**rest, **tiles},
                             triton.Config(tiles, num_warps=launch["num_warps"], num_stages=launch["num_stages"])))
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--head-dim", type=int, default=128, choices=fa.SUPPORTED_HEAD_DIMS)
    parser.add_argument("--dtype", default="bf16", choices=sorted(_TYPES.values()))
    args = parser.parse_args(argv)
    dtype = next(t for t, name in _TYPES.items() if name == args.dtype)
    print(f"triton {triton.__version__}, sm_90, D{args.head_dim} {args.dtype}")
    print(f"{'kernel':16} {'mask':9} {'config':62} {'regs':>4} {'spill':>5} {'smem KB':>7}  notes")
    # "split": the causal forward's first launch and its masked tiles' launch (flash_attention's split=True)
    for causal, unmasked, mask, kernels in ((False, True, "none", None), (False, False, "tail", None),
                                            (True, False, "causal", None), (True, True, "split", ("_attn_fwd",))):
        for name, fn, constants, cfg in candidates(args.head_dim, dtype, causal, unmasked, kernels):
            report = compile_report(fn, dtype, constants, cfg.num_warps, cfg.num_stages, cfg.maxnreg)
            config = ", ".join(f"{k}={v}" for k, v in cfg.kwargs.items()) + f", w{cfg.num_warps} s{cfg.num_stages}"
            if report.error:
                print(f"{name:16} {mask:9} {config:62} {report.error}")
                continue
            notes = " ".join(n for n, on in (("wgmma", report.wgmma), ("ws", report.warp_specialized)) if on)
            print(f"{name:16} {mask:9} {config:62} {report.registers:4d} {report.spill_bytes:5d} "
                  f"{report.shared_bytes / 1024:7.1f}  {notes}")


if __name__ == "__main__":
    main()
