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
    assert len(ok) == 6 and all(r["passed"] for r in ok)  # out, grad_x and the timed-call check, two cases
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
    assert "--set dimensions.throughput.roundz=3: unknown key; did you mean 'rounds'?" in capsys.readouterr().err


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


# --- bad input: exit 2 and a message naming the file, never a traceback ------------------------------


def test_validate_checks_every_file_and_names_each(plugin_dir, tmp_path, capsys):
    good = _write(plugin_dir, CONFIG, "good.yaml")
    typo = _write(plugin_dir, CONFIG.replace("rounds: 2", "rounds: .nan"), "nan.yaml")
    (tmp_path / "folder.yaml").mkdir()
    binary = tmp_path / "binary.yaml"
    binary.write_bytes(b"\x7fELF\x02\x01\x01\x00\x00")
    latin1 = tmp_path / "latin1.yaml"
    latin1.write_bytes(b"plugin: cli_softplus\ndescription: d\xe9j\xe0 vu\n")
    paths = [good, typo, tmp_path / "folder.yaml", tmp_path / "missing.yaml", binary, latin1]
    assert main(["validate", *map(str, paths)]) == 2
    out = capsys.readouterr().out
    assert f"ok {good}" in out
    assert f"{typo}:5: dimensions.throughput.rounds: must be a whole number from 1 to 100000, got nan" in out
    assert f"{tmp_path}/folder.yaml: is a folder, not a config file; name a .yaml file" in out
    assert f"{tmp_path}/missing.yaml: cannot read the config (No such file or directory); check the path" in out
    assert f"{binary}:1: a NUL byte at offset 7: this is a binary (or UTF-16) file, not a UTF-8 YAML config" in out
    assert f"{latin1}:2: byte 0xe9 at offset 35 (column 15) is not UTF-8; save the file as UTF-8" in out
    assert out.rstrip().endswith("5 of 6 config(s) invalid")


def test_messages_holding_rich_markup_are_printed_as_text(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG + "variants: ['[/]', '[bold red]x']\n", "markup.yaml")
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert "markup.yaml:8: variants[0]: no variant '[/]'; the plugin has torch, written, broken" in out
    assert "variants[1]: no variant '[bold red]x'" in out
    odd_name = _write(plugin_dir, CONFIG, "[bold]odd[red].yaml")  # markup would eat the brackets
    assert main(["validate", str(odd_name)]) == 0
    assert f"ok {odd_name}" in capsys.readouterr().out
    path = _write(plugin_dir, "plugin: '[bold red]x[/]'\n", "markup_name.yaml")
    assert main(["run", str(path), "--device", "cpu", "--out", str(tmp_path / "res")]) == 2
    assert ("markup_name.yaml:1: plugin: '[bold red]x[/]' is not a plugin name; names are Python identifiers"
            in capsys.readouterr().err)


def test_set_errors_cite_the_command_line(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG, "set_bad.yaml")
    code = main(["run", str(path), "--device", "cpu", "--no-progress", "--out", str(tmp_path / "res"),
                 "--set", "dimensions.throughput.rounds=abc"])
    err = capsys.readouterr().err
    assert code == 2 and not (tmp_path / "res").exists()
    assert ("--set dimensions.throughput.rounds=abc: expected a whole number, got str 'abc' (write it without "
            "quotes or decimals)") in err
    assert "set_bad.yaml:5" not in err  # the file's line of the overridden field is not the place to fix it
    assert main(["run", str(path), "--device", "cpu", "--set", "seed=[1"]) == 2
    assert "--set seed=[1: not valid YAML: did not find expected ',' or ']'" in capsys.readouterr().err


def test_a_plugin_that_raises_is_cited_at_its_own_line(plugin_dir, capsys):
    (plugin_dir / "raising_plugin.py").write_text("import math\n\nVALUE = math.pi / 0\n")
    path = _write(plugin_dir, CONFIG.replace("[softplus_plugin.py]", "[softplus_plugin.py, raising_plugin.py]"),
                  "raising.yaml")
    assert main(["validate", str(path)]) == 2
    out = capsys.readouterr().out
    assert (f"raising.yaml:3: plugins[1]: {plugin_dir}/raising_plugin.py:3: plugin raised ZeroDivisionError: "
            "float division by zero") in out


