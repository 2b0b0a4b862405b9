"""TensorBoard logs of a run: one sub-run per variant, so baseline and candidates overlay.

Layout: ``<logdir>/<variant>/events.out.tfevents...``; the runner uses
``results/<run-id>/tensorboard`` as ``logdir``, so ``tensorboard --logdir results/<run-id>/tensorboard``
shows every variant as its own run with the same tags, side by side:

================================  ============================================================
``loss/seed<k>``                  loss curve of seed ``k`` (step = training step)
``grad_norm/<layer>``, ``/total`` per-layer gradient norms (``gradnorms.layer_grad_norms``)
``throughput/<unit>``             e.g. ``throughput/tokens_per_s``
``activations/<module>``          histogram of a module's output (recorder with histograms or
``gradients/<module>``            ``keep="full"``), and of the gradient w.r.t. it
``divergence/<kind>``             relative error vs the baseline per module (step = execution
                                  index, so the curve shows where along the depth it starts),
                                  with a text table of the same name
graph                             the variant's dataflow graph (``dataflow``: ops folded by module,
                                  Functions and kernels as one node each), ``add_graph``'s jit trace
                                  as a fallback, or the text ``graph/note`` saying why neither worked
``graph_diff``, ``trace_diff``    text: the op-level graph diff and the profile diff vs the baseline
================================  ============================================================

A diff of two variants' dataflow graphs is a sub-run of its own, ``diff-<candidate>``: its graph is
the union of both, nodes under ``removed/``, ``added/``, ``changed/`` and ``same/`` (see
``dataflow_diff``), with the text ``graph/diff`` summarising it.
"""

from __future__ import annotations

import math
import re
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
from torch import nn
from torch.utils.tensorboard import SummaryWriter

from microscope.instrument.capture import Capture, Observation
from microscope.instrument.dataflow import DataflowGraph
from microscope.instrument.dataflow_diff import DataflowDiff
from microscope.instrument.divergence import DivergenceReport
from microscope.instrument.gradnorms import layer_grad_norms
from microscope.instrument.graphdef import to_graph_def, write_graph_def
from microscope.instrument.graphdiff import GraphDiff
from microscope.instrument.tensorstats import STAT_NAMES
from microscope.instrument.tracediff import TraceDiff

__all__ = ["DIFF_PREFIX", "RunLogger", "diff_subrun"]

_SAFE = re.compile(r"[^A-Za-z0-9_.\-]")
#: Sub-run of the diff graph of a candidate against the baseline: ``diff-<candidate>``.
DIFF_PREFIX = "diff-"


def _subdir(variant: str) -> str:
    """A variant name as a folder name (TensorBoard shows the folder as the run's name)."""
    name = _SAFE.sub("_", variant).strip(".")
    if not name:
        raise ValueError(f"variant name {variant!r} has no usable characters for a folder name")
    return name


def diff_subrun(candidate: str) -> str:
    """The sub-run (folder) holding the diff graph of ``candidate`` against the baseline."""
    return DIFF_PREFIX + _subdir(candidate)


