"""``compare``: side B against side A with the run as the unit and the between-run noise as the yardstick."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from report_fixtures import ENV_GPU, Spec, make_run

from microscope.report.compare import CompareError, adjust, compare_gate, compare_runs, holm
from microscope.report.headline import from_comparison
from microscope.report.publish import compare_command

COMMIT_B = "fedcba9876543210fedcba9876543210fedcba98"


def _side(root: Path, runs: int, speedup: float, first_seed: int, **spec: object) -> Path:
    """A folder of ``runs`` repeats of one config (different noise each, as separate processes give)."""
    for k in range(runs):
        make_run(root, Spec(run_id=f"run{k}", speedup=speedup, seed=first_seed + k, **spec))  # type: ignore[arg-type]
    return root


def _row(table: pd.DataFrame, variant: str, case: str, metric: str) -> pd.Series:
    sel = table[(table["candidate"] == f"{variant} (B)") & (table["case_id"] == case) & (table["metric"] == metric)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_one_run_per_side_cannot_call_a_latency_difference(tmp_path: Path) -> None:
    """Two single runs are two samples of the between-run noise: even a 2.5x -> 3.5x change is
    inconclusive, with the reason and the fix, because nothing says how much runs vary."""
    a = make_run(tmp_path / "a", Spec(run_id="main-run", speedup=2.5, seed=1))
    b = make_run(tmp_path / "b", Spec(run_id="branch-run", speedup=3.5, seed=2, env=dict(ENV_GPU, commit=COMMIT_B)))
    table = compare_runs(a, b).comparison
    fast = _row(table, "triton", "seq=512,bf16", "latency_ms")
    assert fast["baseline"] == "triton (A)" and fast["verdict"] == "inconclusive"
    assert fast["ratio_or_delta"] == pytest.approx(2.5 / 3.5, rel=0.05)
    assert "one run per side" in fast["notes"] and "--repeat" in fast["notes"]
    assert not set(table["metric"]) & {"tflops", "gbps"}  # derived from latency: not repeated
    assert _row(table, "triton", "seq=2048,bf16", "latency_ms")["verdict"] == "failed"
    assert _row(table, "sdpa", "seq=512,bf16", "latency_ms")["verdict"] == "skipped"


def test_a_run_compared_with_itself_is_identical_not_inconclusive(tmp_path: Path) -> None:
    """The same numbers on both sides leave nothing to test: every measured latency is "identical" (memory
    "same"), where one run per side otherwise has no noise estimate and stays inconclusive."""
    a = make_run(tmp_path / "a", Spec(run_id="main-run", speedup=2.5, seed=1))
    table = compare_runs(a, a).comparison
    latency = table[(table["metric"] == "latency_ms") & ~table["verdict"].isin(["failed", "skipped", "not judged"])]
    assert len(latency) == 6 and set(latency["verdict"]) == {"identical"}
    assert set(latency["ratio_or_delta"]) == {1.0}
    assert "every run of both sides gave the same value" in latency.iloc[0]["notes"]
    assert _row(table, "triton", "seq=512,bf16", "peak_bytes")["verdict"] == "same"
    assert compare_gate(table).exit_code == 0
    texts = [h.text for h in from_comparison(table) if h.dimension == "throughput"]
    assert "eager (B) vs eager (A): identical latency in 4 cases" in texts, texts


def test_repeated_runs_find_a_planted_slowdown_and_not_an_aa_difference(tmp_path: Path) -> None:
    base = _side(tmp_path / "a", 5, speedup=2.5, first_seed=10)
    slower = _side(tmp_path / "b", 5, speedup=2.5 / 1.10, first_seed=20)  # triton 10% slower
    same = _side(tmp_path / "c", 5, speedup=2.5, first_seed=30)
    run = compare_runs(base, slower)
    row = _row(run.comparison, "triton", "seq=512,bf16", "latency_ms")
    assert row["verdict"] == "slower" and row["ratio_or_delta"] == pytest.approx(1.10, rel=0.02)
    assert row["ci_low"] > 1.0 and "5 vs 5 run(s)" in row["notes"] and "from the repeats" in row["notes"]
    assert _row(run.comparison, "eager", "seq=512,bf16", "latency_ms")["verdict"] != "slower"
    gate = compare_gate(run.comparison)
    assert gate.exit_code == 1 and any("triton (B) slower" in f for f in gate.failures)
    aa = compare_runs(base, same).comparison
    called = aa[aa["verdict"].isin(["faster", "slower", "less", "more", "better", "worse"])]
    assert called.empty, called[["candidate", "case_id", "metric", "verdict"]]
    assert compare_gate(aa).exit_code == 0


def test_the_latency_relative_to_the_baseline_finds_a_candidate_change_on_a_loaded_machine(tmp_path: Path) -> None:
    """Runs whose machine load differs by up to 2x hide a 10% slower candidate in its absolute latency; its
    latency over the baseline's in the same rounds cancels the load and calls it, and an A/A does not."""
    def loaded(root: Path, loads: list[float], speedup: float, first_seed: int) -> Path:
        for k, load in enumerate(loads):
            make_run(root, Spec(run_id=f"run{k}", speedup=speedup, seed=first_seed + k, load=load, rounds=40))
        return root

    base = loaded(tmp_path / "a", [1.0, 1.9, 0.9], 2.5, first_seed=10)
    slower = loaded(tmp_path / "b", [1.6, 1.0, 1.2], 2.5 / 1.10, first_seed=20)
    same = loaded(tmp_path / "c", [1.5, 0.95, 1.8], 2.5, first_seed=30)
    table = compare_runs(base, slower).comparison
    assert _row(table, "triton", "seq=512,bf16", "latency_ms")["verdict"] == "inconclusive"
    rel = _row(table, "triton", "seq=512,bf16", "latency_vs_baseline")
    assert rel["verdict"] == "slower" and rel["ratio_or_delta"] == pytest.approx(1.10, rel=0.02), rel["notes"]
    assert not (table["candidate"] == "eager (B)").loc[table["metric"] == "latency_vs_baseline"].any()
    gate = compare_gate(table)
    assert gate.exit_code == 1 and any("latency_vs_baseline" in f for f in gate.failures)
    aa = compare_runs(base, same).comparison
    assert not aa["verdict"].isin(["faster", "slower"]).any(), aa[["candidate", "metric", "verdict"]]


