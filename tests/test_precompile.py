"""The parallel precompile step: every shard of every case in its own process, failures reported, never fatal."""

from __future__ import annotations

import os

import pytest

from microscope import registry
from microscope.api import grid
from microscope.precompile import WORKERS_ENV, defines_precompile, precompile

PLUGIN = '''
import os
from pathlib import Path

from microscope.api import Ablation, Tolerance, baseline, grid, register


@register("precompile_probe")
class Probe(Ablation):
    """Writes one file per (case, shard) it is asked to compile; refuses n=3."""

    variants = {"base": baseline(lambda x: x)}
    cases = grid(n=[1, 2, 3], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6)}

    def inputs(self, case, gen, device):
        raise NotImplementedError

    def precompile(self, case, device, shard, backward):
        if case["n"] == 3:
            raise ValueError("no kernel for n=3")
        name = f"n{case['n']}-shard{shard[0]}of{shard[1]}-{device}-{'bwd' if backward else 'fwd'}"
        (Path(os.environ["PROBE_DIR"]) / name).touch()
'''


@pytest.fixture(scope="module")
def probe(tmp_path_factory):
    folder = tmp_path_factory.mktemp("precompile")
    (folder / "probe_plugin.py").write_text(PLUGIN)
    return registry.get("precompile_probe", ["probe_plugin.py"], base_dir=folder)


def test_every_shard_of_every_case_runs_in_its_own_process_and_failures_are_reported(probe, tmp_path, monkeypatch):
    monkeypatch.setenv("PROBE_DIR", str(tmp_path))
    monkeypatch.setenv(WORKERS_ENV, "2")
    report = precompile(probe, probe.cases, "cuda", backward=True)
    assert report is not None and report.workers == 2
    made = sorted(p.name for p in tmp_path.iterdir())
    assert made == [f"n{n}-shard{i}of2-cuda-bwd" for n in (1, 2) for i in (0, 1)]
    assert len(report.errors) == 2 and all("n=3" in e and "no kernel for n=3" in e for e in report.errors)
    assert "2 processes" in report.summary() and "2 problem(s)" in report.summary()
    start_up, compiling = report.slowest
    assert 0 < start_up and 0 <= compiling and start_up + compiling <= report.seconds
    assert "slowest process" in report.summary()


def test_skipped_when_turned_off_or_when_the_plugin_compiles_nothing(probe, monkeypatch):
    monkeypatch.setenv(WORKERS_ENV, "0")
    assert precompile(probe, probe.cases, "cuda", backward=False) is None
    monkeypatch.setenv(WORKERS_ENV, "2")
    plain = registry.get("toy_gelu", ["tests/plugins/toy.py"])
    assert defines_precompile(probe) and not defines_precompile(plain)
    assert precompile(plain, grid(n=[1]), "cuda", backward=False) is None


def test_a_gpu_run_pins_tritons_cache_folder_for_every_process_it_starts(monkeypatch):
    """torch.compile points TRITON_CACHE_DIR at its own folder on first use; a GPU run fixes it first, so
    the precompile processes and the timed worker share one cache (a user's own choice is kept)."""
    from microscope import device

    monkeypatch.delenv("TRITON_CACHE_DIR", raising=False)
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    assert device.prepare("cuda") is False
    assert os.environ["TRITON_CACHE_DIR"] == device.triton_cache_dir()
    monkeypatch.setenv("TRITON_CACHE_DIR", "/somewhere/else")
    device.prepare("cuda")
    assert os.environ["TRITON_CACHE_DIR"] == "/somewhere/else"


def test_each_cases_shard_0_runs_in_its_own_process_and_every_shard_runs_once():
    """Once-per-case work (a torch.compile warm-up) sits under shard 0; turning the numbering by the
    case spreads it over the processes instead of stacking cases that hash alike in one."""
    from microscope.precompile import case_shard

    count = 4
    for case in range(6):
        shards = [case_shard(process, count, case) for process in range(count)]
        assert sorted(shards) == [(i, count) for i in range(count)]  # each shard once per case
        assert shards.index((0, count)) == case % count


def test_a_cases_two_compiled_graphs_warm_in_two_processes_and_16_processes_hold_8_cases_one_each():
    from microscope.api import warm_ways
    from microscope.precompile import case_shard

    assert warm_ways((0, 16), backward=True) == (True,) and warm_ways((8, 16), backward=True) == (False,)
    assert warm_ways((0, 16), backward=False) == () and warm_ways((3, 16), backward=True) == ()
    assert warm_ways((0, 1), backward=True) == (True, False)  # one process does both
    per_process = [sum(len(warm_ways(case_shard(p, 16, c), True)) for c in range(8)) for p in range(16)]
    assert per_process == [1] * 16


