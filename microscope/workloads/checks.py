"""Cheap sanity probes a patched model must pass before its numbers mean anything.

A patch that lets attention see future tokens (a dropped causal mask, a kernel ignoring ``causal``)
does not crash: it trains, and its loss looks *better*. ``future_leak`` catches it directly, in one
forward pass, before any training is spent on it. ``repeat_noise`` measures how far the same forward
drifts from itself (a kernel adding split-K partial sums with atomics), so that drift is not read as a leak.
"""

from __future__ import annotations

import torch
from torch import nn

__all__ = ["PROBE_BATCH", "future_leak", "repeat_noise"]

#: Sequences per probe forward pass: the probe calls the model on ``PROBE_BATCH * seq_len`` rows.
PROBE_BATCH = 2


def _probe_tokens(seq_len: int, batch_size: int, seed: int, vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Random tokens, and a copy whose positions ``>= seq_len // 2`` all differ from the original's."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randint(0, vocab, (batch_size, seq_len), generator=gen)
    x2 = x.clone()
    half = seq_len // 2
    x2[:, half:] = (x[:, half:] + 1 + torch.randint(0, vocab - 1, x[:, half:].shape, generator=gen)) % vocab
    return x, x2


@torch.no_grad()
def _early_logit_change(model: nn.Module, x: torch.Tensor, others: list[torch.Tensor]) -> float:
    """Largest |logit change| at positions ``< seq_len // 2`` between ``x``'s forward and each of ``others``'."""
    dev = next(model.parameters()).device
    half = x.shape[1] // 2
    was_training = model.training
    model.eval()
    try:
        a = model(x.to(dev))[:, :half].float()
        return max(float((a - model(o.to(dev))[:, :half].float()).abs().max()) for o in others)
    finally:
        model.train(was_training)


def future_leak(
    model: nn.Module, seq_len: int = 32, batch_size: int = PROBE_BATCH, seed: int = 0, vocab: int = 256
) -> float:
    """Largest change of the logits at positions ``< seq_len // 2`` when only later tokens change.

    0.0 for a causal model with deterministic kernels (bitwise: the earlier positions' computation never
    reads the later tokens); clearly positive when information flows backwards.
    """
    x, x2 = _probe_tokens(seq_len, batch_size, seed, vocab)
    return _early_logit_change(model, x, [x2])


def repeat_noise(
    model: nn.Module, seq_len: int = 32, batch_size: int = PROBE_BATCH, seed: int = 0, repeats: int = 2,
    vocab: int = 256,
) -> float:
    """Largest change of the same logits as ``future_leak``'s when nothing changes: ``repeats`` more forwards
    of the very same tokens. 0.0 for deterministic kernels; the run-to-run drift of nondeterministic ones."""
    x, _ = _probe_tokens(seq_len, batch_size, seed, vocab)
    return _early_logit_change(model, x, [x] * repeats)
