"""Where trial groups run: ``inline`` (this process), ``local`` (worker processes, the default) or
``ray`` (Ray tasks). Each takes a runner's groups and hands every finished group to the driver, which
alone writes the run's files; README "Isolation, resume and executors" says what each guarantees."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING, Protocol

from microscope.executors.groups import Group, GroupOutcome, Resume, RunOutcome
from microscope.executors.worker import RunSpec

if TYPE_CHECKING:
    from microscope.executors.driver import Driver
    from microscope.executors.local import Worker
    from microscope.runner import RunBase

KINDS = ("local", "inline", "ray")


class Executor(Protocol):
    def run(self, groups: Sequence[Group], driver: Driver) -> set[str]:
        """Run ``groups``, committing each finished one to ``driver``; return the keys finished."""
        ...

    def close(self) -> None:
        """Release workers (called once, when the run ends)."""
        ...


def default_jobs(device: str) -> int:
    """One worker per GPU on CUDA; one on CPU, where parallel workers would share the timed cores."""
    if device == "cuda":
        import torch

        return max(1, torch.cuda.device_count())
    return 1


def make_executor(kind: str, runner: RunBase, spec: RunSpec | None, *, jobs: int | None, timeout_s: float,
                  address: str = "auto", early: Worker | None = None) -> Executor:
    """The executor ``kind`` for ``runner``; ``spec`` rebuilds the runner in a worker (local, ray); ``early``:
    a worker the CLI started before planning (``local.early_worker``), the local executor's first."""
    if kind == "inline" or spec is None:
        from microscope.executors.inline import InlineExecutor

        return InlineExecutor(runner)
    if kind == "ray":
        from microscope.executors.ray_executor import RayExecutor

        return RayExecutor(runner, spec, address=address, jobs=jobs, timeout_s=timeout_s)
    from microscope.executors.local import LocalExecutor

    gpus = default_jobs("cuda") if spec.device == "cuda" else 0
    return LocalExecutor(runner, spec, jobs=jobs or default_jobs(spec.device), timeout_s=timeout_s, gpus=gpus,
                         early=early)


__all__ = ["KINDS", "Executor", "Group", "GroupOutcome", "Resume", "RunOutcome", "RunSpec", "default_jobs",
           "make_executor"]
