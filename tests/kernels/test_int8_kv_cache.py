"""int8 KV cache: quantization bound, memory accounting, and the split-K decode kernel vs float64.

The kernel is checked twice: against float64 attention over the *dequantized* cache (the kernel's
own error, judged against eager attention's error in the same dtype: <= 4x plus a floor) and
against float64 attention over the *unquantized* cache (the whole accuracy cost of int8, judged
against the plugin's declared budget). Each test prints its random seed, shown on failure.
"""

from __future__ import annotations

import math

import pytest
import torch
from microscope_kernels.int8_kv_cache.ablation import INT8_ERROR_BUDGET, Int8KVCache
from microscope_kernels.int8_kv_cache.int8_query import quantize_query
from microscope_kernels.int8_kv_cache.kernel import (
    INT8_QUERY,
    MAX_SPLITS,
    cache_bytes,
    choose_split_len,
    decode_attention,
    dequantize_kv,
    int8_decode_attention,
    quantize_kv,
)
from microscope_kernels.int8_kv_cache.reference import eager_decode_attention, int8_query_decode_attention

from microscope.api import DTYPES, Role

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rel_err(y: torch.Tensor, truth: torch.Tensor) -> float:
    return float((y.double() - truth).norm() / truth.norm().clamp_min(1e-300))


def kernel_truth(q, k_q, k_s, v_q, v_s, granularity, products="fma", int8_query=None, **_):
    """float64 attention with the kernel's own quantization: the dequantized cache, and for the
    int8-query kernel the query quantized as it does. What is left is the kernel's rounding."""
    if products == "fma" and (INT8_QUERY if int8_query is None else int8_query):
        return int8_query_decode_attention(q, k_q, k_s, v_q, v_s, granularity)
    return eager_decode_attention(q.double(), dequantize_kv(k_q, k_s, granularity, torch.float64),
                                  dequantize_kv(v_q, v_s, granularity, torch.float64))


def qkv(b, h, t, d, seed, dtype, q_scale=1.0):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(b, h, d, generator=gen) * q_scale
    k = torch.randn(b, h, t, d, generator=gen)
    v = torch.randn(b, h, t, d, generator=gen)
    return [x.to(device=DEVICE, dtype=dtype) for x in (q, k, v)]


# -- quantization and memory --------------------------------------------------------------------
@pytest.mark.parametrize("scale_dtype", [torch.float32, torch.float16], ids=str)
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("granularity", ["token", "channel"])
def test_round_trip_error_is_at_most_half_a_step(granularity, dtype, scale_dtype, seed):
    gen = torch.Generator().manual_seed(seed)
    x = (torch.randn(2, 3, 45, 32, generator=gen) * torch.rand(2, 3, 45, 1, generator=gen) * 10).to(dtype)
    x[0, 0, 3] = 0.0  # an all-zero token must not divide by zero
    q, scale = quantize_kv(x, granularity, scale_dtype)
    assert q.dtype == torch.int8 and scale.dtype == scale_dtype
    assert scale.shape == ((2, 3, 45) if granularity == "token" else (2, 3, 32))
    assert int(q.abs().max()) <= 127
    error = (dequantize_kv(q, scale, granularity, torch.float64) - x.double()).abs()
    step = scale.double().unsqueeze(-1 if granularity == "token" else -2)
    excess = (error - step / 2).max()
    assert torch.all(error <= step / 2 * (1 + 1e-12)), f"max excess {excess:.3g} (seed {seed})"
    if granularity == "token":
        assert torch.all(q[0, 0, 3] == 0)


@pytest.mark.parametrize("granularity", ["token", "channel"])
def test_int8_cache_is_at_most_053x_bf16_at_head_dim_128(granularity):
    b, h, t, d = 16, 32, 8192, 128
    bf16 = cache_bytes(b, h, t, d, None)
    int8 = cache_bytes(b, h, t, d, granularity)
    assert bf16 == 2 * b * h * t * d * 2
    per_head_scales = t if granularity == "token" else d
    assert int8 == 2 * b * h * (t * d + 4 * per_head_scales)
    assert int8 <= 0.53 * bf16
    assert cache_bytes(b, h, t, d, granularity, scale_dtype=torch.float16) < int8


