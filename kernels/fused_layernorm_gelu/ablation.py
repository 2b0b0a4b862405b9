"""Plugin: LayerNorm + GeLU fused into one Triton kernel vs the two eager ops (and torch.compile).

Operator level: the pair on seeded tensors. Model level: the embedded model built with a LayerNorm over
the MLP's hidden units before its GELU (``ModelConfig.mlp_norm``), the eager pair vs the fused kernel.
"""

from __future__ import annotations

import functools
from collections.abc import Callable

import torch
from microscope_kernels.fused_layernorm_gelu import launches
from microscope_kernels.fused_layernorm_gelu.kernel import ForwardPlan, layernorm_gelu, precompile
from microscope_kernels.fused_layernorm_gelu.launches import Launch
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager

from microscope.api import (
    Ablation,
    Arm,
    Case,
    NormGelu,
    Role,
    Tolerance,
    baseline,
    call_as_timed,
    candidate,
    grid,
    peer,
    randn,
    register,
    warm_ways,
)

EPS = 1e-5


def eager(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    """Eager F.layer_norm then F.gelu: two kernels, the normalized tensor makes a round trip."""
    return layernorm_gelu_eager(x, weight, bias, EPS, approximate)


#: The forward's launch fields a config may sweep (``launch_*`` profiles); warps 0 = the tuned plan.
LAUNCH_PARAMS = {"warps": 0, "persistent": False, "prefetch": 0, "stages": 1, "stream_hints": False,
                 "block_m": 1, "maxnreg": 0, "balanced": False, "tma": False, "tma_store": False}


def triton_fused(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str, warps: int = 0,
                 persistent: bool = False, prefetch: int = 0, stages: int = 1, stream_hints: bool = False,
                 block_m: int = 1, maxnreg: int = 0, balanced: bool = False, tma: bool = False,
                 tma_store: bool = False) -> torch.Tensor:
    """One Triton pass: read x, write gelu(layer_norm(x)); backward recomputes from 2 floats per row.

    ``warps`` > 0 forces the launch plan ``ForwardPlan(warps, persistent, prefetch, stages, stream_hints)``
    instead of the one the kernel tunes per shape class; ``block_m``, ``maxnreg``, ``balanced`` and
    ``tma`` force a persistent launch that only a study uses (``launches.py``, inference calls only)."""
    if block_m != 1 or maxnreg or balanced or tma:
        if torch.is_grad_enabled() and any(t.requires_grad for t in (x, weight, bias)):
            raise ValueError("block_m, maxnreg, balanced and tma are forward-only launch studies: time them "
                             "without a backward (throughput.backward: false, accuracy.backward: false)")
        launch = Launch(block_m, warps or 4, prefetch, maxnreg, balanced, stream_hints, stages, tma, tma_store)
        return launches.forward(x.reshape(-1, x.shape[-1]), weight, bias, EPS, approximate, launch).view_as(x)
    plan = ForwardPlan(warps, persistent, prefetch, stages, stream_hints) if warps else None
    return layernorm_gelu(x, weight, bias, EPS, approximate, plan=plan)


#: Dynamo settings for the peer's calls (those this torch version has).
_WANTED_SETTINGS = {"cache_size_limit": 256, "fail_on_recompile_limit_hit": True}
_RECOMPILE_SETTINGS = {key: value for key, value in _WANTED_SETTINGS.items() if hasattr(torch._dynamo.config, key)}


@functools.lru_cache(maxsize=1)
def _compiled() -> Callable[..., torch.Tensor]:
    return torch.compile(layernorm_gelu_eager, dynamic=False)


def compiled(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor, approximate: str) -> torch.Tensor:
    """torch.compile (Inductor) of the same eager function: what a user gets without a custom kernel.

    Every shape, dtype and grad mode recompiles. The cuda profile's sweep needs more than Dynamo's
    default 8 recompiles, after which Dynamo silently runs the eager function under the peer's name
    (seen on the H200). So the limit is raised for the call, and hitting it anyway is an error.
    """
    with torch._dynamo.config.patch(**_RECOMPILE_SETTINGS):
        return _compiled()(x, weight, bias, EPS, approximate)


def _compile_needs_cuda(case: Case, device: str) -> str | None:
    if device != "cuda":
        return ("torch.compile is measured on CUDA only: on a small CPU box Inductor's C++ compile "
                "takes minutes per case and measures the compiler, not the kernel")
    return None


class FusedNormGelu(torch.nn.Module):
    """The model's ``NormGelu`` computed by the fused kernel, taking over the very same weight and bias
    (same parameter names, so initial weights, checksums and optimizer state are the eager arm's)."""

    def __init__(self, eager_pair: NormGelu) -> None:
        super().__init__()
        self.weight, self.bias = eager_pair.weight, eager_pair.bias
        self.eps, self.approximate = eager_pair.eps, eager_pair.approximate

    def forward(self, h: torch.Tensor) -> torch.Tensor:
        return layernorm_gelu(h, self.weight, self.bias, self.eps, self.approximate)


def use_fused_norm_gelu(model) -> None:  # noqa: ANN001 - a microscope.api.Transformer
    """Model level: every block's LayerNorm -> GELU pair (``block.mlp.act``) runs as one Triton kernel."""
    pairs = [block.mlp for block in model.blocks if isinstance(block.mlp.act, NormGelu)]
    if not pairs:
        raise ValueError("the model has no LayerNorm -> GELU pair to fuse: set workload.model "
                         "{mlp: gelu, mlp_norm: true} in the config (see ablations/fused_layernorm_gelu_model.yaml)")
    for mlp in pairs:
        mlp.act = FusedNormGelu(mlp.act)


@register("fused_layernorm_gelu")
class FusedLayerNormGelu(Ablation):
    """gelu(layer_norm(x)) in one Triton pass (forward and backward) vs eager and torch.compile.

    The claim under test: fusing saves half the memory traffic of the forward, which is where a
    bandwidth-bound pair of ops spends its time.
    """

    variants = {
        "eager": baseline(eager),
        "triton": candidate(triton_fused, needs=("triton",), params=LAUNCH_PARAMS),
        "compile": peer(compiled, supports=_compile_needs_cuda),
    }
    #: Model level (needs ``workload.model: {mlp: gelu, mlp_norm: true}``): the MLP's eager pair vs the kernel.
    arms = {
        "eager": Arm(Role.BASELINE, "F.layer_norm then F.gelu on the MLP's hidden units"),
        "triton": Arm(description="the same pair as one fused Triton kernel (forward and backward)",
                      patch=use_fused_norm_gelu, needs=("triton",)),
    }
    # Odd sizes on purpose: neither is a multiple of a block, so every mask is exercised.
    cases = grid(rows=[37], cols=[301], approximate=["tanh", "none"], dtype=["fp32", "fp16", "bf16"])
    # The element rule allows a few ulps of the output dtype (GeLU outputs near 0 need the atol); the
    # noise-calibrated rule (4x the eager baseline's own error in the same dtype) does the real judging.
    tolerance = {
        "fp32": Tolerance(rtol=1e-5, atol=1e-5),
        "fp16": Tolerance(rtol=4e-3, atol=4e-3),
        "bf16": Tolerance(rtol=3e-2, atol=3e-2),
        "fp64": Tolerance(rtol=1e-10, atol=1e-10),
    }

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """The compiled peer's graphs at the case's shapes (one per way the run calls it, in the shards
        ``warm_ways`` names), then this shard of the Triton kernel's builds, one process further on."""
        if device != "cuda":
            return
        rows, cols = case["rows"], case["cols"]
        tensors = {"x": torch.zeros((rows, cols), device=device, dtype=case.dtype),
                   "weight": torch.ones((cols,), device=device, dtype=case.dtype),
                   "bias": torch.zeros((cols,), device=device, dtype=case.dtype)}
        for grads in warm_ways(shard, backward):
            call_as_timed(compiled, {**tensors, "approximate": case["approximate"]},
                          self.grad_inputs(case) if grads else ())
        torch.cuda.synchronize()
        after = ((shard[0] - 1) % shard[1], shard[1])
        precompile(rows, cols, case.dtype, case["approximate"], EPS, backward, after)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        rows, cols, dtype = case["rows"], case["cols"], case.dtype
        return {
            "x": randn((rows, cols), dtype, gen, device),
            "weight": (1.0 + randn((cols,), torch.float32, gen, "cpu", scale=0.1)).to(device, dtype),
            "bias": randn((cols,), dtype, gen, device, scale=0.1),
            "approximate": case["approximate"],
        }

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ("x", "weight", "bias")

    def flops(self, case: Case, backward: bool = False) -> float:
        """~20 flops per element forward (statistics 4, affine 3, GeLU ~13), ~40 more backward.

        An estimate for a TFLOP/s column; the op is bandwidth-bound, GB/s is the number that matters.
        """
        per_elem = 20 + (40 if backward else 0)
        return float(per_elem * case["rows"] * case["cols"])

    def bytes(self, case: Case, backward: bool = False) -> float:
        """Minimum traffic: forward reads x and writes y; backward reads x and dy and writes dx.

        weight and bias are read (and their gradients written) once: O(cols), counted too.
        """
        rows, cols, size = case["rows"], case["cols"], case.dtype.itemsize
        row_trips = 2 + (3 if backward else 0)
        vector_trips = 2 + (4 if backward else 0)
        return float((row_trips * rows * cols + vector_trips * cols) * size)
