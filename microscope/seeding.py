"""The one place that seeds random number generators and derives per-trial seeds.

Baseline and candidates of a case must see identical inputs, so a trial's seed depends only on the
run seed, the plugin, the case and the repetition index -- never on the variant or on how many trials
ran before it. Seeds are derived with SHA-256, so they are stable across processes and Python versions
(``hash()`` is salted per process and would not be).
"""

from __future__ import annotations

import hashlib
import random

import numpy as np
import torch


def derive_seed(base: int, *keys: object) -> int:
    """A 63-bit seed determined by ``base`` and the keys (e.g. plugin name, case id, seed index)."""
    text = "\x1f".join([str(int(base)), *map(str, keys)])
    return int.from_bytes(hashlib.sha256(text.encode()).digest()[:8], "little") & (2**63 - 1)


def seed_everything(seed: int) -> None:
    """Seed Python, NumPy and torch (CPU and every CUDA device) with one seed."""
    random.seed(seed)
    np.random.seed(seed % 2**32)
    torch.manual_seed(seed)  # also seeds all CUDA devices


def generator(seed: int) -> torch.Generator:
    """A CPU generator seeded with ``seed``; plugins draw from it (see ``microscope.api.randn``)."""
    gen = torch.Generator(device="cpu")
    gen.manual_seed(seed)
    return gen
