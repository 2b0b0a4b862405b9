"""Plugins come from kernels/, entry points and config-listed files; clashes and typos explain themselves."""

from __future__ import annotations

import textwrap

import pytest

from microscope import registry
from microscope.api import RegistrationError

PLUGIN = """
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register

@register({name!r})
class Outside(Ablation):
    \"\"\"A plugin that lives outside the repository.\"\"\"
    variants = {{"ref": baseline(lambda x: x.cumsum(-1)),
                "alt": candidate(lambda x: x @ torch.ones(x.shape[-1], x.shape[-1], dtype=x.dtype).triu())}}
    cases = grid(n=[5, 9], dtype=["fp32"])
    tolerance = {{"*": Tolerance(rtol=1e-5, atol=1e-5)}}

    def inputs(self, case, gen, device):
        return {{"x": randn((3, case["n"]), case.dtype, gen, device)}}
"""


def test_builtin_rooms_are_discovered():
    assert "flash_attn" in registry.discover()


def test_unknown_name_suggests_and_lists():
    with pytest.raises(registry.PluginError) as info:
        registry.get("flash_atn")
    assert "no plugin named 'flash_atn'. Did you mean 'flash_attn'?" in str(info.value)
    assert "Known plugins:" in str(info.value)


def test_plugin_file_outside_the_repo(tmp_path):
    path = tmp_path / "outside_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN.format(name="outside_cumsum")))
    plugin = registry.get("outside_cumsum", [str(path)])
    assert plugin.name == "outside_cumsum" and set(plugin.variants) == {"ref", "alt"}


def test_name_collision_is_an_error_naming_both(tmp_path):
    first, second = tmp_path / "a_plugin.py", tmp_path / "b_plugin.py"
    first.write_text(PLUGIN.format(name="clash_me"))
    second.write_text(PLUGIN.format(name="clash_me"))
    registry.load_plugin_source(str(first))
    with pytest.raises(RegistrationError) as info:
        registry.load_plugin_source(str(second))
    assert "two plugins are registered as 'clash_me'" in str(info.value)
    assert "Rename one of them" in str(info.value)


def test_missing_plugin_file_is_reported(tmp_path):
    with pytest.raises(registry.PluginError) as info:
        registry.get("whatever", ["does/not/exist.py"], base_dir=tmp_path)
    assert "plugin file 'does/not/exist.py' not found" in str(info.value)


def test_plugin_file_with_an_error_names_the_file(tmp_path):
    path = tmp_path / "broken_plugin.py"
    path.write_text("import torch\nraise ValueError('boom')\n")
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source(str(path))
    assert str(path) in str(info.value) and "ValueError: boom" in str(info.value)
