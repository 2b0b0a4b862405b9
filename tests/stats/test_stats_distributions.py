"""Stability / generalization distributions over seeds, and the per-seed summaries."""

import math

import numpy as np
import pytest

from microscope.stats import compare_distributions, count_loss_spikes, count_nonfinite, grad_norm_cv

BASE_SPIKES = [0, 1, 0, 2, 1, 0, 1, 0]
CAND_SPIKES = [3, 4, 2, 5, 3, 4, 6, 3]


def test_more_loss_spikes_is_worse_and_fewer_is_better():
    worse = compare_distributions(BASE_SPIKES, CAND_SPIKES, n_boot=2000)
    assert worse.verdict == "worse"
    assert worse.delta == pytest.approx(np.mean(CAND_SPIKES) - np.mean(BASE_SPIKES))
    assert worse.ci_low > 0 and worse.p < 0.01
    assert worse.prob_greater == 63.5 / 64  # one tie (2 vs 2) of 64 pairs counts half
    better = compare_distributions(CAND_SPIKES, BASE_SPIKES, n_boot=2000)
    assert better.verdict == "better" and better.ci_high < 0
    neutral = compare_distributions(BASE_SPIKES, CAND_SPIKES, lower_is_better=None, n_boot=2000)
    assert neutral.verdict == "higher"
    accuracy_like = compare_distributions(BASE_SPIKES, CAND_SPIKES, lower_is_better=False, n_boot=2000)
    assert accuracy_like.verdict == "better"


def test_equal_distributions_rarely_differ():
    rng = np.random.default_rng(0)
    false = 0
    sims = 1200
    for s in range(sims):
        res = compare_distributions(rng.gamma(2.0, 0.1, 8), rng.gamma(2.0, 0.1, 8), n_boot=200, seed=s)
        false += res.verdict in ("better", "worse")
    assert false / sims <= 0.065  # alpha = 0.05 plus Monte-Carlo slack (2.5 sd at 1200 runs)


def test_known_shift_in_medians_is_covered():
    rng = np.random.default_rng(1)
    base = rng.normal(0.30, 0.02, 12)
    cand = rng.normal(0.20, 0.02, 12)  # e.g. a lower grad-norm CV
    res = compare_distributions(base, cand, statistic="median", n_boot=2000)
    assert res.verdict == "better"
    assert res.ci_low <= -0.10 <= res.ci_high


def test_equivalence_cases_and_small_samples():
    zeros = compare_distributions([0, 0, 0, 0], [0, 0, 0, 0])
    assert zeros.verdict == "identical"  # no NaN steps anywhere
    close = compare_distributions([1.00, 1.02, 0.98, 1.01], [1.01, 0.99, 1.00, 1.02], margin=0.1, n_boot=1000)
    assert close.verdict == "equivalent"
    assert compare_distributions([1.00, 1.02, 0.98, 1.01], [1.01, 0.99, 1.00, 1.02], n_boot=1000).verdict == (
        "inconclusive"
    )
    tiny = compare_distributions([1.0], [2.0, 3.0])
    assert tiny.verdict == "inconclusive" and math.isnan(tiny.p)
    paired = compare_distributions([1.0, 2.0, math.nan, 4.0], [1.5, 2.5, 3.5, 4.5], paired=True, n_boot=500)
    assert paired.n_base == paired.n_cand == 3 and any("non-finite" in n for n in paired.notes)


def test_per_seed_summaries():
    assert grad_norm_cv([1.0, 2.0, 3.0]) == pytest.approx(0.5)  # std (ddof=1) 1 / mean 2
    assert grad_norm_cv([1.0, 2.0, 3.0, math.nan]) == pytest.approx(0.5)
    assert math.isnan(grad_norm_cv([1.0]))
    assert count_nonfinite([1.0, math.nan, math.inf, -math.inf, 2.0]) == 3
    loss = np.full(40, 2.0)
    loss[10], loss[20] = 4.0, 3.5  # +100% and +75%: spikes
    loss[30] = 2.5  # +25%: below the 50% threshold
    loss[35] = math.nan  # not a spike (counted by count_nonfinite)
    assert count_loss_spikes(loss) == 2
    assert count_loss_spikes(loss, threshold=0.2) == 3
    assert count_loss_spikes([10.0, 1.0, 1.0]) == 0  # too little history to judge


def test_three_seeds_can_decide_and_the_ci_agrees_with_the_verdict():
    """3 vs 3 clearly separated seeds: a rank test could not go below p = 0.1; the paired t (the
    seeds are matched) and Welch decide, and their CI excludes zero exactly when p < alpha."""
    paired = compare_distributions([1.0, 1.1, 1.2], [5.0, 5.12, 5.19], paired=True)
    assert paired.verdict == "worse" and paired.p < 0.05 and paired.ci_low > 0
    welch = compare_distributions([1.0, 1.1, 1.2], [5.0, 5.1, 5.2])
    assert welch.verdict == "worse" and welch.ci_low > 0
    rng = np.random.default_rng(3)
    for _ in range(200):
        b, c = rng.normal(0, 1, 3), rng.normal(rng.normal(0, 2), 1, 3)
        for res in (compare_distributions(b, c, paired=True), compare_distributions(b, c)):
            excludes_zero = res.ci_low > 0 or res.ci_high < 0
            assert excludes_zero == (res.p < 0.05), (res.ci_low, res.ci_high, res.p)


def test_bit_identical_seeds_are_identical_not_inconclusive():
    same = compare_distributions([2.5, 2.7, 2.6], [2.5, 2.7, 2.6], paired=True)
    assert same.verdict == "identical" and same.ci_low == same.ci_high == 0.0
    assert compare_distributions([0, 0, 0], [0, 0, 0]).verdict == "identical"
    shifted = compare_distributions([0.5, 0.75, 0.625], [0.625, 0.875, 0.75], paired=True)  # exactly +0.125
    assert shifted.verdict == "worse" and shifted.p == 0.0


def test_a_float32_rounding_difference_on_every_seed_is_identical_not_worse():
    """A sharded model sums in another order: the same 1.3e-8 on a loss of 4.27 on every seed is float32
    noise (an exact paired t would call it "worse" at p = 0); a 1e-4 difference stays a difference."""
    base = np.array([4.2763888, 4.2811234])
    res = compare_distributions(base, base + 1.3e-8, paired=True, lower_is_better=True)
    assert res.verdict == "identical" and "float32 resolution" in " ".join(res.notes)
    assert compare_distributions(base, base + 1e-4, paired=True, lower_is_better=True).verdict == "worse"
