"""One run folder as the history stores it: the run's identity and one value per measurement.

Across runs the run is the unit (``microscope.stats.between_runs``), so each (plugin, variant, case,
dimension, metric) of a run becomes one run-level value, computed the way ``microscope compare`` does:

* latency: the median of the per-round medians (``details.rounds``, all records pooled), with a seeded
  bootstrap 95% CI of that median; ``n`` = rounds;
* accuracy, stability, generalization: the mean over records (seeds), or over ``details.per_seed``;
* memory and rates: the median over records;
* a CI where a record's details give one (``ci_low``/``ci_high``); ``n`` = records (or seeds);
* ``latency_vs_baseline`` (unit "ratio"), one more row per candidate and peer latency: the median of
  its per-round latency over the baseline variant's in the same interleaved round, with a bootstrap
  CI; ``n`` = rounds. Load that slows the machine during a round slows both variants of that round,
  so this ratio moves far less between processes than either latency does (on a shared 2-core CPU,
  1.8% between runs against 4% for the ratio of the two medians and 17% for the latency itself).

The verdict is the variant's comparison row against the baseline (``vs == "baseline"``) in the run's
``comparison.csv``, read by column name so older and newer tables both load. A variant whose trials
all failed or were skipped keeps a row with no value and that status.
"""

from __future__ import annotations

import hashlib
import json
import math
import warnings
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, NewType

import numpy as np
import pandas as pd

from microscope.env import machine_fingerprint
from microscope.stats.bootstrap import bootstrap, make_rng, percentile_ci
from microscope.stats.latency import RELATIVE_LATENCY, paired_round_ratios
from microscope.stats.metrics import metric_kind

from .comparison import read_comparison
from .history_schema import HistoryError
from .records import RecordsError, read_records

__all__ = ["MEASUREMENT_COLUMNS", "RELATIVE_LATENCY", "RunInfo", "RunKey", "RunSummary", "plain_text",
           "summarize_run"]

RunKey = NewType("RunKey", str)
#: The run-level columns of one measurement, as ``summarize_run`` makes them and the history stores them.
MEASUREMENT_COLUMNS = ("plugin", "variant", "role", "case_id", "dimension", "metric", "unit", "value", "ci_low",
                       "ci_high", "n", "status", "verdict")
_NUMBERS = ("value", "ci_low", "ci_high")
_MEAN_DIMENSIONS = ("accuracy", "stability", "generalization")
_N_BOOT = 2000


@dataclass(frozen=True)
class RunInfo:
    """One run in the history: who ran what, where and when."""

    key: RunKey
    run_id: str
    commit: str
    branch: str
    date: str  # ISO-8601 UTC: the run's first record
    fingerprint: str
    gate: str | None  # "pass" | "fail" | None (unknown)
    source: str  # the results folder it was read from
    env: dict[str, Any] = field(default_factory=dict, compare=False)


@dataclass
class RunSummary:
    """A results folder read for the history: ``info`` and ``rows`` (``MEASUREMENT_COLUMNS``)."""

    info: RunInfo
    rows: pd.DataFrame
    notes: list[str] = field(default_factory=list)

    @property
    def digest(self) -> str:
        """A hash of the rows: re-adding an unchanged run is a no-op, a resumed (grown) run replaces its rows."""
        text = self.rows.to_json(orient="values", double_precision=12)
        return hashlib.sha256(text.encode()).hexdigest()[:16]


def plain_text(frame: pd.DataFrame) -> pd.DataFrame:
    """Text columns as Python strings with None where missing, numbers as floats (NaN where missing).

    pandas would infer a string dtype whose missing value is NaN (and which is slow to iterate row by
    row), or an object column mixing None and floats.
    """
    for col in frame.columns:
        if col in _NUMBERS:
            frame[col] = pd.to_numeric(frame[col], errors="coerce").astype(float)
        elif col != "n":
            frame[col] = pd.Series([v if isinstance(v, str) else None for v in frame[col].tolist()],
                                   index=frame.index, dtype=object)
    if "n" in frame.columns:
        frame["n"] = pd.array(frame["n"].tolist(), dtype="Int64")
    return frame


def _finite(v: Any) -> float | None:
    try:
        f = float(v)
    except (TypeError, ValueError):
        return None
    return f if math.isfinite(f) else None


def _details(rec: dict[str, Any]) -> dict[str, Any]:
    d = rec.get("details")
    return d if isinstance(d, dict) else {}


