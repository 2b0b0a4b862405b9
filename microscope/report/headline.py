"""The first thing a reviewer reads: one sentence per dimension and (baseline, candidate) pair.

"throughput: triton faster than eager in 6/8 cases (×1.83 to ×3.1); 1 inconclusive, 1 failed".
Sentences come from the statistics engine's verdicts when the run has a comparison table; a dimension
the table does not cover (or a run without a table) gets a sentence from the raw records instead,
which says plainly that it carries no statistical verdict. Text here is plain, unescaped: each writer
escapes it for its own format.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

import numpy as np
import pandas as pd

from microscope.stats.accuracy import seeds_needed_in
from microscope.stats.latency import RELATIVE_LATENCY
from microscope.stats.metrics import (
    FIGURES,
    INTERPRETER_MEMORY,
    INTERPRETER_TIMING,
    NOT_JUDGED,
    SAVED_BYTES,
    SIGNIFICANT_VERDICTS,
    SPEED_ONLY,
    VS_CONTRAST,
)

from . import fmt
from .load import RunData

#: Verdicts that mean "this row changed something": the rows the short table keeps.
#: Rows worth a reader's eye: every verdict that calls a difference, and failed checks.
SIGNIFICANT = ("fail", *sorted(SIGNIFICANT_VERDICTS))
#: Verdicts a reviewer must look at before merging (failed trials and statistics errors included).
REGRESSIONS = ("fail", "failed", "error", "slower", "more", "worse")
IMPROVEMENTS = ("faster", "less", "better")
TRIAL_VERDICTS = ("failed", "skipped")
#: The headline of variants skipped on this device (one line, whatever their number).
SKIPPED_DIMENSION = "not measured here"
#: "info" rows (TFLOP/s, GB/s, tokens/s) are derived from the latency row's calls: no headline of their own.
_FAMILY_BY_VERDICT = {"faster": "latency", "slower": "latency", "pass": "check", "fail": "check",
                      "less": "memory", "more": "memory", "same": "memory", "better": "model",
                      "worse": "model", "non-inferior": "model", "higher": "model", "lower": "model",
                      "info": "info"}


@dataclass(frozen=True)
class Headline:
    """One verdict sentence; ``tone`` (good | bad | warn | neutral) colours the card it becomes."""

    dimension: str
    text: str
    tone: str
    counts: dict[str, int] = field(default_factory=dict)


def row_family(dimension: str, metric: str, verdict: str) -> str:
    """Which vocabulary a comparison row speaks: latency, relative latency (over the run's baseline),
    check (pass/fail), memory, model or info."""
    if metric == RELATIVE_LATENCY:
        return "relative_latency"
    if dimension == "memory" and metric == SAVED_BYTES:
        return "saved_memory"
    if verdict in _FAMILY_BY_VERDICT:
        return _FAMILY_BY_VERDICT[verdict]
    if dimension == "throughput":
        return "latency" if fmt.is_time_metric(metric) else "info"
    if dimension == "memory":
        return "memory"
    if dimension == "accuracy" and metric.endswith("rel_err"):
        return "check"
    return "model"


def ratios(rows: pd.DataFrame) -> pd.Series:
    """candidate / baseline per row: the engine's effect when it is a usable ratio, else from the values.

    Memory rows always use the values: their ``ratio_or_delta`` may be a byte delta.
    """
    if not len(rows):
        return pd.Series(dtype=float, index=rows.index)
    effect = pd.to_numeric(rows["ratio_or_delta"], errors="coerce")
    base = pd.to_numeric(rows["baseline_value"], errors="coerce")
    cand = pd.to_numeric(rows["candidate_value"], errors="coerce")
    usable = np.isfinite(effect) & (effect > 0)
    from_values = (cand / base).where(np.isfinite(base) & np.isfinite(cand) & (base > 0))
    out = effect.where(usable & (rows["dimension"] != "memory"), from_values)
    return out.fillna(effect.where(usable))


def _tone(counts: Counter, all_pass: bool = False) -> str:
    if any(counts[v] for v in ("fail", "failed", "worse", "error")):
        return "bad"
    if any(counts[v] for v in ("slower", "more")):
        return "warn"
    if any(counts[v] for v in IMPROVEMENTS) or all_pass:
        return "good"
    return "neutral"


def _rest(counts: Counter, shown: tuple[str, ...]) -> str:
    order = ["identical", "equivalent", "non-inferior", "same", "inconclusive", "pass", "fail", "faster",
             "slower", "less", "more", "better", "worse", "higher", "lower", NOT_JUDGED, "failed", "error",
             "skipped"]
    extra = [v for v in counts if v not in order]
    parts = [f"{counts[v]} {v or 'no verdict'}" for v in order + sorted(extra)
             if counts[v] and v not in shown]
    return "; " + ", ".join(parts) if parts else ""


def _unit(rows: pd.DataFrame, judged: str = "", n: int | None = None) -> str:
    """What the rows count: cases (one metric per case), metrics (one case), else comparisons;
    singular when ``n`` is 1."""
    if rows["metric"].nunique() <= 1:
        word = f"{judged}cases"
    elif rows["case_id"].nunique() <= 1:
        word = "metrics"
    else:
        word = "comparisons"
    return word[:-1] if n == 1 else word


def _speedups(frame: pd.DataFrame, gain: bool) -> list[float]:
    """Speed factors (>1 = that much faster) of faster rows, or slowdown factors of slower rows."""
    out = []
    for r, metric in zip(ratios(frame), frame["metric"]):
        if not (r > 0):
            continue
        time_like = not fmt.is_rate_metric(str(metric))
        out.append((1 / r if time_like else r) if gain else (r if time_like else 1 / r))
    return out


def _interpreted_note(rows: pd.DataFrame) -> str:
    return f" ({INTERPRETER_TIMING})" if rows["notes"].astype(str).str.contains(INTERPRETER_TIMING).any() else ""


def _latency_sentence(rows: pd.DataFrame, base: str, cand: str, relative: bool = False) -> tuple[str, tuple[str, ...]]:
    """"triton faster than eager in 3/4 cases (×2.1 to ×3)"; ``relative``: the rows compare each side's
    latency over its own run's baseline (``compare``), which the sentence says."""
    if relative:
        cand = f"{cand} (over its run's baseline)"
    judged = rows[rows["verdict"] != NOT_JUDGED]
    n = len(judged)
    unit = _unit(judged if n else rows, "correct " if len(judged) < len(rows) else "", n)
    faster, slower = judged[judged["verdict"] == "faster"], judged[judged["verdict"] == "slower"]
    parts = []
    if len(faster):
        spread = fmt.span(_speedups(faster, True), fmt.times)
        parts.append(f"{cand} faster than {base} in {len(faster)}/{n} {unit}" + (f" ({spread})" if spread else ""))
    if len(slower):
        spread = fmt.span(_speedups(slower, False), fmt.times)
        lead = "slower in" if parts else f"{cand} slower than {base} in"
        parts.append(f"{lead} {len(slower)}/{n} {unit}" + (f" ({spread} slower)" if spread else ""))
    if not parts and n and (judged["verdict"] == "identical").all():  # the same numbers on both sides
        parts.append(f"{cand} vs {base}: identical latency in {n} {unit}")
        return ", ".join(parts) + _interpreted_note(judged), ("faster", "slower", "identical")
    if not parts and n:
        measured = [r for r in ratios(judged) if r > 0]
        spread = fmt.span(measured, fmt.times)
        parts.append(f"{cand} vs {base}: no significant latency difference in {n} {unit}"
                     + (f" (latency ratio {spread})" if spread else ""))
    if not n:
        parts.append(f"{cand} vs {base}: not judged in {len(rows)} {_unit(rows, n=len(rows))}: fails accuracy")
    return ", ".join(parts) + _interpreted_note(judged), ("faster", "slower")


def _best_peer_sentence(rows: pd.DataFrame, cand: str) -> tuple[str, tuple[str, ...]]:
    """"triton vs the fastest correct peer: sdpa_cudnn in 4 cases, slower in 4/4 (×0.87 its speed)"."""
    judged = rows[rows["verdict"] != NOT_JUDGED]
    parts = []
    for peer, grp in judged.groupby("baseline", sort=False):
        counts = Counter(grp["verdict"])
        speed = [1 / r for r in ratios(grp) if r > 0]
        called = [f"{w} in {counts[w]}/{len(grp)}" for w in ("faster", "slower", "equivalent") if counts[w]]
        rest = len(grp) - sum(counts[w] for w in ("faster", "slower", "equivalent"))
        if rest:
            called.append(f"inconclusive in {rest}/{len(grp)}")
        spread = fmt.span(speed, fmt.times)
        parts.append(f"{peer} in {len(grp)} case{'s' if len(grp) != 1 else ''}: " + ", ".join(called)
                     + (f" ({spread} its speed)" if spread else ""))
    speed_only = rows["notes"].astype(str).str.contains("fastest speed-only").any()
    kind = "fastest peer (speed only, different math)" if speed_only else "fastest correct peer"
    text = f"{cand} vs the {kind}: " + ("; ".join(parts) if parts else "none judged")
    if len(judged) < len(rows):
        text += f"; {len(rows) - len(judged)} not judged (fails accuracy)"
    return text + _interpreted_note(judged), ("faster", "slower", "equivalent", "inconclusive", NOT_JUDGED)


def _memory_sentence(rows: pd.DataFrame, base: str, cand: str,
                     what: str = "peak memory") -> tuple[str, tuple[str, ...]]:
    judged = rows[rows["verdict"] != NOT_JUDGED]
    n = len(judged)
    unit = _unit(judged if n else rows, "correct " if len(judged) < len(rows) else "", n)
    parts = []
    for verdict, word in (("less", "less"), ("more", "more")):
        sel = judged[judged["verdict"] == verdict]
        if not len(sel):
            continue
        changes = [r - 1 for r in ratios(sel) if r > 0]
        spread = fmt.span(changes, fmt.pct)
        lead = f"{word} in" if parts else f"{cand} uses {word} {what} than {base} in"
        parts.append(f"{lead} {len(sel)}/{n} {unit}" + (f" ({spread})" if spread else ""))
    if not parts and n:
        parts.append(f"{cand} vs {base}: no {what} difference in {n} {unit}")
    if not n:
        parts.append(f"{cand} vs {base}: not judged in {len(rows)} {_unit(rows, n=len(rows))}: fails accuracy")
    interpreted = rows["notes"].astype(str).str.contains(INTERPRETER_MEMORY, regex=False).any()
    return ", ".join(parts) + (" (not gated: run by the Triton interpreter)" if interpreted else ""), ("less", "more")


def _check_sentence(rows: pd.DataFrame, cand: str) -> tuple[str, tuple[str, ...]]:
    judged = rows[rows["verdict"].isin(["pass", "fail"])]
    passes, fails = int((judged["verdict"] == "pass").sum()), judged[judged["verdict"] == "fail"]
    text = f"{cand}: {passes}/{len(rows)} accuracy checks pass"
    if passes == len(rows) and rows["case_id"].nunique() > 1:
        return text + f" in {rows['case_id'].nunique()} cases", ("pass", "fail")
    if len(fails):
        worst = fails.assign(_v=pd.to_numeric(fails["candidate_value"], errors="coerce")).sort_values(
            "_v", ascending=False, na_position="last").iloc[0]
        text += (f", {len(fails)} fail (worst: {worst['metric']} "
                 f"{fmt.metric_value(str(worst['metric']), worst['candidate_value'])} in {worst['case_id']})")
    cases = rows.groupby("case_id")["verdict"].agg(lambda v: set(v) <= {"pass"})
    if rows["case_id"].nunique() > 1:
        text += f"; all checks pass in {int(cases.sum())}/{len(cases)} cases"
    return text, ("pass", "fail")


def _model_sentence(rows: pd.DataFrame, base: str, cand: str) -> tuple[str, tuple[str, ...]]:
    if len(rows) <= 4:
        items = []
        for _, row in rows.iterrows():
            effect = fmt.finite(row["ratio_or_delta"])
            ci = fmt.ci(row["ci_low"], row["ci_high"])
            extra = "" if effect is None else f" (effect {effect:.3g}, CI {ci})"
            where = f" [{row['case_id']}]" if rows["case_id"].nunique() > 1 else ""
            items.append(f"{row['metric']}{where} {row['verdict'] or 'no verdict'}{extra}")
        return f"{cand} vs {base}: " + "; ".join(items) + _nearest_decision(rows), tuple(rows["verdict"].unique())
    counts = Counter(rows["verdict"])
    verdicts = [v for v in ("better", "worse", "higher", "lower", "identical", "non-inferior", "equivalent",
                            "inconclusive") if counts[v]]
    body = ", ".join(f"{v} in {counts[v]}" for v in verdicts) or "no verdicts"
    return (f"{cand} vs {base}: {body} of {len(rows)} {_unit(rows, n=len(rows))}" + _nearest_decision(rows),
            tuple(verdicts))


def _nearest_decision(rows: pd.DataFrame) -> str:
    """"; val_loss needs about 9 seeds to decide": the inconclusive seed comparison closest to a verdict."""
    open_rows = rows[rows["verdict"] == "inconclusive"]
    needs = [(n, row["metric"]) for _, row in open_rows.iterrows()
             if (n := seeds_needed_in(str(row.get("notes", "")))) is not None]
    if not needs:
        return ""
    n, metric = min(needs, key=lambda item: item[0])
    return f"; {metric} needs about {n} seeds to decide"


def with_baselines(table: pd.DataFrame) -> pd.DataFrame:
    """Rows with an empty baseline (a trial that failed before any comparison) get their plugin's
    baseline, so they count with the same variant pair instead of reading "triton vs ?"."""
    named = table[table["baseline"] != ""]
    if len(named) == len(table) or not len(named):
        return table
    usual = named.groupby("plugin")["baseline"].agg(lambda s: s.mode().iloc[0])
    fill = table["plugin"].map(usual).fillna("")
    return table.assign(baseline=table["baseline"].where(table["baseline"] != "", fill))


def from_comparison(table: pd.DataFrame, ranks: dict[str, int] | None = None) -> list[Headline]:
    """Headlines from the statistics engine's verdicts, grouped by dimension and variant pair; ``ranks``
    (arm -> processes, distributed arms only) adds the scaling efficiency to a train-speed ratio."""
    if table is None or not len(table):
        return []
    table = with_baselines(table)
    labels = fmt.case_labels(table["case_id"])
    table = table.assign(case_id=table["case_id"].map(lambda c: labels.get(str(c), str(c))))
    vs = table["vs"] if "vs" in table.columns else pd.Series("", index=table.index)
    table = table.assign(_family=[
        "best_peer" if str(w) == "best_peer" else row_family(d, m, "" if v == NOT_JUDGED else v)
        for d, m, v, w in zip(table["dimension"], table["metric"], table["verdict"], vs)])
    table = table.assign(_base=table["baseline"].where(table["_family"] != "best_peer", "best peer"))
    plugins = table["plugin"].nunique() > 1
    out = _rate_headlines(table, plugins, ranks or {}) + _figures_shown(table, plugins)
    table = table[table["_family"] != "info"]
    skipped: dict[str, list[str]] = {}
    out.extend(_figures_failed(table, plugins))
    table = table[table["dimension"] != FIGURES]
    # a contrast's row says so before the reason: "contrast: a vs b (...); speed only: ..."
    speed_only = table[(table["verdict"] == "skipped") & table["notes"].astype(str).str.endswith(SPEED_ONLY)]
    if len(speed_only):
        names = ", ".join(dict.fromkeys(str(c) for c in speed_only["candidate"]))
        out.append(Headline("speed only", f"{names}: timed, accuracy not checked (different math)", "neutral", {}))
        table = table.drop(speed_only.index)
    dead = _all_failed(table)
    for (plugin, cand), rows in table[table["candidate"].isin(dead)].groupby(["plugin", "candidate"], sort=False):
        reasons = Counter(str(n) for n in rows["notes"] if str(n))
        why = reasons.most_common(1)[0][0] if reasons else "no reason recorded"
        text = (f"{plugin}: " if plugins else "") + (f"{cand}: every trial failed in {rows['case_id'].nunique()} "
                                                    f"case(s): {fmt.clip(why, 240)}")
        out.append(Headline("failed", text, "bad", {"failed": len(rows)}))
    table = table[~table["candidate"].isin(dead)]
    unjudged = _never_judged(table)
    table = table[~(table["candidate"].isin(unjudged) & table["dimension"].isin(["throughput", "memory"]))]
    for (dim, plugin, base, cand, family), rows in table.groupby(
            ["dimension", "plugin", "_base", "candidate", "_family"], sort=False):
        counts = Counter(rows["verdict"])
        if counts["skipped"] == len(rows):  # one line for every variant this device cannot run
            skipped.setdefault((f"{plugin}: " if plugins else "") + str(cand), []).extend(
                str(n) for n in rows["notes"] if str(n))
            continue
        if sum(counts[v] for v in TRIAL_VERDICTS) == len(rows):
            text = (f"{plugin}: " if plugins else "") + f"{cand} vs {base}: not measured" + _rest(counts, ())
            out.append(Headline(str(dim), text, "bad" if counts["failed"] else "neutral", dict(counts)))
            continue
        if family == "best_peer":
            text, shown = _best_peer_sentence(rows, cand)
        elif family in ("latency", "relative_latency"):
            text, shown = _latency_sentence(rows, base, cand, relative=family == "relative_latency")
        elif family == "memory":
            text, shown = _memory_sentence(rows, base, cand)
        elif family == "saved_memory":
            text, shown = _memory_sentence(rows, base, cand, "memory kept for the backward")
        elif family == "check":
            text, shown = _check_sentence(rows, cand)
            if cand in unjudged:
                text += "; so its speed and memory are not judged"
        else:
            text, shown = _model_sentence(rows, base, cand)
        text = (f"{plugin}: " if plugins else "") + text + _rest(counts, shown)
        all_pass = family == "check" and counts["pass"] == len(rows)
        tone = _tone(counts, all_pass)
        if family in ("latency", "relative_latency", "best_peer") and INTERPRETER_TIMING in text:
            tone = "neutral"  # interpreter timing: shown, not a finding
        if family == "memory" and "run by the Triton interpreter" in text:
            tone = "neutral"  # the interpreter's memory, not the kernel's: shown, not a finding
        if tone != "bad" and (rows["role"] == "peer").all():
            tone = "neutral"  # a peer is compared, not judged
        if "vs" in rows.columns and (rows["vs"] == VS_CONTRAST).all():
            text += " (contrast, not gated)"
            tone = "neutral" if tone == "bad" else tone  # a finding, never a failure: the gate does not read it
        out.append(Headline(str(dim), text, tone, dict(counts)))
    if skipped:
        out.append(skipped_headline(skipped))
    return out


def _figures_failed(table: pd.DataFrame, plugins: bool) -> list[Headline]:
    """One line per plugin whose own ``figures()`` raised: the plugin's failure, not its baseline's."""
    failed = table[(table["dimension"] == FIGURES) & (table["verdict"] == "failed")]
    out = []
    for plugin, rows in failed.groupby("plugin", sort=False):
        why = Counter(str(n) for n in rows["notes"] if str(n)).most_common(1)
        text = (f"{plugin}: " if plugins else "") + (f"figures() failed in {rows['case_id'].nunique()} case(s): "
                                                    f"{fmt.clip(why[0][0] if why else 'no reason recorded', 240)}")
        out.append(Headline(FIGURES, text, "bad", {"failed": len(rows)}))
    return out


def _figures_shown(table: pd.DataFrame, plugins: bool) -> list[Headline]:
    """"figures: triton: recall 0.62 vs eager 1 in 3 cases": a plugin's own figures, untested, in one line
    per candidate (medians over the cases)."""
    shown = table[(table["dimension"] == FIGURES) & (table["verdict"] == "info")]
    out = []
    for (plugin, base, cand), rows in shown.groupby(["plugin", "baseline", "candidate"], sort=False):
        items = []
        for metric, grp in rows.groupby("metric", sort=False):
            c, b = grp["candidate_value"].median(), grp["baseline_value"].median()
            items.append(f"{metric} {c:.3g} vs {base} {b:.3g}")
        text = (f"{plugin}: " if plugins else "") + f"{cand}: " + ", ".join(items) + (
            f" (medians of {rows['case_id'].nunique()} cases)" if rows["case_id"].nunique() > 1 else "")
        out.append(Headline(FIGURES, text, "neutral", {"info": len(rows)}))
    return out


def _never_judged(table: pd.DataFrame) -> set[str]:
    """Variants whose speed and memory rows are all "not judged" (they fail accuracy in every case)."""
    speed = table[table["dimension"].isin(["throughput", "memory"]) & (table["_family"] != "info")]
    verdicts = speed.groupby("candidate")["verdict"].agg(set)
    return {str(v) for v, seen in verdicts.items() if seen <= {NOT_JUDGED, "failed", "skipped"} and NOT_JUDGED in seen}


def _all_failed(table: pd.DataFrame) -> set[str]:
    """Variants none of whose comparisons could be made because every one of their trials failed."""
    verdicts = table.groupby("candidate")["verdict"].agg(set)
    return {str(v) for v, seen in verdicts.items() if seen == {"failed"}}


def skipped_headline(skipped: dict[str, list[str]]) -> Headline:
    """"not measured here: flex, sdpa_cudnn (needs a CUDA device; ...)": every skipped variant in one line."""
    reasons = Counter(r for notes in skipped.values() for r in dict.fromkeys(notes))
    why = "; ".join(r for r, _ in reasons.most_common(3)) or "no reason recorded"
    more = f"; and {len(reasons) - 3} more reason(s)" if len(reasons) > 3 else ""
    return Headline(SKIPPED_DIMENSION, f"{', '.join(skipped)} ({fmt.clip(why, 200)}{more})", "neutral",
                    {"skipped": len(skipped)})


def scaling_efficiency(speedup: float, ranks: int) -> float:
    """Data-parallel scaling efficiency: the speed-up over one process on the same global batches, per rank."""
    return speedup / ranks


def _rate_headlines(table: pd.DataFrame, plugins: bool, ranks: dict[str, int]) -> list[Headline]:
    """Model-level speed (train/prefill/decode tokens/s): rates with no latency row behind them, so
    no verdict either; the ratios are still what a reviewer looks for first, so say them, untested. An arm
    on N ranks against a single-process baseline also gets its scaling efficiency (train ratio / N)."""
    timed = set(table.loc[table["_family"] == "latency", "plugin"])
    rates = table[(table["_family"] == "info") & (table["dimension"] == "throughput") & ~table["plugin"].isin(timed)]
    out = []
    for (plugin, base, cand), rows in rates.groupby(["plugin", "baseline", "candidate"], sort=False):
        per_metric = ratios(rows).groupby(rows["metric"], sort=False).median().dropna()
        if not len(per_metric):
            continue
        items = ", ".join(f"{metric} ×{value:.3g}" for metric, value in per_metric.items())
        n = ranks.get(str(cand), 1)
        if n > 1 and str(base) not in ranks and "train_tokens_per_s" in per_metric:
            items += f"; scaling efficiency {scaling_efficiency(per_metric['train_tokens_per_s'], n):.0%} on {n} ranks"
        text = (f"{plugin}: " if plugins else "") + f"{cand} vs {base}: {items} (rates; no statistical test)"
        out.append(Headline("throughput", text, "neutral", {"info": len(rows)}))
    return out


_ROLE_ORDER = {"baseline": 0, "candidate": 1, "peer": 2}
#: Within a dimension: what needs a look first, "not measured" last.
_TONE_ORDER = {"bad": 0, "warn": 1, "good": 2, "neutral": 3}


def by_role(records: pd.DataFrame) -> list[tuple[str, pd.DataFrame]]:
    """(variant, its records), baseline first, then candidates, then peers, each in record order."""
    groups = list(records.groupby("variant", sort=False))
    return sorted(groups, key=lambda kv: _ROLE_ORDER.get(str(kv[1]["role"].iloc[0]), 3))


def _baselines(records: pd.DataFrame) -> dict[str, str]:
    base = records[records["role"] == "baseline"]
    return {str(p): str(g["variant"].iloc[0]) for p, g in base.groupby("plugin")}


def _trial_tail(rows: pd.DataFrame) -> str:
    counts = Counter(rows["status"])
    parts = [f"{counts[s]} {s}" for s in TRIAL_VERDICTS if counts[s]]
    return "; " + ", ".join(parts) if parts else ""


def _geomean(values: list[float]) -> float | None:
    vals = [v for v in values if v and v > 0 and math.isfinite(v)]
    return math.exp(sum(map(math.log, vals)) / len(vals)) if vals else None


def _ratio_sentence(dim: str, records: pd.DataFrame, metric: str, plugin: str, base: str) -> list[Headline]:
    """Raw candidate/baseline ratios per case for one metric (no statistics, and it says so)."""
    ok = records[(records["status"] == "ok") & (records["metric"] == metric)]
    per = ok.groupby(["variant", "case_id"])["value"].median()
    out = []
    for variant, rows in by_role(records):
        if variant == base:
            continue
        ratios = [per[(variant, c)] / per[(base, c)] for c in rows["case_id"].unique()
                  if (variant, c) in per and (base, c) in per and per[(base, c)] > 0]
        tail = _trial_tail(rows)
        tone = "bad" if (rows["status"] == "failed").any() else "neutral"
        if not ratios:
            if tail:
                out.append(Headline(dim, f"{variant} vs {base}: not measured{tail}", tone))
            continue
        mid = _geomean(ratios) if dim == "throughput" else float(pd.Series(ratios).median())
        if dim == "throughput":
            text = (f"{variant} vs {base}: latency {fmt.times(mid)} the baseline's (geometric mean over "
                    f"{len(ratios)} cases, {fmt.span(ratios, fmt.times)}; above 1 is slower); "
                    "no statistical verdict")
        else:
            text = (f"{variant} vs {base}: peak memory {fmt.pct((mid or 0) - 1)} (median over {len(ratios)} "
                    f"cases, {fmt.span([r - 1 for r in ratios], fmt.pct)}); no statistical verdict")
        out.append(Headline(dim, (f"{plugin}: " if plugin else "") + text + tail, tone))
    return out


def from_records(records: pd.DataFrame, dimensions: list[str]) -> list[Headline]:
    """Headlines for dimensions without verdicts: pass/fail from the records, raw ratios otherwise."""
    out: list[Headline] = []
    baselines = _baselines(records)
    multi = records["plugin"].nunique() > 1
    for dim in dimensions:
        drows = records[records["dimension"] == dim]
        for plugin, prows in drows.groupby("plugin", sort=False):
            tag = str(plugin) if multi else ""
            base = baselines.get(str(plugin))
            if dim == "accuracy":
                out += _accuracy_from_records(prows, tag)
            elif dim in ("throughput", "memory") and base:
                out += _ratio_sentence(dim, prows, "latency_ms" if dim == "throughput" else "peak_bytes",
                                       tag, base)
            else:
                metrics = ", ".join(sorted(prows["metric"].unique())[:6])
                variants = ", ".join(prows["variant"].unique()[:6])
                n_ok = int((prows["status"] == "ok").sum())
                text = (f"{tag + ': ' if tag else ''}{n_ok} measurements of {metrics} for {variants}; "
                        f"no statistical verdict{_trial_tail(prows)}")
                out.append(Headline(dim, text, "bad" if (prows["status"] == "failed").any() else "neutral"))
    return out


def _accuracy_from_records(rows: pd.DataFrame, tag: str) -> list[Headline]:
    out = []
    for variant, vrows in by_role(rows):
        judged = vrows[(vrows["status"] == "ok") & vrows["passed"].notna()]
        flags = judged["passed"].map(bool)  # an object column of True/False
        passes = int(flags.sum())
        fails = judged[~flags]
        failed = vrows[vrows["status"] == "failed"]
        if not len(judged) and not len(failed):
            continue
        prefix = f"{tag}: " if tag else ""
        text = f"{prefix}{variant}: {passes}/{len(judged) + len(failed)} accuracy checks pass"
        if len(fails):
            worst = fails.sort_values("value", ascending=False, na_position="last").iloc[0]
            text += (f", {len(fails)} fail (worst: {worst['metric']} "
                     f"{fmt.metric_value(str(worst['metric']), worst['value'])} in {worst['case_id']})")
        text += _trial_tail(vrows)
        counts = Counter({"pass": passes, "fail": len(fails), "failed": len(failed)})
        out.append(Headline("accuracy", text, _tone(counts, all_pass=passes > 0), dict(counts)))
    return out


def _ranks(records: pd.DataFrame) -> dict[str, int]:
    """Processes per distributed arm, from its rank records' ``details.ranks``."""
    if not len(records) or "details.ranks" not in records.columns:
        return {}
    known = records.dropna(subset=["details.ranks"])
    return {str(v): int(n) for v, n in zip(known["variant"], known["details.ranks"])}


def headlines(run: RunData) -> list[Headline]:
    """Every dimension of the run gets at least one sentence (verdicts where they exist), in the design's
    dimension order and, within a dimension, regressions first."""
    out = from_comparison(run.comparison, _ranks(run.records)) if run.comparison is not None else []
    covered = {h.dimension for h in out}
    if run.comparison is not None and len(run.comparison):
        # a dimension whose rows are all "not judged" (wrong variants) has its say in the accuracy line;
        # raw speed ratios of a wrong kernel are not a result to headline
        covered |= set(run.comparison["dimension"])
    missing = [d for d in run.dimensions if d not in covered]
    if len(run.records):
        out += from_records(run.records, missing)
    order = {d: i for i, d in enumerate(run.dimensions)}
    return sorted(out, key=lambda h: (order.get(h.dimension, len(order)), _TONE_ORDER.get(h.tone, 4)))
