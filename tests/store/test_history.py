"""The history store: schema and migrations, idempotent and concurrent adds, damaged files, queries,
and a planted step found at its commit in simulated nights."""

from __future__ import annotations

import json
import math
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest
from history_fixtures import CASE, ENV_A100, ENV_H200, Night, commit_sha, write_night, write_nights

from microscope.env import machine_fingerprint
from microscope.store.history import LAST_GOOD, History, HistoryError, series_changes
from microscope.store.history_schema import CURRENT_VERSION
from microscope.store.run_summary import summarize_run

FP_H200 = machine_fingerprint(ENV_H200)
FP_A100 = machine_fingerprint(ENV_A100)


def _fill(db: Path, folders: list[Path], passed: bool = True) -> None:
    with History.open(db, create=True) as h:
        for folder in folders:
            h.add_run(folder, passed=passed)


def _count(db: Path, table: str) -> int:
    with sqlite3.connect(db) as conn:
        return conn.execute(f"SELECT COUNT(*) FROM {table}").fetchone()[0]


# -- schema ---------------------------------------------------------------------------------------------


def test_new_history_has_the_current_schema_in_wal_mode(tmp_path):
    db = tmp_path / "sub" / "history.sqlite"
    with History.open(db, create=True) as h:
        assert h.version == CURRENT_VERSION
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
        versions = [r[0] for r in conn.execute("SELECT version FROM schema_version ORDER BY version")]
        assert versions == list(range(1, CURRENT_VERSION + 1))
        tables = {r[0] for r in conn.execute("SELECT name FROM sqlite_master")}
    assert {"runs", "measurements", "run_env", "history", "history_meta"} <= tables


V1_SQL = """
CREATE TABLE schema_version (version INTEGER PRIMARY KEY, applied_at TEXT NOT NULL, description TEXT NOT NULL);
INSERT INTO schema_version VALUES (1, '2026-11-01T00:00:00+00:00', 'runs and run-level measurements');
CREATE TABLE history_meta (meta_key TEXT PRIMARY KEY, meta_value TEXT NOT NULL);
INSERT INTO history_meta VALUES ('application', 'microscope-history');
CREATE TABLE runs (run_key TEXT PRIMARY KEY, run_id TEXT NOT NULL, commit_sha TEXT NOT NULL, branch TEXT NOT NULL,
  run_date TEXT NOT NULL, fingerprint TEXT NOT NULL, gate TEXT, source TEXT NOT NULL, digest TEXT NOT NULL,
  env_json TEXT NOT NULL, added_at TEXT NOT NULL);
CREATE INDEX runs_by_machine ON runs (fingerprint, run_date);
CREATE TABLE measurements (run_key TEXT NOT NULL REFERENCES runs (run_key), plugin TEXT NOT NULL,
  variant TEXT NOT NULL, case_id TEXT NOT NULL, dimension TEXT NOT NULL, metric TEXT NOT NULL,
  value DOUBLE PRECISION, ci_low DOUBLE PRECISION, ci_high DOUBLE PRECISION, n INTEGER, status TEXT NOT NULL,
  verdict TEXT, PRIMARY KEY (run_key, plugin, variant, case_id, dimension, metric));
CREATE INDEX measurements_by_series ON measurements (plugin, metric, variant, case_id);
"""


def test_a_version_1_history_is_migrated_and_keeps_its_rows(tmp_path):
    db = tmp_path / "old.sqlite"
    conn = sqlite3.connect(db)
    conn.executescript(V1_SQL)  # frozen here: what a version-1 file looks like, whatever the code says now
    env = json.dumps(ENV_H200 | {"commit": "a" * 40})
    conn.execute("INSERT INTO runs VALUES ('k1', 'night-1', ?, 'main', '2026-11-02T02:00:00+00:00', ?, 'pass', "
                 "'/r/1', 'd1', ?, '2026-11-02T03:00:00+00:00')", ("a" * 40, FP_H200, env))
    conn.execute("INSERT INTO measurements VALUES ('k1', 'safe_softmax', 'triton', ?, 'throughput', 'latency_ms', "
                 "0.5, 0.49, 0.51, 20, 'ok', 'faster')", (CASE,))
    conn.commit()
    conn.close()

    with History.open(db) as h:
        assert h.version == CURRENT_VERSION
        rows = h.rows()
        assert len(rows) == 1 and rows["value"].iloc[0] == 0.5 and rows["verdict"].iloc[0] == "faster"
        assert rows["commit"].iloc[0] == "a" * 40 and rows["role"].iloc[0] is None
        assert h.runs()[0].env["device_name"] == "NVIDIA H200"
    with sqlite3.connect(db) as conn:
        env_rows = dict(conn.execute("SELECT env_key, env_value FROM run_env WHERE run_key = 'k1'").fetchall())
        view = conn.execute("SELECT run_id, value FROM history").fetchall()
    assert env_rows["gpu_driver"] == "570.86.15" and env_rows["gpu_memory_bytes"] == "150122102784"
    assert view == [("night-1", 0.5)]


