"""Compile a plugin's GPU kernels for every case (or model-level arm) of a run in parallel processes first.

A Triton room autotunes over many candidates, and compiling each one is most of a first call's cost: one
after another inside the first accuracy check of each case, it takes longer than all the measuring. A
plugin that defines ``Ablation.precompile`` gets its candidates split into shards, one per process, all
compiled side by side into Triton's on-disk cache; the run's own process then finds every binary there
and only benchmarks them. A model-level run does the same through ``Ablation.precompile_model``, per arm,
before its first seed trains. Failures here never stop a run: whatever did not compile compiles on first use.
"""

from __future__ import annotations

import multiprocessing
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from microscope.api import Ablation, Case, ModelShapes

#: ``MICROSCOPE_PRECOMPILE_WORKERS=0`` turns the step off; a number sets the processes (default: one per CPU, <= 16).
WORKERS_ENV = "MICROSCOPE_PRECOMPILE_WORKERS"
#: A shard that has not finished by then is abandoned (the run compiles the rest itself).
TIMEOUT_S = 300.0


@dataclass
class PrecompileReport:
    """What the step did: processes, wall time, the slowest process's start-up (interpreter, imports, plugin)
    and compiling seconds, and each failure as one line."""

    workers: int = 0
    seconds: float = 0.0
    errors: list[str] = field(default_factory=list)
    slowest: tuple[float, float] | None = None
    of: str = "case"  # what the shards cover: every case, or every arm of a model-level run

    def summary(self) -> str:
        text = f"precompiled the GPU kernels of every {self.of} in {self.workers} processes, {self.seconds:.1f} s"
        if self.slowest is not None:
            text += f" (slowest process: {self.slowest[0]:.1f} s start-up, {self.slowest[1]:.1f} s compiling)"
        return text + (f"; {len(self.errors)} problem(s): {self.errors[0]}" if self.errors else "")


def defines_precompile(plugin: Ablation) -> bool:
    """Whether the plugin overrides ``Ablation.precompile`` (the default compiles nothing)."""
    return type(plugin).precompile is not Ablation.precompile


def defines_precompile_model(plugin: Ablation) -> bool:
    """Whether the plugin overrides ``Ablation.precompile_model`` (the default compiles nothing)."""
    return type(plugin).precompile_model is not Ablation.precompile_model


def worker_count(cases: int) -> int:
    """Processes to use: the environment's choice, else one per CPU (at most 16): the run's own process and
    its worker wait meanwhile, and a room with two compiled warm-ups per case (flash_attn: 8 cases, 16
    warm-ups) then has one per process."""
    chosen = os.environ.get(WORKERS_ENV, "").strip()
    if chosen:
        try:
            return max(0, int(chosen))
        except ValueError:
            return 0
    return max(0, min(16, os.cpu_count() or 1)) if cases else 0


def precompile(plugin: Ablation, cases: Sequence[Case], device: str, backward: bool) -> PrecompileReport | None:
    """Run ``plugin.precompile`` for every case, shard ``i`` of ``n`` in process ``i``; None if skipped."""
    workers = worker_count(len(cases))
    if not cases or workers < 1 or not defines_precompile(plugin):
        return None
    params = [c.params for c in cases]
    return _in_processes(plugin, workers, "case", _shard, lambda shard: (params, device, shard, backward))


def precompile_model(plugin: Ablation, arms: Sequence[tuple[str, ModelShapes]], device: str) -> PrecompileReport | None:
    """Run ``plugin.precompile_model`` for every arm, shard ``i`` of ``n`` in process ``i``; None if skipped."""
    workers = worker_count(len(arms))
    if not arms or workers < 1 or not defines_precompile_model(plugin):
        return None
    return _in_processes(plugin, workers, "arm", _model_shard, lambda shard: (list(arms), device, shard))


def _in_processes(plugin: Ablation, workers: int, of: str, job: Callable[..., tuple[list[str], float, float]],
                  arguments: Callable[[tuple[int, int]], tuple]) -> PrecompileReport:
    """``job(plugin name, plugin source, *arguments(shard))`` for every shard, each in its own fresh process."""
    start = time.perf_counter()
    source = _plugin_source(plugin)
    report = PrecompileReport(workers=workers, of=of)
    context = multiprocessing.get_context("spawn")  # a fresh interpreter: no CUDA state inherited
    started = time.time()  # wall clock: the processes stamp their own progress with it
    pool = context.Pool(workers)
    try:
        jobs = [pool.apply_async(job, (plugin.name, source, *arguments((i, workers)))) for i in range(workers)]
        deadline = time.monotonic() + TIMEOUT_S
        for pending in jobs:
            errors, loaded, done = pending.get(timeout=max(0.0, deadline - time.monotonic()))
            report.errors.extend(errors)
            if report.slowest is None or done - started > sum(report.slowest):
                report.slowest = (loaded - started, done - loaded)
    except multiprocessing.TimeoutError:
        report.errors.append(f"a shard took longer than {TIMEOUT_S:.0f} s; the run compiles the rest itself")
    except Exception as exc:  # noqa: BLE001 - a broken pool must not stop the run
        report.errors.append(f"{type(exc).__name__}: {exc}")
    finally:
        pool.terminate()  # no compile may go on beside the timed calls
        pool.join()
    report.seconds = time.perf_counter() - start
    return report


def _plugin_source(plugin: Ablation) -> str | None:
    """The file to import for an outside plugin; None for a built-in room (the registry finds it by name)."""
    import inspect

    module = type(plugin).__module__
    if module.startswith("microscope_kernels."):
        return None
    try:
        return inspect.getfile(type(plugin))
    except (TypeError, OSError):
        return None


def case_shard(process: int, count: int, case_index: int) -> tuple[int, int]:
    """The shard process ``process`` compiles of case ``case_index``: turned by the case, so that each case's
    shard 0 (and its first candidates) falls in a different process."""
    return (process - case_index) % count, count


def _shard(name: str, source: str | None, cases: list[dict], device: str, shard: tuple[int, int],
           backward: bool) -> tuple[list[str], float, float]:
    """In a pool process: this shard of every case's candidates; returns one line per failure, and the wall
    clock once the plugin was loaded and once everything compiled."""
    from microscope import registry

    plugin = registry.get(name, (source,) if source else ())
    loaded = time.time()
    errors = []
    for index, params in enumerate(cases):
        case = Case.of(**params)
        try:
            plugin.precompile(case, device, case_shard(shard[0], shard[1], index), backward)
        except Exception as exc:  # noqa: BLE001 - reported; the run compiles on first use instead
            errors.append(f"{case.id}: {type(exc).__name__}: {str(exc)[:200]}")
    return errors, loaded, time.time()


def _model_shard(name: str, source: str | None, arms: list[tuple[str, ModelShapes]], device: str,
                 shard: tuple[int, int]) -> tuple[list[str], float, float]:
    """In a pool process: this shard of every arm's kernels, as ``_shard`` does for cases."""
    from microscope import registry

    plugin = registry.get(name, (source,) if source else ())
    loaded = time.time()
    errors = []
    for index, (arm, shapes) in enumerate(arms):
        try:
            plugin.precompile_model(arm, shapes, device, case_shard(shard[0], shard[1], index))
        except Exception as exc:  # noqa: BLE001 - reported; the run compiles on first use instead
            errors.append(f"arm {arm}: {type(exc).__name__}: {str(exc)[:200]}")
    return errors, loaded, time.time()
