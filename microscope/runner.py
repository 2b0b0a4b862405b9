"""Plans trials (variant x case x seed x dimension), runs them, and streams one record per measurement.

The runner is the only place where plugins meet measurements. It guarantees that every variant of a
case sees identical inputs (one seeded draw per case and repeat, shared by all variants), that a
failure in one trial (an exception, NaN/Inf, out of memory) is recorded with its reason while every
other trial goes on, and that each record reaches disk the moment it exists.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
import os
import time
import traceback
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

import torch

from microscope import env as envmod
from microscope.api import Ablation, Case, Figure, Role, Tolerance, Variant, dtype_name, grid
from microscope.config import RunConfig, ThroughputConfig, case_grids
from microscope.device import synchronize
from microscope.executors.groups import Group, Resume, RunOutcome
from microscope.measures import accuracy, memory, throughput
from microscope.measures.calls import as_tensors, cotangents, fresh_inputs, make_call, output_names
from microscope.measures.ceilings import Ceilings
from microscope.measures.gpu_state import GpuSampler
from microscope.seeding import derive_seed, generator, seed_everything
from microscope.stats.metrics import FIGURES, INTERPRETER_MEMORY, SAVED_BYTES, SPEED_ONLY
from microscope.stats.sequential_rounds import RoundLooks
from microscope.store.records import Record

if TYPE_CHECKING:
    from microscope.executors import Executor
    from microscope.precompile import PrecompileReport

#: The key of the operator runner's last group: traces and op diffs of every case.
INSTRUMENTS_GROUP = "instruments"
INTERPRETER_NOTE = "Triton ran through its CPU interpreter: timings describe the interpreter, not the kernel"


@dataclass
class RunResult:
    run_id: str
    out_dir: Path
    records: list[Record]
    interpreted: bool
    device: str
    seconds: float
    outcome: RunOutcome | None = None  # groups complete, failed, left undone (interrupted or out of budget)

    @property
    def failed(self) -> list[Record]:
        return [r for r in self.records if r.status == "failed"]


#: Which way is better for each metric this runner emits: records carry it, so nothing downstream has to
#: guess from a metric's name.
HIGHER_IS_BETTER = {"latency_ms": False, "tflops": True, "gbps": True, "peak_bytes": False, "timed_calls.ok": True}


def higher_is_better(metric: str) -> bool | None:
    """The declared direction of one of this runner's metrics (``<tensor>.rel_err``: lower), else None."""
    if metric in HIGHER_IS_BETTER:
        return HIGHER_IS_BETTER[metric]
    return False if metric.endswith("rel_err") else None


def plan_cases(plugin: Ablation, config: RunConfig) -> list[Case]:
    """The plugin's case grid with the config's axes substituted (a full grid over the axes); with a list
    of grids, the cases of each in turn, each case once."""
    grids = case_grids(config)
    if not grids:
        return list(plugin.cases)
    default: dict[str, list[Any]] = {}
    for case in plugin.cases:
        for axis, value in case.items:
            values = default.setdefault(axis, [])
            if value not in values:
                values.append(value)
    planned: dict[str, Case] = {}
    for _, chosen in grids:
        axes = {axis: list(chosen.get(axis, values)) for axis, values in default.items()}
        for case in grid(**axes):
            planned.setdefault(case.id, case)
    return list(planned.values())


def plan_variants(plugin: Ablation, config: RunConfig) -> list[tuple[str, Variant]]:
    """Variants to run, baseline first; a config's ``variants:`` subset always keeps the baseline, and an
    opt-in variant runs only where it names it; a swept variant is followed by one variant per parameter
    combination, ``triton[warps=4,stages=2]``."""
    chosen = set(config.variants)
    out: list[tuple[str, Variant]] = []
    for name, variant in plugin.iter_variants():
        if (chosen or variant.opt_in) and name not in chosen and variant.role is not Role.BASELINE:
            continue
        out.append((name, variant))
        params = config.sweep.get(name)
        for combo in itertools.product(*params.values()) if params else ():
            bound = dict(zip(params, combo))
            label = ",".join(f"{k}={_param_text(v)}" for k, v in bound.items())
            out.append((f"{name}[{label}]", dataclasses.replace(
                variant, fn=functools.partial(variant.fn, **bound),
                description=f"{variant.description} ({label})".strip())))
    return out


def _param_text(value: Any) -> str:
    return str(value).lower() if isinstance(value, bool) else str(value)


def skip_reason(variant: Variant, case: Case, device: str) -> str | None:
    ranks = getattr(variant, "ranks", 1)
    if ranks > 1 and device == "cuda" and torch.cuda.device_count() < ranks:
        return f"needs {ranks} GPUs (one per rank); this machine has {torch.cuda.device_count()}"
    for need in variant.needs:
        if need == "cuda" and device != "cuda":
            return "needs a CUDA GPU"
        if need == "triton":
            try:
                import triton  # noqa: F401
            except ImportError:
                return "needs triton (pip install triton)"
    if variant.supports is not None:
        return variant.supports(case, device)
    return None


