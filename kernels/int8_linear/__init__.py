"""Dynamic int8 Linear: per-token activation and per-channel weight scales, a Triton int8 GEMM (see README.md)."""

from microscope_kernels.int8_linear.kernel import int8_linear, quantize_rows
from microscope_kernels.int8_linear.reference import affine_linear, quantize_per_channel, quantize_per_token

__all__ = ["affine_linear", "int8_linear", "quantize_per_channel", "quantize_per_token", "quantize_rows"]
