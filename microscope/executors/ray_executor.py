"""The Ray executor: the same trial groups as Ray tasks, for sweeps wider than one machine.

Each group is one task (``num_gpus=1`` on CUDA, one CPU otherwise) that runs the group the way the
local executor does, in a spawned child process with the same time limit and culprit isolation, and
returns its records; the driver writes them as each task finishes. ``executor: {kind: ray, address:
auto}`` joins a running cluster, or starts a local Ray on this machine when none answers. Ray is an
optional extra: ``pip install "microscope[ray]"``. Every node needs microscope and the plugin files at
the same paths as the driver.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from microscope.executors.groups import Group, GroupOutcome
from microscope.executors.worker import RunSpec

if TYPE_CHECKING:
    from microscope.executors.driver import Driver
    from microscope.runner import RunBase

INSTALL_HINT = 'the ray executor needs Ray: pip install "microscope[ray]" (or executor: {kind: local})'


class _Collector:
    """The driver a task's local executor reports to: it keeps the outcome for the return value."""

    def __init__(self) -> None:
        self.outcomes: list[GroupOutcome] = []

    def should_stop(self) -> bool:
        return False

    def commit(self, outcome: GroupOutcome) -> None:
        self.outcomes.append(outcome)

    def progress(self, message: str) -> None:
        """Progress stays on the node."""


def run_group_isolated(spec: RunSpec, group: Group, timeout_s: float) -> GroupOutcome:
    """One group in a child process of this (Ray worker) process, as the local executor runs it."""
    from microscope.executors.local import LocalExecutor

    runner = spec.build()
    executor = LocalExecutor(runner, spec, jobs=1, timeout_s=timeout_s)
    collector = _Collector()
    try:
        executor.run([group], collector)  # type: ignore[arg-type]
    finally:
        executor.close()
        runner.close()
    if not collector.outcomes:
        raise RuntimeError(f"group {group.key} did not finish")
    return collector.outcomes[0]


def import_ray() -> Any:
    try:
        import ray
    except ImportError as exc:
        raise ImportError(INSTALL_HINT) from exc
    return ray


class RayExecutor:
    def __init__(self, runner: RunBase, spec: RunSpec, *, address: str = "auto", jobs: int | None = None,
                 timeout_s: float = 600.0) -> None:
        self.ray = import_ray()
        self.runner = runner
        self.spec = spec
        self.timeout_s = timeout_s
        self.jobs = jobs
        self._owns = False
        if not self.ray.is_initialized():
            self._init(address)
        options: dict[str, Any] = {"num_gpus": 1} if spec.device == "cuda" else {"num_cpus": 1}
        self._task = self.ray.remote(max_retries=0, **options)(run_group_isolated)

    def _init(self, address: str) -> None:
        quiet = {"include_dashboard": False, "log_to_driver": False, "logging_level": "ERROR"}
        env = {"env_vars": {k: v for k, v in os.environ.items() if k in ("TRITON_INTERPRET", "PYTHONPATH")}}
        if address != "auto":
            self.ray.init(address=address, runtime_env=env, **quiet)
            return
        try:
            self.ray.init(address="auto", runtime_env=env, **quiet)
        except (ConnectionError, RuntimeError, ValueError):
            self.ray.init(num_cpus=self.jobs or os.cpu_count() or 1, runtime_env=env, **quiet)
            self._owns = True

    def run(self, groups: Sequence[Group], driver: Driver) -> set[str]:
        ray = self.ray
        limit = self.jobs or len(groups) or 1
        todo = list(groups)
        pending: dict[Any, Group] = {}
        finished: set[str] = set()
        while todo or pending:
            if driver.should_stop():
                for ref in pending:
                    ray.cancel(ref, force=True)
                break
            while todo and len(pending) < limit:
                group = todo.pop(0)
                pending[self._task.remote(self.spec, group, self.timeout_s)] = group
            ready, _ = ray.wait(list(pending), num_returns=1, timeout=0.5)
            for ref in ready:
                group = pending.pop(ref)
                try:
                    outcome = ray.get(ref)
                except Exception as exc:  # noqa: BLE001 - a task Ray itself lost: the group failed
                    why = f"ray task failed: {type(exc).__name__}: {str(exc).splitlines()[0][:300]}"
                    outcome = GroupOutcome(group, self.runner.failure_records(group, None, why), status="failed",
                                           reason=why)
                driver.commit(outcome)
                finished.add(group.key)
        return finished

    def close(self) -> None:
        if self._owns and self.ray.is_initialized():
            self.ray.shutdown()
