"""What a user would pick instead of the Triton kernel, behind the same signature as ``flash_attention``.

Each peer is a function ``(q, k, v, causal=False, sm_scale=None) -> Tensor`` plus a ``supports`` check that
returns the reason a backend cannot run a case (``None`` when it can), so that a benchmark reports "n/a:
reason" instead of silently timing a different computation.

Causal alignment: every peer computes FlashAttention-2's bottom-right causal mask (query i sees keys
``j <= i + Sk - Sq``). SDPA's ``is_causal=True`` is top-left aligned, which is the same thing only when
Sq == Sk, so the SDPA peers pass ``torch.nn.attention.bias.causal_lower_right`` instead: PyTorch routes it to
the flash kernel's own bottom-right mode, to the memory-efficient kernel's lower-right mask, or to an
explicit boolean mask for the math backend. The cuDNN backend has no such route, so it reports Sq != Sk
causal as unsupported.
"""

from __future__ import annotations

import functools
import warnings
from collections.abc import Callable
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch.nn.attention import SDPBackend, sdpa_kernel

__all__ = [
    "PEERS",
    "Peer",
    "flex_attention_compiled",
    "sdpa_cudnn",
    "sdpa_efficient",
    "sdpa_flash",
    "sdpa_math",
]

Shape = tuple[int, ...]
_HALF = (torch.float16, torch.bfloat16)


def _sdpa(backend: SDPBackend, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
          sm_scale: float | None) -> torch.Tensor:
    # imported on first use: it imports torch.compile's stack (seconds), which planning a run does not need
    from torch.nn.attention.bias import causal_lower_right

    with warnings.catch_warnings():
        # "will produce NaNs when seq_len_q > seq_len_kv" holds for the fused backends only, and their
        # ``supports`` already reports that case; the math backend returns zeros there.
        warnings.filterwarnings("ignore", message="Lower right causal bias", category=UserWarning)
        mask = causal_lower_right(q.shape[-2], k.shape[-2]) if causal else None
    with sdpa_kernel(backend):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask, scale=sm_scale)


def sdpa_math(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
              sm_scale: float | None = None) -> torch.Tensor:
    """SDPA restricted to its math backend (unfused matmul-softmax-matmul, runs anywhere)."""
    return _sdpa(SDPBackend.MATH, q, k, v, causal, sm_scale)


def sdpa_flash(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               sm_scale: float | None = None) -> torch.Tensor:
    """SDPA restricted to its FlashAttention-2 backend."""
    return _sdpa(SDPBackend.FLASH_ATTENTION, q, k, v, causal, sm_scale)


def sdpa_efficient(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                   sm_scale: float | None = None) -> torch.Tensor:
    """SDPA restricted to its memory-efficient (xFormers/CUTLASS) backend."""
    return _sdpa(SDPBackend.EFFICIENT_ATTENTION, q, k, v, causal, sm_scale)


def sdpa_cudnn(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
               sm_scale: float | None = None) -> torch.Tensor:
    """SDPA restricted to its cuDNN backend (fastest on Hopper); causal only for Sq == Sk."""
    if causal and q.shape[-2] != k.shape[-2]:
        raise ValueError("sdpa_cudnn: bottom-right causal with Sq != Sk has no cuDNN route in SDPA")
    with sdpa_kernel(SDPBackend.CUDNN_ATTENTION):
        return F.scaled_dot_product_attention(q, k, v, is_causal=causal, scale=sm_scale)


@functools.cache
def _compiled_flex() -> Callable:
    from torch.nn.attention.flex_attention import flex_attention

    # dynamic=False: a new sequence length recompiles for its static shape, which the precompile step has
    # put in inductor's caches; automatic dynamic shapes would instead compile a fresh dynamic-shape graph
    # (5 s on an H200) on the second length the worker meets.
    return torch.compile(flex_attention, dynamic=False)


@functools.lru_cache(maxsize=64)
def _causal_block_mask(sq: int, sk: int, device: str):
    """flex_attention's block-sparse description of the bottom-right causal mask, built once per shape."""
    from torch.nn.attention.flex_attention import create_block_mask

    offset = sk - sq

    def bottom_right(b, h, q_idx, kv_idx):
        return kv_idx <= q_idx + offset

    return create_block_mask(bottom_right, B=None, H=None, Q_LEN=sq, KV_LEN=sk, device=device)


