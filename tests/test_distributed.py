"""microscope.distributed on CPU with gloo: 2 spawned ranks training the embedded tiny model."""

import functools
import multiprocessing
import os
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from microscope.distributed import (
    DistributedResult,
    RankContext,
    ddp,
    ddp_powersgd,
    ddp_sign,
    powersgd_claimed_reduction,
    pp,
    takes_own_step,
    takes_whole_batch,
    tp,
    train_on_ranks,
    zero2,
    zero3,
)
from microscope.distributed.sign import pack_signs, unpack_signs
from microscope.distributed.strategies import POWERSGD_START_ITER
from microscope.workloads import ModelConfig, TrainRecipe, build_model, train
from microscope.workloads.model import Transformer

CFG = ModelConfig(n_layers=2, d_model=32, n_heads=2, context=16)
RECIPE = TrainRecipe(steps=4, batch_size=4, warmup=1)
WORLD = 2
build = functools.partial(build_model, CFG, 0)


class Batches:
    """Seeded random token windows: the same global batch for step i in every process."""

    def __init__(self, rows: int, seq: int = 16) -> None:
        self.rows, self.seq = rows, seq

    def __call__(self, step: int) -> tuple[torch.Tensor, torch.Tensor]:
        t = torch.randint(0, 256, (self.rows, self.seq + 1), generator=torch.Generator().manual_seed(step))
        return t[:, :-1], t[:, 1:]


def fails_on_rank1(model: torch.nn.Module, ctx: RankContext) -> torch.nn.Module:
    if ctx.rank == 1:
        raise KeyError("boom from the strategy")
    return ddp(model, ctx)


def crashes_on_rank1(model: torch.nn.Module, ctx: RankContext) -> torch.nn.Module:
    if ctx.rank == 1:
        os._exit(3)
    return ddp(model, ctx)


def hangs_on_rank1(model: torch.nn.Module, ctx: RankContext) -> torch.nn.Module:
    if ctx.rank == 1:
        time.sleep(3600)
    return ddp(model, ctx)


def run(strategy, **kw) -> DistributedResult:
    return train_on_ranks(build, build().state_dict(), Batches(RECIPE.batch_size), RECIPE, strategy, WORLD,
                          timeout_s=kw.pop("timeout_s", 120), **kw)


@pytest.fixture(scope="module")
def single():
    model = build()
    return train(model, Batches(RECIPE.batch_size), RECIPE), model.state_dict()


@pytest.fixture(scope="module")
def ddp_run() -> DistributedResult:
    return run(ddp)


def full_bytes() -> int:
    return sum(p.numel() * p.element_size() for p in build().parameters())


def _worker_children() -> list[int]:
    """Live (non-zombie) processes whose parent is this one and that run multiprocessing's spawn_main."""
    found = []
    for proc in Path("/proc").iterdir():
        try:
            stat = (proc / "stat").read_text().rsplit(")", 1)[1].split()
            cmd = (proc / "cmdline").read_bytes()
        except (OSError, IndexError):
            continue
        if int(stat[1]) == os.getpid() and stat[0] != "Z" and b"spawn_main" in cmd:
            found.append(int(proc.name))
    return found


def test_ddp_matches_single_process_on_global_batch(single, ddp_run):
    ref, ref_state = single
    np.testing.assert_allclose(ddp_run.train.loss, ref.loss, rtol=3e-5)
    np.testing.assert_allclose(ddp_run.train.grad_norm, ref.grad_norm, rtol=1e-4)
    assert ddp_run.train.layer_names == ref.layer_names
    assert set(ddp_run.state_dict) == set(ref_state)
    for key, value in ref_state.items():
        torch.testing.assert_close(ddp_run.state_dict[key], value, rtol=1e-4, atol=1e-5)
    assert int(ddp_run.train.tokens[0]) == RECIPE.batch_size * 16
    full = full_bytes()
    for stats in ddp_run.ranks:
        assert stats.param_bytes == stats.grad_bytes == full
        assert stats.bytes_sent == RECIPE.steps * full  # one fp32 allreduce of every gradient per step
        assert stats.peak_bytes > 0 and len(stats.step_s) == RECIPE.steps and stats.comm_s > 0


