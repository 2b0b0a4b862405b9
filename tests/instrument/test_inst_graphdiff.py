"""Op traces and graph diffs: swapping eager attention for one op is reported as exactly that."""

import json

import pytest
import torch
from torch.autograd.function import BackwardCFunction
from toy_stack import FusedAttention, fused_attention, make_model, sdpa_attention

from microscope.instrument import capture_graph, compare_models, count_hooks, diff_graphs, fx_graph, trace_ops
from microscope.instrument.optrace import FxTraceError

EAGER_OPS = {"aten::bmm", "aten::_softmax"}


def _swapped(fn):
    model = make_model()
    for layer in model.layers:
        layer.attn.attn_fn = fn
    return model


def test_custom_function_replaces_eager_attention_ops(x):
    diff = compare_models(make_model(), _swapped(fused_attention), [x], baseline="eager", candidate="fused")
    assert diff.method == "dispatch"
    assert EAGER_OPS <= set(diff.removed)
    assert diff.removed["aten::bmm"] == 8 and diff.removed["aten::_softmax"] == 4  # 2 matmuls x 4 layers
    assert diff.added == {"FusedAttention": 4}
    (edit,) = diff.replacements  # the same edit in every layer, grouped
    assert edit.count == 4 and edit.new == ("FusedAttention",)
    assert {"aten::bmm", "aten::_softmax"} <= set(edit.old)
    assert sorted(edit.modules) == [f"layers.{i}.attn.attn_fn" for i in range(4)]
    # projections, MLPs and the head are untouched: same counts on both sides
    assert "aten::addmm" not in diff.changed and "aten::gelu" not in diff.changed


def test_sdpa_replaces_eager_attention_ops(x):
    diff = compare_models(make_model(), _swapped(sdpa_attention), [x])
    assert EAGER_OPS <= set(diff.removed)
    (added,) = diff.added
    assert "scaled_dot_product" in added and diff.added[added] == 4
    assert "4x" in diff.headline and added in diff.headline


def test_identical_models_give_an_empty_diff(x):
    diff = compare_models(make_model(), make_model(), [x])
    assert diff.identical and not diff.removed and not diff.added and not diff.changed
    assert diff.headline.startswith("same ")


def test_trace_lists_function_and_its_backward_as_single_ops(x):
    model = _swapped(fused_attention)
    apply, backward_apply = torch.autograd.Function.__dict__["apply"], BackwardCFunction.__dict__["apply"]
    graph = trace_ops(lambda: model(x).sum().backward(), model=model)
    kinds = [(n.op, n.kind) for n in graph.nodes if n.kind != "aten"]
    assert kinds.count(("FusedAttention", "function")) == 4
    assert kinds.count(("FusedAttentionBackward", "function")) == 4
    fwd = next(n for n in graph.nodes if n.op == "FusedAttention")
    assert fwd.module == "layers.0.attn" and any("scaled_dot_product" in op for op in fwd.inner)
    assert not any("scaled_dot_product" in n.op for n in graph.nodes)  # inner ops are not listed
    assert count_hooks(model) == 0
    # the process-wide patches are undone
    assert torch.autograd.Function.__dict__["apply"] is apply and BackwardCFunction.__dict__["apply"] is backward_apply
    assert "apply" not in FusedAttention.__dict__


def test_view_ops_are_dropped_unless_asked(x):
    model = make_model()
    lean = capture_graph(model, x)
    full = capture_graph(model, x, keep_views=True)
    assert "aten::view" not in lean.ops and "aten::view" in full.ops
    assert len(full.nodes) > len(lean.nodes)


def test_triton_launch_is_one_op():
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def double(x_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        tl.store(out_ptr + offs, tl.load(x_ptr + offs, mask=mask) * 2, mask=mask)

    device = "cuda" if torch.cuda.is_available() else "cpu"
    data = torch.arange(100, dtype=torch.float32, device=device)

    def run():
        out = torch.empty_like(data)
        double[(triton.cdiv(100, 64),)](data, out, 100, BLOCK=64)
        return out

    graph = trace_ops(run)
    assert "triton::double" in graph.ops
    assert graph.ops.index("triton::double") > graph.ops.index("aten::empty_like")
    torch.testing.assert_close(run(), data * 2)


def test_fx_refuses_to_inline_a_custom_function_and_auto_falls_back(x):
    fx_graph(make_model())  # the eager toy model traces
    with pytest.raises(FxTraceError, match="FusedAttention"):
        fx_graph(_swapped(fused_attention))
    diff = compare_models(make_model(), _swapped(fused_attention), [x], method="auto")
    assert diff.method == "dispatch" and "FxTraceError" in diff.note
    assert diff.added == {"FusedAttention": 4}


def test_fx_diff_of_sdpa_swap(x):
    diff = compare_models(make_model(), _swapped(sdpa_attention), [x], method="auto")
    assert diff.method == "fx"
    assert diff.removed["torch.matmul"] == 8 and diff.removed["torch.softmax"] == 4
    assert any("scaled_dot_product_attention" in op for op in diff.added)


def test_graphs_of_different_methods_are_not_diffed(x):
    with pytest.raises(ValueError, match="same way"):
        diff_graphs(fx_graph(make_model()), capture_graph(make_model(), x))


def test_diff_is_saved_as_json_and_markdown(tmp_path, x):
    diff = compare_models(make_model(), _swapped(fused_attention), [x])
    path = diff.to_json(tmp_path / "graph_diff" / "fused.json")
    data = json.loads(path.read_text())
    assert data["added"] == [{"op": "FusedAttention", "count": 4}] and data["headline"] == diff.headline
    assert {"op": "aten::_softmax", "count": 4} in data["removed"]
    assert data["replacements"][0]["count"] == 4
    md = diff.to_markdown()
    assert "`FusedAttention`" in md and "removed" in md and "layers.0.attn.attn_fn" in md
