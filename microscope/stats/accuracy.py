"""Model-level accuracy verdicts: paired per-token/per-example differences, seed means, non-inferiority.

Why paired: baseline and candidate are evaluated on the *same* eval set, so each token (or example)
has a baseline loss and a candidate loss. Token difficulty varies enormously (a closing bracket costs
0.01 nats, a variable name 8 nats); that between-token variance is shared by both models and cancels
in the per-token difference ``cand - base``. An unpaired comparison of the two means keeps it and
needs orders of magnitude more tokens to see the same shift. ``compare_unpaired_accuracy`` exists to
show that contrast (and for the rare case of different eval sets); use the paired one.

Why a bootstrap: the mean difference over tokens is well behaved, but tokens of one sequence are
correlated; pass ``groups`` (sequence ids) and the bootstrap resamples whole sequences (cluster
bootstrap), which the i.i.d. formula cannot do.

Across seeds (each seed one trained model, one number per seed) the sample is a handful of values:
Welch's t-test and its CI on the seed means (no equal-variance assumption; a candidate that
destabilizes training often *widens* the spread across seeds), or a bootstrap of the mean difference.

Sign convention: ``estimate = mean(cand) - mean(base)`` in the metric's units, and CIs are of that
difference. ``higher_is_better`` says which direction is an improvement (False for loss, perplexity,
error; True for accuracy).

Verdicts (``accuracy_verdict``), with the CI turned into an *improvement* interval ``[lo, hi]``
(positive = candidate better; for lower-is-better metrics ``lo = -ci_high``, ``hi = -ci_low``) and a
non-inferiority margin ``m >= 0`` in metric units (from the config), checked in this order:

* ``"equivalent"``: ``-m < lo`` and ``hi < m``: the whole CI lies inside the margin (TOST at level
  alpha/2 per side, so conservative). Checked first: a difference the margin calls negligible is
  negligible whichever side of zero it falls. Impossible when ``m == 0``.
* ``"better"``: ``lo > 0`` and ``p < alpha``: significantly better (and not inside the margin).
* ``"non-inferior"``: ``lo > -m``: the candidate may be worse, but by less than the margin, with
  confidence (the one-sided non-inferiority test at level alpha/2).
* ``"worse"``: ``hi < 0``, ``p < alpha`` and ``lo <= -m``: significantly worse, and a degradation of
  the margin or more cannot be ruled out.
* ``"inconclusive"``: anything else (the CI straddles zero and reaches beyond ``-m``).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass, replace

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from .bootstrap import bootstrap, bootstrap_clustered_mean, bootstrap_p, make_rng, percentile_ci

__all__ = [
    "ACCURACY_VERDICTS",
    "AccuracyComparison",
    "accuracy_verdict",
    "compare_paired_accuracy",
    "compare_seed_accuracy",
    "compare_unpaired_accuracy",
    "estimate_seeds_needed",
    "seeds_needed_in",
]

ACCURACY_VERDICTS = ("identical", "better", "worse", "non-inferior", "equivalent", "inconclusive")
#: Default replicates for accuracy bootstraps (token-level samples are large; 2000 keeps it fast).
ACCURACY_N_BOOT = 2_000
#: The most seeds a "seeds needed" estimate considers; past it the change is lost in the seed spread.
SEEDS_NEEDED_CAP = 50
_SEEDS_NEEDED = "about {} seeds would decide it"


@dataclass(frozen=True)
class AccuracyComparison:
    """Outcome of an accuracy comparison; ``estimate``/CI are ``mean(cand) - mean(base)``."""

    verdict: str
    estimate: float
    ci_low: float
    ci_high: float
    p: float
    base_mean: float
    cand_mean: float
    #: paired elements, clusters (when ``groups`` was given) or seeds behind the test.
    n: int
    method: str
    margin: float
    higher_is_better: bool
    alpha: float
    notes: tuple[str, ...]


def accuracy_verdict(
    ci_low: float,
    ci_high: float,
    p: float,
    *,
    alpha: float = 0.05,
    margin: float = 0.0,
    higher_is_better: bool = False,
) -> str:
    """The verdict rule of the module docstring, from a CI of ``mean(cand) - mean(base)`` and a p."""
    if margin < 0:
        raise ValueError("the non-inferiority margin must be >= 0 (in metric units)")
    if not (math.isfinite(ci_low) and math.isfinite(ci_high)):
        return "inconclusive"
    lo, hi = (ci_low, ci_high) if higher_is_better else (-ci_high, -ci_low)
    significant = math.isfinite(p) and p < alpha
    if margin > 0 and -margin < lo and hi < margin:
        return "equivalent"
    if lo > 0 and significant:
        return "better"
    if lo > -margin:
        return "non-inferior"
    if hi < 0 and significant:
        return "worse"
    return "inconclusive"


def _as_1d(x: ArrayLike, label: str) -> np.ndarray:
    a = np.asarray(x, dtype=float)
    if a.ndim != 1:
        raise ValueError(f"{label} must be 1-D, got shape {a.shape}")
    return a


def _finish(vargs: dict, **fields: object) -> AccuracyComparison:
    """Attach the verdict (from the CI and p in ``fields``) and the verdict's parameters.

    A zero difference with a zero-width CI means every paired unit was bit-identical: "identical",
    not a test result that could not decide.
    """
    if fields["estimate"] == 0 and fields["ci_low"] == 0 and fields["ci_high"] == 0:
        return AccuracyComparison(verdict="identical", **vargs, **fields)  # type: ignore[arg-type]
    verdict = accuracy_verdict(fields["ci_low"], fields["ci_high"], fields["p"], **vargs)  # type: ignore[arg-type]
    return AccuracyComparison(verdict=verdict, **vargs, **fields)  # type: ignore[arg-type]


def compare_paired_accuracy(
    base: ArrayLike,
    cand: ArrayLike,
    *,
    groups: ArrayLike | None = None,
    alpha: float = 0.05,
    margin: float = 0.0,
    higher_is_better: bool = False,
    n_boot: int = ACCURACY_N_BOOT,
    seed: int | np.random.Generator = 0,
) -> AccuracyComparison:
    """Paired bootstrap CI of the mean per-element difference ``cand - base`` on the same eval set.

    ``base[i]`` and ``cand[i]`` must be the same token/example. Elements where either is non-finite
    are dropped (and noted). ``groups`` (same length, e.g. sequence ids) switches to a cluster
    bootstrap over groups. The p-value is the bootstrap tail fraction at zero, so it agrees with the CI.
    """
    b, c = _as_1d(base, "base"), _as_1d(cand, "cand")
    if b.size != c.size:
        raise ValueError(f"paired accuracy needs equal lengths (same eval set), got {b.size} and {c.size}")
    notes: list[str] = []
    keep = np.isfinite(b) & np.isfinite(c)
    if not keep.all():
        notes.append(f"{int((~keep).sum())} element(s) with a non-finite value dropped")
    b, c = b[keep], c[keep]
    g = None if groups is None else np.asarray(groups)[keep]
    vargs = {"alpha": alpha, "margin": margin, "higher_is_better": higher_is_better}
    nan = float("nan")
    if b.size < 2:
        notes.append("fewer than 2 paired elements: no test")
        return _finish(
            vargs,
            estimate=float(np.mean(c - b)) if b.size else nan,
            ci_low=nan,
            ci_high=nan,
            p=nan,
            base_mean=float(np.mean(b)) if b.size else nan,
            cand_mean=float(np.mean(c)) if c.size else nan,
            n=int(b.size),
            method="paired-bootstrap",
            notes=tuple(notes),
        )
    d = c - b
    estimate = float(d.mean())
    rng = make_rng(seed, "accuracy-paired")
    if g is not None:
        reps, units = bootstrap_clustered_mean(d, g, n_boot=n_boot, rng=rng)
        method = "paired-cluster-bootstrap"
    else:
        reps = bootstrap((d,), lambda x: x.mean(axis=1), paired=True, n_boot=n_boot, rng=rng)
        units, method = int(d.size), "paired-bootstrap"
    lo, hi = percentile_ci(reps, alpha)
    p = bootstrap_p(reps)
    return _finish(
        vargs,
        estimate=estimate,
        ci_low=lo,
        ci_high=hi,
        p=p,
        base_mean=float(b.mean()),
        cand_mean=float(c.mean()),
        n=int(units),
        method=method,
        notes=tuple(notes),
    )


def compare_unpaired_accuracy(
    base: ArrayLike,
    cand: ArrayLike,
    *,
    alpha: float = 0.05,
    margin: float = 0.0,
    higher_is_better: bool = False,
    n_boot: int = ACCURACY_N_BOOT,
    seed: int | np.random.Generator = 0,
) -> AccuracyComparison:
    """Unpaired bootstrap CI of ``mean(cand) - mean(base)``: the two samples resampled independently.

    For different eval sets only; on the same eval set it throws the pairing away (see the module
    docstring). p: the bootstrap tail fraction at zero (agrees with the CI).
    """
    b, c = _as_1d(base, "base"), _as_1d(cand, "cand")
    notes: list[str] = []
    nb, nc = b.size, c.size
    b, c = b[np.isfinite(b)], c[np.isfinite(c)]
    if b.size < nb or c.size < nc:
        notes.append(f"{nb - b.size + nc - c.size} non-finite value(s) dropped")
    vargs = {"alpha": alpha, "margin": margin, "higher_is_better": higher_is_better}
    nan = float("nan")
    if b.size < 2 or c.size < 2:
        notes.append("fewer than 2 values in a sample: no test")
        bm = float(b.mean()) if b.size else nan
        cm = float(c.mean()) if c.size else nan
        return _finish(
            vargs,
            estimate=cm - bm,
            ci_low=nan,
            ci_high=nan,
            p=nan,
            base_mean=bm,
            cand_mean=cm,
            n=int(min(b.size, c.size)),
            method="unpaired-bootstrap",
            notes=tuple(notes),
        )
    estimate = float(c.mean() - b.mean())
    rng = make_rng(seed, "accuracy-unpaired")
    reps = bootstrap(
        (b, c), lambda x, y: y.mean(axis=1) - x.mean(axis=1), paired=False, n_boot=n_boot, rng=rng
    )
    lo, hi = percentile_ci(reps, alpha)
    p = bootstrap_p(reps)
    return _finish(
        vargs,
        estimate=estimate,
        ci_low=lo,
        ci_high=hi,
        p=p,
        base_mean=float(b.mean()),
        cand_mean=float(c.mean()),
        n=int(min(b.size, c.size)),
        method="unpaired-bootstrap",
        notes=tuple(notes),
    )


def compare_seed_accuracy(
    base_seeds: ArrayLike,
    cand_seeds: ArrayLike,
    *,
    method: str = "welch",
    alpha: float = 0.05,
    margin: float = 0.0,
    higher_is_better: bool = False,
    n_boot: int = ACCURACY_N_BOOT,
    seed: int | np.random.Generator = 0,
) -> AccuracyComparison:
    """Compare one value per seed (e.g. final eval loss of each seed's model).

    ``method="welch"``: Welch's t-test and its ``1 - alpha`` CI of the difference of means (needs at
    least 2 seeds per side). ``method="paired"``: ``base_seeds[i]`` and ``cand_seeds[i]`` come from
    the same seed (same init, data order and eval set), so the per-seed differences get a paired
    t-test and its CI (df = seeds - 1). ``method="bootstrap"``: unpaired bootstrap of the mean
    difference. With zero variance (of both sides, or of the paired differences) the difference is
    exact: CI = [d, d], p = 1 if d == 0 else 0.
    """
    if method not in ("welch", "paired", "bootstrap"):
        raise ValueError("method must be 'welch', 'paired' or 'bootstrap'")
    if method == "paired":
        return _seed_paired(base_seeds, cand_seeds, alpha, margin, higher_is_better)
    if method == "bootstrap":
        res = compare_unpaired_accuracy(
            base_seeds,
            cand_seeds,
            alpha=alpha,
            margin=margin,
            higher_is_better=higher_is_better,
            n_boot=n_boot,
            seed=seed,
        )
        return replace(res, method="seed-bootstrap")
    b, c = _as_1d(base_seeds, "base_seeds"), _as_1d(cand_seeds, "cand_seeds")
    notes: list[str] = []
    nb, nc = b.size, c.size
    b, c = b[np.isfinite(b)], c[np.isfinite(c)]
    if b.size < nb or c.size < nc:
        notes.append(f"{nb - b.size + nc - c.size} non-finite seed value(s) dropped (diverged runs?)")
    vargs = {"alpha": alpha, "margin": margin, "higher_is_better": higher_is_better}
    nan = float("nan")
    bm = float(b.mean()) if b.size else nan
    cm = float(c.mean()) if c.size else nan
    n = int(min(b.size, c.size))
    if b.size < 2 or c.size < 2:
        notes.append("Welch needs at least 2 seeds per variant: no test")
        return _finish(
            vargs,
            estimate=cm - bm,
            ci_low=nan,
            ci_high=nan,
            p=nan,
            base_mean=bm,
            cand_mean=cm,
            n=n,
            method="welch",
            notes=tuple(notes),
        )
    d = cm - bm
    if np.ptp(b) == 0 and np.ptp(c) == 0:
        notes.append("zero variance across seeds on both sides: the difference is exact")
        return _finish(
            vargs,
            estimate=d,
            ci_low=d,
            ci_high=d,
            p=1.0 if d == 0 else 0.0,
            base_mean=bm,
            cand_mean=cm,
            n=n,
            method="welch",
            notes=tuple(notes),
        )
    res = sps.ttest_ind(c, b, equal_var=False)
    ci = res.confidence_interval(confidence_level=1.0 - alpha)
    return _finish(
        vargs,
        estimate=d,
        ci_low=float(ci.low),
        ci_high=float(ci.high),
        p=float(res.pvalue),
        base_mean=bm,
        cand_mean=cm,
        n=n,
        method="welch",
        notes=tuple(notes),
    )


def _seed_paired(base_seeds: ArrayLike, cand_seeds: ArrayLike, alpha: float, margin: float,
                 higher_is_better: bool) -> AccuracyComparison:
    """Paired t over seeds: the training run is the unit, so the evaluation set's size cannot
    shrink the CI below the run-to-run spread of the change."""
    b, c = _as_1d(base_seeds, "base_seeds"), _as_1d(cand_seeds, "cand_seeds")
    if b.size != c.size:
        raise ValueError(f"paired seeds need equal lengths, got {b.size} and {c.size}")
    keep = np.isfinite(b) & np.isfinite(c)
    notes = [] if keep.all() else [f"{int((~keep).sum())} seed(s) with a non-finite value dropped"]
    b, c = b[keep], c[keep]
    vargs = {"alpha": alpha, "margin": margin, "higher_is_better": higher_is_better}
    nan = float("nan")
    d = c - b
    fields = {"base_mean": float(b.mean()) if b.size else nan, "cand_mean": float(c.mean()) if c.size else nan,
              "n": int(d.size), "method": "seed-paired-t"}
    estimate = float(d.mean()) if d.size else nan
    if d.size < 2:
        notes.append("a paired t over seeds needs at least 2 seeds: no test")
        return _finish(vargs, estimate=estimate, ci_low=nan, ci_high=nan, p=nan, notes=tuple(notes), **fields)
    if np.ptp(d) == 0:
        notes.append("the same difference on every seed: it is exact")
        return _finish(vargs, estimate=estimate, ci_low=estimate, ci_high=estimate,
                       p=1.0 if estimate == 0 else 0.0, notes=tuple(notes), **fields)
    res = sps.ttest_rel(c, b)
    ci = res.confidence_interval(confidence_level=1.0 - alpha)
    out = _finish(vargs, estimate=estimate, ci_low=float(ci.low), ci_high=float(ci.high), p=float(res.pvalue),
                  notes=tuple(notes), **fields)
    if out.verdict != "inconclusive":
        return out
    needed = estimate_seeds_needed(d, **vargs)
    plan = (_SEEDS_NEEDED.format(needed) + " (80% power) at this mean and spread" if needed is not None else
            f"more than {SEEDS_NEEDED_CAP} seeds at this mean and spread: the change is small against the seed spread")
    return replace(out, notes=(*out.notes, f"{plan} (a planning estimate; workload.max_seeds adds seeds "
                                           "with the error rate held)"))


def estimate_seeds_needed(differences: ArrayLike, *, alpha: float = 0.05, margin: float = 0.0,
                          higher_is_better: bool = False, power: float = 0.8,
                          cap: int = SEEDS_NEEDED_CAP) -> int | None:
    """Rough number of seeds for a paired t over seeds to decide (not "inconclusive") with probability
    ``power``, if the per-seed differences keep this mean and spread; None past ``cap``.

    The CI half-width at n seeds is inflated from ``t_{1-alpha/2}`` to ``t_{1-alpha/2} + t_power`` standard
    errors (the usual sample-size margin, as ``estimate_rounds_needed`` does for latency): aiming the CI's
    edge exactly at the boundary would decide only half the time.
    """
    d = _as_1d(differences, "differences")
    d = d[np.isfinite(d)]
    if d.size < 2:
        return None
    mean, sd = float(d.mean()), float(d.std(ddof=1))
    if sd == 0:
        return None
    for n in range(2, cap + 1):
        se = sd / math.sqrt(n)
        half = float(sps.t.ppf(1.0 - alpha / 2, n - 1) + sps.t.ppf(power, n - 1)) * se
        p = 2.0 * float(sps.t.sf(abs(mean) / se, n - 1))
        verdict = accuracy_verdict(mean - half, mean + half, p, alpha=alpha, margin=margin,
                                   higher_is_better=higher_is_better)
        if verdict != "inconclusive":
            return n
    return None


def seeds_needed_in(notes: str) -> int | None:
    """The seeds-needed estimate a seed comparison's notes carry, if any (for headlines)."""
    found = re.search(_SEEDS_NEEDED.replace("{}", r"(\d+)"), notes)
    return int(found.group(1)) if found else None
