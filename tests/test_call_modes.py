"""One way to call a variant forward only (under no_grad) for the accuracy check, the timed calls and a
plugin's compile warm-up (``api.call_as_timed``), so a compiled variant is checked on the graph that is timed."""

from __future__ import annotations

import torch

from microscope.api import Variant, call_as_timed, candidate
from microscope.measures import accuracy
from microscope.measures.calls import make_call


def _recording(modes: list[bool]) -> Variant:
    def fn(x: torch.Tensor, scale: float) -> torch.Tensor:
        modes.append(torch.is_grad_enabled())
        return x * scale

    return candidate(fn)


def test_forward_only_accuracy_and_timed_calls_run_in_the_same_grad_mode():
    modes: list[bool] = []
    variant = _recording(modes)
    inputs = {"x": torch.randn(5, 3), "scale": 2.0}
    got = accuracy.evaluate(variant, inputs, ("x",), None)  # forward only: no cotangents
    make_call(variant, inputs, ("x",), False, None)()
    assert modes == [False, False]
    assert torch.equal(got["out"], inputs["x"] * 2.0)


def test_a_gradient_check_runs_with_gradients_enabled():
    modes: list[bool] = []
    variant = _recording(modes)
    x = torch.randn(4, 7)
    got = accuracy.evaluate(variant, {"x": x, "scale": 3.0}, ("x",), [torch.ones(4, 7)])
    assert modes == [True]
    assert torch.allclose(got["grad_x"], torch.full((4, 7), 3.0))


def test_call_as_timed_forward_is_under_no_grad_and_with_grad_inputs_runs_the_backward():
    modes: list[bool] = []
    variant = _recording(modes)
    x = torch.randn(6, 2)
    out = call_as_timed(variant.fn, {"x": x, "scale": 0.5})
    assert out.grad_fn is None and modes == [False]
    out = call_as_timed(variant.fn, {"x": x, "scale": 0.5}, ("x",))
    assert modes == [False, True]
    assert out.grad_fn is not None and not x.requires_grad  # the caller's tensor is left as it was
