"""The environment a measurement was taken in, recorded with every record.

Numbers from different commits, library versions or devices must never be compared silently, so each
record carries enough to tell them apart.
"""

from __future__ import annotations

import hashlib
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

import torch

from microscope.device import device_name


@cache
def git_commit() -> str:
    """``<sha>`` of the checkout microscope runs from (``+dirty`` with local changes), or ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "HEAD"], cwd=here, capture_output=True, text=True, timeout=10, check=True
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=here, capture_output=True, text=True, timeout=10, check=True,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "unknown"


def _triton_version() -> str:
    try:
        import triton

        return triton.__version__
    except ImportError:
        return "absent"


def config_hash(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def capture(device: str, interpreted: bool, cfg_hash: str) -> dict[str, Any]:
    """A small dict for every record: commit, versions, device, config hash."""
    env: dict[str, Any] = {
        "commit": git_commit(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "triton": _triton_version(),
        "device_name": device_name(device),
        "config_hash": cfg_hash,
        "interpreter": interpreted,
        "host_cpus": os.cpu_count(),
    }
    if device == "cuda":
        env["cuda"] = torch.version.cuda
        env["capability"] = ".".join(map(str, torch.cuda.get_device_capability()))
    env["platform"] = f"{sys.platform}-{platform.machine()}"
    return env
