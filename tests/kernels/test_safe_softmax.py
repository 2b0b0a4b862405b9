"""Safe softmax vs the float64 safe softmax: odd shapes, every dtype, large logits, -inf, constants.

Errors are judged against torch.softmax's own error in the same dtype (<= 4x, plus a floor of a few
unit roundoffs). Each test prints its random seed, which pytest shows when the test fails.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.safe_softmax.ablation import SafeSoftmax
from microscope_kernels.safe_softmax.kernel import safe_softmax, softmax_backward
from microscope_kernels.safe_softmax.reference import naive_softmax, safe_softmax_reference

from microscope.api import DTYPES, Role

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]
NEG_INF = float("-inf")


def rel_err(y: torch.Tensor, truth: torch.Tensor) -> float:
    return float((y.double() - truth).norm() / truth.norm().clamp_min(1e-300))


def forward_backward(fn, x: torch.Tensor, dy: torch.Tensor, dtype: torch.dtype):
    leaf = x.detach().to(dtype).requires_grad_(True)
    y = fn(leaf)
    y.backward(dy.to(dtype))
    return y.detach(), leaf.grad


def check_against_float64(x: torch.Tensor, seed: int, dtype: torch.dtype, **kwargs) -> None:
    """Output and gradient within 4x of torch.softmax's error (same dtype) + a floor, on rows that
    torch can handle (it returns NaN for fully masked rows, which the safe version maps to 0).

    The gradient's floor carries its conditioning: dx = y * (dy - sum(y * dy)) cancels for nearly
    one-hot rows (large logits), so an error of e in y moves dx by up to ~e * ||y * dy|| / ||dx||,
    whichever correct implementation computes it. y itself carries a few roundings (exp, the row sum, the
    division; more in the chunked path's rescaled running sums), so the floor is 4 eps times that
    conditioning, capped at 4096 eps (0.05% in fp32): a wrong kernel is off by far more.
    """
    dy = torch.randn(x.shape, generator=torch.Generator().manual_seed(seed + 1)).to(x.device)
    ours = forward_backward(lambda t: safe_softmax(t, **kwargs), x, dy, dtype)
    torch_ = forward_backward(lambda t: torch.softmax(t, -1), x, dy, dtype)
    truth = forward_backward(safe_softmax_reference, x.to(dtype), dy.to(dtype), torch.float64)
    rows = torch.isfinite(x.to(dtype).double()).any(-1)
    eps = torch.finfo(dtype).eps  # two unit roundoffs
    conditioning = float((truth[0] * dy.to(dtype).double()).norm() / truth[1].norm().clamp_min(1e-300))
    for name, got, base, ref in zip(("y", "dx"), ours, torch_, truth):
        floor = eps * (1.0 if name == "y" else min(max(1.0, 4.0 * conditioning), 4096.0))
        assert torch.isfinite(got).all(), f"{name} not finite (seed {seed})"
        limit = 4 * rel_err(base[rows], ref[rows]) + floor
        assert rel_err(got, ref) <= limit, (
            f"{name} {dtype}: rel err {rel_err(got, ref):.3g} > {limit:.3g} "
            f"(torch's own: {rel_err(base[rows], ref[rows]):.3g}; seed {seed})")


def logits(shape, seed, scale=1.0) -> torch.Tensor:
    return (torch.randn(shape, generator=torch.Generator().manual_seed(seed)) * scale).to(DEVICE)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("scale", [1.0, 100.0])
@pytest.mark.parametrize("shape", [(37, 781), (8, 1024), (2, 3, 100)], ids=["odd", "pow2", "3d"])
def test_forward_and_gradient_match_float64(shape, scale, dtype, seed):
    check_against_float64(logits(shape, seed, scale), seed, dtype)


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_masked_constant_and_empty_rows(dtype, seed):
    x = logits((9, 300), seed, scale=5.0)
    x[0, ::3] = NEG_INF  # partly masked
    x[1, 1:] = NEG_INF  # one survivor: probability exactly 1
    x[2] = 7.0  # constant row: uniform
    x[3] = NEG_INF  # fully masked: zeros, not NaN
    check_against_float64(x, seed, dtype)
    y = safe_softmax(x.to(dtype))
    assert torch.all(y[0, ::3] == 0) and y[1, 0] == 1 and torch.all(y[1, 1:] == 0)
    assert torch.allclose(y[2].double(), torch.full((300,), 1 / 300, dtype=torch.float64), rtol=4e-3)
    assert torch.all(y[3] == 0)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, computing with NaN and inf
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("single_pass_cols", [65536, 64], ids=["one-pass", "chunked"])
def test_a_nan_or_inf_logit_turns_its_row_nan_as_torch_softmax_does(single_pass_cols, dtype, seed):
    """A NaN logit (or +inf, whose shifted exponent is inf - inf) must make its whole row NaN, so the
    fault shows. Clamping the row total to >= 1 (which keeps fully masked rows at 0) once let a NaN
    total through as 1: the row came out finite, unnormalized and wrong. Other rows stay untouched."""
    x = logits((5, 300), seed, scale=3.0)
    x[1, 7] = float("nan")
    x[3, 100:102] = float("inf")
    x = x.to(dtype)
    y = safe_softmax(x, max_single_pass_cols=single_pass_cols)
    assert torch.isnan(y[[1, 3]]).all()
    assert torch.isfinite(y[[0, 2, 4]]).all()
    assert torch.equal(y[[0, 2, 4]], safe_softmax(x[[0, 2, 4]], max_single_pass_cols=single_pass_cols))
    assert torch.isnan(torch.softmax(x.float(), dim=-1)[[1, 3]]).all()  # the behaviour matched


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_chunked_path_for_long_rows(dtype, seed):
    """Rows longer than the single-pass limit go through the online two-pass kernels (forced here
    with a 64-column limit on 300-column rows)."""
    x = logits((5, 300), seed, scale=30.0)
    x[1, ::2] = NEG_INF
    x[2] = NEG_INF
    check_against_float64(x, seed, dtype, max_single_pass_cols=64)


def test_naive_overflows_where_safe_stays_finite(seed):
    """The claim under test: at logits ~100x a unit normal, exp overflows in every dtype for the
    naive formula (fp16 already past ~11), while the max-shifted kernel stays finite and accurate."""
    x = logits((16, 257), seed, scale=100.0)
    for dtype in FLOAT_DTYPES:
        assert not torch.isfinite(naive_softmax(x.to(dtype))).all(), f"{dtype} (seed {seed})"
        y = safe_softmax(x.to(dtype))
        assert torch.isfinite(y).all(), f"{dtype} (seed {seed})"
        truth = safe_softmax_reference(x.to(dtype).double())  # the same (rounded) logits
        assert rel_err(y, truth) < torch.finfo(dtype).eps, f"{dtype} (seed {seed})"
    moderate = logits((16, 257), seed)
    moderate = moderate * (60.0 / moderate.abs().amax())  # |max| 60: past fp16's exp limit (~11), not fp32's (~88)
    assert not torch.isfinite(naive_softmax(moderate.half())).all()
    assert torch.isfinite(naive_softmax(moderate.float())).all()


# -- the plugin -----------------------------------------------------------------------------------
def test_plugin_inputs_are_deterministic_and_masked_rows_never_empty():
    plugin = SafeSoftmax()
    for case in plugin.cases:
        a = plugin.inputs(case, torch.Generator().manual_seed(11), "cpu")["x"]
        b = plugin.inputs(case, torch.Generator().manual_seed(11), "cpu")["x"]
        c = plugin.inputs(case, torch.Generator().manual_seed(12), "cpu")["x"]
        assert a.dtype == case.dtype and a.shape == (case["rows"], case["cols"])
        assert torch.equal(a, b) and not torch.equal(a, c)
        finite = torch.isfinite(a)
        assert finite.any(-1).all()
        assert (not finite.all()) == case["masked"]


def test_plugin_declares_variants_tolerances_and_counts():
    plugin = SafeSoftmax()
    roles = {name: v.role for name, v in plugin.variants.items()}
    assert roles == {"naive": Role.BASELINE, "triton": Role.CANDIDATE, "torch": Role.PEER}
    assert {case["scale"] for case in plugin.cases} >= {1.0, 100.0}
    for case in plugin.cases:
        assert case["dtype"] in DTYPES and plugin.tolerance_for(case)
        assert plugin.grad_inputs(case) == ("x",)
        elems = case["rows"] * case["cols"] * case.dtype.itemsize
        assert plugin.bytes(case) == 2 * elems and plugin.bytes(case, backward=True) == 5 * elems


def test_plugin_reference_is_the_float64_safe_softmax(seed):
    """At scale 100 the float64 truth must come from the max-shifted formula: finite, rows sum to 1."""
    plugin = SafeSoftmax()
    case = next(c for c in plugin.cases if c["scale"] == 100.0 and c["masked"])
    x = plugin.inputs(case, torch.Generator().manual_seed(seed), "cpu")["x"].double()
    truth = plugin.reference({"x": x})
    assert truth.dtype == torch.float64 and torch.isfinite(truth).all()
    assert torch.allclose(truth.sum(-1), torch.ones(case["rows"], dtype=torch.float64))


def test_plugin_candidate_meets_its_tolerance_where_naive_fails():
    """On every default case the candidate passes the declared rules against the float64 truth; at
    scale 100 the naive baseline's outputs are non-finite (what the harness records as failures)."""
    plugin = SafeSoftmax()
    for case in plugin.cases:
        x = plugin.inputs(case, torch.Generator().manual_seed(5), DEVICE)["x"]
        tol = plugin.tolerance_for(case)
        truth = plugin.reference({"x": x.double()})
        got = plugin.variants["triton"].fn(x)
        peer = plugin.variants["torch"].fn(x)
        limit = tol.ref_factor * max(rel_err(peer, truth), torch.finfo(case.dtype).eps / 2)
        assert rel_err(got, truth) <= limit, case.id
        outside = ((got.double() - truth).abs() > tol.atol + tol.rtol * truth.abs()).double().mean()
        assert outside <= tol.max_mismatch, case.id
        if case["scale"] == 100.0:
            assert not torch.isfinite(plugin.variants["naive"].fn(x)).all(), case.id


def test_backward_rejects_a_gradient_of_another_shape():
    y = torch.softmax(torch.randn(3, 5), dim=-1)
    with pytest.raises(ValueError, match=r"dy must have y's shape \(3, 5\), got \(3, 4\)"):
        softmax_backward(y, torch.randn(3, 4))


def test_precompile_shards_hand_out_every_candidate_of_forward_and_backward_once(monkeypatch):
    """Shard ``i`` of ``n`` compiles the candidates ``i, i+n, ...`` of ``compile_jobs``: together the shards
    cover every forward and backward candidate the autotuners time, each once."""
    import functools

    from microscope_kernels.safe_softmax import kernel

    jobs = kernel.compile_jobs(4096, 16384, torch.bfloat16, True, device="cpu")
    names = {tuner.fn.__name__ for tuner, *_ in jobs}
    assert names == {"_softmax_fwd_kernel", "_softmax_bwd_kernel"}
    assert len(kernel.compile_jobs(4096, 16384, torch.bfloat16, False, device="cpu")) < len(jobs)
    assert kernel.compile_jobs(4, 65537, torch.bfloat16, True, device="cpu") == []  # the chunked path
    built = []
    for tuner in {tuner for tuner, *_ in jobs}:
        monkeypatch.setattr(tuner.fn, "warmup", lambda *a, grid, **kw: built.append(tuple(sorted(kw.items()))))
    monkeypatch.setattr(kernel, "interpreting", lambda: False)
    monkeypatch.setattr(kernel, "compile_jobs", functools.partial(kernel.compile_jobs, device="cpu"))
    for index in range(3):
        kernel.precompile(4096, 16384, torch.bfloat16, True, (index, 3))
    want = [tuple(sorted({**consts, **cfg.all_kwargs()}.items())) for _, _, consts, cfg in jobs]
    assert sorted(built) == sorted(want) and len(set(built)) == len(jobs)


@pytest.mark.gpu
@pytest.mark.parametrize("shape", [(100, 781), (4096, 16384)])
@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_precompiled_candidates_are_the_ones_the_first_call_runs(shape, dtype, seed):
    """After every shard compiled, the first forward and backward build nothing more: the precompiled
    specializations are the call's own (a mismatch would compile again in the run's first call)."""
    from microscope_kernels.safe_softmax.kernel import precompile
    from triton_builds import triton_builds

    m, n = shape
    for index in range(4):
        precompile(m, n, dtype, True, (index, 4))
    with triton_builds() as builds:
        x = logits((m, n), seed).to("cuda", dtype).requires_grad_(True)
        y = safe_softmax(x)
        y.backward(torch.ones_like(y))
        torch.cuda.synchronize()
    assert builds == []
    assert rel_err(y.detach(), torch.softmax(x.detach().double(), -1)) < 1e-2
