"""The gate's exit code from a comparison table and records, including runs that measured nothing."""

from __future__ import annotations

import pandas as pd

from microscope.gate import EXIT_FAILED, EXIT_OK, evaluate


def test_a_run_with_no_comparison_rows_is_gated_without_error():
    """An interrupted run can end with no records and an empty table without columns: no traceback."""
    for table in (None, pd.DataFrame()):
        result = evaluate(table, pd.DataFrame())
        assert result.exit_code == EXIT_OK and "nothing gated" in result.summary()


def test_failed_trials_fail_the_gate_even_without_comparisons():
    records = pd.DataFrame([{"variant": "cand", "status": "failed"}, {"variant": "base", "status": "ok"}])
    result = evaluate(pd.DataFrame(), records)
    assert result.exit_code == EXIT_FAILED and "1 failed trial record(s) (cand 1)" in result.summary()
