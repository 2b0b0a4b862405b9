"""The mixed_precision plugin: fp32 vs bf16 autocast vs fp16 autocast + GradScaler.

A recipe-level change (``TrainRecipe.precision``): the weights and the optimizer stay in fp32, matmuls
run in the low-precision dtype under ``torch.autocast``, the loss is computed in fp32. fp16 adds a
dynamic loss scaler, whose scale changes and skipped steps the stability records count. Evaluation
and inference run under the same autocast as training, as a user of the arm would run them.
"""

from __future__ import annotations

from microscope.api import Ablation, Arm, Role, register


@register("mixed_precision")
class MixedPrecision(Ablation):
    """Autocast training in bf16 or fp16 (+ dynamic loss scaling) against plain fp32."""

    arms = {
        "fp32": Arm(Role.BASELINE, "fp32 weights and math", recipe={"precision": "fp32"}),
        "bf16": Arm(description="bf16 autocast, fp32 master weights", recipe={"precision": "bf16"}),
        "fp16": Arm(description="fp16 autocast + GradScaler (dynamic loss scale)", recipe={"precision": "fp16"}),
    }
