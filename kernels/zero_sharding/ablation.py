"""ZeRO stages through FSDP2 (``fully_shard``) against plain DDP, each on the same ranks (issue #26).

The claims ("ZeRO-3 trains models 10x the card's memory", "ZeRO-2 with offload: 8x memory saving") are
about memory per rank at an unchanged loss curve: the records that carry them are ``rank_param_bytes``,
``rank_optimizer_bytes``, ``rank_grad_bytes`` and ``rank_peak_bytes`` (largest rank), with the stability
and accuracy rows showing the loss curve and the trained model match DDP's, and ``comm_bytes_per_step``
and tokens/s what the sharding costs. The strategies are ``microscope.api.DISTRIBUTED_STRATEGIES``.
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, register

#: Processes each arm trains on (gloo on a CPU, one GPU each with NCCL).
RANKS = 2


@register("zero_sharding")
class ZeroSharding(Ablation):
    """FSDP2 sharding of gradients and optimizer state (ZeRO-2), of parameters too (ZeRO-3), with CPU offload."""

    arms = {
        "ddp": Arm(Role.BASELINE, f"plain DDP on {RANKS} ranks: every rank holds all parameters, gradients and "
                                  "optimizer state", ranks=RANKS, strategy=STRATEGIES["ddp"]),
        "zero2": Arm(Role.CANDIDATE, "fully_shard, parameters kept gathered between forward and backward: "
                                     "gradients and optimizer state sharded",
                     ranks=RANKS, strategy=STRATEGIES["zero2"]),
        "zero3": Arm(Role.CANDIDATE, "fully_shard, parameters resharded after forward: everything sharded",
                     ranks=RANKS, strategy=STRATEGIES["zero3"]),
        "zero3_offload": Arm(Role.CANDIDATE, "ZeRO-3 with parameters, gradients and optimizer state offloaded "
                                             "to CPU memory (CPUOffloadPolicy; a no-op on a CPU run)",
                             ranks=RANKS, strategy=STRATEGIES["zero3_offload"]),
    }
