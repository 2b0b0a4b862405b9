"""Per-rank records of an arm trained on several processes (``Arm(ranks=N)``, ``microscope.distributed``).

Memory per rank is what a sharding strategy changes (ZeRO-3 holds ~1/N of the parameters), bytes
communicated per step what a compression hook changes; both are recorded beside the usual training
records, the largest rank's memory as the value (the rank that runs out first) and every rank in details.
"""

from __future__ import annotations

import pickle
from collections.abc import Callable, Sequence
from typing import Any

import torch

from microscope.model_measures import Measurement

__all__ = ["RANK_METRICS", "StepBatches", "picklable_batches", "rank_measurements"]

#: (dimension, metric) an arm on several ranks records in its train stage.
RANK_METRICS = [("memory", "rank_peak_bytes"), ("memory", "rank_param_bytes"), ("memory", "rank_grad_bytes"),
                ("memory", "rank_optimizer_bytes"), ("throughput", "comm_bytes_per_step"),
                ("throughput", "comm_time_share")]


class StepBatches:
    """The global batches of every step, computed once in the parent: what a rank process can unpickle
    when the workload's own sampler is a closure."""

    def __init__(self, batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]], steps: int) -> None:
        self.batches = [batches(step) for step in range(steps)]

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        return self.batches[step]


def picklable_batches(batches: Callable[[int], tuple[torch.Tensor, torch.Tensor]],
                      steps: int) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
    """``batches`` itself where it pickles (a ``WindowSampler``), else its ``steps`` batches precomputed."""
    try:
        pickle.dumps(batches)
        return batches
    except (pickle.PicklingError, AttributeError, TypeError):
        return StepBatches(batches, steps)


def rank_measurements(ranks: Sequence[Any], steps: int) -> list[Measurement]:
    """The ``RANK_METRICS`` of one run from its ``RankStats`` (one per rank)."""
    def per_rank(field: str) -> list[float]:
        return [getattr(r, field) for r in ranks]

    out = []
    for metric, field, what in (("rank_peak_bytes", "peak_bytes", "peak memory of the rank during training"),
                                ("rank_param_bytes", "param_bytes", "parameter bytes the rank holds"),
                                ("rank_grad_bytes", "grad_bytes", "gradient bytes the rank holds after backward"),
                                ("rank_optimizer_bytes", "optimizer_bytes", "optimizer-state bytes the rank holds")):
        values = per_rank(field)
        out.append(Measurement("memory", metric, float(max(values)), "bytes",
                               {"higher_is_better": False, "per_rank": values, "ranks": len(ranks),
                                "definition": f"largest over the ranks of the {what}"}))
    sent = [b / max(steps, 1) for b in per_rank("bytes_sent")]
    out.append(Measurement("throughput", "comm_bytes_per_step", float(sum(sent) / len(sent)), "bytes",
                           {"higher_is_better": False, "per_rank": sent, "ranks": len(ranks),
                            "definition": "bytes a rank passes to collectives per training step, mean over ranks"}))
    shares = [r.comm_s / sum(r.step_s) if sum(r.step_s) > 0 else float("nan") for r in ranks]
    out.append(Measurement("throughput", "comm_time_share", float(max(shares)), "ratio",
                           {"higher_is_better": False, "per_rank": shares, "ranks": len(ranks),
                            "definition": "seconds in collectives / seconds of the training steps, largest rank"}))
    return out
