"""The mixture-of-experts MLP (``microscope.api.use_moe``) on one process, and the ``ep`` strategy on 2 gloo
ranks against single-process training of the same MoE model on the global batch."""

import numpy as np
import pytest
import torch
from test_distributed import CFG, RECIPE, WORLD, Batches

from microscope.api import DISTRIBUTED_STRATEGIES, MoE, use_moe
from microscope.distributed import RankContext, ep, train_on_ranks
from microscope.workloads import build_model, train

EXPERTS, TOP_K = 4, 2


def build_moe() -> torch.nn.Module:
    return use_moe(build_model(CFG, 0), experts=EXPERTS, top_k=TOP_K)


def _is_expert(name: str) -> bool:
    return ".mlp.experts." in name


def test_moe_routes_each_token_to_top_k_experts_and_gradients_reach_them():
    model = build_moe()
    moe = model.blocks[0].mlp
    assert isinstance(moe, MoE) and len(moe.experts) == EXPERTS
    assert not torch.equal(moe.experts[0].up.weight, moe.experts[1].up.weight)  # upcycled with noise
    torch.testing.assert_close(build_moe().state_dict(), model.state_dict(), rtol=0, atol=0)  # deterministic
    x = torch.randn(3, 5, CFG.d_model, generator=torch.Generator().manual_seed(1))
    rows = [0] * EXPERTS
    for e, expert in enumerate(moe.experts):
        expert.register_forward_hook(lambda m, args, out, e=e: rows.__setitem__(e, rows[e] + args[0].shape[0]))
    out = moe(x)
    assert out.shape == x.shape
    gates, chosen = moe.route(x.reshape(-1, CFG.d_model))
    assert chosen.shape == (15, TOP_K) and all(len(set(r.tolist())) == TOP_K for r in chosen)
    assert sum(rows) == 15 * TOP_K  # every token runs on exactly top_k experts, no token dropped
    torch.testing.assert_close(gates.sum(-1), torch.ones(15))
    flat = x.reshape(-1, CFG.d_model)
    expected = torch.stack([sum(g * moe.experts[int(e)](t) for g, e in zip(gs, es))
                            for t, gs, es in zip(flat, gates, chosen)])
    torch.testing.assert_close(out.reshape(-1, CFG.d_model), expected, rtol=1e-5, atol=1e-6)
    (out.square().sum()).backward()
    assert moe.router.weight.grad.abs().sum() > 0
    for e, expert in enumerate(moe.experts):
        grad = expert.up.weight.grad
        assert grad is not None  # an expert with no tokens still has a (zero) gradient: DDP needs one every step
        assert (grad.abs().sum() > 0) == (e in chosen)


@pytest.fixture(scope="module")
def single():
    model = build_moe()
    return train(model, Batches(RECIPE.batch_size), RECIPE), model.state_dict()


def test_ep_matches_single_process_on_global_batch(single):
    assert DISTRIBUTED_STRATEGIES["ep"] is ep
    result = train_on_ranks(build_moe, build_moe().state_dict(), Batches(RECIPE.batch_size), RECIPE, ep, WORLD,
                            timeout_s=120)
    ref, ref_state = single
    np.testing.assert_allclose(result.train.loss, ref.loss, rtol=3e-5)
    np.testing.assert_allclose(result.train.grad_norm, ref.grad_norm, rtol=1e-4)  # experts of both ranks in it
    assert (ref.grad_norm > 1).any()  # clipping is active
    assert result.train.layer_names == ref.layer_names
    assert list(result.state_dict) == list(ref_state)  # reassembled under the original names, in order
    for key, value in ref_state.items():
        torch.testing.assert_close(result.state_dict[key], value, rtol=1e-4, atol=1e-4)
    named = dict(build_moe().named_parameters())
    expert_bytes = sum(p.numel() * 4 for n, p in named.items() if _is_expert(n))
    dense_bytes = sum(p.numel() * 4 for n, p in named.items() if not _is_expert(n))
    for s in result.ranks:
        assert s.param_bytes == s.grad_bytes == dense_bytes + expert_bytes // WORLD
    # per step, over both ranks: DDP's all-reduce of the non-expert gradients on each rank, and per MoE layer
    # the E expert counts (int64) from each rank plus four all-to-alls of the (tokens x top_k, d_model) fp32
    # rows (dispatch, combine and their two gradients): every rank's rows sum to the global batch's
    tokens = RECIPE.batch_size * 16
    a2a = CFG.n_layers * (4 * tokens * TOP_K * CFG.d_model * 4 + WORLD * EXPERTS * 8)
    for step in range(RECIPE.steps):
        assert sum(s.step_bytes[step] for s in result.ranks) == WORLD * dense_bytes + a2a
    assert all(s.bytes_sent > RECIPE.steps * dense_bytes for s in result.ranks)
    assert any(n.startswith("ep:") for n in result.notes)


def test_ep_needs_moe_layers_with_experts_divisible_by_world_size():
    with pytest.raises(ValueError, match="4 experts, not divisible by world_size=3"):
        ep(build_moe(), RankContext(0, 3, torch.device("cpu"), "gloo"))
    with pytest.raises(ValueError, match="no MoE layers"):
        ep(build_model(CFG, 0), RankContext(0, 2, torch.device("cpu"), "gloo"))
