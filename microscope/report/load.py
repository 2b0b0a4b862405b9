"""Read a results folder into one ``RunData``: the only thing the Markdown and HTML writers look at.

A report must come out of any run a user can produce: a run killed mid-write (a cut last line), a run
whose statistics never ran (no ``comparison.csv``), a run with a single dimension, a run where every
trial failed. So everything except ``records.jsonl`` is optional, and problems found while reading
(an unreadable instrument file, a cut line) become ``notes`` the report prints instead of exceptions.
"""

from __future__ import annotations

import json
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pandas as pd

from microscope.store.comparison import read_comparison
from microscope.store.records import read_records_lenient, records_from_rows

from .run_progress import RunProgress, read_progress

#: Optional instrument outputs saved in the run folder, keyed by the attribute that holds them.
INSTRUMENT_FILES = {"divergence": "divergence.json", "trace_diff": "trace_diff.json",
                    "graph_diff": "graph_diff.json"}
#: Record columns every downstream step may rely on, even for an empty or odd records file.


class ReportError(Exception):
    """A results folder that cannot be reported on at all (no records); printed without a traceback."""


@dataclass
class RunData:
    """Everything a report shows about one run (or about two runs compared, see ``compare.py``).

    ``records``: one row per record, nested fields flattened one level (``details.rounds``,
    ``case.seq``; the environment is in ``envs``, not in columns). ``comparison``: the statistics
    engine's table, or None when the run has none (the report then shows raw numbers without
    verdicts). ``envs``: the environment per run, keyed by a label ("" for a single run, "A"/"B" for
    a comparison). ``notes``: problems met while loading or comparing, printed as warnings.
    """

    run_id: str
    records: pd.DataFrame
    comparison: pd.DataFrame | None = None
    envs: dict[str, dict[str, Any]] = field(default_factory=dict)
    config_text: str | None = None
    divergence: dict[str, Any] | None = None
    trace_diff: dict[str, Any] | None = None
    graph_diff: dict[str, Any] | None = None
    notes: list[str] = field(default_factory=list)
    title: str = ""
    path: Path | None = None
    progress: RunProgress | None = None  # failed trial groups, partial run: what a report says first

    @property
    def env(self) -> dict[str, Any]:
        """The environment of the (last) run: what a single-run report shows in its env line."""
        return next(reversed(self.envs.values()), {}) if self.envs else {}

    @property
    def dimensions(self) -> list[str]:
        """Dimensions that appear in the records or the comparison, in the design's order."""
        seen = set(self.records["dimension"].dropna()) if len(self.records) else set()
        if self.comparison is not None and len(self.comparison):
            seen |= set(self.comparison["dimension"].dropna())
        order = ["accuracy", "throughput", "memory", "stability", "generalization"]
        return [d for d in order if d in seen] + sorted(str(d) for d in seen - set(order))


def read_instrument(folder: Path, name: str) -> tuple[dict[str, Any] | None, list[str]]:
    """One optional instrument JSON (a dict keyed by variant), or None with a note when unusable."""
    path = folder / name
    if not path.is_file():
        return None, []
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        return None, [f"{name} unreadable ({type(exc).__name__}); left out"]
    if not isinstance(data, dict):
        return None, [f"{name} is not an object keyed by variant; left out"]
    return {str(k): v for k, v in data.items() if isinstance(v, dict)}, []


def run_envs(rows: list[dict[str, Any]]) -> tuple[dict[str, Any], list[str]]:
    """The run's environment (each field's most common value across records) and a note where records give a
    field different values. A field some records lack is no disagreement: a trial that failed before its
    workload loaded has no corpus fields."""
    envs = [r.get("env") if isinstance(r.get("env"), dict) else {} for r in rows]
    seen: dict[str, dict[str, Any]] = {}  # field -> serialized value -> the value
    counts: dict[str, Counter[str]] = {}
    for e in envs:
        for name, value in e.items():
            key = json.dumps(value, sort_keys=True, default=str)
            seen.setdefault(name, {}).setdefault(key, value)
            counts.setdefault(name, Counter())[key] += 1
    env = {name: seen[name][c.most_common(1)[0][0]] for name, c in counts.items()}
    differing = sorted(name for name, c in counts.items() if len(c) > 1)
    notes = []
    if differing:
        shown = ", ".join(f"{name}: {len(counts[name])} values" for name in differing)
        notes.append(f"records disagree on their environment ({shown}); the env line shows each field's most "
                     "common value")
    return env, notes


def load_run(results_dir: Path) -> RunData:
    """Read ``results/<run-id>/`` (records, comparison table, instruments, config) into a ``RunData``."""
    folder = Path(results_dir)
    path = folder / "records.jsonl" if folder.is_dir() else folder
    if path.name == "records.jsonl":
        folder = path.parent
    if not path.is_file():
        raise ReportError(f"{folder}: no records.jsonl here; pass a run folder such as results/<run-id>/")
    rows, notes = read_records_lenient(path)
    records = records_from_rows(rows)
    comparison, more = read_comparison(folder)
    notes += more
    env, more = run_envs(rows)
    notes += more
    instruments: dict[str, Any] = {}
    for attr, name in INSTRUMENT_FILES.items():
        instruments[attr], more = read_instrument(folder, name)
        notes += more
    config = folder / "config.yaml"
    config_text = config.read_text(encoding="utf-8", errors="replace") if config.is_file() else None
    ids = [r for r in records["run_id"].dropna().astype(str).unique() if r]
    run_id = ids[0] if len(ids) == 1 else folder.name
    if comparison is None and len(records):
        notes.append("no comparison table in this run folder (statistics not computed): verdicts are left "
                     "out, raw numbers are shown")
    return RunData(run_id=run_id, records=records, comparison=comparison, envs={"": env},
                   config_text=config_text, notes=notes, title=f"microscope run {run_id}", path=folder,
                   progress=read_progress(folder), **instruments)