def test_report_of_a_damaged_records_file_notes_the_line_and_still_reports(plugin_dir, tmp_path, capsys):
    path = _write(plugin_dir, CONFIG + "variants: [written]\n", "damaged.yaml")
    main(["run", str(path), "--device", "cpu", "--no-progress", "--quick", "--no-report", "--out", str(tmp_path)])
    run = next(tmp_path.iterdir())
    records = run / "records.jsonl"
    lines = records.read_text().splitlines()
    lines[2] = lines[2][: len(lines[2]) // 2]  # a damaged line in the middle
    lines[4] = "\udcff".encode("utf-8", "surrogateescape").decode("latin-1")
    records.write_bytes("\n".join(lines).encode("latin-1", "replace") + b"\n")
    for name in ("comparison.csv", "comparison.parquet", "comparison.json"):
        (run / name).unlink(missing_ok=True)
    capsys.readouterr()
    assert main(["report", str(run), "--format", "md", "--out", str(tmp_path / "rep")]) == 0
    out = capsys.readouterr().out
    assert f"statistics not computed: {records}:3: not a JSON record" in out
    assert "the file is damaged: delete or repair that line, or rerun" in out
    assert next((tmp_path / "rep").glob("*.md")).is_file()


def test_report_of_a_missing_folder_exits_2(tmp_path, capsys):
    assert main(["report", str(tmp_path / "nope")]) == 2
    assert f"{tmp_path}/nope: no such results folder" in capsys.readouterr().err


def test_compare_env_and_set_for_one_side_reach_that_side_only(tmp_path, capsys):
    """``--env-b`` goes to side B's fresh runs and nowhere else: a bad plant switch breaks B's run after A's
    ran, and the refusal names the switch; malformed pairs and per-side options on run folders are refused."""
    config = "ablations/planted_work.yaml"
    common = ["--repeat", "1", "--quick", "--device", "cpu", "--results", str(tmp_path / "runs"), "--out",
              str(tmp_path / "rep"), "--set", "dimensions.throughput.rounds=2", "dimensions.throughput.reps=1"]
    assert main(["compare", config, config, *common, "--env-b", "MICROSCOPE_PLANT_WORK_PCT=lots"]) == 2
    captured = capsys.readouterr()
    assert "compare: side A, run 1/1" in captured.out and "compare: side B, run 1/1" in captured.out
    assert "MICROSCOPE_PLANT_WORK_PCT='lots': extra work in percent" in captured.err
    (side_a,) = (tmp_path / "runs").glob("compare-A-*")
    assert len(list(side_a.glob("*/records.jsonl"))) == 1
    assert main(["compare", config, config, *common, "--env-a", "NO_EQUALS_SIGN"]) == 2
    assert "--env-a 'NO_EQUALS_SIGN': expected NAME=VALUE" in capsys.readouterr().err
    assert main(["compare", str(side_a), config, *common, "--set-a", "seed=3"]) == 2
    assert "side A is a run folder, not a config" in capsys.readouterr().err


def test_calibrate_counts_each_candidates_latency_verdicts_over_seeded_runs(capsys):
    """``microscope calibrate``: N runs, one row per candidate, its verdict counts summing to N per case."""
    assert main(["calibrate", "ablations/planted_work.yaml", "--runs", "2", "--device", "cpu", "--quick",
                 "--set", "dimensions.throughput.rounds=6", "dimensions.throughput.reps=2"]) == 0
    out = capsys.readouterr().out
    assert "ablations/planted_work.yaml: 2 runs on cpu" in out and "rounds 6 x reps 2" in out
    rows = {line.split()[0]: line.replace("│", " ").split() for line in out.splitlines()
            if line.strip().startswith("plus_")}
    assert set(rows) == {f"plus_{p}pct" for p in (0, 1, 2, 3, 5, 10)}
    assert all(sum(int(n) for n in row[1:5]) == 2 for row in rows.values())
    assert main(["calibrate", "ablations/planted_work.yaml", "--runs", "0"]) == 2
    assert "--runs 0: between 1 and 1000" in capsys.readouterr().err
