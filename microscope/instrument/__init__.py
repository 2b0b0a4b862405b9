"""Instruments: where and why a change moved a number.

A verdict says *that* a candidate is faster, less accurate or less stable than the baseline. The
instruments show *where* and *why*, on identical inputs, weights and seeds:

* ``ActivationRecorder`` + ``divergence``: per-module activation and gradient statistics (range
  hazards for fp16/bf16 included) and the first module whose output departs from the baseline
  ("divergence starts at blocks.3.attn.attn_fn").
* ``profile_variant`` + ``diff_profiles``: ``torch.profiler`` Chrome traces and kernel tables per
  variant, and which kernels/ops a change replaced ("3 kernels replaced by 1 fused kernel, -41% GPU
  time").
* ``trace_ops`` / ``compare_models`` + ``diff_graphs``: the ops each variant executed and a
  node-by-node diff (ops removed, added, replaced).
* ``capture_dataflow`` + ``diff_dataflow``: the dataflow graph a variant ran (ops folded by module,
  custom Functions and Triton kernels as one node) and the union of two such graphs with every node
  removed, added, changed or same; ``to_graph_def`` makes either a TensorBoard graph.
* ``RunLogger``: TensorBoard logs with one sub-run per variant (graphs, histograms, scalars) and one
  ``diff-<variant>`` sub-run per diff graph; ``tb_launch`` serves them (``microscope tensorboard``),
  ``tb_compare`` lays two runs' logs side by side.
* ``InstrumentConfig``: the switches; every default is off or cheapest.

Nothing here runs unless asked: with the switches off no hook is registered and no method patched.
"""

from microscope.instrument.callables import SWAP_POINTS, OpModule, wrap_callables
from microscope.instrument.capture import Capture, Observation
from microscope.instrument.config import InstrumentConfig, ProfileConfig
from microscope.instrument.dataflow import DataflowGraph, DataflowNode, capture_dataflow
from microscope.instrument.dataflow_diff import DataflowDiff, DiffNode, diff_dataflow
from microscope.instrument.divergence import DivergenceReport, DivergenceRow, divergence
from microscope.instrument.export import INSTRUMENT_FILES, write_instruments
from microscope.instrument.gradnorms import layer_grad_norms
from microscope.instrument.graphdef import from_graph_def, to_graph_def
from microscope.instrument.graphdiff import GraphDiff, Replacement, compare_models, diff_graphs
from microscope.instrument.hooks import ActivationRecorder
from microscope.instrument.opaque import label_calls
from microscope.instrument.optrace import FxTraceError, OpGraph, OpNode, capture_graph, fx_graph, trace_ops
from microscope.instrument.profiler import OpStat, VariantProfile, profile_variant, readable_kernel_name
from microscope.instrument.tensorboard import RunLogger
from microscope.instrument.tensorstats import (
    BF16_UNSAFE,
    FP16_MAX,
    FP16_MIN_SUBNORMAL,
    STAT_NAMES,
    relative_error,
    sketch,
    summarize,
)
from microscope.instrument.tracediff import TraceDiff, TraceDiffRow, diff_profiles

_LAZY = {"Overhead", "count_hooks", "measure_overhead"}


def __getattr__(name: str):
    # ``overhead`` is also a script (python -m microscope.instrument.overhead); importing it here
    # eagerly would make runpy warn that the module was imported before it ran.
    if name in _LAZY:
        from microscope.instrument import overhead

        return getattr(overhead, name)
    raise AttributeError(f"module 'microscope.instrument' has no attribute {name!r}")

__all__ = [
    "BF16_UNSAFE",
    "FP16_MAX",
    "FP16_MIN_SUBNORMAL",
    "INSTRUMENT_FILES",
    "STAT_NAMES",
    "SWAP_POINTS",
    "ActivationRecorder",
    "Capture",
    "DataflowDiff",
    "DataflowGraph",
    "DataflowNode",
    "DiffNode",
    "DivergenceReport",
    "DivergenceRow",
    "FxTraceError",
    "GraphDiff",
    "InstrumentConfig",
    "Observation",
    "OpGraph",
    "OpModule",
    "OpNode",
    "OpStat",
    "Overhead",
    "ProfileConfig",
    "Replacement",
    "RunLogger",
    "TraceDiff",
    "TraceDiffRow",
    "VariantProfile",
    "capture_dataflow",
    "capture_graph",
    "compare_models",
    "count_hooks",
    "diff_dataflow",
    "diff_graphs",
    "diff_profiles",
    "divergence",
    "from_graph_def",
    "fx_graph",
    "label_calls",
    "layer_grad_norms",
    "measure_overhead",
    "profile_variant",
    "readable_kernel_name",
    "relative_error",
    "sketch",
    "summarize",
    "to_graph_def",
    "trace_ops",
    "wrap_callables",
    "write_instruments",
]
