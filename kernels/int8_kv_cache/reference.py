"""The "before" (eager attention over a bf16/fp16 cache) and the peer (SDPA over the same cache).

Memory traffic of one decode step, one query token per (batch, head), cache (B, H, T, D):

    eager : q @ k^T     read K (B*H*T*D*s)          write scores (B*H*T*s)
            softmax     read + write scores         (2*B*H*T*s)
            p @ v       read V (B*H*T*D*s)          write out (B*H*D*s)
            total ~ 2*B*H*T*D*s + 4*B*H*T*s: the cache dominates (D = 128: 98%)
    sdpa  : K + V read once: 2*B*H*T*D*s
    int8  : K + V int8 read once plus scales: 2*B*H*T*D + 8*B*H*T (per token, fp32 scales)
            = 0.516x the bf16 bytes at D = 128
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from microscope_kernels.int8_kv_cache.int8_query import quantize_query
from microscope_kernels.int8_kv_cache.kernel import dequantize_kv


def eager_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                           sm_scale: float | None = None) -> torch.Tensor:
    """softmax(q k^T * scale) v written out in eager ops; q (B, H, D), k/v (B, H, T, D)."""
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    scores = torch.matmul(q.unsqueeze(-2), k.transpose(-1, -2)) * scale  # (B, H, 1, T)
    return torch.matmul(torch.softmax(scores, dim=-1), v).squeeze(-2)


def sdpa_decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor,
                          sm_scale: float | None = None) -> torch.Tensor:
    """torch.nn.functional.scaled_dot_product_attention with a length-1 query."""
    return F.scaled_dot_product_attention(q.unsqueeze(-2), k, v, scale=sm_scale).squeeze(-2)


def int8_query_decode_attention(q: torch.Tensor, k_q: torch.Tensor, k_scale: torch.Tensor, v_q: torch.Tensor,
                                v_scale: torch.Tensor, granularity: str, sm_scale: float | None = None
                                ) -> torch.Tensor:
    """What the int8-query kernel computes, in float64: the query quantized exactly as the kernel
    does (``quantize_query``), scores = int8 q . int8 k x steps, over the dequantized V. Tests hold
    the kernel to this at fp32 rounding, and to unquantized attention within the int8 budget."""
    per_token = granularity == "token"
    values, step = quantize_query(q, None if per_token else k_scale)
    dots = torch.einsum("bhd,bhtd->bht", values.double(), k_q.double())
    scores = dots * step.double().unsqueeze(-1)
    if per_token:
        scores = scores * k_scale.double()
    scale = sm_scale if sm_scale is not None else 1.0 / math.sqrt(q.shape[-1])
    weights = torch.softmax(scores * scale, dim=-1)
    return torch.einsum("bht,bhtd->bhd", weights, dequantize_kv(v_q, v_scale, granularity, torch.float64))
