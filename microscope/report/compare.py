"""``microscope compare RUN_A RUN_B``: what changed between two runs (say main and a branch).

For every plugin/variant/case/metric measured in both runs, B is compared with A: latency with the
same statistics as within a run (the statistics engine's ``compare_latency`` on the per-round
medians, unpaired because round r of one run has nothing to do with round r of the other; a
Mann-Whitney U with a bootstrap CI of the ratio of medians when the engine is not importable),
accuracy as B's pass/fail with the ratio of worst errors, peak memory as less/more/same against the
band, anything else as higher/lower/same when both runs hold several values. TFLOP/s and GB/s are
left out: they are the plugin's FLOP/byte counts divided by the latency, so they would repeat the
latency verdict.

The result is a ``RunData`` whose comparison rows read "triton (B)" vs "triton (A)" and whose records
are both runs' records with the variants renamed that way, so the ordinary Markdown and HTML writers
render it. Runs on different corpora are refused (their numbers are not comparable) unless forced;
different devices, library versions or configs are compared with a warning.
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import yaml

from . import fmt
from .load import COMPARISON_COLUMNS, ReportError, RunData, load_run, normalise_comparison

DEFAULT_ALPHA, DEFAULT_MIN_BAND = 0.05, 0.01
DERIVED_METRICS = ("tflops", "gbps")
ENV_KEYS_WARNED = ("device_name", "python", "torch", "triton", "cuda", "capability", "interpreter",
                   "config_hash")
N_BOOT = 2_000


class CompareError(ReportError):
    """Two runs that must not be compared (different corpora) without ``force=True``."""


@dataclass
class Measured:
    """One (plugin, variant, case, dimension, metric) of one run, over its seeds."""

    role: str = ""
    values: list[float] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)
    passed: list[bool] = field(default_factory=list)
    failed: list[str] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def tag(variant: str, label: str) -> str:
    return f"{variant} ({label})"


def _measurements(records: pd.DataFrame) -> dict[tuple[str, ...], Measured]:
    out: dict[tuple[str, ...], Measured] = {}
    if not len(records):
        return out
    has_rounds = "details.rounds" in records.columns
    for r in records.to_dict("records"):
        if r["metric"] in DERIVED_METRICS:
            continue
        key = (r["plugin"], r["variant"], r["case_id"], r["dimension"], r["metric"])
        m = out.setdefault(key, Measured(role=str(r["role"])))
        if r["status"] == "failed":
            m.failed.append(str(r.get("reason") or "no reason recorded"))
        elif r["status"] == "skipped":
            m.skipped.append(str(r.get("reason") or "no reason recorded"))
        else:
            value = fmt.finite(r["value"])
            if value is not None:
                m.values.append(value)
            if has_rounds and isinstance(r.get("details.rounds"), list) and not m.rounds:
                m.rounds = [x for x in (fmt.finite(v) for v in r["details.rounds"]) if x is not None]
            if isinstance(r.get("passed"), bool):
                m.passed.append(r["passed"])
    return out


def engine_compare_latency() -> Callable[..., Any] | None:
    """The statistics engine's ``compare_latency`` if it is importable, else None (use the fallback)."""
    try:
        from microscope import stats
    except ImportError:
        return None
    fn = getattr(stats, "compare_latency", None)
    if fn is None:
        try:
            from microscope.stats import latency

            fn = getattr(latency, "compare_latency", None)
        except ImportError:
            return None
    return fn if callable(fn) else None


def fallback_latency(base: list[float], cand: list[float], alpha: float, min_band: float) -> dict[str, Any]:
    """Mann-Whitney U on the round medians, ratio of medians with a seeded bootstrap CI, band = min_band."""
    from scipy.stats import mannwhitneyu

    b, c = np.asarray(base, float), np.asarray(cand, float)
    b, c = b[np.isfinite(b) & (b > 0)], c[np.isfinite(c) & (c > 0)]
    nan = float("nan")
    out: dict[str, Any] = {
        "base_median": float(np.median(b)) if b.size else nan, "cand_median": float(np.median(c)) if c.size else nan,
        "n_base": int(b.size), "n_cand": int(c.size),
        "notes": ["fallback statistics: Mann-Whitney U, band = min_band (no A/A estimate)"]}
    if b.size < 2 or c.size < 2:
        out.update(verdict="inconclusive", effect=out["cand_median"] / out["base_median"] if b.size and c.size
                   else nan, ci_low=nan, ci_high=nan, p=nan)
        out["notes"].append("too few rounds to compare (need >= 2 per run)")
        return out
    rng = np.random.default_rng(0)
    reps = np.median(rng.choice(c, (N_BOOT, c.size)), axis=1) / np.median(rng.choice(b, (N_BOOT, b.size)), axis=1)
    lo, hi = (float(x) for x in np.percentile(reps, [100 * alpha / 2, 100 * (1 - alpha / 2)]))
    p = float(mannwhitneyu(c, b, alternative="two-sided").pvalue)
    if p < alpha and hi < 1 - min_band:
        verdict = "faster"
    elif p < alpha and lo > 1 + min_band:
        verdict = "slower"
    elif 1 - min_band < lo and hi < 1 + min_band:
        verdict = "equivalent"
    else:
        verdict = "inconclusive"
    out.update(verdict=verdict, effect=out["cand_median"] / out["base_median"], ci_low=lo, ci_high=hi, p=p)
    return out


