"""The layernorm_eps plugin: fixed LayerNorm epsilon vs an epsilon that grows with log(batch / 512).

Both arms use LayerNorm (``ModelConfig.norm = "layernorm"``, base epsilon 1e-5). The candidate's rule,
made precise: with ``n`` = tokens per training step (batch rows x context),

    eps(n) = 1e-5 * (1 + ln(max(n, 512) / 512))

so up to 512 tokens it equals the baseline's 1e-5, and it grows by 1e-5 per factor e above that
(1024 tokens: 1.69e-5; 2048: 2.39e-5; 16384: 4.47e-5). Like any hyperparameter chosen from the training
batch, it is fixed once -- by the first forward in training mode -- and kept for evaluation and
inference, whatever their batch.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import nn

from microscope.api import Ablation, Arm, Role, register

BASE_EPS = 1e-5
REFERENCE_TOKENS = 512


def batch_eps(tokens: int, base: float = BASE_EPS) -> float:
    """The candidate's epsilon for a training step of ``tokens`` tokens."""
    return base * (1.0 + math.log(max(tokens, REFERENCE_TOKENS) / REFERENCE_TOKENS))


class TrainBatchEpsLayerNorm(nn.LayerNorm):
    """``nn.LayerNorm`` whose epsilon becomes ``batch_eps`` of the first training batch's token count.

    Before that first training forward (e.g. a sanity probe in eval mode) it uses its base ``eps``.
    """

    def __init__(self, *args: object, **kwargs: object) -> None:
        super().__init__(*args, **kwargs)
        self.train_eps: float | None = None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and self.train_eps is None:
            self.train_eps = batch_eps(x.numel() // x.shape[-1], self.eps)
        eps = self.eps if self.train_eps is None else self.train_eps
        return F.layer_norm(x, self.normalized_shape, self.weight, self.bias, eps)


def train_batch_eps(model: nn.Module) -> None:
    """Swap every ``nn.LayerNorm`` of ``model`` for a ``TrainBatchEpsLayerNorm`` with the same weights."""
    swaps = [(parent, name, child) for parent in model.modules() for name, child in parent.named_children()
             if type(child) is nn.LayerNorm]
    if not swaps:
        raise TypeError("layernorm_eps needs a model with nn.LayerNorm norms (ModelConfig.norm='layernorm')")
    for parent, name, old in swaps:
        new = TrainBatchEpsLayerNorm(old.normalized_shape, eps=old.eps, bias=old.bias is not None,
                                     device=old.weight.device, dtype=old.weight.dtype)
        new.load_state_dict(old.state_dict())
        setattr(parent, name, new)


_LAYERNORM = {"norm": "layernorm", "norm_eps": BASE_EPS}


@register("layernorm_eps")
class LayerNormEps(Ablation):
    """LayerNorm epsilon 1e-5 * (1 + ln(max(tokens per step, 512) / 512)) against a fixed 1e-5."""

    arms = {
        "fixed": Arm(Role.BASELINE, "LayerNorm, eps = 1e-5", model=_LAYERNORM),
        "log_batch": Arm(description="LayerNorm, eps = 1e-5 * (1 + ln(max(tokens per step, 512) / 512))",
                         model=_LAYERNORM, patch=train_batch_eps),
    }
