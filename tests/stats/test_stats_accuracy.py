"""Model-level accuracy: paired vs unpaired, seed means, non-inferiority verdicts."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from microscope.stats import (
    accuracy_verdict,
    compare_paired_accuracy,
    compare_seed_accuracy,
    compare_unpaired_accuracy,
    estimate_seeds_needed,
)


def per_token_losses(seed=0, n=2000, shift=0.02):
    """Per-token losses with huge between-token variance and a small constant candidate shift."""
    rng = np.random.default_rng(seed)
    base = rng.lognormal(0.5, 1.0, n)  # token difficulty: sd ~ 3 nats
    cand = base + shift + rng.normal(0.0, 0.005, n)
    return base, cand


def test_paired_test_detects_a_shift_that_the_unpaired_test_misses():
    base, cand = per_token_losses()
    paired = compare_paired_accuracy(base, cand)
    unpaired = compare_unpaired_accuracy(base, cand)
    assert paired.verdict == "worse"  # loss went up: lower is better by default
    assert paired.ci_low <= 0.02 <= paired.ci_high
    assert paired.ci_high - paired.ci_low < 0.002
    assert paired.p < 1e-6
    assert unpaired.verdict == "inconclusive"
    assert unpaired.p > 0.05
    assert unpaired.ci_low < 0 < unpaired.ci_high
    assert paired.estimate == pytest.approx(unpaired.estimate)  # same point estimate, different evidence


def test_paired_ci_covers_the_true_shift_across_seeds():
    covered = sum(
        (
            r := compare_paired_accuracy(*per_token_losses(seed=s, n=500, shift=0.01), n_boot=500, seed=s)
        ).ci_low
        <= 0.01
        <= r.ci_high
        for s in range(100)
    )
    assert covered >= 88


def test_cluster_bootstrap_widens_the_ci_when_tokens_of_a_sequence_are_correlated():
    rng = np.random.default_rng(1)
    seqs, per_seq = 40, 50
    groups = np.repeat(np.arange(seqs), per_seq)
    base = rng.lognormal(0.5, 1.0, seqs * per_seq)
    # the candidate helps some sequences and hurts others: a per-sequence effect, mean ~0
    cand = base + rng.normal(0.0, 0.05, seqs)[groups] + rng.normal(0.0, 0.005, seqs * per_seq)
    iid = compare_paired_accuracy(base, cand)
    clustered = compare_paired_accuracy(base, cand, groups=groups)
    assert clustered.method == "paired-cluster-bootstrap" and clustered.n == seqs
    assert (clustered.ci_high - clustered.ci_low) > 3 * (iid.ci_high - iid.ci_low)


@pytest.mark.parametrize(
    "ci, p, margin, higher, expected",
    [
        ((-0.01, 0.01), 0.9, 0.05, False, "equivalent"),  # inside +-margin
        ((-0.03, -0.01), 0.001, 0.05, True, "equivalent"),  # significantly worse, but negligibly
        ((0.01, 0.08), 0.001, 0.05, True, "better"),
        ((-0.08, -0.01), 0.001, 0.05, False, "better"),  # loss down: better for lower-is-better
        ((-0.03, 0.08), 0.3, 0.05, True, "non-inferior"),  # may be worse, but by < margin
        ((-0.09, -0.01), 0.001, 0.05, True, "worse"),  # significantly worse, margin not excluded
        ((-0.20, -0.10), 0.001, 0.05, True, "worse"),  # worse by more than the margin
        ((-0.09, 0.02), 0.3, 0.05, True, "inconclusive"),
        ((0.01, 0.08), 0.001, 0.0, True, "better"),  # no margin: plain superiority test
        ((-0.01, 0.01), 0.9, 0.0, True, "inconclusive"),  # no margin: equivalence impossible
        ((-0.08, -0.01), 0.2, 0.0, True, "inconclusive"),  # CI excludes 0 but p does not agree
    ],
)
def test_accuracy_verdict_rule(ci, p, margin, higher, expected):
    assert accuracy_verdict(*ci, p, alpha=0.05, margin=margin, higher_is_better=higher) == expected


def test_non_inferiority_margin_on_real_samples():
    base, cand = per_token_losses(shift=0.02)
    assert compare_paired_accuracy(base, cand, margin=0.05).verdict == "equivalent"
    assert compare_paired_accuracy(base, cand, margin=0.01).verdict == "worse"
    # accuracy-like metric (higher is better) going up
    hits_base = (np.random.default_rng(2).random(5000) < 0.6).astype(float)
    hits_cand = hits_base.copy()
    flip = np.flatnonzero(hits_base == 0)[:250]  # the candidate fixes 250 wrong tokens
    hits_cand[flip] = 1.0
    res = compare_paired_accuracy(hits_base, hits_cand, higher_is_better=True)
    assert res.verdict == "better"
    assert res.estimate == pytest.approx(250 / 5000)


def test_welch_on_seed_means_matches_the_textbook_formula():
    base = np.array([3.10, 3.05, 3.20, 3.12, 3.08])
    cand = np.array([3.00, 2.90, 3.02, 2.95, 3.05, 2.98])
    res = compare_seed_accuracy(base, cand, method="welch")
    v1, v2 = base.var(ddof=1) / base.size, cand.var(ddof=1) / cand.size
    df = (v1 + v2) ** 2 / (v1**2 / (base.size - 1) + v2**2 / (cand.size - 1))
    d = cand.mean() - base.mean()
    half = sps.t.ppf(0.975, df) * math.sqrt(v1 + v2)
    assert res.estimate == pytest.approx(d)
    assert (res.ci_low, res.ci_high) == pytest.approx((d - half, d + half))
    assert res.p == pytest.approx(2 * sps.t.sf(abs(d) / math.sqrt(v1 + v2), df))
    assert res.verdict == "better"  # loss went down by ~0.11 with p < 0.01


def test_seed_comparisons_are_calibrated_under_the_null():
    rng = np.random.default_rng(3)
    false = 0
    for _ in range(300):
        res = compare_seed_accuracy(rng.normal(3.0, 0.05, 5), rng.normal(3.0, 0.05, 5))
        false += res.verdict in ("better", "worse")
    assert false / 300 <= 0.07


def test_seed_bootstrap_and_degenerate_inputs():
    res = compare_seed_accuracy([1.0, 1.1, 0.9, 1.05], [1.5, 1.6, 1.4, 1.55], method="bootstrap")
    assert res.method == "seed-bootstrap" and res.verdict == "worse"
    exact = compare_seed_accuracy([2.0, 2.0, 2.0], [2.0, 2.0, 2.0])
    assert exact.verdict == "identical" and exact.p == 1.0 and exact.ci_low == exact.ci_high == 0.0
    assert compare_seed_accuracy([2.0, 2.0], [2.0, 2.0], margin=0.1).verdict == "identical"
    one = compare_seed_accuracy([2.0], [2.1, 2.2])
    assert one.verdict == "inconclusive" and math.isnan(one.p)
    diverged = compare_seed_accuracy([2.0, 2.1, 2.05], [2.0, math.nan, 2.1])
    assert any("non-finite" in n for n in diverged.notes) and diverged.n == 2
    with pytest.raises(ValueError):
        compare_paired_accuracy([1.0, 2.0], [1.0])


def test_paired_seed_t_matches_the_textbook_formula_and_handles_exact_differences():
    base = np.array([3.10, 3.05, 3.20, 3.12])
    cand = base + np.array([-0.10, -0.12, -0.07, -0.11])
    res = compare_seed_accuracy(base, cand, method="paired")
    d = cand - base
    half = sps.t.ppf(0.975, 3) * d.std(ddof=1) / 2
    assert res.method == "seed-paired-t" and res.n == 4
    assert (res.ci_low, res.ci_high) == pytest.approx((d.mean() - half, d.mean() + half))
    assert res.verdict == "better"
    exact = compare_seed_accuracy([2.0, 2.5, 3.0], [2.0, 2.5, 3.0], method="paired", margin=1e-3)
    assert exact.verdict == "identical" and exact.ci_low == exact.ci_high == 0.0
    with pytest.raises(ValueError, match="equal lengths"):
        compare_seed_accuracy([1.0, 2.0], [1.0], method="paired")


def test_training_noise_is_not_a_verdict_when_the_seed_is_the_unit():
    """Two arms that differ only by run-to-run training noise: each seed's model is a little better or
    worse on every token. Pooling the tokens calls most such pairs different; the seed-level test does not."""
    rng = np.random.default_rng(11)
    pooled_calls = seed_calls = 0
    for _ in range(40):
        seeds_b, seeds_c = [], []
        for _seed in range(3):
            tokens = rng.lognormal(0.5, 1.0, 2000)
            seeds_b.append(tokens + rng.normal(0, 0.02, tokens.size))
            seeds_c.append(tokens + rng.normal(0, 0.02, tokens.size) + rng.normal(0, 0.01))  # this run's offset
        pooled = compare_paired_accuracy(np.concatenate(seeds_b), np.concatenate(seeds_c), n_boot=300)
        by_seed = compare_seed_accuracy([b.mean() for b in seeds_b], [c.mean() for c in seeds_c], method="paired")
        pooled_calls += pooled.verdict in ("better", "worse")
        seed_calls += by_seed.verdict in ("better", "worse")
    assert pooled_calls >= 20  # the flaw the seed-level test removes
    assert seed_calls <= 4


def _decided_share(mean, sd, n, trials, rng, **kw):
    """Share of simulated n-seed runs whose paired t over seeds is not inconclusive."""
    decided = 0
    for _ in range(trials):
        base = rng.normal(2.0, 0.3, n)
        res = compare_seed_accuracy(base, base + rng.normal(mean, sd, n), method="paired", **kw)
        decided += res.verdict != "inconclusive"
    return decided / trials


@pytest.mark.parametrize("mean, sd, margin", [(-0.05, 0.06, 0.0), (0.002, 0.02, 0.03), (-0.01, 0.03, 0.02)])
def test_the_seeds_needed_estimate_decides_about_as_often_as_its_power_says(mean, sd, margin):
    """At the estimated number of seeds, runs with that true mean and spread decide about 80% of the time;
    at half as many, clearly less often."""
    rng = np.random.default_rng(5)
    shape = rng.standard_normal(400)
    exact = mean + sd * (shape - shape.mean()) / shape.std(ddof=1)  # the true mean and spread, exactly
    need = estimate_seeds_needed(exact, margin=margin)
    assert need is not None and need >= 4
    at_need = _decided_share(mean, sd, need, 300, rng, margin=margin)
    at_half = _decided_share(mean, sd, max(2, need // 2), 300, rng, margin=margin)
    assert 0.65 <= at_need <= 0.95
    assert at_half < at_need - 0.15


def test_an_inconclusive_seed_comparison_notes_the_seeds_a_decision_needs():
    base = np.array([2.01, 2.11, 2.12])
    inconclusive = compare_seed_accuracy(base, base + np.array([0.05, -0.12, -0.05]), method="paired")
    assert inconclusive.verdict == "inconclusive"
    need = estimate_seeds_needed(np.array([0.05, -0.12, -0.05]))
    assert need is not None and need > 3
    assert any(f"about {need} seeds would decide it" in n for n in inconclusive.notes)
    decided = compare_seed_accuracy(base, base + np.array([0.10, 0.12, 0.09]), method="paired")
    assert decided.verdict == "worse" and not any("seeds would decide" in n for n in decided.notes)
    lost = compare_seed_accuracy(base, base + np.array([0.05, -0.05, 0.001]), method="paired")
    assert estimate_seeds_needed(np.array([0.05, -0.05, 0.001])) is None
    assert any("more than 50 seeds" in n for n in lost.notes)
