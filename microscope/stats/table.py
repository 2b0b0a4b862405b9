"""The tidy comparison table: one row per (plugin, case, metric, non-baseline variant) vs the baseline.

``compare_records`` reads the run records (``pandas.json_normalize`` of the record dicts, as
``microscope.store.records.records_frame`` makes them) and compares every candidate and peer with the
baseline of the same plugin, case, dimension and metric. It dispatches on the kind of metric:

* **latency**: throughput metric named ``latency*`` or ``*_ms`` with ``details.rounds`` (per-round
  medians); effect = ratio cand/base from ``compare_latency``; faster / slower / equivalent /
  inconclusive.
* **numerics**: accuracy records carrying a ``passed`` flag (operator error vs float64, e.g.
  ``rel_err``); effect = error ratio cand/base (worst record); pass / fail from the flags, which the
  accuracy measure set with ``microscope.stats.numerics``.
* **model accuracy**: other accuracy metrics (eval loss, token accuracy); effect = delta cand - base;
  better / worse / non-inferior / equivalent / inconclusive. With per-token/per-example arrays: pairs
  within each seed, then a paired t over seeds when each arm trained its own model (the training run
  is the unit), or a paired bootstrap over the pooled tokens when the weights are the baseline's
  (``shares_baseline_weights``) or there is one seed. Without arrays: a paired t over matched seeds,
  else Welch over the seed values.
* **memory**: ``dimension == "memory"`` or a ``*bytes`` metric; effect = ratio cand/base; less /
  more / same (deterministic, no p).
* **distribution**: stability and generalization, one value per seed; effect = delta cand - base
  of the mean; better / worse / equivalent / inconclusive (``compare_distributions``).
* **rate**: other throughput metrics (TFLOP/s, GB/s, tokens/s); effect = ratio cand/base; ``info``
  (no test: derived from the same timed calls as the latency row, testing them again would count
  one measurement twice).

Records that failed or were skipped give rows with verdict ``"failed"`` / ``"skipped"`` and the
reason in ``notes``; a failed or missing baseline marks its candidates' rows the same way. A row whose
statistics raise (malformed details) gets verdict ``"error"``; the table itself never raises on bad
records.

Record ``details`` keys read here: ``rounds`` (latency), ``per_token`` / ``per_example`` (paired
model accuracy, same order for every variant), ``shares_baseline_weights``, ``relative_to_baseline``
(a metric defined against the baseline's output: tested only when the weights are shared), ``margin``
(non-inferiority / equivalence margin in metric units, default 0), ``higher_is_better`` (else guessed
from the metric name), ``per_seed`` (distribution values when one record holds all seeds),
``reasons`` (why a numerics check failed).

Contrasts (``contrasts=[(a, b)]``, the config's ``stats.contrasts``) compare variant ``a`` with variant
``b`` the same way (``vs`` = "contrast", ``baseline`` = b): the question a recipe with two candidates
asks ("does full attention in the last layer beat the window everywhere?"). They are exploratory and
never gated; metrics defined against the baseline's output are left out of them.

Multiple comparisons (``microscope.stats.multiple``), per ``family_by`` group (default: per plugin,
each plugin being its own claim): Holm over the *gating* family (candidates' latency and
model-accuracy tests), Benjamini-Hochberg over the *exploratory* rows (peers, stability,
generalization). Raw ``p`` and adjusted ``p_adj`` are both kept; a verdict that needs significance
(faster, slower, better, worse) whose ``p_adj >= alpha`` is downgraded to ``"inconclusive"`` with a
note. Numerics, memory and rate rows have no p-value (deterministic or derived measurements).
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from .accuracy import AccuracyComparison, compare_paired_accuracy, compare_seed_accuracy
from .bootstrap import DEFAULT_N_BOOT, make_rng
from .distributions import compare_distributions
from .latency import compare_latency
from .metrics import (
    INTERPRETER_MEMORY,
    INTERPRETER_TIMING,
    MEMORY_BAND,
    NOT_JUDGED,
    ONE_TRAINING_RUN,
    SAVED_BYTES,
    SIGNIFICANT_VERDICTS,
    VS_BASELINE,
    VS_BEST_PEER,
    VS_CONTRAST,
    higher_is_better,
    memory_verdict,
    metric_kind,
)
from .multiple import benjamini_hochberg, holm

__all__ = ["INTERPRETER_TIMING", "MEMORY_BAND", "NOT_JUDGED", "SIGNIFICANT_VERDICTS", "TABLE_COLUMNS", "VS_BASELINE",
           "VS_BEST_PEER", "VS_CONTRAST", "compare_records", "higher_is_better", "incorrect_variants", "memory_verdict",
           "metric_kind", "save_table"]

TABLE_COLUMNS: tuple[str, ...] = (
    "plugin",
    "case_id",
    "dimension",
    "metric",
    "baseline",
    "candidate",
    "role",
    "baseline_value",
    "candidate_value",
    "ratio_or_delta",
    "ci_low",
    "ci_high",
    "p",
    "p_adj",
    "verdict",
    "n",
    "notes",
    "vs",
    "gated",
)
_KEYS = ["plugin", "case_id", "dimension", "metric"]
_FLOATS = ("baseline_value", "candidate_value", "ratio_or_delta", "ci_low", "ci_high", "p", "p_adj")
_ROLE_ORDER = {"candidate": 0, "peer": 1}

@dataclass
class _Row:
    plugin: str
    case_id: str
    dimension: str
    metric: str
    baseline: str
    candidate: str
    role: str
    baseline_value: float = math.nan
    candidate_value: float = math.nan
    ratio_or_delta: float = math.nan
    ci_low: float = math.nan
    ci_high: float = math.nan
    p: float = math.nan
    p_adj: float = math.nan
    verdict: str = "inconclusive"
    n: int | None = None
    notes: list[str] = field(default_factory=list)
    vs: str = VS_BASELINE
    gated: bool = False
    family: str | None = None  # "gating" | "exploratory" | None (no test)

    def as_dict(self) -> dict[str, Any]:
        d = {c: getattr(self, c) for c in TABLE_COLUMNS}
        d["notes"] = "; ".join(n for n in self.notes if n)
        return d


def _missing(v: Any) -> bool:
    if v is None:
        return True
    if isinstance(v, float) and math.isnan(v):
        return True
    return False


def _detail(rec: pd.Series, key: str) -> Any:
    """``details.<key>`` of a record row, whether the frame was normalized or holds a ``details`` dict."""
    col = f"details.{key}"
    if col in rec.index and not _missing(rec[col]):
        return rec[col]
    d = rec.get("details")
    if isinstance(d, dict) and not _missing(d.get(key)):
        return d[key]
    return None


def _first_detail(recs: Iterable[pd.DataFrame], key: str) -> Any:
    for frame in recs:
        for _, rec in frame.iterrows():
            v = _detail(rec, key)
            if v is not None:
                return v
    return None


def _floats(recs: pd.DataFrame) -> np.ndarray:
    v = pd.to_numeric(recs["value"], errors="coerce").to_numpy(dtype=float)
    return v[np.isfinite(v)]


def _median(v: np.ndarray) -> float:
    return float(np.median(v)) if v.size else math.nan


def _ratio(c: float, b: float) -> float:
    if math.isnan(b) or math.isnan(c):
        return math.nan
    if b == 0:
        return 1.0 if c == 0 else math.inf
    return c / b


def _by_seed(recs: pd.DataFrame) -> pd.DataFrame:
    if "seed" in recs.columns and recs["seed"].notna().all():
        return recs.sort_values("seed", kind="stable")
    return recs


def _seeds(recs: pd.DataFrame) -> list[Any] | None:
    if "seed" not in recs.columns or recs["seed"].isna().any():
        return None
    return list(_by_seed(recs)["seed"])


def _seed_values(recs: pd.DataFrame) -> np.ndarray:
    """Record values in seed order, non-finite ones kept (NaN) so positions still pair by seed."""
    return pd.to_numeric(_by_seed(recs)["value"], errors="coerce").to_numpy(dtype=float)


def _arrays(recs: pd.DataFrame, key: str) -> list[np.ndarray] | None:
    """The ``details[key]`` array of every record in seed order, or None if any record lacks it."""
    out = []
    for _, rec in _by_seed(recs).iterrows():
        v = _detail(rec, key)
        if v is None:
            return None
        out.append(np.asarray(v, dtype=float).ravel())
    return out


def _aligned(base: pd.DataFrame, cand: pd.DataFrame, b: list[np.ndarray], c: list[np.ndarray]) -> bool:
    """True when the two record lists pair up: same seeds and same per-record lengths."""
    sb, sc = _seeds(base), _seeds(cand)
    same_seeds = (sb == sc) if (sb is not None and sc is not None) else len(b) == len(c) == 1
    return same_seeds and len(b) == len(c) and all(x.size == y.size for x, y in zip(b, c))


#: Kinds compared seed against seed: only seeds both arms completed can be compared.
_PER_SEED = ("model_accuracy", "distribution")


def _common_seeds(row: _Row, base: pd.DataFrame, cand: pd.DataFrame) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Both sides restricted to the seeds both have (a run cut short, a seed that failed on one side):
    a baseline mean over seeds the candidate never ran would mix seed-to-seed spread into the effect."""
    sb, sc = _seeds(base), _seeds(cand)
    if sb is None or sc is None or set(sb) == set(sc):
        return base, cand
    common = set(sb) & set(sc)
    if not common:
        row.notes.append("the two sides share no seed: compared as unpaired samples")
        return base, cand
    row.notes.append(f"compared on the {len(common)} seed(s) both completed (baseline {len(set(sb))}, "
                     f"{row.candidate} {len(set(sc))})")
    return base[base["seed"].isin(common)], cand[cand["seed"].isin(common)]


