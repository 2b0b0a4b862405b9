"""2:4 sparse tensor cores through cuSPARSELt as torch ships it: what a 2:4 weight buys a user who writes
no kernel of their own.

The weight is compressed once, outside the call (``torch._cslt_compress``: the kept half of the values and
their positions in one plain tensor, so the harness can rotate input sets through it), and each call is
one ``torch._cslt_sparse_mm``, the op behind ``torch.sparse.to_sparse_semi_structured``'s ``F.linear``.
"""

from __future__ import annotations

import torch

from microscope.api import Case

#: cuSPARSELt's half-precision sparse operand: rows and columns multiples of 16.
SPARSE_MULTIPLE = 16
#: Its dense operand (x transposed): a column count (x's rows) that is a multiple of 8, x padded to it.
DENSE_MULTIPLE = 8


def unsupported(case: Case, device: str) -> str | None:
    """Why cuSPARSELt cannot run this case here, or None."""
    if device != "cuda":
        return "2:4 sparse tensor cores (cuSPARSELt) run on CUDA GPUs only"
    if case["pattern"] != "2:4":
        return f"sparse tensor cores run the 2:4 pattern only, not {case['pattern']}"
    if case.dtype not in (torch.float16, torch.bfloat16):
        return f"cuSPARSELt's 2:4 GEMM takes fp16 or bf16 here, not {case.dtype}"
    if case["n"] % SPARSE_MULTIPLE or case["k"] % SPARSE_MULTIPLE:
        return f"cuSPARSELt needs N and K multiples of {SPARSE_MULTIPLE} (N={case['n']}, K={case['k']})"
    backend = getattr(torch.backends, "cusparselt", None)
    if backend is None or not backend.is_available():
        return "this torch build has no cuSPARSELt"
    return None


def compress(weight: torch.Tensor) -> torch.Tensor:
    """The (N, K) 2:4 weight in cuSPARSELt's compressed form (values and metadata in one tensor)."""
    return torch._cslt_compress(weight.contiguous())


def two_four_linear(x: torch.Tensor, compressed: torch.Tensor, bias: torch.Tensor | None = None) -> torch.Tensor:
    """``x @ W^T + bias`` for the compressed 2:4 weight W; x (M, K), rows padded to a multiple of 8."""
    m = x.shape[0]
    pad = -m % DENSE_MULTIPLE
    dense = torch.nn.functional.pad(x, (0, 0, 0, pad)) if pad else x
    out = torch._cslt_sparse_mm(compressed, dense.t(), bias=bias, transpose_result=True)
    return out[:m] if pad else out
