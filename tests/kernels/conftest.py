"""Shared fixtures of the kernel tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A fresh random seed per test (kernels must hold on any input), printed so a failure can be replayed."""
    value = int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: random seed {value}")
    return value
