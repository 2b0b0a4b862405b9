"""The attn_scale_offset plugin: softmax(q k^T / (sqrt(d) + 0.07)) instead of softmax(q k^T / sqrt(d)).

A model patch through the workload's attention swap point: every block's default ``EagerAttention``
gets ``scale = 1 / (sqrt(head_dim) + OFFSET)``; nothing else changes (the baseline keeps
``scale=None``, i.e. ``1/sqrt(head_dim)``). The claim is about long text (+8% accuracy) and attention
collapse, so the evidence is the 2x/4x-context losses and the out-of-domain loss (generalization),
the paired validation loss and token accuracy, and the stability records.
"""

from __future__ import annotations

import math

from microscope.api import Ablation, Arm, EagerAttention, Role, Transformer, register

#: Added to sqrt(head_dim) in the denominator of the attention scores.
OFFSET = 0.07


def offset_scale(model: Transformer) -> None:
    """Set every block's eager attention scale to 1 / (sqrt(head_dim) + OFFSET)."""
    for block in model.blocks:
        fn = block.attn.attn_fn
        if not isinstance(fn, EagerAttention):
            raise TypeError(f"attn_scale_offset patches the default EagerAttention, found {fn!r}")
        fn.scale = 1.0 / (math.sqrt(block.attn.head_dim) + OFFSET)


@register("attn_scale_offset")
class AttnScaleOffset(Ablation):
    """Attention scores divided by sqrt(d) + 0.07 against the standard sqrt(d)."""

    arms = {
        "sqrt_d": Arm(Role.BASELINE, "scores / sqrt(head_dim)"),
        "sqrt_d_plus_0.07": Arm(description=f"scores / (sqrt(head_dim) + {OFFSET})", patch=offset_scale),
    }
