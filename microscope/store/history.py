"""The nightly history: every run's run-level values in one SQLite file (``results/history.sqlite``).

``History.open(path, create=True)`` opens (or starts) the file and checks it before anything reads it:
not an SQLite file, a truncated or corrupt one (``PRAGMA quick_check``), someone else's database, or a
schema written by a newer microscope are each a ``HistoryError`` that names the file and the problem,
never a silent pass. An older schema is migrated in place, keeping its rows (``history_schema``).

Writers: the file runs in WAL mode, each ``add_run`` is one ``BEGIN IMMEDIATE`` transaction (a second
writer waits for the first, up to ``BUSY_TIMEOUT_S``), and ``add_run`` is idempotent: the same run
added twice leaves one copy, a run that grew since (resumed) replaces its rows.

Readers: ``runs``, ``rows`` and ``series`` (run-level values in date order), ``series_changes`` (steps
and drift, ``microscope.stats.steps``), ``between_run_noise`` (the band a regression gate needs),
``last_good`` and ``baseline_records`` (what a night is compared with). Timings are only comparable on
one machine, so everything that compares takes a machine fingerprint (``microscope.env``).
"""

from __future__ import annotations

import json
import math
import sqlite3
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from microscope.env import machine_summary
from microscope.stats.steps import (
    Drift,
    Step,
    default_min_change,
    detect_drift,
    detect_steps,
    log_scale,
    robust_noise,
)

from .history_schema import (
    CURRENT_VERSION,
    HistoryError,
    check_file,
    current_version,
    damage,
    env_rows,
    migrate,
    newer_schema,
)
from .run_summary import MEASUREMENT_COLUMNS, RunInfo, RunKey, RunSummary, plain_text, summarize_run

__all__ = ["LAST_GOOD", "ROW_COLUMNS", "SERIES_KEYS", "History", "HistoryError", "RunInfo",
           "RunKey", "RunSummary", "series_changes", "summarize_run"]

#: ``baseline_records`` reference for the newest run whose gate passed.
LAST_GOOD = "last-good"
BUSY_TIMEOUT_S = 60.0
RUN_COLUMNS = ("run_key", "run_id", "commit", "branch", "date", "fingerprint", "gate")
#: Columns of ``rows``/``series``: the run's columns, then the measurement's.
ROW_COLUMNS = RUN_COLUMNS + MEASUREMENT_COLUMNS
#: What identifies one series: a measurement on one machine.
SERIES_KEYS = ("fingerprint", "plugin", "variant", "case_id", "dimension", "metric")
_RUN_SQL = "r.run_key, r.run_id, r.commit_sha, r.branch, r.run_date, r.fingerprint, r.gate"
_ROWS_SQL = f"SELECT {_RUN_SQL}, " + ", ".join(f"m.{c}" for c in MEASUREMENT_COLUMNS) + \
    " FROM measurements m JOIN runs r ON r.run_key = m.run_key"
_FILTERS = {"plugin": "m.plugin", "variant": "m.variant", "case": "m.case_id", "dimension": "m.dimension",
            "metric": "m.metric", "fingerprint": "r.fingerprint", "branch": "r.branch"}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="seconds")


def _sql_value(v: Any) -> Any:
    """NaN and numpy scalars as the database wants them (NULL, plain Python numbers)."""
    if v is None or (isinstance(v, float) and not math.isfinite(v)):
        return None
    if isinstance(v, np.generic):
        return _sql_value(v.item())
    return v


