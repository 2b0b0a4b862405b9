"""Greedy generation through the KV cache: the decode path whose speed and memory are measured."""

from __future__ import annotations

import torch

from microscope.workloads.model import Transformer

__all__ = ["generate_greedy"]


@torch.no_grad()
def generate_greedy(model: Transformer, prompt: torch.Tensor, new_tokens: int) -> torch.Tensor:
    """Greedy continuation (B, new_tokens) of ``prompt`` (B, S): one prefill, then cached decode steps.

    Greedy (argmax) keeps generation deterministic, so two variants' outputs can be compared token by
    token and a cache plugin's effect on the generated text is visible.
    """
    if new_tokens < 1:
        raise ValueError(f"new_tokens must be >= 1, got {new_tokens}")
    logits, cache = model.prefill(prompt)
    token = logits[:, -1].argmax(-1)
    out = [token]
    for _ in range(new_tokens - 1):
        token = model.decode_step(token, cache).argmax(-1)
        out.append(token)
    return torch.stack(out, dim=1)
