"""Throughput: latency of every variant of a case, measured in interleaved rounds.

Variants are never timed against a number stored from another run. Each round times every variant
``reps`` times, in alternating order (A B C, then C B A, ...), so slow drifts of the machine (clock
boost, thermals, a neighbour process) hit all variants alike; the statistics work on per-round medians.

GPU, three timing modes (``throughput.mode``), each with the L2 cache overwritten before each call
(outside the timed region) so that a kernel is not flattered by inputs left in cache by its previous
repetition:

* ``events``: CUDA events around each call, ~1 ms of queued GPU work ahead of the start event so that
  host-side launch latency is not counted;
* ``cuda_graph``: each variant's call captured once in a CUDA graph after its warm-up (autotuning
  done), then replayed between the events: device time alone, what a kernel of a few microseconds
  needs, and what a model running under CUDA graphs sees;
* ``host``: ``time.perf_counter`` around the call while ~20 ms of queued GPU work keeps the launches
  asynchronous: the Python, dispatch and launch cost per call (a call that synchronises shows it).

CPU: ``time.perf_counter`` (every mode). Under the Triton interpreter the figures describe the interpreter, not the
kernel: records say so and reports mark them as not representative.

Timed calls are held to the answer the accuracy dimension checked: their inputs rotate over several
seeded sets (copied into fixed buffers outside the timed region), and the output of the last call of
a few rounds is checked against the float64 reference of its own input set (``Rotation``).
"""

from __future__ import annotations

import functools
import statistics
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch

from microscope.config import ThroughputConfig

L2_FLUSH_BYTES = 256 * 2**20  # larger than any current GPU's L2 (H100/H200: 50 MB)
#: GPU clock cycles of queued work ahead of each timed call (~1 ms at the H200's 1.98 GHz): the
#: host's launch work must fit under it, or the excess is timed as GPU time. 0.1 ms was too little
#: for the int8 KV-cache decode wrapper: its former host_cost.py measured 0.20-0.26 ms of Python and launch
#: work per call on the H200 machine (two launches, four TMA descriptors), and its bench once timed
#: the 0.27 ms kernel at 0.37 ms with plain back-to-back launches.
LAUNCH_COVER_CYCLES = 2_000_000
#: ~20 ms of queued GPU work in host mode: a call's launches queue behind it, so the call returns
#: after its host work alone (host costs are tens to hundreds of microseconds).
HOST_COVER_CYCLES = 40_000_000
TIMING_MODES = ("events", "cuda_graph", "host")
#: What each mode's milliseconds are, as the records' ``details.timer`` says.
TIMER_NAMES = {"events": "cuda_event", "cuda_graph": "cuda_graph_replay", "host": "host_perf_counter"}


@dataclass
class Timing:
    """Latency samples of one variant (milliseconds), and what was checked while it was timed."""

    rounds: list[float] = field(default_factory=list)  # per-round medians, in round order
    reps: int = 0  # timed calls per round (fewer than the config's under a round budget)
    samples: list[float] = field(default_factory=list)  # every timed call
    error: str | None = None
    #: (round, input set, problem or None) of every timed call whose output was checked
    checks: list[tuple[int, int, str | None]] = field(default_factory=list)
    #: GPU state read after each round (None where NVML does not answer)
    gpu: list[dict[str, Any] | None] = field(default_factory=list)

    @property
    def median_ms(self) -> float:
        return statistics.median(self.rounds)

    @property
    def iqr_rel(self) -> float:
        """Interquartile range of the per-call samples over their median (noise indicator)."""
        if len(self.samples) < 4:
            return 0.0
        q = statistics.quantiles(self.samples, n=4)
        med = statistics.median(self.samples)
        return (q[2] - q[0]) / med if med > 0 else 0.0

    @property
    def throttled_rounds(self) -> list[int]:
        """Rounds after which the GPU reported a slowdown reason (power cap, thermal, ...)."""
        return [r for r, state in enumerate(self.gpu) if state and state.get("throttle")]


