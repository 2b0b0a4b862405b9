"""The benchmark table on the console: each variant's rate per case and its fraction of the device ceiling.

What a kernel room's bench script used to print, now from the run's own records: one row per case, one
column per variant, each cell the variant's TFLOP/s (or GB/s where the plugin counts bytes but no
FLOPs) with its share of the ceiling measured in the same run, and the candidate over the fastest
correct peer of the case. Variants that failed or were skipped show why in a word.
"""

from __future__ import annotations

import pandas as pd
from rich import box
from rich.table import Table

from . import fmt

__all__ = ["rates_table"]

RATE_UNITS = {"tflops": "TFLOP/s", "gbps": "GB/s"}


def _metric(records: pd.DataFrame) -> str | None:
    """The rate that binds: of TFLOP/s and GB/s, the one nearer its ceiling (a bandwidth-bound kernel is
    judged by its GB/s); without ceilings TFLOP/s when the run has it; None when it has neither."""
    ok = records[(records["status"] == "ok") & (records["dimension"] == "throughput")]
    present = [m for m in RATE_UNITS if (ok["metric"] == m).any()]
    if "details.fraction_of_ceiling" in ok.columns and len(present) > 1:
        share = {m: fmt.finite(ok.loc[ok["metric"] == m, "details.fraction_of_ceiling"].median()) for m in present}
        known = {m: v for m, v in share.items() if v is not None}
        if known:
            return max(known, key=lambda m: known[m])
    return present[0] if present else None


def _cell(rows: pd.DataFrame) -> str:
    ok = rows[rows["status"] == "ok"]
    if not len(ok):
        status = rows["status"].iloc[0] if len(rows) else "-"
        return {"failed": "failed", "skipped": "skipped"}.get(str(status), fmt.MISSING)
    value = fmt.finite(ok["value"].median())
    frac = fmt.finite(ok["details.fraction_of_ceiling"].median()) if "details.fraction_of_ceiling" in ok else None
    text = fmt.num(value, ".4g")
    return text + (f" ({frac:.0%})" if frac is not None else "")


def rates_table(records: pd.DataFrame, unjudged: set[tuple[str, str]] | None = None) -> Table | None:
    """The rate of every variant in every case, or None when the run measured no rate.

    ``unjudged``: (case_id, variant) pairs that failed accuracy; their cells say so after the number,
    and they are never the best peer; nor is a study's variant (``details.study``).
    """
    if not len(records) or "metric" not in records.columns:
        return None
    metric = _metric(records)
    if metric is None:
        return None
    unjudged = unjudged or set()
    latency = records[(records["dimension"] == "throughput") & (records["metric"] == "latency_ms")]
    rates = records[(records["dimension"] == "throughput") & (records["metric"] == metric)]
    variants = list(dict.fromkeys(latency["variant"].astype(str)))
    roles = dict(zip(latency["variant"].astype(str), latency["role"].astype(str)))
    # a study's variants (opt-in: a stage left out) are shown but are never the best peer
    study = set(latency.loc[latency["details.study"].eq(True), "variant"].astype(str)
                if "details.study" in latency else [])
    candidates = [v for v in variants if roles.get(v) == "candidate"]
    ceiling = fmt.finite(rates["details.ceiling"].median()) if "details.ceiling" in rates else None
    title = f"{RATE_UNITS[metric]} per variant" + (f" (share of the {ceiling:.4g} {RATE_UNITS[metric]} ceiling "
                                                   "measured in this run)" if ceiling else "")
    table = Table(title=title, box=box.SIMPLE_HEAD, title_justify="left", pad_edge=False, header_style="bold")
    table.add_column("case", no_wrap=True)
    for v in variants:
        table.add_column(v, justify="right", no_wrap=True)
    for cand in candidates:
        table.add_column(f"{cand}/best peer", justify="right", no_wrap=True)
    labels = fmt.case_labels(latency["case_id"])
    for case, grp in latency.groupby("case_id", sort=False):
        case_rates = rates[rates["case_id"] == case]
        cells = []
        for v in variants:
            rows = case_rates[case_rates["variant"].astype(str) == v]
            if not len(rows):  # no rate: the latency record says why (failed, skipped)
                rows = grp[grp["variant"].astype(str) == v]
            cells.append(_cell(rows) + (" wrong" if (str(case), v) in unjudged else ""))
        ok = case_rates[case_rates["status"] == "ok"]
        peer_rates = {str(v): float(g["value"].median()) for v, g in ok.groupby("variant")
                      if roles.get(str(v)) == "peer" and (str(case), str(v)) not in unjudged and str(v) not in study}
        best = max(peer_rates.items(), key=lambda kv: kv[1]) if peer_rates else None
        for cand in candidates:
            mine = ok[ok["variant"].astype(str) == cand]
            if best is None or not len(mine) or (str(case), cand) in unjudged:
                cells.append(fmt.MISSING)
            else:
                cells.append(f"{float(mine['value'].median()) / best[1]:.2f}x {best[0]}")
        table.add_row(labels.get(str(case), str(case)), *cells)
    return table
