"""Dataflow graphs: what feeds what, Functions as one node, module scopes, the union diff, GraphDef."""

import pytest
import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from toy_stack import fused_attention, make_model

from microscope.instrument import (
    RunLogger,
    capture_dataflow,
    diff_dataflow,
    from_graph_def,
    to_graph_def,
    wrap_callables,
)
from microscope.instrument.dataflow import DataflowNode, closure_inputs, scope_path
from microscope.instrument.variant_graphs import VariantGraphs, capture_variant


def _graph(model, x):
    with wrap_callables(model):
        return capture_dataflow(lambda: model(x), model=model)


def _fused():
    model = make_model()
    for layer in model.layers:
        layer.attn.attn_fn = fused_attention
    return model


def test_nodes_are_scoped_by_module_and_wired_by_tensor(model, x):
    graph = _graph(model, x)
    nodes = graph.by_name()
    assert len(nodes) == len(graph.nodes)  # names are unique
    mm = nodes["layers.0/attn/qkv/addmm"]
    assert mm.scope == "layers.0.attn.qkv" and mm.op == "aten::addmm"
    assert {"layers.0/attn/qkv/weight", "layers.0/attn/qkv/bias", "input_0"} <= set(mm.inputs)
    assert nodes["layers.0/attn/qkv/weight"].kind == "parameter"
    assert nodes["layers.0/attn/qkv/weight"].shapes == [[48, 16]]
    # q, k, v are views of the qkv output: the attention's first matmul reads the addmm directly
    # (through the clone that matmul's reshape makes), no view node in between
    bmm = nodes["layers.0/attn/attn_fn/bmm"]
    assert all("view" not in ref and "permute" not in ref for ref in bmm.inputs)
    assert nodes["layers.0/attn/attn_fn/_softmax"].args.startswith("-1")
    assert not any(n.op in ("aten::view", "aten::transpose", "aten::permute") for n in graph.nodes)
    assert scope_path("blocks.0.attn.attn_fn") == "blocks.0/attn/attn_fn"


def test_a_custom_function_is_one_node_holding_its_inner_ops(x):
    graph = _graph(_fused(), x)
    fused = [n for n in graph.nodes if n.op == "FusedAttention"]
    assert [n.name for n in fused] == [f"layers.{i}/attn/attn_fn/FusedAttention" for i in range(4)]
    assert fused[0].kind == "function" and fused[0].shapes == [[2, 2, 8, 8]]
    assert fused[0].inner  # SDPA's ops ran inside it and are counted there, not drawn
    assert not any(n.scope.endswith("attn_fn") and n.op.startswith("aten::_scaled") for n in graph.nodes)
    # SDPA's output is laid out so that the attention's transpose+reshape is a view: the output
    # projection reads the Function's output directly
    assert "layers.0/attn/attn_fn/FusedAttention" in graph.by_name()["layers.0/attn/proj/addmm"].inputs


def test_union_diff_marks_removed_added_same_and_changed(x):
    base = _graph(make_model(), x)
    diff = diff_dataflow(base, _graph(_fused(), x), baseline="eager", candidate="fused")
    names = {n.name for n in diff.nodes}
    for i in range(4):
        assert f"removed/layers.{i}/attn/attn_fn/_softmax" in names
        assert f"added/layers.{i}/attn/attn_fn/FusedAttention" in names
    assert diff.counts()["added"] == 4 and diff.counts()["changed"] == 0
    assert {f"layers.{i}.attn.attn_fn" for i in range(4)} <= set(diff.scopes("removed"))
    assert "same/layers.0/attn/qkv/addmm" in names and "same/layers.0/attn/qkv/weight" in names
    # the unchanged reader of the attention output is fed by the removed copy and by the added op
    proj = next(n for n in diff.nodes if n.name == "same/layers.0/attn/proj/addmm")
    assert {"removed/layers.0/attn/clone", "added/layers.0/attn/attn_fn/FusedAttention"} <= set(proj.inputs)
    assert diff_dataflow(base, base).counts() == {"same": len(base.ops())}
    wide = make_model().double()
    changed = diff_dataflow(base, _graph(wide, x.double()))
    assert changed.counts()["changed"] and not changed.counts()["removed"]
    assert "dtype ['float32'] -> ['float64']" in next(n.change for n in changed.nodes if n.status == "changed")


def test_graph_def_round_trips_and_refuses_dangling_edges(tmp_path, x):
    graph = _graph(_fused(), x)
    gdef = to_graph_def(graph.nodes)
    back = from_graph_def(gdef)
    assert [(n.name, n.op, n.scope, n.kind, n.inputs, n.shapes, n.inner) for n in back] == [
        (n.name, n.op, n.scope, n.kind, n.inputs, n.shapes, n.inner) for n in graph.nodes]
    with RunLogger(tmp_path) as tb:
        tb.dataflow("fused", graph, about="toy")
    acc = EventAccumulator(str(tmp_path / "fused"))
    acc.Reload()
    nodes = {n.name: n for n in acc.Graph().node}
    assert len(nodes) == len(graph.nodes)
    fn = nodes["layers.2/attn/attn_fn/FusedAttention"]
    assert fn.attr["kind"].s == b"function" and b"aten::" in fn.attr["inner_ops"].s
    assert [d.size for d in fn.attr["_output_shapes"].list.shape[0].dim] == [2, 2, 8, 8]
    with pytest.raises(ValueError, match="not in the graph"):
        to_graph_def([DataflowNode("a", "aten::mul", "", "aten", inputs=["ghost"])])


def test_thunk_inputs_are_named_from_its_closure():
    q, k = torch.randn(2, 3), torch.randn(3, 2)
    inputs = {"q": q, "k": k, "scale": 0.5}

    def thunk():
        return (inputs["q"] @ inputs["k"]) * inputs["scale"]

    named = closure_inputs(thunk)
    assert set(named) == {"q", "k"}
    graph = capture_dataflow(thunk, inputs=named)
    assert graph.by_name()["mm"].inputs == ["q", "k"]
    assert closure_inputs(lambda: None) == {}


def test_a_failed_capture_leaves_a_note_naming_the_variant_and_falls_back_to_jit(tmp_path, model, x):
    def broken():
        raise RuntimeError("cannot run under a dispatch mode")

    captured = VariantGraphs()
    with RunLogger(tmp_path) as tb:
        capture_variant(captured, "odd", broken, model=model, example_inputs=x, logger=tb)
    note = captured.notes["odd"]
    assert "odd" in note and "RuntimeError: cannot run under a dispatch mode" in note and "jit.trace" in note
    acc = EventAccumulator(str(tmp_path / "odd"))
    acc.Reload()
    assert acc.Tags()["graph"] is True  # jit.trace's graph instead
    assert "graph/note/text_summary" in acc.Tags()["tensors"]
