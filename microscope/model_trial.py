"""One arm trained and evaluated for one seed, stage by stage, with every stage's failure isolated.

Stages, in order: ``check`` (build the model from the seed's init, checksum the weights, apply the arm's
patch, probe for future-token leaks), ``train`` (or, for an ``inference_only`` arm, load the baseline's
trained weights), ``evaluate`` (accuracy and generalization), ``generation`` (accuracy and cache bytes of
the KV-cache decode path), ``inference`` (prefill/decode speed) and ``memory``. A stage that raises
records each metric it owed as failed with the reason; after a failed ``check`` or ``train``, or a
training run whose loss went non-finite, later stages record "not measured" with that reason instead of
running on a broken model.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import gc
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch

from microscope.api import CALIBRATION_BATCHES, Arm, Role
from microscope.config import WorkloadConfig
from microscope.model_measures import (
    LEAK_NOISE_FACTOR,
    LEAK_SEQ_LEN,
    LEAK_TOLERANCE,
    LONGER_CONTEXTS,
    Measurement,
    first_nonfinite,
    generation,
    inference_speed,
    lm_evaluation,
    memory,
    recall_evaluation,
    smoothed_loss,
    stability,
    train_speed,
)
from microscope.model_setup import TrialSeeds, TrialSetup, WorkloadData, autocast, param_checksum, trial_setup
from microscope.rank_measures import RANK_METRICS, picklable_batches, rank_measurements
from microscope.runner import _describe
from microscope.workloads import (
    ModelConfig,
    TrainResult,
    Transformer,
    WindowSampler,
    build_model,
    eval_windows,
    evaluate_suite,
    future_leak,
    repeat_noise,
    train,
)
from microscope.workloads.train import Distillation

__all__ = ["BaselineRef", "Trial", "build_patched"]


def build_patched(config: ModelConfig, patch: Callable[[Transformer], None] | None) -> Transformer:
    """The arm's model as a rank process builds it: the config's model (its weights are loaded after), patched."""
    model = build_model(config, seed=0, device="cpu")
    if patch is not None:
        patch(model)
    return model


#: ``emit(measurement, status)``: status None means ok unless the value is missing.
Emit = Callable[[Measurement, "str | None"], None]


@dataclass
class BaselineRef:
    """What the candidates of one seed need from that seed's baseline run.

    ``keep_weights``: store the baseline's trained weights (``trained``) for ``inference_only`` arms, and
    a frozen copy of its trained model (``teacher``) for arms that distill from it.
    """

    final_loss: float | None = None
    checksum: str | None = None
    model: ModelConfig | None = None
    greedy_tokens: torch.Tensor | None = None
    keep_weights: bool = False
    trained: dict[str, torch.Tensor] | None = None
    teacher: torch.nn.Module | None = None


@dataclass
class Trial:
    """Runs the planned stages of one (arm, seed); ``plan`` maps stage -> the (dimension, metric) it records."""

    arm: Arm
    seeds: TrialSeeds
    workload: WorkloadConfig
    data: WorkloadData
    device: str
    plan: dict[str, list[tuple[str, str]]]
    emit: Emit
    baseline: BaselineRef
    notes: list[str] = field(default_factory=list)
    setup: TrialSetup | None = None
    model: Transformer | None = None
    result: TrainResult | None = None
    dead: str | None = None
    common: dict[str, Any] = field(default_factory=dict)
    #: the longest an arm's ranks may train (the run's ``timeout_s`` per group: they cannot outlive it)
    rank_timeout_s: float = 600.0

    @property
    def is_baseline(self) -> bool:
        return self.arm.role is Role.BASELINE

    def run(self) -> None:
        try:
            for stage, fn in (("check", self._check), ("train", self._train), ("evaluate", self._evaluate),
                              ("generation", self._generation), ("inference", self._inference),
                              ("memory", self._memory)):
                if stage in self.plan:
                    self._stage(stage, fn)
        finally:
            self.model = None
            gc.collect()
            if self.device == "cuda":
                torch.cuda.empty_cache()

    def _stage(self, stage: str, fn: Callable[[], list[Measurement]]) -> None:
        owed = self.plan[stage]
        if self.dead is not None:
            for dimension, metric in owed:
                self.emit(Measurement(dimension, metric, None, reason=self.dead, details=dict(self.common)), "failed")
            return
        try:
            measured = fn()
        except Exception as exc:  # noqa: BLE001 - any failure of one arm is recorded, the run goes on
            why = _describe(exc)
            for dimension, metric in owed:
                self.emit(Measurement(dimension, metric, None, reason=why, details=dict(self.common)), "failed")
            if stage in ("check", "train"):
                self.dead = f"not measured: {stage} failed ({why})"
            return
        wanted = set(owed)
        for m in measured:
            if (m.dimension, m.metric) in wanted:
                m.details = {**self.common, **m.details}
                self.emit(m, None)

    # -- stages -------------------------------------------------------------------------------------
    def _check(self) -> list[Measurement]:
        """Same initial weights as the baseline (checked by checksum), then the patch, then the leak probe."""
        self.setup = setup = trial_setup(self.workload, self.arm, self.seeds)
        model = build_model(setup.model, seed=self.seeds.init, device=self.device)
        checksum = param_checksum(model)
        ref = self.baseline
        if self.is_baseline:
            ref.checksum, ref.model = checksum, setup.model
        elif ref.model == setup.model and ref.checksum is not None and ref.checksum != checksum:
            raise RuntimeError("initial weights differ from the baseline's under the same model config")
        self.common = {"init_sha256": checksum,
                       "same_init_as_baseline": None if ref.checksum is None else ref.checksum == checksum,
                       "shares_baseline_weights": self.arm.inference_only}
        if self.arm.patch is not None:
            self.arm.patch(model)
        self.model = model
        seq = min(LEAK_SEQ_LEN, setup.context)
        leak = future_leak(model, seq_len=seq, seed=self.seeds.eval)
        noise = repeat_noise(model, seq_len=seq, seed=self.seeds.eval) if leak > LEAK_TOLERANCE else 0.0
        allowed = LEAK_TOLERANCE + LEAK_NOISE_FACTOR * noise
        ok = leak <= allowed
        reason = None if ok else (
            f"attention sees future tokens: earlier logits change by up to {leak:.3g} when only later tokens "
            f"change ({noise:.3g} when nothing changes); this arm's losses are not valid")
        return [Measurement("accuracy", "future_leak", leak, "max |d logit|", passed=ok, reason=reason,
                            details={"seq_len": seq, "tolerance": LEAK_TOLERANCE, "repeat_noise": noise,
                                     "allowed": allowed, "noise_factor": LEAK_NOISE_FACTOR,
                                     "definition": "workloads.checks.future_leak on the patched, untrained model"})]

    def _batches(self):  # noqa: ANN202 - workloads.train.Batches
        assert self.setup is not None
        recipe, context = self.setup.recipe, self.setup.context
        if self.data.recall is not None:
            return self.data.recall.batches(recipe.batch_size, context, self.seeds.data)
        assert self.data.corpus is not None
        return WindowSampler(self.data.corpus.train, context, recipe.batch_size, seed=self.seeds.data)

    def _train(self) -> list[Measurement]:
        assert self.setup is not None and self.model is not None
        if self.arm.inference_only:
            return self._take_baseline_weights()
        recipe = self.setup.recipe
        ranked: list[Measurement] = []
        if self.arm.ranks > 1:
            self.result = result = self._train_on_ranks(ranked)
        else:
            self.result = result = train(self.model, self._batches(), recipe, self.device,
                                         distill=self._distillation())
            for dimension, metric in RANK_METRICS:
                if (dimension, metric) in self.plan["train"]:
                    self.emit(Measurement(dimension, metric, None, reason="single process: no ranks",
                                          details=dict(self.common)), "skipped")
        diverged = first_nonfinite(result.loss)
        own = None if diverged is not None else float(smoothed_loss(result.loss)[-1])
        if self.is_baseline:
            self.baseline.final_loss = own
            if self.baseline.keep_weights and diverged is None:
                self.baseline.trained = {k: v.detach().clone() for k, v in self.model.state_dict().items()}
                self.baseline.teacher = copy.deepcopy(self.model)  # the Trainer freezes it
        amp_row = ("stability", "loss_scale_changes") in self.plan["train"]
        measured = stability(result, self.baseline.final_loss, recipe.warmup, amp_row)
        measured[0].details.update(model_config=self.setup.model.to_dict(), recipe=dataclasses.asdict(recipe),
                                   profile=self.setup.profile.name)
        measured.append(train_speed(result, self.notes))
        measured.extend(ranked)
        if diverged is not None:
            self.dead = f"not measured: training diverged (the loss is non-finite from step {diverged})"
        return measured

    def _distillation(self) -> Distillation | None:
        """The baseline's trained model of this seed as the teacher, for an arm with ``distill``."""
        if not self.arm.distill:
            return None
        if self.baseline.teacher is None:
            raise RuntimeError("distillation arm: this seed's baseline left no trained model to learn from "
                               "(its training failed or diverged)")
        self.common["distilled_from"] = (f"the baseline's trained model of this seed, weight {self.arm.distill:g}, "
                                         f"temperature {self.arm.distill_temperature:g}")
        return Distillation(self.baseline.teacher, self.arm.distill, self.arm.distill_temperature)

    def _train_on_ranks(self, ranked: list[Measurement]) -> TrainResult:
        """Train on ``arm.ranks`` processes; the trained weights come back into ``self.model``, the per-rank
        measurements into ``ranked``."""
        from microscope.distributed import train_on_ranks

        assert self.setup is not None and self.model is not None
        recipe = self.setup.recipe
        state = {k: v.detach().cpu() for k, v in self.model.state_dict().items()}
        build = functools.partial(build_patched, self.setup.model, self.arm.patch)
        res = train_on_ranks(build, state, picklable_batches(self._batches(), recipe.steps), recipe,
                             self.arm.strategy, self.arm.ranks, device_type=torch.device(self.device).type,
                             timeout_s=self.rank_timeout_s)
        self.model.load_state_dict(res.state_dict)
        self.notes.extend(res.notes)
        ranked.extend(rank_measurements(res.ranks, recipe.steps))
        return res.train

    def _take_baseline_weights(self) -> list[Measurement]:
        """An inference-only arm: the baseline's trained weights of this seed, loaded after the patch."""
        assert self.model is not None
        if self.baseline.trained is None:
            raise RuntimeError("inference-only arm: this seed's baseline left no trained weights "
                               "(its training failed or diverged)")
        self.model.load_state_dict(self.baseline.trained)
        if self.arm.calibrate is not None:
            batches = self._batches()
            tokens = [batches(step)[0].to(self.device) for step in range(CALIBRATION_BATCHES)]
            self.arm.calibrate(self.model, tokens)
            self.common["calibration"] = (f"{CALIBRATION_BATCHES} batches of {tuple(tokens[0].shape)} training "
                                          "tokens after loading the trained weights")
        why = "inference-only arm: it does not train; it reuses the baseline's trained weights of this seed"
        for dimension, metric in self.plan["train"]:
            self.emit(Measurement(dimension, metric, None, reason=why, details=dict(self.common)), "skipped")
        return []

    def _evaluate(self) -> list[Measurement]:
        assert self.setup is not None and self.model is not None
        s, margin = self.setup, self.workload.margin
        longer = tuple(sorted(set(self.workload.longer_contexts)))
        if self.data.recall is not None:
            with autocast(self.device, s.recipe.precision):
                measured = recall_evaluation(self.model, self.data.recall, s.context, self.seeds.eval, margin,
                                             longer)
        else:
            corpus = self.data.corpus
            assert corpus is not None
            evals = evaluate_suite(self.model, corpus, s.context, s.eval_tokens, (1, *longer),
                                   batch_size=s.eval_batch_size, device=self.device, precision=s.recipe.precision)
            measured = lm_evaluation(evals, corpus.val, corpus.ood, margin)
        self._skip_longer(longer)
        return measured

    def _skip_longer(self, longer: tuple[int, ...]) -> None:
        """A skipped record for each longer context the config leaves out, so the report says why it is absent."""
        why = f"not evaluated: workload.longer_contexts is {list(longer)}"
        for dimension, metric in self.plan["evaluate"]:
            if any(metric.endswith(f"_{m}x") for m in LONGER_CONTEXTS if m not in longer):
                self.emit(Measurement(dimension, metric, None, reason=why, details=dict(self.common)), "skipped")

    def _prompt(self) -> torch.Tensor:
        """The inference prompt (eval batch x context), the same tokens for every arm of a seed."""
        assert self.setup is not None
        rows, context = self.setup.eval_batch_size, self.setup.context
        if self.data.recall is not None:
            gen = torch.Generator().manual_seed(self.seeds.eval)
            return self.data.recall.sample(rows, context, gen).x.to(self.device)
        assert self.data.corpus is not None
        return eval_windows(self.data.corpus.val, context)[0][:rows].to(self.device)

    def _generation(self) -> list[Measurement]:
        assert self.setup is not None and self.model is not None
        with autocast(self.device, self.setup.recipe.precision):
            measured, greedy = generation(self.model, self._prompt(), self.workload.decode_tokens,
                                          self.baseline.greedy_tokens, self.workload.margin, self.is_baseline)
        if self.is_baseline:
            self.baseline.greedy_tokens = greedy
        return measured

    def _inference(self) -> list[Measurement]:
        assert self.setup is not None and self.model is not None
        with autocast(self.device, self.setup.recipe.precision):
            return inference_speed(self.model, self._prompt(), self.workload.decode_tokens, self.notes)

    def _memory(self) -> list[Measurement]:
        assert self.setup is not None and self.model is not None
        recipe = self.setup.recipe
        trains = not self.arm.inference_only
        if not trains:
            why = "inference-only arm: it does not train, so it has no train step to measure"
            for metric in ("saved_activation_bytes", "train_step_peak_bytes"):
                self.emit(Measurement("memory", metric, None, reason=why, details=dict(self.common)), "skipped")
        return memory(self.model, self._batches()(0), recipe, self._prompt(), self.workload.decode_tokens,
                      self.device, autocast(self.device, recipe.precision), train_step=trains)
