"""Name -> plugin: built-in rooms under ``kernels/``, installed entry points, and ``plugins:`` paths.

Three sources, one namespace. A clash between two sources is an error that names both origins; an
unknown name lists the known ones with a "did you mean". A plugin that raises while it is imported is
reported at the line of its own file where it raised (``my_plugin.py:12: plugin raised ...``), and a
``plugins:`` entry that cannot name a file or module (``~nobody/x.py``, a 5000-character path, a name
with spaces) is a ``PluginError`` saying so, never an ``OSError`` from deep inside ``pathlib``.
"""

from __future__ import annotations

import difflib
import importlib
import importlib.util
import os
import pkgutil
import re
import sys
import traceback
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


#: What importing a plugin may raise that is the plugin's fault (``sys.exit()`` at import included).
_PLUGIN_FAULTS = (Exception, SystemExit)
#: Longest path and path component the operating system takes (Linux: PATH_MAX, NAME_MAX).
MAX_PATH_CHARS, MAX_NAME_CHARS = 4096, 255


def _message(exc: BaseException) -> str:
    """``Type: message`` of an exception, its message cut to a readable length."""
    text = str(exc)
    text = text if len(text) <= 500 else f"{text[:497]}..."
    return f"{type(exc).__name__}: {text}" if text else type(exc).__name__


def _raise_line(exc: BaseException, file: Path | None) -> tuple[str, int] | None:
    """Where ``exc`` came from: the deepest traceback frame in ``file`` (or, without one, outside
    importlib's own frames), or the line a ``SyntaxError`` names."""
    if isinstance(exc, SyntaxError) and exc.filename and exc.lineno:
        if file is None or _same_file(exc.filename, file):
            return exc.filename, exc.lineno
    frames = traceback.extract_tb(exc.__traceback__)
    if file is not None:
        hits = [f for f in frames if _same_file(f.filename, file)]
    else:
        hits = [f for f in frames if not f.filename.startswith("<") and "importlib" not in f.filename
                and not _same_file(f.filename, Path(__file__))]
    return (hits[-1].filename, hits[-1].lineno or 0) if hits else None


def _same_file(name: str, file: Path) -> bool:
    try:
        return os.path.realpath(name) == os.path.realpath(file)
    except (OSError, ValueError):
        return False


def _import(module: str, origin: str) -> None:
    try:
        importlib.import_module(module)
    except api.RegistrationError:
        raise
    except _PLUGIN_FAULTS as exc:
        site = _raise_line(exc, None)
        at = f" at {site[0]}:{site[1]}" if site else ""
        raise PluginError(f"{origin}: importing {module} failed{at}: {_message(exc)}") from exc


def _shown(source: str) -> str:
    """A ``plugins:`` entry as messages quote it (a 5000-character path is cut)."""
    return repr(source) if len(source) <= 80 else f"{source[:60]!r}... ({len(source)} characters)"


def _plugin_path(source: str, base_dir: Path | None) -> Path:
    """The ``.py`` file a ``plugins:`` entry names, checked to exist; a clear ``PluginError`` otherwise."""
    shown = _shown(source)
    names = re.split(r"[/\\]", source)
    if len(source) > MAX_PATH_CHARS or any(len(name) > MAX_NAME_CHARS for name in names):
        raise PluginError(f"plugin file {shown}: path too long (a path holds at most {MAX_PATH_CHARS} characters, "
                          f"each name in it at most {MAX_NAME_CHARS}); check the entry")
    if "\x00" in source:
        raise PluginError(f"plugin file {shown}: a path cannot hold a NUL character; check the entry")
    try:
        path = Path(source).expanduser()
    except RuntimeError:  # "~nobody/x.py": no such user, or no home directory to expand "~"
        raise PluginError(f"plugin file {shown} not found: {names[0]!r} names no home directory on this "
                          "machine; write the path relative to the config or in full") from None
    if not path.is_absolute() and base_dir is not None:
        path = base_dir / path
    try:
        is_file, is_dir = path.is_file(), path.is_dir()
    except (OSError, ValueError) as exc:
        raise PluginError(f"plugin file {shown} cannot be looked up ({getattr(exc, 'strerror', None) or exc}); "
                          "check the entry") from exc
    if is_dir:
        raise PluginError(f"plugin file {shown} is a folder ({path}); name the .py file in it")
    if not is_file:
        raise PluginError(f"plugin file {shown} not found (looked at {path})")
    if path.suffix != ".py":
        raise PluginError(f"plugin file {shown} is not a .py file; plugins are Python files or module names")
    return path


def _is_module_name(source: str) -> bool:
    return all(part.isidentifier() for part in source.split("."))


def load_plugin_source(source: str, base_dir: Path | None = None) -> None:
    """Import a plugin from a ``.py`` file path (relative to ``base_dir``) or a dotted module name."""
    looks_like_path = source.endswith(".py") or "/" in source or "\\" in source or source.startswith("~")
    if not looks_like_path:
        if not _is_module_name(source):
            raise PluginError(f"plugin {_shown(source)} is neither a .py file nor a module name (dotted Python "
                              "identifiers such as my_package.ablations)")
        _import(source, f"plugin module {source!r}")
        return
    path = _plugin_path(source, base_dir)
    try:
        real = os.path.realpath(path)
    except (OSError, ValueError):
        real = os.path.abspath(path)
    name = f"microscope_user_plugin_{path.stem}_{abs(hash(real)) % 10**8}"
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
    except _PLUGIN_FAULTS as exc:
        del sys.modules[name]
        site = _raise_line(exc, path)
        at = f"{path}:{site[1]}" if site else str(path)
        raise PluginError(f"{at}: plugin raised {_message(exc)}") from exc


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


def import_room(name: str) -> None:
    """Import the built-in room ``kernels/<name>/`` alone, if there is one: a run needs its own plugin, and
    importing all of them costs seconds in every process (the parent and each worker)."""
    module = f"{BUILTIN_PACKAGE}.{name}.ablation"
    if not name.isidentifier() or name in BROKEN or module in sys.modules:
        return
    try:
        if importlib.util.find_spec(module) is None:
            return
    except (ImportError, ValueError):
        return
    try:
        _import(module, f"built-in room kernels/{name}/")
    except PluginError as exc:
        BROKEN[name] = str(exc)


def get(name: str, extra_sources: Iterable[str] = (), base_dir: Path | None = None) -> Ablation:
    """An instance of the plugin registered as ``name``; unknown names get a "did you mean".

    The room of that name (and ``extra_sources``) is imported first; every other source only when the
    name is not found there (an entry point, a typo to suggest a fix for).
    """
    import_room(name)
    for source in extra_sources:
        load_plugin_source(source, base_dir)
    if name in api._REGISTERED:
        plugins = {name: api._REGISTERED[name][0]}
    else:
        plugins = discover(extra_sources, base_dir)
    if name not in plugins and name in BROKEN:
        raise PluginError(f"plugin {name!r} failed to load: {BROKEN[name]}")
    if name not in plugins:
        close = difflib.get_close_matches(name, [*plugins, *BROKEN], n=3, cutoff=0.5)
        hint = f" Did you mean {', '.join(repr(c) for c in close)}?" if close else ""
        known = ", ".join(plugins) or "(none)"
        raise PluginError(f"no plugin named {name!r}.{hint} Known plugins: {known}.")
    try:
        return plugins[name]()
    except _PLUGIN_FAULTS as exc:  # a plugin class with its own __init__ that raises
        site = _raise_line(exc, None)
        at = f"{site[0]}:{site[1]}: " if site else ""
        raise PluginError(f"{at}creating plugin {name!r} raised {_message(exc)}") from exc
