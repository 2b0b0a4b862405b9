"""Latency verdicts from interleaved rounds: faster, slower, equivalent or inconclusive.

The runner measures baseline and candidates in one run, interleaved in rounds (round r runs every
variant, in forward order on even rounds and reverse order on odd rounds: A B C, C B A, ...), and keeps
one median latency per variant per round. Slow drift of the machine (clocks, temperature, a neighbour's
job) therefore hits every variant of a round alike. This module turns two such lists of round medians
into a verdict a reviewer can trust:

effect and confidence interval
    a ratio cand/base of typical latencies (below 1 is faster), with a seeded percentile-bootstrap
    CI. When both lists hold one value per round (equal lengths, the normal case) the comparison is
    **paired by round**: the effect is the median over rounds of the per-round ratio
    ``cand[r] / base[r]``, and the bootstrap resamples rounds, i.e. those ratios. Drift shared by the
    variants of a round (clocks, temperature, a neighbour's job) cancels inside each ratio instead of
    widening the interval. The plain ratio of medians ``median(cand) / median(base)`` estimates the
    same thing without drift, but under drift it degenerates to the ratio of roughly one round (both
    medians land on the same, middle-of-the-drift round) and its CI stops shrinking with more rounds;
    it is still reported (``ratio_of_medians``) and is the effect when the lists cannot be paired (a
    round lost for one variant), with each list then resampled on its own.
p-value
    paired: Wilcoxon signed-rank test on the per-round log ratios (the paired counterpart of
    Mann-Whitney); unpaired: two-sided Mann-Whitney U on the round medians (asv and
    google-benchmark's test). The Mann-Whitney p is always computed and kept (``p_mannwhitney``); on
    drifting runs it loses its power because between-round drift swamps the difference, which is
    exactly what the interleaved design lets the paired test avoid. Both are rank tests, so a few
    outlier rounds cannot manufacture significance.
common-language effect size
    ``prob_faster``: paired, the fraction of rounds in which the candidate was faster than the
    baseline of the same round; unpaired, P(a random candidate round beats a random baseline round)
    from the Mann-Whitney U. Ties count half; 0.5 means no tendency.
A/A noise band
    the baseline's rounds are split into two interleaved halves in an A B B A pattern: rounds with
    ``r % 4 in (0, 3)`` against rounds with ``r % 4 in (1, 2)``, paired as (0,1), (3,2), (4,5),
    (7,6), ... (a leftover last round without a partner is left out). Every pair is two *adjacent*
    rounds, so drift between them is as small as the run allows; each half holds as many
    forward-order as reverse-order rounds, so a position-in-round effect does not masquerade as
    noise; and within each block of four rounds both halves sit at the same mean time, so linear
    drift cancels exactly. The alternatives are worse: a plain even/odd split puts every forward
    round in one half (it measures the order effect), a first/second split measures the drift that
    the interleaved design exists to cancel. The halves are compared like a paired baseline and
    candidate (median of pair ratios, bootstrap over pairs). The A/A spread is the bootstrap standard
    error of that ratio, so ``2 x spread`` is about the 95% reach of the ratio of two identical
    halves of this run: the largest difference pure noise shows. Each half holds half the rounds and
    its pairs are one round apart rather than within one round, so this overstates the noise of the
    full comparison (by about sqrt(2), more under strong drift): the band errs on the side of "not a
    change".
band
    ``tau = max(min_band, exp(2 x A/A spread) - 1)``, the spread measured on the log of the ratio:
    criterion.rs' noise threshold (fixed at 1% there), widened to what this run's own noise
    demands. The band is multiplicative, ``(1 / (1 + tau), 1 + tau)``, so a noisy run (an
    interpreter, a shared CPU) widens it symmetrically in speed-up and slow-down and a 30x slowdown
    never sits "inside the band" (for small tau this is ``1 -+ tau``).

Verdict rule (DESIGN.md "Statistics"; criterion.rs' rule with a measured band, plus TOST):

* ``"faster"``: p < alpha AND the whole CI lies below ``1 / (1 + tau)``;
* ``"slower"``: p < alpha AND the whole CI lies above ``1 + tau``;
* ``"equivalent"``: the whole CI lies inside ``(1 / (1 + tau), 1 + tau)`` (two one-sided tests at level
  alpha/2 each, so conservative) AND ``tau <= max_band``: an equivalence claim of "+-30%" on a noisy
  machine would be technically true and practically useless, so it is not made;
* ``"inconclusive"`` otherwise, with an estimate of the rounds needed.

Outlier rounds are classified by Tukey fences and reported, never dropped; each list's IQR / median is
classified as ok / noisy / unreliable (``microscope.stats.quality``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike
from scipy import stats as sps

from .bootstrap import DEFAULT_N_BOOT, bootstrap, make_rng, percentile_ci
from .outliers import OutlierCounts, classify_outliers
from .quality import NoiseQuality, classify_noise

__all__ = [
    "LATENCY_VERDICTS",
    "LatencyComparison",
    "aa_halves",
    "band_from_spread",
    "compare_latency",
    "decide_latency",
    "estimate_rounds_needed",
    "RELATIVE_LATENCY",
    "paired_round_ratios",
]

LATENCY_VERDICTS = ("faster", "slower", "equivalent", "inconclusive")
#: The metric of a variant's paired, per-round latency over its run's baseline (``paired_round_ratios``).
RELATIVE_LATENCY = "latency_vs_baseline"
#: Above this many rounds an estimate is reported as "not reachable".
MAX_ROUNDS = 100_000


@dataclass(frozen=True)
class LatencyComparison:
    """The outcome of ``compare_latency``; ratios are candidate / baseline (below 1 = faster)."""

    verdict: str
    #: paired: median of per-round ratios; unpaired: ratio of medians (see the module docstring).
    effect: float
    ci_low: float
    ci_high: float
    #: p-value the verdict used: Wilcoxon signed-rank (paired) or Mann-Whitney U (unpaired).
    p: float
    test: str
    p_mannwhitney: float
    prob_faster: float
    tau: float
    aa_ratio: float
    aa_ci_low: float
    aa_ci_high: float
    aa_spread: float
    base_median: float
    cand_median: float
    ratio_of_medians: float
    n_base: int
    n_cand: int
    paired: bool
    alpha: float
    rounds_needed: int | None
    base_outliers: OutlierCounts
    cand_outliers: OutlierCounts
    base_quality: NoiseQuality
    cand_quality: NoiseQuality
    notes: tuple[str, ...]

    @property
    def change(self) -> float:
        """Relative change ``effect - 1`` (e.g. -0.12 = 12% faster)."""
        return self.effect - 1.0


def _clean(rounds: ArrayLike, label: str) -> tuple[np.ndarray, np.ndarray]:
    x = np.asarray(rounds, dtype=float)
    if x.ndim != 1:
        raise ValueError(f"{label} rounds must be a 1-D sequence of per-round medians, got shape {x.shape}")
    good = np.isfinite(x) & (x > 0)
    return x, good


def aa_halves(rounds: ArrayLike) -> tuple[np.ndarray, np.ndarray]:
    """Split rounds into the two A/A halves, A B B A: rounds {0,3,4,7,8,...} and {1,2,5,6,9,...}.

    Index i of one half pairs with index i of the other: (0,1), (3,2), (4,5), (7,6), ... adjacent
    rounds of opposite order; see the module docstring for why this split.
    """
    x = np.asarray(rounds, dtype=float)
    r = np.arange(x.size) % 4
    first = (r == 0) | (r == 3)
    return x[first], x[~first]


def paired_round_ratios(cand: np.ndarray | None, base: np.ndarray | None) -> np.ndarray | None:
    """A variant's per-round latencies over the baseline's of the same interleaved rounds: machine load
    that slows a round slows both, so it cancels. None unless both have the same number (>= 2) of rounds."""
    if cand is None or base is None or cand.size != base.size or cand.size < 2:
        return None
    return cand / base


def _ratio_of_medians(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.median(c, axis=1) / np.median(b, axis=1)


def _median_of_ratios(b: np.ndarray, c: np.ndarray) -> np.ndarray:
    return np.median(c / b, axis=1)


def _ratio_with_ci(
    base: np.ndarray, cand: np.ndarray, paired: bool, alpha: float, n_boot: int, rng: np.random.Generator
) -> tuple[float, float, float, float]:
    """(effect, ci_low, ci_high, bootstrap standard error of log(ratio)) of cand/base, paired or not."""
    if paired:
        effect = float(np.median(cand / base))
        reps = bootstrap((base, cand), _median_of_ratios, paired=True, n_boot=n_boot, rng=rng)
    else:
        effect = float(np.median(cand) / np.median(base))
        reps = bootstrap((base, cand), _ratio_of_medians, paired=False, n_boot=n_boot, rng=rng)
    lo, hi = percentile_ci(reps, alpha)
    logs = np.log(reps[np.isfinite(reps) & (reps > 0)])
    return effect, lo, hi, float(np.std(logs, ddof=1)) if logs.size > 1 else 0.0


def band_from_spread(aa_spread: float, min_band: float) -> float:
    """``tau = max(min_band, exp(2 x spread) - 1)``: the relative change pure noise can show."""
    spread = aa_spread if math.isfinite(aa_spread) else 0.0
    return max(min_band, math.expm1(2.0 * spread))


def decide_latency(
    ci_low: float, ci_high: float, p: float, *, alpha: float, tau: float, max_band: float = 0.05
) -> str:
    """The verdict rule of the module docstring, on a CI of the ratio cand/base and a p-value."""
    if not all(math.isfinite(v) for v in (ci_low, ci_high, p, tau)):
        return "inconclusive"
    low_edge, high_edge = 1.0 / (1.0 + tau), 1.0 + tau
    if p < alpha and ci_high < low_edge:
        return "faster"
    if p < alpha and ci_low > high_edge:
        return "slower"
    if low_edge < ci_low and ci_high < high_edge and tau <= max_band:
        return "equivalent"
    return "inconclusive"


def estimate_rounds_needed(
    effect: float,
    ci_low: float,
    ci_high: float,
    n: int,
    *,
    min_band: float,
    aa_spread: float = 0.0,
    alpha: float = 0.05,
    power: float = 0.8,
) -> int | None:
    """Rough number of rounds for a conclusive verdict with probability ``power``.

    Model: the observed effect is the true one, and both the CI half-width ``h`` and the A/A spread
    ``s`` shrink like ``1/sqrt(n)``. Aiming the CI edge exactly at the band would give a conclusive
    verdict only half the time, so the half-width is inflated by ``(z_{1-alpha/2} + z_power) /
    z_{1-alpha/2}`` (about 1.43 for 80% power), the usual sample-size margin. With
    ``x = sqrt(n / n')`` and ``d = |effect - 1|``:

    * ``d > min_band`` (a change beyond the floor): need ``d - h' x > max(min_band, 2 s x)``;
    * ``d < min_band`` (a change inside the floor): need ``d + h' x < min_band`` (equivalence).

    Returns ``None`` when no number of rounds would do (``d == min_band``), when the estimate exceeds
    ``MAX_ROUNDS``, or when the CI is already narrow enough (then p or the band cap held it back).
    """
    vals = (effect, ci_low, ci_high)
    if n < 1 or not all(math.isfinite(v) for v in vals):
        return None
    d = abs(effect - 1.0)
    z_a = float(sps.norm.ppf(1.0 - alpha / 2.0))
    h = (ci_high - ci_low) / 2.0 * (z_a + float(sps.norm.ppf(power))) / z_a
    s = aa_spread if math.isfinite(aa_spread) else 0.0
    if h <= 0:
        return None
    if d > min_band:
        x = min((d - min_band) / h, d / (h + 2.0 * s))
    elif d < min_band:
        x = (min_band - d) / h
    else:
        return None
    if x <= 0 or x >= 1:
        return None
    need = math.ceil(n / (x * x))
    return need if need <= MAX_ROUNDS else None


def _min_p(n_base: int, n_cand: int, paired: bool) -> float:
    """The smallest two-sided exact p-value the test can reach with these sample sizes."""
    if paired:
        return 2.0 * 0.5 ** min(n_base, 1100)
    if n_base + n_cand > 1000:
        return 0.0
    return min(1.0, 2.0 / math.comb(n_base + n_cand, n_base))


def _signed_rank_p(log_ratios: np.ndarray) -> float:
    if not np.any(log_ratios != 0):
        return 1.0  # every round tied: no evidence of a shift
    return float(sps.wilcoxon(log_ratios, alternative="two-sided").pvalue)


def compare_latency(
    base_rounds: ArrayLike,
    cand_rounds: ArrayLike,
    alpha: float = 0.05,
    min_band: float = 0.01,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int | np.random.Generator = 0,
    *,
    max_band: float = 0.05,
    paired: bool | None = None,
) -> LatencyComparison:
    """Compare per-round median latencies of a candidate against the baseline of the same run.

    ``base_rounds`` and ``cand_rounds`` are the ``details["rounds"]`` lists of the two throughput
    records, in round order. ``paired`` defaults to "equal lengths" (see the module docstring).
    Non-finite or non-positive rounds are ignored and noted (paired: the whole round is dropped). With
    fewer than 2 usable rounds in either list the result is ``"inconclusive"`` with NaN statistics;
    this function never raises on bad measurements, only on misuse (non 1-D input, bad parameters).
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if min_band < 0 or max_band < min_band:
        raise ValueError("need 0 <= min_band <= max_band")
    notes: list[str] = []
    base_all, base_ok = _clean(base_rounds, "baseline")
    cand_all, cand_ok = _clean(cand_rounds, "candidate")
    is_paired = (base_all.size == cand_all.size) if paired is None else bool(paired)
    if is_paired and base_all.size != cand_all.size:
        raise ValueError("paired=True needs one baseline and one candidate value per round (equal lengths)")
    if is_paired:
        keep = base_ok & cand_ok
        base, cand = base_all[keep], cand_all[keep]
        if not keep.all():
            notes.append(f"{int((~keep).sum())} round(s) with a non-finite or non-positive value dropped")
    else:
        base, cand = base_all[base_ok], cand_all[cand_ok]
        for label, ok in (("baseline", base_ok), ("candidate", cand_ok)):
            if not ok.all():
                notes.append(f"{label}: {int((~ok).sum())} non-finite or non-positive round(s) ignored")
    nan = float("nan")
    base_out, cand_out = classify_outliers(base), classify_outliers(cand)
    base_q = classify_noise(base, label="baseline rounds")
    cand_q = classify_noise(cand, label="candidate rounds")
    notes.extend(base_q.notes + cand_q.notes)
    bm = float(np.median(base)) if base.size else nan
    cm = float(np.median(cand)) if cand.size else nan
    rom = cm / bm if base.size and cand.size else nan
    if base.size < 2 or cand.size < 2:
        notes.append(f"too few rounds to compare ({base.size} baseline, {cand.size} candidate; need >= 2)")
        return LatencyComparison(
            verdict="inconclusive",
            effect=rom,
            ci_low=nan,
            ci_high=nan,
            p=nan,
            test="none",
            p_mannwhitney=nan,
            prob_faster=nan,
            tau=min_band,
            aa_ratio=nan,
            aa_ci_low=nan,
            aa_ci_high=nan,
            aa_spread=nan,
            base_median=bm,
            cand_median=cm,
            ratio_of_medians=rom,
            n_base=int(base.size),
            n_cand=int(cand.size),
            paired=is_paired,
            alpha=alpha,
            rounds_needed=None,
            base_outliers=base_out,
            cand_outliers=cand_out,
            base_quality=base_q,
            cand_quality=cand_q,
            notes=tuple(notes),
        )

    rng = make_rng(seed, "latency")
    effect, ci_low, ci_high, _ = _ratio_with_ci(base, cand, is_paired, alpha, n_boot, rng)

    mw = sps.mannwhitneyu(cand, base, alternative="two-sided")
    p_mw = float(mw.pvalue) if math.isfinite(mw.pvalue) else 1.0
    if is_paired:
        test = "wilcoxon-signed-rank"
        p = _signed_rank_p(np.log(cand / base))
        prob_faster = float(np.mean(cand < base) + 0.5 * np.mean(cand == base))
    else:
        test = "mann-whitney"
        p = p_mw
        prob_faster = 1.0 - float(mw.statistic) / (cand.size * base.size)
    if _min_p(base.size, cand.size, is_paired) >= alpha:
        notes.append(
            f"{base.size} vs {cand.size} rounds: the {test} test cannot reach p < {alpha:g}; add rounds"
        )

    # A/A: two interleaved halves of the baseline's rounds, compared like baseline vs candidate.
    aa_ratio = aa_lo = aa_hi = nan
    aa_spread = 0.0
    if base.size >= 4:
        h1, h2 = aa_halves(base)
        m = min(h1.size, h2.size)  # an odd leftover round has no partner: leave it out
        aa_ratio, aa_lo, aa_hi, aa_spread = _ratio_with_ci(h1[:m], h2[:m], True, alpha, n_boot, rng)
        if not aa_lo <= 1.0 <= aa_hi:
            notes.append(
                f"A/A halves of the baseline differ (ratio {aa_ratio:.3f}, CI [{aa_lo:.3f}, "
                f"{aa_hi:.3f}]): drift or order effects the interleaving did not cancel"
            )
    else:
        notes.append("fewer than 4 baseline rounds: no A/A estimate, band = min_band")
    tau = band_from_spread(aa_spread, min_band)

    verdict = decide_latency(ci_low, ci_high, p, alpha=alpha, tau=tau, max_band=max_band)
    if verdict == "inconclusive" and 1.0 / (1.0 + tau) < ci_low and ci_high < 1.0 + tau:
        notes.append(
            f"CI inside the band but band +-{tau:.1%} is wider than max_band +-{max_band:.1%}: "
            "too noisy to call equivalent"
        )
    needed = None
    if verdict == "inconclusive":
        needed = estimate_rounds_needed(
            effect,
            ci_low,
            ci_high,
            min(base.size, cand.size),
            min_band=min_band,
            aa_spread=aa_spread,
            alpha=alpha,
        )
        if needed is not None:
            notes.append(f"~{needed} rounds needed for a conclusive verdict")
    for label, out in (("baseline", base_out), ("candidate", cand_out)):
        if out.total:
            notes.append(f"{label} outlier rounds: {out.describe()}")
    return LatencyComparison(
        verdict=verdict,
        effect=effect,
        ci_low=ci_low,
        ci_high=ci_high,
        p=p,
        test=test,
        p_mannwhitney=p_mw,
        prob_faster=prob_faster,
        tau=tau,
        aa_ratio=aa_ratio,
        aa_ci_low=aa_lo,
        aa_ci_high=aa_hi,
        aa_spread=aa_spread,
        base_median=bm,
        cand_median=cm,
        ratio_of_medians=rom,
        n_base=int(base.size),
        n_cand=int(cand.size),
        paired=is_paired,
        alpha=alpha,
        rounds_needed=needed,
        base_outliers=base_out,
        cand_outliers=cand_out,
        base_quality=base_q,
        cand_quality=cand_q,
        notes=tuple(notes),
    )
