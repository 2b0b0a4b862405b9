"""Fused LayerNorm + GeLU vs float64, on odd shapes, every dtype, fresh random inputs.

Errors are judged against the eager PyTorch version's own error in the same dtype (<= 4x, plus a
floor of a few unit roundoffs), never against hand-tuned atols. Each test prints its random seed,
which pytest shows when the test fails.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels import direct_launch
from microscope_kernels.fused_layernorm_gelu.ablation import FusedLayerNormGelu
from microscope_kernels.fused_layernorm_gelu.kernel import (
    _LAUNCH_BWD,
    _LAUNCH_FWD,
    _LAUNCH_SUM,
    ForwardPlan,
    _tile_shape,
    forward_plans,
    layernorm_gelu,
    layernorm_gelu_forward,
)
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager
from microscope_kernels.fused_layernorm_gelu.tma_forward import _fwd_tma_kernel, descriptors

from microscope.api import DTYPES, Role

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rel_err(y: torch.Tensor, truth: torch.Tensor) -> float:
    return float((y.double() - truth).norm() / truth.norm().clamp_min(1e-300))


def run(fn, x, w, b, dy, approximate, dtype):
    """Outputs and (dx, dw, db) of fn on copies of the inputs cast to ``dtype``."""
    leaves = [t.detach().to(dtype).requires_grad_(True) for t in (x, w, b)]
    y = fn(*leaves, 1e-5, approximate)
    y.backward(dy.to(dtype))
    return [y.detach()] + [t.grad for t in leaves]


def check_against_float64(x, w, b, dy, approximate, dtype, seed, factor=4.0):
    ours = run(layernorm_gelu, x, w, b, dy, approximate, dtype)
    eager = run(layernorm_gelu_eager, x, w, b, dy, approximate, dtype)
    rounded = [t.to(dtype) for t in (x, w, b, dy)]  # the truth sees exactly the inputs the kernels see
    truth = run(layernorm_gelu_eager, *rounded, approximate, torch.float64)
    floor = torch.finfo(dtype).eps  # two unit roundoffs
    for name, got, base, ref in zip(("y", "dx", "dweight", "dbias"), ours, eager, truth):
        assert torch.isfinite(got).all(), f"{name} not finite (seed {seed})"
        limit = factor * rel_err(base, ref) + floor
        assert rel_err(got, ref) <= limit, (
            f"{name} {dtype}: rel err {rel_err(got, ref):.3g} > {limit:.3g} "
            f"(eager's own: {rel_err(base, ref):.3g}; seed {seed})")


def check_forward(x, w, b, y, mean, rstd, label: str) -> None:
    """A tanh forward's output within 4x eager's error of float64 (+ a floor), and its statistics."""
    truth = layernorm_gelu_eager(x.double(), w.double(), b.double(), 1e-5, "tanh")
    eager = layernorm_gelu_eager(x, w, b, 1e-5, "tanh")
    assert rel_err(y, truth) <= 4 * rel_err(eager, truth) + torch.finfo(x.dtype).eps, label
    assert torch.allclose(mean.double(), x.double().mean(-1), atol=1e-5), label
    var = x.double().var(-1, unbiased=False)
    assert torch.allclose(rstd.double(), (var + 1e-5).rsqrt(), rtol=1e-4), label


def make_inputs(shape, seed, scale=1.0, offset=0.0):
    gen = torch.Generator().manual_seed(seed)
    n = shape[-1]
    x = torch.randn(shape, generator=gen) * scale + offset
    w = 1.0 + 0.1 * torch.randn(n, generator=gen)
    b = 0.1 * torch.randn(n, generator=gen)
    dy = torch.randn(shape, generator=gen)
    return x.to(DEVICE), w.to(DEVICE), b.to(DEVICE), dy.to(DEVICE)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("approximate", ["tanh", "none"])
@pytest.mark.parametrize("shape", [(37, 301), (6, 256), (2, 5, 100)], ids=["odd", "pow2", "3d"])
def test_forward_and_gradients_match_float64(shape, approximate, dtype, seed):
    check_against_float64(*make_inputs(shape, seed), approximate, dtype, seed)


@pytest.mark.parametrize("layout", ["column slice", "transposed", "broadcast row"])
def test_strided_inputs_match_their_contiguous_copies(layout, seed):
    """2-D inputs go to the kernel as they are when their columns are contiguous (a row stride
    wider than the row, or 0 for a broadcast row), and are copied otherwise: either way the output
    and the gradients are those of the contiguous input."""
    x, w, b, dy = make_inputs((21, 300), seed)
    wide = torch.randn(21, 333, generator=torch.Generator().manual_seed(seed))
    strided = {"column slice": wide[:, 7:307], "transposed": x.t().contiguous().t(),
               "broadcast row": x[:1].expand(21, 300)}[layout]
    assert not strided.is_contiguous()
    got = run(layernorm_gelu, strided.to(DEVICE), w, b, dy, "tanh", torch.float32)
    want = run(layernorm_gelu, strided.contiguous().to(DEVICE), w, b, dy, "tanh", torch.float32)
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), got, want):
        assert torch.allclose(a, c, rtol=1e-6, atol=1e-6), f"{name}, {layout}, seed {seed}"


def test_strided_weight_and_bias_match_their_contiguous_copies(seed):
    """The kernels read weight and bias at unit stride: views of every other element are copied first, and the
    output and the gradients (which reach the views) are those of contiguous parameters."""
    x, w, b, dy = make_inputs((21, 300), seed)
    w2, b2 = (torch.stack([t, torch.randn_like(t)], dim=1).reshape(-1)[::2] for t in (w, b))
    assert not w2.is_contiguous() and torch.equal(w2, w) and torch.equal(b2, b)
    got = run(layernorm_gelu, x, w2, b2, dy, "tanh", torch.float32)
    want = run(layernorm_gelu, x, w, b, dy, "tanh", torch.float32)
    for name, a, c in zip(("y", "dx", "dweight", "dbias"), got, want):
        assert torch.equal(a, c), name


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_large_offset_and_magnitude(dtype, seed):
    """A mean of 300 over a spread of 1 (fp32 would cancel with a one-pass E[x^2] - E[x]^2 variance),
    and a spread of 300: both must keep the eager error level."""
    check_against_float64(*make_inputs((9, 123), seed, offset=300.0), "tanh", dtype, seed)
    check_against_float64(*make_inputs((9, 123), seed, scale=300.0), "none", dtype, seed)


def test_constant_rows_give_gelu_of_bias(seed):
    """Zero variance: the normalized row is 0 (rstd = 1/sqrt(eps) times exactly 0), output gelu(b)."""
    x, w, b, dy = make_inputs((4, 77), seed)
    x = torch.full_like(x, 3.25)
    y = layernorm_gelu(x, w, b, 1e-5, "tanh")
    expected = torch.nn.functional.gelu(b, approximate="tanh").expand_as(y)
    assert torch.allclose(y, expected, rtol=1e-6, atol=1e-6), f"seed {seed}"
    check_against_float64(x, w, b, dy, "tanh", torch.float32, seed)


@pytest.mark.parametrize("plan", [ForwardPlan(4, persistent=False), ForwardPlan(4, persistent=True, prefetch=1),
                                  ForwardPlan(8, persistent=True, stages=3),
                                  ForwardPlan(4, persistent=True, prefetch=2, stream_hints=True)], ids=str)
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16], ids=str)
def test_every_forward_plan_matches_float64(plan, dtype, seed):
    """The GPU picks among these plans by timing: each must compute the same thing (here on more
    row tiles than programs, with a ragged last tile and a row length that is not a power of two).
    The last plan is not tuned over, only timed by the launch studies; it must be right as well."""
    x, w, b, _ = make_inputs((67, 300), seed)
    x, w, b = (t.to(dtype) for t in (x, w, b))
    y, mean, rstd = layernorm_gelu_forward(x, w, b, 1e-5, "tanh", store_stats=True, plan=plan)
    check_forward(x, w, b, y, mean, rstd, f"{plan}, seed {seed}")


def test_the_plugins_swept_launch_plan_is_forced_in_the_forward_and_under_autograd(seed):
    """``sweep: {triton: {warps: ...}}`` calls the plugin's variant with a plan's fields: the forced plan
    must compute the same output, and its gradients must flow (the accuracy dimension checks both)."""
    from microscope_kernels.fused_layernorm_gelu.ablation import triton_fused

    assert set(FusedLayerNormGelu.variants["triton"].params) == {
        "warps", "persistent", "prefetch", "stages", "stream_hints", "block_m", "maxnreg", "balanced", "tma",
        "tma_store"}
    x, w, b, dy = make_inputs((67, 300), seed)
    expected = layernorm_gelu_eager(x, w, b, 1e-5, "tanh")
    for launch in ({"warps": 8, "persistent": True, "stages": 3}, {"block_m": 2, "warps": 4, "balanced": True},
                   {"warps": 4, "prefetch": 2, "maxnreg": 128}, {"block_m": 2, "warps": 8, "prefetch": 0, "stages": 3}):
        forced = triton_fused(x, w, b, "tanh", **launch)
        assert torch.allclose(forced, expected, rtol=1e-4, atol=1e-5), launch
    with pytest.raises(ValueError, match="forward-only launch studies"):
        triton_fused(x.clone().requires_grad_(True), w, b, "tanh", block_m=2)
    leaf = x.clone().requires_grad_(True)
    triton_fused(leaf, w, b, "tanh", warps=4, persistent=False).backward(dy)
    ref = x.clone().requires_grad_(True)
    layernorm_gelu_eager(ref, w, b, 1e-5, "tanh").backward(dy)
    assert torch.allclose(leaf.grad, ref.grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("tma_store", [False, True], ids=["stores", "tma stores"])
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_tma_study_variant_matches_float64(dtype, tma_store, seed):
    """The TMA forward that the ``launch_tma`` profile times must compute what the shipped one
    does: output and statistics, on more rows than programs (the persistent walk wraps)."""
    if DEVICE == "cuda" and torch.cuda.get_device_capability()[0] < 9:
        pytest.skip("tensor descriptors need sm_90+")
    x, w, b, _ = make_inputs((37, 256), seed)
    x, w, b = (t.to(dtype) for t in (x, w, b))
    y = torch.empty_like(x)
    stats = torch.empty((2, 37), device=DEVICE, dtype=torch.float32)
    _fwd_tma_kernel[(5,)](*descriptors(x, y), w, b, y, stats, 37, 256, y.stride(0), 1e-5, BLOCK_N=256,
                          APPROX_TANH=True, FAST=DEVICE == "cuda", STAGES=2, TMA_STORE=tma_store)
    check_forward(x, w, b, y, stats[0], stats[1], f"seed {seed}")


def test_tma_study_variant_rejects_rows_it_cannot_block():
    x = torch.zeros(3, 300, device=DEVICE)
    with pytest.raises(ValueError, match="power-of-two row length, got 300"):
        descriptors(x, x)


def test_forward_plans_cover_every_overlap_at_sane_warp_counts():
    plans = forward_plans(4096)
    assert {p.warps for p in plans} == {4, 8, 16}  # 32, 16 and 8 fp32 values per thread
    assert {(p.persistent, p.prefetch, p.stages) for p in plans} == {(False, False, 1), (True, True, 1),
                                                                    (True, False, 3)}
    assert {p.warps for p in forward_plans(300)} == {4, 8}  # tiles of 4 stacked 512-wide rows: 16 or 8 a thread


def test_inference_call_matches_training_call(seed):
    """Under no_grad the kernel skips saving the statistics; the output must be the same bits."""
    x, w, b, _ = make_inputs((11, 200), seed)
    with torch.no_grad():
        y_inf = layernorm_gelu(x, w, b)
    y_train = layernorm_gelu(x.requires_grad_(True), w, b)
    assert torch.equal(y_inf, y_train.detach()), f"seed {seed}"


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_repeat_calls_launch_directly_and_match_triton_dispatch_bitwise(seed, monkeypatch):
    """After the first call of a shape, forward and backward launch their compiled kernels directly
    (``kernels/direct_launch.py``); Triton's own dispatch must give the same bits."""
    x, w, b, dy = make_inputs((333, 1000), seed)
    run(layernorm_gelu, x, w, b, dy, "tanh", torch.bfloat16)  # first call: tunes, compiles, caches
    direct = run(layernorm_gelu, x, w, b, dy, "tanh", torch.bfloat16)
    assert all(launcher.last[1] for launcher in (_LAUNCH_FWD, _LAUNCH_BWD, _LAUNCH_SUM)), f"seed {seed}"
    with monkeypatch.context() as patch:
        patch.setattr(direct_launch, "ENABLED", False)
        dispatched = run(layernorm_gelu, x, w, b, dy, "tanh", torch.bfloat16)
    assert not _LAUNCH_FWD.last[1]
    assert all(torch.equal(a, c) for a, c in zip(direct, dispatched)), f"seed {seed}"


