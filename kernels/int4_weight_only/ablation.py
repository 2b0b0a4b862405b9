"""Plugin: a group-wise 4-bit weight-only Linear (Triton, unpacked in registers) vs the bf16 Linear it
replaces, with dequantize-then-F.linear (the peer a user writes first) and torch's own int4 GEMM
(``aten._weight_int4pack_mm``, where the build and case allow it) as peers. Two quantizers feed the same
kernel: round to nearest, and GPTQ calibrated on activations drawn like x (``triton_gptq``), so the
report shows what the calibration buys.

Operator level: one Linear call; the weight is quantized once, outside the call (round to nearest per
group of ``group`` columns). Decode-shaped (M of 1-16) and prefill-shaped calls both.
Model level: every Linear of the trained embedded model with 4-bit weights, scored against the float model.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from microscope_kernels.int4_weight_only.kernel import int4_linear
from microscope_kernels.int4_weight_only.kernel import precompile as compile_candidates
from microscope_kernels.int4_weight_only.model_linear import gptq_calibration, int4_linears
from microscope_kernels.int4_weight_only.reference import Int4Weight, dequantize, quantize_gptq, quantize_int4
from microscope_kernels.int4_weight_only.torch_peer import int4pack_linear, pack, unsupported

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

#: What round-to-nearest 4-bit weights may cost: norm-relative error of the output vs the float64 Linear
#: on the unquantized weight. On Gaussian weights it measures 8-12% (16 levels over a group's range:
#: a step of ~1/3 of the weights' spread), more with larger groups and on one-row cases.
INT4_ERROR_BUDGET = 0.15
#: Model level: the group size of each 4-bit arm (what its kernels are compiled for).
ARM_GROUPS = {"int4_g128": 128, "int4_g32": 32, "int4_gptq_g128": 128}


def linear(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """F.linear on the unquantized weight in the case's dtype (the "before")."""
    return torch.nn.functional.linear(x, weight, bias)


def _weight(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor,
            group: int) -> Int4Weight:
    """The packed weight from its tensors (inputs are plain tensors, so the harness can rotate them)."""
    return Int4Weight(w_packed, w_scale, w_zero, x.shape[-1], group)


def triton_int4(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor, group: int,
                bias: torch.Tensor, **_: object) -> torch.Tensor:
    """``kernel.int4_linear``: a Triton GEMM over the packed 4-bit weight, dequantized in registers per group
    (at prefill shapes, whichever of that and Triton dequantize-then-F.linear is faster on this GPU)."""
    return int4_linear(x, _weight(x, w_packed, w_scale, w_zero, group), bias)


