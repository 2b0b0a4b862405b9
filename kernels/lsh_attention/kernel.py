"""LSH (hash-bucketed) attention in Triton: FlashAttention-2's online softmax over each query's interval of
bucket-sorted keys, forward and backward, every hash round in one launch.

The host side (``visibility.py``, ``plan.py``) hashes q and k, sorts both by (bucket, position) and gives
every query, per round, an interval of sorted keys; ``plan.py`` turns that into tile descriptors. The kernels
never copy q, k or v into sorted order: they gather rows through the permutations (``QPERM``, ``KPERM``) and
scatter results back to original positions, so outputs and gradients come back in the caller's order.

Forward (one program per query-tile descriptor, head and round): online softmax (base 2) over the keys
``[ka, kb)`` in steps of ``BLOCK_N``; a pair counts when the key's sorted index lies in the query's interval
(and, causal, the key's position is not after the query's). With ``n_hashes > 1`` a query's keys are the
union over rounds: each pair's score is lowered by ``log2(rounds that see it)``, so that the rounds' partial
softmaxes, merged by their log-sum-exps, weigh each key exactly once (Reformer's duplicate correction).
Each round writes its normalized output and LSE at the queries' positions; the merge is a few tensor ops.

Backward (FA2 with the merged LSE): ``delta = rowsum(dO * O)``; per round, one program per key tile
accumulates dK, dV over the sorted queries that see it, one per query tile accumulates dQ; P is recomputed
from the merged LSE, so each round's share of a pair is ``P / rounds`` and the rounds' gradients sum to the
exact one. Each round writes its own gradient buffer (a key appears once per round: no atomics); the buffers
are summed.

Dots go through ``microscope_kernels.fp32_dot.mma`` (exact for fp32, tensor cores for fp16/bf16, fp32 under
the interpreter, whose bf16 arithmetic is not IEEE-correct). Tiles: 64 x 64 for fp16/bf16, 32 x 32 for fp32,
16 x 16 under the interpreter (small sequences still span several tiles); 4 warps, 2 stages, not tuned.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from microscope_kernels.attention_inputs import check_qkv
from microscope_kernels.fp32_dot import mma as _mma

from microscope.api import interpreting

from .plan import Plan, build_plan
from .visibility import LSHSpec, key_intervals

__all__ = ["SUPPORTED_HEAD_DIMS", "LSHAttentionFn", "lsh_attention", "tiles_for"]

#: Head dims the kernels are built for.
SUPPORTED_HEAD_DIMS = (32, 64, 128)
_LOG2E = tl.constexpr(1.4426950408889634)
_NO_SPECIALIZE = ["BH", "Sq", "Sk", "OFF", "NT"]
#: Under the interpreter: small tiles, so the tests' short sequences cross tile edges.
_INTERPRET_TILES = (16, 16)


# ----------------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _round(x, DTYPE: tl.constexpr, INTERPRET: tl.constexpr):
    """Round fp32 ``x`` to ``DTYPE`` to nearest even (the interpreter truncates to bf16: round the bits)."""
    if INTERPRET and DTYPE == tl.bfloat16:
        bits = x.to(tl.uint32, bitcast=True)
        bits = bits + 0x7FFF + ((bits >> 16) & 1)
        x = ((bits >> 16) << 16).to(tl.float32, bitcast=True)
    return x.to(DTYPE)


@triton.jit
def _log2_rounds(KRANK, START, END, qpos, kpos, BH, bh, Sq, Sk, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                 N_HASHES: tl.constexpr):
    """log2 of the number of rounds whose interval holds each (query, key) pair (at least 1)."""
    count = tl.zeros([BLOCK_M, BLOCK_N], tl.float32)
    for r2 in tl.static_range(N_HASHES):
        row = (r2 * BH + bh).to(tl.int64)
        kr = tl.load(KRANK + row * Sk + kpos)
        st = tl.load(START + row * Sq + qpos)
        en = tl.load(END + row * Sq + qpos)
        count += ((kr[None, :] >= st[:, None]) & (kr[None, :] < en[:, None])).to(tl.float32)
    return tl.math.log2(tl.maximum(count, 1.0))


# Under the interpreter every call of a @triton.jit helper re-patches the language module (milliseconds
# each), so the loop bodies below inline their gathers and masks and call only the dot and rounding helpers.


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _lsh_fwd(Q, K, V, Out, LSE, QPERM, KPERM, KRANK, START, END, TILES, sm_scale, BH, Sq, Sk, OFF, NT,
             HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_HASHES: tl.constexpr,
             CAUSAL: tl.constexpr, INTERPRET: tl.constexpr):
    """One round's normalized O and base-2 LSE for the sorted queries of one tile descriptor."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1).to(tl.int64)
    rb = tl.program_id(2).to(tl.int64) * BH + bh
    tile = TILES + (rb * NT + tl.program_id(0)) * 4
    qa, qb, ka, kb = tl.load(tile), tl.load(tile + 1), tl.load(tile + 2), tl.load(tile + 3)
    cols = tl.arange(0, HEAD_DIM)
    iq = qa + tl.arange(0, BLOCK_M)
    qvalid = iq < qb
    qpos = tl.load(QPERM + rb * Sq + iq, mask=qvalid, other=0)
    st = tl.load(START + rb * Sq + qpos, mask=qvalid, other=0)
    en = tl.load(END + rb * Sq + qpos, mask=qvalid, other=0)  # st == en: a padding row sees nothing
    q = tl.load(Q + bh * Sq * HEAD_DIM + qpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :],
                mask=qvalid[:, None], other=0.0)
    k_base = K + bh * Sk * HEAD_DIM
    v_base = V + bh * Sk * HEAD_DIM
    qk_scale = sm_scale * _LOG2E
    m_i = tl.full([BLOCK_M], float("-inf"), tl.float32)
    l_i = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(ka, kb, BLOCK_N):
        kk = start_n + tl.arange(0, BLOCK_N)
        kvalid = kk < kb
        kpos = tl.load(KPERM + rb * Sk + kk, mask=kvalid, other=0)
        rows = kpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
        k = tl.load(k_base + rows, mask=kvalid[:, None], other=0.0)
        s = _mma(q, tl.trans(k), None, INTERPRET, IEEE) * qk_scale
        if N_HASHES > 1:
            s = s - _log2_rounds(KRANK, START, END, qpos, kpos, BH, bh, Sq, Sk, BLOCK_M, BLOCK_N, N_HASHES)
        seen = (kk[None, :] >= st[:, None]) & (kk[None, :] < en[:, None]) & kvalid[None, :]
        if CAUSAL:
            seen = seen & (kpos[None, :] <= (qpos + OFF)[:, None])
        s = tl.where(seen, s, float("-inf"))
        m_new = tl.maximum(m_i, tl.max(s, 1))
        m_use = tl.where(m_new == float("-inf"), 0.0, m_new)  # no key yet: shift by 0, exp2 gives 0
        alpha = tl.math.exp2(m_i - m_use)
        p = tl.math.exp2(s - m_use[:, None])
        l_i = l_i * alpha + tl.sum(p, 1)
        v = tl.load(v_base + rows, mask=kvalid[:, None], other=0.0)
        acc = _mma(_round(p, DTYPE, INTERPRET), v, acc * alpha[:, None], INTERPRET, IEEE)
        m_i = m_new
    empty = l_i == 0.0
    l_safe = tl.where(empty, 1.0, l_i)
    tl.store(LSE + rb * Sq + qpos, tl.where(empty, float("-inf"), m_i + tl.math.log2(l_safe)), mask=qvalid)
    out = _round(acc / l_safe[:, None], Out.dtype.element_ty, INTERPRET)
    tl.store(Out + rb * Sq * HEAD_DIM + qpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :], out,
             mask=qvalid[:, None])


