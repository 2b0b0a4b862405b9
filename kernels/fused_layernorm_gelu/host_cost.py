"""Host time per fused LayerNorm+GeLU call, on a GPU
(``python -m microscope_kernels.fused_layernorm_gelu.host_cost``).

Why: on the H200 machines a whole inference call cost 83-98 us of host time (eager's two ops: 19-24
us), about the 16384x4096 forward's GPU time, and the 16384x4096 backward read host-bound (README,
"Host time"). This pins that cost to functions: the GPU is first given a long sleep kernel so every
launch only queues, and the wall clock sees host work alone. Prints microseconds per call (median of
interleaved batches) for eager and the kernel, inference and training (forward + backward), through
Triton's own dispatch and through ``direct_launch``, and a cProfile of the kernel's calls. The
timing helpers are the int8 room's (``int8_kv_cache/host_cost.py``).
"""

from __future__ import annotations

import argparse
from collections.abc import Callable, Sequence

import torch
from microscope_kernels.fused_layernorm_gelu.kernel import layernorm_gelu
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager
from microscope_kernels.int8_kv_cache.host_cost import interleaved_host_us, print_host_table, profile_calls
from microscope_kernels.safe_softmax.bench import gpu_header

EPS = 1e-5


def _inference(fn: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor, b: torch.Tensor
               ) -> Callable[[], object]:
    def call() -> object:
        with torch.no_grad():
            return fn(x, w, b, EPS, "tanh")
    return call


def _training(fn: Callable[..., torch.Tensor], x: torch.Tensor, w: torch.Tensor, b: torch.Tensor,
              dy: torch.Tensor) -> Callable[[], object]:
    """Forward and backward of one step, as a training loop makes them (the graph is built anew)."""
    leaves = [t.detach().requires_grad_(True) for t in (x, w, b)]

    def call() -> object:
        return torch.autograd.grad(fn(*leaves, EPS, "tanh"), leaves, dy)
    return call


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, bool], list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=16384)
    parser.add_argument("--cols", type=int, default=4096)
    parser.add_argument("--top", type=int, default=20, help="functions to list in each profile")
    parser.add_argument("--rounds", type=int, default=7, help="interleaved rounds per call and launch path")
    args = parser.parse_args(argv)
    gpu_header(f"fused_layernorm_gelu host cost per call, {args.rows}x{args.cols} bf16")
    gen = torch.Generator(device="cuda").manual_seed(0)
    x = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16, generator=gen)
    dy = torch.randn(args.rows, args.cols, device="cuda", dtype=torch.bfloat16, generator=gen)
    w = torch.ones(args.cols, device="cuda", dtype=torch.bfloat16)
    b = torch.zeros(args.cols, device="cuda", dtype=torch.bfloat16)
    thunks = {"eager inference": _inference(layernorm_gelu_eager, x, w, b),
              "triton inference": _inference(layernorm_gelu, x, w, b),
              "eager training": _training(layernorm_gelu_eager, x, w, b, dy),
              "triton training": _training(layernorm_gelu, x, w, b, dy)}
    results = interleaved_host_us(thunks, args.rounds)
    for name in ("triton inference", "triton training"):
        print(f"\n== cProfile of {name}, direct launches, by own time")
        profile_calls(thunks[name], args.top)
    print_host_table(results, args.rounds)
    return results


if __name__ == "__main__":
    main()
