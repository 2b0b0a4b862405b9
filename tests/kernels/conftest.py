"""Shared fixtures of the kernel tests."""

from __future__ import annotations

import os

import pytest


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A fresh random seed per test (kernels must hold on any input), printed so a failure can be replayed
    with ``MICROSCOPE_TEST_SEED=<seed> pytest <test id>``."""
    chosen = os.environ.get("MICROSCOPE_TEST_SEED", "").strip()
    value = int(chosen) if chosen.isdigit() else int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: random seed {value}")
    return value
