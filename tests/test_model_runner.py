"""The model-level runner: fair arms (same weights, data, seeds), isolated failures, honest records.

One tiny workload (a 2-block model of width 32, 6 steps, 512 evaluated tokens) keeps every run to a
few seconds; the arms below are built to break in known ways.
"""

from __future__ import annotations

import json
import math

import pytest
import torch

from microscope import cli
from microscope import config as cfgmod
from microscope.api import Ablation, Arm, Role, register
from microscope.model_runner import ModelRunner
from microscope.report.model_console import model_summary_table
from microscope.stats import compare_records
from microscope.store.records import read_records, records_frame
from microscope.workloads import eager_attention

WORKLOAD = """
workload:
  seeds: 2
  steps: 6
  batch_size: 4
  eval_tokens: 512
  decode_tokens: 2
  model: {d_model: 32, n_heads: 2, context: 32}
  corpus: {max_bytes: 1000000}
"""


def _drop_causal_mask(model) -> None:
    """The classic broken patch: attention that ignores ``causal`` and reads future tokens."""
    model.set_attention(lambda q, k, v, causal: eager_attention(q, k, v, causal=False))


def _drifting_attention(model) -> None:
    """Causal attention whose output drifts by float32 units on every call, as atomic split-K sums do."""
    gen = torch.Generator().manual_seed(11)

    def attend(q, k, v, causal):
        o = eager_attention(q, k, v, causal)
        return o * (1 + 1e-4 * torch.randn(o.shape, generator=gen))
    model.set_attention(attend)


def _raise(model) -> None:
    raise RuntimeError("patch exploded on purpose")


def _nan_activation(model) -> None:
    for block in model.blocks:
        block.mlp.act = lambda x: x * math.nan


@register("toy_model_arms")
class ToyModelArms(Ablation):
    """Test plugin: a genuine recipe change, three broken arms and a nondeterministic one."""

    arms = {
        "base": Arm(Role.BASELINE, "the workload as is"),
        "lower_lr": Arm(description="a genuine change: half the learning rate", recipe={"lr": 1.5e-3}),
        "leaky": Arm(description="drops the causal mask", patch=_drop_causal_mask),
        "raises": Arm(description="its patch raises", patch=_raise),
        "drifting": Arm(description="causal, but not bitwise repeatable", patch=_drifting_attention,
                        inference_only=True),
        "nan": Arm(description="NaN activations: the loss is NaN from the first step", patch=_nan_activation),
    }


def _run(tmp_path, extra: str = "", name: str = "run", task: str = "lm", workload_line: str = ""):
    more = f"\n  {workload_line}" if workload_line else ""
    workload = WORKLOAD.replace("seeds: 2", f"seeds: 2\n  task: {task}{more}")
    text = f"plugin: toy_model_arms\nlevel: model\nseed: 3\n{workload}{extra}"
    cfg = cfgmod.loads(text, "toy_model.yaml")
    plugin = ToyModelArms()
    cfgmod.check_against_plugin(cfg, plugin)
    return ModelRunner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id=name).run()


@pytest.fixture(scope="module")
def toy_run(tmp_path_factory):
    return _run(tmp_path_factory.mktemp("model"))


def _by(result, **match):
    return [r for r in result.records if all(getattr(r, k) == v for k, v in match.items())]


def _one(result, **match):
    found = _by(result, **match)
    assert len(found) == 1, (match, len(found))
    return found[0]


def test_every_record_carries_the_runner_fields_and_the_corpus_hash(toy_run):
    on_disk = list(read_records(toy_run.out_dir))
    assert len(on_disk) == len(toy_run.records) > 0
    sha = toy_run.records[0].env["corpus_hash"]
    assert isinstance(sha, str) and len(sha) == 64
    for r in toy_run.records:
        assert r.plugin == "toy_model_arms" and r.case_id == "profile=tiny,task=lm"
        assert r.device == "cpu" and r.interpreted is False and r.env["corpus_hash"] == sha
        assert r.role == ("baseline" if r.variant == "base" else "candidate")
    dims = {r.dimension for r in _by(toy_run, variant="base", status="ok")}
    assert dims == {"accuracy", "stability", "generalization", "throughput", "memory"}
    assert len(_by(toy_run, variant="base", metric="train_step_peak_bytes")) == 1  # memory: once per arm


