"""The runner: identical inputs per case, failures isolated and recorded, records streamed."""

from __future__ import annotations

import json

import pytest
import torch

from microscope import config as cfgmod
from microscope import registry
from microscope.measures import memory
from microscope.runner import Runner

TOY = "tests/plugins/toy.py"


def _run(tmp_path, text: str, name: str = "run"):
    cfg = cfgmod.loads(text, "toy.yaml")
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=None)
    runner = Runner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id=name)
    return runner.run()


BASE = f"""
plugin: toy_gelu
plugins: [{TOY}]
seed: 7
dimensions:
  throughput: {{warmup: 1, rounds: 3, reps: 2}}
  memory: {{backward: true}}
"""


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("toy"), BASE)


def _by(result, **match):
    return [r for r in result.records if all(getattr(r, k) == v for k, v in match.items())]


def _run_plugin(tmp_path, filename: str, source: str, text: str, run_id: str):
    """Write a plugin file beside a config naming it, and run that config on the CPU."""
    (tmp_path / filename).write_text(source)
    cfg = cfgmod.loads(text, str(tmp_path / f"{run_id}.yaml"))
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=tmp_path)
    return Runner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id=run_id).run()


def test_correct_candidate_passes_every_tensor(toy_run):
    acc = _by(toy_run, variant="fused", dimension="accuracy")
    assert {r.metric for r in acc} == {"out.rel_err", "grad_x.rel_err", "grad_w.rel_err", "timed_calls.ok"}
    assert len(acc) == 4 * 4  # three tensors and the timed-call check x four cases
    assert all(r.status == "ok" and r.passed for r in acc), [r.reason for r in acc if not r.passed]
    checks = _by(toy_run, variant="fused", metric="timed_calls.ok")[0].details["checked"]
    assert [c["round"] for c in checks] == [0, 1, 2] and all(c["problem"] is None for c in checks)


@pytest.mark.parametrize("cheat", ["memo", "pointer_cache"])
def test_a_variant_that_returns_stale_answers_when_timed_fails(toy_run, cheat):
    """Its first call (the accuracy check) is right; timed calls see rotating input contents in the same
    buffers, so a memoized or pointer-cached answer is caught and its speed is not judged."""
    first = _by(toy_run, variant=cheat, metric="out.rel_err")
    assert first and all(r.passed for r in first)
    timed = _by(toy_run, variant=cheat, metric="timed_calls.ok")
    assert len(timed) == 4 and all(r.passed is False and "wrong answer" in r.reason for r in timed)
    latency = _by(toy_run, variant=cheat, metric="latency_ms")
    assert latency and all(r.status == "ok" for r in latency)  # the numbers stay in the records

    from microscope import stats
    from microscope.store.records import records_frame

    table = stats.compare_records(records_frame(toy_run.out_dir))
    speed = table[(table["candidate"] == cheat) & (table["dimension"].isin(["throughput", "memory"]))]
    assert len(speed) and set(speed["verdict"]) == {"not judged"}
    assert speed["notes"].str.startswith("not judged: fails accuracy (timed_calls.ok").all()


def test_all_zeros_output_fails_accuracy(toy_run):
    out = _by(toy_run, variant="zeros", dimension="accuracy", metric="out.rel_err")
    assert out and all(r.passed is False for r in out)
    assert all(r.value == pytest.approx(1.0) for r in out)  # ||0 - y|| / ||y||
    assert all("baseline" in r.reason for r in out)


def test_raising_variant_is_recorded_failed_and_others_still_measured(toy_run):
    failed = _by(toy_run, variant="raises")
    assert failed and all(r.status == "failed" for r in failed)
    assert "kernel launch failed on purpose" in failed[0].reason
    assert {r.dimension for r in failed} == {"accuracy", "throughput", "memory"}
    ok_latency = _by(toy_run, variant="fused", metric="latency_ms")
    assert len(ok_latency) == 4 and all(r.status == "ok" and r.value > 0 for r in ok_latency)


def test_nan_output_is_a_failed_trial(toy_run):
    out = _by(toy_run, variant="nan", metric="out.rel_err")
    assert out and all(r.status == "failed" and "NaN/Inf" in r.reason for r in out)


