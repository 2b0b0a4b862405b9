"""The driver: feeds a runner's trial groups to an executor and is the only writer of the run's files.

Records of a group reach ``records.jsonl`` together once the group finishes, then its line reaches
``groups.jsonl``. A group cut short by an interrupt or the run's ``max_wall_s`` keeps the records its
worker had measured (a model-level seed's finished arms), with no ``groups.jsonl`` line: the reports show
them, and ``--resume`` drops them and reruns the group whole. SIGINT and SIGTERM stop the run between
groups (an inline group is interrupted where it is): what finished is kept and the reports are written
from it.
"""

from __future__ import annotations

import signal
import threading
import time
from typing import TYPE_CHECKING, Any

from microscope.executors.groups import Group, GroupLog, GroupOutcome, Resume, RunOutcome, record_from_dict
from microscope.store.records import RecordWriter

if TYPE_CHECKING:
    from microscope.executors import Executor
    from microscope.runner import RunBase


class Driver:
    def __init__(self, runner: RunBase, executor: Executor, *, resume: Resume | None = None,
                 max_wall_s: float | None = None) -> None:
        self.runner = runner
        self.executor = executor
        self.resume = resume
        self.deadline = time.monotonic() + max_wall_s if max_wall_s else None
        self.max_wall_s = max_wall_s
        self.outcome = RunOutcome()
        self._stop: str | None = None
        self._writer: RecordWriter | None = None
        self._log: GroupLog | None = None
        self._committed = 0

    # -- what executors call ------------------------------------------------------------------
    def should_stop(self) -> bool:
        """True once a signal arrived, or the run's wall-time budget is spent and this invocation finished
        a group (so every resume makes progress)."""
        if (self._stop is None and self.deadline is not None and time.monotonic() >= self.deadline
                and self._committed):
            self._stop = f"max_wall_s ({self.max_wall_s:g} s) spent"
        return self._stop is not None

    def seconds_left(self) -> float | None:
        return None if self.deadline is None else max(0.0, self.deadline - time.monotonic())

    def commit(self, outcome: GroupOutcome) -> None:
        """Write a finished group's records, then its line in ``groups.jsonl``."""
        assert self._writer is not None and self._log is not None
        for record in outcome.records:
            self._writer.write(record)
        self.runner.records.extend(outcome.records)
        self._log.write(outcome)
        self._committed += 1
        self.outcome.finished.append(outcome.line())
        for note in outcome.notes:
            self.progress(f"{outcome.group.label}: {note}")
        if outcome.status != "ok":
            self.progress(f"{outcome.group.label}: group failed: {outcome.brief()}")

    def keep_cut(self, group: Group, records: list) -> None:
        """Write the records a group cut short had measured, without its ``groups.jsonl`` line."""
        assert self._writer is not None
        if not records:
            return
        for record in records:
            self._writer.write(record)
        self.runner.records.extend(records)
        self.outcome.cut_records += len(records)
        self.progress(f"{group.label}: cut short; its {len(records)} measured record(s) are kept, and a resume "
                      "reruns the group")

    def progress(self, message: str) -> None:
        self.runner.on_progress(message)

    def stop(self, why: str) -> None:
        self._stop = self._stop or why

    # -- the run ------------------------------------------------------------------------------
    def run(self) -> RunOutcome:
        runner, out = self.runner, self.outcome
        done: dict[str, dict[str, Any]] = {}
        if self.resume is not None:
            done = self.resume.done
            runner.records.extend(record_from_dict(r) for r in self.resume.kept)
            out.finished.extend(done.values())
            out.resumed = len(done)
            for message in self.resume.messages:
                self.progress(message)
        previous = self._install_signals()
        self._writer = RecordWriter(runner.out_dir / "records.jsonl")
        self._log = GroupLog(runner.out_dir)
        try:
            for batch in runner.batches():
                out.total += len(batch)
                todo = [g for g in batch if g.key not in done]
                if self.should_stop():
                    out.unfinished += [g.key for g in todo]
                    continue
                finished = self.executor.run(todo, self)
                out.unfinished += [g.key for g in todo if g.key not in finished]
        finally:
            self.executor.close()
            self._writer.close()
            self._log.close()
            self._restore_signals(previous)
            runner.close()
        out.stopped = self._stop
        return out

    def _install_signals(self) -> dict[int, Any]:
        if threading.current_thread() is not threading.main_thread():
            return {}
        previous = {}

        def handler(signum: int, _frame: Any) -> None:
            self.stop(f"interrupted ({signal.Signals(signum).name})")
            if getattr(self.executor, "interrupt_in_place", False):
                raise KeyboardInterrupt

        for sig in (signal.SIGINT, signal.SIGTERM):
            previous[sig] = signal.signal(sig, handler)
        return previous

    @staticmethod
    def _restore_signals(previous: dict[int, Any]) -> None:
        for sig, old in previous.items():
            signal.signal(sig, old)


__all__ = ["Driver", "Group"]
