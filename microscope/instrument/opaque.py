"""Make custom kernels visible as single ops: autograd.Function calls and Triton launches.

A fused kernel is usually reached through a custom ``torch.autograd.Function`` (so it can train) or
a bare Triton launch. Neither is an ATen op: a dispatch-level trace sees only the ATen ops *inside* a
Function's forward (allocations, copies) and nothing at all of a Triton launch on a GPU, and under
the Triton CPU interpreter the profiler sees a kernel as a scatter of ``aten::copy_``. To name them,
``label_calls`` temporarily wraps

* ``torch.autograd.Function.apply`` -> ``<FunctionName>`` (subclasses that override ``apply`` excepted),
* the backward node's ``apply`` -> ``<FunctionName>Backward``,
* ``triton.runtime.jit.JITFunction.run`` and the interpreter's ``InterpretedFunction.run``
  -> ``triton::<kernel name>`` (only when Triton is already imported; it is never imported here),

calling ``enter(name)`` before and ``exit(token)`` after each call. With ``detail=True`` the callbacks
also see the call's data, ``enter(name, args)`` and ``exit(token, result)`` (``result`` is None when
the call raised), which a dataflow capture needs to wire a Function's inputs to its outputs. The
patches are process-wide and exist only inside the ``with`` block; leaving it restores the original
methods.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Callable, Iterator
from typing import Any

import torch.autograd.function as autograd_function

__all__ = ["label_calls"]

_ABSENT = object()


def _triton_targets() -> list[type]:
    targets = []
    jit = sys.modules.get("triton.runtime.jit")
    if jit is not None and hasattr(jit, "JITFunction"):
        targets.append(jit.JITFunction)
    interp = sys.modules.get("triton.runtime.interpreter")
    if interp is not None and hasattr(interp, "InterpretedFunction"):
        targets.append(interp.InterpretedFunction)
    return targets


def _kernel_name(launcher: Any) -> str:
    fn = getattr(launcher, "fn", None)
    return f"triton::{getattr(fn, '__name__', None) or getattr(launcher, '__name__', 'kernel')}"


class _Callbacks:
    """``enter``/``exit`` called with or without the call's data, as ``label_calls`` was asked."""

    def __init__(self, enter: Callable[..., Any], exit: Callable[..., None], detail: bool) -> None:
        self.enter, self.exit, self.detail = enter, exit, detail

    def call(self, name: str, original: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        token = self.enter(name, args) if self.detail else self.enter(name)
        result = None
        try:
            result = original(*args, **kwargs)
            return result
        finally:
            if self.detail:
                self.exit(token, result)
            else:
                self.exit(token)


def _labelled_run(original: Any, callbacks: _Callbacks) -> Any:
    def run(self: Any, *args: Any, **kwargs: Any) -> Any:
        return callbacks.call(_kernel_name(self), lambda *a, **k: original(self, *a, **k), args, kwargs)

    return run


@contextlib.contextmanager
def label_calls(
    enter: Callable[..., Any],
    exit: Callable[..., None],
    *,
    functions: bool = True,
    triton: bool = True,
    detail: bool = False,
) -> Iterator[None]:
    """Inside the block, custom Functions (forward and backward) and Triton launches report themselves."""
    restore: list[tuple[type, str, Any]] = []
    callbacks = _Callbacks(enter, exit, detail)

    def patch(owner: type, attr: str, wrapper: Any) -> None:
        restore.append((owner, attr, owner.__dict__.get(attr, _ABSENT)))
        setattr(owner, attr, wrapper)

    try:
        if functions:
            fn_cls = autograd_function.Function
            original_apply = fn_cls.__dict__["apply"]

            def apply(cls: type, *args: Any, **kwargs: Any) -> Any:
                return callbacks.call(cls.__name__, original_apply.__get__(None, cls), args, kwargs)

            patch(fn_cls, "apply", classmethod(apply))
            bw_cls = autograd_function.BackwardCFunction
            original_bw = bw_cls.__dict__["apply"]

            def backward_apply(self: Any, *args: Any) -> Any:
                return callbacks.call(f"{self._forward_cls.__name__}Backward",
                                      lambda *a: original_bw(self, *a), args, {})

            patch(bw_cls, "apply", backward_apply)
        if triton:
            for target in _triton_targets():
                patch(target, "run", _labelled_run(target.run, callbacks))
        yield
    finally:
        for owner, attr, value in reversed(restore):
            if value is _ABSENT:
                delattr(owner, attr)
            else:
                setattr(owner, attr, value)
