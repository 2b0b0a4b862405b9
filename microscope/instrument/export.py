"""Instrument results as files in the run folder, in the shape ``microscope.report`` reads.

``results/<run-id>/divergence.json``, ``trace_diff.json`` and ``graph_diff.json`` each hold one JSON
object keyed by variant (or by any label the runner chooses, e.g. ``"triton @ seq=512,bf16"`` or
``"triton (gradients)"``). Each value is the ``to_dict()`` of a ``DivergenceReport``, ``TraceDiff`` or
``GraphDiff``: ``rows`` and ``first_divergent`` for divergence; ``headline`` and the ``added`` /
``removed`` / ``changed`` item lists for the diffs. ``dataflow_diff.json`` holds ``DataflowDiff``
union graphs (every node with its status), which the HTML report draws. Writing merges into an existing file, so the
runner can add entries as each case finishes; the file is replaced atomically, so a reader never
sees half of it.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Protocol

__all__ = ["INSTRUMENT_FILES", "write_instruments"]

#: Instrument kind -> file name inside the run folder.
INSTRUMENT_FILES = {"divergence": "divergence.json", "trace_diff": "trace_diff.json", "graph_diff": "graph_diff.json",
                    "dataflow_diff": "dataflow_diff.json"}


class _HasDict(Protocol):
    def to_dict(self) -> dict[str, Any]: ...


def _merge_write(path: Path, entries: Mapping[str, _HasDict]) -> None:
    data: dict[str, Any] = {}
    if path.exists():
        try:
            loaded = json.loads(path.read_text(encoding="utf-8"))
            data = loaded if isinstance(loaded, dict) else {}
        except json.JSONDecodeError:
            data = {}
    data.update({label: obj.to_dict() for label, obj in entries.items()})
    fd, tmp = tempfile.mkstemp(prefix=path.name, suffix=".tmp", dir=path.parent)
    with os.fdopen(fd, "w", encoding="utf-8") as fh:
        json.dump(data, fh, indent=1, allow_nan=True)
    os.replace(tmp, path)


def write_instruments(
    run_dir: str | Path,
    *,
    divergence: Mapping[str, _HasDict] | None = None,
    trace_diff: Mapping[str, _HasDict] | None = None,
    graph_diff: Mapping[str, _HasDict] | None = None,
    dataflow_diff: Mapping[str, _HasDict] | None = None,
) -> list[Path]:
    """Merge ``{label: result}`` into the run folder's instrument files; returns the files written."""
    run_dir = Path(run_dir)
    run_dir.mkdir(parents=True, exist_ok=True)
    written = []
    for kind, entries in (("divergence", divergence), ("trace_diff", trace_diff), ("graph_diff", graph_diff),
                          ("dataflow_diff", dataflow_diff)):
        if entries:
            path = run_dir / INSTRUMENT_FILES[kind]
            _merge_write(path, entries)
            written.append(path)
    return written
