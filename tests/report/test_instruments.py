"""Instrument files in both shapes: the brief's lists and the instruments' own ``to_dict`` output.

The second shape is written out by hand (mirroring ``DivergenceReport.to_dict``, ``TraceDiff.to_dict``
and ``GraphDiff.to_dict``) so these tests do not depend on the instruments' code, only on its output.
"""

from __future__ import annotations

import json
from pathlib import Path

from report_fixtures import Spec, make_run

from microscope.report.instruments import instrument_findings, instrument_tables
from microscope.report.load import RunData, load_run
from microscope.report.markdown import render_markdown
from microscope.report.plots import divergence_plot, palette

DIVERGENCE = {"triton": {
    "forward": {"kind": "forward", "threshold": 1e-3, "method": "exact", "first_divergent": "blocks.3.attn",
                "summary": "divergence starts at blocks.3.attn (rel err 4.1e-03 > 0.001); 6 of 6 earlier agree",
                "rows": [{"index": i, "module": f"blocks.{i}.attn", "rel_err": 1e-4 * 3**i, "diverged": i >= 3,
                          "base_absmax": 1.0, "cand_absmax": 1.0, "base_nonfinite": 0, "cand_nonfinite": 0,
                          "note": ""} for i in range(6)],
                "only_in_baseline": [], "only_in_candidate": []},
    "backward": {"kind": "backward", "threshold": 1e-3, "method": "exact", "first_divergent": None,
                 "rows": [{"index": 0, "module": "blocks.0.attn", "rel_err": 1e-5, "diverged": False}]}}}
TRACE = {"triton": {"baseline": "eager", "candidate": "triton", "unit": "kernel", "clock": "GPU",
                    "headline": "3 kernels replaced by 1 fused kernel, -41% GPU time",
                    "rows": [{"name": "bmm", "status": "removed", "base_calls": 2, "cand_calls": 0,
                              "base_us": 10.0, "cand_us": 0.0},
                             {"name": "_attn_fwd", "status": "added", "base_calls": 0, "cand_calls": 1,
                              "base_us": 0.0, "cand_us": 6.0},
                             {"name": "copy_", "status": "same", "base_calls": 1, "cand_calls": 1,
                              "base_us": 1.0, "cand_us": 1.0}]}}
GRAPH = {"triton": {"baseline": "eager", "candidate": "triton", "method": "dispatch", "base_ops": 9, "cand_ops": 4,
                    "removed": {"aten.softmax": 1, "aten.bmm": 2}, "added": {"flash_attention": 1},
                    "changed": {"aten.view": [4, 2]},
                    "replacements": [{"old": ["aten.bmm", "aten.softmax", "aten.bmm"], "new": ["flash_attention"],
                                      "count": 1, "modules": ["blocks.0.attn"]}],
                    "headline": "2 op kinds removed, 1 added, 1 changed in count, 9 -> 4 ops"}}


def _run(tmp_path: Path) -> RunData:
    folder = make_run(tmp_path, Spec())
    for name, data in (("divergence.json", DIVERGENCE), ("trace_diff.json", TRACE), ("graph_diff.json", GRAPH)):
        (folder / name).write_text(json.dumps(data), encoding="utf-8")
    return load_run(folder)


def test_instrument_to_dict_shapes_give_findings(tmp_path: Path) -> None:
    findings = instrument_findings(_run(tmp_path))
    assert any("triton (forward): divergence starts at blocks.3.attn" in f for f in findings)
    assert any("triton (backward): no layer diverges across 1 modules" in f for f in findings)
    assert any("3 kernels replaced by 1 fused kernel" in f and "1 removed, 1 added" in f for f in findings)
    assert any("2 op kinds removed" in f and "1 replaced" in f for f in findings)


def test_instrument_to_dict_shapes_give_tables_and_a_chart(tmp_path: Path) -> None:
    run = _run(tmp_path)
    tables = dict(instrument_tables(run))
    assert tables["Layer-wise divergence"].total == 7
    trace = [row[2] for row in tables["Kernel trace diff"].rows]
    assert len(trace) == 2 and not any("copy_" in t for t in trace)  # "same" rows left out
    graph = {(row[1], row[2]) for row in tables["Graph diff"].rows}
    assert ("removed", "aten.bmm (x2)") in graph and ("changed", "aten.view: 4 -> 2") in graph
    assert ("replaced", "1x aten.bmm, aten.softmax, aten.bmm -> flash_attention") in graph
    plot = divergence_plot(run, palette(["eager", "triton"]))
    assert plot.svg and "first divergent" in plot.svg
    md = render_markdown(run)
    assert "<details><summary>Kernel trace diff (2 row(s))" in md
