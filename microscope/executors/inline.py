"""The inline executor: every group in the ``microscope run`` process itself (debugging, tests).

A Python exception in a trial is recorded by the runner and the run goes on; a crash, an abort or a
hang takes the whole run with it, which is why ``local`` is the default.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import TYPE_CHECKING

from microscope.executors.groups import Group, GroupOutcome

if TYPE_CHECKING:
    from microscope.executors.driver import Driver
    from microscope.runner import RunBase


class InlineExecutor:
    #: the driver raises KeyboardInterrupt from its signal handler, so a running group stops at once
    interrupt_in_place = True

    def __init__(self, runner: RunBase) -> None:
        self.runner = runner

    def run(self, groups: Sequence[Group], driver: Driver) -> set[str]:
        finished: set[str] = set()
        for group in groups:
            if driver.should_stop():
                break
            records: list = []
            self.runner.sink = records.append
            start = time.perf_counter()
            try:
                self.runner.run_group(group)
            except KeyboardInterrupt:
                driver.stop("interrupted (SIGINT)")
                break
            driver.commit(GroupOutcome(group, records, seconds=time.perf_counter() - start))
            finished.add(group.key)
        return finished

    def close(self) -> None:
        """Nothing to release."""