def _engine_latency(fn: Callable[..., Any], base: list[float], cand: list[float], alpha: float,
                    min_band: float) -> dict[str, Any]:
    kwargs: dict[str, Any] = {"alpha": alpha, "min_band": min_band}
    if "paired" in inspect.signature(fn).parameters:
        kwargs["paired"] = False  # rounds of two different runs are not paired
    res = fn(base, cand, **kwargs)
    get = res.get if isinstance(res, dict) else (lambda k, d=None: getattr(res, k, d))
    return {"verdict": get("verdict", "inconclusive"), "effect": get("effect", get("ratio")),
            "ci_low": get("ci_low"), "ci_high": get("ci_high"), "p": get("p"),
            "base_median": get("base_median"), "cand_median": get("cand_median"),
            "n_base": get("n_base", len(base)), "n_cand": get("n_cand", len(cand)),
            "notes": list(get("notes", ()) or ())}


def _row(key: tuple[str, ...], a: Measured, b: Measured, alpha: float, min_band: float,
         latency_fn: Callable[..., Any] | None) -> dict[str, Any]:
    plugin, variant, case, dim, metric = key
    row: dict[str, Any] = {"plugin": plugin, "case_id": case, "dimension": dim, "metric": metric,
                           "baseline": tag(variant, "A"), "candidate": tag(variant, "B"),
                           "role": b.role or a.role}
    if not a.values or not b.values:
        why = [f"{lbl}: {m.failed[0] if m.failed else (m.skipped[0] if m.skipped else 'no value')}"
               for lbl, m in (("A", a), ("B", b)) if not m.values]
        failed = (not a.values and a.failed) or (not b.values and b.failed)
        return row | {"verdict": "failed" if failed else "skipped", "notes": "; ".join(why)}
    va, vb = (max(a.values), max(b.values)) if dim in ("accuracy", "memory") else (
        float(np.mean(a.values)), float(np.mean(b.values)))
    ratio = vb / va if va else float("nan")
    row |= {"baseline_value": va, "candidate_value": vb, "ratio_or_delta": ratio, "n": min(len(a.values),
                                                                                             len(b.values))}
    if a.rounds and b.rounds and (dim == "throughput" or fmt.is_time_metric(metric)):
        res = (_engine_latency(latency_fn, a.rounds, b.rounds, alpha, min_band) if latency_fn
               else fallback_latency(a.rounds, b.rounds, alpha, min_band))
        return row | {"baseline_value": res["base_median"], "candidate_value": res["cand_median"],
                      "ratio_or_delta": res["effect"], "ci_low": res["ci_low"], "ci_high": res["ci_high"],
                      "p": res["p"], "verdict": res["verdict"], "n": min(res["n_base"], res["n_cand"]),
                      "notes": "; ".join(map(str, res["notes"]))}
    if dim == "accuracy" and (a.passed or b.passed):
        verdict = "pass" if b.passed and all(b.passed) else "fail"
        was = "passed" if a.passed and all(a.passed) else "failed"
        note = f"A {was}" + ("; regression: passed in A" if verdict == "fail" and was == "passed" else "")
        return row | {"verdict": verdict, "notes": note}
    if dim == "memory":
        verdict = "same" if abs(ratio - 1) <= min_band else ("less" if ratio < 1 else "more")
        return row | {"verdict": verdict, "notes": f"peak over seeds; band +-{min_band:.0%}"}
    if len(a.values) >= 2 and len(b.values) >= 2:
        from scipy.stats import mannwhitneyu

        p = float(mannwhitneyu(b.values, a.values, alternative="two-sided").pvalue)
        verdict = ("same" if abs(ratio - 1) <= min_band else
                   ("higher" if ratio > 1 else "lower") if p < alpha else "inconclusive")
        return row | {"p": p, "verdict": verdict, "notes": "Mann-Whitney U over seeds"}
    verdict = "same" if abs(ratio - 1) <= min_band else "inconclusive"
    return row | {"verdict": verdict, "notes": "one value per run: no test"}


