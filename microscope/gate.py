"""The gate: turns a run's comparison table into the exit code a CI job acts on.

Exit codes (README "Exit codes"): 0 every gated comparison holds; 1 a candidate fails accuracy, a gated
comparison regresses, or a trial failed; 2 bad config, plugin or input (raised before anything runs,
so it never reaches this module). What is gated comes from the config's ``gate:`` section
(``microscope.config.GateConfig``); only candidates are gated, and their speed and memory only where
they are correct (the statistics table marks the others "not judged").
"""

from __future__ import annotations

from collections import Counter
from dataclasses import dataclass, field

import pandas as pd

from microscope.config import GateConfig
from microscope.report.fmt import case_labels
from microscope.stats.table import TABLE_COLUMNS

EXIT_OK, EXIT_FAILED, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130

__all__ = ["EXIT_BAD_INPUT", "EXIT_FAILED", "EXIT_INTERRUPTED", "EXIT_OK", "GateResult", "evaluate"]


@dataclass
class GateResult:
    """The exit code and, one line each, what failed and what held."""

    exit_code: int
    failures: list[str] = field(default_factory=list)
    held: list[str] = field(default_factory=list)
    not_gated: list[str] = field(default_factory=list)

    @property
    def passed(self) -> bool:
        return self.exit_code == EXIT_OK

    def summary(self, limit: int = 4) -> str:
        """``gate: FAIL (exit 1): ...`` or ``gate: pass (exit 0): ...``, at most ``limit`` reasons."""
        if self.failures:
            more = f"; and {len(self.failures) - limit} more" if len(self.failures) > limit else ""
            return f"gate: FAIL (exit {self.exit_code}): " + "; ".join(self.failures[:limit]) + more
        held = "; ".join(self.held[:limit]) if self.held else "nothing gated"
        if len(self.held) > limit:
            held += f"; and {len(self.held) - limit} more held"
        return f"gate: pass (exit {self.exit_code}): {held}"


def _cases(n: int) -> str:
    return f"{n} case{'s' if n != 1 else ''}"


def _by_candidate(rows: pd.DataFrame) -> dict[str, pd.DataFrame]:
    return {str(c): g for c, g in rows.groupby("candidate", sort=False)}


def _candidate_rows(table: pd.DataFrame, dimension: str | tuple[str, ...], vs: str = "baseline") -> pd.DataFrame:
    dims = (dimension,) if isinstance(dimension, str) else dimension
    if not len(table):
        return table
    vs_col = table["vs"] if "vs" in table.columns else pd.Series("baseline", index=table.index)
    vs_col = vs_col.replace("", "baseline").fillna("baseline")
    return table[(table["role"] == "candidate") & table["dimension"].isin(dims) & (vs_col == vs)]


def _gated(rows: pd.DataFrame) -> pd.DataFrame:
    if "gated" not in rows.columns:
        return rows
    flags = rows["gated"].map(lambda v: str(v).strip().lower() in ("true", "1", "yes")).astype(bool)
    return rows.loc[flags]  # a boolean mask even when empty (an empty object Series would select columns)


def _accuracy(table: pd.DataFrame, out: GateResult) -> None:
    rows = _candidate_rows(table, "accuracy")
    labels = case_labels(table["case_id"])
    for cand, grp in _by_candidate(rows).items():
        grp = grp[~grp["verdict"].isin(["skipped", "failed"])]  # not measured: neither passed nor failed here
        bad = grp[grp["verdict"].isin(["fail", "worse"])]
        cases = grp["case_id"].nunique()
        if len(bad):
            worst = bad.iloc[0]
            where = labels.get(str(worst["case_id"]), str(worst["case_id"]))
            out.failures.append(f"{cand} fails accuracy in {bad['case_id'].nunique()}/{_cases(cases)} "
                                f"(e.g. {worst['metric']}{' in ' + where if where else ''})")
        elif len(grp):
            out.held.append(f"{cand} passes accuracy in {_cases(cases)}")