class History:
    """One history database; open with ``History.open``, use as a context manager or ``close()``."""

    def __init__(self, conn: sqlite3.Connection, path: Path) -> None:
        self._conn = conn
        self.path = path

    # -- opening --------------------------------------------------------------------------------------

    @classmethod
    def open(cls, path: Path | str, create: bool = False, check: bool = True) -> History:
        """Open the history at ``path``, creating it when ``create``; ``check`` runs ``PRAGMA quick_check``.

        Raises ``HistoryError`` for a missing file (without ``create``), a folder, a file that is not
        SQLite, a truncated or corrupt database, a foreign database, or a newer schema.
        """
        path = Path(path)
        existed = path.exists()
        if existed:
            check_file(path)
        elif not create:
            raise HistoryError(f"{path}: no history here; `microscope history add RESULTS_DIR --db {path}` "
                               "starts one")
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
        try:
            conn = sqlite3.connect(path, timeout=BUSY_TIMEOUT_S, isolation_level=None)
        except sqlite3.Error as exc:
            raise HistoryError(f"{path}: cannot open the history ({exc})") from exc
        history = cls(conn, path)
        try:
            history._prepare(create, check and existed)
        except BaseException:
            conn.close()
            raise
        return history

    def _prepare(self, create: bool, check: bool) -> None:
        path = self.path
        try:
            if check:
                problems = [r[0] for r in self._conn.execute("PRAGMA quick_check(5)").fetchall()]
                if problems != ["ok"]:
                    raise damage(path, "; ".join(problems))
            version = current_version(self._conn, path)
            if version > CURRENT_VERSION:
                raise newer_schema(path, version)
            if version == 0 and not create:
                raise HistoryError(f"{path}: an empty database, no history yet; add runs with "
                                   f"`microscope history add RESULTS_DIR --db {path}`")
            self._wal()
            if version < CURRENT_VERSION:
                with self._write():
                    migrate(self._conn, path)
        except sqlite3.OperationalError as exc:
            if "readonly" in str(exc) or "read-only" in str(exc):
                raise HistoryError(f"{path}: read-only, and its schema needs migrating to version "
                                   f"{CURRENT_VERSION} ({exc}); open it once where it is writable") from exc
            if "locked" in str(exc) or "busy" in str(exc):
                raise HistoryError(f"{path}: another process held the history's write lock for over "
                                   f"{BUSY_TIMEOUT_S:.0f} s ({exc}); try again when it is done") from exc
            raise damage(path, str(exc)) from exc
        except sqlite3.DatabaseError as exc:
            raise damage(path, str(exc)) from exc

    def _wal(self) -> None:
        try:
            self._conn.execute("PRAGMA journal_mode=WAL")
        except sqlite3.OperationalError:
            pass  # a read-only file keeps its journal mode; readers do not need WAL

    @contextmanager
    def _write(self) -> Iterator[None]:
        """One write transaction, taking the write lock up front so concurrent writers queue, not fail."""
        self._conn.execute("BEGIN IMMEDIATE")
        try:
            yield
        except BaseException:
            self._conn.execute("ROLLBACK")
            raise
        self._conn.execute("COMMIT")

    def close(self) -> None:
        self._conn.close()

    def __enter__(self) -> History:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    @property
    def version(self) -> int:
        return current_version(self._conn, self.path)

    # -- writing --------------------------------------------------------------------------------------

    def add_run(self, results_dir: Path | str, branch: str | None = None, passed: bool | None = None) -> RunKey:
        """Add one run folder; returns its key. ``passed``: the run's gate outcome when the caller knows it
        (``microscope run --history``), else the default gate over the run's saved table decides."""
        summary = summarize_run(results_dir, branch=branch)
        self.add_summary(summary, passed=default_gate(Path(results_dir)) if passed is None else passed)
        return summary.info.key

    def add_summary(self, summary: RunSummary, passed: bool | None = None) -> str:
        """Store a summarised run in one transaction: ``"added"``, ``"unchanged"`` (already there, same
        rows) or ``"replaced"`` (there with other rows: a resumed run grew)."""
        info, digest = summary.info, summary.digest
        gate = None if passed is None else ("pass" if passed else "fail")
        try:
            with self._write():
                row = self._conn.execute("SELECT digest, gate FROM runs WHERE run_key = ?", (info.key,)).fetchone()
                if row is not None and row[0] == digest:
                    if gate is not None and row[1] != gate:
                        self._conn.execute("UPDATE runs SET gate = ? WHERE run_key = ?", (gate, info.key))
                    return "unchanged"
                if row is not None:
                    for table in ("measurements", "run_env", "runs"):
                        self._conn.execute(f"DELETE FROM {table} WHERE run_key = ?", (info.key,))
                self._insert(summary, digest, gate)
        except sqlite3.DatabaseError as exc:
            raise HistoryError(f"{self.path}: could not add run {info.run_id} ({exc})") from exc
        return "added" if row is None else "replaced"

    def _insert(self, summary: RunSummary, digest: str, gate: str | None) -> None:
        info = summary.info
        self._conn.execute(
            "INSERT INTO runs (run_key, run_id, commit_sha, branch, run_date, fingerprint, gate, source, digest, "
            "env_json, added_at) VALUES (?, ?, ?, ?, ?, ?, ?, ?, ?, ?, ?)",
            (info.key, info.run_id, info.commit, info.branch, info.date, info.fingerprint, gate, info.source,
             digest, json.dumps(info.env, sort_keys=True, default=str), _now()))
        self._conn.executemany("INSERT INTO run_env (run_key, env_key, env_value) VALUES (?, ?, ?)",
                               env_rows(info.key, info.env))
        columns = ("run_key",) + MEASUREMENT_COLUMNS
        values = [(info.key, *(_sql_value(v) for v in row))
                  for row in summary.rows[list(MEASUREMENT_COLUMNS)].itertuples(index=False)]
        self._conn.executemany(f"INSERT INTO measurements ({', '.join(columns)}) VALUES "
                               f"({', '.join('?' for _ in columns)})", values)

    def mark_gate(self, key: RunKey, passed: bool) -> None:
        """Record a run's gate outcome decided later (e.g. the nightly regression gate failed it)."""
        with self._write():
            done = self._conn.execute("UPDATE runs SET gate = ? WHERE run_key = ?",
                                      ("pass" if passed else "fail", key))
        if done.rowcount == 0:
            raise HistoryError(f"{self.path}: no run with key {key}")

    # -- reading runs ---------------------------------------------------------------------------------

    def _run_infos(self, where: str = "", params: tuple[Any, ...] = ()) -> list[RunInfo]:
        sql = f"SELECT {_RUN_SQL}, r.source, r.env_json FROM runs r {where} ORDER BY r.run_date, r.run_key"
        return [RunInfo(key=RunKey(r[0]), run_id=r[1], commit=r[2], branch=r[3], date=r[4], fingerprint=r[5],
                        gate=r[6], source=r[7], env=json.loads(r[8] or "{}"))
                for r in self._conn.execute(sql, params).fetchall()]

    def runs(self, fingerprint: str | None = None, branch: str | None = None, commit: str | None = None,
             since: str | None = None, plugin: str | None = None) -> list[RunInfo]:
        """Runs in date order; ``commit`` matches a prefix of the sha, ``since`` an ISO date or time."""
        clauses, params = [], []
        for column, value in (("r.fingerprint", fingerprint), ("r.branch", branch)):
            if value is not None:
                clauses.append(f"{column} = ?")
                params.append(value)
        if commit is not None:
            clauses.append("r.commit_sha LIKE ?")
            params.append(commit.replace("%", "").replace("_", "") + "%")
        if since is not None:
            clauses.append("r.run_date >= ?")
            params.append(since)
        if plugin is not None:
            clauses.append("r.run_key IN (SELECT m.run_key FROM measurements m WHERE m.plugin = ?)")
            params.append(plugin)
        return self._run_infos("WHERE " + " AND ".join(clauses) if clauses else "", tuple(params))

    def run(self, key: str) -> RunInfo | None:
        found = self._run_infos("WHERE r.run_key = ?", (key,))
        return found[0] if found else None

    def machines(self) -> dict[str, str]:
        """fingerprint -> the machine in words (from its newest run), for every machine in the history."""
        out: dict[str, str] = {}
        for info in self._run_infos():
            out[info.fingerprint] = machine_summary(info.env)
        return out

    def require_fingerprint(self, fingerprint: str, what: str = "this history") -> None:
        """Raise unless ``fingerprint`` has runs here: timings from another machine are no baseline."""
        machines = self.machines()
        if fingerprint in machines:
            return
        others = "; ".join(f"{fp} = {name}" for fp, name in machines.items()) or "none"
        raise HistoryError(f"{self.path}: {what} holds no run from machine {fingerprint} (only from: {others}); "
                           "timings from another machine are not comparable: run the baseline on this machine")

    # -- reading measurements -------------------------------------------------------------------------

    def rows(self, plugin: str | None = None, variant: str | None = None, case: str | None = None,
             dimension: str | None = None, metric: str | None = None, fingerprint: str | None = None,
             branch: str | None = None, since: str | None = None, run_keys: list[str] | None = None,
             ) -> pd.DataFrame:
        """Run-level rows (``ROW_COLUMNS``) matching every filter given, in date order."""
        clauses, params = [], []
        for name, value in (("plugin", plugin), ("variant", variant), ("case", case), ("dimension", dimension),
                            ("metric", metric), ("fingerprint", fingerprint), ("branch", branch)):
            if value is not None:
                clauses.append(f"{_FILTERS[name]} = ?")
                params.append(value)
        if since is not None:
            clauses.append("r.run_date >= ?")
            params.append(since)
        if run_keys is not None:
            clauses.append(f"r.run_key IN ({', '.join('?' for _ in run_keys) or 'NULL'})")
            params.extend(run_keys)
        where = " WHERE " + " AND ".join(clauses) if clauses else ""
        order = " ORDER BY r.run_date, r.run_key, m.plugin, m.case_id, m.dimension, m.metric, m.variant"
        data = self._conn.execute(_ROWS_SQL + where + order, params).fetchall()
        return plain_text(pd.DataFrame(data, columns=list(ROW_COLUMNS)))

    def series(self, plugin: str, variant: str, case: str, dimension: str | None, metric: str,
               fingerprint: str | None = None, since: str | None = None) -> pd.DataFrame:
        """One measurement's run-level values in date order (``dimension`` None: the metric's only one)."""
        frame = self.rows(plugin=plugin, variant=variant, case=case, dimension=dimension, metric=metric,
                          fingerprint=fingerprint, since=since)
        if dimension is None and frame["dimension"].nunique() > 1:
            raise ValueError(f"metric {metric!r} is recorded under several dimensions "
                             f"({', '.join(sorted(frame['dimension'].unique()))}); pass dimension=")
        return frame.reset_index(drop=True)

    def between_run_noise(self, plugin: str, variant: str, case: str, metric: str, fingerprint: str, *,
                          dimension: str | None = None, last_n: int = 20) -> float | None:
        """The run-to-run standard deviation of this measurement on this machine, or None (too few runs).

        On the scale ``microscope.stats.between_runs`` compares on: of log values (about the CV) for
        times, memory and rates, of the values otherwise. Taken from runs of one commit repeated, when
        there are at least 3 such repeat pairs (pure machine noise); else from the successive differences
        of the last ``last_n`` runs, leaving out those across a detected step (``robust_noise``: a slow
        drift does not count as noise either). Needs 2 such differences.
        """
        frame = self.series(plugin, variant, case, dimension, metric, fingerprint=fingerprint)
        frame = frame[(frame["status"] == "ok") & np.isfinite(frame["value"])]
        if not len(frame):
            return None
        log = log_scale(str(frame["dimension"].iloc[0]), metric)
        if log:
            frame = frame[frame["value"] > 0]
        x = np.log(frame["value"].to_numpy()) if log else frame["value"].to_numpy()
        commits = frame["commit"].astype(str).to_numpy()
        repeat_diffs = [float(d) for c in dict.fromkeys(commits) for d in np.diff(x[commits == c])]
        if len(repeat_diffs) >= 3:
            return 1.4826 * float(np.median(np.abs(repeat_diffs))) / math.sqrt(2.0)
        steps, _ = series_changes(frame.reset_index(drop=True))
        segments = np.split(x[-last_n:], [s.index - max(0, x.size - last_n) for s in steps
                                         if s.index > x.size - last_n])
        diffs = np.concatenate([np.diff(seg) for seg in segments])
        return robust_noise(np.cumsum(np.r_[0.0, diffs])) if diffs.size >= 2 else None

    def last_good(self, fingerprint: str | None = None, branch: str | None = None,
                  plugin: str | None = None) -> RunInfo | None:
        """The newest run whose gate passed (on this machine, branch, plugin when given)."""
        good = [r for r in self.runs(fingerprint=fingerprint, branch=branch, plugin=plugin) if r.gate == "pass"]
        return good[-1] if good else None

    def _matching(self, ref: str, fingerprint: str | None) -> list[RunInfo]:
        if ref == LAST_GOOD:
            good = [r for r in self.runs(fingerprint=fingerprint) if r.gate == "pass"]
            return good[-1:]
        exact = [r for r in self._run_infos("WHERE r.run_id = ? OR r.run_key = ?", (ref, ref))
                 if fingerprint is None or r.fingerprint == fingerprint]
        if exact:
            return exact
        on_branch = self.runs(branch=ref, fingerprint=fingerprint)
        if on_branch:
            return [r for r in on_branch if r.commit == on_branch[-1].commit]
        if len(ref) >= 4 and all(c in "0123456789abcdef" for c in ref.lower()):
            runs = self.runs(commit=ref.lower(), fingerprint=fingerprint)
            commits = sorted({r.commit.split("+")[0] for r in runs})
            if len(commits) > 1:
                raise HistoryError(f"{self.path}: {ref!r} is ambiguous: commits {', '.join(c[:12] for c in commits)}")
            return runs
        return []

    def resolve(self, ref: str, fingerprint: str | None = None) -> list[RunInfo]:
        """The runs a reference names: ``last-good`` (the newest run whose gate passed), a run id or key, a
        branch (the runs of its newest commit) or a commit sha prefix (all its runs); on machine
        ``fingerprint`` when given. ``HistoryError`` when none match, when the reference is ambiguous, or
        when it ran only on other machines: comparing timings across machines would report the machine,
        not the code."""
        found = self._matching(ref, fingerprint)
        if found:
            return found
        elsewhere = self._matching(ref, None) if fingerprint is not None else []
        if elsewhere:
            names = {r.fingerprint: machine_summary(r.env) for r in elsewhere}
            shown = "; ".join(f"{fp} = {name}" for fp, name in names.items())
            raise HistoryError(f"{self.path}: {ref!r} ran only on other machine(s) ({shown}), not on {fingerprint}; "
                               "timings from another machine are not comparable: run the baseline on this machine")
        if ref == LAST_GOOD:
            raise HistoryError(f"{self.path}: no run has passed its gate yet; nothing to call {LAST_GOOD}")
        raise HistoryError(f"{self.path}: no run matches {ref!r} (a commit, branch, run id or {LAST_GOOD!r})")

    def baseline_records(self, ref: str, fingerprint: str) -> pd.DataFrame:
        """Run-level rows (``ROW_COLUMNS``) of the runs ``ref`` names on machine ``fingerprint`` (``resolve``)."""
        return self.rows(run_keys=[r.key for r in self.resolve(ref, fingerprint)])


