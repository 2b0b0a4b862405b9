"""The command line end to end: run, validate, list, and their exit codes."""

from __future__ import annotations

import json
import textwrap

import pytest

from microscope.cli import main

OUTSIDE_PLUGIN = textwrap.dedent('''
    import torch
    from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register

    def broken(x):
        raise ValueError("deliberately broken")

    @register("cli_softplus")
    class Softplus(Ablation):
        """Softplus written out vs torch's."""
        variants = {"torch": baseline(torch.nn.functional.softplus),
                    "written": candidate(lambda x: torch.log1p(torch.exp(-x.abs())) + x.clamp(min=0)),
                    "broken": candidate(broken)}
        cases = grid(n=[7, 130], dtype=["fp32"])
        tolerance = {"*": Tolerance(rtol=1e-5, atol=1e-6)}

        def inputs(self, case, gen, device):
            return {"x": randn((4, case["n"]), case.dtype, gen, device, scale=5)}

        def grad_inputs(self, case):
            return ("x",)
''')


@pytest.fixture(scope="module")
def plugin_dir(tmp_path_factory):
    """One folder outside the repository holding the plugin file (loaded once per test session)."""
    folder = tmp_path_factory.mktemp("outside")
    (folder / "softplus_plugin.py").write_text(OUTSIDE_PLUGIN)
    return folder


def _write(folder, config: str, name: str = "softplus.yaml"):
    path = folder / name
    path.write_text(config)
    return path


CONFIG = """
plugin: cli_softplus
plugins: [softplus_plugin.py]
dimensions:
  throughput: {warmup: 1, rounds: 2, reps: 2}
quick:
  cases: {n: [7]}
"""


def test_run_prints_the_table_and_exits_1_when_a_trial_failed(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG)
    code = main(["run", str(path), "--device", "cpu", "--no-progress", "--out", str(tmp_path / "res"),
                 "--reports", str(tmp_path / "reports")])
    out = capsys.readouterr().out
    assert code == 1
    assert "cli_softplus" in out and "written" in out and "deliberately broken" in out
    runs = list((tmp_path / "res").iterdir())
    records = [json.loads(line) for line in (runs[0] / "records.jsonl").read_text().splitlines()]
    ok = [r for r in records if r["variant"] == "written" and r["dimension"] == "accuracy"]
    assert len(ok) == 4 and all(r["passed"] for r in ok)  # out + grad_x for two cases
    assert (runs[0] / "config.yaml").read_text() == CONFIG


def test_quick_and_seed_flags(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG + "variants: [written]\n", "quick.yaml")
    main(["run", str(path), "--device", "cpu", "--no-progress", "--quick", "--seed", "5",
          "--out", str(tmp_path / "res"), "--reports", str(tmp_path / "reports")])
    run = next((tmp_path / "res").iterdir())
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    assert {r["case_id"] for r in records} == {"n=7,fp32"}
    assert {r["variant"] for r in records} == {"torch", "written"}  # the baseline always runs
    assert {r["seed"] for r in records} != {0} and "seed 5" in capsys.readouterr().out


def test_validate_reports_problems_and_exits_2(plugin_dir, capsys):
    path = _write(plugin_dir, CONFIG.replace("rounds: 2", "roundz: 2"), "typo.yaml")
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert "typo.yaml:5: dimensions.throughput.roundz: unknown key; did you mean 'rounds'?" in out


def test_run_with_bad_config_exits_2_before_running(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG.replace("cli_softplus", "cli_softplux"), "unknown.yaml")
    assert main(["run", str(path), "--device", "cpu", "--out", str(tmp_path / "res")]) == 2
    err = capsys.readouterr().err
    assert "no plugin named 'cli_softplux'. Did you mean 'cli_softplus'" in err
    assert not (tmp_path / "res").exists()


def test_list_shows_builtin_plugins(capsys):
    assert main(["list"]) == 0
    assert "flash_attn" in capsys.readouterr().out


def test_set_overrides_nested_fields_and_reports_typos(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG, "set.yaml")
    args = ["run", str(path), "--device", "cpu", "--no-progress", "--no-report", "--out", str(tmp_path / "res")]
    main(args + ["--set", "dimensions.throughput.rounds=3", "cases.n=[7]", "variants=[written]"])
    run = next((tmp_path / "res").iterdir())
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines()]
    latency = [r for r in records if r["metric"] == "latency_ms"]
    assert {r["case_id"] for r in records} == {"n=7,fp32"} and len(latency[0]["details"]["rounds"]) == 3
    capsys.readouterr()
    assert main(args + ["--set", "dimensions.throughput.roundz=3"]) == 2
    assert "dimensions.throughput.roundz: unknown key; did you mean 'rounds'?" in capsys.readouterr().err


def test_report_computes_the_statistics_a_killed_run_did_not_get_to(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG + "variants: [written]\n", "killed.yaml")
    main(["run", str(path), "--device", "cpu", "--no-progress", "--quick", "--no-report", "--out", str(tmp_path)])
    run = next(tmp_path.iterdir())
    saved = (run / "comparison.csv").read_text()
    for name in ("comparison.csv", "comparison.parquet", "comparison.json"):
        (run / name).unlink(missing_ok=True)  # as if the run was killed after its last record
    capsys.readouterr()
    assert main(["report", str(run), "--format", "md", "--out", str(tmp_path / "rep")]) == 0
    assert "computed it now from" in capsys.readouterr().out
    assert (run / "comparison.csv").read_text() == saved
    assert "no comparison table" not in next((tmp_path / "rep").glob("*.md")).read_text()
