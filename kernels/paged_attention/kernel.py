"""Decode attention over a paged KV cache: a split-K Triton kernel that reads K/V through a block table.

Why through the table: a paged cache scatters a sequence's tokens over physical blocks of the pool
(``allocator.py``), so the kernel maps each logical token t to ``block_table[b, t // PAGE]`` and slot
``t % PAGE``. Each token's D values are one contiguous run of memory, so a tile of BLOCK_T tokens is
BLOCK_T row loads whatever the physical order; a tile may span several pages (small pages) or part
of one (large pages), which keeps the tile size a tuning choice, independent of the page size.

Why split-K (flash-decoding, as in ``int8_kv_cache``): one query token per (batch, head) gives B*H
programs, too few to fill a GPU when each would walk thousands of tokens. The token axis is split
into chunks of ``split_len``; each (split, batch*head) program writes an unnormalized partial output
with its running max and sum (fp32), and a second kernel merges the splits. With mixed lengths the
grid covers the longest sequence (the table's width, so no device sync); a split past a sequence's
end does no work and the merge gives it zero weight.
"""

from __future__ import annotations

import functools
import math

import torch
import triton
import triton.language as tl
from microscope_kernels.autotune_timing import bench_candidate
from microscope_kernels.direct_launch import DirectLauncher, cdiv
from microscope_kernels.split_merge import merged_output

from microscope.api import interpreting

#: Tokens per physical block (``PAGE``) the kernel supports.
PAGE_SIZES = (16, 32, 64, 128)
#: Most splits one merge program handles (its tile is MAX_SPLITS x D fp32).
MAX_SPLITS = 128
_LOG2E = math.log2(math.e)
#: Under the interpreter: small tiles and splits, so tiny test caches still use several of each.
_INTERP_BLOCK_T = 16
_INTERP_SPLIT = 32
#: Tiles a caller may force (``block_t``), all dividing the GPU split lengths (multiples of 256).
_FORCED_BLOCKS = (16, 32, 64, 128)


