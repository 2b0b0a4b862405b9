"""Launch an already-compiled Triton kernel without Triton's per-call dispatch (hot paths: int8 decode,
fused LayerNorm+GeLU).

Why: one decode step's device time at B16 H32 T8192 is ~0.27 ms, and ``kernel[grid](...)`` spends
tens of microseconds of Python per launch before the kernel is queued: binding the arguments,
specializing each one, building the cache key, reading knobs, the autotuner's own key and pre-hook.
An int8 decode call launches two kernels with 15 and 7 arguments; the room's former host_cost.py measured the
whole call at 257 us of host time (median; rounds 197-341 us) on the H200 machine, about the
kernel's own time, so plain-launch decode could wait for Python. Through this launcher: 203 us
(173-219 us). The rest is spread over the wrapper's own Python (the README's "Host time per call").

How: the first call with a given specialization goes through the normal path (so compiling and
autotuning behave exactly as usual) and keeps the ``CompiledKernel`` that path returns, with the
autotuner's chosen config. Later calls that specialize the same way call that kernel's launcher
directly. The key holds what Triton specializes a launch on: each tensor's dtype and 16-byte
alignment, each integer's equality to 1, divisibility by 16 and 32-bit range, each descriptor's
dtype and block shape, constexpr values, the device; and the exact values of the autotuner's key
arguments, so an autotuner that would tune a new key still does. A launch hook (a profiler such as
proton) or the CPU interpreter sends every call down the normal path.

A hot path that calls one shape again and again can go further with ``bind``: the grid is worked out
once and each call checks only its tensors' dtypes and alignment, the caller keying the bound launch on
everything else (int4 decode: 21.5 -> 10.9 us of Python a call on the CI machine, launch faked).
"""

from __future__ import annotations

import os
from collections import OrderedDict
from collections.abc import Callable, Hashable, Sequence
from typing import Any, NamedTuple

import torch
import triton
from triton.runtime.autotuner import Autotuner, Heuristics
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor

#: Off (``MICROSCOPE_DIRECT_LAUNCH=0``): every call takes Triton's normal path; ``.ci/gpu_session.sh host``
#: compares the two (``compare --env-b MICROSCOPE_DIRECT_LAUNCH=0`` with host timing).
ENABLED = os.environ.get("MICROSCOPE_DIRECT_LAUNCH", "1").strip() != "0"
_I32 = range(-(2**31), 2**31)


