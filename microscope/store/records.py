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


def read_records_lenient(path: Path) -> tuple[list[dict[str, Any]], list[str]]:
    """Every line of ``records.jsonl`` that is a record, and a note on those that are not.

    ``read_records`` raises on a damaged line, which is right for statistics but wrong for a report:
    the measurements around the damage are exactly what the reader wants to see.
    """
    rows: list[dict[str, Any]] = []
    bad: list[int] = []
    for line_no, line in enumerate(Path(path).read_bytes().split(b"\n"), 1):
        line = line.strip()
        if not line:
            continue
        record, problem = _parse_line(line)
        if problem is None:
            rows.append(record)
        else:
            bad.append(line_no)
    notes = []
    if bad:
        shown = ", ".join(map(str, bad[:5])) + (" ..." if len(bad) > 5 else "")
        notes.append(f"{Path(path).name}: {len(bad)} line(s) are not JSON records (line {shown}); "
                     "was the run killed mid-write? They are left out of this report.")
    return rows, notes


#: Columns every records DataFrame has (filled with None where no record holds them).
RECORD_COLUMNS = ("run_id", "plugin", "variant", "role", "case_id", "seed", "dimension", "metric", "value",
                  "unit", "status", "reason", "passed", "device", "interpreted")


def flatten(row: dict[str, Any]) -> dict[str, Any]:
    """One level of nesting flattened (``details.rounds``, ``case.seq``); ``env`` is kept out.

    ``pandas.json_normalize`` deep-copies every record, which takes seconds on a run of tens of
    thousands of records; this does the one level the statistics and reports need. The environment is
    the same for (nearly) every record, so it is summarised once per run instead of becoming columns.
    """
    flat: dict[str, Any] = {}
    for key, value in row.items():
        if key == "env":
            continue
        if isinstance(value, dict):
            for sub, v in value.items():
                flat[f"{key}.{sub}"] = v
        else:
            flat[key] = value
    return flat


def text_column(column):  # noqa: ANN001, ANN202 - a pandas Series
    """Plain Python strings ("" for missing) in an object column: iterating pandas' Arrow-backed
    string columns row by row is an order of magnitude slower, and the writers iterate."""
    import pandas as pd

    values = ["" if v is None or (isinstance(v, float) and pd.isna(v)) else str(v) for v in column.tolist()]
    return pd.Series(values, index=column.index, dtype=object)


def records_from_rows(rows: list[dict[str, Any]]):  # -> pandas.DataFrame
    """Records as a DataFrame, one level flattened, with ``RECORD_COLUMNS`` present: the one builder the
    statistics and the reports share."""
    import pandas as pd

    frame = pd.DataFrame([flatten(r) for r in rows]) if rows else pd.DataFrame()
    for col in RECORD_COLUMNS:
        if col not in frame.columns:
            frame[col] = None
    frame["status"] = frame["status"].fillna("ok")
    for col in ("plugin", "variant", "role", "case_id", "dimension", "metric"):
        frame[col] = text_column(frame[col])
    frame["value"] = pd.to_numeric(frame["value"], errors="coerce")
    return frame


def records_frame(path: Path):  # -> pandas.DataFrame
    """All records of a run as a DataFrame (``records_from_rows`` of ``read_records``)."""
    return records_from_rows(list(read_records(path)))
