"""The comparison table on small hand-made record frames, including failed and skipped records."""

import math
import sys
from dataclasses import asdict

import numpy as np
import pandas as pd
import pytest

from microscope.stats import TABLE_COLUMNS, compare_records, save_table
from microscope.store.records import Record

CASE = "rows=7,fp32"
N_BOOT = 1000


def record(**kw):
    fields = {"run_id": "run", "plugin": "softmax", "case": {}, "seed": 0, "case_id": CASE}
    fields.update(kw)
    return asdict(Record(**fields))


def latency_rounds(rng, ratio, n=24, cv=0.02):
    drift = 1.0 + 0.05 * np.sin(np.arange(n) / 3.0)
    return list(ratio * drift * np.exp(rng.normal(0.0, cv, n)))


def run_records():
    rng = np.random.default_rng(0)
    lat = {"dimension": "throughput", "metric": "latency_ms"}
    recs = [
        record(
            variant="ref",
            role="baseline",
            value=1.0,
            details={"rounds": latency_rounds(rng, 1.0), "reps": 10},
            **lat,
        ),
        record(
            variant="triton",
            role="candidate",
            value=0.7,
            details={"rounds": latency_rounds(rng, 0.7), "reps": 10},
            **lat,
        ),
        record(
            variant="sdpa",
            role="peer",
            value=1.0,
            details={"rounds": latency_rounds(rng, 1.0), "reps": 10},
            **lat,
        ),
        record(
            variant="broken",
            role="candidate",
            value=None,
            status="failed",
            reason="CUDA error: out of memory",
            **lat,
        ),
        record(variant="cuda_only", role="peer", value=None, status="skipped", reason="needs cuda", **lat),
        record(variant="ref", role="baseline", dimension="throughput", metric="tflops", value=1.0),
        record(variant="triton", role="candidate", dimension="throughput", metric="tflops", value=1.4),
        record(variant="ref", role="baseline", dimension="memory", metric="peak_bytes", value=4096),
        record(variant="triton", role="candidate", dimension="memory", metric="peak_bytes", value=2048),
        record(variant="sdpa", role="peer", dimension="memory", metric="peak_bytes", value=4096),
        record(
            variant="ref", role="baseline", dimension="accuracy", metric="rel_err", value=1e-7, passed=True
        ),
        record(
            variant="triton",
            role="candidate",
            dimension="accuracy",
            metric="rel_err",
            value=2e-7,
            passed=True,
        ),
        record(
            variant="sdpa",
            role="peer",
            dimension="accuracy",
            metric="rel_err",
            value=1e-3,
            passed=False,
            details={"reasons": ["norm error 1e-3 > 4 x baseline"]},
        ),
    ]
    tokens = rng.lognormal(0.5, 1.0, 3000)
    shifted = tokens + 0.05 + rng.normal(0.0, 0.01, 3000)
    acc = {"case_id": "model", "dimension": "accuracy", "metric": "eval_loss"}
    recs += [
        record(
            variant="ref",
            role="baseline",
            value=float(tokens.mean()),
            details={"per_token": list(tokens), "margin": 0.01},
            **acc,
        ),
        record(
            variant="triton",
            role="candidate",
            value=float(shifted.mean()),
            details={"per_token": list(shifted), "margin": 0.01},
            **acc,
        ),
    ]
    for s in range(6):
        st = {"case_id": "model", "dimension": "stability", "metric": "loss_spikes", "seed": s}
        recs.append(record(variant="ref", role="baseline", value=[0, 1, 0, 1, 0, 0][s], **st))
        recs.append(record(variant="triton", role="candidate", value=[4, 5, 3, 6, 4, 5][s], **st))
    return recs


@pytest.fixture(scope="module")
def table():
    return compare_records(pd.json_normalize(run_records(), max_level=1), n_boot=N_BOOT)


