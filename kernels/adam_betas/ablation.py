"""The adam_betas plugin: AdamW's first-moment decay and epsilon.

Baseline: beta1 = 0.9, eps = 1e-8 (PyTorch's defaults). Candidate: beta1 = 0.95, eps = 1e-6, claimed to
converge about 20% faster to the same final loss. beta2 stays at the workload recipe's value (0.95 in
the embedded profiles) in both arms, so only the two named knobs move. The claim is checked by the
stability metric ``steps_to_baseline_loss`` (first step whose trailing mean loss reaches the
baseline's final loss of the same seed) together with ``final_loss`` and the paired ``val_loss``.
"""

from __future__ import annotations

from microscope.api import Ablation, Arm, Role, register

#: beta2 of both arms: the embedded profiles' value, kept fixed so only beta1 and eps differ.
BETA2 = 0.95


@register("adam_betas")
class AdamBetas(Ablation):
    """AdamW beta1 0.95 and eps 1e-6 against beta1 0.9 and eps 1e-8 (same beta2, lr and schedule)."""

    arms = {
        "beta1_0.9": Arm(Role.BASELINE, "AdamW beta1=0.9, eps=1e-8", recipe={"betas": (0.9, BETA2), "eps": 1e-8}),
        "beta1_0.95": Arm(description="AdamW beta1=0.95, eps=1e-6", recipe={"betas": (0.95, BETA2), "eps": 1e-6}),
    }
