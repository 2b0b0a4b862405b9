"""Per-rank measurements, the merged result, and the byte counts of what a rank holds."""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

import numpy as np
import torch
from torch import nn

from microscope.workloads.train import TrainResult

__all__ = ["DistributedResult", "RankStats", "held_bytes", "merge_train", "optimizer_state_bytes", "unwrap"]


@dataclass
class RankStats:
    """One rank's measurements over the training run (bytes are this rank's local shards)."""

    rank: int
    peak_bytes: int
    param_bytes: int
    grad_bytes: int
    optimizer_bytes: int
    bytes_sent: int
    comm_s: float
    step_s: list[float]
    step_bytes: list[int] = field(default_factory=list)  # bytes_sent per step (warm-up steps visible)


@dataclass
class DistributedResult:
    """A multi-rank training run: the merged per-step record, the full trained weights, each rank's stats."""

    train: TrainResult
    state_dict: dict[str, torch.Tensor]
    ranks: list[RankStats]
    notes: list[str]


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if hasattr(t, "to_local") else t  # DTensor -> this rank's shard


def held_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the local part of each distinct tensor (shared tensors count once, None skipped)."""
    seen: dict[int, int] = {}
    for t in tensors:
        if t is not None and id(t) not in seen:
            local = _local(t)
            seen[id(t)] = local.numel() * local.element_size()
    return sum(seen.values())


def optimizer_state_bytes(opt: torch.optim.Optimizer) -> int:
    """Bytes of the tensors in the optimizer's state (moments, step counters), local shards only."""
    return held_bytes(v for state in opt.state.values() for v in state.values() if isinstance(v, torch.Tensor))


def unwrap(model: nn.Module) -> nn.Module:
    """The user's module inside a DDP wrapper (FSDP2 shards in place, so it is its own module)."""
    return model.module if hasattr(model, "module") and isinstance(model.module, nn.Module) else model


def merge_train(results: list[TrainResult], whole_batch: bool = False) -> TrainResult:
    """One record from every rank's: loss is the mean of the ranks' local losses, tokens their sum, step
    time the slowest rank's; the other columns are rank 0's (identical across ranks after the reduction).
    ``whole_batch`` (every rank trained on the same global batch): loss and tokens are rank 0's too."""
    base = results[0]
    return TrainResult(
        loss=base.loss.copy() if whole_batch else np.mean([r.loss for r in results], axis=0),
        lr=base.lr,
        grad_norm=base.grad_norm,
        layer_grad_norm=base.layer_grad_norm,
        update_ratio=base.update_ratio,
        layer_update_ratio=base.layer_update_ratio,
        nan_count=base.nan_count,
        inf_count=base.inf_count,
        loss_scale=base.loss_scale,
        skipped=base.skipped,
        step_time=np.max([r.step_time for r in results], axis=0),
        tokens=base.tokens.copy() if whole_batch else np.sum([r.tokens for r in results], axis=0),
        layer_names=base.layer_names,
        spike_window=base.spike_window,
        spike_k=base.spike_k,
    )
