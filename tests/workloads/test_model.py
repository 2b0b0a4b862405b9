import copy

import pytest
import torch

from microscope.workloads.attention import EagerAttention, eager_attention
from microscope.workloads.checks import future_leak
from microscope.workloads.generate import generate_greedy
from microscope.workloads.kv_cache import KVCache
from microscope.workloads.model import ModelConfig, RMSNorm, build_model
from microscope.workloads.profiles import get_profile
from microscope.workloads.train import lm_loss


@pytest.mark.parametrize("norm", ["rmsnorm", "layernorm"])
@pytest.mark.parametrize("mlp", ["gelu", "swiglu"])
def test_forward_shapes(norm, mlp):
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=4, context=32, norm=norm, mlp=mlp)
    model = build_model(cfg, seed=0)
    x = torch.randint(0, 256, (3, 32))
    assert model(x).shape == (3, 32, cfg.vocab_size)
    assert model(x[:, :5]).shape == (3, 5, cfg.vocab_size)
    longer = torch.randint(0, 256, (1, 4 * 32))  # beyond the training context
    assert model(longer).shape == (1, 128, cfg.vocab_size)
    expected_norm = RMSNorm if norm == "rmsnorm" else torch.nn.LayerNorm
    assert isinstance(model.blocks[0].attn_norm, expected_norm)


def test_same_seed_same_weights_different_seed_different(tiny_cfg):
    a, b, c = build_model(tiny_cfg, 1), build_model(tiny_cfg, 1), build_model(tiny_cfg, 2)
    for pa, pb in zip(a.parameters(), b.parameters()):
        assert torch.equal(pa, pb)
    assert not torch.equal(a.embed.weight, c.embed.weight)


def test_causal_changing_future_tokens_leaves_earlier_logits(tiny_cfg):
    model = build_model(tiny_cfg, 0).eval()
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    x2 = x.clone()
    x2[:, 20] = (x2[:, 20] + 1) % 256
    with torch.no_grad():
        a, b = model(x), model(x2)
    assert torch.equal(a[:, :20], b[:, :20])
    assert not torch.allclose(a[:, 20:], b[:, 20:])
    assert future_leak(model) == 0.0


def test_kv_cache_decode_matches_full_forward(tiny_cfg):
    model = build_model(tiny_cfg, 0).eval()
    x = torch.randint(0, 256, (2, 24), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        full = model(x)
        logits, cache = model.prefill(x[:, :8])
        torch.testing.assert_close(logits, full[:, :8], rtol=1e-5, atol=1e-5)
        for t in range(8, 24):
            step = model.decode_step(x[:, t], cache)
            torch.testing.assert_close(step, full[:, t], rtol=1e-5, atol=1e-5)
    assert cache.seq_len == 24
    k, v = cache.get(1)
    assert k.shape == v.shape == (2, tiny_cfg.n_heads, 24, tiny_cfg.head_dim)
    assert cache.nbytes() >= 2 * tiny_cfg.n_layers * k.numel() * k.element_size()


def test_cache_class_is_replaceable(tiny_cfg):
    appended = []

    class CountingCache(KVCache):
        def append(self, layer, k, v):
            appended.append((layer, k.shape[-2]))
            return super().append(layer, k, v)

    model = build_model(tiny_cfg, 0).eval()
    model.cache_cls = CountingCache
    out = generate_greedy(model, torch.randint(0, 256, (1, 6)), new_tokens=3)
    assert out.shape == (1, 3)
    assert appended == [(0, 6), (1, 6), (0, 1), (1, 1), (0, 1), (1, 1)]


def test_greedy_generation_matches_argmax_of_full_forward(tiny_cfg):
    model = build_model(tiny_cfg, 3).eval()
    prompt = torch.randint(0, 256, (2, 10), generator=torch.Generator().manual_seed(2))
    out = generate_greedy(model, prompt, new_tokens=5)
    seq = prompt
    with torch.no_grad():
        for _ in range(5):
            seq = torch.cat([seq, model(seq)[:, -1].argmax(-1, keepdim=True)], dim=1)
    assert torch.equal(out, seq[:, 10:])


def test_attention_swap_point_and_scale(tiny_cfg):
    model = build_model(tiny_cfg, 0).eval()
    x = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        base = model(x)
        calls = []

        def sdpa(q, k, v, causal):
            calls.append((tuple(q.shape), causal))
            return torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)

        model.set_attention(sdpa)
        torch.testing.assert_close(model(x), base, rtol=1e-5, atol=1e-5)
        assert calls == [((1, tiny_cfg.n_heads, 16, tiny_cfg.head_dim), True)] * tiny_cfg.n_layers

        model.set_attention(EagerAttention)  # a class: one instance per block
        assert model.blocks[0].attn.attn_fn is not model.blocks[1].attn.attn_fn
        torch.testing.assert_close(model(x), base, rtol=0, atol=0)
        for block in model.blocks:
            block.attn.attn_fn.scale = 0.5 / tiny_cfg.head_dim**0.5
        assert not torch.allclose(model(x), base)


def test_norm_and_activation_swap_points(tiny_cfg):
    model = build_model(tiny_cfg, 0).eval()
    x = torch.randint(0, 256, (1, 16))
    with torch.no_grad():
        base = model(x)
        model.blocks[0].mlp.act = torch.relu
        relu = model(x)
        model.blocks[0].mlp_norm = torch.nn.Identity()
        no_norm = model(x)
    assert not torch.allclose(base, relu) and not torch.allclose(relu, no_norm)


def test_eager_attention_causal_mask_matches_sdpa():
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(2, 3, 9, 8, generator=gen) for _ in range(3))
    for causal in (False, True):
        ref = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        torch.testing.assert_close(eager_attention(q, k, v, causal), ref, rtol=1e-5, atol=1e-6)


def test_checkpointing_gives_identical_loss_and_gradients(tiny_cfg):
    plain = build_model(tiny_cfg, 0)
    ckpt = copy.deepcopy(plain)
    ckpt.set_checkpointing(1)
    assert all(b.checkpoint for b in ckpt.blocks)
    x = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(0))
    y = torch.randint(0, 256, (2, 32), generator=torch.Generator().manual_seed(1))
    loss_a = lm_loss(plain(x), y)
    loss_b = lm_loss(ckpt(x), y)
    loss_a.backward()
    loss_b.backward()
    assert torch.equal(loss_a, loss_b)
    for (name, pa), (_, pb) in zip(plain.named_parameters(), ckpt.named_parameters()):
        assert torch.equal(pa.grad, pb.grad), name


def test_checkpoint_every_k_layers():
    model = build_model(ModelConfig(n_layers=6, d_model=32, n_heads=2), 0)
    model.set_checkpointing(2)
    assert [b.checkpoint for b in model.blocks] == [True, False, True, False, True, False]
    model.set_checkpointing(0)
    assert not any(b.checkpoint for b in model.blocks)


def test_profiles_have_the_requested_shapes():
    tiny, gpu = get_profile("tiny").model, get_profile("gpu").model
    assert (tiny.n_layers, tiny.n_heads, tiny.context) == (2, 4, 128) and 64 <= tiny.d_model <= 128
    assert (gpu.n_layers, gpu.d_model, gpu.n_heads, gpu.context) == (12, 768, 12, 1024)
    with pytest.raises(KeyError, match="known"):
        get_profile("huge")
