"""Peak memory: the most bytes held by tensors allocated during one call.

GPU: the CUDA caching allocator's peak-allocated counter, reset just before the call, minus what was
allocated before it. CPU: torch has no allocator statistics there, so a dispatch mode watches every
tensor storage that operators create during the call and frees it from the count when the storage
dies. Both count only what the call allocates (outputs, workspaces, saved activations), never the
inputs, and neither is ever zero for a call that allocates an output.
"""

from __future__ import annotations

import gc
import weakref
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten


class LiveTensorBytes(TorchDispatchMode):
    """Tracks live bytes of storages created by torch operators while active; keeps the peak."""

    def __init__(self) -> None:
        super().__init__()
        self._live: dict[int, int] = {}
        self.current = 0
        self.peak = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001
        out = func(*args, **(kwargs or {}))
        for t in tree_flatten(out)[0]:
            if isinstance(t, torch.Tensor) and t.device.type == "cpu":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and ptr not in self._live:
                    self._live[ptr] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, ptr)
        return out

    def _release(self, ptr: int) -> None:
        self.current -= self._live.pop(ptr, 0)


def peak_bytes(thunk: Callable[[], Any], device: str) -> tuple[int, str]:
    """Peak bytes allocated while ``thunk`` runs (its result is dropped first), and the method used."""
    gc.collect()
    if device == "cuda":
        torch.cuda.synchronize()
        torch.cuda.empty_cache()
        before = torch.cuda.memory_allocated()
        torch.cuda.reset_peak_memory_stats()
        result = thunk()
        torch.cuda.synchronize()
        peak = torch.cuda.max_memory_allocated() - before
        del result
        return int(peak), "cuda_allocator_peak"
    with LiveTensorBytes() as tracker:
        result = thunk()
        del result
    return int(tracker.peak), "cpu_live_tensor_bytes"
