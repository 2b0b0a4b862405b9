"""What the attention rooms' kernel tests share: devices, dtypes, error floors, the relative error and one
forward+backward call with fresh leaves."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPES = {"fp32": torch.float32, "fp16": torch.float16, "bf16": torch.bfloat16}
#: The smallest relative error a dtype's rounding allows (a kernel is judged against max(floor, 4x eager's)).
FLOOR = {torch.float32: 1e-6, torch.float16: 5e-4, torch.bfloat16: 4e-3}
REF_FACTOR = 4.0


def rel_err(x: torch.Tensor, ref: torch.Tensor) -> float:
    """||x - ref|| / ||ref|| in float64."""
    return ((x.double() - ref).norm() / ref.norm().clamp_min(1e-30)).item()


def error_limit(eager: torch.Tensor, ref: torch.Tensor, dtype: torch.dtype) -> tuple[float, float]:
    """(eager's relative error, the kernel's limit: 4x that plus the dtype's floor).

    Where eager overflowed in the low dtype (fp16 sums past 65504), its error says nothing; the error of
    merely storing the float64 result in ``dtype`` stands in for it.
    """
    base = rel_err(eager, ref)
    if not base < float("inf"):
        base = rel_err(ref.to(dtype), ref)
    return base, REF_FACTOR * base + FLOOR[dtype]


def fwd_bwd(fn: Callable[..., torch.Tensor], tensors: list[torch.Tensor], do: torch.Tensor,
            kwargs: dict[str, Any] | None = None, **kw: Any) -> list[torch.Tensor]:
    """[output, grads of ``tensors``] of one call of ``fn`` on fresh leaves, with output gradient ``do``."""
    leaves = [t.detach().clone().requires_grad_() for t in tensors]
    out = fn(*leaves, **(kwargs or {}), **kw)
    out.backward(do)
    return [out.detach()] + [t.grad for t in leaves]
