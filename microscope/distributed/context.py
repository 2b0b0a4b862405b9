"""What a strategy is told about its rank, and where it leaves notes for the result."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Protocol, TypeVar

import torch

from microscope.workloads.train import StepMetrics

__all__ = ["RankContext", "RankStep", "Strategy", "add_note", "own_step", "take_notes", "takes_own_step",
           "takes_whole_batch", "whole_batch"]


@dataclass(frozen=True)
class RankContext:
    """One rank's place in the process group, handed to the strategy."""

    rank: int
    world_size: int
    device: torch.device  # cpu, or cuda:<local rank>
    backend: str  # "gloo" on CPU, "nccl" on CUDA


#: Wraps or shards the freshly built model on each rank and returns the module to train; must be a
#: picklable module-level callable (ranks are spawned processes). By default a strategy is data parallel:
#: each rank trains on rows ``rank::world_size`` of every global batch and the merged loss is the ranks'
#: mean. One marked ``@whole_batch`` (model parallel, e.g. tensor parallel) gets the whole global batch on
#: every rank; all ranks then compute the same loss, and the merged loss and tokens are rank 0's. One marked
#: ``@own_step`` (pipeline parallel) also trains its rank itself: the module it returns has
#: ``rank_trainer(recipe, device, counter) -> RankStep``, which the launcher uses instead of ``RankTrainer``;
#: its ``step`` must return the same loss on every rank.
Strategy = Callable[[torch.nn.Module, RankContext], torch.nn.Module]

_S = TypeVar("_S", bound=Callable[..., torch.nn.Module])


def whole_batch(strategy: _S) -> _S:
    """Mark ``strategy`` as model parallel: every rank sees the whole global batch (not a 1/N slice)."""
    strategy.whole_batch = True  # type: ignore[attr-defined]
    return strategy


def takes_whole_batch(strategy: Strategy) -> bool:
    """Whether ``strategy`` was marked ``@whole_batch`` (the launcher then does not split batches)."""
    return bool(getattr(strategy, "whole_batch", False))


class RankStep(Protocol):
    """What the launcher drives on a rank: ``RankTrainer``, or an ``@own_step`` strategy's trainer."""

    params: list[torch.nn.Parameter]
    optimizer: torch.optim.Optimizer
    group_names: tuple[str, ...]

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepMetrics: ...


def own_step(strategy: _S) -> _S:
    """Mark ``strategy`` as owning its rank's training step (implies ``@whole_batch``); see ``Strategy``."""
    strategy.own_step = True  # type: ignore[attr-defined]
    return whole_batch(strategy)


def takes_own_step(strategy: Strategy) -> bool:
    """Whether ``strategy`` was marked ``@own_step`` (its module's ``rank_trainer`` trains the rank)."""
    return bool(getattr(strategy, "own_step", False))


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
