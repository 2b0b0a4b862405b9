"""The CUDA paths: autocast training, the allocator's peak-memory counter, cached decoding on a GPU."""

import dataclasses

import numpy as np
import pytest
import torch

from microscope.workloads.batching import WindowSampler
from microscope.workloads.evaluate import evaluate_suite
from microscope.workloads.memory import peak_memory_inference, peak_memory_train_step
from microscope.workloads.model import build_model
from microscope.workloads.profiles import get_profile
from microscope.workloads.throughput import decode_throughput, prefill_throughput
from microscope.workloads.train import TrainRecipe, train

pytestmark = pytest.mark.gpu


def test_same_init_on_cpu_and_gpu(tiny_cfg):
    cpu, gpu = build_model(tiny_cfg, 5), build_model(tiny_cfg, 5, "cuda")
    for a, b in zip(cpu.parameters(), gpu.parameters()):
        assert torch.equal(a, b.cpu())


@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_gpu_profile_trains_and_measures(corpus, precision):
    profile = get_profile("gpu")
    cfg = profile.model
    # The profile's long warm-up matters for a 12-layer model; a short run warms up over all its steps.
    recipe = dataclasses.replace(profile.recipe, steps=10, batch_size=4, warmup=10, precision=precision)
    model = build_model(cfg, 0, "cuda")
    result = train(model, WindowSampler(corpus.train, cfg.context, recipe.batch_size, 0), recipe)
    assert np.isfinite(result.loss).all() and result.loss[-3:].mean() < result.loss[0] - 0.5
    assert (result.nan_count == 0).all() or precision == "fp16"
    assert result.tokens_per_s(skip=2) > 0
    if precision == "fp16":
        assert (result.loss_scale > 0).all()
    evals = evaluate_suite(model, corpus, cfg.context, max_tokens=4 * cfg.context, precision=precision)
    assert evals["val@4x"].seq_len == 4 * cfg.context
    print(precision, "tokens/s", result.tokens_per_s(skip=2), {k: round(v.loss, 3) for k, v in evals.items()})


def test_cuda_peak_memory_and_throughput(corpus):
    cfg = get_profile("gpu").model
    recipe = TrainRecipe(steps=3, batch_size=4, precision="bf16")
    batch = WindowSampler(corpus.train, cfg.context, 4, 0)(0)
    plain = peak_memory_train_step(build_model(cfg, 0, "cuda"), batch, recipe)
    ckpt_recipe = dataclasses.replace(recipe, checkpoint_every=1)
    ckpt = peak_memory_train_step(build_model(cfg, 0, "cuda"), batch, ckpt_recipe)
    assert 0 < ckpt < plain  # recomputation must save activation memory
    model = build_model(cfg, 0, "cuda").to(torch.bfloat16)
    prompt = batch[0].cuda()
    infer = peak_memory_inference(model, prompt, new_tokens=16)
    pre = prefill_throughput(model, prompt)
    dec = decode_throughput(model, prompt, new_tokens=32)
    assert infer > 0 and pre.tokens_per_s > dec.tokens_per_s > 0
    print("peak train", plain, "ckpt", ckpt, "infer", infer)
    print("prefill tok/s", pre.tokens_per_s, "decode tok/s", dec.tokens_per_s)


def test_kv_cache_decode_matches_full_forward_on_gpu(tiny_cfg):
    model = build_model(tiny_cfg, 0, "cuda").eval()
    x = torch.randint(0, 256, (2, 24), device="cuda")
    with torch.no_grad():
        full = model(x)
        _, cache = model.prefill(x[:, :8])
        for t in range(8, 24):
            torch.testing.assert_close(model.decode_step(x[:, t], cache), full[:, t], rtol=1e-4, atol=1e-4)
