"""The closing table a run prints: one row per variant and case, the numbers a reader looks for first."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable

from rich.table import Table

from microscope.store.records import Record

_ROLE_ORDER = {"baseline": 0, "candidate": 1, "peer": 2}


def skipped_summary(records: Iterable[Record]) -> list[str]:
    """One line per skipped variant and reason, with the number of cases: ``flex: needs CUDA (4 cases)``."""
    cases: dict[tuple[str, str], set[str]] = defaultdict(set)
    for r in records:
        if r.status == "skipped":
            cases[(r.variant, r.reason or "")].add(r.case_id)
    return [f"{variant}: {reason} ({len(ids)} case{'s' if len(ids) > 1 else ''})"
            for (variant, reason), ids in cases.items()]


def _fmt(value: float | None, spec: str) -> str:
    return "-" if value is None else format(value, spec)


def summary_table(records: Iterable[Record], title: str = "") -> Table:
    """Plugin, variant, case, and per dimension the headline metric (worst tensor error for accuracy)."""
    rows: dict[tuple[str, str, str], dict[str, object]] = defaultdict(dict)
    roles: dict[str, str] = {}
    for r in records:
        if r.status == "skipped":
            continue  # listed once per variant by skipped_summary, not as empty rows
        row = rows[(r.plugin, r.variant, r.case_id)]
        roles[r.variant] = r.role
        if r.status != "ok":
            problem = f"{r.status}: {r.reason}"
            if problem not in row.setdefault("problems", []):  # type: ignore[operator]
                row["problems"].append(problem)  # type: ignore[union-attr]
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
    case_order = {key[2]: i for i, key in reversed(list(enumerate(rows)))}
    ordered = sorted(rows.items(), key=lambda kv: (kv[0][0], case_order[kv[0][2]], _ROLE_ORDER[roles[kv[0][1]]]))
    for (plugin, variant, case), row in ordered:
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
