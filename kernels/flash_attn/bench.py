"""GPU benchmark of the Triton flash-attention kernel against the attention a user would pick instead.

Run on a CUDA machine (the repository installed)::

    python -m microscope_kernels.flash_attn.bench            # everything: checks, timings, table
    python -m microscope_kernels.flash_attn.bench --dtypes bf16 --variants triton,sdpa_cudnn --ab-tma

One process measures every variant side by side, in this order:

1. the environment (GPU, torch, triton, CUDA, date) and a bf16 matmul ceiling;
2. the Triton autotuning candidates are compiled in parallel worker processes first: the autotuner then
   finds them in Triton's on-disk cache instead of compiling a few hundred kernels one after another;
3. correctness of every variant against float64 eager attention on small slices (odd lengths, causal,
   Sq != Sk, gradients included), judged against the error of eager attention in the same dtype;
4. ``triton.testing.do_bench`` medians for the anchor shapes (``../shared/ANCHORS.md``), forward and
   forward+backward, as TFLOP/s: 4*B*H*Sq*Sk*D per forward, halved when causal, 3.5x for forward+backward;
5. the configuration the autotuner chose per shape, then a compact table (printed last).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import multiprocessing
import os
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

import torch
import triton
from triton.testing import do_bench

from microscope.api import DTYPES

from . import kernel
from .kernel import SUPPORTED_HEAD_DIMS, flash_attention
from .peers import PEERS
from .reference import eager_attention

#: Relative-error floor per dtype (half an ulp at 1.0): a variant passes with error <= 4x eager's + floor.
FLOOR = {torch.float32: 6e-8, torch.float16: 5e-4, torch.bfloat16: 4e-3}
REF_FACTOR = 4.0
#: Contenders that compile a kernel per shape, dtype and direction: measured last, on leftover time.
SLOW = {"flex"}


@dataclass(frozen=True)
class Shape:
    """One attention problem: (B, H, Sq, D) queries against (B, H, Sk, D) keys and values."""

    b: int
    h: int
    sq: int
    sk: int
    d: int
    causal: bool

    @property
    def label(self) -> str:
        seq = f"S{self.sq}" if self.sq == self.sk else f"Sq{self.sq} Sk{self.sk}"
        return f"B{self.b} H{self.h} {seq} D{self.d}{' causal' if self.causal else ''}"

    def flops(self, backward: bool) -> float:
        fwd = 4.0 * self.b * self.h * self.sq * self.sk * self.d * (0.5 if self.causal else 1.0)
        return fwd * (3.5 if backward else 1.0)


#: The anchor shapes and whether forward+backward is timed for them too.
ANCHORS: list[tuple[Shape, bool]] = [
    (Shape(8, 16, 1024, 1024, 128, False), False),
    (Shape(4, 16, 4096, 4096, 128, False), True),
    (Shape(4, 16, 4096, 4096, 128, True), True),
    (Shape(1, 16, 16384, 16384, 128, False), False),
    (Shape(4, 32, 4096, 4096, 64, False), False),
]
#: Correctness slices: odd lengths (tails), chunked prefill (Sq < Sk), Sq > Sk causal, one-query decode.
CHECKS: list[tuple[Shape, tuple[str, ...]]] = [
    (Shape(1, 2, 1000, 1000, 128, False), ("bf16", "fp16", "fp32")),
    (Shape(1, 2, 1000, 1000, 128, True), ("bf16", "fp16", "fp32")),
    (Shape(1, 2, 300, 1000, 128, True), ("bf16",)),
    (Shape(1, 2, 1000, 300, 128, True), ("bf16",)),
    (Shape(1, 2, 1000, 1000, 64, False), ("bf16", "fp16", "fp32")),
    (Shape(1, 2, 1, 777, 64, True), ("bf16",)),
    (Shape(1, 2, 1000, 1000, 32, False), ("bf16",)),
    (Shape(1, 2, 1000, 1000, 256, True), ("bf16",)),
]


@dataclass(frozen=True)
class Variant:
    """A contender: its function, when it cannot run, and environment it needs (e.g. a forced load path)."""

    name: str
    fn: Callable[..., torch.Tensor]
    supports: Callable[[Shape, torch.dtype], str | None]
    env: dict[str, str] = field(default_factory=dict)


def _triton_supports(shape: Shape, dtype: torch.dtype) -> str | None:
    return None if shape.d in SUPPORTED_HEAD_DIMS else f"head dim {shape.d} not in {SUPPORTED_HEAD_DIMS}"


def _peer_variant(name: str) -> Variant:
    peer = PEERS[name]

    def supports(shape: Shape, dtype: torch.dtype) -> str | None:
        q_shape, k_shape = (shape.b, shape.h, shape.sq, shape.d), (shape.b, shape.h, shape.sk, shape.d)
        return peer.supports(q_shape, k_shape, dtype, "cuda", shape.causal)

    return Variant(name, peer.fn, supports)


def variants(names: list[str], ab_tma: bool) -> list[Variant]:
    """The contenders in report order; ``ab_tma`` adds the Triton kernel forced onto pointer loads."""
    chosen = [Variant("triton", flash_attention, _triton_supports)]
    if ab_tma:
        chosen.append(Variant("triton_ptr", flash_attention, _triton_supports, {"MICROSCOPE_FLASH_TMA": "0"}))
    return chosen + [_peer_variant(n) for n in names if n != "triton"]


@contextlib.contextmanager
def _environ(env: dict[str, str]) -> Iterator[None]:
    saved = {key: os.environ.get(key) for key in env}
    os.environ.update(env)
    try:
        yield
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value


# ----------------------------------------------------------------------------------------------------------
# 1. environment
# ----------------------------------------------------------------------------------------------------------


def environment() -> dict[str, str]:
    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": f"{props.name} ({props.multi_processor_count} SMs, cc {props.major}.{props.minor})",
        "torch": torch.__version__,
        "triton": triton.__version__,
        "cuda": str(torch.version.cuda),
        "cudnn": str(torch.backends.cudnn.version()),
        "date": datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
    }


def matmul_ceiling() -> float:
    """bf16 8192^3 matmul TFLOP/s: the tensor-core roof the attention numbers are read against."""
    a = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    b = torch.randn(8192, 8192, device="cuda", dtype=torch.bfloat16)
    ms = do_bench(lambda: a @ b, warmup=25, rep=100, return_mode="median")
    return 2 * 8192**3 / ms / 1e9


# ----------------------------------------------------------------------------------------------------------
# 2. parallel precompilation
# ----------------------------------------------------------------------------------------------------------


def _precompile_task(combos: list[tuple], shard: tuple[int, int]) -> list[tuple[str, str, str]]:
    """Worker: compile and run once (small) its shard of the candidates of every combo (see ``_combos``)."""
    failures = []
    for dtype_name, head_dim, causal, whole_tiles, backward, env in combos:
        with _environ(dict(env)):
            q, k = _compile_probe(dtype_name, head_dim, whole_tiles)
            failures += kernel.precompile(q, k, causal, backward, shard=shard, launch=True)
    return failures


def _compile_probe(dtype_name: str, head_dim: int, whole_tiles: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Small q, k whose lengths are (or are not) a whole number of tiles: that selects the kernel variant."""
    n = 128 if whole_tiles else 127
    q = torch.zeros(1, 2, n, head_dim, device="cuda", dtype=DTYPES[dtype_name])
    return q, torch.zeros_like(q)


