"""Sequential rounds: where the looks fall, when they stop, and how the table judges a stopped case."""

import time
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from microscope.config import ThroughputConfig
from microscope.measures import throughput
from microscope.stats import compare_records
from microscope.stats.latency import compare_latency
from microscope.stats.sequential_rounds import RoundLooks, first_decisive_round
from microscope.store.records import Record


def test_looks_start_at_min_rounds_step_by_look_every_and_end_at_the_budget():
    looks = RoundLooks(min_rounds=8, rounds=20, look_every=4, alpha=0.05)
    assert looks.points == (8, 12, 16, 20)
    assert looks.alpha_per_look == pytest.approx(0.05 / 4)
    assert RoundLooks(8, 8, 4).points == (8,)
    # 7 looks test at 0.05/7, which 8 paired rounds cannot reach (2/2**8 > 0.0071): the first look moves to 9
    later = RoundLooks(min_rounds=8, rounds=30, look_every=4, alpha=0.05)
    assert later.points == (9, 13, 17, 21, 25, 29, 30)
    assert first_decisive_round(later.alpha_per_look) <= later.points[0]
    with pytest.raises(ValueError):
        RoundLooks(min_rounds=12, rounds=10, look_every=2)


def test_a_run_of_many_cases_decides_each_look_at_its_share_of_the_holm_family():
    """8 cases: Holm multiplies the smallest p by 8, so a look stops only below alpha / (looks * 8), and
    the first look waits for the round where Wilcoxon can reach it (10 rounds for 2 looks, not 8)."""
    looks = RoundLooks(min_rounds=8, rounds=12, look_every=4, alpha=0.05, family=8)
    assert looks.points == (10, 12) and looks.stop_level == pytest.approx(0.05 / 16)
    assert looks.alpha_per_look == pytest.approx(0.025)  # what the table judges a record at, before Holm
    rng = np.random.default_rng(2)
    clear = {"base": rounds(rng, 1.0, 8), "cand": rounds(rng, 4.0, 8)}
    assert RoundLooks(8, 12, 4).decided(clear, "base", ["cand"])  # p = 2/256 < 0.025
    assert not looks.decided(clear, "base", ["cand"])  # 2/256 x 16 > 0.05: Holm would undo the call
    more = {"base": rounds(rng, 1.0, 10), "cand": rounds(rng, 4.0, 10)}
    assert looks.decided(more, "base", ["cand"])
    with pytest.raises(ValueError):
        RoundLooks(8, 12, 4, family=0)


def test_first_decisive_round_is_where_wilcoxon_can_first_reach_the_level():
    for level in (0.05, 0.0125, 0.001):
        n = first_decisive_round(level)
        assert 2 / 2**n < level <= 2 / 2 ** (n - 1)


def rounds(rng, scale, n, cv=0.02):
    return list(scale * np.exp(rng.normal(0.0, cv, n)))


def test_a_clear_difference_is_decided_and_a_noisy_small_one_is_not():
    rng = np.random.default_rng(1)
    looks = RoundLooks(min_rounds=8, rounds=20, look_every=4, alpha=0.05)
    clear = {"base": rounds(rng, 1.0, 8), "cand": rounds(rng, 2.0, 8), "peer": rounds(rng, 1.5, 8)}
    assert looks.decided(clear, "base", ["cand"], ["peer"])
    # decided against the baseline, but not against a peer of the same speed under 20% noise
    close = dict(clear, peer=rounds(rng, 2.0, 8, cv=0.2))
    assert not looks.decided(close, "base", ["cand"], ["peer"])
    assert not looks.decided({"cand": clear["cand"]}, "base", ["cand"])  # no baseline: run the budget
    # a candidate that dropped out (an error) is not waited for
    assert looks.decided({"base": clear["base"], "peer": clear["peer"]}, "base", ["cand"], ["peer"])


def test_identical_variants_rarely_stop_on_a_false_difference():
    """The error rate the looks promise: under no difference, a false call at any look stays near or
    below alpha (Bonferroni over the looks is conservative)."""
    rng = np.random.default_rng(7)
    looks = RoundLooks(min_rounds=8, rounds=20, look_every=4, alpha=0.05)
    false_calls = 0
    for _ in range(40):
        base, cand = rounds(rng, 1.0, 20, cv=0.05), rounds(rng, 1.0, 20, cv=0.05)
        for n in looks.points:
            verdict = compare_latency(base[:n], cand[:n], alpha=looks.alpha_per_look, seed=0).verdict
            if verdict in ("faster", "slower"):
                false_calls += 1
                break
            if verdict == "equivalent":
                break
    assert false_calls <= 4  # alpha = 5% of 40 is 2; 4 allows for the simulation's own spread


def test_interleaved_stops_at_the_first_look_that_decides_and_checks_that_round():
    def fast():
        time.sleep(0.002)

    def slow():
        time.sleep(0.006)

    looks = RoundLooks(min_rounds=8, rounds=40, look_every=4)
    rotation = throughput.Rotation(n_sets=1, check=lambda name, k, out: None, check_rounds=1)
    cfg = ThroughputConfig(warmup=1, rounds=40, reps=1, min_rounds=8)
    res = throughput.interleaved(
        {"base": slow, "cand": fast}, cfg, "cpu", rotation=rotation, looks=looks.points,
        stop=lambda r: looks.decided({n: t.rounds for n, t in r.items()}, "base", ["cand"]))
    assert len(res["base"].rounds) == len(res["cand"].rounds) < 40
    assert len(res["cand"].rounds) in looks.points
    stopped = len(res["cand"].rounds) - 1
    assert stopped in {r for r, _, _ in res["cand"].checks}  # the last round run had its answer checked


def record(variant, role, rounds, looks):
    details = {"rounds": rounds, "reps": 1}
    if looks > 1:
        details["sequential"] = {"looks": looks, "alpha_per_look": 0.05 / looks, "max_rounds": 40,
                                 "rounds_run": len(rounds), "stopped_early": True}
    return asdict(Record(run_id="r", plugin="p", case={}, seed=0, case_id="c", variant=variant, role=role,
                         dimension="throughput", metric="latency_ms", value=float(np.median(rounds)),
                         details=details))


def test_the_table_judges_a_sequential_case_at_its_per_look_level():
    """Eight paired rounds, the candidate faster in all: Wilcoxon p = 2/256. Fixed rounds: "faster";
    the same rounds from a run with 8 looks are judged at alpha/8 and reported with p x 8."""
    rng = np.random.default_rng(3)
    base = rounds(rng, 1.0, 8, cv=0.01)
    cand = [b * 0.8 for b in base]

    def latency_row(looks):
        frame = pd.json_normalize([record("ref", "baseline", base, looks), record("new", "candidate", cand, looks)],
                                  max_level=1)
        table = compare_records(frame, n_boot=1000)
        return table[table["metric"] == "latency_ms"].iloc[0]

    fixed, sequential = latency_row(1), latency_row(8)
    assert fixed["verdict"] == "faster"
    assert sequential["verdict"] == "inconclusive"
    assert sequential["p"] == pytest.approx(min(1.0, fixed["p"] * 8))
    assert "8 looks" in sequential["notes"]