def test_backward_is_deterministic(seed):
    """Partial sums are reduced in a fixed order (no atomics): two backwards agree bitwise."""
    x, w, b, dy = make_inputs((41, 96), seed)
    first = run(layernorm_gelu, x, w, b, dy, "tanh", torch.float32)
    second = run(layernorm_gelu, x, w, b, dy, "tanh", torch.float32)
    assert all(torch.equal(a, c) for a, c in zip(first, second)), f"seed {seed}"


def test_rejects_bad_arguments():
    x = torch.randn(3, 8, device=DEVICE)
    w = torch.ones(8, device=DEVICE)
    with pytest.raises(ValueError, match="approximate"):
        layernorm_gelu(x, w, w, 1e-5, "erf")
    with pytest.raises(ValueError, match="shape"):
        layernorm_gelu(x, w[:4], w, 1e-5, "tanh")
    with pytest.raises(ValueError, match="the input's device"):
        layernorm_gelu(x, w, w.to("meta"), 1e-5, "tanh")


def test_gpu_tile_shape_keeps_sixteen_values_per_thread():
    assert _tile_shape(4096) == (1, 8)
    assert _tile_shape(8192) == (1, 16)
    assert _tile_shape(65536) == (1, 32)
    block_m, warps = _tile_shape(256)
    assert block_m * 256 == 2048 and warps == 4


