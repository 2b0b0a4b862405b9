"""The gate's exit code from a comparison table and records, including runs that measured nothing."""

from __future__ import annotations

import pandas as pd

from microscope.gate import EXIT_FAILED, EXIT_OK, evaluate
from microscope.stats.table import TABLE_COLUMNS


def test_a_run_with_no_comparison_rows_is_gated_without_error():
    """An interrupted run can end with no records and an empty table without columns: no traceback."""
    for table in (None, pd.DataFrame()):
        result = evaluate(table, pd.DataFrame())
        assert result.exit_code == EXIT_OK and "nothing gated" in result.summary()


def test_failed_trials_fail_the_gate_even_without_comparisons():
    records = pd.DataFrame([{"variant": "cand", "status": "failed"}, {"variant": "base", "status": "ok"}])
    result = evaluate(pd.DataFrame(), records)
    assert result.exit_code == EXIT_FAILED and "1 failed trial record(s) (cand 1)" in result.summary()


def test_the_failed_trials_named_add_up_to_their_count():
    """Five variants failed, 15 records: the four most frequent are named and the rest counted, not dropped."""
    failed = (("aborts", 3), ("hangs", 3), ("segfaults", 4), ("oom", 4), ("asserts", 1))
    records = pd.DataFrame([{"variant": v, "status": "failed"} for v, n in failed for _ in range(n)])
    summary = evaluate(pd.DataFrame(), records).summary()
    assert "15 failed trial record(s) (segfaults 4, oom 4, aborts 3, hangs 3, 1 in 1 more variant)" in summary


def _accuracy_rows(verdicts: dict[str, str]) -> pd.DataFrame:
    return pd.DataFrame([{**dict.fromkeys(TABLE_COLUMNS, ""), "candidate": "cand", "role": "candidate",
                          "dimension": "accuracy", "metric": "out.rel_err", "case_id": case, "verdict": verdict,
                          "vs": "baseline", "gated": True} for case, verdict in verdicts.items()])


def test_a_candidate_is_said_to_pass_accuracy_only_in_the_cases_it_was_measured_in():
    """Skipped (this device cannot run it) and failed trials are not passes."""
    records = pd.DataFrame([{"variant": "cand", "status": "ok"}])
    unmeasured = evaluate(_accuracy_rows({"a": "skipped", "b": "skipped"}), records)
    assert unmeasured.exit_code == EXIT_OK and not any("passes accuracy" in h for h in unmeasured.held)
    mixed = evaluate(_accuracy_rows({"a": "pass", "b": "skipped", "c": "failed"}), records)
    assert "cand passes accuracy in 1 case" in mixed.held
    failing = evaluate(_accuracy_rows({"a": "fail", "b": "skipped"}), records)
    assert failing.exit_code == EXIT_FAILED and "cand fails accuracy in 1/1 case" in failing.summary()
