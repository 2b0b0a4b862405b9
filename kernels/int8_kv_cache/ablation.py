"""Plugin: decode attention over an int8 KV cache (fused Triton split-K) vs eager/SDPA on the bf16 cache.

Operator level: one decode step over a seeded cache. Model level: generation of the embedded model
with ``model.cache_cls`` swapped for the int8 cache (``model_cache.py``).
"""

from __future__ import annotations

import torch
from microscope_kernels.int8_kv_cache.kernel import (
    cache_bytes,
    decode_attention,
    int8_decode_attention,
    quantize_kv,
)
from microscope_kernels.int8_kv_cache.model_cache import Int8KVCache as ModelInt8Cache
from microscope_kernels.int8_kv_cache.model_cache import UnfusedInt8KVCache
from microscope_kernels.int8_kv_cache.reference import eager_decode_attention, sdpa_decode_attention

from microscope.api import Ablation, Arm, Case, Role, baseline, candidate, error_budget, grid, peer, randn, register

#: The accuracy the int8 cache is allowed to cost: norm-relative error of the attention output vs
#: the float64 truth on the unquantized cache. Symmetric int8 with per-token or per-channel scales
#: measures ~1% on Gaussian K/V (each value is off by at most scale/2 = amax/254).
INT8_ERROR_BUDGET = 0.03


def eager(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: object) -> torch.Tensor:
    """Eager softmax(q k^T / sqrt(D)) v over the unquantized cache (the "before")."""
    return eager_decode_attention(q, k, v)


#: The int8 decode kernels a config may sweep (``kernel``): "dp4a" (the default) forms the scores as
#: int8 dot products with q quantized to int8; "fma" multiplies in fp32 over the dequantized K;
#: "portable" is "fma" without the PTX unpack; "dot" runs on tensor cores (head_dim >= 64).
KERNELS = {"dp4a": {"ptx_dequant": True, "products": "fma", "int8_query": True},
           "fma": {"ptx_dequant": True, "products": "fma", "int8_query": False},
           "portable": {"ptx_dequant": False, "products": "fma", "int8_query": False},
           "dot": {"ptx_dequant": True, "products": "dot", "int8_query": False}}
#: What a config may sweep on ``triton_int8`` (0: the kernel's own choice, autotuned on a GPU).
INT8_PARAMS = {"kernel": "auto", "split_len": 0, "block_t": 0, "stages": 0}


def triton_int8(q: torch.Tensor, k_q: torch.Tensor, k_scale: torch.Tensor, v_q: torch.Tensor,
                v_scale: torch.Tensor, granularity: str, kernel: str = "auto", split_len: int = 0, block_t: int = 0,
                stages: int = 0, **_: object) -> torch.Tensor:
    """Split-K Triton decode reading the int8 cache and its scales, dequantizing in registers.

    ``kernel`` (a ``KERNELS`` name), ``split_len``, and ``block_t`` with ``stages`` force what the
    kernel otherwise chooses or autotunes (a sweep over them is the kernel's launch study)."""
    if kernel != "auto" and kernel not in KERNELS:
        raise ValueError(f"kernel {kernel!r}: one of auto, {', '.join(KERNELS)}")
    forced = {"split_len": split_len or None, "block_t": block_t or None, "stages": stages or None,
              **KERNELS.get(kernel, {})}
    return int8_decode_attention(q, k_q, k_scale, v_q, v_scale, granularity,
                                 **{k: v for k, v in forced.items() if v is not None})


def triton_fp(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: object) -> torch.Tensor:
    """The same split-K Triton decode over the unquantized cache: separates kernel gain from byte gain."""
    return decode_attention(q, k, v)


def sdpa(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, **_: object) -> torch.Tensor:
    """torch SDPA over the unquantized cache: what serving code calls today."""
    return sdpa_decode_attention(q, k, v)


def use_int8_cache(model) -> None:  # noqa: ANN001 - a microscope.api.Transformer
    """Model level: generation stores K/V as int8 and decodes with the fused Triton kernel."""
    model.cache_cls = ModelInt8Cache


def use_unfused_int8_cache(model) -> None:  # noqa: ANN001
    """Model level: the same int8 storage, dequantized each decode step for the model's own attention."""
    model.cache_cls = UnfusedInt8KVCache


@register("int8_kv_cache")
class Int8KVCache(Ablation):
    """One decode step (one query token per batch and head) over an int8 vs a bf16/fp16 KV cache.

    The cache is quantized in ``inputs()``, outside the timed call, as a serving engine does when a
    token is appended; each variant takes the tensors it needs (``**kwargs`` swallows the rest).
    The truth is float64 attention over the *unquantized* cache, so the int8 variant's error is the
    full accuracy cost of the change, judged against ``INT8_ERROR_BUDGET``.
    """

    variants = {
        "eager": baseline(eager, differentiable=False),
        "triton_int8": candidate(triton_int8, needs=("triton",), differentiable=False, params=INT8_PARAMS),
        "triton_fp": candidate(triton_fp, needs=("triton",), differentiable=False),
        "sdpa": peer(sdpa, differentiable=False),
    }
    #: Model level: only generation changes, so the int8 arms reuse the baseline's trained weights.
    arms = {
        "model_cache": Arm(Role.BASELINE, "the embedded model's KV cache in its compute dtype "
                                          "(bf16 under the gpu profile's autocast, fp32 on CPU)"),
        "int8_fused": Arm(description="int8 K/V with per-token scales; decode reads them in the Triton kernel",
                          patch=use_int8_cache, needs=("triton",), inference_only=True),
        "int8_unfused": Arm(description="int8 K/V with per-token scales, dequantized for eager attention each step",
                            patch=use_unfused_int8_cache, inference_only=True),
    }
    # 97 tokens: several splits under the interpreter and a partial last token block.
    cases = grid(batch=[1], heads=[2], tokens=[97], head_dim=[32], granularity=["token", "channel"],
                 dtype=["fp32", "fp16", "bf16"])
    # outputs are averages of V (~0.1-1): the element rule admits 2% of them beyond 0.02 + 5%
    tolerance = error_budget(INT8_ERROR_BUDGET, rtol=0.05, atol=0.02, max_mismatch=0.02)

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        b, h, t, d = case["batch"], case["heads"], case["tokens"], case["head_dim"]
        dtype, granularity = case.dtype, case["granularity"]
        q = randn((b, h, d), dtype, gen, device)
        k = randn((b, h, t, d), dtype, gen, device)
        v = randn((b, h, t, d), dtype, gen, device)
        k_q, k_scale = quantize_kv(k, granularity)
        v_q, v_scale = quantize_kv(v, granularity)
        return {"q": q, "k": k, "v": v, "k_q": k_q, "k_scale": k_scale, "v_q": v_q, "v_scale": v_scale,
                "granularity": granularity}

    def flops(self, case: Case, backward: bool = False) -> float:
        """q.k^T and p.v: 2 multiply-adds per cached element of K and of V."""
        return 4.0 * case["batch"] * case["heads"] * case["tokens"] * case["head_dim"]

    def bytes(self, case: Case, backward: bool = False) -> float:
        """The least any variant must move: the int8 cache with its fp32 scales read once, plus q and
        the output. The bf16 variants move ``cache_bytes(..., None)`` (~1.94x at D = 128), so their
        GB/s here reads as effective bandwidth at the int8 size; bench.py prints both."""
        b, h, t, d = case["batch"], case["heads"], case["tokens"], case["head_dim"]
        qo = 2 * b * h * d * case.dtype.itemsize
        return float(cache_bytes(b, h, t, d, case["granularity"]) + qo)