def precompile_all(combos: set[tuple], workers: int, timeout: float) -> list[tuple[str, str, str]]:
    """Compile and smoke-run every candidate of every combo on ``workers`` processes; returns failures.

    Raises ``multiprocessing.TimeoutError`` (after killing the workers, which frees the GPU of anything
    hung) when the whole does not finish within ``timeout`` seconds: a hang, or a worker that died.
    """
    # One task per worker (its shard of every combo): a fault in a candidate cannot spill into another task.
    tasks = [(sorted(combos), (i, workers)) for i in range(workers)]
    pool = multiprocessing.get_context("spawn").Pool(workers)
    try:
        results = pool.starmap_async(_precompile_task, tasks).get(timeout)
        return [failure for result in results for failure in result]
    finally:
        pool.terminate()
        pool.join()


def _robust_precompile(combos: set, workers: int) -> None:
    """Precompile; if workers hang or die, retry without warp specialization, then without LAZY either."""
    for disable in ("", "WARP_SPEC", "WARP_SPEC,LAZY"):
        os.environ["MICROSCOPE_FLASH_NO"] = disable
        with_env = {(*combo[:-1], tuple(sorted({**dict(combo[-1]), "MICROSCOPE_FLASH_NO": disable}.items())))
                    for combo in combos}
        started = time.monotonic()
        try:
            failures = precompile_all(with_env, workers, timeout=170)
        except multiprocessing.TimeoutError:
            print(f"precompile: workers hung or died (disabled: {disable or 'none'}); retrying with fewer "
                  "candidate features", flush=True)
            continue
        for kernel_name, config, error in failures:
            print(f"precompile: candidate failed: {kernel_name} {config}: {error}")
            kernel.skip_candidate(kernel_name, config)  # never re-run here: a fault would poison this context
        elapsed = time.monotonic() - started
        print(f"precompile: {len(with_env)} combos on {workers} workers in {elapsed:.0f} s, {len(failures)} "
              f"failures, disabled features: {disable or 'none'}", flush=True)
        return
    sys.exit("precompile: workers hang or die even without WARP_SPEC and LAZY candidates; giving up")


