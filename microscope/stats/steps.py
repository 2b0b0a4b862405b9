"""Steps and drift in a history of run-level values (one value per run, in date order).

A nightly benchmark is noisy from run to run (clocks, placement, the JIT's choices), so a fixed
threshold either cries wolf on a noisy night or misses a real 5% loss. Here the noise is measured from
the series itself and a change is reported only where it stands out of that noise:

step detection (asv's idea: a piecewise-constant fit)
    the series is fitted by segments of constant level, minimising the sum of absolute deviations from
    each segment's median plus a penalty per segment (optimal partitioning, solved exactly by dynamic
    programming). Absolute deviations and medians make one bad night cost little; the penalty is
    ``noise x (PENALTY_BASE + PENALTY_PER_LOG_N x ln n)``, so it scales with the measured noise and
    grows slowly with the series' length (more places a spurious split could hide). Every segment
    holds at least ``min_size`` runs (default 2): one odd night is an outlier, not a step, and the
    newest night alone is the gate's business, not the history's. A change point may only sit between
    two different commits (runs of one commit measure the same code). Each step found must then be
    larger than ``STEP_NOISE_FACTOR`` x the noise (the run-to-run band) and than ``min_change``;
    steps that are not are merged away and the fit is redone.
noise
    ``robust_noise``: the MAD of successive differences / sqrt(2), a standard deviation of one run's
    value that neither a step (one large difference) nor a slow drift inflates. ``noise_floor``
    (e.g. from the runs' own confidence intervals) keeps a short series that happens to look quiet
    from making every wiggle a step.
scale
    times, memory and rates are compared as ratios (logs): a step is "+5.0%". Accuracy, loss and
    stability metrics are compared as differences in their own units (``log_scale``).
drift
    a slow creep that no single night shows (0.3% a night for a month): Theil-Sen slope and the
    Mann-Kendall test (Kendall's tau against run order) over the runs since the last step; reported
    when significant and when the total change over those runs exceeds the step threshold.

Short series (fewer than ``2 x min_size`` usable runs) have no steps; NaN/Inf values (and, on the log
scale, non-positive ones) are skipped, and indices refer to the positions in the input.
"""

from __future__ import annotations

import heapq
import math
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

__all__ = [
    "Drift",
    "Step",
    "default_min_change",
    "detect_drift",
    "detect_steps",
    "log_scale",
    "robust_noise",
    "short_commit",
]

#: Penalty per segment, in units of the noise: ``PENALTY_BASE + PENALTY_PER_LOG_N * ln(n)``. Tuned by
#: simulation: flat Gaussian series of 4 to 200 runs show a false step in 2-4% of cases, and a +5%
#: step with 0.5% run-to-run noise is found at its commit in >= 96% of 5-night series.
PENALTY_BASE, PENALTY_PER_LOG_N = 4.0, 0.75
#: A step must move the level by more than this many noise standard deviations (the gate's 2 sigma band).
STEP_NOISE_FACTOR = 2.0
#: Mann-Kendall level for drift, and the fewest runs a drift is judged on.
DRIFT_ALPHA, DRIFT_MIN_RUNS = 0.01, 8
#: The last this many usable runs are searched for steps (the fit costs O(n^2)).
MAX_POINTS = 2000
_MAD_TO_SD = 1.4826


@dataclass(frozen=True)
class Step:
    """A change of level between two commits. ``change`` is relative (``after / before - 1``) on the log
    scale and a difference in the metric's units otherwise; ``noise`` is on the same scale."""

    index: int  # position in the input of the first run at the new level
    commit_before: str  # the last run at the old level
    commit_after: str  # the first run at the new level: the range before..after introduced the step
    level_before: float  # median of the old segment, in the metric's units
    level_after: float
    change: float
    relative: bool
    n_before: int
    n_after: int
    noise: float

    @property
    def commit_range(self) -> str:
        return f"{short_commit(self.commit_before)}..{short_commit(self.commit_after)}"

    def describe(self, unit: str = "") -> str:
        """``+5.0% (1.000 -> 1.050 ms) in abc1234..def5678``."""
        unit = f" {unit}" if unit else ""
        size = f"{self.change:+.1%}" if self.relative else f"{self.change:+.4g}"
        return (f"{size} ({self.level_before:.4g} -> {self.level_after:.4g}{unit}) in {self.commit_range}, "
                f"{self.n_before} run(s) before, {self.n_after} after")


