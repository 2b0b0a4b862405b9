"""The benchmark table printed by ``throughput.table``: rates, shares of the ceiling, candidate over best peer."""

from __future__ import annotations

import io
from pathlib import Path

from report_fixtures import Spec, make_run
from rich.console import Console

from microscope.report.load import load_run
from microscope.report.rates_console import rates_table


def _text(table) -> str:
    out = io.StringIO()
    Console(file=out, width=200).print(table)
    return out.getvalue()


def test_each_case_shows_every_variant_rate_share_and_why_one_is_missing(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, Spec(run_id="bench", speedup=2.5, seed=3)))
    text = _text(rates_table(run.records, {("seq=1024,bf16", "triton")}))
    assert "TFLOP/s per variant (share of the 700 TFLOP/s ceiling" in text  # the rate nearer its ceiling
    lines = {line.split()[0]: line for line in text.splitlines() if line.strip().startswith("seq=")}
    assert set(lines) == {"seq=512", "seq=1024", "seq=1536", "seq=2048"}  # only the axis that varies
    rec = run.records
    ok = rec[(rec["metric"] == "tflops") & (rec["variant"] == "eager") & (rec["case_id"] == "seq=512,bf16")]
    value, share = float(ok["value"].iloc[0]), float(ok["details.fraction_of_ceiling"].iloc[0])
    assert f"{value:.4g} ({share:.0%})" in lines["seq=512"]
    assert "skipped" in lines["seq=512"]  # the peer never ran on this device
    assert "wrong" in lines["seq=1024"]  # triton fails accuracy there: its number is shown, marked
    assert "failed" in lines["seq=2048"]  # triton ran out of memory: no rate


def test_no_rates_no_table(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, Spec(run_id="acc", dims=("accuracy",))))
    assert rates_table(run.records) is None


def test_a_study_variant_is_shown_but_never_the_best_peer(tmp_path: Path) -> None:
    """A stage-study peer (``details.study``: the kernel with a stage left out) is faster than anything usable;
    its rate is shown, and the candidate's ratio is taken against the fastest usable peer."""
    import pandas as pd

    rec = load_run(make_run(tmp_path, Spec(run_id="bench", speedup=2.5, seed=3))).records
    timed = rec[(rec["dimension"] == "throughput") & (rec["variant"] == "eager") & (rec["status"] == "ok")]
    usable = timed.assign(variant="cudnn", role="peer", value=timed["value"] * 1.0)
    study = timed.assign(variant="triton_no_pv", role="peer", value=timed["value"] * 1.0)
    rates = study["metric"] != "latency_ms"
    study.loc[rates, "value"] *= 100
    study = study.assign(**{"details.study": True})
    text = _text(rates_table(pd.concat([rec, usable, study], ignore_index=True)))
    assert "triton_no_pv" in text.splitlines()[2], "the study variant has its own column"
    rows = [line for line in text.splitlines() if line.strip().startswith("seq=512")]
    assert rows and "x cudnn" in rows[0] and "x triton_no_pv" not in rows[0]
