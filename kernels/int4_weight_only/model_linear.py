"""The embedded model's Linears with 4-bit weights, for the model-level claims ("INT4 -3.5% accuracy").

Each ``nn.Linear`` of the trained model is replaced after training (``Transformer.swap_linears``): the
weight is quantized once (round to nearest, per group), when the trained weights are loaded, and only
its packed 4-bit form with the per-group scales and zero points is kept. The GPTQ arm quantizes in its
``calibrate`` step instead, from each Linear's input Hessian over training batches of the trained float
model (one pass: every layer sees the float model's activations, not its quantized predecessors').
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
from torch import nn

from microscope.api import ConvertedLinear, Transformer

from .kernel import int4_linear
from .reference import Int4Weight, quantize_gptq_hessian, quantize_int4


class Int4Linear(ConvertedLinear):
    """A Linear with a group-wise 4-bit weight, applied by the Triton GEMM."""

    def __init__(self, linear: nn.Linear, group: int = 128, hessian: torch.Tensor | None = None) -> None:
        # plain attributes, set before ``convert`` runs in the base constructor; the Hessian (GPTQ) is
        # dropped once used, so a later ``load_state_dict`` rounds to nearest
        self.group, self._hessian = group, hessian
        self._weight: Int4Weight | None = None  # the buffers as one Int4Weight, made on the first call
        super().__init__(linear)
        self._hessian = None

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        if self._hessian is not None:
            w4 = quantize_gptq_hessian(weight.float(), self._hessian, self.group)
        else:
            w4 = quantize_int4(weight, self.group)
        self.register_buffer("packed", w4.packed, persistent=False)
        self.register_buffer("scale", w4.scale, persistent=False)
        self.register_buffer("zero", w4.zero, persistent=False)
        self.register_buffer("bias", None if bias is None else bias.float(), persistent=False)

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        weight = self._weight
        if (weight is None or weight.packed is not self.packed or weight.scale is not self.scale
                or weight.zero is not self.zero):  # made once; again after a load, a move or a cast
            weight = self._weight = Int4Weight(self.packed, self.scale, self.zero, self.in_features, self.group)
        return int4_linear(x, weight, None if self.bias is None else self.bias.to(x.dtype))


def int4_linears(group: int):  # noqa: ANN201 - an Arm patch
    """A patch putting ``Int4Linear`` with this group size in place of every Linear of the model."""

    def patch(model: Transformer) -> None:
        model.swap_linears(lambda _name, linear: Int4Linear(linear, group))

    patch.__doc__ = f"Every Linear with round-to-nearest 4-bit weights in groups of {group} (Triton GEMM)."
    return patch


def gptq_calibration(group: int):  # noqa: ANN201 - an Arm calibrate step
    """A ``calibrate`` step: each Linear's input Hessian ``X^T X / n`` over the calibration batches of the
    trained float model, then ``Int4Linear`` with GPTQ-quantized weights in place of every Linear."""

    def calibrate(model: Transformer, batches: Sequence[torch.Tensor]) -> None:
        sums: dict[str, torch.Tensor] = {}
        rows: dict[str, int] = {}

        def record(name: str):  # noqa: ANN202
            def hook(_module: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
                x = args[0].detach().reshape(-1, args[0].shape[-1]).float()
                sums[name] = sums.get(name, 0) + x.t() @ x
                rows[name] = rows.get(name, 0) + x.shape[0]
            return hook

        hooks = [m.register_forward_pre_hook(record(name)) for name, m in model.named_modules()
                 if isinstance(m, nn.Linear)]
        try:
            with torch.no_grad():
                for tokens in batches:
                    model(tokens)
        finally:
            for h in hooks:
                h.remove()
        model.swap_linears(lambda name, linear: Int4Linear(linear, group, sums[name] / rows[name]))

    calibrate.__doc__ = f"GPTQ 4-bit weights in groups of {group}, Hessians from the trained model's activations."
    return calibrate
