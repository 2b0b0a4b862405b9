"""RunLogger: one sub-run per variant with the expected tags, read back by TensorBoard's own reader."""

import torch
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from torch import nn
from toy_stack import fused_attention, make_model

from microscope.instrument import ActivationRecorder, RunLogger, compare_models, divergence, layer_grad_norms


def _read(path):
    acc = EventAccumulator(str(path), size_guidance={"scalars": 0, "tensors": 0, "histograms": 0})
    acc.Reload()
    return acc


def model_width(model):
    return model.layers[0].mlp.fc1.out_features


def _train_losses(model, x, steps=3):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for _ in range(steps):
        opt.zero_grad()
        loss = model(x).square().mean()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    return losses


def test_variant_subruns_hold_scalars_graph_and_graph_diff(tmp_path, x):
    logdir = tmp_path / "tensorboard"
    models = {"baseline": make_model(), "fused": make_model()}
    for layer in models["fused"].layers:
        layer.attn.attn_fn = fused_attention
    with RunLogger(logdir) as tb:
        for name, model in models.items():
            for seed in (0, 1):
                tb.loss_curve(name, _train_losses(model, x + seed), seed=seed)
            tb.grad_norms(name, model, step=0)
            tb.throughput(name, 1234.5)
            assert tb.graph(name, model, x) is None
        tb.graph_diff("fused", compare_models(models["baseline"], models["fused"], [x], candidate="fused"))
    assert sorted(p.name for p in logdir.iterdir()) == ["baseline", "fused"]
    for name in models:
        acc = _read(logdir / name)
        scalars = set(acc.Tags()["scalars"])
        assert {"loss/seed0", "loss/seed1", "grad_norm/total", "grad_norm/layers.0", "grad_norm/head",
                "throughput/tokens_per_s"} <= scalars
        assert [e.step for e in acc.Scalars("loss/seed1")] == [0, 1, 2]
        assert acc.Tags()["graph"] is True
    fused = _read(logdir / "fused")
    assert "graph_diff/text_summary" in fused.Tags()["tensors"]
    text = fused.Tensors("graph_diff/text_summary")[0].tensor_proto.string_val[0].decode()
    assert "FusedAttention" in text and "aten::_softmax" in text
    assert "graph_diff/text_summary" not in _read(logdir / "baseline").Tags()["tensors"]


def test_loss_values_round_trip(tmp_path):
    with RunLogger(tmp_path) as tb:
        tb.loss_curve("base", [3.0, 2.5, 2.0], seed=7, start_step=10)
    events = _read(tmp_path / "base").Scalars("loss/seed7")
    assert [(e.step, e.value) for e in events] == [(10, 3.0), (11, 2.5), (12, 2.0)]


class _Untraceable(nn.Module):
    def forward(self, x):
        return {"logits": x * 2, "note": "jit.trace cannot return strings"}


def test_untraceable_model_gets_an_honest_note(tmp_path, x):
    with RunLogger(tmp_path) as tb:
        note = tb.graph("odd", _Untraceable(), x)
    assert note is not None and "torch.jit.trace failed" in note
    acc = _read(tmp_path / "odd")
    assert acc.Tags()["graph"] is False
    assert "graph/note/text_summary" in acc.Tags()["tensors"]


def test_histograms_and_divergence_from_the_recorder(tmp_path, x):
    base, cand = make_model(), make_model()
    with torch.no_grad():
        cand.layers[3].mlp.fc2.weight.mul_(1.01)
    recs = {}
    for name, model in (("base", base), ("cand", cand)):
        with ActivationRecorder(model, backward=True, histograms=16) as rec:
            model(x).sum().backward()
        recs[name] = rec
    report = divergence(recs["base"], recs["cand"], threshold=1e-4)
    with RunLogger(tmp_path) as tb:
        written = tb.capture("cand", recs["cand"].capture)
        tb.divergence("cand", report)
    acc = _read(tmp_path / "cand")
    hist = set(acc.Tags()["histograms"])
    assert written == len(hist) == len(recs["cand"].stats) + len(recs["cand"].grad_stats)
    assert {"activations/layers.0.mlp.fc1", "gradients/layers.0.mlp.fc1"} <= hist
    h = acc.Histograms("activations/layers.0.mlp.fc1")[0].histogram_value
    assert h.num == x.shape[0] * x.shape[1] * model_width(cand) and sum(h.bucket) == h.num
    curve = acc.Scalars("divergence/forward")
    assert len(curve) == len(report.rows)
    first = report.first_index
    assert all(e.value == 0.0 for e in curve if e.step < first) and curve[-1].value > 0
    assert "divergence/forward/text_summary" in acc.Tags()["tensors"]


def test_layer_grad_norms_group_by_block(model, x):
    model(x).square().sum().backward()
    norms = layer_grad_norms(model)
    assert set(norms) == {"layers.0", "layers.1", "layers.2", "layers.3", "head", "total"}
    grads = [p.grad for n, p in model.named_parameters() if n.startswith("layers.2.")]
    expected = torch.linalg.vector_norm(torch.cat([g.flatten() for g in grads])).item()
    assert abs(norms["layers.2"] - expected) < 1e-5 * expected
    everything = torch.cat([p.grad.flatten() for p in model.parameters()])
    assert abs(norms["total"] - everything.norm().item()) < 1e-5 * norms["total"]
