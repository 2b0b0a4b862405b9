"""One ``microscope run`` in a fresh Python process: the unit of every comparison across runs.

Two runs in one process share the allocator, the JIT caches and the warmed-up clocks; two nights do
not. ``compare --repeat`` and ``regress`` therefore start each run as its own process, so the spread
between their values is the between-run noise a night-to-night verdict must beat.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

EXIT_BAD_INPUT, EXIT_TIMED_OUT = 2, 124
DEFAULT_TIMEOUT_S = 3600.0

__all__ = ["DEFAULT_TIMEOUT_S", "EXIT_TIMED_OUT", "FreshRun", "FreshRunError", "run_fresh"]


class FreshRunError(Exception):
    """The run refused its config or command line (exit 2): bad input, not a measurement."""


@dataclass(frozen=True)
class FreshRun:
    """One finished run: its folder, exit code (124: killed at its time limit), wall time and output's tail."""

    config: Path
    folder: Path | None
    exit_code: int
    seconds: float
    output_tail: str

    @property
    def completed(self) -> bool:
        """Whether the process ended by itself with a gate outcome (0 pass, 1 fail), not a crash or a kill."""
        return self.exit_code in (0, 1)

    def describe_exit(self) -> str:
        """How the process ended, as a predicate: "exited 0", "was killed at its time limit (exit 124)"."""
        if self.exit_code == EXIT_TIMED_OUT:
            return "was killed at its time limit (exit 124)"
        if self.exit_code < 0:
            return f"was killed by signal {-self.exit_code}"
        return f"exited {self.exit_code}" + ("" if self.completed else " (crashed or interrupted)")


def _run_folders(root: Path) -> set[Path]:
    return {p for p in root.iterdir() if (p / "records.jsonl").is_file()} if root.is_dir() else set()


def run_fresh(config: Path, out_root: Path, *, device: str | None = None, quick: bool = False, seed: int | None = None,
              sets: Sequence[str] = (), env: Mapping[str, str] | None = None, report: bool = False,
              extra_args: Sequence[str] = (), timeout_s: float = DEFAULT_TIMEOUT_S) -> FreshRun:
    """Run ``config`` once with ``python -m microscope.cli run`` into ``out_root``; returns the new run folder.

    ``env`` adds environment variables for that process only. A run still going after ``timeout_s`` is
    killed with its process group (exit code 124; what it wrote is kept). A run that crashed before
    writing records has ``folder`` None. Raises ``FreshRunError`` when the run exits 2: it refused its
    config or command line (the message is in the error).
    """
    out_root.mkdir(parents=True, exist_ok=True)
    before = _run_folders(out_root)
    cmd = [sys.executable, "-m", "microscope.cli", "run", str(config), "--out", str(out_root), "--no-progress"]
    cmd += [] if report else ["--no-report"]
    cmd += ["--seed", str(seed)] if seed is not None else []
    cmd += (["--device", device] if device else []) + (["--quick"] if quick else [])
    cmd += ["--set", *sets] if sets else []
    cmd += list(extra_args)
    start = time.perf_counter()
    code, stdout, stderr = _call(cmd, {**os.environ, **(env or {})}, timeout_s)
    seconds = time.perf_counter() - start
    tail = (stdout[-3000:] + ("\n" + stderr[-3000:] if stderr.strip() else "")).strip()
    if code == EXIT_BAD_INPUT:
        raise FreshRunError(f"{config}: the run refused its config:\n{stderr.strip()[-2000:] or tail[-2000:]}")
    new = sorted(_run_folders(out_root) - before)
    return FreshRun(config, new[-1] if new else None, code, seconds, tail)


def _call(cmd: list[str], env: dict[str, str], timeout_s: float) -> tuple[int, str, str]:
    """Run ``cmd`` in its own session; at ``timeout_s`` kill the whole group (worker processes too)."""
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
                            start_new_session=True)
    try:
        stdout, stderr = proc.communicate(timeout=timeout_s)
        return proc.returncode, stdout, stderr
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        stdout, stderr = proc.communicate()
        return EXIT_TIMED_OUT, stdout, stderr + f"\nkilled after {timeout_s:.0f} s"
    except BaseException:  # interrupted: the run is in its own session, so Ctrl-C did not reach it
        _kill_group(proc)
        proc.wait()
        raise


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except (ProcessLookupError, PermissionError):
        pass