def test_identical_initial_weights_across_arms_and_distinct_across_seeds(toy_run):
    by_seed: dict[int, set[str]] = {}
    for r in toy_run.records:
        if r.variant in ("base", "lower_lr", "leaky") and "init_sha256" in r.details:
            by_seed.setdefault(r.seed, set()).add(r.details["init_sha256"])
            assert r.details["same_init_as_baseline"] is True
    assert len(by_seed) == 2 and all(len(shas) == 1 for shas in by_seed.values())
    assert len(set.union(*by_seed.values())) == 2


def test_training_is_deterministic_through_the_runner(toy_run, tmp_path):
    again = _run(tmp_path, "variants: [lower_lr]\ndimensions: {throughput: {enabled: false}, "
                           "memory: {enabled: false}}\n", name="again")
    for arm in ("base", "lower_lr"):
        first = {r.seed: r.details["curve"] for r in _by(toy_run, variant=arm, metric="final_loss")}
        second = {r.seed: r.details["curve"] for r in _by(again, variant=arm, metric="final_loss")}
        assert first == second and len(first) == 2
    assert not _by(again, variant="leaky")  # the variants subset keeps the baseline, drops the rest
    base = {r.seed: r.details["curve"] for r in _by(toy_run, variant="base", metric="final_loss")}
    lower = {r.seed: r.details["curve"] for r in _by(toy_run, variant="lower_lr", metric="final_loss")}
    assert all(base[s][0] == lower[s][0] for s in base)  # same weights and first batch: same first loss
    assert all(base[s] != lower[s] for s in base)


def test_dropped_causal_mask_fails_the_future_leak_check(toy_run):
    for seed_rec in _by(toy_run, variant="base", metric="future_leak"):
        assert seed_rec.status == "ok" and seed_rec.passed is True and seed_rec.value == 0.0
    leaks = _by(toy_run, variant="leaky", metric="future_leak")
    assert len(leaks) == 2
    for r in leaks:
        assert r.status == "ok" and r.passed is False and r.value > 1e-3
        assert "future tokens" in r.reason
        assert r.details["repeat_noise"] == 0.0 and r.details["allowed"] == r.details["tolerance"]
    table = compare_records(records_frame(toy_run.out_dir))
    row = table[(table.metric == "future_leak") & (table.candidate == "leaky")].iloc[0]
    assert row.verdict == "fail"


def test_a_nondeterministic_causal_arm_passes_the_future_leak_check(toy_run):
    """Its earlier logits change when later tokens change, but no more than when nothing changes."""
    checks = _by(toy_run, variant="drifting", metric="future_leak")
    assert len(checks) == 2
    for r in checks:
        assert r.passed is True and r.reason is None
        assert 1e-6 < r.value <= r.details["allowed"] == 1e-6 + 4 * r.details["repeat_noise"]


def test_raising_patch_is_recorded_failed_while_the_other_arms_succeed(toy_run):
    failed = _by(toy_run, variant="raises")
    assert failed and all(r.status == "failed" and r.value is None for r in failed)
    assert all("patch exploded on purpose" in r.reason for r in failed)
    assert {r.dimension for r in failed} == {"accuracy", "stability", "generalization", "throughput", "memory"}
    for arm in ("base", "lower_lr", "leaky"):
        assert all(r.status == "ok" for r in _by(toy_run, variant=arm)), arm


def test_nan_loss_is_a_recorded_failure_with_its_stability_evidence(toy_run):
    for r in _by(toy_run, variant="nan", metric="final_loss"):
        assert r.status == "failed" and "non-finite from step 0" in r.reason
        assert len(r.details["curve"]) == 6
    for r in _by(toy_run, variant="nan", metric="nonfinite_steps"):
        assert r.status == "ok" and r.value == 6
    for r in _by(toy_run, variant="nan", metric="val_loss"):
        assert r.status == "failed" and "training diverged" in r.reason


