"""SwiGLU with 8-bit saved inputs: the quantizer, what the backward keeps, and the gradients against
float64; the Triton kernels against the eager reference on odd shapes in every dtype.

On a CPU the kernels run through the Triton interpreter (CI); with a GPU present, compiled.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.act_compression_8bit.ablation import GRAD_ERROR_BUDGET, ActCompression8bit
from microscope_kernels.act_compression_8bit.kernel import Int8SwiGLU, int8_saved_swiglu
from microscope_kernels.act_compression_8bit.reference import (
    dequantize_rows,
    eager_int8_swiglu,
    quantize_rows,
    swiglu,
    swiglu_grads,
)

from microscope.workloads import ModelConfig, build_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
FUNCTIONS = {"triton": int8_saved_swiglu, "eager": eager_int8_swiglu}


def _randn(shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("cols", [1, 5, 300, 1000])
def test_round_trip_within_half_a_step_zero_rows_exact(cols, seed):
    x = _randn((9, cols), seed, scale=3.0)
    x[2] = 0.0
    q, scale = quantize_rows(x)
    assert q.dtype == torch.int8 and scale.shape == (9,) and int(q.abs().max()) <= 127
    back = dequantize_rows(q, scale)
    assert bool(((back - x).abs() <= scale[:, None] / 2 * (1 + 3e-6) + 1e-12).all())
    assert torch.equal(back[2], x[2]) and float(scale[2]) == 0.0


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("shape", [(1, 1), (37, 300), (2, 3, 129)], ids=str)
def test_triton_matches_the_eager_reference_forward_and_backward(shape, dtype, seed):
    """Same output; the same int8 copies and scales (so the same gradients, up to float32 rounding)."""
    g, u, dh = _randn(shape, seed, dtype, 2.0), _randn(shape, seed + 1, dtype), _randn(shape, seed + 2, dtype)
    outs, grads = {}, {}
    for name, fn in FUNCTIONS.items():
        gg, uu = g.clone().requires_grad_(), u.clone().requires_grad_()
        outs[name] = fn(gg, uu)
        outs[name].backward(dh)
        grads[name] = (gg.grad, uu.grad)
    eps = torch.finfo(dtype).eps
    assert outs["triton"].dtype == dtype and outs["triton"].shape == shape
    assert torch.allclose(outs["triton"].float(), outs["eager"].float(), rtol=2 * eps, atol=2 * eps)
    for got, want in zip(grads["triton"], grads["eager"]):
        assert torch.allclose(got.float(), want.float(), rtol=4 * eps, atol=4 * eps * float(want.abs().max()))


def test_the_triton_quantize_is_the_eager_one_exactly(seed):
    g, u = _randn((37, 300), seed, scale=4.0), _randn((37, 300), seed + 1)
    g[3] = 0.0
    g.requires_grad_()
    out = Int8SwiGLU.apply(g, u)
    qg, sg, qu, su = out.grad_fn.saved_tensors
    want_qg, want_sg = quantize_rows(g.detach())
    want_qu, want_su = quantize_rows(u)
    assert torch.equal(qg, want_qg) and torch.equal(sg, want_sg)
    assert torch.equal(qu, want_qu) and torch.equal(su, want_su)


@pytest.mark.parametrize("name", FUNCTIONS)
def test_the_backward_keeps_only_int8_copies_and_row_scales(name, seed):
    """What autograd holds between forward and backward: no tensor of the inputs' size in float."""
    g = _randn((64, 256), seed, torch.float32).requires_grad_()
    u = _randn((64, 256), seed + 1, torch.float32).requires_grad_()
    saved = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        FUNCTIONS[name](g, u)
    big = [t for t in saved if t.numel() == g.numel()]
    assert big and all(t.dtype == torch.int8 for t in big), [(t.dtype, t.shape) for t in saved]
    assert sum(t.numel() * t.element_size() for t in saved) <= 2 * g.numel() + 2 * 64 * 4
    plain = []
    with torch.autograd.graph.saved_tensors_hooks(lambda t: plain.append(t) or t, lambda t: t):
        swiglu(g, u)
    assert sum(t.numel() * t.element_size() for t in plain) >= 3 * 4 * g.numel()  # g, u, silu(g) in fp32


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
def test_gradients_within_budget_of_float64_and_forward_exact(dtype, seed):
    g, u, dh = _randn((37, 300), seed, dtype, 2.0), _randn((37, 300), seed + 1, dtype), _randn((37, 300), seed + 2)
    want_h = swiglu(g.double(), u.double())
    want_dg, want_du = (t.double() for t in swiglu_grads(dh.double(), g.double(), u.double()))
    gg, uu = g.clone().requires_grad_(), u.clone().requires_grad_()
    h = int8_saved_swiglu(gg, uu)
    h.backward(dh.to(dtype))
    eps = torch.finfo(dtype).eps
    assert torch.allclose(h.double(), want_h, rtol=2 * eps, atol=2 * eps)
    for got, want in ((gg.grad, want_dg), (uu.grad, want_du)):
        rel = float((got.double() - want).norm() / want.norm())
        assert 0 < rel <= GRAD_ERROR_BUDGET, rel


