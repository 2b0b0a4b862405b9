"""``compare_runs``: B against A (main vs a branch) with the same latency statistics as within a run."""

from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest
from report_fixtures import ENV_GPU, Spec, make_run

from microscope.report import compare
from microscope.report.compare import CompareError, compare_runs, holm
from microscope.report.publish import compare_command


def _pair(tmp_path: Path, **b_changes: object) -> tuple[Path, Path]:
    a = make_run(tmp_path / "a", Spec(run_id="main-run", speedup=2.5, seed=1))
    env_b = dict(ENV_GPU, commit="fedcba9876543210fedcba9876543210fedcba98")
    env_b.update(b_changes.pop("env", {}))  # type: ignore[arg-type]
    b = make_run(tmp_path / "b", Spec(run_id="branch-run", speedup=3.5, seed=2, env=env_b, **b_changes))
    return a, b


def _row(table: pd.DataFrame, variant: str, case: str, metric: str) -> pd.Series:
    sel = table[(table["candidate"] == f"{variant} (B)") & (table["case_id"] == case) & (table["metric"] == metric)]
    assert len(sel) == 1, sel
    return sel.iloc[0]


def test_faster_branch_is_detected_with_engine_statistics(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    run = compare_runs(a, b)
    table = run.comparison
    assert compare.engine_compare_latency() is not None
    fast = _row(table, "triton", "seq=512,bf16", "latency_ms")
    assert fast["baseline"] == "triton (A)" and fast["verdict"] == "faster"
    assert fast["ratio_or_delta"] == pytest.approx(2.5 / 3.5, rel=0.05)
    assert fast["ci_low"] < fast["ratio_or_delta"] < fast["ci_high"] and fast["p"] < 0.05
    same = _row(table, "eager", "seq=512,bf16", "latency_ms")
    assert same["verdict"] in ("equivalent", "inconclusive")
    assert set(table["metric"]) >= {"latency_ms", "out.rel_err", "peak_bytes"}
    assert not set(table["metric"]) & {"tflops", "gbps"}  # derived from latency: not repeated
    assert _row(table, "triton", "seq=2048,bf16", "latency_ms")["verdict"] == "failed"
    assert _row(table, "sdpa", "seq=512,bf16", "latency_ms")["verdict"] == "skipped"
    acc = _row(table, "triton", "seq=1024,bf16", "out.rel_err")
    assert acc["verdict"] == "fail" and "A failed" in acc["notes"]
    assert run.envs["A"]["commit"] != run.envs["B"]["commit"]


def test_fallback_statistics_when_the_engine_is_absent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(compare, "engine_compare_latency", lambda: None)
    a, b = _pair(tmp_path)
    run = compare_runs(a, b)
    fast = _row(run.comparison, "triton", "seq=512,bf16", "latency_ms")
    assert fast["verdict"] == "faster" and "Mann-Whitney" in fast["notes"]
    assert any("fallback" in n for n in run.notes)


def test_different_corpora_are_refused_unless_forced(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, env={"corpus_hash": "deadbeefdeadbeef"})
    with pytest.raises(CompareError, match="different corpora.*force"):
        compare_runs(a, b)
    run = compare_runs(a, b, force=True)
    assert any("compared anyway" in n for n in run.notes)


def test_different_devices_and_versions_warn(tmp_path: Path) -> None:
    a, b = _pair(tmp_path, env={"device_name": "NVIDIA A100", "torch": "2.14.0"})
    notes = compare_runs(a, b).notes
    assert any("device_name differs: A NVIDIA H200, B NVIDIA A100" in n for n in notes)
    assert any("torch differs" in n for n in notes)


def test_compare_command_writes_md_html_and_csv(tmp_path: Path) -> None:
    a, b = _pair(tmp_path)
    paths = compare_command(a, b, tmp_path / "reports", force=False)
    assert set(paths) == {"md", "html", "csv"}
    assert paths["md"].name == "main-run-vs-branch-run.md"
    md = paths["md"].read_text(encoding="utf-8")
    assert md.startswith("### microscope compare: B = branch-run vs A = main-run")
    assert "triton (B) faster than triton (A) in 3/4 cases" in md
    assert "A: GPU NVIDIA H200" in md and "B: GPU NVIDIA H200" in md
    assert "commit fedcba987654" in md and "commit 0123456789ab" in md
    assert "triton (B)" in paths["html"].read_text(encoding="utf-8")


def test_measurements_in_one_run_only_are_noted(tmp_path: Path) -> None:
    a = make_run(tmp_path / "a", Spec(run_id="a", cases=3))
    b = make_run(tmp_path / "b", Spec(run_id="b", cases=4))
    notes = compare_runs(a, b).notes
    assert any("only in B" in n and "not compared" in n for n in notes)


def test_holm_adjustment() -> None:
    adj = holm(pd.Series([0.01, float("nan"), 0.04, 0.03]))
    assert adj[0] == pytest.approx(0.03) and adj[3] == pytest.approx(0.06) and adj[2] == pytest.approx(0.06)
    assert pd.isna(adj[1])


def test_significance_that_does_not_survive_holm_is_inconclusive() -> None:
    table = pd.DataFrame({"verdict": ["faster", "faster", "slower", "pass"], "p": [0.001, 0.03, 0.04, float("nan")],
                          "notes": ["", "x", "", ""]})
    out = compare.adjust(table, alpha=0.05)  # Holm: 0.003, 0.06, 0.06
    assert list(out["verdict"]) == ["faster", "inconclusive", "inconclusive", "pass"]
    assert "after Holm over 3 tests" in out.at[1, "notes"] and out.at[1, "notes"].startswith("x; ")
