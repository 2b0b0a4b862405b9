"""flash_attention (forward and gradients) vs float64 eager attention: the Triton interpreter on CPU, the
compiled kernel on a GPU host.

Every test draws fresh random inputs from a new seed, printed in any failure message; rerun one case with
``MICROSCOPE_TEST_SEED=<seed>``. Errors are judged relative to the error eager attention itself makes in the
same dtype (``rel_err(kernel) <= 4 * rel_err(eager) + floor``), not against a hand-tuned atol: a kernel
passes when it is about as accurate as the plain PyTorch it replaces, in every dtype.

Shapes are tiny and odd (the interpreter runs each program in numpy), yet span several tiles of the fixed
interpreter configuration (32 x 16), so masked tails, causal diagonals and Sq != Sk all occur.
"""

from __future__ import annotations

import functools
import os
import secrets

import pytest
import torch

#: Compiled kernels on a GPU host; the Triton interpreter with CPU tensors elsewhere (CI).
from attention_checks import DEVICE, DTYPES, error_limit
from attention_checks import rel_err as _rel
from microscope_kernels.flash_attn import kernel
from microscope_kernels.flash_attn.kernel import flash_attention
from microscope_kernels.flash_attn.peers import PEERS, sdpa_math
from microscope_kernels.flash_attn.reference import causal_visible, eager_attention


def _seed() -> int:
    return int(os.environ.get("MICROSCOPE_TEST_SEED", secrets.randbits(31)))


def _fwd_bwd(fn, inputs: list[torch.Tensor], do: torch.Tensor, causal: bool) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, causal=causal)
    out.backward(do)
    return [out.detach()] + [t.grad for t in leaves]


def _inputs(seed: int, sq: int, sk: int, head_dim: int, dtype: torch.dtype, q_scale: float = 1.0):
    """q, k, v, dO in ``dtype`` (batch 1, 2 heads). ``q_scale`` > 1 makes sharp softmaxes (large logits)."""
    gen = torch.Generator().manual_seed(seed)
    shapes = [(1, 2, sq, head_dim), (1, 2, sk, head_dim), (1, 2, sk, head_dim), (1, 2, sq, head_dim)]
    q, k, v, do = (torch.randn(shape, generator=gen, dtype=torch.float64) for shape in shapes)
    # Keys growing along the sequence make the running max jump between tiles (the rescaling paths).
    k = k * torch.linspace(0.5, 1.5, sk, dtype=torch.float64)[:, None]
    return [t.to(device=DEVICE, dtype=dtype) for t in (q * q_scale, k, v, do)]


def assert_as_accurate_as_eager(sq: int, sk: int, head_dim: int, dtype: torch.dtype, causal: bool,
                                q_scale: float = 1.0, **options) -> None:
    """Out, dq, dk, dv of flash_attention (with keyword ``options`` such as ``dq``, ``split``) vs float64
    eager, against eager's own error in ``dtype``."""
    seed = _seed()
    q, k, v, do = _inputs(seed, sq, sk, head_dim, dtype, q_scale)
    # The reference sees the same rounded inputs, so only the arithmetic is compared.
    ref = _fwd_bwd(eager_attention, [q.double(), k.double(), v.double()], do.double(), causal)
    eager = _fwd_bwd(eager_attention, [q, k, v], do, causal)
    got = _fwd_bwd(functools.partial(flash_attention, **options), [q, k, v], do, causal)
    for name, g, e, r in zip(("out", "dq", "dk", "dv"), got, eager, ref):
        assert g.dtype == dtype and g.shape == r.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        err, (base, limit) = _rel(g, r), error_limit(e, r, dtype)
        assert err <= limit, (f"{name}: rel. error {err:.2e} > {limit:.2e} (eager {base:.2e}) for Sq={sq} "
                              f"Sk={sk} D={head_dim} {dtype} causal={causal} {options}; MICROSCOPE_TEST_SEED={seed}")


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize(("sq", "sk", "head_dim"), [(37, 53, 64), (100, 100, 128), (1, 45, 64)])
def test_matches_float64_eager(sq: int, sk: int, head_dim: int, dtype: str, causal: bool) -> None:
    assert_as_accurate_as_eager(sq, sk, head_dim, DTYPES[dtype], causal)


@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
@pytest.mark.parametrize(("sq", "sk"), [(45, 128), (128, 128)])
def test_whole_tiles_single_loop(monkeypatch: pytest.MonkeyPatch, sq: int, sk: int, tma: str) -> None:
    """No causal mask and S a multiple of 128: the forward and dQ (Sk) and dK/dV (Sq) compile one loop."""
    monkeypatch.setenv("MICROSCOPE_FLASH_TMA", tma)
    assert_as_accurate_as_eager(sq, sk, 64, torch.bfloat16, causal=False)


