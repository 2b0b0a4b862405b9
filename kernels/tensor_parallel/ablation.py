"""Tensor parallelism through DTensor (``parallelize_module``, Megatron layout) against plain DDP, each on the
same ranks (issue #26: "tensor parallel: communication ~12% of time").

The claim is about the share of step time spent communicating: the records that carry it are
``comm_time_share`` and ``comm_bytes_per_step``, with ``rank_param_bytes`` for what the split saves, the
stability and accuracy rows for an unchanged loss curve, and tokens/s for the cost. The strategies are
``microscope.api.DISTRIBUTED_STRATEGIES``; ``tp`` ranks all train on the whole global batch.
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, register

#: Processes each arm trains on (gloo on a CPU, one GPU each with NCCL).
RANKS = 2


@register("tensor_parallel")
class TensorParallel(Ablation):
    """Column/row-parallel attention and MLP projections (tensor parallel) vs data-parallel DDP."""

    arms = {
        "ddp": Arm(Role.BASELINE, f"plain DDP on {RANKS} ranks: each rank holds the whole model and trains on "
                                  "half of every global batch", ranks=RANKS, strategy=STRATEGIES["ddp"]),
        "tp": Arm(Role.CANDIDATE, "tensor parallel: q/k/v and MLP up/gate column-parallel, attention output and "
                                  "MLP down row-parallel, each rank on the whole batch",
                  ranks=RANKS, strategy=STRATEGIES["tp"]),
    }
