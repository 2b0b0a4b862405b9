"""planted_work: candidates that do the baseline's work plus a known extra fraction.

Not an optimization: a calibration target for the statistics. The A/A candidate (``plus_0pct``) must
almost never be called faster or slower, and a planted slowdown must be found as often as the
verdict rule promises. ``microscope/bench/planted.py`` runs this study through ``microscope run``.
"""

from __future__ import annotations

import torch

from microscope.api import Ablation, Case, Tolerance, baseline, candidate, grid, randn, register

from .kernel import spin, spin_reference

PLANTED = (0, 1, 2, 3, 5, 10)  # percent extra work


def _spinner(extra_pct: int):
    def run(x: torch.Tensor, iters: int) -> torch.Tensor:
        return spin(x, round(iters * (1 + extra_pct / 100)))

    run.__doc__ = f"The baseline's loop plus {extra_pct}% more iterations."
    return run


@register("planted_work")
class PlantedWork(Ablation):
    """Calibration: candidates do the baseline's work plus 0 (A/A), 1, 2, 3, 5 or 10 percent."""

    variants = {
        "base": baseline(_spinner(0), "the baseline loop"),
        **{f"plus_{p}pct": candidate(_spinner(p), differentiable=False) for p in PLANTED},
    }
    cases = grid(elements=[4096], iters=[400], dtype=["fp32"])
    # every candidate computes a longer recurrence, so only the baseline is expected to match; the
    # accuracy dimension is switched off in the study's configs
    tolerance = {"*": Tolerance(rtol=1e-4, atol=1e-5)}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        return {"x": randn((case["elements"],), case.dtype, gen, device), "iters": case["iters"]}

    def reference(self, inputs):  # noqa: ANN001, ANN201
        return spin_reference(inputs["x"], inputs["iters"])