@triton.jit
def _paged_split_kernel(
    Q, K_POOL, V_POOL, BLOCK_TABLE, SEQ_LENS, PART_ACC, PART_ML,
    heads, split_len, num_splits, qk_scale,
    stride_qb, stride_qh, stride_kn, stride_kh, stride_kt, stride_vn, stride_vh, stride_vt, stride_tb,
    D: tl.constexpr, PAGE: tl.constexpr, BLOCK_T: tl.constexpr, STAGES: tl.constexpr,
):
    """One (split, batch*head): online softmax over the split's tokens, gathered through the table."""
    split = tl.program_id(0)
    bh = tl.program_id(1)
    b = (bh // heads).to(tl.int64)
    h = (bh % heads).to(tl.int64)
    d = tl.arange(0, D)
    offs_t = tl.arange(0, BLOCK_T)
    q = tl.load(Q + b * stride_qb + h * stride_qh + d).to(tl.float32) * qk_scale  # sm_scale * log2(e)
    t_start = split * split_len
    t_end = tl.minimum(t_start + split_len, tl.load(SEQ_LENS + b))
    table = BLOCK_TABLE + b * stride_tb
    k_head = K_POOL + h * stride_kh
    v_head = V_POOL + h * stride_vh
    m_i = -float("inf")
    l_vec = tl.zeros((BLOCK_T,), tl.float32)
    acc = tl.zeros((BLOCK_T, D), tl.float32)
    for t0 in tl.range(t_start, t_end, BLOCK_T, num_stages=STAGES):  # empty past the sequence's end
        t = t0 + offs_t
        ok = t < t_end
        page = tl.load(table + t // PAGE, mask=ok, other=0).to(tl.int64)
        slot = t % PAGE
        k = tl.load(k_head + page[:, None] * stride_kn + slot[:, None] * stride_kt + d[None, :],
                    mask=ok[:, None], other=0.0)
        v = tl.load(v_head + page[:, None] * stride_vn + slot[:, None] * stride_vt + d[None, :],
                    mask=ok[:, None], other=0.0)
        s = tl.where(ok, tl.sum(k.to(tl.float32) * q[None, :], axis=1), -float("inf"))
        m_new = tl.maximum(m_i, tl.max(s, axis=0))  # finite: token t0 is always in range
        if m_new > m_i:  # rescale only when the running max grows
            alpha = tl.exp2(m_i - m_new)
            acc = acc * alpha
            l_vec = l_vec * alpha
            m_i = m_new
        p = tl.exp2(s - m_i)
        l_vec += p
        acc += p[:, None] * v.to(tl.float32)
    part = bh.to(tl.int64) * num_splits + split
    tl.store(PART_ACC + part * D + d, tl.sum(acc, axis=0))
    tl.store(PART_ML + part * 2, m_i)
    tl.store(PART_ML + part * 2 + 1, tl.sum(l_vec, axis=0))


@triton.jit
def _merge_kernel(PART_ACC, PART_ML, OUT, num_splits, stride_obh, D: tl.constexpr, BLOCK_S: tl.constexpr):
    """Merge the splits of one batch*head (``split_merge``). A split past its sequence's end is empty
    (weight 0); split 0 always holds a token."""
    bh = tl.program_id(0).to(tl.int64)
    d = tl.arange(0, D)
    out = merged_output(PART_ACC, PART_ML, bh, num_splits, D, BLOCK_S)
    tl.store(OUT + bh * stride_obh + d, out.to(OUT.dtype.element_ty))


#: (BLOCK_T, num_warps, stages) autotuning candidates on a GPU: a tile is BLOCK_T rows of D values of
#: K and of V, loads pipelined ``stages`` deep (cp.async on sm_80+).
_SHAPES = ((32, 4, 2), (32, 4, 3), (64, 4, 2), (64, 4, 3), (64, 8, 3), (128, 8, 2), (128, 8, 3))
_CONFIGS = [triton.Config({"BLOCK_T": bt, "STAGES": st}, num_warps=w) for bt, w, st in _SHAPES]
_split_tuned = triton.autotune(configs=_CONFIGS, key=["split_len", "num_splits", "D", "PAGE"],
                               do_bench=bench_candidate)(_paged_split_kernel)
#: Launches skip Triton's per-call dispatch after the first call per specialization (direct_launch.py).
_LAUNCH_SPLIT = {True: DirectLauncher(_split_tuned), False: DirectLauncher(_paged_split_kernel)}
_LAUNCH_MERGE = DirectLauncher(_merge_kernel)


@functools.cache
def _sm_count(device_index: int) -> int:
    return torch.cuda.get_device_properties(device_index).multi_processor_count


def choose_split_len(tokens: int, heads_total: int, sm_count: int, waves: int = 8) -> int:
    """Tokens per split (a multiple of 256, so of every tile): enough programs for ~``waves`` waves of
    4 resident programs per SM, at most MAX_SPLITS splits. The int8_kv_cache room's rule, whose H200
    split sweep found 8 waves 0.6-11% faster than 16."""
    split_len = max(cdiv(tokens * heads_total, waves * 4 * sm_count), cdiv(tokens, MAX_SPLITS), 1)
    return min(max(256, cdiv(split_len, 256) * 256), max(256, cdiv(tokens, 256) * 256))


def _on_gpu(t: torch.Tensor) -> bool:
    return t.device.type == "cuda" and not interpreting()


def _check(q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
           seq_lens: torch.Tensor) -> None:
    """Shapes and dtypes (and, for CPU tensors, where checking costs no device sync, the values)."""
    if q.dim() != 3 or k_pool.dim() != 4 or k_pool.shape != v_pool.shape or k_pool.shape[1] != q.shape[1] \
            or k_pool.shape[3] != q.shape[2]:
        raise ValueError(f"expected q (B, H, D) and k_pool, v_pool (num_blocks, H, block_size, D); got "
                         f"{tuple(q.shape)}, {tuple(k_pool.shape)}, {tuple(v_pool.shape)}")
    b, d, page = q.shape[0], q.shape[2], k_pool.shape[2]
    if page not in PAGE_SIZES:
        raise ValueError(f"block size (k_pool.shape[2]) must be one of {PAGE_SIZES}, got {page}")
    if d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d}")
    if k_pool.dtype != q.dtype or v_pool.dtype != q.dtype:
        raise TypeError(f"q, k_pool and v_pool must share a dtype, got {q.dtype}, {k_pool.dtype}, {v_pool.dtype}")
    if block_table.dtype != torch.int32 or seq_lens.dtype != torch.int32:
        raise TypeError(f"block_table and seq_lens must be int32, got {block_table.dtype} and {seq_lens.dtype}")
    if block_table.dim() != 2 or block_table.shape[0] != b or tuple(seq_lens.shape) != (b,):
        raise ValueError(f"expected block_table (B, max_blocks) and seq_lens (B,) for B = {b}; got "
                         f"{tuple(block_table.shape)} and {tuple(seq_lens.shape)}")
    if seq_lens.device.type == "cpu" and block_table.device.type == "cpu" and b:
        width = block_table.shape[1]
        if int(seq_lens.min()) < 1 or int(seq_lens.max()) > width * page:
            raise ValueError(f"seq_lens must be in [1, {width * page}] (the table's {width} blocks of {page}), "
                             f"got {seq_lens.tolist()}")
        used = torch.arange(width)[None, :] < ((seq_lens + page - 1) // page)[:, None]
        ids = block_table[used]
        if ids.numel() and (int(ids.min()) < 0 or int(ids.max()) >= k_pool.shape[0]):
            raise ValueError(f"block_table names blocks outside the pool of {k_pool.shape[0]} for tokens "
                             "the sequences hold")


def _split_plan(q: torch.Tensor, tokens: int, split_len: int | None, gpu: bool) -> tuple[int, int]:
    if split_len is None:
        if gpu:
            index = q.device.index if q.device.index is not None else torch.cuda.current_device()
            split_len = choose_split_len(tokens, q.shape[0] * q.shape[1], _sm_count(index))
        else:
            blocks = cdiv(cdiv(tokens, MAX_SPLITS), _INTERP_BLOCK_T)
            split_len = max(_INTERP_SPLIT, blocks * _INTERP_BLOCK_T)
    if split_len < 1:
        raise ValueError(f"split_len must be >= 1, got {split_len}")
    num_splits = cdiv(tokens, split_len)
    if num_splits > MAX_SPLITS:
        raise ValueError(f"split_len={split_len} gives {num_splits} splits > {MAX_SPLITS}")
    return split_len, num_splits


def precompile(batch: int, heads: int, head_dim: int, page: int, tokens: int, dtype: torch.dtype, device: str,
               shard: tuple[int, int] = (0, 1)) -> list[tuple[str, str]]:
    """Compile shard ``shard[0]`` of ``shard[1]`` of the split kernel's autotuning candidates (the merge
    kernel in shard 0) for a decode over ``batch`` x ``heads`` sequences of up to ``tokens`` in blocks of
    ``page``. Triton specializes on integer arguments, so the call's own (heads, split length, strides) go
    in, on one-block stand-in tensors. Returns (kernel, error) per candidate that failed."""
    if interpreting():
        return []
    q = torch.empty((batch, heads, head_dim), device=device, dtype=dtype)
    pool = torch.empty((1, heads, page, head_dim), device=device, dtype=dtype)
    table = torch.empty((batch, cdiv(tokens, page)), device=device, dtype=torch.int32)
    lens = torch.empty((batch,), device=device, dtype=torch.int32)
    split_len, num_splits = _split_plan(q, table.shape[1] * page, None, True)
    part_acc = torch.empty((num_splits, head_dim), device=device, dtype=torch.float32)
    part_ml = torch.empty((num_splits, 2), device=device, dtype=torch.float32)
    args = (q, pool, pool, table, lens, part_acc, part_ml, heads, split_len, num_splits, 1.0 / math.sqrt(head_dim),
            q.stride(0), q.stride(1), *pool.stride()[:3], *pool.stride()[:3], table.stride(0))
    failed = []
    for cfg in _CONFIGS[shard[0]::shard[1]]:
        try:
            _paged_split_kernel.warmup(*args, grid=(1,), D=head_dim, PAGE=page, **cfg.all_kwargs())
        except Exception as exc:  # noqa: BLE001 - reported; the autotuner compiles it on first use instead
            failed.append((f"_paged_split_kernel {cfg}", f"{type(exc).__name__}: {str(exc)[:300]}"))
    if shard[0] == 0:
        out = torch.empty((1, head_dim), device=device, dtype=dtype)
        _merge_kernel.warmup(part_acc, part_ml, out, num_splits, head_dim, grid=(1,), D=head_dim,
                             BLOCK_S=max(2, 1 << (num_splits - 1).bit_length()), num_warps=4)
    return failed


def paged_decode_attention(
    q: torch.Tensor, k_pool: torch.Tensor, v_pool: torch.Tensor, block_table: torch.Tensor,
    seq_lens: torch.Tensor, sm_scale: float | None = None, split_len: int | None = None,
    block_t: int | None = None, stages: int | None = None,
) -> torch.Tensor:
    """softmax(q k^T * sm_scale) v for one query token per (batch, head) over a paged cache.

    q: (B, H, D); k_pool, v_pool: (num_blocks, H, block_size, D), block_size in ``PAGE_SIZES``;
    block_table: int32 (B, max_blocks), entry j the physical block of sequence b's tokens
    [j * block_size, (j + 1) * block_size); seq_lens: int32 (B,), each >= 1. Returns (B, H, D) in q's
    dtype, accumulated in fp32. ``split_len``, ``block_t`` (a tile of tokens) and ``stages`` force what
    a GPU otherwise chooses or autotunes; the interpreter runs 16-token tiles unpipelined.
    """
    _check(q, k_pool, v_pool, block_table, seq_lens)
    if block_t is not None and block_t not in _FORCED_BLOCKS:
        raise ValueError(f"block_t must be one of {_FORCED_BLOCKS}, got {block_t!r}")
    b, h, d = q.shape
    page = k_pool.shape[2]
    q = q if q.stride(-1) == 1 else q.contiguous()
    k_pool = k_pool if k_pool.stride(-1) == 1 else k_pool.contiguous()
    v_pool = v_pool if v_pool.stride(-1) == 1 else v_pool.contiguous()
    block_table = block_table if block_table.stride(-1) == 1 else block_table.contiguous()
    seq_lens = seq_lens.contiguous()
    gpu = _on_gpu(q)
    split_len, num_splits = _split_plan(q, block_table.shape[1] * page, split_len, gpu)
    part_acc = torch.empty((b * h * num_splits, d), device=q.device, dtype=torch.float32)
    part_ml = torch.empty((b * h * num_splits, 2), device=q.device, dtype=torch.float32)
    qk_scale = (sm_scale if sm_scale is not None else 1.0 / math.sqrt(d)) * _LOG2E
    args = (q, k_pool, v_pool, block_table, seq_lens, part_acc, part_ml, h, split_len, num_splits, qk_scale,
            q.stride(0), q.stride(1), k_pool.stride(0), k_pool.stride(1), k_pool.stride(2),
            v_pool.stride(0), v_pool.stride(1), v_pool.stride(2), block_table.stride(0))
    grid = (num_splits, b * h)
    if gpu and block_t is None and stages is None:
        _LAUNCH_SPLIT[True](grid, *args, D=d, PAGE=page)
    else:
        tile = block_t or (64 if gpu else _INTERP_BLOCK_T)
        depth = stages if stages is not None else (3 if gpu else 1)
        _LAUNCH_SPLIT[False](grid, *args, D=d, PAGE=page, BLOCK_T=tile, STAGES=depth, num_warps=4)
    # the interpreter converts fp32 to bf16 by truncation; under it a bf16 output is rounded by torch
    store_dtype = torch.float32 if interpreting() and q.dtype == torch.bfloat16 else q.dtype
    out = torch.empty((b, h, d), device=q.device, dtype=store_dtype)
    _LAUNCH_MERGE((b * h,), part_acc, part_ml, out, num_splits, d, D=d,
                  BLOCK_S=max(2, 1 << (num_splits - 1).bit_length()), num_warps=4)
    return out.to(q.dtype)
