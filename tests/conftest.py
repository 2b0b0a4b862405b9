"""Test-wide set-up: Triton through its CPU interpreter where no GPU is present, and the gpu marker."""

import os

import torch

# Must happen before any @triton.jit runs (i.e. before kernel modules are imported).
if not torch.cuda.is_available():
    os.environ.setdefault("TRITON_INTERPRET", "1")

import pytest  # noqa: E402


def pytest_collection_modifyitems(config, items):
    if torch.cuda.is_available():
        return
    skip = pytest.mark.skip(reason="needs a CUDA GPU (none present); run with the gpu tox env on a GPU host")
    for item in items:
        if "gpu" in item.keywords:
            item.add_marker(skip)
