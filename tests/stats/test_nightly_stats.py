"""The nightly comparison (``microscope.stats.nightly``) on simulated run-level values: a planted 5% is
flagged, an unchanged night is not, machine load that slows every variant alike is cancelled by the
latency relative to the baseline, a night too noisy to rule out 10% says so, Holm acts across the
family, and a second sample confirms only what it shows too."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from microscope.stats.nightly import (
    KEY,
    RELATIVE,
    compare_nights,
    confirmed_keys,
    missing_keys,
    relative_latency,
    worse_if_up,
)
from microscope.store.run_summary import MEASUREMENT_COLUMNS

CASE = "n=4096"


def _runs(n: int, *, cand_ms: float = 1.0, base_ms: float = 2.0, sd: float = 0.01, load_sd: float = 0.0,
          err: float = 1e-6, peak: float = 4096.0, seed: int = 0, tag: str = "r") -> pd.DataFrame:
    """``n`` runs: a baseline and a candidate latency (noise ``sd``; a per-run load factor ``load_sd``
    shared by both), the candidate's error and peak memory."""
    rng = np.random.default_rng(seed)
    rows = []
    for i in range(n):
        load = float(np.exp(rng.normal(0, load_sd)))
        for variant, role, ms in (("ref", "baseline", base_ms), ("kernel", "candidate", cand_ms)):
            value = ms * load * float(np.exp(rng.normal(0, sd)))
            rows.append({"plugin": "p", "variant": variant, "role": role, "case_id": CASE, "dimension": "throughput",
                         "metric": "latency_ms", "unit": "ms", "value": value, "status": "ok", "run_key": f"{tag}{i}"})
        rows.append({"plugin": "p", "variant": "kernel", "role": "candidate", "case_id": CASE, "dimension": "accuracy",
                     "metric": "out.rel_err", "unit": "", "value": err, "status": "ok", "run_key": f"{tag}{i}"})
        rows.append({"plugin": "p", "variant": "kernel", "role": "candidate", "case_id": CASE, "dimension": "memory",
                     "metric": "peak_bytes", "unit": "bytes", "value": peak, "status": "ok", "run_key": f"{tag}{i}"})
    frame = pd.DataFrame(rows)
    for col in MEASUREMENT_COLUMNS:
        if col not in frame:
            frame[col] = None
    return frame


def _row(table: pd.DataFrame, metric: str) -> pd.Series:
    return table[table["metric"] == metric].iloc[0]


def test_a_planted_five_percent_is_flagged_and_an_unchanged_night_is_not():
    base = _runs(6, seed=1, tag="a")
    slow = compare_nights(base, _runs(3, cand_ms=1.05, seed=2, tag="b"))
    row = _row(slow, "latency_ms")
    assert row["verdict"] == "regressed" and row["flagged"] and 1.03 < row["effect"] < 1.07
    assert row["ci_low"] > 1 + row["tau"] and row["p_holm"] < 0.05
    assert _row(slow, RELATIVE)["flagged"]
    assert set(slow.loc[~slow["flagged"], "metric"]) == {"out.rel_err", "peak_bytes"}
    same = compare_nights(base, _runs(3, seed=3, tag="c"))
    assert not same["flagged"].any() and not same["noisy"].any()
    assert set(same["verdict"]) <= {"no change", "inconclusive", "identical"}


def test_a_faster_kernel_and_a_lower_error_are_improvements_not_regressions():
    table = compare_nights(_runs(6, seed=1, tag="a"), _runs(3, cand_ms=0.9, err=5e-7, seed=4, tag="b"))
    assert set(table["verdict"]) == {"improved", "identical"} and not table["flagged"].any()
    assert _row(table, "out.rel_err")["verdict"] == "improved"


def test_more_memory_and_a_larger_error_regress():
    table = compare_nights(_runs(4, seed=1, tag="a"), _runs(3, err=2e-6, peak=8192.0, seed=5, tag="b"))
    assert _row(table, "peak_bytes")["verdict"] == "regressed" and _row(table, "out.rel_err")["flagged"]
    assert worse_if_up("memory", "peak_bytes") and worse_if_up("accuracy", "val_loss")
    assert not worse_if_up("accuracy", "val_token_acc") and not worse_if_up("throughput", "train_tokens_per_s")


def test_relative_latency_cancels_load_that_slows_both_variants():
    # +-15% load per run swamps the absolute latency, but the kernel/ref ratio still shows the 5%
    base = _runs(8, sd=0.005, load_sd=0.15, seed=6, tag="a")
    now = _runs(3, cand_ms=1.05, sd=0.005, load_sd=0.15, seed=7, tag="b")
    ratios = relative_latency(now)
    assert np.allclose(ratios.loc[ratios["metric"] == RELATIVE, "value"], 1.05 / 2.0, rtol=0.03)
    table = compare_nights(base, now)
    assert _row(table, RELATIVE)["flagged"] and not _row(table, "latency_ms")["flagged"]