def test_unavailable_variant_is_skipped_with_reason(toy_run):
    skipped = _by(toy_run, variant="gpu_only")
    assert skipped and all(r.status == "skipped" and r.reason == "needs a CUDA GPU" for r in skipped)


def test_throughput_records_carry_interleaved_rounds(toy_run):
    lat = _by(toy_run, variant="eager", metric="latency_ms")[0]
    assert len(lat.details["rounds"]) == 3 and lat.details["reps"] == 2
    assert lat.details["timer"] == "perf_counter"
    assert _by(toy_run, variant="eager", metric="gbps")


def test_every_record_of_the_runner_declares_which_way_is_better(toy_run):
    """The direction is declared where a metric is emitted, never guessed from its name downstream."""
    declared = {r.metric: r.details.get("higher_is_better") for r in toy_run.records if r.status == "ok"}
    assert declared["latency_ms"] is False and declared["gbps"] is True and declared["peak_bytes"] is False
    assert all(v is False for m, v in declared.items() if m.endswith("rel_err")) and declared["timed_calls.ok"]
    assert None not in declared.values(), declared


def test_interleaved_marks_each_variant_outside_its_timed_calls_and_cpu_ignores_the_gpu_mode():
    """``on_variant`` runs before each warm-up and before each variant's calls of a round, in the
    alternating order; on a CPU every timing mode is ``perf_counter``."""
    from microscope.config import ThroughputConfig
    from microscope.measures import throughput

    seen: list[str] = []
    calls = {"a": 0, "b": 0}

    def thunk(name):
        def call():
            calls[name] += 1
            return seen[-1] == name  # the marker names the variant while it runs
        return call

    cfg = ThroughputConfig(warmup=1, rounds=3, reps=2, mode="cuda_graph")
    res = throughput.interleaved({"a": thunk("a"), "b": thunk("b")}, cfg, "cpu", on_variant=seen.append)
    assert seen == ["a", "b", "a", "b", "b", "a", "a", "b"]
    assert calls == {"a": 7, "b": 7} and all(len(t.rounds) == 3 and t.error is None for t in res.values())


def test_an_unknown_timing_mode_is_a_config_error_with_the_choices():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.loads(BASE.replace("reps: 2}", "reps: 2, mode: graphs}"), "toy.yaml")
    assert "dimensions.throughput.mode" in str(err.value.problems) and "'cuda_graph'" in str(err.value.problems)


def test_cpu_peak_memory_is_measured_not_zero(toy_run):
    mem = _by(toy_run, variant="eager", dimension="memory", case_id="rows=17,cols=33,fp32")[0]
    out_bytes = 17 * 33 * 4
    assert mem.details["method"] == "cpu_live_tensor_bytes"
    assert mem.value >= out_bytes  # forward+backward holds at least the output


def test_saved_bytes_count_the_distinct_storages_autograd_keeps_for_the_backward(toy_run):
    x, y = torch.randn(100, requires_grad=True), torch.randn(100, requires_grad=True)
    assert memory.saved_for_backward_bytes(lambda: x * y) == 800  # both inputs are kept
    assert memory.saved_for_backward_bytes(lambda: x.exp()) == 400  # its output is kept
    assert memory.saved_for_backward_bytes(lambda: x * x) == 400  # one storage, counted once
    assert memory.saved_for_backward_bytes(lambda: x + y) == 0  # nothing is needed
    w = torch.randn(100, 7, requires_grad=True)
    assert memory.saved_for_backward_bytes(lambda: x.view(1, 100) @ w) == 400 + 2800  # matmul keeps both
    assert memory.saved_for_backward_bytes(lambda: x.view(1, 100) @ w, exclude=[w]) == 400  # a held weight is not
    # a saved output (softmax keeps its result) is freed with its graph: packing the output itself once
    # made a cycle through C++ that kept every measured graph alive (610-834 MiB a group on the H200)
    import gc
    import weakref

    outs = []

    def forward():
        probs = torch.softmax(x.view(10, 10), -1)  # saved by its own grad_fn
        outs.append(weakref.ref(probs))
        return probs @ y.view(10, 10)

    assert memory.saved_for_backward_bytes(forward) > 0
    gc.collect()
    assert outs[0]() is None
    saved = _by(toy_run, variant="eager", metric="saved_bytes")
    assert len(saved) == 4 and all(r.status == "ok" and r.value > 0 and r.dimension == "memory" for r in saved)


