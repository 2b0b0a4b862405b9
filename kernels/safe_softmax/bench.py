"""GPU benchmark of the safe softmax (``python -m microscope_kernels.safe_softmax.bench``).

Checks correctness on the GPU first, measures the device's copy bandwidth in the same process,
times every variant with ``triton.testing.do_bench`` (median, L2 flushed between calls) and prints
a compact table last. ``main()`` returns the rows so one process can run all the rooms' benches.

The small helpers here (``gpu_header``, ``gpu_state``, ``copy_bandwidth_gbps``, ``measure``, ``interleaved_medians``,
``print_table``) are shared by the fused_layernorm_gelu and int8_kv_cache bench scripts.
"""

from __future__ import annotations

import argparse
import datetime
import platform
import statistics
import traceback
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass

import torch
import triton
import triton.testing
from microscope_kernels.copy_kernel import triton_copy
from microscope_kernels.safe_softmax.kernel import safe_softmax, tuned_forward_configs
from microscope_kernels.safe_softmax.reference import naive_softmax, safe_softmax_reference

from microscope.api import DTYPES

#: (rows, cols) of the targets: bf16 rows of 4K..32K columns, 64M elements (128 MB) each.
SHAPES = ((16384, 4096), (8192, 8192), (4096, 16384), (2048, 32768))


@dataclass
class Row:
    """One timed (case, variant): ``ms`` is None when the variant failed; ``nbytes`` it must move."""

    case: str
    variant: str
    ms: float | None
    nbytes: float
    note: str = ""


def gpu_header(title: str) -> None:
    """Print what the numbers were measured on: GPU, SMs, memory, versions, date."""
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    print(f"== {title}")
    print(f"   GPU {props.name} ({props.multi_processor_count} SMs, {props.total_memory / 2**30:.0f} GiB), "
          f"torch {torch.__version__}, CUDA {torch.version.cuda}, triton {triton.__version__}, "
          f"python {platform.python_version()}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} UTC")


def gpu_state() -> str:
    """SM clock, power and temperature now, through NVML ("" where NVML is unavailable).

    Why: an issue-bound kernel slows when the GPU lowers its SM clock under sustained load (power or
    heat), while a bandwidth-bound peer barely moves; the int8 decode kernel's figures moved by up to
    29% between H200 machines while SDPA's moved 3%. Printed right after timing, beside the figures.
    """
    try:
        return (f"SM clock {torch.cuda.clock_rate()} MHz, power {torch.cuda.power_draw() / 1000:.0f} W, "
                f"{torch.cuda.temperature()} C")
    except Exception:  # no pynvml, or not an NVIDIA GPU
        return ""


def measure(fn: Callable[[], object], label: str, warmup: int = 25, rep: int = 100, graphs: bool = False
            ) -> float | None:
    """Median ms of ``fn`` under do_bench; a failure prints its error and returns None.

    ``graphs``: replay ``fn`` from a CUDA graph (``do_bench_cudagraph``), which times the device work
    alone. Plain do_bench also times any gap the host leaves between launches: a call whose Python
    and launch cost exceeds its GPU time is host-bound, and its figure is then the host's.
    """
    try:
        if graphs:
            return float(triton.testing.do_bench_cudagraph(fn, rep=rep, return_mode="median"))
        return float(triton.testing.do_bench(fn, warmup=warmup, rep=rep, return_mode="median"))
    except Exception as exc:  # one broken variant must not end the whole run
        print(f"   {label}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}")
        traceback.print_exc(limit=2)
        return None


def interleaved_medians(thunks: Mapping[str, Callable[[], object]], rounds: int = 5, rep: int = 40,
                        graphs: bool = False) -> dict[str, tuple[float, float, float] | None]:
    """(median, min, max) over ``rounds`` of each thunk's do_bench median, the thunks taking turns in
    every round (None for one that failed). A transient on the GPU then moves one round of every
    variant, not one variant's whole figure: one int8 bench row once read 32-50% slow against the
    autotuner's timing of the same config a moment earlier. ``graphs`` as in ``measure``."""
    per_round: dict[str, list[float]] = {name: [] for name in thunks}
    failed: set[str] = set()
    for _ in range(rounds):
        for name, fn in thunks.items():
            if name not in failed:
                ms = measure(fn, name, warmup=10, rep=rep, graphs=graphs)
                if ms is None:
                    failed.add(name)
                else:
                    per_round[name].append(ms)
    return {name: None if name in failed else (statistics.median(v), min(v), max(v))
            for name, v in per_round.items()}


def copy_bandwidth_gbps(nbytes: int, graphs: bool = False) -> float:
    """Device-to-device copy bandwidth (bytes read + written per second) on an ``nbytes`` buffer:
    the ceiling that bandwidth-bound kernels are quoted against.

    ``graphs``: for kernels timed from graph replays (``measure``). Plain do_bench flushes L2
    before each call and counts the host's gap, which costs a short copy several percent, so the
    copy is timed from graph replays too, as a Triton kernel (``copy_kernel.py``: a captured
    ``copy_`` is a slower memcpy node). The faster of that and torch's copy under do_bench is
    returned: the stricter ceiling, whichever timing gives it."""
    src = torch.empty(nbytes, dtype=torch.uint8, device="cuda")
    dst = torch.empty_like(src)

    def gbps_of(ms: float | None) -> float:
        return 2 * nbytes / (ms * 1e-3) / 1e9 if ms else float("nan")

    gbps = gbps_of(measure(lambda: dst.copy_(src), "copy"))
    if graphs:
        graph_gbps = gbps_of(measure(lambda: triton_copy(src, dst), "triton copy", graphs=True))
        print(f"   copy of {nbytes / 2**20:.0f} MiB: torch copy_ under do_bench {gbps:.0f} GB/s, Triton copy "
              f"from graph replays {graph_gbps:.0f} GB/s; quoted against the faster")
        gbps = max(gbps, graph_gbps)
    return gbps


