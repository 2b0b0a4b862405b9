"""Stability and generalization: compare per-seed summaries of baseline and candidate runs.

A training-stability or generalization claim rests on a few seeds, each reduced to one number:
the coefficient of variation of the global grad norm, the count of loss spikes, the count of NaN/Inf
steps, the out-of-domain gap (OOD loss minus in-domain loss). Such numbers are small samples, often
skewed or discrete (counts with many zeros), so the comparison is distribution-free:

* Mann-Whitney U (two-sided) for "do the seeds of one variant tend to sit higher";
* a seeded bootstrap CI of the difference of means (or medians) for "by how much";
* ``prob_greater`` = P(a candidate seed's value > a baseline seed's value), ties half, the
  common-language effect size.

When baseline and candidate share their seeds (the harness gives both the same trial seeds, so the
same initial weights and data order) ``paired=True`` keeps seed i of both together in the bootstrap.

Verdicts, with ``delta = stat(cand) - stat(base)`` and its CI ``[lo, hi]``, in this order:

* ``"equivalent"``: ``margin > 0`` and ``-margin < lo`` and ``hi < margin`` (TOST, as for accuracy),
  or both samples are the same constant (e.g. zero NaN steps on every seed of both);
* ``"better"`` / ``"worse"``: p < alpha and the CI excludes 0 on the improving / degrading side
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

from .bootstrap import DEFAULT_N_BOOT, bootstrap, make_rng, percentile_ci

__all__ = [
    "DistributionComparison",
    "compare_distributions",
    "count_loss_spikes",
    "count_nonfinite",
    "grad_norm_cv",
    "seeds_to_decide",
    "smallest_mannwhitney_p",
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
    p = float(mw.pvalue) if math.isfinite(mw.pvalue) else 1.0
    prob_greater = float(mw.statistic) / (b.size * c.size)
    rng = make_rng(seed, "distribution", statistic)
    reps = bootstrap(
        (b, c), lambda x, y: stat(y, axis=1) - stat(x, axis=1), paired=paired, n_boot=n_boot, rng=rng
    )
    lo, hi = percentile_ci(reps, alpha)

    if np.ptp(b) == 0 and np.ptp(c) == 0 and b[0] == c[0]:
        verdict = "equivalent"
        notes.append("both variants gave the same value on every seed")
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
        floor = smallest_mannwhitney_p(b.size, c.size)
        if floor >= alpha:
            notes.append(f"{b.size} vs {c.size} seeds cannot decide: Mann-Whitney's smallest p here is "
                         f"{floor:.2g} >= alpha {alpha:g}; run >= {seeds_to_decide(alpha)} seeds per variant")
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


def smallest_mannwhitney_p(n_base: int, n_cand: int) -> float:
    """The smallest two-sided exact Mann-Whitney p that ``n_base`` vs ``n_cand`` values can give
    (complete separation): 2 / C(n_base + n_cand, n_base). With 3 seeds a side it is 0.1, so no
    3-seed comparison can be called different at alpha 0.05 however large the effect."""
    return min(1.0, 2.0 / math.comb(n_base + n_cand, n_base))


def seeds_to_decide(alpha: float) -> int:
    """Fewest seeds per variant at which Mann-Whitney can reach p < ``alpha`` (4 at 0.05)."""
    n = 2
    while smallest_mannwhitney_p(n, n) >= alpha:
        n += 1
    return n


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
