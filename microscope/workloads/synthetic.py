"""Associative recall: a synthetic task whose answer is known by construction.

A sequence lists distinct key -> value pairs, then asks for one key's value::

    <bos>   ab3 cd7 ef1 ?cd        -> target "7"

Keys are ``key_len`` lowercase letters, values one digit (chance accuracy 10%). Solving it needs
attention to find the earlier occurrence of the query key -- exactly what attention changes (kernels,
approximations, KV-cache quantization) can break while the language-model loss barely moves. The
generator takes any context length, so a model trained at one length is tested at 2x and 4x.

By default the pairs fill the context (longer context = more pairs, and the answer can be further
away); a fixed ``n_pairs`` leaves the rest as left padding of spaces after BOS.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from microscope.seeding import derive_seed
from microscope.workloads.tokenizer import BOS

__all__ = ["AssociativeRecall", "RecallBatch", "recall_accuracy"]

_LETTERS = b"abcdefghijklmnopqrstuvwxyz"
_DIGITS = b"0123456789"
_SPACE, _QUERY = ord(" "), ord("?")


@dataclass
class RecallBatch:
    """Inputs ``x`` (B, L), targets ``y`` (B, L) = -100 except the last position, and the ``answer`` (B,)."""

    x: torch.Tensor
    y: torch.Tensor
    answer: torch.Tensor


@dataclass(frozen=True)
class AssociativeRecall:
    """Generator of associative-recall sequences over the byte vocabulary."""

    key_len: int = 2

    @property
    def pair_len(self) -> int:
        """Tokens per pair: key, value, space."""
        return self.key_len + 2

    @property
    def n_keys(self) -> int:
        return len(_LETTERS) ** self.key_len

    def max_pairs(self, context: int) -> int:
        """Pairs that fit: BOS + pairs + "?" + query key = context."""
        return (context - 2 - self.key_len) // self.pair_len

    def sample(
        self, batch_size: int, context: int, gen: torch.Generator, n_pairs: int | None = None
    ) -> RecallBatch:
        """``batch_size`` sequences of exactly ``context`` tokens; the model answers at the last position."""
        n = self.max_pairs(context) if n_pairs is None else n_pairs
        if n < 1 or n > self.max_pairs(context):
            raise ValueError(f"{n} pairs do not fit in context {context} (at most {self.max_pairs(context)})")
        if n > self.n_keys:
            raise ValueError(f"{n} distinct keys need key_len > {self.key_len} ({self.n_keys} keys)")
        keys = torch.rand(batch_size, self.n_keys, generator=gen).argsort(dim=1)[:, :n]  # distinct per row
        values = torch.randint(0, len(_DIGITS), (batch_size, n), generator=gen)
        which = torch.randint(0, n, (batch_size,), generator=gen)

        letters = torch.tensor(list(_LETTERS))
        digits = torch.tensor(list(_DIGITS))
        key_chars = torch.stack(
            [
                letters[(keys // len(_LETTERS) ** (self.key_len - 1 - j)) % len(_LETTERS)]
                for j in range(self.key_len)
            ],
            dim=-1,
        )  # (B, n, key_len)
        pairs = torch.cat(
            [key_chars, digits[values][..., None], torch.full((batch_size, n, 1), _SPACE)], dim=-1
        ).flatten(1)
        rows = torch.arange(batch_size)
        query = key_chars[rows, which]
        pad = context - 2 - self.key_len - n * self.pair_len
        x = torch.cat(
            [
                torch.full((batch_size, 1), BOS),
                torch.full((batch_size, pad), _SPACE),
                pairs,
                torch.full((batch_size, 1), _QUERY),
                query,
            ],
            dim=1,
        )
        answer = digits[values[rows, which]]
        y = torch.full_like(x, -100)
        y[:, -1] = answer
        return RecallBatch(x, y, answer)

    def batches(
        self, batch_size: int, context: int, seed: int, n_pairs: int | None = None
    ) -> Callable[[int], tuple[torch.Tensor, torch.Tensor]]:
        """``batches(step) -> (x, y)`` for training; step ``s`` depends only on ``(seed, s)``."""

        def at(step: int) -> tuple[torch.Tensor, torch.Tensor]:
            gen = torch.Generator().manual_seed(derive_seed(seed, "recall", step))
            b = self.sample(batch_size, context, gen, n_pairs)
            return b.x, b.y

        return at


@torch.no_grad()
def recall_accuracy(
    model: nn.Module,
    task: AssociativeRecall,
    context: int,
    n_examples: int = 256,
    seed: int = 0,
    batch_size: int = 32,
    n_pairs: int | None = None,
    device: torch.device | str | None = None,
) -> float:
    """Fraction of ``n_examples`` fresh sequences whose last-position argmax is the right value."""
    dev = torch.device(device) if device is not None else next(model.parameters()).device
    gen = torch.Generator().manual_seed(derive_seed(seed, "recall-eval", context))
    was_training = model.training
    model.eval()
    correct = 0
    try:
        for start in range(0, n_examples, batch_size):
            b = task.sample(min(batch_size, n_examples - start), context, gen, n_pairs)
            pred = model(b.x.to(dev))[:, -1].argmax(-1).cpu()
            correct += int((pred == b.answer).sum())
    finally:
        model.train(was_training)
    return correct / n_examples