# -- the decode kernels ---------------------------------------------------------------------------
#: The int8 kernels: CUDA-core with int8 score products (the default) or fp32 ones (any head_dim >=
#: 16), tensor-core products (>= 64). Each entry: (head_dim, options).
KERNELS = {"int8 query": (32, dict(products="fma", int8_query=True)),
           "fp32 query": (32, dict(products="fma", int8_query=False)),
           "tensor cores": (64, dict(products="dot"))}


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("granularity", ["token", "channel"])
@pytest.mark.parametrize("kernel", KERNELS)
def test_int8_decode_matches_float64(kernel, granularity, dtype, seed):
    head_dim, options = KERNELS[kernel]
    q, k, v = qkv(2, 3, 97, head_dim, seed, dtype)
    k_q, k_s = quantize_kv(k, granularity)
    v_q, v_s = quantize_kv(v, granularity)
    out = int8_decode_attention(q, k_q, k_s, v_q, v_s, granularity, **options)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    k_deq, v_deq = (dequantize_kv(x, s, granularity, torch.float64) for x, s in ((k_q, k_s), (v_q, v_s)))
    model = kernel_truth(q, k_q, k_s, v_q, v_s, granularity, **options)
    eager_deq = eager_decode_attention(q, k_deq.to(dtype), v_deq.to(dtype))
    limit = 4 * rel_err(eager_deq, eager_decode_attention(q.double(), k_deq, v_deq)) + torch.finfo(dtype).eps
    assert rel_err(out, model) <= limit, f"kernel error {rel_err(out, model):.3g} > {limit:.3g} (seed {seed})"
    truth = eager_decode_attention(q.double(), k.double(), v.double())
    assert rel_err(out, truth) <= INT8_ERROR_BUDGET, f"int8 cost {rel_err(out, truth):.3g} (seed {seed})"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_unquantized_decode_matches_float64(dtype, seed):
    q, k, v = qkv(1, 2, 75, 64, seed, dtype)
    out = decode_attention(q, k, v)
    truth = eager_decode_attention(q.double(), k.double(), v.double())
    limit = 4 * rel_err(eager_decode_attention(q, k, v), truth) + torch.finfo(dtype).eps
    assert rel_err(out, truth) <= limit, f"seed {seed}"


KERNEL_VARIANTS = {"unpipelined": dict(stages=1), "pipelined": dict(stages=3),
                   "32-token blocks": dict(block_t=32), "fp32 query": dict(int8_query=False, stages=3),
                   "tensor-cores": dict(products="dot", stages=3)}


@pytest.mark.parametrize("variant", KERNEL_VARIANTS)
@pytest.mark.parametrize("granularity", ["token", "channel"])
@pytest.mark.parametrize("tokens,split_len", [(5, None), (16, 16), (33, 16), (97, 48), (97, 400), (300, 256)])
def test_split_boundaries(tokens, split_len, granularity, variant, seed):
    """Fewer tokens than a block, splits that end mid-block, one split: all the same attention,
    with the loads pipelined or not (the GPU autotunes the depth) and on tensor cores."""
    q, k, v = qkv(1, 2, tokens, 64, seed, torch.float32)
    k_q, k_s = quantize_kv(k, granularity)
    v_q, v_s = quantize_kv(v, granularity)
    out = int8_decode_attention(q, k_q, k_s, v_q, v_s, granularity, split_len=split_len, **KERNEL_VARIANTS[variant])
    truth = kernel_truth(q, k_q, k_s, v_q, v_s, granularity, **KERNEL_VARIANTS[variant])
    assert rel_err(out, truth) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("variant", KERNEL_VARIANTS)