def test_one_run_per_side_takes_the_between_run_noise_from_the_history(tmp_path: Path) -> None:
    """With ``history``, a single run per side is judged against this machine's run-to-run noise there."""
    from microscope.store.history import History

    db = tmp_path / "h.sqlite"
    with History.open(db, create=True) as history:
        for k in range(6):
            history.add_run(make_run(tmp_path / "past", Spec(run_id=f"night{k}", seed=40 + k)), passed=True)
    a = make_run(tmp_path / "a", Spec(run_id="main-run", seed=1))
    b = make_run(tmp_path / "b", Spec(run_id="branch-run", speedup=2.5 / 1.3, seed=2))
    table = compare_runs(a, b, history=db).comparison
    row = _row(table, "triton", "seq=512,bf16", "latency_ms")
    assert row["verdict"] == "slower" and "between-run noise from the history" in row["notes"]
    alone = _row(compare_runs(a, b).comparison, "triton", "seq=512,bf16", "latency_ms")
    assert alone["verdict"] == "inconclusive" and "one run per side" in alone["notes"]
    empty = tmp_path / "empty.sqlite"
    History.open(empty, create=True).close()
    notes = compare_runs(a, b, history=empty).notes
    assert any("no between-run noise for these measurements on this machine" in n for n in notes)


