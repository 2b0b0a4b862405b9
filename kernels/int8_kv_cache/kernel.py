"""Decode attention over an int8 KV cache: quantization, a split-K Triton kernel, memory accounting.

Why int8: decoding one token reads the whole K and V cache once per step, so decode time is cache
bytes / bandwidth. Symmetric int8 with one fp32 scale per token (or per channel) per head stores
D + 4 bytes per token per head instead of 2*D for bf16: 0.516x at D = 128.

Why a fused kernel: dequantizing the cache to bf16 first and then calling SDPA would read int8 and
write bf16 (more traffic than not quantizing at all). Here each program reads int8 K/V tiles and
dequantizes in registers, so HBM sees only the int8 bytes and the scales.

Why split-K (flash-decoding): one query token per (batch, head) gives B*H programs, too few to fill
132 SMs when B*H is small and each program would walk thousands of tokens in sequence. The token axis
is split into chunks of ``split_len`` tokens; each (split, batch*head) program writes an unnormalized
partial output with its running max and sum, and a second small kernel merges the splits.

Dequantization never uses the int -> float convert instruction (a quarter-rate pipe on Hopper, which
at ~1 GB of int8 per step would cost as much time as the memory traffic). Instead each int8 value is
sign-extended and added into the mantissa of 2^23 (float bits 0x4B000080 + q encode exactly
2^23 + 128 + q), and one float subtraction recovers q: integer and FP32 pipes only, exact. By
default K is not dequantized at all: the query is quantized to int8 and each K word's four products
are one exact ``dp4a`` (``int8_query.py``); only the per-token score is converted to float.
"""

from __future__ import annotations

import math

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.direct_launch import DirectLauncher, cdiv
from microscope_kernels.int8_kv_cache.descriptors import cache_descriptor, fit_descriptor_blocks, scale_descriptor
from microscope_kernels.int8_kv_cache.int8_query import int8_dot_words, quantize_query_tiles
from microscope_kernels.int8_kv_cache.split_io import load_query_tiles, store_partial
from microscope_kernels.int8_kv_cache.tensor_core import DOT_CONFIGS, MIN_DOT_HEAD_DIM, decode_split_int8_dot_kernel
from microscope_kernels.sm_count import sm_count
from microscope_kernels.split_merge import merged_output

from microscope.api import interpreting

GRANULARITIES = ("token", "channel")
#: Where the int8 split kernel multiplies: ``"fma"`` on CUDA cores (this module's kernel), ``"dot"`` on
#: tensor cores (``tensor_core.py``, head_dim >= 64).
PRODUCTS = ("fma", "dot")
#: The CUDA-core kernel's default score products: int8 dot products with the query quantized to int8
#: (``int8_query.py``), or fp32 products over the dequantized K (False).
INT8_QUERY = True
_LOG2E = math.log2(math.e)


# -- quantization (runs once when a token is appended, outside the decode step) ------------------
def quantize_kv(x: torch.Tensor, granularity: str, scale_dtype: torch.dtype = torch.float32
                ) -> tuple[torch.Tensor, torch.Tensor]:
    """Symmetric int8 quantization of a (B, H, T, D) cache tensor.

    ``granularity="token"``: one scale per (b, h, t), shape (B, H, T); ``"channel"``: one per
    (b, h, d) over all tokens, shape (B, H, D) (KIVI's choice for K, whose outliers live in fixed
    channels). scale = amax / 127, q = round(x / scale) clamped to [-127, 127], computed with the
    scale as stored (fp32 or fp16) so that |q * scale - x| <= scale / 2 holds for the stored scale.
    """
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    reduce_dim = -1 if granularity == "token" else -2
    amax = x.detach().abs().amax(dim=reduce_dim, keepdim=True).float()
    scale = (amax / 127.0).clamp_min(torch.finfo(torch.float32).tiny).to(scale_dtype)
    # a scale stored rounded down (fp16) would clamp the largest value at 127 short of amax, by more
    # than half a step: take the next representable scale up instead
    short = scale.double() * 127.0 < amax.double()
    scale = torch.where(short, torch.nextafter(scale, torch.full_like(scale, float("inf"))), scale)
    # float64 division: an fp32 x / scale can round a value that sits within ~1e-5 of a half step to
    # the wrong side; in float64 the bound holds to ~1e-16 (this runs once per token, not per step)
    q = torch.round(x.double() / scale.double()).clamp_(-127, 127).to(torch.int8)
    return q, scale.squeeze(reduce_dim)


