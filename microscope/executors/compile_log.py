"""One worker-log line per Triton kernel build, so a slow first call shows whether it compiled or hit the cache.

A group that spends seconds in its first call is either compiling (a specialization the precompile step
did not build) or loading binaries from Triton's disk cache; the line names the kernel, which of the two,
and the milliseconds, beside the phase stamps of the worker log.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any


def install(log: Callable[[str], None]) -> bool:
    """Hook Triton's compilation listener (Triton >= 3.4) to ``log``; False where this Triton has none."""
    try:
        from triton import knobs
    except ImportError:
        return False
    compilation = getattr(knobs, "compilation", None)
    if compilation is None or not hasattr(compilation, "listener"):
        return False

    def listener(*, src: Any, metadata: dict, metadata_group: dict, times: Any, cache_hit: bool) -> None:
        name = metadata.get("name") or getattr(getattr(src, "fn", None), "__name__", "?")
        how = "disk cache" if cache_hit else "compiled"
        log(f"triton {name}: {how}, {getattr(times, 'total', 0) / 1e3:.0f} ms "
            f"(warps {metadata.get('num_warps', '?')}, stages {metadata.get('num_stages', '?')})")

    compilation.listener = listener
    return True
