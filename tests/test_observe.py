"""Operator-level instruments through the runner: traces, op diffs, TensorBoard sub-runs per variant."""

from __future__ import annotations

import gzip
import json

from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from microscope import config as cfgmod
from microscope import registry
from microscope.runner import Runner

CONFIG = """
plugin: toy_gelu
plugins: [tests/plugins/toy.py]
variants: [eager, fused]
cases: {rows: [3], dtype: [fp32]}
dimensions:
  throughput: {warmup: 1, rounds: 2, reps: 1}
  memory: {enabled: false}
instrument:
  profile: {enabled: true, wait: 0, warmup: 1, active: 2}
  graph_diff: true
  tensorboard: true
"""


def test_instruments_write_traces_diffs_and_tensorboard(tmp_path):
    cfg = cfgmod.loads(CONFIG, "observe.yaml")
    plugin = registry.get(cfg.plugin, cfg.plugins)
    result = Runner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="obs").run()
    run = result.out_dir
    key = "fused @ rows=3,cols=33,fp32"
    graph = json.loads((run / "graph_diff.json").read_text())[key]
    # gelu(x * w) as one aten::gelu vs the tanh formula written out: gelu removed, tanh added
    assert "aten::gelu" in json.dumps(graph["removed"]) and "aten::tanh" in json.dumps(graph["added"])
    trace = json.loads((run / "trace_diff.json").read_text())[key]
    assert trace["headline"]
    traces = list((run / "traces").rglob("*.json.gz"))
    assert len(traces) == 2 and all(json.loads(gzip.open(p).read())["traceEvents"] for p in traces)
    for variant in ("eager", "fused"):
        acc = EventAccumulator(str(run / "tensorboard" / variant))
        acc.Reload()
        assert "latency_ms/rows=3,cols=33,fp32" in acc.Tags()["scalars"]
