"""Compact console rendering of the comparison table with rich: one line per row, verdicts in colour.

Green: the change is good or harmless (faster, better, less, pass, equivalent, non-inferior, same).
Red: it hurts (slower, worse, more, fail). Yellow: not decided (inconclusive). Magenta: no
measurement (failed, skipped, error). Numbers are shortened for the eye; the CSV/Parquet written by
``save_table`` keeps them in full.
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["VERDICT_STYLES", "print_table", "render_table"]

VERDICT_STYLES: dict[str, str] = {
    "faster": "bold green",
    "better": "bold green",
    "less": "green",
    "pass": "green",
    "equivalent": "green",
    "non-inferior": "green",
    "same": "green",
    "lower": "cyan",
    "higher": "cyan",
    "slower": "bold red",
    "worse": "bold red",
    "more": "red",
    "fail": "bold red",
    "inconclusive": "yellow",
    "info": "dim",
    "failed": "magenta",
    "skipped": "magenta",
    "error": "bold magenta",
}
_RATIO_DIMENSIONS = ("throughput", "memory")


def _is_ratio(row: Any) -> bool:
    return row["dimension"] in _RATIO_DIMENSIONS or row["verdict"] in ("pass", "fail")


def _num(v: Any) -> str:
    if v is None or pd.isna(v):
        return "-"
    v = float(v)
    if v == 0:
        return "0"
    if math.isinf(v):
        return "inf" if v > 0 else "-inf"
    a = abs(v)
    if a >= 1e5 or a < 1e-3:
        return f"{v:.3g}"
    return f"{v:.4g}"


def _effect(row: Any) -> str:
    v = row["ratio_or_delta"]
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return f"{_num(v)}x" if _is_ratio(row) else f"{float(v):+.3g}"


def _ci(row: Any) -> str:
    lo, hi = row["ci_low"], row["ci_high"]
    if any(x is None or (isinstance(x, float) and math.isnan(x)) for x in (lo, hi)):
        return "-"
    return f"[{_num(lo)}, {_num(hi)}]"


def _p(v: Any) -> str:
    if v is None or (isinstance(v, float) and math.isnan(v)):
        return "-"
    return "<1e-4" if v < 1e-4 else f"{v:.4f}"


def render_table(
    df: pd.DataFrame, *, title: str = "microscope: candidates and peers vs baseline", notes_width: int = 60
) -> Table:
    """A ``rich.table.Table`` of a ``compare_records`` frame; notes cut at ``notes_width`` characters."""
    table = Table(title=title, show_lines=False, header_style="bold", pad_edge=False)
    right = {"justify": "right"}
    columns: tuple[tuple[str, dict[str, Any]], ...] = (
        ("plugin", {}),
        ("case", {}),
        ("metric", {}),
        ("variant", {}),
        ("base", right),
        ("cand", right),
        ("effect", right),
        ("95% CI", {}),
        ("p", right),
        ("p_adj", right),
        ("verdict", {}),
        ("n", right),
        ("notes", {"overflow": "fold"}),
    )
    for name, kw in columns:
        table.add_column(name, **kw)
    for _, row in df.iterrows():
        verdict = str(row["verdict"])
        notes = str(row["notes"] or "")
        if len(notes) > notes_width:
            notes = notes[: notes_width - 3] + "..."
        n = row["n"]
        table.add_row(
            str(row["plugin"]),
            str(row["case_id"]),
            f"{row['dimension']}/{row['metric']}",
            f"{row['candidate']} ({row['role']})",
            _num(row["baseline_value"]),
            _num(row["candidate_value"]),
            _effect(row),
            _ci(row),
            _p(row["p"]),
            _p(row["p_adj"]),
            Text(verdict, style=VERDICT_STYLES.get(verdict, "")),
            "-" if pd.isna(n) else str(int(n)),
            notes,
        )
    return table


def print_table(df: pd.DataFrame, console: Console | None = None, **kwargs: Any) -> None:
    """Print ``render_table(df, **kwargs)`` to ``console`` (a new stdout console by default)."""
    (console or Console()).print(render_table(df, **kwargs))
