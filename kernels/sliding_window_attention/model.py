"""Model level: the embedded model's attention swapped for the sliding window, in every block or all but the
last, through the per-block swap point ``block.attn.attn_fn`` (``Transformer.set_attention`` sets all).

The window is a quarter of the model's training context, so evaluating at 2x and 4x the context (the
model-level generalization dimension) asks a model whose every token saw at most ``context / 4`` keys to
read 8x and 16x that many positions.
"""

from __future__ import annotations

import torch
from microscope_kernels.flash_attn.kernel import flash_attention

from microscope.api import ModelShapes, Transformer

from .kernel import SUPPORTED_HEAD_DIMS, sliding_window_attention
from .reference import masked_attention

__all__ = ["WindowAttention", "model_attention_calls", "use_full_flash_attention", "use_window_attention",
           "window_for"]


def window_for(context: int) -> int:
    """The model-level window: a quarter of the training context (at least one token)."""
    return max(1, context // 4)


class WindowAttention:
    """An ``attn_fn`` (``microscope.workloads.attention`` contract) running the causal sliding window.

    The model passes ``causal=True`` with as many queries as keys (training, evaluation, prefill) and
    ``causal=False`` for a one-token decode step over the cache. Both are the causal window here: the kernel
    aligns queries to the last keys, so the decode query is the last position and sees the last ``window``
    keys (and the global tokens), exactly what it saw as the last row of a prefill.

    ``eager=True`` computes the same mask with ``reference.masked_attention`` in plain PyTorch: the window's
    math at eager speed, so a CPU run can train long enough to separate the arms (the interpreted kernel
    takes minutes per step); the kernel's equality with it is the operator-level accuracy check.
    """

    def __init__(self, window: int, globals: int = 0, eager: bool = False) -> None:
        self.window = window
        self.globals = globals
        self.eager = eager

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        attend = masked_attention if self.eager else sliding_window_attention
        return attend(q, k, v, None, self.window, self.globals, causal=True)

    def __repr__(self) -> str:
        return f"WindowAttention(window={self.window}, globals={self.globals}{', eager' if self.eager else ''})"


def use_window_attention(model: Transformer, keep_full_last: bool = False, eager: bool = False) -> None:
    """Every block attends through a causal window of ``window_for(context)``; with ``keep_full_last`` the
    last block keeps the model's own full attention (the "full attention in the last layers" recipe);
    ``eager`` as ``WindowAttention``'s."""
    if not eager and model.cfg.head_dim not in SUPPORTED_HEAD_DIMS:
        raise ValueError(f"the window kernel supports head dims {SUPPORTED_HEAD_DIMS}; this model's is "
                         f"{model.cfg.head_dim} (set workload.model d_model / n_heads)")
    if keep_full_last and len(model.blocks) < 2:
        raise ValueError("keeping full attention in the last block needs at least 2 blocks (n_layers >= 2)")
    fn = WindowAttention(window_for(model.cfg.context), eager=eager)
    windowed = model.blocks[:-1] if keep_full_last else model.blocks
    for block in windowed:
        block.attn.attn_fn = fn


def use_full_flash_attention(model: Transformer) -> None:
    """Full causal attention through flash_attn's fused FA2 kernel in every block: the speed and memory of
    full attention without eager's materialized scores, to set the windowed arms against."""
    model.set_attention(flash_attention)


def model_attention_calls(shapes: ModelShapes, device: str) -> list[tuple[torch.Tensor, torch.Tensor, bool, bool]]:
    """(q, k, causal, backward) for each way a model of ``shapes`` calls its attention in the run's dtype, as
    small zero tensors of the call's lengths (the lengths pick the kernels' masked or unmasked tiles): the
    context causally (with the backward where the arm trains), the decode prompt (half the context), and one
    query over a cache of the prompt plus one token."""
    cfg = shapes.model
    prompt = max(1, cfg.context // 2)

    def zeros(seq: int) -> torch.Tensor:
        return torch.zeros((1, cfg.n_heads, seq, cfg.head_dim), device=device, dtype=shapes.dtype)

    return [(zeros(cfg.context), zeros(cfg.context), True, shapes.trains), (zeros(prompt), zeros(prompt), True, False),
            (zeros(1), zeros(prompt + 1), False, False)]
