"""Findings and tables from the optional instrument files (divergence, kernel trace diff, graph diff).

Each file is a JSON object keyed by variant. The instruments are written by another part of
microscope and their shapes may grow, so this module reads them generously:

* ``divergence.json``: per variant ``{"rows": [{"module", "rel_err", ...}], "first_divergent",
  "summary"?}`` (``DivergenceReport.to_dict``), or one such entry per pass (``{"forward": {...},
  "backward": {...}}``), which becomes "triton (forward)", "triton (backward)".
* ``trace_diff.json`` / ``graph_diff.json``: per variant a ``headline`` and the changes, either as
  ``added``/``removed``/``changed`` lists, as ``{op: count}`` dicts (``GraphDiff.to_dict``, whose
  ``replacements`` are listed too), or as ``rows`` with a ``status`` (``TraceDiff.to_dict``; rows
  whose status is ``same`` are left out).

Unknown item shapes are rendered as ``key=value`` text rather than failing, so a new field in an
instrument never breaks a report.

* ``dataflow_diff.json``: per variant the union graph of the baseline's and the variant's dataflow
  (``DataflowDiff.to_dict``: ``headline``, ``counts`` and ``nodes`` with a ``status`` each), read from
  the run folder and drawn by ``graph_svg``.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import Any

from . import fmt
from .graph_svg import DiffFigure, diff_figures
from .load import RunData
from .tables import Table

MAX_ITEMS = 500
DIFF_KINDS = ("removed", "added", "changed")
DIFF_TITLES = (("trace_diff", "kernel trace diff"), ("graph_diff", "graph diff"))
_DIFF_KEYS = ("headline", "rows", "added", "removed", "changed", "replacements")
DATAFLOW_FILE = "dataflow_diff.json"


def item_text(item: Any) -> str:
    """One diff item as text: a string as is, a dict as ``name: k=v, ...``, anything else via str."""
    if isinstance(item, dict):
        key = next((k for k in ("name", "kernel", "op", "node", "module") if item.get(k)), None)
        rest = ", ".join(f"{k}={v}" for k, v in item.items() if k != key)
        return f"{item[key]}: {rest}" if key else rest
    return str(item)


def _entries(data: dict[str, Any] | None,
             is_entry: Callable[[dict[str, Any]], bool]) -> dict[str, dict[str, Any]]:
    """variant -> entry, one level of nesting (e.g. per pass) flattened into "variant (pass)"."""
    out: dict[str, dict[str, Any]] = {}
    for variant, entry in (data or {}).items():
        if not isinstance(entry, dict):
            continue
        if is_entry(entry):
            out[variant] = entry
            continue
        for sub, inner in entry.items():
            if isinstance(inner, dict) and is_entry(inner):
                out[f"{variant} ({sub})"] = inner
    return out


def divergence_entries(data: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return _entries(data, lambda e: isinstance(e.get("rows"), list))


def diff_entries(data: dict[str, Any] | None) -> dict[str, dict[str, Any]]:
    return _entries(data, lambda e: any(k in e for k in _DIFF_KEYS))


def divergence_rows(entry: dict[str, Any]) -> list[dict[str, Any]]:
    rows = entry.get("rows")
    return [r for r in rows if isinstance(r, dict)] if isinstance(rows, list) else []


def diff_items(entry: dict[str, Any]) -> list[tuple[str, str]]:
    """(kind of change, description) for every change an entry lists, whatever its shape."""
    items: list[tuple[str, str]] = []
    for kind in DIFF_KINDS:
        value = entry.get(kind)
        if isinstance(value, list):
            items += [(kind, item_text(v)) for v in value]
        elif isinstance(value, dict):
            for name, v in value.items():
                if isinstance(v, (list, tuple)) and len(v) == 2:
                    items.append((kind, f"{name}: {v[0]} -> {v[1]}"))
                else:
                    items.append((kind, f"{name}: {v}" if kind == "changed" else f"{name} (x{v})"))
    for rep in entry.get("replacements") or []:
        if isinstance(rep, dict):
            old, new = ", ".join(map(str, rep.get("old") or [])), ", ".join(map(str, rep.get("new") or []))
            items.append(("replaced", f"{rep.get('count', '?')}x {old or '(nothing)'} -> {new or '(nothing)'}"))
    for row in entry.get("rows") or []:
        if isinstance(row, dict) and row.get("status", "same") != "same":
            rest = {k: v for k, v in row.items() if k not in ("status",)}
            items.append((str(row["status"]), item_text(rest)))
    return items


def _counts(items: list[tuple[str, str]]) -> str:
    kinds: dict[str, int] = {}
    for kind, _ in items:
        kinds[kind] = kinds.get(kind, 0) + 1
    return ", ".join(f"{n} {k}" for k, n in kinds.items())


def dataflow_diffs(run: RunData) -> dict[str, Any]:
    """``dataflow_diff.json`` of the run folder (empty when absent or unreadable)."""
    path = run.path / DATAFLOW_FILE if run.path is not None and run.path.is_dir() else None
    if path is None or not path.is_file():
        return {}
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return {str(k): v for k, v in data.items() if isinstance(v, dict)} if isinstance(data, dict) else {}


def diff_graph_figures(run: RunData) -> tuple[list[DiffFigure], int]:
    """The drawn dataflow diffs (``graph_svg.diff_figures``) and how many regions were not drawn."""
    return diff_figures(dataflow_diffs(run))


def instrument_findings(run: RunData) -> list[str]:
    """One sentence per instrumented variant: where it first diverges, what its traces/graphs changed."""
    out = []
    for variant, entry in divergence_entries(run.divergence).items():
        rows = divergence_rows(entry)
        first = entry.get("first_divergent")
        errs = {str(r.get("module")): fmt.finite(r.get("rel_err")) for r in rows}
        if entry.get("summary"):
            out.append(f"layer-wise divergence, {variant}: {fmt.clip(entry['summary'], 300)}")
        elif first:
            err = errs.get(str(first))
            out.append(f"layer-wise divergence, {variant}: first diverges at {first}"
                       + (f" (rel err {err:.2e})" if err is not None else ""))
        elif rows:
            worst = max((e for e in errs.values() if e is not None), default=None)
            out.append(f"layer-wise divergence, {variant}: no layer diverges across {len(rows)} modules"
                       + (f" (max rel err {worst:.2e})" if worst is not None else ""))
    for attr, label in DIFF_TITLES:
        for variant, entry in diff_entries(getattr(run, attr)).items():
            counts = _counts(diff_items(entry))
            head = entry.get("headline")
            text = fmt.clip(head, 300) + (f" ({counts})" if counts else "") if head else (counts or "no changes")
            out.append(f"{label}, {variant}: {text}")
    for variant, entry in dataflow_diffs(run).items():
        if entry.get("headline"):
            out.append(f"dataflow graph diff, {variant}: {fmt.clip(entry['headline'], 300)}")
    return out


def divergence_table(data: dict[str, Any] | None) -> Table:
    out = Table(["variant", "module", "rel err", "first divergent", "other fields"],
                [False, False, True, False, False])
    for variant, entry in divergence_entries(data).items():
        first = entry.get("first_divergent")
        for r in divergence_rows(entry)[:MAX_ITEMS]:
            other = ", ".join(f"{k}={v}" for k, v in r.items() if k not in ("module", "rel_err"))
            is_first = first is not None and str(r.get("module")) == str(first)
            out.add([(fmt.clip(variant, 60), None), (fmt.clip(r.get("module"), 120), None),
                     (fmt.num(r.get("rel_err"), ".2e"), fmt.finite(r.get("rel_err"))),
                     ("yes" if is_first else "", None), (fmt.clip(other, 200), None)],
                    "fail" if is_first else "")
    return out


def diff_table(data: dict[str, Any] | None) -> Table:
    out = Table(["variant", "change", "item"], [False, False, False])
    for variant, entry in diff_entries(data).items():
        for kind, text in diff_items(entry)[:MAX_ITEMS]:
            out.add([(fmt.clip(variant, 60), None), (kind, None), (fmt.clip(text, 400), None)])
    return out


def instrument_tables(run: RunData) -> list[tuple[str, Table]]:
    """(title, table) for each instrument file the run has, in a fixed order."""
    out = []
    if divergence_entries(run.divergence):
        out.append(("Layer-wise divergence", divergence_table(run.divergence)))
    for attr, label in DIFF_TITLES:
        if diff_entries(getattr(run, attr)):
            out.append((label[0].upper() + label[1:], diff_table(getattr(run, attr))))
    return out