def test_reads_a_growing_cache_in_place_and_ignores_its_spare(variant, seed):
    """A model's cache is a buffer with spare capacity, sliced to its filled length: the kernel must
    read the views in place and never let the spare (here NaN scales, random bytes) leak in."""
    q, k, v = qkv(2, 2, 45, 64, seed, torch.float32)
    k_q, k_s = quantize_kv(k, "token")
    v_q, v_s = quantize_kv(v, "token")
    gen = torch.Generator().manual_seed(seed)
    views = []
    for data, scale in ((k_q, k_s), (v_q, v_s)):
        spare_data = torch.randint(-127, 128, (2, 2, 64, 64), generator=gen, dtype=torch.int8).to(DEVICE)
        spare_scale = torch.full((2, 2, 64), float("nan"), device=DEVICE)
        spare_data[:, :, :45], spare_scale[:, :, :45] = data, scale
        views += [spare_data[:, :, :45], spare_scale[:, :, :45]]
    out = int8_decode_attention(q, *views, "token", split_len=32, **KERNEL_VARIANTS[variant])
    truth = kernel_truth(q, k_q, k_s, v_q, v_s, "token", **KERNEL_VARIANTS[variant])
    assert torch.isfinite(out).all() and rel_err(out, truth) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("start", [1, 3, 4])
def test_reads_a_window_that_starts_past_the_first_token(start, seed):
    """A sliding window over a cache buffer, ``[:, :, start:start + 44]``: its scales start 4-12 bytes
    into their buffer with a head stride that is a multiple of 4 scales, and its int8 data starts 4
    bytes into an unaligned allocation. TMA needs 16-byte aligned starts, so such views are copied
    first (before, the descriptor's bare AssertionError escaped)."""
    q, k, v = qkv(2, 2, 48, 64, seed, torch.float32)
    k_q, k_s = quantize_kv(k, "token")
    v_q, v_s = quantize_kv(v, "token")
    window = slice(start, start + 44)
    k_q, k_s, v_q, v_s = k_q[:, :, window], k_s[:, :, window], v_q[:, :, window], v_s[:, :, window]
    unaligned = torch.empty(k_q.numel() + 4, dtype=torch.int8, device=DEVICE)[4:].view(k_q.shape)
    unaligned.copy_(k_q)
    assert unaligned.data_ptr() % 16 and (start % 4 == 0 or k_s.data_ptr() % 16)
    out = int8_decode_attention(q, unaligned, k_s, v_q, v_s, "token", split_len=32)
    truth = kernel_truth(q, k_q, k_s, v_q, v_s, "token")
    assert rel_err(out, truth) < 1e-5, f"seed {seed}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, overflowing in discarded lanes
@pytest.mark.parametrize("kernel", KERNELS)
def test_large_scores_stay_finite(kernel, seed):
    """Scores in the hundreds: the online softmax's running max keeps every exponent <= 0."""
    head_dim, options = KERNELS[kernel]
    q, k, v = qkv(1, 2, 70, head_dim, seed, torch.float16, q_scale=60.0)
    for granularity in ("token", "channel"):
        k_q, k_s = quantize_kv(k, granularity)
        v_q, v_s = quantize_kv(v, granularity)
        out = int8_decode_attention(q, k_q, k_s, v_q, v_s, granularity, **options)
        truth = kernel_truth(q, k_q, k_s, v_q, v_s, granularity, **options)
        assert torch.isfinite(out).all() and rel_err(out, truth) < 4e-3, f"{granularity} (seed {seed})"


@pytest.mark.parametrize("granularity", ["token", "channel"])
@pytest.mark.parametrize("magnitude", [1e-6, 1e4], ids=["tiny", "huge"])
def test_tensor_core_kernel_holds_fp16_range(magnitude, granularity, seed):
    """The tensor-core kernel feeds fp16 operands: q (with per-channel K scales folded in) and the
    weights times per-token V scales must neither underflow nor overflow fp16, whatever the cache's
    magnitude. fp32 inputs, so fp32's own accuracy is the bar."""
    q, k, v = qkv(2, 3, 150, 64, seed, torch.float32, q_scale=1.0 / magnitude)
    k, v = k * magnitude, v * magnitude * torch.rand(2, 3, 150, 1, generator=torch.Generator().manual_seed(seed),
                                                     dtype=torch.float32).to(v.device)
    k_q, k_s = quantize_kv(k, granularity)
    v_q, v_s = quantize_kv(v, granularity)
    out = int8_decode_attention(q, k_q, k_s, v_q, v_s, granularity, products="dot")
    truth = eager_decode_attention(q.double(), dequantize_kv(k_q, k_s, granularity, torch.float64),
                                   dequantize_kv(v_q, v_s, granularity, torch.float64))
    assert torch.isfinite(out).all() and rel_err(out, truth) < 1e-5, f"{rel_err(out, truth):.3g} (seed {seed})"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, overflowing in discarded lanes
