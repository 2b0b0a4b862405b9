"""The CPU nightly suite through the real CLI, as CI runs it: ``ablations/nightly/`` with ``--quick``, its
exact gates against the committed ``results/baselines/nightly_cpu.json``; a first night that starts the
history (``regress --append`` with no history yet); and a planted numerics change
(``MICROSCOPE_PLANT_NUMERICS=1``: the planted_work candidate's answer scaled by 1 +- 2^-16 by element,
inside its accuracy tolerance) caught with exit 1 by the exact gate (against the clean night's values of
this machine) and, as a confirmed regression of
``out.rel_err``, by the statistical gate against the history. Every run is a fresh process, as in CI.

Nothing here asserts on timing: on a shared CI machine that would be flaky. The planted ~5% more work
(``MICROSCOPE_PLANT_WORK_PCT=5``) and ten clean nights are measured evidence, quoted with their commands
in ``results/baselines/README.md``.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SUITE = ROOT / "ablations" / "nightly"
EXACT = ROOT / "results" / "baselines" / "nightly_cpu.json"
PLANTED = SUITE / "planted_work.yaml"
FEW_ROUNDS = ["--set", "dimensions.throughput.rounds=4", "dimensions.throughput.reps=2"]  # no timing is asserted


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path) -> subprocess.CompletedProcess:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("MICROSCOPE_PLANT_")}
    return subprocess.run([sys.executable, "-m", "microscope.cli", *args], capture_output=True, text=True,
                          cwd=cwd, env={**clean, "COLUMNS": "200", **(env or {})}, timeout=600)


def _words(done: subprocess.CompletedProcess) -> str:
    return " ".join((done.stdout + done.stderr).split())


@pytest.fixture(scope="module")
def night(tmp_path_factory):
    """A first night (``run --history``), then the whole suite with its exact gates (``regress --exact``)."""
    tmp = tmp_path_factory.mktemp("nightly")
    first = _cli("run", str(PLANTED), "--quick", "--device", "cpu", "--out", str(tmp / "runs"), "--history",
                 str(tmp / "h.sqlite"), "--no-progress", *FEW_ROUNDS, cwd=tmp)
    suite = _cli("regress", str(SUITE), "--quick", "--device", "cpu", "--repeat", "1", "--exact", str(EXACT),
                 "--out", str(tmp / "suite"), *FEW_ROUNDS, cwd=tmp)
    return tmp, first, suite


@pytest.fixture(scope="module")
def started(night):
    """``regress --append`` where there is no history yet: tonight's two runs start it."""
    tmp = night[0]
    done = _cli("regress", str(PLANTED), "--quick", "--device", "cpu", "--repeat", "2", "--baseline", "last-good",
                "--history", str(tmp / "started.sqlite"), "--append", "--out", str(tmp / "start"), *FEW_ROUNDS, cwd=tmp)
    return tmp / "started.sqlite", done


def test_a_run_appends_itself_to_the_history_and_reports_its_trends(night):
    tmp, first, _ = night
    assert first.returncode == 0, _words(first)
    assert "history: added" in _words(first) and "gate pass" in _words(first)
    (html,) = (tmp / "runs").glob("*/*.html")
    assert '<section id="trends">' in html.read_text()


def test_the_quick_cpu_suite_reproduces_its_exact_baseline(night):
    """Bit-exact on a machine class the baseline file holds values for (torch's and numpy's SIMD levels
    change the last bits); on another class the gate exits 2 and says so, which is its contract."""
    tmp, _, suite = night
    out = _words(suite)
    if suite.returncode == 2 and "holds values for" in out and "cannot be checked" in out:
        pytest.skip("no exact values for this machine class in results/baselines/nightly_cpu.json: "
                    + out[out.index("holds values for"):][:300])
    assert suite.returncode == 0, out
    assert "regress: clean (exit 0)" in out and "bit-exact" in out
    report = (tmp / "suite" / "regress.md").read_text()
    assert "### Exact gate" in report and "0 differ, 0 not measured" in report
    assert len(list((tmp / "suite" / "runs" / "tonight-1").iterdir())) == len(list(SUITE.glob("*.yaml")))


def test_a_first_night_starts_the_history_and_says_there_was_nothing_to_compare(started):
    from microscope.store.history import History

    db, done = started
    out = _words(done)
    assert done.returncode == 2, out
    assert "regress: COULD NOT MEASURE (exit 2)" in out and f"{db} holds no passing night of this machine" in out
    assert f"Tonight's 2 run(s) started the history {db} for this machine (gate pass" in out
    with History.open(db) as history:
        assert [r.gate for r in history.runs()] == ["pass", "pass"]


def test_a_planted_numerics_change_exits_1_from_both_gates(started):
    from microscope.store.history import History

    db, first = started
    assert first.returncode == 2
    # the exact gate needs values of this machine's class: the committed file's, with this machine's added from
    # the clean night (CI's class is in the file; a developer's CPU may not be)
    exact = db.parent / "exact.json"
    exact.write_text(EXACT.read_text())
    clean = sorted(str(p) for p in (db.parent / "start" / "runs").glob("tonight-*/*") if p.is_dir())
    saved = _cli("baseline", "save", *clean, str(exact), cwd=db.parent)
    assert saved.returncode == 0 and "the file's other classes are kept" in _words(saved), _words(saved)
    out_dir = db.parent / "planted"
    done = _cli("regress", str(PLANTED), "--quick", "--device", "cpu", "--repeat", "2", "--baseline", "last-good",
                "--history", str(db), "--exact", str(exact), "--append", "--out", str(out_dir), *FEW_ROUNDS,
                env={"MICROSCOPE_PLANT_NUMERICS": "1"}, cwd=db.parent)
    out = _words(done)
    assert done.returncode == 1, out
    assert "regress: REGRESSION (exit 1)" in out
    assert "planted_work | plus_0pct | elements=4096,iters=400,fp32 | accuracy out.rel_err: baseline " in out
    assert "tolerance rtol 1e-09 (differs)" in out and "peak_bytes regressed" not in out  # numerics only
    # the statistical gate: rel_err grew ~60% with zero between-run noise, and the rerun saw it again
    assert "accuracy out.rel_err regressed" in out and "a confirming rerun of 2 fresh process(es) shows it too" in out
    report = (out_dir / "regress.md").read_text()
    assert "**differs**" in report and "**confirmed**" in report and "### Confirming rerun" in report
    with History.open(db) as history:  # the regressed night is kept, failed: never a baseline
        assert [r.gate for r in history.runs()] == ["pass", "pass"] + ["fail"] * 4