def test_records_are_streamed_to_disk(toy_run):
    lines = (toy_run.out_dir / "records.jsonl").read_text().splitlines()
    assert len(lines) == len(toy_run.records)
    first = json.loads(lines[0])
    assert first["env"]["torch"] and first["env"]["config_hash"] and first["run_id"] == "run"


ACCURACY_ONLY = BASE.replace(
    "  throughput: {warmup: 1, rounds: 3, reps: 2}\n  memory: {backward: true}\n",
    "  throughput: {enabled: false}\n  memory: {enabled: false}\n",
)


def test_same_config_and_seed_reproduce_accuracy_records(tmp_path):
    a, b = (_run(tmp_path, ACCURACY_ONLY, name=f"same{i}") for i in range(2))

    def key(result):
        return [(r.variant, r.case_id, r.metric, r.value, r.status, r.seed) for r in result.records]

    assert key(a) == key(b) and len(key(a)) > 10


def test_different_seed_changes_inputs(tmp_path):
    a = _run(tmp_path, ACCURACY_ONLY, "s7")
    b = _run(tmp_path, ACCURACY_ONLY.replace("seed: 7", "seed: 8"), "s8")
    va = [r.value for r in a.records if r.variant == "fused" and r.status == "ok"]
    vb = [r.value for r in b.records if r.variant == "fused" and r.status == "ok"]
    assert va != vb


def test_a_record_cut_by_a_kill_is_skipped_and_the_rest_survive(toy_run, tmp_path):
    from microscope.store.records import read_records

    text = (toy_run.out_dir / "records.jsonl").read_text()
    cut = tmp_path / "records.jsonl"
    cut.write_text(text + '{"run_id": "run", "plugin": "toy_g')
    with pytest.warns(UserWarning, match="last record cut short"):
        assert len(list(read_records(cut))) == len(toy_run.records)
    cut.write_text('{"broken\n' + text)
    with pytest.raises(ValueError, match="records.jsonl:1: not a JSON record"):
        list(read_records(cut))


SWEPT_PLUGIN = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


def scaled(x, factor: float = 1.0, square: bool = False):
    y = x * factor
    return y * y if square else y


@register("sweep_probe")
class SweepProbe(Ablation):
    """x, and x scaled by a swept factor: only factor 1 without squaring is right."""

    variants = {"plain": baseline(lambda x: x.clone()),
                "scaled": candidate(scaled, params={"factor": 1.0, "square": False})}
    cases = grid(n=[33], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-6)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


@pytest.fixture(scope="module")
def sweep_dir(tmp_path_factory):
    folder = tmp_path_factory.mktemp("sweep")
    (folder / "sweep_plugin.py").write_text(SWEPT_PLUGIN)
    return folder


def test_a_swept_parameter_adds_one_variant_per_value_beside_the_declared_one(sweep_dir, tmp_path):
    text = ("plugin: sweep_probe\nplugins: [sweep_plugin.py]\nsweep: {scaled: {factor: [1, 2.0], square: [false]}}\n"
            "dimensions:\n  throughput: {warmup: 1, rounds: 2, reps: 1}\n  memory: {enabled: false}\n")
    cfg = cfgmod.loads(text, str(sweep_dir / "sweep.yaml"))
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=sweep_dir)
    cfgmod.check_against_plugin(cfg, plugin)
    result = Runner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="sweep").run()
    passed = {r.variant: r.passed for r in result.records if r.metric == "out.rel_err"}
    assert passed == {"plain": True, "scaled": True, "scaled[factor=1,square=false]": True,
                      "scaled[factor=2.0,square=false]": False}
    timed = {r.variant for r in result.records if r.metric == "latency_ms" and r.status == "ok"}
    assert timed == set(passed)


