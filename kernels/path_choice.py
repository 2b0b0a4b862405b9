"""Which of several equal-output ways of making one call is the fastest on this GPU, timed once per shape.

Why: an autotuner ranks one kernel's configurations, but a call may also differ in how many launches, buffers
and casts it takes, and in how much host time that costs; whole calls, timed back to back, settle it on the
device at hand rather than by a rule that holds on one GPU. The harness times the runs; this only picks.
"""

from __future__ import annotations

import logging
import warnings
from collections.abc import Callable, Hashable, Mapping

import triton

#: Each choice with its timings (a worker's log shows it).
_LOG = logging.getLogger(__name__)


def fastest_path(chosen: dict[Hashable, str], key: Hashable, paths: Mapping[str, Callable[[], object]],
                 kernel: str) -> str:
    """The name of the fastest of ``paths`` (name -> a call making the whole output) for ``key``, each timed
    once; kept in ``chosen``, so later calls with that key only look it up. A path other than the first that
    fails here is left out with a warning (the first path's own failure is the call's)."""
    if key not in chosen:
        times = {}
        for index, (name, call) in enumerate(paths.items()):
            try:
                times[name] = triton.testing.do_bench(call, warmup=5, rep=20)
            except Exception as exc:  # noqa: BLE001 - a compile or launch failure of an alternative
                if index == 0:
                    raise
                warnings.warn(f"{kernel}: the {name} path failed on this GPU and is left out: {exc}", stacklevel=3)
        chosen[key] = min(times, key=times.__getitem__)
        timed = ", ".join(f"{name} {ms * 1000:.1f} us" for name, ms in times.items())
        _LOG.info(f"{kernel} {key}: the {chosen[key]} path ({timed})")
    return chosen[key]