def test_a_night_that_cannot_rule_out_ten_percent_is_noisy():
    table = compare_nights(_runs(3, sd=0.25, seed=8, tag="a"), _runs(3, sd=0.25, seed=9, tag="b"))
    timing = table[table["dimension"] == "throughput"]
    assert timing["noisy"].all() and not table["flagged"].any()
    assert "cannot rule out a regression of 10%" in _row(table, "latency_ms")["notes"]
    # with a precise relative latency the night still vouches for the kernel: neither row stays noisy
    loud = compare_nights(_runs(6, sd=0.003, load_sd=0.3, seed=10, tag="a"),
                          _runs(3, sd=0.003, load_sd=0.3, seed=11, tag="b"))
    assert not loud["noisy"].any()


def test_holm_turns_a_marginal_row_inconclusive_in_a_large_family():
    base = _runs(3, sd=0.01, seed=12, tag="a")
    now = _runs(3, cand_ms=1.035, sd=0.01, seed=13, tag="b")
    alone = compare_nights(base, now)
    many = pd.concat([base] + [base.assign(case_id=f"n={i}") for i in range(30)], ignore_index=True)
    many_now = pd.concat([now] + [_runs(3, sd=0.01, seed=100 + i, tag="b").assign(case_id=f"n={i}")
                                  for i in range(30)], ignore_index=True)
    family = compare_nights(many, many_now)
    row, crowded = _row(alone, "latency_ms"), family[(family["case_id"] == CASE) & (family["metric"] == "latency_ms")]
    assert row["verdict"] == "regressed" and row["p_holm"] < 0.05  # 4 tests: Holm multiplies p by at most 4
    assert crowded.iloc[0]["p"] == row["p"] and crowded.iloc[0]["verdict"] == "inconclusive"
    assert "tests: inconclusive" in crowded.iloc[0]["notes"] and crowded.iloc[0]["p_holm"] >= 0.05


def test_failed_and_new_measurements_are_not_tested():
    now = _runs(3, seed=14, tag="b")
    now.loc[now["metric"] == "peak_bytes", ["status", "value"]] = ["failed", np.nan]
    extra = now[now["metric"] == "out.rel_err"].assign(metric="grad.rel_err")
    table = compare_nights(_runs(3, seed=15, tag="a"), pd.concat([now, extra], ignore_index=True))
    assert _row(table, "peak_bytes")["verdict"] == "failed" and _row(table, "grad.rel_err")["verdict"] == "new"
    assert table.loc[table["verdict"].isin(["failed", "new"]), "p"].isna().all()


def test_a_second_sample_confirms_only_what_it_shows_too():
    base = _runs(6, seed=16, tag="a")
    first = compare_nights(base, _runs(3, cand_ms=1.06, seed=17, tag="b"))
    flagged = first[first["flagged"]]
    keys = {tuple(k) for k in flagged[list(KEY)].itertuples(index=False)}
    agree, table = confirmed_keys(flagged, base, _runs(3, cand_ms=1.06, seed=18, tag="c"))
    assert agree == keys and len(table) == len(keys)
    disagree, _ = confirmed_keys(flagged, base, _runs(3, seed=19, tag="d"))
    assert disagree == set()


def test_a_stored_paired_ratio_is_used_and_only_missing_runs_get_the_ratio_of_medians():
    runs = _runs(2, seed=20, tag="s")
    paired = runs[(runs["run_key"] == "s0") & (runs["variant"] == "kernel") & (runs["metric"] == "latency_ms")]
    stored = pd.concat([runs, paired.assign(metric=RELATIVE, unit="ratio", value=0.5123)], ignore_index=True)
    rel = relative_latency(stored)
    rel = rel[rel["metric"] == RELATIVE].set_index("run_key")["value"]
    assert len(rel) == 2 and rel["s0"] == 0.5123  # the stored (per-round) ratio, not derived again
    assert rel["s1"] == pytest.approx(1.0 / 2.0, rel=0.05)  # an older run: latency over the baseline's


def test_measurements_the_baseline_holds_but_tonight_lacks_are_named():
    base = _runs(2, seed=21, tag="a")
    now = _runs(2, seed=22, tag="b")
    now = now[now["metric"] != "peak_bytes"]
    other = base.assign(plugin="q")  # another plugin tonight did not run: not missing, just not tonight's
    missing = missing_keys(pd.concat([base, other], ignore_index=True), now)
    assert missing == [("p", "kernel", CASE, "memory", "peak_bytes")]
    assert missing_keys(base, _runs(2, seed=23, tag="c")) == [] and missing_keys(base, now.iloc[:0]) == []
