"""A broken patch must not look like a win: attention that ignores the causal mask.

Such a patch trains without error and its validation loss *drops* -- the model reads the token it is
asked to predict. The workload exposes it twice: ``future_leak`` flags it in one forward pass, and
after identical training (same init, same data order) the leaky model's next-token loss falls far
below the causal model's, which no genuine attention optimization can do.
"""

import torch

from microscope.workloads.attention import eager_attention
from microscope.workloads.batching import WindowSampler
from microscope.workloads.checks import future_leak, repeat_noise
from microscope.workloads.evaluate import evaluate
from microscope.workloads.model import ModelConfig, build_model
from microscope.workloads.train import TrainRecipe, train


def leaky_attention(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
    """The bug: the ``causal`` flag is dropped."""
    return eager_attention(q, k, v, causal=False)


def test_future_leak_probe_flags_the_broken_patch():
    model = build_model(ModelConfig(n_layers=2, d_model=64, n_heads=4), 0)
    assert future_leak(model) == 0.0
    model.set_attention(leaky_attention)
    assert future_leak(model) > 1e-3


class DriftingAttention:
    """Causal attention whose output drifts by a few float32 units on every call, as atomic split-K sums do."""

    def __init__(self, causal: bool = True) -> None:
        self.causal = causal
        self.gen = torch.Generator().manual_seed(7)

    def __call__(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        o = eager_attention(q, k, v, causal=causal and self.causal)
        return o * (1 + 4e-7 * torch.randn(o.shape, generator=self.gen))


def test_repeat_noise_is_zero_for_deterministic_models_and_measures_drift():
    model = build_model(ModelConfig(n_layers=2, d_model=64, n_heads=4), 0)
    assert repeat_noise(model) == 0.0
    model.set_attention(DriftingAttention())
    drift = repeat_noise(model)
    assert 0.0 < drift < 1e-4
    # a drifting but causal model changes its earlier logits by about its drift, not by a leak's amount
    assert 0.0 < future_leak(model) < 4 * drift


def test_a_drifting_model_that_leaks_is_still_flagged():
    model = build_model(ModelConfig(n_layers=2, d_model=64, n_heads=4), 0)
    model.set_attention(DriftingAttention(causal=False))
    assert future_leak(model) > 1000 * repeat_noise(model)


def test_leaky_attention_gives_an_implausibly_low_validation_loss(corpus):
    # Context 64 and 160 steps: the leak is learned reliably (loss ratio 0.21-0.30 over seeds 0-3).
    cfg = ModelConfig(n_layers=2, d_model=128, n_heads=4, context=64)
    recipe = TrainRecipe(steps=160, batch_size=8, lr=3e-3, warmup=4)
    losses = {}
    for name, attn in (("causal", None), ("leaky", leaky_attention)):
        model = build_model(cfg, seed=0)
        if attn is not None:
            model.set_attention(attn)
        train(model, WindowSampler(corpus.train, cfg.context, recipe.batch_size, seed=0), recipe)
        losses[name] = evaluate(model, corpus.val, cfg.context, max_tokens=4096).loss
    # Same init, same data, same steps: only the mask differs. A genuine change moves the loss by a
    # few percent; reading the answer cuts it by more than half.
    assert losses["leaky"] < 0.5 * losses["causal"], losses
