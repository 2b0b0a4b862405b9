"""The history database's schema, its migrations, and the checks that refuse a file that is not one.

A history outlives the microscope that wrote it: nightly jobs add to it for years, across upgrades. So
the schema carries a version (table ``schema_version``, one row per migration applied), and
``MIGRATIONS`` is the ordered list of functions that take a database from one version to the next;
opening an older file applies the missing ones in one transaction and keeps every row. A file from a
*newer* microscope is refused, never rewritten: this version cannot know what the newer columns mean.

The SQL is portable (plain tables, composite primary keys, ``TEXT``/``INTEGER``/``DOUBLE PRECISION``,
``ALTER TABLE ... ADD COLUMN``, views, no SQLite-only functions or ``INSERT OR ...``), so a server
database can sit behind the same ``History`` interface later; only the connection set-up
(WAL, ``BEGIN IMMEDIATE``, ``PRAGMA quick_check``) is SQLite's.

Versions:

1. ``runs`` (one row per run: its commit, branch, date, machine fingerprint, gate outcome, the
   environment as JSON) and ``measurements`` (one row per run x plugin x variant x case x dimension x
   metric: run-level value, CI, n, status, verdict).
2. ``run_env``: the environment as one row per key (queryable without JSON functions, which differ
   between databases), filled from the JSON of version-1 runs; ``measurements.role`` and ``.unit``;
   the ``history`` view joining both tables into one row per measurement with its run's columns.
"""

from __future__ import annotations

import json
import sqlite3
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path

__all__ = ["APPLICATION", "CURRENT_VERSION", "MIGRATIONS", "HistoryError", "check_file", "current_version",
           "damage", "env_rows", "migrate", "newer_schema"]

#: The marker in ``history_meta`` that tells our database from any other SQLite file.
APPLICATION = "microscope-history"
SQLITE_MAGIC = b"SQLite format 3\x00"


class HistoryError(Exception):
    """A history file that cannot be used; the message names the file and what is wrong with it."""


def _v1(conn: sqlite3.Connection) -> None:
    conn.execute("CREATE TABLE history_meta (meta_key TEXT PRIMARY KEY, meta_value TEXT NOT NULL)")
    conn.execute("INSERT INTO history_meta (meta_key, meta_value) VALUES ('application', ?)", (APPLICATION,))
    conn.execute("""CREATE TABLE runs (
        run_key TEXT PRIMARY KEY,
        run_id TEXT NOT NULL,
        commit_sha TEXT NOT NULL,
        branch TEXT NOT NULL,
        run_date TEXT NOT NULL,
        fingerprint TEXT NOT NULL,
        gate TEXT,
        source TEXT NOT NULL,
        digest TEXT NOT NULL,
        env_json TEXT NOT NULL,
        added_at TEXT NOT NULL)""")
    conn.execute("CREATE INDEX runs_by_machine ON runs (fingerprint, run_date)")
    conn.execute("""CREATE TABLE measurements (
        run_key TEXT NOT NULL REFERENCES runs (run_key),
        plugin TEXT NOT NULL,
        variant TEXT NOT NULL,
        case_id TEXT NOT NULL,
        dimension TEXT NOT NULL,
        metric TEXT NOT NULL,
        value DOUBLE PRECISION,
        ci_low DOUBLE PRECISION,
        ci_high DOUBLE PRECISION,
        n INTEGER,
        status TEXT NOT NULL,
        verdict TEXT,
        PRIMARY KEY (run_key, plugin, variant, case_id, dimension, metric))""")
    conn.execute("CREATE INDEX measurements_by_series ON measurements (plugin, metric, variant, case_id)")


def _v2(conn: sqlite3.Connection) -> None:
    conn.execute("""CREATE TABLE run_env (
        run_key TEXT NOT NULL REFERENCES runs (run_key),
        env_key TEXT NOT NULL,
        env_value TEXT,
        PRIMARY KEY (run_key, env_key))""")
    rows = conn.execute("SELECT run_key, env_json FROM runs").fetchall()
    for run_key, env_json in rows:
        conn.executemany("INSERT INTO run_env (run_key, env_key, env_value) VALUES (?, ?, ?)",
                         env_rows(run_key, json.loads(env_json or "{}")))
    conn.execute("ALTER TABLE measurements ADD COLUMN role TEXT")
    conn.execute("ALTER TABLE measurements ADD COLUMN unit TEXT")
    conn.execute("""CREATE VIEW history AS
        SELECT r.run_id, r.commit_sha, r.branch, r.run_date, r.fingerprint, r.gate, m.*
        FROM measurements m JOIN runs r ON r.run_key = m.run_key""")


#: (version, what it adds, the function that adds it), in order; never edit a shipped entry, append one.
MIGRATIONS: list[tuple[int, str, Callable[[sqlite3.Connection], None]]] = [
    (1, "runs and run-level measurements", _v1),
    (2, "environment as rows, role and unit per measurement, history view", _v2),
]
CURRENT_VERSION = MIGRATIONS[-1][0]