def test_ood_and_long_context_evaluations_use_other_data_and_lengths(toy_run):
    seed = toy_run.records[0].seed
    val = _one(toy_run, variant="base", seed=seed, metric="val_loss").details
    ood = _one(toy_run, variant="base", seed=seed, metric="ood_loss").details
    x2 = _one(toy_run, variant="base", seed=seed, metric="val_loss_2x").details
    x4 = _one(toy_run, variant="base", seed=seed, metric="val_loss_4x").details
    assert (val["split"], ood["split"]) == ("val", "ood")
    assert ood["data_sha256"] != val["data_sha256"]
    assert (val["seq_len"], x2["seq_len"], x4["seq_len"]) == (32, 64, 128)
    assert val["n_tokens"] == x2["n_tokens"] == x4["n_tokens"] == ood["n_tokens"] == 512
    assert (val["n_windows"], x2["n_windows"], x4["n_windows"]) == (16, 8, 4)
    assert len(val["per_token"]) == len(x4["per_token"]) == len(ood["per_token"]) == 512
    assert val["per_token"] != ood["per_token"]


def test_stats_pair_val_loss_per_token_and_treat_stability_as_distributions(toy_run):
    table = compare_records(records_frame(toy_run.out_dir))
    cand = table[table.candidate == "lower_lr"]
    val = cand[cand.metric == "val_loss"].iloc[0]
    assert val.n == 2 and "the training run is the unit" in val.notes  # each arm trained its own model
    per_seed = {}
    for arm in ("base", "lower_lr"):
        for r in _by(toy_run, variant=arm, metric="val_loss"):
            per_seed.setdefault(r.seed, {})[arm] = sum(r.details["per_token"]) / len(r.details["per_token"])
    deltas = [v["lower_lr"] - v["base"] for v in per_seed.values()]
    assert val.ratio_or_delta == pytest.approx(sum(deltas) / len(deltas), rel=1e-5)
    acc = cand[cand.metric == "val_token_acc"].iloc[0]
    assert acc.n == 2 and "higher is better" in acc.notes
    for metric in ("final_loss", "grad_norm_cv", "loss_spikes", "steps_to_baseline_loss", "ood_loss"):
        row = cand[cand.metric == metric].iloc[0]
        assert row.n == 2 and "over seeds" in row.notes, metric
    raised = table[(table.candidate == "raises") & (table.metric == "val_loss")].iloc[0]
    assert raised.verdict == "failed"


def test_recall_task_scores_fresh_sequences_at_1x_2x_and_4x_context(tmp_path):
    result = _run(tmp_path, "variants: [lower_lr]\ndimensions: {throughput: {enabled: false}, "
                            "memory: {enabled: false}}\n", name="recall", task="recall")
    assert not result.failed
    base = {r.metric: r for r in _by(result, variant="base") if r.dimension in ("accuracy", "generalization")}
    assert set(base) == {"future_leak", "recall_loss", "recall_acc", "recall_loss_2x", "recall_loss_4x",
                         "recall_acc_2x", "recall_acc_4x", "decode_loss", "decode_ppl", "greedy_agreement"}
    assert [base[m].details["seq_len"] for m in ("recall_acc", "recall_acc_2x", "recall_acc_4x")] == [32, 64, 128]
    assert all(len(base[m].details["per_example"]) == 256 for m in base if m.startswith("recall"))
    assert result.records[0].env["corpus"]["kind"] == "associative_recall"
    table = compare_records(records_frame(result.out_dir))
    row = table[(table.metric == "recall_loss") & (table.candidate == "lower_lr")].iloc[0]
    assert row.n == 2 and "paired per token within each seed" in row.notes


