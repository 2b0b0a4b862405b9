"""CPU peak memory of a training run that may hold DTensors (FSDP2): ``LiveTensorBytes`` counting the
local storage inside tensor subclasses, whose own wrapper has none."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass
from torch.utils._pytree import tree_flatten

from microscope.measures.memory import LiveTensorBytes

__all__ = ["LocalTensorBytes", "plain_tensors"]


def plain_tensors(value: Any) -> Iterator[torch.Tensor]:
    """The ordinary tensors in a pytree, a wrapper subclass (DTensor, ...) replaced by its inner tensors."""
    for t in tree_flatten(value)[0]:
        if not isinstance(t, torch.Tensor):
            continue
        if is_traceable_wrapper_subclass(t):
            names, _ = t.__tensor_flatten__()
            yield from plain_tensors([getattr(t, n) for n in names])
        else:
            yield t


class LocalTensorBytes(LiveTensorBytes):
    """Live bytes of CPU storages created by operators while active, subclass outputs unwrapped; keeps the peak."""

    def tensors(self, value: Any) -> Iterator[torch.Tensor]:
        return plain_tensors(value)
