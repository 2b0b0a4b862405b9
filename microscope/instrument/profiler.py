"""``torch.profiler`` traces of one variant: a Chrome trace file and a kernel/op table.

``profile_variant(fn, out_dir, config)`` calls ``fn`` ``wait + warmup + active`` times under the
profiler with that schedule, writes ``<out_dir>/trace.json.gz`` (Chrome trace format, gzipped;
Perfetto and chrome://tracing open it directly) and returns a ``VariantProfile`` whose tables cover
the active steps only.

What the tables hold:

``kernels`` (GPU runs): device activity -- CUDA kernels, memcpy, memset -- aggregated by readable
    name, with call count and self device time. Names are made readable by dropping ``void``, the
    parameter list and the template arguments, and, for kernels launched by an ATen op, appending
    that op: ``vectorized_elementwise_kernel[aten::gelu]`` rather than 400 characters of template.
    Triton kernels appear under their own (already readable) name.
``ops``: every CPU op (ATen ops, autograd nodes such as ``MulBackward0``, custom Functions, Triton
    launches labelled ``triton::<name>``) aggregated by name, with count, self and inclusive CPU time.
``top_level``: the outermost CPU ops only -- those not running inside another op -- with their
    inclusive time: what the program asked for, not how ATen implemented it (``aten::linear``, not
    the ``aten::addmm`` inside it; a fused Function, not the allocation inside it).

Not ops: the ``ProfilerStep#`` ranges, the autograd engine's ``evaluate_function`` wrappers, CUDA
runtime/driver calls (``cudaLaunchKernel``...) and memory records. A user ``record_function`` range
counts as an op: it names a unit of work.

Triton under the CPU interpreter is invisible to the profiler (it runs NumPy), so while profiling,
launches are wrapped in a ``record_function("triton::<kernel>")`` range (see ``opaque``).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.autograd import DeviceType
from torch.profiler import ProfilerActivity, profile, record_function, schedule

from microscope.instrument.config import ProfileConfig
from microscope.instrument.opaque import label_calls

__all__ = ["OpStat", "VariantProfile", "profile_variant", "readable_kernel_name"]

TRACE_FILE = "trace.json.gz"
_RUNTIME = re.compile(r"^(cu[A-Z]|cuda[A-Z]|hip[A-Z])")
_NOT_OPS = ("ProfilerStep", "autograd::engine::evaluate_function", "[memory]", "[")


@dataclass
class OpStat:
    """One row of a kernel or op table: totals over the profile's active steps."""

    name: str
    count: int
    self_us: float
    total_us: float
    kind: str  # kernel | op
    raw: str = ""

    def per_step(self, steps: int) -> dict[str, float]:
        return {"count": self.count / steps, "self_us": self.self_us / steps, "total_us": self.total_us / steps}


@dataclass
class VariantProfile:
    """What the profiler saw for one variant over ``steps`` active steps."""

    name: str
    device: str
    steps: int
    trace_path: Path | None
    kernels: list[OpStat] = field(default_factory=list)
    ops: list[OpStat] = field(default_factory=list)
    top_level: list[OpStat] = field(default_factory=list)

    @property
    def on_gpu(self) -> bool:
        return bool(self.kernels)

    def summary_rows(self, top_k: int | None = None) -> list[dict[str, Any]]:
        """Top rows by self time: device kernels on a GPU run, CPU ops otherwise; totals and per step."""
        rows = self.kernels if self.on_gpu else self.ops
        ranked = sorted(rows, key=lambda s: -s.self_us)[:top_k]
        clock = "device" if self.on_gpu else "cpu"
        return [{"variant": self.name, "name": s.name, "kind": s.kind, "clock": clock, "count": s.count,
                 "self_us": s.self_us, "total_us": s.total_us,
                 "self_us_per_step": s.self_us / self.steps, "calls_per_step": s.count / self.steps,
                 "raw": s.raw} for s in ranked]

    def summary(self, top_k: int | None = None):  # -> pandas.DataFrame
        """``summary_rows`` as a pandas DataFrame."""
        import pandas as pd

        return pd.DataFrame(self.summary_rows(top_k))

    def to_dict(self, top_k: int | None = None) -> dict[str, Any]:
        return {"name": self.name, "device": self.device, "steps": self.steps,
                "trace": str(self.trace_path) if self.trace_path else None,
                "summary": self.summary_rows(top_k),
                "top_level": [asdict(s) for s in self.top_level]}


_TEMPLATE = re.compile(r"<[^<>]*>")


def readable_kernel_name(raw: str, launcher: str | None = None) -> str:
    """``void ns::kernel<4, Functor<...>>(int, ...)`` -> ``kernel``; ``kernel[aten::op]`` with a launcher."""
    name = raw.strip().replace("(anonymous namespace)::", "")
    if name.startswith("void "):
        name = name[5:]
    previous = None
    while previous != name:  # strip nested template arguments from the inside out
        previous, name = name, _TEMPLATE.sub("", name)
    name = name.split("(", 1)[0].strip()
    name = name.rsplit("::", 1)[-1] or name
    if launcher and launcher.startswith("aten::"):
        name = f"{name}[{launcher}]"
    return name


