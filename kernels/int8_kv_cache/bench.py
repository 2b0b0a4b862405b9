"""GPU benchmark of int8-KV decode attention (``python -m microscope_kernels.int8_kv_cache.bench``).

Checks correctness on the GPU first, measures copy bandwidth in the same process, then times one
decode step (one query token per batch and head) for SDPA and eager attention over the bf16 cache,
the same split-K Triton kernel over the bf16 cache, and the int8 kernels (``KERNELS``: int8 score
products with an int8 query, the default; fp32 products with PTX or portable dequantization;
tensor-core products), in 5 interleaved rounds (median and range),
once with plain launches and once replayed from CUDA graphs (device time alone).
GB/s counts the bytes each variant must read (bf16 cache, or int8 + scales). ``--split-sweep`` adds a
table of the per-token kernels at several split lengths; ``--config-sweep`` one of the CUDA-core
kernel at each forced 4-warp config beside the autotuned one. ``main()`` returns the rows so one
process can run all the rooms' benches.
"""

from __future__ import annotations

import argparse
import functools
from collections.abc import Sequence

import torch
import triton
from microscope_kernels.int8_kv_cache.kernel import (
    MAX_SPLITS,
    cache_bytes,
    choose_split_len,
    decode_attention,
    dequantize_kv,
    int8_decode_attention,
    last_tuning,
    quantize_kv,
    tuned_split_config,
)
from microscope_kernels.int8_kv_cache.reference import (
    eager_decode_attention,
    int8_query_decode_attention,
    sdpa_decode_attention,
)
from microscope_kernels.safe_softmax.bench import (
    Row,
    check,
    copy_bandwidth_gbps,
    gpu_header,
    gpu_state,
    interleaved_medians,
    measure,
    print_table,
)

from microscope.api import DTYPES

#: The targets: (batch, heads, tokens, head_dim).
SHAPES = ((16, 32, 8192, 128), (64, 8, 32768, 128))
#: The int8 kernels the bench can time: name -> ``int8_decode_attention`` options. "dp4a" (the
#: default) forms the scores as int8 dot products with q quantized to int8; "fma" multiplies in fp32
#: over the dequantized K; "portable" is "fma" without the PTX unpack; "dot" runs on tensor cores.
KERNELS = {"dp4a": dict(ptx_dequant=True, products="fma", int8_query=True),
           "fma": dict(ptx_dequant=True, products="fma", int8_query=False),
           "portable": dict(ptx_dequant=False, products="fma", int8_query=False),
           "dot": dict(ptx_dequant=True, products="dot", int8_query=False)}
#: The kernel whose rows carry the plain ``int8_<granularity>`` name (the others add their own).
DEFAULT_KERNEL = "dp4a"
#: Correctness runs per kernel beyond the autotuned one: forced pipeline depths, or the portable unpack.
_EXTRA_CHECKS = {"dp4a": (dict(stages=1), dict(stages=3), dict(ptx_dequant=False)),
                 "fma": (dict(stages=1), dict(stages=3)), "portable": (), "dot": (dict(ptx_dequant=False),)}


def _cache(b: int, h: int, t: int, d: int, dtype: torch.dtype, seed: int = 0):
    gen = torch.Generator(device="cuda").manual_seed(seed)
    q = torch.randn(b, h, d, device="cuda", dtype=dtype, generator=gen)
    k = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=gen)
    v = torch.randn(b, h, t, d, device="cuda", dtype=dtype, generator=gen)
    return q, k, v


def _correctness(dtype: torch.dtype, kernels: Sequence[str]) -> bool:
    """Both int8 dequantization paths and the bf16 kernel vs float64 eager attention on an odd
    length: the kernel's own error over the dequantized cache within 4x eager's (+ a floor), and the
    full int8 cost over the unquantized cache."""
    ok = True
    q, k, v = _cache(3, 5, 4099, 128, dtype, seed=1)
    truth = eager_decode_attention(q.double(), k.double(), v.double())
    rel = lambda y, r: float((y.double() - r).norm() / r.norm())  # noqa: E731
    floor = torch.finfo(dtype).eps  # two unit roundoffs
    eager_err = rel(eager_decode_attention(q, k, v), truth)
    ok = check(f"triton bf16-cache kernel {dtype}", rel(decode_attention(q, k, v), truth),
               4 * eager_err + floor) and ok
    for granularity in ("token", "channel"):
        k_q, k_s = quantize_kv(k, granularity)
        v_q, v_s = quantize_kv(v, granularity)
        k_d, v_d = (dequantize_kv(x, s, granularity, torch.float64) for x, s in ((k_q, k_s), (v_q, v_s)))
        truth_deq = eager_decode_attention(q.double(), k_d, v_d)
        # the int8-query kernel's own model: the cache dequantized and q quantized as the kernel does
        truth_q8 = int8_query_decode_attention(q, k_q, k_s, v_q, v_s, granularity)
        limit = 4 * rel(eager_decode_attention(q, k_d.to(dtype), v_d.to(dtype)), truth_deq) + floor
        for kernel in kernels:
            for extra in ({}, *_EXTRA_CHECKS[kernel]):
                options = {**KERNELS[kernel], **extra}
                label = f"int8 {granularity} {kernel} " + " ".join(f"{k}={v}" for k, v in extra.items())
                try:
                    out = int8_decode_attention(q, k_q, k_s, v_q, v_s, granularity, **options)
                except Exception as exc:  # a kernel that fails to build must not end the bench
                    print(f"   check {label}: FAIL {type(exc).__name__}: "
                          f"{str(exc).splitlines()[0] if str(exc) else ''}")
                    ok = False
                    continue
                model = ("the int8-query model", truth_q8) if options["int8_query"] else ("dequantized cache",
                                                                                          truth_deq)
                ok = check(f"{label} vs {model[0]}", rel(out, model[1]), limit) and ok
                ok = check(f"{label} vs unquantized cache (int8 cost)", rel(out, truth), 0.03) and ok
    return ok


