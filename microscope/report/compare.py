"""``microscope compare A B``: how side B differs from side A, with the run as the unit.

A side is one run folder (``results/<run-id>``), a folder of run folders (repeats of one config, e.g.
made by ``compare --repeat``), or a list of run folders. For every plugin/variant/case/metric measured
on both sides, each run contributes one run-level value (its median latency, its peak memory, its mean
over seeds), and ``microscope.stats.between_runs`` compares the two samples with the between-run noise:
never the rounds of one process against the rounds of another, which are not paired. With one run per
side the noise is unknown unless the history store knows it for this machine, so such rows say
"inconclusive" and how to get a verdict (``--repeat``). Accuracy checks compare B's pass/fail with A's;
TFLOP/s and GB/s are left out (they restate the latency).

Runs of different plugins, devices, case grids or corpora are refused (``CompareError``, exit 2) unless
``force``: their numbers do not measure the same thing. The result is a ``RunData`` whose rows read
"triton (B)" vs "triton (A)", rendered by the ordinary Markdown and HTML writers.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from microscope.gate import EXIT_FAILED, EXIT_OK, GateResult
from microscope.stats.between_runs import compare_between_runs
from microscope.stats.latency import RELATIVE_LATENCY, paired_round_ratios
from microscope.stats.metrics import NOT_JUDGED, SIGNIFICANT_VERDICTS, higher_is_better, memory_verdict, metric_kind
from microscope.stats.multiple import holm as engine_holm
from microscope.stats.table import incorrect_variants
from microscope.store.comparison import COMPARISON_COLUMNS, normalise_comparison

from . import fmt
from .load import ReportError, RunData, load_run

DEFAULT_ALPHA, DEFAULT_MIN_BAND = 0.05, 0.01
DERIVED_METRICS = ("tflops", "gbps")
ENV_KEYS_WARNED = ("device_name", "python", "torch", "triton", "cuda", "capability", "interpreter",
                   "config_hash")
#: Verdicts of B against A that a CI job should fail on (peers excepted: they are not our code).
REGRESSIONS = ("slower", "more", "worse")

__all__ = ["CompareError", "compare_gate", "compare_runs", "compare_sides", "load_side"]


class CompareError(ReportError):
    """Two sides that must not be compared (different plugins, devices, cases or corpora) without ``force``."""


@dataclass
class Measured:
    """One (plugin, variant, case, dimension, metric) on one side: one value per run."""

    role: str = ""
    values: list[float] = field(default_factory=list)
    passed: list[bool] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)
    higher_is_better: bool | None = None


def tag(variant: str, label: str) -> str:
    return f"{variant} ({label})"


def load_side(path: Path) -> list[RunData]:
    """The runs of one side: a run folder, or a folder whose sub-folders are runs."""
    path = Path(path)
    if (path / "records.jsonl").is_file() or path.name == "records.jsonl":
        return [load_run(path)]
    runs = sorted(p for p in path.iterdir() if (p / "records.jsonl").is_file()) if path.is_dir() else []
    if not runs:
        raise ReportError(f"{path}: neither a run folder (with records.jsonl) nor a folder of run folders")
    return [load_run(p) for p in runs]


def _run_values(run: RunData) -> dict[tuple[str, ...], Measured]:
    """One value per measurement of one run (median over seeds/records), its pass flags and failures."""
    out: dict[tuple[str, ...], Measured] = {}
    rec = run.records
    if not len(rec):
        return out
    for key, grp in rec.groupby(["plugin", "variant", "case_id", "dimension", "metric"], sort=False):
        if key[4] in DERIVED_METRICS:
            continue
        m = out.setdefault(tuple(str(k) for k in key), Measured(role=str(grp["role"].iloc[0])))
        ok = grp[grp["status"] == "ok"]
        m.failed += [str(r or "no reason recorded") for r in grp.loc[grp["status"] == "failed", "reason"]]
        m.skipped += [str(r or "no reason recorded") for r in grp.loc[grp["status"] == "skipped", "reason"]]
        values = pd.to_numeric(ok["value"], errors="coerce").dropna()
        if len(values):
            m.values.append(float(values.mean()) if key[3] in ("accuracy", "stability", "generalization")
                            else float(values.median()))
        m.passed += [bool(v) for v in ok["passed"] if isinstance(v, (bool, np.bool_))]
        if "details.higher_is_better" in grp.columns:
            hib = grp["details.higher_is_better"].dropna()
            if len(hib):
                m.higher_is_better = bool(hib.iloc[0])
    return out


def _rounds(grp: pd.DataFrame) -> np.ndarray | None:
    """The per-round medians of a variant's one ok latency record, or None."""
    ok = grp[grp["status"] == "ok"]
    if len(ok) != 1 or "details.rounds" not in ok.columns or not isinstance(ok["details.rounds"].iloc[0], list):
        return None
    x = pd.to_numeric(pd.Series(ok["details.rounds"].iloc[0]), errors="coerce").to_numpy(dtype=float)
    return x if np.all(np.isfinite(x) & (x > 0)) else None