# ----------------------------------------------------------------------------------------------------------
# 3. correctness
# ----------------------------------------------------------------------------------------------------------


def _rel(x: torch.Tensor, ref: torch.Tensor) -> float:
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def _fwd_bwd(fn: Callable, inputs: tuple[torch.Tensor, ...], do: torch.Tensor,
             causal: bool) -> list[torch.Tensor]:
    leaves = [t.detach().clone().requires_grad_() for t in inputs]
    out = fn(*leaves, causal=causal)
    out.backward(do)
    return [out.detach()] + [t.grad for t in leaves]


def check(shape: Shape, dtype: torch.dtype, contenders: list[Variant], gen: torch.Generator) -> list[dict]:
    """Errors of out, dq, dk, dv vs float64 eager, for each contender and for eager in ``dtype``."""
    # The float64 reference sees the same (rounded) inputs as the variants: only the arithmetic differs.
    q, k, v, do = (torch.randn(shape.b, shape.h, s, shape.d, generator=gen, device="cuda", dtype=dtype)
                   for s in (shape.sq, shape.sk, shape.sk, shape.sq))
    low = (q, k, v)
    ref = _fwd_bwd(eager_attention, tuple(t.double() for t in low), do.double(), shape.causal)
    eager = [_rel(x, r) for x, r in zip(_fwd_bwd(eager_attention, low, do, shape.causal), ref)]
    rows = []
    for variant in contenders:
        reason = variant.supports(shape, dtype)
        row = {"shape": shape.label, "dtype": str(dtype).replace("torch.", ""), "variant": variant.name,
               "eager": eager}
        if reason is None:
            with _environ(variant.env):
                got = _fwd_bwd(variant.fn, low, do, shape.causal)
            errs = [_rel(x, r) for x, r in zip(got, ref)]
            row["errors"] = errs
            row["ok"] = all(e <= REF_FACTOR * g + FLOOR[dtype] for e, g in zip(errs, eager))
        else:
            row["skip"] = reason
        rows.append(row)
    return rows


def _print_check(row: dict) -> None:
    head = f"{row['shape']:<26} {row['dtype']:<9} {row['variant']:<15}"
    if "skip" in row:
        print(f"{head} n/a: {row['skip']}")
        return
    errs = " ".join(f"{e:.1e}" for e in row["errors"])
    eager = " ".join(f"{e:.1e}" for e in row["eager"])
    print(f"{head} out/dq/dk/dv {errs}  (eager {eager})  {'OK' if row['ok'] else 'FAIL'}", flush=True)


