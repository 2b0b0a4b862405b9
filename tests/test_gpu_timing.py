"""The GPU timing modes through the runner: CUDA-graph replay and host time per call.

Skipped where no GPU is present (CI). On a GPU host: ``python -m pytest -m gpu tests/test_gpu_timing.py``.
"""

from __future__ import annotations

import json

import pytest
import torch

from microscope import config as cfgmod
from microscope import registry
from microscope.runner import Runner

pytestmark = pytest.mark.gpu

PLUGIN = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


def scale(x):
    return x * 2.0


def scale_synchronising(x):
    out = x * 2.0
    torch.cuda.synchronize()  # a host wait on every call: cannot be captured, and shows as host time
    return out


@register("timing_modes_probe")
class Probe(Ablation):
    """x * 2, once plainly and once with a device synchronisation per call."""

    variants = {"plain": baseline(scale), "synchronising": candidate(scale_synchronising, differentiable=False)}
    cases = grid(n=[1 << 20], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-6)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """One plugin file for the module: a plugin name registers once per process."""
    folder = tmp_path_factory.mktemp("probe")
    (folder / "probe_plugin.py").write_text(PLUGIN)
    return folder


def _run(plugin_dir, tmp_path, mode: str):
    text = (f"plugin: timing_modes_probe\nplugins: [probe_plugin.py]\ndimensions:\n  memory: {{enabled: false}}\n"
            f"  throughput: {{warmup: 2, rounds: 4, reps: 3, mode: {mode}}}\n")
    cfg = cfgmod.loads(text, str(plugin_dir / "probe.yaml"))
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=plugin_dir)
    return Runner(plugin, cfg, device="cuda", interpreted=False, out_root=tmp_path, run_id=mode).run()


def _latency(result, variant):
    (rec,) = [r for r in result.records if r.variant == variant and r.metric == "latency_ms"]
    return rec


def test_cuda_graph_mode_replays_captured_calls_and_names_what_cannot_be_captured(plugin_dir, tmp_path):
    result = _run(plugin_dir, tmp_path, "cuda_graph")
    plain = _latency(result, "plain")
    assert plain.status == "ok" and plain.details["timer"] == "cuda_graph_replay"
    assert plain.details["timing_mode"] == "cuda_graph" and len(plain.details["rounds"]) == 4
    (checked,) = [r for r in result.records if r.variant == "plain" and r.metric == "timed_calls.ok"]
    assert checked.passed and len(checked.details["checked"]) == 3  # replays of rotated inputs, each right
    syncing = _latency(result, "synchronising")
    assert syncing.status == "failed" and "cannot be captured in a CUDA graph" in syncing.reason
    assert "throughput.mode: events" in syncing.reason
    assert torch.randn(4, device="cuda").isfinite().all()  # the failed capture left the GPU's RNG usable


def test_host_mode_times_the_call_until_it_returns(plugin_dir, tmp_path):
    """A call that only launches returns while the queued 20 ms of GPU work runs; one that synchronises
    waits for it, so its host time is ~100x longer. No TFLOP/s or GB/s come from host time."""
    result = _run(plugin_dir, tmp_path, "host")
    plain, syncing = _latency(result, "plain"), _latency(result, "synchronising")
    assert plain.details["timer"] == syncing.details["timer"] == "host_perf_counter"
    assert plain.value < 2.0 < 10.0 < syncing.value, (plain.value, syncing.value)
    assert not [r for r in result.records if r.metric in ("tflops", "gbps")]


def test_ceilings_are_measured_once_per_run_and_gpu(tmp_path):
    """A run's later worker processes read the first measurement instead of repeating it."""
    from microscope.measures.ceilings import Ceilings

    first = Ceilings.for_run(tmp_path)
    (saved,) = tmp_path.glob("ceilings-*.json")
    assert first.tflops > 10 and first.gbps > 100
    planted = Ceilings(tflops=first.tflops * 2, gbps=first.gbps / 2)  # what a later worker must read back
    saved.write_text(json.dumps({"tflops": planted.tflops, "gbps": planted.gbps}))
    assert Ceilings.for_run(tmp_path) == planted


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_captures_share_one_warm_up_stream_so_cublas_workspaces_do_not_pile_up():
    """cuBLAS keeps a workspace per stream it meets: forty captures of a matmul must not hold forty more."""
    import gc

    from microscope.measures.throughput import graphed

    a = torch.randn(256, 256, device="cuda")
    graphed(lambda: a @ a)()  # the warm-up and capture streams' workspaces, once
    torch.cuda.synchronize()
    gc.collect()
    before = torch.cuda.memory_allocated()
    for _ in range(40):
        graphed(lambda: a @ a)()
    torch.cuda.synchronize()
    gc.collect()
    assert torch.cuda.memory_allocated() - before < 8 * 2**20