@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize(("sq", "sk", "head_dim"), [(37, 53, 64), (53, 37, 32), (128, 96, 128)])
def test_atomic_dq_matches_float64_eager(monkeypatch: pytest.MonkeyPatch, sq: int, sk: int, head_dim: int,
                                         dtype: str, causal: bool, tma: str) -> None:
    """dQ added by the dK/dV kernel: key tiles past Sk (through TMA another head's keys) and query tiles
    past Sq must add nothing, to this head or the next. Sq = 128 (no causal mask) runs the single-loop path."""
    monkeypatch.setenv("MICROSCOPE_FLASH_TMA", tma)
    assert_as_accurate_as_eager(sq, sk, head_dim, DTYPES[dtype], causal, dq="atomic")


@pytest.mark.parametrize("tma", ["0", "1"], ids=["pointers", "tma"])
@pytest.mark.parametrize("dtype", list(DTYPES), ids=list(DTYPES))
@pytest.mark.parametrize(("sq", "sk", "causal"), [(37, 53, True), (53, 37, True), (100, 100, True),
                                                  (37, 53, False), (1, 45, True)])
def test_split_forward_matches_float64_eager(monkeypatch: pytest.MonkeyPatch, sq: int, sk: int, causal: bool,
                                             dtype: str, tma: str) -> None:
    """The masked tiles in a second launch that resumes from the first's O and LSE: causal diagonals with
    Sq <, = and > Sk (rows that see no key in either launch, or only in the second), a partial last key tile
    without mask, a single query."""
    monkeypatch.setenv("MICROSCOPE_FLASH_TMA", tma)
    assert_as_accurate_as_eager(sq, sk, 64, DTYPES[dtype], causal, split=True)


def test_split_without_masked_tiles_is_the_single_launch() -> None:
    """No causal mask and whole tiles: nothing to split, the one launch runs (bit-identical output)."""
    q, k, v, _ = _inputs(_seed(), 64, 128, 32, torch.float32)
    assert torch.equal(flash_attention(q, k, v, split=True), flash_attention(q, k, v))


def test_both_dq_modes_agree_and_a_bad_mode_is_refused() -> None:
    seed = _seed()
    q, k, v, do = _inputs(seed, 45, 61, 64, torch.float32)
    separate = _fwd_bwd(flash_attention, [q, k, v], do, True)
    atomic = _fwd_bwd(functools.partial(flash_attention, dq="atomic"), [q, k, v], do, True)
    assert torch.equal(separate[0], atomic[0]), "the forward does not depend on the dQ mode"
    for name, a, b in zip(("dq", "dk", "dv"), atomic[1:], separate[1:]):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6, msg=f"{name}; MICROSCOPE_TEST_SEED={seed}")
    with pytest.raises(ValueError, match="dq='atomics'"):
        flash_attention(q, k, v, dq="atomics")


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # no softmax: O = PV / 0
@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_each_omitted_stage_is_what_leaves_the_kernel(dtype: str) -> None:
    """The stage study's launches leave out what they say: no PV GEMM leaves O zero; no exponentials or no
    softmax change O. They are forward only, and an unknown stage is refused by name."""
    q, k, v, _ = _inputs(_seed(), 45, 61, 64, DTYPES[dtype])
    whole = flash_attention(q, k, v)
    assert torch.all(flash_attention(q, k, v, omit="pv") == 0)
    for stage in ("exp2", "softmax"):
        out = flash_attention(q, k, v, omit=stage)
        assert out.shape == whole.shape and not torch.allclose(out.double(), whole.double(), equal_nan=False), stage
    assert torch.equal(flash_attention(q, k, v), whole), "the study's launches leave the whole kernel as it was"
    leaf = q.detach().clone().requires_grad_()
    with pytest.raises(RuntimeError, match="forward-only speed study"):
        flash_attention(leaf, k, v, omit="exp2").sum().backward()
    with pytest.raises(ValueError, match="omit='qk'.*'softmax'"):
        flash_attention(q, k, v, omit="qk")


@pytest.mark.parametrize("dtype", ["fp32", "bf16"])
def test_causal_queries_that_see_no_key_output_zero(dtype: str) -> None:
    """Sq > Sk causal: the first Sq - Sk queries see nothing; output and gradients there are zero."""
    assert_as_accurate_as_eager(53, 37, 64, DTYPES[dtype], causal=True)
    q, k, v, _ = _inputs(_seed(), 53, 37, 64, DTYPES[dtype])
    assert torch.all(flash_attention(q, k, v, causal=True)[:, :, :16] == 0)