# ----------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _lsh_bwd_dkdv(Q, K, V, DO, DK, DV, LSE, DELTA, QPERM, KPERM, KRANK, START, END, TILES, sm_scale, BH, Sq, Sk,
                  OFF, NT, HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                  N_HASHES: tl.constexpr, CAUSAL: tl.constexpr, INTERPRET: tl.constexpr):
    """One round's share of dK, dV for the sorted keys of one key tile, over the sorted queries that see it."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1).to(tl.int64)
    rb = tl.program_id(2).to(tl.int64) * BH + bh
    tile = TILES + (rb * NT + tl.program_id(0)) * 4
    ka, kb, qa, qb = tl.load(tile), tl.load(tile + 1), tl.load(tile + 2), tl.load(tile + 3)
    cols = tl.arange(0, HEAD_DIM)
    kk = ka + tl.arange(0, BLOCK_N)
    kvalid = kk < kb
    kpos = tl.load(KPERM + rb * Sk + kk, mask=kvalid, other=0)
    krows = kpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
    k = tl.load(K + bh * Sk * HEAD_DIM + krows, mask=kvalid[:, None], other=0.0)
    v = tl.load(V + bh * Sk * HEAD_DIM + krows, mask=kvalid[:, None], other=0.0)
    q_base = Q + bh * Sq * HEAD_DIM
    do_base = DO + bh * Sq * HEAD_DIM
    qk_scale = sm_scale * _LOG2E
    dk = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    dv = tl.zeros([BLOCK_N, HEAD_DIM], tl.float32)
    for start_m in range(qa, qb, BLOCK_M):
        iq = start_m + tl.arange(0, BLOCK_M)
        qvalid = iq < qb
        qpos = tl.load(QPERM + rb * Sq + iq, mask=qvalid, other=0)
        st = tl.load(START + rb * Sq + qpos, mask=qvalid, other=0)
        en = tl.load(END + rb * Sq + qpos, mask=qvalid, other=0)
        qrows = qpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
        q = tl.load(q_base + qrows, mask=qvalid[:, None], other=0.0)
        do = tl.load(do_base + qrows, mask=qvalid[:, None], other=0.0)
        lse = tl.load(LSE + bh * Sq + qpos, mask=qvalid, other=float("inf"))
        delta = tl.load(DELTA + bh * Sq + qpos, mask=qvalid, other=0.0)
        s = _mma(q, tl.trans(k), None, INTERPRET, IEEE) * qk_scale
        if N_HASHES > 1:
            s = s - _log2_rounds(KRANK, START, END, qpos, kpos, BH, bh, Sq, Sk, BLOCK_M, BLOCK_N, N_HASHES)
        seen = (kk[None, :] >= st[:, None]) & (kk[None, :] < en[:, None]) & kvalid[None, :]
        if CAUSAL:
            seen = seen & (kpos[None, :] <= (qpos + OFF)[:, None])
        p_t = tl.trans(tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0))
        dv = _mma(_round(p_t, DTYPE, INTERPRET), do, dv, INTERPRET, IEEE)
        dp_t = _mma(v, tl.trans(do), None, INTERPRET, IEEE)
        dk = _mma(_round(p_t * (dp_t - delta[None, :]), DTYPE, INTERPRET), q, dk, INTERPRET, IEEE)
    out_dtype: tl.constexpr = DK.dtype.element_ty
    out_rows = rb * Sk * HEAD_DIM + krows
    tl.store(DV + out_rows, _round(dv, out_dtype, INTERPRET), mask=kvalid[:, None])
    tl.store(DK + out_rows, _round(dk * sm_scale, out_dtype, INTERPRET), mask=kvalid[:, None])


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _lsh_bwd_dq(Q, K, V, DO, DQ, LSE, DELTA, QPERM, KPERM, KRANK, START, END, TILES, sm_scale, BH, Sq, Sk, OFF, NT,
                HEAD_DIM: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr, N_HASHES: tl.constexpr,
                CAUSAL: tl.constexpr, INTERPRET: tl.constexpr):
    """One round's share of dQ for the sorted queries of one query-tile descriptor."""
    DTYPE: tl.constexpr = Q.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    bh = tl.program_id(1).to(tl.int64)
    rb = tl.program_id(2).to(tl.int64) * BH + bh
    tile = TILES + (rb * NT + tl.program_id(0)) * 4
    qa, qb, ka, kb = tl.load(tile), tl.load(tile + 1), tl.load(tile + 2), tl.load(tile + 3)
    cols = tl.arange(0, HEAD_DIM)
    iq = qa + tl.arange(0, BLOCK_M)
    qvalid = iq < qb
    qpos = tl.load(QPERM + rb * Sq + iq, mask=qvalid, other=0)
    st = tl.load(START + rb * Sq + qpos, mask=qvalid, other=0)
    en = tl.load(END + rb * Sq + qpos, mask=qvalid, other=0)
    qrows = qpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
    q = tl.load(Q + bh * Sq * HEAD_DIM + qrows, mask=qvalid[:, None], other=0.0)
    do = tl.load(DO + bh * Sq * HEAD_DIM + qrows, mask=qvalid[:, None], other=0.0)
    lse = tl.load(LSE + bh * Sq + qpos, mask=qvalid, other=float("inf"))
    delta = tl.load(DELTA + bh * Sq + qpos, mask=qvalid, other=0.0)
    k_base = K + bh * Sk * HEAD_DIM
    v_base = V + bh * Sk * HEAD_DIM
    qk_scale = sm_scale * _LOG2E
    dq = tl.zeros([BLOCK_M, HEAD_DIM], tl.float32)
    for start_n in range(ka, kb, BLOCK_N):
        kk = start_n + tl.arange(0, BLOCK_N)
        kvalid = kk < kb
        kpos = tl.load(KPERM + rb * Sk + kk, mask=kvalid, other=0)
        rows = kpos[:, None].to(tl.int64) * HEAD_DIM + cols[None, :]
        k = tl.load(k_base + rows, mask=kvalid[:, None], other=0.0)
        v = tl.load(v_base + rows, mask=kvalid[:, None], other=0.0)
        s = _mma(q, tl.trans(k), None, INTERPRET, IEEE) * qk_scale
        if N_HASHES > 1:
            s = s - _log2_rounds(KRANK, START, END, qpos, kpos, BH, bh, Sq, Sk, BLOCK_M, BLOCK_N, N_HASHES)
        seen = (kk[None, :] >= st[:, None]) & (kk[None, :] < en[:, None]) & kvalid[None, :]
        if CAUSAL:
            seen = seen & (kpos[None, :] <= (qpos + OFF)[:, None])
        p = tl.where(seen, tl.math.exp2(s - lse[:, None]), 0.0)
        dp = _mma(do, tl.trans(v), None, INTERPRET, IEEE)
        dq = _mma(_round(p * (dp - delta[:, None]), DTYPE, INTERPRET), k, dq, INTERPRET, IEEE)
    tl.store(DQ + rb * Sq * HEAD_DIM + qrows, _round(dq * sm_scale, DQ.dtype.element_ty, INTERPRET),
             mask=qvalid[:, None])