# -- the plugin -----------------------------------------------------------------------------------
def test_plugin_inputs_are_deterministic_for_a_seed():
    plugin = FusedLayerNormGelu()
    for case in plugin.cases:
        a = plugin.inputs(case, torch.Generator().manual_seed(7), "cpu")
        b = plugin.inputs(case, torch.Generator().manual_seed(7), "cpu")
        c = plugin.inputs(case, torch.Generator().manual_seed(8), "cpu")
        assert a["approximate"] == case["approximate"]
        for name in ("x", "weight", "bias"):
            assert a[name].dtype == case.dtype
            assert torch.equal(a[name], b[name])
        assert not torch.equal(a["x"], c["x"])


def test_plugin_declares_variants_tolerances_and_counts():
    plugin = FusedLayerNormGelu()
    roles = {name: v.role for name, v in plugin.variants.items()}
    assert roles == {"eager": Role.BASELINE, "triton": Role.CANDIDATE, "compile": Role.PEER}
    assert plugin.variants["compile"].supports(plugin.cases[0], "cpu")
    assert plugin.variants["compile"].supports(plugin.cases[0], "cuda") is None
    for case in plugin.cases:
        assert case["dtype"] in DTYPES
        assert plugin.tolerance_for(case)
        assert plugin.grad_inputs(case) == ("x", "weight", "bias")
        rows, cols, size = case["rows"], case["cols"], case.dtype.itemsize
        assert plugin.bytes(case) == (2 * rows * cols + 2 * cols) * size
        assert plugin.bytes(case, backward=True) == (5 * rows * cols + 6 * cols) * size
        assert plugin.flops(case, backward=True) > plugin.flops(case) > 0
        assert case["cols"] % 16, "default columns should not be a multiple of a block"


