"""The shared bootstrap: seeded, chunked without changing results, paired vs unpaired."""

import numpy as np
import pytest

from microscope.stats import bootstrap as bs


def test_make_rng_is_stable_and_keyed():
    a = bs.make_rng(3, "softmax", "rows=7").random(4)
    b = bs.make_rng(3, "softmax", "rows=7").random(4)
    c = bs.make_rng(3, "softmax", "rows=8").random(4)
    assert np.array_equal(a, b) and not np.array_equal(a, c)
    g = np.random.default_rng(0)
    assert bs.make_rng(g) is g


def test_chunking_does_not_change_the_replicates(monkeypatch):
    x = np.random.default_rng(0).normal(size=50)
    whole = bs.bootstrap((x,), lambda v: v.mean(axis=1), paired=True, n_boot=300, rng=bs.make_rng(1))
    monkeypatch.setattr(bs, "MAX_CELLS", 7 * 50)  # 7 replicates per chunk
    chunked = bs.bootstrap((x,), lambda v: v.mean(axis=1), paired=True, n_boot=300, rng=bs.make_rng(1))
    assert np.array_equal(whole, chunked)  # memory bounding changes nothing, not even the stream


def test_paired_keeps_elements_together():
    x = np.arange(1.0, 21.0)
    diffs = bs.bootstrap(
        (x, x + 1.0), lambda a, b: (b - a).mean(axis=1), paired=True, n_boot=200, rng=bs.make_rng(0)
    )
    assert np.all(diffs == 1.0)
    unpaired = bs.bootstrap(
        (x, x + 1.0), lambda a, b: (b - a).mean(axis=1), paired=False, n_boot=200, rng=bs.make_rng(0)
    )
    assert unpaired.std() > 1.0
    with pytest.raises(ValueError):
        bs.bootstrap((x, x[:-1]), lambda a, b: a.mean(axis=1), paired=True, n_boot=10, rng=bs.make_rng(0))


def test_percentile_ci_and_cluster_bootstrap():
    lo, hi = bs.percentile_ci(np.arange(1001.0), alpha=0.05)
    assert (lo, hi) == pytest.approx((25.0, 975.0))
    values = np.array([1.0, 1.0, 5.0, 5.0, 5.0])
    groups = np.array([0, 0, 1, 1, 1])
    reps, k = bs.bootstrap_clustered_mean(values, groups, n_boot=400, rng=bs.make_rng(0))
    assert k == 2
    # only three possible replicate means: both clusters {1,1}, {5,5,5}, or one of each (17/5)
    assert set(np.round(reps, 6)) <= {1.0, 5.0, 3.4}
