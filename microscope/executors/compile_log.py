"""Worker-log lines for Triton's builds and autotuning choices, and for the rooms' own choices, so a slow first
call or a swing between runs can be traced.

A group that spends seconds in its first call is either compiling (a specialization the precompile step
did not build) or loading binaries from Triton's disk cache; the line names the kernel, which of the two,
and the milliseconds, beside the phase stamps of the worker log. An autotuner's pick can differ from run to
run (candidates within noise of each other, or a short kernel timed with its launch), which moves every
later timing of that kernel: the line says which configuration won, against which runner-up, for which key.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from typing import Any

#: The logger a room reports its own per-shape choices to (INFO), e.g. which of two paths a shape keeps.
KERNELS_LOGGER = "microscope_kernels"


def install(log: Callable[[str], None]) -> bool:
    """Hook Triton's compilation listener (Triton >= 3.4) to ``log``; False where this Triton has none. The
    rooms' INFO lines (``KERNELS_LOGGER``) go to ``log`` as well."""
    install_kernel_log(log)
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
    _install_autotuning(knobs, log)
    return True


class _Forward(logging.Handler):
    """Hands each log record's message to a worker's ``log``."""

    def __init__(self, log: Callable[[str], None]) -> None:
        super().__init__(logging.INFO)
        self.log = log

    def emit(self, record: logging.LogRecord) -> None:
        self.log(record.getMessage())


def install_kernel_log(log: Callable[[str], None]) -> None:
    """Send the rooms' INFO lines to ``log`` (once: a second call replaces the first handler)."""
    logger = logging.getLogger(KERNELS_LOGGER)
    for handler in [h for h in logger.handlers if isinstance(h, _Forward)]:
        logger.removeHandler(handler)
    logger.addHandler(_Forward(log))
    logger.setLevel(logging.INFO)


def _install_autotuning(knobs: Any, log: Callable[[str], None]) -> None:
    """One line per autotuned key (Triton >= 3.7 calls a listener); older Triton prints its own lines."""
    autotuning = getattr(knobs, "autotuning", None)
    if autotuning is None:
        return
    if not hasattr(autotuning, "listener"):
        autotuning.print = True  # Triton 3.6: four lines per tuned key, on stdout (the worker's log)
        return

    def listener(*, fn: Any, key: Any, best_config: Any, configs_timings: dict | None, duration: float | None,
                 cache_hit: bool) -> None:
        name = getattr(fn, "__name__", "?")
        if cache_hit:
            log(f"triton autotune {name}: key {key}: {best_config} (autotuning cache)")
            return
        ranked = sorted((_ms(t), str(c)) for c, t in (configs_timings or {}).items())
        runner_up = f"; runner-up {ranked[1][1]} at {ranked[1][0]:.4g} ms" if len(ranked) > 1 else ""
        best = f" at {ranked[0][0]:.4g} ms" if ranked else ""
        took = f" in {duration:.1f} s" if duration is not None else ""
        log(f"triton autotune {name}: key {key}: {len(ranked)} candidates{took}, chose {best_config}{best}"
            f"{runner_up}")

    autotuning.listener = listener


def _ms(timing: Any) -> float:
    """A candidate's time: do_bench returns a float, or a list whose first entry is the median."""
    return float(timing[0] if isinstance(timing, (list, tuple)) else timing)
