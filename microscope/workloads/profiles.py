"""Named sizes of the embedded workload: ``tiny`` for CPUs and tests, ``gpu`` for a real GPU run.

A profile bundles the model shape, the training recipe, the corpus and the evaluation budget, so a
config can say ``workload: tiny`` and override single fields.
"""

from __future__ import annotations

from dataclasses import dataclass

from microscope.workloads.corpus import CorpusSpec
from microscope.workloads.model import ModelConfig
from microscope.workloads.train import TrainRecipe

__all__ = ["PROFILES", "Profile", "get_profile"]


@dataclass(frozen=True)
class Profile:
    """Model, recipe, corpus and evaluation budget (predicted tokens per split and length)."""

    name: str
    model: ModelConfig
    recipe: TrainRecipe
    corpus: CorpusSpec
    eval_tokens: int
    eval_batch_size: int


PROFILES: dict[str, Profile] = {
    # ~0.47M parameters: a few dozen steps in about a second on 2 CPU cores.
    "tiny": Profile(
        name="tiny",
        model=ModelConfig(n_layers=2, d_model=128, n_heads=4, context=128),
        recipe=TrainRecipe(steps=40, batch_size=8, lr=3e-3, warmup=4),
        corpus=CorpusSpec(kind="stdlib", max_bytes=4_000_000),
        eval_tokens=16 * 512,
        eval_batch_size=8,
    ),
    # GPT-2-small-sized body (~85M parameters: byte vocabulary, small embeddings), context 1024, bf16.
    "gpu": Profile(
        name="gpu",
        model=ModelConfig(n_layers=12, d_model=768, n_heads=12, context=1024),
        recipe=TrainRecipe(steps=2000, batch_size=16, lr=6e-4, warmup=100, precision="bf16"),
        corpus=CorpusSpec(kind="stdlib"),
        eval_tokens=64 * 4096,
        eval_batch_size=16,
    ),
}


def get_profile(name: str) -> Profile:
    """The profile called ``name``; an unknown name lists the known ones."""
    try:
        return PROFILES[name]
    except KeyError:
        raise KeyError(f"unknown workload profile {name!r}; known: {sorted(PROFILES)}") from None