def test_sweeps_name_what_is_wrong(sweep_dir):
    plugin = registry.get("sweep_probe", ["sweep_plugin.py"], base_dir=sweep_dir)

    def problems(sweep: str) -> str:
        cfg = cfgmod.loads(f"plugin: sweep_probe\nsweep: {sweep}\n", "ablations/s.yaml")
        with pytest.raises(cfgmod.ConfigError) as err:
            cfgmod.check_against_plugin(cfg, plugin)
        return str(err.value)

    assert "sweep.scaled.factr: variant 'scaled' has no parameter 'factr'; it declares factor, square" in problems(
        "{scaled: {factr: [2.0]}}")
    assert "sweep.plain: the baseline is not swept" in problems("{plain: {factor: [2.0]}}")
    assert "sweep.scaled.square: 'yes' is a str, expected bool" in problems("{scaled: {square: ['yes']}}")
    assert "sweep.scaeld: no variant 'scaeld'; did you mean 'scaled'?" in problems("{scaeld: {factor: [2.0]}}")


def test_a_round_budget_gives_a_slow_variant_fewer_reps_and_keeps_every_round():
    """``round_budget_ms``: a variant whose call takes ~20 ms under a 25 ms budget runs once per round,
    a fast one keeps the configured reps; both time every round (the rounds stay paired)."""
    import time

    from microscope.config import ThroughputConfig
    from microscope.measures import throughput

    calls = {"fast": 0, "slow": 0}

    def fast():
        calls["fast"] += 1

    def slow():
        calls["slow"] += 1
        time.sleep(0.02)

    cfg = ThroughputConfig(warmup=1, rounds=4, reps=5, round_budget_ms=25.0)
    res = throughput.interleaved({"fast": fast, "slow": slow}, cfg, "cpu")
    assert res["fast"].reps == 5 and res["slow"].reps == 1
    assert len(res["fast"].rounds) == len(res["slow"].rounds) == 4
    assert calls == {"fast": 1 + 1 + 4 * 5, "slow": 1 + 1 + 4}  # warm-up, the costing call, the rounds
    plain = throughput.interleaved({"slow": slow}, ThroughputConfig(warmup=0, rounds=1, reps=3), "cpu")
    assert plain["slow"].reps == 3 and len(plain["slow"].samples) == 3


OBJECT_INPUT_PLUGIN = '''
import torch
from dataclasses import dataclass
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


@dataclass
class Packed:
    w: torch.Tensor


@register("object_input_probe")
class ObjectInput(Ablation):
    """x * w where w comes wrapped in an object: the harness cannot rotate it."""

    variants = {"plain": baseline(lambda x, packed: x * packed.w),
                "same": candidate(lambda x, packed: packed.w * x)}
    cases = grid(n=[9], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-6)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device),
                "packed": Packed(randn((case["n"],), case.dtype, gen, device))}

    def reference(self, inputs):
        return inputs["x"] * inputs["packed"].w
'''


def test_timed_calls_that_cannot_rotate_input_sets_say_so_in_their_records(tmp_path):
    """An input the harness cannot copy between sets (an object holding tensors) leaves the timed calls on
    one set, where a memoizing variant goes unseen: the latency records say so and how to fix it."""
    (tmp_path / "object_plugin.py").write_text(OBJECT_INPUT_PLUGIN)
    cfg = cfgmod.loads("plugin: object_input_probe\nplugins: [object_plugin.py]\n"
                       "dimensions:\n  throughput: {warmup: 1, rounds: 2, reps: 1}\n  memory: {enabled: false}\n",
                       str(tmp_path / "o.yaml"))
    plugin = registry.get(cfg.plugin, cfg.plugins, base_dir=tmp_path)
    result = Runner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="o").run()
    (lat,) = _by(result, variant="same", metric="latency_ms")
    assert lat.details["input_sets"] == 1
    assert any("timed on one input set" in n and "plain tensors" in n for n in lat.details["notes"])


NON_DIFFERENTIABLE = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


