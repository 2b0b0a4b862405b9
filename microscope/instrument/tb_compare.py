"""Two runs' TensorBoard logs side by side, for ``microscope compare`` (e.g. main vs a branch).

``write_side_by_side(run_a, run_b, out)`` copies every sub-run of each side into one logdir as
``A-<sub-run>`` and ``B-<sub-run>`` (``A-eager``, ``B-triton``, ``A-diff-triton``...), so TensorBoard
overlays their scalars and histograms and its Graphs tab switches between their graphs. For every
variant whose dataflow graph both sides hold it also writes the union of A's and B's graph as the
sub-run ``diff-B-<variant>`` (see ``dataflow_diff``): what the branch changed in that variant's graph,
which is empty when the graphs agree. A side is a run folder or a folder of repeated runs (the
first run with logs is used: graphs do not change between repeats of one commit).
"""

from __future__ import annotations

import shutil
from dataclasses import dataclass, field
from pathlib import Path

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from microscope.instrument.dataflow import DataflowGraph
from microscope.instrument.dataflow_diff import diff_dataflow
from microscope.instrument.graphdef import from_graph_def
from microscope.instrument.tensorboard import DIFF_PREFIX, RunLogger

__all__ = ["SideBySide", "side_logdir", "write_side_by_side"]

_EVENTS = "events.out.tfevents.*"


@dataclass
class SideBySide:
    """What ``write_side_by_side`` wrote: the logdir, its sub-runs, and why a side gave nothing."""

    logdir: Path
    subruns: list[str] = field(default_factory=list)
    diffs: dict[str, str] = field(default_factory=dict)  # variant -> headline of B's graph vs A's
    notes: list[str] = field(default_factory=list)


def side_logdir(side: str | Path) -> Path | None:
    """The ``tensorboard/`` folder of a run folder, or of the first run in a folder of runs."""
    side = Path(side)
    if (side / "tensorboard").is_dir():
        return side / "tensorboard"
    runs = sorted(p / "tensorboard" for p in side.iterdir() if (p / "tensorboard").is_dir()) if side.is_dir() else []
    return runs[0] if runs else None


def _subruns(logdir: Path) -> dict[str, Path]:
    return {p.name: p for p in sorted(logdir.iterdir()) if p.is_dir() and any(p.glob(_EVENTS))}


def _graph(subrun: Path) -> DataflowGraph | None:
    acc = EventAccumulator(str(subrun), size_guidance={"scalars": 1, "histograms": 1, "tensors": 1})
    acc.Reload()
    if not acc.Tags().get("graph"):
        return None
    return DataflowGraph(from_graph_def(acc.Graph()))


def write_side_by_side(run_a: str | Path, run_b: str | Path, out: str | Path,
                       labels: tuple[str, str] = ("A", "B")) -> SideBySide:
    """Copy both runs' sub-runs into ``out`` as ``<label>-<sub-run>`` and diff the graphs they share."""
    out = Path(out)
    result = SideBySide(out)
    sides = {}
    for label, side in zip(labels, (run_a, run_b)):
        logdir = side_logdir(side)
        if logdir is None:
            result.notes.append(f"side {label} ({side}) has no TensorBoard logs: run it with "
                                "--set instrument.tensorboard=true")
            continue
        sides[label] = _subruns(logdir)
        for name, path in sides[label].items():
            target = out / f"{label}-{name}"
            if target.exists():
                shutil.rmtree(target)
            shutil.copytree(path, target)
            result.subruns.append(target.name)
    if len(sides) < 2:
        return result
    (a_label, a), (b_label, b) = sides.items()
    with RunLogger(out) as logger:
        for variant in (v for v in a if v in b and not v.startswith(DIFF_PREFIX)):
            ga, gb = _graph(a[variant]), _graph(b[variant])
            if ga is None or gb is None:
                result.notes.append(f"{variant}: no graph in side {a_label if ga is None else b_label}")
                continue
            diff = diff_dataflow(ga, gb, baseline=f"{a_label}-{variant}", candidate=f"{b_label}-{variant}")
            result.subruns.append(logger.dataflow_diff(diff, about=f"{variant}: side {b_label} against side {a_label}"))
            result.diffs[variant] = diff.headline
    return result