def env_rows(run_key: str, env: dict) -> list[tuple[str, str, str | None]]:
    """``run_env`` rows of one run: scalars as text, anything nested as JSON."""
    def text(v: object) -> str | None:
        if v is None or isinstance(v, str):
            return v
        return json.dumps(v, sort_keys=True, default=str)

    return [(run_key, str(k), text(v)) for k, v in sorted(env.items())]


def _tables(conn: sqlite3.Connection) -> list[str]:
    rows = conn.execute("SELECT name FROM sqlite_master WHERE type IN ('table', 'view') ORDER BY name")
    return [r[0] for r in rows]


def current_version(conn: sqlite3.Connection, path: Path) -> int:
    """The schema version of an open database: 0 when it is empty, else what ``schema_version`` says.

    A database with tables but without our marker is someone else's: ``HistoryError``.
    """
    tables = _tables(conn)
    if not tables:
        return 0
    if "history_meta" not in tables or "schema_version" not in tables:
        shown = ", ".join(tables[:8]) + (" ..." if len(tables) > 8 else "")
        raise HistoryError(f"{path}: an SQLite database, but not a microscope history (its tables: {shown}); "
                           "pass the history file (default results/history.sqlite) or a new path")
    marker = conn.execute("SELECT meta_value FROM history_meta WHERE meta_key = 'application'").fetchone()
    if marker is None or marker[0] != APPLICATION:
        raise HistoryError(f"{path}: an SQLite database, but not a microscope history (application marker "
                           f"{marker[0] if marker else 'missing'!r}, expected {APPLICATION!r})")
    row = conn.execute("SELECT MAX(version) FROM schema_version").fetchone()
    if row is None or row[0] is None:
        raise HistoryError(f"{path}: a microscope history without a schema version (schema_version is empty); "
                           "the file was damaged or written by hand")
    return int(row[0])


def migrate(conn: sqlite3.Connection, path: Path, target: int = CURRENT_VERSION) -> int:
    """Bring an open database (inside a write transaction) to ``target``; return the version it had.

    A version above the newest this microscope knows is refused: ``HistoryError``, nothing written.
    """
    found = current_version(conn, path)
    if found > CURRENT_VERSION:
        raise newer_schema(path, found)
    if found == 0:
        conn.execute("CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL, "
                     "description TEXT NOT NULL)")
    now = datetime.now(timezone.utc).isoformat(timespec="seconds")
    for version, description, step in MIGRATIONS:
        if found < version <= target:
            step(conn)
            conn.execute("INSERT INTO schema_version (version, applied_at, description) VALUES (?, ?, ?)",
                         (version, now, description))
    return found


def newer_schema(path: Path, found: int) -> HistoryError:
    return HistoryError(f"{path}: history schema version {found} was written by a newer microscope (this one "
                        f"reads up to version {CURRENT_VERSION}); upgrade microscope to use this file")


def check_file(path: Path) -> None:
    """Refuse, before SQLite opens it, a path that is a folder or a file that is not an SQLite database."""
    if path.is_dir():
        raise HistoryError(f"{path}: a folder, not a history file; pass e.g. {path / 'history.sqlite'}")
    try:
        with path.open("rb") as fh:
            head = fh.read(100)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot read the history file ({exc.strerror or exc})") from exc
    if not head:
        return  # an empty file is an empty database
    if not head.startswith(SQLITE_MAGIC):
        shown = head[:16].decode("ascii", errors="replace").replace("\ufffd", "?")
        shown = "".join(c if c.isprintable() else "?" for c in shown)
        raise HistoryError(f"{path}: not an SQLite database (it starts with {shown!r}, not 'SQLite format 3'); "
                           "is this the history file?")
    if len(head) < 100:
        raise HistoryError(f"{path}: truncated: {len(head)} bytes, shorter than an SQLite header (100 bytes)")


def damage(path: Path, detail: str) -> HistoryError:
    """The error for a database SQLite finds damaged: "truncated" when the file is shorter than its header
    says, else "corrupt", with SQLite's own words."""
    size = path.stat().st_size if path.exists() else 0
    try:
        with path.open("rb") as fh:
            head = fh.read(100)
    except OSError:
        head = b""
    if len(head) == 100:
        page_size = int.from_bytes(head[16:18], "big")
        page_size = 65536 if page_size == 1 else page_size
        pages = int.from_bytes(head[28:32], "big")
        valid = head[24:28] == head[92:96]  # the header's page count is valid only when these agree
        if valid and pages and size < pages * page_size:
            return HistoryError(f"{path}: truncated: its header says {pages} pages of {page_size} bytes "
                                f"({pages * page_size} bytes) but the file holds {size}; restore it from a backup "
                                "or start a new history")
    return HistoryError(f"{path}: corrupt history database ({detail}); restore it from a backup or start a new "
                        "history")
