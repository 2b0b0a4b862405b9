"""Name -> plugin: built-in rooms under ``kernels/``, installed entry points, and ``plugins:`` paths.

Three sources, one namespace. A clash between two sources is an error that names both origins; an
unknown name lists the known ones with a "did you mean".
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import pkgutil
import sys
from collections.abc import Iterable
from importlib.metadata import entry_points
from pathlib import Path

from microscope import api
from microscope.api import Ablation

ENTRY_POINT_GROUP = "microscope.ablations"
BUILTIN_PACKAGE = "microscope_kernels"


class PluginError(Exception):
    """A plugin could not be found, imported or registered."""


#: Plugin sources that failed to import: name (room or entry point) -> why. One broken room must not
#: stop every other plugin from running, so the error is raised only when that name is asked for.
BROKEN: dict[str, str] = {}


def _import_builtins() -> None:
    """Import ``microscope_kernels.<room>.ablation`` for every room that has one."""
    package = importlib.import_module(BUILTIN_PACKAGE)
    for info in sorted(pkgutil.iter_modules(package.__path__), key=lambda m: m.name):
        if not info.ispkg:
            continue
        module = f"{BUILTIN_PACKAGE}.{info.name}.ablation"
        if importlib.util.find_spec(module) is None:
            continue
        try:
            _import(module, f"built-in room kernels/{info.name}/")
        except PluginError as exc:
            BROKEN[info.name] = str(exc)


def _import_entry_points() -> None:
    for ep in entry_points(group=ENTRY_POINT_GROUP):
        try:
            ep.load()
        except api.RegistrationError:
            raise
        except Exception as exc:  # a broken third-party package must say who it is
            BROKEN[ep.name] = f"entry point {ep.name!r} ({ep.value}) of group {ENTRY_POINT_GROUP} failed: {exc}"


def _import(module: str, origin: str) -> None:
    try:
        importlib.import_module(module)
    except api.RegistrationError:
        raise
    except Exception as exc:
        raise PluginError(f"{origin}: importing {module} failed: {type(exc).__name__}: {exc}") from exc


def load_plugin_source(source: str, base_dir: Path | None = None) -> None:
    """Import a plugin from a ``.py`` file path (relative to ``base_dir``) or a dotted module name."""
    looks_like_path = source.endswith(".py") or "/" in source or "\\" in source
    if not looks_like_path:
        _import(source, f"plugin module {source!r}")
        return
    path = Path(source).expanduser()
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    if not path.is_file():
        raise PluginError(f"plugin file {source!r} not found (looked at {path})")
    name = f"microscope_user_plugin_{path.stem}_{abs(hash(str(path.resolve()))) % 10**8}"
    if name in sys.modules:
        return
    spec = importlib.util.spec_from_file_location(name, path)
    if spec is None or spec.loader is None:
        raise PluginError(f"plugin file {path} cannot be imported as a Python module")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    try:
        spec.loader.exec_module(module)
    except api.RegistrationError:
        del sys.modules[name]
        raise
    except Exception as exc:
        del sys.modules[name]
        raise PluginError(f"plugin file {path}: {type(exc).__name__}: {exc}") from exc


_discovered = False


def discover(extra_sources: Iterable[str] = (), base_dir: Path | None = None) -> dict[str, type[Ablation]]:
    """Import every plugin source and return name -> plugin class."""
    global _discovered
    if not _discovered:
        _import_builtins()
        _import_entry_points()
        _discovered = True
    for source in extra_sources:
        load_plugin_source(source, base_dir)
    return {name: cls for name, (cls, _) in sorted(api._REGISTERED.items())}


def get(name: str, extra_sources: Iterable[str] = (), base_dir: Path | None = None) -> Ablation:
    """An instance of the plugin registered as ``name``; unknown names get a "did you mean"."""
    plugins = discover(extra_sources, base_dir)
    if name not in plugins and name in BROKEN:
        raise PluginError(f"plugin {name!r} failed to load: {BROKEN[name]}")
    if name not in plugins:
        close = difflib.get_close_matches(name, [*plugins, *BROKEN], n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(plugins) or "(none)"
        raise PluginError(f"no plugin named {name!r}.{hint} Known plugins: {known}.")
    return plugins[name]()