def dequant_linear(x: torch.Tensor, w_packed: torch.Tensor, w_scale: torch.Tensor, w_zero: torch.Tensor,
                   group: int, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """The 4-bit weight dequantized to x's dtype in eager PyTorch each call, then F.linear."""
    return torch.nn.functional.linear(x, dequantize(_weight(x, w_packed, w_scale, w_zero, group), x.dtype), bias)


def torch_int4(x: torch.Tensor, t_packed: torch.Tensor, t_scale_zero: torch.Tensor, group: int,
               bias: torch.Tensor, **_: object) -> torch.Tensor:
    """torch's int4 weight-only GEMM (aten._weight_int4pack_mm) over the same 4-bit values, + bias."""
    return int4pack_linear(x, t_packed, t_scale_zero, group, bias)


def triton_gptq(x: torch.Tensor, g_packed: torch.Tensor, g_scale: torch.Tensor, g_zero: torch.Tensor, group: int,
                bias: torch.Tensor, **_: object) -> torch.Tensor:
    """The same Triton GEMM over a GPTQ-quantized weight (calibrated on activations like x)."""
    return int4_linear(x, _weight(x, g_packed, g_scale, g_zero, group), bias)


#: Rank of the activations' shared part: real activations are correlated across channels, which is
#: what an error-compensating quantizer uses (on independent channels GPTQ is round to nearest).
MIX_RANK = 8
def calibration_rows(k: int) -> int:
    """Calibration rows for GPTQ's Hessian: twice K, within [256, 4096]."""
    return min(4096, max(256, 2 * k))


def _activations(rows: int, k: int, mix: tuple[torch.Tensor, torch.Tensor], dtype: torch.dtype,
                 gen: torch.Generator, device: str) -> torch.Tensor:
    """Gaussian activations plus a shared low-rank part (``MIX_RANK`` directions) of the same variance."""
    z = randn((rows, k), torch.float32, gen, device)
    return (z + (z @ mix[0]) @ mix[1] / (k * MIX_RANK) ** 0.5).to(dtype)


def _torch_int4_refuses(case: Case, device: str) -> str | None:
    return unsupported(case["n"], case["k"], case["group"], case.dtype, device)


@register("int4_weight_only")
class Int4WeightOnly(Ablation):
    """Group-wise 4-bit weights (round to nearest, and GPTQ-calibrated) in a Triton GEMM vs the bf16 Linear."""

    variants = {
        "linear": baseline(linear, differentiable=False),
        "triton": candidate(triton_int4, needs=("triton",), differentiable=False),
        "triton_gptq": candidate(triton_gptq, needs=("triton",), differentiable=False),
        "dequant": peer(dequant_linear, differentiable=False),
        "torch_int4": peer(torch_int4, differentiable=False, supports=_torch_int4_refuses),
    }
    #: Model level: quantization after training, so the 4-bit arms reuse the baseline's trained weights.
    arms = {
        "float": Arm(Role.BASELINE, "the trained model's own Linears (bf16 under the gpu profile's autocast, "
                                    "fp32 on CPU)"),
        "int4_g128": Arm(description="every Linear with 4-bit weights, groups of 128 (round to nearest, Triton)",
                         patch=int4_linears(ARM_GROUPS["int4_g128"]), needs=("triton",), inference_only=True),
        "int4_g32": Arm(description="every Linear with 4-bit weights, groups of 32 (round to nearest, Triton)",
                        patch=int4_linears(ARM_GROUPS["int4_g32"]), needs=("triton",), inference_only=True),
        "int4_gptq_g128": Arm(description="every Linear with GPTQ 4-bit weights, groups of 128: Hessians of "
                                          "the trained model's activations on training batches (Triton)",
                              calibrate=gptq_calibration(ARM_GROUPS["int4_gptq_g128"]), needs=("triton",),
                              inference_only=True),
    }
    # odd sizes: K a multiple of no group (the last group is padded), N and M of no tile; then one
    # shape torch's int4 op takes, so its peer is checked too
    cases = [*grid(m=[1, 37], n=[129], k=[300], group=[32, 128], dtype=["fp32", "fp16", "bf16"]),
             *grid(m=[5], n=[48], k=[256], group=[64], dtype=["fp32", "bf16"])]
    # outputs ~N(0, 1) with ~0.1 of rounding error: the element rule admits 2% beyond 0.35 + 10%
    tolerance = error_budget(INT4_ERROR_BUDGET, rtol=0.1, atol=0.35, max_mismatch=0.02)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        m, n, k, dtype = case["m"], case["n"], case["k"], case.dtype
        weight = randn((n, k), dtype, gen, device, scale=k**-0.5)  # outputs of order 1
        mix = (randn((k, MIX_RANK), torch.float32, gen, device), randn((MIX_RANK, k), torch.float32, gen, device))
        w4 = quantize_int4(weight, case["group"])
        gptq = quantize_gptq(weight, _activations(calibration_rows(k), k, mix, torch.float32, gen, device),
                             case["group"])
        tensors = {"x": _activations(m, k, mix, dtype, gen, device), "weight": weight,
                   "bias": randn((n,), dtype, gen, device, scale=0.1), "w_packed": w4.packed, "w_scale": w4.scale,
                   "w_zero": w4.zero, "group": case["group"], "g_packed": gptq.packed, "g_scale": gptq.scale,
                   "g_zero": gptq.zero}
        if _torch_int4_refuses(case, device) is None:
            tensors["t_packed"], tensors["t_scale_zero"] = pack(w4, dtype)
        return tensors

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the Triton GEMM's autotuning candidates for the case's shape, group and dtype."""
        if device == "cuda":
            compile_candidates(case["m"], case["n"], case["k"], case["group"], case.dtype, True, shard)

    def precompile_model(self, arm: str, shapes: ModelShapes, device: str, shard: tuple[int, int]) -> None:
        """This shard of the candidates of every Linear of a 4-bit arm's model, at each row count it runs."""
        if device == "cuda" and arm in ARM_GROUPS:
            for n, k, has_bias in shapes.linears:
                for m, dtype in shapes.calls():
                    compile_candidates(m, n, k, ARM_GROUPS[arm], dtype, has_bias, shard)

    def reference(self, inputs: Mapping[str, object]) -> torch.Tensor:
        """The Linear on the unquantized weight (float64 here): what every variant approximates."""
        return torch.nn.functional.linear(inputs["x"], inputs["weight"], inputs["bias"])

    def flops(self, case: Case, backward: bool = False) -> float:
        return 2.0 * case["m"] * case["n"] * case["k"]

    def bytes(self, case: Case, backward: bool = False) -> float:
        """What the 4-bit kernel moves: x, the packed weight with its scales and zero points, the output."""
        m, n, k, s, g = case["m"], case["n"], case["k"], case.dtype.itemsize, case["group"]
        groups = -(-k // g)
        return float(m * k * s + n * groups * g // 2 + 8 * n * groups + m * n * s)
