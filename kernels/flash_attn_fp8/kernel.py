"""FlashAttention forward with FP8 (e4m3) operands and per-block scales, in Triton.

Why: Hopper's tensor cores multiply e4m3 at twice the bf16 rate, and attention's forward at long sequences
is bound by its two matmuls. Each call quantizes its bf16/fp16 q, k and v in one pass (``quantize_blocks``:
per head and block of ``SCALE_BLOCK`` tokens, ``scale = absmax / 448`` and ``x / scale`` rounded to e4m3;
v written transposed, the layout an FP8 matmul wants for its second operand), then runs the online-softmax
loop with both matmuls in FP8: ``q k^T`` rescaled by the query row's and the key block's scales, and the
probabilities (in [0, 1]) times ``P_SCALE`` rounded to e4m3 for ``p v``. Softmax statistics and the
accumulator stay float32; the output is in the inputs' dtype. Forward only.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from microscope_kernels.attention_inputs import check_qkv
from microscope_kernels.autotune_timing import bench_candidate

from microscope.api import interpreting

#: Tokens that share one scale (per head): the key/value tile of the attention loop.
SCALE_BLOCK = 64
#: Probabilities (at most 1) are multiplied by this before rounding to e4m3, so that small ones keep
#: their mantissa bits rather than falling into e4m3's subnormals (a power of two: descaling is exact).
P_SCALE = 256.0
SUPPORTED_HEAD_DIMS = (64, 128)
FP8 = torch.float8_e4m3fn


@triton.jit
def _e4m3(x, INTERPRET: tl.constexpr):
    """x (within +-448) rounded to the nearest e4m3 value, as e4m3. A GPU's conversion rounds to nearest;
    the interpreter's truncates (or, asked to round, loses a power of two when the rounding carries into
    the exponent), so there the value is rounded in float32 first (half away from zero) and then exact."""
    if INTERPRET:
        a = tl.abs(x)
        exponent = tl.maximum(tl.floor(tl.log2(tl.maximum(a, 0.001953125))), -6.0)  # subnormals: spacing 2^-9
        spacing = tl.exp2(exponent - 3.0)  # 3 mantissa bits
        r = tl.minimum(tl.floor(a / spacing + 0.5) * spacing, 448.0)
        return tl.where(x < 0, -r, r).to(tl.float8e4nv)
    else:
        return x.to(tl.float8e4nv)


@triton.jit
def _quantize_kernel(X, Y, S, L, stride_xbh, stride_ybh, stride_ys, stride_yd, D: tl.constexpr,
                     BLOCK: tl.constexpr, INTERPRET: tl.constexpr):
    """One (head, block of BLOCK tokens): absmax / 448 (e4m3's largest value) as the scale, 1 for an all-zero
    block; the tokens divided by it in e4m3 at ``Y + bh * stride_ybh + token * stride_ys + d * stride_yd``."""
    bh, blk = tl.program_id(0).to(tl.int64), tl.program_id(1)
    rows = blk * BLOCK + tl.arange(0, BLOCK)
    cols = tl.arange(0, D)
    x = tl.load(X + bh * stride_xbh + rows[:, None] * D + cols[None, :], mask=rows[:, None] < L,
                other=0.0).to(tl.float32)
    amax = tl.max(tl.max(tl.abs(x), axis=1), axis=0)
    scale = tl.where(amax > 0, amax / 448.0, 1.0)
    y = _e4m3(x / scale, INTERPRET)
    tl.store(Y + bh * stride_ybh + rows[:, None] * stride_ys + cols[None, :] * stride_yd, y, mask=rows[:, None] < L)
    tl.store(S + bh * tl.num_programs(1) + blk, scale)


@triton.jit
def _attn_fp8_fwd(Q, K, VT, QS, KS, VS, Out, sm_scale, Sq, Sk, SK_PAD, NQB, NKB, SQ_BUCKET, SK_BUCKET,
                  D: tl.constexpr, CAUSAL: tl.constexpr, SCALE_BLOCK: tl.constexpr, P_SCALE: tl.constexpr,
                  INTERPRET: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr):
    """O for BLOCK_M queries of one head; BLOCK_N equals SCALE_BLOCK (one key scale per tile). Causal is
    bottom-right aligned (query i sees keys j <= i + Sk - Sq); a query that sees no key outputs zeros."""
    pid_m, bh = tl.program_id(0), tl.program_id(1).to(tl.int64)
    rm = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    rn0 = tl.arange(0, BLOCK_N)
    rd = tl.arange(0, D)
    q = tl.load(Q + bh * Sq * D + rm[:, None] * D + rd[None, :], mask=rm[:, None] < Sq, other=0.0)
    q_scale = tl.load(QS + bh * NQB + rm // SCALE_BLOCK, mask=rm < Sq, other=0.0)
    row_scale = q_scale * (sm_scale * 1.4426950408889634)  # base-2 exponent: exp(x) = exp2(x * log2(e))
    m_i = tl.full((BLOCK_M,), float("-inf"), tl.float32)
    l_i = tl.zeros((BLOCK_M,), tl.float32)
    acc = tl.zeros((BLOCK_M, D), tl.float32)
    end = Sk
    if CAUSAL:
        end = tl.minimum(Sk, (pid_m + 1) * BLOCK_M + Sk - Sq)
    for start in range(0, end, BLOCK_N):
        rn = start + rn0
        k = tl.load(K + bh * Sk * D + rn[:, None] * D + rd[None, :], mask=rn[:, None] < Sk, other=0.0)
        s = tl.dot(q, tl.trans(k)) * (row_scale[:, None] * tl.load(KS + bh * NKB + start // BLOCK_N))
        seen = rn[None, :] < Sk
        if CAUSAL:
            seen = seen & (rn[None, :] <= rm[:, None] + Sk - Sq)
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=1))
        m_safe = tl.where(m_new == float("-inf"), 0.0, m_new)  # rows that have seen nothing yet
        alpha = tl.exp2(m_i - m_safe)
        p = tl.exp2(s - m_safe[:, None])
        l_i = l_i * alpha + tl.sum(p, axis=1)
        vt = tl.load(VT + bh * D * SK_PAD + rd[:, None] * SK_PAD + rn[None, :], mask=rn[None, :] < Sk, other=0.0)
        pv = tl.dot(_e4m3(p * P_SCALE, INTERPRET), tl.trans(vt))
        acc = acc * alpha[:, None] + pv * (tl.load(VS + bh * NKB + start // BLOCK_N) / P_SCALE)
        m_i = m_new
    out = acc / tl.where(l_i > 0, l_i, 1.0)[:, None]
    tl.store(Out + bh * Sq * D + rm[:, None] * D + rd[None, :], out.to(Out.dtype.element_ty), mask=rm[:, None] < Sq)


def _configs() -> list[triton.Config]:
    return [triton.Config({"BLOCK_M": bm}, num_warps=w, num_stages=s) for bm in (64, 128) for w in (4, 8)
            for s in (2, 3, 4)]


_FWD = triton.autotune(_configs(), key=["SQ_BUCKET", "SK_BUCKET", "D", "CAUSAL"], do_bench=bench_candidate)(
    _attn_fp8_fwd)
#: Under the interpreter: one tile size, 64 queries.
_INTERPRET = {"BLOCK_M": 64}


def quantize_blocks(x: torch.Tensor, transposed: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """(e4m3 tensor, float32 scales (B*H, blocks)) of x (B, H, S, D): one scale per head and block of
    ``SCALE_BLOCK`` tokens. ``transposed``: the values as (B*H, D, S rounded up to a block), token-minor."""
    b, h, s, d = x.shape
    x = x.contiguous()
    blocks = triton.cdiv(s, SCALE_BLOCK)
    scales = torch.empty((b * h, blocks), device=x.device, dtype=torch.float32)
    if transposed:
        pad = blocks * SCALE_BLOCK
        y = torch.zeros((b * h, d, pad), device=x.device, dtype=FP8)
        strides = (d * pad, 1, pad)
    else:
        y = torch.empty((b * h, s, d), device=x.device, dtype=FP8)
        strides = (s * d, d, 1)
    if s and b * h:
        _quantize_kernel[(b * h, blocks)](x, y, scales, s, s * d, *strides, D=d, BLOCK=SCALE_BLOCK,
                                          INTERPRET=interpreting(), num_warps=4)
    return y, scales


def _check(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> None:
    check_qkv("flash_attention_fp8", q, k, v, SUPPORTED_HEAD_DIMS)
    if q.dtype not in (torch.float16, torch.bfloat16):
        raise ValueError(f"flash_attention_fp8 takes fp16 or bf16 inputs (it rounds them to e4m3), got {q.dtype}")
    if causal and q.shape[2] > k.shape[2]:
        raise ValueError(f"causal needs Sq <= Sk (queries aligned to the last keys), got Sq={q.shape[2]}, "
                         f"Sk={k.shape[2]}")


def flash_attention_fp8(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                        sm_scale: float | None = None) -> torch.Tensor:
    """``softmax(q k^T * sm_scale [+ causal mask]) v`` with both matmuls in FP8 (e4m3), forward only.

    q (B, H, Sq, D), k and v (B, H, Sk, D) in fp16 or bf16, D in ``SUPPORTED_HEAD_DIMS``; the output is
    (B, H, Sq, D) in the inputs' dtype. The quantization of q, k and v is part of the call.
    """
    _check(q, k, v, causal)
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    if not scale > 0:
        raise ValueError(f"sm_scale must be positive, got {sm_scale}")
    b, h, sq, d = q.shape
    sk = k.shape[2]
    out = torch.empty_like(q)
    if sq == 0 or b * h == 0:
        return out
    q8, qs = quantize_blocks(q)
    k8, ks = quantize_blocks(k)
    vt8, vs = quantize_blocks(v, transposed=True)
    args = (q8, k8, vt8, qs, ks, vs, out, scale, sq, sk, vt8.shape[2], qs.shape[1], ks.shape[1],
            triton.next_power_of_2(sq), triton.next_power_of_2(sk))
    consts = {"D": d, "CAUSAL": bool(causal), "SCALE_BLOCK": SCALE_BLOCK, "P_SCALE": P_SCALE, "BLOCK_N": SCALE_BLOCK,
              "INTERPRET": interpreting()}
    if interpreting():
        _attn_fp8_fwd[(triton.cdiv(sq, _INTERPRET["BLOCK_M"]), b * h)](*args, **consts, **_INTERPRET)
    else:
        _FWD[lambda meta: (triton.cdiv(sq, meta["BLOCK_M"]), b * h)](*args, **consts)
    return out


def precompile(sq: int, sk: int, head_dim: int, dtype: torch.dtype, causal: bool,
               shard: tuple[int, int] = (0, 1)) -> None:
    """Compile, without launching the attention, this shard's part of the autotuning candidates for one
    shape (candidate ``i`` goes to shard ``i % count``; quantizing zeros for their arguments builds the
    quantizing kernel too), so that a run's processes build them side by side rather than the first call
    one by one."""
    if interpreting():
        return
    q = torch.zeros((1, 1, sq, head_dim), device="cuda", dtype=dtype)
    k = torch.zeros((1, 1, sk, head_dim), device="cuda", dtype=dtype)
    q8, qs = quantize_blocks(q)
    k8, ks = quantize_blocks(k)
    vt8, vs = quantize_blocks(k, transposed=True)
    # the integer arguments as the call passes them: Triton specializes on their divisibility by 16
    args = (q8, k8, vt8, qs, ks, vs, torch.empty_like(q), 0.125, sq, sk, vt8.shape[2], qs.shape[1], ks.shape[1],
            triton.next_power_of_2(sq), triton.next_power_of_2(sk))
    consts = {"D": head_dim, "CAUSAL": bool(causal), "SCALE_BLOCK": SCALE_BLOCK, "P_SCALE": P_SCALE,
              "BLOCK_N": SCALE_BLOCK, "INTERPRET": False}
    index, count = shard
    for cfg in _FWD.configs[index::count]:
        _FWD.fn.warmup(*args, grid=(1,), **consts, **cfg.all_kwargs())
