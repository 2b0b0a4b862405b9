"""How the harness calls a variant: inputs with gradients, cotangents, forward and backward.

Shared by every dimension so that accuracy, timing and memory exercise exactly the same call.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

from microscope.api import Variant, randn


def as_tensors(out: Any) -> list[torch.Tensor]:
    """A variant returns a tensor or a tuple/list of tensors; normalize to a list."""
    if isinstance(out, torch.Tensor):
        return [out]
    if isinstance(out, (tuple, list)) and all(isinstance(t, torch.Tensor) for t in out):
        return list(out)
    raise TypeError(f"a variant must return a tensor or a tuple of tensors, got {type(out).__name__}")


def output_names(outputs: Sequence[torch.Tensor]) -> list[str]:
    return ["out"] if len(outputs) == 1 else [f"out{i}" for i in range(len(outputs))]


def fresh_inputs(
    inputs: Mapping[str, Any], grad_names: Sequence[str], dtype: torch.dtype | None = None
) -> dict[str, Any]:
    """Detached copies (optionally cast) of the inputs; ``grad_names`` get ``requires_grad``."""
    out: dict[str, Any] = {}
    for name, value in inputs.items():
        if isinstance(value, torch.Tensor):
            value = value.detach()
            if dtype is not None and value.is_floating_point():
                value = value.to(dtype)
            value = value.clone()
            if name in grad_names:
                value.requires_grad_(True)
        out[name] = value
    return out


def cotangents(outputs: Sequence[torch.Tensor], gen: torch.Generator) -> list[torch.Tensor]:
    """Seeded random output gradients in float32 on the outputs' device (cast per use), drawn like inputs
    (``api.randn``: on the GPU for benchmark sizes, where one CPU thread took seconds)."""
    return [randn(tuple(o.shape), torch.float32, gen, o.device) for o in outputs]


def make_call(
    variant: Variant,
    inputs: Mapping[str, Any],
    grad_names: Sequence[str],
    backward: bool,
    cots: Sequence[torch.Tensor] | None,
) -> Callable[[], Any]:
    """A thunk running one forward (and backward) call of ``variant`` on prepared inputs."""
    fn = variant.fn
    if not backward or not grad_names or not variant.differentiable:
        if any(isinstance(v, torch.Tensor) and v.requires_grad for v in inputs.values()):
            frozen = {k: (v.detach() if isinstance(v, torch.Tensor) else v) for k, v in inputs.items()}
        else:
            frozen = dict(inputs)

        def forward() -> Any:
            with torch.no_grad():
                return fn(**frozen)

        return forward
    leaves = [inputs[n] for n in grad_names]
    assert cots is not None

    def forward_backward() -> Any:
        for leaf in leaves:
            leaf.grad = None
        outs = as_tensors(fn(**inputs))
        torch.autograd.backward(outs, [c for c in cots])
        return outs

    return forward_backward
