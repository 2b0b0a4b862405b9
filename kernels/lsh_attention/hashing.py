"""Angular LSH as in Reformer: a vector's bucket is ``argmax([x R, -x R])`` for a random rotation ``R``.

Two vectors at a small angle land in the same bucket with high probability, so their dot product, the
attention score, is likely large where buckets agree. ``n_hashes`` rounds use independent rotations; the
rotations are an **input tensor** (drawn by ``draw_rotations`` from a seeded generator), so hashing is a
pure function of its inputs: the harness can rotate, check and replay it like q, k and v.

The projection runs in float64 whatever the input dtype: a bf16 variant and its float64 ground truth see the
same values (bf16 and fp32 upcast exactly), so they must also see the same buckets; an fp32 or TF32 GEMM
could round a near-tie differently in the two and make them attend to different keys.
"""

from __future__ import annotations

import torch

__all__ = ["check_n_buckets", "draw_rotations", "hash_vectors"]


def check_n_buckets(n_buckets: object) -> int:
    """``n_buckets`` as an int, or a ValueError saying why not: angular LSH buckets come in +/- pairs, so
    the count is even (or 1, which puts every vector in bucket 0)."""
    if isinstance(n_buckets, bool) or not isinstance(n_buckets, int) or n_buckets < 1:
        raise ValueError(f"n_buckets must be a positive integer, got {n_buckets!r}")
    if n_buckets != 1 and n_buckets % 2:
        raise ValueError(f"n_buckets must be 1 or even (angular LSH: argmax over [xR, -xR]), got {n_buckets}")
    return n_buckets


def draw_rotations(n_hashes: int, head_dim: int, n_buckets: int, gen: torch.Generator,
                   device: str | torch.device = "cpu") -> torch.Tensor:
    """(n_hashes, head_dim, n_buckets // 2) float32 standard normals: one random rotation per hash round,
    drawn on the CPU generator (the same numbers on every device), shared by every batch row and head."""
    check_n_buckets(n_buckets)
    if isinstance(n_hashes, bool) or not isinstance(n_hashes, int) or n_hashes < 1:
        raise ValueError(f"n_hashes must be a positive integer, got {n_hashes!r}")
    shape = (n_hashes, head_dim, n_buckets // 2)
    return torch.randn(shape, generator=gen, dtype=torch.float32).to(device)


def hash_vectors(x: torch.Tensor, rotations: torch.Tensor, n_buckets: int) -> torch.Tensor:
    """Buckets of ``x`` (..., S, D) in every round: int64 (n_hashes, ..., S), values in [0, n_buckets).

    Ties (measure zero for continuous inputs) go to the lower bucket, as ``argmax`` does.
    """
    check_n_buckets(n_buckets)
    if rotations.dim() != 3 or rotations.shape[1] != x.shape[-1] or rotations.shape[2] != n_buckets // 2:
        raise ValueError(f"rotations must be (n_hashes, head_dim={x.shape[-1]}, n_buckets // 2={n_buckets // 2}), "
                         f"got {tuple(rotations.shape)}")
    n_hashes = rotations.shape[0]
    lead = x.shape[:-1]
    if n_buckets == 1:
        return torch.zeros((n_hashes, *lead), dtype=torch.int64, device=x.device)
    with torch.no_grad():
        flat = x.detach().to(torch.float64).reshape(-1, x.shape[-1])
        rot = rotations.detach().to(device=x.device, dtype=torch.float64)
        proj = torch.matmul(flat, rot.permute(1, 0, 2).reshape(x.shape[-1], -1))  # (N, n_hashes * nb/2)
        proj = proj.reshape(-1, n_hashes, n_buckets // 2)
        buckets = torch.cat((proj, -proj), dim=-1).argmax(dim=-1)  # (N, n_hashes)
    return buckets.T.reshape(n_hashes, *lead).contiguous()
