"""The sparse attention mask, defined once: the token predicate, the seeded BigBird random pattern, and the
tile map that tells a kernel which (query tile, key tile) pairs to skip, to compute whole, or to mask.

Positions. Queries are aligned bottom-right, as in FlashAttention-2: with ``Sq`` queries and ``Sk`` keys,
query ``i`` sits at position ``p = i + Sk - Sq`` (``Sq <= Sk``). Self-attention (``Sq == Sk``) gives
``p = i``; a one-token decode step is the last position.

Predicate. Query position ``p`` sees key ``j`` when any of

* the window: ``|p - j| < window`` (``0 <= p - j < window`` when causal), so ``window = 1`` is the token
  itself, ``window = 0`` sees no neighbour at all;
* the global tokens: ``p < globals`` or ``j < globals`` (the first ``globals`` positions attend to and are
  attended by every token, Longformer's global attention and BigBird's global blocks);
* the random blocks: ``pairs[p // block, j // block]``, a (n_blocks, n_blocks) boolean matrix made from a
  seeded (n_blocks, r) pattern of key-block indices (BigBird);

holds, and, when causal, ``j <= p``. A query that sees no key outputs zero and gets zero gradient.

The pattern is an input tensor (seeded by whoever draws it, see ``random_block_pattern``), shared by every
batch row and head, so the kernel, the reference and the peers read the very same mask.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

__all__ = [
    "EMPTY",
    "FULL",
    "PARTIAL",
    "MaskSpec",
    "TileLists",
    "block_pairs",
    "count_visible",
    "dense_mask",
    "n_blocks",
    "random_block_pattern",
    "tile_classes",
    "tile_lists",
    "visible",
]

#: Tile classes: no visible pair (skipped), some (token mask applied), all (no mask at all).
EMPTY, PARTIAL, FULL = 0, 1, 2
#: Rows of the dense mask built at a time: bounds the temporaries of ``dense_mask`` at long lengths.
_DENSE_ROWS = 1024


@dataclass(frozen=True)
class MaskSpec:
    """The scalar half of the mask (the random pattern is the tensor half).

    ``block`` is BigBird's block size: the granularity of the random pattern only; it does not constrain
    the kernels' tiles.
    """

    window: int
    causal: bool
    globals: int = 0
    block: int = 64

    def __post_init__(self) -> None:
        for name in ("window", "globals", "block"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ValueError(f"{name} must be an integer, got {value!r}")
        if self.window < 0:
            raise ValueError(f"window must be >= 0 (0: no neighbours, 1: the token itself), got {self.window}")
        if self.globals < 0:
            raise ValueError(f"globals (number of global tokens) must be >= 0, got {self.globals}")
        if self.block < 1:
            raise ValueError(f"block (BigBird block size) must be >= 1, got {self.block}")


def n_blocks(seq: int, block: int) -> int:
    """BigBird blocks covering ``seq`` positions (the last one may be short)."""
    return -(-seq // block)


def random_block_pattern(spec: MaskSpec, seq: int, random_blocks: int, gen: torch.Generator,
                         device: torch.device | str = "cpu") -> torch.Tensor:
    """(n_blocks, random_blocks) int32 key-block indices per query block, -1 where a row has too few choices.

    As in BigBird, a query block draws its random key blocks among those that add new pairs: blocks holding
    no global key and no key inside the window of any of its queries, and (causal) lying wholly before it.
    Every row draws ``random_blocks`` distinct blocks uniformly (from the CPU generator ``gen``, so every
    device gets the same pattern).
    """
    if random_blocks < 0:
        raise ValueError(f"random_blocks must be >= 0, got {random_blocks}")
    nb = n_blocks(seq, spec.block)
    starts = torch.arange(nb) * spec.block
    ends = torch.clamp(starts + spec.block, max=seq) - 1  # inclusive
    q0, q1, k0, k1 = starts[:, None], ends[:, None], starts[None, :], ends[None, :]
    gap = torch.maximum(k0 - q1, q0 - k1)  # distance between the two blocks' intervals (<= 0: they overlap)
    allowed = (gap >= spec.window) & (k0 >= spec.globals)
    if spec.causal:
        allowed &= k1 < q0
    scores = torch.rand((nb, nb), generator=gen).masked_fill(~allowed, -1.0)
    take = min(random_blocks, nb)
    values, picks = torch.topk(scores, take, dim=1) if take else (scores[:, :0], scores[:, :0].long())
    pattern = torch.where(values >= 0, picks, -1).to(torch.int32)
    if take < random_blocks:
        pattern = torch.cat([pattern, pattern.new_full((nb, random_blocks - take), -1)], dim=1)
    return pattern.to(device)


def block_pairs(pattern: torch.Tensor | None, nb: int) -> torch.Tensor | None:
    """The (nb, nb) bool matrix of (query block, key block) pairs a (nb, r) pattern lists; -1 entries and
    entries outside [0, nb) list nothing. None where the pattern lists no block column."""
    if pattern is None or pattern.numel() == 0:
        return None
    if pattern.dim() != 2 or pattern.shape[0] != nb:
        raise ValueError(f"the random block pattern must be (n_blocks={nb}, r), got {tuple(pattern.shape)}")
    if pattern.is_floating_point() or pattern.is_complex():
        raise ValueError(f"the random block pattern holds block indices (an integer dtype), got {pattern.dtype}")
    cols = torch.arange(nb, device=pattern.device)
    return (pattern.long()[:, :, None] == cols).any(dim=1)


def visible(spec: MaskSpec, pairs: torch.Tensor | None, p: torch.Tensor, j: torch.Tensor) -> torch.Tensor:
    """The token predicate on broadcastable integer tensors of query positions ``p`` and key indices ``j``.

    Plain tensor arithmetic, so the same function serves the dense mask, pair counts and flex_attention's
    ``mask_mod``; block indices are clamped, so padded positions past the sequence index safely.
    """
    d = p - j
    low = 0 if spec.causal else 1 - spec.window
    seen = (d >= low) & (d < spec.window)
    if spec.globals:
        seen = seen | (p < spec.globals) | (j < spec.globals)
    if pairs is not None:
        last = pairs.shape[0] - 1
        seen = seen | pairs[torch.clamp(p // spec.block, max=last), torch.clamp(j // spec.block, max=last)]
    if spec.causal:
        seen = seen & (j <= p)
    return seen


def dense_mask(spec: MaskSpec, pairs: torch.Tensor | None, sq: int, sk: int,
               device: torch.device | str | None = None) -> torch.Tensor:
    """(Sq, Sk) bool: True where query ``i`` sees key ``j``. Built ``_DENSE_ROWS`` rows at a time."""
    _check_lengths(sq, sk)
    device = pairs.device if device is None and pairs is not None else device
    out = torch.empty((sq, sk), dtype=torch.bool, device=device)
    cols = torch.arange(sk, device=device)[None, :]
    for r0 in range(0, sq, _DENSE_ROWS):
        rows = torch.arange(r0, min(sq, r0 + _DENSE_ROWS), device=device)[:, None] + (sk - sq)
        out[r0:r0 + rows.shape[0]] = visible(spec, pairs, rows, cols)
    return out


def _check_lengths(sq: int, sk: int) -> None:
    if sq < 1 or sk < 1:
        raise ValueError(f"need at least one query and one key, got Sq={sq}, Sk={sk}")
    if sq > sk:
        raise ValueError(f"queries are aligned to the last keys (bottom-right): Sq={sq} must be <= Sk={sk}")


def tile_classes(spec: MaskSpec, pairs: torch.Tensor | None, sq: int, sk: int, block_m: int,
                 block_n: int, device: torch.device | str | None = None) -> torch.Tensor:
    """(ceil(Sq/block_m), ceil(Sk/block_n)) int8 of EMPTY / PARTIAL / FULL, without the dense mask.

    Computed from interval arithmetic per mask component, exactly for the window and the globals and from
    2-D prefix sums of ``pairs`` for the random blocks. A tile is PARTIAL when some component may show it a
    pair (a superset, so no visible pair is ever skipped), FULL only when one component alone covers every
    pair of a tile lying wholly inside both sequences (a subset, so a FULL tile never needs the mask).
    """
    _check_lengths(sq, sk)
    device = pairs.device if device is None and pairs is not None else device
    off = sk - sq
    qt = torch.arange(-(-sq // block_m), device=device)
    kt = torch.arange(-(-sk // block_n), device=device)
    p0 = (qt * block_m + off)[:, None]
    p1 = (torch.clamp((qt + 1) * block_m, max=sq) - 1 + off)[:, None]  # inclusive, clipped to the queries
    j0 = (kt * block_n)[None, :]
    j1 = (torch.clamp((kt + 1) * block_n, max=sk) - 1)[None, :]
    whole = (((qt + 1) * block_m <= sq)[:, None]) & (((kt + 1) * block_n <= sk)[None, :])

    # Window: the differences p - j over a tile fill [p0 - j1, p1 - j0]; the window admits [low, w - 1].
    w = spec.window
    low = 0 if spec.causal else 1 - w
    d0, d1 = p0 - j1, p1 - j0
    some = (d1 >= low) & (d0 <= w - 1) & (w > 0)  # window 0 admits nothing: [low, w - 1] is empty
    every = (d0 >= low) & (d1 <= w - 1) & (w > 0)
    # Causal: some pair has j <= p iff j0 <= p1; every pair iff j1 <= p0.
    some_causal = j0 <= p1 if spec.causal else torch.ones_like(some)
    every_causal = j1 <= p0 if spec.causal else torch.ones_like(some)
    g = spec.globals
    if g:
        some = some | ((j0 < g) & some_causal) | ((p0 < g) & ((j0 <= p0) if spec.causal else True))
        every = every | ((j1 < g) & every_causal) | ((p1 < g) & every_causal)
    if pairs is not None:
        rand_some, rand_every = _rectangles(pairs, spec.block, p0, p1, j0, j1)
        some = some | (rand_some & some_causal)
        every = every | (rand_every & every_causal)
    return some.to(torch.int8) + (some & every & whole).to(torch.int8)


def _rectangles(pairs: torch.Tensor, block: int, p0: torch.Tensor, p1: torch.Tensor, j0: torch.Tensor,
                j1: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Per tile: whether any, and whether all, of the (query block, key block) cells it overlaps are set."""
    nb = pairs.shape[0]
    sums = torch.zeros((nb + 1, nb + 1), dtype=torch.int32, device=pairs.device)
    sums[1:, 1:] = pairs.to(torch.int32).cumsum(0).cumsum(1)
    b0, b1 = torch.clamp(p0 // block, max=nb - 1), torch.clamp(p1 // block, max=nb - 1)
    c0, c1 = torch.clamp(j0 // block, max=nb - 1), torch.clamp(j1 // block, max=nb - 1)
    ones = sums[b1 + 1, c1 + 1] - sums[b0, c1 + 1] - sums[b1 + 1, c0] + sums[b0, c0]
    return ones > 0, ones == (b1 - b0 + 1) * (c1 - c0 + 1)


@dataclass(frozen=True)
class TileLists:
    """Per outer tile, the inner tiles to visit: ``index[t, :full[t]]`` whole, ``index[t, full[t]:count[t]]``
    masked, in ascending order within each group; the rest of the row is padding. int32, on the classes'
    device; ``index`` is as wide as the inner axis, so building it never waits for the GPU."""

    count: torch.Tensor
    full: torch.Tensor
    index: torch.Tensor


def tile_lists(classes: torch.Tensor) -> TileLists:
    """Row-wise lists of a (outer, inner) class matrix (pass ``classes.T`` for the lists per key tile)."""
    inner = classes.shape[1]
    cols = torch.arange(inner, device=classes.device, dtype=torch.int32)
    rank = (FULL - classes.to(torch.int32)) * inner + cols  # FULL first, then PARTIAL, then EMPTY
    index = torch.sort(rank, dim=1).values % inner
    return TileLists(count=(classes != EMPTY).sum(1, dtype=torch.int32),
                     full=(classes == FULL).sum(1, dtype=torch.int32),
                     index=index.to(torch.int32).contiguous())


def count_visible(spec: MaskSpec, pairs: torch.Tensor | None, sq: int, sk: int, tile: int = 64) -> int:
    """Visible (query, key) pairs, without the dense mask: FULL tiles whole, PARTIAL tiles pair by pair."""
    classes = tile_classes(spec, pairs, sq, sk, tile, tile, device="cpu")
    pairs = None if pairs is None else pairs.cpu()
    rows_in = torch.clamp(sq - torch.arange(classes.shape[0]) * tile, max=tile)
    cols_in = torch.clamp(sk - torch.arange(classes.shape[1]) * tile, max=tile)
    total = int(((classes == FULL) * rows_in[:, None] * cols_in[None, :]).sum())
    partial = (classes == PARTIAL).nonzero()
    offs = torch.arange(tile)
    for chunk in partial.split(1024):
        p = (chunk[:, 0] * tile)[:, None, None] + offs[None, :, None]
        j = (chunk[:, 1] * tile)[:, None, None] + offs[None, None, :]
        inside = (p < sq) & (j < sk)
        total += int((visible(spec, pairs, p + (sk - sq), j) & inside).sum())
    return total
