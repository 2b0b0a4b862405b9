"""How many SMs a CUDA device has: persistent kernels and split heuristics size their grids by it."""

from __future__ import annotations

import functools

import torch


@functools.cache
def _sm_count_of(index: int) -> int:
    return torch.cuda.get_device_properties(index).multi_processor_count


def sm_count(device: torch.device) -> int:
    """The number of streaming multiprocessors of ``device`` (the current CUDA device where it has no
    index), asked once per device: a decode step asks on every call."""
    return _sm_count_of(device.index if device.index is not None else torch.cuda.current_device())
