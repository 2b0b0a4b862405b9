"""Cheap sanity probes a patched model must pass before its numbers mean anything.

A patch that lets attention see future tokens (a dropped causal mask, a kernel ignoring ``causal``)
does not crash: it trains, and its loss looks *better*. ``future_leak`` catches it directly, in one
forward pass, before any training is spent on it.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["future_leak"]


@torch.no_grad()
def future_leak(
    model: nn.Module, seq_len: int = 32, batch_size: int = 2, seed: int = 0, vocab: int = 256
) -> float:
    """Largest change of the logits at positions ``< seq_len // 2`` when only later tokens change.

    0.0 for a causal model (bitwise: the earlier positions' computation never reads the later
    tokens); clearly positive when information flows backwards.
    """
    dev = next(model.parameters()).device
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
    x2 = x.clone()
    half = seq_len // 2
    x2[:, half:] = (x[:, half:] + 1 + torch.randint(0, vocab - 1, x[:, half:].shape, generator=gen)) % vocab
    was_training = model.training
    model.eval()
    try:
        a = model(x.to(dev))[:, :half].float()
        b = model(x2.to(dev))[:, :half].float()
    finally:
        model.train(was_training)
    return float((a - b).abs().max())