# ----------------------------------------------------------------------------------------------------------
# 4. timing
# ----------------------------------------------------------------------------------------------------------


def time_ms(variant: Variant, shape: Shape, dtype: torch.dtype, backward: bool) -> float:
    """Median ms of one forward (or forward+backward) call, after a warm-up call that compiles and tunes."""
    q, k, v = (torch.randn(shape.b, shape.h, s, shape.d, device="cuda", dtype=dtype, requires_grad=backward)
               for s in (shape.sq, shape.sk, shape.sk))
    if backward:
        do = torch.randn_like(q)
        call = lambda: variant.fn(q, k, v, causal=shape.causal).backward(do)  # noqa: E731
    else:
        call = lambda: variant.fn(q, k, v, causal=shape.causal)  # noqa: E731
    with _environ(variant.env):
        call()
        torch.cuda.synchronize()
        return do_bench(call, warmup=25, rep=100, grad_to_none=[q, k, v] if backward else None,
                        return_mode="median")


def _report_tuning(seen: dict[str, set], quiet: bool = False) -> None:
    """Print what the autotuners chose since the last call, with every candidate's time for that key."""
    for name, tuner in kernel.TUNERS.items():
        for key, cfg in tuner.cache.items():
            if key in seen.setdefault(name, set()):
                continue
            seen[name].add(key)
            if quiet:
                continue
            print(f"  autotune {name} key={key} -> {cfg}")
            timings = getattr(tuner, "configs_timings", None) or {}
            ranked = sorted(timings.items(), key=lambda item: _first(item[1]))
            for cand, t in ranked[:8]:
                print(f"      {_first(t) * 1e3:9.1f} us  {cand}")


def _first(timing) -> float:
    return timing[0] if isinstance(timing, (list, tuple)) else float(timing)


# ----------------------------------------------------------------------------------------------------------
# 5. driver
# ----------------------------------------------------------------------------------------------------------


def _whole_tiles(shape: Shape) -> bool:
    """Whether the kernels compile their single-loop variant for this shape (see kernel.UNMASKED)."""
    return shape.sk % 128 == 0 and not shape.causal


def _combos(dtypes: list[str], ab_tma: bool) -> set[tuple]:
    """(dtype, head dim, causal, whole key tiles, backward, env): every kernel variant the run will need."""
    combos = set()
    for shape, check_dtypes in CHECKS:
        for dt in check_dtypes:
            combos.add((dt, shape.d, shape.causal, _whole_tiles(shape), True, ()))
    for shape, backward in ANCHORS:
        for dt in dtypes:
            combos.add((dt, shape.d, shape.causal, _whole_tiles(shape), backward, ()))
            if ab_tma:
                pointers = (("MICROSCOPE_FLASH_TMA", "0"),)
                combos.add((dt, shape.d, shape.causal, _whole_tiles(shape), backward, pointers))
    # A combo timed forward-only is covered by the same combo with its backward.
    return {c for c in combos if c[4] or (*c[:4], True, c[5]) not in combos}


def _table(results: list[dict], names: list[str]) -> None:
    cols = names + ["tri/cudnn", "tri/flash"]
    print("\nTFLOP/s (do_bench median; fwd = 4*B*H*Sq*Sk*D, /2 causal, fwd+bwd = 3.5x fwd)")
    print(f"{'shape':<26} {'mode':<8} {'dtype':<6} " + " ".join(f"{c:>14}" for c in cols))
    for row in results:
        tf = row["tflops"]
        cells = [f"{tf[n]:14.1f}" if isinstance(tf.get(n), float) else f"{str(tf.get(n)).split(':')[0]:>14}"
                 for n in names]
        for peer in ("sdpa_cudnn", "sdpa_flash"):
            ok = isinstance(tf.get("triton"), float) and isinstance(tf.get(peer), float)
            cells.append(f"{tf['triton'] / tf[peer]:13.2f}x" if ok else f"{'-':>14}")
        print(f"{row['shape']:<26} {row['mode']:<8} {row['dtype']:<6} " + " ".join(cells))


