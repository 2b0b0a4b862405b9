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


def assert_eager_arm_matches(patch_kernel: Callable[[Any], None], patch_eager: Callable[[Any], None],
                             seed: int, context: int = 16, tokens: int = 20) -> None:
    """A model-level ``_eager`` arm is its kernel arm's function: the same weights patched each way give the
    same logits and the same parameter gradients of a next-token loss (fp32, kernel's rounding only)."""
    from microscope.workloads import ModelConfig, build_model

    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=context)
    ids = torch.randint(0, 256, (2, tokens + 1), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    results = []
    for patch in (patch_kernel, patch_eager):
        model = build_model(cfg, seed=seed % 1000, device=DEVICE)
        patch(model)
        logits = model(ids[:, :-1])
        torch.nn.functional.cross_entropy(logits.flatten(0, 1), ids[:, 1:].flatten()).backward()
        results.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    (kernel_logits, kernel_grads), (eager_logits, eager_grads) = results
    torch.testing.assert_close(eager_logits, kernel_logits, rtol=1e-4, atol=1e-4)
    assert kernel_grads.keys() == eager_grads.keys()
    for name, grad in kernel_grads.items():
        torch.testing.assert_close(eager_grads[name], grad, rtol=1e-3, atol=1e-5, msg=name)