def series_changes(frame: pd.DataFrame) -> tuple[list[Step], Drift | None]:
    """Steps and drift in one series (a ``History.series`` frame). ``Step.index`` is a row of ``frame``.

    The noise is the series' own run-to-run noise, never below what the runs' CIs show (within-run noise
    is a floor for between-run noise); failed runs are skipped.
    """
    if not len(frame):
        return [], None
    dimension, metric = str(frame["dimension"].iloc[0]), str(frame["metric"].iloc[0])
    log = log_scale(dimension, metric)
    ok = (frame["status"] == "ok").to_numpy()
    values = np.where(ok, frame["value"].to_numpy(dtype=float), np.nan)
    lo, hi = frame["ci_low"].to_numpy(dtype=float), frame["ci_high"].to_numpy(dtype=float)
    with np.errstate(divide="ignore", invalid="ignore"):
        width = (np.log(hi) - np.log(lo)) if log else (hi - lo)
    width = width[ok & np.isfinite(width)]
    floor = float(np.median(width)) / (2 * 1.96) if width.size else 0.0
    min_change = default_min_change(dimension, metric)
    steps = detect_steps(values, frame["commit"].astype(str).tolist(), log=log, noise_floor=floor,
                         min_change=min_change)
    drift = detect_drift(values, log=log, since=steps[-1].index if steps else 0, min_change=min_change)
    return steps, drift


def default_gate(results_dir: Path) -> bool:
    """Whether a saved run passes the default gate (``microscope.gate``, ``GateConfig()``) over its table."""
    from microscope.gate import evaluate  # imports the config layer (and torch): only when needed

    from .comparison import read_comparison
    from .records import read_records_lenient, records_from_rows

    folder = Path(results_dir)
    records = records_from_rows(read_records_lenient(folder / "records.jsonl")[0])
    return evaluate(read_comparison(folder)[0], records).passed
