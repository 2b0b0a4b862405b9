"""The local executor (the default): trial groups in spawned worker processes, with a time limit each.

A worker that dies (a signal, an abort, a segfault, a CUDA error that poisons its context) or runs
past ``timeout_s`` is killed and replaced. The variant it was running (shared memory says which) is
recorded as failed with the reason (signal name or exit code, the last lines of its stderr, "timed out
after N s"), and the group is rerun without it, so every other variant of the case still gets its
numbers. If the baseline itself is to blame, or no variant was running, the whole group fails.
"""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import tempfile
import time
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field
from multiprocessing.connection import wait
from pathlib import Path
from typing import TYPE_CHECKING, Any

from microscope.executors.groups import Group, GroupOutcome
from microscope.executors.worker import GROUP_BANNER, RunSpec, worker_main

if TYPE_CHECKING:
    from microscope.executors.driver import Driver
    from microscope.runner import RunBase

#: Seconds a worker gets to leave after it is told to (then it is killed).
GRACE_S = 10.0
#: Seconds a new worker may take to import torch and the plugin before its group fails.
STARTUP_S = 300.0
TAIL_LINES = 6


@dataclass
class Attempt:
    """One try at a group: the variants left out so far (culprits of earlier tries) and why."""

    group: Group
    culprits: dict[str, str] = field(default_factory=dict)
    number: int = 1
    records: list[Any] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    started: float = 0.0
    first_started: float = 0.0


class Worker:
    """One spawned worker process, its pipe, its shared "running now" marker and its log."""

    def __init__(self, spec: RunSpec | None, index: int, log_dir: Path | None, gpu: int | None,
                 warm: bool = False) -> None:
        ctx = multiprocessing.get_context("spawn")
        self.conn, child = ctx.Pipe()
        self.marker = ctx.Array("c", 256, lock=False)
        if spec is None or log_dir is None:  # an early worker: a log of its own until it is told its run's
            fd, early_log = tempfile.mkstemp(prefix="microscope-worker-", suffix=".log")
            os.close(fd)
            self.log = Path(early_log)
        else:
            self.log = log_dir / f"worker-{index}.log"
        self.proc = ctx.Process(target=worker_main, args=(spec, child, self.marker, str(self.log), warm),
                                name=f"microscope-worker-{index}", daemon=True)
        saved = os.environ.get("CUDA_VISIBLE_DEVICES")
        if gpu is not None:
            os.environ["CUDA_VISIBLE_DEVICES"] = str(gpu)
        try:
            self.proc.start()
        except OSError:
            if spec is None:
                self.log.unlink(missing_ok=True)
            raise
        finally:
            if gpu is not None:
                if saved is None:
                    os.environ.pop("CUDA_VISIBLE_DEVICES", None)
                else:
                    os.environ["CUDA_VISIBLE_DEVICES"] = saved
        child.close()
        self.attempt: Attempt | None = None
        self.ready = False
        self.born = time.monotonic()
        self.last_words: str | None = None  # what the worker said before it exited (read on an earlier poll)
        self.adopted = spec is not None  # an early worker belongs to the CLI until an executor takes it

    @classmethod
    def early(cls) -> Worker:
        """A worker started before its run is planned (``microscope run`` starts one first thing): it
        imports torch and the harness while the parent does the same, then waits for ``assign``."""
        return cls(None, 0, None, None)

    def assign(self, spec: RunSpec, index: int, log_dir: Path, gpu: int | None, warm: bool) -> None:
        """Tell an early worker its run: it moves its log to the run's folder and builds the runner."""
        log = log_dir / f"worker-{index}.log"
        try:
            self.conn.send(("setup", spec, str(log), warm, gpu, dict(os.environ)))
        except OSError:  # it died importing: its own log keeps the reason, read when the executor polls it
            return
        self.log = log

    def discard(self) -> None:
        """Stop an early worker that no run needed, and remove its log."""
        self.kill()
        self.conn.close()
        self.log.unlink(missing_ok=True)

    def running(self) -> str | None:
        name = bytes(self.marker.value).decode("utf-8", "replace")
        return name or None

    def death(self) -> str:
        """Why the process ended: signal name or exit code, and the last lines of its log."""
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is None:
            what = "did not exit"
        elif code < 0:
            try:
                what = f"killed by {signal.Signals(-code).name}"
            except ValueError:
                what = f"killed by signal {-code}"
        else:
            what = f"exited with code {code}"
        tail = self.tail()
        return f"worker process {what}" + (f"; its last output: {tail}" if tail else "")

    def tail(self) -> str:
        try:
            text = self.log.read_text(encoding="utf-8", errors="replace")
        except OSError:
            return ""
        text = text.rsplit(GROUP_BANNER, 1)[-1].split("\n", 1)[-1]
        lines = [line.strip() for line in text.splitlines() if line.strip()]
        fatal = next((i for i, line in enumerate(lines) if line.startswith("Fatal Python error")), None)
        if fatal is not None:  # faulthandler's dump: the error and the innermost frames, not the module list
            frames = [line for line in lines[fatal:] if line.startswith("File ")][:3]
            return " | ".join([lines[fatal], *frames])[:600]
        return " | ".join(lines[-TAIL_LINES:])[-600:]

    def kill(self) -> None:
        if self.proc.is_alive():
            self.proc.kill()
        self.proc.join(GRACE_S)

    def stop(self) -> None:
        try:
            self.conn.send(None)
        except OSError:
            pass
        self.proc.join(GRACE_S)
        if self.proc.is_alive():
            self.kill()
        self.conn.close()