# ----------------------------------------------------------------------------------------------------------
# Host side
# ----------------------------------------------------------------------------------------------------------


def tiles_for(dtype: torch.dtype) -> tuple[int, int]:
    """(BLOCK_M, BLOCK_N): 64 x 64 for fp16/bf16, 32 x 32 for fp32 (exact dots on CUDA cores spill least),
    ``_INTERPRET_TILES`` under the interpreter."""
    if interpreting():
        return _INTERPRET_TILES
    return (32, 32) if dtype == torch.float32 else (64, 64)


def _launch(kernel, grid: tuple[int, ...], *args, **meta) -> None:
    if interpreting():
        kernel[grid](*args, **meta)
    else:
        kernel[grid](*args, **meta, num_warps=4, num_stages=2)


def _merge_rounds(o_r: torch.Tensor, lse_r: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The rounds' normalized outputs and base-2 LSEs (R, BH, Sq, ...) merged into one softmax over the
    union; rows that saw nothing give O = 0 and LSE = +inf (so that the backward's P is 0 there)."""
    if o_r.shape[0] == 1:
        lse = lse_r[0]
        return o_r[0], torch.where(torch.isneginf(lse), torch.inf, lse)
    top = lse_r.amax(0)
    seen = torch.isfinite(top)
    top = torch.where(seen, top, 0.0)
    weights = torch.exp2(lse_r - top)  # 0 for rounds that saw nothing
    total = weights.sum(0)
    o = (weights.unsqueeze(-1) * o_r).sum(0) / torch.where(seen, total, 1.0).unsqueeze(-1)
    return o, torch.where(seen, top + torch.log2(torch.where(seen, total, 1.0)), torch.inf)


class LSHAttentionFn(torch.autograd.Function):
    """Autograd glue: the forward saves O, the merged LSE and the plan; the backward recomputes P."""

    @staticmethod
    def forward(ctx, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, plan: Plan, causal: bool,
                sm_scale: float, tiles: tuple[int, int]) -> torch.Tensor:
        batch, heads, sq, head_dim = q.shape
        sk = k.shape[2]
        rounds, bh = plan.n_hashes, batch * heads
        buf = q.dtype if rounds == 1 else torch.float32  # one round: the kernel's output is the answer
        o_r = torch.empty((rounds, bh, sq, head_dim), device=q.device, dtype=buf)
        lse_r = torch.empty((rounds, bh, sq), device=q.device, dtype=torch.float32)
        meta = {"HEAD_DIM": head_dim, "BLOCK_M": tiles[0], "BLOCK_N": tiles[1], "N_HASHES": rounds,
                "CAUSAL": bool(causal), "INTERPRET": interpreting()}
        nt = plan.q_tiles.shape[2]
        _launch(_lsh_fwd, (nt, bh, rounds), q, k, v, o_r, lse_r, plan.qperm, plan.kperm, plan.krank, plan.start,
                plan.end, plan.q_tiles, sm_scale, bh, sq, sk, sk - sq, nt, **meta)
        o, lse = _merge_rounds(o_r, lse_r)
        o = o.to(q.dtype).reshape(q.shape)
        ctx.save_for_backward(q, k, v, o, lse)
        ctx.plan, ctx.sm_scale, ctx.meta = plan, sm_scale, meta
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        q, k, v, o, lse = ctx.saved_tensors
        plan, sm_scale, meta = ctx.plan, ctx.sm_scale, ctx.meta
        batch, heads, sq, head_dim = q.shape
        sk = k.shape[2]
        rounds, bh = plan.n_hashes, batch * heads
        do = do.contiguous()
        delta = (do.float() * o.float()).sum(-1).reshape(bh, sq)
        buf = q.dtype if rounds == 1 else torch.float32
        dq = torch.empty((rounds, bh, sq, head_dim), device=q.device, dtype=buf)
        dk = torch.empty((rounds, bh, sk, head_dim), device=q.device, dtype=buf)  # key tiles cover every key
        dv = torch.empty_like(dk)
        args = (plan.qperm, plan.kperm, plan.krank, plan.start, plan.end)
        nk, nq = plan.k_tiles.shape[2], plan.q_tiles.shape[2]
        _launch(_lsh_bwd_dkdv, (nk, bh, rounds), q, k, v, do, dk, dv, lse, delta, *args, plan.k_tiles, sm_scale, bh,
                sq, sk, sk - sq, nk, **meta)
        _launch(_lsh_bwd_dq, (nq, bh, rounds), q, k, v, do, dq, lse, delta, *args, plan.q_tiles, sm_scale, bh, sq,
                sk, sk - sq, nq, **meta)
        grads = [g.sum(0).to(q.dtype).reshape(t.shape) for g, t in ((dq, q), (dk, k), (dv, v))]
        return (*grads, None, None, None, None)


def _check_inputs(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float) -> None:
    check_qkv("lsh_attention", q, k, v, SUPPORTED_HEAD_DIMS)
    if not 1 <= q.shape[2] <= k.shape[2]:
        raise ValueError(f"need 1 <= Sq <= Sk (queries aligned to the last keys), got Sq={q.shape[2]}, "
                         f"Sk={k.shape[2]}")
    if not sm_scale > 0:
        raise ValueError(f"sm_scale must be positive (it is folded into a running max), got {sm_scale}")


def lsh_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, rotations: torch.Tensor, n_buckets: int,
                  chunk: int, causal: bool = False, rule: str = "chunk", sm_scale: float | None = None) -> torch.Tensor:
    """Softmax attention over the keys LSH buckets put next to each query (``visibility.py`` defines which).

    Args:
        q: (B, H, Sq, D) queries; k, v: (B, H, Sk, D), ``Sq <= Sk`` (``Sq == Sk`` for the chunk rule).
            fp32, fp16 or bf16 (one dtype), D in ``SUPPORTED_HEAD_DIMS``; non-contiguous inputs are copied.
        rotations: (n_hashes, D, n_buckets // 2) random rotations (``hashing.draw_rotations``).
        n_buckets: buckets per round (1 or even).
        chunk: chunk length (``chunk`` rule) or keys per bucket window (``window`` rule).
        causal: also require key position <= query position (required by the window rule).
        rule: ``"chunk"`` (Reformer) or ``"window"`` (causal-safe).
        sm_scale: score scale, default ``1 / sqrt(D)``.

    Returns:
        (B, H, Sq, D) in the input dtype, zero for queries that see no key; differentiable in q, k and v.
    """
    scale = 1.0 / math.sqrt(q.shape[-1]) if sm_scale is None else float(sm_scale)
    _check_inputs(q, k, v, scale)
    spec = LSHSpec(n_buckets=n_buckets, chunk=chunk, causal=bool(causal), rule=rule)
    tiles = tiles_for(q.dtype)
    plan = build_plan(spec, key_intervals(spec, q, k, rotations), *tiles)
    return LSHAttentionFn.apply(q.contiguous(), k.contiguous(), v.contiguous(), plan, spec.causal, scale, tiles)