@register("inference_kernel_probe")
class Probe(Ablation):
    """A differentiable baseline and an inference-only candidate of the same math."""

    variants = {"base": baseline(lambda x: torch.tanh(x)),
                "inference": candidate(lambda x: torch.tanh(x.detach()), differentiable=False)}
    cases = grid(n=[33], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}

    def grad_inputs(self, case):
        return ("x",)
'''


def test_a_non_differentiable_variant_owes_only_its_outputs_when_gradients_are_checked(tmp_path):
    text = ("plugin: inference_kernel_probe\nplugins: [probe.py]\ndimensions:\n  accuracy: {backward: true}\n"
            "  throughput: {warmup: 1, rounds: 3, reps: 1}\n  memory: {enabled: false}\n")
    result = _run_plugin(tmp_path, "probe.py", NON_DIFFERENTIABLE, text, "probe")
    assert not [r for r in result.records if r.status == "failed"]
    assert {r.metric for r in _by(result, variant="inference", dimension="accuracy")} == {"out.rel_err",
                                                                                       "timed_calls.ok"}
    assert {"out.rel_err", "grad_x.rel_err"} <= {r.metric for r in _by(result, variant="base", dimension="accuracy")}


DIFFERENTIABLE_PROBE = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


@register("differentiable_probe")
class Probe(Ablation):
    variants = {"base": baseline(lambda x: torch.tanh(x) * 2), "same": candidate(lambda x: 2 * torch.tanh(x))}
    cases = grid(n=[33, 70], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}

    def grad_inputs(self, case):
        return ("x",)
'''


def test_each_case_draws_its_cotangents_once_and_every_phase_runs_the_checked_backward(tmp_path, monkeypatch):
    """The accuracy check's float64 truth and cotangents serve the timed and the memory calls: no second
    float64 reference (seconds a case at benchmark sizes), and every phase runs the backward that was checked."""
    import microscope.runner as runner_module

    drawn: list[tuple[int, ...]] = []
    seen: list[torch.Tensor] = []
    draw, call = runner_module.cotangents, runner_module.make_call

    def counting(outputs, gen):
        drawn.append(tuple(outputs[0].shape))
        return draw(outputs, gen)

    def recording(variant, inputs, grad_names, backward, cots):
        seen.append(cots[0])
        return call(variant, inputs, grad_names, backward, cots)

    monkeypatch.setattr(runner_module, "cotangents", counting)
    monkeypatch.setattr(runner_module, "make_call", recording)
    text = ("plugin: differentiable_probe\nplugins: [probe.py]\ndimensions:\n  accuracy: {backward: true}\n"
            "  throughput: {warmup: 1, rounds: 2, reps: 1, backward: true}\n  memory: {backward: true}\n")
    result = _run_plugin(tmp_path, "probe.py", DIFFERENTIABLE_PROBE, text, "probe")
    assert not [r for r in result.records if r.status == "failed"]
    assert sorted(drawn) == [(33,), (70,)]
    by_shape: dict[tuple[int, ...], list[torch.Tensor]] = {}
    for cots in seen:
        by_shape.setdefault(tuple(cots.shape), []).append(cots)
    assert sorted(by_shape) == [(33,), (70,)]
    for cots in by_shape.values():  # two variants, timed and memory calls
        assert len(cots) == 4 and all(torch.equal(c, cots[0]) for c in cots)


def test_cpu_peak_counts_allocations_not_views_of_existing_tensors():
    """A Linear's ``weight.t()`` and an input's ``view`` allocate nothing: only the output is counted."""
    w, x = torch.randn(256, 256), torch.randn(8, 256)
    peak, method = memory.peak_bytes(lambda: torch.nn.functional.linear(x, w), "cpu")
    assert method == "cpu_live_tensor_bytes" and peak == 8 * 256 * 4
    assert memory.peak_bytes(lambda: x.view(-1), "cpu")[0] == 0
    assert memory.peak_bytes(lambda: (x * 2).t().contiguous(), "cpu")[0] == 2 * 8 * 256 * 4  # both live at once


