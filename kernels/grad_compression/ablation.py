"""Gradient compression through DDP communication hooks against plain DDP, on the same ranks (issue #26).

Claims: "1-bit gradient compression: 4x less communication" (and PowerSGD's low-rank compression) at a
loss curve close to DDP's. The records that carry them: ``comm_bytes_per_step`` (bytes each rank passes to
collectives, measured), the stability rows (final loss, steps to the baseline's loss) and the accuracy
rows of the trained model. The hooks are ``microscope.api.DISTRIBUTED_STRATEGIES``: PowerSGD is PyTorch's
(rank 1, error feedback, 2 uncompressed warm-up steps), the sign hook sends 1 bit per gradient element
plus one float32 scale (mean |g|) per gradient tensor, with error feedback.
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, register

#: Processes each arm trains on (gloo on a CPU, one GPU each with NCCL).
RANKS = 2


@register("grad_compression")
class GradCompression(Ablation):
    """PowerSGD and 1-bit sign compression of DDP's gradient all-reduce vs the plain all-reduce."""

    arms = {
        "ddp": Arm(Role.BASELINE, f"plain DDP on {RANKS} ranks: fp32 gradients all-reduced",
                   ranks=RANKS, strategy=STRATEGIES["ddp"]),
        "powersgd": Arm(Role.CANDIDATE, "PowerSGD rank-1 compression with error feedback (torch's hook)",
                        ranks=RANKS, strategy=STRATEGIES["ddp_powersgd"]),
        "sign": Arm(Role.CANDIDATE, "1-bit sign compression with a scale per gradient tensor and error feedback",
                    ranks=RANKS, strategy=STRATEGIES["ddp_sign"]),
    }
