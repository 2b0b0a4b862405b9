"""Fixed-length windows from a token stream: seeded random ones for training, fixed ones for evaluation.

Training order must be identical for every variant of an ablation, so the batch of step ``s`` is a
pure function of ``(seed, s)``: it does not depend on how many batches were drawn before, on the model,
or on any global random state. Evaluation windows are non-overlapping and in stream order, so the
per-token losses of two variants line up token by token for paired statistics.
"""

from __future__ import annotations

import torch

from microscope.seeding import derive_seed

__all__ = ["WindowSampler", "eval_windows"]


class WindowSampler:
    """``sampler(step) -> (x, y)``: ``batch_size`` random windows of ``context`` tokens, y = x shifted by one.

    Start offsets are uniform over the stream (windows may cross document boundaries; EOS marks them),
    drawn from a generator seeded by ``derive_seed(seed, "windows", step)``.
    """

    def __init__(self, tokens: torch.Tensor, context: int, batch_size: int, seed: int) -> None:
        if tokens.dim() != 1:
            raise ValueError(f"WindowSampler needs a 1-D token stream, got shape {tuple(tokens.shape)}")
        if tokens.numel() < context + 2:
            raise ValueError(f"token stream of {tokens.numel()} tokens is too short for context {context}")
        self.tokens = tokens
        self.context = context
        self.batch_size = batch_size
        self.seed = seed
        self._offsets = torch.arange(context + 1)

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        gen = torch.Generator().manual_seed(derive_seed(self.seed, "windows", step))
        high = self.tokens.numel() - self.context - 1
        starts = torch.randint(0, high + 1, (self.batch_size,), generator=gen)
        windows = self.tokens[starts[:, None] + self._offsets].long()
        return windows[:, :-1], windows[:, 1:]


def eval_windows(
    tokens: torch.Tensor, seq_len: int, max_tokens: int | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Non-overlapping windows from the start of the stream: ``x[i] = tokens[i*L : (i+1)*L]``, y shifted.

    At most ``max_tokens`` predicted tokens (rounded down to whole windows). Using the same
    ``max_tokens`` for several ``seq_len`` scores the same stretch of text at every context length.
    """
    n_windows = (tokens.numel() - 1) // seq_len
    if max_tokens is not None:
        n_windows = min(n_windows, max_tokens // seq_len)
    if n_windows < 1:
        raise ValueError(
            f"cannot cut a window of {seq_len} tokens from {tokens.numel()} tokens"
            + (f" within max_tokens={max_tokens}" if max_tokens is not None else "")
        )
    span = tokens[: n_windows * seq_len + 1].long()
    x = span[:-1].view(n_windows, seq_len)
    y = span[1:].reshape(n_windows, seq_len)
    return x, y
