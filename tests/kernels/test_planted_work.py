"""planted_work's nightly plants: the Triton kernel (through the interpreter) and the CPU loop agree bit for
bit, the planted work leaves the answer alone, the planted numerics stay inside the accuracy tolerance yet
raise the error, the baseline variant is never planted, and a bad switch value names the switch."""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.planted_work import ablation
from microscope_kernels.planted_work.kernel import _spin_planted_kernel, spin, spin_planted, spin_reference

ITERS = 400


def _rel_err(out: torch.Tensor, ref: torch.Tensor) -> float:
    return float((out.double() - ref).norm() / ref.norm())


@pytest.mark.parametrize("extra, delta", [(0, 0.0), (20, 0.0), (0, 2.0**-16), (20, 2.0**-16)])
def test_the_triton_kernel_and_the_cpu_loop_agree(extra, delta):
    x = torch.randn(3000, generator=torch.Generator().manual_seed(0))
    out = torch.empty_like(x)
    _spin_planted_kernel[(3,)](x, out, x.numel(), ITERS, extra, delta, 0.0, BLOCK=1024)
    assert torch.equal(out, spin_planted(x, ITERS, extra=extra, delta=delta))


def test_planted_work_keeps_the_answer_and_planted_numerics_raise_the_error_inside_tolerance():
    x = torch.randn(4096, generator=torch.Generator().manual_seed(1))
    ref = spin_reference(x.double(), ITERS)
    assert torch.equal(spin_planted(x, ITERS, extra=20), spin(x, ITERS))
    planted = spin_planted(x, ITERS, delta=ablation.NUMERICS_DELTA)
    assert _rel_err(planted, ref) > 1.3 * _rel_err(spin(x, ITERS), ref)
    tol = ablation.PlantedWork.tolerance["*"]
    assert torch.all((planted.double() - ref).abs() <= tol.atol + tol.rtol * ref.abs())


def test_the_baseline_is_never_planted(monkeypatch):
    monkeypatch.setattr(ablation, "PLANT_WORK_PCT", 5.0)
    monkeypatch.setattr(ablation, "PLANT_DELTA", ablation.NUMERICS_DELTA)
    assert ablation._spinner(0).__name__ == "planted" and "planted: +5% work" in ablation._spinner(0).__doc__
    assert ablation._spinner(0, plant=False).__name__ == "run"


@pytest.mark.parametrize("env, message", [
    ({"MICROSCOPE_PLANT_WORK_PCT": "five"}, "MICROSCOPE_PLANT_WORK_PCT='five': extra work in percent"),
    ({"MICROSCOPE_PLANT_WORK_PCT": "-1"}, "a number from 0 to 100"),
    ({"MICROSCOPE_PLANT_NUMERICS": "yes"}, "MICROSCOPE_PLANT_NUMERICS='yes': 1 plants the numerics change"),
])
def test_a_bad_switch_value_names_the_switch(monkeypatch, env, message):
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(ValueError, match=message):
        ablation.planted_from_env()
