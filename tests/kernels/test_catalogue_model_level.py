"""Model level of the catalogue kernels: the int8 KV cache in generation, the fused LayerNorm+GELU in the MLP.

Kernels run through the Triton interpreter on CPU (compiled, on a GPU host), so models stay tiny;
every comparison is against the model's own eager path on the same weights.
"""

from __future__ import annotations

import pytest
import torch
from microscope_kernels.fused_layernorm_gelu.ablation import FusedNormGelu, use_fused_norm_gelu
from microscope_kernels.int8_kv_cache.kernel import cache_bytes
from microscope_kernels.int8_kv_cache.model_cache import Int8KVCache, UnfusedInt8KVCache

from microscope.workloads import (
    EagerAttention,
    KVCache,
    ModelConfig,
    NormGelu,
    build_model,
    generate_greedy,
    score_through_cache,
)

SMALL = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32)
#: Where the Triton kernels can run: compiled on a GPU host, interpreted (with CPU tensors) elsewhere.
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tokens(seed: int, rows: int = 2, length: int = 24) -> torch.Tensor:
    return torch.randint(0, 256, (rows, length), generator=torch.Generator().manual_seed(seed)).to(DEVICE)


# -- int8 KV cache -----------------------------------------------------------------------------------


@pytest.mark.parametrize("cache_cls", [Int8KVCache, UnfusedInt8KVCache])
def test_int8_cache_decodes_close_to_the_models_own_cache(cache_cls, seed):
    model = build_model(SMALL, seed=seed % 1000, device=DEVICE)
    tokens = _tokens(seed)
    own = score_through_cache(model, tokens, 12)
    model.cache_cls = cache_cls
    quant = score_through_cache(model, tokens, 12)
    assert type(quant.cache) is cache_cls
    # the first scored token comes from the prefill, which attends over the fresh (unquantized) K/V
    rows, scored = tokens.shape[0], tokens.shape[1] - 12
    first = slice(None, None, scored)
    assert torch.equal(torch.from_numpy(quant.token_losses[first]), torch.from_numpy(own.token_losses[first]))
    # later tokens read int8 K/V: close (per-token scales, error <= half a step), not identical
    diff = abs(quant.token_losses - own.token_losses)
    assert 0 < diff.max() < 2e-2
    assert abs(quant.loss - own.loss) / own.loss < 1e-2
    assert quant.token_losses.size == rows * scored


def test_fused_and_unfused_int8_caches_give_the_same_logits(seed):
    model = build_model(SMALL, seed=seed % 1000, device=DEVICE)
    prompt = _tokens(seed, length=16)
    logits = {}
    for cls in (Int8KVCache, UnfusedInt8KVCache):
        model.cache_cls = cls
        _, cache = model.prefill(prompt)
        logits[cls] = torch.stack([model.decode_step(prompt[:, i], cache) for i in range(4)])
    torch.testing.assert_close(logits[Int8KVCache], logits[UnfusedInt8KVCache], rtol=1e-4, atol=1e-4)


def test_int8_cache_honours_the_models_attention_scale(seed):
    model = build_model(SMALL, seed=seed % 1000, device=DEVICE)
    model.set_attention(EagerAttention(scale=0.05))
    prompt = _tokens(seed, length=12)
    outs = {}
    for cls in (Int8KVCache, UnfusedInt8KVCache):
        model.cache_cls = cls
        outs[cls] = generate_greedy(model, prompt, 3), score_through_cache(model, prompt, 6).token_losses
    assert torch.equal(outs[Int8KVCache][0], outs[UnfusedInt8KVCache][0])
    assert abs(outs[Int8KVCache][1] - outs[UnfusedInt8KVCache][1]).max() < 1e-4


def test_int8_cache_holds_int8_data_and_per_token_scales_and_counts_them():
    model = build_model(SMALL)
    model.cache_cls = Int8KVCache
    _, cache = model.prefill(_tokens(0, rows=3, length=10))
    k_q, k_scale, v_q, v_scale = cache.quantized(0)
    assert k_q.dtype == v_q.dtype == torch.int8 and k_q.shape == (3, 2, 10, 32)
    assert k_scale.dtype == torch.float32 and k_scale.shape == (3, 2, 10)
    # 10 tokens cached in data buffers of exactly 10 and scale buffers of 12 (a multiple of 4, for the
    # kernel's aligned reads): cache_bytes' formula plus 2 spare fp32 scales per (row, head) for K and V
    spare_scales = 2 * 3 * 2 * (12 - 10) * 4
    assert cache.nbytes() == SMALL.n_layers * (cache_bytes(3, 2, 10, 32, "token") + spare_scales)
    own = KVCache(SMALL.n_layers)
    own.append(0, torch.zeros(3, 2, 10, 32), torch.zeros(3, 2, 10, 32))
    k_deq, _ = cache.get(0)
    assert k_deq.shape == own.get(0)[0].shape and k_deq.dtype == torch.float32


