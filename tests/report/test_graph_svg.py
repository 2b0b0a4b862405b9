"""The HTML report draws the dataflow diff as inline SVG: one figure per edit, escaped, laid out."""

from __future__ import annotations

import json
from pathlib import Path

from cdp_client import Browser

from microscope.instrument.dataflow import DataflowGraph, DataflowNode
from microscope.instrument.dataflow_diff import diff_dataflow
from microscope.report.graph_svg import diff_figures
from microscope.report.html import render_html
from microscope.report.load import load_run
from microscope.report.publish import write_reports

HOSTILE = "<script>alert(1)</script>"


def _layer(i: int, fused: bool) -> list[DataflowNode]:
    """q, k, v from a projection; eager attention (bmm, softmax, bmm) or one fused Function."""
    s = f"blocks.{i}.attn"
    scope = f"blocks.{i}/attn"
    src = f"blocks.{i - 1}/attn/proj/mm" if i else "x"
    nodes = [DataflowNode(f"{scope}/qkv/mm", "aten::mm", f"{s}.qkv", "aten", [src], [[4, 96]], ["float32"])]
    qkv = nodes[0].name
    if fused:
        nodes.append(DataflowNode(f"{scope}/attn_fn/Fused", HOSTILE if i == 0 else "FusedFn", f"{s}.attn_fn",
                                  "function", [qkv], [[1, 2, 4, 16]], ["float32"], inner={"triton::k": 1}))
        out = nodes[-1].name
    else:
        nodes += [DataflowNode(f"{scope}/attn_fn/bmm", "aten::bmm", f"{s}.attn_fn", "aten", [qkv], [[2, 4, 4]]),
                  DataflowNode(f"{scope}/attn_fn/_softmax", "aten::_softmax", f"{s}.attn_fn", "aten",
                               [f"{scope}/attn_fn/bmm"], [[1, 2, 4, 4]]),
                  DataflowNode(f"{scope}/attn_fn/bmm_1", "aten::bmm", f"{s}.attn_fn", "aten",
                               [f"{scope}/attn_fn/_softmax", qkv], [[2, 4, 16]])]
        out = nodes[-1].name
    nodes.append(DataflowNode(f"{scope}/proj/mm", "aten::mm", f"{s}.proj", "aten", [out], [[4, 32]], ["float32"]))
    return nodes


def _graph(fused: bool, layers: int = 3) -> DataflowGraph:
    nodes = [DataflowNode("x", "Input", "", "input", [], [[1, 4, 32]], ["float32"])]
    for i in range(layers):
        nodes += _layer(i, fused)
    return DataflowGraph(nodes)


def _with_diff(folder: Path) -> Path:
    diff = diff_dataflow(_graph(False), _graph(True), baseline="eager", candidate="fused")
    (folder / "dataflow_diff.json").write_text(json.dumps({"fused": diff.to_dict()}), encoding="utf-8")
    return folder


def test_identical_edits_are_drawn_once_and_every_text_is_escaped() -> None:
    data = {"fused": diff_dataflow(_graph(False), _graph(True), candidate="fused").to_dict()}
    figures, left_out = diff_figures(data)
    assert left_out == 0
    # layer 0's Function has another name, so it is its own edit; layers 1 and 2 are one figure
    assert [f.places for f in figures] == [["blocks.0.attn.attn_fn"],
                                           ["blocks.1.attn.attn_fn", "blocks.2.attn.attn_fn"]]
    assert figures[1].title == "fused: blocks.#.attn.attn_fn"
    assert figures[1].summary == "3 removed: bmm, _softmax, bmm; 1 added: FusedFn"
    svg = figures[0].svg
    assert HOSTILE not in svg and "&lt;script&gt;" in svg
    # context: the unchanged projection feeding the region and the one reading it, drawn grey
    assert svg.count('class="gd-node gd-same"') == 2 and svg.count('class="gd-node gd-removed"') == 3


def test_html_report_has_the_drawn_diff(default_run: Path) -> None:
    html = render_html(load_run(_with_diff(default_run)))
    assert 'id="graph-diff-drawn"' in html
    assert html.count('<svg xmlns="http://www.w3.org/2000/svg" class="graph-diff"') == 2
    assert HOSTILE not in html
    assert "dataflow graph diff, fused: 9 ops removed, 3 added, 0 changed" in html  # a finding too


def test_a_run_without_the_file_has_no_section(tmp_path: Path) -> None:
    from report_fixtures import Spec, make_run

    assert 'id="graph-diff-drawn"' not in render_html(load_run(make_run(tmp_path, Spec())))


def test_drawn_diff_renders_in_headless_chromium(default_run: Path, tmp_path: Path, browser: Browser) -> None:
    path = write_reports(_with_diff(default_run), tmp_path / "out", formats=("html",))["html"]
    browser.open(path.as_uri())
    assert browser.console_errors() == []
    sizes = browser.evaluate("Array.from(document.querySelectorAll('#graph-diff-drawn svg.graph-diff'))"
                             ".map(s => [s.getBoundingClientRect().width, s.querySelectorAll('g.gd-node').length])")
    assert len(sizes) == 2 and all(w > 200 and n >= 3 for w, n in sizes), sizes
