"""planted_crashes: candidates that kill, hang or poison the process that runs them, beside a correct one.

Not an optimization: a calibration target for process isolation (``microscope/executors``). With the
default local executor each bad candidate must be recorded failed with its reason (signal, timeout,
out of memory, CUDA error) while the correct candidate's records and verdicts stay complete, and a GPU
leak must be reported after the group that grew it; with the inline executor the first crash ends
the run, which is what isolation is for.
"""

from __future__ import annotations

import ctypes
import os
import time

import torch

from microscope.api import Ablation, Case, Tolerance, baseline, candidate, grid, randn, register


def softmax(x: torch.Tensor) -> torch.Tensor:
    """Row softmax."""
    return torch.softmax(x, dim=-1)


def correct(x: torch.Tensor) -> torch.Tensor:
    """Row softmax through torch.nn.functional: right, and not a crash."""
    return torch.nn.functional.softmax(x, dim=-1)


def aborts(x: torch.Tensor) -> torch.Tensor:
    """Calls abort(): SIGABRT, as a failed C++ assertion in an extension would."""
    os.abort()


def segfaults(x: torch.Tensor) -> torch.Tensor:
    """Reads address 0 through ctypes: SIGSEGV."""
    ctypes.string_at(0)
    return x


def hangs(x: torch.Tensor) -> torch.Tensor:
    """Never returns (a deadlock): only a time limit ends it."""
    while True:
        time.sleep(1.0)


def exhausts_memory(x: torch.Tensor) -> torch.Tensor:
    """Allocates 256 MiB blocks until the allocator refuses (CUDA OOM, or the CPU worker's memory cap)."""
    blocks = []
    while True:
        blocks.append(torch.ones(2**26, dtype=torch.float32, device=x.device))


def device_assert(x: torch.Tensor) -> torch.Tensor:
    """Indexes out of bounds: a device-side assert on CUDA (the context is lost), an IndexError on CPU."""
    return x[torch.tensor([x.shape[0] + 7], device=x.device)]


_KEPT: dict[tuple[int, ...], torch.Tensor] = {}


def leaks(x: torch.Tensor) -> torch.Tensor:
    """Right, but keeps 512 MiB of GPU memory per input shape alive forever (a leak across groups)."""
    _KEPT.setdefault(tuple(x.shape), torch.ones(2**27, dtype=torch.float32, device=x.device))
    return torch.softmax(x, dim=-1)


def triton_oob(x: torch.Tensor) -> torch.Tensor:
    """A Triton kernel that stores far outside its output: an illegal memory access on CUDA."""
    from .kernel import out_of_bounds_store

    return out_of_bounds_store(x)


@register("planted_crashes")
class PlantedCrashes(Ablation):
    """Calibration: candidates that abort, segfault, hang, exhaust memory or poison CUDA, and a correct one."""

    variants = {
        "eager": baseline(softmax),
        "correct": candidate(correct),
        "aborts": candidate(aborts),
        "segfaults": candidate(segfaults),
        "hangs": candidate(hangs),
        "exhausts_memory": candidate(exhausts_memory),
        "device_assert": candidate(device_assert),
        "triton_oob": candidate(triton_oob, needs=("triton", "cuda")),
        "leaks": candidate(leaks, needs=("cuda",)),
    }
    cases = grid(rows=[33], cols=[257], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-5, atol=1e-6)}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
        return {"x": randn((case["rows"], case["cols"]), case.dtype, gen, device)}
