"""Latency verdicts on synthetic interleaved rounds with known answers."""

import math

import numpy as np
import pytest

from microscope.stats import aa_halves, compare_latency, decide_latency, estimate_rounds_needed

N_BOOT = 1000  # enough for stable 95% percentiles in tests, keeps the suite fast


def rounds(rng, n, ratio=1.0, cv=0.03, drift=0.0):
    """Baseline and candidate per-round medians sharing a per-round drift factor (as interleaving does)."""
    shared = 1.0 + drift * np.sin(np.linspace(0.0, 3.0, n))
    base = shared * np.exp(rng.normal(0.0, cv, n))
    cand = ratio * shared * np.exp(rng.normal(0.0, cv, n))
    return base, cand


def test_equal_distributions_are_never_called_faster_or_slower():
    calls, small_p = 0, 0
    sims = 200
    for s in range(sims):
        base, cand = rounds(np.random.default_rng(s), 20, ratio=1.0, cv=0.03, drift=0.05)
        res = compare_latency(base, cand, n_boot=N_BOOT, seed=s)
        calls += res.verdict in ("faster", "slower")
        small_p += res.p < 0.05
    assert calls / sims <= 0.05  # the verdict's false-positive rate is at most alpha
    assert small_p / sims <= 0.10  # and the raw test itself is calibrated (alpha, plus MC slack)


def test_known_speedup_is_detected_and_covered():
    base, cand = rounds(np.random.default_rng(1), 20, ratio=0.8, cv=0.03)
    res = compare_latency(base, cand, n_boot=N_BOOT)
    assert res.verdict == "faster"
    assert res.ci_low <= 0.8 <= res.ci_high
    assert res.effect == pytest.approx(0.8, rel=0.03)
    assert res.p < 0.001
    assert res.prob_faster > 0.95
    assert res.paired and res.test == "wilcoxon-signed-rank"


def test_known_slowdown_is_detected():
    base, cand = rounds(np.random.default_rng(2), 20, ratio=1.25, cv=0.03)
    res = compare_latency(base, cand, n_boot=N_BOOT)
    assert res.verdict == "slower"
    assert res.ci_low <= 1.25 <= res.ci_high
    assert res.prob_faster < 0.05


def test_ci_coverage_of_the_true_ratio():
    sims, covered = 200, 0
    for s in range(sims):
        base, cand = rounds(np.random.default_rng(1000 + s), 20, ratio=0.9, cv=0.04, drift=0.1)
        res = compare_latency(base, cand, n_boot=N_BOOT, seed=s)
        covered += res.ci_low <= 0.9 <= res.ci_high
    # nominal 95%; the percentile bootstrap of a median undercovers a little at n = 20
    assert covered / sims >= 0.88


def test_pairing_by_round_cancels_drift():
    # Drift of +-30% across the run dwarfs a 5% speedup; pairing by round recovers it.
    base, cand = rounds(np.random.default_rng(3), 30, ratio=0.95, cv=0.01, drift=0.3)
    paired = compare_latency(base, cand, n_boot=N_BOOT)
    unpaired = compare_latency(base, cand, n_boot=N_BOOT, paired=False)
    assert paired.verdict == "faster"
    assert paired.ci_low <= 0.95 <= paired.ci_high
    assert unpaired.verdict != "faster"
    assert (paired.ci_high - paired.ci_low) * 5 < unpaired.ci_high - unpaired.ci_low
    assert unpaired.test == "mann-whitney"


def test_quiet_equal_runs_are_equivalent_with_the_minimum_band():
    base, cand = rounds(np.random.default_rng(4), 40, ratio=1.0, cv=0.005)
    res = compare_latency(base, cand, n_boot=N_BOOT, min_band=0.01)
    assert res.verdict == "equivalent"
    assert res.tau == 0.01  # A/A noise below the floor: the band is min_band
    assert 0.99 < res.ci_low <= res.ci_high < 1.01


def test_noisy_run_widens_the_band_from_the_aa_halves():
    base, cand = rounds(np.random.default_rng(5), 30, ratio=1.0, cv=0.08)
    res = compare_latency(base, cand, n_boot=N_BOOT)
    assert res.tau > 0.03  # 2 x A/A spread, far above the 1% floor
    assert res.tau == pytest.approx(math.expm1(2 * res.aa_spread))  # multiplicative band from the log spread
    assert res.aa_ci_low <= 1.0 <= res.aa_ci_high
    assert res.verdict not in ("faster", "slower")


def test_inconclusive_reports_rounds_needed_and_more_rounds_decide():
    rng = np.random.default_rng(3)
    base, cand = rounds(rng, 8, ratio=1.04, cv=0.04, drift=0.02)
    res = compare_latency(base, cand, n_boot=2000)
    assert res.verdict == "inconclusive"
    assert res.rounds_needed is not None and res.rounds_needed > 8
    assert any("rounds needed" in n for n in res.notes)
    decided = 0
    for s in range(20):
        b, c = rounds(np.random.default_rng(100 + s), res.rounds_needed, ratio=1.04, cv=0.04, drift=0.02)
        decided += compare_latency(b, c, n_boot=N_BOOT, seed=s).verdict == "slower"
    assert decided >= 5  # with 8 rounds this never happens (see the first assert)


