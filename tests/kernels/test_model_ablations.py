"""The model-level plugins: each arm changes exactly what it claims to, and their configs validate."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from microscope import config as cfgmod
from microscope import registry
from microscope.api import Role
from microscope.commands import load_checked
from microscope.model_setup import TrialSeeds, trial_setup
from microscope.workloads import EagerAttention, ModelConfig, build_model, future_leak

ROOT = Path(__file__).resolve().parents[2]
CONFIGS = {
    "grad_checkpoint": "grad_checkpoint",
    "mixed_precision": "mixed_precision",
    "adam_betas": "adam_betas",
    "attn_scale_offset": "attn_scale_offset",
    "layernorm_eps": "layernorm_eps",
    "flash_attn_model": "flash_attn",
    "int8_kv_cache_model": "int8_kv_cache",
    "fused_layernorm_gelu_model": "fused_layernorm_gelu",
}
SMALL = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32)


def _recipe(plugin: str, arm: str):
    """The recipe an arm trains with under the default workload (profile tiny, no overrides)."""
    return trial_setup(cfgmod.WorkloadConfig(), registry.get(plugin).arms[arm], TrialSeeds.of(0, 0)).recipe


@pytest.mark.parametrize("plugin", sorted(set(CONFIGS.values())))
def test_model_plugins_declare_one_baseline_arm(plugin):
    arms = registry.get(plugin).arms
    assert sum(a.role is Role.BASELINE for a in arms.values()) == 1
    assert len(arms) >= 2 and all(a.description for a in arms.values())


@pytest.mark.parametrize("name", sorted(CONFIGS))
@pytest.mark.parametrize("device", ["cpu", "cuda"])
@pytest.mark.parametrize("quick", [False, True])
def test_shipped_model_configs_validate(name, device, quick):
    path = ROOT / "ablations" / f"{name}.yaml"
    config, plugin = load_checked(path, device, quick)
    assert plugin.name == CONFIGS[name]
    assert cfgmod.effective_level(config, plugin) == "model"
    assert config.workload.seeds >= 3
    text = path.read_text()
    assert f"microscope run ablations/{name}.yaml --quick --device cpu" in text  # the header's command
    if device == "cuda" and not quick:
        assert config.workload.profile == "gpu"


def test_grad_checkpoint_arms_differ_only_in_checkpoint_every():
    recipes = {arm: _recipe("grad_checkpoint", arm) for arm in ("none", "every_2", "every_1")}
    assert [r.checkpoint_every for r in recipes.values()] == [0, 2, 1]
    base = recipes["none"]
    for r in recipes.values():
        assert dataclasses.replace(r, checkpoint_every=0) == base


def test_mixed_precision_arms_set_the_autocast_dtype():
    assert [_recipe("mixed_precision", a).precision for a in ("fp32", "bf16", "fp16")] == ["fp32", "bf16", "fp16"]


def test_adam_betas_arms_move_beta1_and_eps_only():
    base, cand = _recipe("adam_betas", "beta1_0.9"), _recipe("adam_betas", "beta1_0.95")
    assert (base.betas, base.eps) == ((0.9, 0.95), 1e-8)
    assert (cand.betas, cand.eps) == ((0.95, 0.95), 1e-6)
    assert (base.lr, base.warmup, base.steps) == (cand.lr, cand.warmup, cand.steps)


def test_attn_scale_offset_patch_sets_the_offset_scale_in_every_block():
    from microscope_kernels.attn_scale_offset.ablation import OFFSET

    arm = registry.get("attn_scale_offset").arms["sqrt_d_plus_0.07"]
    model = build_model(SMALL, seed=0)
    x = torch.randint(0, 256, (2, 16))
    before = model(x)
    arm.patch(model)
    for block in model.blocks:
        assert isinstance(block.attn.attn_fn, EagerAttention)
        assert block.attn.attn_fn.scale == pytest.approx(1 / (math.sqrt(SMALL.head_dim) + OFFSET))
    after = model(x)
    assert not torch.equal(before, after) and torch.allclose(before, after, atol=1e-2)
    assert future_leak(model) == 0.0


def test_layernorm_eps_rule_and_patch():
    from microscope_kernels.layernorm_eps.ablation import TrainBatchEpsLayerNorm, batch_eps

    assert batch_eps(100) == batch_eps(512) == 1e-5
    assert batch_eps(1024) == pytest.approx(1e-5 * (1 + math.log(2)))
    assert batch_eps(512 * math.e**2) == pytest.approx(3e-5)
    plugin = registry.get("layernorm_eps")
    cfg = trial_setup(cfgmod.WorkloadConfig(model={"d_model": 64, "n_heads": 2}), plugin.arms["log_batch"],
                      TrialSeeds.of(0, 0)).model
    assert cfg.norm == "layernorm" and cfg.norm_eps == 1e-5
    model = build_model(cfg, seed=0)
    plugin.arms["log_batch"].patch(model)
    norms = [m for m in model.modules() if isinstance(m, nn.LayerNorm)]
    assert len(norms) == 2 * cfg.n_layers + 1 and all(type(m) is TrainBatchEpsLayerNorm for m in norms)
    norm = norms[0]
    x = torch.randn(4, 300, 64) * 1e-3  # tiny activations, where epsilon matters
    plain = F.layer_norm(x, (64,), norm.weight, norm.bias, 1e-5)
    assert torch.equal(norm.eval()(x), plain)  # before any training step: the base epsilon
    trained = norm.train()(x)  # the first training batch (1200 tokens) fixes the epsilon ...
    assert norm.train_eps == pytest.approx(batch_eps(1200))
    assert torch.equal(trained, F.layer_norm(x, (64,), norm.weight, norm.bias, batch_eps(1200)))
    assert not torch.allclose(trained, plain)
    assert torch.equal(norm.eval()(x[:1, :10]), F.layer_norm(x[:1, :10], (64,), norm.weight, norm.bias,
                                                             batch_eps(1200)))  # ... and keeps it after
    with pytest.raises(TypeError, match="LayerNorm"):
        plugin.arms["log_batch"].patch(build_model(SMALL, seed=0))  # rmsnorm model: nothing to patch


def test_flash_attn_arm_puts_the_triton_kernel_in_every_block():
    from microscope_kernels.flash_attn.kernel import flash_attention

    arm = registry.get("flash_attn").arms["triton"]
    assert arm.needs == ("triton",)
    model = build_model(SMALL, seed=0)
    x = torch.randint(0, 256, (2, 16))
    eager = model(x)
    arm.patch(model)
    assert all(block.attn.attn_fn is flash_attention for block in model.blocks)
    torch.testing.assert_close(model(x), eager, rtol=1e-4, atol=1e-4)
    assert future_leak(model, seq_len=16) == 0.0


@pytest.mark.parametrize("name", ["grad_checkpoint", "mixed_precision"])
def test_the_cuda_profile_trains_the_gpu_sized_model(name):
    """The issue's H200 budget is for the gpu profile (12 x 768, context 1024); a CPU-sized override
    at the top level of a config must not leak into its cuda profile."""
    config, plugin = load_checked(ROOT / "ablations" / f"{name}.yaml", "cuda", False)
    baseline = next(arm for arm in plugin.arms.values() if arm.role is Role.BASELINE)
    model = trial_setup(config.workload, baseline, TrialSeeds.of(0, 0)).model
    assert (model.n_layers, model.d_model, model.context) == (12, 768, 1024)