def _bench_shape(b: int, h: int, t: int, d: int, dtype: torch.dtype, kernels: Sequence[str], sweep: bool,
                 config_sweep: bool) -> tuple[list[Row], list[Row], list[Row]]:
    """Every variant on one cache shape (a function, so the caches are freed when it returns), timed
    in interleaved rounds after every autotuner has settled, with plain launches and replayed from
    CUDA graphs; and, if asked, the per-token kernels at other split lengths and the CUDA-core kernel
    at each forced config (the third list)."""
    q, k, v = _cache(b, h, t, d, dtype)
    full = cache_bytes(b, h, t, d, None, dtype=dtype)
    shape = f"B{b} H{h} T{t} D{d}"
    thunks = {name: functools.partial(fn, q, k, v) for name, fn in (
        ("sdpa", sdpa_decode_attention), ("eager", eager_decode_attention), ("triton_bf16cache", decode_attention))}
    nbytes = dict.fromkeys(thunks, full)
    notes = dict.fromkeys(thunks, "")
    for granularity in ("token", "channel"):
        k_q, k_s = quantize_kv(k, granularity)
        v_q, v_s = quantize_kv(v, granularity)
        for kernel in kernels:
            name = f"int8_{granularity}" + ("" if kernel == DEFAULT_KERNEL else f"_{kernel}")
            thunk = functools.partial(int8_decode_attention, q, k_q, k_s, v_q, v_s, granularity, **KERNELS[kernel])
            if measure(thunk, f"{name} {shape} (autotuning)", warmup=0, rep=1) is None:
                continue  # it failed to build or run, and said so
            tuning = last_tuning(KERNELS[kernel]["products"])
            print(f"   {name} {shape} candidates: " + "; ".join(f"{c} {ms:.4f} ms" for c, ms in tuning))
            thunks[name] = thunk
            nbytes[name] = cache_bytes(b, h, t, d, granularity)
            notes[name] = f"cache {nbytes[name] / full:.3f}x of {str(dtype).replace('torch.', '')}"
    tables = []
    for graphs in (False, True):
        rows = []
        timings = interleaved_medians(thunks, graphs=graphs)
        print(f"   {shape} GPU right after the {'CUDA-graph' if graphs else 'plain-launch'} rounds: {gpu_state()}")
        for name, timing in timings.items():
            spread = f"rounds {timing[1]:.4f}-{timing[2]:.4f}" if timing else ""
            rows.append(Row(shape, name, timing[0] if timing else None, nbytes[name],
                            note="; ".join(n for n in (notes[name], spread) if n)))
        tables.append(rows)
    extra = (_split_sweep(q, k, v, shape) if sweep else []) + (_config_sweep(q, k, v, shape) if config_sweep else [])
    return tables[0], tables[1], extra


def _split_sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: str) -> list[Row]:
    """The per-token int8 kernels (all but the portable one) at split lengths 256..8192, each
    autotuned on its own: how much ``choose_split_len``'s choice leaves on the table."""
    b, h, t, d = k.shape
    k_q, k_s = quantize_kv(k, "token")
    v_q, v_s = quantize_kv(v, "token")
    small = cache_bytes(b, h, t, d, "token")
    sm_count = torch.cuda.get_device_properties(q.device).multi_processor_count
    rows = []
    chosen = choose_split_len(t, b * h, sm_count)
    for kernel in ("dp4a", "fma", "dot"):
        options = KERNELS[kernel]
        for split_len in (256, 512, 1024, 2048, 4096, 8192):
            if split_len > t or triton.cdiv(t, split_len) > MAX_SPLITS:
                continue
            thunk = functools.partial(int8_decode_attention, q, k_q, k_s, v_q, v_s, "token", split_len=split_len,
                                      **options)
            if measure(thunk, f"split {split_len} {kernel} {shape} (autotuning)", warmup=0, rep=1) is None:
                continue
            best = tuned_split_config(split_len, t, d, per_token=True, products=options["products"],
                                      int8_query=options["int8_query"]) or "?"
            note = ("the default; " if split_len == chosen else "") + f"best config: {best}"
            rows.append(Row(f"{shape} int8_token {kernel}", f"split_len {split_len} ({triton.cdiv(t, split_len)})",
                            measure(thunk, f"split {split_len} {shape}"), small, note=note))
    return rows


