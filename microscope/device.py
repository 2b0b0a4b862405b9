"""Which device a run uses, and the Triton interpreter switch that goes with the CPU.

On a machine without a GPU, Triton kernels run through Triton's CPU interpreter. The interpreter is
chosen by an environment variable that Triton reads when ``@triton.jit`` decorates a kernel, so
``prepare`` must run before any plugin module is imported.
"""

from __future__ import annotations

import ctypes
import os
from dataclasses import dataclass
from functools import cache

import torch


class DeviceError(Exception):
    """The requested device is not available here."""


def resolve(requested: str = "auto") -> str:
    """``auto`` -> ``cuda`` when a GPU is present, else ``cpu``; an explicit ``cuda`` must exist."""
    if requested == "auto":
        return "cuda" if torch.cuda.is_available() else "cpu"
    if requested == "cuda" and not torch.cuda.is_available():
        raise DeviceError("--device cuda was asked for, but torch sees no CUDA GPU here; use --device cpu")
    if requested not in ("cpu", "cuda"):
        raise DeviceError(f"unknown device {requested!r}; use cpu, cuda or auto")
    return requested


def prepare(device: str) -> bool:
    """Switch Triton to its CPU interpreter for CPU runs; returns whether kernels are interpreted.

    On a GPU, pins Triton's disk cache to one directory for this process and every process it starts:
    torch.compile points ``TRITON_CACHE_DIR`` at its own folder on first use, so binaries the precompile
    step built before or after a compiled peer ran would land where the timed worker does not look.
    """
    if device == "cpu":
        os.environ["TRITON_INTERPRET"] = "1"
        return True
    if "TRITON_CACHE_DIR" not in os.environ:
        os.environ["TRITON_CACHE_DIR"] = triton_cache_dir()
    return os.environ.get("TRITON_INTERPRET", "0") not in ("", "0")


def triton_cache_dir() -> str:
    """Triton's own default cache folder (``~/.triton/cache`` unless its settings say otherwise)."""
    try:
        from triton import knobs

        return str(knobs.cache.dir)
    except (ImportError, AttributeError):
        return os.path.join(os.path.expanduser("~"), ".triton", "cache")


def synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()


@dataclass(frozen=True)
class GpuFacts:
    """What a record says of the GPU: the name, compute capability and memory torch would report."""

    name: str
    capability: str  # "9.0"
    memory_bytes: int


#: ``cuDeviceGetAttribute``'s codes for the compute capability's major and minor numbers.
_CC_MAJOR, _CC_MINOR = 75, 76


@cache
def gpu_facts() -> GpuFacts:
    """The current GPU's facts, read through the CUDA driver where torch has not started CUDA in this process.

    torch's own accessors initialise its CUDA runtime (seconds on an H200 host); the process that plans a
    run and starts its workers never launches a kernel, so it asks the driver (``cuDeviceGetName``,
    ``cuDeviceTotalMem``: the values torch's device properties are made of) for device 0, torch's current
    device in a process that never chose one.
    """
    if not torch.cuda.is_initialized():
        facts = _driver_facts()
        if facts is not None:
            return facts
    props = torch.cuda.get_device_properties(torch.cuda.current_device())
    return GpuFacts(props.name, f"{props.major}.{props.minor}", int(props.total_memory))


def _driver_facts() -> GpuFacts | None:
    """Device 0's facts from ``libcuda``, or None where the library or a call fails (torch answers then)."""
    try:
        lib = ctypes.CDLL("libcuda.so.1")
        device, name = ctypes.c_int(), ctypes.create_string_buffer(256)
        memory, major, minor = ctypes.c_size_t(), ctypes.c_int(), ctypes.c_int()
        codes = [lib.cuInit(0), lib.cuDeviceGet(ctypes.byref(device), 0)]
        if not any(codes):
            codes += [lib.cuDeviceGetName(name, len(name), device),
                      lib.cuDeviceTotalMem_v2(ctypes.byref(memory), device),
                      lib.cuDeviceGetAttribute(ctypes.byref(major), _CC_MAJOR, device),
                      lib.cuDeviceGetAttribute(ctypes.byref(minor), _CC_MINOR, device)]
    except (OSError, AttributeError):  # no driver library, or one without these entry points
        return None
    if any(codes) or not name.value:
        return None
    return GpuFacts(name.value.decode("utf-8", "replace"), f"{major.value}.{minor.value}", int(memory.value))


def device_name(device: str) -> str:
    if device == "cuda":
        return gpu_facts().name
    import platform

    return platform.processor() or platform.machine() or "cpu"
