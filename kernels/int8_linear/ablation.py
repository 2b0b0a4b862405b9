"""Plugin: dynamic int8 Linear (per-token activations, per-channel weights, Triton int8 GEMM with a fused
dequant epilogue) vs the seed's per-tensor affine int8 Linear, with torch's int8 GEMM and F.linear as peers.

Operator level: one Linear call on seeded activations; the weight is quantized once, outside the call,
as a deployment would (``inputs`` hands every variant both the float weight and its int8 form).
Model level: every Linear of the trained embedded model in int8, scored against the float model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from microscope_kernels.int8_linear.kernel import int8_gemm, int8_linear
from microscope_kernels.int8_linear.kernel import precompile as compile_candidates
from microscope_kernels.int8_linear.model_linear import use_affine_int8, use_dynamic_int8
from microscope_kernels.int8_linear.reference import affine_linear, quantize_per_channel, quantize_rows_eager

from microscope.api import (
    Ablation,
    Arm,
    Case,
    ModelShapes,
    Role,
    baseline,
    candidate,
    error_budget,
    grid,
    peer,
    randn,
    register,
)

#: The accuracy dynamic int8 is allowed to cost: norm-relative error of the output vs the float64 Linear
#: on the unquantized weight. Per-token and per-channel symmetric int8 measures ~1% on Gaussian inputs.
INT8_ERROR_BUDGET = 0.03


def affine(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """The seed's int8 Linear: x and W quantized per tensor (affine, with a zero point), dequantized."""
    return affine_linear(x, weight, bias)


def triton_int8(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor,
                x_q: torch.Tensor | None = None, x_scale: torch.Tensor | None = None, **_: object) -> torch.Tensor:
    """One Triton quantize pass (per token) and one int8 x int8 -> int32 GEMM, dequant and bias fused; the
    GEMM alone where the case hands over quantized activations (``stage: gemm``)."""
    if x_q is not None:
        return int8_gemm(x_q, x_scale, w_q, w_scale, bias, x.dtype)
    return int8_linear(x, w_q, w_scale, bias)


def int_mm(x: torch.Tensor, w_q: torch.Tensor, w_scale: torch.Tensor, bias: torch.Tensor,
           x_q: torch.Tensor | None = None, x_scale: torch.Tensor | None = None, **_: object) -> torch.Tensor:
    """The same scheme with torch's pieces: eager per-token quantization (unless the case hands over
    quantized activations), ``torch._int_mm``, eager rescale."""
    if x_q is None:
        x_q, x_scale = quantize_rows_eager(x)
    acc = torch._int_mm(x_q, w_q.t())
    return (acc.float() * x_scale[:, None] * w_scale[None, :] + bias.float()).to(x.dtype)


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """F.linear on the unquantized weight in the case's dtype: what a user runs without quantization."""
    return torch.nn.functional.linear(x, weight, bias)


def _int_mm_supports(case: Case, device: str) -> str | None:
    if device == "cuda" and (case["m"] <= 16 or case["k"] % 8 or case["n"] % 8):
        return "torch._int_mm on CUDA needs M > 16 and K, N multiples of 8"
    return None


@register("int8_linear")
class Int8Linear(Ablation):
    """Dynamic int8 Linear in Triton vs the seed's per-tensor affine int8 Linear (and torch's int8 GEMM)."""

    variants = {
        "affine": baseline(affine, differentiable=False),
        "triton": candidate(triton_int8, needs=("triton",), differentiable=False),
        "int_mm": peer(int_mm, supports=_int_mm_supports, differentiable=False),
        "linear": peer(linear, differentiable=False),
    }
    #: Model level: quantization after training, so the int8 arms reuse the baseline's trained weights.
    arms = {
        "float": Arm(Role.BASELINE, "the trained model's own Linears (bf16 under the gpu profile's autocast, "
                                    "fp32 on CPU)"),
        "int8_dynamic": Arm(description="every Linear int8: per-channel weights, per-token activations, "
                                        "the Triton GEMM", patch=use_dynamic_int8, needs=("triton",),
                            inference_only=True),
        "int8_per_tensor": Arm(Role.PEER, "every Linear int8 the seed's way: per-tensor affine weights and "
                                          "activations, dequantized for a float Linear",
                               patch=use_affine_int8, inference_only=True),
    }
    # odd sizes: rows that fill no tile, N and K multiples of no block. ``stage: gemm`` times the int8
    # variants' GEMM and epilogue alone, on activations quantized outside the call.
    cases = grid(m=[1, 37], n=[129], k=[300], dtype=["fp32", "fp16", "bf16"], stage=["linear"])
    # outputs ~N(0, 1): the element rule admits 2% of them beyond 0.05 + 5%
    tolerance = error_budget(INT8_ERROR_BUDGET, rtol=0.05, atol=0.05, max_mismatch=0.02)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        m, n, k, dtype = case["m"], case["n"], case["k"], case.dtype
        weight = randn((n, k), dtype, gen, device, scale=k**-0.5)  # outputs ~N(0, 1)
        w_q, w_scale = quantize_per_channel(weight)
        x = randn((m, k), dtype, gen, device)
        inputs = {"x": x, "weight": weight, "bias": randn((n,), dtype, gen, device, scale=0.1),
                  "w_q": w_q, "w_scale": w_scale}
        if case.get("stage", "linear") == "gemm":  # the int8 variants start from quantized activations
            inputs["x_q"], inputs["x_scale"] = quantize_rows_eager(x)
        return inputs

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the kernels the case's shape and dtype may run (``kernel.precompile``; the bias is always
        passed)."""
        if device == "cuda":
            compile_candidates(case["m"], case["n"], case["k"], case.dtype, True, shard)

    def precompile_model(self, arm: str, shapes: ModelShapes, device: str, shard: tuple[int, int]) -> None:
        """This shard of the kernels every Linear of the int8 arm may run, at each row count it is called with
        (the first call of each shape autotunes or times them)."""
        if device == "cuda" and arm == "int8_dynamic":
            for n, k, has_bias in shapes.linears:
                for m, dtype in shapes.calls():
                    compile_candidates(m, n, k, dtype, has_bias, shard)

    def reference(self, inputs: Mapping[str, torch.Tensor]) -> torch.Tensor:
        """The Linear itself on the unquantized weight (float64 here): what every variant approximates."""
        return torch.nn.functional.linear(inputs["x"], inputs["weight"], inputs["bias"])

    def flops(self, case: Case, backward: bool = False) -> float:
        return 2.0 * case["m"] * case["n"] * case["k"]

    def bytes(self, case: Case, backward: bool = False) -> float:
        """The least any int8 variant moves: x, the int8 weight and its scales, the output."""
        m, n, k, s = case["m"], case["n"], case["k"], case.dtype.itemsize
        return float(m * k * s + n * k + 4 * n + m * n * s)