class Timer:
    """Times one call of a thunk, in milliseconds, the right way for the device and timing mode."""

    def __init__(self, device: str, flush_l2: bool, mode: str = "events") -> None:
        if mode not in TIMING_MODES:
            raise ValueError(f"timing mode {mode!r}: one of {', '.join(TIMING_MODES)}")
        self.device = device
        self.mode = mode
        self._flush = None
        if device == "cuda":
            if flush_l2:
                self._flush = torch.empty(L2_FLUSH_BYTES // 4, dtype=torch.int32, device="cuda")
            self._start = torch.cuda.Event(enable_timing=True)
            self._end = torch.cuda.Event(enable_timing=True)

    def __call__(self, thunk: Callable[[], Any]) -> tuple[float, Any]:
        """(milliseconds, the call's return value)."""
        if self.device != "cuda":
            t0 = time.perf_counter()
            out = thunk()
            return (time.perf_counter() - t0) * 1e3, out
        if self._flush is not None:
            self._flush.zero_()
        if self.mode == "host":
            torch.cuda._sleep(HOST_COVER_CYCLES)
            t0 = time.perf_counter()
            out = thunk()
            seconds = time.perf_counter() - t0
            torch.cuda.synchronize()
            return seconds * 1e3, out
        if hasattr(torch.cuda, "_sleep"):
            # Keep the GPU busy while the CPU enqueues the start event and the call, so that a
            # variant's Python launch latency (autotuner dispatch, argument checks) is not timed as
            # GPU time: with one synchronisation per call nothing else hides it.
            torch.cuda._sleep(LAUNCH_COVER_CYCLES)
        self._start.record()
        out = thunk()
        self._end.record()
        self._end.synchronize()
        return self._start.elapsed_time(self._end), out


@dataclass
class Rotation:
    """Which input set each timed call sees, and the hooks that load and check it.

    ``load(name, k)`` copies input set ``k`` into the buffers variant ``name`` is called on (outside
    the timed region): the buffers keep their addresses while their contents change from call to
    call, so a variant that memoizes its first result, or skips work when it sees the same input
    pointers again, returns a stale answer. ``check(name, k, output)`` returns None when ``output`` is
    right for input set ``k``, else why not; it runs on the last call of ``check_rounds`` rounds.
    """

    n_sets: int = 1
    load: Callable[[str, int], None] | None = None
    check: Callable[[str, int, Any], str | None] | None = None
    check_rounds: int = 0

    def rounds_to_check(self, rounds: int) -> set[int]:
        """Evenly spread rounds, always including the last one."""
        n = min(self.check_rounds, rounds) if self.check is not None else 0
        if n <= 0:
            return set()
        if n == 1:
            return {rounds - 1}
        return {round(i * (rounds - 1) / (n - 1)) for i in range(n)}


@functools.cache
def _warm_up_stream(device: int) -> torch.cuda.Stream:
    """One side stream per GPU for every pre-capture call: cuBLAS keeps a workspace (32 MiB and more on
    Hopper) per stream it meets, for the life of the process, so a fresh stream per capture grows the
    memory a worker holds group after group."""
    return torch.cuda.Stream(device)


def graphed(thunk: Callable[[], Any]) -> Callable[[], Any]:
    """``thunk`` captured once in a CUDA graph: the returned callable replays it and returns the output
    of the capture (its buffers hold each replay's result). Raises what the capture raised."""
    side = _warm_up_stream(torch.cuda.current_device())
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):  # a call on a side stream before capture, as CUDA graphs require
        thunk()
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    try:
        with torch.cuda.graph(graph):
            out = thunk()
    except Exception:
        _end_rng_capture()
        raise
    torch.cuda.synchronize()

    def replay() -> Any:
        graph.replay()
        return out

    return replay


def _end_rng_capture() -> None:
    """After a failed capture, one trivial capture that succeeds. A capture that fails inside ends before
    torch takes the default CUDA generator out of capture mode, and from then on every random draw on the
    GPU raises ("Offset increment outside graph capture"); a complete capture takes it out again."""
    try:
        scratch = torch.zeros(1, device="cuda")
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            scratch.add_(1.0)
        torch.cuda.synchronize()
    except Exception:  # noqa: BLE001 - the capture's own error is the one to report
        pass