def _latency_value(records: list[dict[str, Any]], rng_keys: tuple[str, ...]) -> tuple[float, float | None,
                                                                                    float | None, int]:
    rounds = [f for r in records for f in map(_finite, _details(r).get("rounds") or []) if f is not None and f > 0]
    if not rounds:
        values = [f for f in (_finite(r.get("value")) for r in records) if f is not None]
        return float(np.median(values)), None, None, len(values)
    x = np.asarray(rounds)
    if x.size < 2:
        return float(x[0]), None, None, 1
    reps = bootstrap((x,), lambda a: np.median(a, axis=1), paired=True, n_boot=_N_BOOT, rng=make_rng(0, *rng_keys))
    lo, hi = percentile_ci(reps)
    return float(np.median(x)), lo, hi, int(x.size)


def _plain_value(records: list[dict[str, Any]], dimension: str) -> tuple[float, float | None, float | None, int]:
    per_seed = _details(records[0]).get("per_seed") if len(records) == 1 else None
    if isinstance(per_seed, list) and per_seed:
        values = [f for f in map(_finite, per_seed) if f is not None]
    else:
        values = [f for f in (_finite(r.get("value")) for r in records) if f is not None]
    if not values:
        return math.nan, None, None, 0
    value = float(np.mean(values)) if dimension in _MEAN_DIMENSIONS else float(np.median(values))
    cis = [(_finite(_details(r).get("ci_low")), _finite(_details(r).get("ci_high"))) for r in records]
    cis = [c for c in cis if c[0] is not None and c[1] is not None]
    lo, hi = (cis[0] if len(cis) == 1 else (None, None))
    return value, lo, hi, len(values)


def _verdicts(folder: Path) -> tuple[dict[tuple[str, ...], str], list[str]]:
    """(plugin, variant, case, dimension, metric) -> verdict against the baseline, from comparison.csv."""
    table, notes = read_comparison(folder)
    if table is None or not len(table):
        return {}, notes
    rows = table[table["vs"].isin(["baseline", ""])]
    out = {}
    for r in rows[["plugin", "candidate", "case_id", "dimension", "metric", "verdict"]].itertuples(index=False):
        out.setdefault(tuple(str(v) for v in r[:5]), str(r[5]))
    return out, notes


