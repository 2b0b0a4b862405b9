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
