"""The embedded model's Linears in int8, for the model-level claims ("8-bit keeps > 95% of the accuracy").

Each ``nn.Linear`` of the trained model is replaced after training (``Transformer.swap_linears``): the
weight is quantized once, when the trained weights are loaded, and only its int8 form is kept.
"""

from __future__ import annotations

import torch
from torch import nn

from microscope.api import ConvertedLinear, Transformer

from .kernel import int8_linear
from .reference import quantize_per_channel, quantize_per_tensor_affine


class DynamicInt8Linear(ConvertedLinear):
    """Per-channel int8 weight; activations quantized per token on every call; the Triton GEMM."""

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w_q, w_scale = quantize_per_channel(weight)
        self.register_buffer("w_q", w_q, persistent=False)
        self.register_buffer("w_scale", w_scale, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        bias = None if self.bias is None else self.bias.to(x.dtype)
        return int8_linear(x, self.w_q, self.w_scale, bias)


class AffineInt8Linear(ConvertedLinear):
    """The seed's scheme: the weight quantized per tensor (one scale and zero point), activations per
    tensor on every call, both dequantized before a float Linear."""

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        w_q, scale, zero = quantize_per_tensor_affine(weight)
        self.register_buffer("w_q", w_q, persistent=False)
        self.w_scale, self.w_zero = scale, zero
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        x_q, x_scale, x_zero = quantize_per_tensor_affine(x)
        x_d = (x_q.float() - x_zero) * x_scale
        w_d = (self.w_q.float() - self.w_zero) * self.w_scale
        return nn.functional.linear(x_d, w_d, self.bias).to(x.dtype)


def use_dynamic_int8(model: Transformer) -> None:
    """Every Linear of the model as a dynamic int8 Linear (Triton GEMM)."""
    model.swap_linears(lambda _name, linear: DynamicInt8Linear(linear))


def use_affine_int8(model: Transformer) -> None:
    """Every Linear of the model as the seed's per-tensor affine int8 Linear."""
    model.swap_linears(lambda _name, linear: AffineInt8Linear(linear))