MODEL_PLUGIN = '''
import json
import os
from pathlib import Path

from microscope.api import Ablation, Arm, Role, register


@register("model_precompile_probe")
class ModelProbe(Ablation):
    """Writes what it is asked to compile, per (arm, shard); refuses the arm "broken"."""

    arms = {"base": Arm(Role.BASELINE, "the workload as is"),
            "quantized": Arm(description="inference only", inference_only=True),
            "broken": Arm(description="its kernels do not build", inference_only=True),
            "gpu_only": Arm(description="needs a GPU", needs=("cuda",))}

    def precompile_model(self, arm, shapes, device, shard):
        if arm == "broken":
            raise ValueError("no kernel for this arm")
        seen = {"linears": [list(s) for s in shapes.linears], "rows": list(shapes.rows),
                "dtype": str(shapes.dtype), "trains": shapes.trains, "context": shapes.model.context,
                "calls": [[m, str(dtype)] for m, dtype in shapes.calls()]}
        name = f"{arm}-shard{shard[0]}of{shard[1]}-{device}.json"
        (Path(os.environ["PROBE_DIR"]) / name).write_text(json.dumps(seen))
'''


def test_a_model_level_run_compiles_every_runnable_arms_kernels_for_its_linears_and_rows(tmp_path, monkeypatch):
    """Each arm the run can run gets every shard, with its model's Linears (out, in, bias) and the rows of its
    calls (training only where it trains); an arm whose compile raises is one reported line."""
    import json

    from microscope import config as cfgmod
    from microscope.model_runner import ModelRunner

    (tmp_path / "model_probe.py").write_text(MODEL_PLUGIN)
    out = tmp_path / "made"
    out.mkdir()
    monkeypatch.setenv("PROBE_DIR", str(out))
    monkeypatch.setenv(WORKERS_ENV, "2")
    text = ("plugin: model_precompile_probe\nplugins: [model_probe.py]\nlevel: model\nworkload:\n  steps: 2\n"
            "  batch_size: 4\n  eval_batch_size: 3\n  model: {d_model: 32, n_heads: 2, context: 16, mlp: gelu}\n"
            "  recipe: {precision: bf16}\n")
    cfg = cfgmod.loads(text, str(tmp_path / "probe.yaml"))
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=tmp_path)
    runner = ModelRunner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="probe")
    assert runner.compiles_kernels()
    report = runner.precompile_kernels()
    assert report is not None and "every arm in 2 processes" in report.summary()
    assert report.errors == ["arm broken: ValueError: no kernel for this arm"] * 2  # one line per shard
    made = sorted(p.name for p in out.iterdir())
    assert made == [f"{arm}-shard{i}of2-cpu.json" for arm in ("base", "quantized") for i in (0, 1)]
    base = json.loads((out / "base-shard0of2-cpu.json").read_text())
    quantized = json.loads((out / "quantized-shard1of2-cpu.json").read_text())
    *blocks, head = base["linears"]  # a block's qkv, output, MLP up and down (distinct shapes), the output head
    assert blocks == [[96, 32, False], [32, 32, False], [128, 32, False], [32, 128, False]] and head[1:] == [32, False]
    assert base["dtype"] == "torch.bfloat16" and base["context"] == 16
    assert base["rows"] == [3, 3 * 8, 3 * 16, 4 * 16] and base["trains"]  # decode, decode prompt, eval, train
    assert quantized["rows"] == [3, 3 * 8, 3 * 16] and not quantized["trains"]
    # the causality check runs 2 sequences of min(32, context) tokens in float32, before any bf16 call
    assert quantized["calls"] == [[m, "torch.bfloat16"] for m in quantized["rows"]] + [[2 * 16, "torch.float32"]]


def test_a_plugin_without_model_kernels_compiles_nothing_at_model_level(monkeypatch):
    import torch

    from microscope.api import ModelShapes
    from microscope.precompile import defines_precompile_model, precompile_model
    from microscope.workloads import ModelConfig

    monkeypatch.setenv(WORKERS_ENV, "2")
    plain = registry.get("toy_gelu", ["tests/plugins/toy.py"])
    assert not defines_precompile_model(plain)
    shapes = ModelShapes(ModelConfig(), torch.float32, ((128, 128, False),), (4,), trains=True)
    assert precompile_model(plain, [("base", shapes)], "cuda") is None  # no process started for it
