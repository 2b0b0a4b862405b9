"""The report's tables as plain text cells, built once and rendered by both writers.

Each table keeps, next to the display text, a numeric sort key per numeric cell (so the HTML sorts
1e-3 below 2e-2 and "-" last) and the row's verdict (so both formats can colour or order by it).
Three tables: the statistics engine's comparison rows (all, or only the significant ones), the raw
numbers per variant and case from the records (what a run without statistics still shows), and the
failed/skipped trials with their reasons.
"""

from __future__ import annotations

import math
from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any

import pandas as pd

from . import fmt
from .headline import SIGNIFICANT, ratios


@dataclass
class Table:
    """Display rows plus sort keys; ``total`` counts rows before any cap a writer applies."""

    columns: list[str]
    numeric: list[bool]
    rows: list[list[str]] = field(default_factory=list)
    keys: list[list[float | None]] = field(default_factory=list)
    verdicts: list[str] = field(default_factory=list)

    @property
    def total(self) -> int:
        return len(self.rows)

    def add(self, cells: list[tuple[str, float | None]], verdict: str = "") -> None:
        self.rows.append([text for text, _ in cells])
        self.keys.append([key for _, key in cells])
        self.verdicts.append(verdict)

    def head(self, n: int) -> Table:
        return Table(self.columns, self.numeric, self.rows[:n], self.keys[:n], self.verdicts[:n])

    def tail(self, n: int) -> Table:
        return Table(self.columns, self.numeric, self.rows[n:], self.keys[n:], self.verdicts[n:])


def _t(value: Any, limit: int = 120) -> tuple[str, None]:
    return fmt.clip(value, limit), None


def _n(text: str, value: Any) -> tuple[str, float | None]:
    return text, fmt.finite(value)


_RANK = {v: i for i, v in enumerate(("fail", "failed", "error", "slower", "more", "worse", "higher", "lower",
                                      "better", "faster", "less"))}


def significant_rows(table: pd.DataFrame | None) -> pd.DataFrame:
    """Rows whose verdict is a change, regressions first, then the largest effects first."""
    if table is None or not len(table):
        return pd.DataFrame(columns=[] if table is None else table.columns)
    sig = table[table["verdict"].isin(SIGNIFICANT)]
    size = [abs(math.log(r)) if r > 0 else 0.0 for r in ratios(sig)]
    rank = [_RANK.get(v, len(_RANK)) for v in sig["verdict"]]
    return sig.assign(_rank=rank, _size=size).sort_values(["_rank", "_size"], ascending=[True, False]).drop(
        columns=["_rank", "_size"])


def comparison_table(rows: pd.DataFrame, show_plugin: bool) -> Table:
    """Comparison rows with values formatted per metric, the effect with its CI, raw and adjusted p."""
    cols = (["plugin"] if show_plugin else []) + [
        "case", "dimension", "metric", "baseline", "candidate", "baseline value", "candidate value",
        "ratio / delta", "95% CI", "p", "p adj", "verdict", "n", "notes"]
    numeric = [c in ("baseline value", "candidate value", "ratio / delta", "p", "p adj", "n") for c in cols]
    out = Table(cols, numeric)
    for row in rows.to_dict("records"):
        metric = str(row["metric"])
        cells = ([_t(row["plugin"])] if show_plugin else []) + [
            _t(row["case_id"]), _t(row["dimension"]), _t(metric), _t(row["baseline"], 60),
            _t(row["candidate"], 60),
            _n(fmt.metric_value(metric, row["baseline_value"]), row["baseline_value"]),
            _n(fmt.metric_value(metric, row["candidate_value"]), row["candidate_value"]),
            _n(fmt.num(row["ratio_or_delta"]), row["ratio_or_delta"]),
            _t(fmt.ci(row["ci_low"], row["ci_high"])),
            _n(fmt.pvalue(row["p"]), row["p"]), _n(fmt.pvalue(row["p_adj"]), row["p_adj"]),
            _t(row["verdict"] or "-"), _n(fmt.num(row["n"], ".0f"), row["n"]), _t(row["notes"], 200)]
        out.add(cells, str(row["verdict"]))
    return out


def significant_table(rows: pd.DataFrame, show_plugin: bool) -> Table:
    """The significant rows in seven columns that fit a 1400 px window: short case labels (only the axes
    that vary), "candidate vs yardstick", the effect with its CI, adjusted p, verdict and notes."""
    cols = (["plugin"] if show_plugin else []) + ["case", "metric", "comparison", "effect [95% CI]", "p adj",
                                                   "verdict", "notes"]
    numeric = [c == "p adj" for c in cols]
    out = Table(cols, numeric)
    names = fmt.case_labels(rows["case_id"]) if len(rows) else {}
    for row in rows.to_dict("records"):
        yardstick = "best peer " + str(row["baseline"]) if row.get("vs") == "best_peer" else str(row["baseline"])
        effect = f"{fmt.num(row['ratio_or_delta'])} {fmt.ci(row['ci_low'], row['ci_high'])}".strip()
        cells = ([_t(row["plugin"])] if show_plugin else []) + [
            _t(names.get(str(row["case_id"]), row["case_id"]), 48), _t(row["metric"], 32),
            _t(f"{row['candidate']} vs {yardstick}", 48), _n(effect, row["ratio_or_delta"]),
            _n(fmt.pvalue(row["p_adj"]), row["p_adj"]), _t(row["verdict"] or "-"), _t(row["notes"], 160)]
        out.add(cells, str(row["verdict"]))
    return out