@pytest.mark.parametrize("kernel", KERNELS)
@pytest.mark.parametrize("gap", [126, 135, 144])
def test_a_block_far_below_the_running_max_adds_nothing_and_breaks_nothing(gap, kernel, seed):
    """One 32-token block scores ``gap`` (base 2) below the block before it, so its weights are
    subnormal floats: the tensor-core kernel's power-of-two operand scaling once made them infinite
    and the output NaN. Per-token scales, where the weights are scaled."""
    head_dim, options = KERNELS[kernel]
    gen = torch.Generator().manual_seed(seed)
    q = torch.zeros(1, 2, head_dim)
    q[..., 0] = 1000.0
    qk_scale = 1000.0 * math.log2(math.e) / math.sqrt(head_dim)
    k = torch.rand(1, 2, 64, head_dim, generator=gen) * 1e-3
    k[:, :, :32, 0], k[:, :, 32:, 0] = 1.0, 1.0 - gap / qk_scale
    v = torch.randn(1, 2, 64, head_dim, generator=gen)
    q, k, v = q.to(DEVICE), k.to(DEVICE), v.to(DEVICE)
    k_q, k_s = quantize_kv(k, "token")
    v_q, v_s = quantize_kv(v, "token")
    out = int8_decode_attention(q, k_q, k_s, v_q, v_s, "token", split_len=64, block_t=32, **options)
    truth = kernel_truth(q, k_q, k_s, v_q, v_s, "token", **options)
    assert torch.isfinite(out).all() and rel_err(out, truth) < 1e-5, f"seed {seed}"


