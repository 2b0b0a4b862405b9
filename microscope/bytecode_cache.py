"""Python bytecode compiled once per run (or per user), not once per process.

A run starts several interpreters (its worker, the precompile processes), each importing torch and
often its compiler stack: thousands of modules. Where Python cannot save their bytecode beside them
(``PYTHONDONTWRITEBYTECODE=1``, common in container images, or a read-only install) every one of those
interpreters compiles every module again: ~9 s of CPU each on an H200 host, all at once. Python's
``pycache_prefix`` keeps the bytecode in a folder of ours instead: a temporary folder removed when the
run ends where the environment asked for no bytecode files, else a folder of the user's cache.
"""

from __future__ import annotations

import atexit
import importlib.util
import os
import shutil
import sys
import tempfile
from pathlib import Path

#: The environment variables Python reads at start-up (the run's processes inherit them).
PREFIX_ENV = "PYTHONPYCACHEPREFIX"
NO_BYTECODE_ENV = "PYTHONDONTWRITEBYTECODE"


def cache_folder() -> Path:
    """``$XDG_CACHE_HOME/microscope/pycache`` (``~/.cache`` when XDG_CACHE_HOME is not set)."""
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "microscope" / "pycache"


def _origin(package: str) -> str | None:
    spec = importlib.util.find_spec(package)
    return spec.origin if spec is not None and spec.origin and spec.origin.endswith(".py") else None


def install_has_bytecode(package: str = "torch") -> bool:
    """Whether ``package``'s modules have their bytecode beside them (pip writes it at install time); a
    prefix would hide it. True when the package is not installed: nothing to do for it."""
    origin = _origin(package)
    return origin is None or os.path.exists(importlib.util.cache_from_source(origin))


def install_is_writable(package: str = "torch") -> bool:
    """Whether Python can save bytecode beside ``package``'s modules (True when it is not installed)."""
    origin = _origin(package)
    if origin is None:
        return True
    folder = Path(origin).parent
    pycache = folder / "__pycache__"
    return os.access(pycache if pycache.is_dir() else folder, os.W_OK)


def use_shared_cache(package: str = "torch") -> Path | None:
    """Point this process, and every process it starts, at one bytecode folder where ``package``'s modules
    would otherwise be compiled by each of them; returns the folder, or None where nothing changed.

    No bytecode files wanted: a temporary folder, removed at exit, so no ``.pyc`` outlives the run.
    A read-only install: the user's cache folder, kept for the next run. Nothing changes where the user
    chose a prefix, or where the install holds its own bytecode (a prefix would hide it) or can save it.
    Call it before the heavy imports.
    """
    if sys.pycache_prefix or os.environ.get(PREFIX_ENV) or install_has_bytecode(package):
        return None
    if sys.dont_write_bytecode:
        folder = Path(tempfile.mkdtemp(prefix="microscope-pycache-"))
        atexit.register(shutil.rmtree, folder, ignore_errors=True)
        sys.dont_write_bytecode = False
        os.environ.pop(NO_BYTECODE_ENV, None)
    elif install_is_writable(package):
        return None
    else:
        folder = cache_folder()
        try:
            folder.mkdir(parents=True, exist_ok=True)
        except OSError:
            return None
        if not os.access(folder, os.W_OK):
            return None
    sys.pycache_prefix = str(folder)
    os.environ[PREFIX_ENV] = str(folder)
    return folder