def cdiv(a: int, b: int) -> int:
    """``triton.cdiv`` in plain Python for launch paths: Triton's is a constexpr function, ~2 us of host time a
    call on the CI machine (an int4 decode call made four such calls)."""
    return -(-a // b)


def next_power_of_2(n: int) -> int:
    """``triton.next_power_of_2`` in plain Python for ``n >= 1``, for the same reason as ``cdiv``."""
    return 1 << (n - 1).bit_length()


def specialization(value: Any, exact: bool = False) -> Hashable:
    """The part of ``value`` that Triton compiles a kernel for (``exact``: the value itself)."""
    if exact:
        return ("=", value)
    kind = type(value)  # exact-type checks first: this runs for every argument of every launch
    if kind is torch.Tensor:
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if kind is int:
        return ("int", value == 1, value % 16 == 0, value in _I32)
    if isinstance(value, torch.Tensor):
        return ("tensor", value.dtype, value.data_ptr() % 16 == 0)
    if isinstance(value, (bool, str)) or value is None:
        return ("=", value)
    if isinstance(value, int):
        return ("int", value == 1, value % 16 == 0, value in _I32)
    if isinstance(value, float):
        return ("float",)
    if isinstance(value, TensorDescriptor):
        return ("desc", value.base.dtype, tuple(value.block_shape), value.padding,
                getattr(value, "round_f32_to_tf32", False))  # triton >= 3.7
    return ("=", value)


def _hooked(hook: Any) -> bool:
    """Whether a launch hook is set: triton >= 3.5 keeps them in an always-present chain."""
    calls = getattr(hook, "calls", None)
    return bool(calls) if calls is not None else hook is not None


class _Entry(NamedTuple):
    """A specialization's compiled kernel and what completes its argument list on a direct launch."""

    compiled: Any
    tail: tuple[Any, ...]  # values of the parameters after the positional ones (constexprs, config)
    pre_hook: Callable[[dict[str, Any]], None] | None  # the autotuner config's, if any


class DirectLauncher:
    """``launcher(grid, *args, **constexprs)`` behaves as ``fn[grid](*args, **constexprs)`` for a
    ``triton.jit`` function or an autotuner over one; after the first call per specialization it
    launches the compiled kernel directly. Keeps the ``max_entries`` most recent specializations.
    Runtime arguments go positionally, constexprs by keyword (the order Triton kernels declare them).
    ``grid`` is a tuple, or (as in Triton) a callable of the launch's arguments by name, the autotuner's
    chosen config included: an autotuned tile size sets the number of programs."""

    def __init__(self, fn: JITFunction | Autotuner, max_entries: int = 64) -> None:
        self.fn = fn
        jit = fn
        while isinstance(jit, (Autotuner, Heuristics)):
            jit = jit.fn
        self._direct = isinstance(jit, JITFunction)  # False under the interpreter
        self.arg_names: list[str] = list(jit.arg_names) if self._direct else []
        tuned = frozenset(getattr(fn, "keys", ()))  # an autotuner tunes per exact key value
        self._exact = [name in tuned for name in self.arg_names]
        self._max_entries = max_entries
        self._entries: OrderedDict[Hashable, _Entry] = OrderedDict()
        #: (compiled kernel, launched directly?) of the latest call, for tests (None under the interpreter).
        self.last: tuple[Any, bool] | None = None

    def key(self, args: Sequence[Any], constexprs: dict[str, Any]) -> Hashable:
        """What a compiled kernel is reused for: device, each argument's specialization, constexprs."""
        device = triton.runtime.driver.active.get_current_device()
        spec = tuple(map(specialization, args, self._exact))
        return device, spec, tuple(constexprs.items())

    def __call__(self, grid: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]], *args: Any,
                 **constexprs: Any) -> None:
        hooks = triton.knobs.runtime
        if not (ENABLED and self._direct) or _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            self.last = (self.fn[grid](*args, **constexprs), False)
            return
        key = self.key(args, constexprs)
        entry = self._entries.get(key)
        if entry is None:
            self._first_launch(key, grid, args, constexprs)
            return
        self._entries.move_to_end(key)
        full = (*args, *entry.tail)
        if entry.pre_hook is not None or callable(grid):
            named = dict(zip(self.arg_names, full))
            if entry.pre_hook is not None:  # e.g. an autotuner config that sets the descriptors' block shape
                entry.pre_hook(named)
            if callable(grid):
                grid = grid(named)
        driver = triton.runtime.driver.active
        stream = driver.get_current_stream(key[0])
        compiled = entry.compiled
        grid_x, grid_y, grid_z = (*grid, 1, 1)[:3]
        compiled.run(grid_x, grid_y, grid_z, stream, compiled.function, compiled.packed_metadata, None, None, None,
                     *full)
        self.last = (compiled, True)

    def bind(self, grid: tuple[int, ...] | Callable[[dict[str, Any]], tuple[int, ...]], *args: Any,
             **constexprs: Any) -> BoundLaunch | None:
        """A launch of this call's compiled kernel with its grid worked out once, for a hot path that calls the
        same shape again and again (None until a call of this specialization has compiled it, or where direct
        launches are off, or where its config has a pre-hook). The caller keys the result on every value the
        grid and the non-tensor arguments depend on; the bound launch checks each tensor's dtype and alignment."""
        if not (ENABLED and self._direct):
            return None
        key = self.key(args, constexprs)
        entry = self._entries.get(key)
        if entry is None or entry.pre_hook is not None:
            return None
        if callable(grid):
            grid = grid(dict(zip(self.arg_names, (*args, *entry.tail))))
        return BoundLaunch(self, entry, (*grid, 1, 1)[:3], key[0], args, constexprs)

    def _first_launch(self, key: Hashable, grid: Any, args: Sequence[Any],
                      constexprs: dict[str, Any]) -> None:
        compiled = self.fn[grid](*args, **constexprs)
        self.last = (compiled, False)
        if compiled is None:
            return
        config = getattr(self.fn, "best_config", None)
        given = {**constexprs, **(config.all_kwargs() if config is not None else {})}
        try:
            tail = tuple(given[name] for name in self.arg_names[len(args):])
        except KeyError:  # a parameter left to its default: keep this specialization on the normal path
            return
        self._entries[key] = _Entry(compiled, tail, config.pre_hook if config is not None else None)
        if len(self._entries) > self._max_entries:
            self._entries.popitem(last=False)


class BoundLaunch:
    """``bound(*args)`` launches one compiled kernel on a fixed grid: ``DirectLauncher.bind``'s result. Its cost
    per call is a check of each tensor's dtype and 16-byte alignment against the bound call's and the launch
    itself; a tensor that differs, a registered launch hook or direct launches turned off send the call through the
    launcher instead."""

    __slots__ = ("_launcher", "_compiled", "_tail", "_grid", "_device", "_tensors", "_constexprs")

    def __init__(self, launcher: DirectLauncher, entry: _Entry, grid: tuple[int, int, int], device: Any,
                 args: Sequence[Any], constexprs: dict[str, Any]) -> None:
        self._launcher, self._compiled, self._tail, self._grid, self._device = launcher, entry.compiled, entry.tail, \
            grid, device
        self._tensors = tuple((i, a.dtype, a.data_ptr() % 16 == 0) for i, a in enumerate(args)
                              if isinstance(a, torch.Tensor))
        self._constexprs = constexprs

    def __call__(self, *args: Any) -> None:
        hooks = triton.knobs.runtime
        if not ENABLED or _hooked(hooks.launch_enter_hook) or _hooked(hooks.launch_exit_hook):
            self._launcher(self._grid, *args, **self._constexprs)
            return
        for i, dtype, aligned in self._tensors:
            tensor = args[i]
            if tensor.dtype != dtype or (tensor.data_ptr() % 16 == 0) != aligned:
                self._launcher(self._grid, *args, **self._constexprs)
                return
        compiled = self._compiled
        stream = triton.runtime.driver.active.get_current_stream(self._device)
        compiled.run(*self._grid, stream, compiled.function, compiled.packed_metadata, None, None, None, *args,
                     *self._tail)
        self._launcher.last = (compiled, True)