def run_checks(contenders: list[Variant], checks: list[tuple[Shape, tuple[str, ...]]],
               gen: torch.Generator) -> list[dict]:
    rows = []
    for shape, check_dtypes in checks:
        for dt in check_dtypes:
            for row in check(shape, DTYPES[dt], contenders, gen):
                _print_check(row)
                rows.append(row)
    return rows


def _rows(dtypes: list[str]) -> list[tuple[Shape, bool, str]]:
    return [(shape, backward, dt) for shape, with_backward in ANCHORS
            for backward in ((False, True) if with_backward else (False,)) for dt in dtypes]


def run_timings(contenders: list[Variant], rows: list[tuple[Shape, bool, str]], results: dict,
                seen: dict[str, set], deadline: float) -> None:
    """TFLOP/s of ``contenders`` on ``rows``, into ``results[(label, mode, dtype)]``. A measurement that would
    start within its warm-up allowance of ``deadline`` (time.monotonic) is skipped: the table still prints
    inside a time limit."""
    for shape, backward, dt in rows:
        mode = "fwd+bwd" if backward else "fwd"
        row = results.setdefault((shape.label, mode, dt), {"shape": shape.label, "mode": mode, "dtype": dt,
                                                          "tflops": {}})
        for variant in contenders:
            value = row["tflops"][variant.name] = _tflops(variant, shape, DTYPES[dt], backward, deadline)
            print(f"{shape.label:<26} {mode:<8} {dt:<5} {variant.name:<15} {value}", flush=True)
            if variant.name.startswith("triton"):
                _report_tuning(seen)


def measure(contenders: list[Variant], dtypes: list[str], with_checks: bool,
            deadline: float) -> tuple[list[dict], list[dict]]:
    """Correctness rows, then one timing row per anchor row, mode and dtype.

    Peers that compile per shape and dtype (flex: tens of seconds each) go last, on leftover time: checked
    on the chunked-prefill slice only, and timed bf16 rows first. The pointer-load A/B variant is timed
    only: its correctness is the interpreter tests' business.
    """
    seen: dict[str, set] = {}
    gen = torch.Generator(device="cuda").manual_seed(0)
    slow = [v for v in contenders if v.name in SLOW]
    fast = [v for v in contenders if v.name not in SLOW]
    checks: list[dict] = []
    if with_checks:
        print("\ncorrectness vs float64 eager (rel. L2 error; pass: <= 4x eager's own error + floor)")
        checks += run_checks([v for v in fast if not v.env], CHECKS, gen)
    _report_tuning(seen, quiet=True)  # the small check shapes' choices are not the timed ones
    print("\ntimings")
    by_row: dict = {}
    run_timings(fast, _rows(dtypes), by_row, seen, deadline)
    if slow and time.monotonic() + 120 < deadline:
        if with_checks:
            checks += run_checks(slow, [(Shape(1, 2, 300, 1000, 128, True), ("bf16",))], gen)
        run_timings(slow, sorted(_rows(dtypes), key=lambda r: dtypes.index(r[2])), by_row, seen, deadline)
    results = [by_row[(shape.label, "fwd+bwd" if bwd else "fwd", dt)] for shape, bwd, dt in _rows(dtypes)]
    for row in results:
        for variant in contenders:
            row["tflops"].setdefault(variant.name, "skipped: time budget")
    return checks, results


def _tflops(variant: Variant, shape: Shape, dtype: torch.dtype, backward: bool,
            deadline: float) -> float | str:
    reason = variant.supports(shape, dtype)
    if reason is not None:
        return f"n/a: {reason}"
    # flex compiles a kernel per shape and direction: allow it a minute of compilation.
    if time.monotonic() + (60.0 if variant.name == "flex" else 10.0) > deadline:
        return "skipped: time budget"
    try:
        return shape.flops(backward) / time_ms(variant, shape, dtype, backward) / 1e9
    except Exception as exc:  # noqa: BLE001 - a failing peer is reported, not fatal
        return f"error: {type(exc).__name__}: {str(exc)[:160]}"


