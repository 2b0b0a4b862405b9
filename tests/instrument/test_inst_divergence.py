"""divergence(): a planted change in one module is named as where divergence starts, and nothing earlier moves."""

import math
import types

import pytest
import torch
from torch import nn
from toy_stack import MLP, make_model

from microscope.instrument import ActivationRecorder, divergence

EPS = 1e-2


def _perturb_mlp(model: nn.Module, layer: int, eps: float = EPS) -> None:
    """Scale layers.<layer>.mlp's output by (1 + eps), keeping every module name unchanged."""
    mlp = model.layers[layer].mlp
    mlp.forward = types.MethodType(lambda self, h: MLP.forward(self, h) * (1 + eps), mlp)


def _record(model, x, keep="sketch", backward=False):
    with ActivationRecorder(model, keep=keep, backward=backward) as rec:
        out = model(x)
        if backward:
            out.square().mean().backward()
    return rec


@pytest.mark.parametrize("keep", ["sketch", "full"])
def test_planted_change_in_layer2_mlp_is_localised(x, keep):
    base, cand = make_model(), make_model()
    _perturb_mlp(cand, 2)
    report = divergence(_record(base, x, keep), _record(cand, x, keep), threshold=1e-4)
    assert report.first_divergent == "layers.2.mlp"
    assert report.method == ("exact" if keep == "full" else "sketch")
    first = report.first_index
    before = [r for r in report.rows if r.index < first]
    assert len(before) >= 20  # layers 0-1, layer 2's attention and the MLP's own children
    assert all(r.rel_err == 0.0 and not r.diverged for r in before)  # bit-identical, not merely close
    assert {"layers.2.mlp.fc1", "layers.2.mlp.act", "layers.2.mlp.fc2"} <= {r.module for r in before}
    row = next(r for r in report.rows if r.module == "layers.2.mlp")
    # the planted error is exactly eps in relative terms; a sketch estimates it within a few percent
    assert row.rel_err == pytest.approx(EPS, rel=1e-4 if keep == "full" else 0.15)
    later = [r for r in report.rows if r.index > first]
    assert any(r.module == "layers.3" and r.diverged for r in later)
    assert "divergence starts at layers.2.mlp" in report.summary()


def test_sketch_estimates_track_exact_errors(x):
    base, cand = make_model(), make_model()
    _perturb_mlp(cand, 1, eps=3e-3)
    sk = divergence(_record(base, x), _record(cand, x), threshold=1e-4)
    ex = divergence(_record(base, x, "full"), _record(cand, x, "full"), threshold=1e-4)
    assert [r.module for r in sk.rows] == [r.module for r in ex.rows]
    for a, b in zip(sk.rows, ex.rows):
        if b.rel_err == 0.0:
            assert a.rel_err == 0.0
        else:
            assert a.rel_err == pytest.approx(b.rel_err, rel=0.25), a.module


def test_identical_models_do_not_diverge(x):
    report = divergence(_record(make_model(), x), _record(make_model(), x), threshold=1e-12)
    assert report.first_divergent is None
    assert all(r.rel_err == 0.0 for r in report.rows)
    assert report.summary().startswith("no divergence above")


class _GradScale(torch.autograd.Function):
    """Identity forward, gradient scaled by (1 + EPS): a change only the backward pass can see."""

    @staticmethod
    def forward(ctx, t):
        return t.view_as(t)

    @staticmethod
    def backward(ctx, g):
        return g * (1 + EPS)


def test_backward_only_change_is_localised_in_gradients(x):
    base, cand = make_model(), make_model()
    act = cand.layers[1].mlp.act
    act.forward = types.MethodType(lambda self, h: _GradScale.apply(nn.GELU.forward(self, h)), act)
    rb, rc = _record(base, x, backward=True), _record(cand, x, backward=True)
    assert divergence(rb, rc, 1e-6).first_divergent is None  # the forward pass is untouched
    grads = divergence(rb, rc, 1e-4, kind="backward")
    # gradients reach layers.1.mlp.act unchanged; the first gradient it scaled is the one w.r.t. fc1's output
    assert grads.first_divergent == "layers.1.mlp.fc1"
    first = grads.first_index
    assert all(r.rel_err == 0.0 for r in grads.rows if r.index < first)
    assert "layers.1.mlp.act" in [r.module for r in grads.rows if r.index < first]


def test_nan_in_candidate_is_infinite_divergence(x):
    base, cand = make_model(), make_model()
    mlp = cand.layers[3].mlp
    mlp.forward = types.MethodType(lambda self, h: MLP.forward(self, h) / 0.0 * 0.0, mlp)  # 0/0 -> NaN
    report = divergence(_record(base, x), _record(cand, x))
    row = next(r for r in report.rows if r.module == "layers.3.mlp")
    assert report.first_divergent == "layers.3.mlp" and math.isinf(row.rel_err) and row.cand_nonfinite > 0


def test_unmatched_modules_are_listed_not_compared(x):
    base, cand = make_model(), make_model()
    cand.layers[0].extra = nn.Identity()
    layer = cand.layers[0]
    layer.forward = types.MethodType(lambda self, h: self.extra(type(self).forward(self, h)), layer)
    report = divergence(_record(base, x), _record(cand, x))
    assert report.only_in_candidate == ["layers.0.extra"] and report.only_in_baseline == []
    assert report.first_divergent is None


def test_stats_only_captures_cannot_be_compared(x):
    base = _record(make_model(), x, keep="stats")
    with pytest.raises(ValueError, match="keep='sketch'"):
        divergence(base, base)


def test_records_rows_carry_module_metric_value(x):
    base, cand = make_model(), make_model()
    _perturb_mlp(cand, 2)
    report = divergence(_record(base, x), _record(cand, x), threshold=1e-4)
    rows = report.to_records()
    assert all({"module", "metric", "value", "unit", "details"} <= set(r) for r in rows)
    start = rows[-1]
    assert start["metric"] == "divergence.forward_start" and start["module"] == "layers.2.mlp"
    assert start["value"] == report.first_index
    assert sum(r["details"].get("diverged", False) for r in rows[:-1]) == sum(r.diverged for r in report.rows)
    frame = report.to_frame()
    assert list(frame["module"]) == [r.module for r in report.rows]


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_planted_change_is_localised_on_gpu(dtype):
    x = torch.randn(2, 8, 16, generator=torch.Generator().manual_seed(1)).to("cuda", dtype)
    base, cand = make_model().to("cuda", dtype), make_model().to("cuda", dtype)
    _perturb_mlp(cand, 2, eps=0.05)
    rb, rc = _record(base, x, backward=True), _record(cand, x, backward=True)
    report = divergence(rb, rc, threshold=1e-3)
    assert report.first_divergent == "layers.2.mlp"
    assert all(r.rel_err == 0.0 for r in report.rows if r.index < report.first_index)
    assert rb.capture.forward[0].summary.device.type == "cpu"  # brought to the host after the pass
    assert rb.stats[0]["dtype"] == str(dtype).replace("torch.", "")
