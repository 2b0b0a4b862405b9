"""The environment a measurement was taken in, recorded with every record.

Numbers from different commits, library versions or devices must never be compared silently, so each
record carries enough to tell them apart, and ``machine_fingerprint`` names the machine a run's timings
belong to (the history compares a night only with nights of the same fingerprint). torch is imported
only by ``capture``, so reading a fingerprint stays cheap.
"""

from __future__ import annotations

import hashlib
import json
import os
import platform
import subprocess
import sys
from functools import cache
from pathlib import Path
from typing import Any

#: What makes timings comparable between two runs: the machine, not the software on it. Library
#: versions and the commit are left out on purpose: they are what a history compares across.
FINGERPRINT_KEYS = ("platform", "device_name", "capability", "gpu_driver", "gpu_memory_bytes", "cpu_model",
                    "host_cpus")
#: CI variables that name the branch of a detached checkout (GitHub Actions, GitLab CI).
BRANCH_VARIABLES = ("GITHUB_HEAD_REF", "GITHUB_REF_NAME", "CI_COMMIT_REF_NAME")


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


@cache
def git_branch() -> str:
    """The checked-out branch; on a detached checkout (CI) the branch a CI variable names, else ``unknown``."""
    here = Path(__file__).resolve().parent
    try:
        name = subprocess.run(["git", "rev-parse", "--abbrev-ref", "HEAD"], cwd=here, capture_output=True,
                              text=True, timeout=10, check=True).stdout.strip()
    except (OSError, subprocess.SubprocessError):
        name = ""
    if name and name != "HEAD":
        return name
    return next((os.environ[v] for v in BRANCH_VARIABLES if os.environ.get(v)), "unknown")


#: numpy's SIMD dispatch targets, best first: the first this CPU supports is the path numpy's math takes.
_NUMPY_TARGETS = ("AVX512_SPR", "AVX512_ICL", "AVX512_CNL", "AVX512_CLX", "AVX512_SKX", "AVX512F", "AVX2", "FMA3",
                  "AVX", "SSE42", "SVE", "ASIMDHP", "ASIMD", "NEON", "VSX4", "VSX3", "VSX2", "VX")


@cache
def numpy_simd() -> str:
    """The best SIMD target numpy dispatches to here (it computes the Triton interpreter's math), or ``""``."""
    try:
        from numpy._core._multiarray_umath import __cpu_features__ as features
    except ImportError:
        try:
            from numpy.core._multiarray_umath import __cpu_features__ as features
        except ImportError:
            return ""
    return next((t for t in _NUMPY_TARGETS if features.get(t)), "baseline")


@cache
def cpu_model() -> str:
    """The CPU's model name (``/proc/cpuinfo`` on Linux, else what ``platform`` says)."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as fh:
            for line in fh:
                if line.lower().startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or platform.machine() or "unknown"


@cache
def gpu_driver() -> str | None:
    """The NVIDIA driver version: NVML where ``pynvml`` is installed, else ``/proc/driver/nvidia/version``."""
    try:
        import pynvml  # type: ignore[import-not-found]

        pynvml.nvmlInit()
        version = pynvml.nvmlSystemGetDriverVersion()
        return version.decode() if isinstance(version, bytes) else str(version)
    except Exception:  # no NVML, no driver, no permission
        pass
    try:
        text = Path("/proc/driver/nvidia/version").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return None
    words = text.split()
    if "Module" in words and words.index("Module") + 1 < len(words):
        return words[words.index("Module") + 1]
    return None


def machine_fingerprint(env: dict[str, Any]) -> str:
    """A short stable hash of the ``FINGERPRINT_KEYS`` of a record's ``env``: two runs with the same
    fingerprint ran on interchangeable machines, so their timings may be compared across nights."""
    parts = {key: env.get(key) for key in FINGERPRINT_KEYS if env.get(key) not in (None, "")}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:12]


def machine_summary(env: dict[str, Any]) -> str:
    """The machine in words, e.g. ``NVIDIA H200 (sm 9.0, driver 570.86, 140 GiB), linux-x86_64``."""
    extra = [f"sm {env['capability']}" if env.get("capability") else "",
             f"driver {env['gpu_driver']}" if env.get("gpu_driver") else "",
             f"{int(env['gpu_memory_bytes']) / 2**30:.0f} GiB" if env.get("gpu_memory_bytes") else ""]
    if not env.get("capability") and env.get("host_cpus"):
        extra.append(f"{env['host_cpus']} CPUs")
    name = env.get("device_name") or "unknown device"
    if not env.get("capability") and env.get("cpu_model"):
        name = env["cpu_model"]
    inner = ", ".join(e for e in extra if e)
    return f"{name}{f' ({inner})' if inner else ''}, {env.get('platform', 'unknown platform')}"


def capture(device: str, interpreted: bool, cfg_hash: str) -> dict[str, Any]:
    """A small dict for every record: commit, branch, versions, device, machine, config hash."""
    import torch

    from microscope.device import device_name, gpu_facts

    env: dict[str, Any] = {
        "commit": git_commit(),
        "branch": git_branch(),
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
        env["capability"] = gpu_facts().capability
        env["gpu_memory_bytes"] = gpu_facts().memory_bytes
        env["gpu_driver"] = gpu_driver()
    env["cpu_model"] = cpu_model()  # launch-bound kernels time the host too
    # the SIMD level torch's CPU kernels dispatch to: it changes the last bits of CPU results
    env["cpu_capability"] = torch.backends.cpu.get_cpu_capability()
    env["numpy_simd"] = numpy_simd()  # and numpy's, which the Triton interpreter computes with
    env["platform"] = f"{sys.platform}-{platform.machine()}"
    return env
