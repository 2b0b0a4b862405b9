"""What a reader must know before trusting the numbers: the environment line and the warnings.

Warnings cover timings that do not describe the kernel (Triton's CPU interpreter), a noisy machine
(IQR/median of the per-round medians above 10% warns, above 25% is unreliable: DESIGN.md), failed
trials with their reasons, skipped trials, and anything the loader or the run comparison noticed.
Each warning is one bounded line: failures are grouped by reason, so a run with a thousand failures
still has a short warnings list (the full list goes into a folded table).
"""

from __future__ import annotations

from dataclasses import dataclass

import pandas as pd

from microscope.stats.metrics import ONE_TRAINING_RUN

from . import fmt
from .load import RunData

NOISY, UNRELIABLE = 0.10, 0.25
MAX_REASONS = 8
REASON_CHARS = 240


@dataclass(frozen=True)
class Caveat:
    """One warning line; ``level`` is ``warn`` (read before trusting) or ``info``; ``items`` its sub-lines."""

    level: str
    text: str
    items: tuple[str, ...] = ()


def _short_commit(commit: object) -> str:
    s = str(commit)
    sha, _, rest = s.partition("+")
    return (sha[:12] + ("+" + rest if rest else "")) if len(sha) >= 12 else s


def env_text(env: dict, device: str = "") -> str:
    """One line: device, versions, commit, config and corpus hashes (whatever the records carry)."""
    parts = []
    name = env.get("device_name")
    if device == "cuda" or env.get("cuda"):
        gpu = f"GPU {name or 'unknown'}"
        extra = [f"CUDA {env['cuda']}" if env.get("cuda") else "", f"sm {env['capability']}" if
                 env.get("capability") else ""]
        extra = [e for e in extra if e]
        parts.append(gpu + (f" ({', '.join(extra)})" if extra else ""))
    elif name or device:
        cpus = env.get("host_cpus")
        parts.append(f"CPU {name or device}" + (f" ({cpus} cores)" if fmt.finite(cpus) else ""))
    for key in ("torch", "triton", "python"):
        if env.get(key):
            parts.append(f"{key} {env[key]}")
    if env.get("commit"):
        parts.append(f"commit {_short_commit(env['commit'])}")
    for key, label in (("config_hash", "config"), ("corpus_hash", "corpus")):
        if env.get(key):
            parts.append(f"{label} {str(env[key])[:16]}")
    if env.get("interpreter") in (True, "True", "true"):
        parts.append("Triton interpreter")
    return " · ".join(parts) or "environment not recorded"


def env_lines(run: RunData) -> list[str]:
    """The env line, or one line per run (``A: ...``, ``B: ...``) for a comparison of two runs."""
    devices = run.records["device"].dropna().astype(str) if len(run.records) else pd.Series(dtype=str)
    device = devices.mode().iloc[0] if len(devices) else ""
    lines = []
    for label, env in run.envs.items():
        text = env_text(env, device if len(run.envs) == 1 else ("cuda" if env.get("cuda") else ""))
        lines.append(f"{label}: {text}" if label else text)
    return lines or ["environment not recorded"]


def _grouped(rows: pd.DataFrame, what: str) -> list[str]:
    """``<n> <what>: reason (variant on k cases, dims)`` per distinct reason, most frequent first."""
    out = []
    reasons = rows.assign(reason=rows["reason"].fillna("no reason recorded").astype(str))
    groups = sorted(reasons.groupby("reason", sort=False), key=lambda kv: -len(kv[1]))
    for reason, g in groups[:MAX_REASONS]:
        variants = ", ".join(g["variant"].astype(str).unique()[:4])
        cases = g["case_id"].nunique()
        dims = ", ".join(g["dimension"].astype(str).unique())
        out.append(f"{len(g)} {what} ({variants}; {cases} case(s); {dims}): {fmt.clip(reason, REASON_CHARS)}")
    if len(groups) > MAX_REASONS:
        out.append(f"... and {len(groups) - MAX_REASONS} more distinct reason(s): see the full list")
    return out


def caveats(run: RunData) -> list[Caveat]:
    """Warnings first (interpreter, noise, failures, loader notes), then informational lines (skips)."""
    rec = run.records
    out: list[Caveat] = []
    if len(rec) and (rec["interpreted"].fillna(False).astype(bool).any()
                     or str(run.env.get("interpreter")) == "True"):
        out.append(Caveat("warn", "Triton ran through its CPU interpreter: timings describe the interpreter, "
                                  "not the kernel; throughput numbers are not representative."))
    if "details.iqr_rel" in rec.columns:
        iqr = pd.to_numeric(rec["details.iqr_rel"], errors="coerce")
        noisy, bad = int((iqr > NOISY).sum()), int((iqr > UNRELIABLE).sum())
        if noisy:
            worst = fmt.pct(iqr.max(), signed=False)
            out.append(Caveat("warn", f"noisy machine: IQR/median of the per-round medians above 10% in "
                                      f"{noisy} latency measurement(s) (max {worst}); {bad} above 25% are "
                                      "unreliable."))
    if run.comparison is not None and len(run.comparison):
        notes = run.comparison["notes"].astype(str).str.lower()
        unreliable = int(notes.str.contains("unreliable").sum())
        if unreliable:
            out.append(Caveat("warn", f"the statistics engine marked {unreliable} comparison(s) unreliable "
                                      "(see their notes)."))
    one_run = _decided_on_one_training_run(run.comparison)
    if len(one_run):
        arms = ", ".join(sorted(one_run["candidate"].astype(str).unique()))
        out.append(Caveat("warn", f"{len(one_run)} accuracy verdict(s) ({arms}) rest on one trained model per arm: "
                                  "the intervals cover evaluation tokens, not the spread between trainings; "
                                  "workload.seeds >= 3 decides them."))
    failed = rec[rec["status"] == "failed"] if len(rec) else rec
    if len(failed):
        out.append(Caveat("warn", f"{len(failed)} failed trial record(s), by reason:",
                          tuple(_grouped(failed, "failed"))))
    out += [Caveat("warn", fmt.clip(note, 2 * REASON_CHARS)) for note in run.notes]
    skipped = rec[rec["status"] == "skipped"] if len(rec) else rec
    if len(skipped):
        out.append(Caveat("info", f"{len(skipped)} skipped trial record(s), by reason:",
                          tuple(_grouped(skipped, "skipped"))))
    return out


def _decided_on_one_training_run(table: pd.DataFrame | None) -> pd.DataFrame:
    """The comparison rows that call an accuracy difference from a single trained model per arm."""
    if table is None or not len(table):
        return pd.DataFrame(columns=["candidate"])
    notes = table["notes"].astype(str)
    return table[table["verdict"].isin(["better", "worse"]) & notes.str.contains(ONE_TRAINING_RUN, regex=False)]
