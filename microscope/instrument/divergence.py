"""Where does a candidate start to differ from the baseline? Module-by-module relative error.

Two captures (``ActivationRecorder`` on the baseline and on the candidate, same inputs, same weights,
same seeds) are matched tensor by tensor -- by module name, call number and output index -- and each
pair gets ``||a - b|| / ||a||`` in float64. Walking them in execution order, the first module above
the threshold is where divergence starts: "divergence starts at layers.3.attn". Everything before it
agreed (for an operator-preserving change, bit for bit: relative error exactly 0).

For the backward pass the order is the order in which gradients arrived, so the first divergent
gradient is the one closest to the loss.

Precision: with ``keep="full"`` captures the error is exact. With sketches (the default) the
numerator comes from the difference of the two sketches (an unbiased estimate, spread ~4%) and the
denominator is the exact norm from the baseline's statistics; identical tensors still give exactly 0.
NaN/Inf: if the two tensors are non-finite in different places (or with different fractions, for
sketches) the error is ``inf`` -- a candidate that produces NaN where the baseline did not has
diverged, whatever its finite values say.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from typing import Any

import torch

from microscope.instrument.capture import Capture, Kind, Observation
from microscope.instrument.hooks import ActivationRecorder
from microscope.instrument.tensorstats import STAT_NAMES, relative_error

__all__ = ["DivergenceReport", "DivergenceRow", "divergence"]

_L2 = STAT_NAMES.index("l2")
_NAN = STAT_NAMES.index("nan_frac")
_INF = STAT_NAMES.index("inf_frac")
_ABSMAX = STAT_NAMES.index("absmax")


@dataclass(frozen=True)
class DivergenceRow:
    """One matched tensor: its position in the baseline's execution order and its relative error."""

    index: int
    module: str
    rel_err: float
    diverged: bool
    base_absmax: float
    cand_absmax: float
    base_nonfinite: float
    cand_nonfinite: float
    note: str = ""


@dataclass
class DivergenceReport:
    """Per-module relative errors of a candidate vs the baseline, and where divergence starts."""

    kind: str
    threshold: float
    method: str  # "exact" (full tensors) or "sketch"
    rows: list[DivergenceRow]
    first_divergent: str | None
    only_in_baseline: list[str] = field(default_factory=list)
    only_in_candidate: list[str] = field(default_factory=list)

    @property
    def first_index(self) -> int | None:
        """Execution index of the first divergent module (``None`` when nothing diverged)."""
        for row in self.rows:
            if row.diverged:
                return row.index
        return None

    @property
    def max_row(self) -> DivergenceRow | None:
        finite = [r for r in self.rows if not math.isnan(r.rel_err)]
        return max(finite, key=lambda r: r.rel_err) if finite else None

    def summary(self) -> str:
        """One sentence for logs and reports."""
        what = "gradient divergence" if self.kind == "backward" else "divergence"
        extra = ""
        if self.only_in_baseline or self.only_in_candidate:
            extra = (f"; {len(self.only_in_baseline)} module outputs only in the baseline, "
                     f"{len(self.only_in_candidate)} only in the candidate")
        if self.first_divergent is None:
            top = self.max_row
            biggest = f" (largest {top.rel_err:.2e} at {top.module})" if top is not None else ""
            return f"no {what} above {self.threshold:g} over {len(self.rows)} module outputs{biggest}{extra}"
        first = next(r for r in self.rows if r.diverged)
        exact = sum(1 for r in self.rows if r.index < first.index and r.rel_err == 0.0)
        before = sum(1 for r in self.rows if r.index < first.index)
        note = f", {first.note}" if first.note else ""
        return (f"{what} starts at {first.module} (rel err {first.rel_err:.2e} > {self.threshold:g}{note}); "
                f"{exact} of {before} earlier module outputs agree exactly ({self.method}){extra}")

    def to_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "threshold": self.threshold, "method": self.method,
                "first_divergent": self.first_divergent, "summary": self.summary(),
                "rows": [asdict(r) for r in self.rows],
                "only_in_baseline": self.only_in_baseline, "only_in_candidate": self.only_in_candidate}

    def to_frame(self):  # -> pandas.DataFrame
        import pandas as pd

        return pd.DataFrame([asdict(r) for r in self.rows])

    def to_records(self) -> list[dict[str, Any]]:
        """Records-friendly rows ``{module, metric, value, unit, details}``: one per module, plus the start.

        The last row (metric ``<kind>.divergence_start``) carries the first divergent module's
        execution index as its value (-1 when nothing diverged) and its name in ``module``.
        """
        metric = "rel_err" if self.kind == "forward" else "grad_rel_err"
        rows: list[dict[str, Any]] = [
            {"module": r.module, "metric": f"divergence.{metric}", "value": r.rel_err, "unit": "ratio",
             "details": {"index": r.index, "diverged": r.diverged, "threshold": self.threshold,
                         "method": self.method, "note": r.note}}
            for r in self.rows
        ]
        first = self.first_index
        rows.append({"module": self.first_divergent, "metric": f"divergence.{self.kind}_start",
                     "value": float(-1 if first is None else first), "unit": "index",
                     "details": {"summary": self.summary(), "threshold": self.threshold, "method": self.method}})
        return rows