def _relative_values(run: RunData) -> dict[tuple[str, ...], Measured]:
    """``latency_vs_baseline`` per non-baseline latency: its per-round latency over the baseline's in the same
    interleaved rounds, one median per run. Load that slows the machine slows both variants of a round, so
    between runs this ratio moves far less than either latency; it is the row that finds a change to the
    candidate alone when the machine is busy (it also moves when only the baseline changed)."""
    out: dict[tuple[str, ...], Measured] = {}
    rec = run.records
    if not len(rec) or "details.rounds" not in rec.columns:
        return out
    latency = rec[[metric_kind(d, m) == "latency" and m != RELATIVE_LATENCY
                   for d, m in zip(rec["dimension"], rec["metric"])]]
    for (plugin, case, dim, _), grp in latency.groupby(["plugin", "case_id", "dimension", "metric"], sort=False):
        base = grp[grp["role"] == "baseline"]
        if base["variant"].nunique() != 1:
            continue
        base_rounds = _rounds(base)
        for variant, mine in grp[grp["role"] != "baseline"].groupby("variant", sort=False):
            ratios = paired_round_ratios(_rounds(mine), base_rounds)
            key = (str(plugin), str(variant), str(case), str(dim), RELATIVE_LATENCY)
            if ratios is not None and key not in out:  # the first latency metric of the case
                out[key] = Measured(role=str(mine["role"].iloc[0]), values=[float(np.median(ratios))])
    return out


def _side_values(side: Sequence[RunData]) -> dict[tuple[str, ...], Measured]:
    merged: dict[tuple[str, ...], Measured] = {}
    for run in side:
        for key, m in (_run_values(run) | _relative_values(run)).items():
            into = merged.setdefault(key, Measured(role=m.role, higher_is_better=m.higher_is_better))
            into.values += m.values
            into.passed += m.passed
            into.failed += m.failed
            into.skipped += m.skipped
    return merged


def _missing_row(row: dict[str, Any], a: Measured, b: Measured) -> dict[str, Any]:
    why = [f"{lbl}: {m.failed[0] if m.failed else (m.skipped[0] if m.skipped else 'no value')}"
           for lbl, m in (("A", a), ("B", b)) if not m.values]
    failed = (not a.values and a.failed) or (not b.values and b.failed)
    return row | {"verdict": "failed" if failed else "skipped", "notes": "; ".join(why)}