SLEEPY = '''
import time
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


def waits(ms):
    def call(x):
        time.sleep(ms / 1e3)
        return torch.tanh(x)
    return call


@register("sleepy_probe")
class Sleepy(Ablation):
    """The same answer, one variant waiting 3x longer: a difference any look decides."""

    variants = {"base": baseline(waits(6)), "quick": candidate(waits(2)), "wrong": candidate(lambda x: x * 0)}
    cases = grid(n=[33], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


def test_sequential_rounds_stop_a_decided_case_and_the_table_judges_it_at_the_per_look_level(tmp_path):
    """rounds: 40 with min_rounds: 8 stops at the first look (a 3x difference), not waiting for the wrong
    candidate; the records say how many rounds ran of how many, and every case's latency row is "faster"
    with its p-value multiplied by the looks, also after Holm over the run's 3 cases x 2 candidates (a
    look decides at the level that correction leaves)."""
    from microscope.stats.run_table import save_run_table

    text = ("plugin: sleepy_probe\nplugins: [sleepy.py]\ncases: {n: [33, 34, 35], dtype: [fp32]}\ndimensions:\n"
            "  throughput: {warmup: 1, rounds: 40, reps: 1, min_rounds: 8}\n  memory: {enabled: false}\n")
    result = _run_plugin(tmp_path, "sleepy.py", SLEEPY, text, "s")
    latencies = _by(result, variant="quick", metric="latency_ms")
    assert len(latencies) == 3
    for lat in latencies:
        seq = lat.details["sequential"]
        assert len(lat.details["rounds"]) == seq["rounds_run"] < 40 and seq["stopped_early"]
        assert seq["looks"] > 1 and seq["max_rounds"] == 40 and seq["family"] == 6
    table = save_run_table(result.out_dir)
    rows = table[(table["candidate"] == "quick") & (table["metric"] == "latency_ms") & (table["vs"] == "baseline")]
    assert list(rows["verdict"]) == ["faster"] * 3 and (rows["p_adj"] < 0.05).all()
    assert all(f"{seq['looks']} looks" in note for note in rows["notes"])


FIGURES = '''
import torch
from microscope.api import Ablation, Figure, Tolerance, baseline, candidate, grid, peer, randn, register


@register("figures_probe")
class Figures(Ablation):
    """tanh, a correct candidate, and a speed-only peer computing something else (exp)."""

    variants = {"base": baseline(lambda x: torch.tanh(x)), "fused": candidate(lambda x: torch.tanh(x) + 0),
                "other_math": peer(lambda x: torch.exp(x), checked=False)}
    cases = grid(n=[33, 64], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}
    fail_on = 64

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}

    def figures(self, case, inputs, device):
        if case["n"] == self.fail_on:
            raise RuntimeError("no recall for this case")
        share = float((inputs["x"] > 0).double().mean())
        return {"base": {"recall": Figure(1.0, "ratio", True)},
                "fused": {"recall": Figure(share, "ratio", True, note="share of positive inputs")},
                "not_in_this_run": {"recall": Figure(0.5)}}
