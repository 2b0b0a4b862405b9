"""Tukey-fence outlier classification: counted and reported, never dropped.

Why keep outliers: a slow round is a measurement of the machine too (a clock drop, a context switch, a
page fault in the candidate's allocator). Dropping it (as tritonbench does) hides real costs and lets
the analyst's filter pick the answer. We follow criterion.rs instead: classify each sample against
Tukey's fences, report the counts next to the verdict, and rely on robust statistics (medians, rank
tests) so that a few outliers cannot move the verdict on their own.

Fences (Tukey 1977), with quartiles Q1, Q3 and IQR = Q3 - Q1:

* mild:   outside [Q1 - 1.5 IQR, Q3 + 1.5 IQR] but inside the severe fences;
* severe: outside [Q1 - 3 IQR,   Q3 + 3 IQR].
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["OutlierCounts", "classify_outliers"]


@dataclass(frozen=True)
class OutlierCounts:
    """How many samples fall beyond each Tukey fence, and which ones (``labels``, one per sample)."""

    n: int
    low_severe: int
    low_mild: int
    high_mild: int
    high_severe: int
    #: (low severe, low mild, high mild, high severe) fence values.
    fences: tuple[float, float, float, float]
    #: per sample: "" (inside the fences), "low mild", "low severe", "high mild" or "high severe".
    labels: tuple[str, ...]

    @property
    def mild(self) -> int:
        return self.low_mild + self.high_mild

    @property
    def severe(self) -> int:
        return self.low_severe + self.high_severe

    @property
    def total(self) -> int:
        return self.mild + self.severe

    def describe(self) -> str:
        """A short phrase for reports, e.g. ``"2 mild, 1 severe of 30 (kept)"``."""
        return f"{self.mild} mild, {self.severe} severe of {self.n} (kept)"


def classify_outliers(samples: ArrayLike) -> OutlierCounts:
    """Classify ``samples`` (1-D, finite values are used) against Tukey's mild and severe fences.

    Quartiles use numpy's default linear interpolation. With fewer than 4 finite samples the
    quartiles say nothing, so nothing is flagged.
    """
    x = np.asarray(samples, dtype=float).ravel()
    finite = np.isfinite(x)
    xs = x[finite]
    if xs.size < 4:
        nan = float("nan")
        return OutlierCounts(int(xs.size), 0, 0, 0, 0, (nan, nan, nan, nan), tuple("" for _ in x))
    q1, q3 = np.percentile(xs, [25, 75])
    iqr = q3 - q1
    fences = (q1 - 3.0 * iqr, q1 - 1.5 * iqr, q3 + 1.5 * iqr, q3 + 3.0 * iqr)
    labels = []
    for value, ok in zip(x, finite):
        if not ok:
            labels.append("")
        elif value < fences[0]:
            labels.append("low severe")
        elif value < fences[1]:
            labels.append("low mild")
        elif value > fences[3]:
            labels.append("high severe")
        elif value > fences[2]:
            labels.append("high mild")
        else:
            labels.append("")
    return OutlierCounts(
        n=int(xs.size),
        low_severe=labels.count("low severe"),
        low_mild=labels.count("low mild"),
        high_mild=labels.count("high mild"),
        high_severe=labels.count("high severe"),
        fences=tuple(float(f) for f in fences),  # type: ignore[arg-type]
        labels=tuple(labels),
    )