def test_an_accuracy_check_that_passed_in_a_and_fails_in_b_is_a_regression(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", Spec(run_id="a", acc_fail=False))
    b = make_run(tmp_path / "b", Spec(run_id="b"))
    run = compare_runs(a, b)
    acc = _row(run.comparison, "triton", "seq=1024,bf16", "out.rel_err")
    assert acc["verdict"] == "fail" and "regression: passed in A" in acc["notes"]
    gate = compare_gate(run.comparison)
    assert gate.exit_code == 1 and "triton (B) fails out.rel_err in seq=1024,bf16 (passed in A)" in gate.failures
    assert compare_gate(compare_runs(b, a).comparison).exit_code == 0  # fixed in B: not a regression


def test_sides_of_different_plugins_cases_devices_or_corpora_are_refused(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", Spec(run_id="a"))
    for name, spec in (("plugin", Spec(run_id="p", plugin="safe_softmax")), ("case grids", Spec(run_id="c", cases=3)),
                       ("devices", Spec(run_id="d", gpu=False)),
                       ("corpora", Spec(run_id="k", env=dict(ENV_GPU, corpus_hash="deadbeefdeadbeef")))):
        b = make_run(tmp_path / name.replace(" ", "_"), spec)
        with pytest.raises(CompareError, match=f"refusing to compare: .*{name.split()[0]}.*--force"):
            compare_runs(a, b)
        forced = compare_runs(a, b, force=True)
        assert any("compared anyway (forced)" in n for n in forced.notes)


def test_different_versions_warn(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", Spec(run_id="a"))
    b = make_run(tmp_path / "b", Spec(run_id="b", env=dict(ENV_GPU, device_name="NVIDIA A100", torch="2.14.0")))
    notes = compare_runs(a, b).notes
    assert any("device_name differs: A NVIDIA H200, B NVIDIA A100" in n for n in notes)
    assert any("torch differs" in n for n in notes)


def test_compare_command_writes_md_html_and_csv(tmp_path: Path) -> None:
    a = _side(tmp_path / "main", 3, speedup=2.5, first_seed=1)
    b = _side(tmp_path / "branch", 3, speedup=3.5, first_seed=7)
    run, paths = compare_command(a, b, tmp_path / "reports", force=False)
    assert set(paths) == {"md", "html", "csv"}
    assert paths["md"].name == "main-vs-branch.md"
    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("### microscope compare: B = 3 runs (run0 ...) vs A = 3 runs (run0 ...)")
    assert "triton (B) faster than triton (A) in 2/3 correct cases" in md  # one case fails accuracy in B
    assert "triton (B)" in paths["html"].read_text(encoding="utf-8")
    assert run.comparison is not None and len(pd.read_csv(paths["csv"])) == len(run.comparison)


def test_holm_adjustment() -> None:
    adj = holm(pd.Series([0.01, float("nan"), 0.04, 0.03]))
    assert adj[0] == pytest.approx(0.03) and adj[3] == pytest.approx(0.06) and adj[2] == pytest.approx(0.06)
    assert pd.isna(adj[1])


def test_significance_that_does_not_survive_holm_is_inconclusive() -> None:
    table = pd.DataFrame({"verdict": ["faster", "faster", "slower", "pass"], "p": [0.001, 0.03, 0.04, float("nan")],
                          "notes": ["", "x", "", ""]})
    out = adjust(table, alpha=0.05)  # Holm: 0.003, 0.06, 0.06
    assert list(out["verdict"]) == ["faster", "inconclusive", "inconclusive", "pass"]
    assert "after Holm over 3 tests" in out.at[1, "notes"] and out.at[1, "notes"].startswith("x; ")


def test_peak_memory_the_same_in_every_run_is_judged_as_within_a_run(tmp_path: Path) -> None:
    """Peak memory is deterministic: runs that each measured the same peak are compared with the run's
    own 0.1% rule, so a 0.5% growth is "more" (and gates) where a between-run test would call it noise."""
    import json

    base = _side(tmp_path / "a", 2, speedup=2.5, first_seed=1)
    grown = _side(tmp_path / "b", 2, speedup=2.5, first_seed=3)
    for records in grown.glob("*/records.jsonl"):
        lines = [json.loads(line) for line in records.read_text().splitlines()]
        for rec in lines:
            if rec["metric"] == "peak_bytes" and rec["variant"] == "eager" and rec["value"] is not None:
                rec["value"] *= 1.005
        records.write_text("".join(json.dumps(rec) + "\n" for rec in lines))
    table = compare_runs(base, grown).comparison
    row = _row(table, "eager", "seq=512,bf16", "peak_bytes")
    assert row["verdict"] == "more" and row["ratio_or_delta"] == pytest.approx(1.005)
    assert "same in every run of each side" in row["notes"]
    assert _row(table, "triton", "seq=512,bf16", "peak_bytes")["verdict"] == "same"
    assert compare_gate(table).exit_code == 1
