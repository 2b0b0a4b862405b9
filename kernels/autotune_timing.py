"""The rooms' autotuning timer: how long each candidate configuration runs while an autotuner ranks them.

Triton's default spends 25 ms warming up and 100 ms timing every candidate, which made ranking tiles most of
a bench run's first calls (a few seconds per shape for a room with 20-30 candidates). The autotuner only
picks a configuration; the comparisons a run reports are timed by the harness afterwards.
"""

from __future__ import annotations

from collections.abc import Callable

import triton


def timer(warmup_ms: float, rep_ms: float) -> Callable:
    """A ``do_bench`` hook for ``triton.autotune`` that warms each candidate up for ``warmup_ms`` and takes
    the median over ``rep_ms`` of calls."""

    def bench(kernel_call, quantiles):  # noqa: ANN001, ANN202 - triton.autotune's hook signature
        return triton.testing.do_bench(kernel_call, warmup=warmup_ms, rep=rep_ms, quantiles=quantiles)

    return bench


#: The rooms' default: a 20 ms median is hundreds of calls of a microsecond kernel, tens of a millisecond one.
bench_candidate = timer(5, 20)