def test_int8_cache_refuses_a_multi_token_step_after_the_prompt():
    cache = Int8KVCache(1)
    x = torch.randn(1, 2, 4, 32)
    cache.attend(0, x, x, x, EagerAttention())
    with pytest.raises(ValueError, match="one token per step"):
        cache.attend(0, x, x, x, EagerAttention())


# -- fused LayerNorm + GELU in the MLP ------------------------------------------------------------------

GELU_NORM = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32, mlp="gelu", mlp_norm=True)


def test_mlp_norm_needs_a_gelu_mlp():
    with pytest.raises(ValueError, match="mlp_norm"):
        ModelConfig(mlp="swiglu", mlp_norm=True)


def test_fused_norm_gelu_takes_over_the_same_parameters():
    model = build_model(GELU_NORM, seed=3)
    before = dict(model.named_parameters())
    use_fused_norm_gelu(model)
    after = dict(model.named_parameters())
    assert list(before) == list(after)
    assert all(before[name] is after[name] for name in before)
    assert all(isinstance(block.mlp.act, FusedNormGelu) for block in model.blocks)


def test_fused_norm_gelu_model_matches_the_eager_model_forward_and_backward(seed):
    eager, fused = (build_model(GELU_NORM, seed=seed % 1000, device=DEVICE) for _ in range(2))
    with torch.no_grad():  # non-trivial norm parameters, the same in both models
        gen = torch.Generator().manual_seed(seed)
        for a, b in zip(eager.blocks, fused.blocks, strict=True):
            assert isinstance(a.mlp.act, NormGelu)
            a.mlp.act.weight.copy_(1 + 0.2 * torch.randn(a.mlp.act.weight.shape, generator=gen).to(DEVICE))
            a.mlp.act.bias.copy_(0.2 * torch.randn(a.mlp.act.bias.shape, generator=gen).to(DEVICE))
            b.mlp.act.load_state_dict(a.mlp.act.state_dict())
    use_fused_norm_gelu(fused)
    tokens = _tokens(seed, length=21)  # 42 rows of 256 hidden units: a partial row block
    outs = []
    for model in (eager, fused):
        logits = model(tokens)
        logits.float().square().mean().backward()
        outs.append((logits.detach(), {n: p.grad for n, p in model.named_parameters()}))
    torch.testing.assert_close(outs[1][0], outs[0][0], rtol=1e-4, atol=1e-5)
    for name, grad in outs[0][1].items():
        torch.testing.assert_close(outs[1][1][name], grad, rtol=1e-3, atol=1e-6, msg=name)


def test_fusing_a_model_without_the_pair_says_how_to_get_it():
    with pytest.raises(ValueError, match="mlp_norm: true"):
        use_fused_norm_gelu(build_model(SMALL))


@pytest.mark.gpu
def test_int8_cache_on_the_gpu_matches_its_unfused_form_under_bf16_autocast(seed):
    """The compiled kernel (inline-PTX unpacking, autotuned blocks) inside the model, in bf16."""
    model = build_model(SMALL, seed=seed % 1000, device="cuda")
    tokens = _tokens(seed, rows=4, length=300).cuda()  # several token blocks and splits
    losses = {}
    with torch.autocast("cuda", dtype=torch.bfloat16):
        own = score_through_cache(model, tokens, 150)
        for cls in (Int8KVCache, UnfusedInt8KVCache):
            model.cache_cls = cls
            losses[cls] = score_through_cache(model, tokens, 150).token_losses
    assert abs(losses[Int8KVCache] - losses[UnfusedInt8KVCache]).max() < 2e-2
    assert abs(losses[Int8KVCache].mean() - own.loss) / own.loss < 1e-2


@pytest.mark.gpu
def test_fused_norm_gelu_trains_like_the_eager_pair_on_the_gpu(seed):
    eager = build_model(GELU_NORM, seed=seed % 1000, device="cuda")
    fused = build_model(GELU_NORM, seed=seed % 1000, device="cuda")
    use_fused_norm_gelu(fused)
    tokens = _tokens(seed, rows=4, length=32).cuda()
    grads = []
    for model in (eager, fused):
        with torch.autocast("cuda", dtype=torch.bfloat16):
            loss = model(tokens).float().logsumexp(-1).mean()
        loss.backward()
        grads.append(torch.cat([p.grad.flatten() for p in model.parameters()]))
    assert torch.allclose(grads[1], grads[0], rtol=5e-2, atol=1e-4)
