"""Multiple-comparison control: Holm for the gating family, Benjamini-Hochberg for exploratory rows.

A run tests many cases x metrics x candidates; at alpha = 0.05 each, twenty null comparisons give one
"significant" change on average. Two families, two guarantees:

* **Holm** (step-down Bonferroni) controls the family-wise error rate: the probability of *any* false
  "faster"/"better" among the gating tests (the candidates' latency and accuracy verdicts that decide
  whether a change is accepted) stays <= alpha, under any dependence between the tests.
* **Benjamini-Hochberg** controls the false discovery rate: among the exploratory rows called
  significant (peers, stability, generalization), the expected fraction of false ones stays <= alpha.
  Less strict, fitting for rows that inform rather than gate.

Both return adjusted p-values (compare them to alpha directly) in the input order; NaN entries (rows
with no test) stay NaN and do not count towards the number of tests. The report shows raw and
adjusted p side by side.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import ArrayLike

__all__ = ["adjust_pvalues", "benjamini_hochberg", "holm"]


def _prepare(pvalues: ArrayLike) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    p = np.asarray(pvalues, dtype=float).ravel()
    valid = np.isfinite(p)
    if np.any((p[valid] < 0) | (p[valid] > 1)):
        raise ValueError("p-values must lie in [0, 1]")
    return p, valid, p[valid]


def holm(pvalues: ArrayLike) -> np.ndarray:
    """Holm-adjusted p-values: sorted ascending, ``p_(i) * (m - i + 1)``, running max, capped at 1."""
    p, valid, pv = _prepare(pvalues)
    out = np.full(p.shape, np.nan)
    m = pv.size
    if m == 0:
        return out
    order = np.argsort(pv, kind="stable")
    scaled = pv[order] * (m - np.arange(m))
    adj = np.minimum(np.maximum.accumulate(scaled), 1.0)
    res = np.empty(m)
    res[order] = adj
    out[valid] = res
    return out


def benjamini_hochberg(pvalues: ArrayLike) -> np.ndarray:
    """BH-adjusted p-values: sorted ascending, ``p_(i) * m / i``, running min from the top, capped at 1."""
    p, valid, pv = _prepare(pvalues)
    out = np.full(p.shape, np.nan)
    m = pv.size
    if m == 0:
        return out
    order = np.argsort(pv, kind="stable")
    scaled = pv[order] * m / np.arange(1, m + 1)
    adj = np.minimum(np.minimum.accumulate(scaled[::-1])[::-1], 1.0)
    res = np.empty(m)
    res[order] = adj
    out[valid] = res
    return out


def adjust_pvalues(pvalues: ArrayLike, method: str) -> np.ndarray:
    """``method`` is ``"holm"`` or ``"bh"`` (Benjamini-Hochberg)."""
    if method == "holm":
        return holm(pvalues)
    if method in ("bh", "fdr_bh", "benjamini-hochberg"):
        return benjamini_hochberg(pvalues)
    raise ValueError(f"unknown adjustment {method!r}; use 'holm' or 'bh'")