#: (block_t, stages) forced by ``--config-sweep``: the CUDA-core kernel's 4-warp configs.
SWEEP_CONFIGS = ((32, 3), (32, 4), (64, 3), (64, 4))


def _config_sweep(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, shape: str) -> list[Row]:
    """The default kernel at each forced 4-warp config and autotuned, both granularities, timed
    together in interleaved rounds from CUDA graphs: whether a config the tuner prefers stays fast
    when timed beside the others (per token at T32768, 32-token blocks timed 14-16% slower than the
    tuner's own figure in two runs, 64-token blocks 3.5-5% in two others)."""
    b, h, t, d = k.shape
    thunks, nbytes = {}, {}
    for granularity in ("token", "channel"):
        k_q, k_s = quantize_kv(k, granularity)
        v_q, v_s = quantize_kv(v, granularity)
        call = functools.partial(int8_decode_attention, q, k_q, k_s, v_q, v_s, granularity)
        for block_t, stages in (*SWEEP_CONFIGS, (None, None)):
            name = f"{granularity} " + (f"block {block_t} x{stages} stages" if block_t else "autotuned")
            thunk = functools.partial(call, block_t=block_t, stages=stages)
            if measure(thunk, f"{name} {shape} (compile)", warmup=0, rep=1) is not None:
                thunks[name] = thunk
                nbytes[name] = cache_bytes(b, h, t, d, granularity)
    timings = interleaved_medians(thunks, graphs=True)
    print(f"   {shape} GPU right after the config sweep: {gpu_state()}")
    split_len = choose_split_len(t, b * h, torch.cuda.get_device_properties(q.device).multi_processor_count)
    for granularity in ("token", "channel"):
        print(f"   {shape} {granularity}: the autotuned rows ran "
              f"{tuned_split_config(split_len, t, d, per_token=granularity == 'token')}")
    return [Row(f"{shape} int8 {DEFAULT_KERNEL}", name, timing[0] if timing else None, nbytes[name],
                note=f"rounds {timing[1]:.4f}-{timing[2]:.4f}" if timing else "")
            for name, timing in timings.items()]


def main(argv: Sequence[str] | None = None) -> list[Row]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtype", default="bf16", choices=["bf16", "fp16"])
    parser.add_argument("--kernels", default=",".join(KERNELS),
                        help=f"comma-separated int8 kernels to check and time, of {', '.join(KERNELS)}")
    parser.add_argument("--split-sweep", action="store_true",
                        help="also time the per-token kernels at split lengths 256..8192 (each autotuned: minutes)")
    parser.add_argument("--config-sweep", action="store_true",
                        help="also time the CUDA-core kernel at each forced 4-warp config beside the autotuned one")
    args = parser.parse_args(argv)
    dtype = DTYPES[args.dtype]  # choices limit it to bf16/fp16
    kernels = [name.strip() for name in args.kernels.split(",") if name.strip()]
    unknown = sorted(set(kernels) - set(KERNELS))
    if unknown:
        parser.error(f"--kernels: unknown {', '.join(unknown)}; choose from {', '.join(KERNELS)}")
    gpu_header(f"int8_kv_cache decode bench, {args.dtype} cache vs int8 cache")
    _correctness(dtype, kernels)
    copy_gbps = copy_bandwidth_gbps(1 << 30)
    launched: list[Row] = []
    graphed: list[Row] = []
    sweep: list[Row] = []
    for shape in SHAPES:
        shape_launched, shape_graphed, shape_sweep = _bench_shape(*shape, dtype, kernels, args.split_sweep,
                                                                  args.config_sweep)
        launched += shape_launched
        graphed += shape_graphed
        sweep += shape_sweep
        torch.cuda.empty_cache()
    what = f"bytes = the cache each variant reads ({args.dtype} K+V, or int8 + fp32 scales)"
    print_table(f"int8_kv_cache decode, plain launches (host time between launches counts): {what}", launched,
                copy_gbps, peers=["sdpa", "eager"])
    print_table(f"int8_kv_cache decode, replayed from CUDA graphs (device time): {what}", graphed, copy_gbps,
                peers=["sdpa", "eager"])
    if sweep:
        print_table("int8 decode sweeps: per-token kernels by split length (tokens per program; each autotuned), "
                    "and the CUDA-core kernel by forced config (CUDA graphs)", sweep, copy_gbps, peers=[])
    return graphed


if __name__ == "__main__":
    main()
