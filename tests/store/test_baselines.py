"""Exact baselines (``microscope.store.baselines`` and ``microscope baseline save | check``) on simulated run
folders: deterministic metrics are saved with a tolerance (never timing), a changed value is named with
both values and the tolerance, and malformed files or foreign devices are errors that say what to fix."""

from __future__ import annotations

import json

import pytest
from history_fixtures import CASE, Night, write_night

from microscope.cli import main
from microscope.store.baselines import BaselineError, BaselineFile, ExactBaseline, baseline_from_runs, check_runs


@pytest.fixture
def two_nights(tmp_path):
    return [write_night(tmp_path / "runs", Night(i)) for i in range(2)]


def test_save_keeps_deterministic_metrics_with_declared_tolerances_and_never_timing(two_nights, tmp_path):
    baseline, notes = baseline_from_runs(two_nights, "nightly")
    keys = {(m.variant, m.dimension, m.metric) for m in baseline.metrics}
    assert keys == {(v, d, m) for v in ("torch", "triton") for d, m in (("accuracy", "out.rel_err"),
                                                                          ("memory", "peak_bytes"))}
    assert baseline.applies_to == {"device": "cuda"} and not notes
    by = {(m.variant, m.metric): m for m in baseline.metrics}
    assert by[("triton", "peak_bytes")].tolerance() == "exact"
    assert by[("triton", "out.rel_err")].rtol == 1e-9 and by[("triton", "out.rel_err")].value == 2.1e-3
    path = baseline.save(tmp_path / "b.json")
    (again,) = BaselineFile.load(path).classes
    assert again.metrics == baseline.metrics and again.recorded["runs"] == [p.name for p in two_nights]


def test_a_metric_that_differs_between_the_runs_is_left_out_by_name(tmp_path):
    runs = [write_night(tmp_path / "runs", Night(i, triton_err=2.1e-3 * (1 + i * 1e-7))) for i in range(2)]
    baseline, notes = baseline_from_runs(runs, "nightly")
    assert ("triton", "out.rel_err") not in {(m.variant, m.metric) for m in baseline.metrics}
    assert any("triton | " + CASE + " | accuracy out.rel_err: left out, not deterministic" in n for n in notes)


def test_check_names_the_metric_both_values_and_the_tolerance(two_nights, tmp_path):
    baseline, _ = baseline_from_runs(two_nights, "nightly")
    report = check_runs(baseline, two_nights)
    assert {c.status for c in report.checks} == {"same"} and not report.differs
    now = 2.1e-3 * (1 + 1e-6)
    drifted = write_night(tmp_path / "later", Night(5, triton_err=now))
    report = check_runs(baseline, [drifted])
    (bad,) = report.differs
    text = bad.describe()
    assert f"safe_softmax | triton | {CASE} | accuracy out.rel_err: baseline 0.0021, now {now!r}" in text
    assert "tolerance rtol 1e-09 (differs)" in text and "difference +2.1e-09" in text
    loose = ExactBaseline(baseline.name, baseline.applies_to,
                          [m if m.metric != "out.rel_err" else type(m)(**{**m.__dict__, "rtol": 1e-5})
                           for m in baseline.metrics])
    report = check_runs(loose, [drifted])
    assert not report.differs and {c.status for c in report.checks} == {"same", "within"}


def test_unmeasured_metrics_and_other_devices_cannot_be_checked(two_nights, tmp_path):
    baseline, _ = baseline_from_runs(two_nights, "nightly")
    failed = write_night(tmp_path / "later", Night(6, failed_triton=True))
    report = check_runs(baseline, [failed])
    assert {c.status for c in report.unmeasured} == {"failed"} and not report.differs
    cpu = ExactBaseline("cpu", {"device": "cpu"}, baseline.metrics, path=tmp_path / "cpu.json")
    report = check_runs(cpu, two_nights)
    assert report.problems and "holds values for cpu;" in report.problems[0] and "ran on cuda" in report.problems[0]


def _cpu_night(folder, index: int, capability: str, err: float = 2.1e-3):
    env = {"device_name": "cpu", "cpu_model": "AMD EPYC", "cpu_capability": capability, "host_cpus": 2}
    return write_night(folder, Night(index, env=env, device="cpu", triton_err=err))


