"""Holm and Benjamini-Hochberg against hand-computed values."""

import math

import numpy as np
import pytest
from scipy import stats as sps

from microscope.stats import adjust_pvalues, benjamini_hochberg, holm

P = [0.01, 0.04, 0.03, 0.005]


def test_holm_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> running max
    assert holm(P) == pytest.approx([0.03, 0.06, 0.06, 0.02])


def test_bh_by_hand():
    # sorted 0.005, 0.01, 0.03, 0.04 -> x4/1, x4/2, x4/3, x4/4 = 0.02, 0.02, 0.04, 0.04
    # -> running min from the top
    assert benjamini_hochberg(P) == pytest.approx([0.02, 0.04, 0.04, 0.02])


def test_caps_and_nan_rows():
    assert holm([0.5, 0.6]) == pytest.approx([1.0, 1.0])
    adj = holm([0.01, math.nan, 0.02])  # NaN: a row without a test, not counted in m
    assert adj[0] == pytest.approx(0.02) and adj[2] == pytest.approx(0.02) and math.isnan(adj[1])
    bh = benjamini_hochberg([math.nan, 0.01, 0.04])
    assert math.isnan(bh[0]) and bh[1:] == pytest.approx([0.02, 0.04])
    assert holm([]).size == 0
    with pytest.raises(ValueError):
        holm([1.5])


def test_against_scipy_and_basic_properties():
    p = np.random.default_rng(0).random(25) ** 3
    assert benjamini_hochberg(p) == pytest.approx(sps.false_discovery_control(p, method="bh"))
    h = holm(p)
    assert np.all(h >= p) and np.all(h >= benjamini_hochberg(p) - 1e-15)  # Holm is the stricter
    order = np.argsort(p)
    assert np.all(np.diff(h[order]) >= 0)  # adjusted values keep the order of the raw ones
    assert adjust_pvalues(p, "holm") == pytest.approx(h)
    with pytest.raises(ValueError):
        adjust_pvalues(p, "bonferroni-ish")
