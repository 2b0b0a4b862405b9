"""What a recorder keeps: one ``Observation`` per tensor a hook saw, grouped in a ``Capture``.

Observations are created on the tensor's device (so hooks never wait for the device) and brought to
the host together by ``Capture.finalize`` once the recorded pass is over.
"""

from __future__ import annotations

from collections import defaultdict
from dataclasses import dataclass, field
from typing import Any, Literal

import torch

from microscope.instrument.tensorstats import STAT_NAMES, stats_dict

__all__ = ["Capture", "Keep", "Kind", "Observation"]

#: What a recorder keeps per tensor besides its statistics.
Keep = Literal["stats", "sketch", "full"]
#: Which pass an observation belongs to.
Kind = Literal["forward", "backward"]


@dataclass
class Observation:
    """One tensor a hook saw: a module's output (forward) or the gradient w.r.t. that output (backward).

    ``call`` counts the module's calls within the recording (a module used twice has calls 0 and 1;
    in the backward pass call 0 is the gradient that arrives first). ``output`` indexes the floating
    tensors of the module's output (forward) or of ``grad_output`` (backward).
    """

    kind: str
    index: int
    module: str
    call: int
    output: int
    n_outputs: int
    shape: tuple[int, ...]
    dtype: str
    summary: torch.Tensor
    sketch: torch.Tensor | None = None
    tensor: torch.Tensor | None = None
    histogram: torch.Tensor | None = None
    hist_range: tuple[float, float] | None = None

    @property
    def key(self) -> tuple[str, int, int]:
        """What identifies the same tensor across two runs of the same architecture."""
        return (self.module, self.call, self.output)

    @property
    def label(self) -> str:
        """Readable name: ``layers.2.mlp``, ``layers.2.mlp#1`` (second call), ``attn[1]`` (second output)."""
        text = self.module
        if self.call:
            text += f"#{self.call}"
        if self.n_outputs > 1:
            text += f"[{self.output}]"
        return text

    def stats(self) -> dict[str, Any]:
        out: dict[str, Any] = {"module": self.label, "kind": self.kind, "index": self.index,
                               "shape": list(self.shape), "dtype": self.dtype}
        out.update(stats_dict(self.summary))
        return out


@dataclass
class Capture:
    """Everything an ``ActivationRecorder`` kept: observations of the forward and the backward pass."""

    keep: str
    forward: list[Observation] = field(default_factory=list)
    backward: list[Observation] = field(default_factory=list)

    def observations(self, kind: Kind = "forward") -> list[Observation]:
        if kind not in ("forward", "backward"):
            raise ValueError(f"kind must be 'forward' or 'backward', got {kind!r}")
        return self.forward if kind == "forward" else self.backward

    def stats(self, kind: Kind = "forward") -> list[dict[str, Any]]:
        """One dict per observed tensor, in execution order (see ``tensorstats.STAT_NAMES``)."""
        return [o.stats() for o in self.observations(kind)]

    def finalize(self) -> None:
        """Bring summaries, sketches, histograms and kept tensors to the host, one transfer per kind.

        Idempotent: observations already on the host are left alone (a backward pass that runs after
        the recorder's block still adds observations; the next access finalises those too).
        """
        for attr in ("summary", "sketch", "histogram"):
            pending = [o for o in (*self.forward, *self.backward)
                       if getattr(o, attr) is not None and getattr(o, attr).device.type != "cpu"]
            by_shape: dict[tuple[int, ...], list[Observation]] = defaultdict(list)
            for o in pending:
                by_shape[tuple(getattr(o, attr).shape)].append(o)
            for group in by_shape.values():
                host = torch.stack([getattr(o, attr) for o in group]).cpu()
                for o, value in zip(group, host):
                    setattr(o, attr, value)
        for o in (*self.forward, *self.backward):
            if o.tensor is not None and o.tensor.device.type != "cpu":
                o.tensor = o.tensor.cpu()

    def to_records(self, kind: Kind = "forward") -> list[dict[str, Any]]:
        """Records-friendly rows ``{module, metric, value, unit, details}``: one per module and statistic."""
        prefix = "act" if kind == "forward" else "grad"
        rows = []
        for o in self.observations(kind):
            stats = stats_dict(o.summary)
            for name in STAT_NAMES:
                if name == "numel":
                    continue
                rows.append({"module": o.label, "metric": f"{prefix}.{name}", "value": stats[name],
                             "unit": "ratio" if name.endswith("_frac") else "",
                             "details": {"index": o.index, "shape": list(o.shape), "dtype": o.dtype}})
        return rows
