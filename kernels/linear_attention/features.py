"""Feature maps of linear attention, in one place: Performer's FAVOR+ and cosFormer.

Linear attention replaces ``softmax(q k^T) v`` by ``phi(q) phi(k)^T v`` normalized by ``phi(q) phi(k)^T 1``,
so the keys and values can be summed once into an (F, D) state. Everything here maps raw (B, H, S, D)
queries and keys to (B, H, S, F) features; the kernel and the reference then share the same inputs.

* **Performer (FAVOR+, Choromanski et al. 2021)**: positive random features
  ``phi(x)_r = exp(w_r . x' - |x'|^2 / 2)`` with ``x' = x / D^(1/4)``, so that
  ``E[phi(q) . phi(k)] = exp(q . k / sqrt(D))``, the softmax kernel. The rows ``w_r`` come from
  ``orthogonal_projection``: blocks of D mutually orthogonal directions with Gaussian (chi-distributed)
  lengths, an **input tensor** drawn from a seeded generator (no hidden state). The paper's 1/sqrt(F)
  factor is left out: it cancels between numerator and normalizer.
* **Stability**: each row's largest exponent is subtracted inside the exp (``exp(a - max_r a)``), as the
  FAVOR+ implementation does for queries. For a query that constant cancels between numerator and
  normalizer. For a key it does not (each key would be re-weighted), so the key's subtracted maximum is
  returned as a float32 ``log_scale`` and the attention puts it back as ``exp(log_scale_j - r_i)`` with a
  reference ``r_i`` that only depends on keys ``j <= i`` (the running maximum, causal) or on all keys
  (non-causal). The official code subtracts one maximum over the whole key sequence instead, which in a
  causal model lets future keys change the rounding of past ones; this choice keeps every feature <= 1
  (fp16-safe) and the causal output bitwise independent of later tokens. The maxima are treated as
  constants by autograd (they cancel in the ratio up to the normalizer's ``eps``).
* **cosFormer (Qin et al. 2022)**: ``relu`` features re-weighted by ``cos(pi/2 * (i - j) / M)``. Since
  ``cos(a - b) = cos a cos b + sin a sin b``, that is two linear-attention terms, which concatenate into one
  of ``F = 2 D`` features: ``phi(x_p) = [relu(x_p) cos(theta_p), relu(x_p) sin(theta_p)]``,
  ``theta_p = pi/2 * p / M``. ``M`` is the key length (the official code's ``max(src_len, tgt_len)``), so
  every weight lies in (0, 1]; queries are aligned to the last keys (position ``p = Sk - Sq + i``).
"""

from __future__ import annotations

import math
from typing import NamedTuple

import torch

__all__ = ["FEATURE_MAPS", "Features", "cosformer_features", "feature_pair", "orthogonal_projection",
           "performer_features"]

#: Feature maps by config name.
FEATURE_MAPS = ("performer", "cosformer")


class Features(NamedTuple):
    """Mapped queries and keys in the input dtype, and the keys' log-scales (None: no re-weighting)."""

    q: torch.Tensor
    k: torch.Tensor
    key_log_scale: torch.Tensor | None


def _compute_dtype(x: torch.Tensor) -> torch.dtype:
    """float64 stays float64 (the ground truth); every other dtype is mapped in float32."""
    return torch.float64 if x.dtype == torch.float64 else torch.float32


def orthogonal_projection(features: int, head_dim: int, gen: torch.Generator,
                          device: str | torch.device = "cpu") -> torch.Tensor:
    """FAVOR+'s (features, head_dim) projection: orthogonal blocks of ``head_dim`` rows, Gaussian lengths.

    Each block is the Q factor of a Gaussian matrix with the signs of R's diagonal folded in (a uniformly
    random rotation); each row is then scaled by the norm of an independent Gaussian vector, so its
    marginal law is N(0, I) as the unbiased estimator needs. Drawn on ``gen``'s device (the harness's CPU
    generator), returned float32 on ``device``.
    """
    if features < 1 or head_dim < 1:
        raise ValueError(f"features and head_dim must be positive, got {features} and {head_dim}")
    n_blocks = math.ceil(features / head_dim)
    gauss = torch.randn((n_blocks, head_dim, head_dim), generator=gen, dtype=torch.float32).double()
    q, r = torch.linalg.qr(gauss)  # one QR per block, batched
    blocks = (q * torch.sign(torch.diagonal(r, dim1=-2, dim2=-1))[:, None, :]).transpose(-2, -1)
    rows = blocks.reshape(n_blocks * head_dim, head_dim)[:features]
    lengths = torch.randn((features, head_dim), generator=gen, dtype=torch.float32).double().norm(dim=1)
    return (rows * lengths[:, None]).float().to(device)


def performer_features(x: torch.Tensor, projection: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """FAVOR+ positive features of (..., S, D) ``x`` with a (F, D) ``projection``.

    Returns ``phi`` (..., S, F) in x's dtype with each row's largest feature exactly 1, and the
    subtracted exponent (..., S) in float32 (float64 for float64 x): the true feature is
    ``exp(log_scale) * phi``.
    """
    if projection.dim() != 2 or projection.shape[1] != x.shape[-1]:
        raise ValueError(f"projection must be (features, head_dim={x.shape[-1]}), got {tuple(projection.shape)}")
    ct = _compute_dtype(x)
    xs = x.to(ct) * x.shape[-1] ** -0.25
    a = xs @ projection.to(device=x.device, dtype=ct).T - 0.5 * (xs * xs).sum(-1, keepdim=True)
    top = a.amax(-1, keepdim=True).detach()
    return torch.exp(a - top).to(x.dtype), top.squeeze(-1)


def cosformer_features(x: torch.Tensor, key_len: int) -> torch.Tensor:
    """cosFormer's features of (..., S, D) ``x`` at positions ``key_len - S .. key_len - 1``: (..., S, 2D)."""
    if x.shape[-2] > key_len:
        raise ValueError(f"cosFormer queries are aligned to the last keys: S={x.shape[-2]} > key_len={key_len}")
    ct = _compute_dtype(x)
    pos = torch.arange(key_len - x.shape[-2], key_len, device=x.device, dtype=ct)
    theta = (0.5 * math.pi / key_len) * pos[:, None]
    r = torch.relu(x.to(ct))
    return torch.cat((r * torch.cos(theta), r * torch.sin(theta)), dim=-1).to(x.dtype)


def feature_pair(q: torch.Tensor, k: torch.Tensor, feature_map: str,
                 projection: torch.Tensor | None = None) -> Features:
    """phi(q), phi(k) (and the keys' log-scales) of one feature map, as the kernel and reference take them."""
    if feature_map == "performer":
        if projection is None:
            raise ValueError("the performer feature map needs a projection (orthogonal_projection)")
        fq, _ = performer_features(q, projection)  # a query's own maximum cancels in its ratio
        fk, log_scale = performer_features(k, projection)
        return Features(fq, fk, log_scale)
    if feature_map == "cosformer":
        key_len = k.shape[-2]
        return Features(cosformer_features(q, key_len), cosformer_features(k, key_len), None)
    raise ValueError(f"feature_map must be one of {FEATURE_MAPS}, got {feature_map!r}")
