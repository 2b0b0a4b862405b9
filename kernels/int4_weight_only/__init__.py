"""Group-wise 4-bit weight-only Linear: round-to-nearest quantizer and a Triton GEMM (see README.md)."""

from microscope_kernels.int4_weight_only.kernel import int4_linear
from microscope_kernels.int4_weight_only.reference import Int4Weight, dequantize, quantize_int4

__all__ = ["Int4Weight", "dequantize", "int4_linear", "quantize_int4"]
