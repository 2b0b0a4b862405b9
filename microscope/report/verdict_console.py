"""What a run prints by default: one screen, verdicts first, at 80 columns.

The verdict sentences (the Markdown report's first lines), then only the rows that changed something or
failed, with case labels reduced to the axes that vary, then the gate's one-line outcome. Everything is
printed as plain ``rich.text.Text``: names, reasons and notes come from configs, plugins and exception
messages, and must never be parsed as rich markup. The full tables are in ``--verbose``, the CSV and
the reports.
"""

from __future__ import annotations

import pandas as pd
from rich import box
from rich.console import Console
from rich.table import Table
from rich.text import Text

from microscope.gate import GateResult
from microscope.stats.metrics import VS_CONTRAST

from . import fmt
from .caveats import caveats
from .headline import Headline, headlines, with_baselines
from .load import RunData
from .tables import significant_rows

#: Verdicts worth a row on the console besides the significant ones (failed trials are listed by reason).
_FAILING = ("fail", "error")
_MARK = {"good": ("\u2714", "green"), "bad": ("\u2718", "bold red"), "warn": ("!", "yellow"),
         "neutral": ("\u00b7", "dim")}
_VERDICT_STYLE = {"faster": "green", "less": "green", "better": "green", "slower": "red", "more": "red",
                  "worse": "bold red", "fail": "bold red", "failed": "magenta", "error": "magenta"}
MAX_ROWS = 12


def headline_lines(items: list[Headline]) -> list[Text]:
    """One styled line per verdict sentence: a mark, the dimension, the sentence."""
    out = []
    for h in items:
        mark, style = _MARK.get(h.tone, ("\u00b7", ""))
        line = Text(f" {mark} ", style=style)
        line.append(f"{h.dimension}: ", style="bold")
        line.append(h.text)
        out.append(line)
    return out


def _num(value: object) -> str:
    f = fmt.finite(value)
    if f is None:
        return "-"
    if abs(f) < 1e3:
        return f"{f:.3g}"
    return f"{f:.0f}" if abs(f) < 1e6 else f"{f:.2e}"


def _effect(row: pd.Series) -> str:
    value = fmt.finite(row["ratio_or_delta"])
    if value is None:
        return "-"
    if row["dimension"] in ("throughput", "memory") or row["verdict"] in ("pass", "fail"):
        return f"\u00d7{_num(value)}"
    return f"{value:+.3g}"


def _ci(row: pd.Series) -> str:
    lo, hi = fmt.finite(row["ci_low"]), fmt.finite(row["ci_high"])
    return "-" if lo is None or hi is None else f"[{_num(lo)}, {_num(hi)}]"


def notable_rows(table: pd.DataFrame | None) -> pd.DataFrame:
    """Candidates' significant rows (regressions first) and every failing row: what the console lists.

    Peers' own changes against the baseline are in the verdict sentences and the full tables; the rows
    here are the ones a kernel author acts on.
    """
    if table is None or not len(table):
        return pd.DataFrame()
    table = with_baselines(table)
    failing = table[table["verdict"].isin(_FAILING)]
    sig = significant_rows(table[table["role"] == "candidate"])
    return pd.concat([failing, sig[~sig.index.isin(failing.index)]])


_SHORT_METRIC = {"latency_ms": "latency", "peak_bytes": "peak mem", "timed_calls.ok": "timed calls",
                 "latency_vs_baseline": "lat/baseline"}


def rows_table(rows: pd.DataFrame, labels: dict[str, str], limit: int = MAX_ROWS) -> Table:
    """A narrow table of comparison rows: variant, what it is compared with, case, metric, effect, verdict."""
    table = Table(box=box.SIMPLE_HEAD, pad_edge=False, show_edge=False, header_style="bold",
                  padding=(0, 1), collapse_padding=True)
    for name, kw in (("variant", {"max_width": 14}), ("vs", {"max_width": 14}), ("case", {"max_width": 22}),
                     ("metric", {"max_width": 14}), ("effect [95% CI]", {}), ("verdict", {"min_width": 8})):
        table.add_column(name, no_wrap=True, overflow="ellipsis", **kw)
    for _, row in rows.head(limit).iterrows():
        best, contrast = str(row.get("vs", "")) == "best_peer", str(row.get("vs", "")) == VS_CONTRAST
        verdict = str(row["verdict"])
        if "interpreter" in str(row["notes"]):
            verdict += "*"
        metric = str(row["metric"])
        mark = "\u2020" if best else "\u2021" if contrast else ""
        table.add_row(Text(str(row["candidate"])), Text(str(row["baseline"]) + mark),
                      Text(labels.get(str(row["case_id"]), "")), Text(_SHORT_METRIC.get(metric, metric)),
                      Text(f"{_effect(row)} {_ci(row)}" if _ci(row) != "-" else _effect(row)),
                      Text(verdict, style=_VERDICT_STYLE.get(str(row["verdict"]), "")))
    return table


def print_verdicts(console: Console, run: RunData, gate: GateResult | None) -> None:
    """The default closing output of ``microscope run``: verdicts, notable rows, gate."""
    console.print(Text("Verdicts", style="bold"))
    for line in headline_lines(headlines(run)):
        console.print(line)
    table = run.comparison
    rows = notable_rows(table)
    if len(rows):
        labels = fmt.case_labels(table["case_id"]) if table is not None else {}
        shown = min(len(rows), MAX_ROWS)
        console.print(Text(f"\nSignificant or failing rows ({len(rows)} of {len(table)} comparisons"
                           + (f"; first {shown}" if shown < len(rows) else "") + "):", style="bold"))
        console.print(rows_table(rows, labels))
        keys = []
        if (rows.get("vs", pd.Series(dtype=str)).astype(str) == "best_peer").any():
            speed_only = rows["notes"].astype(str).str.contains("fastest speed-only").any()
            kind = "correct or speed-only" if speed_only else "correct"
            keys.append(f"\u2020 the fastest {kind} peer of the case")
        if (rows.get("vs", pd.Series(dtype=str)).astype(str) == VS_CONTRAST).any():
            keys.append("\u2021 a contrast (stats.contrasts): reported, not gated")
        if rows["notes"].astype(str).str.contains("interpreter").any():
            keys.append("* run by the Triton interpreter: not gated")
        if keys:
            console.print(Text(" " + "; ".join(keys), style="dim"))
    for caveat in caveats(run):
        if caveat.level == "warn" and not caveat.text.startswith("Triton ran"):
            console.print(Text(" ! " + fmt.clip(caveat.text, 200), style="yellow"))
            for item in caveat.items[:3]:
                console.print(Text("   " + fmt.clip(item, 200)))
            if len(caveat.items) > 3:
                console.print(Text(f"   ... {len(caveat.items) - 3} more in the report", style="dim"))
    if gate is not None:
        console.print(gate_line(gate))


def gate_line(gate: GateResult) -> Text:
    """``gate: pass (exit 0): ...`` in green, or ``gate: FAIL (exit 1): ...`` in red."""
    text = Text(gate.summary(), style="green" if gate.passed else "bold red")
    if gate.not_gated:
        text.append("; " + "; ".join(gate.not_gated), style="dim")
    return text
