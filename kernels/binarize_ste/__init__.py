"""1-bit weights with the straight-through estimator: eager reference and a packed-bit Triton GEMM (see README.md)."""

from microscope_kernels.binarize_ste.kernel import binary_linear_packed, binary_linear_triton
from microscope_kernels.binarize_ste.reference import SignSTE, binarize, binary_linear, pack_signs, unpack_signs

__all__ = ["SignSTE", "binarize", "binary_linear", "binary_linear_packed", "binary_linear_triton", "pack_signs",
           "unpack_signs"]
