"""Model level: the embedded causal LM with its softmax attention swapped for Performer or cosFormer linear
attention in every block (``Transformer.set_attention``), and FlashAttention as a GPU speed peer.

Linformer is not an arm: it projects keys and values along the sequence, so every projected key mixes
future positions into every query of a causal LM (``reference.linformer_attention`` refuses ``causal``);
the embedded workload has no bidirectional task to measure it on (README, "Linformer").
"""

from __future__ import annotations

import torch
from microscope_kernels.flash_attn.kernel import flash_attention

from microscope.api import Transformer, interpreting

from .features import feature_pair, orthogonal_projection
from .kernel import SUPPORTED_DIMS, linear_attention
from .reference import linear_attention_reference

__all__ = ["FeatureMapAttention", "model_chunk", "model_features", "use_cosformer", "use_flash", "use_performer"]

#: Seed of block ``i``'s Performer projection is ``_PROJECTION_SEED + i``: fixed per layer, so every seed
#: of a run shares the projections and the seeds' spread is over initialization and data order.
_PROJECTION_SEED = 24_000


def model_chunk() -> int:
    """The kernel's chunk at model level: 32 under the interpreter (one chunk of a 32-token context, four at 4x), 64 on
    a GPU. The chunk changes the association of the sums, not the function."""
    return 32 if interpreting() else 64


def model_features(head_dim: int) -> int:
    """Performer's random features at model level: 2 x head_dim, as many as cosFormer's (cos and sin
    halves), so the two arms carry states of the same size."""
    return 2 * head_dim


class FeatureMapAttention:
    """An ``attn_fn`` (``microscope.workloads.attention`` contract): feature map, then the chunked kernel.

    ``causal=True`` (training, evaluation, prefill: as many queries as keys) runs the kernel's causal
    recurrence. ``causal=False`` is a decode step: one query over the cached keys, the same sum as the last
    row of a prefill. For one query ``phi(q) phi(K)^T`` is a single (1, Sk) row, already linear in Sk, so the
    step runs the reference's form (``reference.linear_attention_reference``): the workload's cache holds K
    and V, not the (F, D) state a recurrent decoder would carry, and a chunked launch per generated token
    buys nothing (under the interpreter it was 40% of a model run). The Performer projection is held on the
    CPU and copied to each device once.
    """

    def __init__(self, feature_map: str, projection: torch.Tensor | None = None, chunk: int | None = None,
                 eager: bool = False) -> None:
        self.feature_map = feature_map
        self.projection = projection
        self.chunk = model_chunk() if chunk is None else chunk
        self.eager = eager
        self._on_device: dict[torch.device, torch.Tensor] = {}

    def _projection(self, device: torch.device) -> torch.Tensor | None:
        if self.projection is None:
            return None
        if device not in self._on_device:
            self._on_device[device] = self.projection.to(device)
        return self._on_device[device]

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        f = feature_pair(q, k, self.feature_map, self._projection(q.device))
        if not causal:
            return linear_attention_reference(f.q, f.k, v, False, f.key_log_scale)
        if self.eager:
            return linear_attention_reference(f.q, f.k, v, True, f.key_log_scale)
        return linear_attention(f.q, f.k, v, True, f.key_log_scale, self.chunk)

    def __repr__(self) -> str:
        features = "" if self.projection is None else f", features={self.projection.shape[0]}"
        how = "eager" if self.eager else f"chunk={self.chunk}"
        return f"FeatureMapAttention({self.feature_map}{features}, {how})"


def _check_head_dim(model: Transformer, features: int, eager: bool) -> None:
    head_dim = model.cfg.head_dim
    if not eager and (head_dim not in SUPPORTED_DIMS or features not in SUPPORTED_DIMS):
        raise ValueError(f"the linear-attention kernel supports head dims and feature dims {SUPPORTED_DIMS}; this "
                         f"model has head_dim {head_dim} and would use {features} features (set workload.model "
                         "d_model / n_heads)")


def use_performer(model: Transformer, eager: bool = False) -> None:
    """Every block attends through FAVOR+ features (``model_features(head_dim)``), its own seeded projection.
    ``eager`` runs the causal sums as the reference's quadratic form in plain PyTorch (the same function, fast
    enough on a CPU to train for hundreds of steps, where the interpreted kernel is not)."""
    head_dim = model.cfg.head_dim
    _check_head_dim(model, model_features(head_dim), eager)
    for i, block in enumerate(model.blocks):
        projection = orthogonal_projection(model_features(head_dim), head_dim,
                                           torch.Generator().manual_seed(_PROJECTION_SEED + i))
        block.attn.attn_fn = FeatureMapAttention("performer", projection, eager=eager)


def use_cosformer(model: Transformer, eager: bool = False) -> None:
    """Every block attends through cosFormer's ReLU features with cos/sin re-weighting (F = 2 x head_dim);
    ``eager`` as ``use_performer``'s."""
    _check_head_dim(model, 2 * model.cfg.head_dim, eager)
    model.set_attention(FeatureMapAttention("cosformer", eager=eager))


def use_flash(model: Transformer) -> None:
    """Exact softmax attention through flash_attn's fused kernel in every block: the speed and memory of
    softmax attention without eager's materialized scores, to set the linear arms against."""
    model.set_attention(flash_attention)
