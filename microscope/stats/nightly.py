"""Tonight against a baseline night: the statistics behind ``microscope regress``.

Both sides are run-level values (one per run and measurement, ``microscope.store.run_summary``): the
baseline's runs from the history, tonight's fresh runs. For every measurement of the gating family
(each candidate's latency or throughput rate, peak memory and accuracy metrics) the two samples are
compared with ``between_runs.compare_between_runs``, the run as the unit, the noise being the larger of
the repeats' spread and the history's run-to-run noise of that measurement on this machine. A row is
*flagged* as a regression only when

(a) it moved in the worse direction and stays significant after Holm across the whole family, and
(b) its confidence interval lies beyond the between-run noise band ``tau`` (``compare_between_runs``
    decides "slower"/"higher" only then).

Flagged rows still need (c), a second sample that agrees (a confirming rerun, or the previous night
in the history): ``confirmed_keys`` applies (a) and (b) again to that sample alone, with Holm over the
flagged rows.

Absolute times move with everything else on the machine (another job, clocks, a neighbour VM), and
between processes that spread can dwarf a 5% change. Inside a run the baseline variant is timed in the
same interleaved rounds as the candidate, so each candidate latency also enters the family as
``latency_vs_baseline`` (the median over rounds of its latency over the baseline variant's in the same
round, ``run_summary``): machine load that slows both cancels, a slower kernel does not. A candidate's
timing is *noisy* when none of its timing rows can rule out a regression of ``max_noise`` (the CI
reaches past it in the worse direction): such a night cannot vouch for it, and a night with noisy
timings and no confirmed regression could not be measured.
"""

from __future__ import annotations

import math
from collections.abc import Collection, Mapping

import numpy as np
import pandas as pd

from .between_runs import compare_between_runs
from .latency import RELATIVE_LATENCY
from .metrics import higher_is_better, metric_kind
from .multiple import holm
from .steps import log_scale

__all__ = ["GATING_COLUMNS", "KEY", "REGRESSED", "RELATIVE", "compare_nights", "confirmed_keys", "gating_family",
           "missing_keys", "relative_latency", "worse_if_up"]

KEY = ("plugin", "variant", "case_id", "dimension", "metric")
RELATIVE = RELATIVE_LATENCY
REGRESSED, IMPROVED = "regressed", "improved"
DERIVED_METRICS = ("tflops", "gbps")  # they restate the latency
GATING_COLUMNS = (*KEY, "unit", "n_base", "n_new", "base_value", "new_value", "effect", "ci_low", "ci_high",
                  "log", "tau", "sigma", "noise_source", "p", "p_holm", "verdict", "flagged", "noisy", "notes")


def worse_if_up(dimension: str, metric: str) -> bool:
    """Whether a larger value is a regression: times, memory and errors/losses yes; rates and accuracies no."""
    kind = metric_kind(dimension, metric)
    if kind in ("latency", "memory"):
        return True
    if kind == "rate":
        return False
    return not higher_is_better(metric)


def gating_family(rows: pd.DataFrame, not_gated: Collection[tuple[str, ...]] = ()) -> pd.DataFrame:
    """The candidates' latency/throughput, memory and accuracy rows (derived TFLOP/s, GB/s and interpreter
    timings left out): the measurements a nightly regression is called on."""
    if not len(rows):
        return rows
    keep = (rows["role"] == "candidate") & rows["dimension"].isin(["throughput", "memory", "accuracy"]) & (
        ~rows["metric"].isin(DERIVED_METRICS))
    out = rows[keep]
    if not_gated:
        skip = set(not_gated)
        out = out[[tuple(k) not in skip for k in out[list(KEY)].itertuples(index=False)]]
    return out


