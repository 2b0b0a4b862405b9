"""``microscope tensorboard RESULTS_DIR``: TensorBoard on a run's logs, one command.

A run writes its event files to ``results/<run-id>/tensorboard/`` (one sub-run per variant, one
``diff-<candidate>`` per diff graph). ``logdir_of`` accepts that folder, the run folder above it, or a
results root holding several runs (TensorBoard then shows ``<run-id>/<variant>``). ``serve`` starts
TensorBoard as a child process on a local port, waits until it answers and lists the runs, and stops
it on exit: what the CLI does in the foreground, and what the screenshot test does in the background.
"""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from pathlib import Path

__all__ = ["free_port", "logdir_of", "main", "serve", "tensorboard_argv"]

_EVENTS = "events.out.tfevents.*"


def logdir_of(path: str | Path) -> Path:
    """The folder to give ``tensorboard --logdir``: ``<run>/tensorboard`` if there is one, else ``path``.

    Raises ``FileNotFoundError`` naming what to do when ``path`` holds no event file at all.
    """
    path = Path(path)
    if not path.is_dir():
        raise FileNotFoundError(f"{path} is not a folder (give a results folder, e.g. results/<run-id>)")
    candidate = path / "tensorboard"
    logdir = candidate if candidate.is_dir() else path
    if not any(logdir.rglob(_EVENTS)):
        raise FileNotFoundError(f"no TensorBoard event files under {logdir}: run with "
                                "`--set instrument.tensorboard=true` (or `instrument: {tensorboard: true}`)")
    return logdir


def free_port(host: str = "127.0.0.1") -> int:
    """A TCP port nothing listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def tensorboard_argv(logdir: Path, host: str, port: int, *, load_once: bool = False) -> list[str]:
    """The command line that serves ``logdir`` (the running Python's TensorBoard, no PATH lookup).

    ``load_once`` reads the logs once at start-up instead of polling them for new events.
    """
    argv = [sys.executable, "-m", "tensorboard.main", "--logdir", str(logdir), "--host", host, "--port", str(port)]
    return argv + ["--reload_interval", "0"] if load_once else argv


def _runs(url: str) -> list[str]:
    with urllib.request.urlopen(f"{url}/data/runs", timeout=5) as response:
        return list(json.loads(response.read().decode("utf-8")))


@contextlib.contextmanager
def serve(
    logdir: str | Path,
    *,
    host: str = "127.0.0.1",
    port: int | None = None,
    wait_for: Sequence[str] = (),
    timeout: float = 90.0,
) -> Iterator[str]:
    """TensorBoard on ``logdir`` (see ``logdir_of``) while the block runs; yields its URL once it lists
    the ``wait_for`` runs."""
    port = port or free_port(host)
    url = f"http://{host}:{port}"
    proc = subprocess.Popen(tensorboard_argv(logdir_of(logdir), host, port, load_once=True), stdout=subprocess.DEVNULL,
                            stderr=subprocess.PIPE)
    try:
        deadline = time.monotonic() + timeout
        while True:
            if proc.poll() is not None:
                err = proc.stderr.read().decode(errors="replace")[-2000:] if proc.stderr else ""
                raise RuntimeError(f"tensorboard exited with {proc.returncode}: {err}")
            try:
                runs = _runs(url)
                if runs and set(wait_for) <= set(runs):
                    break
            except (urllib.error.URLError, ConnectionError, TimeoutError, ValueError):
                pass
            if time.monotonic() > deadline:
                raise TimeoutError(f"tensorboard did not list {list(wait_for) or 'any run'} within {timeout:.0f} s")
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(timeout=10)
        if proc.stderr:
            proc.stderr.close()


def main(results_dir: str | Path, *, host: str = "127.0.0.1", port: int = 6006) -> int:
    """Serve the run's logs in the foreground until interrupted; 2 when there is nothing to serve."""
    try:
        logdir = logdir_of(results_dir)
    except FileNotFoundError as exc:
        print(f"microscope tensorboard: {exc}", file=sys.stderr)
        return 2
    argv = tensorboard_argv(logdir, host, port)
    print(f"TensorBoard on {logdir}: http://{host}:{port}/#graphs (runs: one per variant, diff-<variant> "
          f"for the diff graphs; Ctrl-C stops it). The same: tensorboard --logdir {logdir}", flush=True)
    try:
        return subprocess.call(argv)
    except KeyboardInterrupt:
        return 0
