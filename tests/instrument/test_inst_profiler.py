"""Profiles and trace diffs: valid Chrome traces, op tables, and "3 ops replaced by 1 fused op"."""

import gzip
import json
from types import SimpleNamespace

import pytest
import torch
import torch.nn.functional as F
from torch.autograd import DeviceType

from microscope.instrument import ProfileConfig, diff_profiles, profile_variant, readable_kernel_name
from microscope.instrument.profiler import _tables

CFG = ProfileConfig(enabled=True, wait=1, warmup=1, active=2)
N = 4096


class FusedMulGeluAdd(torch.autograd.Function):
    """One op standing for gelu(x * w) + b (its body is irrelevant to the profile's top level)."""

    @staticmethod
    def forward(ctx, x, w, b):
        return F.gelu(x * w) + b

    @staticmethod
    def backward(ctx, g):
        raise NotImplementedError


@pytest.fixture(scope="module")
def xwb():
    gen = torch.Generator().manual_seed(0)
    return [torch.randn(N, generator=gen) for _ in range(3)]


def unfused(x, w, b):
    return F.gelu(x * w) + b


def test_trace_is_gzipped_chrome_json(tmp_path, xwb):
    prof = profile_variant(lambda: unfused(*xwb), tmp_path / "base", CFG, name="base", device="cpu")
    assert prof.trace_path == tmp_path / "base" / "trace.json.gz"
    with gzip.open(prof.trace_path, "rt", encoding="utf-8") as fh:
        trace = json.load(fh)
    names = {e.get("name") for e in trace["traceEvents"]}
    assert {"aten::mul", "aten::gelu", "aten::add"} <= names


def test_schedule_keeps_only_active_steps_and_counts_calls(tmp_path, xwb):
    calls = []

    def fn():
        calls.append(1)
        return unfused(*xwb)

    prof = profile_variant(fn, None, CFG, name="base", device="cpu")
    assert len(calls) == CFG.wait + CFG.warmup + CFG.active == 4
    assert prof.trace_path is None and prof.steps == 2
    rows = {r["name"]: r for r in prof.summary_rows()}
    for op in ("aten::mul", "aten::gelu", "aten::add"):
        assert rows[op]["count"] == 2 and rows[op]["calls_per_step"] == 1.0 and rows[op]["clock"] == "cpu"
    assert all(not name.startswith(("ProfilerStep", "[")) for name in rows)
    frame = prof.summary(top_k=2)
    assert len(frame) == 2 and list(frame["self_us"]) == sorted(frame["self_us"], reverse=True)


def test_trace_diff_reports_three_ops_replaced_by_one(tmp_path, xwb):
    base = profile_variant(lambda: unfused(*xwb), tmp_path / "base", CFG, name="base", device="cpu")
    fused = profile_variant(lambda: FusedMulGeluAdd.apply(*xwb), tmp_path / "fused", CFG, name="fused", device="cpu")
    assert [s.name for s in fused.top_level] == ["FusedMulGeluAdd"]  # its inner ATen ops are not top level
    diff = diff_profiles(base, fused)
    assert diff.unit == "op" and diff.clock == "CPU"
    assert sorted(diff.removed) == ["aten::add", "aten::gelu", "aten::mul"]
    assert diff.added == ["FusedMulGeluAdd"]
    assert diff.headline.startswith("3 ops replaced by 1 fused op, ")
    assert diff.headline.endswith("% CPU time")
    same = diff_profiles(base, base)
    assert same.headline.startswith("same 3 ops") and not same.removed and not same.added
    assert "`aten::gelu` | removed" in diff.to_markdown()


def test_count_changes_are_reported(xwb):
    once = profile_variant(lambda: unfused(*xwb), None, CFG, name="once", device="cpu")
    twice = profile_variant(lambda: unfused(unfused(*xwb), *xwb[1:]), None, CFG, name="twice", device="cpu")
    diff = diff_profiles(once, twice)
    assert sorted(diff.count_changed) == ["aten::add", "aten::gelu", "aten::mul"]
    assert "3 changed in count" in diff.headline
    row = next(r for r in diff.rows if r.name == "aten::mul")
    assert (row.base_calls, row.cand_calls) == (1.0, 2.0)