# -- adding runs ------------------------------------------------------------------------------------------


def test_a_run_becomes_one_value_per_measurement(tmp_path):
    folder = write_night(tmp_path / "results", Night(0))
    summary = summarize_run(folder)
    rows = summary.rows.set_index(["variant", "metric"])
    assert len(rows) == 9  # 2 variants x (rel_err, latency, gbps, peak), triton's latency_vs_baseline
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    rounds = next(r["details"]["rounds"] for r in records if r["variant"] == "triton" and r["metric"] == "latency_ms")
    base = next(r["details"]["rounds"] for r in records if r["variant"] == "torch" and r["metric"] == "latency_ms")
    paired = rows.loc[("triton", "latency_vs_baseline")]  # round by round, not the ratio of the medians
    assert paired["value"] == pytest.approx(np.median(np.divide(rounds, base))) and paired["n"] == 20
    assert paired["value"] != pytest.approx(np.median(rounds) / np.median(base), rel=1e-9)
    assert paired["ci_low"] < paired["value"] < paired["ci_high"] and paired["unit"] == "ratio"
    lat = rows.loc[("triton", "latency_ms")]
    assert lat["value"] == pytest.approx(np.median(rounds)) and lat["n"] == 20
    assert lat["ci_low"] < lat["value"] < lat["ci_high"] and lat["ci_high"] / lat["ci_low"] < 1.03
    assert lat["verdict"] == "faster"  # the row vs the baseline, not the best-peer row ("slower")
    assert rows.loc[("torch", "latency_ms")]["verdict"] is None  # the baseline has no comparison row
    assert rows.loc[("triton", "peak_bytes")]["n"] == 1 and math.isnan(rows.loc[("triton", "peak_bytes")]["ci_low"])
    assert summary.info.fingerprint == FP_H200 and summary.info.commit == commit_sha(0)
    assert summary.info.date == "2026-12-01T02:00:05+00:00" and summary.info.env["sm_mhz_median"] == 1980


def test_an_old_comparison_table_and_a_failed_variant_are_read(tmp_path):
    folder = write_night(tmp_path / "results", Night(0, old_csv=True, failed_triton=True))
    rows = summarize_run(folder).rows.set_index(["variant", "metric"])
    failed = rows.loc[("triton", "latency_ms")]
    assert failed["status"] == "failed" and math.isnan(failed["value"]) and failed["verdict"] == "failed"
    assert rows.loc[("torch", "latency_ms")]["status"] == "ok"


def test_adding_a_run_twice_keeps_one_copy_and_a_grown_run_replaces_its_rows(tmp_path):
    folder = write_night(tmp_path / "results", Night(0))
    db = tmp_path / "h.sqlite"
    with History.open(db, create=True) as h:
        first = h.add_summary(summarize_run(folder), passed=True)
        again = h.add_summary(summarize_run(folder), passed=True)
        key = h.add_run(folder, passed=True)
        assert (first, again) == ("added", "unchanged") and len(h.runs()) == 1
        assert len(h.rows()) == 9
        extra = json.loads((folder / "records.jsonl").read_text().splitlines()[0])
        with (folder / "records.jsonl").open("a") as fh:  # a resumed run measured one more metric
            fh.write(json.dumps(extra | {"metric": "max_abs_err", "value": 0.01}) + "\n")
        assert h.add_summary(summarize_run(folder), passed=True) == "replaced"
        assert [r.key for r in h.runs()] == [key] and len(h.rows()) == 10
    assert _count(db, "runs") == 1 and _count(db, "measurements") == 10


_WRITER = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from microscope.store.history import History
    from microscope.store.run_summary import summarize_run
    db, me, other, folders = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4:]
    summaries = [summarize_run(f) for f in folders]
    me.touch()
    while not other.exists():  # both start writing together, the file not yet created
        time.sleep(0.005)
    for summary in summaries:
        with History.open(db, create=True) as h:
            h.add_summary(summary, passed=True)
