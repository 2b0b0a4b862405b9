"""Kernel numerics verdict: honest low-precision outputs pass; zeros, constants, shifts never do."""

import math

import numpy as np
import pytest

from microscope.stats import judge_outputs, numerics_errors, numerics_verdict, unit_roundoff

RTOL, ATOL = 1e-2, 1e-3


def case(seed=0, n=4096, mean=0.0, std=1.0):
    """float64 truth and the baseline's fp16 output (its only error is fp16 rounding)."""
    truth = mean + std * np.random.default_rng(seed).normal(size=n)
    return truth, truth.astype(np.float16)


def judge(candidate, baseline, truth, **kw):
    return judge_outputs(candidate, baseline, truth, rtol=RTOL, atol=ATOL, **kw)


def test_an_honest_fp16_candidate_passes():
    truth, base = case()
    # a different accumulation order: float32 noise a few ulps wide, then the fp16 cast
    noisy = truth + np.random.default_rng(1).normal(0.0, 2e-4, truth.size) * np.abs(truth)
    res = judge(noisy.astype(np.float16), base, truth)
    assert res.passed and res.verdict == "pass" and res.reasons == ()
    assert res.error_ratio < 4.0  # in units of max(baseline error, fp16 unit roundoff)


def test_all_zeros_output_fails_from_errors_and_from_arrays():
    truth, base = case()
    zeros = np.zeros_like(base)
    err = numerics_errors(zeros, truth, rtol=RTOL, atol=ATOL)
    assert err.norm_rel_err == pytest.approx(1.0)
    assert err.mismatch_fraction > 0.99
    ref = numerics_errors(base, truth, rtol=RTOL, atol=ATOL)
    # even with a huge k and a mismatch allowance, an error norm of 1 never passes
    v = numerics_verdict(err.norm_rel_err, ref.norm_rel_err, k=1e6, mismatch_fraction=0.0, max_mismatch=0.5)
    assert not v.passed and any("all zeros" in r for r in v.reasons)
    res = judge(zeros, base, truth, k=1e6, max_mismatch=0.99)
    assert not res.passed and "all-zeros output" in res.reasons


def test_constant_output_fails():
    truth, base = case()
    const = np.full_like(base, np.float16(truth.mean()))
    err = numerics_errors(const, truth, rtol=RTOL, atol=ATOL)
    ref = numerics_errors(base, truth, rtol=RTOL, atol=ATOL)
    v = numerics_verdict(err.norm_rel_err, ref.norm_rel_err, k=4, mismatch_fraction=err.mismatch_fraction)
    assert not v.passed
    res = judge(const, base, truth)
    assert not res.passed and any("constant output" in r for r in res.reasons)


def test_constant_output_on_a_large_mean_signal_is_caught_where_allclose_and_the_plain_rule_are_blind():
    # truth = 1000 +- 1.5: the offset dominates the norm, so a constant 1000 is within 0.15% of it
    truth, base = case(mean=1000.0, std=1.5)
    const = np.full_like(base, np.float16(1000.0))
    err = numerics_errors(const, truth, rtol=RTOL, atol=ATOL)
    ref = numerics_errors(base, truth, rtol=RTOL, atol=ATOL)
    assert err.mismatch_fraction == 0.0  # a global allclose(rtol=1e-2) would pass it
    fp16 = unit_roundoff(np.float16)
    assert numerics_verdict(err.norm_rel_err, ref.norm_rel_err, k=4, floor=fp16).passed  # and the plain rule
    res = judge(const, base, truth)
    assert not res.passed
    assert any("constant output" in r for r in res.reasons)
    assert any(r.startswith("centered:") for r in res.reasons)


def test_flattened_output_fails_on_the_centered_rule():
    truth, base = case(mean=1000.0, std=1.5)
    flat = (1000.0 + 0.3 * (truth - 1000.0)).astype(np.float16)  # keeps the mean, loses 70% of the signal
    assert np.unique(flat).size > 1  # not constant: the constant-output guard does not apply
    res = judge(flat, base, truth)
    assert not res.passed
    assert all(r.startswith("centered:") for r in res.reasons)  # only the centered rule can see it


@pytest.mark.parametrize("shift", [0.05, -0.05, 0.5])
def test_shifted_output_fails(shift):
    truth, base = case()
    shifted = (truth + shift).astype(np.float16)
    err = numerics_errors(shifted, truth, rtol=RTOL, atol=ATOL)
    ref = numerics_errors(base, truth, rtol=RTOL, atol=ATOL)
    assert err.centered_rel_err < 1e-3  # the shape is perfect...
    v = numerics_verdict(err.norm_rel_err, ref.norm_rel_err, k=4, mismatch_fraction=err.mismatch_fraction)
    assert not v.passed  # ...but the offset is far beyond fp16's own error
    assert not judge(shifted, base, truth).passed


def test_noise_calibrated_rule_by_hand():
    assert numerics_verdict(3e-3, 1e-3, k=4).passed
    v = numerics_verdict(5e-3, 1e-3, k=4)
    assert not v.passed and v.error_ratio == pytest.approx(5.0) and v.limit == pytest.approx(4e-3)
    # an exact baseline (error 0) is floored at the dtype's unit roundoff
    assert numerics_verdict(3e-8, 0.0, k=4, floor=unit_roundoff(np.float32)).passed
    assert not numerics_verdict(3e-7, 0.0, k=4, floor=unit_roundoff(np.float32)).passed
    assert not numerics_verdict(1e-3, 1e-3, mismatch_fraction=0.02, max_mismatch=0.01).passed
    assert numerics_verdict(1e-3, 1e-3, mismatch_fraction=0.005, max_mismatch=0.01).passed
    assert not numerics_verdict(math.nan, 1e-3).passed
    assert not numerics_verdict(math.inf, 1e-3).passed
    assert not numerics_verdict(1.2, 0.5, k=4).passed  # a bad baseline does not license garbage
    with pytest.raises(ValueError):
        numerics_verdict(1e-3, 1e-3, k=0.5)


def test_non_finite_and_wrong_shape_outputs_fail():
    truth, base = case()
    bad = base.copy()
    bad[17] = np.nan
    res = judge(bad, base, truth)
    assert not res.passed and "non-finite values where the reference is finite" in res.reasons
    assert not judge(base[:-1], base, truth).passed


def test_unit_roundoff():
    assert unit_roundoff(np.float32) == 2.0**-24
    assert unit_roundoff(np.float16) == 2.0**-11
    assert unit_roundoff("bf16") == 2.0**-8
