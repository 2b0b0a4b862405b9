"""TensorBoard graphs of the real flash_attn plugin: every variant's graph, the diff run, histograms.

Built once per module from the embedded model with the Triton kernel in every block (interpreted on
a CPU) and from the operator-level variants on one case, then read back with TensorBoard's own
``EventAccumulator`` -- and, where Chromium is installed, served and screenshot in the Graphs tab.
"""

from __future__ import annotations

import json
import os
import urllib.request
from pathlib import Path

import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

from microscope import config as cfgmod
from microscope import registry
from microscope.cli import main as cli_main
from microscope.instrument import InstrumentConfig, RunLogger
from microscope.instrument.config import DEFAULT_HISTOGRAM_BINS
from microscope.instrument.tb_compare import write_side_by_side
from microscope.instrument.tb_launch import logdir_of, serve
from microscope.measures.calls import fresh_inputs, make_call
from microscope.model_runner import plan_arms
from microscope.model_setup import TrialSeeds, WorkloadData
from microscope.observe import observe_case
from microscope.observe_model import observe_models
from microscope.seeding import generator

MODEL = """
plugin: flash_attn
level: model
workload:
  profile: tiny
  model: {n_layers: 2, d_model: 64, n_heads: 2, context: 32}
  corpus: {max_bytes: 200000}
instrument: {tensorboard: true}
"""
ATTENTION_OPS = ("bmm", "mul", "masked_fill", "_softmax", "bmm_1")


def _read(path: Path) -> EventAccumulator:
    acc = EventAccumulator(str(path), size_guidance={"histograms": 0, "tensors": 0})
    acc.Reload()
    return acc


