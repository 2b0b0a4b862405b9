"""Instrument files in the run folder: merged per label, in the shape microscope.report reads."""

import json

import pytest
from toy_stack import fused_attention, make_model

from microscope.instrument import (
    INSTRUMENT_FILES,
    ActivationRecorder,
    ProfileConfig,
    capture_dataflow,
    compare_models,
    diff_dataflow,
    diff_profiles,
    divergence,
    profile_variant,
    wrap_callables,
    write_instruments,
)


def _swapped():
    model = make_model()
    for layer in model.layers:
        layer.attn.attn_fn = fused_attention
    return model


def _divergence(x):
    recs = []
    for model in (make_model(), _swapped()):
        with wrap_callables(model, ["attn_fn"]), ActivationRecorder(model) as rec:
            model(x)
        recs.append(rec)
    return divergence(*recs, threshold=1e-12)


def test_files_are_keyed_by_label_and_merge(tmp_path, x):
    cfg = ProfileConfig(enabled=True, wait=0, warmup=1, active=1)
    base, cand = make_model(), _swapped()
    trace = diff_profiles(profile_variant(lambda: base(x), None, cfg, name="eager", device="cpu"),
                          profile_variant(lambda: cand(x), None, cfg, name="fused", device="cpu"))
    flows = []
    for model in (base, cand):
        with wrap_callables(model):
            flows.append(capture_dataflow(lambda m=model: m(x), model=model))
    written = write_instruments(tmp_path, divergence={"fused": _divergence(x)}, trace_diff={"fused": trace},
                                graph_diff={"fused": compare_models(base, cand, [x])},
                                dataflow_diff={"fused": diff_dataflow(*flows, candidate="fused")})
    assert sorted(p.name for p in written) == sorted(INSTRUMENT_FILES.values())
    write_instruments(tmp_path, graph_diff={"fused @ other case": compare_models(base, base, [x])})
    graph = json.loads((tmp_path / "graph_diff.json").read_text())
    assert set(graph) == {"fused", "fused @ other case"}  # merged, not overwritten
    assert {"op": "FusedAttention", "count": 4} in graph["fused"]["added"]
    tr = json.loads((tmp_path / "trace_diff.json").read_text())["fused"]
    assert "FusedAttention" in [i["name"] for i in tr["added"]] and tr["headline"] == trace.headline
    div = json.loads((tmp_path / "divergence.json").read_text())["fused"]
    # SDPA inside the Function reorders the arithmetic: the swapped function's output is the first to move
    assert div["first_divergent"] == "layers.0.attn.attn_fn"
    assert all({"module", "rel_err"} <= set(r) for r in div["rows"])
    drawn = json.loads((tmp_path / "dataflow_diff.json").read_text())["fused"]
    assert drawn["counts"]["added"] == 4  # one FusedAttention node per layer
    assert "added/layers.0/attn/attn_fn/FusedAttention" in {n["name"] for n in drawn["nodes"]}


def test_report_reads_what_the_instruments_write(tmp_path, x):
    report_load = pytest.importorskip("microscope.report.load")
    report_instruments = pytest.importorskip("microscope.report.instruments")
    base, cand = make_model(), _swapped()
    diff = compare_models(base, cand, [x])
    write_instruments(tmp_path, divergence={"fused": _divergence(x)}, graph_diff={"fused": diff})
    graph, notes = report_load.read_instrument(tmp_path, "graph_diff.json")
    assert notes == []
    rows = report_instruments.diff_table(graph).rows  # [variant, change, item text]
    assert ["fused", "added", "FusedAttention: count=4"] in rows
    assert ["fused", "removed", "aten::_softmax: count=4"] in rows
    div, _ = report_load.read_instrument(tmp_path, "divergence.json")
    assert report_instruments.divergence_rows(div["fused"])[0]["module"] == "layers.0.attn.qkv"
