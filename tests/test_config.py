"""Config mistakes produce messages that name the file, the line, the field and a fix."""

from __future__ import annotations

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
    assert msg == "ablations/bad.yaml:4: dimensions.throughput.reps: must be > 0, got 0"


def test_bad_choice_suggests_the_closest():
    msg = problems("plugin: toy_gelu\ndevice: cude\n")
    assert msg == "ablations/bad.yaml:2: device: 'cude' is not one of 'auto', 'cpu', 'cuda'; did you mean 'cuda'?"


def test_missing_required_key():
    assert problems("seed: 1\n") == "ablations/bad.yaml: plugin: required key is missing; add 'plugin: ...'"


def test_every_problem_is_reported_at_once():
    msg = problems("plugin: toy_gelu\nseed: -1\nrepeats: 1.5\n")
    assert msg.splitlines() == [
        "ablations/bad.yaml:2: seed: must be >= 0, got -1",
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
