"""Pipeline parallelism through ``torch.distributed.pipelining`` (one stage per rank, GPipe over microbatches)
against plain DDP, each on the same ranks (issue #26: "pipeline 8-GPU efficiency 78%").

The claim is about the pipeline bubble: GPipe with m microbatches on p stages keeps each stage busy
m / (m + p - 1) of the step. The records that carry it are train tokens/s against DDP, ``comm_time_share``
and ``comm_bytes_per_step``, with ``rank_param_bytes`` for what the split saves and the stability and
accuracy rows for an unchanged loss curve. The strategies are ``microscope.api.DISTRIBUTED_STRATEGIES``;
``pp`` ranks all receive the whole global batch (stage 0 uses the inputs, the last stage the targets).
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, register

#: Processes each arm trains on (gloo on a CPU, one GPU each with NCCL).
RANKS = 2


@register("pipeline_parallel")
class PipelineParallel(Ablation):
    """One pipeline stage per rank (GPipe over microbatches) vs data-parallel DDP."""

    arms = {
        "ddp": Arm(Role.BASELINE, f"plain DDP on {RANKS} ranks: each rank holds the whole model and trains on "
                                  "half of every global batch", ranks=RANKS, strategy=STRATEGIES["ddp"]),
        "pp": Arm(Role.CANDIDATE, "pipeline parallel: rank 0 holds the embedding and the first half of the "
                                  "blocks, rank 1 the rest, the final norm and the head; GPipe over 4 "
                                  "microbatches of the whole batch", ranks=RANKS, strategy=STRATEGIES["pp"]),
    }
