"""Generation through the KV cache: greedy continuation, and scoring known text one cached step at a time.

Both go through ``prefill`` then ``decode_step``, the path a KV-cache change (int8 storage, a decode
kernel) acts on; the full-sequence forward used by training and ``evaluate`` never touches the cache.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F

from microscope.workloads.kv_cache import KVCache
from microscope.workloads.model import Transformer

__all__ = ["CachedScore", "generate_greedy", "score_through_cache"]


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


@dataclass
class CachedScore:
    """Per-token results of teacher-forced decoding; arrays are (B, scored) flattened row-major."""

    token_losses: np.ndarray  # float32 cross-entropy of each scored token
    token_correct: np.ndarray  # bool, argmax == the true token
    cache: KVCache  # the cache after the last step (its ``nbytes`` is the memory the text cost)

    @property
    def loss(self) -> float:
        return float(self.token_losses.mean())


@torch.no_grad()
def score_through_cache(model: Transformer, tokens: torch.Tensor, prefill_len: int) -> CachedScore:
    """Score ``tokens[:, prefill_len:]`` (B, S) the way generation would see them, teacher-forced.

    Prefill the first ``prefill_len`` tokens, then feed the true tokens one decode step at a time:
    every scored token is predicted from K and V that went through the cache (``model.cache_cls``).
    Losses are computed in float32 from the logits.
    """
    seq = tokens.shape[1]
    if not 1 <= prefill_len < seq:
        raise ValueError(f"prefill_len must lie in [1, {seq - 1}] for sequences of {seq} tokens, got {prefill_len}")
    was_training = model.training
    model.eval()
    try:
        logits, cache = model.prefill(tokens[:, :prefill_len])
        step_logits = [logits[:, -1].float()]
        for t in range(prefill_len, seq - 1):
            step_logits.append(model.decode_step(tokens[:, t], cache).float())
    finally:
        model.train(was_training)
    logits = torch.stack(step_logits, dim=1)  # (B, scored, V)
    targets = tokens[:, prefill_len:]
    losses = F.cross_entropy(logits.flatten(0, 1), targets.flatten(), reduction="none")
    correct = logits.argmax(-1).flatten() == targets.flatten()
    return CachedScore(losses.cpu().numpy().astype(np.float32), correct.cpu().numpy(), cache)
