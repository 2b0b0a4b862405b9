"""Model-level throughput: prefill and cached-decode tokens/s (training tokens/s: ``TrainResult``).

Each helper returns every timed repetition, not one number, so the statistics engine can put a
confidence interval on it. CUDA work is synchronised before each clock read.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from microscope.workloads.model import Transformer

__all__ = ["Throughput", "decode_throughput", "prefill_throughput"]


@dataclass
class Throughput:
    """``tokens`` processed per timed repetition and the seconds each repetition took."""

    tokens: int
    seconds: list[float]

    @property
    def samples(self) -> list[float]:
        """Tokens/s of each repetition."""
        return [self.tokens / s for s in self.seconds]

    @property
    def tokens_per_s(self) -> float:
        """Median over repetitions."""
        return statistics.median(self.samples)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


@torch.no_grad()
def prefill_throughput(
    model: Transformer, prompt: torch.Tensor, repeats: int = 5, warmup: int = 1
) -> Throughput:
    """Time ``model.prefill(prompt)`` (B, S): ``B * S`` tokens per repetition, after ``warmup`` untimed."""
    model.eval()
    seconds = []
    for i in range(warmup + repeats):
        _sync(prompt.device)
        t0 = time.perf_counter()
        model.prefill(prompt)
        _sync(prompt.device)
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    return Throughput(prompt.numel(), seconds)


@torch.no_grad()
def decode_throughput(
    model: Transformer, prompt: torch.Tensor, new_tokens: int, repeats: int = 3, warmup: int = 1
) -> Throughput:
    """Time ``new_tokens`` greedy decode steps through the KV cache after an (untimed) prefill of ``prompt``.

    ``B * new_tokens`` tokens per repetition; the cache starts at the prompt length, so the number
    depends on it -- keep the prompt fixed across variants.
    """
    model.eval()
    seconds = []
    for i in range(warmup + repeats):
        logits, cache = model.prefill(prompt)
        token = logits[:, -1].argmax(-1)
        _sync(prompt.device)
        t0 = time.perf_counter()
        for _ in range(new_tokens):
            token = model.decode_step(token, cache).argmax(-1)
        _sync(prompt.device)
        if i >= warmup:
            seconds.append(time.perf_counter() - t0)
    return Throughput(prompt.shape[0] * new_tokens, seconds)
