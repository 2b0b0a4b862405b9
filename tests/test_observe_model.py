"""Model-level instruments: a change planted in one layer is localized to that layer."""

from __future__ import annotations

import json

import torch.nn.functional as F

from microscope import config as cfgmod
from microscope.api import Arm, Role
from microscope.model_setup import TrialSeeds, WorkloadData
from microscope.observe_model import observe_models

WORKLOAD = """
plugin: unused
level: model
workload:
  profile: tiny
  model: {n_layers: 3, d_model: 64, n_heads: 2, context: 32}
  corpus: {max_bytes: 200000}
instrument: {hooks: true, graph_diff: true, keep: full}
"""


def _perturb_layer_1(model):
    """Scales layer 1's MLP activation by 1.05: only blocks.1.mlp and what follows may change."""
    model.blocks[1].mlp.act = lambda x: F.silu(x) * 1.05


def test_planted_change_is_localized_to_its_layer(tmp_path):
    cfg = cfgmod.loads(WORKLOAD, "observe.yaml")
    arms = [("base", Arm(Role.BASELINE)), ("perturbed", Arm(Role.CANDIDATE, patch=_perturb_layer_1))]
    data = WorkloadData.load(cfg.workload)
    problems = observe_models(arms, cfg.workload, data, TrialSeeds.of(0, 0), "cpu", cfg.instrument, tmp_path)
    assert problems == []
    report = json.loads((tmp_path / "divergence.json").read_text())["perturbed"]
    assert report["first_divergent"].startswith("blocks.1.mlp")
    rows = report["rows"]
    first = next(i for i, r in enumerate(rows) if r["module"] == report["first_divergent"])
    assert first > 0 and all(r["rel_err"] == 0 for r in rows[:first])  # everything before is bitwise equal
    assert any(r["module"].startswith("blocks.2") and r["diverged"] for r in rows[first:])
    gradients = json.loads((tmp_path / "divergence.json").read_text())["perturbed (gradients)"]
    assert gradients["first_divergent"] is not None


def test_flash_attn_model_graph_diff_names_the_kernel(tmp_path):
    """flash_attn at model level: eager attention's ops leave the graph, the Triton kernel's Function enters."""
    from microscope import registry
    from microscope.model_runner import plan_arms

    cfg = cfgmod.loads(WORKLOAD.replace("plugin: unused", "plugin: flash_attn")
                       .replace("hooks: true, ", ""), "observe.yaml")
    arms = plan_arms(registry.get("flash_attn"), cfg)
    data = WorkloadData.load(cfg.workload)
    assert observe_models(arms, cfg.workload, data, TrialSeeds.of(0, 0), "cpu", cfg.instrument, tmp_path) == []
    diff = json.loads((tmp_path / "graph_diff.json").read_text())["triton"]
    removed, added = json.dumps(diff["removed"]), json.dumps(diff["added"])
    assert "aten::_softmax" in removed and "aten::bmm" in removed
    assert "FlashAttentionFn" in added
