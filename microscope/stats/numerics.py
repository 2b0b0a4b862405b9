"""Kernel numerics verdict: is a candidate's output as close to the truth as the baseline's own?

A single global ``allclose`` is the wrong test in both directions. Too tight, it fails a bf16 kernel
for the rounding bf16 itself forces; too loose (KernelBench's 1e-2 for half precision), its users
found all-zeros outputs passing. microscope judges a candidate against two yardsticks, both measured
against the float64 evaluation of the baseline (``reference64``):

noise-calibrated rule
    the candidate's norm-relative error ``||y - y64|| / ||y64||`` must be at most ``k`` times the
    baseline's own norm-relative error *in the same dtype* (floored at the dtype's unit roundoff, so an
    exact baseline does not make the rule impossible). The baseline in bf16 shows what bf16 costs;
    a candidate may lose a small factor more (reordered accumulation), not orders of magnitude.
element rule
    at most ``max_mismatch`` (a fraction) of the elements may violate
    ``|y - y64| <= atol + rtol * |y64|`` (the declared ``Tolerance``).

Degenerate outputs never pass, whatever the tolerances:

* a norm-relative error >= 1 is no closer to the truth than an all-zeros output;
* ``judge_outputs`` also fails outputs that are all zeros, constant (while the truth is not), carry
  non-finite values where the truth is finite, or have the wrong shape, and it applies the
  noise-calibrated rule a second time to the *centered* outputs (mean removed): a constant output
  has centered error 1 even when the truth's large mean makes its plain error look small, and a
  shifted output fails the plain rule because the shift is not in the baseline's error.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
from numpy.typing import ArrayLike

__all__ = [
    "NumericsErrors",
    "NumericsVerdict",
    "judge_outputs",
    "numerics_errors",
    "numerics_verdict",
    "unit_roundoff",
]


@dataclass(frozen=True)
class NumericsErrors:
    """Errors of one output against the float64 truth."""

    norm_rel_err: float
    #: the same on mean-removed outputs (blind to a common offset, sensitive to a flattened output).
    centered_rel_err: float
    max_abs_err: float
    #: fraction of elements violating ``|y - y64| <= atol + rtol |y64|``.
    mismatch_fraction: float
    n: int


@dataclass(frozen=True)
class NumericsVerdict:
    """``verdict`` is ``"pass"`` or ``"fail"``; ``reasons`` says which rules failed (empty on pass)."""

    passed: bool
    verdict: str
    #: candidate error / max(reference error, floor): how many times the baseline's own error.
    error_ratio: float
    limit: float
    reasons: tuple[str, ...]


def unit_roundoff(dtype: np.dtype | str | type) -> float:
    """Half the machine epsilon of a floating dtype (``2**-24`` for float32); bf16 is ``2**-8``."""
    if str(dtype) in ("bf16", "bfloat16"):
        return 2.0**-8
    return float(np.finfo(np.dtype(dtype)).eps) / 2.0


def _rel(num: float, den: float) -> float:
    if den > 0:
        return num / den
    return 0.0 if num == 0 else math.inf


def numerics_errors(
    output: ArrayLike, reference64: ArrayLike, *, rtol: float, atol: float = 0.0
) -> NumericsErrors:
    """Errors of ``output`` against ``reference64`` (both cast to float64, same shape)."""
    y = np.asarray(output, dtype=np.float64)
    t = np.asarray(reference64, dtype=np.float64)
    if y.shape != t.shape:
        raise ValueError(f"output shape {y.shape} != reference shape {t.shape}")
    if y.size == 0:
        return NumericsErrors(0.0, 0.0, 0.0, 0.0, 0)
    diff = y - t
    with np.errstate(invalid="ignore", over="ignore"):
        norm_rel = _rel(float(np.linalg.norm(diff)), float(np.linalg.norm(t)))
        centered = _rel(float(np.linalg.norm(diff - diff.mean())), float(np.linalg.norm(t - t.mean())))
        bad = ~(np.abs(diff) <= atol + rtol * np.abs(t))  # NaN compares False: counted as a mismatch
    max_abs = float(np.max(np.abs(diff))) if np.all(np.isfinite(diff)) else math.inf
    return NumericsErrors(
        norm_rel_err=norm_rel if math.isfinite(norm_rel) else math.inf,
        centered_rel_err=centered if math.isfinite(centered) else math.inf,
        max_abs_err=max_abs,
        mismatch_fraction=float(bad.mean()),
        n=int(y.size),
    )


def numerics_verdict(
    candidate_err: float,
    reference_err: float,
    *,
    k: float = 4.0,
    mismatch_fraction: float = 0.0,
    max_mismatch: float = 0.0,
    floor: float = 0.0,
) -> NumericsVerdict:
    """Pass iff ``candidate_err <= k * max(reference_err, floor)``, ``candidate_err < 1`` and
    ``mismatch_fraction <= max_mismatch``.

    ``candidate_err`` and ``reference_err`` are norm-relative errors against float64 (candidate and
    baseline in the same dtype); ``floor`` is the dtype's unit roundoff (``unit_roundoff``).
    A non-finite candidate error fails; a non-finite reference error cannot calibrate anything, so
    the candidate is then held to ``k * floor``.
    """
    if k < 1:
        raise ValueError("k must be >= 1: a candidate is not asked to beat the baseline's own error")
    if not 0 <= max_mismatch < 1:
        raise ValueError("max_mismatch is a fraction in [0, 1)")
    reasons: list[str] = []
    ref_ok = math.isfinite(reference_err)
    scale = max(reference_err if ref_ok else 0.0, floor)
    limit = k * scale
    ratio = _rel(candidate_err, scale) if math.isfinite(candidate_err) else math.inf
    if not math.isfinite(candidate_err):
        reasons.append("candidate error is not finite")
    else:
        if candidate_err >= 1.0 - 1e-9:  # rounding must not let an exact "1" slip under
            reasons.append(f"norm-relative error {candidate_err:.3g} >= 1: no closer than all zeros")
        if candidate_err > limit:
            reasons.append(f"norm-relative error {candidate_err:.3g} > {k:g} x baseline's {scale:.3g}")
    if not mismatch_fraction <= max_mismatch:
        reasons.append(f"{mismatch_fraction:.2%} of elements outside rtol/atol (allowed {max_mismatch:.2%})")
    if reasons and not ref_ok:
        reasons.append("the baseline's error is not finite; the floor was used")
    passed = not reasons
    return NumericsVerdict(passed, "pass" if passed else "fail", ratio, limit, tuple(reasons))


def judge_outputs(
    candidate: ArrayLike,
    baseline: ArrayLike,
    reference64: ArrayLike,
    *,
    rtol: float,
    atol: float = 0.0,
    k: float = 4.0,
    max_mismatch: float = 0.0,
    floor: float | None = None,
) -> NumericsVerdict:
    """Judge a candidate output from the arrays: errors, both rules and the degenerate-output guards.

    ``baseline`` is the baseline variant's output in the same dtype as the candidate; ``floor``
    defaults to the unit roundoff of ``baseline``'s dtype (pass it explicitly for bf16, which numpy
    lacks).
    """
    cand = np.asarray(candidate)
    base = np.asarray(baseline)
    truth = np.asarray(reference64, dtype=np.float64)
    if floor is None:
        floor = unit_roundoff(base.dtype) if np.issubdtype(base.dtype, np.floating) else 0.0
    guards: list[str] = []
    if cand.shape != truth.shape:
        return NumericsVerdict(
            False,
            "fail",
            math.inf,
            math.nan,
            (f"output shape {cand.shape} != reference shape {truth.shape}",),
        )
    c64 = cand.astype(np.float64)
    truth_finite = np.isfinite(truth)
    truth_varies = bool(truth_finite.sum() > 1 and np.ptp(truth[truth_finite]) > 0)
    if np.any(~np.isfinite(c64) & truth_finite):
        guards.append("non-finite values where the reference is finite")
    if truth.size and np.any(truth != 0) and not np.any(c64 != 0):
        guards.append("all-zeros output")
    elif truth_varies and np.all(c64 == c64.flat[0]):
        guards.append("constant output (the reference is not constant)")
    ce = numerics_errors(c64, truth, rtol=rtol, atol=atol)
    be = numerics_errors(base.astype(np.float64), truth, rtol=rtol, atol=atol)
    plain = numerics_verdict(
        ce.norm_rel_err,
        be.norm_rel_err,
        k=k,
        mismatch_fraction=ce.mismatch_fraction,
        max_mismatch=max_mismatch,
        floor=floor,
    )
    reasons = list(guards) + list(plain.reasons)
    if truth_varies:
        # Only meaningful when the truth varies: a constant truth has no shape to flatten.
        centered = numerics_verdict(ce.centered_rel_err, be.centered_rel_err, k=k, floor=floor)
        reasons += [f"centered: {r}" for r in centered.reasons]
    ok = not reasons
    return NumericsVerdict(ok, "pass" if ok else "fail", plain.error_ratio, plain.limit, tuple(reasons))
