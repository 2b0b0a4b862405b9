"""SwiGLU keeping its saved inputs in 8 bits: eager reference and fused Triton kernels (see README.md)."""

from microscope_kernels.act_compression_8bit.kernel import Int8SwiGLU, int8_saved_swiglu
from microscope_kernels.act_compression_8bit.reference import eager_int8_swiglu, quantize_rows, swiglu

__all__ = ["Int8SwiGLU", "eager_int8_swiglu", "int8_saved_swiglu", "quantize_rows", "swiglu"]
