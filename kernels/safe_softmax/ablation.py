"""Plugin: max-subtracted softmax in one Triton pass vs the naive exp/sum formula (and torch.softmax)."""

from __future__ import annotations

from collections.abc import Mapping

import torch
from microscope_kernels.safe_softmax.kernel import precompile, safe_softmax
from microscope_kernels.safe_softmax.reference import naive_softmax, safe_softmax_reference, torch_softmax

from microscope.api import Ablation, Case, Tolerance, baseline, candidate, grid, peer, randn, register

#: Fraction of entries set to -inf in ``masked`` cases (column 0 is never masked, so no row is empty).
MASKED_FRACTION = 0.25


def naive(x: torch.Tensor) -> torch.Tensor:
    """exp(x) / sum(exp(x)): overflows to inf/NaN once logits pass ~11 (fp16) or ~89 (bf16, fp32)."""
    return naive_softmax(x)


def triton_safe(x: torch.Tensor) -> torch.Tensor:
    """One Triton pass: row max, exp2(x - max), sum and normalize in registers (read x, write y)."""
    return safe_softmax(x)


def torch_peer(x: torch.Tensor) -> torch.Tensor:
    """torch.softmax(x, -1): the max-shifted library kernel users call today."""
    return torch_softmax(x)


@register("safe_softmax")
class SafeSoftmax(Ablation):
    """One-pass max-shifted softmax (forward and backward) vs naive exp/sum and torch.softmax.

    The questions: is it stable where the naive formula is not, and as fast as a copy?
    The accuracy truth is the float64 *safe* softmax (``reference`` below), not the float64 naive
    formula: in float64 the naive one survives logits up to ~709, but it is still not the function
    users mean on a fully masked row, and the truth must not depend on the baseline's overflow.
    ``scale=100`` cases make every naive output non-finite (the recorded evidence); ``masked``
    cases put -inf in a quarter of the entries.
    """

    variants = {
        "naive": baseline(naive),
        "triton": candidate(triton_safe, needs=("triton",)),
        "torch": peer(torch_peer),
    }
    # 781 columns: not a power of two, so the column mask and padding are exercised.
    cases = grid(rows=[37], cols=[781], scale=[1.0, 100.0], masked=[False, True],
                 dtype=["fp32", "fp16", "bf16"])
    # Outputs are probabilities in [0, 1]: a few ulps relative, plus an atol far below 1/cols for the
    # values that flush to 0 (fp16 subnormals). max_mismatch admits the rare gradient element whose
    # dy - sum(y*dy) cancels; the noise-calibrated rule (4x the baseline's error) judges the rest.
    tolerance = {
        "fp32": Tolerance(rtol=1e-5, atol=1e-8, max_mismatch=0.01),
        "fp16": Tolerance(rtol=4e-3, atol=1e-6, max_mismatch=0.01),
        "bf16": Tolerance(rtol=3e-2, atol=1e-6, max_mismatch=0.01),
        "fp64": Tolerance(rtol=1e-10, atol=1e-14, max_mismatch=0.01),
    }

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the forward's (and backward's) autotuning candidates for the case's shape and dtype."""
        if device == "cuda":
            precompile(case["rows"], case["cols"], case.dtype, backward, shard)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, torch.Tensor]:
        rows, cols = case["rows"], case["cols"]
        x = randn((rows, cols), torch.float32, gen, "cpu", scale=float(case["scale"]))
        if case.get("masked", False):
            drop = torch.rand((rows, cols), generator=gen) < MASKED_FRACTION
            drop[:, 0] = False
            x = x.masked_fill(drop, float("-inf"))
        return {"x": x.to(device=device, dtype=case.dtype)}

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("x",)

    def reference(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The true softmax: max-shifted, in whatever precision the inputs come in (float64 here)."""
        return safe_softmax_reference(inputs["x"])

    def flops(self, case: Case, backward: bool = False) -> float:
        """~5 flops per element forward (max, subtract, exp, sum, scale), ~4 more backward."""
        return float((5 + (4 if backward else 0)) * case["rows"] * case["cols"])

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Minimum traffic: forward reads x, writes y; backward reads y and dy, writes dx."""
        return float((2 + (3 if backward else 0)) * case["rows"] * case["cols"] * case.dtype.itemsize)
