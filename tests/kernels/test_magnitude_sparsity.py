"""Magnitude sparsity: the masks hit their pattern and sparsity, the block index lists exactly the occupied
tiles, the Triton GEMM equals the masked Linear on odd shapes, and the model arms train under their masks.

On a CPU the kernel runs through the Triton interpreter (CI); with a GPU present, compiled.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.magnitude_sparsity.ablation import MagnitudeSparsity, MaskedLinear, masked_training
from microscope_kernels.magnitude_sparsity.kernel import block_index, block_sparse_linear
from microscope_kernels.magnitude_sparsity.reference import (
    block_mask,
    magnitude_mask,
    mask_for,
    nonzero_blocks,
    two_four_mask,
)
from microscope_kernels.magnitude_sparsity.semi_structured import compress, two_four_linear, unsupported

from microscope.api import Case
from microscope.workloads import ModelConfig, build_model

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _randn(shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def test_masks_keep_the_largest_weights_in_their_pattern(seed):
    w = _randn((64, 96), seed)
    m = magnitude_mask(w, 0.5)
    assert int(m.sum()) == w.numel() // 2 and float(w[m].abs().min()) >= float(w[~m].abs().max())
    m24 = two_four_mask(w).view(64, 24, 4)
    assert bool((m24.sum(-1) == 2).all())
    kept = w.abs().view(64, 24, 4).masked_fill(~m24, float("inf")).amin(-1)
    dropped = w.abs().view(64, 24, 4).masked_fill(m24, -1.0).amax(-1)
    assert bool((kept >= dropped).all())
    b = block_mask(w, 0.5).view(2, 32, 3, 32)
    tiles = b.all(dim=(1, 3)) | ~b.any(dim=(1, 3))
    assert bool(tiles.all()) and int(b.all(dim=(1, 3)).sum()) == 3  # whole tiles, half of 6 kept
    with pytest.raises(ValueError, match="multiple of 4"):
        two_four_mask(w[:, :95])
    with pytest.raises(ValueError, match="pattern 'random'"):
        mask_for(w, "random")


def test_the_block_index_lists_exactly_the_occupied_tiles(seed):
    w = _randn((70, 100), seed)
    w[:, 32:64] = 0.0  # the second K tile empty everywhere
    w[64:, :] = 0.0  # the last strip's rows empty
    index, count = nonzero_blocks(w, 32, 32)
    assert index.shape == (3, 4) and count.tolist() == [3, 3, 0]
    assert index[0, :3].tolist() == [0, 2, 3]


@pytest.mark.parametrize("dtype", DTYPES, ids=str)
@pytest.mark.parametrize("pattern", ["unstructured", "2:4", "block"])
@pytest.mark.parametrize(("m", "n", "k"), [(1, 1, 4), (5, 129, 300), (37, 70, 64)], ids=str)
def test_the_kernel_equals_the_masked_linear(m, n, k, pattern, dtype, seed):
    x, w, b = _randn((m, k), seed, dtype), _randn((n, k), seed + 1, dtype, k**-0.5), _randn((n,), seed + 2, dtype)
    sparse = w * mask_for(w, pattern, 0.5)
    index, count = block_index(sparse)
    got = block_sparse_linear(x, sparse, index, count, b).double()
    want = x.double() @ sparse.double().t() + b.double()
    eps = torch.finfo(dtype).eps
    assert torch.allclose(got, want, rtol=2 * eps, atol=4 * eps * float(want.abs().max().clamp_min(1)))


def test_plugin_variants_agree_and_bad_inputs_are_refused(seed):
    plugin = MagnitudeSparsity()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(seed), DEVICE)
        truth = plugin.reference({k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                                  for k, v in inputs.items()})
        for name, variant in plugin.variants.items():
            if variant.supports is not None and variant.supports(case, DEVICE):
                continue  # refused here with a reason (semi_structured: 2:4 on a GPU only)
            rel = float((variant.fn(**inputs).double() - truth).norm() / truth.norm())
            assert rel < 4 * torch.finfo(case.dtype).eps, (case.id, name, rel)
    index, count = block_index(torch.ones(64, 64, device=DEVICE))
    with pytest.raises(ValueError, match="x has 63 features"):
        block_sparse_linear(torch.ones(2, 63, device=DEVICE), torch.ones(64, 64, device=DEVICE), index, count)


def test_masked_training_updates_the_mask_every_ten_steps_and_leaves_the_head_dense(seed):
    cfg = ModelConfig(n_layers=1, d_model=32, n_heads=2, context=16)
    model = build_model(cfg, seed=seed % 1000, device=DEVICE)
    masked_training("unstructured")(model)
    layer = model.blocks[0].mlp.up
    assert isinstance(layer, MaskedLinear) and not isinstance(model.lm_head, MaskedLinear)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    opt = torch.optim.SGD(model.parameters(), lr=1.0)
    first = layer.mask.clone()
    for step in range(11):
        opt.zero_grad()
        model(tokens).float().pow(2).mean().backward()
        opt.step()
        if step == 4:
            # a training step may barely move this layer's magnitudes (the mask then rightly stays): swap
            # which half is large, so the recompute at call 10 must give a different mask
            with torch.no_grad():
                layer.weight.mul_(torch.where(first.to(layer.weight.device), 1e-3, 1e3).to(layer.weight.dtype))
        if step < 9:
            assert torch.equal(layer.mask, first) or step == 0
    assert float(layer.mask.float().mean()) == pytest.approx(0.5, abs=0.01)
    assert not torch.equal(layer.mask, first)  # recomputed from the trained weights at call 10


def test_sparse_tensor_cores_are_refused_with_the_reason_where_they_cannot_run():
    def case(**params):
        return Case.of(**{"m": 16, "n": 64, "k": 64, "pattern": "2:4", "dtype": "bf16", **params})

    assert "CUDA GPUs only" in unsupported(case(), "cpu")
    assert "2:4 pattern only, not block" in unsupported(case(pattern="block"), "cuda")
    assert "fp16 or bf16" in unsupported(case(dtype="fp32"), "cuda")
    assert "multiples of 16 (N=129" in unsupported(case(n=129), "cuda")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available() or unsupported(Case.of(m=8, n=64, k=64, pattern="2:4", dtype="bf16"),
                                                                   "cuda") is not None,
                    reason="needs a CUDA GPU with cuSPARSELt")
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16], ids=str)
@pytest.mark.parametrize(("m", "n", "k"), [(1, 64, 128), (37, 96, 320), (64, 256, 512)], ids=str)
def test_the_cusparselt_gemm_equals_the_two_four_masked_linear(m, n, k, dtype, seed):
    """Rows of x a multiple of 8 or not (padded), with a bias; fp32 accumulation, one rounding of the output."""
    x, w, b = _randn((m, k), seed, dtype), _randn((n, k), seed + 1, dtype, k**-0.5), _randn((n,), seed + 2, dtype)
    sparse = w * two_four_mask(w)
    got = two_four_linear(x, compress(sparse), b)
    want = x.double() @ sparse.double().t() + b.double()
    assert got.shape == (m, n) and got.dtype == dtype
    eps = torch.finfo(dtype).eps
    assert torch.allclose(got.double(), want, rtol=2 * eps, atol=4 * eps * float(want.abs().max().clamp_min(1)))