def row(df, metric, candidate, case_id=CASE):
    sel = df[(df.metric == metric) & (df.candidate == candidate) & (df.case_id == case_id)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_columns_and_rows(table):
    assert tuple(table.columns) == TABLE_COLUMNS
    assert len(table) == 11  # every non-baseline (variant, metric) once
    assert set(table.baseline) == {"ref"}
    assert "ref" not in set(table.candidate)


def test_latency_rows(table):
    fast = row(table, "latency_ms", "triton")
    assert fast.verdict == "faster" and fast.role == "candidate"
    assert fast.ci_low <= 0.7 <= fast.ci_high
    assert fast.ratio_or_delta == pytest.approx(0.7, rel=0.03)
    assert fast.baseline_value == pytest.approx(1.0, rel=0.05) and fast.n == 24
    assert fast.p_adj >= fast.p
    # sdpa fails accuracy in this case, so its speed is not a result
    peer = row(table, "latency_ms", "sdpa")
    assert peer.verdict == "not judged" and peer.role == "peer" and "fails accuracy" in peer.notes
    assert math.isnan(peer.p_adj)


def test_failed_and_skipped_records_become_rows_with_their_reason(table):
    failed = row(table, "latency_ms", "broken")
    assert failed.verdict == "failed" and "out of memory" in failed.notes
    assert math.isnan(failed.ratio_or_delta) and math.isnan(failed.p) and pd.isna(failed.n)
    skipped = row(table, "latency_ms", "cuda_only")
    assert skipped.verdict == "skipped" and skipped.notes == "needs cuda"


def test_memory_numerics_and_rate_rows(table):
    mem = row(table, "peak_bytes", "triton")
    assert mem.verdict == "less" and mem.ratio_or_delta == 0.5 and math.isnan(mem.p)
    assert row(table, "peak_bytes", "sdpa").verdict == "not judged"
    ok = row(table, "rel_err", "triton")
    assert ok.verdict == "pass" and ok.ratio_or_delta == pytest.approx(2.0)
    bad = row(table, "rel_err", "sdpa")
    assert bad.verdict == "fail" and "norm error 1e-3" in bad.notes
    rate = row(table, "tflops", "triton")
    assert rate.verdict == "info" and rate.ratio_or_delta == pytest.approx(1.4) and math.isnan(rate.p)


def test_model_accuracy_and_stability_rows(table):
    acc = row(table, "eval_loss", "triton", case_id="model")
    assert acc.verdict == "worse"  # +0.05 nats, margin 0.01
    assert acc.ci_low <= 0.05 <= acc.ci_high and acc.n == 3000
    spikes = row(table, "loss_spikes", "triton", case_id="model")
    assert spikes.verdict == "worse" and spikes.ratio_or_delta == pytest.approx(27 / 6 - 2 / 6)
    assert spikes.n == 6


def test_adjusted_p_values_by_family(table):
    tested = table[table.p.notna() & (table.verdict != "not judged")]
    assert (tested.p_adj >= tested.p - 1e-15).all()
    assert table[table.p.isna() | (table.verdict == "not judged")].p_adj.isna().all()
    # gating (Holm): triton latency + triton eval_loss; exploratory (BH): sdpa latency + loss_spikes
    gating = table[
        (table.role == "candidate") & table.metric.isin(["latency_ms", "eval_loss"]) & table.p.notna()
    ]
    assert len(gating) == 2
    p = np.sort(gating.p.to_numpy())
    assert np.sort(gating.p_adj.to_numpy()) == pytest.approx([2 * p[0], max(2 * p[0], p[1])])


def seed_accuracy_records(n_candidates):
    """One candidate with a real-looking effect (paired t over 5 seeds, p ~ 0.005) and n - 1 with none."""
    base = [10.0, 10.2, 9.9, 10.1, 10.05]
    jitter = [0.1, -0.1, 0.1, -0.1, 0.0]
    recs = []
    for s in range(5):
        common = {"dimension": "accuracy", "metric": "eval_loss", "case_id": "model", "seed": s}
        recs.append(record(variant="ref", role="baseline", value=base[s], **common))
        recs.append(record(variant="cand0", role="candidate", value=base[s] - 0.25 + jitter[s], **common))
        for k in range(1, n_candidates):
            recs.append(
                record(variant=f"cand{k}", role="candidate", value=base[s] + jitter[(s + k) % 5], **common)
            )
    return recs


def test_holm_downgrades_a_verdict_that_does_not_survive_the_family():
    alone = compare_records(seed_accuracy_records(1))
    assert alone.verdict.tolist() == ["better"] and alone.p.iloc[0] < 0.01
    many = compare_records(seed_accuracy_records(20))
    first = many[many.candidate == "cand0"].iloc[0]
    assert first.p == pytest.approx(alone.p.iloc[0])
    assert first.p_adj == pytest.approx(min(1.0, 20 * first.p))
    assert first.verdict == "inconclusive" and "after Holm over 20 gating tests" in first.notes


def test_problem_records_never_crash_the_table():
    lat = {"dimension": "throughput", "metric": "latency_ms"}
    recs = [
        # baseline failed: its candidates cannot be compared
        record(variant="ref", role="baseline", value=None, status="failed", reason="compile error", **lat),
        record(variant="triton", role="candidate", value=0.5, details={"rounds": [0.5, 0.5, 0.5]}, **lat),
        # a candidate without a baseline for its metric
        record(variant="triton", role="candidate", dimension="memory", metric="peak_bytes", value=10),
        # a trial that crashed before it knew its metric
        record(
            variant="triton",
            role="candidate",
            dimension="throughput",
            metric="",
            value=None,
            status="failed",
            reason="timeout after 600 s",
        ),
        # malformed details
        record(variant="ref", role="baseline", case_id="b", details={"rounds": "oops"}, value=1.0, **lat),
        record(
            variant="triton", role="candidate", case_id="b", details={"rounds": [1.0, 2.0]}, value=1.0, **lat
        ),
        # a baseline skipped with no candidate measured at all
        record(
            variant="ref",
            role="baseline",
            case_id="c",
            value=None,
            status="skipped",
            reason="needs cuda",
            **lat,
        ),
    ]
    df = compare_records(pd.json_normalize(recs, max_level=1), n_boot=200)
    got = {(r.case_id, r.metric, r.candidate): (r.verdict, r.notes) for r in df.itertuples()}
    assert got[(CASE, "latency_ms", "triton")] == ("failed", "baseline failed: compile error")
    assert got[(CASE, "peak_bytes", "triton")][0] == "skipped"
    assert "no baseline record" in got[(CASE, "peak_bytes", "triton")][1]
    assert got[(CASE, "", "triton")] == ("failed", "timeout after 600 s")
    assert got[("b", "latency_ms", "triton")][0] == "error"
    assert got[("c", "latency_ms", "ref")] == ("skipped", "baseline skipped: needs cuda")


def test_a_numerics_check_stands_when_the_baseline_failed():
    """safe_softmax's naive baseline overflows at large logits by design; the candidate's own check
    against float64 still decides its row (it was reported as "failed" with the baseline's reason)."""
    acc = {"dimension": "accuracy", "metric": "out.rel_err"}
    recs = [
        record(variant="naive", role="baseline", value=None, status="failed", passed=False,
               reason="out has 12 NaN/Inf elements", **acc),
        record(variant="triton", role="candidate", value=0.002, passed=True, **acc),
        record(variant="bad", role="candidate", value=0.9, passed=False, details={"reasons": ["rel err 0.9"]}, **acc),
    ]
    df = compare_records(pd.json_normalize(recs, max_level=1), n_boot=100)
    got = {r.candidate: r for r in df.itertuples()}
    assert got["triton"].verdict == "pass" and got["bad"].verdict == "fail"
    assert "baseline failed: out has 12 NaN/Inf elements" in got["triton"].notes
    assert np.isnan(got["triton"].ratio_or_delta) and got["triton"].candidate_value == 0.002


def test_deterministic_and_accepts_unnormalized_records():
    recs = run_records()
    a = compare_records(pd.json_normalize(recs, max_level=1), n_boot=300, seed=5)
    b = compare_records(pd.json_normalize(recs, max_level=1), n_boot=300, seed=5)
    pd.testing.assert_frame_equal(a, b)
    c = compare_records(pd.DataFrame(recs), n_boot=300, seed=5)  # a plain "details" dict column
    pd.testing.assert_frame_equal(a, c)
    d = compare_records(recs, n_boot=300, seed=5)  # a list of record dicts
    pd.testing.assert_frame_equal(a, d)


def test_empty_frame():
    df = compare_records(pd.DataFrame())
    assert df.empty and tuple(df.columns) == TABLE_COLUMNS


def test_save_table_round_trips(tmp_path, table):
    """Parquet where pyarrow is installed (the ``parquet`` extra), JSON otherwise; CSV always."""
    paths = save_table(table, tmp_path / "out")
    try:
        import pyarrow  # noqa: F401

        assert [p.name for p in paths] == ["comparison.csv", "comparison.parquet"]
        back = pd.read_parquet(paths[1])
    except ImportError:
        assert [p.name for p in paths] == ["comparison.csv", "comparison.json"]
        back = pd.read_json(paths[1], orient="records")
        back = back.reindex(columns=list(TABLE_COLUMNS))
    pd.testing.assert_frame_equal(back, table, check_dtype=False)
    csv = pd.read_csv(paths[0])
    assert list(csv.columns) == list(TABLE_COLUMNS) and len(csv) == len(table)


def test_save_table_falls_back_to_json_without_pyarrow(tmp_path, table, monkeypatch):
    monkeypatch.setitem(sys.modules, "pyarrow", None)  # makes `import pyarrow` raise ImportError
    paths = save_table(table, tmp_path)
    assert [p.name for p in paths] == ["comparison.csv", "comparison.json"]
    back = pd.read_json(paths[1], orient="records")
    assert list(back.columns) == list(TABLE_COLUMNS) and back.verdict.tolist() == table.verdict.tolist()


def test_a_candidate_cut_short_is_compared_on_the_seeds_both_arms_completed():
    """The baseline finished 3 seeds, the candidate 1 (its run was killed): comparing the baseline's mean
    over 3 seeds with the candidate's one seed would report seed-to-seed spread as the effect."""
    recs = []
    for s, level in enumerate([2.0, 2.5, 3.0]):
        tokens = list(level + np.linspace(-0.1, 0.1, 50))
        common = {"dimension": "accuracy", "metric": "decode_loss", "case_id": "model", "seed": s}
        recs.append(record(variant="ref", role="baseline", value=float(np.mean(tokens)),
                           details={"per_token": tokens}, **common))
        if s == 2:
            recs.append(record(variant="cut", role="candidate", value=float(np.mean(tokens)),
                               details={"per_token": tokens}, **common))
    row = compare_records(recs).iloc[0]
    assert row.ratio_or_delta == 0 and row.baseline_value == pytest.approx(3.0)
    assert "compared on the 1 seed(s) both completed (baseline 3, cut 1)" in row.notes


def test_best_peer_row_uses_the_fastest_correct_peer():
    """A wrong peer is never the yardstick; the fastest correct one is, on the same rounds."""
    rng = np.random.default_rng(3)
    lat = {"dimension": "throughput", "metric": "latency_ms"}
    acc = {"dimension": "accuracy", "metric": "rel_err"}
    recs = []
    for variant, role, ratio, ok in (("ref", "baseline", 1.0, True), ("triton", "candidate", 0.8, True),
                                     ("cudnn", "peer", 0.6, True), ("cheat", "peer", 0.1, False),
                                     ("math", "peer", 1.2, True)):
        recs.append(record(variant=variant, role=role, value=ratio,
                           details={"rounds": latency_rounds(rng, ratio), "reps": 10}, **lat))
        recs.append(record(variant=variant, role=role, value=1e-7 if ok else 0.5, passed=ok, **acc))
    table = compare_records(pd.json_normalize(recs, max_level=1), n_boot=N_BOOT)
    best = table[(table.vs == "best_peer") & (table.metric == "latency_ms")]
    assert len(best) == 1
    best = best.iloc[0]
    assert best.candidate == "triton" and best.baseline == "cudnn"
    assert best.verdict == "slower" and best.ratio_or_delta == pytest.approx(0.8 / 0.6, rel=0.05)
    assert "fastest correct peer" in best.notes and not best.gated
    cheat = row(table, "latency_ms", "cheat")
    assert cheat.verdict == "not judged"


def _model_records(arms, seeds=4, tokens=400, shares=()):
    """Per-token losses per (arm, seed): each arm's mean shift over the baseline's and per-seed training
    noise; ``shares`` arms carry the baseline's weights (inference-only) and no training noise."""
    rng = np.random.default_rng(11)
    recs = []
    for s in range(seeds):
        base = rng.gamma(2.0, 1.5, tokens)
        for variant, role, shift in arms:
            noise = 0.0 if variant in shares or role == "baseline" else rng.normal(0.0, 0.01)
            per_token = base + shift + noise + rng.normal(0.0, 0.05, tokens)
            details = {"per_token": per_token.tolist()}
            if variant in shares:
                details["shares_baseline_weights"] = True
            common = {"case_id": "model", "seed": s, "variant": variant, "role": role}
            recs.append(record(dimension="accuracy", metric="val_loss", value=float(per_token.mean()),
                               details=details, **common))
            recs.append(record(dimension="accuracy", metric="greedy_agreement", value=1.0 - shift,
                               details={"relative_to_baseline": True}, **common))
    return recs


def test_a_contrast_compares_two_candidates_and_leaves_the_baseline_rows_as_they_were():
    arms = (("full", "baseline", 0.0), ("window", "candidate", 0.0), ("last_full", "candidate", 0.06))
    recs = _model_records(arms)
    plain = compare_records(recs, n_boot=N_BOOT)
    table = compare_records(recs, n_boot=N_BOOT, contrasts=[("last_full", "window")])
    pd.testing.assert_frame_equal(table[table.vs == "baseline"].reset_index(drop=True), plain)
    contrast = table[table.vs == "contrast"]
    assert contrast.metric.tolist() == ["val_loss"]  # greedy agreement is measured against the baseline only
    row = contrast.iloc[0]
    assert (row.candidate, row.baseline, row.role) == ("last_full", "window", "candidate")
    assert row.verdict == "worse" and row.ratio_or_delta == pytest.approx(0.06, abs=0.02)
    assert row.ci_low > 0 and not row.gated
    assert "the training run is the unit" in row.notes and "contrast: last_full vs window" in row.notes


def test_a_contrast_of_two_equal_candidates_is_not_significant():
    arms = (("full", "baseline", 0.0), ("a", "candidate", 0.05), ("b", "candidate", 0.05))
    row = compare_records(_model_records(arms), n_boot=N_BOOT, contrasts=[("a", "b")]).query("vs == 'contrast'")
    assert row.verdict.iloc[0] in ("inconclusive", "equivalent")
    assert row.ci_low.iloc[0] < 0 < row.ci_high.iloc[0]


def test_a_contrast_pools_tokens_only_when_both_arms_evaluate_the_baselines_weights():
    arms = (("full", "baseline", 0.0), ("int8", "candidate", 0.01), ("int4", "candidate", 0.03),
            ("qat", "candidate", 0.02))
    table = compare_records(_model_records(arms, shares=("int8", "int4")), n_boot=N_BOOT,
                            contrasts=[("int4", "int8"), ("qat", "int8")])
    shared = table[(table.vs == "contrast") & (table.candidate == "int4")].iloc[0]
    assert "the training run is the unit" not in shared.notes and shared.n > 1000  # tokens, pooled over seeds
    assert shared.verdict == "worse"
    mixed = table[(table.vs == "contrast") & (table.candidate == "qat")].iloc[0]
    assert "the training run is the unit" in mixed.notes and mixed.n == 4  # a trained arm: seeds are the unit


def test_a_speed_contrast_uses_the_same_rounds_and_is_not_judged_against_a_wrong_reference():
    rng = np.random.default_rng(5)
    lat = {"dimension": "throughput", "metric": "latency_ms"}
    acc = {"dimension": "accuracy", "metric": "rel_err"}
    recs = []
    for variant, role, ratio, ok in (("ref", "baseline", 1.0, True), ("v2", "candidate", 0.8, True),
                                     ("v1", "candidate", 0.6, True), ("bad", "candidate", 0.5, False)):
        recs.append(record(variant=variant, role=role, value=ratio,
                           details={"rounds": latency_rounds(rng, ratio), "reps": 10}, **lat))
        recs.append(record(variant=variant, role=role, value=1e-7 if ok else 0.5, passed=ok, **acc))
    table = compare_records(recs, n_boot=N_BOOT, contrasts=[("v2", "v1"), ("v1", "bad")])
    assert not ((table.vs == "contrast") & (table.dimension == "accuracy")).any()  # pass/fail: each on its own
    speed = table[(table.vs == "contrast") & (table.metric == "latency_ms")].set_index("candidate")
    assert speed.loc["v2", "verdict"] == "slower"
    assert speed.loc["v2", "ratio_or_delta"] == pytest.approx(0.8 / 0.6, rel=0.05)
    assert speed.loc["v1", "verdict"] == "not judged" and "its reference bad fails accuracy" in speed.loc["v1", "notes"]


def test_a_contrast_naming_a_variant_the_run_lacks_adds_no_rows():
    arms = (("full", "baseline", 0.0), ("window", "candidate", 0.0))
    table = compare_records(_model_records(arms), n_boot=N_BOOT, contrasts=[("last_full", "window")])
    assert not (table.vs == "contrast").any()


def test_a_worse_contrast_does_not_fail_the_gate():
    """Contrasts answer a question about two candidates; the exit code stays about the baseline."""
    from microscope.gate import EXIT_OK, evaluate

    arms = (("full", "baseline", 0.0), ("window", "candidate", 0.0), ("last_full", "candidate", 0.06))
    table = compare_records(_model_records(arms), n_boot=N_BOOT, contrasts=[("last_full", "window")])
    # last_full's own rows against the baseline would fail the gate; keep window's and the contrast
    seen = table[(table.candidate == "window") | (table.vs == "contrast")]
    assert seen[seen.vs == "contrast"].verdict.tolist() == ["worse"]
    assert evaluate(seen, pd.DataFrame([{"variant": "window", "status": "ok"}])).exit_code == EXIT_OK
