"""Peak memory: the most bytes held by tensors allocated during one call.

GPU: the CUDA caching allocator's peak-allocated counter, reset just before the call, minus what was
allocated before it. CPU: torch has no allocator statistics there, so a dispatch mode watches every
tensor storage that operators create during the call and frees it from the count when the storage
dies (where an operator refuses to run under a dispatch mode, the profiler's allocator events give
the same running peak). Both count only what the call allocates (outputs, workspaces, saved activations), never the
inputs, and neither is ever zero for a call that allocates an output.
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
import weakref
from collections.abc import Callable, Iterable, Iterator
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
        # an output on an argument's storage is a view (w.t(), x.view(...)) or an in-place result: nothing
        # was allocated, and counting it would charge tensors that existed before the call (weights, inputs)
        given = {a.untyped_storage().data_ptr() for a in self.tensors((args, kwargs)) if a.device.type == "cpu"}
        for t in self.tensors(out):
            if t.device.type == "cpu":
                storage = t.untyped_storage()
                ptr = storage.data_ptr()
                if ptr and ptr not in self._live and ptr not in given:
                    self._live[ptr] = storage.nbytes()
                    self.current += storage.nbytes()
                    self.peak = max(self.peak, self.current)
                    weakref.finalize(storage, self._release, ptr)
        return out

    def tensors(self, value: Any) -> Iterator[torch.Tensor]:
        """The tensors of a pytree whose storages are counted (a subclass may unwrap wrapper tensors)."""
        return (t for t in tree_flatten(value)[0] if isinstance(t, torch.Tensor))

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
    try:
        with LiveTensorBytes() as tracker:
            result = thunk()
            del result
        return int(tracker.peak), "cpu_live_tensor_bytes"
    except RuntimeError as exc:
        # Some operators build tensor subclasses (e.g. SDPA's CausalBias) that cannot be created under
        # a dispatch mode; the profiler's allocator events measure the same peak without one.
        if "subclass" not in str(exc):
            raise
    return _profiler_peak(thunk), "cpu_allocator_events"


def saved_for_backward_bytes(forward: Callable[[], Any], exclude: Iterable[torch.Tensor] = ()) -> int:
    """Bytes of the distinct storages autograd keeps from one ``forward`` call for its backward.

    Saved inputs count too: inside a model they are activations that would otherwise be freed, which is
    what an activation-memory claim is about (a peak measured around one operator never sees them,
    because the caller holds its inputs anyway). Storages of ``exclude`` (a model's parameters, which are
    held whether saved or not) are not counted.
    """
    skip = {(t.device.type, t.untyped_storage().data_ptr()) for t in exclude}
    kept: dict[tuple[str, int], int] = {}
    held: list[torch.Tensor] = []  # alive until the forward ends, so no two saved storages share an address

    def pack(t: torch.Tensor) -> None:
        # held here, not in the graph: packing the tensor itself makes an output its own grad_fn's saved
        # tensor, a reference cycle through C++ that the garbage collector cannot free (graphs stayed alive)
        storage = t.untyped_storage()
        key = (t.device.type, storage.data_ptr())
        if key not in skip:
            kept[key] = storage.nbytes()
        held.append(t)

    def unpack(_: None) -> torch.Tensor:
        raise RuntimeError("saved_for_backward_bytes measures a forward; its graph cannot run backward")

    with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
        out = forward()
    del out
    held.clear()
    return sum(kept.values())


@contextlib.contextmanager
def _stderr_silenced() -> Iterator[None]:
    """Kineto logs profiler start/stop lines straight to file descriptor 2; keep them off the table."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as devnull:
            os.dup2(devnull.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def _profiler_peak(thunk: Callable[[], Any]) -> int:
    """Peak of the running sum of CPU allocator events (allocations +, frees -) during the call."""
    from torch.profiler import ProfilerActivity, profile

    with _stderr_silenced(), profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = thunk()
        del result
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    current = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        current += event.nbytes()
        peak = max(peak, current)
    return peak
