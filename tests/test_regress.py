"""``microscope regress`` where it must refuse before running anything (exit 2, a paragraph and a report),
``run --history``'s append, ``report --history``'s Trends section and ``history add --commit``.

Nothing here runs a config: a history from another machine, a corrupted or missing history and an
unknown reference are found before the night is spent. The suite itself runs in ``test_nightly.py``.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "store"))
from history_fixtures import ENV_A100, Night, commit_sha, write_night, write_nights  # noqa: E402

from microscope.cli import main  # noqa: E402
from microscope.env import machine_fingerprint  # noqa: E402
from microscope.history_command import append_run_to_history  # noqa: E402
from microscope.store.history import History  # noqa: E402

ROOT = Path(__file__).resolve().parents[1]
CONFIG = str(ROOT / "ablations" / "nightly" / "planted_work.yaml")


def _regress(tmp_path, *args: str) -> int:
    return main(["regress", CONFIG, "--device", "cpu", "--quick", "--out", str(tmp_path / "out"), *args])


def _said(capsys) -> str:
    captured = capsys.readouterr()
    return " ".join((captured.out + captured.err).split())


def test_a_history_of_another_machine_is_no_baseline(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    append_run_to_history(write_night(tmp_path / "results", Night(0, env=dict(ENV_A100))), db, passed=True)
    assert _regress(tmp_path, "--baseline", "last-good", "--history", str(db)) == 2
    out = _said(capsys)
    assert "regress: COULD NOT MEASURE (exit 2)" in out
    assert f"no comparable baseline: {db}: 'last-good' ran only on other machine(s) " \
           f"({machine_fingerprint(ENV_A100)} = NVIDIA A100-SXM4-80GB" in out
    assert "timings from another machine are not comparable" in out and "start the history on this machine" in out
    report = (tmp_path / "out" / "regress.md").read_text()
    assert report.startswith("## regress: COULD NOT MEASURE (exit 2)") and "ran only on other machine" in report
    assert not (tmp_path / "out" / "runs").exists()  # nothing was run


def test_a_corrupted_history_and_an_unknown_reference_exit_2_with_their_message(tmp_path, capsys):
    db = tmp_path / "h.sqlite"
    write_nights(tmp_path / "results", 2)
    assert main(["history", "add", str(tmp_path / "results"), "--db", str(db)]) == 0
    capsys.readouterr()
    assert _regress(tmp_path, "--baseline", "0123abcd", "--history", str(db)) == 2
    assert f"no comparable baseline: {db}: no run matches '0123abcd'" in _said(capsys)
    data = bytearray(db.read_bytes())
    data[4096:8192] = b"\xa5" * 4096
    db.write_bytes(bytes(data))
    assert _regress(tmp_path, "--baseline", "last-good", "--history", str(db)) == 2
    assert f"Could not measure tonight: no comparable baseline: {db}: corrupt history database" in _said(capsys)
    assert _regress(tmp_path, "--baseline", "last-good", "--history", str(tmp_path / "none.sqlite")) == 2
    assert "none.sqlite: no history here" in _said(capsys)


def _damage(db: Path, how: str) -> str:
    """Damage a filled history ``how``; returns the message the gate must print."""
    import sqlite3

    if how == "truncated":
        data = db.read_bytes()
        db.write_bytes(data[: len(data) // 2])
        return "truncated: its header says"
    if how == "future schema":
        with sqlite3.connect(db) as conn:
            conn.execute("INSERT INTO schema_version VALUES (99, '2030-01-01', 'from the future')")
        return "history schema version 99 was written by a newer microscope"
    if how == "foreign":
        db.unlink()
        with sqlite3.connect(db) as conn:
            conn.execute("CREATE TABLE accounts (id INTEGER)")
        return "an SQLite database, but not a microscope history (its tables: accounts)"
    db.write_text('{"runs": []}\n')
    return "not an SQLite database"


@pytest.mark.parametrize("how", ["truncated", "future schema", "foreign", "text"])
def test_a_damaged_history_is_never_started_over_and_nothing_runs(tmp_path, capsys, how):
    db = tmp_path / "h.sqlite"
    write_nights(tmp_path / "results", 3)
    assert main(["history", "add", str(tmp_path / "results"), "--db", str(db)]) == 0
    message = _damage(db, how)
    before = _content(db)
    assert _regress(tmp_path, "--baseline", "last-good", "--history", str(db), "--append") == 2
    out = _said(capsys)
    assert f"Could not measure tonight: no comparable baseline: {db}: " in out and message in out
    assert f"Nothing was run and {db} was left as it is" in out
    assert _content(db) == before and not (tmp_path / "out" / "runs").exists()


def _content(db: Path) -> object:
    """What a file holds: its SQL dump where SQLite reads it (a WAL checkpoint may move its bytes), else bytes."""
    import sqlite3

    try:
        with sqlite3.connect(db) as conn:
            return list(conn.iterdump())
    except sqlite3.DatabaseError:
        return db.read_bytes()


def test_last_good_is_every_passing_run_of_its_commit_and_the_previous_night_follows_it(tmp_path):
    from microscope.regress import previous_night, resolve_baseline
    from microscope.store.history import LAST_GOOD

    db = tmp_path / "h.sqlite"
    folders = write_nights(tmp_path / "results", 6)
    same_commit = write_night(tmp_path / "repeat", Night(2, seed=1))  # night 2 run again an hour later
    records = same_commit / "records.jsonl"
    records.write_text(records.read_text().replace("-020000-", "-030000-").replace("T02:00:05", "T03:00:05"))
    for i, folder in enumerate(folders):
        append_run_to_history(folder, db, passed=i <= 2)  # nights 3, 4, 5 failed their gate
    append_run_to_history(same_commit, db, passed=True)
    fingerprint = machine_fingerprint(Night(0).env)
    with History.open(db) as history:
        base = resolve_baseline(history, LAST_GOOD, fingerprint)
        assert {r.commit for r in base} == {commit_sha(2)} and len(base) == 2
        previous = previous_night(history, fingerprint, base)
        assert [r.commit for r in previous] == [commit_sha(5)]  # the newest night after the baseline
        assert [r.commit for r in resolve_baseline(history, commit_sha(4)[:10], fingerprint)] == [commit_sha(4)]
        assert previous_night(history, fingerprint, resolve_baseline(history, commit_sha(5), fingerprint)) == []


@pytest.mark.parametrize("args, message", [
    ([], "regress needs --baseline REF"),
    (["--baseline", "last-good", "--repeat", "1"], "--repeat 1: the statistical gate needs at least 2 fresh runs"),
    (["--exact", "missing.json"], "missing.json: no such baseline file"),
    (["--baseline", "last-good", "--alpha", "2"], "--alpha 2.0: must lie between 0 and 1"),
    (["--baseline", "last-good", "--set", "nonsense"], "nonsense"),
])
def test_bad_input_exits_2_before_anything_runs(tmp_path, capsys, args, message):
    assert _regress(tmp_path, *args) == 2
    assert message in _said(capsys)
    assert main(["regress", str(tmp_path / "nowhere.yaml"), "--exact", "x.json"]) == 2
    assert "nowhere.yaml: no such config or folder of configs" in _said(capsys)


def test_run_history_appends_with_the_gate_and_refuses_a_damaged_file(tmp_path, capsys):
    from rich.console import Console

    from microscope import commands

    folder = write_night(tmp_path / "results", Night(0))
    db = tmp_path / "h.sqlite"
    args = argparse.Namespace(history=db, no_report=True)
    assert commands._append_history(args, 1, folder, Console()) == 1
    assert commands._append_history(args, 130, folder, Console()) == 130  # interrupted: not added
    with History.open(db) as history:
        assert [r.gate for r in history.runs()] == ["fail"]
    db.write_text("not a database")
    with pytest.raises(commands.UserError, match="h.sqlite"):
        commands._append_history(args, 0, folder, Console())


def test_report_history_draws_the_trends_with_the_step_and_its_commit_range(tmp_path, capsys):
    folders = write_nights(tmp_path / "results", 5, step_at=3)
    db = tmp_path / "h.sqlite"
    assert main(["history", "add", str(tmp_path / "results"), "--db", str(db)]) == 0
    assert main(["report", str(folders[-1]), "--history", str(db), "--out", str(tmp_path / "rep"),
                 "--format", "html"]) == 0
    html = (tmp_path / "rep" / f"{folders[-1].name}.html").read_text()
    section = html[html.index('<section id="trends">'):]
    section = section[:section.index("</section>")]
    rng = f"{commit_sha(2)[:8]}..{commit_sha(3)[:8]}"
    assert "step in triton: +" in section and f"in {rng}, 3 run(s) before, 2 after" in section
    assert section.count("<svg") >= 1 and rng in section
    other = write_night(tmp_path / "other", Night(9, env=dict(ENV_A100)))
    assert main(["report", str(other), "--history", str(db), "--out", str(tmp_path / "rep"), "--format", "html"]) == 0
    assert "holds no run from this run&#39;s machine" in (tmp_path / "rep" / f"{other.name}.html").read_text()
    (tmp_path / "bad.sqlite").write_text("no")
    assert main(["report", str(other), "--history", str(tmp_path / "bad.sqlite"), "--out", str(tmp_path / "rep")]) == 2
    assert "bad.sqlite" in _said(capsys)


def test_history_add_commit_labels_a_run(tmp_path, capsys):
    folder = write_night(tmp_path / "results", Night(0))
    db = tmp_path / "h.sqlite"
    assert main(["history", "add", str(folder), "--db", str(db), "--commit", "night-3"]) == 0
    assert "commit night-3" in _said(capsys)
    with History.open(db) as history:
        assert [r.commit for r in history.runs()] == ["night-3"]
