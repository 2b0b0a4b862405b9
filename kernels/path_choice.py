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
#: Interleaved timing rounds per path; a path's time is its best round.
ROUNDS = 3


def fastest_path(chosen: dict[Hashable, str], key: Hashable, paths: Mapping[str, Callable[[], object]],
                 kernel: str) -> str:
    """The name of the fastest of ``paths`` (name -> a call making the whole output) for ``key``; kept in
    ``chosen``, so later calls with that key only look it up. Each path is called once (compiling it), then
    timed in ``ROUNDS`` interleaved rounds and ranked by its best round, so that a GPU still raising its clocks
    after a compile, or any other passing slowdown, does not decide for one path. A path other than the first
    that fails here is left out with a warning (the first path's own failure is the call's)."""
    if key not in chosen:
        calls = {}
        for index, (name, call) in enumerate(paths.items()):
            try:
                call()
                calls[name] = call
            except Exception as exc:  # noqa: BLE001 - a compile or launch failure of an alternative
                if index == 0:
                    raise
                warnings.warn(f"{kernel}: the {name} path failed on this GPU and is left out: {exc}", stacklevel=3)
        rounds = {name: [] for name in calls}
        for _ in range(ROUNDS):
            for name, call in calls.items():
                rounds[name].append(triton.testing.do_bench(call, warmup=2, rep=8))
        times = {name: min(ms) for name, ms in rounds.items()}
        chosen[key] = min(times, key=times.__getitem__)
        timed = ", ".join(f"{name} {times[name] * 1000:.1f} us (rounds: {_microseconds(rounds[name])})"
                          for name in rounds)
        _LOG.info(f"{kernel} {key}: the {chosen[key]} path ({timed})")
    return chosen[key]


def _microseconds(times_ms: list[float]) -> str:
    return " / ".join(f"{ms * 1000:.1f}" for ms in times_ms)
