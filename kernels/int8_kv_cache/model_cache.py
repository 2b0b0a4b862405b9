"""The int8 KV cache inside the embedded model: ``model.cache_cls`` for generation (the model level).

``Int8KVCache`` stores K and V as int8 with one fp32 scale per (batch, head, token), quantized as each
token is appended. Per token, not per channel: a per-channel scale spans every token, so it would move
(and the whole cache would need requantizing) each time a token with a larger value arrives; per-token
scales never change once written.

What each forward call sees:

* prefill (the prompt): attention over the prompt's own fresh K and V through the model's ``attn_fn``,
  as serving engines do; the int8 copies are what later tokens read.
* a decode step: the fused Triton kernel reads the int8 cache and its scales (``fused=True``), or the
  cache is dequantized and handed to ``attn_fn`` (``fused=False``: same numbers, unfused speed).
"""

from __future__ import annotations

from typing import Any

import torch
from microscope_kernels.int8_kv_cache.kernel import dequantize_kv, int8_decode_attention, quantize_kv

from microscope.api import KVCache

__all__ = ["Int8KVCache", "UnfusedInt8KVCache"]

_GRANULARITY = "token"


class Int8KVCache(KVCache):
    """int8 K/V plus per-token fp32 scales per layer, grown by doubling like ``KVCache``."""

    fused = True

    def __init__(self, n_layers: int, capacity: int = 0) -> None:
        super().__init__(n_layers, capacity)
        self._k_scale: list[torch.Tensor | None] = [None] * n_layers
        self._v_scale: list[torch.Tensor | None] = [None] * n_layers

    def _store(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> None:
        """Quantize the new ``k``, ``v`` (B, H, S_new, D) and write them after what ``layer`` holds."""
        kq, ks = quantize_kv(k, _GRANULARITY)
        vq, vs = quantize_kv(v, _GRANULARITY)
        old = self._len[layer]
        new = old + k.shape[-2]
        if self._k[layer] is None or self._k[layer].shape[-2] < new:  # type: ignore[union-attr]
            held = self._k[layer].shape[-2] if self._k[layer] is not None else 0  # type: ignore[union-attr]
            size = max(new, self.capacity, 2 * held)
            # scale buffers hold a multiple of 4 tokens: their head stride stays 16-byte aligned, so the
            # decode kernel's scale descriptor reads them in place instead of copying them every step
            size4 = -(-size // 4) * 4
            for bufs, fresh, length in ((self._k, kq, size), (self._v, vq, size), (self._k_scale, ks, size4),
                                        (self._v_scale, vs, size4)):
                grown = fresh.new_empty((*fresh.shape[:2], length, *fresh.shape[3:]))
                if bufs[layer] is not None:
                    grown[:, :, :old] = bufs[layer][:, :, :old]  # type: ignore[index]
                bufs[layer] = grown
        for bufs, fresh in ((self._k, kq), (self._v, vq), (self._k_scale, ks), (self._v_scale, vs)):
            bufs[layer][:, :, old:new] = fresh  # type: ignore[index]
        self._len[layer] = new

    def quantized(self, layer: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """(k_q, k_scale, v_q, v_scale) of ``layer``, views of the filled part: (B, H, T, D) and (B, H, T)."""
        n = self._len[layer]
        bufs = (self._k[layer], self._k_scale[layer], self._v[layer], self._v_scale[layer])
        if any(b is None for b in bufs):
            raise LookupError(f"layer {layer} has nothing cached yet")
        return tuple(b[:, :, :n] for b in bufs)  # type: ignore[index, return-value]

    def _dequantized(self, layer: int, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
        k_q, k_s, v_q, v_s = self.quantized(layer)
        return dequantize_kv(k_q, k_s, _GRANULARITY, dtype), dequantize_kv(v_q, v_s, _GRANULARITY, dtype)

    def append(self, layer: int, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Store ``k``, ``v`` quantized; return all of ``layer``'s K and V dequantized to ``k.dtype``."""
        self._store(layer, k, v)
        return self._dequantized(layer, k.dtype)

    def get(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """All cached K and V of ``layer``, dequantized to float32."""
        return self._dequantized(layer, torch.float32)

    def attend(self, layer: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, attn_fn: Any) -> torch.Tensor:
        prefill = self._len[layer] == 0
        self._store(layer, k, v)
        if prefill:
            return attn_fn(q, k, v, True)
        if q.shape[-2] != 1:
            raise ValueError(f"an int8 cache decodes one token per step, got {q.shape[-2]} queries")
        if not self.fused:
            k_all, v_all = self._dequantized(layer, q.dtype)
            return attn_fn(q, k_all, v_all, False)
        k_q, k_s, v_q, v_s = self.quantized(layer)
        # the model's softmax scale: EagerAttention.scale when set (None: 1/sqrt(D), the kernel's default)
        scale = getattr(attn_fn, "scale", None)
        o = int8_decode_attention(q[:, :, 0], k_q, k_s, v_q, v_s, _GRANULARITY, sm_scale=scale)
        return o.unsqueeze(2)

    def nbytes(self) -> int:
        """int8 data plus fp32 scales, including spare capacity (as ``KVCache.nbytes``)."""
        held = (*self._k, *self._v, *self._k_scale, *self._v_scale)
        return sum(t.numel() * t.element_size() for t in held if t is not None)


class UnfusedInt8KVCache(Int8KVCache):
    """The same int8 storage, but each decode step dequantizes the cache and calls the model's ``attn_fn``."""

    fused = False