def test_longer_contexts_left_out_are_skipped_records_that_say_why(tmp_path):
    """``workload.longer_contexts: [2]`` evaluates at 1x and 2x only (eager attention at 4x may not fit); the
    4x metrics are skipped records naming the field, and the 2x losses are the ones of a full run."""
    quiet = "dimensions: {throughput: {enabled: false}, memory: {enabled: false}}\n"
    short = _run(tmp_path, "variants: [lower_lr]\n" + quiet, name="short", workload_line="longer_contexts: [2]")
    full = _run(tmp_path, "variants: [lower_lr]\n" + quiet, name="full")
    for name in ("base", "lower_lr"):
        records = [r for r in _by(short, variant=name) if r.dimension == "generalization"]
        assert len(records) == 2 * 4  # 2 seeds
        assert {(r.metric, r.status) for r in records} == {("ood_loss", "ok"), ("ood_gap", "ok"),
                                                           ("val_loss_2x", "ok"), ("val_loss_4x", "skipped")}
        for r in records:
            if r.metric == "val_loss_4x":
                assert r.reason == "not evaluated: workload.longer_contexts is [2]" and r.value is None
            if r.metric == "val_loss_2x":  # the budget is rounded to the longest evaluated length, 2x not 4x
                two = _one(full, variant=name, seed=r.seed, metric="val_loss_2x")
                assert r.details["n_tokens"] >= two.details["n_tokens"]
    recall = _run(tmp_path, "variants: [lower_lr]\n" + quiet, name="recall", task="recall",
                  workload_line="longer_contexts: []")
    statuses = {r.metric: r.status for r in _by(recall, variant="base") if r.dimension == "generalization"}
    assert set(statuses.values()) == {"skipped"} and set(statuses) == {"recall_loss_2x", "recall_loss_4x",
                                                                       "recall_acc_2x", "recall_acc_4x"}


def test_a_longer_context_other_than_2_or_4_is_a_config_error():
    with pytest.raises(cfgmod.ConfigError) as err:
        cfgmod.loads("plugin: toy_model_arms\nlevel: model\nworkload:\n  longer_contexts: [3]\n", "toy.yaml")
    assert "toy.yaml:4: workload.longer_contexts[0]: 3 is not one of 2, 4" in str(err.value)


def test_model_summary_table_lists_every_arm_with_its_seed_means(toy_run):
    from rich.console import Console

    console = Console(width=250, record=True)
    console.print(model_summary_table(toy_run.records, title="toy"))
    text = console.export_text()
    for word in ("base", "lower_lr", "leaky", "raises", "final loss", "val loss", "OOD loss", "train tok/s",
                 "train peak MiB", "spikes", "patch exploded on purpose", "future tokens"):
        assert word in text, word