def new_run_id(plugin: str) -> str:
    stamp = datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")
    return f"{stamp}-{plugin}"


def _describe(exc: BaseException) -> str:
    if isinstance(exc, torch.cuda.OutOfMemoryError):
        torch.cuda.empty_cache()
        return f"out of memory: {str(exc).splitlines()[0]}"
    frame = traceback.extract_tb(exc.__traceback__)[-1] if exc.__traceback__ else None
    where = f" (at {Path(frame.filename).name}:{frame.lineno})" if frame else ""
    return f"{type(exc).__name__}: {exc}{where}"


def _no_mark(_name: str) -> None:
    """The inline executor's mark: nothing to tell."""


_no_mark.noop = True  # type: ignore[attr-defined]


class RunBase:
    """What every runner shares: the run's identity and folder, its environment, and the record stream.

    A run is a list of trial groups (``groups.Group``: one case, or one seed of a model-level run); an
    executor runs each group, in this process or in a worker process, and the driver is the only writer
    of ``records.jsonl``. Subclasses implement ``batches`` (the groups, in batches the runner may look
    between), ``run_group`` (one group, records through ``_write``) and ``failure_records``.
    """

    def __init__(
        self,
        plugin: Ablation,
        config: RunConfig,
        *,
        device: str,
        interpreted: bool,
        out_root: Path,
        config_text: str = "",
        run_id: str | None = None,
        on_progress: Callable[[str], None] | None = None,
        env: dict[str, Any] | None = None,
    ) -> None:
        self.plugin = plugin
        self.config = config
        self.device = device
        self.interpreted = interpreted
        self.run_id = run_id or new_run_id(plugin.name)
        self.out_dir = Path(out_root) / self.run_id
        #: ``env``: the parent's, for a runner rebuilt in a worker (one environment per run)
        self.env = dict(env) if env is not None else envmod.capture(
            device, interpreted, envmod.config_hash(config_text or repr(config)))
        self.on_progress = on_progress or (lambda _msg: None)
        #: detail for a worker's log only (never a progress step): where a slow case spends its time
        self.log: Callable[[str], None] = lambda _msg: None
        self._one_set: dict[str, str] = {}  # case id -> why its timed calls could not rotate input sets
        self.records: list[Record] = []
        #: where ``_write`` sends each record: the executor's per-group buffer
        self.sink: Callable[[Record], None] = self.records.append
        #: called with the name of the variant (or arm) about to run, so a worker that dies names it
        self.mark: Callable[[str], None] = _no_mark
        self._group = ""
        self._setup()

    def _setup(self) -> None:
        """Runner-specific state (called at the end of ``__init__``)."""

    def _write(self, record: Record) -> None:
        """Hand ``record`` to the executor's sink (the driver streams it to ``records.jsonl``)."""
        record.group = self._group
        self.sink(record)

    # -- the executor's view ------------------------------------------------------------------
    def batches(self) -> Iterator[list[Group]]:
        """The run's trial groups, in batches; the runner may read the records written between two."""
        raise NotImplementedError

    def planned_groups(self) -> list[list[Group]]:
        """The groups known before the run starts (a sequential model run may add seeds later)."""
        raise NotImplementedError

    def run_group(self, group: Group, exclude: frozenset[str] = frozenset()) -> None:
        """Run one group in this process, leaving out the variants in ``exclude``."""
        raise NotImplementedError

    def failure_records(self, group: Group, variant: str | None, reason: str) -> list[Record]:
        """Failed records for ``variant`` (None: every variant) of a group whose worker died."""
        raise NotImplementedError

    def close(self) -> None:
        """Release what the runner holds open (TensorBoard writers)."""

    def compiles_kernels(self) -> bool:
        """Whether the plugin has GPU kernels to compile before the groups run (``precompile_kernels``)."""
        return False

    def precompile_kernels(self) -> PrecompileReport | None:
        """Compile the plugin's GPU kernels in parallel processes (``microscope.precompile``); None if skipped."""
        return None

    def run(self, executor: Executor | None = None, *, resume: Resume | None = None,
            max_wall_s: float | None = None) -> RunResult:
        """Run every group on ``executor`` (default: inline, in this process) and return the result. On a GPU
        the plugin's kernels compile first (``precompile_kernels``), while an executor that can (``prestart``)
        starts its first worker."""
        from microscope.executors.driver import Driver
        from microscope.executors.inline import InlineExecutor

        compiling = self.device == "cuda" and not self.interpreted and self.compiles_kernels()
        if compiling:
            # every process compiles serially: a run's precompile processes (one per CPU) and its worker
            # would otherwise each start one compile subprocess per CPU, all importing torch at once
            os.environ.setdefault("TORCHINDUCTOR_COMPILE_THREADS", "1")
        if hasattr(executor, "prestart"):
            executor.prestart(warm=compiling)  # type: ignore[union-attr]
        if compiling:
            report = self.precompile_kernels()
            if report is not None:
                self.on_progress(report.summary())
        start = time.perf_counter()
        self.out_dir.mkdir(parents=True, exist_ok=True)
        self.outcome = Driver(self, executor or InlineExecutor(self), resume=resume, max_wall_s=max_wall_s).run()
        return self._result(start)

    def _result(self, start: float) -> RunResult:
        return RunResult(self.run_id, self.out_dir, self.records, self.interpreted, self.device,
                         time.perf_counter() - start, getattr(self, "outcome", None))