def _row(key: tuple[str, ...], a: Measured, b: Measured, alpha: float, min_band: float,
         history_sigma: dict[tuple[str, ...], float]) -> dict[str, Any]:
    plugin, variant, case, dim, metric = key
    row: dict[str, Any] = {"plugin": plugin, "case_id": case, "dimension": dim, "metric": metric,
                           "baseline": tag(variant, "A"), "candidate": tag(variant, "B"), "role": b.role or a.role,
                           "vs": "baseline", "gated": (b.role or a.role) != "peer"}
    if not a.values or not b.values:
        return _missing_row(row, a, b)
    va, vb = float(np.median(a.values)), float(np.median(b.values))
    row |= {"baseline_value": va, "candidate_value": vb, "n": min(len(a.values), len(b.values))}
    if dim == "accuracy" and (a.passed or b.passed):
        verdict = "pass" if b.passed and all(b.passed) else "fail"
        was = "passed" if a.passed and all(a.passed) else "failed"
        note = f"A {was}" + ("; regression: passed in A" if verdict == "fail" and was == "passed" else "")
        return row | {"verdict": verdict, "ratio_or_delta": vb / va if va else math.nan, "notes": note}
    time_like = dim == "throughput" and fmt.is_time_metric(metric)
    if (dim == "memory" or metric.endswith("bytes")) and va > 0 and np.ptp(a.values) == 0 and np.ptp(b.values) == 0:
        # every run measured the same peak on each side: deterministic, judged as within a run
        ratio = vb / va
        return row | {"ratio_or_delta": ratio, "ci_low": ratio, "ci_high": ratio, "p": math.nan,
                      "verdict": memory_verdict(ratio), "notes": f"peak memory the same in every run of each side "
                                                                 f"({len(a.values)} vs {len(b.values)}); "
                                                                 "deterministic, no test"}
    log = time_like or dim == "memory" or metric.endswith("bytes") or fmt.is_rate_metric(metric)
    res = compare_between_runs(a.values, b.values, alpha=alpha, min_band=min_band, log=log,
                               history_sigma=history_sigma.get(key))
    verdict = res.verdict
    if dim == "memory" or metric.endswith("bytes"):
        verdict = {"faster": "less", "slower": "more", "equivalent": "same", "identical": "same"}.get(verdict, verdict)
    elif log and not time_like:  # a rate: B / A above 1 is higher
        verdict = {"faster": "lower", "slower": "higher"}.get(verdict, verdict)
    if verdict in ("higher", "lower") and not time_like:
        hib = b.higher_is_better if b.higher_is_better is not None else higher_is_better(metric)
        direction_known = b.higher_is_better is not None or hib or any(
            h in metric.lower() for h in ("loss", "err", "ppl", "perplex", "nan", "spike", "bytes"))
        if direction_known:
            verdict = "better" if (verdict == "higher") == hib else "worse"
    effect = "ratio B/A of geometric means" if log else "difference B - A of means"
    noise = {"repeats": "between-run noise from the repeats", "history": "between-run noise from the history",
             "none": "between-run noise unknown"}[res.noise_source]
    notes = [f"{effect} over {res.n_a} vs {res.n_b} run(s); {noise}"
             + (f"; band +-{res.tau:.1%}" if log and math.isfinite(res.tau) else "")] + list(res.notes)
    return row | {"ratio_or_delta": res.effect, "ci_low": res.ci_low, "ci_high": res.ci_high, "p": res.p,
                  "verdict": verdict, "notes": "; ".join(notes)}


def _not_judged_where_b_is_wrong(rows: list[dict[str, Any]], side_b: Sequence[RunData]) -> None:
    """B's speed and memory in a case where B fails accuracy are no result (as within a run)."""
    wrong: dict[tuple[str, str, str], str] = {}
    for run in side_b:
        wrong |= incorrect_variants(run.records)
    for row in rows:
        variant = row["candidate"][: -len(" (B)")]
        why = wrong.get((row["plugin"], row["case_id"], variant))
        if why and row["dimension"] in ("throughput", "memory") and row.get("verdict") not in ("failed", "skipped"):
            row["verdict"], row["p"] = NOT_JUDGED, math.nan
            row["notes"] = f"not judged: B fails accuracy ({why}); " + str(row.get("notes", ""))


def holm(pvalues: pd.Series) -> pd.Series:
    """Holm-adjusted p-values (NaN stays NaN), by the statistics engine's own Holm."""
    p = pvalues.dropna()
    return pd.Series(engine_holm(p.to_numpy(dtype=float)), index=p.index).reindex(pvalues.index)


