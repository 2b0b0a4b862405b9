"""The model-level runner: every arm of a plugin trained and evaluated on the embedded workload, per seed.

The operator runner (``microscope.runner``) calls kernels on seeded tensors; this one trains the
embedded model (``microscope.workloads``) once per arm and seed and measures what the change did to
the model: stability of training, accuracy, generalization, throughput and memory. Same constructor,
same ``RunResult``, same record conventions (one record per measurement, streamed to
``records.jsonl``; ``status`` ok / failed / skipped with a reason; a failing arm never stops the
others), so ``microscope run`` picks either by the config's level.

Fairness: for seed index ``k`` every arm starts from bitwise-identical weights (checked by checksum),
sees the same batches in the same order and the same loop seed (``model_setup.TrialSeeds``); arms run
baseline first, so a candidate's convergence speed can be measured against the baseline's final loss of
the same seed. Throughput is measured arm after arm, not interleaved: rates are shown, never tested.

The config's ``dimensions`` switch whole stages: ``accuracy.enabled`` the evaluations (accuracy and
generalization), ``throughput.enabled`` the speed records, ``memory.enabled`` the peak-memory records
(measured once per arm, on seed index 0). Training and its stability records always run.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Iterator
from typing import TYPE_CHECKING

from microscope.api import Ablation, Arm, Case, Role
from microscope.config import RunConfig
from microscope.executors.groups import Group
from microscope.instrument import RunLogger
from microscope.model_measures import Measurement, stage_metrics
from microscope.model_setup import TrialSeeds, WorkloadData, model_shapes, trial_setup
from microscope.model_trial import BaselineRef, Trial
from microscope.observe_model import log_training, observe_models
from microscope.rank_measures import RANK_METRICS
from microscope.runner import INSTRUMENTS_GROUP, INTERPRETER_NOTE, RunBase, _describe, skip_reason
from microscope.stats.metrics import INTERPRETER_MEMORY
from microscope.stats.sequential import SequentialPlan, undecided
from microscope.store.records import Record

if TYPE_CHECKING:
    from microscope.precompile import PrecompileReport

__all__ = ["ModelRunner", "plan_arms"]

_ROLE_ORDER = {Role.BASELINE: 0, Role.CANDIDATE: 1, Role.PEER: 2}


def plan_arms(plugin: Ablation, config: RunConfig) -> list[tuple[str, Arm]]:
    """Arms to run, baseline first; a config's ``variants:`` subset always keeps the baseline.
    ``workload.ranks`` sets the processes of every arm the plugin runs on several (a single-process arm
    stays one)."""
    chosen = set(config.variants)
    arms = [(n, a) for n, a in plugin.arms.items() if not chosen or n in chosen or a.role is Role.BASELINE]
    if config.workload.ranks:
        arms = [(n, dataclasses.replace(a, ranks=config.workload.ranks) if a.ranks > 1 else a) for n, a in arms]
    return sorted(arms, key=lambda na: _ROLE_ORDER[na[1].role])


def _seed_group(k: int, names: tuple[str, ...]) -> Group:
    """Seed ``k``'s trial group, named as its records and groups.jsonl name it (from 0)."""
    return Group(f"seed {k}", f"seed {k}", names)