class RunLogger:
    """Writes TensorBoard event files for the variants of one run (``<logdir>/<variant>/``).

    Writers are opened on first use and flushed by ``flush``/``close``; use it as a context manager.
    """

    def __init__(self, logdir: str | Path) -> None:
        self.logdir = Path(logdir)
        self._writers: dict[str, SummaryWriter] = {}
        self._graphs: set[str] = set()

    # -- plumbing -------------------------------------------------------------------------------
    def writer(self, variant: str) -> SummaryWriter:
        """The ``SummaryWriter`` of ``variant``'s sub-run."""
        if variant not in self._writers:
            self._writers[variant] = SummaryWriter(log_dir=str(self.logdir / _subdir(variant)))
        return self._writers[variant]

    def flush(self) -> None:
        for writer in self._writers.values():
            writer.flush()

    def close(self) -> None:
        for writer in self._writers.values():
            writer.close()
        self._writers.clear()

    def __enter__(self) -> RunLogger:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # -- scalars --------------------------------------------------------------------------------
    def scalar(self, variant: str, tag: str, value: float, step: int = 0) -> None:
        self.writer(variant).add_scalar(tag, float(value), step)

    def loss_curve(self, variant: str, losses: Sequence[float], *, seed: int, start_step: int = 0) -> None:
        """``loss/seed<seed>`` for each step; NaN/Inf losses are written too (TensorBoard marks them)."""
        writer = self.writer(variant)
        for i, loss in enumerate(losses):
            writer.add_scalar(f"loss/seed{seed}", float(loss), start_step + i)

    def grad_norms(self, variant: str, norms: nn.Module | dict[str, float], step: int, *, depth: int = 2) -> None:
        """``grad_norm/<layer>`` and ``grad_norm/total`` from a model's ``.grad`` or a precomputed dict."""
        values = layer_grad_norms(norms, depth) if isinstance(norms, nn.Module) else norms
        writer = self.writer(variant)
        for layer, value in values.items():
            writer.add_scalar(f"grad_norm/{layer}", float(value), step)

    def throughput(self, variant: str, value: float, *, unit: str = "tokens_per_s", step: int = 0) -> None:
        self.writer(variant).add_scalar(f"throughput/{unit}", float(value), step)

    # -- recorder -------------------------------------------------------------------------------
    def capture(self, variant: str, capture: Capture, step: int = 0) -> int:
        """Histograms of activations and gradients; returns how many were written.

        A histogram needs the data: either the recorder kept full tensors (``keep="full"``) or it
        computed histograms (``histograms=<bins>``). A statistics-only capture writes none.
        """
        writer = self.writer(variant)
        written = 0
        for kind, prefix in (("forward", "activations"), ("backward", "gradients")):
            for obs in capture.observations(kind):  # type: ignore[arg-type]
                if _histogram(writer, f"{prefix}/{obs.label}", obs, step):
                    written += 1
        return written

    def divergence(self, variant: str, report: DivergenceReport) -> None:
        """Relative error per module (step = execution index) and a text table naming the modules."""
        writer = self.writer(variant)
        tag = f"divergence/{report.kind}"
        for row in report.rows:
            value = row.rel_err if math.isfinite(row.rel_err) else float("inf")
            writer.add_scalar(tag, value, row.index)
        lines = [report.summary(), "", "| # | module | rel err | diverged |", "| ---: | --- | ---: | --- |"]
        for r in report.rows:
            lines.append(f"| {r.index} | `{r.module}` | {r.rel_err:.3e} | {'yes' if r.diverged else ''} |")
        writer.add_text(tag, "\n".join(lines))

    # -- graphs ---------------------------------------------------------------------------------
    def has_graph(self, subrun: str) -> bool:
        """Whether this logger already wrote a graph for ``subrun`` (TensorBoard shows one per run)."""
        return _subdir(subrun) in self._graphs

    def dataflow(self, variant: str, graph: DataflowGraph, *, about: str = "") -> None:
        """The variant's dataflow graph in its sub-run's Graphs tab; ``about`` (e.g. the case) as text."""
        write_graph_def(self.writer(variant), to_graph_def(graph.nodes))
        self._graphs.add(_subdir(variant))
        if about or graph.note:
            self.writer(variant).add_text("graph/about", " ".join(t for t in (about, graph.note) if t))

    def dataflow_diff(self, diff: DataflowDiff, *, about: str = "") -> str:
        """The union graph of ``diff`` as the sub-run ``diff-<candidate>``; returns the sub-run's name."""
        subrun = diff_subrun(diff.candidate)
        writer = self.writer(subrun)
        write_graph_def(writer, to_graph_def(diff.nodes))
        self._graphs.add(subrun)
        lines = [f"**{diff.baseline} -> {diff.candidate}**{f' ({about})' if about else ''}: {diff.headline}", "",
                 "Graphs tab: open `removed/`, `added/`, `changed/` and `same/`; each folds by module. "
                 "Colour by device to tell them apart."]
        if diff.note:
            lines += ["", f"_{diff.note}_"]
        writer.add_text("graph/diff", "\n".join(lines))
        return subrun

    def graph_note(self, variant: str, note: str) -> None:
        """The text ``graph/note`` of a sub-run whose graph could not be captured (why, and which variant)."""
        self.writer(variant).add_text("graph/note", note)

    def graph(self, variant: str, model: nn.Module, example_inputs: Any) -> str | None:
        """``add_graph`` of the model; if tracing fails, a ``graph/note`` text saying so (returned)."""
        writer = self.writer(variant)
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")  # TracerWarnings about Python values baked into the trace
                writer.add_graph(model, example_inputs, use_strict_trace=False)
            self._graphs.add(_subdir(variant))
            return None
        except Exception as exc:  # jit tracing raises many kinds; the note records which
            first = (str(exc).strip().splitlines() or [""])[0][:300]
            note = (f"no graph for {variant}: torch.jit.trace failed ({type(exc).__name__}: {first}). "
                    "The ops it executed are listed in the graph diff (dispatch trace) instead.")
            writer.add_text("graph/note", note)
            return note

    def graph_diff(self, variant: str, diff: GraphDiff) -> None:
        """The graph diff vs the baseline as the text summary ``graph_diff`` of the candidate's sub-run."""
        self.writer(variant).add_text("graph_diff", diff.to_markdown())

    def trace_diff(self, variant: str, diff: TraceDiff) -> None:
        self.writer(variant).add_text("trace_diff", diff.to_markdown())


_N, _MEAN, _L2, _NAN, _INF = (STAT_NAMES.index(k) for k in ("numel", "mean", "l2", "nan_frac", "inf_frac"))


def _histogram(writer: SummaryWriter, tag: str, obs: Observation, step: int) -> bool:
    if obs.tensor is not None:
        finite = obs.tensor.detach().float()
        finite = finite[torch.isfinite(finite)]
        if finite.numel():
            writer.add_histogram(tag, finite, step)
            return True
        return False
    if obs.histogram is None or obs.hist_range is None:
        return False
    counts = obs.histogram.tolist()
    lo, hi = obs.hist_range
    width = (hi - lo) / len(counts)
    s = obs.summary.tolist()
    n_finite = s[_N] * (1.0 - s[_NAN] - s[_INF])
    writer.add_histogram_raw(tag, min=lo, max=hi, num=round(n_finite), sum=s[_MEAN] * n_finite,
                             sum_squares=s[_L2] ** 2, bucket_limits=[lo + width * (i + 1) for i in range(len(counts))],
                             bucket_counts=counts, global_step=step)
    return True