def _throughput(table: pd.DataFrame, mode: str, vs: str, out: GateResult) -> None:
    rows = _candidate_rows(table, "throughput", vs)
    rows = rows[rows["verdict"].isin(["faster", "slower", "equivalent", "inconclusive", "not judged"])]
    label = "the baseline" if vs == "baseline" else "the best correct peer"
    ungated = rows[~rows.index.isin(_gated(rows).index)] if vs == "baseline" else rows.iloc[0:0]
    if len(ungated):
        out.not_gated.append(f"{len(ungated)} latency comparison(s) vs {label} not gated (interpreter timing)")
    rows = _gated(rows) if vs == "baseline" else rows[~rows["notes"].astype(str).str.contains("interpreter")]
    for cand, grp in _by_candidate(rows).items():
        judged = grp[grp["verdict"] != "not judged"]
        if mode == "faster":
            bad = judged[judged["verdict"] != "faster"]
            words = "not shown faster than"
        else:
            bad = judged[judged["verdict"] == "slower"]
            words = "slower than"
        if len(bad):
            out.failures.append(f"{cand} {words} {label} in {bad['case_id'].nunique()}/"
                                f"{_cases(judged['case_id'].nunique())}")
        elif len(judged):
            what = "faster than" if mode == "faster" else "not slower than"
            out.held.append(f"{cand} {what} {label} in {_cases(judged['case_id'].nunique())}")


def _memory(table: pd.DataFrame, growth: float, out: GateResult) -> None:
    rows = _gated(_candidate_rows(table, "memory"))
    rows = rows[rows["verdict"].isin(["less", "more", "same"])]
    for cand, grp in _by_candidate(rows).items():
        ratio = pd.to_numeric(grp["candidate_value"], errors="coerce") / pd.to_numeric(
            grp["baseline_value"], errors="coerce")
        bad = grp[ratio > 1.0 + growth]
        metrics = ", ".join(dict.fromkeys((bad if len(bad) else grp)["metric"].astype(str)))
        if len(bad):
            out.failures.append(f"{cand} uses more than +{growth:.0%} memory ({metrics}) in "
                                f"{bad['case_id'].nunique()}/{_cases(grp['case_id'].nunique())} "
                                f"(up to +{float(ratio.max()) - 1:.1%})")
        else:
            out.held.append(f"{cand} memory within +{growth:.0%} ({metrics})")


def _stability(table: pd.DataFrame, out: GateResult) -> None:
    rows = _gated(_candidate_rows(table, ("stability", "generalization")))
    for cand, grp in _by_candidate(rows).items():
        bad = grp[grp["verdict"] == "worse"]
        if len(bad):
            out.failures.append(f"{cand} worse in {len(bad)} stability/generalization metric(s) "
                                f"(e.g. {bad.iloc[0]['metric']})")
        elif len(grp):
            out.held.append(f"{cand} not worse in stability/generalization")


def _failed_trials(records: pd.DataFrame, out: GateResult) -> None:
    if not len(records) or "status" not in records.columns:
        return
    failed = records[records["status"] == "failed"]
    if not len(failed):
        return
    counts = Counter(str(v) for v in failed["variant"])
    shown = counts.most_common(4)
    who = ", ".join(f"{v} {n}" for v, n in shown)
    if len(counts) > len(shown):  # the parenthesis must add up to the count it explains
        rest = counts.total() - sum(n for _, n in shown)
        more = len(counts) - len(shown)
        who += f", {rest} in {more} more variant{'s' if more != 1 else ''}"
    out.failures.append(f"{len(failed)} failed trial record(s) ({who})")


def evaluate(table: pd.DataFrame | None, records: pd.DataFrame, gate: GateConfig | None = None) -> GateResult:
    """The exit code of a run from its comparison table and records, under ``gate``."""
    gate = gate or GateConfig()
    out = GateResult(EXIT_OK)
    if table is None or not set(TABLE_COLUMNS) <= set(table.columns):  # no comparison (nothing was measured)
        table = pd.DataFrame(columns=list(TABLE_COLUMNS))
    if gate.failed_trials:
        _failed_trials(records, out)
    if gate.accuracy:
        _accuracy(table, out)
    if gate.throughput != "off":
        _throughput(table, gate.throughput, "baseline", out)
    if gate.best_peer != "off":
        _throughput(table, gate.best_peer, "best_peer", out)
    if gate.memory_growth is not None:
        _memory(table, gate.memory_growth, out)
    if gate.stability:
        _stability(table, out)
    out.exit_code = EXIT_FAILED if out.failures else EXIT_OK
    return out
