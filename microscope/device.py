"""Which device a run uses, and the Triton interpreter switch that goes with the CPU.

On a machine without a GPU, Triton kernels run through Triton's CPU interpreter. The interpreter is
chosen by an environment variable that Triton reads when ``@triton.jit`` decorates a kernel, so
``prepare`` must run before any plugin module is imported.
"""

from __future__ import annotations

import os

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


def device_name(device: str) -> str:
    if device == "cuda":
        return torch.cuda.get_device_name()
    import platform

    return platform.processor() or platform.machine() or "cpu"