def test_zero3_same_losses_half_the_params(single, ddp_run):
    result = run(zero3)
    np.testing.assert_allclose(result.train.loss, single[0].loss, rtol=3e-5)
    for key, value in single[1].items():
        torch.testing.assert_close(result.state_dict[key], value, rtol=1e-4, atol=1e-5)
    full = full_bytes()
    assert sum(s.param_bytes for s in result.ranks) == full  # shards partition the model
    for s in result.ranks:
        assert abs(s.param_bytes - full / WORLD) <= 0.06 * full  # uneven dim-0 shards
        assert s.optimizer_bytes < 0.6 * ddp_run.ranks[s.rank].optimizer_bytes
        assert s.grad_bytes < 0.6 * full


def test_zero2_shards_optimizer_state_and_gathers_once(single, ddp_run):
    result = run(zero2)
    np.testing.assert_allclose(result.train.loss, single[0].loss, rtol=3e-5)
    full = full_bytes()
    for s in result.ranks:
        ratio = s.optimizer_bytes / ddp_run.ranks[s.rank].optimizer_bytes
        assert 0.4 < ratio < 0.6
        assert s.grad_bytes < 0.6 * full
        # params stay gathered through backward: one all-gather (shard) + reduce-scatter (full) per step,
        # where zero3 gathers twice
        assert s.step_bytes[-1] < 1.6 * full


def test_powersgd_sends_less_by_its_claim(ddp_run):
    result = run(ddp_powersgd)
    claim = powersgd_claimed_reduction(build())
    assert claim > 4
    for s, base in zip(result.ranks, ddp_run.ranks):
        assert s.step_bytes[:POWERSGD_START_ITER] == base.step_bytes[:POWERSGD_START_ITER]  # warm-up
        for sent, plain in zip(s.step_bytes[POWERSGD_START_ITER:], base.step_bytes[POWERSGD_START_ITER:]):
            assert plain / sent >= claim * 0.999
        assert s.bytes_sent < base.bytes_sent
    assert np.isfinite(result.train.loss).all()
    np.testing.assert_allclose(result.train.loss, ddp_run.train.loss, rtol=2e-3)
    assert any("PowerSGD" in n for n in result.notes)


def test_sign_sends_at_least_8x_less(ddp_run):
    result = run(ddp_sign)
    for s, base in zip(result.ranks, ddp_run.ranks):
        assert base.bytes_sent / s.bytes_sent >= 8
    assert np.isfinite(result.train.loss).all()
    np.testing.assert_allclose(result.train.loss, ddp_run.train.loss, rtol=5e-3)


def test_sign_packing_round_trips():
    x = torch.randn(21)
    packed = pack_signs(x)
    assert packed.dtype == torch.uint8 and packed.numel() == 3
    torch.testing.assert_close(unpack_signs(packed, 21), torch.where(x >= 0, 1.0, -1.0))


def test_rank_error_names_rank_and_message():
    with pytest.raises(RuntimeError, match=r"rank 1 failed: KeyError: 'boom from the strategy'"):
        run(fails_on_rank1)
    assert not multiprocessing.active_children() and not _worker_children()


def test_crash_without_traceback_names_the_dead_rank():
    with pytest.raises(RuntimeError, match=r"^rank 1 failed: rank process died \(exit code 3\)"):
        run(crashes_on_rank1)
    assert not multiprocessing.active_children() and not _worker_children()


def test_hang_is_cut_by_timeout_and_cleaned_up():
    t0 = time.monotonic()
    with pytest.raises(RuntimeError, match=r"did not finish within timeout_s=10s") as info:
        run(hangs_on_rank1, timeout_s=10)
    assert time.monotonic() - t0 < 25
    assert "hangs_on_rank1" in str(info.value)  # the hung rank's stack
    assert not multiprocessing.active_children() and not _worker_children()


def test_global_batch_must_divide_by_world_size():
    recipe = TrainRecipe(steps=1, batch_size=5)
    with pytest.raises(ValueError, match="not divisible by world_size=2"):
        train_on_ranks(build, build().state_dict(), Batches(5), recipe, ddp, 2)


#: what tp splits across ranks (dim 0 of column-parallel, dim 1 of row-parallel weights); the rest is replicated
TP_SHARDED = ("attn.qkv.weight", "attn.proj.weight", "mlp.up.weight", "mlp.gate.weight", "mlp.down.weight")


