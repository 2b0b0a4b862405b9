"""The closing table a run prints: one row per variant and case, the numbers a reader looks for first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from rich.table import Table

from microscope.store.records import Record


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(records: Iterable[Record], title: str = "") -> Table:
    """Plugin, variant, case, and per dimension the headline metric (worst tensor error for accuracy)."""
    rows: dict[tuple[str, str, str], dict[str, object]] = defaultdict(dict)
    roles: dict[str, str] = {}
    for r in records:
        row = rows[(r.plugin, r.variant, r.case_id)]
        roles[r.variant] = r.role
        if r.status != "ok":
            row.setdefault("problems", []).append(f"{r.dimension} {r.status}: {r.reason}")  # type: ignore[union-attr]
            continue
        if r.dimension == "accuracy":
            row["err"] = max(row.get("err", 0.0), r.value)  # type: ignore[type-var]
            row["pass"] = row.get("pass", True) and bool(r.passed)
            if not r.passed:
                row.setdefault("problems", []).append(f"{r.metric}: {r.reason}")  # type: ignore[union-attr]
        elif r.metric in ("latency_ms", "tflops", "gbps", "peak_bytes"):
            row[r.metric] = r.value
            if r.metric == "latency_ms":
                row["iqr"] = r.details.get("iqr_rel")
    table = Table(title=title, show_lines=False, header_style="bold")
    for col, justify in (("plugin", "left"), ("variant", "left"), ("role", "left"), ("case", "left"),
                         ("max rel err", "right"), ("acc", "center"), ("latency ms", "right"),
                         ("IQR/med", "right"), ("TFLOP/s", "right"), ("GB/s", "right"),
                         ("peak MiB", "right"), ("notes", "left")):
        table.add_column(col, justify=justify, overflow="fold")
    for (plugin, variant, case), row in rows.items():
        passed = row.get("pass")
        acc = "-" if passed is None else ("[green]pass[/]" if passed else "[red]FAIL[/]")
        peak = row.get("peak_bytes")
        problems = row.get("problems", [])
        table.add_row(
            plugin, variant, roles[variant], case,
            _fmt(row.get("err"), ".2e"), acc,  # type: ignore[arg-type]
            _fmt(row.get("latency_ms"), ".4g"), _fmt(row.get("iqr"), ".1%"),  # type: ignore[arg-type]
            _fmt(row.get("tflops"), ".1f"), _fmt(row.get("gbps"), ".1f"),  # type: ignore[arg-type]
            _fmt(None if peak is None else peak / 2**20, ".2f"),  # type: ignore[operator]
            "; ".join(problems)[:200],  # type: ignore[arg-type]
        )
    return table