@dataclass(frozen=True)
class Drift:
    """A slow, steady change over the runs since ``start`` (no single step)."""

    start: int  # position in the input of the first run of the drifting stretch
    runs: int
    slope: float  # per run: relative on the log scale, in metric units otherwise
    total: float  # over the stretch, same scale
    p: float
    relative: bool

    def describe(self) -> str:
        fmt = (lambda v: f"{v:+.2%}") if self.relative else (lambda v: f"{v:+.4g}")
        return f"drift {fmt(self.slope)} per run over the last {self.runs} runs ({fmt(self.total)} in all, " \
               f"Mann-Kendall p={self.p:.2g})"


def short_commit(commit: str) -> str:
    """A 40-hex sha cut to 8 characters (``+dirty`` kept); anything else as it is."""
    text = str(commit)
    sha, _, rest = text.partition("+")
    if len(sha) == 40 and all(c in "0123456789abcdef" for c in sha):
        return sha[:8] + (f"+{rest}" if rest else "")
    return text


def log_scale(dimension: str, metric: str) -> bool:
    """Whether a metric is compared as a ratio: times, memory and rates (as ``microscope compare`` does)."""
    m, d = metric.lower(), dimension.lower()
    return d in ("throughput", "memory") or m.endswith("bytes") or m.startswith("latency")


def default_min_change(dimension: str, metric: str) -> float:
    """The smallest step worth reporting whatever the noise: 1% for times and rates, 0.1% for memory
    (a deterministic measurement, where the statistics table's "same" band is 0.1%), 0 otherwise."""
    if not log_scale(dimension, metric):
        return 0.0
    return 0.001 if dimension.lower() == "memory" or metric.lower().endswith("bytes") else 0.01


def robust_noise(values: ArrayLike) -> float:
    """Standard deviation of one run's value: ``1.4826 x median|x[i+1] - x[i]| / sqrt(2)``.

    When more than half of the differences are exact ties (a deterministic metric that moved once or
    twice) the median is 0; the mean absolute difference (``x sqrt(pi) / 2``) then stands in.
    """
    x = np.asarray(values, dtype=float)
    x = x[np.isfinite(x)]
    if x.size < 2:
        return 0.0
    d = np.abs(np.diff(x))
    sigma = _MAD_TO_SD * float(np.median(d)) / math.sqrt(2.0)
    if sigma == 0.0 and d.any():
        sigma = float(d.mean()) * math.sqrt(math.pi) / 2.0
    return sigma


class _MedianCost:
    """Running sum of absolute deviations from the median (two heaps): O(log n) per added value."""

    def __init__(self) -> None:
        self._low: list[float] = []  # max-heap (negated): the lower half, holds the median
        self._high: list[float] = []  # min-heap: the upper half
        self._sum_low = self._sum_high = 0.0

    def add(self, v: float) -> None:
        if self._low and v > -self._low[0]:
            heapq.heappush(self._high, v)
            self._sum_high += v
        else:
            heapq.heappush(self._low, -v)
            self._sum_low += v
        if len(self._low) > len(self._high) + 1:
            moved = -heapq.heappop(self._low)
            self._sum_low -= moved
            heapq.heappush(self._high, moved)
            self._sum_high += moved
        elif len(self._high) > len(self._low):
            moved = heapq.heappop(self._high)
            self._sum_high -= moved
            heapq.heappush(self._low, -moved)
            self._sum_low += moved

    def cost(self) -> float:
        med = -self._low[0]
        return max(0.0, self._sum_high - self._sum_low + med * (len(self._low) - len(self._high)))


def _partition(x: np.ndarray, allowed: np.ndarray, penalty: float, min_size: int) -> list[int]:
    """Segment starts (after 0) of the L1 piecewise-constant fit minimising cost + penalty x segments."""
    n = x.size
    best = np.full(n + 1, math.inf)
    best[0] = 0.0
    prev = np.zeros(n + 1, dtype=int)
    for i in range(n):
        if not math.isfinite(best[i]) or (i > 0 and not allowed[i]):
            continue
        acc = _MedianCost()
        for j in range(i, n):
            acc.add(float(x[j]))
            end = j + 1
            if end - i < min_size or (end < n and not allowed[end]):
                continue
            total = best[i] + acc.cost() + penalty
            if total < best[end]:
                best[end], prev[end] = total, i
    starts, end = [], n
    while end > 0:
        end = int(prev[end])
        if end > 0:
            starts.append(end)
    return sorted(starts)


def _segments(n: int, starts: list[int]) -> list[tuple[int, int]]:
    edges = [0, *starts, n]
    return list(zip(edges[:-1], edges[1:]))


