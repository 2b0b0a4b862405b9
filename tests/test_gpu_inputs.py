"""Seeded inputs on a GPU: benchmark-sized tensors are drawn on the device, reproducibly.

Skipped where no GPU is present (CI); the CPU path is covered wherever plugins make inputs.
"""

from __future__ import annotations

import pytest
import torch

from microscope.api import DEVICE_DRAW_ELEMENTS, randn

pytestmark = pytest.mark.gpu


def test_a_large_gpu_input_is_drawn_on_the_gpu_from_the_seed_and_a_small_one_matches_the_cpu():
    shape = (DEVICE_DRAW_ELEMENTS // 1024 + 1, 1024)
    a = randn(shape, torch.bfloat16, torch.Generator().manual_seed(7), "cuda")
    b = randn(shape, torch.bfloat16, torch.Generator().manual_seed(7), "cuda")
    c = randn(shape, torch.bfloat16, torch.Generator().manual_seed(8), "cuda")
    assert a.is_cuda and a.dtype == torch.bfloat16 and a.shape == shape
    assert torch.equal(a, b) and not torch.equal(a, c)
    assert abs(float(a.float().mean())) < 1e-3 and abs(float(a.float().std()) - 1) < 1e-2
    small = randn((33, 7), torch.float32, torch.Generator().manual_seed(7), "cuda")
    assert torch.equal(small.cpu(), randn((33, 7), torch.float32, torch.Generator().manual_seed(7), "cpu"))
