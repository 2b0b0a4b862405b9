"""Machine quality: is this sample set quiet enough to support a verdict?

The rule (DESIGN.md, "Statistics"): the relative spread IQR / median of a variant's samples (the
per-round medians of a latency measurement) above 10% warns that the machine is **noisy**; above 25%
marks the measurement **unreliable**, and the report must say so. IQR / median is used rather than the
coefficient of variation because it is robust: one preempted round does not flag a quiet machine,
while a machine that is genuinely jittery (shared GPU, thermal throttling, frequency scaling) is.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["NOISY", "UNRELIABLE", "NoiseQuality", "classify_noise"]

#: IQR / median above this warns "noisy".
NOISY = 0.10
#: IQR / median above this marks the measurement "unreliable".
UNRELIABLE = 0.25
#: Below this many samples the quartiles are too coarse to judge the machine.
MIN_SAMPLES = 4


@dataclass(frozen=True)
class NoiseQuality:
    """The classification of one sample set.

    ``level`` is ``"ok"``, ``"noisy"``, ``"unreliable"`` or ``"unknown"`` (no usable samples or a
    non-positive median). ``flags`` holds machine-readable tags (the level when it is not ok, and
    ``"few-samples"``); ``notes`` holds the sentences a report prints.
    """

    level: str
    rel_iqr: float
    median: float
    iqr: float
    n: int
    flags: tuple[str, ...]
    notes: tuple[str, ...]

    @property
    def ok(self) -> bool:
        return self.level == "ok"


def classify_noise(
    samples: ArrayLike,
    *,
    noisy: float = NOISY,
    unreliable: float = UNRELIABLE,
    label: str = "samples",
) -> NoiseQuality:
    """Classify ``samples`` by their IQR / median (non-finite values are ignored and noted).

    ``label`` names the sample set in the notes (e.g. ``"baseline rounds"``).
    """
    if not 0 <= noisy <= unreliable:
        raise ValueError("need 0 <= noisy <= unreliable")
    x = np.asarray(samples, dtype=float).ravel()
    finite = x[np.isfinite(x)]
    flags: list[str] = []
    notes: list[str] = []
    dropped = x.size - finite.size
    if dropped:
        notes.append(f"{label}: {dropped} non-finite value(s) ignored")
    if finite.size == 0:
        return NoiseQuality(
            "unknown",
            float("nan"),
            float("nan"),
            float("nan"),
            0,
            ("unknown",),
            tuple(notes + [f"{label}: no finite samples"]),
        )
    q1, med, q3 = np.percentile(finite, [25, 50, 75])
    iqr = float(q3 - q1)
    if finite.size < MIN_SAMPLES:
        flags.append("few-samples")
        notes.append(f"{label}: only {finite.size} sample(s); spread cannot be judged")
    if med <= 0:
        flags.append("unknown")
        notes.append(f"{label}: median {med:g} is not positive; IQR/median is meaningless")
        return NoiseQuality(
            "unknown", float("nan"), float(med), iqr, int(finite.size), tuple(flags), tuple(notes)
        )
    rel = iqr / float(med)
    if rel > unreliable:
        level = "unreliable"
        notes.append(f"{label}: IQR/median {rel:.1%} > {unreliable:.0%}: unreliable measurement")
    elif rel > noisy:
        level = "noisy"
        notes.append(f"{label}: IQR/median {rel:.1%} > {noisy:.0%}: noisy machine")
    else:
        level = "ok"
    if level != "ok":
        flags.insert(0, level)
    return NoiseQuality(level, rel, float(med), iqr, int(finite.size), tuple(flags), tuple(notes))
