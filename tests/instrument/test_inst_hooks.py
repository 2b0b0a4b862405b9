"""ActivationRecorder: statistics per module, hooks that exist only inside the block, callables as modules."""

import math
import warnings

import pytest
import torch
from torch import nn
from torch.utils.checkpoint import checkpoint
from toy_stack import D_MODEL, TinyStack, eager_attention, make_model

from microscope.instrument import (
    ActivationRecorder,
    OpModule,
    count_hooks,
    wrap_callables,
)


def _all_hook_dicts_empty(model: nn.Module) -> bool:
    return all(
        not m._forward_hooks and not m._forward_pre_hooks and not m._backward_hooks and not m._backward_pre_hooks
        for m in model.modules()
    )


def test_forward_stats_match_a_direct_computation(model, x):
    with ActivationRecorder(model) as rec:
        model(x)
    by_name = {s["module"]: s for s in rec.stats}
    expected = model.layers[1].mlp.fc1(model.layers[0](x) + model.layers[1].attn(model.layers[0](x)))
    got = by_name["layers.1.mlp.fc1"]
    assert got["numel"] == expected.numel()
    assert got["shape"] == list(expected.shape)
    assert got["mean"] == pytest.approx(expected.mean().item(), rel=1e-5, abs=1e-7)
    assert got["std"] == pytest.approx(expected.std().item(), rel=1e-5)
    assert got["absmax"] == pytest.approx(expected.abs().max().item(), rel=1e-6)
    assert got["l2"] == pytest.approx(expected.norm().item(), rel=1e-5)
    assert got["nan_frac"] == 0.0 and got["fp16_overflow_frac"] == 0.0


def test_stats_follow_execution_order_children_before_parents(model, x):
    with ActivationRecorder(model) as rec:
        model(x)
    names = [s["module"] for s in rec.stats]
    assert names.index("layers.0.attn.qkv") < names.index("layers.0.attn.proj") < names.index("layers.0.attn")
    assert names.index("layers.0.attn") < names.index("layers.0.mlp.fc1") < names.index("layers.0")
    assert names.index("layers.0") < names.index("layers.1.attn.qkv")
    assert names[-1] == "<root>"
    assert [s["index"] for s in rec.stats] == list(range(len(names)))


def test_range_hazards_nan_inf_fp16_and_bf16():
    values = torch.tensor([1.0, float("nan"), float("inf"), 0.0, 1e-9, 300.0, 70000.0, -2.0])
    op = OpModule(lambda t: t * 1.0, "identity")
    with ActivationRecorder(op) as rec:
        op(values)
    (s,) = rec.stats
    assert s["nan_frac"] == 1 / 8 and s["inf_frac"] == 1 / 8
    assert s["zero_frac"] == 1 / 8  # the real 0.0; the zeroed NaN/Inf are not counted as zeros
    assert s["fp16_overflow_frac"] == 1 / 8  # 70000 > 65504
    assert s["fp16_underflow_frac"] == 1 / 8  # 1e-9 < 2**-24
    assert s["bf16_unsafe_frac"] == 2 / 8  # 300 and 70000 (>= 256)
    assert s["absmax"] == 70000.0 and s["min"] == -2.0 and s["max"] == 70000.0  # finite values only
    assert not math.isnan(s["mean"])


def test_backward_hooks_record_gradients_wrt_module_outputs(model, x):
    with ActivationRecorder(model, backward=True) as rec:
        out = model(x)
        out.pow(2).sum().backward()
    grads = {s["module"]: s for s in rec.grad_stats}
    # d(sum(out^2))/d(out) = 2 * out: the recorded gradient of the head output is exactly that
    assert grads["head"]["l2"] == pytest.approx((2 * out.detach()).norm().item(), rel=1e-5)
    order = [s["module"] for s in rec.grad_stats]
    assert order.index("head") < order.index("layers.3") < order.index("layers.0")  # backward order


def test_hooks_are_removed_on_exit_and_on_error(model, x):
    assert count_hooks(model) == 0
    with ActivationRecorder(model, backward=True) as rec:
        n_modules = len(list(model.modules()))
        assert rec.num_hooks == 2 * n_modules == count_hooks(model)
        model(x)
    assert count_hooks(model) == 0 and _all_hook_dicts_empty(model)
    with pytest.raises(RuntimeError, match="boom"):
        with ActivationRecorder(model, backward=True):
            raise RuntimeError("boom")
    assert _all_hook_dicts_empty(model)


