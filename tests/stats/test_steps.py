"""Step and drift detection over run-level values: planted changes are found at their commit, flat noise
stays quiet, and short, tied or NaN-holed series are handled."""

from __future__ import annotations

import math

import numpy as np
import pytest

from microscope.stats.steps import (
    default_min_change,
    detect_drift,
    detect_steps,
    log_scale,
    robust_noise,
    short_commit,
)

COMMITS = [f"{i:02d}" + "ab" * 19 for i in range(60)]


def _noisy(n: int, sd: float, seed: int) -> np.ndarray:
    return np.exp(np.random.default_rng(seed).normal(0.0, sd, n))


def test_a_planted_five_percent_step_is_found_at_its_commit():
    x = 0.5 * _noisy(10, 0.005, 1)
    x[6:] *= 1.05
    (step,) = detect_steps(x, COMMITS[:10], log=True, min_change=0.01)
    assert step.index == 6 and (step.commit_before, step.commit_after) == (COMMITS[5], COMMITS[6])
    assert step.commit_range == f"{COMMITS[5][:8]}..{COMMITS[6][:8]}"
    assert step.change == pytest.approx(0.05, abs=0.01) and step.relative
    assert step.level_before == pytest.approx(0.5, rel=0.01) and (step.n_before, step.n_after) == (6, 4)
    assert "+5." in step.describe("ms") and "ms) in 0" in step.describe("ms")


@pytest.mark.parametrize("split", [2, 3])
def test_five_nights_with_real_run_noise_find_the_step_almost_always(split):
    found = 0
    for seed in range(100):
        x = _noisy(5, 0.005, seed)
        x[split:] *= 1.05
        steps = detect_steps(x, COMMITS[:5], log=True, min_change=0.01)
        found += len(steps) == 1 and steps[0].index == split
    assert found >= 90


def test_flat_noisy_series_rarely_show_a_step():
    rng = np.random.default_rng(2024)
    trials = 300
    false = sum(bool(detect_steps(np.exp(rng.normal(0, 0.01, int(rng.integers(5, 40)))), log=True, min_change=0.01))
                for _ in range(trials))
    assert false / trials <= 0.05


def test_heavy_tailed_nights_rarely_show_a_step():
    rng = np.random.default_rng(7)
    false = sum(bool(detect_steps(np.exp(0.006 * rng.standard_t(3, 20)), log=True, min_change=0.01))
                for _ in range(200))
    assert false / 200 <= 0.05


def test_one_odd_night_is_an_outlier_not_a_step():
    x = np.full(10, 1.0) * _noisy(10, 0.003, 3)
    x[4] *= 1.3
    assert detect_steps(x, log=True, min_change=0.01) == []


def test_short_series_have_no_steps():
    assert detect_steps([1.0, 1.0, 2.0], log=True) == []
    assert detect_steps([], log=True) == []
    assert len(detect_steps([1.0, 1.0, 2.0, 2.0])) == 1  # 2 runs either side is enough when exact


def test_nan_and_non_positive_values_are_skipped_and_indices_stay_in_the_input():
    x = [1.0, math.nan, 1.0, 1.0, -1.0, 2.0, math.inf, 2.0, 2.0]
    (step,) = detect_steps(x, COMMITS[:9], log=True)
    assert step.index == 5 and step.commit_before == COMMITS[3] and step.change == pytest.approx(1.0)


def test_a_deterministic_metric_that_moves_once_has_one_step():
    x = [1_000_000.0] * 6 + [1_001_000.0] * 5  # tied nights: the noise is 0, a 0.1% change is real
    (step,) = detect_steps(x, log=True, min_change=0.0005)
    assert step.index == 6 and step.change == pytest.approx(0.001)
    assert detect_steps(x, log=True, min_change=0.01) == []  # below a 1% floor


def test_steps_fall_only_between_different_commits():
    x = [1.0, 1.0, 1.0, 1.1, 1.1, 1.1]
    commits = ["a", "a", "a", "a", "b", "b"]  # the change shows inside commit "a": not blamed on it
    (step,) = detect_steps(x, commits, log=True)
    assert step.index == 4 and step.commit_before == "a" and step.commit_after == "b"
    assert detect_steps(x, ["a"] * 6, log=True) == []


def test_accuracy_steps_are_differences_in_the_metric_units():
    rng = np.random.default_rng(5)
    loss = 2.30 + rng.normal(0, 0.002, 12)
    loss[7:] += 0.02
    (step,) = detect_steps(loss, COMMITS[:12])
    assert step.index == 7 and not step.relative and step.change == pytest.approx(0.02, abs=0.004)
    assert "+0.02" in step.describe()


def test_two_steps_are_both_reported():
    x = _noisy(15, 0.004, 11)
    x[5:] *= 1.10
    x[10:] /= 1.10
    assert [s.index for s in detect_steps(x, log=True, min_change=0.01)] == [5, 10]


def test_a_known_noise_level_overrides_the_series_estimate():
    x = _noisy(10, 0.004, 4)
    x[5:] *= 1.05
    assert len(detect_steps(x, log=True)) == 1
    assert detect_steps(x, log=True, noise=0.05) == []  # a 5% change inside 5% noise is no step


def test_slow_drift_is_reported_and_flat_noise_is_not():
    t = np.arange(30)
    creeping = np.exp(0.004 * t) * _noisy(30, 0.003, 8)  # +0.4% a night: no single step
    drift = detect_drift(creeping, log=True, min_change=0.01)
    assert drift is not None and drift.slope == pytest.approx(0.004, abs=0.0015) and drift.total > 0.08
    assert "per run over the last 30 runs" in drift.describe()
    flat = sum(detect_drift(_noisy(30, 0.01, s), log=True, min_change=0.01) is not None for s in range(100))
    assert flat <= 5
    assert detect_drift(creeping[:5], log=True) is None  # too few runs


def test_noise_estimate_and_scales():
    x = _noisy(400, 0.01, 9)
    assert robust_noise(np.log(x)) == pytest.approx(0.01, rel=0.15)
    stepped = np.log(x)
    stepped[200:] += 0.2  # a step is one large difference: it does not inflate the estimate
    assert robust_noise(stepped) == pytest.approx(0.01, rel=0.15)
    assert robust_noise([5.0, 5.0, 5.0]) == 0.0 and robust_noise([1.0]) == 0.0
    assert log_scale("throughput", "latency_ms") and log_scale("memory", "peak_bytes")
    assert not log_scale("accuracy", "eval_loss") and not log_scale("stability", "grad_norm_cv")
    assert default_min_change("memory", "peak_bytes") == 0.001 and default_min_change("accuracy", "loss") == 0.0
    assert short_commit("f" * 40 + "+dirty") == "ffffffff+dirty" and short_commit("unknown") == "unknown"


def test_bad_arguments_are_refused():
    with pytest.raises(ValueError, match="3 values but 2 commits"):
        detect_steps([1.0, 2.0, 3.0], ["a", "b"])
    with pytest.raises(ValueError, match="min_size"):
        detect_steps([1.0] * 5, min_size=0)
