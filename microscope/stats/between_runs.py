"""Across runs: the run (the process) is the unit, and the noise is the noise between runs.

Inside one run the variants are interleaved round by round, so round r of the baseline and round r of
the candidate share the machine's state and pair up. Two runs (two nights, two commits, two processes)
share nothing: clocks, memory layout, what else the machine was doing and the JIT's choices all move
between processes, and that between-run spread is larger than the round-to-round spread. Pairing the
rounds of two processes would call that spread a change. So here each run contributes one value per
measurement (its median latency, its peak memory, its loss), and a comparison of side A (n_a runs)
with side B (n_b runs) is a two-sample test on those values:

* time-like metrics work on logs, the effect is the ratio of geometric means B / A;
* ``n_a, n_b >= 2``: Welch's t on the run values, and its interval (they agree by construction);
* one side with a single run: the between-run noise ``sigma`` must come from elsewhere (the other
  side's repeats, or the history store's runs of the same machine), then a z interval with that
  sigma; with no estimate at all the verdict is "inconclusive" and says how to get one;
* every run of both sides with the same value (a run compared with itself, a deterministic metric):
  "identical", whatever the number of runs;
* the noise band ``tau = max(min_band, exp(2 sigma sqrt(1/n_a + 1/n_b)) - 1)``: the change two groups
  of this size show under pure between-run noise (the A/A spread of the within-run rule, at the run
  level). "faster"/"slower" need p < alpha AND the whole CI beyond the band; "equivalent" needs the
  CI inside it (and a band no wider than ``max_band``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from .latency import decide_latency

__all__ = ["BetweenRuns", "between_run_sigma", "compare_between_runs"]


@dataclass(frozen=True)
class BetweenRuns:
    """B against A over run-level values; ``effect`` is B / A (log scale) or B - A (linear)."""

    verdict: str
    effect: float
    ci_low: float
    ci_high: float
    p: float
    sigma: float  # between-run noise (sd of log values, or of values), NaN if unknown
    noise_source: str  # "repeats" | "history" | "none"
    tau: float
    n_a: int
    n_b: int
    log: bool
    notes: tuple[str, ...]


def between_run_sigma(values: ArrayLike, log: bool = True) -> float:
    """Sample standard deviation of one side's run values (of their logs when ``log``); NaN below 2 runs."""
    x = _clean(values, log)
    return float(np.std(x, ddof=1)) if x.size >= 2 else math.nan


def _clean(values: ArrayLike, log: bool) -> np.ndarray:
    x = np.asarray(values, dtype=float).ravel()
    x = x[np.isfinite(x)]
    if log:
        x = np.log(x[x > 0])
    return x


def _pooled(a: np.ndarray, b: np.ndarray) -> float:
    dof = (a.size - 1) + (b.size - 1)
    if dof <= 0:
        return math.nan
    ss = (np.var(a, ddof=1) * (a.size - 1) if a.size > 1 else 0.0) + (
        np.var(b, ddof=1) * (b.size - 1) if b.size > 1 else 0.0)
    return float(math.sqrt(ss / dof))


def compare_between_runs(
    a: ArrayLike,
    b: ArrayLike,
    *,
    alpha: float = 0.05,
    min_band: float = 0.01,
    max_band: float = 0.05,
    log: bool = True,
    history_sigma: float | None = None,
) -> BetweenRuns:
    """Compare run-level values of side B with side A (see the module docstring).

    ``history_sigma``: the between-run noise of this measurement on this machine, from the history
    store (sd of log values when ``log``), used when a side has a single run. Non-finite values (and,
    on the log scale, non-positive ones) are dropped.
    """
    xa, xb = _clean(a, log), _clean(b, log)
    notes: list[str] = []
    nan = math.nan
    to_effect = (lambda d: math.exp(d)) if log else (lambda d: d)
    if xa.size == 0 or xb.size == 0:
        return BetweenRuns("inconclusive", nan, nan, nan, nan, nan, "none", min_band, int(xa.size), int(xb.size),
                           log, ("no usable value on one side",))
    if np.ptp(np.concatenate([xa, xb])) == 0:  # e.g. a run compared with itself: the numbers say it all
        return BetweenRuns("identical", to_effect(0.0), to_effect(0.0), to_effect(0.0), 1.0, 0.0,
                           "repeats" if xa.size >= 2 and xb.size >= 2 else "none", min_band, int(xa.size),
                           int(xb.size), log, ("every run of both sides gave the same value",))
    d = float(xb.mean() - xa.mean())
    if xa.size >= 2 and xb.size >= 2:
        sigma, source = _pooled(xa, xb), "repeats"
    elif xa.size + xb.size >= 3:
        sigma, source = _pooled(xa, xb), "repeats"
        notes.append("one side has a single run: the noise comes from the other side's repeats")
    elif history_sigma is not None and math.isfinite(history_sigma):
        sigma, source = float(history_sigma), "history"
    else:
        notes.append("inconclusive: one run per side, so the between-run noise is unknown; "
                     "use --repeat N (fresh processes per side) or --history")
        return BetweenRuns("inconclusive", to_effect(d), nan, nan, nan, nan, "none", min_band, 1, 1, log,
                           tuple(notes))
    if history_sigma is not None and math.isfinite(history_sigma) and source == "repeats" and history_sigma > sigma:
        notes.append(f"history's between-run noise ({history_sigma:.3g}) exceeds these runs' ({sigma:.3g}): used")
        sigma, source = float(history_sigma), "history"
    scale = math.sqrt(1.0 / xa.size + 1.0 / xb.size)
    if sigma == 0 and source == "repeats" and np.ptp(xa) == 0 and np.ptp(xb) == 0:
        lo = hi = d
        p = 1.0 if d == 0 else 0.0
        notes.append("every run of each side gave the same value: the difference is exact")
    elif xa.size >= 2 and xb.size >= 2 and source == "repeats":
        res = sps.ttest_ind(xb, xa, equal_var=False)
        ci = res.confidence_interval(confidence_level=1.0 - alpha)
        lo, hi, p = float(ci.low), float(ci.high), float(res.pvalue)
    else:
        se = sigma * scale
        z = float(sps.norm.ppf(1.0 - alpha / 2.0))
        lo, hi = d - z * se, d + z * se
        p = float(2.0 * sps.norm.sf(abs(d) / se)) if se > 0 else (1.0 if d == 0 else 0.0)
    spread = 2.0 * sigma * scale
    if log:
        tau = max(min_band, math.expm1(spread))
        verdict = decide_latency(math.exp(lo), math.exp(hi), p, alpha=alpha, tau=tau, max_band=max_band)
        if lo == hi == 0.0:
            verdict = "identical"
        return BetweenRuns(verdict, math.exp(d), math.exp(lo), math.exp(hi), p, sigma, source, tau, int(xa.size),
                           int(xb.size), log, tuple(notes))
    tau = spread
    if lo == hi == 0.0:
        verdict = "identical"
    elif p < alpha and lo > tau:
        verdict = "higher"
    elif p < alpha and hi < -tau:
        verdict = "lower"
    elif -tau < lo and hi < tau:
        verdict = "equivalent"
    else:
        verdict = "inconclusive"
    return BetweenRuns(verdict, d, lo, hi, p, sigma, source, tau, int(xa.size), int(xb.size), log, tuple(notes))
