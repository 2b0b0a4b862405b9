"""A results folder's saved statistics table (``comparison.csv`` or ``.parquet``), read back normalised.

The history reads it for each run's verdicts and the reports for every table they draw, so it lives
with the other readers of a run folder rather than in the reports.
"""

from __future__ import annotations

from pathlib import Path

import pandas as pd

from microscope.stats.table import TABLE_COLUMNS

from .records import text_column

__all__ = ["COMPARISON_COLUMNS", "NUMERIC_COLUMNS", "normalise_comparison", "read_comparison"]

#: The statistics engine's table, in its column order (one list, owned by ``microscope.stats.table``).
COMPARISON_COLUMNS = TABLE_COLUMNS
NUMERIC_COLUMNS = ("baseline_value", "candidate_value", "ratio_or_delta", "ci_low", "ci_high", "p", "p_adj",
                   "n")


def read_comparison(folder: Path) -> tuple[pd.DataFrame | None, list[str]]:
    """The statistics table from ``comparison.csv`` (or ``.parquet``), normalised to known columns.

    Text is read as text (``keep_default_na=False``) so a variant literally named "NA" or "None" stays
    a name; only the numeric columns are coerced, with unreadable cells becoming NaN.
    """
    csv, parquet = folder / "comparison.csv", folder / "comparison.parquet"
    try:
        if csv.is_file():
            table = pd.read_csv(csv, dtype=str, keep_default_na=False)
        elif parquet.is_file():
            table = pd.read_parquet(parquet)
        else:
            return None, []
    except Exception as exc:  # a broken table must not cost the raw numbers
        return None, [f"comparison table unreadable ({type(exc).__name__}: {exc}); verdicts left out"]
    return normalise_comparison(table), []


def normalise_comparison(table: pd.DataFrame) -> pd.DataFrame:
    """Known columns present, numeric columns numeric, text columns plain strings."""
    table = table.copy()
    for col in COMPARISON_COLUMNS:
        if col not in table.columns:
            table[col] = None
    for col in NUMERIC_COLUMNS:
        table[col] = pd.to_numeric(table[col], errors="coerce")
    for col in set(COMPARISON_COLUMNS) - set(NUMERIC_COLUMNS):
        table[col] = text_column(table[col])
    table["verdict"] = text_column(table["verdict"].map(lambda v: v.strip().lower()))
    table["vs"] = table["vs"].replace("", "baseline")
    table["gated"] = table["gated"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes"))
    return table.reset_index(drop=True)
