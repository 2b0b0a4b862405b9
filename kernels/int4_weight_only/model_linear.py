"""The embedded model's Linears with 4-bit weights, for the model-level claims ("INT4 -3.5% accuracy").

Each ``nn.Linear`` of the trained model is replaced after training (``Transformer.swap_linears``): the
weight is quantized once (round to nearest, per group), when the trained weights are loaded, and only
its packed 4-bit form with the per-group scales and zero points is kept.
"""

from __future__ import annotations

import torch
from torch import nn

from microscope.api import ConvertedLinear, Transformer

from .kernel import int4_linear
from .reference import Int4Weight, quantize_int4


class Int4Linear(ConvertedLinear):
    """A Linear with a group-wise 4-bit weight, applied by the Triton GEMM."""

    def __init__(self, linear: nn.Linear, group: int = 128) -> None:
        self.group = group  # a plain attribute, set before ``convert`` runs in the base constructor
        super().__init__(linear)

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w4 = quantize_int4(weight, self.group)
        self.register_buffer("packed", w4.packed, persistent=False)
        self.register_buffer("scale", w4.scale, persistent=False)
        self.register_buffer("zero", w4.zero, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        weight = Int4Weight(self.packed, self.scale, self.zero, self.in_features, self.group)
        return int4_linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))


def int4_linears(group: int):  # noqa: ANN201 - an Arm patch
    """A patch putting ``Int4Linear`` with this group size in place of every Linear of the model."""

    def patch(model: Transformer) -> None:
        model.swap_linears(lambda _name, linear: Int4Linear(linear, group))

    patch.__doc__ = f"Every Linear with round-to-nearest 4-bit weights in groups of {group} (Triton GEMM)."
    return patch
