"""The 2-D layout of axial attention and its two passes, defined once for every variant.

A sequence of ``S = rows * cols`` tokens is read row-major as a ``rows x cols`` grid: token ``p`` sits at
row ``p // cols``, column ``p % cols``. Axial attention attends along rows, then along columns:

    o_row = attend(q, k, v) within each row         (B*H*rows sequences of length cols)
    o     = attend(q, k, o_row) within each column  (B*H*cols sequences of length rows)

so every token reaches every other in two hops, for ``S * (rows + cols)`` scored pairs instead of ``S^2``.
The column pass reuses the same q and k and takes the row pass's output as its values (one operator, no
projections in between; the Axial Transformer puts projections between the passes). With ``causal`` both
passes are causal along their axis, so a token sees only tokens up and to the left of it (a subset of the
raster-order past). ``attend(q, k, v, causal)`` is any batched attention over (B, H', L, D) tensors: eager,
SDPA or the flash_attn kernel.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

__all__ = ["axial", "check_grid", "from_cols", "from_rows", "to_cols", "to_rows"]

Attend = Callable[[torch.Tensor, torch.Tensor, torch.Tensor, bool], torch.Tensor]


def check_grid(seq: int, rows: object, cols: object) -> None:
    """A ValueError saying why ``rows x cols`` cannot lay out ``seq`` tokens, if it cannot."""
    for name, value in (("rows", rows), ("cols", cols)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{name} must be a positive integer, got {value!r}")
    if rows * cols != seq:
        raise ValueError(f"a {rows} x {cols} grid holds {rows * cols} tokens, but the sequence has {seq}")


def to_rows(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(B, H, S, D) -> (B, H*rows, cols, D): one sequence per grid row (a view of a contiguous ``x``)."""
    b, h, _, d = x.shape
    return x.reshape(b, h * rows, cols, d)


def from_rows(y: torch.Tensor, heads: int) -> torch.Tensor:
    """The inverse of ``to_rows``."""
    b, _, cols, d = y.shape
    return y.reshape(b, heads, -1, d)


def to_cols(x: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    """(B, H, S, D) -> (B, H*cols, rows, D): one sequence per grid column (a transposing copy)."""
    b, h, _, d = x.shape
    return x.reshape(b, h, rows, cols, d).transpose(2, 3).reshape(b, h * cols, rows, d)


def from_cols(y: torch.Tensor, heads: int, rows: int, cols: int) -> torch.Tensor:
    """The inverse of ``to_cols``."""
    b, _, _, d = y.shape
    return y.reshape(b, heads, cols, rows, d).transpose(2, 3).reshape(b, heads, rows * cols, d)


def axial(attend: Attend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rows: int, cols: int,
          causal: bool) -> torch.Tensor:
    """Axial attention of (B, H, S, D) ``q``, ``k``, ``v`` on a ``rows x cols`` grid through ``attend``."""
    if q.dim() != 4 or q.shape != k.shape or k.shape != v.shape:
        raise ValueError(f"axial attention expects q, k, v of one (B, H, S, D) shape, got q{tuple(q.shape)} "
                         f"k{tuple(k.shape)} v{tuple(v.shape)}")
    check_grid(q.shape[2], rows, cols)
    heads = q.shape[1]
    o_row = from_rows(attend(to_rows(q, rows, cols), to_rows(k, rows, cols), to_rows(v, rows, cols), causal), heads)
    o_col = attend(to_cols(q, rows, cols), to_cols(k, rows, cols), to_cols(o_row, rows, cols), causal)
    return from_cols(o_col, heads, rows, cols)
