"""Plugin: 1-bit weights with the straight-through estimator.

Operator level: the binarized Linear ``x @ (alpha * sign(W))^T`` as the seed writes it (eager, with the
STE's gradients) vs a Triton GEMM over 32 signs per word, with ``F.linear`` on the binarized weight
materialized in the case's dtype as the peer a user writes first. Model level: the claim "QAT recovers
most of post-training quantization's loss", for 1-bit weights: the float model, the same model trained
with binarized Linears through the STE (QAT, stability included), and the float model's trained weights
binarized after training (PTQ, the Triton kernel).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

from microscope.api import (
    Ablation,
    Arm,
    Case,
    ConvertedLinear,
    Role,
    Tolerance,
    Transformer,
    baseline,
    candidate,
    grid,
    peer,
    randn,
    register,
)

from .kernel import binary_linear_packed
from .reference import binarize, binary_linear, pack_signs

#: The output head keeps float weights in every arm: binarized networks keep their first and last layers.
KEPT_FLOAT = ("lm_head",)


def eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """The seed's binarized Linear: sign and row scale each call, F.linear, STE gradients to W."""
    return binary_linear(x, weight, bias)


def triton_binary(x: torch.Tensor, packed: torch.Tensor, alpha: torch.Tensor, bias: torch.Tensor,
                  **_: object) -> torch.Tensor:
    """One Triton GEMM over the packed signs (packed once, outside the call), alpha in the epilogue."""
    return binary_linear_packed(x, packed, alpha, x.shape[-1], bias)


def dense_binarized(x: torch.Tensor, w_binarized: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """F.linear on alpha * sign(W) materialized in the case's dtype (once, outside the call)."""
    return torch.nn.functional.linear(x, w_binarized, bias)


class STEBinaryLinear(nn.Module):
    """A Linear training through binarized weights: the float weight is the parameter (the same one the
    replaced Linear held), the forward uses ``alpha * sign(W)``, the STE carries gradients back."""

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.weight, self.bias = linear.weight, linear.bias

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return binary_linear(x, self.weight, self.bias)


class PackedBinaryLinear(ConvertedLinear):
    """A trained Linear binarized after training: packed signs and row scales, the Triton kernel."""

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        packed, alpha = pack_signs(weight)
        self.register_buffer("packed", packed, persistent=False)
        self.register_buffer("alpha", alpha, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return binary_linear_packed(x, self.packed, self.alpha, self.in_features, bias)


def _swap(model: Transformer, make) -> None:  # noqa: ANN001
    model.swap_linears(lambda name, linear: linear if name in KEPT_FLOAT else make(linear))


def train_binarized(model: Transformer) -> None:
    """Model level (QAT): every Linear but the output head trains through binarized weights."""
    _swap(model, STEBinaryLinear)


def binarize_after_training(model: Transformer) -> None:
    """Model level (PTQ): every Linear but the output head takes the trained weights' signs (Triton)."""
    _swap(model, PackedBinaryLinear)


@register("binarize_ste")
class BinarizeSTE(Ablation):
    """1-bit weights (alpha * sign(W), straight-through estimator): eager vs a packed-bit Triton GEMM."""

    variants = {
        "eager": baseline(eager),
        "triton": candidate(triton_binary, needs=("triton",), differentiable=False),
        "dense_binarized": peer(dense_binarized, differentiable=False),
    }
    arms = {
        "float": Arm(Role.BASELINE, "the embedded model with float weights"),
        "binary_qat": Arm(description="every Linear but the head trained through alpha * sign(W) (STE)",
                          patch=train_binarized),
        "binary_qat_kd": Arm(description="binary_qat learning from the float model's trained outputs too "
                                         "(distillation: half the loss, temperature 2)",
                             patch=train_binarized, distill=0.5, distill_temperature=2.0),
        "binary_ptq": Arm(Role.PEER, "the float model's trained weights binarized after training (Triton)",
                          patch=binarize_after_training, needs=("triton",), inference_only=True),
    }
    # odd sizes: K a whole number of words neither, N and M of no tile
    cases = grid(m=[1, 37], n=[129], k=[300], dtype=["fp32", "fp16", "bf16"])
    # the same math in every variant: +-1 products are exact, so what differs is the summation order
    tolerance = {"fp32": Tolerance(rtol=1e-4, atol=1e-5, ref_factor=8),
                 "fp16": Tolerance(rtol=1e-2, atol=1e-3, ref_factor=8, max_mismatch=0.01),
                 "bf16": Tolerance(rtol=5e-2, atol=1e-2, ref_factor=8, max_mismatch=0.01)}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        m, n, k, dtype = case["m"], case["n"], case["k"], case.dtype
        weight = randn((n, k), dtype, gen, device, scale=0.5)
        packed, alpha = pack_signs(weight)
        return {"x": randn((m, k), dtype, gen, device), "weight": weight,
                "bias": randn((n,), dtype, gen, device, scale=0.1), "packed": packed, "alpha": alpha,
                "w_binarized": binarize(weight)}

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("x", "weight")

    def reference(self, inputs: Mapping[str, object]) -> torch.Tensor:
        """The binarized Linear in float64, with the STE's gradients: what every variant computes."""
        return binary_linear(inputs["x"], inputs["weight"], inputs["bias"])

    def flops(self, case: Case, backward: bool = False) -> float:
        return 2.0 * case["m"] * case["n"] * case["k"] * (3 if backward else 1)

    def bytes(self, case: Case, backward: bool = False) -> float:
        """What the 1-bit kernel moves: x, the packed signs and row scales, the output."""
        m, n, k, s = case["m"], case["n"], case["k"], case.dtype.itemsize
        return float(m * k * s + n * (-(-k // 32)) * 4 + 4 * n + m * n * s)
