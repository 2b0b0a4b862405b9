"""Console rendering of the comparison table."""

import math

import pandas as pd
from rich.console import Console
from rich.table import Table

from microscope.stats import TABLE_COLUMNS, VERDICT_STYLES, print_table, render_table


def frame():
    base = {
        "plugin": "softmax",
        "case_id": "rows=7",
        "baseline": "ref",
        "p_adj": math.nan,
        "ci_low": math.nan,
        "ci_high": math.nan,
        "p": math.nan,
    }
    rows = [
        {
            **base,
            "dimension": "throughput",
            "metric": "latency_ms",
            "candidate": "triton",
            "role": "candidate",
            "baseline_value": 1.0,
            "candidate_value": 0.7,
            "ratio_or_delta": 0.7,
            "ci_low": 0.68,
            "ci_high": 0.72,
            "p": 1e-6,
            "p_adj": 2e-6,
            "verdict": "faster",
            "n": 24,
            "notes": "band +-1.0%",
        },
        {
            **base,
            "dimension": "accuracy",
            "metric": "eval_loss",
            "candidate": "triton",
            "role": "candidate",
            "baseline_value": 2.5,
            "candidate_value": 2.55,
            "ratio_or_delta": 0.05,
            "ci_low": 0.04,
            "ci_high": 0.06,
            "p": 0.001,
            "p_adj": 0.002,
            "verdict": "worse",
            "n": 3000,
            "notes": "x" * 200,
        },
        {
            **base,
            "dimension": "throughput",
            "metric": "latency_ms",
            "candidate": "broken",
            "role": "candidate",
            "baseline_value": math.nan,
            "candidate_value": math.nan,
            "ratio_or_delta": math.nan,
            "verdict": "failed",
            "n": None,
            "notes": "CUDA error",
        },
    ]
    df = pd.DataFrame(rows, columns=list(TABLE_COLUMNS))
    df["n"] = pd.array(df["n"].tolist(), dtype="Int64")
    return df


def test_render_table_colours_verdicts_and_formats_effects():
    table = render_table(frame(), notes_width=40)
    assert isinstance(table, Table) and table.row_count == 3
    verdicts = next(c for c in table.columns if c.header == "verdict")
    cells = list(verdicts.cells)
    assert [str(c) for c in cells] == ["faster", "worse", "failed"]
    assert [c.style for c in cells] == [
        VERDICT_STYLES["faster"],
        VERDICT_STYLES["worse"],
        VERDICT_STYLES["failed"],
    ]
    assert "green" in VERDICT_STYLES["faster"] and "red" in VERDICT_STYLES["worse"]
    effects = [str(c) for c in next(c for c in table.columns if c.header == "effect").cells]
    assert effects == ["0.7x", "+0.05", "-"]  # ratio for throughput, signed delta for accuracy
    notes = [str(c) for c in next(c for c in table.columns if c.header == "notes").cells]
    assert len(notes[1]) == 40 and notes[1].endswith("...")
    assert [str(c) for c in next(c for c in table.columns if c.header == "n").cells] == ["24", "3000", "-"]


def test_print_table_writes_to_the_console():
    console = Console(record=True, width=200)
    print_table(frame(), console)
    text = console.export_text()
    for word in ("faster", "worse", "failed", "triton (candidate)", "[0.68, 0.72]", "<1e-4"):
        assert word in text
