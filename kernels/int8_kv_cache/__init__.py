"""int8 KV cache: quantization, a fused split-K Triton decode kernel, memory accounting (see README.md)."""

from microscope_kernels.int8_kv_cache.kernel import (
    cache_bytes,
    decode_attention,
    dequantize_kv,
    int8_decode_attention,
    quantize_kv,
)
from microscope_kernels.int8_kv_cache.reference import eager_decode_attention, sdpa_decode_attention

__all__ = [
    "cache_bytes",
    "decode_attention",
    "dequantize_kv",
    "eager_decode_attention",
    "int8_decode_attention",
    "quantize_kv",
    "sdpa_decode_attention",
]