@pytest.fixture(scope="module")
def model_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One instrumented step of both arms of flash_attn at model level, TensorBoard on."""
    out = tmp_path_factory.mktemp("flash_attn_model")
    cfg = cfgmod.loads(MODEL, "flash_attn_model.yaml")
    arms = plan_arms(registry.get("flash_attn"), cfg)
    data = WorkloadData.load(cfg.workload)
    with RunLogger(out / "tensorboard") as logger:
        problems = observe_models(arms, cfg.workload, data, TrialSeeds.of(0, 0), "cpu", cfg.instrument, out, logger)
    assert problems == []
    return out


def test_every_arm_and_the_diff_run_hold_a_graph(model_run: Path) -> None:
    logdir = model_run / "tensorboard"
    assert sorted(p.name for p in logdir.iterdir()) == ["diff-triton", "eager", "triton"]
    graphs = {}
    for run in ("eager", "triton", "diff-triton"):
        acc = _read(logdir / run)
        assert acc.Tags()["graph"] is True, run
        graphs[run] = {n.name: n for n in acc.Graph().node}
    eager, triton, diff = graphs["eager"], graphs["triton"], graphs["diff-triton"]
    for layer in (0, 1):
        scope = f"blocks.{layer}/attn/attn_fn"
        assert {f"{scope}/{op}" for op in ATTENTION_OPS} <= set(eager)
        fn = triton[f"{scope}/FlashAttentionFn"]
        assert fn.op == "FlashAttentionFn" and fn.attr["dtype"].s == b"float32"
        assert b"triton::_attn_fwd" in fn.attr["inner_ops"].s  # the kernel ran inside, drawn as one node
        assert not any(name.startswith(f"{scope}/") and "softmax" in name for name in triton)
        # the diff run: the eager attention ops under removed/, the kernel's Function under added/, per layer
        assert {f"removed/{scope}/{op}" for op in ATTENTION_OPS} <= set(diff)
        added = diff[f"added/{scope}/FlashAttentionFn"]
        assert added.device == "added" and added.attr["diff"].s == b"added"
        assert all(ref.startswith("same/") for ref in added.input)  # fed by the unchanged q, k, v
    assert {n.split("/", 1)[0] for n in diff} == {"removed", "added", "same"}
    assert not any(n.startswith(("removed/", "added/")) and "/mlp/" in n for n in diff)
    assert len(diff) == len(eager) + sum(n.startswith("added/") for n in diff)
    assert "graph/diff/text_summary" in _read(logdir / "diff-triton").Tags()["tensors"]


def test_histograms_overlay_the_arms_by_default(model_run: Path) -> None:
    tags = {run: set(_read(model_run / "tensorboard" / run).Tags()["histograms"]) for run in ("eager", "triton")}
    assert tags["eager"] == tags["triton"]
    assert {"activations/blocks.0.attn.attn_fn", "gradients/blocks.0.attn.attn_fn",
            "activations/blocks.1.mlp", "gradients/lm_head"} <= tags["eager"]
    hist = _read(model_run / "tensorboard" / "triton").Histograms("activations/blocks.0.attn.attn_fn")[0]
    assert len(hist.histogram_value.bucket) == DEFAULT_HISTOGRAM_BINS
    assert hist.histogram_value.num == 2 * 2 * 32 * 32  # rows x heads x tokens x head_dim


def test_the_report_gets_the_diff_as_a_graph(model_run: Path) -> None:
    from microscope.report.graph_svg import diff_figures

    data = json.loads((model_run / "dataflow_diff.json").read_text())
    assert set(data) == {"triton"}
    figures, left_out = diff_figures(data)
    assert left_out == 0 and len(figures) == 1  # both layers' identical edit drawn once
    fig = figures[0]
    assert fig.places == ["blocks.0.attn.attn_fn", "blocks.1.attn.attn_fn"]
    assert fig.summary.startswith("8 removed: bmm, mul") and fig.summary.endswith("1 added: FlashAttentionFn")
    assert fig.svg.count('class="gd-node gd-removed"') == 8 and fig.svg.count('class="gd-node gd-added"') == 1
    assert "<script" not in fig.svg and "FlashAttentionFn" in fig.svg


def test_operator_level_variants_get_graphs_on_one_case(tmp_path: Path) -> None:
    plugin = registry.get("flash_attn")
    case = next(c for c in plugin.cases if c["causal"] and c["dtype"] == "fp32")
    inputs = plugin.inputs(case, generator(0), "cpu")
    thunks = {name: make_call(plugin.variants[name], fresh_inputs(inputs, ()), (), False, None)
              for name in ("eager", "triton")}
    with RunLogger(tmp_path / "tensorboard") as logger:
        assert observe_case(case, thunks, "eager", InstrumentConfig(tensorboard=True), tmp_path, "cpu", logger) == []
    eager = {n.name: n for n in _read(tmp_path / "tensorboard" / "eager").Graph().node}
    triton = {n.name: n for n in _read(tmp_path / "tensorboard" / "triton").Graph().node}
    assert {"q", "k", "v", "bmm", "_softmax", "bmm_1"} <= set(eager)  # matmul, softmax, matmul
    assert set(triton) == {"q", "k", "v", "FlashAttentionFn"} and triton["FlashAttentionFn"].input == ["q", "k", "v"]
    diff = {n.name for n in _read(tmp_path / "tensorboard" / "diff-triton").Graph().node}
    assert {"same/q", "same/k", "same/v", "removed/_softmax", "added/FlashAttentionFn"} <= diff
    assert list(json.loads((tmp_path / "dataflow_diff.json").read_text())) == [f"triton @ {case.id}"]


def test_compare_writes_both_runs_side_by_side(model_run: Path, tmp_path: Path) -> None:
    result = write_side_by_side(model_run, model_run, tmp_path / "tb")
    assert result.notes == []
    assert set(result.subruns) == {"A-eager", "A-triton", "A-diff-triton", "B-eager", "B-triton", "B-diff-triton",
                                   "diff-B-eager", "diff-B-triton"}
    assert result.diffs["triton"].startswith("0 ops removed, 0 added, 0 changed")
    for run in result.subruns:
        assert _read(tmp_path / "tb" / run).Tags()["graph"] is True, run
    assert logdir_of(model_run) == model_run / "tensorboard" and logdir_of(tmp_path / "tb") == tmp_path / "tb"
    (tmp_path / "no_logs").mkdir()
    with pytest.raises(FileNotFoundError, match="instrument.tensorboard=true"):
        logdir_of(tmp_path / "no_logs")


def test_tensorboard_serves_the_diff_graph_and_the_cli_refuses_an_empty_folder(model_run: Path, tmp_path: Path) -> None:
    with serve(model_run, wait_for=["eager", "triton", "diff-triton"]) as url:
        with urllib.request.urlopen(f"{url}/data/plugin/graphs/graph?run=diff-triton&conversions=false") as reply:
            pbtxt = reply.read().decode()
    assert 'name: "added/blocks.1/attn/attn_fn/FlashAttentionFn"' in pbtxt
    assert 'name: "removed/blocks.1/attn/attn_fn/_softmax"' in pbtxt
    (tmp_path / "empty").mkdir()
    assert cli_main(["tensorboard", str(tmp_path / "empty")]) == 2


def test_graphs_tab_shows_the_diff_run(model_run: Path, tmp_path: Path) -> None:
    """Served by TensorBoard on a free local port, rendered by headless Chromium, screenshot."""
    from tb_screenshot import capture_diff_graph, find_chromium  # (cdp_client's, from tests/report)

    if find_chromium() is None:
        pytest.skip("no Chromium on PATH: run .ci/install_browser.sh to screenshot TensorBoard's Graphs tab")
    out = Path(os.environ.get("MICROSCOPE_TB_SCREENSHOT", tmp_path / "graphs_tab.png"))
    shown = capture_diff_graph(model_run / "tensorboard", out)
    assert {"same", "removed", "added", "removed/blocks.0/attn/attn_fn/_softmax",
            "added/blocks.0/attn/attn_fn/FlashAttentionFn"} <= set(shown)
    assert out.stat().st_size > 20_000  # a rendered page, not a blank one


def test_compare_cli_writes_both_sides_graphs_and_their_diff(tmp_path: Path, capsys: pytest.CaptureFixture) -> None:
    config = Path(__file__).resolve().parents[2] / "ablations" / "planted_crashes.yaml"
    runs = []
    for side in ("a", "b"):
        assert cli_main(["run", str(config), "--quick", "--device", "cpu", "--executor", "inline", "--no-progress",
                         "--no-report", "--out", str(tmp_path / side), "--set", "variants=[correct]",
                         "instrument.tensorboard=true", "dimensions.throughput.rounds=3"]) == 0
        (run,) = (tmp_path / side).iterdir()
        runs.append(run)
    capsys.readouterr()
    assert cli_main(["compare", str(runs[0]), str(runs[1]), "--out", str(tmp_path / "rep"),
                     "--tensorboard", str(tmp_path / "tb")]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "tensorboard: correct, graph of B against A: 0 ops removed, 0 added, 0 changed" in out
    assert f"microscope tensorboard {tmp_path / 'tb'}" in out
    for sub in ("A-eager", "A-correct", "B-eager", "B-correct", "diff-B-correct"):
        assert _read(tmp_path / "tb" / sub).Tags()["graph"] is True, sub
    softmax = {n.name for n in _read(tmp_path / "tb" / "A-correct").Graph().node}
    assert any("softmax" in name for name in softmax), softmax