@pytest.mark.parametrize("granularity", ["token", "channel"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_query_quantization_is_within_half_a_step(dtype, granularity, seed):
    """The int8 query the kernel forms (``quantize_query`` is its torch twin, bit for bit): every
    value in [-127, 127], within half a step of q (per-channel K scales folded in; plus the fp32
    quotient's rounding, at most half an ulp of 127 = 2^-18 steps), the largest at +-127; an
    all-zero query quantizes to zeros."""
    q, k, _ = qkv(3, 4, 9, 64, seed, dtype, q_scale=5.0)
    _, k_s = quantize_kv(k, granularity)
    folded = k_s if granularity == "channel" else None
    values, step = quantize_query(q, folded)
    exact = q.double() * (folded.double() if folded is not None else 1.0)
    assert values.abs().max() <= 127 and (values.abs().amax(-1) == 127).all()
    assert ((values.double() * step.double().unsqueeze(-1) - exact).abs()
            <= step.double().unsqueeze(-1) * (0.5 + 2**-18)).all(), f"seed {seed}"
    zeros, unit = quantize_query(torch.zeros_like(q), folded)
    assert (zeros == 0).all() and (unit == 1).all()


def test_an_all_zero_query_attends_uniformly():
    """q = 0 gives equal scores, so the output is the mean of the dequantized V: the int8 query's
    step guard (0 / 0 would be NaN) and the integer products at zero."""
    q, k, v = qkv(2, 3, 77, 32, 0, torch.float32)
    k_q, k_s = quantize_kv(k, "token")
    v_q, v_s = quantize_kv(v, "token")
    out = int8_decode_attention(torch.zeros_like(q), k_q, k_s, v_q, v_s, "token", int8_query=True, split_len=32)
    mean_v = dequantize_kv(v_q, v_s, "token", torch.float64).mean(dim=2)
    assert rel_err(out, mean_v) < 1e-5


def test_rejects_bad_arguments():
    q, k, v = qkv(1, 2, 8, 32, 0, torch.float32)
    k_q, k_s = quantize_kv(k, "token")
    with pytest.raises(TypeError, match="int8"):
        int8_decode_attention(q, k, k_s, v, k_s, "token")
    with pytest.raises(ValueError, match="granularity"):
        quantize_kv(k, "block")
    with pytest.raises(ValueError, match="expected q"):
        int8_decode_attention(q[:, :1], k_q, k_s, k_q, k_s, "token")
    with pytest.raises(ValueError, match="products must be one of"):
        int8_decode_attention(q, k_q, k_s, k_q, k_s, "token", products="wmma")
    with pytest.raises(ValueError, match='head_dim >= 64.*products="fma"'):
        int8_decode_attention(q, k_q, k_s, k_q, k_s, "token", products="dot")
    q64, k64, _ = qkv(1, 2, 8, 64, 0, torch.float32)
    k64_q, k64_s = quantize_kv(k64, "token")
    with pytest.raises(ValueError, match='int8_query applies to the CUDA-core kernel.*products="fma"'):
        int8_decode_attention(q64, k64_q, k64_s, k64_q, k64_s, "token", products="dot", int8_query=True)
    with pytest.raises(ValueError, match="block_t must be one of"):
        int8_decode_attention(q, k_q, k_s, k_q, k_s, "token", block_t=48)
    if DEVICE == "cuda":  # 16-token blocks faulted on the H200; the interpreter keeps them
        with pytest.raises(ValueError, match=r"block_t must be one of \(32, 64, 128\) on a GPU"):
            int8_decode_attention(q, k_q, k_s, k_q, k_s, "token", block_t=16)
    _, channel_scales = quantize_kv(k, "channel")
    with pytest.raises(ValueError, match=r"k_scale must be \(B, H, D .*granularity='channel', got \(1, 2, 8\)"):
        int8_decode_attention(q, k_q, k_s, k_q, k_s, "channel")  # per-token scales, per-channel granularity
    with pytest.raises(ValueError, match=r"v_scale must be \(B, H, T .*got \(1, 2, 7\)"):
        int8_decode_attention(q, k_q, k_s, k_q, k_s[:, :, :7], "token")
    with pytest.raises(ValueError, match="k_scale must be"):
        int8_decode_attention(q, k_q, channel_scales, k_q, k_s, "token")


def test_split_plan_fills_an_h200_for_the_target_shapes():
    """B16 H32 T8192 and B64 H8 T32768 (512 heads): ~8 waves of 4 programs on 132 SMs, whole
    multiples of 256 tokens, never more splits than one merge program handles."""
    for b, h, t in ((16, 32, 8192), (64, 8, 32768), (1, 8, 32768), (1, 1, 300)):
        split_len = choose_split_len(t, b * h, 132)
        splits = -(-t // split_len)
        assert split_len % 256 == 0 and splits <= MAX_SPLITS
        if b * h * t >= 8 * 4 * 132 * 256:
            assert splits * b * h >= 8 * 4 * 132 * 0.9, (b, h, t, split_len)
    assert choose_split_len(8192, 512, 132) == 1024 and choose_split_len(32768, 512, 132) == 4096


# -- the plugin -----------------------------------------------------------------------------------
def test_plugin_inputs_are_deterministic_and_hold_the_quantized_cache():
    plugin = Int8KVCache()
    for case in plugin.cases:
        a = plugin.inputs(case, torch.Generator().manual_seed(21), "cpu")
        b = plugin.inputs(case, torch.Generator().manual_seed(21), "cpu")
        c = plugin.inputs(case, torch.Generator().manual_seed(22), "cpu")
        assert a["granularity"] == case["granularity"]
        for name in ("q", "k", "v", "k_q", "k_scale", "v_q", "v_scale"):
            assert torch.equal(a[name], b[name]), name
        assert not torch.equal(a["k"], c["k"])
        assert a["k_q"].dtype == torch.int8 and a["q"].dtype == case.dtype


def test_plugin_declares_variants_tolerances_and_counts():
    plugin = Int8KVCache()
    roles = {name: v.role for name, v in plugin.variants.items()}
    assert roles == {"eager": Role.BASELINE, "triton_int8": Role.CANDIDATE, "triton_fp": Role.CANDIDATE,
                     "sdpa": Role.PEER}
    assert not any(v.differentiable for v in plugin.variants.values())
    for case in plugin.cases:
        assert case["dtype"] in DTYPES and plugin.tolerance_for(case)
        assert plugin.grad_inputs(case) == ()
        b, h, t, d = case["batch"], case["heads"], case["tokens"], case["head_dim"]
        assert plugin.bytes(case) == cache_bytes(b, h, t, d, case["granularity"]) + 2 * b * h * d * case.dtype.itemsize
        assert plugin.flops(case) == 4 * b * h * t * d


def test_plugin_variants_meet_the_tolerance_on_default_cases():
    """Every variant on every default case, judged as the harness judges: float64 truth over the
    unquantized cache, noise-calibrated against the eager baseline, and the element rule."""
    plugin = Int8KVCache()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(9), DEVICE)
        tol = plugin.tolerance_for(case)
        x64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
               for k, v in inputs.items()}
        truth = plugin.reference(x64)
        base_err = rel_err(plugin.variants["eager"].fn(**inputs), truth)
        limit = tol.ref_factor * max(base_err, torch.finfo(case.dtype).eps / 2)
        for name, variant in plugin.variants.items():
            got = variant.fn(**inputs)
            assert got.shape == inputs["q"].shape and got.dtype == case.dtype
            assert rel_err(got, truth) <= min(limit, INT8_ERROR_BUDGET), (case.id, name)
            outside = ((got.double() - truth).abs() > tol.atol + tol.rtol * truth.abs()).double().mean()
            assert outside <= tol.max_mismatch, (case.id, name)


def test_long_splits_tune_only_blocks_of_64_tokens_or_more():
    """The autotuner's pre-prune: 32-token blocks only for splits shorter than ``_LONG_SPLIT``."""
    from microscope_kernels.int8_kv_cache.kernel import _INT8_SPLIT_CONFIGS, _LONG_SPLIT, _prune_int8_blocks

    blocks = lambda split_len: {c.kwargs["BLOCK_T"] for c in _prune_int8_blocks(  # noqa: E731
        _INT8_SPLIT_CONFIGS, {"split_len": split_len})}
    assert blocks(_LONG_SPLIT - 1) == {32, 64, 128}
    assert blocks(_LONG_SPLIT) == blocks(4096) == {64, 128}


def test_the_swept_parameters_force_what_the_kernel_would_choose_and_stay_within_budget():
    """``sweep: {triton_int8: {...}}`` calls the variant with forced choices: each must still be right,
    and an unknown kernel name is refused with the names it takes."""
    from microscope_kernels.int8_kv_cache.ablation import triton_int8

    plugin = Int8KVCache()
    assert set(plugin.variants["triton_int8"].params) == {"kernel", "split_len", "block_t", "stages"}
    case = next(c for c in plugin.cases if c["dtype"] == "fp32" and c["granularity"] == "token")
    inputs = plugin.inputs(case, torch.Generator().manual_seed(5), DEVICE)
    x64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v) for k, v in inputs.items()}
    truth = plugin.reference(x64)
    forced = [{"kernel": "portable"}, {"split_len": 32}, {"split_len": 64, "kernel": "portable"}]
    if DEVICE == "cuda":
        forced += [{"kernel": "fma"}, {"block_t": 32, "stages": 3}]
    for options in forced:
        assert rel_err(triton_int8(**inputs, **options), truth) <= INT8_ERROR_BUDGET, options
    with pytest.raises(ValueError, match="kernel 'dp5a': one of auto, dp4a, fma, portable, dot"):
        triton_int8(**inputs, kernel="dp5a")
