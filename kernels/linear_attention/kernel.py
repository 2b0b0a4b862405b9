"""Chunked linear attention in Triton: forward and backward, causal and not, one kernel set for every
feature map (it takes the features phi(q), phi(k), not q and k).

Layout: ``fq`` (B, H, Sq, F), ``fk`` (B, H, Sk, F), ``v`` (B, H, Sk, D), optional float32 ``key_log_scale``
(B, H, Sk) (Performer's per-key maxima, ``features.py``). The function computed is
``reference.linear_attention_reference``: ``out_i = sum_j A_ij v_j / (sum_j A_ij + eps)`` with
``A_ij = (fq_i . fk_j) exp(l_j - r_i)``, ``j <= i`` when causal, where ``r_i`` is the running maximum of the
log-scales (``reference.reference_points``) so that every weight is <= 1.

Causal, chunks of C tokens (the "chunkwise parallel" form of linear attention):

* ``_kv_states`` walks the chunks of one (batch, head) in order and stores the state *before* each chunk,
  ``S_c = sum_{j < cC} exp(l_j - R_c) fk_j^T v_j`` (F x D) and ``z_c`` (F), in float32, with ``R_c`` the
  log-scale reference at the chunk's start (rescaled by ``exp(R_old - R_new) <= 1`` as it grows). Programs
  split F and D in blocks, so the state a program carries is BF x BD.
* ``_fwd_out`` runs every chunk in parallel: the inter-chunk part ``exp(R_c - r_i) (fq_i S_c, fq_i . z_c)``
  plus the intra-chunk part as a masked (C x C) product, then the division. It saves ``den + eps``.
* Backward, with ``dn_i = dO_i / den_i`` and ``dd_i = -(dO_i . O_i) / den_i`` (so that the gradient of
  ``A_ij`` is ``dn_i . v_j + dd_i``): ``_q_states`` walks the chunks in reverse and stores
  ``dS_c = sum_{i in later chunks} exp(R'_c - r_i) fq_i^T dn_i`` and ``dz_c``; ``_grads_qk`` gives d(fq)
  from the forward states (recomputed, not stored) and d(fk) from the reverse ones, ``_grads_v`` gives dV;
  each adds its masked (C x C) intra-chunk part. The backward is the exact derivative of the forward, as the
  reference's autograd computes it (the log-scales are constants: ``features.py`` says why).

Non-causal is the plain ``phi(Q) (phi(K)^T V)`` form: ``_kv_states`` sums all keys into one state,
``_fwd_out`` reads it out; any Sq, Sk (a decode step is one query over the cached keys).

Precision: states, normalizers and every accumulation are float32. Dots of two input tiles
(``fq fk^T``, ``fk^T v`` without re-weighting) run in the input dtype with float32 accumulation (tensor
cores for fp16/bf16); dots with a float32 operand (a state, a re-weighted tile, dO / den) run in float32
(TF32 on a GPU for fp16/bf16 inputs, IEEE for fp32 inputs). Under the Triton interpreter every dot is
float32 and a fixed small tiling is used (``interpreting()``).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from microscope_kernels.fp32_dot import mma as _mma
from microscope_kernels.fp32_dot import round_to as _round
from microscope_kernels.input_checks import FLOAT_DTYPES

from microscope.api import interpreting

from .reference import EPS, reference_points

__all__ = ["SUPPORTED_CHUNKS", "SUPPORTED_DIMS", "LinearAttentionFn", "linear_attention", "tiles_for"]

#: Feature dims F and head dims D the kernels are built for (tl.dot needs >= 16; powers of two for tiles).
SUPPORTED_DIMS = (16, 32, 64, 128, 256)
#: Chunk lengths C (the intra-chunk product is a C x C tile).
SUPPORTED_CHUNKS = (16, 32, 64, 128)
# Lengths only bound loops and masks: specializing on them would recompile for every sequence length.
_NO_SPECIALIZE = ["Sq", "Sk", "NC"]


# ----------------------------------------------------------------------------------------------------------
# Device helpers
# ----------------------------------------------------------------------------------------------------------


@triton.jit
def _tile(base, rows, n_rows, cols, WIDTH: tl.constexpr):
    """Rows ``rows`` (zeros past ``n_rows``), columns ``cols`` of a row-major (n_rows, WIDTH) matrix."""
    return tl.load(base + rows[:, None] * WIDTH + cols[None, :], mask=rows[:, None] < n_rows, other=0.0)


@triton.jit
def _put(base, rows, n_rows, cols, value, WIDTH: tl.constexpr):
    tl.store(base + rows[:, None] * WIDTH + cols[None, :], value, mask=rows[:, None] < n_rows)


@triton.jit
def _state_tile(base, idx, offs_f, offs_d, F: tl.constexpr, D: tl.constexpr):
    """The (BF, BD) block of state ``idx`` of a (n, F, D) float32 buffer."""
    return tl.load(base + idx * F * D + offs_f[:, None] * D + offs_d[None, :])


@triton.jit
def _first_only(pid, n):
    """``n`` for program 0 of an axis, 0 for the others: a store bound that lets one program write a value
    every program of the axis computes."""
    return tl.where(pid == 0, n, 0)


@triton.jit
def _row_ref(R, b, Sq, idx):
    """The log-scale reference ``r`` of row ``idx`` of head ``b``."""
    return tl.load(R + b * Sq + idx)


@triton.jit
def _intra_weights(l_cols, r_rows, seen):
    """``exp(l_j - r_i)`` where ``seen``, else 0 (never inf - inf: ``r`` is +inf only on padding rows)."""
    return tl.exp(tl.where(seen, l_cols[None, :] - r_rows[:, None], float("-inf")))


# ----------------------------------------------------------------------------------------------------------
# Forward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _kv_states(FK, V, L, R, S_OUT, Z_OUT, Sq, Sk, NC, F: tl.constexpr, D: tl.constexpr, C: tl.constexpr,
               BF: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, HAS_SCALE: tl.constexpr,
               INTERPRET: tl.constexpr):
    """Causal: the (BF, BD) block of the state before each of the NC chunks. Non-causal: of all keys."""
    DTYPE: tl.constexpr = FK.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_d = tl.program_id(0)
    pid_f = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_f = pid_f * BF + tl.arange(0, BF)
    offs_d = pid_d * BD + tl.arange(0, BD)
    offs_c = tl.arange(0, C)
    fk_base = FK + b * Sk * F
    v_base = V + b * Sk * D
    state = tl.zeros([BF, BD], tl.float32)
    z = tl.zeros([BF], tl.float32)
    ref = 0.0
    if HAS_SCALE:
        ref = _row_ref(R, b, Sq, 0)  # non-causal: the maximum over all keys; causal: r_0
    for c in range(0, NC):
        if CAUSAL:
            idx = b * NC + c
            tl.store(S_OUT + idx * F * D + offs_f[:, None] * D + offs_d[None, :], state)
            tl.store(Z_OUT + idx * F + offs_f, z, mask=offs_f < _first_only(pid_d, F))
        rows = c * C + offs_c
        fk = _tile(fk_base, rows, Sk, offs_f, F)
        v = _tile(v_base, rows, Sk, offs_d, D)
        if HAS_SCALE:
            l_rows = tl.load(L + b * Sk + rows, mask=rows < Sk, other=float("-inf"))
            if CAUSAL:
                new_ref = _row_ref(R, b, Sq, tl.minimum(c * C + C, Sk) - 1)
                shrink = tl.exp(ref - new_ref)
                state = state * shrink
                z = z * shrink
                ref = new_ref
            fkw = fk.to(tl.float32) * tl.exp(l_rows - ref)[:, None]
            state = _mma(tl.trans(fkw), v.to(tl.float32), state, INTERPRET, IEEE)
            z += tl.sum(fkw, 0)
        else:
            state = _mma(tl.trans(fk), v, state, INTERPRET, IEEE)
            z += tl.sum(fk.to(tl.float32), 0)
    if not CAUSAL:
        tl.store(S_OUT + b * F * D + offs_f[:, None] * D + offs_d[None, :], state)
        tl.store(Z_OUT + b * F + offs_f, z, mask=offs_f < _first_only(pid_d, F))


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _fwd_out(FQ, FK, V, L, R, S_IN, Z_IN, OUT, DEN, Sq, Sk, NC, eps, F: tl.constexpr, D: tl.constexpr,
             C: tl.constexpr, BF: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, HAS_SCALE: tl.constexpr,
             INTERPRET: tl.constexpr):
    """Output block (C rows, BD columns) of one chunk; the D-block 0 program also saves ``den + eps``."""
    DTYPE: tl.constexpr = FQ.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_c = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_c = tl.arange(0, C)
    offs_d = pid_d * BD + tl.arange(0, BD)
    rows = pid_c * C + offs_c
    q_base = FQ + b * Sq * F
    k_base = FK + b * Sk * F
    if CAUSAL:
        sidx = b * NC + pid_c
    else:
        sidx = b
    acc = tl.zeros([C, BD], tl.float32)
    den = tl.zeros([C], tl.float32)
    scores = tl.zeros([C, C], tl.float32)
    for f0 in range(0, F, BF):
        offs_f = f0 + tl.arange(0, BF)
        fq = _tile(q_base, rows, Sq, offs_f, F)
        acc = _mma(fq.to(tl.float32), _state_tile(S_IN, sidx, offs_f, offs_d, F, D), acc, INTERPRET, IEEE)
        den += tl.sum(fq.to(tl.float32) * tl.load(Z_IN + sidx * F + offs_f)[None, :], 1)
        if CAUSAL:
            scores = _mma(fq, tl.trans(_tile(k_base, rows, Sk, offs_f, F)), scores, INTERPRET, IEEE)
    if CAUSAL:
        seen = (offs_c[None, :] <= offs_c[:, None]) & (rows[None, :] < Sk)
        if HAS_SCALE:
            r_rows = tl.load(R + b * Sq + rows, mask=rows < Sq, other=float("inf"))
            l_cols = tl.load(L + b * Sk + rows, mask=rows < Sk, other=float("-inf"))
            alpha = tl.exp(_row_ref(R, b, Sq, tl.maximum(pid_c * C - 1, 0)) - r_rows)
            acc = acc * alpha[:, None]
            den = den * alpha
            a = scores * _intra_weights(l_cols, r_rows, seen)
        else:
            a = tl.where(seen, scores, 0.0)
        v = _tile(V + b * Sk * D, rows, Sk, offs_d, D)
        acc = _mma(a, v.to(tl.float32), acc, INTERPRET, IEEE)
        den += tl.sum(a, 1)
    den = den + eps
    _put(OUT + b * Sq * D, rows, Sq, offs_d, _round(acc / den[:, None], DTYPE, INTERPRET), D)
    tl.store(DEN + b * Sq + rows, den, mask=rows < _first_only(pid_d, Sq))


# ----------------------------------------------------------------------------------------------------------
# Backward
# ----------------------------------------------------------------------------------------------------------


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _q_states(FQ, DO, INV_DEN, DD, R, DS_OUT, DZ_OUT, Sq, NC, F: tl.constexpr, D: tl.constexpr,
              C: tl.constexpr, BF: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, HAS_SCALE: tl.constexpr,
              INTERPRET: tl.constexpr):
    """Causal: the (BF, BD) block of ``dS`` (and ``dz``) over the rows *after* each chunk, walking back.
    Non-causal: over all rows."""
    DTYPE: tl.constexpr = FQ.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_d = tl.program_id(0)
    pid_f = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_f = pid_f * BF + tl.arange(0, BF)
    offs_d = pid_d * BD + tl.arange(0, BD)
    offs_c = tl.arange(0, C)
    dstate = tl.zeros([BF, BD], tl.float32)
    dz = tl.zeros([BF], tl.float32)
    ref = 0.0
    if HAS_SCALE:
        ref = _row_ref(R, b, Sq, Sq - 1)
    for t in range(0, NC):
        if CAUSAL:
            c = NC - 1 - t
            idx = b * NC + c
            tl.store(DS_OUT + idx * F * D + offs_f[:, None] * D + offs_d[None, :], dstate)
            tl.store(DZ_OUT + idx * F + offs_f, dz, mask=offs_f < _first_only(pid_d, F))
        else:
            c = t
        rows = c * C + offs_c
        fq = _tile(FQ + b * Sq * F, rows, Sq, offs_f, F).to(tl.float32)
        inv = tl.load(INV_DEN + b * Sq + rows, mask=rows < Sq, other=0.0)
        dd = tl.load(DD + b * Sq + rows, mask=rows < Sq, other=0.0)
        dn = _tile(DO + b * Sq * D, rows, Sq, offs_d, D).to(tl.float32) * inv[:, None]
        if HAS_SCALE and CAUSAL:
            new_ref = _row_ref(R, b, Sq, tl.maximum(c * C - 1, 0))
            shrink = tl.exp(new_ref - ref)
            dstate = dstate * shrink
            dz = dz * shrink
            ref = new_ref
            r_rows = tl.load(R + b * Sq + rows, mask=rows < Sq, other=float("inf"))
            fq = fq * tl.exp(ref - r_rows)[:, None]
        dstate = _mma(tl.trans(fq), dn, dstate, INTERPRET, IEEE)
        dz += tl.sum(fq * dd[:, None], 0)
    if not CAUSAL:
        tl.store(DS_OUT + b * F * D + offs_f[:, None] * D + offs_d[None, :], dstate)
        tl.store(DZ_OUT + b * F + offs_f, dz, mask=offs_f < _first_only(pid_d, F))


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _grads_qk(FQ, FK, V, DO, INV_DEN, DD, L, R, S_IN, Z_IN, DS_IN, DZ_IN, DFQ, DFK, Sq, Sk, NC,
              F: tl.constexpr, D: tl.constexpr, C: tl.constexpr, BF: tl.constexpr, BD: tl.constexpr,
              CAUSAL: tl.constexpr, HAS_SCALE: tl.constexpr, INTERPRET: tl.constexpr):
    """d(fq) of query chunk ``c`` and d(fk) of key chunk ``c``, feature block ``pid_f``."""
    DTYPE: tl.constexpr = FQ.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_c = tl.program_id(0)
    pid_f = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_c = tl.arange(0, C)
    offs_f = pid_f * BF + tl.arange(0, BF)
    rows = pid_c * C + offs_c
    if CAUSAL:
        sidx = b * NC + pid_c
    else:
        sidx = b
    inv = tl.load(INV_DEN + b * Sq + rows, mask=rows < Sq, other=0.0)
    dd = tl.load(DD + b * Sq + rows, mask=rows < Sq, other=0.0)
    dq = tl.zeros([C, BF], tl.float32)
    dk = tl.zeros([C, BF], tl.float32)
    gdot = tl.zeros([C, C], tl.float32)
    for d0 in range(0, D, BD):
        offs_d = d0 + tl.arange(0, BD)
        dn = _tile(DO + b * Sq * D, rows, Sq, offs_d, D).to(tl.float32) * inv[:, None]
        v = _tile(V + b * Sk * D, rows, Sk, offs_d, D).to(tl.float32)
        dq = _mma(dn, tl.trans(_state_tile(S_IN, sidx, offs_f, offs_d, F, D)), dq, INTERPRET, IEEE)
        dk = _mma(v, tl.trans(_state_tile(DS_IN, sidx, offs_f, offs_d, F, D)), dk, INTERPRET, IEEE)
        if CAUSAL:
            gdot = _mma(dn, tl.trans(v), gdot, INTERPRET, IEEE)
    dq += dd[:, None] * tl.load(Z_IN + sidx * F + offs_f)[None, :]
    dk += tl.load(DZ_IN + sidx * F + offs_f)[None, :]
    if HAS_SCALE:
        l_rows = tl.load(L + b * Sk + rows, mask=rows < Sk, other=float("-inf"))
        if CAUSAL:
            r_rows = tl.load(R + b * Sq + rows, mask=rows < Sq, other=float("inf"))
            dq = dq * tl.exp(_row_ref(R, b, Sq, tl.maximum(pid_c * C - 1, 0)) - r_rows)[:, None]
            dk = dk * tl.exp(l_rows - _row_ref(R, b, Sq, tl.minimum(pid_c * C + C, Sq) - 1))[:, None]
        else:
            dk = dk * tl.exp(l_rows - _row_ref(R, b, Sq, 0))[:, None]
    if CAUSAL:
        seen = (offs_c[None, :] <= offs_c[:, None]) & (rows[None, :] < Sk)
        g = gdot + dd[:, None]
        if HAS_SCALE:
            g = g * _intra_weights(l_rows, r_rows, seen)
        else:
            g = tl.where(seen, g, 0.0)
        fq = _tile(FQ + b * Sq * F, rows, Sq, offs_f, F).to(tl.float32)
        fk = _tile(FK + b * Sk * F, rows, Sk, offs_f, F).to(tl.float32)
        dq = _mma(g, fk, dq, INTERPRET, IEEE)
        dk = _mma(tl.trans(g), fq, dk, INTERPRET, IEEE)
    _put(DFQ + b * Sq * F, rows, Sq, offs_f, _round(dq, DTYPE, INTERPRET), F)
    _put(DFK + b * Sk * F, rows, Sk, offs_f, _round(dk, DTYPE, INTERPRET), F)


@triton.jit(do_not_specialize=_NO_SPECIALIZE)
def _grads_v(FQ, FK, DO, INV_DEN, L, R, DS_IN, DV, Sq, Sk, NC, F: tl.constexpr, D: tl.constexpr,
             C: tl.constexpr, BF: tl.constexpr, BD: tl.constexpr, CAUSAL: tl.constexpr, HAS_SCALE: tl.constexpr,
             INTERPRET: tl.constexpr):
    """dV of key chunk ``c``, value block ``pid_d``."""
    DTYPE: tl.constexpr = FK.dtype.element_ty
    IEEE: tl.constexpr = DTYPE == tl.float32
    pid_c = tl.program_id(0)
    pid_d = tl.program_id(1)
    b = tl.program_id(2).to(tl.int64)
    offs_c = tl.arange(0, C)
    offs_d = pid_d * BD + tl.arange(0, BD)
    rows = pid_c * C + offs_c
    if CAUSAL:
        sidx = b * NC + pid_c
    else:
        sidx = b
    dv = tl.zeros([C, BD], tl.float32)
    p = tl.zeros([C, C], tl.float32)
    for f0 in range(0, F, BF):
        offs_f = f0 + tl.arange(0, BF)
        fk = _tile(FK + b * Sk * F, rows, Sk, offs_f, F)
        dv = _mma(fk.to(tl.float32), _state_tile(DS_IN, sidx, offs_f, offs_d, F, D), dv, INTERPRET, IEEE)
        if CAUSAL:
            p = _mma(_tile(FQ + b * Sq * F, rows, Sq, offs_f, F), tl.trans(fk), p, INTERPRET, IEEE)
    if HAS_SCALE:
        l_rows = tl.load(L + b * Sk + rows, mask=rows < Sk, other=float("-inf"))
        if CAUSAL:
            dv = dv * tl.exp(l_rows - _row_ref(R, b, Sq, tl.minimum(pid_c * C + C, Sq) - 1))[:, None]
        else:
            dv = dv * tl.exp(l_rows - _row_ref(R, b, Sq, 0))[:, None]
    if CAUSAL:
        seen = (offs_c[None, :] <= offs_c[:, None]) & (rows[None, :] < Sk)
        if HAS_SCALE:
            r_rows = tl.load(R + b * Sq + rows, mask=rows < Sq, other=float("inf"))
            p = p * _intra_weights(l_rows, r_rows, seen)
        else:
            p = tl.where(seen, p, 0.0)
        inv = tl.load(INV_DEN + b * Sq + rows, mask=rows < Sq, other=0.0)
        dn = _tile(DO + b * Sq * D, rows, Sq, offs_d, D).to(tl.float32) * inv[:, None]
        dv = _mma(tl.trans(p), dn, dv, INTERPRET, IEEE)
    _put(DV + b * Sk * D, rows, Sk, offs_d, _round(dv, DTYPE, INTERPRET), D)


# ----------------------------------------------------------------------------------------------------------
# Launch
# ----------------------------------------------------------------------------------------------------------

#: Under the interpreter: 64-wide feature and value blocks (a quarter of the 32-wide blocks' interpreted time;
#: F = 128, cosFormer's features at D = 64, still loops over two; the tests also run narrower blocks, with
#: scan blocks unlike the chunk kernels' as on a GPU).
_INTERPRET_BLOCK = 64
_INTERPRET_SCAN_BLOCK = 64
#: On a GPU the chunk kernels (parallel over chunks) take 64-wide blocks; the two state scans, sequential over
#: the chunks of a head, take 32-wide ones, so that B*H*(F/32)*(D/32) programs share the scan.
_GPU_BLOCK = 64
_GPU_SCAN_BLOCK = 32


def tiles_for(features: int, head_dim: int, scan: bool = False) -> tuple[int, int]:
    """(BF, BD): the feature and value block of a program (a scan's state block is BF x BD float32)."""
    if interpreting():
        block = _INTERPRET_SCAN_BLOCK if scan else _INTERPRET_BLOCK
    else:
        block = _GPU_SCAN_BLOCK if scan else _GPU_BLOCK
    return min(features, block), min(head_dim, block)


def _meta(shape: tuple[int, int, int, bool, bool], scan: bool = False) -> dict:
    """Compile-time arguments of a launch; ``shape`` is (F, D, C, causal, has_scale)."""
    features, head_dim, chunk, causal, has_scale = shape
    bf, bd = tiles_for(features, head_dim, scan)
    meta = {"F": features, "D": head_dim, "C": chunk, "BF": bf, "BD": bd, "CAUSAL": causal,
            "HAS_SCALE": has_scale, "INTERPRET": interpreting()}
    if not interpreting():
        meta["num_warps"] = 8 if chunk >= 128 and not scan else 4
    return meta


def _states(fk: torch.Tensor, v: torch.Tensor, scale: torch.Tensor, r: torch.Tensor, sq: int,
            shape: tuple[int, int, int, bool, bool]) -> tuple[torch.Tensor, torch.Tensor]:
    """The forward states (per chunk when causal, one when not), float32."""
    meta = _meta(shape, scan=True)
    bh, sk = fk.shape[0] * fk.shape[1], fk.shape[2]
    n_chunks = triton.cdiv(sk, meta["C"])
    n_states = bh * (n_chunks if meta["CAUSAL"] else 1)
    s = torch.empty((n_states, meta["F"], meta["D"]), device=fk.device, dtype=torch.float32)
    z = torch.empty((n_states, meta["F"]), device=fk.device, dtype=torch.float32)
    grid = (meta["D"] // meta["BD"], meta["F"] // meta["BF"], bh)
    _kv_states[grid](fk, v, scale, r, s, z, sq, sk, n_chunks, **meta)
    return s, z


class LinearAttentionFn(torch.autograd.Function):
    """Autograd glue: the forward saves the output and ``den + eps``; the backward recomputes the states."""

    @staticmethod
    def forward(ctx, fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, scale: torch.Tensor | None,
                causal: bool, chunk: int, eps: float) -> torch.Tensor:
        batch, heads, sq, features = fq.shape
        sk, head_dim = fk.shape[2], v.shape[3]
        shape = (features, head_dim, chunk, causal, scale is not None)
        if scale is None:  # a stand-in the kernels never read (HAS_SCALE is a compile-time switch)
            scale = r = torch.zeros(1, device=fq.device, dtype=torch.float32)
        else:
            scale = scale.detach().float().contiguous()
            r = reference_points(scale, sq, causal).contiguous()
        o = torch.empty((batch, heads, sq, head_dim), device=fq.device, dtype=fq.dtype)
        den = torch.empty((batch * heads * sq,), device=fq.device, dtype=torch.float32)
        ctx.save_for_backward(fq, fk, v, scale, r, o, den)
        ctx.shape = shape
        if o.numel() == 0:
            return o
        s, z = _states(fk, v, scale, r, sq, shape)
        meta = _meta(shape)
        grid = (triton.cdiv(sq, chunk), head_dim // meta["BD"], batch * heads)
        _fwd_out[grid](fq, fk, v, scale, r, s, z, o, den, sq, sk, triton.cdiv(sk, chunk), eps, **meta)
        return o

    @staticmethod
    def backward(ctx, do: torch.Tensor):
        fq, fk, v, scale, r, o, den = ctx.saved_tensors
        shape = ctx.shape
        batch, heads, sq, features = fq.shape
        sk, head_dim, chunk = fk.shape[2], v.shape[3], shape[2]
        if o.numel() == 0:
            return torch.zeros_like(fq), torch.zeros_like(fk), torch.zeros_like(v), None, None, None, None
        do = do.contiguous()
        inv_den = 1.0 / den
        dd = -(do.float() * o.float()).sum(-1).reshape(-1) * inv_den  # dL/d(den) per row
        s, z = _states(fk, v, scale, r, sq, shape)
        n_q, n_k = triton.cdiv(sq, chunk), triton.cdiv(sk, chunk)
        ds, dz = torch.empty_like(s), torch.empty_like(z)
        scan = _meta(shape, scan=True)
        _q_states[(head_dim // scan["BD"], features // scan["BF"], batch * heads)](
            fq, do, inv_den, dd, r, ds, dz, sq, n_q, **scan)
        dfq, dfk, dv = torch.empty_like(fq), torch.empty_like(fk), torch.empty_like(v)
        meta = _meta(shape)
        _grads_qk[(max(n_q, n_k), features // meta["BF"], batch * heads)](
            fq, fk, v, do, inv_den, dd, scale, r, s, z, ds, dz, dfq, dfk, sq, sk, n_k, **meta)
        _grads_v[(n_k, head_dim // meta["BD"], batch * heads)](fq, fk, do, inv_den, scale, r, ds, dv, sq, sk, n_k,
                                                               **meta)
        return dfq, dfk, dv, None, None, None, None


def _check_inputs(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, scale: torch.Tensor | None, causal: bool,
                  chunk: int) -> None:
    if fq.dim() != 4 or fk.dim() != 4 or v.dim() != 4:
        raise ValueError(f"linear_attention expects (B, H, S, F|D) tensors, got fq{tuple(fq.shape)} "
                         f"fk{tuple(fk.shape)} v{tuple(v.shape)}")
    if fq.shape[:2] != fk.shape[:2] or fk.shape[:3] != v.shape[:3] or fq.shape[3] != fk.shape[3]:
        raise ValueError(f"fq (B, H, Sq, F), fk (B, H, Sk, F) and v (B, H, Sk, D) disagree: fq{tuple(fq.shape)} "
                         f"fk{tuple(fk.shape)} v{tuple(v.shape)}")
    if fq.shape[3] not in SUPPORTED_DIMS or v.shape[3] not in SUPPORTED_DIMS:
        raise ValueError(f"linear_attention supports feature and head dims {SUPPORTED_DIMS}, got F={fq.shape[3]}, "
                         f"D={v.shape[3]}")
    if not (fq.dtype == fk.dtype == v.dtype) or fq.dtype not in FLOAT_DTYPES:
        raise ValueError(f"linear_attention needs fq, fk, v of one dtype among fp32/fp16/bf16, got {fq.dtype}, "
                         f"{fk.dtype}, {v.dtype}")
    if not (fq.device == fk.device == v.device):
        raise ValueError(f"fq, fk, v are on different devices: {fq.device}, {fk.device}, {v.device}")
    if chunk not in SUPPORTED_CHUNKS:
        raise ValueError(f"chunk must be one of {SUPPORTED_CHUNKS}, got {chunk!r}")
    if fq.shape[2] < 1 or fk.shape[2] < 1:
        raise ValueError(f"need at least one query and one key, got Sq={fq.shape[2]}, Sk={fk.shape[2]}")
    if causal and fq.shape[2] != fk.shape[2]:
        raise ValueError(f"causal linear attention needs as many queries as keys, got Sq={fq.shape[2]}, "
                         f"Sk={fk.shape[2]}")
    if scale is not None and tuple(scale.shape) != tuple(fk.shape[:3]):
        raise ValueError(f"key_log_scale must be (B, H, Sk) = {tuple(fk.shape[:3])}, got {tuple(scale.shape)}")


def linear_attention(fq: torch.Tensor, fk: torch.Tensor, v: torch.Tensor, causal: bool = False,
                     key_log_scale: torch.Tensor | None = None, chunk: int = 64, eps: float = EPS) -> torch.Tensor:
    """``out_i = sum_j A_ij v_j / (sum_j A_ij + eps)``, ``A_ij = (fq_i . fk_j) exp(l_j - r_i)``, chunked.

    Args:
        fq: (B, H, Sq, F) query features; fk: (B, H, Sk, F) key features; v: (B, H, Sk, D). One dtype of
            fp32/fp16/bf16; F and D in ``SUPPORTED_DIMS``; non-contiguous inputs are copied.
        causal: key ``j`` only for queries ``i >= j``; needs ``Sq == Sk``.
        key_log_scale: (B, H, Sk) log-scale per key (Performer, ``features.performer_features``), or None
            (cosFormer). Treated as a constant: it gets no gradient.
        chunk: tokens per chunk C, in ``SUPPORTED_CHUNKS``; the intra-chunk product is C x C.
        eps: added to the normalizer.

    Returns:
        (B, H, Sq, D) in the input dtype; differentiable in fq, fk and v.
    """
    _check_inputs(fq, fk, v, key_log_scale, causal, chunk)
    return LinearAttentionFn.apply(fq.contiguous(), fk.contiguous(), v.contiguous(), key_log_scale, bool(causal),
                                   int(chunk), float(eps))
