from contextlib import contextmanager

import numpy as np
import pytest
import torch

from microscope.workloads.evaluate import evaluate, evaluate_suite
from microscope.workloads.memory import peak_memory_inference, peak_memory_train_step
from microscope.workloads.model import build_model
from microscope.workloads.throughput import decode_throughput, prefill_throughput
from microscope.workloads.train import TrainRecipe


def test_suite_evaluates_longer_than_trained_and_out_of_domain(corpus, tiny_cfg):
    model = build_model(tiny_cfg, 0)
    results = evaluate_suite(model, corpus, tiny_cfg.context, max_tokens=1000)
    assert list(results) == ["val@1x", "val@2x", "val@4x", "ood@1x"]
    for name, m in (("val@1x", 1), ("val@2x", 2), ("val@4x", 4), ("ood@1x", 1)):
        assert results[name].seq_len == m * tiny_cfg.context
    assert results["val@4x"].seq_len > results["val@2x"].seq_len > tiny_cfg.context
    # the same stretch of text (7 windows of 128 = 896 tokens) at every length
    assert {r.n_tokens for r in results.values()} == {896}
    assert results["val@4x"].n_windows == 7 and results["val@1x"].n_windows == 28


def test_per_token_losses_are_fixed_order_float32_and_consistent(corpus, tiny_cfg):
    model = build_model(tiny_cfg, 0)
    a = evaluate(model, corpus.val, 32, max_tokens=256, batch_size=3)
    b = evaluate(model, corpus.val, 32, max_tokens=256, batch_size=8)
    assert a.token_losses.dtype == np.float32 and a.token_losses.shape == (256,)
    np.testing.assert_allclose(a.token_losses, b.token_losses, rtol=1e-5)  # batching does not reorder
    assert a.loss == pytest.approx(float(a.token_losses.mean()), rel=1e-6)
    assert a.perplexity == pytest.approx(np.exp(a.loss))
    assert a.accuracy == pytest.approx(a.token_correct.mean())
    assert model.training  # evaluation restored the mode


def test_throughput_helpers_report_every_repetition(tiny_cfg):
    model = build_model(tiny_cfg, 0)
    prompt = torch.randint(0, 256, (2, 16))
    pre = prefill_throughput(model, prompt, repeats=3)
    dec = decode_throughput(model, prompt, new_tokens=4, repeats=2)
    assert pre.tokens == 32 and len(pre.seconds) == 3 and pre.tokens_per_s > 0
    assert dec.tokens == 8 and len(dec.samples) == 2 and dec.tokens_per_s > 0


def test_cpu_peak_memory_needs_a_probe_and_uses_it(corpus, tiny_cfg):
    model = build_model(tiny_cfg, 0)
    x = corpus.train[:65].long()
    batch = (x[:-1].view(2, 32), x[1:].view(2, 32))
    recipe = TrainRecipe(steps=2, batch_size=2)
    with pytest.raises(ValueError, match="probe"):
        peak_memory_train_step(model, batch, recipe)
    with pytest.raises(ValueError, match="probe"):
        peak_memory_inference(model, batch[0])

    entered = []

    class Reading:
        peak_bytes = -1

    @contextmanager
    def probe():
        reading = Reading()
        entered.append(reading)
        yield reading
        reading.peak_bytes = 12345  # stands in for the harness's real CPU measure

    assert peak_memory_train_step(model, batch, recipe, probe=probe) == 12345
    assert peak_memory_inference(model, batch[0], new_tokens=2, probe=probe) == 12345
    assert len(entered) == 2

    @contextmanager
    def silent():
        yield object()

    with pytest.raises(RuntimeError, match="peak_bytes"):
        peak_memory_inference(model, batch[0], probe=silent)
