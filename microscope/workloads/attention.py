"""The attention swap point and rotary position embeddings.

Every attention module of the model calls ``attn_fn(q, k, v, causal) -> o`` with ``q, k, v`` shaped
``(batch, heads, seq, head_dim)`` and expects ``o`` shaped like ``q``. The default is
``EagerAttention``: the textbook math (scores, mask, softmax, weighted sum) materialised in full --
the "before" that fused kernels (FlashAttention, SDPA, a Triton kernel) are compared against.

Contract for a replacement ``attn_fn``:

* ``causal=True`` is only passed with ``q`` and ``k`` of the same length (training, evaluation and
  prefill): position ``i`` may attend to key positions ``<= i``.
* ``causal=False`` is passed for a decode step: one query that may see every cached key.
* the softmax scale is the replacement's own business; the model does not pass it. The default
  uses ``1/sqrt(head_dim)`` unless ``EagerAttention.scale`` is set.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
from torch import nn

__all__ = ["AttnFn", "EagerAttention", "RotaryEmbedding", "apply_rotary", "eager_attention"]

#: ``attn_fn(q, k, v, causal) -> o``; all tensors (B, H, S, D).
AttnFn = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def eager_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, scale: float | None = None
) -> torch.Tensor:
    """Plain attention: softmax(q k^T * scale + mask) v, softmax in float32.

    Memory traffic: writes and reads the full (B, H, Sq, Sk) score and probability matrices -- the
    quadratic cost that fused kernels avoid. For ``causal`` with ``Sq < Sk`` the mask is aligned to
    the end (query ``i`` sees keys ``<= i + Sk - Sq``), the convention of cached decoding.
    """
    d = q.shape[-1]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    scores = torch.matmul(q, k.transpose(-2, -1)) * scale
    if causal:
        sq, sk = q.shape[-2], k.shape[-2]
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=q.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    probs = torch.softmax(scores.float(), dim=-1).to(v.dtype)
    return torch.matmul(probs, v)


class EagerAttention:
    """The default ``attn_fn``: ``eager_attention`` with a settable softmax ``scale``.

    ``scale=None`` means ``1/sqrt(head_dim)``. A plugin studying the scale (e.g. a temperature or a
    QK-norm recipe) sets ``block.attn.attn_fn.scale`` instead of replacing the function.
    """

    def __init__(self, scale: float | None = None) -> None:
        self.scale = scale

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        return eager_attention(q, k, v, causal, scale=self.scale)

    def __repr__(self) -> str:
        return f"EagerAttention(scale={self.scale})"


class RotaryEmbedding(nn.Module):
    """RoPE tables: ``forward(start, length, device) -> (cos, sin)``, each (length, head_dim), float32.

    Computed on demand for any positions, so evaluation beyond the training context (2x, 4x) simply
    uses positions the model never saw -- which is what the extrapolation measurement asks. The model
    holds one instance as ``model.rotary``; a plugin can replace it (e.g. NTK or linear scaling) with
    any module of the same signature.
    """

    def __init__(self, head_dim: int, base: float = 10000.0) -> None:
        super().__init__()
        if head_dim % 2:
            raise ValueError(f"RoPE needs an even head_dim, got {head_dim}")
        self.head_dim = head_dim
        self.base = base
        inv_freq = 1.0 / (base ** (torch.arange(0, head_dim, 2, dtype=torch.float64) / head_dim))
        self.register_buffer("inv_freq", inv_freq.float(), persistent=False)

    def forward(
        self, start: int, length: int, device: torch.device | str
    ) -> tuple[torch.Tensor, torch.Tensor]:
        pos = torch.arange(start, start + length, device=device, dtype=torch.float32)
        freqs = torch.outer(pos, self.inv_freq.to(device))
        angles = torch.cat((freqs, freqs), dim=-1)
        return angles.cos(), angles.sin()


def apply_rotary(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate channel pairs ``(i, i + D/2)`` of ``x`` (B, H, S, D) by the position angles; float32 math."""
    half = x.shape[-1] // 2
    xf = x.float()
    rotated = torch.cat((-xf[..., half:], xf[..., :half]), dim=-1)
    return (xf * cos + rotated * sin).to(x.dtype)
