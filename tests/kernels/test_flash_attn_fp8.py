"""FP8 FlashAttention forward: the per-block quantization bound and layout, the kernel against float64 attention
over its own quantized operands (the kernel's arithmetic) and over the unquantized inputs (FP8's whole cost,
within the plugin's budget), on odd lengths, causal and not, both head dims and both input dtypes.

On a CPU the kernel runs through the Triton interpreter (CI); with a GPU present it runs compiled.
"""

from __future__ import annotations

import math

import pytest
import torch
from microscope_kernels.flash_attn.reference import eager_attention
from microscope_kernels.flash_attn_fp8.ablation import FP8_ERROR_BUDGET, FlashAttentionFP8
from microscope_kernels.flash_attn_fp8.kernel import FP8, P_SCALE, SCALE_BLOCK, flash_attention_fp8, quantize_blocks

from microscope.api import Role

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
HALF_DTYPES = [torch.float16, torch.bfloat16]
#: e4m3's finest spacing (subnormals) and a normal value's half-step, relative.
E4M3_SUBNORMAL_STEP, E4M3_HALF_STEP = 2.0**-9, 2.0**-4


def _randn(shape, seed, dtype=torch.float32, scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    return (torch.randn(shape, generator=gen) * scale).to(device=DEVICE, dtype=dtype)


def _dequantized(x8: torch.Tensor, scales: torch.Tensor, length: int, transposed: bool) -> torch.Tensor:
    """float64 (B*H, S, D) values the kernel multiplies: each block's e4m3 values times its scale."""
    values = x8.double().transpose(1, 2) if transposed else x8.double()
    per_token = scales.double().repeat_interleave(SCALE_BLOCK, dim=1)[:, : values.shape[1], None]
    return (values * per_token)[:, :length]


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize(("s", "d"), [(1, 64), (100, 64), (129, 128)], ids=str)
def test_blocks_round_within_half_a_step_and_v_is_stored_transposed(s, d, dtype, seed):
    x = _randn((2, 3, s, d), seed, dtype, scale=3.0)
    x[0, 0, : min(s, SCALE_BLOCK)] = 0  # an all-zero block: scale 1, zeros
    x8, scales = quantize_blocks(x)
    assert x8.dtype == FP8 and x8.shape == (6, s, d) and scales.shape == (6, math.ceil(s / SCALE_BLOCK))
    assert float(scales[0, 0]) == 1.0 and not bool(x8[0, : min(s, SCALE_BLOCK)].double().any())
    got = _dequantized(x8, scales, s, transposed=False)
    want = x.double().reshape(6, s, d)
    per_token = scales.double().repeat_interleave(SCALE_BLOCK, dim=1)[:, :s, None]
    bound = torch.maximum(want.abs() * E4M3_HALF_STEP, per_token * E4M3_SUBNORMAL_STEP / 2) * (1 + 1e-6)
    assert bool(((got - want).abs() <= bound).all()), float(((got - want).abs() - bound).max())
    vt8, v_scales = quantize_blocks(x, transposed=True)
    assert vt8.shape == (6, d, math.ceil(s / SCALE_BLOCK) * SCALE_BLOCK) and torch.equal(v_scales, scales)
    assert torch.equal(vt8[:, :, :s].double(), x8.double().transpose(1, 2))
    assert not bool(vt8[:, :, s:].double().any())  # the padding to a whole block is zeros


def _emulated(q, k, v, causal):
    """float64 attention over the kernel's own e4m3 operands, key block by key block with a running maximum,
    each block's probabilities rounded to e4m3 against the maximum so far, as the kernel does."""
    b, h, sq, d = q.shape
    sk = k.shape[2]
    q64 = _dequantized(*quantize_blocks(q), sq, transposed=False)
    k64 = _dequantized(*quantize_blocks(k), sk, transposed=False)
    v64 = _dequantized(*quantize_blocks(v, transposed=True), sk, transposed=True)
    s = q64 @ k64.transpose(1, 2) / math.sqrt(d)
    if causal:
        visible = torch.arange(sk, device=q.device)[None, :] <= torch.arange(sq, device=q.device)[:, None] + sk - sq
        s = s.masked_fill(~visible, float("-inf"))
    m = torch.full((b * h, sq, 1), float("-inf"), dtype=torch.float64, device=q.device)
    total = torch.zeros_like(m)
    acc = torch.zeros_like(q64)
    for start in range(0, sk, SCALE_BLOCK):
        block = s[:, :, start : start + SCALE_BLOCK]
        m_new = torch.maximum(m, block.amax(-1, keepdim=True))
        base = torch.where(torch.isinf(m_new), 0.0, m_new)
        alpha, p = torch.exp(m - base), torch.exp(block - base)
        p8 = (p * P_SCALE).float().to(FP8).double() / P_SCALE
        acc = acc * alpha + p8 @ v64[:, start : start + SCALE_BLOCK]
        total, m = total * alpha + p.sum(-1, keepdim=True), m_new
    return (acc / total).reshape(b, h, sq, d)


@pytest.mark.parametrize("dtype", HALF_DTYPES, ids=str)
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize(("sq", "sk", "d"), [(100, 100, 64), (70, 137, 128), (1, 65, 64), (129, 129, 128)], ids=str)
def test_the_kernel_is_attention_over_its_e4m3_operands_and_within_the_fp8_budget(sq, sk, d, causal, dtype, seed):
    q, k, v = (_randn((1, 2, n, d), seed + i, dtype) for i, n in enumerate((sq, sk, sk)))
    got = flash_attention_fp8(q, k, v, causal)
    assert got.shape == q.shape and got.dtype == dtype
    own = _emulated(q, k, v, causal)
    # the kernel's own arithmetic: fp32 sums, a probability near a rounding boundary rounding the other way, and
    # the output's rounding to its dtype (the interpreter's bf16 rounds toward zero: up to one step)
    assert float((got.double() - own).norm() / own.norm()) < 1e-3 + torch.finfo(dtype).eps
    truth = eager_attention(q.double(), k.double(), v.double(), causal)
    assert float((got.double() - truth).norm() / truth.norm()) < FP8_ERROR_BUDGET


def test_inputs_the_kernel_cannot_take_are_refused():
    q = torch.zeros(1, 1, 8, 64, device=DEVICE, dtype=torch.bfloat16)
    with pytest.raises(ValueError, match="fp16 or bf16"):
        flash_attention_fp8(q.float(), q.float(), q.float())
    with pytest.raises(ValueError, match="head dims"):
        flash_attention_fp8(q[..., :32], q[..., :32], q[..., :32])
    with pytest.raises(ValueError, match="Sq <= Sk"):
        flash_attention_fp8(q, q[:, :, :4], q[:, :, :4], causal=True)
    with pytest.raises(ValueError, match="positive"):
        flash_attention_fp8(q, q, q, sm_scale=0.0)
    assert not bool(flash_attention_fp8(q, q, q).double().any())  # zeros in, zeros out


def test_plugin_variants_meet_the_budget(seed):
    plugin = FlashAttentionFP8()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(seed), DEVICE)
        truth = plugin.reference({k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()})
        for name, variant in plugin.variants.items():
            if variant.supports is not None and variant.supports(case, DEVICE):
                continue
            rel = float((variant.fn(**inputs).double() - truth).norm() / truth.norm())
            assert rel < (FP8_ERROR_BUDGET if variant.role is Role.CANDIDATE else 0.01), (case.id, name, rel)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_precompiled_candidates_match_the_calls_signature_and_the_call_stays_exact(seed):
    from microscope_kernels.flash_attn_fp8.kernel import precompile

    sq, sk, d = 200, 264, 128
    for index in range(3):
        precompile(sq, sk, d, torch.bfloat16, True, (index, 3))
    q, k, v = (_randn((2, 3, n, d), seed + i, torch.bfloat16) for i, n in enumerate((sq, sk, sk)))
    got, own = flash_attention_fp8(q, k, v, True), _emulated(q, k, v, True)
    assert float((got.double() - own).norm() / own.norm()) < 1e-3 + torch.finfo(torch.bfloat16).eps