@pytest.mark.parametrize("lazy", [False, True], ids=["exact", "lazy"])
def test_large_logits_in_both_rescaling_modes(monkeypatch: pytest.MonkeyPatch, lazy: bool) -> None:
    """Sharp softmaxes whose max jumps across tiles, with the exact and the lazy (thresholded) rescale."""
    monkeypatch.setitem(kernel._INTERPRET_FWD, "LAZY", lazy)
    assert_as_accurate_as_eager(70, 90, 64, torch.bfloat16, causal=False, q_scale=6.0)
    assert_as_accurate_as_eager(70, 90, 64, torch.float32, causal=True, q_scale=6.0)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_tma_descriptor_path(monkeypatch: pytest.MonkeyPatch, causal: bool) -> None:
    """The Hopper load path (tensor descriptors over the flattened heads) gives the same answers."""
    monkeypatch.setenv("MICROSCOPE_FLASH_TMA", "1")
    assert_as_accurate_as_eager(37, 53, 64, torch.float16, causal)


def test_non_contiguous_inputs_and_custom_scale() -> None:
    seed = _seed()
    gen = torch.Generator().manual_seed(seed)
    # (B, S, H, D) projections viewed as (B, H, S, D): not contiguous.
    q, k, v = (torch.randn(1, 40, 2, 64, generator=gen).to(DEVICE).transpose(1, 2) for _ in range(3))
    got = flash_attention(q, k, v, causal=True, sm_scale=0.3)
    ref = eager_attention(q.double(), k.double(), v.double(), causal=True, sm_scale=0.3)
    assert _rel(got, ref) < 1e-5, f"MICROSCOPE_TEST_SEED={seed}"


@pytest.mark.parametrize("head_dim", [48, 512])
def test_unsupported_head_dim_raises(head_dim: int) -> None:
    q = torch.randn(1, 1, 8, head_dim)
    with pytest.raises(ValueError, match=r"head dims \(32, 64, 128, 256\)"):
        flash_attention(q, q, q)


def test_mismatched_shapes_and_dtypes_raise() -> None:
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match="disagree"):
        flash_attention(q, torch.randn(1, 3, 8, 64), torch.randn(1, 3, 8, 64))
    with pytest.raises(ValueError, match="one dtype"):
        flash_attention(q, q.half(), q)


def test_reference_causal_mask_is_bottom_right() -> None:
    visible = causal_visible(2, 4)
    assert visible.tolist() == [[True, True, True, False], [True, True, True, True]]
    q, k, v = (torch.randn(1, 1, s, 8, dtype=torch.float64) for s in (3, 5, 5))
    explicit = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=causal_visible(3, 5))
    torch.testing.assert_close(eager_attention(q, k, v, causal=True), explicit)


@pytest.mark.parametrize(("sq", "sk", "causal", "step"), [(37, 53, True, 5), (53, 37, True, 7), (41, 41, False, 16),
                                                      (29, 29, True, 1), (0, 9, True, 4)])
def test_reference_in_row_slices_is_the_whole_reference(sq: int, sk: int, causal: bool, step: int) -> None:
    """A float64 truth taken ``step`` query rows at a time (the causal mask's rows offset with them, queries
    that see no key zero) equals the one-shot reference, outputs and gradients."""
    gen = torch.Generator().manual_seed(secrets.randbits(32))
    q, k, v = (torch.randn(2, 3, s, 16, generator=gen, dtype=torch.float64, requires_grad=True) for s in (sq, sk, sk))
    cot = torch.randn(2, 3, sq, 16, generator=gen, dtype=torch.float64)
    whole = eager_attention(q, k, v, causal=causal)
    sliced = eager_attention(q, k, v, causal=causal, rows_per_step=step)
    torch.testing.assert_close(sliced, whole, rtol=1e-12, atol=1e-12)
    for a, b in zip(torch.autograd.grad(whole, (q, k, v), cot), torch.autograd.grad(sliced, (q, k, v), cot)):
        torch.testing.assert_close(b, a, rtol=1e-12, atol=1e-12)


