"""Evaluation of the language model: loss, perplexity, next-token accuracy, and the per-token record.

The per-token losses (float32, in a fixed token order: window by window, position by position) are
what the statistics engine pairs between variants -- the same token scored by baseline and candidate
-- so a small but consistent accuracy change is detectable where a difference of two means is not.

``evaluate_suite`` scores the in-domain validation split at the training context and at 2x and 4x
(positions the model never saw: RoPE extrapolation) over the same stretch of text, and the
out-of-domain split at the training context.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from microscope.workloads.batching import eval_windows
from microscope.workloads.corpus import Corpus
from microscope.workloads.train import PRECISIONS

__all__ = ["EvalResult", "evaluate", "evaluate_suite"]


@dataclass
class EvalResult:
    """One evaluation: summary numbers and the per-token arrays behind them."""

    name: str
    seq_len: int
    loss: float
    perplexity: float
    accuracy: float
    n_tokens: int
    n_windows: int
    token_losses: np.ndarray  # float32 (n_tokens,), window-major order
    token_correct: np.ndarray  # bool (n_tokens,), argmax == target


@torch.no_grad()
def evaluate(
    model: nn.Module,
    tokens: torch.Tensor,
    seq_len: int,
    max_tokens: int | None = None,
    batch_size: int = 8,
    device: torch.device | str | None = None,
    precision: str = "fp32",
    name: str = "val",
) -> EvalResult:
    """Score non-overlapping ``seq_len`` windows of ``tokens`` (at most ``max_tokens`` targets).

    The model runs in eval mode (restored afterwards); ``precision`` selects autocast as in training.
    Losses are computed in float32 from the logits.
    """
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    amp = PRECISIONS[precision]
    x_all, y_all = eval_windows(tokens, seq_len, max_tokens)
    was_training = model.training
    model.eval()
    losses, correct = [], []
    try:
        for i in range(0, x_all.shape[0], batch_size):
            x, y = x_all[i : i + batch_size].to(dev), y_all[i : i + batch_size].to(dev)
            with torch.autocast(dev.type, dtype=amp or torch.float32, enabled=amp is not None):
                logits = model(x)
            logits = logits.float()
            losses.append(F.cross_entropy(logits.flatten(0, 1), y.flatten(), reduction="none").cpu())
            correct.append((logits.argmax(-1) == y).flatten().cpu())
    finally:
        model.train(was_training)
    token_losses = torch.cat(losses).numpy().astype(np.float32)
    token_correct = torch.cat(correct).numpy()
    mean = float(token_losses.astype(np.float64).mean())
    return EvalResult(
        name=name,
        seq_len=seq_len,
        loss=mean,
        perplexity=math.exp(mean) if mean < 700 else math.inf,
        accuracy=float(token_correct.mean()),
        n_tokens=int(token_losses.size),
        n_windows=int(x_all.shape[0]),
        token_losses=token_losses,
        token_correct=token_correct,
    )


def evaluate_suite(
    model: nn.Module,
    corpus: Corpus,
    context: int,
    max_tokens: int,
    multipliers: Sequence[int] = (1, 2, 4),
    batch_size: int = 8,
    device: torch.device | str | None = None,
    precision: str = "fp32",
) -> dict[str, EvalResult]:
    """``val@1x``, ``val@2x``, ``val@4x`` (in-domain, at ``context`` times each multiplier) and ``ood@1x``.

    ``max_tokens`` is rounded down to a multiple of the longest sequence, so every length scores the
    very same tokens and a loss difference between lengths is due to the context alone.
    """
    longest = context * max(multipliers)
    budget = (max_tokens // longest) * longest
    if budget == 0:
        raise ValueError(
            f"max_tokens={max_tokens} is shorter than the longest evaluated sequence ({longest})"
        )
    results: dict[str, EvalResult] = {}
    for m in multipliers:
        name = f"val@{m}x"
        results[name] = evaluate(
            model, corpus.val, context * m, budget, max(1, batch_size // m), device, precision, name
        )
    results["ood@1x"] = evaluate(model, corpus.ood, context, budget, batch_size, device, precision, "ood@1x")
    return results
