"""The grad_checkpoint plugin: activation checkpointing of every 2nd / every block vs none.

A recipe-level change: the arms differ only in ``TrainRecipe.checkpoint_every`` (the training loop
calls ``model.set_checkpointing``), so weights, data and numerics are otherwise identical. The claim
under test is about memory (activation memory O(n) -> O(sqrt n) layers) and speed (about one extra
forward per step); accuracy and stability should not move at all, since recomputation is exact.
"""

from __future__ import annotations

from microscope.api import Ablation, Arm, Role, register


@register("grad_checkpoint")
class GradCheckpoint(Ablation):
    """Activation checkpointing (torch.utils.checkpoint, non-reentrant) of every 2nd or every block."""

    arms = {
        "none": Arm(Role.BASELINE, "store every activation for backward (checkpoint_every=0)"),
        "every_2": Arm(description="recompute blocks 0, 2, 4, ... in backward", recipe={"checkpoint_every": 2}),
        "every_1": Arm(description="recompute every block in backward", recipe={"checkpoint_every": 1}),
    }