def adjust(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Holm over every tested row; a significant verdict that does not survive it becomes inconclusive."""
    table = table.assign(p_adj=holm(table["p"]))
    lost = table["verdict"].isin(SIGNIFICANT_VERDICTS) & (
        table["p_adj"] >= alpha)
    tested = int(table["p"].notna().sum())
    for i in table.index[lost]:
        why = (f"{table.at[i, 'verdict']} at raw p={table.at[i, 'p']:.3g} but p_adj={table.at[i, 'p_adj']:.3g} "
               f">= {alpha:g} after Holm over {tested} tests: inconclusive")
        table.at[i, "notes"] = "; ".join(n for n in (table.at[i, "notes"], why) if n)
        table.at[i, "verdict"] = "inconclusive"
    return table


def _grid(side: Sequence[RunData]) -> dict[str, set[str]]:
    grid: dict[str, set[str]] = {}
    for run in side:
        for plugin, grp in run.records.groupby("plugin"):
            grid.setdefault(str(plugin), set()).update(str(c) for c in grp["case_id"])
    return grid


def _devices(side: Sequence[RunData]) -> set[str]:
    return {str(d) for run in side for d in run.records["device"].dropna().unique()}


def comparability(side_a: Sequence[RunData], side_b: Sequence[RunData], force: bool) -> list[str]:
    """Refuse sides that measure different things (unless forced); warn about different versions."""
    problems, notes = [], []
    grid_a, grid_b = _grid(side_a), _grid(side_b)
    if set(grid_a) != set(grid_b):
        problems.append(f"different plugins (A: {', '.join(sorted(grid_a)) or 'none'}; "
                        f"B: {', '.join(sorted(grid_b)) or 'none'})")
    else:
        for plugin in grid_a:
            if grid_a[plugin] != grid_b[plugin]:
                only_a, only_b = sorted(grid_a[plugin] - grid_b[plugin]), sorted(grid_b[plugin] - grid_a[plugin])
                problems.append(f"{plugin}: different case grids (only in A: {', '.join(only_a[:3]) or '-'}; "
                                f"only in B: {', '.join(only_b[:3]) or '-'})")
    if _devices(side_a) != _devices(side_b):
        problems.append(f"different devices (A: {', '.join(sorted(_devices(side_a)))}; "
                        f"B: {', '.join(sorted(_devices(side_b)))})")
    corpora = [{str(r.env.get("corpus_hash")) for r in side if r.env.get("corpus_hash")} for side in (side_a, side_b)]
    if corpora[0] and corpora[1] and corpora[0] != corpora[1]:
        problems.append(f"different corpora (corpus_hash {', '.join(sorted(corpora[0]))} vs "
                        f"{', '.join(sorted(corpora[1]))}): their numbers are not comparable")
    if problems and not force:
        raise CompareError("refusing to compare: " + "; ".join(problems) + ". Pass --force to compare anyway.")
    notes += [f"{p}; compared anyway (forced)" for p in problems]
    env_a, env_b = side_a[-1].env, side_b[-1].env
    for key in ENV_KEYS_WARNED:
        va, vb = env_a.get(key), env_b.get(key)
        if va is not None and vb is not None and str(va) != str(vb):
            what = "configs" if key == "config_hash" else key
            notes.append(f"{what} differ{'s' if key != 'config_hash' else ''}: A {va}, B {vb}")
    return notes


def stats_params(run: RunData) -> tuple[float, float]:
    """alpha and min_band from the run's config ``stats:`` section, else the defaults."""
    try:
        stats = (yaml.safe_load(run.config_text or "") or {}).get("stats") or {}
        return float(stats.get("alpha", DEFAULT_ALPHA)), float(stats.get("min_band", DEFAULT_MIN_BAND))
    except (yaml.YAMLError, AttributeError, TypeError, ValueError):
        return DEFAULT_ALPHA, DEFAULT_MIN_BAND


def _only(keys: set[tuple[str, ...]], label: str) -> str:
    examples = ", ".join("/".join(k[1:3]) + f" {k[4]}" for k in sorted(keys)[:3])
    return f"{len(keys)} measurement(s) only in {label} (e.g. {examples}); not compared"


def _label(side: Sequence[RunData]) -> str:
    return side[0].run_id if len(side) == 1 else f"{len(side)} runs ({side[0].run_id} ...)"


def history_noise(history: Path, side: Sequence[RunData],
                  keys: Sequence[tuple[str, ...]]) -> dict[tuple[str, ...], float]:
    """The run-to-run noise of each measurement on the machine of ``side``'s last run, from the history
    store (``History.between_run_noise``); measurements with too few runs there are left out."""
    from microscope.env import machine_fingerprint
    from microscope.store.history import History
    from microscope.store.history_schema import HistoryError

    fingerprint = machine_fingerprint(side[-1].env)
    try:
        with History.open(history) as store:
            if fingerprint not in store.machines():
                return {}
            out = {}
            for key in keys:
                plugin, variant, case, dim, metric = key
                sigma = store.between_run_noise(plugin, variant, case, metric, fingerprint, dimension=dim)
                if sigma is not None:
                    out[key] = sigma
            return out
    except HistoryError as exc:
        raise ReportError(str(exc)) from exc


def compare_sides(side_a: Sequence[RunData], side_b: Sequence[RunData], *, alpha: float | None = None,
                  min_band: float | None = None, force: bool = False,
                  history_sigma: dict[tuple[str, ...], float] | None = None, history: Path | None = None) -> RunData:
    """B against A for everything both sides measured, as a ``RunData`` the report writers render.

    ``history``: a history store whose runs of this machine give the between-run noise (needed when a
    side has a single run); ``history_sigma`` gives it directly instead."""
    notes = comparability(side_a, side_b, force)
    cfg_alpha, cfg_band = stats_params(side_b[-1])
    alpha = cfg_alpha if alpha is None else alpha
    min_band = cfg_band if min_band is None else min_band
    ma, mb = _side_values(side_a), _side_values(side_b)
    if history is not None and history_sigma is None:
        history_sigma = history_noise(history, side_b, [k for k in mb if k in ma])
        if not history_sigma:
            notes.append(f"{history}: no between-run noise for these measurements on this machine "
                         "(too few runs of it there)")
    rows = [_row(k, ma[k], mb[k], alpha, min_band, history_sigma or {}) for k in mb if k in ma]
    _not_judged_where_b_is_wrong(rows, side_b)
    for keys, label in ((set(ma) - set(mb), "A"), (set(mb) - set(ma), "B")):
        if keys:
            notes.append(_only(keys, label))
    table = adjust(normalise_comparison(pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))), alpha)
    for label, side in (("A", side_a), ("B", side_b)):
        notes += [f"{label}: {n}" for run in side for n in run.notes]
    records = pd.concat([run.records.assign(variant=run.records["variant"].map(lambda v, lbl=label: tag(v, lbl)))
                         for label, side in (("A", side_a), ("B", side_b)) for run in side], ignore_index=True)
    a_cfg, b_cfg = side_a[-1].config_text or "", side_b[-1].config_text or ""
    config = b_cfg if a_cfg == b_cfg else (f"# A: {side_a[-1].run_id}\n{a_cfg or '(none)'}\n\n"
                                           f"# B: {side_b[-1].run_id}\n{b_cfg or '(none)'}")
    title = f"microscope compare: B = {_label(side_b)} vs A = {_label(side_a)}"
    return RunData(run_id=f"{side_a[0].run_id}-vs-{side_b[0].run_id}", records=records, comparison=table,
                   envs={"A": side_a[-1].env, "B": side_b[-1].env}, config_text=config, notes=notes, title=title)


