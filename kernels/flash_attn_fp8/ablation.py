"""The flash_attn_fp8 plugin: FlashAttention's forward with FP8 (e4m3) matmuls and per-block scales, against
microscope's bf16 FlashAttention kernel (the baseline: the same algorithm in the inputs' dtype) and the
torch SDPA backends a user would pick instead.

Accuracy is the FP8 claim's price: every variant is judged against the float64 attention of the same bf16
(or fp16) inputs, the FP8 kernel within ``FP8_ERROR_BUDGET``. Forward only (FP8 here is an inference
kernel). torch's own FP8 attention is not a peer: this torch's ``scaled_dot_product_attention`` takes no
e4m3 inputs.

Case parameters: ``batch``, ``heads``, ``seq`` (queries), ``kv_prefix`` (keys before the first query),
``head_dim``, ``dtype``, ``causal``.
"""

from __future__ import annotations

import torch
from microscope_kernels.flash_attn.ablation import FlashAttention, peer_variant, triton_supports
from microscope_kernels.flash_attn.kernel import flash_attention
from microscope_kernels.flash_attn.peers import PEERS

from microscope.api import Case, baseline, candidate, error_budget, grid, register

from .kernel import SUPPORTED_HEAD_DIMS, flash_attention_fp8
from .kernel import precompile as compile_candidates

#: What FP8 operands may cost: norm-relative output error against float64. e4m3 keeps 3 mantissa bits
#: (a half-step of 6.25% relative at most); with q, k, v and the probabilities each rounded, random inputs
#: measure 4.3-5.1% (medians over 40 seeds, 64-129 queries), and one query's 128 outputs spread to 8.1%
#: (worst of 300 seeds; CPU, the interpreter rounding to nearest as a GPU does; README).
FP8_ERROR_BUDGET = 0.10


def _fp8_supports(case: Case, device: str) -> str | None:
    if case["head_dim"] not in SUPPORTED_HEAD_DIMS:
        return f"head_dim {case['head_dim']} not in {SUPPORTED_HEAD_DIMS}"
    if case.dtype not in (torch.float16, torch.bfloat16):
        return f"FP8 attention rounds fp16/bf16 inputs, not {case.dtype}"
    if device == "cuda" and torch.cuda.get_device_capability() < (8, 9):
        return "e4m3 matmuls need a GPU of compute capability 8.9 or newer (Ada, Hopper)"
    return None


@register("flash_attn_fp8")
class FlashAttentionFP8(FlashAttention):
    """FP8 (e4m3) FlashAttention forward with per-block scales vs the same kernel in bf16 and torch SDPA.

    The cases' parameters, inputs, FLOP and byte counts are flash_attn's (forward only here)."""

    variants = {
        "triton_bf16": baseline(flash_attention, "microscope's FlashAttention kernel in the inputs' dtype",
                                needs=("triton",), supports=triton_supports, differentiable=False),
        "triton_fp8": candidate(flash_attention_fp8, "q, k, v and the probabilities in e4m3 with per-block scales",
                                needs=("triton",), supports=_fp8_supports, differentiable=False),
        "sdpa_cudnn": peer_variant(PEERS["sdpa_cudnn"], "torch SDPA, cuDNN backend (bf16)"),
        "sdpa_flash": peer_variant(PEERS["sdpa_flash"], "torch SDPA, FlashAttention-2 backend (bf16)"),
        "sdpa_math": peer_variant(PEERS["sdpa_math"], "torch SDPA, math backend"),
    }
    arms = {}  # an inference kernel: no model-level arm
    cases = grid(batch=[1], heads=[2], seq=[100], kv_prefix=[0, 37], head_dim=[64], dtype=["bf16"],
                 causal=[False, True])
    # outputs are averages of unit-variance values (|y| up to ~3 for the first causal rows): the element rule
    # admits 2% of elements beyond 0.03 + 15%
    tolerance = error_budget(FP8_ERROR_BUDGET, rtol=0.15, atol=0.03, max_mismatch=0.02)

    def grad_inputs(self, case: Case) -> tuple[str, ...]:
        return ()

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the FP8 kernel's autotuning candidates for the case's lengths, head dim and mask."""
        if device == "cuda" and _fp8_supports(case, device) is None:
            sq, sk = case["seq"], case["seq"] + case["kv_prefix"]
            compile_candidates(sq, sk, case["head_dim"], case.dtype, case["causal"], shard)