def test_disabled_recorder_registers_no_hook(model, x):
    with ActivationRecorder(model, backward=True, enabled=False) as rec:
        assert count_hooks(model) == 0 and rec.num_hooks == 0
        model(x).sum().backward()
    assert rec.stats == [] and rec.grad_stats == []


def test_include_filter_hooks_only_matching_modules(model, x):
    with ActivationRecorder(model, include=r"\.mlp$") as rec:
        assert rec.num_hooks == 4
        model(x)
    assert [s["module"] for s in rec.stats] == [f"layers.{i}.mlp" for i in range(4)]


def test_repeated_calls_are_numbered(model, x):
    with ActivationRecorder(model, include=r"^head$") as rec:
        model(x)
        model(x)
    assert [s["module"] for s in rec.stats] == ["head", "head#1"]


class _Checkpointed(TinyStack):
    def forward(self, x):
        for layer in self.layers:
            x = checkpoint(layer, x, use_reentrant=False)
        return self.head(x)


def test_checkpoint_recompute_is_not_recorded_twice(x):
    plain = make_model()
    ckpt = _Checkpointed()
    ckpt.load_state_dict(plain.state_dict())
    records = []
    for m in (plain, ckpt):
        with ActivationRecorder(m, backward=True) as rec:
            m(x).sum().backward()
        records.append(rec)
    assert [s["module"] for s in records[0].stats] == [s["module"] for s in records[1].stats]
    assert [s["module"] for s in records[0].grad_stats] == [s["module"] for s in records[1].grad_stats]


def test_wrap_callables_makes_attn_fn_a_module_and_restores_it(model, x):
    original = model.layers[0].attn.attn_fn
    with wrap_callables(model, ["attn_fn"]) as names:
        assert names == [f"layers.{i}.attn.attn_fn" for i in range(4)]
        assert isinstance(model.layers[0].attn.attn_fn, OpModule)
        with ActivationRecorder(model) as rec:
            model(x)
    assert "layers.2.attn.attn_fn" in [s["module"] for s in rec.stats]
    assert model.layers[0].attn.attn_fn is original is eager_attention
    assert "attn_fn" not in model.layers[0].attn._modules
    assert len(list(model.modules())) == len(list(make_model().modules()))


def test_opmodule_observes_an_operator_with_keyword_inputs():
    def variant(*, a, b):
        return a @ b, (a + 1.0)

    op = OpModule(variant, "matmul_variant")
    a, b = torch.randn(3, 4), torch.randn(4, 5)
    with ActivationRecorder(op, backward=True) as rec:
        y, z = op(a=a.requires_grad_(), b=b)
        (y.sum() + z.sum()).backward()
    assert [s["module"] for s in rec.stats] == ["<root>[0]", "<root>[1]"]
    assert rec.stats[0]["shape"] == [3, 5]
    assert len(rec.grad_stats) == 2
    assert count_hooks(op) == 0


def test_opmodule_reads_through_to_the_callable():
    class Fn:
        scale = 0.5

        def __call__(self, t):
            return t * self.scale

    op = OpModule(Fn())
    assert op.scale == 0.5
    assert op(torch.ones(2)).tolist() == [0.5, 0.5]


def test_histograms_count_every_finite_value(model, x):
    with ActivationRecorder(model, histograms=8, keep="stats", include="layers.0.mlp.fc1") as rec:
        model(x)
    (obs,) = rec.capture.forward
    assert obs.histogram is not None and obs.histogram.numel() == 8
    assert obs.histogram.sum().item() == obs.summary[0].item() == x.shape[0] * x.shape[1] * 2 * D_MODEL
    assert obs.sketch is None and obs.tensor is None  # keep="stats" keeps nothing else


def test_capture_to_records_rows(model, x):
    with ActivationRecorder(model, include=r"^head$") as rec:
        model(x)
    rows = rec.capture.to_records()
    metrics = {r["metric"] for r in rows}
    assert {"act.mean", "act.absmax", "act.fp16_overflow_frac", "act.bf16_unsafe_frac"} <= metrics
    assert all(r["module"] == "head" and isinstance(r["value"], float) for r in rows)


def test_backward_after_the_block_still_reports_but_leaves_no_hooks(model, x):
    with ActivationRecorder(model, backward=True) as rec:
        out = model(x)
    assert count_hooks(model) == 0 and rec.grad_stats == []
    with warnings.catch_warnings():  # the block's filter of PyTorch's "hook sees outputs only" notice is gone
        warnings.simplefilter("ignore")
        out.sum().backward()
    assert [s["module"] for s in rec.grad_stats][:2] == ["<root>", "head"]
    assert all(o.summary.device.type == "cpu" for o in rec.capture.backward)
