"""The KV cache used for generation: K and V per layer, appended one step at a time.

It is an explicit small class so a plugin can replace it (``model.cache_cls = Int8KVCache``) and
measure what that does to decode speed, memory (``nbytes``) and accuracy. A replacement keeps the
same members: ``append``, ``get``, ``attend``, ``seq_len`` and ``nbytes``; ``append`` and ``get``
return K and V in the model's compute dtype, however they are stored. ``attend`` is what the
attention module calls: a cache that stores K and V in another form (int8, paged...) overrides it to
run its own kernel on what it stores instead of handing dequantized copies to ``attn_fn``.
"""

from __future__ import annotations

from typing import Any

import torch

__all__ = ["KVCache"]


class KVCache:
    """Per-layer K and V buffers of shape (B, H, capacity, D) that grow by doubling.

    Doubling keeps appends amortised O(1) without knowing the generation length up front; pass
    ``capacity`` when it is known to allocate once.
    """

    def __init__(self, n_layers: int, capacity: int = 0) -> None:
        self.n_layers = n_layers
        self.capacity = capacity
        self._k: list[torch.Tensor | None] = [None] * n_layers
        self._v: list[torch.Tensor | None] = [None] * n_layers
        self._len = [0] * n_layers

    @property
    def seq_len(self) -> int:
        """Tokens cached so far (layer 0; every layer holds the same count between forward calls)."""
        return self._len[0]

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store new ``k``, ``v`` (B, H, S_new, D) for ``layer``; return all cached K and V of that layer."""
        old = self._len[layer]
        new = old + k.shape[-2]
        buf_k, buf_v = self._k[layer], self._v[layer]
        if buf_k is None or buf_v is None or buf_k.shape[-2] < new:
            size = max(new, self.capacity, 2 * (buf_k.shape[-2] if buf_k is not None else 0))
            shape = (*k.shape[:-2], size, k.shape[-1])
            grown_k = k.new_empty(shape)
            grown_v = v.new_empty(shape)
            if buf_k is not None and buf_v is not None:
                grown_k[..., :old, :] = buf_k[..., :old, :]
                grown_v[..., :old, :] = buf_v[..., :old, :]
            self._k[layer], self._v[layer] = buf_k, buf_v = grown_k, grown_v
        buf_k[..., old:new, :] = k
        buf_v[..., old:new, :] = v
        self._len[layer] = new
        return buf_k[..., :new, :], buf_v[..., :new, :]

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_fn: Any) -> torch.Tensor:
        """Cache the new ``k``, ``v`` of ``layer`` and return ``q``'s attention over everything cached.

        q, k, v: (B, H, S_new, D); ``attn_fn`` is the block's attention (``workloads.attention``
        contract): causal for a prefill (queries as long as the keys), not for a one-token decode step.
        """
        k_all, v_all = self.append(layer, k, v)
        return attn_fn(q, k_all, v_all, k_all.shape[-2] == q.shape[-2])

    def get(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached K and V of ``layer`` (B, H, seq_len, D)."""
        k, v = self._k[layer], self._v[layer]
        if k is None or v is None:
            raise LookupError(f"layer {layer} has nothing cached yet")
        n = self._len[layer]
        return k[..., :n, :], v[..., :n, :]

    def nbytes(self) -> int:
        """Bytes the cache holds allocated (all layers, K and V, including spare capacity)."""
        return sum(t.numel() * t.element_size() for t in (*self._k, *self._v) if t is not None)