def holm(pvalues: pd.Series) -> pd.Series:
    """Holm-adjusted p-values (NaN stays NaN), by the statistics engine's own Holm."""
    from microscope.stats import holm as engine_holm

    p = pvalues.dropna()
    return pd.Series(engine_holm(p.to_numpy(dtype=float)), index=p.index).reindex(pvalues.index)


def adjust(table: pd.DataFrame, alpha: float) -> pd.DataFrame:
    """Holm over every tested row; a significant verdict that does not survive it becomes inconclusive.

    The same rule the statistics engine applies within a run: many cases compared at once would
    otherwise produce "faster" somewhere by chance.
    """
    table = table.assign(p_adj=holm(table["p"]))
    lost = table["verdict"].isin(("faster", "slower", "higher", "lower")) & (table["p_adj"] >= alpha)
    tested = int(table["p"].notna().sum())
    for i in table.index[lost]:
        why = (f"{table.at[i, 'verdict']} at raw p={table.at[i, 'p']:.3g} but p_adj={table.at[i, 'p_adj']:.3g} "
               f">= {alpha:g} after Holm over {tested} tests: inconclusive")
        table.at[i, "notes"] = "; ".join(n for n in (table.at[i, "notes"], why) if n)
        table.at[i, "verdict"] = "inconclusive"
    return table


def env_checks(env_a: dict[str, Any], env_b: dict[str, Any], force: bool) -> list[str]:
    """Refuse different corpora (unless forced); warn about different devices, versions, configs."""
    notes = []
    ca, cb = env_a.get("corpus_hash"), env_b.get("corpus_hash")
    if ca and cb and str(ca) != str(cb):
        msg = f"the runs used different corpora (corpus_hash {ca} vs {cb}): their numbers are not comparable"
        if not force:
            raise CompareError(msg + "; pass force=True (--force) to compare them anyway")
        notes.append(msg + "; compared anyway (forced)")
    elif bool(ca) != bool(cb):
        notes.append("only one run records a corpus hash: check that both used the same corpus")
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


def _renamed(data: dict[str, Any] | None, label: str) -> dict[str, Any]:
    return {tag(k, label): v for k, v in (data or {}).items()}


def _only(keys: set[tuple[str, ...]], label: str) -> str:
    examples = ", ".join("/".join(k[1:3]) + f" {k[4]}" for k in sorted(keys)[:3])
    return f"{len(keys)} measurement(s) only in {label} (e.g. {examples}); not compared"


def compare_runs(run_a: Path, run_b: Path, *, alpha: float | None = None, min_band: float | None = None,
                 force: bool = False) -> RunData:
    """B against A for everything both runs measured, as a ``RunData`` the report writers render.

    ``alpha``/``min_band`` default to run B's config (``stats:``), else 0.05 and 1%. Raises
    ``CompareError`` when the corpora differ and ``force`` is False.
    """
    a, b = load_run(Path(run_a)), load_run(Path(run_b))
    notes = env_checks(a.env, b.env, force)
    cfg_alpha, cfg_band = stats_params(b)
    alpha = cfg_alpha if alpha is None else alpha
    min_band = cfg_band if min_band is None else min_band
    ma, mb = _measurements(a.records), _measurements(b.records)
    latency_fn = engine_compare_latency()
    if latency_fn is None:
        notes.append("statistics engine not importable: latency compared with a Mann-Whitney U fallback")
    both = [k for k in mb if k in ma]
    rows = [_row(k, ma[k], mb[k], alpha, min_band, latency_fn) for k in both]
    for keys, label in ((set(ma) - set(mb), "A"), (set(mb) - set(ma), "B")):
        if keys:
            notes.append(_only(keys, label))
    table = adjust(normalise_comparison(pd.DataFrame(rows, columns=list(COMPARISON_COLUMNS))), alpha)
    notes += [f"A: {n}" for n in a.notes] + [f"B: {n}" for n in b.notes]
    records = pd.concat([a.records.assign(variant=a.records["variant"].map(lambda v: tag(v, "A"))),
                         b.records.assign(variant=b.records["variant"].map(lambda v: tag(v, "B")))],
                        ignore_index=True)
    config = b.config_text if (a.config_text or "") == (b.config_text or "") else (
        f"# A: {a.run_id}\n{a.config_text or '(none)'}\n\n# B: {b.run_id}\n{b.config_text or '(none)'}")
    return RunData(
        run_id=f"{a.run_id}-vs-{b.run_id}", records=records, comparison=table, envs={"A": a.env, "B": b.env},
        config_text=config, notes=notes, title=f"microscope compare: B = {b.run_id} vs A = {a.run_id}",
        divergence=_renamed(a.divergence, "A") | _renamed(b.divergence, "B") or None,
        trace_diff=_renamed(a.trace_diff, "A") | _renamed(b.trace_diff, "B") or None,
        graph_diff=_renamed(a.graph_diff, "A") | _renamed(b.graph_diff, "B") or None,
    )
