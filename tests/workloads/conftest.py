"""Shared fixtures: a capped standard-library corpus, the tiny model shape, one intra-op thread."""

import pytest
import torch

from microscope.workloads.corpus import CorpusSpec, load_corpus
from microscope.workloads.model import ModelConfig

SMALL_CORPUS = CorpusSpec(kind="stdlib", max_bytes=1_000_000)


@pytest.fixture(autouse=True)
def _one_cpu_thread():
    """Run each test here with one intra-op thread, then restore the setting.

    The test models' matrices are too small to gain from threads, and on a busy 2-core runner
    OpenMP's spin-waiting made two threads about 9x slower than one (80 steps: 22.8 s vs 2.5 s).
    """
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="session")
def small_spec() -> CorpusSpec:
    return SMALL_CORPUS


@pytest.fixture(scope="session")
def corpus():
    return load_corpus(SMALL_CORPUS)


@pytest.fixture
def tiny_cfg() -> ModelConfig:
    return ModelConfig(n_layers=2, d_model=64, n_heads=4, context=32)