def interleaved(
    thunks: Mapping[str, Callable[[], Any]],
    cfg: ThroughputConfig,
    device: str,
    on_round: Callable[[int], None] | None = None,
    rotation: Rotation | None = None,
    gpu_state: Callable[[], dict[str, Any] | None] | None = None,
    on_variant: Callable[[str], None] | None = None,
    looks: Sequence[int] = (),
    stop: Callable[[dict[str, Timing]], bool] | None = None,
) -> dict[str, Timing]:
    """Warm every variant up, then time all of them in interleaved rounds.

    Call ``i`` of a round sees input set ``(round * reps + i) % n_sets`` for every variant, so the
    variants of a round stay paired. A variant that raises (during warm-up, capture or a round) keeps
    its error and drops out of later rounds; the others go on. ``on_variant(name)`` runs before each
    variant's warm-up and before its calls of each round, outside the timed region (the executor's
    "running now" marker). With ``stop``, after each number of completed rounds in ``looks`` the rounds
    end early where ``stop(results)`` says the verdicts are decided (sequential rounds); the last round
    before each look has its output checked, so a run that stops there still checked its last answer.
    """
    rot = rotation or Rotation()
    mode = cfg.mode if device == "cuda" else "events"
    timer = Timer(device, cfg.flush_l2, mode)
    results = {name: Timing() for name in thunks}
    calls_of = dict(thunks)
    mark = on_variant or (lambda name: None)

    def load(name: str, k: int) -> None:
        if rot.load is not None and rot.n_sets > 1:
            rot.load(name, k)

    for name, thunk in thunks.items():
        mark(name)
        try:
            for i in range(cfg.warmup):
                load(name, i % rot.n_sets)
                thunk()
            if device == "cuda":
                torch.cuda.synchronize()
        except Exception as exc:  # recorded as a failed trial by the runner
            results[name].error = f"{type(exc).__name__}: {exc}"
            continue
        if mode == "cuda_graph":
            try:
                calls_of[name] = graphed(thunk)
            except Exception as exc:
                results[name].error = (f"cannot be captured in a CUDA graph ({type(exc).__name__}: {exc}); "
                                       "time it with throughput.mode: events")
                continue
        results[name].reps = cfg.reps
        if cfg.round_budget_ms > 0:
            try:
                ms, _ = timer(calls_of[name])  # one more warm call, timed: what a call costs
            except Exception as exc:
                results[name].error = f"{type(exc).__name__}: {exc}"
                continue
            results[name].reps = max(1, min(cfg.reps, int(cfg.round_budget_ms // max(ms, 1e-6))))
    order = [n for n in thunks if results[n].error is None]
    checked = rot.rounds_to_check(cfg.rounds)
    if stop is not None and rot.check is not None:
        checked |= {n - 1 for n in looks if 0 < n <= cfg.rounds}
    for r in range(cfg.rounds):
        for name in order if r % 2 == 0 else reversed(order):
            timing = results[name]
            if timing.error is not None:
                continue
            mark(name)
            calls: list[float] = []
            try:
                for i in range(timing.reps):  # call i sees the same input set in every variant
                    k = (r * cfg.reps + i) % rot.n_sets
                    load(name, k)
                    ms, out = timer(calls_of[name])
                    calls.append(ms)
                if r in checked and rot.check is not None:
                    timing.checks.append((r, k, rot.check(name, k, out)))
            except Exception as exc:
                timing.error = f"{type(exc).__name__}: {exc}"
                continue
            timing.samples.extend(calls)
            timing.rounds.append(statistics.median(calls))
        state = gpu_state() if gpu_state is not None else None
        for name in order:
            results[name].gpu.append(state)
        if on_round is not None:
            on_round(r)
        if stop is not None and r + 1 in looks and r + 1 < cfg.rounds and stop(results):
            break
    return results
