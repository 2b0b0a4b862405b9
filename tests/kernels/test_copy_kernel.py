"""The Triton copy that graph-timed benches are quoted against must copy every byte exactly."""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.copy_kernel import BLOCK_BYTES, triton_copy

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


@pytest.mark.parametrize("nbytes", [1, 4 * 3 + 1, BLOCK_BYTES + 4, 3 * BLOCK_BYTES - 3], ids=str)
def test_copies_every_byte_in_bytes_or_words(nbytes, seed):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randint(0, 256, (nbytes,), generator=gen, dtype=torch.uint8).to(DEVICE)
    dst = torch.zeros_like(src)
    triton_copy(src, dst)
    assert torch.equal(dst, src), f"seed {seed}"


def test_copies_a_bf16_matrix_bitwise_into_a_byte_buffer(seed):
    gen = torch.Generator().manual_seed(seed)
    src = torch.randn(37, 301, generator=gen).to(torch.bfloat16).to(DEVICE)  # 22274 bytes: int32 words
    dst = torch.empty(src.numel() * 2, dtype=torch.uint8, device=DEVICE)
    triton_copy(src, dst)
    assert torch.equal(dst.view(torch.bfloat16).view(37, 301), src), f"seed {seed}"


def test_rejects_mismatched_or_strided_buffers():
    a = torch.zeros(10, 10, device=DEVICE)
    with pytest.raises(ValueError, match="400 bytes in src but 396 in dst"):
        triton_copy(a, torch.zeros(99, device=DEVICE))
    with pytest.raises(ValueError, match="contiguous"):
        triton_copy(a.t(), torch.zeros(10, 10, device=DEVICE))