class ModelRunner(RunBase):
    """Runs one model-level config for one plugin on one device; writes ``<out>/<run_id>/records.jsonl``."""

    def _setup(self) -> None:
        workload = self.config.workload
        self.case = Case.of(profile=workload.profile, task=workload.task)
        self._data: WorkloadData | None = None
        self._tb: RunLogger | None = None

    # -- planning -----------------------------------------------------------------------------
    def arms(self) -> list[tuple[str, Arm]]:
        return plan_arms(self.plugin, self.config)

    def steps(self) -> int:
        """Progress steps: one per arm that is not skipped, and seed."""
        runnable = [a for _, a in self.arms() if skip_reason(a, self.case, self.device) is None]  # type: ignore[arg-type]
        return len(runnable) * self.config.workload.seeds

    def plan(self, first_seed: bool) -> dict[str, list[tuple[str, str]]]:
        """Stage -> (dimension, metric) records owed, for the enabled dimensions (memory: first seed only)."""
        dims = self.config.dimensions
        enabled = {"stability": True, "accuracy": dims.accuracy.enabled,
                   "generalization": dims.accuracy.enabled, "throughput": dims.throughput.enabled,
                   "memory": dims.memory.enabled and first_seed}
        stages = stage_metrics(self.config.workload.task, self._any_fp16())
        if any(arm.ranks > 1 for _, arm in self.arms()):
            stages["train"] = stages["train"] + RANK_METRICS
        every_seed = {"memory": dims.memory.enabled, "throughput": dims.throughput.enabled}  # from the train stage
        plan = {stage: [(d, m) for d, m in owed if (every_seed[d] if (d, m) in RANK_METRICS else enabled[d])]
                for stage, owed in stages.items()}
        return {stage: owed for stage, owed in plan.items() if owed or stage in ("check", "train")}

    def compiles_kernels(self) -> bool:
        from microscope.precompile import defines_precompile_model

        return defines_precompile_model(self.plugin)

    def precompile_kernels(self) -> PrecompileReport | None:
        """Every arm's kernels (``Ablation.precompile_model``) for the Linears and rows its model will run."""
        from microscope.precompile import precompile_model

        arms = []
        for name, arm in self.arms():
            if skip_reason(arm, self.case, self.device) is not None:
                continue
            try:
                arms.append((name, model_shapes(self.config.workload, arm)))
            except Exception:  # noqa: BLE001 - never fatal: its check stage records a bad setup, and kernels
                continue  # that did not compile here compile on first use
        return precompile_model(self.plugin, arms, self.device)

    def _any_fp16(self) -> bool:
        """Whether some arm trains with fp16 autocast (then every arm records AMP loss-scale changes)."""
        seeds = TrialSeeds.of(self.config.seed, 0)
        for _, arm in self.arms():
            try:
                if trial_setup(self.config.workload, arm, seeds).recipe.precision == "fp16":
                    return True
            except (TypeError, ValueError, KeyError):
                continue  # the arm's own check stage records why its setup is invalid
        return False

    # -- records ------------------------------------------------------------------------------
    def _emit(self, seed: int, name: str, arm: Arm, m: Measurement, status: str | None) -> None:
        if status is None:
            status = "failed" if m.value is None else "ok"
        if m.dimension == "memory" and self.interpreted and "triton" in arm.needs:
            # the interpreter's memory use is not the compiled kernel's: shown, not gated
            notes = [*m.details.get("notes", []), INTERPRETER_MEMORY]
            m.details = {**m.details, "interpreted": True, "notes": notes}
        record = Record(
            run_id=self.run_id, plugin=self.plugin.name, variant=name, role=arm.role.value,
            case_id=self.case.id, case=self.case.params, seed=seed, dimension=m.dimension, metric=m.metric,
            value=m.value if status == "ok" else None, unit=m.unit, status=status, reason=m.reason,
            passed=m.passed if status == "ok" else None, details=m.details, device=self.device,
            interpreted=self.interpreted, env=self.env,
        )
        self._write(record)

    def _emit_all(self, seed: int, name: str, arm: Arm, status: str, reason: str) -> None:
        for owed in self.plan(first_seed=True).values():
            for dimension, metric in owed:
                self._emit(seed, name, arm, Measurement(dimension, metric, None, reason=reason), status)

    # -- the executor's view ------------------------------------------------------------------
    def batches(self) -> Iterator[list[Group]]:
        """The instruments' one step per arm, then one group per seed (all arms: they share the
        baseline's weights and losses); with ``workload.max_seeds`` one more seed at a time until every
        gating test is decided (a look at the records between two batches)."""
        names = tuple(n for n, _ in self.arms())
        if self.config.instrument.enabled:
            yield [Group(INSTRUMENTS_GROUP, "instruments", names)]
        workload = self.config.workload
        yield [_seed_group(k, names) for k in range(workload.seeds)]
        sequential = self._sequential()
        if sequential is None:
            return
        completed = workload.seeds
        while completed < sequential.max_seeds and not self._decided(sequential, completed):
            yield [_seed_group(completed, names)]
            completed += 1
        if sequential.seeds_run != completed:  # the budget ran out: the last look
            self._decided(sequential, completed)
        sequential.save(self.out_dir)

    def planned_groups(self) -> list[list[Group]]:
        names = tuple(n for n, _ in self.arms())
        first = [[Group(INSTRUMENTS_GROUP, "instruments", names)]] if self.config.instrument.enabled else []
        return first + [[_seed_group(k, names) for k in range(self.config.workload.seeds)]]

    def run_group(self, group: Group, exclude: frozenset[str] = frozenset()) -> None:
        self._group = group.key
        active = self._active([(n, a) for n, a in self.arms() if n not in exclude], group)
        if active is None:
            return
        data = self._data
        if group.key == INSTRUMENTS_GROUP:
            self._observe(active, data)
            return
        k = int(group.key.split()[1])
        seeds = TrialSeeds.of(self.config.seed, k)
        plan = self.plan(first_seed=k == 0)
        baseline = BaselineRef(keep_weights=any(arm.inference_only or arm.distill for _, arm in active))
        for name, arm in active:
            self.mark(name)
            self.on_progress(f"seed {k} ({k + 1} of {self.config.workload.seeds}): {name}")
            notes = [INTERPRETER_NOTE] if self.interpreted and "triton" in arm.needs else []
            emit = functools.partial(self._emit, seeds.trial, name, arm)
            trial = Trial(arm, seeds, self.config.workload, data, self.device, plan, emit, baseline, notes,
                          rank_timeout_s=self.config.timeout_s)
            trial.run()
            if self._logger() is not None and trial.result is not None:
                log_training(self._logger(), name, k, trial.result)

    def _active(self, arms: list[tuple[str, Arm]], group: Group) -> list[tuple[str, Arm]] | None:
        """The arms that run in ``group`` after loading the corpus (None: it failed, every arm recorded);
        skipped arms are recorded once, in the first seed's group."""
        seed0 = TrialSeeds.of(self.config.seed, 0).trial
        if self._data is None:
            try:
                self._data = WorkloadData.load(self.config.workload)
            except Exception as exc:  # noqa: BLE001 - a corpus that cannot be read fails every arm, visibly
                if group.key != INSTRUMENTS_GROUP:
                    why = f"workload data failed to load: {_describe(exc)}"
                    self.env = {**self.env, "corpus_hash": None}
                    for name, arm in arms:
                        self._emit_all(seed0, name, arm, "failed", why)
                return None
            self.env = {**self.env, "corpus_hash": self._data.sha256, "corpus": self._data.description}
        active = []
        for name, arm in arms:
            reason = skip_reason(arm, self.case, self.device)  # type: ignore[arg-type]  # same needs/supports
            if reason is None:
                active.append((name, arm))
            elif group.key == "seed 0":
                self._emit_all(seed0, name, arm, "skipped", reason)
        return active

    def failure_records(self, group: Group, variant: str | None, reason: str) -> list[Record]:
        if group.key == INSTRUMENTS_GROUP:
            return []
        k = int(group.key.split()[1])
        seed = TrialSeeds.of(self.config.seed, k).trial
        out: list[Record] = []
        sink, self.sink, self._group = self.sink, out.append, group.key
        try:
            for name, arm in self.arms():
                if variant is None or name == variant:
                    plan = self.plan(first_seed=k == 0)
                    for owed in plan.values():
                        for dimension, metric in owed:
                            self._emit(seed, name, arm, Measurement(dimension, metric, None, reason=reason), "failed")
        finally:
            self.sink = sink
        return out

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()
            self._tb = None

    def _logger(self) -> RunLogger | None:
        if self._tb is None and self.config.instrument.tensorboard:
            self._tb = RunLogger(self.out_dir / "tensorboard")
        return self._tb

    def _sequential(self) -> SequentialPlan | None:
        """The sequential plan when ``workload.max_seeds`` allows more seeds than ``workload.seeds``."""
        workload = self.config.workload
        if workload.max_seeds is None or workload.max_seeds <= workload.seeds:
            return None
        return SequentialPlan(alpha=self.config.stats.alpha, seeds=workload.seeds, max_seeds=workload.max_seeds)

    def _decided(self, plan: SequentialPlan, seeds_run: int) -> bool:
        """One look: the comparison table of the records so far at the per-look level."""
        from microscope import stats
        from microscope.store.records import records_frame

        table = stats.compare_records(records_frame(self.out_dir), alpha=plan.alpha_per_look,
                                      min_band=self.config.stats.min_band)
        done = plan.look(table, seeds_run)
        self.on_progress(f"after {seeds_run} seeds: " + ("every test decided" if done else
                                                         f"{undecided(table)} undecided"))
        return done

    def _observe(self, active: list[tuple[str, Arm]], data: WorkloadData) -> None:
        """Hooks, op and trace diffs of one step per arm (before training)."""
        icfg = self.config.instrument
        if active and icfg.enabled:
            self.on_progress("instruments: one step per arm")
            problems = observe_models(active, self.config.workload, data, TrialSeeds.of(self.config.seed, 0),
                                      self.device, icfg, self.out_dir, self._logger())
            for problem in problems:
                self.on_progress(f"instrument: {problem}")