def test_non_finite_rows_give_non_finite_gradients_only_there(seed):
    g, u = _randn((4, 50), seed), _randn((4, 50), seed + 1)
    g[1, 7] = float("nan")
    for fn in FUNCTIONS.values():
        gg = g.clone().requires_grad_()
        fn(gg, u).sum().backward()
        finite = torch.isfinite(gg.grad).all(dim=1)
        assert finite.tolist() == [True, False, True, True]


def test_bad_inputs_are_refused_clearly():
    with pytest.raises(ValueError, match="g and u must match"):
        int8_saved_swiglu(torch.zeros(2, 3, device=DEVICE), torch.zeros(2, 4, device=DEVICE))
    with pytest.raises(TypeError, match="fp32, fp16 or bf16"):
        int8_saved_swiglu(torch.zeros(2, 3, device=DEVICE, dtype=torch.float64),
                          torch.zeros(2, 3, device=DEVICE, dtype=torch.float64))


def test_model_patch_trains_with_int8_saved_inputs_and_refuses_a_gelu_mlp(seed):
    plugin = ActCompression8bit()
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, context=16)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    losses = {}
    for name in ("plain", "int8_saved"):
        model = build_model(cfg, seed=seed % 1000, device=DEVICE)
        if plugin.arms[name].patch is not None:
            plugin.arms[name].patch(model)
        logits = model(tokens)
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, logits.shape[-1]),
                                                 tokens[:, 1:].reshape(-1))
        loss.backward()
        losses[name] = (loss.item(), model.blocks[0].mlp.up.weight.grad.clone())
    assert losses["plain"][0] == pytest.approx(losses["int8_saved"][0], rel=1e-5)  # the forward is exact
    rel = float((losses["int8_saved"][1] - losses["plain"][1]).norm() / losses["plain"][1].norm())
    assert 0 < rel < 0.02, rel
    gelu = build_model(ModelConfig(n_layers=1, d_model=32, n_heads=2, context=16, mlp="gelu"), device=DEVICE)
    with pytest.raises(ValueError, match="need the SwiGLU MLP"):
        plugin.arms["int8_saved"].patch(gelu)



@pytest.mark.parametrize("name", FUNCTIONS)
def test_inference_quantizes_nothing_and_gives_the_same_output(name, seed):
    """Without gradients nothing runs the backward: no copies are written, the output is the same."""
    g, u = _randn((37, 300), seed, torch.bfloat16, 2.0), _randn((37, 300), seed + 1, torch.bfloat16)
    with_grad = FUNCTIONS[name](g.clone().requires_grad_(), u.clone().requires_grad_())
    saved = []
    with torch.no_grad(), torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
        plain_call = FUNCTIONS[name](g, u)
    assert saved == [] and plain_call.grad_fn is None
    assert torch.equal(plain_call, with_grad.detach())
