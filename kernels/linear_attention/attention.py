"""Linear attention over raw (B, H, S, D) queries, keys and values: a feature map, then the quadratic
reference or the chunked kernel. The plugin's variants and the model-level ``attn_fn`` are these two.

Both take the same arguments, so a variant, a peer and the float64 ground truth see one signature; the
baseline ignores ``chunk`` (it has no chunks), and ``projection`` is only read by the Performer map.
"""

from __future__ import annotations

import torch

from .features import feature_pair
from .kernel import linear_attention
from .reference import linear_attention_reference

__all__ = ["eager_linear_attention", "triton_linear_attention"]


def eager_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor | None = None,
                           feature_map: str = "performer", causal: bool = False, chunk: int = 64,
                           rows_per_step: int | None = None) -> torch.Tensor:
    """Feature map, then ``phi(q) phi(k)^T`` materialized, masked, normalized: plain PyTorch in q's dtype."""
    f = feature_pair(q, k, feature_map, projection)
    return linear_attention_reference(f.q, f.k, v, causal, f.key_log_scale, rows_per_step=rows_per_step)


def triton_linear_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, projection: torch.Tensor | None = None,
                            feature_map: str = "performer", causal: bool = False, chunk: int = 64) -> torch.Tensor:
    """Feature map (PyTorch), then the chunked Triton kernel on the features."""
    f = feature_pair(q, k, feature_map, projection)
    return linear_attention(f.q, f.k, v, causal, f.key_log_scale, chunk)
