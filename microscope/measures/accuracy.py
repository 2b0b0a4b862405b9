"""Accuracy: every variant's outputs and gradients against a float64 evaluation of the reference.

Judged two ways (see ``microscope.api.Tolerance``): an element rule (atol + rtol * |truth|) and a
noise-calibrated rule that compares the variant's norm-relative error with the baseline's own error in
the same dtype. The second rule is what lets a bf16 kernel be judged fairly without hand-tuned atols,
and what makes an all-zeros output fail: its relative error is 1, far above any baseline's.
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import torch

from microscope.api import Tolerance, Variant
from microscope.measures.calls import as_tensors, fresh_inputs, output_names
from microscope.stats.numerics import numerics_verdict


@dataclass
class TensorError:
    """Error of one output or gradient tensor against the float64 truth."""

    name: str
    rel_err: float  # ||y - truth|| / ||truth||
    max_abs_err: float
    mismatch: float  # fraction of elements outside atol + rtol * |truth|
    nonfinite: int  # NaN/Inf elements in y
    ref_rel_err: float = float("nan")  # the baseline's own rel_err in this dtype
    limit: float = float("nan")  # the rel_err this tensor had to stay under
    passed: bool | None = None
    reason: str = ""


def evaluate(
    variant: Variant,
    inputs: Mapping[str, Any],
    grad_names: Sequence[str],
    cots: Sequence[torch.Tensor] | None,
) -> dict[str, torch.Tensor]:
    """Run ``variant`` once; return its outputs (and gradients, when asked) as named tensors."""
    with_grads = cots is not None and variant.differentiable and bool(grad_names)
    x = fresh_inputs(inputs, grad_names if with_grads else ())
    # forward only under no_grad, as its timed calls run: a compiled variant is checked on the graph that is timed
    with torch.enable_grad() if with_grads else torch.no_grad():
        outs = as_tensors(variant.fn(**x))
    named = {name: o.detach() for name, o in zip(output_names(outs), outs)}
    if with_grads:
        leaves = [x[n] for n in grad_names]
        grads = torch.autograd.grad(
            outs, leaves, [c.to(device=o.device, dtype=o.dtype) for c, o in zip(cots, outs)], allow_unused=True
        )
        for n, g, leaf in zip(grad_names, grads, leaves):
            # an input the output does not depend on has a zero gradient; judged, not an error
            named[f"grad_{n}"] = torch.zeros_like(leaf) if g is None else g.detach()
    return named


def compare(name: str, y: torch.Tensor, truth: torch.Tensor, tol: Tolerance) -> TensorError:
    """Raw error numbers of ``y`` against ``truth`` (float64), before any pass/fail judgement."""
    if y.shape != truth.shape:
        reason = f"shape {tuple(y.shape)} != {tuple(truth.shape)}"
        return TensorError(name, float("inf"), float("inf"), 1.0, 0, reason=reason)
    y64 = y.detach().to(torch.float64)
    t64 = truth.detach().to(device=y64.device, dtype=torch.float64)
    nonfinite = int((~torch.isfinite(y64)).sum())
    finite_truth = torch.isfinite(t64)
    diff = torch.where(finite_truth, y64 - t64, torch.where(y64 == t64, 0.0, float("inf")))
    norm = float(torch.linalg.vector_norm(torch.where(finite_truth, t64, 0.0)))
    diff_norm = float(torch.linalg.vector_norm(diff))
    rel = diff_norm / norm if norm > 0 else (0.0 if diff_norm == 0 else float("inf"))
    bound = tol.atol + tol.rtol * t64.abs()
    mismatch = float(((diff.abs() > bound) | diff.isnan()).double().mean()) if diff.numel() else 0.0
    max_abs = float(diff.abs().max()) if diff.numel() else 0.0
    return TensorError(name, rel, max_abs, mismatch, nonfinite)


def unit_roundoff(dtype: torch.dtype) -> float:
    return float(torch.finfo(dtype).eps) / 2


def judge(err: TensorError, ref_err: TensorError | None, tol: Tolerance, dtype: torch.dtype) -> TensorError:
    """Apply both rules; ``ref_err`` is the baseline's error on the same tensor in the same dtype."""
    if err.reason:
        err.passed = False
        return err
    reasons = []
    usable = ref_err is not None and math.isfinite(ref_err.rel_err) and not ref_err.nonfinite
    ref_rel = ref_err.rel_err if usable else 0.0
    ref_mismatch = ref_err.mismatch if usable else 0.0
    err.ref_rel_err = ref_err.rel_err if ref_err is not None else float("nan")
    allowed_mismatch = max(tol.max_mismatch, tol.ref_factor * ref_mismatch)
    if err.nonfinite:
        reasons.append(f"{err.nonfinite} NaN/Inf elements")
    if usable:  # the noise-calibrated rule, as the statistics engine defines it
        verdict = numerics_verdict(err.rel_err, ref_rel, k=tol.ref_factor, floor=unit_roundoff(dtype))
        err.limit = verdict.limit
        reasons.extend(verdict.reasons)
    else:  # the baseline itself broke (e.g. overflowed): only the declared tolerance can judge
        err.limit = math.inf
    if err.mismatch > allowed_mismatch:
        reasons.append(
            f"{err.mismatch:.2%} of elements outside atol={tol.atol:g} + rtol={tol.rtol:g}*|ref| "
            f"(allowed {allowed_mismatch:.2%}: the larger of the declared {tol.max_mismatch:.2%} "
            f"and {tol.ref_factor:g} x the baseline's {ref_mismatch:.2%})"
        )
    err.passed = not reasons
    if not usable and ref_err is not None:
        reasons.append("baseline output not finite: judged by the declared tolerance alone")
    err.reason = "; ".join(reasons)
    return err
