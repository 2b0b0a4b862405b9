"""Graphs of a comparison's variants, where reviewers look: TensorBoard's Graphs tab and the report.

``capture_variant`` records one variant's dataflow graph (``dataflow.capture_dataflow``, with a
model's callable swap points wrapped so a swapped ``attn_fn`` is a scope of its own). It never
raises: a variant whose capture fails gets a note saying which variant and why, and, for a model,
``torch.jit.trace`` (``add_graph``) is tried instead so the Graphs tab is not left empty.
``publish_graphs`` then writes every captured graph to its sub-run, diffs each candidate against the
baseline (``dataflow_diff``) into the sub-run ``diff-<candidate>``, and saves the diffs to
``dataflow_diff.json`` in the run folder, which the HTML report draws.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from microscope.instrument.callables import wrap_callables
from microscope.instrument.dataflow import DataflowGraph, capture_dataflow
from microscope.instrument.dataflow_diff import DataflowDiff, diff_dataflow
from microscope.instrument.export import write_instruments
from microscope.instrument.tensorboard import RunLogger, diff_subrun

__all__ = ["VariantGraphs", "capture_variant", "publish_graphs"]


@dataclass
class VariantGraphs:
    """The graphs captured for one comparison (one case, or one model step), and notes on failures."""

    graphs: dict[str, DataflowGraph] = field(default_factory=dict)
    notes: dict[str, str] = field(default_factory=dict)


def _first_line(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {(str(exc).strip().splitlines() or [''])[0][:300]}"


def capture_variant(
    into: VariantGraphs,
    name: str,
    fn: Callable[[], Any],
    *,
    model: nn.Module | None = None,
    inputs: Mapping[str, Any] | None = None,
    example_inputs: Any = None,
    logger: RunLogger | None = None,
) -> None:
    """Capture ``fn()``'s graph as ``into.graphs[name]``; on failure a note (and, for a model, jit.trace).

    ``inputs`` names the tensors ``fn`` reads (``q``, ``k``, ``v``); ``example_inputs`` are what
    ``jit.trace`` would call ``model`` with.
    """
    try:
        with wrap_callables(model) if model is not None else contextlib.nullcontext():
            into.graphs[name] = capture_dataflow(fn, model=model, inputs=inputs)
        return
    except Exception as exc:  # noqa: BLE001 - any failure becomes a note; the run goes on
        reason = f"no dataflow graph for {name}: the dispatch capture failed ({_first_line(exc)})"
    if model is not None and example_inputs is not None and logger is not None:
        jit_note = logger.graph(name, model, example_inputs)
        reason += "; the Graphs tab shows torch.jit.trace's graph instead" if jit_note is None else f"; {jit_note}"
    into.notes[name] = reason
    if logger is not None:
        logger.graph_note(name, reason)


def publish_graphs(
    captured: VariantGraphs,
    baseline: str,
    *,
    logger: RunLogger | None,
    run_dir: Path,
    label: Callable[[str], str] = str,
    about: str = "",
) -> list[str]:
    """Write the graphs and the diffs against ``baseline``; returns the notes (problems) to report.

    ``label`` names a candidate's entry in ``dataflow_diff.json`` (e.g. ``"triton @ seq=100"``);
    ``about`` says what was captured (shown next to each graph in TensorBoard).
    """
    if logger is not None:
        for name, graph in captured.graphs.items():
            if not logger.has_graph(name):
                logger.dataflow(name, graph, about=about)
    diffs: dict[str, DataflowDiff] = {}
    if baseline in captured.graphs:
        base = captured.graphs[baseline]
        for name, graph in captured.graphs.items():
            if name != baseline:
                diffs[name] = diff_dataflow(base, graph, baseline=baseline, candidate=name)
    if logger is not None:
        for name, diff in diffs.items():
            if not logger.has_graph(diff_subrun(name)):
                logger.dataflow_diff(diff, about=about)
    if diffs:
        write_instruments(run_dir, dataflow_diff={label(n): d for n, d in diffs.items()})
    problems = list(captured.notes.values())
    if baseline not in captured.graphs and len(captured.graphs) + len(captured.notes) > 1:
        problems.append(f"no diff graphs: the baseline {baseline!r} has no dataflow graph")
    return problems

