"""How far a run got, read from its ``run.json`` and ``groups.jsonl``: the lines a report puts first.

A report of a run that lost trial groups (a crash, a timeout) or stopped early (a signal, its wall-time
budget, a kill) must say so before any verdict, since its verdicts cover only what finished.
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from pathlib import Path

from . import fmt

REASON_CHARS = 300


@dataclass(frozen=True)
class RunProgress:
    """``failed``: (group: variant, reason) per variant that took a group's worker down; ``status``: from
    run.json (``complete``, ``interrupted``, ``out of budget``, or ``running`` when the process died first)."""

    folder: Path
    planned: int
    finished: int
    groups_failed: int
    failed: tuple[tuple[str, str], ...]
    status: str
    stopped: str | None

    @property
    def partial(self) -> bool:
        return self.status != "complete" or self.finished < self.planned

    def lines(self) -> list[tuple[str, tuple[str, ...]]]:
        """(sentence, sub-items) for the top of a report; empty for a complete run without failures."""
        out: list[tuple[str, tuple[str, ...]]] = []
        if self.partial:
            why = self.stopped or ("its process ended before it finished (killed?)" if self.status == "running"
                                   else self.status)
            out.append((f"Partial run: {self.finished} of {self.planned} trial groups finished ({why}); the "
                        f"verdicts cover only those. Continue with: microscope resume {self.folder}", ()))
        if self.failed:
            out.append((f"{self.groups_failed} of {self.planned} trial groups failed; rerun them with: microscope "
                        f"resume {self.folder} --retry-failed",
                        tuple(f"{group}: {fmt.clip(reason, REASON_CHARS)}" for group, reason in self.failed)))
        return out


def read_progress(folder: Path) -> RunProgress | None:
    """The run's progress, or None for a folder written without an executor (no ``run.json``)."""
    from microscope.executors.groups import read_group_log
    from microscope.run_state import RunState

    try:
        state = RunState.load(folder)
    except ValueError:
        return None
    if state is None:
        return None
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cut last line: the loader of records already says so
        try:
            entries = read_group_log(folder)
        except ValueError:
            entries = []
    failed: list[tuple[str, str]] = []
    for e in entries:
        if e.get("status") != "failed":
            continue
        culprits = e.get("culprits") if isinstance(e.get("culprits"), dict) else {}
        # one item per variant that took its worker down; a group without culprits failed as a whole
        failed += [(f"{e['group']}: {name}", str(why)) for name, why in culprits.items()] or [
            (str(e["group"]), str(e.get("reason") or "unknown"))]
    groups_failed = len({e["group"] for e in entries if e.get("status") == "failed"})
    return RunProgress(Path(folder), int(state.groups_planned), len({e["group"] for e in entries}),
                       groups_failed, tuple(failed), state.status, state.stopped)
