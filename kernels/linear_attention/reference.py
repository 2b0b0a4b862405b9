"""Linear attention as the plain quadratic form, and Linformer's sequence projection, in PyTorch.

``linear_attention_reference`` materializes the (Sq, Sk) matrix ``A = phi(q) phi(k)^T`` (times the keys'
re-weighting ``exp(log_scale_j - r_i)``, masked when causal) and returns ``A v / (A 1 + eps)``. The kernel's
chunked recurrence is an exact re-association of this sum, so on float64 inputs it is the ground truth,
and in a variant's dtype it shows how much error plain PyTorch makes there.

``linformer_attention`` (Wang et al. 2020) is softmax attention over keys and values projected along the
sequence by (k, S) matrices E and F. Every projected key mixes every position, so it has no causal form:
asked for one it raises, rather than leak later tokens into earlier outputs.
"""

from __future__ import annotations

import math

import torch

__all__ = ["EPS", "linear_attention_reference", "linformer_attention", "linformer_projections", "reference_points"]

#: Added to the normalizer ``phi(q_i) . sum_j phi(k_j)``, which is 0 when every feature product vanishes
#: (cosFormer: a query with no positive coordinate); as in cosFormer's and FAVOR+'s code. Kernel and
#: reference add the same eps, so it is part of the function both compute.
EPS = 1e-6


def reference_points(key_log_scale: torch.Tensor, sq: int, causal: bool) -> torch.Tensor:
    """Per query row, the log-scale every weight ``exp(log_scale_j - r_i)`` is taken against: the running
    maximum over keys ``j <= i`` (causal, so nothing depends on later keys) or the maximum over all keys.
    Every weight is then <= 1 and the largest one is exactly 1. Shape (..., Sq)."""
    if causal:
        return torch.cummax(key_log_scale, dim=-1).values
    top = key_log_scale.amax(-1, keepdim=True)
    return top.expand(*key_log_scale.shape[:-1], sq)


def _weights(key_log_scale: torch.Tensor | None, r: torch.Tensor | None, rows: slice, sk: int, causal: bool,
             device: torch.device) -> torch.Tensor | None:
    """The (..., rows, Sk) re-weighting and causal mask as one factor (None: all ones)."""
    i = torch.arange(rows.start, rows.stop, device=device)[:, None]
    seen = torch.arange(sk, device=device)[None, :] <= i if causal else None
    if key_log_scale is None:
        return None if seen is None else seen
    # the log-scales carry no gradient (see features.py), so the (rows, Sk) exponent is updated in place
    expo = key_log_scale.detach()[..., None, :] - r.detach()[..., rows, None]
    if seen is not None:
        expo.masked_fill_(~seen, float("-inf"))
    return expo.exp_()


def linear_attention_reference(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, causal: bool = False,
                               key_log_scale: torch.Tensor | None = None, eps: float = EPS,
                               rows_per_step: int | None = None) -> torch.Tensor:
    """``(A v) / (A 1 + eps)`` with ``A_ij = phi(q_i) . phi(k_j) * exp(log_scale_j - r_i)``, masked ``j <= i``.

    Args:
        fq: (B, H, Sq, F) query features; fk: (B, H, Sk, F) key features; v: (B, H, Sk, D). One dtype.
        causal: only keys ``j <= i``; needs ``Sq == Sk``.
        key_log_scale: (B, H, Sk) per-key log-scale (``features.performer_features``), or None.
        eps: added to the normalizer.
        rows_per_step: evaluate that many query rows at a time (the same math, for a ground truth whose
            (Sq, Sk) matrix would not fit at once).

    Returns:
        (B, H, Sq, D) in fq's dtype.
    """
    sq, sk = fq.shape[-2], fk.shape[-2]
    if causal and sq != sk:
        raise ValueError(f"causal linear attention needs as many queries as keys, got Sq={sq}, Sk={sk}")
    r = None if key_log_scale is None else reference_points(key_log_scale, sq, causal)
    step = sq if rows_per_step is None else max(1, rows_per_step)
    outs = []
    for r0 in range(0, sq, step):
        rows = slice(r0, min(sq, r0 + step))
        # reads B*H*(Sq+Sk)*F, writes B*H*Sq*Sk
        a = torch.matmul(fq[..., rows, :], fk.transpose(-2, -1))
        w = _weights(key_log_scale, r, rows, sk, causal, fq.device)
        if w is not None:
            a = a * w.to(a.dtype) if w.dtype != torch.bool else a.masked_fill(~w, 0.0)
        # reads B*H*Sq*Sk + B*H*Sk*D, writes B*H*Sq*D
        outs.append(torch.matmul(a, v) / (a.sum(-1, keepdim=True) + eps))
    return torch.cat(outs, dim=-2)


def linformer_projections(seq: int, proj_len: int, gen: torch.Generator,
                          device: str | torch.device = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    """Linformer's E and F, (proj_len, seq) each, entries N(0, 1/proj_len) (the paper's fixed random
    projection, a JL embedding of the sequence axis), float32 on ``device``."""
    if proj_len < 1 or seq < 1:
        raise ValueError(f"seq and proj_len must be positive, got {seq} and {proj_len}")
    e, f = (torch.randn((proj_len, seq), generator=gen, dtype=torch.float32) / math.sqrt(proj_len)
            for _ in range(2))
    return e.to(device), f.to(device)


def linformer_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, e_proj: torch.Tensor,
                        f_proj: torch.Tensor, causal: bool = False, scale: float | None = None) -> torch.Tensor:
    """``softmax(q (E k)^T * scale) (F v)``: attention over ``proj_len`` mixtures of the keys and values.

    q: (B, H, Sq, D); k, v: (B, H, Sk, D); e_proj, f_proj: (proj_len, Sk). Non-causal only: row t of
    ``E k`` sums keys of every position, so no mask over projected keys can hide the later ones.
    """
    if causal:
        raise ValueError("Linformer has no causal form: each projected key mixes all positions, so a causal "
                         "model would see later tokens (see kernels/linear_attention/README.md)")
    if e_proj.shape[-1] != k.shape[-2] or f_proj.shape[-1] != v.shape[-2]:
        raise ValueError(f"E and F must be (proj_len, Sk={k.shape[-2]}), got {tuple(e_proj.shape)} and "
                         f"{tuple(f_proj.shape)}")
    scale = 1.0 / math.sqrt(q.shape[-1]) if scale is None else scale
    k_proj = torch.matmul(e_proj.to(k.dtype), k)
    v_proj = torch.matmul(f_proj.to(v.dtype), v)
    probs = torch.softmax(torch.matmul(q, k_proj.transpose(-2, -1)) * scale, dim=-1)
    return torch.matmul(probs, v_proj)
