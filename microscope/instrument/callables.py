"""Callables as modules: make an operator or a swapped function visible to module hooks.

Module hooks, divergence reports and op traces name what they see by module path. A plugin's
operator variant, or a model's swap point that holds a plain function (``block.attn.attn_fn``,
``mlp.act``), is not a module and would be invisible: its work would be attributed to the module
around it. ``OpModule`` wraps one callable; ``wrap_callables`` wraps a model's swap points for the
duration of a ``with`` block and puts the originals back afterwards.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator, Sequence
from typing import Any

from torch import nn

__all__ = ["SWAP_POINTS", "OpModule", "wrap_callables"]

#: Callable attributes of ``microscope.workloads`` modules that plugins swap (see its model docs).
SWAP_POINTS: tuple[str, ...] = ("attn_fn", "act")


class OpModule(nn.Module):
    """A parameter-free module around a callable, so that module hooks see an operator.

    Reading an attribute the module does not have falls through to the callable, so code that reads
    e.g. ``attn_fn.scale`` keeps working while the callable is wrapped.
    """

    def __init__(self, fn: Callable[..., Any], name: str | None = None) -> None:
        super().__init__()
        self.fn = fn
        self.op_name = name or getattr(fn, "__name__", type(fn).__name__)

    def forward(self, *args: Any, **kwargs: Any) -> Any:
        return self.fn(*args, **kwargs)

    def __getattr__(self, name: str) -> Any:
        try:
            return super().__getattr__(name)
        except AttributeError:
            fn = self.__dict__.get("fn")
            if fn is None:
                raise
            return getattr(fn, name)

    def extra_repr(self) -> str:
        return self.op_name


@contextlib.contextmanager
def wrap_callables(model: nn.Module, attrs: Sequence[str] = SWAP_POINTS) -> Iterator[list[str]]:
    """Inside the block, every plain callable attribute named in ``attrs`` is an ``OpModule``.

    Modules see ``block.attn.attn_fn`` as a submodule ``blocks.0.attn.attn_fn``, so hooks, divergence
    reports and op traces name the swapped function itself. Yields the wrapped modules' names. On
    exit the original callables are put back and the model has exactly its old submodules.
    """
    wrapped: list[tuple[nn.Module, str, Any]] = []
    names: list[str] = []
    try:
        for mod_name, module in list(model.named_modules()):
            for attr in attrs:
                value = module.__dict__.get(attr)
                if value is None or isinstance(value, nn.Module) or not callable(value):
                    continue
                setattr(module, attr, OpModule(value, attr))
                wrapped.append((module, attr, value))
                names.append(f"{mod_name}.{attr}" if mod_name else attr)
        yield names
    finally:
        for module, attr, value in reversed(wrapped):
            del module._modules[attr]
            setattr(module, attr, value)