def _as_capture(obj: Capture | ActivationRecorder) -> Capture:
    return obj.capture if isinstance(obj, ActivationRecorder) else obj


def _pair_error(a: Observation, b: Observation) -> tuple[float, str]:
    if a.shape != b.shape:
        return math.inf, f"shape {list(a.shape)} -> {list(b.shape)}"
    if a.tensor is not None and b.tensor is not None:
        return relative_error(a.tensor, b.tensor), ""
    sa, sb = a.summary, b.summary
    if sa[_NAN].item() != sb[_NAN].item() or sa[_INF].item() != sb[_INF].item():
        return math.inf, "NaN/Inf fractions differ"
    if a.sketch is None or b.sketch is None:
        raise ValueError("these captures kept statistics only (keep='stats'); record with keep='sketch' or 'full'")
    diff = torch.linalg.vector_norm(a.sketch.to(torch.float64) - b.sketch.to(torch.float64)).item()
    norm = sa[_L2].item()
    if norm == 0.0:
        return (0.0 if diff == 0.0 else math.inf), ""
    return diff / norm, ""


def divergence(
    base: Capture | ActivationRecorder,
    cand: Capture | ActivationRecorder,
    threshold: float = 1e-3,
    *,
    kind: Kind = "forward",
) -> DivergenceReport:
    """Compare two captures tensor by tensor and name the first module whose error exceeds ``threshold``.

    Tensors are matched by (module name, call, output index); those present in only one capture (a
    module the candidate added or removed) are listed, not compared. Rows follow the baseline's
    execution order.
    """
    base_c, cand_c = _as_capture(base), _as_capture(cand)
    b_obs, c_obs = base_c.observations(kind), cand_c.observations(kind)
    by_key = {o.key: o for o in c_obs}
    exact = base_c.keep == "full" and cand_c.keep == "full"
    rows: list[DivergenceRow] = []
    first: str | None = None
    for a in b_obs:
        b = by_key.get(a.key)
        if b is None:
            continue
        err, note = _pair_error(a, b)
        diverged = not err <= threshold  # NaN errors count as diverged
        if diverged and first is None:
            first = a.label
        rows.append(DivergenceRow(
            index=a.index, module=a.label, rel_err=err, diverged=diverged,
            base_absmax=a.summary[_ABSMAX].item(), cand_absmax=b.summary[_ABSMAX].item(),
            base_nonfinite=a.summary[_NAN].item() + a.summary[_INF].item(),
            cand_nonfinite=b.summary[_NAN].item() + b.summary[_INF].item(), note=note,
        ))
    base_keys = {o.key for o in b_obs}
    return DivergenceReport(
        kind=kind, threshold=threshold, method="exact" if exact else "sketch", rows=rows, first_divergent=first,
        only_in_baseline=[o.label for o in b_obs if o.key not in by_key],
        only_in_candidate=[o.label for o in c_obs if o.key not in base_keys],
    )

