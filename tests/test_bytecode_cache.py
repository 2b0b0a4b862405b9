"""The bytecode cache: a read-only install's modules get their bytecode in the user's cache folder."""

from __future__ import annotations

import importlib.util
import os
import py_compile
import stat
import sys

import pytest

from microscope import bytecode_cache


@pytest.fixture
def clean_prefix(monkeypatch):
    monkeypatch.delenv(bytecode_cache.PREFIX_ENV, raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", False)  # PYTHONDONTWRITEBYTECODE=1 keeps it True
    # whether torch's install holds its bytecode depends on how it was installed: decided per test
    monkeypatch.setattr(bytecode_cache, "install_has_bytecode", lambda package="torch": False)
    yield
    # monkeypatch restores sys.pycache_prefix and the environment


def _package(tmp_path, name: str, writable: bool):
    pkg = tmp_path / "site" / name
    pkg.mkdir(parents=True)
    (pkg / "__init__.py").write_text("")
    if not writable:
        pkg.chmod(stat.S_IRUSR | stat.S_IXUSR)
    return pkg


def test_a_read_only_install_points_every_process_at_the_user_cache(tmp_path, monkeypatch, clean_prefix):
    # whether a folder is writable depends on who runs the tests (root writes anywhere): decided here
    monkeypatch.setattr(bytecode_cache, "install_is_writable", lambda package="torch": False)
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    folder = bytecode_cache.use_shared_cache()
    assert folder == tmp_path / "cache" / "microscope" / "pycache"
    assert folder.is_dir()
    assert sys.pycache_prefix == str(folder)
    assert os.environ[bytecode_cache.PREFIX_ENV] == str(folder)  # what spawned workers inherit


@pytest.mark.skipif(hasattr(os, "geteuid") and os.geteuid() == 0, reason="root can write a read-only folder")
def test_a_folder_without_write_permission_is_a_read_only_install(tmp_path, monkeypatch):
    pkg = _package(tmp_path, "readonly_pkg", writable=False)
    monkeypatch.syspath_prepend(str(pkg.parent))
    try:
        assert not bytecode_cache.install_is_writable("readonly_pkg")
    finally:
        pkg.chmod(stat.S_IRWXU)


def test_a_writable_install_keeps_its_own_bytecode(tmp_path, monkeypatch, clean_prefix):
    pkg = _package(tmp_path, "writable_pkg", writable=True)
    monkeypatch.syspath_prepend(str(pkg.parent))
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    assert bytecode_cache.install_is_writable("writable_pkg")
    assert bytecode_cache.use_shared_cache("writable_pkg") is None
    assert sys.pycache_prefix is None
    assert bytecode_cache.PREFIX_ENV not in os.environ


def test_no_bytecode_files_wanted_shares_a_folder_that_ends_with_the_run(monkeypatch, clean_prefix):
    registered = []
    monkeypatch.setattr(bytecode_cache.atexit, "register", lambda fn, *args, **kw: registered.append((fn, args, kw)))
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    monkeypatch.setenv(bytecode_cache.NO_BYTECODE_ENV, "1")
    folder = bytecode_cache.use_shared_cache()
    assert folder is not None and folder.is_dir() and folder.name.startswith("microscope-pycache-")
    assert sys.pycache_prefix == str(folder) and not sys.dont_write_bytecode
    assert os.environ[bytecode_cache.PREFIX_ENV] == str(folder)
    assert bytecode_cache.NO_BYTECODE_ENV not in os.environ  # the run's processes write there too
    for fn, args, kw in registered:  # what happens at exit: the folder goes
        fn(*args, **kw)
    assert not folder.exists()


def test_an_install_with_its_own_bytecode_keeps_it(tmp_path, monkeypatch):
    monkeypatch.delenv(bytecode_cache.PREFIX_ENV, raising=False)
    monkeypatch.setattr(sys, "pycache_prefix", None)
    monkeypatch.setattr(sys, "dont_write_bytecode", True)
    pkg = _package(tmp_path, "compiled_pkg", writable=True)
    monkeypatch.syspath_prepend(str(pkg.parent))
    source = str(pkg / "__init__.py")
    assert not bytecode_cache.install_has_bytecode("compiled_pkg")
    py_compile.compile(source, cfile=importlib.util.cache_from_source(source))  # what pip does at install
    assert bytecode_cache.install_has_bytecode("compiled_pkg")
    assert bytecode_cache.use_shared_cache("compiled_pkg") is None  # a prefix would hide the install's .pyc
    assert sys.pycache_prefix is None and bytecode_cache.PREFIX_ENV not in os.environ


def test_a_prefix_the_user_chose_is_kept(tmp_path, monkeypatch, clean_prefix):
    monkeypatch.setattr(bytecode_cache, "install_is_writable", lambda package="torch": False)
    monkeypatch.setenv(bytecode_cache.PREFIX_ENV, str(tmp_path / "mine"))
    assert bytecode_cache.use_shared_cache() is None
    assert sys.pycache_prefix is None
    assert os.environ[bytecode_cache.PREFIX_ENV] == str(tmp_path / "mine")
