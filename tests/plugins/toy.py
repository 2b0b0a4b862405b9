"""Tiny plugins for harness tests: a correct candidate and candidates that are wrong in known ways."""

from __future__ import annotations

import torch

from microscope.api import Ablation, Tolerance, baseline, candidate, grid, peer, randn, register


def gelu_ref(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Eager tanh-GeLU of x * w."""
    return torch.nn.functional.gelu(x * w, approximate="tanh")


def gelu_fused(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """The same math written out (a stand-in for a fused kernel)."""
    y = x * w
    return 0.5 * y * (1 + torch.tanh(0.7978845608028654 * (y + 0.044715 * y**3)))


def gelu_zeros(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Wrong on purpose: all zeros (KernelBench's all-zeros pass must never happen here)."""
    return torch.zeros_like(x) + 0 * w.sum()


def gelu_raises(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    raise RuntimeError("kernel launch failed on purpose")


def gelu_nan(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    out = gelu_ref(x, w).clone()
    out.view(-1)[0] = float("nan")
    return out


_FIRST: dict[tuple, torch.Tensor] = {}
_BY_POINTER: dict[tuple, torch.Tensor] = {}


def gelu_memo(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Cheats at inference: computes once per shape, then returns that first answer for any input."""
    if torch.is_grad_enabled():
        return gelu_ref(x, w)
    key = (tuple(x.shape), x.dtype)
    if key not in _FIRST:
        _FIRST[key] = gelu_ref(x, w)
    return _FIRST[key]


def gelu_pointer_cache(x: torch.Tensor, w: torch.Tensor) -> torch.Tensor:
    """Cheats at inference: skips the work when it sees the same input pointers again (stale if the
    contents changed)."""
    if torch.is_grad_enabled():
        return gelu_ref(x, w)
    key = (x.data_ptr(), w.data_ptr(), tuple(x.shape), x.dtype)
    if key not in _BY_POINTER:
        _BY_POINTER[key] = gelu_ref(x, w)
    return _BY_POINTER[key]


@register("toy_gelu")
class ToyGelu(Ablation):
    """GeLU(x*w): a correct candidate, a peer, four broken ones and two that cheat the timer."""

    variants = {
        "eager": baseline(gelu_ref),
        "fused": candidate(gelu_fused),
        "zeros": candidate(gelu_zeros),
        "raises": candidate(gelu_raises),
        "nan": candidate(gelu_nan),
        "memo": candidate(gelu_memo),
        "pointer_cache": candidate(gelu_pointer_cache),
        "gpu_only": peer(gelu_ref, needs=("cuda",)),
    }
    cases = grid(rows=[3, 17], cols=[33], dtype=["fp32", "bf16"])
    tolerance = {"fp32": Tolerance(rtol=1e-5, atol=1e-6), "bf16": Tolerance(rtol=5e-2, atol=1e-2, max_mismatch=0.03)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["rows"], case["cols"]), case.dtype, gen, device),
                "w": randn((case["cols"],), case.dtype, gen, device)}

    def grad_inputs(self, case):
        return ("x", "w")

    def bytes(self, case, backward=False):
        return 2 * case["rows"] * case["cols"] * case.dtype.itemsize