def _reasons(recs: pd.DataFrame) -> str:
    rs = [str(r) for r in recs.get("reason", pd.Series(dtype=object)) if not _missing(r) and str(r)]
    return "; ".join(dict.fromkeys(rs)) or "no reason recorded"


def _status_of(recs: pd.DataFrame) -> str:
    return "failed" if (recs["status"] == "failed").any() else "skipped"


# -- one comparison per kind ---------------------------------------------------------------------------


def _interpreted(recs: pd.DataFrame) -> bool:
    """Whether a latency record timed a Triton kernel through the CPU interpreter."""
    if "details.interpreted" in recs.columns and "details" not in recs.columns:  # a normalized frame
        return any(bool(v) for v in recs["details.interpreted"] if not _missing(v))
    return any(bool(_detail(rec, "interpreted")) for _, rec in recs.iterrows())


def _latency(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    b, c = _arrays(base, "rounds"), _arrays(cand, "rounds")
    row.family = "gating" if row.role == "candidate" and row.vs == VS_BASELINE else "exploratory"
    if _interpreted(base) or _interpreted(cand):
        # the interpreter's speed says nothing about the kernel's: shown, tested, never gated
        row.family, row.gated = "exploratory", False
        row.notes.append(INTERPRETER_TIMING)
    if b is None or c is None:
        bv, cv = _median(_floats(base)), _median(_floats(cand))
        row.baseline_value, row.candidate_value, row.ratio_or_delta = bv, cv, _ratio(cv, bv)
        row.verdict, row.n, row.family = "inconclusive", min(len(base), len(cand)), None
        row.notes.append("ratio cand/base of recorded values; no per-round samples (details.rounds): no test")
        return
    paired = _aligned(base, cand, b, c)
    seq = _sequential(base, cand)
    looks = int(seq["looks"]) if seq else 1
    res = compare_latency(
        np.concatenate(b),
        np.concatenate(c),
        alpha=opts["alpha"] / looks,
        min_band=opts["min_band"],
        n_boot=opts["n_boot"],
        seed=opts["rng"],
        max_band=opts["max_band"],
        paired=paired,
    )
    row.baseline_value, row.candidate_value, row.ratio_or_delta = res.base_median, res.cand_median, res.effect
    row.ci_low, row.ci_high, row.verdict = res.ci_low, res.ci_high, res.verdict
    row.p = min(1.0, res.p * looks) if math.isfinite(res.p) else res.p  # Bonferroni over the looks
    row.n = min(res.n_base, res.n_cand)
    effect = "median per-round ratio" if res.paired else "ratio of medians"
    row.notes.append(
        f"{effect} cand/base; {res.test}; band +-{res.tau:.1%}; P(cand faster)={res.prob_faster:.2f}"
    )
    if seq:
        row.notes.append(f"sequential rounds: {row.n} of at most {seq.get('max_rounds')}, {looks} looks at "
                         f"alpha {opts['alpha'] / looks:.3g} each (p x {looks})")
    row.notes.extend(res.notes)


def _sequential(base: pd.DataFrame, cand: pd.DataFrame) -> dict[str, Any] | None:
    """``details.sequential`` of a sequential-rounds comparison (None for fixed rounds)."""
    seq = _first_detail((cand, base), "sequential")
    return seq if isinstance(seq, dict) and int(seq.get("looks") or 0) > 1 else None


def _memory(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    bvals, cvals = _floats(base), _floats(cand)
    bv, cv = _median(bvals), _median(cvals)
    ratio = _ratio(cv, bv)
    row.baseline_value, row.candidate_value, row.ratio_or_delta, row.n = bv, cv, ratio, len(cvals)
    row.verdict = memory_verdict(ratio, opts["memory_band"])
    what = "bytes kept for the backward" if row.metric == SAVED_BYTES else "peak memory"
    row.notes.append(f"ratio cand/base of {what}; deterministic, no test")
    if _interpreted(base) or _interpreted(cand):
        row.gated = False
        row.notes.append(INTERPRETER_MEMORY)
    for label, vals in (("baseline", bvals), ("candidate", cvals)):
        if vals.size and np.ptp(vals) > 0:
            row.notes.append(
                f"{label} varies across records ({vals.min():.6g}..{vals.max():.6g}); median used"
            )


def _numerics(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    bvals, cvals = _floats(base), _floats(cand)
    bv = float(bvals.max()) if bvals.size else math.nan
    cv = float(cvals.max()) if cvals.size else math.nan
    row.baseline_value, row.candidate_value, row.ratio_or_delta = bv, cv, _ratio(cv, bv)
    row.n = len(cand)
    flags = [None if _missing(v) else bool(v) for v in cand["passed"]] if "passed" in cand.columns else [None]
    if any(f is None for f in flags):
        row.verdict = "inconclusive"
        row.notes.append("error ratio cand/base; a record has no pass/fail flag")
        return
    row.verdict = "pass" if all(flags) else "fail"
    row.notes.append("error ratio cand/base (worst record)")
    if not all(flags):
        why = _first_detail([cand[~np.array(flags)]], "reasons")
        failed = len(flags) - sum(flags)
        row.notes.append(
            f"{failed} of {len(flags)} record(s) failed the tolerance"
            + (f": {why if isinstance(why, str) else '; '.join(map(str, why))}" if why else "")
        )


def _model_accuracy(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    if _first_detail([cand], "relative_to_baseline") and not _first_detail([cand], "shares_baseline_weights"):
        # e.g. greedy agreement with the baseline's text: between separately trained models it also
        # measures training noise, so it is shown, not tested
        bv, cv = _median(_floats(base)), _median(_floats(cand))
        row.baseline_value, row.candidate_value, row.ratio_or_delta = bv, cv, cv - bv
        row.verdict, row.n = "info", min(len(base), len(cand))
        row.notes.append("delta cand-base; measured against the baseline's own output, and the arms trained "
                         "separately, so it includes training noise: no test")
        return
    margin = _first_detail([cand, base], "margin")
    margin = float(margin) if margin is not None else 0.0
    hib = _first_detail([cand, base], "higher_is_better")
    hib = bool(hib) if hib is not None else higher_is_better(row.metric)
    kw = {"alpha": opts["alpha"], "margin": margin, "higher_is_better": hib, "seed": opts["rng"]}
    res = None
    for key in ("per_token", "per_example"):
        b, c = _arrays(base, key), _arrays(cand, key)
        if b is not None and c is not None and _aligned(base, cand, b, c):
            res = _paired_model_accuracy(row, cand, b, c, kw)
            break
    if res is None:
        bvals, cvals = _floats(base), _floats(cand)
        sb = _seeds(base)
        if sb is not None and sb == _seeds(cand) and bvals.size == cvals.size >= 2:
            # one value per seed, seeds matched: each seed shares init, data and eval set, so pair them
            res = compare_seed_accuracy(_seed_values(base), _seed_values(cand), method="paired", **kw)
        elif bvals.size >= 2 and cvals.size >= 2:
            res = compare_seed_accuracy(bvals, cvals, method="welch", **kw)
        else:
            bv, cv = _median(bvals), _median(cvals)
            row.baseline_value, row.candidate_value, row.ratio_or_delta = bv, cv, cv - bv
            row.n = int(min(bvals.size, cvals.size))
            row.notes.append("delta cand-base; one measurement per variant and no per-token losses: no test")
            return
    row.family = "gating" if row.role == "candidate" else "exploratory"
    row.baseline_value, row.candidate_value, row.ratio_or_delta = res.base_mean, res.cand_mean, res.estimate
    row.ci_low, row.ci_high, row.p, row.verdict, row.n = res.ci_low, res.ci_high, res.p, res.verdict, res.n
    row.notes.append(
        f"delta cand-base ({res.method}); margin {margin:g}; {'higher' if hib else 'lower'} is better"
    )
    row.notes.extend(res.notes)


def _paired_model_accuracy(row: _Row, cand: pd.DataFrame, b: list[np.ndarray], c: list[np.ndarray],
                           kw: dict[str, Any]) -> AccuracyComparison:
    """Per-token pairs, tested at the level the randomness lives at.

    An arm that trained its own model differs from the baseline's by training noise too (GPU kernels
    are not bitwise reproducible; any real change moves the whole trajectory): pooling tokens across
    seeds would call that noise significant. So with several seeds the unit is the seed: each seed's
    paired per-token mean difference, then a paired t over seeds. Tokens are pooled only where the
    weights are the baseline's own (``shares_baseline_weights``: inference-only arms), or with a single
    seed, where the note says the CI covers evaluation noise only.
    """
    shared = bool(_first_detail([cand], "shares_baseline_weights"))
    if shared or len(b) == 1:
        if not shared:
            row.notes.append(ONE_TRAINING_RUN)
        return compare_paired_accuracy(np.concatenate(b), np.concatenate(c), **kw)
    row.notes.append(f"paired per token within each seed, then across {len(b)} seeds (the training run is the unit)")
    return compare_seed_accuracy([x.mean() for x in b], [y.mean() for y in c], method="paired", **kw)


def _distribution(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    def values(recs: pd.DataFrame) -> np.ndarray:
        per_seed = _arrays(recs, "per_seed")
        if per_seed is not None and len(recs) == 1:
            return per_seed[0]
        return _seed_values(recs)

    bvals, cvals = values(base), values(cand)
    lib = _first_detail([cand, base], "higher_is_better")
    lower = (not bool(lib)) if lib is not None else not higher_is_better(row.metric)
    margin = _first_detail([cand, base], "margin")
    sb, sc = _seeds(base), _seeds(cand)
    paired = sb is not None and sb == sc and bvals.size == cvals.size and len(base) > 1
    res = compare_distributions(
        bvals,
        cvals,
        alpha=opts["alpha"],
        margin=float(margin or 0.0),
        lower_is_better=lower,
        paired=paired,
        n_boot=opts["n_boot"],
        seed=opts["rng"],
    )
    row.family = "exploratory"
    row.baseline_value, row.candidate_value, row.ratio_or_delta = res.base_center, res.cand_center, res.delta
    row.ci_low, row.ci_high, row.p, row.verdict = res.ci_low, res.ci_high, res.p, res.verdict
    row.n = min(res.n_base, res.n_cand)
    row.notes.append(
        f"delta cand-base of the {res.statistic} over seeds; Mann-Whitney; "
        f"P(cand > base)={res.prob_greater:.2f}; {'lower' if lower else 'higher'} is better"
    )
    row.notes.extend(res.notes)


def _info(row: _Row, base: pd.DataFrame, cand: pd.DataFrame, opts: dict[str, Any]) -> None:
    bv, cv = _median(_floats(base)), _median(_floats(cand))
    row.baseline_value, row.candidate_value, row.ratio_or_delta = bv, cv, _ratio(cv, bv)
    row.verdict, row.n = "info", min(len(base), len(cand))
    if row.dimension == "throughput":
        row.notes.append("ratio cand/base; derived from the timed calls, tested on the latency row")
    else:
        row.notes.append("ratio cand/base; no test for this kind of metric")


_HANDLERS = {
    "latency": _latency,
    "memory": _memory,
    "numerics": _numerics,
    "model_accuracy": _model_accuracy,
    "distribution": _distribution,
    "rate": _info,
    "info": _info,
}


# -- assembling the table ------------------------------------------------------------------------------


def _prepare(frame: pd.DataFrame | Sequence[dict[str, Any]]) -> pd.DataFrame:
    if not isinstance(frame, pd.DataFrame):
        rows = list(frame)
        frame = pd.json_normalize(rows, max_level=1) if rows else pd.DataFrame()
    df = frame.copy()
    for col in (
        "plugin",
        "variant",
        "role",
        "case_id",
        "dimension",
        "metric",
        "status",
        "reason",
        "value",
        "passed",
        "seed",
    ):
        if col not in df.columns:
            df[col] = None
    for col in ("plugin", "variant", "role", "case_id", "dimension", "metric"):
        df[col] = df[col].map(lambda v: "" if _missing(v) else str(v))
    df["status"] = df["status"].map(lambda v: "ok" if _missing(v) else str(v))
    df["role"] = df["role"].replace("", "candidate")
    return df.reset_index(drop=True)


def _compare_group(key: tuple[str, ...], grp: pd.DataFrame, opts: dict[str, Any]) -> list[_Row]:
    plugin, case_id, dimension, metric = key
    base = grp[grp["role"] == "baseline"]
    others = grp[grp["role"] != "baseline"]
    base_name = str(base["variant"].iloc[0]) if len(base) else ""
    base_ok = base[base["status"] == "ok"]
    problem: tuple[str, str] | None = None
    if len(base) == 0:
        problem = ("skipped", "no baseline record for this case and metric: nothing to compare with")
    elif len(base_ok) == 0:
        st = _status_of(base)
        problem = (st, f"baseline {st}: {_reasons(base)}")
    has_passed = "passed" in grp.columns and grp["passed"].map(lambda v: not _missing(v)).any()
    kind = metric_kind(dimension, metric, bool(has_passed))
    rows: list[_Row] = []

    by_variant = dict(tuple(others.groupby("variant", sort=False)))
    order = sorted(by_variant, key=lambda v: _ROLE_ORDER.get(str(by_variant[v]["role"].iloc[0]), 2))
    for variant in order:
        recs = by_variant[variant]
        row = _Row(plugin, case_id, dimension, metric, base_name, variant, str(recs["role"].iloc[0]))
        row.gated = row.role == "candidate"
        ok = recs[recs["status"] == "ok"]
        if len(ok) == 0:
            row.verdict = _status_of(recs)
            row.notes.append(_reasons(recs))
        elif problem is not None and kind == "numerics":
            # a numerics check judges the candidate against float64, not against the baseline: it
            # stands when the baseline failed (safe_softmax's naive "before" overflows by design)
            _numerics(row, base_ok, ok, opts)
            row.notes.append(f"{problem[1]}; judged on its own check, no error ratio")
        elif problem is not None:
            row.verdict = problem[0]
            row.notes.append(problem[1])
        else:
            if len(ok) < len(recs):
                bad = recs[recs["status"] != "ok"]
                row.notes.append(
                    f"{len(bad)} of {len(recs)} record(s) {_status_of(bad)} ({_reasons(bad)}); "
                    "compared the rest"
                )
            try:
                opts["rng"] = make_rng(opts["seed"], plugin, case_id, dimension, metric, variant,
                                       *opts.get("rng_keys", ()))
                base_used, ok = _common_seeds(row, base_ok, ok) if kind in _PER_SEED else (base_ok, ok)
                _HANDLERS[kind](row, base_used, ok, opts)
            except Exception as exc:  # a malformed record must not take the whole table down
                row.verdict, row.family = "error", None
                row.notes.append(f"statistics failed: {type(exc).__name__}: {exc}")
        rows.append(row)
    if not order and problem is not None and len(base):
        row = _Row(plugin, case_id, dimension, metric, base_name, base_name, "baseline", verdict=problem[0])
        row.notes.append(problem[1])
        rows.append(row)
    return rows


def _adjust(rows: list[_Row], alpha: float, family_by: str | None) -> None:
    groups: dict[Any, list[_Row]] = {}
    for r in rows:
        groups.setdefault(getattr(r, family_by) if family_by else None, []).append(r)
    for members in groups.values():
        for family, method, adjust in (("gating", "Holm", holm), ("exploratory", "BH", benjamini_hochberg)):
            fam = [r for r in members if r.family == family and math.isfinite(r.p)]
            if not fam:
                continue
            for r, adj in zip(fam, adjust([r.p for r in fam])):
                r.p_adj = float(adj)
                if r.verdict in SIGNIFICANT_VERDICTS and not r.p_adj < alpha:
                    r.notes.append(
                        f"{r.verdict} at raw p={r.p:.3g} but p_adj={r.p_adj:.3g} >= {alpha:g} "
                        f"after {method} over {len(fam)} {family} tests: inconclusive"
                    )
                    r.verdict = "inconclusive"


def compare_records(
    frame: pd.DataFrame | Sequence[dict[str, Any]],
    alpha: float = 0.05,
    min_band: float = 0.01,
    *,
    max_band: float = 0.05,
    memory_band: float = MEMORY_BAND,
    n_boot: int = DEFAULT_N_BOOT,
    seed: int = 0,
    family_by: str | None = "plugin",
    contrasts: Sequence[tuple[str, str]] = (),
) -> pd.DataFrame:
    """The comparison table of a run's records (see the module docstring); columns ``TABLE_COLUMNS``.

    ``frame`` is ``records_frame(run)`` (or a list of record dicts). ``min_band``/``max_band`` are the
    latency noise-band floor and the widest band an equivalence claim may use (``compare_latency``);
    ``memory_band`` the relative difference below which peak memory is "same": 0.1% by default, since a
    CUDA allocator peak moves by a few blocks with the allocator's history (0: exactly equal).
    ``seed`` seeds every bootstrap (each row derives its own stream from it and the row's keys, so
    rows do not depend on each other). ``family_by`` is the
    column whose values delimit multiple-comparison families (None: the whole table is one family).
    ``contrasts``: (candidate, reference) variant pairs compared as well (module docstring).
    """
    if not 0 < alpha < 1:
        raise ValueError("alpha must be in (0, 1)")
    if family_by is not None and family_by not in TABLE_COLUMNS:
        raise ValueError(f"family_by must be a table column or None, got {family_by!r}")
    df = _prepare(frame)
    if df.empty:
        return _to_frame([])
    opts = {
        "alpha": alpha,
        "min_band": min_band,
        "max_band": max_band,
        "memory_band": memory_band,
        "n_boot": n_boot,
        "seed": seed,
    }
    rows: list[_Row] = []
    for key, grp in df.groupby(_KEYS, sort=False):
        rows.extend(_compare_group(tuple(key), grp, opts))
    wrong = incorrect_variants(df)
    rows.extend(_best_peer_rows(df, wrong, opts))
    rows.extend(_contrast_rows(df, contrasts, opts))
    _judge_only_correct(rows, wrong)
    _adjust(rows, alpha, family_by)
    return _to_frame(rows)


def incorrect_variants(df: pd.DataFrame) -> dict[tuple[str, str, str], str]:
    """(plugin, case_id, variant) -> why, for every variant that failed accuracy in a case.

    A failed accuracy trial (it raised, or returned NaN/Inf) and a numerics check that did not pass
    both count: such a variant's speed and memory in that case are not a result (KernelBench's fast_p).
    """
    acc = df[df["dimension"] == "accuracy"]
    if not len(acc):
        return {}
    flags = acc["passed"].map(lambda v: v is False or v is np.False_)
    bad = acc[(acc["status"] == "failed") | flags]
    out: dict[tuple[str, str, str], str] = {}
    for _, rec in bad.iterrows():
        key = (str(rec["plugin"]), str(rec["case_id"]), str(rec["variant"]))
        if key not in out:
            why = rec["reason"] if not _missing(rec["reason"]) else f"{rec['metric']} fails its tolerance"
            out[key] = f"{rec['metric']}: {why}"
    return out


def _judge_only_correct(rows: list[_Row], wrong: dict[tuple[str, str, str], str]) -> None:
    """Speed and memory rows of a variant that fails accuracy in the case become "not judged"."""
    for row in rows:
        if row.dimension not in ("throughput", "memory") or row.verdict in ("failed", "skipped"):
            continue
        why = wrong.get((row.plugin, row.case_id, row.candidate))
        whose = "fails accuracy"
        if why is None and row.vs == VS_CONTRAST:
            why = wrong.get((row.plugin, row.case_id, row.baseline))
            whose = f"its reference {row.baseline} fails accuracy"
        if why is None:
            continue
        row.verdict, row.family, row.p_adj = NOT_JUDGED, None, math.nan
        row.notes.insert(0, f"not judged: {whose} ({_clip(why, 160)})")


def _clip(text: str, n: int) -> str:
    text = " ".join(str(text).split())
    return text if len(text) <= n else text[: n - 3] + "..."


def _best_peer_rows(df: pd.DataFrame, wrong: dict[tuple[str, str, str], str], opts: dict[str, Any]) -> list[_Row]:
    """Each candidate against the fastest correct peer of the same case, on the same interleaved rounds.

    "Correct" means the peer passed every accuracy check of that case; "fastest" is the lowest median
    latency. The rows answer the kernel author's question, "how does my kernel stand against the best
    thing I could use instead?"; they are exploratory (Benjamini-Hochberg), not part of the gate unless
    the config's ``gate.best_peer`` asks for it.
    """
    lat = df[(df["dimension"] == "throughput") & (df["status"] == "ok")
             & df["metric"].map(lambda m: metric_kind("throughput", m) == "latency")]
    out: list[_Row] = []
    for (plugin, case_id, metric), grp in lat.groupby(["plugin", "case_id", "metric"], sort=False):
        # a study's variant (opt-in: the kernel with a stage left out, say) is no peer anyone could use instead
        usable = [(plugin, case_id, rec["variant"]) not in wrong and not _detail(rec, "study")
                  for _, rec in grp.iterrows()]
        peers = grp[(grp["role"] == "peer") & pd.Series(usable, index=grp.index)]
        cands = grp[grp["role"] == "candidate"]
        if not len(peers) or not len(cands):
            continue
        medians = peers.groupby("variant")["value"].median()
        best = str(medians.idxmin())
        best_recs = peers[peers["variant"] == best]
        for variant in dict.fromkeys(cands["variant"]):
            row = _Row(plugin, case_id, "throughput", metric, best, str(variant), "candidate", vs=VS_BEST_PEER)
            try:
                opts["rng"] = make_rng(opts["seed"], plugin, case_id, metric, variant, VS_BEST_PEER)
                _latency(row, best_recs, cands[cands["variant"] == variant], opts)
            except Exception as exc:  # a malformed record must not take the whole table down
                row.verdict, row.family = "error", None
                row.notes.append(f"statistics failed: {type(exc).__name__}: {exc}")
            speed_only = any(bool(_detail(rec, "speed_only")) for _, rec in best_recs.iterrows())
            what = "speed-only (different math, accuracy not checked)" if speed_only else "correct"
            row.notes.insert(0, f"vs the fastest {what} peer in this case ({best}, of {len(medians)})")
            out.append(row)
    return out


def _contrast_rows(df: pd.DataFrame, contrasts: Sequence[tuple[str, str]], opts: dict[str, Any]) -> list[_Row]:
    """Each (candidate, reference) pair compared like a candidate with the baseline: exploratory, not gated.

    A metric measured against the baseline's own output (``relative_to_baseline``, e.g. greedy agreement)
    says nothing about the pair and is left out, as are pass/fail checks (each variant's own verdict).
    Per-token losses are pooled across seeds only when both arms evaluate the baseline's weights;
    otherwise the training run is the unit, as for the baseline.
    """
    out: list[_Row] = []
    for cand, ref in contrasts:
        sub = df[df["variant"].isin([cand, ref])]
        if not (sub["variant"] == cand).any() or not (sub["variant"] == ref).any():
            continue  # a variant the run did not include (a --set variants subset)
        role = str(sub.loc[sub["variant"] == cand, "role"].iloc[0])
        sub = sub.assign(role=np.where(sub["variant"] == ref, "baseline", "candidate"))
        # a check with a pass flag judges each variant on its own; a metric measured against the baseline's
        # output says nothing about the pair
        own = sub.apply(lambda rec: bool(_detail(rec, "relative_to_baseline")) or not _missing(rec["passed"]), axis=1)
        sub = sub[~sub.set_index(_KEYS).index.isin(sub[own].set_index(_KEYS).index)]
        ref_shares = sub[sub["variant"] == ref].apply(lambda rec: bool(_detail(rec, "shares_baseline_weights")), axis=1)
        if not ref_shares.any():
            sub = _without_detail(sub, "shares_baseline_weights")
        keyed = {**opts, "rng_keys": (VS_CONTRAST, ref)}
        for key, grp in sub.groupby(_KEYS, sort=False):
            for row in _compare_group(tuple(key), grp, keyed):
                row.role, row.vs, row.gated = role, VS_CONTRAST, False
                if row.family is not None:
                    row.family = "exploratory"
                row.notes.insert(0, f"contrast: {cand} vs {ref} (stats.contrasts; not gated)")
                out.append(row)
    return out


def _without_detail(df: pd.DataFrame, key: str) -> pd.DataFrame:
    """``df`` with ``details.<key>`` cleared, in the normalized column and in a ``details`` dict alike."""
    df = df.copy()
    if f"details.{key}" in df.columns:
        df[f"details.{key}"] = None
    if "details" in df.columns:
        df["details"] = df["details"].map(lambda d: {k: v for k, v in d.items() if k != key} if isinstance(d, dict)
                                          else d)
    return df


def _to_frame(rows: list[_Row]) -> pd.DataFrame:
    out = pd.DataFrame([r.as_dict() for r in rows], columns=list(TABLE_COLUMNS))
    for col in _FLOATS:
        out[col] = pd.to_numeric(out[col], errors="coerce").astype(float)
    out["n"] = pd.array(out["n"].tolist(), dtype="Int64")
    for col in TABLE_COLUMNS:
        if col not in _FLOATS and col != "n":
            out[col] = out[col].astype(object)
    return out


def save_table(df: pd.DataFrame, folder: str | Path) -> list[Path]:
    """Write ``comparison.csv`` and ``comparison.parquet`` (``comparison.json`` if pyarrow is missing).

    Returns the paths written. Parquet keeps the dtypes (nullable ``n``, float NaNs) for later
    machine reading; CSV is for eyes and spreadsheets; JSON is the dependency-free fallback.
    """
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    written = [folder / "comparison.csv"]
    df.to_csv(written[0], index=False)
    try:
        import pyarrow  # noqa: F401
    except ImportError:
        path = folder / "comparison.json"
        df.to_json(path, orient="records", indent=1)
    else:
        path = folder / "comparison.parquet"
        df.to_parquet(path, index=False)
    written.append(path)
    return written
