"""Fixtures of the instrument tests: the tiny stack of ``toy_stack`` and a seeded input."""

import pytest
import torch
from toy_stack import BATCH, D_MODEL, SEQ, TinyStack, make_model


@pytest.fixture
def model() -> TinyStack:
    return make_model()


@pytest.fixture
def x() -> torch.Tensor:
    return torch.randn(BATCH, SEQ, D_MODEL, generator=torch.Generator().manual_seed(1))
