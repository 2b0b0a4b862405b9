"""Plugin: magnitude sparsity (the seed's ``weights * (|w| > threshold)``) at 50%, 2:4 and in whole blocks.

Operator level: a Linear whose weight is masked, as the seed writes it (the mask applied each call), vs
a Triton GEMM that skips the weight's zero tiles and, for the 2:4 pattern on a GPU, torch's 2:4 sparse
tensor-core GEMM (cuSPARSELt), with ``F.linear`` on the pre-masked weight as the peer.
Model level: the embedded model trained with masks recomputed from ``|w|`` every few steps (unstructured
50%, 2:4, 50% of 32 x 32 blocks) against the dense model: the accuracy each pattern costs.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from microscope.api import (
    Ablation,
    Arm,
    Case,
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

from .kernel import block_index, block_sparse_linear
from .reference import mask_for
from .semi_structured import compress, two_four_linear, unsupported

#: Training steps between two mask updates at model level.
MASK_EVERY = 10


def seed_masked(x: torch.Tensor, weight: torch.Tensor, mask: torch.Tensor, bias: torch.Tensor,
                **_: object) -> torch.Tensor:
    """The seed's form: ``F.linear(x, weight * mask)``, the mask applied in every call."""
    return F.linear(x, weight * mask, bias)


def triton_block_sparse(x: torch.Tensor, w_sparse: torch.Tensor, index: torch.Tensor, count: torch.Tensor,
                        bias: torch.Tensor, **_: object) -> torch.Tensor:
    """One Triton GEMM over the pre-masked weight, reading only its nonzero 32 x 32 tiles."""
    return block_sparse_linear(x, w_sparse, index, count, bias)


def semi_structured(x: torch.Tensor, w_compressed: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """The 2:4 weight compressed for sparse tensor cores, one cuSPARSELt GEMM (``torch._cslt_sparse_mm``)."""
    return two_four_linear(x, w_compressed, bias)


def dense(x: torch.Tensor, w_sparse: torch.Tensor, bias: torch.Tensor, **_: object) -> torch.Tensor:
    """``F.linear`` on the pre-masked weight: every zero multiplied."""
    return F.linear(x, w_sparse, bias)


class MaskedLinear(nn.Module):
    """A Linear training under a magnitude mask recomputed from ``|w|`` every ``MASK_EVERY`` training calls
    (the weight is the replaced Linear's own parameter; pruned weights keep training and may return)."""

    def __init__(self, linear: nn.Linear, pattern: str) -> None:
        super().__init__()
        self.weight, self.bias, self.pattern = linear.weight, linear.bias, pattern
        self.register_buffer("mask", mask_for(linear.weight, pattern), persistent=False)
        self.calls = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.training and torch.is_grad_enabled():
            if self.calls % MASK_EVERY == 0:
                self.mask = mask_for(self.weight, self.pattern)
            self.calls += 1
        return F.linear(x, self.weight * self.mask, self.bias)


def masked_training(pattern: str):  # noqa: ANN201 - an Arm patch
    """A patch putting ``MaskedLinear(pattern)`` in place of every Linear but the output head."""

    def patch(model: Transformer) -> None:
        model.swap_linears(lambda name, linear: linear if name == "lm_head" else MaskedLinear(linear, pattern))

    patch.__doc__ = f"Every Linear but the output head trained under a {pattern} magnitude mask."
    return patch


@register("magnitude_sparsity")
class MagnitudeSparsity(Ablation):
    """Masked Linear: the seed's per-call mask vs a Triton GEMM skipping zero tiles."""

    variants = {
        "seed_mask": baseline(seed_masked, differentiable=False),
        "triton": candidate(triton_block_sparse, needs=("triton",), differentiable=False),
        "semi_structured": candidate(semi_structured, differentiable=False, supports=unsupported),
        "dense": peer(dense, differentiable=False),
    }
    arms = {
        "dense": Arm(Role.BASELINE, "the embedded model's dense Linears"),
        "unstructured_50": Arm(description="50% of each weight's smallest |w| masked, mask updated every 10 steps",
                               patch=masked_training("unstructured")),
        "two_four": Arm(description="2 of every 4 input columns kept per row (2:4), updated every 10 steps",
                        patch=masked_training("2:4")),
        "block_50": Arm(description="50% of 32 x 32 weight tiles (smallest norm) masked, updated every 10 steps",
                        patch=masked_training("block")),
    }
    # odd sizes: N and K of no tile; the three patterns
    cases = grid(m=[1, 37], n=[129], k=[300], pattern=["unstructured", "2:4", "block"], dtype=["fp32", "bf16"])
    # every variant multiplies the same masked weight: only the summation order differs
    tolerance = {"fp32": Tolerance(rtol=1e-4, atol=1e-5, ref_factor=8),
                 "fp16": Tolerance(rtol=1e-2, atol=1e-3, ref_factor=8, max_mismatch=0.01),
                 "bf16": Tolerance(rtol=5e-2, atol=1e-2, ref_factor=8, max_mismatch=0.01)}

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        m, n, k, dtype = case["m"], case["n"], case["k"], case.dtype
        weight = randn((n, k), dtype, gen, device, scale=k**-0.5)
        mask = mask_for(weight, case["pattern"], 0.5)
        w_sparse = weight * mask
        index, count = block_index(w_sparse)
        tensors = {"x": randn((m, k), dtype, gen, device), "weight": weight, "mask": mask.to(dtype),
                   "w_sparse": w_sparse, "index": index, "count": count,
                   "bias": randn((n,), dtype, gen, device, scale=0.1)}
        if unsupported(case, device) is None:
            tensors["w_compressed"] = compress(w_sparse)
        return tensors

    def flops(self, case: Case, backward: bool = False) -> float:
        """The dense count (2MNK): rates then compare times; the sparse kernel does less of it."""
        return 2.0 * case["m"] * case["n"] * case["k"]
