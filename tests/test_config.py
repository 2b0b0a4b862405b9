"""Config mistakes produce messages that name the file, the line, the field and a fix."""

from __future__ import annotations

from pathlib import Path

import pytest

from microscope import config as cfgmod
from microscope import registry
from microscope.config import ConfigError

TOY = "tests/plugins/toy.py"


def problems(text: str, **kw) -> str:
    with pytest.raises(ConfigError) as info:
        cfgmod.loads(text, "ablations/bad.yaml", **kw)
    return str(info.value)


def test_unknown_key_names_line_and_suggests_the_near_key():
    msg = problems("plugin: toy_gelu\ndimensions:\n  throughput:\n    roundz: 4\n")
    assert msg == "ablations/bad.yaml:4: dimensions.throughput.roundz: unknown key; did you mean 'rounds'?"


def test_unknown_key_without_near_match_lists_known_keys():
    msg = problems("plugin: toy_gelu\nzzz: 1\n")
    assert msg.startswith("ablations/bad.yaml:2: zzz: unknown key; known keys here: plugin, description,")


def test_wrong_type_says_what_was_expected():
    msg = problems("plugin: toy_gelu\ndimensions:\n  throughput: {rounds: ten}\n")
    assert msg == ("ablations/bad.yaml:3: dimensions.throughput.rounds: expected a whole number, got str 'ten' "
                   "(write it without quotes or decimals)")


def test_bad_value_is_rejected_with_range():
    msg = problems("plugin: toy_gelu\ndimensions:\n  throughput:\n    reps: 0\n")
    assert msg == "ablations/bad.yaml:4: dimensions.throughput.reps: must be a whole number from 1 to 100000, got 0"


def test_bad_choice_suggests_the_closest():
    msg = problems("plugin: toy_gelu\ndevice: cude\n")
    assert msg == "ablations/bad.yaml:2: device: 'cude' is not one of 'auto', 'cpu', 'cuda'; did you mean 'cuda'?"


def test_missing_required_key():
    assert problems("seed: 1\n") == "ablations/bad.yaml: plugin: required key is missing; add 'plugin: ...'"


def test_every_problem_is_reported_at_once():
    msg = problems("plugin: toy_gelu\nseed: -1\nrepeats: 1.5\n")
    assert msg.splitlines() == [
        "ablations/bad.yaml:2: seed: must be a whole number >= 0, got -1",
        "ablations/bad.yaml:3: repeats: expected a whole number, got float 1.5 (write it without quotes or decimals)",
    ]


def test_yaml_syntax_error_names_the_line():
    assert problems("plugin: toy_gelu\ncases: {seq: [1, 2}\n").startswith("ablations/bad.yaml:2: not valid YAML")


def test_unsafe_yaml_tags_are_refused():
    msg = problems("plugin: !!python/object/apply:os.system ['true']\n")
    assert msg == ("ablations/bad.yaml:1: plugin: YAML tag 'tag:yaml.org,2002:python/object/apply:os.system' "
                   "is not allowed; configs hold plain values, lists and mappings only")


def test_duplicate_key_is_an_error():
    msg = problems("plugin: toy_gelu\nseed: 1\nseed: 2\n")
    assert msg == "ablations/bad.yaml:3: seed: duplicate key (first at line 2); keep one"


def test_typo_in_a_device_profile_shows_even_on_the_other_device():
    text = "plugin: toy_gelu\nprofiles:\n  cuda:\n    dimensions: {throughput: {repz: 3}}\n"
    msg = problems(text, device="cpu")
    assert msg == "ablations/bad.yaml:4: dimensions.throughput.repz: unknown key; did you mean 'reps'?"
    assert "unknown device; did you mean 'cuda'" in problems("plugin: toy_gelu\nprofiles:\n  gpu: {seed: 1}\n")


