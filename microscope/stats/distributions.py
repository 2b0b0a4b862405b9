"""Stability and generalization: compare per-seed summaries of baseline and candidate runs.

A training-stability or generalization claim rests on a few seeds, each reduced to one number:
the coefficient of variation of the global grad norm, the count of loss spikes, the count of NaN/Inf
steps, the out-of-domain gap (OOD loss minus in-domain loss), the loss at 4x the trained context.

The verdict and its confidence interval come from **one** method, so they agree by construction
(a CI that excludes zero is a p below alpha, and the reverse):

* ``paired=True`` (the harness gives baseline and candidate the same trial seeds: same initial
  weights, data order and eval set): a paired t-test on the per-seed differences and its t interval.
  With 3 seeds a side a rank test cannot go below p = 0.1; the paired t can, when the differences are
  consistent across seeds;
* ``paired=False``: Welch's t-test and its interval (no equal-variance assumption: a destabilizing
  change often widens the spread across seeds);
* ``statistic="median"``: a seeded bootstrap of the difference of medians; its p is the bootstrap's
  own two-sided tail fraction at zero, so again the interval and the p agree.

``prob_greater`` = P(a candidate seed's value > a baseline seed's value), ties half: the
common-language effect size, shown, never used for the verdict.

Verdicts, with ``delta = stat(cand) - stat(base)`` and its CI ``[lo, hi]``, in this order:

* ``"identical"``: every seed gave bit-identical values on both sides (paired), or values equal to float32
  resolution (``FLOAT_RESOLUTION``: a reordered sum, as a sharded model computes), or both sides are the
  same constant;
* ``"equivalent"``: ``margin > 0`` and ``-margin < lo`` and ``hi < margin`` (TOST, as for accuracy);
* ``"better"`` / ``"worse"``: p < alpha (the CI excludes 0) on the improving / degrading side
  (``lower_is_better`` says which; with ``lower_is_better=None`` the verdicts are ``"lower"`` /
  ``"higher"``);
* ``"inconclusive"`` otherwise.

The per-seed summaries themselves come from ``grad_norm_cv``, ``count_loss_spikes`` and
``count_nonfinite`` so every plugin computes them the same way.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from .bootstrap import DEFAULT_N_BOOT, bootstrap, bootstrap_p, make_rng, percentile_ci

__all__ = [
    "DistributionComparison",
    "compare_distributions",
    "count_loss_spikes",
    "count_nonfinite",
    "grad_norm_cv",
]


@dataclass(frozen=True)
class DistributionComparison:
    """Outcome of ``compare_distributions``; ``delta`` and CI are ``stat(cand) - stat(base)``."""

    verdict: str
    statistic: str
    base_center: float
    cand_center: float
    delta: float
    ci_low: float
    ci_high: float
    p: float
    prob_greater: float
    n_base: int
    n_cand: int
    paired: bool
    lower_is_better: bool | None
    notes: tuple[str, ...]


_STATS = {"mean": np.mean, "median": np.median}


def compare_distributions(
    base: ArrayLike,
    cand: ArrayLike,
    *,
    statistic: str = "mean",
    alpha: float = 0.05,
    margin: float = 0.0,
    lower_is_better: bool | None = True,
    paired: bool = False,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
) -> DistributionComparison:
    """Compare per-seed values (one per seed) of baseline and candidate; see the module docstring.

    Non-finite values are dropped and noted (a diverged seed should be counted by ``count_nonfinite``
    upstream, not smuggled in as a NaN). Fewer than 2 values on a side gives ``"inconclusive"``.
    """
    if statistic not in _STATS:
        raise ValueError(f"statistic must be one of {sorted(_STATS)}")
    stat = _STATS[statistic]
    b = np.asarray(base, dtype=float).ravel()
    c = np.asarray(cand, dtype=float).ravel()
    if paired and b.size != c.size:
        raise ValueError("paired=True needs one value per seed on both sides (equal lengths)")
    notes: list[str] = []
    if paired:
        keep = np.isfinite(b) & np.isfinite(c)
        b, c = b[keep], c[keep]
        dropped = int((~keep).sum())
    else:
        nb, nc = b.size, c.size
        b, c = b[np.isfinite(b)], c[np.isfinite(c)]
        dropped = nb - b.size + nc - c.size
    if dropped:
        notes.append(f"{dropped} non-finite value(s) dropped")
    nan = float("nan")
    bc = float(stat(b)) if b.size else nan
    cc = float(stat(c)) if c.size else nan
    delta = cc - bc
    if b.size < 2 or c.size < 2:
        notes.append(f"too few values to compare ({b.size} baseline, {c.size} candidate; need >= 2)")
        return DistributionComparison(
            verdict="inconclusive",
            statistic=statistic,
            base_center=bc,
            cand_center=cc,
            delta=delta,
            ci_low=nan,
            ci_high=nan,
            p=nan,
            prob_greater=nan,
            n_base=int(b.size),
            n_cand=int(c.size),
            paired=paired,
            lower_is_better=lower_is_better,
            notes=tuple(notes),
        )
    mw = sps.mannwhitneyu(c, b, alternative="two-sided")
    prob_greater = float(mw.statistic) / (b.size * c.size)
    if statistic == "median":
        method = "bootstrap of the difference of medians"
        lo, hi, p = _bootstrap_interval(b, c, stat, paired, alpha, n_boot, make_rng(seed, "distribution", statistic))
    else:
        method = "paired t over seeds" if paired else "Welch t"
        lo, hi, p = _t_interval(b, c, paired, alpha)

    identical = (paired and bool(np.all(b == c))) or (np.ptp(b) == 0 and np.ptp(c) == 0 and b[0] == c[0])
    if identical:
        verdict = "identical"
        notes.append("bit-identical values on every seed")
    elif paired and _float_equal(b, c):
        verdict = "identical"
        notes.append(f"equal on every seed to float32 resolution (|delta| <= {FLOAT_RESOLUTION:g} x |value|): "
                     "a change of summation order, not of the result")
    elif margin > 0 and -margin < lo and hi < margin:
        verdict = "equivalent"
    elif p < alpha and (lo > 0 or hi < 0):
        higher = lo > 0
        if lower_is_better is None:
            verdict = "higher" if higher else "lower"
        else:
            verdict = "worse" if higher == lower_is_better else "better"
    else:
        verdict = "inconclusive"
    notes.insert(0, method)
    return DistributionComparison(
        verdict=verdict,
        statistic=statistic,
        base_center=bc,
        cand_center=cc,
        delta=delta,
        ci_low=lo,
        ci_high=hi,
        p=p,
        prob_greater=prob_greater,
        n_base=int(b.size),
        n_cand=int(c.size),
        paired=paired,
        lower_is_better=lower_is_better,
        notes=tuple(notes),
    )


#: Relative difference below which two per-seed values computed in float32 are the same number: 8 float32
#: epsilons, the spread a different summation order (another reduction tree, a sharded sum) leaves.
FLOAT_RESOLUTION = 8 * float(np.finfo(np.float32).eps)


def _float_equal(b: np.ndarray, c: np.ndarray) -> bool:
    """Whether every seed's pair agrees to ``FLOAT_RESOLUTION`` (and at least one pair differs at all)."""
    scale = np.maximum(np.abs(b), np.abs(c))
    return bool(np.all(np.abs(c - b) <= FLOAT_RESOLUTION * scale))