'''


def test_speed_only_peers_and_plugin_figures(tmp_path):
    """A checked=False peer is timed, its accuracy recorded as skipped, and it can be the fastest peer; a
    plugin's figures() become records of the figures dimension and info rows; a figures() that raises
    is one failed record and the case's other measurements stand."""
    from microscope.api import Variant
    from microscope.stats.metrics import SPEED_ONLY
    from microscope.stats.run_table import save_run_table

    text = ("plugin: figures_probe\nplugins: [figures.py]\ndimensions:\n"
            "  throughput: {warmup: 1, rounds: 4, reps: 1}\n  memory: {enabled: false}\n")
    result = _run_plugin(tmp_path, "figures.py", FIGURES, text, "f")
    acc = _by(result, variant="other_math", dimension="accuracy")
    assert acc and all(r.status == "skipped" and r.reason == SPEED_ONLY for r in acc)
    lat = _by(result, variant="other_math", metric="latency_ms")
    assert len(lat) == 2 and all(r.status == "ok" and r.details["speed_only"] for r in lat)
    figs = [r for r in _by(result, dimension="figures") if r.status == "ok"]
    assert {(r.case_id, r.variant) for r in figs} == {("n=33,fp32", "base"), ("n=33,fp32", "fused")}
    (fused,) = [r for r in figs if r.variant == "fused"]
    assert 0 < fused.value < 1 and fused.unit == "ratio" and fused.details["higher_is_better"] is True
    (failed,) = [r for r in _by(result, dimension="figures") if r.status == "failed"]
    assert failed.case_id == "n=64,fp32" and "no recall for this case" in failed.reason
    assert _by(result, case_id="n=64,fp32", variant="fused", metric="latency_ms")[0].status == "ok"
    table = save_run_table(result.out_dir)
    info = table[(table["dimension"] == "figures") & (table["candidate"] == "fused")]
    assert info["verdict"].tolist() == ["info"] and info["ratio_or_delta"].item() == pytest.approx(fused.value)
    best = table[(table["vs"] == "best_peer") & (table["candidate"] == "fused")]
    assert len(best) == 2 and all("speed-only" in n for n in best["notes"])
    from microscope.report.headline import from_comparison

    lines = [h.text for h in from_comparison(table)]
    assert any(t.startswith("fused vs the fastest peer (speed only, different math): other_math") for t in lines)
    assert any(t.startswith("figures() failed in 1 case(s)") for t in lines)
    assert f"fused: recall {fused.value:.3g} vs base 1" in lines
    assert "other_math: timed, accuracy not checked (different math)" in lines
    assert not any("every trial failed" in t for t in lines)  # the hook's failure is not the baseline's
    with pytest.raises(ValueError, match="peers only"):
        Variant(lambda x: x, checked=False)


STUDY = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, peer, randn, register


def _slow_tanh(x):
    for _ in range(20):
        y = torch.tanh(x.double()).float()
    return y


@register("study_probe")
class Study(Ablation):
    """tanh; a correct but slow peer, and an opt-in study variant that skips the work (so it is fastest)."""

    variants = {"base": baseline(lambda x: torch.tanh(x)), "fused": candidate(lambda x: torch.tanh(x) + 0),
                "slow": peer(_slow_tanh),
                "no_work": peer(lambda x: x, checked=False, differentiable=False, opt_in=True)}
    cases = grid(n=[4096], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-7)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


def test_a_study_variant_is_timed_where_named_but_never_the_best_peer(tmp_path):
    """An opt-in variant (the kernel with a stage left out) runs only where ``variants:`` names it; its records
    say ``study``, and the candidate is compared with the fastest usable peer, not with it."""
    from microscope.stats.run_table import save_run_table

    base = ("plugin: study_probe\nplugins: [study.py]\ndimensions:\n"
            "  throughput: {warmup: 1, rounds: 4, reps: 1}\n  memory: {enabled: false}\n")
    plain = _run_plugin(tmp_path, "study.py", STUDY, base, "plain")
    assert not _by(plain, variant="no_work")
    text = base + "variants: [fused, slow, no_work]\nstats: {contrasts: [no_work vs fused]}\n"
    result = _run_plugin(tmp_path, "study.py", STUDY, text, "study")
    (lat,) = _by(result, variant="no_work", metric="latency_ms")
    assert lat.status == "ok" and lat.details["study"] is True and lat.details["speed_only"] is True
    assert not _by(result, variant="slow", metric="latency_ms")[0].details.get("study")
    (fast,) = _by(result, variant="slow", metric="latency_ms")
    assert lat.value < fast.value, "the study variant is the fastest peer by time"
    table = save_run_table(result.out_dir, contrasts=(("no_work", "fused"),))
    best = table[(table["vs"] == "best_peer") & (table["candidate"] == "fused")]
    assert best["baseline"].tolist() == ["slow"] and "(slow, of 1)" in best["notes"].item()
    from microscope.report.headline import SKIPPED_DIMENSION, from_comparison

    headlines = from_comparison(table)
    lines = [h.text for h in headlines]
    assert "no_work: timed, accuracy not checked (different math)" in lines
    assert any(t.startswith("no_work vs fused") and t.endswith("(contrast, not gated)") for t in lines), lines
    assert not [h.text for h in headlines if h.dimension == SKIPPED_DIMENSION]  # it was timed, not left out