def _dump_compiled(path: str) -> None:
    """One JSON line per compiled Triton kernel: its cache key (constexprs, warps, stages), registers, spills,
    shared memory, and whether the PTX uses wgmma, TMA bulk copies and setmaxnreg (warp specialization)."""
    with open(path, "w") as f:
        for name, tuner in kernel.TUNERS.items():
            for device_cache in getattr(tuner.fn, "device_caches", {}).values():
                for key, compiled in device_cache[0].items():
                    ptx = compiled.asm.get("ptx", "") if hasattr(compiled, "asm") else ""
                    facts = {"kernel": name, "key": str(key)[:600],
                             "shared": getattr(compiled.metadata, "shared", None),
                             "n_regs": getattr(compiled, "n_regs", None),
                             "n_spills": getattr(compiled, "n_spills", None),
                             "wgmma": "wgmma" in ptx, "tma": "cp.async.bulk.tensor" in ptx,
                             "setmaxnreg": "setmaxnreg" in ptx}
                    f.write(json.dumps(facts, default=str) + "\n")


def _write_json(path: str, env: dict, checks: list[dict], results: list[dict]) -> None:
    tuned = {name: {str(key): cfg for key, cfg in by_key.items()}
             for name, by_key in kernel.tuned_configs().items()}
    with open(path, "w") as f:
        json.dump({"env": env, "checks": checks, "results": results, "tuned": tuned}, f, indent=1)


def _parse(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--dtypes", default="bf16,fp16", help="timed dtypes (checks add fp32)")
    parser.add_argument("--variants", default="triton,sdpa_flash,sdpa_cudnn,sdpa_efficient,flex",
                        help="comma list among triton and " + ", ".join(PEERS))
    parser.add_argument("--ab-tma", action="store_true", help="also time the Triton kernel on pointer loads")
    parser.add_argument("--no-check", action="store_true", help="skip the float64 correctness checks")
    parser.add_argument("--workers", type=int, default=min(16, os.cpu_count() or 1), help="compile processes")
    parser.add_argument("--json", help="also write every number to this file")
    parser.add_argument("--kernels", help="write facts about every compiled Triton kernel to this file")
    parser.add_argument("--time-budget", type=float, default=float("inf"),
                        help="seconds for the run: later measurements are skipped, the table still prints")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = _parse(argv)
    deadline = time.monotonic() + args.time_budget
    if not torch.cuda.is_available():
        print("bench: needs a CUDA GPU")
        return 2
    dtypes = args.dtypes.split(",")
    contenders = variants(args.variants.split(","), args.ab_tma)

    env = environment()
    env["bf16 matmul 8192^3 TFLOP/s"] = f"{matmul_ceiling():.0f}"
    for key, value in env.items():
        print(f"{key}: {value}", flush=True)

    _robust_precompile(_combos(dtypes, args.ab_tma), args.workers)
    checks, results = measure(contenders, dtypes, not args.no_check, deadline)

    failed = [c for c in checks if c.get("ok") is False]
    print(f"\ncorrectness: {len(checks) - len(failed)} of {len(checks)} rows pass or n/a"
          + "".join(f"\n  FAIL {c['shape']} {c['dtype']} {c['variant']}" for c in failed))
    if args.json:
        _write_json(args.json, env, checks, results)
    if args.kernels:
        try:
            _dump_compiled(args.kernels)
        except Exception as exc:  # noqa: BLE001 - diagnostics only; Triton internals differ across versions
            print(f"kernel facts unavailable: {type(exc).__name__}: {exc}")
    print("\n" + " | ".join(f"{k} {v}" for k, v in env.items()))
    _table(results, [v.name for v in contenders])
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