class LocalExecutor:
    def __init__(self, runner: RunBase, spec: RunSpec, *, jobs: int = 1, timeout_s: float = 600.0,
                 gpus: int = 0, early: Worker | None = None) -> None:
        self.runner = runner
        self.spec = spec
        self.jobs = max(1, jobs)
        self.timeout_s = timeout_s
        self.gpus = gpus
        self.log_dir = Path(spec.out_root) / spec.run_id / "workers"
        self.idle: list[Worker] = []
        self._started = 0
        self._early = early  # started by the CLI before the run was planned; its first worker
        if early is not None:
            early.adopted = True

    def _worker(self, warm: bool = False) -> Worker:
        if self.idle:
            return self.idle.pop()
        gpu = self._started % self.gpus if self.gpus > 1 else None
        self.log_dir.mkdir(parents=True, exist_ok=True)
        if self._early is not None:
            worker, self._early = self._early, None
            worker.assign(self.spec, self._started, self.log_dir, gpu, warm)
        else:
            worker = Worker(self.spec, self._started, self.log_dir, gpu, warm)
        self._started += 1
        return worker

    def prestart(self, warm: bool = False) -> None:
        """Start (or tell its run to) the first worker now: its imports (torch, Triton, the plugin: seconds)
        and, with ``warm``, its GPU libraries' first-use costs (``worker.warm_gpu_libraries``) then overlap
        the parent's own work (a precompile step)."""
        if not self.idle and not self._started:
            self.idle.append(self._worker(warm=warm))

    def run(self, groups: Sequence[Group], driver: Driver) -> set[str]:
        queue: deque[Attempt] = deque(Attempt(g) for g in groups)
        busy: list[Worker] = []
        finished: set[str] = set()
        while queue or busy:
            if driver.should_stop():
                # groups in flight keep what they measured (written before any worker is killed, as a killed
                # CUDA process may take seconds to go and a supervisor's SIGKILL may come first); --resume
                # reruns them whole
                for worker in busy:
                    driver.keep_cut(worker.attempt.group, self._measured(worker))
                for worker in busy:
                    worker.kill()
                    worker.conn.close()
                break
            while queue and len(busy) < self.jobs:
                attempt = queue.popleft()
                worker = self._worker()
                now = time.monotonic()
                attempt.started, attempt.first_started = now, attempt.first_started or now
                attempt.records = []
                worker.attempt = attempt
                worker.conn.send((attempt.group, frozenset(attempt.culprits)))
                busy.append(worker)
            wait([w.conn for w in busy] + [w.proc.sentinel for w in busy], timeout=0.25)
            for worker in list(busy):
                outcome, retry = self._poll(worker, driver)
                if outcome is None and retry is None:
                    continue
                busy.remove(worker)
                if retry is not None:
                    queue.appendleft(retry)
                if outcome is not None:
                    driver.commit(outcome)
                    finished.add(outcome.group.key)
        return finished

    @staticmethod
    def _measured(worker: Worker) -> list:
        """The records a worker's attempt streamed so far, with those still in its pipe."""
        attempt = worker.attempt
        assert attempt is not None
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                if message[0] == "record":
                    attempt.records.append(message[1])
        except (EOFError, OSError):
            pass
        return list(attempt.records)

    def _poll(self, worker: Worker, driver: Driver) -> tuple[GroupOutcome | None, Attempt | None]:
        """Read what the worker sent; settle its attempt if it finished, died or ran out of time."""
        attempt = worker.attempt
        assert attempt is not None
        try:
            while worker.conn.poll():
                message = worker.conn.recv()
                kind = message[0]
                if kind == "ready":
                    worker.ready = True
                    attempt.started = time.monotonic()
                elif kind == "record":
                    attempt.records.append(message[1])
                elif kind == "progress":
                    driver.progress(message[1])
                elif kind == "poisoned":
                    worker.last_words = f"CUDA error poisoned the worker's context: {message[2]}"
                elif kind == "done":
                    _, _key, notes, replace = message
                    attempt.notes += notes
                    if replace:
                        worker.proc.join(GRACE_S)
                        worker.conn.close()
                    else:
                        self.idle.append(worker)
                    return self._finish(attempt), None
        except (EOFError, OSError):
            pass  # the pipe closed: the process is gone; the sentinel says so below
        if worker.proc.is_alive():
            if not worker.ready:
                if time.monotonic() - worker.born <= STARTUP_S:
                    return None, None
                worker.kill()
                why, culprit = f"the worker process did not start within {STARTUP_S:g} s", None
            elif time.monotonic() - attempt.started <= self.timeout_s:
                return None, None
            else:
                culprit = worker.running()
                worker.kill()
                why = f"timed out after {self.timeout_s:g} s" + (f" in {culprit}" if culprit else "")
        else:
            culprit = worker.running()
            why = worker.last_words or worker.death()
        worker.conn.close()
        return self._blame(attempt, culprit, why)

    def _blame(self, attempt: Attempt, culprit: str | None, why: str) -> tuple[GroupOutcome | None, Attempt | None]:
        """A dead attempt: rerun the group without the variant to blame, or fail it whole."""
        group = attempt.group
        baseline = group.variants[0] if group.variants else None
        if culprit is not None and culprit != baseline and culprit not in attempt.culprits:
            culprits = {**attempt.culprits, culprit: why}
            return None, Attempt(group, culprits, attempt.number + 1, notes=attempt.notes,
                                 first_started=attempt.first_started)
        records = []
        for name, reason in attempt.culprits.items():
            records += self.runner.failure_records(group, name, reason)
        left = [v for v in group.variants if v not in attempt.culprits]
        whom = f" while {culprit} ran" if culprit else ""
        for name in left:
            records += self.runner.failure_records(group, name, f"{why}{whom}")
        return GroupOutcome(group, records, status="failed", reason=f"{why}{whom}", culprits=dict(attempt.culprits),
                            attempts=attempt.number, seconds=time.monotonic() - attempt.first_started,
                            notes=attempt.notes), None

    def _finish(self, attempt: Attempt) -> GroupOutcome:
        records = list(attempt.records)
        for name, reason in attempt.culprits.items():
            records += self.runner.failure_records(attempt.group, name, reason)
        status = "failed" if attempt.culprits else "ok"
        reason = "; ".join(f"{n}: {r}" for n, r in attempt.culprits.items()) or None
        return GroupOutcome(attempt.group, records, status=status, reason=reason, culprits=dict(attempt.culprits),
                            attempts=attempt.number, seconds=time.monotonic() - attempt.first_started,
                            notes=attempt.notes)

    def close(self) -> None:
        for worker in self.idle:
            worker.stop()
        self.idle = []
        if self._early is not None:  # never needed (a run with nothing to measure)
            self._early.discard()
            self._early = None


#: A config naming another executor (top level, a profile or the quick overlay) gets no early worker.
_OTHER_EXECUTOR = re.compile(r"\bkind:\s*['\"]?(inline|ray)\b")


def early_worker(config: Path, executor: str | None) -> Worker | None:
    """``microscope run CONFIG``'s first worker, started before the CLI imports torch: a worker's start-up
    (torch, Triton, CUDA: ~10 s on an H200 host) then overlaps the CLI's own. None where the run will not
    use the local executor, as far as the command line and the config's text say."""
    if executor not in (None, "local"):
        return None
    try:
        text = config.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError):
        return None
    if _OTHER_EXECUTOR.search(text):
        return None
    try:
        return Worker.early()
    except OSError:  # no process could be started here: the executor tries again, and reports it, when it needs one
        return None