def test_decide_latency_rule():
    assert decide_latency(0.80, 0.90, 0.01, alpha=0.05, tau=0.05) == "faster"
    assert decide_latency(0.80, 0.90, 0.20, alpha=0.05, tau=0.05) == "inconclusive"  # CI alone is not enough
    assert decide_latency(0.93, 0.97, 0.01, alpha=0.05, tau=0.05) == "inconclusive"  # straddles the band edge
    assert decide_latency(1.10, 1.20, 0.01, alpha=0.05, tau=0.05) == "slower"
    assert decide_latency(0.97, 1.02, 0.60, alpha=0.05, tau=0.05) == "equivalent"
    assert (
        decide_latency(0.97, 1.02, 0.01, alpha=0.05, tau=0.05) == "equivalent"
    )  # significant but negligible
    assert decide_latency(0.95, 1.05, 0.60, alpha=0.05, tau=0.10, max_band=0.05) == "inconclusive"
    assert decide_latency(math.nan, 1.0, 0.01, alpha=0.05, tau=0.05) == "inconclusive"


def test_estimate_rounds_needed_by_hand():
    # d = 0.03, h = 0.03 inflated by (1.96 + 0.8416) / 1.96 for 80% power; x = 0.02 / h'
    h = 0.03 * (1.959964 + 0.841621) / 1.959964
    x = 0.02 / h
    assert estimate_rounds_needed(1.03, 1.0, 1.06, 10, min_band=0.01) == math.ceil(10 / x**2)
    # inside the floor: d = 0.005, equivalence needs d + h' x < 0.01
    h = 0.02 * (1.959964 + 0.841621) / 1.959964
    x = 0.005 / h
    assert estimate_rounds_needed(1.005, 0.985, 1.025, 10, min_band=0.01) == math.ceil(10 / x**2)
    assert estimate_rounds_needed(1.01, 0.99, 1.03, 10, min_band=0.01) is None  # exactly on the floor
    assert estimate_rounds_needed(1.2, 1.19, 1.21, 10, min_band=0.01) is None  # already narrow enough


def test_aa_halves_follow_an_abba_pattern():
    first, second = aa_halves(np.arange(10.0))
    assert first.tolist() == [0, 3, 4, 7, 8]
    assert second.tolist() == [1, 2, 5, 6, 9]  # pairs (0,1) (3,2) (4,5) (7,6) (8,9): adjacent


def test_outlier_rounds_are_counted_and_kept_without_flipping_the_verdict():
    base, cand = rounds(np.random.default_rng(6), 20, ratio=0.8, cv=0.02)
    spiky = cand.copy()
    spiky[7] *= 10.0  # one preempted round
    clean = compare_latency(base, cand, n_boot=N_BOOT)
    res = compare_latency(base, spiky, n_boot=N_BOOT)
    assert res.cand_outliers.high_severe == 1
    assert res.cand_outliers.labels[7] == "high severe"
    assert res.n_cand == 20  # kept, not dropped
    assert res.verdict == clean.verdict == "faster"
    assert any("candidate outlier rounds" in n for n in res.notes)


def test_seeded_bootstrap_is_deterministic():
    base, cand = rounds(np.random.default_rng(7), 15, ratio=0.97, cv=0.03)
    a = compare_latency(base, cand, n_boot=500, seed=11)
    b = compare_latency(base, cand, n_boot=500, seed=11)
    c = compare_latency(base, cand, n_boot=500, seed=12)
    assert (a.ci_low, a.ci_high, a.aa_spread) == (b.ci_low, b.ci_high, b.aa_spread)
    assert (a.ci_low, a.ci_high) != (c.ci_low, c.ci_high)


def test_too_few_rounds_and_bad_values_do_not_raise():
    res = compare_latency([1.0], [0.5], n_boot=100)
    assert res.verdict == "inconclusive" and math.isnan(res.ci_low)
    assert any("too few rounds" in n for n in res.notes)
    res = compare_latency([1.0, 1.1, 0.9], [0.5, 0.55, 0.45], n_boot=100)
    assert res.verdict == "inconclusive"  # 3 paired rounds: signed-rank p >= 0.25 at best
    assert any("cannot reach" in n for n in res.notes)
    res = compare_latency(
        [1.0, math.nan, 1.0, 1.02, 0.98, 1.01], [0.5, 0.5, -1.0, 0.51, 0.49, 0.5], n_boot=100
    )
    assert res.n_base == res.n_cand == 4
    assert any("dropped" in n for n in res.notes)
    with pytest.raises(ValueError):
        compare_latency(np.ones((3, 2)), np.ones(6))


def test_unreliable_rounds_are_flagged():
    base, cand = rounds(np.random.default_rng(8), 20, ratio=1.0, cv=0.35)
    res = compare_latency(base, cand, n_boot=N_BOOT)
    assert res.base_quality.level == "unreliable"
    assert any("unreliable" in n for n in res.notes)
    assert res.verdict == "inconclusive"
