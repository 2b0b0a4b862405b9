"""planted_work: candidates that do the baseline's work plus a known extra fraction.

Not an optimization: a calibration target for the statistics. The A/A candidate (``plus_0pct``) must
almost never be called faster or slower, and a planted slowdown must be found as often as the
verdict rule promises. ``microscope calibrate ablations/planted_work.yaml --runs 20`` counts them.

Two environment switches plant a regression in every candidate (never the baseline, so the latency
relative to the baseline shows it too) for the nightly gate (``microscope regress``; read when the
plugin is imported, so fresh processes see them): ``MICROSCOPE_PLANT_WORK_PCT=5`` adds 5% more loop
iterations whose result is thrown away (slower, same answer), ``MICROSCOPE_PLANT_NUMERICS=1`` scales
the elements of the answer by ``1 + 2**-16`` and ``1 - 2**-16`` in turn: well inside the accuracy
tolerance (rtol 1e-4), yet the error against the reference grows by 5-10% on a GPU and by ~60% on a
CPU, which the nightly gate calls on a quiet night and the CPU exact baseline always.
"""

from __future__ import annotations

import math
import os

import torch

from microscope.api import Ablation, Case, Tolerance, baseline, candidate, grid, randn, register

from .kernel import spin, spin_planted, spin_reference

PLANTED = (0, 1, 2, 3, 5, 10)  # percent extra work
WORK_SWITCH, NUMERICS_SWITCH = "MICROSCOPE_PLANT_WORK_PCT", "MICROSCOPE_PLANT_NUMERICS"
NUMERICS_DELTA = 2.0**-16


def planted_from_env() -> tuple[float, float]:
    """(extra work in percent, numerics delta) from the plant switches; a bad value names the switch."""
    text = os.environ.get(WORK_SWITCH, "").strip() or "0"
    try:
        work = float(text)
    except ValueError:
        work = math.nan
    if not 0 <= work <= 100:
        raise ValueError(f"{WORK_SWITCH}={text!r}: extra work in percent, a number from 0 to 100 (e.g. 5)")
    flag = os.environ.get(NUMERICS_SWITCH, "").strip() or "0"
    if flag not in ("0", "1"):
        raise ValueError(f"{NUMERICS_SWITCH}={flag!r}: 1 plants the numerics change, 0 (or unset) does not")
    return work, NUMERICS_DELTA if flag == "1" else 0.0


PLANT_WORK_PCT, PLANT_DELTA = planted_from_env()


def _plant_note() -> str:
    parts = ([f"+{PLANT_WORK_PCT:g}% work"] if PLANT_WORK_PCT else []) + (
        ["output x (1 +- 2^-16)"] if PLANT_DELTA else [])
    return f" (planted: {', '.join(parts)})" if parts else ""


def _spinner(extra_pct: int, plant: bool = True):
    def run(x: torch.Tensor, iters: int) -> torch.Tensor:
        return spin(x, round(iters * (1 + extra_pct / 100)))

    def planted(x: torch.Tensor, iters: int) -> torch.Tensor:
        return spin_planted(x, round(iters * (1 + extra_pct / 100)), extra=round(iters * PLANT_WORK_PCT / 100),
                            delta=PLANT_DELTA)

    chosen = planted if plant and (PLANT_WORK_PCT or PLANT_DELTA) else run
    chosen.__doc__ = f"The baseline's loop plus {extra_pct}% more iterations{_plant_note() if plant else ''}."
    return chosen


@register("planted_work")
class PlantedWork(Ablation):
    """Calibration: candidates do the baseline's work plus 0 (A/A), 1, 2, 3, 5 or 10 percent."""

    variants = {
        "base": baseline(_spinner(0, plant=False), "the baseline loop"),
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
