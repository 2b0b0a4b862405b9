"""Magnitude sparsity: unstructured, 2:4 and block masks, and a Triton GEMM skipping zero tiles (see README.md)."""

from microscope_kernels.magnitude_sparsity.kernel import block_index, block_sparse_linear
from microscope_kernels.magnitude_sparsity.reference import mask_for, nonzero_blocks

__all__ = ["block_index", "block_sparse_linear", "mask_for", "nonzero_blocks"]