def test_interpreted_or_compiled_triton_kernel_is_a_named_op(tmp_path):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def mul_add(x_ptr, w_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        y = tl.load(x_ptr + offs, mask=mask) * tl.load(w_ptr + offs, mask=mask) + tl.load(b_ptr + offs, mask=mask)
        tl.store(out_ptr + offs, y, mask=mask)

    x, w, b = (torch.randn(256) for _ in range(3))

    def fused():
        out = torch.empty_like(x)
        mul_add[(2,)](x, w, b, out, 256, BLOCK=128)
        return out

    prof = profile_variant(fused, tmp_path, CFG, name="triton", device="cpu")
    assert "triton::mul_add" in [s.name for s in prof.top_level]
    base = profile_variant(lambda: x * w + b, None, CFG, name="base", device="cpu")
    diff = diff_profiles(base, prof)
    assert "triton::mul_add" in diff.added and {"aten::mul", "aten::add"} <= set(diff.removed)


@pytest.mark.parametrize(
    ("raw", "launcher", "expected"),
    [
        ("void at::native::vectorized_elementwise_kernel<4, at::native::GeluCUDAKernelImpl(at::TensorIteratorBase&, "
         "at::native::GeluType)::{lambda()#2}::operator()() const::{lambda(float)#1}, std::array<char*, 2ul> >"
         "(int, at::native::GeluCUDAKernelImpl, std::array<char*, 2ul>)", "aten::gelu",
         "vectorized_elementwise_kernel[aten::gelu]"),
        ("void at::native::reduce_kernel<512, 1, at::native::ReduceOp<float, at::native::func_wrapper_t<float, "
         "at::native::sum_functor<float, float, float>::operator()>, unsigned int, float, 4> >"
         "(at::native::ReduceOp<float>)", None, "reduce_kernel"),
        ("_attn_fwd", None, "_attn_fwd"),
        ("void at::native::(anonymous namespace)::cunn_SoftMaxForward<4, float, float, float, "
         "at::native::(anonymous namespace)::SoftMaxForwardEpilogue>(float*, float const*, int)", "aten::_softmax",
         "cunn_SoftMaxForward[aten::_softmax]"),
        ("sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64", "aten::mm",
         "sm90_xmma_gemm_bf16bf16_bf16f32_f32_tn_n_tilesize128x128x64[aten::mm]"),
        ("Memcpy DtoD (Device -> Device)", None, "Memcpy DtoD"),
    ],
)
def test_readable_kernel_names(raw, launcher, expected):
    assert readable_kernel_name(raw, launcher) == expected


def _event(name, device_type, self_us=0.0, annotation=False):
    return SimpleNamespace(name=name, device_type=device_type, is_user_annotation=annotation, kernels=(),
                           self_device_time_total=self_us, self_cpu_time_total=1.0, cpu_time_total=1.0,
                           cpu_parent=None)


@pytest.mark.parametrize("flagged", [True, False], ids=["flagged", "name-only"])
def test_device_mirrors_of_cpu_ranges_are_not_kernels(flagged):
    """On a GPU the ``triton::<name>`` range around a launch is mirrored onto the device timeline;
    counting the mirror as a kernel doubled the Triton kernel's calls and time (H200). Whether or
    not torch flags the mirror, the kernel table holds the kernel once."""
    events = [_event("triton::mul_gelu_add", DeviceType.CPU, annotation=True),
              _event("triton::mul_gelu_add", DeviceType.CUDA, 18.0, annotation=flagged),
              _event("mul_gelu_add", DeviceType.CUDA, 18.0),
              _event("Memcpy DtoD (Device -> Device)", DeviceType.CUDA, 2.0)]
    kernels, ops, _ = _tables(events)
    assert {(k.name, k.count, k.self_us) for k in kernels} == {("mul_gelu_add", 1, 18.0), ("Memcpy DtoD", 1, 2.0)}
    assert [o.name for o in ops] == ["triton::mul_gelu_add"]


@pytest.mark.gpu
def test_gpu_kernels_diff_unfused_vs_triton(tmp_path):
    triton = pytest.importorskip("triton")
    import triton.language as tl

    @triton.jit
    def mul_gelu_add(x_ptr, w_ptr, b_ptr, out_ptr, n, BLOCK: tl.constexpr):
        offs = tl.program_id(0) * BLOCK + tl.arange(0, BLOCK)
        mask = offs < n
        y = tl.load(x_ptr + offs, mask=mask) * tl.load(w_ptr + offs, mask=mask)
        y = 0.5 * y * (1 + tl.erf(y * 0.7071067811865476))
        tl.store(out_ptr + offs, y + tl.load(b_ptr + offs, mask=mask), mask=mask)

    n = 1 << 22
    x, w, b = (torch.randn(n, device="cuda") for _ in range(3))

    def fused():
        out = torch.empty_like(x)
        mul_gelu_add[(triton.cdiv(n, 1024),)](x, w, b, out, n, BLOCK=1024)
        return out

    torch.testing.assert_close(fused(), unfused(x, w, b), rtol=1e-5, atol=1e-5)
    base = profile_variant(lambda: unfused(x, w, b), tmp_path / "base", CFG, name="base", device="cuda")
    cand = profile_variant(fused, tmp_path / "cand", CFG, name="triton", device="cuda")
    assert {k.name for k in base.kernels} >= {"vectorized_elementwise_kernel[aten::mul]",
                                               "vectorized_elementwise_kernel[aten::gelu]",
                                               "vectorized_elementwise_kernel[aten::add]"}
    diff = diff_profiles(base, cand)
    assert diff.unit == "kernel" and diff.clock == "GPU"
    assert diff.added == ["mul_gelu_add"] and len(diff.removed) == 3
    assert diff.headline.startswith("3 kernels replaced by 1 fused kernel, ")
    assert diff.time_change is not None and diff.time_change < 0  # one pass over memory instead of three
    with gzip.open(cand.trace_path, "rt") as fh:
        assert any(e.get("name") == "mul_gelu_add" for e in json.load(fh)["traceEvents"])
