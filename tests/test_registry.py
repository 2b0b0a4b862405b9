"""Plugins come from kernels/, entry points and config-listed files; clashes and typos explain themselves."""

from __future__ import annotations

import textwrap

import pytest
import torch

from microscope import api, registry
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
    assert "no plugin named 'flash_atn'. Did you mean 'flash_attn'" in str(info.value)  # the nearest first
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


def test_plugin_file_with_an_error_names_the_file_and_line(tmp_path):
    path = tmp_path / "broken_plugin.py"
    path.write_text("import torch\nraise ValueError('boom')\n")
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source(str(path))
    assert str(info.value) == f"{path}:2: plugin raised ValueError: boom"


def test_a_plugin_raising_in_a_helper_is_reported_at_the_deepest_line_of_its_own_file(tmp_path):
    (tmp_path / "ablations").mkdir()
    (tmp_path / "my_plugin.py").write_text("import json\n\n\ndef scale():\n    return 1 / 0\n\n\nS = scale()\n")
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source("../my_plugin.py", tmp_path / "ablations")
    assert str(info.value) == (f"{tmp_path}/ablations/../my_plugin.py:5: plugin raised ZeroDivisionError: "
                               "division by zero")


@pytest.mark.parametrize(("text", "expected"), [
    ("x = 1\ndef broken(:\n    pass\n", ":2: plugin raised SyntaxError: "),
    ("import sys\n\nsys.exit(3)\n", ":3: plugin raised SystemExit: 3"),
    ("x = 1\n\x00\n", ": plugin raised SyntaxError: source code string cannot contain null bytes"),
])
def test_plugins_that_do_not_parse_or_exit_are_clean_errors(tmp_path, text, expected):
    path = tmp_path / "odd_plugin.py"
    path.write_text(text)
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source(str(path))
    assert str(info.value).startswith(f"{path}{expected}")


@pytest.mark.parametrize(("source", "expected"), [
    ("~nobody_at_all/x.py", "plugin file '~nobody_at_all/x.py' not found: '~nobody_at_all' names no home "
                            "directory on this machine; write the path relative to the config or in full"),
    ("a" * 300 + ".py", "path too long (a path holds at most 4096 characters, each name in it at most 255)"),
    ("x/" * 3000 + "p.py", "path too long"),
    ("x\x00y.py", "plugin file 'x\\x00y.py': a path cannot hold a NUL character; check the entry"),
    ("my plugin", "plugin 'my plugin' is neither a .py file nor a module name (dotted Python identifiers such as "
                  "my_package.ablations)"),
    ("[/]", "plugin file '[/]' not found (looked at "),
    ("[bold red]", "plugin '[bold red]' is neither a .py file nor a module name"),
    ("no_such_module_here", "plugin module 'no_such_module_here': importing no_such_module_here failed: "
                            "ModuleNotFoundError: No module named 'no_such_module_here'"),
])
def test_odd_plugin_sources_are_clean_errors(tmp_path, source, expected):
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source(source, tmp_path)
    assert expected in str(info.value)


def test_a_folder_or_a_file_that_is_not_python_is_named(tmp_path):
    (tmp_path / "plugins.py").mkdir()
    (tmp_path / "notes.txt/").mkdir()
    with pytest.raises(registry.PluginError, match=r"plugin file 'plugins.py' is a folder .*; name the .py file"):
        registry.load_plugin_source("plugins.py", tmp_path)
    (tmp_path / "data.csv").write_text("a,b\n")
    with pytest.raises(registry.PluginError, match="plugin file './data.csv' is not a .py file"):
        registry.load_plugin_source("./data.csv", tmp_path)


def test_a_plugin_module_that_raises_is_cited_at_its_line(tmp_path, monkeypatch):
    (tmp_path / "raising_plugin_module.py").write_text("import os\n\nos.environ['X'] = str(1 / 0)\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    with pytest.raises(registry.PluginError) as info:
        registry.load_plugin_source("raising_plugin_module")
    assert str(info.value) == (
        f"plugin module 'raising_plugin_module': importing raising_plugin_module failed at "
        f"{tmp_path}/raising_plugin_module.py:3: ZeroDivisionError: division by zero")


def test_a_plugin_whose_constructor_raises_is_cited_at_its_line(tmp_path):
    path = tmp_path / "init_plugin.py"
    path.write_text(textwrap.dedent(PLUGIN.format(name="init_raises")) + "\n    def __init__(self):\n"
                    "        raise RuntimeError('no GPU found')\n")
    try:
        with pytest.raises(registry.PluginError) as info:
            registry.get("init_raises", [str(path)])
    finally:
        api._REGISTERED.pop("init_raises", None)  # `microscope list` in later tests builds every plugin
    line = path.read_text().splitlines().index("        raise RuntimeError('no GPU found')") + 1
    assert str(info.value) == f"{path}:{line}: creating plugin 'init_raises' raised RuntimeError: no GPU found"


def test_error_budget_admits_the_budget_in_every_dtype():
    """A lossy change's budget, as tolerances: ref_factor x unit roundoff is the budget in each dtype."""
    tolerances = api.error_budget(0.03, rtol=0.05, atol=0.02, max_mismatch=0.02)
    assert set(tolerances) == {"fp32", "fp16", "bf16"}
    for name, tol in tolerances.items():
        assert tol.ref_factor * torch.finfo(api.DTYPES[name]).eps / 2 == pytest.approx(0.03)
        assert (tol.rtol, tol.atol, tol.max_mismatch) == (0.05, 0.02, 0.02)
