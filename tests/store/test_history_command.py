"""``microscope history add | show`` end to end on simulated nights: the planted step is printed with its
commit range and drawn in the trend plot; bad files, filters and machines exit 2 with their message."""

from __future__ import annotations

import re

import pytest
from history_fixtures import CASE, ENV_A100, Night, commit_sha, write_night, write_nights

from microscope.cli import main
from microscope.env import machine_fingerprint
from microscope.history_command import append_run_to_history
from microscope.store.history import History

RANGE = f"{commit_sha(2)[:8]}..{commit_sha(3)[:8]}"


@pytest.fixture
def nights(tmp_path):
    """Five nights in results/, the triton latency +5% from the fourth (commit 3) on."""
    write_nights(tmp_path / "results", 5, step_at=3)
    return tmp_path


def _add_all(tmp_path, capsys) -> str:
    assert main(["history", "add", str(tmp_path / "results"), "--db", str(tmp_path / "h.sqlite")]) == 0
    return capsys.readouterr().out


def test_add_then_show_prints_the_step_at_its_commit(nights, capsys):
    out = _add_all(nights, capsys)
    assert out.count("added ") == 5 and f"commit {commit_sha(0)[:8]}, branch main" in out
    assert "NVIDIA H200 (sm 9.0, driver 570.86.15, 140 GiB)" in out
    assert main(["history", "add", str(nights / "results"), "--db", str(nights / "h.sqlite")]) == 0
    assert capsys.readouterr().out.count("already in ") == 5

    assert main(["history", "show", "--db", str(nights / "h.sqlite"), "--plugin", "safe_softmax"]) == 0
    out = capsys.readouterr().out
    assert "one row per series" in out and "2 step(s) detected in 7 series:" in out
    # the latency itself and the latency relative to the baseline's in the same rounds
    lines = [x for x in out.splitlines() if x.strip().startswith("step ")]
    assert len(lines) == 2 and "throughput latency_vs_baseline" in lines[1]
    assert re.search(r"latency_vs_baseline on \w{12}: \+[3-7]\.\d% \(0\.\d+ -> 0\.\d+ ratio\)", lines[1])
    line = lines[0]
    assert f"safe_softmax | triton | {CASE} | throughput latency_ms" in line
    assert f"in {RANGE}, 3 run(s) before, 2 after (2026-12-03 -> 2026-12-04)" in line
    assert re.search(r"latency_ms on \w{12}: \+[3-7]\.\d% \(0\.\d+ -> 0\.\d+ ms\)", line)


def test_show_one_series_lists_its_runs_and_marks_the_step_row(nights, capsys):
    _add_all(nights, capsys)
    assert main(["history", "show", "--db", str(nights / "h.sqlite"), "--variant", "triton", "--metric",
                 "latency_ms", "--case", "4096"]) == 0
    out = capsys.readouterr().out
    rows = [x for x in out.splitlines() if "2026-12-0" in x and "main" in x]
    assert len(rows) == 5 and all("faster" in r for r in rows)
    assert re.search(rf"up \+[3-7]\.\d% from {RANGE}", rows[3]) and RANGE not in rows[2]


@pytest.mark.parametrize("suffix", [".png", ".svg"])
def test_plot_writes_the_trend_chart(nights, capsys, suffix):
    _add_all(nights, capsys)
    plot = nights / f"trend{suffix}"
    assert main(["history", "show", "--db", str(nights / "h.sqlite"), "--metric", "latency_ms", "--plot",
                 str(plot)]) == 0
    assert f"trend plot: {plot}" in capsys.readouterr().out
    data = plot.read_bytes()
    assert data.startswith(b"\x89PNG") if suffix == ".png" else RANGE.encode() in data


def test_a_corrupted_history_file_exits_2_naming_it(nights, capsys):
    _add_all(nights, capsys)
    db = nights / "h.sqlite"
    data = bytearray(db.read_bytes())
    data[4096:8192] = b"\xa5" * 4096
    db.write_bytes(bytes(data))
    assert main(["history", "show", "--db", str(db)]) == 2
    err = capsys.readouterr().err
    assert f"error: {db}: corrupt history database" in " ".join(err.split())


def test_a_history_from_another_machine_exits_2_with_its_message(tmp_path, capsys):
    folder = write_night(tmp_path / "results", Night(0, env=dict(ENV_A100)))
    db = tmp_path / "h.sqlite"
    append_run_to_history(folder, db, passed=True)
    assert main(["history", "show", "--db", str(db), "--machine", "0123456789ab"]) == 2
    err = " ".join(capsys.readouterr().err.split())
    assert f"{db}: this history holds no run from machine 0123456789ab (only from: " \
           f"{machine_fingerprint(ENV_A100)} = NVIDIA A100-SXM4-80GB" in err and "not comparable" in err


def test_filters_that_match_nothing_and_bad_arguments_exit_2(nights, capsys):
    _add_all(nights, capsys)
    db = str(nights / "h.sqlite")
    assert main(["history", "show", "--db", db, "--plugin", "flash_attn"]) == 2
    assert "no history rows for --plugin 'flash_attn'; plugins here: safe_softmax" in capsys.readouterr().err
    assert main(["history", "show", "--db", db, "--metric", "latency_us"]) == 2
    assert "metrics here: gbps, latency_ms, latency_vs_baseline, out.rel_err, peak_bytes" in capsys.readouterr().err
    assert main(["history", "show", "--db", db, "--since", "yesterday"]) == 2
    assert "--since 'yesterday': not an ISO date" in capsys.readouterr().err
    assert main(["history", "show", "--db", db, "--since", "2027-01-01"]) == 2
    assert "no history rows match these filters together since 2027-01-01" in capsys.readouterr().err
    assert main(["history", "show", "--db", db, "--plot", str(nights / "trend.pdf")]) == 2
    assert "write the trend chart as a .png or .svg file" in capsys.readouterr().err
    assert main(["history", "show", "--db", str(nights / "none.sqlite")]) == 2
    assert "none.sqlite: no history here" in capsys.readouterr().err
    assert main(["history", "add", str(nights / "missing"), "--db", db]) == 2
    assert "neither a run folder" in capsys.readouterr().err


def test_append_run_to_history_reports_what_it_did(tmp_path):
    root, db = tmp_path / "results", tmp_path / "h.sqlite"
    first = append_run_to_history(write_night(root, Night(0)), db, branch="nightly", passed=False)
    assert first.status == "added" and first.info.branch == "nightly" and first.info.gate == "fail"
    assert first.rows == 9 and first.notes == []
    assert "added" in first.describe(db) and "gate fail" in first.describe(db)
    other = append_run_to_history(write_night(root, Night(1, env=dict(ENV_A100))), db, passed=True)
    assert other.notes and "first run of machine" in other.notes[0]
    with History.open(db) as h:
        assert [r.gate for r in h.runs()] == ["fail", "pass"]