def _run_date(records: list[dict[str, Any]], records_path: Path) -> str:
    times = []
    for r in records:
        try:
            t = datetime.fromisoformat(str(r.get("time")))
        except ValueError:
            continue
        times.append(t if t.tzinfo else t.replace(tzinfo=timezone.utc))
    when = min(times) if times else datetime.fromtimestamp(records_path.stat().st_mtime, timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _env(records: list[dict[str, Any]]) -> dict[str, Any]:
    """The most common environment across records (a resumed run may have two), with GPU clocks added."""
    envs = [r.get("env") if isinstance(r.get("env"), dict) else {} for r in records]
    keys = [json.dumps(e, sort_keys=True, default=str) for e in envs]
    env = dict(envs[keys.index(Counter(keys).most_common(1)[0][0])]) if envs else {}
    clocks = [s.get("sm_mhz") for r in records for s in (_details(r).get("gpu_state") or [])
              if isinstance(s, dict) and isinstance(s.get("sm_mhz"), (int, float))]
    if clocks:
        env["sm_mhz_median"] = float(np.median(clocks))
    throttled = [_details(r).get("throttled_rounds") for r in records]
    if any(isinstance(t, int) for t in throttled):
        env["throttled_rounds"] = sum(t for t in throttled if isinstance(t, int))
    return env


def _read(folder: Path) -> tuple[list[dict[str, Any]], list[str]]:
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            records = list(read_records(folder))
        except RecordsError as exc:
            raise HistoryError(str(exc)) from exc
    return records, [str(w.message) for w in caught]


def summarize_run(results_dir: Path | str, branch: str | None = None, commit: str | None = None) -> RunSummary:
    """Read ``results/<run-id>/`` into its run-level rows. ``branch`` and ``commit`` override the records' own
    (a run measured from an uncommitted tree, labelled with the commit it became)."""
    folder = Path(results_dir)
    folder = folder.parent if folder.name == "records.jsonl" else folder
    records, notes = _read(folder)
    if not records:
        raise HistoryError(f"{folder / 'records.jsonl'}: no records; nothing to add to the history")
    env = _env(records)
    verdicts, more = _verdicts(folder)
    notes += more
    run_ids = {str(r.get("run_id")) for r in records if r.get("run_id")}
    run_id = run_ids.pop() if len(run_ids) == 1 else folder.name
    commit = commit or str(env.get("commit") or "unknown")
    fingerprint = machine_fingerprint(env)
    date = _run_date(records, folder / "records.jsonl")
    key = RunKey(hashlib.sha256(json.dumps([run_id, commit, fingerprint, date]).encode()).hexdigest()[:16])
    info = RunInfo(key=key, run_id=run_id, commit=commit, branch=branch or str(env.get("branch") or "unknown"),
                   date=date, fingerprint=fingerprint, gate=None, source=str(folder.resolve()), env=env)
    return RunSummary(info=info, rows=_rows(records, verdicts, run_id), notes=notes)


def _rows(records: list[dict[str, Any]], verdicts: dict[tuple[str, ...], str], run_id: str) -> pd.DataFrame:
    groups: dict[tuple[str, ...], list[dict[str, Any]]] = {}
    for r in records:
        key = tuple(str(r.get(k) or "") for k in ("plugin", "variant", "case_id", "dimension", "metric"))
        groups.setdefault(key, []).append(r)
    rows = []
    for key, recs in groups.items():
        plugin, variant, case_id, dimension, metric = key
        ok = [r for r in recs if (r.get("status") or "ok") == "ok" and _finite(r.get("value")) is not None]
        row: dict[str, Any] = dict(zip(("plugin", "variant", "case_id", "dimension", "metric"), key))
        row |= {"role": str(recs[0].get("role") or ""), "unit": str(recs[0].get("unit") or ""),
                "verdict": verdicts.get(key)}
        if not ok:
            status = "failed" if any(r.get("status") == "failed" for r in recs) else "skipped"
            rows.append(row | {"value": math.nan, "ci_low": None, "ci_high": None, "n": 0, "status": status})
            continue
        if metric_kind(dimension, metric) == "latency":
            value, lo, hi, n = _latency_value(ok, (run_id, *key))
        else:
            value, lo, hi, n = _plain_value(ok, dimension)
        rows.append(row | {"value": value, "ci_low": lo, "ci_high": hi, "n": n, "status": "ok"})
    rows += _relative_rows(groups, run_id)
    frame = plain_text(pd.DataFrame(rows, columns=list(MEASUREMENT_COLUMNS)))
    return frame.sort_values(["plugin", "case_id", "dimension", "metric", "variant"], kind="stable",
                             ignore_index=True)


def _one_rounds(recs: list[dict[str, Any]]) -> np.ndarray | None:
    """The per-round medians of a variant's single ok latency record, or None (no rounds, several records)."""
    ok = [r for r in recs if (r.get("status") or "ok") == "ok"]
    if len(ok) != 1:
        return None
    rounds = [_finite(v) for v in _details(ok[0]).get("rounds") or []]
    if len(rounds) < 2 or any(v is None or v <= 0 for v in rounds):
        return None
    return np.asarray(rounds, dtype=float)


def _relative_rows(groups: dict[tuple[str, ...], list[dict[str, Any]]], run_id: str) -> list[dict[str, Any]]:
    """``RELATIVE_LATENCY`` rows: each non-baseline variant's latency over the baseline's, round by round.

    Only where both have one record with the same number of rounds (round r of every variant ran in the
    same interleaved round); the value is the median of the per-round ratios, the CI its bootstrap.
    """
    out = []
    for key, recs in groups.items():
        plugin, variant, case_id, dimension, metric = key
        role = str(recs[0].get("role") or "")
        if role == "baseline" or metric_kind(dimension, metric) != "latency" or metric == RELATIVE_LATENCY:
            continue
        base = [(k, r) for k, r in groups.items() if k[0] == plugin and k[2:] == (case_id, dimension, metric)
                and str(r[0].get("role") or "") == "baseline"]
        ratios = paired_round_ratios(_one_rounds(recs), _one_rounds(base[0][1]) if len(base) == 1 else None)
        if ratios is None:
            continue
        reps = bootstrap((ratios,), lambda a: np.median(a, axis=1), paired=True, n_boot=_N_BOOT,
                         rng=make_rng(0, run_id, *key, RELATIVE_LATENCY))
        lo, hi = percentile_ci(reps)
        out.append({"plugin": plugin, "variant": variant, "role": role, "case_id": case_id, "dimension": dimension,
                    "metric": RELATIVE_LATENCY, "unit": "ratio", "value": float(np.median(ratios)), "ci_low": lo,
                    "ci_high": hi, "n": int(ratios.size), "status": "ok", "verdict": None})
    return out
