"""Safe (max-subtracted) softmax in one Triton pass, forward and backward (see README.md)."""

from microscope_kernels.safe_softmax.kernel import safe_softmax
from microscope_kernels.safe_softmax.reference import naive_softmax, safe_softmax_reference, torch_softmax

__all__ = ["naive_softmax", "safe_softmax", "safe_softmax_reference", "torch_softmax"]