def dequantize_kv(q: torch.Tensor, scale: torch.Tensor, granularity: str,
                  dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """q * scale broadcast along the quantized axis (reference and tests; the kernel never does this)."""
    expand = scale.unsqueeze(-1) if granularity == "token" else scale.unsqueeze(-2)
    compute = torch.promote_types(dtype, torch.float32)  # float64 stays exact
    return (q.to(compute) * expand.to(compute)).to(dtype)


def cache_bytes(batch: int, heads: int, tokens: int, head_dim: int, granularity: str | None,
                scale_dtype: torch.dtype = torch.float32, dtype: torch.dtype = torch.bfloat16) -> int:
    """Bytes of a K plus V cache: ``granularity=None`` is the unquantized cache in ``dtype``;
    otherwise int8 data plus the scales (per token: B*H*T each; per channel: B*H*D each)."""
    if granularity is None:
        return 2 * batch * heads * tokens * head_dim * torch.finfo(dtype).bits // 8
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be None or one of {GRANULARITIES}, got {granularity!r}")
    per_head_scales = tokens if granularity == "token" else head_dim
    scale_size = torch.finfo(scale_dtype).bits // 8
    return 2 * batch * heads * (tokens * head_dim + per_head_scales * scale_size)


# -- kernels -----------------------------------------------------------------------------------------
_MAGIC_BITS = tl.constexpr(0x4B000080)  # float bits of 2^23 + 128
_MAGIC = tl.constexpr(8388736.0)  # 2^23 + 128


@triton.jit
def _unpack_int8x4(words, PTX_DEQUANT: tl.constexpr):
    """int32 words holding four int8 each -> four fp32 tiles: byte j of every word, exactly.

    Each byte lands in the mantissa of 2^23 (float bits 0x4B000080 + q encode 2^23 + 128 + q) and
    one subtraction recovers q, so no int->float convert instruction (a quarter-rate pipe on Hopper)
    is issued. ``PTX_DEQUANT`` (GPU): 1 LOP3 + 4 PRMT per word build the bit patterns directly (xor
    0x80 turns q into the unsigned byte 128 + q; each PRMT assembles [byte, 0, 0, 0x4B]). Otherwise
    portable shifts, which is also what the CPU interpreter runs.
    """
    if PTX_DEQUANT:
        b0, b1, b2, b3 = tl.inline_asm_elementwise(
            asm="""{
            .reg .b32 t;
            xor.b32 t, $4, 0x80808080;
            prmt.b32 $0, t, 0x4B000000, 0x7440;
            prmt.b32 $1, t, 0x4B000000, 0x7441;
            prmt.b32 $2, t, 0x4B000000, 0x7442;
            prmt.b32 $3, t, 0x4B000000, 0x7443;
            }""",
            constraints="=r,=r,=r,=r,r", args=[words],
            dtype=(tl.int32, tl.int32, tl.int32, tl.int32), is_pure=True, pack=1)
    else:
        b0 = ((words << 24) >> 24) + _MAGIC_BITS  # arithmetic shifts sign-extend byte j
        b1 = ((words << 16) >> 24) + _MAGIC_BITS
        b2 = ((words << 8) >> 24) + _MAGIC_BITS
        b3 = (words >> 24) + _MAGIC_BITS
    return (b0.to(tl.float32, bitcast=True) - _MAGIC, b1.to(tl.float32, bitcast=True) - _MAGIC,
            b2.to(tl.float32, bitcast=True) - _MAGIC, b3.to(tl.float32, bitcast=True) - _MAGIC)


@triton.jit
def _decode_split_int8_kernel(
    Q, K_DESC, V_DESC, K_SCALE, KS_DESC, VS_DESC, PART_ACC, PART_ML,
    T, split_len, num_splits, qk_scale, stride_qbh, stride_ksbh, stride_vsbh,
    D: tl.constexpr, BLOCK_T: tl.constexpr, PER_TOKEN: tl.constexpr, PTX_DEQUANT: tl.constexpr,
    STAGES: tl.constexpr, INT8_QUERY: tl.constexpr,
):
    """One (split, batch*head) over the int8 cache: online softmax over ``split_len`` tokens.

    K and V are read as int32 words (four int8 each) through tensor descriptors over (batch*heads, T,
    D/4) with (1, BLOCK_T, D/4) blocks (``descriptors.py``); the compiler pipelines those loads
    through shared memory ``STAGES`` steps deep. A tile unpacks to four fp32 tiles holding channels
    4w + j; q and the output are split the same way, so nothing is ever re-interleaved. Scales are
    applied outside the D-wide products: a per-channel K scale is folded into q once, a per-token K
    scale multiplies the scores, a per-token V scale multiplies the weights, and a per-channel V
    scale is left to the merge kernel (it commutes with the sum over tokens). The accumulators are
    (BLOCK_T, D/4) tiles reduced over T once at the end, so the loop has no cross-warp reduction of
    D-wide vectors. ``INT8_QUERY``: q (with any per-channel K scale folded in) is quantized to int8
    once, and each K word's four products are one exact integer dot product (``int8_query.py``).
    """
    split = tl.program_id(0)
    head = tl.program_id(1)
    bh = head.to(tl.int64)
    w = tl.arange(0, D // 4)
    offs_t = tl.arange(0, BLOCK_T)
    q0, q1, q2, q3 = load_query_tiles(Q, K_SCALE, bh, stride_qbh, stride_ksbh, w, PER_TOKEN)
    if INT8_QUERY:
        i0, i1, i2, i3, q_word, q_step = quantize_query_tiles(q0, q1, q2, q3)
        score_scale = q_step * qk_scale
    else:
        q0, q1, q2, q3 = q0 * qk_scale, q1 * qk_scale, q2 * qk_scale, q3 * qk_scale  # sm_scale * log2(e)
    t_start = split * split_len
    t_end = tl.minimum(t_start + split_len, T)
    ks_start = head * stride_ksbh  # per-token scales: flat 1-D descriptors
    vs_start = head * stride_vsbh
    m_i = -float("inf")
    l_vec = tl.zeros((BLOCK_T,), tl.float32)
    acc0 = tl.zeros((BLOCK_T, D // 4), tl.float32)
    acc1 = tl.zeros((BLOCK_T, D // 4), tl.float32)
    acc2 = tl.zeros((BLOCK_T, D // 4), tl.float32)
    acc3 = tl.zeros((BLOCK_T, D // 4), tl.float32)
    for t0 in tl.range(t_start, t_end, BLOCK_T, num_stages=STAGES):
        ok = t0 + offs_t < t_end
        k_raw = K_DESC.load([head, t0, 0]).reshape(BLOCK_T, D // 4)
        v_raw = V_DESC.load([head, t0, 0]).reshape(BLOCK_T, D // 4)
        if PER_TOKEN:  # masked: scales past T may be a buffer's unwritten spare (NaN times 0 is NaN)
            ks = tl.where(ok, KS_DESC.load([ks_start + t0]), 0.0)
            vs = tl.where(ok, VS_DESC.load([vs_start + t0]), 0.0)
        if INT8_QUERY:
            dots = int8_dot_words(k_raw, q_word, i0, i1, i2, i3, PTX_DEQUANT)
            s = tl.sum(dots, axis=1).to(tl.float32) * score_scale
        else:
            k0, k1, k2, k3 = _unpack_int8x4(k_raw, PTX_DEQUANT)
            s = tl.sum(k0 * q0[None, :] + k1 * q1[None, :] + k2 * q2[None, :] + k3 * q3[None, :], axis=1)
        if PER_TOKEN:
            s = s * ks
        s = tl.where(ok, s, -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))  # finite: token t0 is always in range
        if m_new > m_i:
            # Lazy rescale: only when the running max grows (a few times per split for real
            # scores), which keeps a multiply per cached value out of the common path.
            alpha = tl.exp2(m_i - m_new)
            acc0, acc1, acc2, acc3 = acc0 * alpha, acc1 * alpha, acc2 * alpha, acc3 * alpha
            l_vec = l_vec * alpha
            m_i = m_new
        p = tl.exp2(s - m_i)
        l_vec += p
        if PER_TOKEN:
            p = p * vs
        v0, v1, v2, v3 = _unpack_int8x4(v_raw, PTX_DEQUANT)
        acc0 += p[:, None] * v0
        acc1 += p[:, None] * v1
        acc2 += p[:, None] * v2
        acc3 += p[:, None] * v3
    store_partial(PART_ACC, PART_ML, bh, split, num_splits, w, acc0, acc1, acc2, acc3, m_i, l_vec, D)


@triton.jit
def _decode_split_kernel(
    Q, K, V, PART_ACC, PART_ML,
    T, split_len, num_splits, qk_scale,
    stride_qbh, stride_kbh, stride_kt, stride_vbh, stride_vt,
    D: tl.constexpr, BLOCK_T: tl.constexpr,
):
    """The same split-K decode over an unquantized (bf16/fp16/fp32) cache: isolates what the
    kernel alone gains from what the int8 bytes gain, in the ablation."""
    split = tl.program_id(0)
    bh = tl.program_id(1).to(tl.int64)
    d = tl.arange(0, D)
    offs_t = tl.arange(0, BLOCK_T)
    q = tl.load(Q + bh * stride_qbh + d).to(tl.float32) * qk_scale
    t_start = split * split_len
    t_end = tl.minimum(t_start + split_len, T)
    m_i = -float("inf")
    l_vec = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, D), tl.float32)
    for t0 in range(t_start, t_end, BLOCK_T):
        t = t0 + offs_t
        ok = t < t_end
        k = tl.load(K + bh * stride_kbh + t[:, None] * stride_kt + d[None, :], mask=ok[:, None], other=0.0)
        v = tl.load(V + bh * stride_vbh + t[:, None] * stride_vt + d[None, :], mask=ok[:, None], other=0.0)
        s = tl.where(ok, tl.sum(k.to(tl.float32) * q[None, :], axis=1), -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))
        if m_new > m_i:
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha
            l_vec = l_vec * alpha
            m_i = m_new
        p = tl.exp2(s - m_i)
        l_vec += p
        acc += p[:, None] * v.to(tl.float32)
    part = bh * num_splits + split
    tl.store(PART_ACC + part * D + d, tl.sum(acc, axis=0))
    tl.store(PART_ML + part * 2, m_i)
    tl.store(PART_ML + part * 2 + 1, tl.sum(l_vec, axis=0))


@triton.jit
def _decode_merge_kernel(
    PART_ACC, PART_ML, V_SCALE, OUT, num_splits, stride_vsbh, stride_obh,
    D: tl.constexpr, BLOCK_S: tl.constexpr, V_SCALE_PER_CHANNEL: tl.constexpr,
):
    """Merge the splits of one batch*head (``split_merge``), then apply a per-channel V scale."""
    bh = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    out = merged_output(PART_ACC, PART_ML, bh, num_splits, D, BLOCK_S)
    if V_SCALE_PER_CHANNEL:
        out = out * tl.load(V_SCALE + bh * stride_vsbh + d)
    tl.store(OUT + bh * stride_obh + d, out.to(OUT.dtype.element_ty))


# -- launch configuration --------------------------------------------------------------------------
#: (BLOCK_T, num_warps) candidates. At D = 128 each thread holds 32 to 64 values of the four
#: accumulator tiles; sm_90 builds put (32, 4) at ~80-95 registers and (64, 4) at ~128-154 (for the
#: target shapes the H200 autotuner picked (64, 4), and at T32768 in some runs (32, 4)).
_SPLIT_SHAPES = ((32, 4), (64, 4), (64, 8), (128, 8))
#: Pipeline depths for the int8 kernel's descriptor loads (4 only for tiles of <= 64 tokens: 128 x
#: 128 int8 x K and V x 4 stages would be 128 KB of shared memory). An earlier register prefetch of
#: the next tile lost 1.6-2.7x to the pipeline once loads went through descriptors (H200): a
#: descriptor load outside the pipeliner waits for its own copy.
_STAGES = (3, 4)
_SPLIT_CONFIGS = [triton.Config({"BLOCK_T": bt}, num_warps=w) for bt, w in _SPLIT_SHAPES]
_INT8_SPLIT_CONFIGS = [triton.Config({"BLOCK_T": bt, "STAGES": stages}, num_warps=w, pre_hook=fit_descriptor_blocks)
                       for bt, w in _SPLIT_SHAPES for stages in _STAGES if stages < 4 or bt <= 64]
#: The best tile depends on the split length and how many splits (programs) there are.
_INT8_KEY = ["split_len", "num_splits", "D", "PER_TOKEN", "PTX_DEQUANT"]
#: Splits at least this long skip 32-token blocks: in the H200 config sweeps (two runs, both kernels,
#: both granularities, T8192 and T32768) 64-token blocks were 2.6-6.1% faster in all 8 rows, yet the
#: tuner's single timing per config picked 32 twice, each 3-4% slower in the timed rounds.
_LONG_SPLIT = 1024


def _prune_int8_blocks(configs: list[triton.Config], named_args: dict, **kwargs) -> list[triton.Config]:
    """``early_config_prune``: on long splits, only blocks of 64 tokens or more (see ``_LONG_SPLIT``)."""
    if named_args["split_len"] < _LONG_SPLIT:
        return configs
    return [c for c in configs if c.kwargs["BLOCK_T"] >= 64]


_split_int8_tuned = triton.autotune(configs=_INT8_SPLIT_CONFIGS, key=[*_INT8_KEY, "INT8_QUERY"],
                                    prune_configs_by={"early_config_prune": _prune_int8_blocks},
                                    do_bench=bench_candidate)(_decode_split_int8_kernel)
_split_int8_dot_tuned = triton.autotune(configs=DOT_CONFIGS, key=_INT8_KEY, do_bench=bench_candidate)(
    decode_split_int8_dot_kernel)
_split_fp_tuned = triton.autotune(configs=_SPLIT_CONFIGS, key=["split_len", "D"], do_bench=bench_candidate)(
    _decode_split_kernel)
#: Every launch goes through a DirectLauncher: after the first call per specialization it skips
#: Triton's per-call dispatch (~20% of the int8 call's host time on the H200 machine, direct_launch.py).
#: ``_LAUNCH_INT8[(products, autotuned)]``; the forced configs serve tests and the interpreter.
_LAUNCH_INT8 = {("fma", True): DirectLauncher(_split_int8_tuned),
                ("fma", False): DirectLauncher(_decode_split_int8_kernel),
                ("dot", True): DirectLauncher(_split_int8_dot_tuned),
                ("dot", False): DirectLauncher(decode_split_int8_dot_kernel)}
_LAUNCH_FP = {True: DirectLauncher(_split_fp_tuned), False: DirectLauncher(_decode_split_kernel)}
_LAUNCH_MERGE = DirectLauncher(_decode_merge_kernel)


def _int8_tuner(products: str) -> triton.runtime.Autotuner:
    return _LAUNCH_INT8[products, True].fn


def last_tuning(products: str = "fma") -> list[tuple[str, float]]:
    """(config, ms) of every candidate in an int8 split kernel's most recent autotuning, fastest
    first, for bench reports (empty before the first tuning, or if triton keeps no timings)."""
    def ms(timing: object) -> float:
        return float(timing[0] if isinstance(timing, (list, tuple)) else timing)

    timings = getattr(_int8_tuner(products), "configs_timings", None) or {}
    return [(str(config), ms(t)) for config, t in sorted(timings.items(), key=lambda kv: ms(kv[1]))]


def tuned_split_config(split_len: int, tokens: int, head_dim: int, per_token: bool, ptx_dequant: bool = True,
                       products: str = "fma", int8_query: bool = INT8_QUERY) -> str | None:
    """An int8 split kernel's autotuned config for one key, for bench reports (None if not tuned).
    Triton's cache keys start with the ``_INT8_KEY`` values in order (then, for "fma", INT8_QUERY)."""
    wanted = (split_len, cdiv(tokens, split_len), head_dim, per_token, ptx_dequant)
    wanted += (int8_query,) if products == "fma" else ()
    for key, config in _int8_tuner(products).cache.items():
        if tuple(key[:len(wanted)]) == wanted:
            return str(config)
    return None


#: Most splits one merge program handles (its tile is MAX_SPLITS x D fp32).
MAX_SPLITS = 128
#: Token blocks a caller may force (``block_t``): powers of two that the configs above span. 16 only
#: under the interpreter: on the H200 (triton 3.6) a forced 16-token block faulted with "misaligned
#: address" (2026-12-02); the autotuner's configs start at 32.
_FORCED_BLOCKS = (16, 32, 64, 128)
_FORCED_BLOCKS_GPU = (32, 64, 128)
#: Under the interpreter: small token blocks and splits, so tiny test caches still use several splits.
_INTERP_BLOCK_T = 16
_INTERP_SPLIT = 32


def choose_split_len(tokens: int, heads_total: int, sm_count: int, waves: int = 8) -> int:
    """Tokens per split (a multiple of 256, so of every BLOCK_T): enough programs for ~``waves``
    waves of 4 resident programs per SM, and at most MAX_SPLITS splits so the merge stays one
    program per head. 8 waves: on the H200 both int8 kernels ran 0.6-11% faster at 8 waves than at 16
    (the split sweep in the README), and the last, partial wave still costs only a few percent."""
    wanted_programs = waves * 4 * sm_count
    split_len = cdiv(tokens * heads_total, wanted_programs)
    split_len = max(split_len, cdiv(tokens, MAX_SPLITS), 1)
    return min(max(256, cdiv(split_len, 256) * 256), max(256, cdiv(tokens, 256) * 256))


def _on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and not interpreting()


def _split_plan(q: torch.Tensor, tokens: int, split_len: int | None, gpu: bool) -> tuple[int, int]:
    bh = q.shape[0] * q.shape[1]
    if split_len is None:
        if gpu:
            split_len = choose_split_len(tokens, bh, sm_count(q.device))
        else:
            blocks = cdiv(cdiv(tokens, MAX_SPLITS), _INTERP_BLOCK_T)
            split_len = max(_INTERP_SPLIT, blocks * _INTERP_BLOCK_T)
    num_splits = cdiv(tokens, split_len)
    if num_splits > MAX_SPLITS:
        raise ValueError(f"split_len={split_len} gives {num_splits} splits > {MAX_SPLITS}")
    return split_len, num_splits


def _by_head(t: torch.Tensor) -> torch.Tensor:
    """``t`` (B, H, ...) laid out as the kernels index it: last dim contiguous and (b, h) at offset
    ``(b * H + h) * stride(1)``. A cache buffer sliced to its filled length along T already is, so a
    model's decode step reads its growing cache in place instead of copying it every token."""
    flat_heads = t.shape[0] == 1 or t.stride(0) == t.shape[1] * t.stride(1)
    return t if t.stride(-1) == 1 and flat_heads else t.contiguous()


def _check_shapes(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> None:
    consistent = k.shape == v.shape and k.shape[:2] == q.shape[:2] and k.shape[3] == q.shape[2]
    if q.dim() != 3 or k.dim() != 4 or not consistent:
        raise ValueError(f"expected q (B, H, D) and k, v (B, H, T, D); got {tuple(q.shape)}, "
                         f"{tuple(k.shape)}, {tuple(v.shape)}")
    if k.shape[2] == 0:
        raise ValueError("decode attention over an empty cache is undefined")
    d = q.shape[2]
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")


def _merge(part_acc: torch.Tensor, part_ml: torch.Tensor, v_scale: torch.Tensor | None, shape: torch.Size,
           dtype: torch.dtype, num_splits: int, per_channel_v: bool) -> torch.Tensor:
    """Launch the merge; returns the (B, H, D) output.

    The CPU interpreter converts fp32 to bf16 by truncation (about 2x the error of the GPU's
    round-to-nearest), so under it a bf16 output is written in fp32 and rounded by torch.
    """
    b, h, d = shape
    store_dtype = torch.float32 if interpreting() and dtype == torch.bfloat16 else dtype
    out = torch.empty((b, h, d), device=part_acc.device, dtype=store_dtype)
    scale = v_scale if v_scale is not None else part_ml
    _LAUNCH_MERGE((b * h,), part_acc, part_ml, scale, out, num_splits, scale.stride(1) if per_channel_v else 0, d,
                  D=d, BLOCK_S=max(2, 1 << (num_splits - 1).bit_length()), V_SCALE_PER_CHANNEL=per_channel_v,
                  num_warps=4)
    return out.to(dtype)


def int8_decode_attention(
    q: torch.Tensor, k_q: torch.Tensor, k_scale: torch.Tensor, v_q: torch.Tensor, v_scale: torch.Tensor,
    granularity: str, sm_scale: float | None = None, split_len: int | None = None,
    ptx_dequant: bool | None = None, stages: int | None = None, products: str = "fma", block_t: int | None = None,
    int8_query: bool | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v for one query token per (batch, head), over an int8 cache.

    q: (B, H, D); k_q, v_q: (B, H, T, D) int8 from ``quantize_kv``; scales (B, H, T) for
    ``granularity="token"`` or (B, H, D) for ``"channel"``. Returns (B, H, D) in q's dtype.
    ``ptx_dequant`` defaults to on for GPUs (off under the interpreter, which cannot run PTX).
    ``stages`` and ``block_t`` (tests, bench sweeps) force one config on 4 warps: loads pipelined
    ``stages`` steps deep (1: none; default 3 on a GPU) over blocks of ``block_t`` tokens (32 to 128,
    and 16 under the interpreter; default 64 on a GPU). By default the GPU autotunes both, and the
    interpreter runs 1 x 16.
    ``products`` picks the CUDA-core (``"fma"``) or the tensor-core (``"dot"``, head_dim >= 64) kernel.
    ``int8_query`` (CUDA-core kernel only; default ``INT8_QUERY``): quantize q per (batch, head) to
    int8 and form the scores as exact int8 dot products (``int8_query.py``); False: fp32 products.
    """
    _check_shapes(q, k_q, v_q)
    if k_q.dtype != torch.int8 or v_q.dtype != torch.int8:
        raise TypeError(f"k_q and v_q must be int8, got {k_q.dtype} and {v_q.dtype}")
    if granularity not in GRANULARITIES:
        raise ValueError(f"granularity must be one of {GRANULARITIES}, got {granularity!r}")
    if products not in PRODUCTS:
        raise ValueError(f"products must be one of {PRODUCTS}, got {products!r}")
    b, h, t, d = k_q.shape
    if products == "dot" and d < MIN_DOT_HEAD_DIM:
        raise ValueError(f'products="dot" needs head_dim >= {MIN_DOT_HEAD_DIM}, got {d}; use products="fma"')
    if products == "dot" and int8_query:
        raise ValueError('int8_query applies to the CUDA-core kernel; use products="fma" or int8_query=None')
    int8_query = INT8_QUERY if int8_query is None else bool(int8_query)
    gpu = _on_gpu(q)
    allowed = _FORCED_BLOCKS_GPU if gpu else _FORCED_BLOCKS
    if block_t is not None and block_t not in allowed:
        raise ValueError(f"block_t must be one of {allowed} on {'a GPU' if gpu else 'the interpreter'}, "
                         f"got {block_t!r}")
    wanted = (b, h, t if granularity == "token" else d)
    for name, scale in (("k_scale", k_scale), ("v_scale", v_scale)):
        if tuple(scale.shape) != wanted:
            axis = "T (one scale per token)" if granularity == "token" else "D (one scale per channel)"
            raise ValueError(f"{name} must be (B, H, {axis}) = {wanted} for granularity={granularity!r}, got "
                             f"{tuple(scale.shape)}; pass the scales quantize_kv(x, {granularity!r}) returned")
    q, k_q, v_q = _by_head(q), _by_head(k_q), _by_head(v_q)
    k_scale, v_scale = _by_head(k_scale.float()), _by_head(v_scale.float())
    k_words, v_words = k_q.view(torch.int32), v_q.view(torch.int32)  # 4 channels per word
    split_len, num_splits = _split_plan(q, t, split_len, gpu)
    part_acc = torch.empty((b * h * num_splits, d), device=q.device, dtype=torch.float32)
    part_ml = torch.empty((b * h * num_splits, 2), device=q.device, dtype=torch.float32)
    qk_scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * _LOG2E
    per_token = granularity == "token"
    autotuned = gpu and stages is None and block_t is None
    # the autotuner's configs each set their own block (fit_descriptor_blocks); forced runs use this one
    block_t = block_t or (64 if gpu else _INTERP_BLOCK_T)
    (ks_desc, ks_stride), (vs_desc, vs_stride) = scale_descriptor(k_scale, block_t), scale_descriptor(v_scale, block_t)
    # K_SCALE (per-channel scales, loaded by pointer) is the tensor behind ks_desc, so it shares ks_stride
    args = (q, cache_descriptor(k_words, block_t), cache_descriptor(v_words, block_t), ks_desc.base, ks_desc,
            vs_desc, part_acc, part_ml, t, split_len, num_splits, qk_scale, q.stride(1), ks_stride, vs_stride)
    grid = (num_splits, b * h)
    ptx = gpu and ptx_dequant is not False
    flags = dict(D=d, PER_TOKEN=per_token, PTX_DEQUANT=ptx)
    if products == "fma":
        flags["INT8_QUERY"] = int8_query
    if autotuned:
        _LAUNCH_INT8[products, True](grid, *args, **flags)
    else:
        depth = stages if stages is not None else (3 if gpu else 1)
        _LAUNCH_INT8[products, False](grid, *args, BLOCK_T=block_t, STAGES=depth, num_warps=4, **flags)
    return _merge(part_acc, part_ml, v_scale, q.shape, q.dtype, num_splits, per_channel_v=not per_token)


def decode_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, sm_scale: float | None = None,
                     split_len: int | None = None) -> torch.Tensor:
    """The same split-K decode over an unquantized cache (any float dtype): the kernel-only ablation."""
    _check_shapes(q, k, v)
    b, h, t, d = k.shape
    q, k, v = _by_head(q), _by_head(k), _by_head(v)
    gpu = _on_gpu(q)
    split_len, num_splits = _split_plan(q, t, split_len, gpu)
    part_acc = torch.empty((b * h * num_splits, d), device=q.device, dtype=torch.float32)
    part_ml = torch.empty((b * h * num_splits, 2), device=q.device, dtype=torch.float32)
    qk_scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * _LOG2E
    args = (q, k, v, part_acc, part_ml, t, split_len, num_splits, qk_scale,
            q.stride(1), k.stride(1), k.stride(2), v.stride(1), v.stride(2))
    if gpu:
        _LAUNCH_FP[True]((num_splits, b * h), *args, D=d)
    else:
        _LAUNCH_FP[False]((num_splits, b * h), *args, D=d, BLOCK_T=_INTERP_BLOCK_T, num_warps=4)
    return _merge(part_acc, part_ml, None, q.shape, q.dtype, num_splits, per_channel_v=False)
