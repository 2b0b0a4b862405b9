"""Plugin: SwiGLU keeping its saved inputs in 8 bits (Triton) vs the plain op autograd keeps in full.

Operator level: ``h = silu(g) * u`` forward and backward; the forward is exact, the gradients carry the
int8 rounding of g and u; the memory dimension shows what the backward keeps. Model level: every MLP of
the embedded model (SwiGLU) trained with the 8-bit saved inputs; train-step peak memory, tokens/s and
the loss curve against the plain model over seeds.
"""

from __future__ import annotations

import torch
from microscope_kernels.act_compression_8bit.kernel import int8_saved_swiglu
from microscope_kernels.act_compression_8bit.reference import eager_int8_swiglu, swiglu

from microscope.api import (
    Ablation,
    Arm,
    Case,
    Role,
    Transformer,
    baseline,
    candidate,
    error_budget,
    grid,
    peer,
    randn,
    register,
)

#: What 8-bit saved inputs may cost the gradients: norm-relative error vs the float64 gradients. Half a
#: step of absmax / 127 per element measures 0.3-0.6% on Gaussian inputs.
GRAD_ERROR_BUDGET = 0.02


def plain(g: torch.Tensor, u: torch.Tensor, **_: object) -> torch.Tensor:
    """``F.silu(g) * u``: autograd keeps g, u and silu(g) in their own dtype."""
    return swiglu(g, u)


def triton_int8(g: torch.Tensor, u: torch.Tensor, **_: object) -> torch.Tensor:
    """One Triton pass writes h and int8 copies of g and u; the backward dequantizes in registers."""
    return int8_saved_swiglu(g, u)


def eager_int8(g: torch.Tensor, u: torch.Tensor, **_: object) -> torch.Tensor:
    """The same 8-bit saved inputs quantized and dequantized in eager PyTorch."""
    return eager_int8_swiglu(g, u)


def use_int8_saved_swiglu(model: Transformer) -> None:
    """Model level: every MLP's SwiGLU keeps its inputs in 8 bits for the backward (Triton)."""
    _set_glu(model, int8_saved_swiglu)


def use_eager_int8_saved_swiglu(model: Transformer) -> None:
    """Model level: the same in eager PyTorch."""
    _set_glu(model, eager_int8_swiglu)


def _set_glu(model: Transformer, fn) -> None:  # noqa: ANN001
    if model.cfg.mlp != "swiglu":
        raise ValueError(f"8-bit saved SwiGLU inputs need the SwiGLU MLP; this model's MLP is {model.cfg.mlp!r} "
                         "(set workload.model.mlp: swiglu)")
    for block in model.blocks:
        block.mlp.glu = fn


@register("act_compression_8bit")
class ActCompression8bit(Ablation):
    """SwiGLU with int8 saved inputs (Triton, and eager) vs the plain op."""

    variants = {
        "plain": baseline(plain),
        "triton": candidate(triton_int8, needs=("triton",)),
        "eager_int8": peer(eager_int8),
    }
    #: Model level: the plain SwiGLU MLP vs the one keeping 8-bit inputs for its backward, both trained.
    arms = {
        "plain": Arm(Role.BASELINE, "the embedded model's SwiGLU MLP: autograd keeps g, u and silu(g)"),
        "int8_saved": Arm(description="every MLP keeps int8 g and u for the backward (Triton)",
                          patch=use_int8_saved_swiglu, needs=("triton",)),
        "int8_saved_eager": Arm(Role.PEER, "every MLP keeps int8 g and u for the backward (eager PyTorch)",
                                patch=use_eager_int8_saved_swiglu),
    }
    # odd sizes: rows that fill no block, a row length of no power of two
    cases = grid(rows=[37], cols=[300], dtype=["fp32", "fp16", "bf16"])
    # a rounding step of a large input can move one gradient: 1% of elements may stray beyond 0.02 + 5%
    tolerance = error_budget(GRAD_ERROR_BUDGET, rtol=0.05, atol=0.02, max_mismatch=0.01)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        shape, dtype = (case["rows"], case["cols"]), case.dtype
        return {"g": randn(shape, dtype, gen, device, scale=2.0), "u": randn(shape, dtype, gen, device)}

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("g", "u")

    def bytes(self, case: Case, backward: bool = False) -> float:
        """The 8-bit variant's traffic: forward reads g, u and writes h and the int8 copies; backward
        reads dh and the copies and writes dg, du."""
        n, s = case["rows"] * case["cols"], case.dtype.itemsize
        forward = n * (3 * s + 2) + 8 * case["rows"]
        return float(forward + n * (3 * s + 2) + 8 * case["rows"]) if backward else float(forward)
