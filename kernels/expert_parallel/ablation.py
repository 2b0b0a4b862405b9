"""Expert parallelism (each rank holds experts / N experts of every MoE layer, tokens dispatched to them with
``all_to_all_single``) against plain DDP on the same mixture-of-experts model, each on the same ranks (issue
#26: "expert parallel: 92% compute efficiency").

The claim is about throughput: train tokens/s against DDP, where every rank holds every expert and no token
leaves its rank. Both arms apply the same patch (every block's MLP becomes an upcycled ``MoE``), so the
comparison isolates where the experts live. ``rank_param_bytes`` (non-expert weights + E/N experts) says what
the split saves, ``comm_bytes_per_step`` and ``comm_time_share`` what the dispatch costs, and the stability
and accuracy rows that the loss curve is DDP's. The strategies are ``microscope.api.DISTRIBUTED_STRATEGIES``.
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, Transformer, register, use_moe

#: Processes each arm trains on (gloo on a CPU, one GPU each with NCCL).
RANKS = 2
#: Experts per MoE layer (divisible by RANKS) and experts per token.
EXPERTS, TOP_K = 4, 2


def moe(model: Transformer) -> None:
    """Both arms' patch: every block's MLP becomes a top-2 mixture of 4 experts upcycled from it."""
    use_moe(model, experts=EXPERTS, top_k=TOP_K)


@register("expert_parallel")
class ExpertParallel(Ablation):
    """MoE experts split across ranks (expert parallel, all-to-all dispatch) vs DDP holding every expert."""

    arms = {
        "ddp": Arm(Role.BASELINE, f"DDP on {RANKS} ranks of the MoE model ({EXPERTS} experts, top-{TOP_K}): each "
                                  "rank holds every expert and trains on half of every global batch",
                   patch=moe, ranks=RANKS, strategy=STRATEGIES["ddp"]),
        "ep": Arm(Role.CANDIDATE, f"expert parallel: each rank holds {EXPERTS // RANKS} experts of every MoE "
                                  "layer, tokens go to their experts' rank and back by all-to-all; the rest is "
                                  "DDP", patch=moe, ranks=RANKS, strategy=STRATEGIES["ep"]),
    }
