"""1-bit weights with the straight-through estimator: packing exact, the STE's gradients, the Triton GEMM
against the float64 binarized Linear on odd shapes in every dtype, and the model-level arms.

On a CPU the kernel runs through the Triton interpreter (CI); with a GPU present, compiled.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.binarize_ste.ablation import (
    BinarizeSTE,
    PackedBinaryLinear,
    STEBinaryLinear,
    binarize_after_training,
    train_binarized,
)
from microscope_kernels.binarize_ste.kernel import binary_linear_packed, binary_linear_triton
from microscope_kernels.binarize_ste.reference import binarize, binary_linear, pack_signs, row_scale, unpack_signs
from torch import nn

from microscope.workloads import ModelConfig, build_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


@pytest.mark.parametrize("k", [1, 31, 32, 33, 300])
def test_packing_round_trips_exactly_with_zero_as_plus_one(k, seed):
    w = _randn((7, k), seed)
    w[0, 0] = 0.0
    packed, alpha = pack_signs(w)
    assert packed.dtype == torch.int32 and packed.shape == (7, -(-k // 32))
    signs = unpack_signs(packed, k)
    assert torch.equal(signs, torch.where(w >= 0, 1.0, -1.0))
    assert torch.allclose(alpha, w.abs().mean(dim=1)) and torch.equal(binarize(w), signs * alpha[:, None])


def test_the_straight_through_estimator_passes_gradients_inside_the_clip_only(seed):
    w = _randn((4, 10), seed, scale=1.5).requires_grad_()
    x, dy = _randn((3, 10), seed + 1), _randn((3, 4), seed + 2)
    binary_linear(x, w).backward(dy)
    want = (dy.t() @ x) * (w.detach().abs() <= 1)
    assert torch.allclose(w.grad, want, atol=1e-6) and bool((w.grad[w.detach().abs() > 1] == 0).all())


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 1), (1, 129, 300), (17, 33, 64), (37, 70, 513)], ids=str)
def test_the_kernel_equals_the_binarized_linear(m, n, k, dtype, seed):
    x, w, b = _randn((m, k), seed, dtype), _randn((n, k), seed + 1, dtype), _randn((n,), seed + 2, dtype)
    got = binary_linear_triton(x, w, b).double()
    w_b = unpack_signs(pack_signs(w)[0], k).double() * row_scale(w).double()[:, None]
    want = x.double() @ w_b.t() + b.double()
    # a float sum's rounding error scales with the sum of its terms' magnitudes, not with its result
    magnitude = x.double().abs() @ w_b.abs().t() + b.double().abs()
    eps = torch.finfo(dtype).eps
    error = (got - want).abs()
    assert bool((error <= 2 * eps * want.abs() + 8 * eps * magnitude).all()), float(error.max())
    assert got.shape == (m, n)


def test_bad_inputs_are_refused_clearly():
    with pytest.raises(ValueError, match="NaN/Inf"):
        pack_signs(torch.tensor([[float("nan"), 1.0]], device=DEVICE))
    packed, alpha = pack_signs(torch.randn(4, 40, device=DEVICE))
    with pytest.raises(ValueError, match="x has 39 features, the weight 40"):
        binary_linear_packed(torch.randn(2, 39, device=DEVICE), packed, alpha, 40)


def test_plugin_variants_agree_with_the_reference(seed):
    plugin = BinarizeSTE()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(seed), DEVICE)
        truth = plugin.reference({k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                                  for k, v in inputs.items()})
        for name, variant in plugin.variants.items():
            rel = float((variant.fn(**inputs).double() - truth).norm() / truth.norm())
            assert rel < 4 * torch.finfo(case.dtype).eps, (case.id, name, rel)


def test_model_arms_train_through_signs_and_binarize_trained_weights(seed):
    cfg = ModelConfig(n_layers=2, d_model=32, n_heads=2, context=16)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    float_model = build_model(cfg, seed=seed % 1000, device=DEVICE)
    qat = build_model(cfg, seed=seed % 1000, device=DEVICE)
    weight = qat.blocks[0].mlp.up.weight
    train_binarized(qat)
    assert isinstance(qat.blocks[0].mlp.up, STEBinaryLinear) and qat.blocks[0].mlp.up.weight is weight
    assert isinstance(qat.lm_head, nn.Linear)  # the head stays float
    logits = qat(tokens)
    logits.float().pow(2).mean().backward()
    assert weight.grad is not None and bool(torch.isfinite(weight.grad).all())
    ptq = build_model(cfg, seed=seed % 1000 + 1, device=DEVICE)
    binarize_after_training(ptq)
    ptq.load_state_dict(float_model.state_dict())  # the trained weights, binarized on load
    assert isinstance(ptq.blocks[0].attn.qkv, PackedBinaryLinear)
    with torch.no_grad():
        want = qat(tokens)  # the same float weights, binarized in the forward
        assert torch.allclose(ptq(tokens), want, rtol=1e-3, atol=1e-3)