def compare_runs(run_a: Path, run_b: Path, *, alpha: float | None = None, min_band: float | None = None,
                 force: bool = False, history_sigma: dict[tuple[str, ...], float] | None = None,
                 history: Path | None = None) -> RunData:
    """``compare_sides`` of two paths, each a run folder or a folder of run folders."""
    return compare_sides(load_side(Path(run_a)), load_side(Path(run_b)), alpha=alpha, min_band=min_band,
                         force=force, history_sigma=history_sigma, history=history)


def compare_gate(table: pd.DataFrame | None) -> GateResult:
    """Exit 1 when B regressed against A (slower, more memory, worse, or an accuracy check that passed in A
    now fails), for candidates and baselines; peers are not our code."""
    out = GateResult(EXIT_OK)
    if table is None or not len(table):
        return out
    ours = table[table["role"] != "peer"]
    acc = ours[(ours["verdict"] == "fail") & ours["notes"].astype(str).str.contains("regression: passed in A")]
    for _, row in acc.iterrows():
        out.failures.append(f"{row['candidate']} fails {row['metric']} in {row['case_id'] or 'the run'} (passed in A)")
    for verdict in REGRESSIONS:
        bad = ours[ours["verdict"] == verdict]
        for cand, grp in bad.groupby("candidate", sort=False):
            out.failures.append(f"{cand} {verdict} than A in {len(grp)} comparison(s) "
                                f"(e.g. {grp.iloc[0]['metric']} {fmt.times(grp.iloc[0]['ratio_or_delta'])})")
    tested = table[table["p"].notna()]
    out.held.append(f"{len(tested)} tested comparison(s), no regression")
    out.exit_code = EXIT_FAILED if out.failures else EXIT_OK
    return out