def test_cli_run_picks_the_model_runner_for_a_model_level_config(tmp_path, capsys):
    config = tmp_path / "gc.yaml"
    config.write_text("plugin: grad_checkpoint\nlevel: model\nseed: 1\nvariants: [every_1]\n"
                      "dimensions: {throughput: {enabled: false}}\n" + WORKLOAD.replace("seeds: 2", "seeds: 1"))
    code = cli.main(["run", str(config), "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress",
                     "--no-report", "--verbose"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "final loss" in out and "train peak MiB" in out and "saved act MiB" in out and "every_1" in out
    records = [json.loads(line) for line in next((tmp_path / "out").glob("*/records.jsonl")).read_text().splitlines()]
    peaks = {r["variant"]: r["value"] for r in records if r["metric"] == "train_step_peak_bytes"}
    assert peaks["every_1"] < peaks["none"]  # checkpointing every block stores fewer activations
    saved = {r["variant"]: r["value"] for r in records if r["metric"] == "saved_activation_bytes"}
    assert 0 < saved["every_1"] < saved["none"] / 2  # it keeps each block's input, not what the block computes
    curves = {r["variant"]: r["details"]["curve"] for r in records if r["metric"] == "final_loss"}
    assert curves["every_1"] == curves["none"]  # recomputation is exact


def test_a_contrast_compares_two_arms_in_the_saved_table_and_the_console(tmp_path, capsys):
    config = tmp_path / "gc.yaml"
    config.write_text("plugin: grad_checkpoint\nlevel: model\nseed: 1\nvariants: [every_1, every_2]\n"
                      "stats: {contrasts: [every_1 vs every_2]}\n"
                      "dimensions: {throughput: {enabled: false}}\n" + WORKLOAD)
    code = cli.main(["run", str(config), "--device", "cpu", "--out", str(tmp_path / "out"), "--no-progress",
                     "--no-report"])
    out = capsys.readouterr().out
    assert code == 0, out
    import pandas as pd

    table = pd.read_csv(next((tmp_path / "out").glob("*/comparison.csv")))
    contrast = table[table["vs"] == "contrast"]
    assert set(contrast["candidate"]) == {"every_1"} and set(contrast["baseline"]) == {"every_2"}
    assert not contrast["gated"].any()
    memory = contrast[contrast["metric"] == "saved_activation_bytes"].iloc[0]
    assert memory["verdict"] == "less" and memory["ratio_or_delta"] < 1  # every block keeps less than every other
    loss = contrast[contrast["metric"] == "val_loss"].iloc[0]
    assert loss["ratio_or_delta"] == 0 and loss["verdict"] != "worse"  # recomputation is exact
    assert "every_1 vs every_2" in out


def test_saved_activation_bytes_are_the_activations_alone():
    """The activation memory grows with the batch and holds no parameter: doubling the rows doubles it."""
    import contextlib

    from microscope.model_measures import saved_activation_bytes
    from microscope.workloads import ModelConfig, build_model

    model = build_model(ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32))
    gen = torch.Generator().manual_seed(0)
    saved = [saved_activation_bytes(model, (torch.randint(0, 256, (b, 32), generator=gen),
                                            torch.randint(0, 256, (b, 32), generator=gen)), contextlib.nullcontext())
             for b in (4, 8)]
    assert 1.98 < saved[1] / saved[0] <= 2.0  # with the ~0.5 MB of weights counted, it would be ~1.8


def _half_scale_cache(model) -> None:
    """An inference-only change with a visible effect: decode steps attend with half the softmax scale."""
    from microscope.workloads import KVCache

    class HalfScale(KVCache):
        def attend(self, layer, q, k, v, attn_fn):
            k_all, v_all = self.append(layer, k, v)
            if k_all.shape[-2] == q.shape[-2]:
                return attn_fn(q, k_all, v_all, True)
            return eager_attention(q, k_all, v_all, False, scale=0.5 / q.shape[-1] ** 0.5)

    model.cache_cls = HalfScale


@register("toy_inference_arms")
class ToyInferenceArms(Ablation):
    """Test plugin: inference-only arms reuse the baseline's trained weights."""

    arms = {
        "base": Arm(Role.BASELINE, "the workload as is"),
        "half_scale": Arm(description="decode with half the softmax scale", patch=_half_scale_cache,
                          inference_only=True),
        "same_cache": Arm(description="no change at all", inference_only=True),
    }


def test_inference_only_arms_reuse_the_baseline_weights_and_show_only_the_decode_change(tmp_path):
    text = f"plugin: toy_inference_arms\nlevel: model\nseed: 1\n{WORKLOAD}"
    cfg = cfgmod.loads(text.replace("decode_tokens: 2", "decode_tokens: 6\n  margin: 0.02"), "toy_inference.yaml")
    plugin = ToyInferenceArms()
    result = ModelRunner(plugin, cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="inf").run()
    assert not result.failed
    for arm in ("half_scale", "same_cache"):
        trained = _by(result, variant=arm, metric="final_loss")
        assert len(trained) == 2 and {r.status for r in trained} == {"skipped"}
        assert "reuses the baseline's trained weights" in trained[0].reason
    for seed in {r.seed for r in _by(result, variant="base", metric="val_loss")}:
        base = _one(result, variant="base", seed=seed, metric="val_loss").details["per_token"]
        for arm in ("half_scale", "same_cache"):  # the full forward never touches the cache: identical
            assert _one(result, variant=arm, seed=seed, metric="val_loss").details["per_token"] == base
        same = _one(result, variant="same_cache", seed=seed, metric="decode_loss")
        assert same.details["per_token"] == _one(result, variant="base", seed=seed, metric="decode_loss").details[
            "per_token"]
        assert _one(result, variant="same_cache", seed=seed, metric="greedy_agreement").value == 1.0
        changed = _one(result, variant="half_scale", seed=seed, metric="decode_loss")
        assert changed.value != _one(result, variant="base", seed=seed, metric="decode_loss").value
        assert len(changed.details["per_token"]) == changed.details["n_tokens"] == 8 * 16
    table = compare_records(records_frame(result.out_dir))
    row = table[(table.metric == "decode_loss") & (table.candidate == "same_cache")].iloc[0]
    assert row.ratio_or_delta == 0 and row.n == 2 * 8 * 16  # shared weights: tokens pooled over seeds
    changed = table[(table.metric == "decode_loss") & (table.candidate == "half_scale")].iloc[0]
    assert changed.n == 2 * 8 * 16 and "paired-bootstrap" in changed.notes
    agreement = table[(table.metric == "greedy_agreement") & (table.candidate == "same_cache")].iloc[0]
    assert agreement.verdict != "info" and agreement.ratio_or_delta == 0  # shared weights: a real test
    for arm in ("half_scale", "same_cache"):  # no training, so no train step to measure: skipped, not failed
        (step,) = {r.status: r for r in _by(result, variant=arm, metric="train_step_peak_bytes")}.values()
        assert step.status == "skipped" and "no train step" in step.reason
        weights = _by(result, variant=arm, metric="weight_bytes")
        assert weights and all(r.status == "ok" and r.value > 0 for r in weights)
    ppl = _by(result, variant="base", metric="val_ppl")[0]
    loss = _one(result, variant="base", seed=ppl.seed, metric="val_loss")
    assert loss.details["margin"] == 0.02  # the loss margin, carried over to perplexity units
    assert ppl.details["margin"] == pytest.approx(ppl.value * math.expm1(0.02))


def test_inference_only_arm_fails_visibly_when_its_baseline_did_not_train(tmp_path):
    @register("toy_inference_broken_base")
    class BrokenBase(Ablation):
        arms = {"base": Arm(Role.BASELINE, "diverges", patch=_nan_activation),
                "reuse": Arm(description="needs the baseline's weights", inference_only=True)}

    cfg = cfgmod.loads(f"plugin: toy_inference_broken_base\nlevel: model\n{WORKLOAD}", "broken.yaml")
    result = ModelRunner(BrokenBase(), cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="b").run()
    reused = _by(result, variant="reuse", metric="val_loss")
    assert reused and all(r.status == "failed" and "left no trained weights" in r.reason for r in reused)


_CALIBRATION_SEEN: list[tuple[int, tuple[int, ...], torch.dtype, int]] = []


def _halve_head(model, batches) -> None:  # noqa: ANN001 - an Arm calibrate step
    """Changes the model: a weight load after it would undo the change, so a changed loss shows the order."""
    _CALIBRATION_SEEN.append((len(batches), tuple(batches[0].shape), batches[0].dtype, int(batches[0].max())))
    with torch.no_grad():
        model.lm_head.weight.mul_(0.5)


def test_a_calibrate_step_runs_on_the_trained_weights_with_training_batches(tmp_path):
    from microscope.api import CALIBRATION_BATCHES

    @register("toy_calibrated_arm")
    class Calibrated(Ablation):
        arms = {"base": Arm(Role.BASELINE, "the workload as is"),
                "calibrated": Arm(description="halves the output head once trained", calibrate=_halve_head,
                                  inference_only=True)}

    _CALIBRATION_SEEN.clear()
    cfg = cfgmod.loads(f"plugin: toy_calibrated_arm\nlevel: model\nseed: 1\n{WORKLOAD}", "calibrated.yaml")
    result = ModelRunner(Calibrated(), cfg, device="cpu", interpreted=False, out_root=tmp_path, run_id="c").run()
    assert not result.failed
    assert _CALIBRATION_SEEN and all(seen[0] == CALIBRATION_BATCHES and len(seen[1]) == 2 and seen[2] == torch.long
                                     and seen[3] > 0 for seen in _CALIBRATION_SEEN)
    for rec in _by(result, variant="calibrated", metric="val_loss"):
        assert "training tokens after loading the trained weights" in rec.details["calibration"]
        assert rec.value != _one(result, variant="base", seed=rec.seed, metric="val_loss").value  # not undone
    with pytest.raises(ValueError, match="needs inference_only=True"):
        Arm(calibrate=_halve_head)


def test_an_inference_only_baseline_is_refused_at_registration():
    with pytest.raises(TypeError, match="cannot be inference_only"):
        @register("toy_inference_only_baseline")
        class Bad(Ablation):
            arms = {"base": Arm(Role.BASELINE, inference_only=True), "other": Arm()}


def test_greedy_agreement_is_tested_only_between_shared_weights(toy_run):
    table = compare_records(records_frame(toy_run.out_dir))
    separate = table[(table.metric == "greedy_agreement") & (table.candidate == "lower_lr")].iloc[0]
    assert separate.verdict == "info" and "training noise" in separate.notes