def _raw_cells(records: list[dict[str, Any]]) -> dict[str, Any]:
    """Per variant and case: worst error, pass, latency, IQR, TFLOP/s, GB/s, peak, other metrics, problems."""
    acc: dict[str, Any] = {"problems": [], "other": defaultdict(list)}
    for r in records:
        metric, value, status = str(r["metric"]), r["value"], r["status"]
        if status != "ok":
            acc["problems"].append(f"{r['dimension']} {status}: {fmt.clip(r.get('reason'), 160)}")
            continue
        if r["dimension"] == "accuracy" and metric.endswith("rel_err"):
            acc["err"] = max(acc.get("err", 0.0), fmt.finite(value) or 0.0)
            passed = r.get("passed")
            if passed is not None and not (isinstance(passed, float) and math.isnan(passed)):
                acc["pass"] = acc.get("pass", True) and bool(passed)
                if not passed:
                    acc["problems"].append(f"{metric}: {fmt.clip(r.get('reason'), 160)}")
        elif metric in ("latency_ms", "tflops", "gbps", "peak_bytes"):
            acc[metric] = value
            if metric == "latency_ms":
                acc["iqr"] = r.get("details.iqr_rel")
            if metric in ("tflops", "gbps"):
                acc[metric + "_frac"] = r.get("details.fraction_of_ceiling")
        else:
            acc["other"][metric].append(fmt.finite(value))
    return acc


def _mean(values: list[float | None]) -> float | None:
    vals = [v for v in values if v is not None]
    return sum(vals) / len(vals) if vals else None


def _rate(cells: dict[str, Any], metric: str) -> str:
    """TFLOP/s or GB/s with the fraction of the device ceiling when the run measured one."""
    text = fmt.num(cells.get(metric), ".3g")
    frac = fmt.finite(cells.get(metric + "_frac"))
    return text if frac is None else f"{text} ({frac:.0%})"


def raw_table(records: pd.DataFrame) -> Table:
    """The raw numbers per variant and case: what a run without a comparison table still shows."""
    show_plugin = records["plugin"].nunique() > 1
    cols = (["plugin"] if show_plugin else []) + [
        "variant", "role", "case", "max rel err", "accuracy", "latency", "IQR/med", "TFLOP/s", "GB/s",
        "peak memory", "other metrics", "problems"]
    numeric = [c in ("max rel err", "latency", "IQR/med", "TFLOP/s", "GB/s", "peak memory") for c in cols]
    out = Table(cols, numeric)
    if not len(records):
        return out
    wanted = ("plugin", "variant", "role", "case_id", "dimension", "metric", "value", "status", "reason",
              "passed", "details.iqr_rel", "details.fraction_of_ceiling")
    keep = [c for c in wanted if c in records.columns]
    groups: dict[tuple[str, str, str], list[dict[str, Any]]] = defaultdict(list)
    for r in records[keep].to_dict("records"):
        groups[(r["plugin"], r["variant"], r["case_id"])].append(r)
    for (plugin, variant, case), recs in groups.items():
        a = _raw_cells(recs)
        passed = a.get("pass")
        other = "; ".join(f"{m} {fmt.num(_mean(vals))}" for m, vals in list(a["other"].items())[:6])

        cells = ([_t(plugin)] if show_plugin else []) + [
            _t(variant, 60), _t(recs[0]["role"]), _t(case),
            _n(fmt.num(a.get("err"), ".2e"), a.get("err")),
            _t("-" if passed is None else ("pass" if passed else "FAIL")),
            _n(fmt.metric_value("latency_ms", a.get("latency_ms")), a.get("latency_ms")),
            _n(fmt.pct(a.get("iqr"), signed=False), a.get("iqr")),
            _n(_rate(a, "tflops"), a.get("tflops")), _n(_rate(a, "gbps"), a.get("gbps")),
            _n(fmt.size(a.get("peak_bytes")), a.get("peak_bytes")),
            _t(other, 200), _t("; ".join(a["problems"]), 300)]
        failed = any(" failed:" in p for p in a["problems"])
        verdict = "fail" if passed is False else ("failed" if failed else "")
        out.add(cells, verdict)
    return out


def trials_table(records: pd.DataFrame) -> Table:
    """Every failed or skipped trial record with its reason, failures first."""
    out = Table(["status", "variant", "role", "case", "dimension", "metric", "reason"], [False] * 7)
    if not len(records):
        return out
    bad = records[records["status"].isin(["failed", "skipped"])]
    bad = bad.assign(_o=(bad["status"] != "failed").astype(int)).sort_values("_o", kind="stable")
    for r in bad.to_dict("records"):
        out.add([_t(r["status"]), _t(r["variant"], 60), _t(r["role"]), _t(r["case_id"]), _t(r["dimension"]),
                 _t(r["metric"]), _t(r.get("reason") or "no reason recorded", 400)], str(r["status"]))
    return out