def relative_latency(rows: pd.DataFrame) -> pd.DataFrame:
    """``rows`` with a ``latency_vs_baseline`` row for every candidate latency of every run (``run_key``).

    ``summarize_run`` stores the paired one (the median of per-round ratios); a run summarised before it
    did gets the ratio of the two run-level latencies instead, unit "ratio".
    """
    if not len(rows) or "run_key" not in rows.columns:
        return rows
    is_latency = np.array([metric_kind(d, m) == "latency" and m != RELATIVE
                           for d, m in zip(rows["dimension"], rows["metric"])], dtype=bool)
    lat = rows[is_latency & (rows["status"] == "ok").to_numpy()]
    base = lat[lat["role"] == "baseline"].set_index(["run_key", "plugin", "case_id", "dimension", "metric"])["value"]
    base = base[~base.index.duplicated()]
    cand = lat[lat["role"] == "candidate"]
    if not len(cand) or not len(base):
        return rows
    index = pd.MultiIndex.from_frame(cand[["run_key", "plugin", "case_id", "dimension", "metric"]])
    denominator = base.reindex(index).to_numpy(dtype=float)
    extra = cand.assign(value=cand["value"].to_numpy(dtype=float) / denominator, metric=RELATIVE, unit="ratio",
                        ci_low=np.nan, ci_high=np.nan, verdict=None)
    extra = extra[np.isfinite(extra["value"].to_numpy(dtype=float))]
    stored = rows[rows["metric"] == RELATIVE]
    if len(stored):
        have = set(stored[["run_key", "plugin", "variant", "case_id", "dimension"]].astype(str)
                   .itertuples(index=False, name=None))
        mask = [k not in have for k in extra[["run_key", "plugin", "variant", "case_id", "dimension"]].astype(str)
                .itertuples(index=False, name=None)]
        extra = extra[mask]
    return pd.concat([rows, extra], ignore_index=True) if len(extra) else rows


def _values(frame: pd.DataFrame) -> dict[tuple[str, ...], tuple[list[float], int, str]]:
    """key -> (finite values of ok rows, number of failed rows, unit)."""
    out: dict[tuple[str, ...], tuple[list[float], int, str]] = {}
    for key, grp in frame.groupby(list(KEY), sort=False):
        ok = grp[(grp["status"] == "ok") & np.isfinite(grp["value"].astype(float))]
        unit = next((u for u in grp["unit"] if isinstance(u, str) and u), "")
        out[tuple(str(k) for k in key)] = ([float(v) for v in ok["value"]], int((grp["status"] == "failed").sum()),
                                           unit)
    return out


def _center(values: list[float], log: bool) -> float:
    return float(np.exp(np.mean(np.log(values)))) if log else float(np.mean(values))


def _row(key: tuple[str, ...], a: list[float], b: list[float], unit: str, *, alpha: float, min_band: float,
         max_noise: float, sigma: float | None) -> dict[str, object]:
    dimension, metric = key[3], key[4]
    log = log_scale(dimension, metric) or (dimension == "accuracy" and min(a + b) > 0)
    res = compare_between_runs(a, b, alpha=alpha, min_band=min_band, log=log, history_sigma=sigma)
    up = res.verdict in ("slower", "higher")
    down = res.verdict in ("faster", "lower")
    worse = worse_if_up(dimension, metric)
    verdict = {True: REGRESSED, False: IMPROVED}[up == worse] if (up or down) else {
        "equivalent": "no change", "identical": "identical"}.get(res.verdict, "inconclusive")
    noisy = dimension == "throughput" and verdict != REGRESSED and not _rules_out(res, worse, max_noise)
    notes = list(res.notes)
    if noisy:
        notes.append(f"the CI cannot rule out a regression of {max_noise:.0%}")
    return dict(zip(KEY, key)) | {
        "unit": unit, "n_base": len(a), "n_new": len(b), "base_value": _center(a, log), "new_value": _center(b, log),
        "effect": res.effect, "ci_low": res.ci_low, "ci_high": res.ci_high, "log": log, "tau": res.tau,
        "sigma": res.sigma, "noise_source": res.noise_source, "p": res.p, "verdict": verdict, "noisy": noisy,
        "notes": "; ".join(notes)}


def _rules_out(res, worse_up: bool, max_noise: float) -> bool:  # noqa: ANN001 - a BetweenRuns
    """Whether the CI excludes a regression of ``max_noise`` (a ratio on the log scale)."""
    lo, hi = res.ci_low, res.ci_high
    if not (math.isfinite(lo) and math.isfinite(hi)) or not res.log:
        return math.isfinite(lo) and math.isfinite(hi)
    return hi < 1.0 + max_noise if worse_up else lo > 1.0 / (1.0 + max_noise)