class Runner(RunBase):
    """Runs one operator-level config for one plugin on one device; writes ``<out>/<run_id>/records.jsonl``."""

    def _setup(self) -> None:
        self.ceilings: Ceilings | None = None
        #: case id -> variant -> output tensor -> the error its timed calls may show (None: not checked)
        self._accepted: dict[str, dict[str, dict[str, float | None]]] = {}
        self._gpu = GpuSampler() if self.device == "cuda" else None
        #: (case id, seed) and the output gradients drawn for them, reused by every phase of that case
        self._case_cots: tuple[tuple[str, int] | None, list[torch.Tensor] | None] = (None, None)
        self.tensorboard = None
        if self.config.instrument.tensorboard:
            from microscope.instrument import RunLogger

            self.tensorboard = RunLogger(self.out_dir / "tensorboard")

    def compiles_kernels(self) -> bool:
        from microscope.precompile import defines_precompile

        return defines_precompile(self.plugin)

    def precompile_kernels(self) -> PrecompileReport | None:
        """Every case's kernels (``Ablation.precompile``), with their backward where a dimension needs it."""
        from microscope.precompile import precompile

        dims = self.config.dimensions
        backward = any(d.enabled and d.backward for d in (dims.accuracy, dims.throughput, dims.memory))
        return precompile(self.plugin, plan_cases(self.plugin, self.config), self.device, backward)

    # -- planning -----------------------------------------------------------------------------
    def trials(self) -> Iterator[tuple[Case, int]]:
        cases = plan_cases(self.plugin, self.config)
        yield from itertools.product(cases, range(self.config.repeats))

    def steps(self) -> int:
        dims = self.config.dimensions
        per_case = dims.accuracy.enabled * self.config.repeats + dims.throughput.enabled + dims.memory.enabled
        return len(plan_cases(self.plugin, self.config)) * per_case

    # -- records ------------------------------------------------------------------------------
    def _emit(self, case: Case, seed: int, name: str, variant: Variant, dimension: str, metric: str,
              value: float | None, **kw: Any) -> None:
        better = higher_is_better(metric)
        if better is not None:
            kw["details"] = {"higher_is_better": better, **(kw.get("details") or {})}
        if variant.opt_in:  # a study's variant (a stage left out): timed beside the others, never a best peer
            kw["details"] = {**(kw.get("details") or {}), "study": True}
        record = Record(
            run_id=self.run_id, plugin=self.plugin.name, variant=name, role=variant.role.value,
            case_id=case.id, case=case.params, seed=seed, dimension=dimension, metric=metric, value=value,
            device=self.device, interpreted=self.interpreted, env=self.env, **kw,
        )
        self._write(record)

    # -- the executor's view ------------------------------------------------------------------
    def batches(self) -> Iterator[list[Group]]:
        """One group per case (all its variants: interleaving and identical inputs need them together),
        then one group for the instruments, which patch process-wide hooks and so run after every
        measurement."""
        names = tuple(n for n, _ in plan_variants(self.plugin, self.config))
        yield [Group(f"case {case.id}", case.id, names) for case in plan_cases(self.plugin, self.config)]
        if self.config.instrument.profile.enabled or self.config.instrument.dataflow:
            yield [Group(INSTRUMENTS_GROUP, "instruments", names)]

    def planned_groups(self) -> list[list[Group]]:
        return list(self.batches())

    def run_group(self, group: Group, exclude: frozenset[str] = frozenset()) -> None:
        self._group = group.key
        variants = [(n, v) for n, v in plan_variants(self.plugin, self.config) if n not in exclude]
        if group.key == INSTRUMENTS_GROUP:
            self._instruments(variants)
            return
        case = next(c for c in plan_cases(self.plugin, self.config) if c.id == group.label)
        if self.device == "cuda" and self.config.dimensions.throughput.enabled and self.ceilings is None:
            self.on_progress("device ceilings (matmul TFLOP/s, copy GB/s): measured once per run and GPU")
            self.ceilings = Ceilings.for_run(self.out_dir)
        self._run_case(case, variants)

    def failure_records(self, group: Group, variant: str | None, reason: str) -> list[Record]:
        if group.key == INSTRUMENTS_GROUP:
            return []
        case = next(c for c in plan_cases(self.plugin, self.config) if c.id == group.label)
        dims = [d for d in ("accuracy", "throughput", "memory") if getattr(self.config.dimensions, d).enabled]
        seed0 = derive_seed(self.config.seed, self.plugin.name, case.id, 0)
        out: list[Record] = []
        sink, self.sink, self._group = self.sink, out.append, group.key
        try:
            for name, v in plan_variants(self.plugin, self.config):
                if variant is None or name == variant:
                    for dim in dims:
                        self._emit(case, seed0, name, v, dim, _MAIN_METRIC[dim], None, status="failed", reason=reason)
        finally:
            self.sink = sink
        return out

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
            self.tensorboard = None

    def _instruments(self, variants: Sequence[tuple[str, Variant]]) -> None:
        """Traces and op diffs per case, of the variants that ran (an instrument never fails a run)."""
        ran = self._ran_variants()
        for case in plan_cases(self.plugin, self.config):
            timed = [(n, v) for n, v in variants if n in ran.get(case.id, set())]
            if not timed:
                continue
            self.on_progress(f"{case.id}: instruments")
            seed = derive_seed(self.config.seed, self.plugin.name, case.id, 0)
            try:
                self._observe(case, seed, self.plugin.inputs(case, generator(seed), self.device), timed)
            except Exception as exc:
                self.on_progress(f"instrument: {case.id}: {_describe(exc)}")

    def _ran_variants(self) -> dict[str, set[str]]:
        """case id -> variants with a measured (ok) record, read from the records written so far."""
        from microscope.store.records import read_records

        path = self.out_dir / "records.jsonl"
        ran: dict[str, set[str]] = {}
        if path.exists():
            for rec in read_records(path):
                if rec.get("status") == "ok" and rec.get("dimension") in ("throughput", "memory", "accuracy"):
                    ran.setdefault(str(rec.get("case_id")), set()).add(str(rec.get("variant")))
        return ran

    def _run_case(self, case: Case, variants: Sequence[tuple[str, Variant]]) -> None:
        dims = self.config.dimensions
        active: list[tuple[str, Variant]] = []
        enabled = [d for d in ("accuracy", "throughput", "memory") if getattr(dims, d).enabled]
        seed0 = derive_seed(self.config.seed, self.plugin.name, case.id, 0)
        for name, variant in variants:
            reason = skip_reason(variant, case, self.device)
            if reason is None:
                active.append((name, variant))
                continue
            for dim in enabled:
                self._emit(case, seed0, name, variant, dim, _MAIN_METRIC[dim], None, status="skipped", reason=reason)
        broken: dict[str, str] = {}
        first_inputs: dict[str, Any] | None = None
        for rep in range(self.config.repeats if dims.accuracy.enabled else 1):
            seed = derive_seed(self.config.seed, self.plugin.name, case.id, rep)
            try:
                seed_everything(seed)
                inputs = self.plugin.inputs(case, generator(seed), self.device)
            except Exception as exc:
                why = f"plugin inputs() failed: {_describe(exc)}"
                for name, variant in active:
                    for dim in enabled:
                        self._emit(case, seed, name, variant, dim, _MAIN_METRIC[dim], None, status="failed", reason=why)
                self.on_progress(f"{case.id}: inputs failed")
                return
            if first_inputs is None:
                first_inputs = inputs
            if dims.accuracy.enabled:
                self.on_progress(f"{case.id}: accuracy (repeat {rep + 1}/{self.config.repeats})")
                broken.update(self._accuracy(case, seed, inputs, [(n, v) for n, v in active if v.checked]))
        if dims.accuracy.enabled:
            for name, variant in active:
                if not variant.checked:
                    self._emit(case, seed0, name, variant, "accuracy", _MAIN_METRIC["accuracy"], None,
                               status="skipped", reason=SPEED_ONLY)
        assert first_inputs is not None
        timed = [(n, v) for n, v in active if n not in broken]
        for name, variant in active:
            if name in broken:
                for dim in enabled[1:] if enabled[0] == "accuracy" else enabled:
                    self._emit(case, seed0, name, variant, dim, _MAIN_METRIC[dim], None, status="failed",
                               reason=f"not measured: the variant failed to run ({broken[name]})")
        self._figures(case, seed0, first_inputs, active)
        if dims.throughput.enabled:
            self.on_progress(f"{case.id}: throughput")
            self._throughput(case, seed0, first_inputs, timed)
        if dims.memory.enabled:
            self.on_progress(f"{case.id}: memory")
            self._memory(case, seed0, first_inputs, timed)
        self._case_cots = (None, None)  # the next case draws its own (they hold GPU memory)

    def _figures(self, case: Case, seed: int, inputs: dict[str, Any], active: Sequence[tuple[str, Variant]]) -> None:
        """The plugin's own figures of this case (``Ablation.figures``) as records of the ``figures``
        dimension; a hook that raises or returns something else is one failed record, the case goes on."""
        if type(self.plugin).figures is Ablation.figures:
            return
        variants = dict(active)
        try:
            got = self.plugin.figures(case, inputs, self.device)
            rows = [(str(name), str(metric), fig) for name, figs in dict(got).items() if name in variants
                    for metric, fig in dict(figs).items()]
            bad = [f"{name}.{metric}" for name, metric, fig in rows if not isinstance(fig, Figure)]
            if bad:
                raise TypeError(f"figures() must map variant -> metric -> api.Figure; not a Figure: {', '.join(bad)}")
        except Exception as exc:
            name, variant = self.plugin.baseline_variant()
            self._emit(case, seed, name, variant, FIGURES, FIGURES, None, status="failed",
                       reason=f"plugin figures() failed: {_describe(exc)}")
            return
        for name, metric, fig in rows:
            details: dict[str, Any] = {"notes": [fig.note] if fig.note else []}
            if fig.higher_is_better is not None:
                details["higher_is_better"] = fig.higher_is_better
            self._emit(case, seed, name, variants[name], FIGURES, metric, float(fig.value), unit=fig.unit,
                       details=details)

    # -- dimensions ---------------------------------------------------------------------------
    def _grad_names(self, case: Case, backward: bool) -> tuple[str, ...]:
        return tuple(self.plugin.grad_inputs(case)) if backward else ()

    def _cotangents(self, case: Case, seed: int, inputs: dict[str, Any], grad_names: Sequence[str]):
        """Ground truth in float64, and the seeded output gradients every variant receives."""
        x64 = fresh_inputs(inputs, grad_names, torch.float64)
        outs = as_tensors(self.plugin.reference(x64))
        cots = cotangents(outs, generator(derive_seed(seed, "cotangent"))) if grad_names else None
        if cots is not None:
            self._case_cots = ((case.id, seed), cots)
        return x64, outs, cots

    def _measured_cotangents(self, case: Case, seed: int, inputs: dict[str, Any],
                             grad_names: Sequence[str]) -> list[torch.Tensor] | None:
        """The cotangents of the timed and memory calls, on the device in the case's dtype: the accuracy
        check's own when it drew them for this case and seed, so no second float64 reference runs."""
        if not grad_names:
            return None
        key, cots = self._case_cots
        if key != (case.id, seed):
            _, _, cots = self._cotangents(case, seed, inputs, grad_names)
        cots = [c.to(device=self.device, dtype=case.dtype) for c in cots]
        self._case_cots = ((case.id, seed), cots)  # kept in the case's dtype: no float32 copy stays allocated
        return cots

    def _accuracy(self, case: Case, seed: int, inputs: dict[str, Any],
                  active: Sequence[tuple[str, Variant]]) -> dict[str, str]:
        """Records every tensor's error; returns the variants that could not run at all."""
        grad_names = self._grad_names(case, self.config.dimensions.accuracy.backward)
        tol = self.plugin.tolerance_for(case)
        broken: dict[str, str] = {}
        self.log(f"{case.id}: float64 truth")
        try:
            x64, outs64, cots = self._cotangents(case, seed, inputs, grad_names)
            truth = {name: o.detach() for name, o in zip(output_names(outs64), outs64)}
            if cots is not None:
                grads = torch.autograd.grad(outs64, [x64[n] for n in grad_names],
                                            [c.to(o) for c, o in zip(cots, outs64)])
                truth.update({f"grad_{n}": g for n, g in zip(grad_names, grads)})
        except Exception as exc:
            why = f"float64 reference failed: {_describe(exc)}"
            for name, variant in active:
                self._emit(case, seed, name, variant, "accuracy", "rel_err", None, status="failed", reason=why)
                broken[name] = why
            return broken
        errors: dict[str, dict[str, accuracy.TensorError]] = {}
        self._accepted.setdefault(case.id, {})
        for name, variant in active:
            self.mark(name)
            self.log(f"{case.id}: accuracy of {name}")  # a first call's compiling shows in the log's clock
            try:
                got = accuracy.evaluate(variant, inputs, grad_names, cots)
                synchronize(self.device)  # an asynchronous CUDA error belongs to this variant, not the next
                errors[name] = {t: accuracy.compare(t, got[t], truth[t], tol) for t in truth if t in got}
                # a variant declared non-differentiable (an inference kernel) owes only its outputs
                owed = [t for t in truth if variant.differentiable or not t.startswith("grad_")]
                missing = [t for t in owed if t not in got]
                if missing:
                    raise RuntimeError(f"variant did not produce {missing}")
            except Exception as exc:
                why = _describe(exc)
                broken[name] = why
                errors.pop(name, None)
                self._emit(case, seed, name, variant, "accuracy", "rel_err", None, status="failed", reason=why)
        base_name = self.plugin.baseline_variant()[0]
        base_errs = errors.get(base_name, {})
        for name, variant in active:
            for tensor, err in errors.get(name, {}).items():
                accuracy.judge(err, base_errs.get(tensor), tol, case.dtype)
                status, reason = "ok", None
                if err.nonfinite and torch.isfinite(truth[tensor]).all():
                    status, reason = "failed", f"{tensor} has {err.nonfinite} NaN/Inf elements"
                elif not err.passed:
                    reason = err.reason
                details = {k: getattr(err, k) for k in ("max_abs_err", "mismatch", "nonfinite", "ref_rel_err", "limit")}
                details.update(tensor=tensor, dtype=dtype_name(case.dtype), tolerance=dataclasses.asdict(tol))
                self._emit(case, seed, name, variant, "accuracy", f"{tensor}.rel_err",
                           err.rel_err if status == "ok" else None, unit="ratio", status=status, reason=reason,
                           passed=bool(err.passed) if status == "ok" else False, details=details)
                self._note_accepted(case, name, tensor, err, tol, status == "ok" and bool(err.passed))
        return broken

    def _note_accepted(self, case: Case, name: str, tensor: str, err: accuracy.TensorError, tol: Tolerance,
                       passed: bool) -> None:
        """The error a timed call of this variant may show on this output: twice what the accuracy
        check accepted (its limit, or the declared rtol where the baseline broke), so a fresh input
        set's ordinary spread passes and a stale or constant answer (error near 1) does not."""
        accepted = self._accepted[case.id].setdefault(name, {})
        if not passed:
            accepted[tensor] = None  # already failed: its timed calls are not checked again
            return
        if tensor in accepted and accepted[tensor] is None:
            return
        limit = err.limit if math.isfinite(err.limit) else max(tol.rtol, err.rel_err)
        accepted[tensor] = max(accepted.get(tensor) or 0.0, 2.0 * max(limit, err.rel_err))

    def _throughput(self, case: Case, seed: int, inputs: dict[str, Any],
                    timed: Sequence[tuple[str, Variant]]) -> None:
        cfg = self.config.dimensions.throughput
        grad_names = self._grad_names(case, cfg.backward)
        thunks, buffers = {}, {}
        cots = self._measured_cotangents(case, seed, inputs, grad_names)
        for name, variant in timed:
            buffers[name] = fresh_inputs(inputs, grad_names if variant.differentiable else ())
            thunks[name] = make_call(variant, buffers[name], grad_names, bool(grad_names), cots)
        rotation = self._rotation(case, seed, inputs, buffers, cfg)
        self.log(f"{case.id}: throughput rounds ({len(thunks)} variants, {rotation.n_sets} input sets)")
        looks = self._round_looks(cfg)
        results = throughput.interleaved(thunks, cfg, self.device, rotation=rotation,
                                         gpu_state=self._gpu.sample if self._gpu is not None else None,
                                         on_variant=None if getattr(self.mark, "noop", False) else self.mark,
                                         looks=looks.points if looks else (),
                                         stop=self._decided_rule(case, timed, looks) if looks else None)
        mode = "forward+backward" if grad_names else "forward"
        flops = self.plugin.flops(case, backward=bool(grad_names))
        nbytes = self.plugin.bytes(case, backward=bool(grad_names))
        for name, variant in timed:
            timing = results[name]
            if timing.checks and variant.checked:
                self._emit_timed_checks(case, seed, name, variant, timing)
            if timing.error is not None or not timing.rounds:
                self._emit(case, seed, name, variant, "throughput", "latency_ms", None, status="failed",
                           reason=timing.error or "no timed round completed")
                continue
            interpreted = self.interpreted and "triton" in variant.needs
            notes = ([INTERPRETER_NOTE] if interpreted else []) + (
                [self._one_set[case.id]] if case.id in self._one_set else [])
            timing_mode = cfg.mode if self.device == "cuda" else "events"
            details = {"rounds": timing.rounds, "reps": timing.reps, "warmup": cfg.warmup, "mode": mode,
                       "timing_mode": timing_mode,
                       "timer": throughput.TIMER_NAMES[timing_mode] if self.device == "cuda" else "perf_counter",
                       "l2_flush": self.device == "cuda" and cfg.flush_l2, "iqr_rel": timing.iqr_rel,
                       "n_samples": len(timing.samples), "input_sets": rotation.n_sets, "notes": notes,
                       "interpreted": interpreted}
            if looks is not None:
                details["sequential"] = looks.as_details(len(timing.rounds))
            if not variant.checked:
                details["speed_only"] = True
            if any(timing.gpu):
                details["gpu_state"] = timing.gpu
                details["throttled_rounds"] = timing.throttled_rounds
            self._emit(case, seed, name, variant, "throughput", "latency_ms", timing.median_ms, unit="ms",
                       details=details)
            if self.tensorboard is not None:
                self.tensorboard.scalar(name, f"latency_ms/{case.id}", timing.median_ms)
            seconds = timing.median_ms / 1e3
            for metric, amount, unit, scale in (("tflops", flops, "TFLOP/s", 1e12), ("gbps", nbytes, "GB/s", 1e9)):
                if not amount or timing_mode == "host":  # host time is not the kernel's: no rate from it
                    continue
                extra: dict[str, Any] = {"mode": mode, "amount": amount, "notes": notes}
                if self.ceilings is not None:
                    ceiling = self.ceilings.tflops if metric == "tflops" else self.ceilings.gbps
                    extra["fraction_of_ceiling"] = amount / seconds / scale / ceiling
                    extra["ceiling"] = ceiling
                self._emit(case, seed, name, variant, "throughput", metric, amount / seconds / scale, unit=unit,
                           details=extra)

    def _round_looks(self, cfg: ThroughputConfig) -> RoundLooks | None:
        """Where sequential rounds look (``throughput.min_rounds`` > 0), at the run's own alpha and band."""
        if not cfg.min_rounds or cfg.min_rounds >= cfg.rounds:
            return None
        return RoundLooks(cfg.min_rounds, cfg.rounds, cfg.look_every, alpha=self.config.stats.alpha,
                          min_band=self.config.stats.min_band, family=self._gating_tests)

    @functools.cached_property
    def _gating_tests(self) -> int:
        """The table's Holm family of latency tests: one per candidate and case."""
        candidates = sum(v.role is Role.CANDIDATE for _, v in plan_variants(self.plugin, self.config))
        return len(plan_cases(self.plugin, self.config)) * max(1, candidates)

    def _decided_rule(self, case: Case, timed: Sequence[tuple[str, Variant]],
                      looks: RoundLooks) -> Callable[[dict[str, throughput.Timing]], bool]:
        """The stop rule of a case's rounds: every correct candidate decided against the baseline and the
        fastest correct peer (a variant that failed an accuracy check has no speed verdict to wait for)."""
        accepted = self._accepted.get(case.id, {})

        def correct(name: str) -> bool:
            return None not in accepted.get(name, {}).values()

        base = next((n for n, v in timed if v.role is Role.BASELINE), "")
        cands = [n for n, v in timed if v.role is Role.CANDIDATE and correct(n)]
        peers = [n for n, v in timed if v.role is Role.PEER and correct(n)]

        def stop(results: dict[str, throughput.Timing]) -> bool:
            rounds = {n: t.rounds for n, t in results.items() if t.error is None and t.rounds}
            return looks.decided(rounds, base, cands, peers)

        return stop

    def _rotation(self, case: Case, seed: int, inputs: dict[str, Any], buffers: dict[str, dict[str, Any]],
                  cfg: ThroughputConfig) -> throughput.Rotation:
        """Seeded input sets copied into each variant's buffers call by call, and the check of timed
        outputs against each set's float64 reference (only where the accuracy dimension ran)."""
        sets = [inputs]
        wanted = self._input_sets_that_fit(case, inputs, len(buffers), cfg.input_sets)
        for k in range(1, wanted):
            extra = self.plugin.inputs(case, generator(derive_seed(seed, "timing", k)), self.device)
            if not _same_layout(inputs, extra):
                self.on_progress(f"{case.id}: input sets differ in shape; timing on one set")
                self._one_set[case.id] = (
                    "timed on one input set: another seeded set differs in more than its values (a shape, a "
                    "dtype, or a non-tensor input such as an object holding tensors); a variant that memoizes "
                    "is not caught here: make inputs() return plain tensors of fixed shapes")
                sets = [inputs]
                break
            sets.append(extra)

        def load(name: str, k: int) -> None:
            with torch.no_grad():
                for key, dst in buffers[name].items():
                    if isinstance(dst, torch.Tensor):
                        dst.copy_(sets[k][key])

        accepted = self._accepted.get(case.id, {})
        if not cfg.check_rounds or not accepted or wanted < cfg.input_sets:  # no room for float64 truths
            return throughput.Rotation(n_sets=len(sets), load=load)
        truths: dict[int, list[torch.Tensor]] = {}

        def check(name: str, k: int, out: Any) -> str | None:
            limits = accepted.get(name)
            if not limits:
                return None
            if k not in truths:
                truths[k] = as_tensors(self.plugin.reference(fresh_inputs(sets[k], (), torch.float64)))
            outs = as_tensors(out)
            for tensor, got, truth in zip(output_names(truths[k]), outs, truths[k]):
                limit = limits.get(tensor)
                if limit is None:
                    continue
                err = accuracy.compare(tensor, got.detach(), truth, self.plugin.tolerance_for(case))
                if err.reason or err.nonfinite or not err.rel_err <= limit:
                    shown = err.reason or f"rel err {err.rel_err:.3g} > {limit:.3g}"
                    return f"{tensor} of a timed call on input set {k}: {shown}"
            return None

        return throughput.Rotation(n_sets=len(sets), load=load, check=check, check_rounds=cfg.check_rounds)

    def _input_sets_that_fit(self, case: Case, inputs: dict[str, Any], n_buffers: int, wanted: int) -> int:
        """How many input sets to rotate: ``wanted``, or 1 where the extra sets (and their float64 truths)
        would not fit in half of the GPU memory free now beside each variant's own buffers."""
        if self.device != "cuda" or wanted <= 1:
            return wanted
        set_bytes = sum(t.numel() * t.element_size() for t in inputs.values() if isinstance(t, torch.Tensor))
        truth_bytes = sum(t.numel() * 8 for t in inputs.values() if isinstance(t, torch.Tensor))
        free, _ = torch.cuda.mem_get_info()
        needed = (wanted - 1) * (set_bytes + truth_bytes)
        if needed <= 0.5 * free:
            return wanted
        gib = 2.0**30
        self.on_progress(f"{case.id}: timing on one input set (more would not fit in GPU memory)")
        self._one_set[case.id] = (
            f"timed on one input set: {wanted - 1} more seeded set(s) and their float64 truths need "
            f"{needed / gib:.1f} GiB, more than half of the {free / gib:.1f} GiB free beside {n_buffers} "
            "variants' buffers; timed calls are not checked against float64 truths, so a variant that memoizes "
            "is not caught at this size")
        return 1

    def _emit_timed_checks(self, case: Case, seed: int, name: str, variant: Variant,
                           timing: throughput.Timing) -> None:
        """One accuracy record per variant: did every checked timed call give the right answer?"""
        problems = [(r, k, why) for r, k, why in timing.checks if why]
        details = {"checked": [{"round": r, "input_set": k, "problem": why} for r, k, why in timing.checks],
                   "tensor": "timed outputs", "dtype": dtype_name(case.dtype)}
        reason = None
        if problems:
            r, _, why = problems[0]
            reason = (f"{len(problems)} of {len(timing.checks)} checked timed calls gave a wrong answer "
                      f"(round {r}: {why}); the accuracy check passed on another call, so its timings "
                      "may not time the work")
        self._emit(case, seed, name, variant, "accuracy", "timed_calls.ok", float(not problems), unit="bool",
                   reason=reason, passed=not problems, details=details)

    def _observe(self, case: Case, seed: int, inputs: dict[str, Any],
                 timed: Sequence[tuple[str, Variant]]) -> None:
        """Traces and op diffs of the variants, in the throughput dimension's call mode."""
        seed_everything(seed)
        from microscope.observe import observe_case

        grad_names = self._grad_names(case, self.config.dimensions.throughput.backward)
        cots = self._measured_cotangents(case, seed, inputs, grad_names)
        thunks = {name: make_call(variant, fresh_inputs(inputs, grad_names if variant.differentiable else ()),
                                  grad_names, bool(grad_names), cots) for name, variant in timed}
        problems = observe_case(case, thunks, self.plugin.baseline_variant()[0], self.config.instrument,
                                self.out_dir, self.device, self.tensorboard)
        for problem in problems:
            self.on_progress(f"instrument: {problem}")

    def _memory(self, case: Case, seed: int, inputs: dict[str, Any],
                timed: Sequence[tuple[str, Variant]]) -> None:
        cfg = self.config.dimensions.memory
        grad_names = self._grad_names(case, cfg.backward)
        cots = self._measured_cotangents(case, seed, inputs, grad_names)
        mode = "forward+backward" if grad_names else "forward"
        for name, variant in timed:
            self.mark(name)
            self.log(f"{case.id}: memory of {name}")  # the worker's log shows which variant a slow phase waits on
            try:
                x = fresh_inputs(inputs, grad_names if variant.differentiable else ())
                thunk = make_call(variant, x, grad_names, bool(grad_names), cots)
                peak, method = memory.peak_bytes(thunk, self.device)
            except Exception as exc:
                self._emit(case, seed, name, variant, "memory", "peak_bytes", None, status="failed",
                           reason=_describe(exc))
                continue
            interpreted = self.interpreted and "triton" in variant.needs
            notes = [INTERPRETER_MEMORY] if interpreted else []
            self._emit(case, seed, name, variant, "memory", "peak_bytes", peak, unit="bytes",
                       details={"method": method, "mode": mode, "interpreted": interpreted, "notes": notes})
            if grad_names and variant.differentiable:
                self._saved_bytes(case, seed, name, variant, inputs, grad_names)

    def _saved_bytes(self, case: Case, seed: int, name: str, variant: Variant, inputs: dict[str, Any],
                     grad_names: Sequence[str]) -> None:
        """What the variant's forward keeps for its backward (``memory.saved_for_backward_bytes``)."""
        x = fresh_inputs(inputs, grad_names)
        try:
            saved = memory.saved_for_backward_bytes(lambda: variant.fn(**x))
        except Exception as exc:
            self._emit(case, seed, name, variant, "memory", SAVED_BYTES, None, status="failed",
                       reason=_describe(exc))
            return
        self._emit(case, seed, name, variant, "memory", SAVED_BYTES, saved, unit="bytes",
                   details={"method": "saved_tensors_hooks", "higher_is_better": False,
                            "definition": "bytes of the distinct storages autograd keeps for the backward, "
                                          "saved inputs included (in a model they are activations)"})


_MAIN_METRIC = {"accuracy": "rel_err", "throughput": "latency_ms", "memory": "peak_bytes"}


def _same_layout(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two input dicts hold tensors of the same names, shapes and dtypes (and equal non-tensors)."""
    if a.keys() != b.keys():
        return False
    for key, x in a.items():
        y = b[key]
        if isinstance(x, torch.Tensor):
            if not isinstance(y, torch.Tensor) or x.shape != y.shape or x.dtype != y.dtype:
                return False
        else:
            try:
                if type(x) is not type(y) or bool(x != y):
                    return False
            except Exception:  # values without a plain equality (arrays, custom objects)
                return False
    return True