def test_plugin_candidate_meets_its_tolerance_on_default_cases():
    """The candidate, on every default case, against the float64 truth and the eager baseline,
    under the element and noise-calibrated rules that ``Tolerance`` documents."""
    plugin = FusedLayerNormGelu()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(3), DEVICE)
        tol = plugin.tolerance_for(case)
        x64 = {k: (v.double() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        truth = plugin.variants["eager"].fn(**x64)
        base = plugin.variants["eager"].fn(**inputs)
        got = plugin.variants["triton"].fn(**inputs)
        limit = tol.ref_factor * max(rel_err(base, truth), torch.finfo(case.dtype).eps / 2)
        assert rel_err(got, truth) <= limit, case.id
        outside = ((got.double() - truth).abs() > tol.atol + tol.rtol * truth.abs()).double().mean()
        assert outside <= tol.max_mismatch, case.id


def test_precompile_shards_build_each_forward_plan_and_the_backward_once(monkeypatch):
    """``compile_jobs`` holds one build per tuned forward plan and, with gradients, one for the backward
    (with its column sums); shard ``i`` of ``n`` runs jobs ``i, i+n, ...``, so the shards run each once."""
    from microscope_kernels.fused_layernorm_gelu import kernel

    built = []
    monkeypatch.setattr(kernel._fwd_kernel, "warmup", lambda *a, grid, **kw: built.append(("fwd", kw["num_warps"],
                                                                                         kw["PREFETCH"], kw["STAGES"])))
    monkeypatch.setattr(kernel._bwd_kernel, "warmup", lambda *a, grid, **kw: built.append(("bwd", kw["num_warps"])))
    monkeypatch.setattr(kernel._sum_partials_kernel, "warmup", lambda *a, grid, **kw: built.append(("sum",)))
    monkeypatch.setattr(kernel, "interpreting", lambda: False)
    cpu = torch.device("cpu")
    real = kernel.compile_jobs
    monkeypatch.setattr(kernel, "compile_jobs", lambda *a, **kw: real(*a, **kw, device=cpu))
    n = 4096
    assert len(real(16384, n, torch.bfloat16, "tanh", 1e-5, False, device=cpu)) == len(forward_plans(n))
    for index in range(4):
        kernel.precompile(16384, n, torch.bfloat16, "tanh", 1e-5, True, (index, 4))
    plans = sorted(("fwd", p.warps, p.prefetch, p.stages) for p in forward_plans(n))
    assert sorted(b for b in built if b[0] == "fwd") == plans
    assert [b[0] for b in built if b[0] != "fwd"] == ["bwd", "sum"]


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(100, 781), (16384, 4096)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_precompiled_builds_are_the_ones_the_first_call_runs(shape, dtype, seed):
    """After every shard built, the first forward (with its plan tuning) and backward build nothing more:
    the precompiled specializations are the call's own."""
    from microscope_kernels.fused_layernorm_gelu.kernel import precompile
    from triton_builds import triton_builds

    for index in range(3):
        precompile(*shape, dtype, "tanh", 1e-5, True, (index, 3))
    x, w, b, dy = (t.to(dtype) for t in make_inputs(shape, seed))
    x.requires_grad_(True)
    with triton_builds() as builds:
        layernorm_gelu(x, w, b, 1e-5, "tanh").backward(dy)
        torch.cuda.synchronize()
    assert builds == []
    assert x.grad is not None and torch.isfinite(x.grad).all()
