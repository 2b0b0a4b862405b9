"""GPU benchmark of fused LayerNorm + GeLU (``python -m microscope_kernels.fused_layernorm_gelu.bench``).

Checks correctness on the GPU first, measures copy bandwidth in the same process, times eager,
torch.compile and the Triton kernel (forward under no_grad; backward alone through
``torch.autograd.grad`` on a retained graph) and prints a compact table last. ``main()`` returns the
rows so one process can run all the rooms' benches.
"""

from __future__ import annotations

import argparse
import functools
import time
from collections.abc import Callable, Sequence

import torch
from microscope_kernels.fused_layernorm_gelu.kernel import (
    forward_plans,
    layernorm_gelu,
    layernorm_gelu_forward,
    tuned_forward_plans,
)
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager
from microscope_kernels.safe_softmax.bench import Row, check, copy_bandwidth_gbps, gpu_header, measure, print_table

from microscope.api import DTYPES

#: The targets: (rows, cols) in bf16.
SHAPES = ((16384, 4096), (65536, 8192))
EPS = 1e-5

LnFn = Callable[..., torch.Tensor]


def _inputs(m: int, n: int, dtype: torch.dtype, seed: int = 0) -> tuple[torch.Tensor, ...]:
    gen = torch.Generator(device="cuda").manual_seed(seed)
    x = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    w = (1 + 0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    b = (0.1 * torch.randn(n, device="cuda", generator=gen)).to(dtype)
    dy = torch.randn(m, n, device="cuda", dtype=dtype, generator=gen)
    return x, w, b, dy


def _grads(fn: LnFn, x, w, b, dy, approximate: str, dtype: torch.dtype) -> list[torch.Tensor]:
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves, EPS, approximate)
    return [y.detach(), *torch.autograd.grad(y, leaves, dy.to(dtype))]


def _correctness(dtype: torch.dtype) -> bool:
    """Output and the three gradients vs float64, within 4x eager's own error (+ a floor)."""
    ok = True
    for approximate in ("tanh", "none"):
        x, w, b, dy = _inputs(1003, 4096, dtype, seed=1)
        ours = _grads(layernorm_gelu, x, w, b, dy, approximate, dtype)
        eager = _grads(layernorm_gelu_eager, x, w, b, dy, approximate, dtype)
        truth = _grads(layernorm_gelu_eager, x, w, b, dy, approximate, torch.float64)
        for name, got, base, ref in zip(("y", "dx", "dw", "db"), ours, eager, truth):
            err = float((got.double() - ref).norm() / ref.norm())
            limit = 4 * float((base.double() - ref).norm() / ref.norm()) + torch.finfo(dtype).eps
            ok = check(f"{approximate} {name} {dtype} (norm-relative)", err, limit) and ok
    return ok


def _thunks(fn: LnFn, x, w, b, dy, approximate: str):
    def forward() -> torch.Tensor:
        with torch.no_grad():
            return fn(x, w, b, EPS, approximate)

    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves, EPS, approximate)

    def backward() -> object:
        return torch.autograd.grad(y, leaves, dy, retain_graph=True)

    return forward, backward


def _host_us_per_call(fn: LnFn, approximate: str, dtype: torch.dtype, calls: int = 2000) -> float:
    """Wall microseconds per inference call on 8 rows, launched back to back: the GPU work is a few
    microseconds, so this is the host's cost (Python, checks, launch). A 16384x4096 forward runs
    ~75 us on the GPU, so a host cost near that would make the do_bench rows above host-bound."""
    x, w, b, _ = _inputs(8, 4096, dtype)
    with torch.no_grad():
        for _ in range(20):
            fn(x, w, b, EPS, approximate)
        torch.cuda.synchronize()
        start = time.perf_counter()
        for _ in range(calls):
            fn(x, w, b, EPS, approximate)
        torch.cuda.synchronize()
    return (time.perf_counter() - start) / calls * 1e6


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    parser.add_argument("--approximate", default="tanh", choices=["tanh", "none"])
    parser.add_argument("--graphs", action="store_true",
                        help="time the forward from CUDA-graph replays: device time alone, no L2 flush, "
                             "quoted against a copy timed the same way. The backward is left out: "
                             "autograd's backward on a kept graph failed to capture on the H200 machine "
                             "(cudaErrorStreamCaptureImplicit)")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    gpu_header(f"fused_layernorm_gelu bench, {args.dtype}, approximate={args.approximate}")
    _correctness(dtype)
    copy_gbps = copy_bandwidth_gbps(max(m * n for m, n in SHAPES) * dtype.itemsize, graphs=args.graphs)
    variants: dict[str, LnFn] = {
        "eager": layernorm_gelu_eager,
        "torch.compile": torch.compile(layernorm_gelu_eager, dynamic=False),
        "triton": layernorm_gelu,
    }
    rows: list[Row] = []
    plan_rows: list[Row] = []
    same_size_copy: dict[str, float] = {}
    for m, n in SHAPES:
        x, w, b, dy = _inputs(m, n, dtype)
        size = m * n * dtype.itemsize
        same_size_copy[f"fwd {m}x{n}"] = same_size_copy[f"bwd {m}x{n}"] = copy_bandwidth_gbps(size, graphs=args.graphs)
        for name, fn in variants.items():
            try:
                forward, backward = _thunks(fn, x, w, b, dy, args.approximate)
            except Exception as exc:
                print(f"   {name} {m}x{n}: FAILED {type(exc).__name__}: {exc}")
                forward = backward = None
            for mode, thunk, nbytes in (("fwd", forward, 2 * size), ("bwd", backward, 3 * size)):
                if mode == "bwd" and args.graphs:  # see --graphs
                    continue
                ms = measure(thunk, f"{name} {mode} {m}x{n}", graphs=args.graphs) if thunk else None
                rows.append(Row(f"{mode} {m}x{n}", name, ms, nbytes))
        for plan in forward_plans(n):  # what the forward's one-off timing chose among
            thunk = functools.partial(layernorm_gelu_forward, x, w, b, EPS, args.approximate, False, plan)
            ms = measure(thunk, f"plan {plan} {m}x{n}", graphs=args.graphs)
            plan_rows.append(Row(f"fwd {m}x{n}", str(plan), ms, 2 * size))
        del x, w, b, dy
        torch.cuda.empty_cache()
    timing = "CUDA graph replays" if args.graphs else "do_bench"
    print_table(f"fused_layernorm_gelu {args.dtype} {args.approximate} ({timing}): fwd bytes = read x + write y; "
                f"bwd = read x, dy + write dx", rows, copy_gbps, peers=["torch.compile", "eager"],
                same_size_copy=same_size_copy)
    print_table("forward launch plans (inference call)", plan_rows, copy_gbps, peers=[],
                same_size_copy=same_size_copy)
    for key, plan in tuned_forward_plans().items():
        print(f"   forward plan chosen for key {key}: {plan}")
    # torch.compile is left out: the new shape would recompile it (dynamic=False)
    host = {name: _host_us_per_call(variants[name], args.approximate, dtype) for name in ("eager", "triton")}
    print("   host time per inference call (8x4096, back to back): "
          + ", ".join(f"{name} {us:.1f} us" for name, us in host.items()))
    return rows


if __name__ == "__main__":
    main()