def check(label: str, error: float, limit: float) -> bool:
    ok = error <= limit
    print(f"   check {label}: error {error:.3g} (limit {limit:.3g}) {'PASS' if ok else 'FAIL'}")
    return ok


def print_table(title: str, rows: Sequence[Row], copy_gbps: float, peers: Sequence[str],
                same_size_copy: Mapping[str, float] | None = None) -> None:
    """case | variant | ms | GB/s | fraction of copy bandwidth | speedup vs each peer (same case).

    ``same_size_copy`` (case -> GB/s of a copy of that case's tensor, measured in the same run) adds a
    column against it: a 128 MB copy runs below the 1 GiB copy's rate (launch, ramp-up and tail are
    a larger share), and it is the ceiling for a kernel that moves exactly that tensor.
    """
    print(f"\n{title} (copy bandwidth {copy_gbps:.0f} GB/s)")
    head = f"{'case':<28} {'variant':<22} {'ms':>9} {'GB/s':>8} {'of copy':>8}"
    head += f" {'of same-size copy':>18}" if same_size_copy else ""
    head += "".join(f" {'vs ' + p:>14}" for p in peers)
    print(head)
    by_case: dict[str, dict[str, Row]] = {}  # insertion-ordered: cases in the order first measured
    for row in rows:
        by_case.setdefault(row.case, {})[row.variant] = row
    for row in (r for case in by_case.values() for r in case.values()):
        if row.ms is None:
            print(f"{row.case:<28} {row.variant:<22} {'failed':>9}  {row.note}")
            continue
        gbps = row.nbytes / (row.ms * 1e-3) / 1e9
        line = f"{row.case:<28} {row.variant:<22} {row.ms:9.4f} {gbps:8.0f} {gbps / copy_gbps:8.1%}"
        if same_size_copy:
            line += f" {gbps / same_size_copy[row.case]:18.1%}" if row.case in same_size_copy else f" {'-':>18}"
        for p in peers:
            other = by_case[row.case].get(p)
            line += f" {other.ms / row.ms:13.2f}x" if other and other.ms else f" {'-':>14}"
        print(line + (f"  {row.note}" if row.note else ""))


# -- this room -------------------------------------------------------------------------------------
def _correctness(dtype: torch.dtype) -> bool:
    """Forward and backward vs float64 on an odd shape, with large logits and masked entries."""
    gen = torch.Generator().manual_seed(0)
    x = (torch.randn(257, 3001, generator=gen) * 30).cuda()
    x[::7, ::5] = float("-inf")
    dy = torch.randn(x.shape, generator=gen).cuda()
    xl = x.detach().to(dtype).requires_grad_(True)
    y = safe_softmax(xl)
    (dx,) = torch.autograd.grad(y, xl, dy.to(dtype))
    y = y.detach()
    x64 = x.to(dtype).double().requires_grad_(True)
    y64 = safe_softmax_reference(x64)
    (dx64,) = torch.autograd.grad(y64, x64, dy.to(dtype).double())
    y64 = y64.detach()
    eps = torch.finfo(dtype).eps
    ok = check(f"forward {dtype} (max abs)", float((y.double() - y64).abs().max()), 4 * eps)
    backward_err = float((dx.double() - dx64).abs().max() / dx64.abs().max())
    return check(f"backward {dtype} (max abs / max |dx|)", backward_err, 8 * eps) and ok


def _fwd_bwd(fn: Callable[[torch.Tensor], torch.Tensor], x: torch.Tensor, dy: torch.Tensor):
    """Thunks for the forward (no grad) and for the backward alone (autograd.grad, graph retained)."""
    def forward() -> torch.Tensor:
        with torch.no_grad():
            return fn(x)

    leaf = x.detach().requires_grad_(True)
    y = fn(leaf)

    def backward() -> object:
        return torch.autograd.grad(y, leaf, dy, retain_graph=True)

    return forward, backward


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16", "fp32"])
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]
    gpu_header(f"safe_softmax bench, {args.dtype}")
    _correctness(dtype)
    copy_gbps = copy_bandwidth_gbps(max(m * n for m, n in SHAPES) * dtype.itemsize)
    variants = {"naive": naive_softmax, "triton": safe_softmax, "torch.softmax": lambda t: torch.softmax(t, -1)}
    rows: list[Row] = []
    for m, n in SHAPES:
        x = torch.randn(m, n, device="cuda", dtype=dtype)
        dy = torch.randn_like(x)
        size = m * n * dtype.itemsize
        for name, fn in variants.items():
            try:
                forward, backward = _fwd_bwd(fn, x, dy)
            except Exception as exc:
                print(f"   {name} {m}x{n}: FAILED {type(exc).__name__}: {exc}")
                forward = backward = None
            for mode, thunk, nbytes in (("fwd", forward, 2 * size), ("bwd", backward, 3 * size)):
                ms = measure(thunk, f"{name} {mode} {m}x{n}") if thunk else None
                rows.append(Row(f"{mode} {m}x{n}", name, ms, nbytes))
        del x, dy
        torch.cuda.empty_cache()
    print_table(f"safe_softmax {args.dtype}: fwd bytes = read x + write y; bwd = read y, dy + write dx",
                rows, copy_gbps, peers=["torch.softmax", "naive"])
    for key, config in tuned_forward_configs().items():
        print(f"   forward config for key {key}: {config}")
    return rows


if __name__ == "__main__":
    main()