def test_profiles_and_quick_overlay_in_order():
    text = (
        "plugin: toy_gelu\ncases: {rows: [3]}\ndimensions: {throughput: {rounds: 9}}\n"
        "profiles:\n  cuda:\n    cases: {rows: [4096]}\n    dimensions: {throughput: {rounds: 20}}\n"
        "quick:\n  dimensions: {throughput: {rounds: 2}}\n"
    )
    cpu = cfgmod.loads(text, "x.yaml", device="cpu")
    cuda = cfgmod.loads(text, "x.yaml", device="cuda", quick=True)
    assert cpu.cases == {"rows": (3,)} and cpu.dimensions.throughput.rounds == 9
    assert cuda.cases == {"rows": (4096,)} and cuda.dimensions.throughput.rounds == 2
    assert cuda.where("cases.rows") == "x.yaml:6"


def test_a_named_profile_applies_after_the_device_profile_and_is_checked_on_every_device():
    text = (
        "plugin: toy_gelu\ncases: {rows: [3]}\ndimensions: {throughput: {rounds: 9}}\n"
        "profiles:\n  cuda:\n    cases: {rows: [4096]}\n    dimensions: {throughput: {rounds: 20}}\n"
        "  bench:\n    dimensions: {throughput: {rounds: 30, mode: cuda_graph}}\n"
        "quick:\n  dimensions: {throughput: {rounds: 2}}\n"
    )
    bench = cfgmod.loads(text, "x.yaml", device="cuda", overrides={"profile": "bench"})
    assert bench.cases == {"rows": (4096,)} and bench.dimensions.throughput.rounds == 30
    assert bench.dimensions.throughput.mode == "cuda_graph"
    assert bench.where("dimensions.throughput.rounds") == "x.yaml:9"
    quick = cfgmod.loads(text, "x.yaml", device="cuda", quick=True, overrides={"profile": "bench"})
    assert quick.dimensions.throughput.rounds == 2  # quick comes last
    assert cfgmod.loads(text, "x.yaml", device="cuda").dimensions.throughput.rounds == 20  # not asked for
    assert problems(text, overrides={"profile": "bnech"}) == (
        "--profile 'bnech': x.yaml has no such profile; did you mean 'bench'? (its profiles: bench)"
        .replace("x.yaml", "ablations/bad.yaml"))
    assert "the cuda profile follows the device (--device cuda)" in problems(text, overrides={"profile": "cuda"})
    typo = text.replace("mode: cuda_graph", "mode: graph")
    assert "ablations/bad.yaml:9: dimensions.throughput.mode:" in problems(typo, device="cpu")


def test_quick_axes_over_a_profile_with_a_list_of_grids_narrow_each_grid_and_keep_its_shapes():
    text = (
        "plugin: toy_gelu\ncases: {rows: [3], cols: [5]}\n"
        "profiles:\n  bench:\n    cases:\n      - {rows: [4096], cols: [64, 128]}\n      - {rows: [16], cols: [128]}\n"
        "quick:\n  cases: {cols: [128]}\n"
    )
    quick = cfgmod.loads(text, "x.yaml", device="cuda", quick=True, overrides={"profile": "bench"})
    assert quick.cases == ({"rows": (4096,), "cols": (128,)}, {"rows": (16,), "cols": (128,)})
    assert quick.where("cases[0].cols") == quick.where("cases[1].cols") == "x.yaml:9"


