"""Switches for the instruments: which of them run, and how much they keep.

Instruments answer *where* and *why* a change moved a number; the verdicts answer *that* it did. They
cost time and disk, so every switch defaults to off (or to its cheapest setting) and a run pays only
for what its config asks for. The dataclasses are frozen and hold only plain values (bool, int,
float, a Literal), so ``microscope.config`` can validate them from YAML like any other section::

    instrument:
      hooks: true                 # per-module activation/gradient statistics + divergence
      divergence_threshold: 1e-3  # relative error that counts as "diverged"
      profile: {enabled: true, wait: 1, warmup: 1, active: 3}
      tensorboard: true
      graph_diff: true
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

__all__ = ["DEFAULT_HISTOGRAM_BINS", "InstrumentConfig", "ProfileConfig"]

#: Histogram bins per module when TensorBoard is on at model level and ``histograms`` is not set:
#: enough to show a distribution's shape, and one small ``histc`` per module output and gradient
#: (flash_attn_model --quick on a CPU: 66 histograms per arm, 1.3 s and 80 KiB of event files in all).
DEFAULT_HISTOGRAM_BINS = 32


@dataclass(frozen=True)
class ProfileConfig:
    """A ``torch.profiler`` schedule and what the trace records.

    The profiler skips ``wait`` steps, records but discards ``warmup`` steps (first-call costs such
    as allocator growth, autotuning or lazy initialisation would otherwise dominate), then keeps
    ``active`` steps; tables and diffs report totals over the active steps and per-step averages.
    ``record_shapes`` and ``profile_memory`` make the Chrome trace richer (input shapes and
    allocations per op) at some profiling overhead; they never affect the timed measurements, which
    run without the profiler.
    """

    enabled: bool = False
    wait: int = 1
    warmup: int = 1
    active: int = 3
    record_shapes: bool = True
    profile_memory: bool = True
    with_stack: bool = False  # Python stacks in the trace: useful, but large files and slow export
    top_k: int = 20  # rows of the kernel summary shown in reports

    def __post_init__(self) -> None:
        if self.wait < 0 or self.warmup < 0:
            raise ValueError("profile wait and warmup must be >= 0")
        if self.active < 1:
            raise ValueError("profile active must be >= 1 (the steps that are kept)")
        if self.top_k < 1:
            raise ValueError("profile top_k must be >= 1")

    @property
    def steps(self) -> int:
        """How many times the profiled function is called in total."""
        return self.wait + self.warmup + self.active


@dataclass(frozen=True)
class InstrumentConfig:
    """Which instruments run for a plugin's variants. Every default is off or cheapest.

    ``hooks``                 forward (and ``backward_hooks``) hooks on every module: statistics per
                              module output, and the divergence of each candidate from the baseline.
    ``keep``                  what the hooks keep per module output besides its statistics:
                              ``"sketch"`` (1024 float64 numbers: enough for an estimate of the
                              relative error with a few percent accuracy, and exact zeros stay zero),
                              ``"full"`` (a copy of every tensor: exact, only for small models) or
                              ``"stats"`` (nothing; no divergence can be computed).
    ``histograms``            bins of an activation/gradient histogram per module (0 = none); on a
                              GPU each histogram costs one device synchronisation. Unset (None):
                              ``DEFAULT_HISTOGRAM_BINS`` at model level when ``tensorboard`` is on
                              (so the Histograms tab overlays the arms), none otherwise.
    ``divergence_threshold``  relative error ``||a-b|| / ||a||`` above which a module "diverges".
                              1e-3 lies well above fp32 rounding noise (~1e-6) and below bf16's unit
                              roundoff (3.9e-3), so an fp32 reordering stays quiet while a change of
                              bf16 size is named.
    ``profile``               ``torch.profiler`` traces and kernel tables (see ``ProfileConfig``).
    ``tensorboard``           write ``<run>/tensorboard/<variant>/`` event files, with each variant's
                              dataflow graph and a ``diff-<candidate>`` graph sub-run.
    ``graph_diff``            trace the ops each variant executes and diff them against the baseline
                              (and capture the dataflow graphs the HTML report draws as a diff).
    """

    hooks: bool = False
    backward_hooks: bool = True
    keep: Literal["stats", "sketch", "full"] = "sketch"
    histograms: int | None = None
    divergence_threshold: float = 1e-3
    profile: ProfileConfig = field(default_factory=ProfileConfig)
    tensorboard: bool = False
    graph_diff: bool = False

    def __post_init__(self) -> None:
        # ``keep`` is a Literal: microscope.config reports a wrong value with file:line and a
        # suggestion, and ActivationRecorder refuses it; numbers are checked here.
        if self.histograms is not None and self.histograms < 0:
            raise ValueError("instrument histograms (bins) must be >= 0")
        if not self.divergence_threshold > 0:
            raise ValueError("instrument divergence_threshold must be > 0")

    @property
    def model_histogram_bins(self) -> int:
        """Histogram bins per module output at model level (0: none); see ``histograms``."""
        if self.histograms is not None:
            return self.histograms
        return DEFAULT_HISTOGRAM_BINS if self.tensorboard else 0

    @property
    def dataflow(self) -> bool:
        """True when the variants' dataflow graphs are captured (TensorBoard's Graphs tab, report)."""
        return self.tensorboard or self.graph_diff

    @property
    def enabled(self) -> bool:
        """True when at least one instrument runs (the runner can skip all set-up otherwise)."""
        return self.hooks or self.profile.enabled or self.tensorboard or self.graph_diff
