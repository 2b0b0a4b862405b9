"""Which Triton kernels a block of GPU code builds or loads: the precompile tests' witness."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager


@contextmanager
def triton_builds() -> Iterator[list[tuple[str | None, bool | None]]]:
    """(kernel name, whether it came from Triton's disk cache) for every kernel Triton compiled or loaded from
    disk inside the block; kernels already in this process's memory leave no entry."""
    from triton import knobs

    seen: list[tuple[str | None, bool | None]] = []
    saved = knobs.compilation.listener
    knobs.compilation.listener = lambda **kw: seen.append((kw["metadata"].get("name"), kw.get("cache_hit")))
    try:
        yield seen
    finally:
        knobs.compilation.listener = saved