def test_a_list_of_case_grids_takes_their_cases_together_and_cites_each_grid():
    from microscope.runner import plan_cases

    text = (f"plugin: toy_gelu\nplugins: [{TOY}]\ncases:\n  - {{rows: [3, 5], cols: [7], dtype: [fp32]}}\n"
            "  - {rows: [5, 9], cols: [7, 8], dtype: [fp32]}\n")
    cfg = cfgmod.loads(text, "x.yaml")
    cfgmod.check_against_plugin(cfg, _plugin())
    ids = [c.id for c in plan_cases(_plugin(), cfg)]
    assert len(ids) == len(set(ids)) == 5  # rows=5,cols=7 is in both grids: once
    assert [c.id.split(",")[:2] for c in plan_cases(_plugin(), cfg)][:2] == [["rows=3", "cols=7"], ["rows=5", "cols=7"]]
    narrowed = cfgmod.loads(text, "x.yaml", overrides={"cases.cols": [8]})  # --set an axis of every grid
    assert {c["cols"] for c in plan_cases(_plugin(), narrowed)} == {8}
    bad = cfgmod.loads(text.replace("rows: [5, 9]", "rowz: [5, 9]"), "ablations/bad.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(bad, _plugin())
    assert "ablations/bad.yaml:5: cases[1].rowz: plugin 'toy_gelu' has no case axis 'rowz'" in str(info.value)
    assert "cases[0]: expected a mapping" in problems("plugin: toy_gelu\ncases:\n  - [3]\n")


def _plugin():
    return registry.get("toy_gelu", [TOY])


def test_unknown_case_axis_and_variant_need_the_plugin():
    text = f"plugin: toy_gelu\nplugins: [{TOY}]\nvariants: [eager, fusd]\ncases:\n  rowz: [3]\n  dtype: [bf61]\n"
    cfg = cfgmod.loads(text, "ablations/bad.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfg, _plugin())
    assert info.value.problems == [
        "ablations/bad.yaml:3: variants[1]: no variant 'fusd'; did you mean 'fused'?",
        "ablations/bad.yaml:5: cases.rowz: plugin 'toy_gelu' has no case axis 'rowz'; did you mean 'rows'?",
        "ablations/bad.yaml:6: cases.dtype: 'bf61' is not a dtype (fp64, fp32, fp16, bf16); did you mean 'bf16'?",
    ]


def test_case_value_of_the_wrong_kind():
    cfg = cfgmod.loads(f"plugin: toy_gelu\nplugins: [{TOY}]\ncases:\n  rows: ['3']\n", "ablations/bad.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfg, _plugin())
    assert info.value.problems == ["ablations/bad.yaml:4: cases.rows: '3' is a str, expected int"]


def test_every_shipped_config_is_valid():
    import pathlib

    from microscope.commands import load_checked

    shipped = sorted(pathlib.Path("ablations").glob("*.yaml"))
    assert shipped, "no configs under ablations/"
    for path in shipped:
        for device in ("cpu", "cuda"):
            for quick in (False, True):
                load_checked(path, device, quick)


# --- bad input never gives a traceback: every problem names the file, the line and the field ---------


def problems_in_file(tmp_path, data: bytes, name: str = "bad.yaml") -> str:
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(ConfigError) as info:
        cfgmod.load(path)
    return str(info.value).replace(str(tmp_path), "DIR")


def test_non_utf8_bytes_name_line_column_and_offset(tmp_path):
    msg = problems_in_file(tmp_path, b"plugin: toy_gelu\ndescription: caf\xe9\n")
    assert msg == "DIR/bad.yaml:2: byte 0xe9 at offset 33 (column 17) is not UTF-8; save the file as UTF-8"


def test_binary_files_folders_and_missing_files_are_named(tmp_path):
    assert problems_in_file(tmp_path, b"plugin: x\n\x00\x01\x02") == (
        "DIR/bad.yaml:2: a NUL byte at offset 10: this is a binary (or UTF-16) file, not a UTF-8 YAML config")
    (tmp_path / "folder.yaml").mkdir()
    for name, expected in (("folder.yaml", "is a folder, not a config file"), ("missing.yaml", "No such file")):
        with pytest.raises(ConfigError) as info:
            cfgmod.load(tmp_path / name)
        assert str(info.value).startswith(f"{tmp_path / name}: ") and expected in str(info.value)


def test_a_file_over_the_size_limit_is_refused_before_it_is_read(tmp_path):
    msg = problems_in_file(tmp_path, b"plugin: toy_gelu\n#" + b"x" * cfgmod.MAX_FILE_BYTES)
    assert msg.startswith("DIR/bad.yaml: 1048594 bytes is too large for a config (at most 1048576)")


def test_control_characters_name_line_and_column():
    assert problems("plugin: toy_gelu\ndescription: a\x1b[31mb\n") == (
        "ablations/bad.yaml:2: character U+001B at offset 31 (column 15) is a control character YAML does not "
        "allow; delete it (a config is plain text)")


@pytest.mark.parametrize(("nested", "line"), [
    (" " + "[" * 40 + "]" * 40, 2),
    (" " + "{a: " * 40 + "1" + "}" * 40, 2),
    ("\n" + "\n".join("  " * i + f"k{i}:" for i in range(1, 100)) + " 1", 33),  # k31 is the 33rd level
])
def test_deep_nesting_is_bounded(nested, line):
    assert problems(f"plugin: toy_gelu\ndescription:{nested}\n") == (
        f"ablations/bad.yaml:{line}: nested more than 32 levels deep; a config nests a few levels (dimensions: "
        "{throughput: {rounds: 10}})")


@pytest.mark.parametrize("nested", ["[" * 50_000 + "]" * 50_000, "{a: " * 50_000 + "1" + "}" * 50_000])
def test_nesting_past_the_parser_limit_is_a_clean_error(nested):
    assert problems(f"plugin: toy_gelu\ndescription: {nested}\n").startswith("ablations/bad.yaml:2: ")


def test_an_alias_bomb_fails_in_milliseconds_before_it_is_expanded():
    import time

    levels = ['a0: &a0 ["lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol", "lol"]']
    levels += [f"a{i}: &a{i} [" + ", ".join([f"*a{i - 1}"] * 9) + "]" for i in range(1, 9)]
    text = "plugin: toy_gelu\nworkload:\n  model:\n" + "".join(f"    {line}\n" for line in levels)
    start = time.perf_counter()
    msg = problems(text)
    assert time.perf_counter() - start < 0.5
    assert msg == (f"ablations/bad.yaml:8: this value expands to more than {cfgmod.MAX_NODES} values (aliases "
                   "repeating aliases, a 'billion laughs' file?); a config holds a few hundred")


def test_aliases_are_counted_and_may_not_contain_themselves():
    many = "plugin: toy_gelu\nx: &x 1\nrefs: [" + ", ".join(["*x"] * (cfgmod.MAX_ALIASES + 1)) + "]\n"
    assert problems(many).startswith(f"ablations/bad.yaml:3: more than {cfgmod.MAX_ALIASES} aliases (*name)")
    assert problems("plugin: toy_gelu\nloop: &r [*r]\n") == (
        "ablations/bad.yaml:2: alias *r sits inside the value it names (a value that contains itself); write the "
        "values out")
    few = cfgmod.loads("plugin: toy_gelu\ncases: {rows: &rows [3, 17]}\nprofiles: {cuda: {cases: {rows: *rows}}}\n")
    assert few.cases == {"rows": (3, 17)}  # a handful of aliases is ordinary YAML and still works


@pytest.mark.parametrize(("line", "expected"), [
    ("stats: {alpha: .nan}", "2: stats.alpha: must be a finite number > 0 and < 1, got nan"),
    ("stats: {alpha: 1.5}", "2: stats.alpha: must be a finite number > 0 and < 1, got 1.5"),
    ("stats: {min_band: .inf}", "2: stats.min_band: must be a finite number >= 0 and < 1, got inf"),
    ("timeout_s: .inf", "2: timeout_s: must be a finite number > 0 and <= 604800, got inf"),
    ("dimensions: {throughput: {rounds: 1000000}}",
     "2: dimensions.throughput.rounds: must be a whole number from 1 to 100000, got 1000000"),
    ("dimensions: {throughput: {rounds: 1.0e+30}}",
     "2: dimensions.throughput.rounds: expected a whole number, got float 1e+30 (write it without quotes or decimals)"),
    ("seed: 100000000000000000000", "2: seed: 100000000000000000000 is too large; whole numbers in a config lie "
                                    "within +-9223372036854775807 (2**63 - 1)"),
    ("workload: {seeds: -3}", "2: workload.seeds: must be a whole number from 1 to 1000, got -3"),
    ("workload: {model: {dropout: .nan}}", "2: workload.model.dropout: must be a finite number >= 0 and <= 1e+12, "
                                          "got nan"),
    ("workload: {recipe: {betas: [0.9, -.inf]}}", "2: workload.recipe.betas[1]: must be a finite number >= 0 and "
                                                  "<= 1e+12, got -inf"),
])
def test_non_finite_and_absurd_numbers_are_refused_with_the_accepted_range(line, expected):
    assert problems(f"plugin: toy_gelu\n{line}\n") == f"ablations/bad.yaml:{expected}"


def _numeric_fields(cls: type, prefix: str = ""):
    import dataclasses
    import typing

    for f in dataclasses.fields(cls):
        if f.name in ("path", "lines", "overridden"):
            continue
        tp = typing.get_type_hints(cls)[f.name]
        args = [a for a in typing.get_args(tp) if a is not type(None)] or [tp]
        dotted = f"{prefix}{f.name}"
        if dataclasses.is_dataclass(args[0]):
            yield from _numeric_fields(args[0], f"{dotted}.")
        elif args[0] in (int, float):
            yield dotted


def test_nan_is_refused_in_every_numeric_field():
    fields = list(_numeric_fields(cfgmod.RunConfig))
    assert "dimensions.throughput.rounds" in fields and "instrument.profile.top_k" in fields
    for dotted in fields:
        *parents, last = dotted.split(".")
        text = "plugin: toy_gelu\n" + "".join(f"{'  ' * i}{p}:\n" for i, p in enumerate(parents))
        text += f"{'  ' * len(parents)}{last}: .nan\n"
        assert f":{len(parents) + 2}: {dotted}: " in problems(text), dotted


def test_null_where_a_value_is_required_says_what_to_do():
    assert problems("plugin: toy_gelu\ndimensions:\n  throughput:\n    rounds:\n") == (
        "ablations/bad.yaml:4: dimensions.throughput.rounds: has no value (null); give it one, or delete the line "
        "for the default (10)")
    assert problems("plugin:\n") == "ablations/bad.yaml:1: plugin: has no value (null); it is required: give it one"
    assert problems("plugin: toy_gelu\nstats: null\n") == (
        "ablations/bad.yaml:2: stats: has no value (null); give it one, or delete the line for the defaults")
    # optional fields take null as "the default": workload.steps: null is the profile's step count
    assert cfgmod.loads("plugin: toy_gelu\nworkload: {steps: null}\n").workload.steps is None


def test_case_values_must_be_plain_and_listed_once():
    msg = problems("plugin: toy_gelu\ncases:\n  rows:\n    - 3\n    - {a: 1}\n    - [1, 2]\n    - 3\n")
    assert msg.splitlines() == [
        "ablations/bad.yaml:5: cases.rows[1]: a mapping {'a': 1} is not a case value; each value is a number, "
        "text or true/false, e.g. 'seq: [128, 256]'",
        "ablations/bad.yaml:6: cases.rows[2]: a list [1, 2] is not a case value; each value is a number, text or "
        "true/false, e.g. 'seq: [128, 256]'",
        "ablations/bad.yaml:7: cases.rows[3]: 3 is listed twice; keep one",
    ]
    assert problems("plugin: toy_gelu\ncases: {rows: null}\n") == (
        "ablations/bad.yaml:2: cases.rows: has no values; give a list such as 'rows: [128, 256]', or delete the axis")


def test_model_level_cases_are_refused_with_what_to_write_instead():
    plugin = registry.get("adam_betas")
    cfg = cfgmod.loads("plugin: adam_betas\nlevel: model\ncases:\n  profile: [gpu]\n  seq: [128]\n", "m.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfg, plugin)
    assert info.value.problems == [
        "m.yaml:4: cases.profile: a model-level run has one case, (workload.profile, workload.task), and no case "
        "grid; write 'workload: {profile: ...}' and delete cases.profile",
        "m.yaml:5: cases.seq: a model-level run has no case axis 'seq': its one case is (workload.profile, "
        "workload.task); delete it",
    ]


def test_case_grids_are_bounded():
    axes = "".join(f"  {axis}: [{', '.join(str(v) for v in range(1, 120))}]\n" for axis in ("rows", "cols"))
    cfg = cfgmod.loads(f"plugin: toy_gelu\nplugins: [{TOY}]\ncases:\n{axes}", "ablations/bad.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfg, _plugin())
    assert info.value.problems == [
        "ablations/bad.yaml:3: cases: asks for 28322 cases (the product of the axes' lengths); at most 10000 are "
        "allowed: list fewer values per axis"]


def test_workload_profile_and_plugin_names_are_checked_before_any_import():
    assert problems("plugin: adam_betas\nworkload: {profile: gpuu}\n") == (
        "ablations/bad.yaml:2: workload.profile: 'gpuu' is not a workload profile; use one of tiny, gpu; did you "
        "mean 'gpu'?")
    assert problems("plugin: '[bold red]x[/]'\n") == (
        "ablations/bad.yaml:1: plugin: '[bold red]x[/]' is not a plugin name; names are Python identifiers "
        "(letters, digits, underscores), e.g. 'plugin: flash_attn'")
    assert problems("plugin: adam_betas\nworkload: {model: {n_heads: 3}}\n") == (
        "ablations/bad.yaml:2: workload.model: with profile 'tiny': d_model=128 is not divisible by n_heads=3")


def test_long_values_are_cut_in_messages():
    msg = problems("plugin: toy_gelu\nseed: '" + "x" * 100_000 + "'\n")
    assert len(msg) < 300 and msg.startswith("ablations/bad.yaml:2: seed: expected a whole number, got str 'xxx")
    assert "(100002 characters)" in msg


def test_set_values_are_cited_as_the_command_line_not_a_line_of_the_file():
    text = "plugin: toy_gelu\ndimensions:\n  throughput:\n    rounds: 5\n"
    overrides = dict(cfgmod.parse_assignment(a) for a in ["dimensions.throughput.rounds=abc", "seed=-1",
                                                          "dimensions.accuracy={backwardz: true}"])
    assert sorted(problems(text, overrides=overrides).splitlines()) == [
        "--set dimensions.accuracy={backwardz: true}: dimensions.accuracy.backwardz: unknown key; did you mean "
        "'backward'?",
        "--set dimensions.throughput.rounds=abc: expected a whole number, got str 'abc' (write it without quotes "
        "or decimals)",
        "--set seed=-1: must be a whole number >= 0, got -1",
    ]
    cfg = cfgmod.loads(text, "x.yaml", overrides={"dimensions.throughput.rounds": 7})
    assert cfg.dimensions.throughput.rounds == 7 and cfg.where("dimensions.throughput.rounds") == (
        "--set dimensions.throughput.rounds=7")


@pytest.mark.parametrize(("arg", "expected"), [
    ("rounds", "--set rounds: expected KEY=VALUE, e.g. --set workload.steps=60"),
    ("a..b=1", "--set a..b=1: 'a..b' has an empty part; write dotted field names such as "
               "dimensions.throughput.rounds"),
    ("quick.seed=1", "--set quick.seed=1: quick is an overlay of the file; set the field itself (--set applies "
                     "after the profile and quick overlays)"),
    ("seed=[1", "--set seed=[1: not valid YAML: did not find expected ',' or ']' (while parsing a flow sequence); "
                "check the indentation, quotes and brackets"),
    ("seed=" + "[" * 100 + "]" * 100, "nested more than 32 levels deep"),
    ("seed=!!python/name:os.system", "--set seed=!!python/name:os.system: the value: YAML tag "
                                     "'tag:yaml.org,2002:python/name:os.system' is not allowed"),
])
def test_bad_set_arguments(arg, expected):
    with pytest.raises(ConfigError) as info:
        cfgmod.parse_assignment(arg)
    assert str(info.value).startswith(expected) or expected in str(info.value)


def test_contrasts_are_pairs_of_the_runs_variants():
    cfg = cfgmod.loads(f"plugin: toy_gelu\nplugins: [{TOY}]\nstats:\n  contrasts: [fused vs memo, zeros vs fused]\n")
    assert cfg.stats.contrasts == (("fused", "memo"), ("zeros", "fused"))
    cfgmod.check_against_plugin(cfg, _plugin())
    one = cfgmod.loads(f"plugin: toy_gelu\nplugins: [{TOY}]\n", overrides={"stats.contrasts": "fused vs memo"})
    assert one.stats.contrasts == (("fused", "memo"),)


def test_a_malformed_contrast_names_its_line_and_the_form():
    msg = problems("plugin: toy_gelu\nstats:\n  contrasts:\n    - fused versus memo\n    - memo vs memo\n")
    assert msg.splitlines() == [
        "ablations/bad.yaml:4: stats.contrasts[0]: 'fused versus memo' is not 'a vs b' (two variant names), "
        "e.g. 'contrasts: [window_last_full vs window]'",
        "ablations/bad.yaml:5: stats.contrasts[1]: compares 'memo' with itself; name two different variants",
    ]


def test_a_contrast_with_the_baseline_an_unknown_or_an_unselected_variant_is_refused():
    text = (f"plugin: toy_gelu\nplugins: [{TOY}]\nvariants: [fused]\nstats:\n"
            "  contrasts: [fused vs eager, fusd vs fused, memo vs fused]\n")
    cfg = cfgmod.loads(text, "ablations/bad.yaml")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfg, _plugin())
    assert info.value.problems == [
        "ablations/bad.yaml:5: stats.contrasts[0]: 'eager' is the baseline, which every variant is compared with "
        "already; contrast two other variants",
        "ablations/bad.yaml:5: stats.contrasts[1]: no variant 'fusd'; did you mean 'fused'?",
        "ablations/bad.yaml:5: stats.contrasts[2]: 'memo' is not in this run's variants; add it to 'variants:' or "
        "drop the contrast",
    ]


def test_an_opt_in_variant_runs_only_where_the_config_names_it():
    """flash_attn's stage-study peers stay out of a plain run and of its bench profile, run under --profile
    stages, and a contrast or sweep naming one that the run leaves out is a config error with file:line."""
    from microscope.api import Variant
    from microscope.runner import plan_variants

    plugin = registry.get("flash_attn")
    path = Path(__file__).resolve().parents[1] / "ablations" / "flash_attn.yaml"
    for profile in ("", "bench"):
        cfg = cfgmod.load(path, device="cuda", overrides={"profile": profile} if profile else None)
        cfgmod.check_against_plugin(cfg, plugin)
        names = [name for name, _ in plan_variants(plugin, cfg)]
        assert "triton" in names and "sdpa_cudnn" in names and not any("_no_" in name for name in names)
    cfg = cfgmod.load(path, device="cuda", overrides={"profile": "bench,stages"})
    cfgmod.check_against_plugin(cfg, plugin)
    assert [name for name, _ in plan_variants(plugin, cfg)] == [
        "eager", "triton", "sdpa_cudnn", "triton_no_softmax", "triton_no_exp2", "triton_no_pv"]
    assert len(cfg.stats.contrasts) == 3
    text = ("plugin: flash_attn\nstats:\n  contrasts: [triton_no_pv vs triton]\n"
            "sweep:\n  triton_no_exp2: {loads: [tma]}\n")
    with pytest.raises(ConfigError) as info:
        cfgmod.check_against_plugin(cfgmod.loads(text, "ablations/x.yaml"), plugin)
    assert ("ablations/x.yaml:3: stats.contrasts: 'triton_no_pv' runs only where 'variants:' names it (an opt-in "
            "variant); add it there or drop the contrast") in info.value.problems
    assert any(p.startswith("ablations/x.yaml:5: sweep.triton_no_exp2: 'triton_no_exp2' runs only where")
               for p in info.value.problems), info.value.problems
    with pytest.raises(ValueError, match="peers only"):
        Variant(lambda x: x, opt_in=True)