def flex_attention_compiled(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool = False,
                            sm_scale: float | None = None) -> torch.Tensor:
    """``torch.compile``d flex_attention (Inductor generates a Triton kernel), causal through a block mask.

    Each new shape or dtype recompiles (static shapes); the recompile limit is raised for the call so that a
    sweep over a dozen shapes does not fall back to the unfused eager path halfway through.
    """
    block_mask = _causal_block_mask(q.shape[-2], k.shape[-2], str(q.device)) if causal else None
    with torch._dynamo.config.patch(cache_size_limit=256):
        return _compiled_flex()(q, k, v, block_mask=block_mask, scale=sm_scale)


def _needs_cuda(device: torch.device | str) -> str | None:
    if torch.device(device).type != "cuda" or not torch.cuda.is_available():
        return "needs a CUDA device"
    return None


def _sm80(device: torch.device | str) -> str | None:
    reason = _needs_cuda(device)
    if reason is None and torch.cuda.get_device_capability(torch.device(device)) < (8, 0):
        return "needs compute capability 8.0 or newer"
    return reason


def _no_empty_rows(q_shape: Shape, k_shape: Shape, causal: bool) -> str | None:
    if causal and q_shape[-2] > k_shape[-2]:
        return "queries that see no key (causal, Sq > Sk) come out NaN on this backend (PyTorch warns)"
    return None


def _supports_math(q_shape: Shape, k_shape: Shape, dtype: torch.dtype, device: torch.device | str,
                   causal: bool) -> str | None:
    return None


def _supports_flash(q_shape: Shape, k_shape: Shape, dtype: torch.dtype, device: torch.device | str,
                    causal: bool) -> str | None:
    if dtype not in _HALF:
        return "FlashAttention-2 backend needs fp16 or bf16"
    if q_shape[-1] > 256 or q_shape[-1] % 8:
        return "FlashAttention-2 backend needs head dim <= 256 and a multiple of 8"
    return _no_empty_rows(q_shape, k_shape, causal) or _sm80(device)


def _supports_efficient(q_shape: Shape, k_shape: Shape, dtype: torch.dtype, device: torch.device | str,
                        causal: bool) -> str | None:
    if dtype not in (torch.float32, *_HALF):
        return "memory-efficient backend needs fp32, fp16 or bf16"
    return _no_empty_rows(q_shape, k_shape, causal) or _needs_cuda(device)


def _supports_cudnn(q_shape: Shape, k_shape: Shape, dtype: torch.dtype, device: torch.device | str,
                    causal: bool) -> str | None:
    if dtype not in _HALF:
        return "cuDNN backend needs fp16 or bf16"
    if causal and q_shape[-2] != k_shape[-2]:
        return "SDPA's cuDNN causal mask is top-left aligned; bottom-right with Sq != Sk is not expressible"
    if q_shape[-1] > 128 or q_shape[-1] % 8:
        return "cuDNN backend needs head dim <= 128 and a multiple of 8"
    return _sm80(device)


def _supports_flex(q_shape: Shape, k_shape: Shape, dtype: torch.dtype, device: torch.device | str,
                   causal: bool) -> str | None:
    head_dim = q_shape[-1]
    if dtype not in (torch.float32, *_HALF):
        return "flex_attention needs fp32, fp16 or bf16"
    if head_dim < 16 or head_dim & (head_dim - 1):
        return "flex_attention needs a power-of-two head dim >= 16"
    return _needs_cuda(device)


@dataclass(frozen=True)
class Peer:
    """A peer implementation and the check that says when it cannot run a case."""

    name: str
    fn: Callable[..., torch.Tensor]
    supports: Callable[[Shape, Shape, torch.dtype, torch.device | str, bool], str | None]


#: The peers by short name, in the order a report lists them.
PEERS: dict[str, Peer] = {
    peer.name: peer
    for peer in (
        Peer("sdpa_flash", sdpa_flash, _supports_flash),
        Peer("sdpa_cudnn", sdpa_cudnn, _supports_cudnn),
        Peer("sdpa_efficient", sdpa_efficient, _supports_efficient),
        Peer("flex", flex_attention_compiled, _supports_flex),
        Peer("sdpa_math", sdpa_math, _supports_math),
    )
}
