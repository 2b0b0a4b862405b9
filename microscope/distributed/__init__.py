"""Multi-process data-parallel training of the workload: DDP (+ comm-hook compression) and FSDP2 (ZeRO-2/3).

``train_on_ranks`` spawns one process per rank and returns the merged training record, the full trained
weights and each rank's measured memory and communication (``launch``); the strategies are in
``strategies``; bytes on the wire are counted in ``counting``.
"""

from microscope.distributed.context import RankContext, Strategy, add_note
from microscope.distributed.launch import train_on_ranks
from microscope.distributed.stats import DistributedResult, RankStats
from microscope.distributed.strategies import (
    STRATEGIES,
    ddp,
    ddp_powersgd,
    ddp_sign,
    powersgd_claimed_reduction,
    zero2,
    zero3,
    zero3_offload,
)

__all__ = [
    "STRATEGIES",
    "DistributedResult",
    "RankContext",
    "RankStats",
    "Strategy",
    "add_note",
    "ddp",
    "ddp_powersgd",
    "ddp_sign",
    "powersgd_claimed_reduction",
    "train_on_ranks",
    "zero2",
    "zero3",
    "zero3_offload",
]
