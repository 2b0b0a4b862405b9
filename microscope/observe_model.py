"""Instruments at model level: where inside the model each arm departs from the baseline.

Every arm is built from the same initial weights (seed index 0), patched, and run for one
forward+backward step on the same first training batch, with hooks on every module. Before any
training the only difference between the arms is the change itself, so the first module whose
activations (or gradients) diverge is where the change acts: "divergence starts at
blocks.0.attn.attn_fn". The same step is op-traced (``graph_diff``) and profiled (``profile``).
Its forward pass is captured as a dataflow graph (``tensorboard`` or ``graph_diff``): each arm's graph
in its TensorBoard sub-run, the union with the baseline's as ``diff-<arm>``, and ``dataflow_diff.json``
for the report. With TensorBoard on, activation and gradient histograms per module are written too
(``InstrumentConfig.model_histogram_bins``). Results go to ``divergence.json``, ``graph_diff.json``,
``trace_diff.json``, ``dataflow_diff.json`` and TensorBoard.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from microscope.api import Arm
from microscope.config import InstrumentConfig, WorkloadConfig
from microscope.instrument import (
    ActivationRecorder,
    RunLogger,
    diff_graphs,
    diff_profiles,
    divergence,
    profile_variant,
    trace_ops,
    wrap_callables,
)
from microscope.instrument.export import write_instruments
from microscope.instrument.variant_graphs import VariantGraphs, capture_variant, publish_graphs
from microscope.model_setup import TrialSeeds, WorkloadData, autocast, trial_setup
from microscope.workloads import TrainResult, WindowSampler, build_model, lm_loss

#: Rows of the first batch used for the instrumented step (enough to exercise every op, cheap).
OBSERVE_ROWS = 2


def _first_batch(data: WorkloadData, context: int, seeds: TrialSeeds) -> tuple[torch.Tensor, torch.Tensor]:
    if data.recall is not None:
        return data.recall.batches(OBSERVE_ROWS, context, seeds.data)(0)
    assert data.corpus is not None
    return WindowSampler(data.corpus.train, context, OBSERVE_ROWS, seeds.data)(0)


def _forward(model: torch.nn.Module, batch: tuple[torch.Tensor, torch.Tensor], device: str,
             precision: str) -> Callable[[], torch.Tensor]:
    """The training step's forward pass and loss (what the dataflow graph shows)."""
    x, y = (t.to(device) for t in batch)

    def run() -> torch.Tensor:
        with autocast(device, precision):
            logits = model(x)
        return lm_loss(logits, y)

    return run


def _step(forward: Callable[[], torch.Tensor], model: torch.nn.Module) -> Callable[[], None]:
    def run() -> None:
        model.zero_grad(set_to_none=True)
        forward().backward()

    return run


def observe_models(
    arms: Sequence[tuple[str, Arm]],
    workload: WorkloadConfig,
    data: WorkloadData,
    seeds: TrialSeeds,
    device: str,
    cfg: InstrumentConfig,
    run_dir: Path,
    logger: RunLogger | None = None,
) -> list[str]:
    """Instrument one step of every arm (baseline first in ``arms``); returns problems, never raises."""
    problems: list[str] = []
    base = arms[0][0]
    captures: dict[str, Any] = {}
    graphs: dict[str, Any] = {}
    profiles: dict[str, Any] = {}
    flows = VariantGraphs()
    bins = cfg.model_histogram_bins if logger is not None else 0
    for name, arm in arms:
        try:
            setup = trial_setup(workload, arm, seeds)
            model = build_model(setup.model, seed=seeds.init, device=device)
            model.set_checkpointing(setup.recipe.checkpoint_every)
            if arm.patch is not None:
                arm.patch(model)
            batch = _first_batch(data, setup.context, seeds)
            forward = _forward(model, batch, device, setup.recipe.precision)
            step = _step(forward, model)
            if cfg.hooks or bins:
                with wrap_callables(model), ActivationRecorder(
                    model, backward=cfg.backward_hooks, keep=cfg.keep if cfg.hooks else "stats", histograms=bins
                ) as recorder:
                    step()
                if cfg.hooks:
                    captures[name] = recorder.capture
                if logger is not None:
                    logger.capture(name, recorder.capture)
            if cfg.dataflow:
                capture_variant(flows, name, forward, model=model, example_inputs=batch[0].to(device),
                                logger=logger)
            if cfg.graph_diff:
                graphs[name] = trace_ops(step, model=model)
            if cfg.profile.enabled:
                profiles[name] = profile_variant(step, run_dir / "traces" / "model" / name, cfg.profile,
                                                 name=name, device=device)
        except Exception as exc:  # noqa: BLE001 - an instrument never fails the run
            problems.append(f"instrumenting arm {name!r} failed: {type(exc).__name__}: {exc}")
    others = [name for name, _ in arms[1:]]
    if base in captures:
        reports = {}
        for name in others:
            if name in captures:
                reports[name] = divergence(captures[base], captures[name], cfg.divergence_threshold)
                if cfg.backward_hooks:
                    reports[f"{name} (gradients)"] = divergence(
                        captures[base], captures[name], cfg.divergence_threshold, kind="backward")
                if logger is not None:
                    logger.divergence(name, reports[name])
        write_instruments(run_dir, divergence=reports)
    if base in graphs:
        gdiffs = {n: diff_graphs(graphs[base], graphs[n], baseline=base, candidate=n) for n in others if n in graphs}
        write_instruments(run_dir, graph_diff=gdiffs)
        if logger is not None:
            for name, gdiff in gdiffs.items():
                logger.graph_diff(name, gdiff)
    if base in profiles:
        write_instruments(run_dir, trace_diff={n: diff_profiles(profiles[base], profiles[n])
                                               for n in others if n in profiles})
    if cfg.dataflow:
        problems += publish_graphs(flows, base, logger=logger, run_dir=run_dir,
                                   about=f"forward pass and loss of the first training step ({OBSERVE_ROWS} rows)")
    return problems


def log_training(logger: RunLogger, arm: str, seed_index: int, result: TrainResult) -> None:
    """Loss curve per seed, global and per-layer gradient norms and training speed, per arm sub-run."""
    logger.loss_curve(arm, result.loss.tolist(), seed=seed_index)
    writer = logger.writer(arm)
    for step, norm in enumerate(result.grad_norm.tolist()):
        writer.add_scalar(f"grad_norm/seed{seed_index}", norm, step)
    for i, layer in enumerate(result.layer_names):
        writer.add_scalar(f"grad_norm_final/{layer}", float(result.layer_grad_norm[-1, i]), seed_index)
    logger.throughput(arm, result.tokens_per_s(skip=min(1, len(result.loss) - 1)), step=seed_index)
