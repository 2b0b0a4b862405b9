"""Trial groups and the run's group log: what ran, what failed and why, what ``--resume`` may skip.

A trial group is the unit an executor runs and isolates: one case of an operator-level plugin (all its
variants, so timing stays interleaved and inputs identical) or one seed of a model-level run (all its
arms, which share the baseline's weights and losses). ``groups.jsonl`` gets one line per finished
group, written after the group's records are on disk, so a group with a line is complete.
"""

from __future__ import annotations

import json
import os
import warnings
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from microscope.store.records import Record, RecordsError, read_records

GROUPS_FILE = "groups.jsonl"


@dataclass(frozen=True)
class Group:
    """One trial group: ``key`` is stored with every record it wrote; ``variants`` in run order."""

    key: str
    label: str
    variants: tuple[str, ...]


@dataclass
class GroupOutcome:
    """A finished group: its records (written together), ok/failed and why, and the variants whose
    crash or hang the executor isolated (each recorded failed; the group was rerun without it)."""

    group: Group
    records: list[Record]
    status: str = "ok"
    reason: str | None = None
    culprits: dict[str, str] = field(default_factory=dict)
    attempts: int = 1
    seconds: float = 0.0
    notes: list[str] = field(default_factory=list)

    def brief(self) -> str:
        """One console line: each culprit with the first clause of its reason (the reports hold the rest)."""
        if self.culprits:
            return ", ".join(f"{name} ({_first_clause(why)})" for name, why in self.culprits.items())
        return _first_clause(self.reason or "unknown")

    def line(self) -> dict[str, Any]:
        return {"group": self.group.key, "status": self.status, "reason": self.reason, "culprits": self.culprits,
                "attempts": self.attempts, "seconds": round(self.seconds, 3), "records": len(self.records),
                "notes": self.notes}


def _first_clause(reason: str, width: int = 90) -> str:
    head = reason.split("; its last output", 1)[0].removeprefix("worker process ")
    return head if len(head) <= width else head[: width - 1] + "…"


@dataclass
class RunOutcome:
    """How far a run got: groups complete (ok or failed) and groups never finished, with why."""

    total: int = 0
    finished: list[dict[str, Any]] = field(default_factory=list)
    unfinished: list[str] = field(default_factory=list)
    stopped: str | None = None  # "interrupted (SIGINT)", "max_wall_s (3600 s) spent"
    resumed: int = 0  # groups taken over from an earlier attempt
    #: records of groups cut short, kept in ``records.jsonl`` (no ``groups.jsonl`` line: a resume drops them)
    cut_records: int = 0

    @property
    def failed(self) -> list[dict[str, Any]]:
        return [g for g in self.finished if g["status"] != "ok"]


class GroupLog:
    """Appends one JSON line per finished group to ``groups.jsonl`` (flushed and synced)."""

    def __init__(self, folder: Path) -> None:
        self.path = Path(folder) / GROUPS_FILE
        self._fh = self.path.open("a", encoding="utf-8")

    def write(self, outcome: GroupOutcome) -> None:
        self._fh.write(json.dumps(outcome.line()) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()


def read_group_log(folder: Path) -> list[dict[str, Any]]:
    """The finished groups of a run folder; a line cut by a kill is dropped (its group reruns)."""
    path = Path(folder) / GROUPS_FILE
    if not path.exists():
        return []
    out = []
    lines = [line for line in path.read_text(encoding="utf-8", errors="replace").splitlines() if line.strip()]
    for i, line in enumerate(lines):
        try:
            entry = json.loads(line)
            if not isinstance(entry, dict) or "group" not in entry:
                raise ValueError("not a group entry")
        except (ValueError, RecursionError) as exc:
            if i == len(lines) - 1:
                warnings.warn(f"{path}:{i + 1}: last group line cut short; that group reruns", stacklevel=2)
                break
            raise RecordsError(f"{path}:{i + 1}: not a group entry ({exc}); the file is damaged") from exc
        out.append(entry)
    return out


@dataclass
class Resume:
    """What an interrupted run already holds: the groups to skip and their records to keep.

    ``prepare`` rewrites ``records.jsonl`` to the records of complete groups only (a group cut short
    reruns from its start, so no trial appears twice) and ``groups.jsonl`` to those groups' lines.
    """

    done: dict[str, dict[str, Any]]
    kept: list[dict[str, Any]]
    dropped_records: int = 0
    messages: list[str] = field(default_factory=list)

    @classmethod
    def prepare(cls, folder: Path, retry_failed: bool = False) -> Resume:
        folder = Path(folder)
        messages: list[str] = []
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            entries = read_group_log(folder)
            records = list(read_records(folder)) if (folder / "records.jsonl").exists() else []
        messages += [str(w.message) for w in caught]
        done = {e["group"]: e for e in entries if retry_failed is False or e.get("status") == "ok"}
        kept = [r for r in records if r.get("group") in done]
        _rewrite(folder / "records.jsonl", [json.dumps(r) for r in kept])
        _rewrite(folder / GROUPS_FILE, [json.dumps(e) for e in entries if e["group"] in done])
        dropped = len(records) - len(kept)
        if dropped:
            messages.append(f"dropped {dropped} record(s) of groups that had not finished; those groups rerun")
        return cls(done=done, kept=kept, dropped_records=dropped, messages=messages)


def _rewrite(path: Path, lines: list[str]) -> None:
    """Replace ``path`` atomically (a kill during a resume leaves the old file or the new one)."""
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    os.replace(tmp, path)


def record_from_dict(data: dict[str, Any]) -> Record:
    """A kept record read back from disk (fields a newer microscope added are ignored)."""
    known = Record.__dataclass_fields__
    return Record(**{k: v for k, v in data.items() if k in known})


__all__ = ["GROUPS_FILE", "Group", "GroupLog", "GroupOutcome", "Resume", "RunOutcome", "read_group_log",
           "record_from_dict"]
