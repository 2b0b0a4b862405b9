"""What a strategy is told about its rank, and where it leaves notes for the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

__all__ = ["RankContext", "Strategy", "add_note", "take_notes"]


@dataclass(frozen=True)
class RankContext:
    """One rank's place in the process group, handed to the strategy."""

    rank: int
    world_size: int
    device: torch.device  # cpu, or cuda:<local rank>
    backend: str  # "gloo" on CPU, "nccl" on CUDA


#: Wraps or shards the freshly built model on each rank and returns the module to train; must be a
#: picklable module-level callable (ranks are spawned processes).
Strategy = Callable[[torch.nn.Module, RankContext], torch.nn.Module]

_NOTES: list[str] = []


def add_note(text: str) -> None:
    """Record a caveat for ``DistributedResult.notes`` (per process: each rank is its own process)."""
    if text not in _NOTES:
        _NOTES.append(text)


def take_notes() -> list[str]:
    """The notes recorded so far in this process, clearing them."""
    out = list(_NOTES)
    _NOTES.clear()
    return out