def _is_op(evt: Any) -> bool:
    return evt.device_type == DeviceType.CPU and not evt.name.startswith(_NOT_OPS) and not _RUNTIME.match(evt.name)


def _self_device_us(evt: Any) -> float:
    value = getattr(evt, "self_device_time_total", None)
    if value is None:
        value = getattr(evt, "self_cuda_time_total", 0.0)
    return float(value)


def _aggregate(items: Iterable[tuple[str, float, float, str]], kind: str) -> list[OpStat]:
    table: dict[str, OpStat] = {}
    for name, self_us, total_us, raw in items:
        stat = table.get(name)
        if stat is None:
            table[name] = OpStat(name, 1, self_us, total_us, kind, raw)
        else:
            stat.count += 1
            stat.self_us += self_us
            stat.total_us += total_us
    return sorted(table.values(), key=lambda s: -s.self_us)


def _is_device_work(evt: Any, cpu_names: set[str]) -> bool:
    """A kernel, memcpy or memset on the device, not a mirror of a CPU range.

    On a GPU, Kineto mirrors every ``record_function`` range that launched device work onto the
    device timeline (a "gpu_user_annotation" spanning its kernels). Counted as device work, the
    ``triton::<name>`` label around a Triton launch doubled that kernel's calls and time (seen on the
    H200). Mirrors are flagged ``is_user_annotation`` (where torch has the flag) and carry the CPU
    range's name; no kernel is named like a CPU event (``aten::mul`` launches ``..._kernel``).
    """
    if evt.device_type == DeviceType.CPU or evt.name.startswith("ProfilerStep"):
        return False
    return not getattr(evt, "is_user_annotation", False) and evt.name not in cpu_names


def _tables(events: list[Any]) -> tuple[list[OpStat], list[OpStat], list[OpStat]]:
    cpu_names = {e.name for e in events if e.device_type == DeviceType.CPU}
    launcher: dict[str, str] = {}
    for evt in events:
        if evt.device_type == DeviceType.CPU and evt.name.startswith("aten::"):
            for kernel in getattr(evt, "kernels", ()) or ():
                launcher.setdefault(kernel.name, evt.name)
    device = [e for e in events if _is_device_work(e, cpu_names)]
    kernels = _aggregate(((readable_kernel_name(e.name, launcher.get(e.name)), _self_device_us(e),
                           _self_device_us(e), e.name) for e in device), "kernel")
    cpu_ops = [e for e in events if _is_op(e)]
    ops = _aggregate(((e.name, float(e.self_cpu_time_total), float(e.cpu_time_total), e.name) for e in cpu_ops), "op")

    def outermost(evt: Any) -> bool:
        parent = evt.cpu_parent
        while parent is not None:
            if _is_op(parent):
                return False
            parent = parent.cpu_parent
        return True

    top = _aggregate(((e.name, float(e.cpu_time_total), float(e.cpu_time_total), e.name)
                      for e in cpu_ops if outermost(e)), "op")
    return kernels, ops, top


def _record_range(name: str) -> Any:
    rf = record_function(name)
    rf.__enter__()
    return rf


def _close_range(rf: Any) -> None:
    rf.__exit__(None, None, None)


def profile_variant(
    fn: Callable[[], Any],
    out_dir: str | Path | None,
    config: ProfileConfig | None = None,
    *,
    name: str = "variant",
    device: str | None = None,
) -> VariantProfile:
    """Profile ``config.steps`` calls of ``fn`` and summarise the ``active`` ones.

    ``device`` ``"cuda"`` adds CUDA activity (default: when a GPU is available). ``out_dir=None``
    skips writing the trace. Every call is followed by a device synchronisation on a GPU, so each
    step's kernels finish inside that step.
    """
    config = config or ProfileConfig(enabled=True)
    use_cuda = torch.cuda.is_available() if device is None else device.startswith("cuda")
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if use_cuda else [])
    trace_path = Path(out_dir) / TRACE_FILE if out_dir is not None else None
    if trace_path is not None:
        trace_path.parent.mkdir(parents=True, exist_ok=True)

    def on_ready(prof: profile) -> None:
        if trace_path is not None:
            prof.export_chrome_trace(str(trace_path))

    with label_calls(_record_range, _close_range, functions=False):
        with profile(
            activities=activities,
            schedule=schedule(wait=config.wait, warmup=config.warmup, active=config.active, repeat=1),
            on_trace_ready=on_ready,
            record_shapes=config.record_shapes,
            profile_memory=config.profile_memory,
            with_stack=config.with_stack,
        ) as prof:
            for _ in range(config.steps):
                fn()
                if use_cuda:
                    torch.cuda.synchronize()
                prof.step()
    kernels, ops, top = _tables(list(prof.events()))
    return VariantProfile(name=name, device="cuda" if use_cuda else "cpu", steps=config.active,
                          trace_path=trace_path, kernels=kernels, ops=ops, top_level=top)
