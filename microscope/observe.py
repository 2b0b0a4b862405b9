"""Instruments for one operator-level case: which kernels and ops each candidate replaced.

Runs after a case's measurements, never inside a timed region, and only for the instruments the
config switches on (``instrument:``). The results land in the run folder, where the reports read
them: ``trace_diff.json`` and ``graph_diff.json`` (keyed ``"<variant> @ <case>"``), ``kernels.json``
(top kernels/ops per variant), Chrome traces under ``traces/<case>/<variant>/``, and TensorBoard
text summaries. With ``tensorboard`` or ``graph_diff`` each variant's call is captured as a dataflow
graph (``dataflow_diff.json`` per case, for the report); the first case observed also gives each
variant's sub-run its graph and each candidate a ``diff-<variant>`` sub-run (TensorBoard shows one
graph per run, and the graph of one case's inputs is what a reviewer compares). Per-module hooks
and divergence belong to models (see ``model_runner``): for an operator, the accuracy dimension
already compares the one output that exists.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from microscope.api import Case
from microscope.instrument import InstrumentConfig, RunLogger, diff_graphs, diff_profiles, profile_variant, trace_ops
from microscope.instrument.dataflow import closure_inputs
from microscope.instrument.export import write_instruments
from microscope.instrument.variant_graphs import VariantGraphs, capture_variant, publish_graphs


def case_slug(case: Case) -> str:
    """A folder-safe name for a case id."""
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", case.id)[:120]


def observe_case(
    case: Case,
    thunks: Mapping[str, Callable[[], Any]],
    baseline: str,
    cfg: InstrumentConfig,
    run_dir: Path,
    device: str,
    logger: RunLogger | None = None,
) -> list[str]:
    """Profile and op-trace every variant of ``case``; returns problems (an instrument never fails a run)."""
    problems: list[str] = []
    if baseline not in thunks:
        return [f"{case.id}: no baseline measurement to diff against"]

    def label(name: str) -> str:
        return f"{name} @ {case.id}"

    if cfg.profile.enabled:
        profiles = {}
        for name, thunk in thunks.items():
            try:
                out = run_dir / "traces" / case_slug(case) / name
                profiles[name] = profile_variant(thunk, out, cfg.profile, name=name, device=device)
            except Exception as exc:  # noqa: BLE001 - reported, the run goes on
                problems.append(f"profile of {label(name)} failed: {type(exc).__name__}: {exc}")
        if baseline in profiles:
            diffs = {label(n): diff_profiles(profiles[baseline], p) for n, p in profiles.items() if n != baseline}
            write_instruments(run_dir, trace_diff=diffs)
            _merge_json(run_dir / "kernels.json", {label(n): p.to_dict(cfg.profile.top_k) for n, p in profiles.items()})
            if logger is not None:
                for key, diff in diffs.items():
                    logger.trace_diff(key.split(" @ ")[0], diff)
    if cfg.graph_diff:
        graphs = {}
        for name, thunk in thunks.items():
            try:
                graphs[name] = trace_ops(thunk)
            except Exception as exc:  # noqa: BLE001
                problems.append(f"op trace of {label(name)} failed: {type(exc).__name__}: {exc}")
        if baseline in graphs:
            gdiffs = {label(n): diff_graphs(graphs[baseline], g, baseline=baseline, candidate=n)
                      for n, g in graphs.items() if n != baseline}
            write_instruments(run_dir, graph_diff=gdiffs)
            if logger is not None:
                for key, gdiff in gdiffs.items():
                    logger.graph_diff(key.split(" @ ")[0], gdiff)
    if cfg.dataflow:
        flows = VariantGraphs()
        for name, thunk in thunks.items():
            capture_variant(flows, name, thunk, inputs=closure_inputs(thunk), logger=logger)
        problems += [f"{case.id}: {note}" for note in
                     publish_graphs(flows, baseline, logger=logger, run_dir=run_dir, label=label,
                                    about=f"one call on the inputs of case {case.id}")]
    return problems


def _merge_json(path: Path, entries: Mapping[str, Any]) -> None:
    data = json.loads(path.read_text(encoding="utf-8")) if path.exists() else {}
    data.update(entries)
    path.write_text(json.dumps(data, indent=1, default=str), encoding="utf-8")
