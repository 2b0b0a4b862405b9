"""``Trainer`` for a wrapped or sharded model: layer groups by the user's module names, statistics over
whole (unsharded) gradients, and instrumentation kept out of the communication count."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Iterable
from typing import Any

import torch
import torch.distributed as dist
from torch import nn

from microscope.distributed.counting import CommCounter
from microscope.distributed.stats import unwrap
from microscope.workloads.stability import layer_groups
from microscope.workloads.train import StepMetrics, Trainer, TrainRecipe

__all__ = ["RankTrainer", "mark_rank_local"]

#: attribute set on a parameter only this rank holds (expert parallel's experts)
_RANK_LOCAL = "_microscope_rank_local"


def _is_dtensor(t: torch.Tensor) -> bool:
    return hasattr(t, "to_local")


def _local(t: torch.Tensor) -> torch.Tensor:
    return t.to_local() if _is_dtensor(t) else t


def mark_rank_local(params: Iterable[nn.Parameter]) -> None:
    """Mark parameters that only this rank holds (no other rank has a copy): like DTensor shards, their
    squared norms are summed across ranks for the global gradient norm and clipping."""
    for p in params:
        setattr(p, _RANK_LOCAL, True)


def _is_split(p: torch.Tensor) -> bool:
    """Whether ``p`` is one rank's part of the model (a DTensor shard or a rank-local parameter)."""
    return _is_dtensor(p) or getattr(p, _RANK_LOCAL, False)


class RankTrainer(Trainer):
    """One rank's ``Trainer``. With DTensor (FSDP2) parameters, whose statistics the base loop cannot take,
    gradient statistics and clipping move into an optimizer pre-step hook (same point in the step: after
    backward and unscaling, before the update) and are reduced across ranks. Tensor parallel mixes DTensor
    and replicated plain parameters, which ``clip_grad_norm_`` refuses: those are clipped by the reduced
    norm instead (torch's formula). Rank-local parameters (``mark_rank_local``: expert parallel's experts) go
    the same way as DTensor shards."""

    def __init__(self, model: nn.Module, recipe: TrainRecipe, device: torch.device, counter: CommCounter) -> None:
        super().__init__(model, recipe, device)
        self.counter = counter
        inner = unwrap(model)
        if inner is not model:  # DDP prefixes names with "module.": group by the user's module instead
            index = {id(p): i for i, p in enumerate(self.params)}
            named = dict(inner.named_parameters())
            self.groups = [(g, [index[id(named[n])] for n in names]) for g, names in layer_groups(inner)]
            if hasattr(inner, "set_checkpointing"):
                inner.set_checkpointing(recipe.checkpoint_every)
        self.split = torch.tensor([_is_split(p) for p in self.params])
        self.sharded = bool(self.split.any())
        self.mixed = self.sharded and not all(_is_dtensor(p) for p in self.params)
        if recipe.precision == "fp16" and any(getattr(p, _RANK_LOCAL, False) for p in self.params):
            raise ValueError("rank-local parameters (expert parallel) with fp16: each rank's GradScaler would "
                             "skip steps on its own experts' overflow alone; use fp32 or bf16")
        self._stats: dict[str, Any] = {}
        if self.sharded:
            self.instrument, self.clip = False, recipe.grad_clip
            self.recipe = dataclasses.replace(recipe, grad_clip=None)  # clipped in the hook instead
            self.optimizer.register_step_pre_hook(self._before_update)
            self.optimizer.register_step_post_hook(self._after_update)

    def _global_sums(self, values: torch.Tensor, sharded: torch.Tensor) -> torch.Tensor:
        """Per-tensor local sums -> global sums (sharded entries all_reduced), uncounted as traffic."""
        sharded = sharded.to(values.device)
        total = values * sharded
        with self.counter.paused():
            dist.all_reduce(total)
        return torch.where(sharded, total, values)

    def _norms(self, tensors: list[torch.Tensor]) -> tuple[torch.Tensor, torch.Tensor]:
        sq = self._global_sums(torch.stack([_local(t).float().pow(2).sum() for t in tensors]), self.split)
        return sq.sum().sqrt(), torch.stack([sq[idx].sum() for _, idx in self.groups]).sqrt()

    def _before_update(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        t0 = time.perf_counter()
        grads = [_local(p.grad) if p.grad is not None else _local(p).new_zeros(()) for p in self.params]
        total, per_group = self._norms([p.grad if p.grad is not None else torch.zeros_like(p) for p in self.params])
        counts = torch.stack([torch.stack([g.isnan().sum(), g.isinf().sum()]) for g in grads]).double()
        counts = torch.stack([self._global_sums(counts[:, i], self.split).sum() for i in range(2)])
        self._stats = {"grad_norm": float(total), "layer_grad_norm": per_group.tolist(),
                       "nan_count": int(counts[0]), "inf_count": int(counts[1]),
                       "prev": [p.detach().clone() for p in self.params]}
        spent = time.perf_counter() - t0
        if self.clip is not None and self.mixed:
            coef = torch.clamp(self.clip / (total + 1e-6), max=1.0)
            for p in self.params:
                if p.grad is not None:
                    _local(p.grad).mul_(coef.to(p.grad.device))
        elif self.clip is not None:
            torch.nn.utils.clip_grad_norm_(self.params, self.clip)
        self._stats["instrument_s"] = spent

    def _after_update(self, opt: torch.optim.Optimizer, args: Any, kwargs: Any) -> None:
        t0 = time.perf_counter()
        prev = self._stats.pop("prev")
        delta_total, delta_group = self._norms([p.detach() - q for p, q in zip(self.params, prev)])
        base_total, base_group = self._norms(prev)
        self._stats["update_ratio"] = float(delta_total / base_total)
        self._stats["layer_update_ratio"] = (delta_group / base_group).tolist()
        self._stats["instrument_s"] += time.perf_counter() - t0

    def step(self, step: int, x: torch.Tensor, y: torch.Tensor) -> StepMetrics:
        self._stats = {}
        metrics = super().step(step, x, y)
        if self.sharded and self._stats:  # an fp16 step the scaler skipped never reaches the hooks
            metrics.step_time -= self._stats.pop("instrument_s")
            self._stats.pop("prev", None)
            for name, value in self._stats.items():
                setattr(metrics, name, value)
        return metrics
