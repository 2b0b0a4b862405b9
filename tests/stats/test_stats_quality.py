"""Machine quality flags and Tukey-fence outlier classification."""

import math

from microscope.stats import classify_noise, classify_outliers


def test_noise_levels_by_hand():
    ok = classify_noise([95, 97, 100, 103, 105])  # IQR 6 / median 100
    assert ok.level == "ok" and ok.rel_iqr == 0.06 and ok.flags == () and ok.ok
    noisy = classify_noise([90, 95, 100, 108, 110])  # IQR 13 / 100
    assert noisy.level == "noisy" and noisy.flags == ("noisy",)
    assert any("noisy" in n for n in noisy.notes)
    bad = classify_noise([70, 85, 100, 115, 130], label="baseline rounds")  # IQR 30 / 100
    assert bad.level == "unreliable" and "unreliable" in bad.flags
    assert bad.notes[0].startswith("baseline rounds: IQR/median 30.0%")


def test_noise_edge_cases():
    few = classify_noise([1.0, 1.5])
    assert "few-samples" in few.flags
    assert classify_noise([]).level == "unknown"
    assert classify_noise([-1.0, -2.0, -3.0, -4.0]).level == "unknown"
    with_nan = classify_noise([95, 97, math.nan, 100, 103, 105])
    assert with_nan.n == 5 and with_nan.level == "ok" and any("non-finite" in n for n in with_nan.notes)
    # custom thresholds
    assert classify_noise([95, 97, 100, 103, 105], noisy=0.05).level == "noisy"


def test_tukey_fences_by_hand():
    # sorted: -25, 1..12, 30, 60 -> Q1 = 3.5, Q3 = 10.5, IQR = 7
    x = [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 30, 60, -25]
    out = classify_outliers(x)
    assert out.fences == (3.5 - 21, 3.5 - 10.5, 10.5 + 10.5, 10.5 + 21)
    assert (out.low_severe, out.low_mild, out.high_mild, out.high_severe) == (1, 0, 1, 1)
    assert (
        out.labels[12] == "high mild" and out.labels[13] == "high severe" and out.labels[14] == "low severe"
    )
    assert out.labels[:12] == ("",) * 12
    assert out.mild == 1 and out.severe == 2 and out.total == 3 and out.n == 15


def test_outliers_need_four_samples_and_ignore_nan():
    assert classify_outliers([1.0, 100.0, 1.0]).total == 0
    out = classify_outliers([1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, math.nan, 60])
    assert out.n == 13 and out.labels[12] == "" and out.high_severe == 1
