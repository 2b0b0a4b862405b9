"""Measured communication: the bytes each rank hands to collectives and the time spent in them.

Wraps the Python entry points of ``torch.distributed`` and its functional collectives (what comm hooks,
FSDP2 and DTensor call); the DDP reducer's built-in C++ allreduce is invisible here, so the ``ddp``
strategy routes it through torch's equivalent ``allreduce_hook``.
"""

from __future__ import annotations

import inspect
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol

__all__ = ["CommCounter"]

# function name -> the argument holding what this rank sends
_DIST = {
    "all_reduce": "tensor", "all_reduce_coalesced": "tensors", "all_gather": "tensor",
    "all_gather_single": "input_tensor", "all_gather_into_tensor": "input_tensor",
    "_all_gather_base": "input_tensor", "all_gather_coalesced": "input_tensor_list",
    "reduce_scatter": "input_list", "reduce_scatter_single": "input", "reduce_scatter_tensor": "input",
    "_reduce_scatter_base": "input", "broadcast": "tensor", "reduce": "tensor", "all_to_all": "input_tensor_list",
    "all_to_all_single": "input", "gather": "tensor", "scatter": "scatter_list", "send": "tensor",
    "isend": "tensor",
}
_FUNCOL = {
    "all_reduce": "self", "all_gather_tensor": "self", "all_gather_single": "self",
    "reduce_scatter_tensor": "self", "reduce_scatter_single": "self", "all_reduce_coalesced": "self",
    "all_gather_into_tensor_coalesced": "self", "reduce_scatter_tensor_coalesced": "inputs",
    "all_to_all_single": "self", "broadcast": "self", "all_gather_tensor_autograd": "self",
}
_ROOTED = {"broadcast": "src", "scatter": "src"}  # only the root sends


def _nbytes(value: Any) -> int:
    if isinstance(value, torch.Tensor):
        local = value.to_local() if hasattr(value, "to_local") else value
        return local.numel() * local.element_size()
    if isinstance(value, (list, tuple)):
        return sum(_nbytes(v) for v in value)
    return 0


class CommCounter:
    """While installed, adds up the bytes this rank passes to collectives and the seconds they take.

    ``seconds``: a synchronous call's wall time; for an async one, issue to completion of its future
    where the backend provides one (overlapped with compute, so this can exceed the step's exposed wait).
    """

    def __init__(self) -> None:
        self.bytes = 0
        self.calls = 0
        self.seconds = 0.0
        self._lock = threading.Lock()
        self._local = threading.local()
        self._saved: list[tuple[Any, str, Callable[..., Any]]] = []
        self._paused = False

    def _add_time(self, seconds: float) -> None:
        with self._lock:
            self.seconds += seconds

    def _wrap(self, name: str, fn: Callable[..., Any], arg: str) -> Callable[..., Any]:
        sig = inspect.signature(fn)
        counter = self

        def counted(*args: Any, **kwargs: Any) -> Any:
            if getattr(counter._local, "depth", 0) or counter._paused:  # nested call: count the outer one
                return fn(*args, **kwargs)
            bound = sig.bind_partial(*args, **kwargs)
            sent = _nbytes(bound.arguments.get(arg))
            root = _ROOTED.get(name)
            if root is not None and dist.is_initialized():
                src = bound.arguments.get(root)
                if src is not None and src != dist.get_rank():
                    sent = 0
            with counter._lock:
                counter.bytes += sent
                counter.calls += 1
            counter._local.depth = 1
            t0 = time.perf_counter()
            try:
                out = fn(*args, **kwargs)
            finally:
                counter._local.depth = 0
            if bound.arguments.get("async_op") and isinstance(out, dist.Work):
                try:
                    out.get_future().add_done_callback(lambda _f: counter._add_time(time.perf_counter() - t0))
                    return out
                except RuntimeError:  # backend without futures for this op: issue time only
                    pass
            counter._add_time(time.perf_counter() - t0)
            return out

        counted._microscope_counted = True  # type: ignore[attr-defined]
        return counted

    def install(self) -> None:
        # one wrapper per function: ``dist.isend`` must stay ``distributed_c10d.isend`` (P2POp checks identity)
        wrappers: dict[int, Callable[..., Any]] = {}
        for module, table in ((dist, _DIST), (dist.distributed_c10d, _DIST), (funcol, _FUNCOL)):
            for name, arg in table.items():
                fn = getattr(module, name, None)
                if fn is None or getattr(fn, "_microscope_counted", False):
                    continue
                self._saved.append((module, name, fn))
                if id(fn) not in wrappers:
                    wrappers[id(fn)] = self._wrap(name, fn, arg)
                setattr(module, name, wrappers[id(fn)])

    def uninstall(self) -> None:
        for module, name, fn in reversed(self._saved):
            setattr(module, name, fn)
        self._saved.clear()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """Collectives issued inside are not counted (instrumentation)."""
        self._paused, before = True, self._paused
        try:
            yield
        finally:
            self._paused = before

    @contextmanager
    def installed(self) -> Iterator[CommCounter]:
        self.install()
        try:
            yield self
        finally:
            self.uninstall()