def compare_nights(baseline: pd.DataFrame, new: pd.DataFrame, *, alpha: float = 0.05, min_band: float = 0.01,
                   max_noise: float = 0.10, noise: Mapping[tuple[str, ...], float] | None = None,
                   keys: Collection[tuple[str, ...]] | None = None,
                   not_gated: Collection[tuple[str, ...]] = ()) -> pd.DataFrame:
    """One row per gating measurement (``GATING_COLUMNS``): tonight (``new``) against ``baseline``.

    Both frames hold run-level rows (``MEASUREMENT_COLUMNS``, one per run). ``noise``: the history's
    between-run sd per key; ``keys``: compare only these (a confirmation). Measurements tonight without
    a baseline value are "new", those whose every run failed tonight are "failed"; neither is tested.
    """
    noise = noise or {}
    skip = set(not_gated) | {(*k[:4], RELATIVE) for k in not_gated}
    base = _values(gating_family(relative_latency(baseline), skip))
    now = _values(gating_family(relative_latency(new), skip))
    rows = []
    for key, (b, failed, unit) in now.items():
        if keys is not None and key not in keys:
            continue
        a = base.get(key, ([], 0, unit))[0]
        if not b:
            rows.append(dict(zip(KEY, key)) | {"unit": unit, "n_base": len(a), "n_new": 0, "verdict": "failed",
                                               "notes": f"{failed} run(s) failed this measurement"})
            continue
        if not a:
            rows.append(dict(zip(KEY, key)) | {"unit": unit, "n_base": 0, "n_new": len(b),
                                               "new_value": float(np.mean(b)), "verdict": "new",
                                               "notes": "not in the baseline's runs"})
            continue
        rows.append(_row(key, a, b, unit, alpha=alpha, min_band=min_band, max_noise=max_noise, sigma=noise.get(key)))
    table = pd.DataFrame(rows, columns=list(GATING_COLUMNS))
    for col in ("flagged", "noisy", "log"):
        table[col] = table[col].eq(True)
    _noisy_only_if_every_timing_is(table)
    table["p_holm"] = holm(table["p"].to_numpy(dtype=float)) if len(table) else []
    survives = table["p_holm"].to_numpy(dtype=float) < alpha
    moved = table["verdict"].isin([REGRESSED, IMPROVED]).to_numpy()
    for i in np.flatnonzero(moved & ~survives):
        note = (f"{table.at[i, 'verdict']} at p={table.at[i, 'p']:.3g}, but p_holm={table.at[i, 'p_holm']:.3g} >= "
                f"{alpha:g} over {int(table['p'].notna().sum())} tests: inconclusive")
        table.at[i, "notes"] = "; ".join(n for n in (table.at[i, "notes"], note) if isinstance(n, str) and n)
        table.at[i, "verdict"] = "inconclusive"
    table["flagged"] = (table["verdict"] == REGRESSED).to_numpy()
    return table


def _noisy_only_if_every_timing_is(table: pd.DataFrame) -> None:
    """A candidate's absolute latency may be noisy while its latency relative to the baseline is not: the
    night still vouches for that candidate, so neither row stays noisy (the note on the wide band stays)."""
    timing = table["dimension"] == "throughput"
    for _, grp in table[timing].groupby(["plugin", "variant", "case_id"], sort=False):
        if not grp["noisy"].all():
            table.loc[grp.index, "noisy"] = False


def missing_keys(baseline: pd.DataFrame, new: pd.DataFrame,
                 not_gated: Collection[tuple[str, ...]] = ()) -> list[tuple[str, ...]]:
    """Gating measurements the baseline holds for the plugins ``new`` ran but ``new`` lacks: a case, variant
    or metric dropped from the suite, or a run that stopped before measuring it. Never tested, so named."""
    if not len(new):
        return []
    skip = set(not_gated) | {(*k[:4], RELATIVE) for k in not_gated}
    plugins = set(new["plugin"].astype(str))
    base = gating_family(relative_latency(baseline), skip)
    now = gating_family(relative_latency(new), skip)
    have = {tuple(str(v) for v in k) for k in now[list(KEY)].itertuples(index=False)}
    want = dict.fromkeys(tuple(str(v) for v in k) for k in base[list(KEY)].itertuples(index=False))
    return [k for k in want if k[0] in plugins and k not in have]


def confirmed_keys(flagged: pd.DataFrame, baseline: pd.DataFrame, second: pd.DataFrame, **kw: object
                   ) -> tuple[set[tuple[str, ...]], pd.DataFrame]:
    """Which flagged regressions a second, independent sample (a rerun or the previous night) shows too.

    The second sample is compared with the baseline on the flagged measurements only (Holm over those);
    returns the keys it also calls regressed, and its table.
    """
    keys = {tuple(str(v) for v in k) for k in flagged[list(KEY)].itertuples(index=False)}
    table = compare_nights(baseline, second, keys=keys, **kw)  # type: ignore[arg-type]
    agree = {tuple(str(v) for v in k) for k in table.loc[table["flagged"], list(KEY)].itertuples(index=False)}
    return agree & keys, table