""")


def test_two_processes_adding_at_once_do_not_corrupt_the_history(tmp_path):
    folders = write_nights(tmp_path / "results", 8)
    db, ready = tmp_path / "h.sqlite", [tmp_path / "ready-a", tmp_path / "ready-b"]
    writers = [subprocess.Popen([sys.executable, "-c", _WRITER, str(db), str(ready[i]), str(ready[1 - i]),
                                 *map(str, folders[i::2])], stderr=subprocess.PIPE, text=True) for i in (0, 1)]
    for proc in writers:
        _, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr
    with sqlite3.connect(db) as conn:
        assert conn.execute("PRAGMA integrity_check").fetchone()[0] == "ok"
    with History.open(db) as h:
        assert len(h.runs()) == 8 and len(h.rows()) == 72
        assert [r.commit for r in h.runs()] == [commit_sha(i) for i in range(8)]  # date order


# -- files that are not a usable history ------------------------------------------------------------------


@pytest.fixture
def filled(tmp_path) -> Path:
    db = tmp_path / "h.sqlite"
    _fill(db, write_nights(tmp_path / "results", 6))
    return db


def test_a_text_file_is_not_a_history(tmp_path):
    db = tmp_path / "history.sqlite"
    db.write_text('{"runs": []}\n')
    with pytest.raises(HistoryError, match=r"history\.sqlite: not an SQLite database \(it starts with '\{\"runs"):
        History.open(db)


def test_a_truncated_history_says_truncated(filled):
    data = filled.read_bytes()
    filled.write_bytes(data[: len(data) // 2])
    with pytest.raises(HistoryError, match=r"h\.sqlite: truncated: its header says \d+ pages"):
        History.open(filled)


def test_a_corrupted_history_says_corrupt(filled):
    data = bytearray(filled.read_bytes())
    page = int.from_bytes(data[16:18], "big")
    data[page:] = bytes(range(256)) * ((len(data) - page) // 256) + bytes((len(data) - page) % 256)
    filled.write_bytes(bytes(data))
    with pytest.raises(HistoryError, match=r"h\.sqlite: corrupt history database \("):
        History.open(filled)


def test_a_short_file_is_truncated(tmp_path):
    db = tmp_path / "h.sqlite"
    db.write_bytes(b"SQLite format 3\x00" + b"\x10\x00")
    with pytest.raises(HistoryError, match=r"h\.sqlite: truncated: 18 bytes"):
        History.open(db)


def test_a_foreign_sqlite_database_is_refused(tmp_path):
    db = tmp_path / "other.db"
    with sqlite3.connect(db) as conn:
        conn.execute("CREATE TABLE accounts (id INTEGER)")
    with pytest.raises(HistoryError, match=r"other\.db: an SQLite database, but not a microscope history "
                                           r"\(its tables: accounts\)"):
        History.open(db, create=True)
    assert _count(db, "accounts") == 0  # and nothing was added to it


def test_a_newer_schema_is_refused_and_left_alone(filled):
    with sqlite3.connect(filled) as conn:
        conn.execute("INSERT INTO schema_version VALUES (99, '2030-01-01', 'from the future')")
    with pytest.raises(HistoryError, match=r"h\.sqlite: history schema version 99 was written by a newer "
                                           r"microscope .* upgrade microscope"):
        History.open(filled, create=True)
    assert _count(filled, "runs") == 6


def test_missing_empty_and_folder_paths(tmp_path):
    with pytest.raises(HistoryError, match=r"missing\.sqlite: no history here"):
        History.open(tmp_path / "missing.sqlite")
    (tmp_path / "empty.sqlite").write_bytes(b"")
    with pytest.raises(HistoryError, match=r"empty\.sqlite: an empty database, no history yet"):
        History.open(tmp_path / "empty.sqlite")
    with pytest.raises(HistoryError, match="a folder, not a history file"):
        History.open(tmp_path)


# -- reading: steps, noise, baselines ---------------------------------------------------------------------


def _latency(h: History, variant: str = "triton", fp: str = FP_H200):
    return h.series("safe_softmax", variant, CASE, "throughput", "latency_ms", fingerprint=fp)


@pytest.mark.parametrize(("nights", "step_at"), [(5, 3), (5, 2), (8, 5)])
def test_a_planted_step_is_found_at_its_commit(tmp_path, nights, step_at):
    db = tmp_path / "h.sqlite"
    _fill(db, write_nights(tmp_path / "results", nights, step_at=step_at, factor=1.05))
    with History.open(db) as h:
        steps, drift = series_changes(_latency(h))
        assert len(steps) == 1 and drift is None
        step = steps[0]
        assert (step.commit_before, step.commit_after) == (commit_sha(step_at - 1), commit_sha(step_at))
        assert step.change == pytest.approx(0.05, abs=0.015) and step.relative
        assert series_changes(_latency(h, "torch")) == ([], None)  # the baseline did not move


def test_planted_steps_in_memory_and_accuracy_are_found(tmp_path):
    nights = [Night(i, triton_peak=268_435_456.0 * (1.25 if i >= 4 else 1.0),
                    triton_err=2.1e-3 * (3.0 if i >= 3 else 1.0)) for i in range(7)]
    db = tmp_path / "h.sqlite"
    _fill(db, [write_night(tmp_path / "results", n) for n in nights])
    with History.open(db) as h:
        memory, _ = series_changes(h.series("safe_softmax", "triton", CASE, "memory", "peak_bytes"))
        accuracy, _ = series_changes(h.series("safe_softmax", "triton", CASE, "accuracy", "out.rel_err"))
    assert [(s.commit_after, round(s.change, 3)) for s in memory] == [(commit_sha(4), 0.25)]
    assert [(s.commit_after, s.relative) for s in accuracy] == [(commit_sha(3), False)]
    assert accuracy[0].change == pytest.approx(4.2e-3)


def test_between_run_noise_is_the_night_to_night_spread(tmp_path):
    db = tmp_path / "h.sqlite"
    _fill(db, write_nights(tmp_path / "results", 12, step_at=6, between_sd=0.01, round_sd=0.002))
    with History.open(db) as h:
        noise = h.between_run_noise("safe_softmax", "triton", CASE, "latency_ms", FP_H200)
        assert 0.004 < noise < 0.02  # ~1% night to night; the +5% step is not counted as noise
        assert h.between_run_noise("safe_softmax", "triton", CASE, "latency_ms", FP_A100) is None


def test_between_run_noise_prefers_repeats_of_one_commit(tmp_path):
    nights = [Night(i, commit=commit_sha(i // 4), between_sd=0.004, round_sd=0.001) for i in range(8)]
    db = tmp_path / "h.sqlite"
    _fill(db, [write_night(tmp_path / "results", n) for n in nights])
    with History.open(db) as h:
        noise = h.between_run_noise("safe_softmax", "triton", CASE, "latency_ms", FP_H200)
    assert 0.001 < noise < 0.01


def test_last_good_and_baselines_by_commit_branch_and_machine(tmp_path):
    root, db = tmp_path / "results", tmp_path / "h.sqlite"
    with History.open(db, create=True) as h:
        for i in range(4):
            h.add_run(write_night(root, Night(i)), passed=i != 3)
        h.add_run(write_night(root, Night(4, branch="fix-softmax")), passed=True)
        h.add_run(write_night(root, Night(5, env=dict(ENV_A100))), passed=True)
        assert h.last_good(fingerprint=FP_H200).commit == commit_sha(4)
        assert h.last_good(fingerprint=FP_H200, branch="main").commit == commit_sha(2)
        assert set(h.baseline_records(LAST_GOOD, FP_H200)["commit"]) == {commit_sha(4)}
        assert set(h.baseline_records("main", FP_H200)["commit"]) == {commit_sha(3)}  # the branch tip
        by_sha = h.baseline_records(commit_sha(1)[:10], FP_H200)
        assert set(by_sha["commit"]) == {commit_sha(1)} and len(by_sha) == 9
        with pytest.raises(HistoryError, match=r"h\.sqlite: '.{10}' ran only on other machine\(s\) "
                                               rf"\({FP_A100} = NVIDIA A100-SXM4-80GB .*not comparable"):
            h.baseline_records(commit_sha(5)[:10], FP_H200)
        with pytest.raises(HistoryError, match="no run matches 'nope'"):
            h.baseline_records("nope", FP_H200)
        with pytest.raises(HistoryError, match=rf"holds no run from machine 0123456789ab \(only from: {FP_H200} = "
                                               "NVIDIA H200"):
            h.require_fingerprint("0123456789ab")


def test_the_fingerprint_ignores_software_and_tells_machines_apart():
    assert machine_fingerprint(ENV_H200) == machine_fingerprint(ENV_H200 | {"torch": "2.14", "commit": "b" * 40})
    assert machine_fingerprint(ENV_H200) != machine_fingerprint(ENV_H200 | {"gpu_driver": "580.1"})
    assert FP_H200 != FP_A100 and len(FP_H200) == 12


def test_trend_svgs_mark_the_step_with_its_commit_range(tmp_path):
    from microscope.report.trends import trend_svgs

    db = tmp_path / "h.sqlite"
    _fill(db, write_nights(tmp_path / "results", 6, step_at=3))
    with History.open(db) as h:
        charts = trend_svgs(h, "safe_softmax", FP_H200)
    titles = [t for t, _ in charts]
    assert titles[0] == f"safe_softmax | {CASE} | throughput latency_ms"  # the chart with a step comes first
    assert len(charts) == 4 and all(svg.startswith("<svg") for _, svg in charts)
    assert f"{commit_sha(2)[:8]}..{commit_sha(3)[:8]}" in charts[0][1]