def _t_interval(b: np.ndarray, c: np.ndarray, paired: bool, alpha: float) -> tuple[float, float, float]:
    """(lo, hi, p) of mean(c) - mean(b): paired t on the differences, or Welch; exact at zero variance."""
    d = c - b if paired else None
    spread = np.ptp(d) if d is not None else max(np.ptp(b), np.ptp(c))
    delta = float(d.mean()) if d is not None else float(c.mean() - b.mean())
    if spread == 0:  # the same difference on every seed (or constant sides): it is exact
        return delta, delta, (1.0 if delta == 0 else 0.0)
    res = sps.ttest_rel(c, b) if paired else sps.ttest_ind(c, b, equal_var=False)
    ci = res.confidence_interval(confidence_level=1.0 - alpha)
    return float(ci.low), float(ci.high), float(res.pvalue)


def _bootstrap_interval(b: np.ndarray, c: np.ndarray, stat, paired: bool, alpha: float,  # noqa: ANN001
                        n_boot: int, rng: np.random.Generator) -> tuple[float, float, float]:
    """(lo, hi, p) from one bootstrap: the percentile CI and the two-sided tail fraction at zero."""
    reps = bootstrap((b, c), lambda x, y: stat(y, axis=1) - stat(x, axis=1), paired=paired, n_boot=n_boot,
                     rng=rng)
    lo, hi = percentile_ci(reps, alpha)
    return lo, hi, bootstrap_p(reps)


def grad_norm_cv(grad_norms: ArrayLike) -> float:
    """Coefficient of variation (std / mean, ddof=1) of one run's global grad norms, finite steps only.

    A scale-free measure of how jumpy the optimization is: comparable across models whose grad norms
    differ in size. NaN when fewer than 2 finite steps or a zero mean.
    """
    g = np.asarray(grad_norms, dtype=float).ravel()
    g = g[np.isfinite(g)]
    if g.size < 2 or g.mean() == 0:
        return float("nan")
    return float(g.std(ddof=1) / g.mean())


def count_nonfinite(values: ArrayLike) -> int:
    """Number of NaN or +-Inf entries (e.g. steps whose loss or grad norm overflowed)."""
    v = np.asarray(values, dtype=float)
    return int((~np.isfinite(v)).sum())


def count_loss_spikes(
    losses: ArrayLike, *, window: int = 20, threshold: float = 0.5, min_history: int = 5
) -> int:
    """Steps whose loss exceeds ``(1 + threshold)`` times the median of the previous ``window`` losses.

    The running median (not mean) keeps one spike from hiding the next; a relative threshold makes
    the count comparable across loss scales. Steps with fewer than ``min_history`` finite previous
    losses are not judged; non-finite losses are not spikes (``count_nonfinite`` counts them).
    """
    x = np.asarray(losses, dtype=float).ravel()
    spikes = 0
    for t in range(1, x.size):
        if not math.isfinite(x[t]):
            continue
        hist = x[max(0, t - window) : t]
        hist = hist[np.isfinite(hist)]
        if hist.size < min_history:
            continue
        if x[t] > (1.0 + threshold) * float(np.median(hist)):
            spikes += 1
    return spikes