def test_one_file_holds_each_cpu_class_and_a_check_uses_the_runs_class(tmp_path):
    """The last bits of CPU numerics follow the SIMD level, so each level keeps its own values."""
    avx2 = [_cpu_night(tmp_path / "avx2", i, "AVX2") for i in range(2)]
    avx512 = [_cpu_night(tmp_path / "avx512", i, "AVX512", err=2.1e-3 * (1 + 4e-2)) for i in range(2)]
    path = tmp_path / "nightly_cpu.json"
    for runs in (avx2, avx512, avx2):  # saving a class again replaces it, keeping the other
        baseline, _ = baseline_from_runs(runs, "nightly_cpu")
        baseline.save(path)
    held = BaselineFile.load(path)
    assert [c.applies_to for c in held.classes] == [
        {"device": "cpu", "cpu_capability": "AVX512", "cpu_model": "AMD EPYC"},
        {"device": "cpu", "cpu_capability": "AVX2", "cpu_model": "AMD EPYC"}]
    for runs in (avx2, avx512):
        report = check_runs(held, runs)
        assert not report.problems and not report.differs and {c.status for c in report.checks} == {"same"}
    assert check_runs(held.classes[1], avx512).problems  # one class alone refuses runs of another
    other = _cpu_night(tmp_path / "neon", 3, "DEFAULT")
    (problem,) = check_runs(held, [other]).problems
    assert ("holds values for cpu (cpu_capability AVX512, cpu_model AMD EPYC); "
            "cpu (cpu_capability AVX2, cpu_model AMD EPYC)") in problem
    assert "ran on cpu (cpu_capability DEFAULT, cpu_model AMD EPYC)" in problem
    # the same SIMD level on another CPU is another class: its last bits are its own
    intel = write_night(tmp_path / "intel", Night(4, device="cpu", env={
        "device_name": "cpu", "cpu_model": "Intel(R) Xeon(R) Processor", "cpu_capability": "AVX512", "host_cpus": 2}))
    (problem,) = check_runs(held, [intel]).problems
    assert "ran on cpu (cpu_capability AVX512, cpu_model Intel(R) Xeon(R) Processor)" in problem
    assert "microscope baseline save RUN_DIR nightly_cpu" in problem
    with pytest.raises(BaselineError, match="a baseline's values hold for one class"):
        baseline_from_runs([avx2[0], avx512[0]], "mixed")


def test_a_version_1_file_is_one_class_that_applies_to_every_cpu_level(two_nights, tmp_path):
    runs = [_cpu_night(tmp_path / "runs", i, "AVX512") for i in range(2)]
    baseline, _ = baseline_from_runs(runs, "old")
    data = {"format": "microscope-exact-baseline", "version": 1, "name": "old", "applies_to": {"device": "cpu"},
            "recorded": {}, "metrics": [m.__dict__ for m in baseline.metrics]}
    path = tmp_path / "old.json"
    path.write_text(json.dumps(data))
    report = check_runs(BaselineFile.load(path), runs)
    assert not report.problems and {c.status for c in report.checks} == {"same"}


@pytest.mark.parametrize("text, message", [
    ("{not json", "not JSON"),
    ('{"format": "something-else"}', "not a microscope exact baseline (field 'format'"),
    ('{"format": "microscope-exact-baseline", "version": 7}',
     "field 'version' is 7; this microscope reads versions 1 and 2"),
    ('{"format": "microscope-exact-baseline", "version": 1, "applies_to": {}}', "field 'applies_to.device'"),
    ('{"format": "microscope-exact-baseline", "version": 1, "applies_to": {"device": "cpu"}, "metrics": []}',
     "field 'metrics' must be a non-empty list"),
    ('{"format": "microscope-exact-baseline", "version": 1, "applies_to": {"device": "cpu"}, "metrics": '
     '[{"plugin": "p", "variant": "v", "case": "c", "dimension": "throughput", "metric": "latency_ms", '
     '"value": 1}]}', "metrics[0]: dimension 'throughput' is never exact"),
    ('{"format": "microscope-exact-baseline", "version": 1, "applies_to": {"device": "cpu"}, "metrics": '
     '[{"plugin": "p", "variant": "v", "case": "c", "dimension": "accuracy", "metric": "e", "value": 1, '
     '"rtol": -1}]}', "metrics[0]: field 'rtol' must be >= 0"),
    ('{"format": "microscope-exact-baseline", "version": 1, "applies_to": {"device": "cpu"}, "metrics": '
     '[{"plugin": "p", "variant": "v", "case": "c", "dimension": "accuracy", "metric": "e", "value": "x"}]}',
     "metrics[0]: field 'value' must be a finite number"),
])
def test_malformed_baseline_files_name_the_file_and_field(tmp_path, text, message):
    path = tmp_path / "bad.json"
    path.write_text(text)
    with pytest.raises(BaselineError) as err:
        BaselineFile.load(path)
    assert str(path) in str(err.value) and message in str(err.value)


def test_cli_save_and_check_exit_codes(two_nights, tmp_path, capsys):
    target = tmp_path / "base" / "nightly.json"
    assert main(["baseline", "save", *map(str, two_nights), str(target)]) == 0
    out = capsys.readouterr().out
    assert "saved" in out and "4 deterministic metric(s) of 1 plugin(s), for machine class cuda" in out
    assert main(["baseline", "check", str(two_nights[0]), "--exact", str(target)]) == 0
    assert "4 metric(s) checked" in capsys.readouterr().out
    drifted = write_night(tmp_path / "later", Night(7, triton_peak=268_435_456.0 + 512))
    assert main(["baseline", "check", str(drifted), "--exact", str(target)]) == 1
    out = capsys.readouterr().out
    assert "differs: safe_softmax | triton" in out and "peak_bytes: baseline 268435456, now 268435968" in out
    assert "tolerance exact" in out
    assert main(["baseline", "check", str(tmp_path / "nowhere"), "--exact", str(target)]) == 2
    assert "neither a run folder" in capsys.readouterr().err
    data = json.loads(target.read_text())
    data["classes"][0]["applies_to"]["device"] = "tpu"
    target.write_text(json.dumps(data))
    assert main(["baseline", "check", str(two_nights[0]), "--exact", str(target)]) == 2
    assert "field 'classes[0].applies_to.device'" in capsys.readouterr().err
    assert main(["baseline", "save", str(two_nights[0])]) == 2
    assert "then a NAME" in capsys.readouterr().err
