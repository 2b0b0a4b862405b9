"""Tensor descriptors over the int8 cache and its per-token scales, shared by both split kernels.

Why descriptors: on Hopper a descriptor load is one TMA copy of a whole block into shared memory.
Pointer loads cost every thread an address, a mask and a copy instruction per 16 bytes, which in a
decode kernel that is already instruction-bound (Nsight Compute on the H200: 70% of issue slots
used) is time taken from the math. Tokens past the end of the cache read as zero.
"""

from __future__ import annotations

import torch
from triton.tools.tensor_descriptor import TensorDescriptor


def cache_descriptor(words: torch.Tensor, block_t: int) -> TensorDescriptor:
    """A (B, H, T, D/4) int32 view of an int8 cache, heads flat at stride(1), as a (B*H, T, D/4)
    descriptor with (1, block_t, D/4) blocks. TMA needs 16-byte aligned strides (D >= 16 gives them)
    and a 16-byte aligned start: a view that starts elsewhere in its buffer is copied first."""
    if words.data_ptr() % 16:
        words = words.clone()
    b, h, t, w = words.shape
    return TensorDescriptor(words, [b * h, t, w], [words.stride(1), words.stride(2), 1], [1, block_t, w])


def scale_descriptor(scale: torch.Tensor, block_t: int) -> tuple[TensorDescriptor, int]:
    """Per-token scales (B, H, T), heads flat at stride(1), as one flat 1-D descriptor with blocks of
    ``block_t`` scales; head ``bh``'s token ``t`` is element ``bh * stride(1) + t``. Scales past T in
    the same block belong to the next head or the padding: the kernels mask those tokens.

    A block must start 16-byte aligned, so the head stride must be a multiple of 4 scales and the
    first scale 16-byte aligned. A cache buffer allocated for a round context length, read from its
    first token, has both; otherwise (an odd length, or a window that starts past token 0) the scales
    are copied into a padded buffer (each copy reads and writes B*H*T*4 bytes, ~1.5% of the int8
    cache's bytes at D = 128). Returns the descriptor and the head stride to index it with."""
    if scale.stride(1) % 4 or scale.data_ptr() % 16:
        scale = torch.nn.functional.pad(scale, (0, -scale.shape[2] % 4))[..., :scale.shape[2]]
    b, h = scale.shape[:2]
    span = (b * h - 1) * scale.stride(1) + scale.shape[2]
    return TensorDescriptor(scale, [span], [1], [block_t]), scale.stride(1)


def fit_descriptor_blocks(nargs: dict) -> None:
    """Autotuner pre-hook: make a config's BLOCK_T the descriptors' block before it launches."""
    for name in ("K_DESC", "V_DESC"):
        nargs[name].block_shape = [1, nargs["BLOCK_T"], nargs["D"] // 4]
    for name in ("KS_DESC", "VS_DESC"):
        nargs[name].block_shape = [nargs["BLOCK_T"]]
