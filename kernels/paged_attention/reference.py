"""The "before" (eager attention over a contiguous cache) and the peers (SDPA, flex_attention on it).

Every sequence has its own length: a contiguous cache (B, H, T, D) holds sequence b's tokens in
slots [0, seq_lens[b]) and padding after, which every function here masks out of the scores. One
query token per (batch, head), q (B, H, D); outputs (B, H, D).
"""

from __future__ import annotations

import functools
import math

import torch
import torch.nn.functional as F


def length_mask(seq_lens: torch.Tensor, max_len: int) -> torch.Tensor:
    """(B, max_len) bool: True at the slots each sequence holds."""
    return torch.arange(max_len, device=seq_lens.device)[None, :] < seq_lens[:, None]


def eager_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor,
                           sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale, masked past each length) v, written out in eager ops."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.unsqueeze(-2), k.transpose(-1, -2)).squeeze(-2) * scale  # (B, H, T)
    keep = length_mask(seq_lens, k.shape[2])[:, None, :]
    weights = torch.softmax(scores.masked_fill(~keep, -math.inf), dim=-1)
    return torch.matmul(weights.unsqueeze(-2), v).squeeze(-2)


def sdpa_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None,
                          sm_scale: float | None = None) -> torch.Tensor:
    """``F.scaled_dot_product_attention`` with a length-1 query; ``seq_lens=None`` means every
    sequence fills the cache (no mask, so torch may pick its fused flash/cuDNN kernels)."""
    mask = None if seq_lens is None else length_mask(seq_lens, k.shape[2])[:, None, None, :]
    return F.scaled_dot_product_attention(q.unsqueeze(-2), k, v, attn_mask=mask, scale=sm_scale).squeeze(-2)


@functools.cache
def _compiled_flex():  # noqa: ANN202 - torch's compiled callable
    from torch.nn.attention.flex_attention import flex_attention

    return torch.compile(flex_attention, dynamic=False)


def flex_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor | None,
                          compiled: bool = True) -> torch.Tensor:
    """flex_attention with a score_mod that masks past each length (none for full sequences).
    ``compiled=False`` runs flex's unfused eager path (tests on the CPU); the peer is the compiled one."""
    from torch.nn.attention.flex_attention import flex_attention

    score_mod = None
    if seq_lens is not None:
        def score_mod(score, b, h, q_idx, kv_idx):  # noqa: ANN001, ANN202 - flex's signature
            return torch.where(kv_idx < seq_lens[b], score, -math.inf)
    fn = _compiled_flex() if compiled else flex_attention
    return fn(q.unsqueeze(-2), k, v, score_mod=score_mod).squeeze(-2)
