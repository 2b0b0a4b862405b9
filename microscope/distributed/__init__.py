"""Multi-process training of the workload: DDP (+ comm-hook compression), FSDP2 (ZeRO-2/3) and DTensor
tensor parallel, pipeline parallel (``torch.distributed.pipelining``) and expert parallel (``all_to_all_single``).

``train_on_ranks`` spawns one process per rank and returns the merged training record, the full trained
weights and each rank's measured memory and communication (``launch``); the strategies are in
``strategies``; bytes on the wire are counted in ``counting``.
"""

from microscope.distributed.context import (
    RankContext,
    RankStep,
    Strategy,
    add_note,
    own_step,
    takes_own_step,
    takes_whole_batch,
    whole_batch,
)
from microscope.distributed.launch import train_on_ranks
from microscope.distributed.stats import DistributedResult, RankStats
from microscope.distributed.strategies import (
    STRATEGIES,
    ddp,
    ddp_powersgd,
    ddp_sign,
    ep,
    powersgd_claimed_reduction,
    pp,
    tp,
    zero2,
    zero3,
    zero3_offload,
)

__all__ = [
    "STRATEGIES",
    "DistributedResult",
    "RankContext",
    "RankStats",
    "RankStep",
    "Strategy",
    "add_note",
    "ddp",
    "ddp_powersgd",
    "ddp_sign",
    "ep",
    "own_step",
    "powersgd_claimed_reduction",
    "pp",
    "takes_own_step",
    "takes_whole_batch",
    "tp",
    "train_on_ranks",
    "whole_batch",
    "zero2",
    "zero3",
    "zero3_offload",
]
