"""Run records: one JSON object per measurement, appended to ``results/<run-id>/records.jsonl``.

Each record is written (and flushed) the moment its measurement exists, so a crash, a timeout or a
killed run never loses what was already measured. Everything downstream (statistics, reports,
nightly history) reads these records and nothing else.

Record fields:

``run_id``      the run's id (also the results folder name)
``plugin``      registered plugin name
``variant``     variant name; ``role`` is baseline | candidate | peer
``case_id``     readable case id; ``case`` holds the case parameters as a dict
``seed``        the trial seed (derived from the run seed, identical for every variant of a case)
``dimension``   accuracy | throughput | memory | stability | generalization
``metric``      e.g. ``rel_err``, ``latency_ms``, ``tflops``, ``peak_bytes``
``value``       a float, or null when the trial failed or was skipped
``unit``        e.g. ``ms``, ``TFLOP/s``, ``bytes``, ``ratio``
``status``      ok | failed | skipped; ``reason`` says why for the last two
``passed``      for gating metrics (accuracy): true/false, else null
``details``     free-form dict: raw samples (``rounds``: per-round medians), thresholds, etc.
``device``      cpu | cuda; ``interpreted`` true when Triton ran through its CPU interpreter
``env``         git commit, python/torch/triton versions, device name, config hash, corpus hash
``time``        ISO-8601 UTC time of the measurement
``group``       the trial group that produced it (``case <id>``, ``seed <k>``): what ``--resume`` skips or reruns
"""

from __future__ import annotations

import json
import math
import os
import warnings
from collections.abc import Iterator
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

STATUSES = ("ok", "failed", "skipped")


@dataclass
class Record:
    run_id: str
    plugin: str
    variant: str
    role: str
    case_id: str
    case: dict[str, Any]
    seed: int
    dimension: str
    metric: str
    value: float | None
    unit: str = ""
    status: str = "ok"
    reason: str | None = None
    passed: bool | None = None
    details: dict[str, Any] = field(default_factory=dict)
    device: str = "cpu"
    interpreted: bool = False
    env: dict[str, Any] = field(default_factory=dict)
    time: str = field(default_factory=lambda: datetime.now(timezone.utc).isoformat(timespec="seconds"))
    group: str = ""

    def __post_init__(self) -> None:
        if self.status not in STATUSES:
            raise ValueError(f"record status must be one of {STATUSES}, got {self.status!r}")
        if self.value is not None:
            self.value = float(self.value)
            if self.status == "ok" and not math.isfinite(self.value):
                self.status, self.reason = "failed", f"non-finite value {self.value}"

    def to_json(self) -> str:
        return json.dumps(asdict(self), default=_json_default, allow_nan=True, sort_keys=False)


def _json_default(obj: Any) -> Any:
    if hasattr(obj, "item"):
        return obj.item()
    if isinstance(obj, (set, tuple)):
        return list(obj)
    if isinstance(obj, Path):
        return str(obj)
    return str(obj)


class RecordWriter:
    """Appends records to a JSON Lines file, flushing and syncing each line as it is written."""

    def __init__(self, path: Path) -> None:
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._fh = self.path.open("a", encoding="utf-8")
        self.count = 0

    def write(self, record: Record) -> None:
        self._fh.write(record.to_json() + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())
        self.count += 1

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> RecordWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordsError(ValueError):
    """A records file that cannot be read: missing, unreadable, or damaged at ``file:line``."""


def read_records(path: Path) -> Iterator[dict[str, Any]]:
    """Yield the records of a ``records.jsonl`` (or of a results folder holding one).

    A run killed mid-write leaves a cut last line: it is skipped with a warning, so every record that
    was complete survives. A bad line anywhere else (not UTF-8, not JSON, not a JSON object) means the
    file was damaged and is a ``RecordsError`` naming ``file:line``.
    """
    path = Path(path)
    try:
        if path.is_dir():
            path = path / "records.jsonl"
        data = path.read_bytes()
    except OSError as exc:
        raise RecordsError(f"{path}: cannot read the records ({exc.strerror or exc}); pass a run folder such as "
                           "results/<run-id>/") from exc
    lines = [(n, line.strip()) for n, line in enumerate(data.split(b"\n"), 1)]
    lines = [(n, line) for n, line in lines if line]
    for i, (line_no, line) in enumerate(lines):
        record, problem = _parse_line(line)
        if problem is None:
            yield record
            continue
        if i == len(lines) - 1:
            warnings.warn(f"{path}:{line_no}: last record cut short ({problem}); was the run killed "
                          "mid-write? Skipped it.", stacklevel=2)
            return
        raise RecordsError(f"{path}:{line_no}: not a JSON record ({problem}); the file is damaged: delete or "
                           "repair that line, or rerun")


def _parse_line(line: bytes) -> tuple[dict[str, Any], str | None]:
    """One line of ``records.jsonl`` -> (record, None), or ({}, why it is not a record)."""
    try:
        record = json.loads(line.decode("utf-8"))
    except UnicodeDecodeError as exc:
        return {}, f"byte 0x{line[exc.start]:02x} at column {exc.start + 1} is not UTF-8"
    except json.JSONDecodeError as exc:
        return {}, exc.msg
    except RecursionError:
        return {}, "nested too deeply"
    if not isinstance(record, dict):
        return {}, f"a JSON {type(record).__name__}, not an object"
    return record, None


def records_frame(path: Path):  # -> pandas.DataFrame
    """All records of a run as a pandas DataFrame (case parameters flattened as ``case.<name>``)."""
    import pandas as pd

    rows = list(read_records(path))
    frame = pd.json_normalize(rows, max_level=1) if rows else pd.DataFrame()
    return frame
