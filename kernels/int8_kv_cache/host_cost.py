"""Host time per decode call (``python -m microscope_kernels.int8_kv_cache.host_cost``, GPU).

Why: a decode step's device time at B16 H32 T8192 is ~0.27 ms, so a wrapper whose Python and launch
work takes longer than that makes the step host-bound however fast the kernel is. This measures the
host side alone: the GPU is first given a long sleep kernel, so every launch below only queues and
the wall clock sees pure host work. Prints microseconds per call (median of interleaved batches)
for SDPA, the bf16-cache Triton kernel and the int8 kernels (autotuned and forced config), each
through Triton's own dispatch and through ``direct_launch``, and a cProfile of the int8 call both
ways, so the cost is pinned to functions rather than inferred.
"""

from __future__ import annotations

import argparse
import cProfile
import functools
import pstats
import statistics
import time
from collections.abc import Callable, Sequence

import torch
from microscope_kernels import direct_launch
from microscope_kernels.int8_kv_cache.kernel import decode_attention, int8_decode_attention, quantize_kv
from microscope_kernels.int8_kv_cache.reference import sdpa_decode_attention
from microscope_kernels.safe_softmax.bench import gpu_header

#: Calls per batch: few enough that their launches fit the GPU's launch queue behind the sleep.
CALLS = 100
#: GPU cycles of sleep ahead of each batch: ~0.1 s at H200 clocks, longer than any batch's host work.
COVER_CYCLES = 200_000_000


def batch_us_per_call(fn: Callable[[], object]) -> float:
    """Wall-clock microseconds per call over CALLS calls queued behind a GPU sleep."""
    torch.cuda._sleep(COVER_CYCLES)
    start = time.perf_counter()
    for _ in range(CALLS):
        fn()
    elapsed = time.perf_counter() - start
    torch.cuda.synchronize()
    return elapsed / CALLS * 1e6


def interleaved_host_us(thunks: dict[str, Callable[[], object]], rounds: int
                        ) -> dict[tuple[str, bool], list[float]]:
    """Per (call, direct launch on?) the us per call of each round's batch. Every round runs every
    call both ways in turn, so a drift in the host's speed (the H200 machine's figures moved by 20% and
    more between runs) moves both sides of the comparison alike."""
    for fn in thunks.values():
        fn()
    torch.cuda.synchronize()
    samples: dict[tuple[str, bool], list[float]] = {}
    for _ in range(rounds):
        for direct in (False, True):
            direct_launch.ENABLED = direct
            for name, fn in thunks.items():
                samples.setdefault((name, direct), []).append(batch_us_per_call(fn))
    direct_launch.ENABLED = True
    return samples


def profile_calls(fn: Callable[[], object], top: int) -> None:
    """cProfile of CALLS covered calls, the ``top`` functions by own time."""
    torch.cuda._sleep(COVER_CYCLES)
    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(CALLS):
        fn()
    profiler.disable()
    torch.cuda.synchronize()
    pstats.Stats(profiler).sort_stats("tottime").print_stats(top)


def print_host_table(results: dict[tuple[str, bool], list[float]], rounds: int) -> None:
    """us per call of each call both ways (median, min-max over the rounds) and the share saved."""
    print(f"== host us per call: median (min-max) over {rounds} interleaved rounds of {CALLS} calls, "
          "GPU busy throughout")
    print(f"   {'call':32s} {'Triton dispatch':>22s} {'direct launch':>22s} {'saved':>7s}")
    for name in dict.fromkeys(name for name, _ in results):
        cells = [f"{statistics.median(v):6.1f} ({min(v):.0f}-{max(v):.0f})" for v in
                 (results[name, False], results[name, True])]
        saved = 1 - statistics.median(results[name, True]) / statistics.median(results[name, False])
        print(f"   {name:32s} {cells[0]:>22s} {cells[1]:>22s} {saved:7.0%}")


def _cache_shape(text: str) -> tuple[int, int, int, int]:
    try:
        b, h, t, d = (int(x) for x in text.split(","))
    except ValueError:
        expected = "four integers B,H,T,D such as 16,32,8192,128"
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}") from None
    return b, h, t, d


def main(argv: Sequence[str] | None = None) -> dict[tuple[str, bool], list[float]]:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--shape", type=_cache_shape, default=(16, 32, 8192, 128),
                        help="B,H,T,D of the cache (default: the T8192 target)")
    parser.add_argument("--top", type=int, default=25, help="functions to list in the profile")
    parser.add_argument("--rounds", type=int, default=11, help="interleaved rounds per call and launch path")
    args = parser.parse_args(argv)
    b, h, t, d = args.shape
    gpu_header(f"int8_kv_cache host cost per decode call, B{b} H{h} T{t} D{d}")
    gen = torch.Generator(device="cuda").manual_seed(0)
    q, k, v = (torch.randn(*shape, device="cuda", dtype=torch.bfloat16, generator=gen)
               for shape in ((b, h, d), (b, h, t, d), (b, h, t, d)))
    thunks: dict[str, Callable[[], object]] = {
        "sdpa": functools.partial(sdpa_decode_attention, q, k, v),
        "triton_bf16cache": functools.partial(decode_attention, q, k, v),
    }
    for granularity in ("token", "channel"):
        (k_q, k_s), (v_q, v_s) = quantize_kv(k, granularity), quantize_kv(v, granularity)
        call = functools.partial(int8_decode_attention, q, k_q, k_s, v_q, v_s, granularity)
        thunks[f"int8_{granularity}"] = call
        thunks[f"int8_{granularity} forced config"] = functools.partial(call, stages=3)
    results = interleaved_host_us(thunks, args.rounds)
    for direct in (False, True):
        direct_launch.ENABLED = direct
        print(f"\n== cProfile of int8_token (autotuned), {'direct launches' if direct else 'Triton dispatch'}, "
              "by own time")
        profile_calls(thunks["int8_token"], args.top)
    direct_launch.ENABLED = True
    print_host_table(results, args.rounds)
    return results


if __name__ == "__main__":
    main()