def test_tp_matches_single_process_on_global_batch(single, ddp_run):
    assert takes_whole_batch(tp) and not takes_whole_batch(ddp)
    result = run(tp)
    ref, ref_state = single
    np.testing.assert_allclose(result.train.loss, ref.loss, rtol=3e-5)
    np.testing.assert_allclose(result.train.grad_norm, ref.grad_norm, rtol=1e-4)  # > 1: clipping is active
    assert (ref.grad_norm > 1).any()
    assert int(result.train.tokens[0]) == RECIPE.batch_size * 16  # rank 0's whole batch, not a sum
    for key, value in ref_state.items():  # qkv rows come back in the model's order
        # Adam turns summation-order noise in near-zero gradients into ~lr-sized differences: atol 1e-4
        torch.testing.assert_close(result.state_dict[key], value, rtol=1e-4, atol=1e-4)
    named = dict(build().named_parameters())
    sharded = sum(p.numel() for n, p in named.items() if n.endswith(TP_SHARDED))
    replicated = sum(p.numel() for n, p in named.items() if not n.endswith(TP_SHARDED))
    assert sharded > replicated / 2  # a meaningful split
    expected = (replicated + sharded // WORLD) * 4
    for s in result.ranks:
        assert s.param_bytes == s.grad_bytes == expected
        assert s.param_bytes / full_bytes() == pytest.approx(expected / full_bytes())
        assert s.param_bytes < ddp_run.ranks[s.rank].param_bytes
        # per block and step: one fp32 all-reduce of the (batch, seq, d_model) activations after the attention
        # output and the MLP down projections, and one of their input gradients in backward
        act = RECIPE.batch_size * 16 * CFG.d_model * 4
        assert s.bytes_sent > 0 and s.step_bytes == [4 * CFG.n_layers * act] * RECIPE.steps
    assert any(n.startswith("tp:") for n in result.notes)


def test_tp_needs_heads_and_mlp_width_divisible_by_world_size():
    ctx = RankContext(0, 4, torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match="n_heads=2 is not divisible by world_size=4"):
        tp(Transformer(ModelConfig(n_layers=1, d_model=32, n_heads=2, context=16)), ctx)
    ctx = RankContext(0, 3, torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match="MLP width 64 is not divisible by world_size=3"):
        tp(Transformer(ModelConfig(n_layers=1, d_model=48, n_heads=3, ffn_dim=64, context=16)), ctx)


def test_pp_matches_single_process_on_global_batch(single):
    assert takes_own_step(pp) and takes_whole_batch(pp) and not takes_own_step(tp)
    result = run(pp)
    ref, ref_state = single
    # microbatching changes only the summation order of the loss and the gradients
    np.testing.assert_allclose(result.train.loss, ref.loss, rtol=3e-5)
    np.testing.assert_allclose(result.train.grad_norm, ref.grad_norm, rtol=1e-4)  # global norm across stages
    assert (ref.grad_norm > 1).any()  # clipping is active
    assert result.train.layer_names == ref.layer_names
    assert int(result.train.tokens[0]) == RECIPE.batch_size * 16
    assert set(result.state_dict) == set(ref_state)  # reassembled under the original names
    for key, value in ref_state.items():
        torch.testing.assert_close(result.state_dict[key], value, rtol=1e-4, atol=1e-4)
    per = CFG.n_layers // WORLD
    stage_prefixes = [("embed.",) + tuple(f"blocks.{i}." for i in range(per)),
                      tuple(f"blocks.{i}." for i in range(per, CFG.n_layers)) + ("norm.", "lm_head.")]
    named = dict(build().named_parameters())
    act = RECIPE.batch_size * 16 * CFG.d_model * 4  # the (batch, seq, d_model) activations or their gradient
    for s, prefixes in zip(result.ranks, stage_prefixes):
        expected = sum(p.numel() * 4 for n, p in named.items() if n.startswith(prefixes))
        assert s.param_bytes == s.grad_bytes == expected
        # rank 0 sends the activations forward, rank 1 their gradients back; step 0 adds the shape metadata
        assert s.step_bytes[1:] == [act] * (RECIPE.steps - 1) and act < s.step_bytes[0] < act + 1024
    assert sum(s.param_bytes for s in result.ranks) == full_bytes()
    assert any(n.startswith("pp:") for n in result.notes)


def test_pp_needs_layers_divisible_by_world_size_and_batch_by_microbatches():
    ctx = RankContext(0, 2, torch.device("cpu"), "gloo")
    with pytest.raises(ValueError, match="n_layers=3 is not divisible by world_size=2"):
        pp(Transformer(ModelConfig(n_layers=3, d_model=32, n_heads=2, context=16)), ctx)
    recipe = TrainRecipe(steps=1, batch_size=6)
    with pytest.raises(RuntimeError, match="batch_size=6 is not divisible by the 4 microbatches"):
        train_on_ranks(build, build().state_dict(), Batches(6), recipe, pp, WORLD, timeout_s=60)