def test_the_plugins_truth_is_taken_in_row_slices(monkeypatch: pytest.MonkeyPatch) -> None:
    """flash_attn's (and flash_attn_fp8's) float64 truth holds at most ``TRUTH_SCORES`` scores at a time, so a
    16k-token case fits on an 80 GB card, and equals the eager baseline on the same inputs."""
    import microscope_kernels.attention_inputs as shared
    from microscope_kernels.flash_attn.ablation import FlashAttention

    monkeypatch.setattr(shared, "TRUTH_SCORES", 2 * 3 * 50 * 4)  # 4 of 37 query rows a step
    steps = []
    real = torch.matmul
    monkeypatch.setattr(torch, "matmul", lambda a, b: steps.append(a.shape[-2]) or real(a, b))
    q, k, v = (torch.randn(2, 3, s, 16, dtype=torch.float64) for s in (37, 50, 50))
    truth = FlashAttention().reference({"q": q, "k": k, "v": v, "causal": True})
    assert max(steps) == 4 and len(steps) == 2 * 10
    monkeypatch.setattr(torch, "matmul", real)
    torch.testing.assert_close(truth, eager_attention(q, k, v, causal=True), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize(("sq", "sk"), [(7, 13), (13, 7)])
def test_sdpa_math_peer_uses_the_same_causal_alignment(sq: int, sk: int) -> None:
    q, k, v = (torch.randn(1, 2, s, 16, dtype=torch.float64) for s in (sq, sk, sk))
    torch.testing.assert_close(sdpa_math(q, k, v, causal=True), eager_attention(q, k, v, causal=True))


def test_peers_report_why_they_cannot_run() -> None:
    shape_q, shape_k = (1, 2, 37, 64), (1, 2, 53, 64)
    reasons = {name: peer.supports(shape_q, shape_k, torch.float32, "cpu", True)
               for name, peer in PEERS.items()}
    assert reasons.pop("sdpa_math") is None
    assert all(isinstance(reason, str) for reason in reasons.values()), reasons
    assert "top-left" in PEERS["sdpa_cudnn"].supports(shape_q, shape_k, torch.bfloat16, "cuda", True)


def test_a_forced_load_path_is_checked_and_reaches_forward_and_backward():
    """``loads`` (swept by ``--profile bench,loads``): a bad value is refused; pointer loads give what
    the automatic choice gives (on an sm_90 GPU in bf16 that is TMA, a different path), gradients too."""
    dtype = torch.bfloat16 if DEVICE == "cuda" else torch.float32
    gen = torch.Generator().manual_seed(3)
    q, k, v = (torch.randn((1, 2, 37, 64), generator=gen).to(DEVICE, dtype).requires_grad_(True) for _ in range(3))
    with pytest.raises(ValueError, match="loads='tmaa'"):
        flash_attention(q, k, v, loads="tmaa")
    outs, grads = [], []
    for loads in ("auto", "pointers"):
        for t in (q, k, v):
            t.grad = None
        out = flash_attention(q, k, v, causal=True, loads=loads)
        out.float().sum().backward()
        outs.append(out.float())
        grads.append([t.grad.float() for t in (q, k, v)])
    tol = {"rtol": 2e-2, "atol": 2e-2} if dtype == torch.bfloat16 else {"rtol": 0, "atol": 0}
    torch.testing.assert_close(outs[0], outs[1], **tol)
    for a, b in zip(*grads):
        torch.testing.assert_close(a, b, **tol)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_every_atomic_dq_candidate_builds_and_runs_on_this_gpu(causal: bool) -> None:
    """Each pruned candidate of the dK/dV kernel that adds dQ (a TMA bulk reduction on sm_90) compiles and
    launches; then the autotuned call is as accurate as eager (the interpreter adds dQ through pointers)."""
    q = torch.zeros((1, 1, 1024, 128), device="cuda", dtype=torch.bfloat16)
    assert kernel.precompile(q, q, causal, dq="atomic", launch=True) == []
    assert_as_accurate_as_eager(1024, 1024, 128, torch.bfloat16, causal, dq="atomic")


@pytest.mark.gpu
@pytest.mark.parametrize(("sq", "causal"), [(4096, True), (1000, False)], ids=["causal", "tail"])
def test_split_forward_candidates_build_and_the_call_builds_nothing_more(sq: int, causal: bool) -> None:
    """Every first-launch candidate (warp-specialized ones included, now that the launch has one loop) and
    the masked tiles' launch at its tiles are precompiled; the split call then builds nothing."""
    from triton_builds import triton_builds

    z = torch.zeros((1, 1, sq, 128), device="cuda", dtype=torch.bfloat16)
    assert kernel.precompile(z, z, causal, backward=False, split=True) == []
    q, k, v, _ = _inputs(_seed(), sq, sq, 128, torch.bfloat16)
    with triton_builds() as builds:
        out = flash_attention(q, k, v, causal=causal, split=True)
        torch.cuda.synchronize()
    assert [name for name, cache_hit in builds if not cache_hit] == []
    torch.testing.assert_close(out.float(), flash_attention(q, k, v, causal=causal).float(), rtol=2e-2, atol=2e-2)
