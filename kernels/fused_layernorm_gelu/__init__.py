"""Fused LayerNorm + GeLU: one Triton pass forward and backward (see README.md)."""

from microscope_kernels.fused_layernorm_gelu.kernel import layernorm_gelu
from microscope_kernels.fused_layernorm_gelu.reference import layernorm_gelu_eager

__all__ = ["layernorm_gelu", "layernorm_gelu_eager"]