def detect_steps(
    values: ArrayLike,
    commits: Sequence[str] | None = None,
    *,
    log: bool = False,
    noise: float | None = None,
    noise_floor: float = 0.0,
    min_change: float = 0.0,
    min_size: int = 2,
    penalty: float | None = None,
) -> list[Step]:
    """Steps in ``values`` (run-level values in date order; see the module docstring).

    ``commits``: the commit of each run (steps fall only between different commits; default: every
    position differs). ``log``: compare as ratios (times, memory, rates). ``noise``: a known
    run-to-run standard deviation (log units when ``log``), else ``robust_noise`` of the series, never
    below ``noise_floor``. ``min_change``: the smallest step reported (relative when ``log``).
    ``penalty``: override the per-segment penalty (in cost units).
    """
    raw = np.asarray(values, dtype=float).ravel()
    labels = [str(c) for c in commits] if commits is not None else [str(i) for i in range(raw.size)]
    if len(labels) != raw.size:
        raise ValueError(f"{raw.size} values but {len(labels)} commits")
    if min_size < 1:
        raise ValueError("min_size must be >= 1")
    ok = np.isfinite(raw) & ((raw > 0) if log else True)
    where = np.flatnonzero(ok)[-MAX_POINTS:]
    if where.size < 2 * min_size:
        return []
    x = np.log(raw[where]) if log else raw[where]
    kept = [labels[i] for i in where]
    allowed = np.array([True] + [kept[k] != kept[k - 1] for k in range(1, x.size)])
    sigma = max(float(noise) if noise is not None and math.isfinite(noise) else robust_noise(x), noise_floor)
    floor = max(min_change if not log else math.log1p(min_change), STEP_NOISE_FACTOR * sigma)
    if floor == 0.0:  # a flat, tie-only series: any change of level is a step, float dust is not
        floor = 1e-9 * max(1.0, float(np.max(np.abs(x))))
    beta = penalty if penalty is not None else sigma * (PENALTY_BASE + PENALTY_PER_LOG_N * math.log(x.size))
    starts = _partition(x, allowed, max(beta, 0.0), min_size)
    while True:  # merge away the smallest step that does not clear the threshold, then re-check
        levels = [float(np.median(x[a:b])) for a, b in _segments(x.size, starts)]
        sizes = [abs(after - before) for before, after in zip(levels, levels[1:])]
        small = [k for k, s in enumerate(sizes) if s <= floor]
        if not small:
            break
        starts.pop(min(small, key=lambda k: sizes[k]))
    segs = _segments(x.size, starts)
    steps = []
    for (a, b), (c, d) in zip(segs, segs[1:]):
        before, after = float(np.median(x[a:b])), float(np.median(x[c:d]))
        steps.append(Step(
            index=int(where[c]), commit_before=kept[c - 1], commit_after=kept[c],
            level_before=math.exp(before) if log else before, level_after=math.exp(after) if log else after,
            change=math.expm1(after - before) if log else after - before, relative=log,
            n_before=b - a, n_after=d - c, noise=sigma))
    return steps


def detect_drift(
    values: ArrayLike,
    *,
    log: bool = False,
    since: int = 0,
    noise: float | None = None,
    min_change: float = 0.0,
) -> Drift | None:
    """A significant monotone trend over ``values[since:]`` (e.g. the runs after the last step), or None.

    Theil-Sen slope per run; Mann-Kendall p (Kendall's tau of value against run order) below
    ``DRIFT_ALPHA``; the total change over the stretch must exceed ``STEP_NOISE_FACTOR`` x the noise and
    ``min_change``. Needs ``DRIFT_MIN_RUNS`` usable runs.
    """
    raw = np.asarray(values, dtype=float).ravel()
    pos = np.arange(raw.size)
    ok = np.isfinite(raw) & ((raw > 0) if log else True) & (pos >= since)
    if ok.sum() < DRIFT_MIN_RUNS:
        return None
    t, x = pos[ok].astype(float), (np.log(raw[ok]) if log else raw[ok])
    if np.ptp(x) == 0:
        return None
    tau = sps.kendalltau(t, x)
    p = float(tau.pvalue)
    if not math.isfinite(p) or p >= DRIFT_ALPHA:
        return None
    slope = float(sps.theilslopes(x, t).slope)
    total = slope * float(t[-1] - t[0])
    sigma = float(noise) if noise is not None else robust_noise(x - slope * t)
    floor = max(math.log1p(min_change) if log else min_change, STEP_NOISE_FACTOR * sigma)
    if abs(total) <= floor:
        return None
    rel = (lambda v: math.expm1(v)) if log else (lambda v: v)
    return Drift(start=int(t[0]), runs=int(ok.sum()), slope=rel(slope), total=rel(total), p=p, relative=log)
