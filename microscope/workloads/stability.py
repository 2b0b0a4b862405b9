"""Training-stability definitions shared by the training loop and the measures: layer groups and loss spikes.

Kept apart from the loop so that the report and the statistics engine apply the same definitions to
stored loss curves without re-running anything.
"""

from __future__ import annotations

import numpy as np
from torch import nn

__all__ = ["layer_groups", "loss_spikes"]


def layer_groups(model: nn.Module) -> list[tuple[str, list[str]]]:
    """Parameter names grouped by layer, in model order: a numbered child of a ModuleList is one group
    (``blocks.0``, ``blocks.1``, ...), any other top-level child is one group (``embed``, ``norm``,
    ``lm_head``). Per-layer grad norms and update ratios are reported per group.
    """
    groups: dict[str, list[str]] = {}
    for name, param in model.named_parameters():
        if not param.requires_grad:
            continue
        parts = name.split(".")
        key = ".".join(parts[:2]) if len(parts) > 2 and parts[1].isdigit() else parts[0]
        groups.setdefault(key, []).append(name)
    return list(groups.items())


def loss_spikes(losses: np.ndarray, window: int = 20, k: float = 3.0) -> np.ndarray:
    """Boolean mask of loss spikes.

    Step ``t`` (``t >= window``) spikes when ``loss[t] > median(W) + k * MAD(W)``, where ``W`` is the
    previous ``window`` losses and ``MAD(W) = median(|W - median(W)|)`` (unscaled). Median and MAD
    rather than mean and standard deviation, so an earlier spike inside the window does not hide the
    next one. A non-finite loss is always a spike; a finite loss in the first ``window`` steps never is (no
    reference yet). Non-finite losses inside ``W`` are left out of the reference.
    """
    losses = np.asarray(losses, dtype=np.float64)
    if window < 1:
        raise ValueError(f"spike window must be >= 1, got {window}")
    spikes = ~np.isfinite(losses)
    for t in range(window, len(losses)):
        ref = losses[t - window : t]
        ref = ref[np.isfinite(ref)]
        if spikes[t] or ref.size == 0:
            continue
        med = np.median(ref)
        mad = np.median(np.abs(ref - med))
        spikes[t] = losses[t] > med + k * mad
    return spikes
