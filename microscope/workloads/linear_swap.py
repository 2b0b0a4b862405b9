"""A base for Linear replacements that store their weight in another form (int8, packed 4-bit, sparse).

Model-level arms patch a freshly built model and then, for an inference-only arm, load the baseline's
trained float weights into it; a replacement therefore has to take the float ``weight``/``bias`` both
when it is built from an ``nn.Linear`` and when ``load_state_dict`` hands it the trained ones.
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

__all__ = ["ConvertedLinear"]


class ConvertedLinear(nn.Module):
    """An ``nn.Linear`` stand-in: ``convert(weight, bias)`` stores the weight its own way, ``compute(x)``
    applies it. Under autocast the input is cast to the autocast dtype first, as ``nn.Linear`` would be.

    The stored form is not part of ``state_dict`` (register it with ``persistent=False``); loading a
    state dict takes the float ``weight`` and optional ``bias`` keys of the Linear it replaced.
    """

    def __init__(self, linear: nn.Linear) -> None:
        super().__init__()
        self.in_features, self.out_features = linear.in_features, linear.out_features
        self.has_bias = linear.bias is not None
        with torch.no_grad():
            self.convert(linear.weight.detach(), None if linear.bias is None else linear.bias.detach())

    def convert(self, weight: torch.Tensor, bias: torch.Tensor | None) -> None:
        """Store ``weight`` (out_features, in_features) and ``bias`` in this module's own form."""
        raise NotImplementedError

    def compute(self, x: torch.Tensor) -> torch.Tensor:
        """``x @ W^T + b`` from the stored form; x is (..., in_features)."""
        raise NotImplementedError

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        kind = x.device.type
        if torch.is_autocast_enabled(kind) and x.is_floating_point():
            x = x.to(torch.get_autocast_dtype(kind))
        return self.compute(x)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, bias={self.has_bias}"

    def _load_from_state_dict(self, state_dict: dict[str, Any], prefix: str, local_metadata: dict[str, Any],
                              strict: bool, missing_keys: list[str], unexpected_keys: list[str],
                              error_msgs: list[str]) -> None:
        keys = {prefix + "weight"} | ({prefix + "bias"} if self.has_bias else set())
        missing_keys.extend(sorted(k for k in keys if k not in state_dict))
        unexpected_keys.extend(k for k in state_dict if k.startswith(prefix) and k not in keys
                               and "." not in k[len(prefix):])
        weight = state_dict.get(prefix + "weight")
        if weight is None:
            return
        if tuple(weight.shape) != (self.out_features, self.in_features):
            error_msgs.append(f"size mismatch for {prefix}weight: got {tuple(weight.shape)}, this "
                              f"{type(self).__name__} holds ({self.out_features}, {self.in_features})")
            return
        device = next((t.device for t in self.buffers()), weight.device)
        bias = state_dict.get(prefix + "bias") if self.has_bias else None
        with torch.no_grad():
            self.convert(weight.to(device), None if bias is None else bias.to(device))
