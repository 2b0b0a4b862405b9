"""Data parallelism against one process, both on the same global batches: what N ranks buy in train
tokens/s (issue #26: "the embedded gpu profile on 2 and 4 GPUs, with scaling efficiency").

The baseline trains in one process on every global batch; ``ddp`` splits each batch over N ranks (rows
``rank::N``) and averages gradients, which is the same update (``tests/test_distributed.py`` checks the
losses), so the stability and accuracy rows should read "identical" and the throughput row carries the
claim. The closing table's "scaling eff." column is tokens/s over the baseline's, per rank. N is 2 here;
``--set workload.ranks=4`` runs the ``ddp`` arm on 4 (one GPU per rank with ``--device cuda``).
"""

from __future__ import annotations

from microscope.api import DISTRIBUTED_STRATEGIES as STRATEGIES
from microscope.api import Ablation, Arm, Role, register

#: Processes of the ``ddp`` arm unless the config's ``workload.ranks`` says otherwise.
RANKS = 2


@register("data_parallel")
class DataParallel(Ablation):
    """DDP on N ranks vs one process training on the same global batches."""

    arms = {
        "single": Arm(Role.BASELINE, "one process (one GPU with --device cuda) trains on every global batch"),
        "ddp": Arm(Role.CANDIDATE, f"DDP on {RANKS} ranks (workload.ranks to change): each rank holds the whole model "
                                   "and trains on rows rank::N of every global batch; gradients are averaged",
                   ranks=RANKS, strategy=STRATEGIES["ddp"]),
    }
