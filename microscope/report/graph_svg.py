"""The dataflow diff drawn: what a change replaced, as small inline-SVG graphs for the HTML report.

A whole model's union graph has hundreds of nodes; what a reviewer needs is each place the change
touched, with enough of the unchanged graph around it to see the wiring. So the drawing is cut into
*regions*: the removed, added and changed nodes of one module, plus the unchanged nodes that feed
them and that read their results. Regions that are the same edit in another layer (``blocks.0`` and
``blocks.1`` differ only in the index) or in another case are drawn once, titled with every place.
Each region is laid out in layers left to right (a node one column right of its furthest input), and
drawn with removed nodes red, added green, changed amber and context grey; hovering a node shows its
full name, shapes, dtypes and what changed. Every text is escaped: the SVG holds no active content.
"""

from __future__ import annotations

import html
import re
from collections import defaultdict
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

__all__ = ["DiffFigure", "diff_figures"]

#: Figures drawn at most; the rest are counted in a note (TensorBoard's diff sub-runs hold them all).
MAX_FIGURES = 8
#: Unchanged neighbours drawn on each side of a region.
MAX_CONTEXT = 4
#: Nodes drawn per region at most (a change that rewrites a whole model is summarised, not drawn).
MAX_REGION = 60
_OP_KINDS = ("aten", "function", "triton")
_W, _H, _GAP_X, _GAP_Y, _PAD = 132, 34, 40, 12, 14
_STYLE = {  # fill, stroke
    "removed": ("#fde2e1", "#c62828"),
    "added": ("#e3f4e1", "#2e7d32"),
    "changed": ("#fff3cd", "#b8860b"),
    "same": ("#f1f3f5", "#9aa0a6"),
}


@dataclass
class DiffFigure:
    """One drawn region: a title naming every place it occurs, its counts, and the SVG."""

    title: str
    summary: str
    svg: str
    places: list[str] = field(default_factory=list)


@dataclass
class _Region:
    entry: str
    scope: str
    members: list[dict[str, Any]]
    context_in: list[dict[str, Any]]
    context_out: list[dict[str, Any]]

    def signature(self) -> tuple[Any, ...]:
        def ops(nodes: Iterable[dict[str, Any]]) -> tuple[tuple[str, str], ...]:
            return tuple(sorted((str(n.get("status")), str(n.get("op"))) for n in nodes))

        return (_generic(self.scope), ops(self.members), ops(self.context_in), ops(self.context_out))


def _generic(scope: str) -> str:
    """A scope with layer indices blanked, so the same edit in every layer groups: ``blocks.#.attn``."""
    return re.sub(r"(?<=\.)\d+(?=\.|$)", "#", scope)


def _base(ref: str) -> str:
    return ref.split(":", 1)[0]


def _regions(label: str, nodes: list[dict[str, Any]]) -> list[_Region]:
    by_name = {str(n.get("name")): n for n in nodes}
    consumers: dict[str, list[dict[str, Any]]] = defaultdict(list)
    for n in nodes:
        for ref in n.get("inputs") or []:
            consumers[_base(str(ref))].append(n)
    touched: dict[str, list[dict[str, Any]]] = {}
    for n in nodes:
        if n.get("status") != "same" and n.get("kind") in _OP_KINDS:
            touched.setdefault(str(n.get("scope", "")), []).append(n)
    regions = []
    for scope, members in touched.items():
        names = {str(m["name"]) for m in members}
        feeds: dict[str, dict[str, Any]] = {}
        reads: dict[str, dict[str, Any]] = {}
        for m in members:
            for ref in m.get("inputs") or []:
                src = by_name.get(_base(str(ref)))
                if src is not None and str(src["name"]) not in names:
                    feeds.setdefault(str(src["name"]), src)
            for dst in consumers.get(str(m["name"]), []):
                if str(dst["name"]) not in names:
                    reads.setdefault(str(dst["name"]), dst)
        regions.append(_Region(label, scope, members[:MAX_REGION], list(feeds.values())[:MAX_CONTEXT],
                               [n for n in reads.values() if n["name"] not in feeds][:MAX_CONTEXT]))
    return regions


def _ranks(nodes: list[dict[str, Any]]) -> dict[str, int]:
    """Longest-path column of each node, counting only inputs among ``nodes`` (from 0)."""
    names = {str(n["name"]) for n in nodes}
    preds = {str(n["name"]): [p for p in (_base(str(r)) for r in n.get("inputs") or []) if p in names]
             for n in nodes}
    rank: dict[str, int] = {}
    visiting: set[str] = set()

    def visit(name: str) -> int:
        if name in rank:
            return rank[name]
        if name in visiting:  # a dataflow graph has no cycle; stay safe with malformed input
            return 0
        visiting.add(name)
        rank[name] = 1 + max((visit(p) for p in preds[name]), default=-1)
        visiting.discard(name)
        return rank[name]

    for n in nodes:
        visit(str(n["name"]))
    return rank


_BANDS = ("removed", "changed", "added")


def _layout(region: _Region) -> dict[str, tuple[float, float]]:
    """Positions: inputs in the first column, then one band per status (removed above changed above
    added, each centred on the widest), readers in the last column; rows ordered to follow inputs."""
    bands = [[m for m in region.members if m.get("status") == status] for status in _BANDS]
    bands = [b for b in bands if b]
    ranked = [_ranks(b) for b in bands]
    widest = max((max(r.values()) + 1 for r in ranked), default=1)
    cells: list[list[list[dict[str, Any]]]] = []  # band -> column -> nodes
    for band, rank in zip(bands, ranked):
        span = max(rank.values()) + 1
        offset = (widest - span) // 2
        cols: list[list[dict[str, Any]]] = [[] for _ in range(widest)]
        for m in band:
            cols[offset + rank[str(m["name"])]].append(m)
        cells.append(cols)
    rows = [max(len(c) for c in cols) for cols in cells]
    total = max(sum(rows), len(region.context_in), len(region.context_out), 1)
    pos: dict[str, tuple[float, float]] = {}

    def place(nodes: list[dict[str, Any]], col: int, first_row: float) -> None:
        def center(n: dict[str, Any]) -> float:
            ys = [pos[_base(str(r))][1] for r in n.get("inputs") or [] if _base(str(r)) in pos]
            return sum(ys) / len(ys) if ys else 0.0

        for i, n in enumerate(sorted(nodes, key=center)):
            pos[str(n["name"])] = (_PAD + col * (_W + _GAP_X), _PAD + 22 + (first_row + i) * (_H + _GAP_Y))

    place(region.context_in, 0, (total - len(region.context_in)) / 2)
    top = (total - sum(rows)) / 2
    for cols, height in zip(cells, rows):
        for c, nodes in enumerate(cols):
            place(nodes, c + 1, top + (height - len(nodes)) / 2)
        top += height
    place(region.context_out, widest + 1, (total - len(region.context_out)) / 2)
    return pos


def _fmt_shape(node: dict[str, Any]) -> str:
    shapes = node.get("shapes") or []
    dtypes = node.get("dtypes") or []
    text = "x".join(str(s) for s in shapes[0]) if shapes else ""
    if dtypes:
        short = str(dtypes[0]).replace("float", "f").replace("bfloat", "bf").replace("int", "i")
        text = f"{text} {short}".strip()
    return text


def _label(node: dict[str, Any]) -> str:
    op = str(node.get("op", ""))
    text = op.rsplit("::", 1)[-1] if node.get("kind") in _OP_KINDS else str(node.get("name", "")).rsplit("/", 1)[-1]
    return text if len(text) <= 18 else text[:17] + "\u2026"


def _tooltip(node: dict[str, Any]) -> str:
    lines = [f"{node.get('status')}: {node.get('op')}", str(node.get("name", "")).split("/", 1)[-1]]
    if node.get("shapes"):
        lines.append(f"shapes {node['shapes']}  dtypes {node.get('dtypes')}")
    if node.get("args"):
        lines.append(f"args {node['args']}")
    if node.get("change"):
        lines.append(f"changed: {node['change']}")
    if node.get("inner"):
        lines.append("runs inside: " + ", ".join(f"{k} x{v}" for k, v in node["inner"].items()))
    return "\n".join(lines)


def _svg(region: _Region, uid: str) -> str:
    nodes = region.context_in + region.members + region.context_out
    pos = _layout(region)
    width = max(x for x, _ in pos.values()) + _W + _PAD
    height = max(y for _, y in pos.values()) + _H + _PAD
    esc = html.escape
    status_of = {str(n["name"]): str(n.get("status")) for n in nodes}
    out = [f'<svg xmlns="http://www.w3.org/2000/svg" class="graph-diff" viewBox="0 0 {width:.0f} {height:.0f}" '
           f'width="{width:.0f}" height="{height:.0f}" font-family="sans-serif" font-size="11" role="img" '
           f'aria-label="{esc(region.scope or "top level")}">',
           "<defs>"]
    for status, (_, stroke) in _STYLE.items():
        out.append(f'<marker id="arrow-{uid}-{status}" viewBox="0 0 8 8" refX="8" refY="4" markerWidth="7" '
                   f'markerHeight="7" orient="auto"><path d="M0,0 L8,4 L0,8 z" fill="{stroke}"/></marker>')
    out.append("</defs>")
    x = _PAD
    for status, (fill, stroke) in _STYLE.items():  # legend
        out.append(f'<rect x="{x}" y="{_PAD - 2}" width="12" height="12" rx="2" fill="{fill}" stroke="{stroke}"/>'
                   f'<text x="{x + 16}" y="{_PAD + 8}" class="gd-legend">{status}</text>')
        x += 86
    for n in nodes:
        x2, y2 = pos[str(n["name"])]
        for ref in n.get("inputs") or []:
            src = pos.get(_base(str(ref)))
            if src is None:
                continue
            statuses = {str(n.get("status")), status_of.get(_base(str(ref)), "same")}
            kind = next((s for s in ("removed", "added", "changed") if s in statuses), "same")
            x1, y1 = src[0] + _W, src[1] + _H / 2
            mid = (x1 + x2) / 2
            dash = ' stroke-dasharray="4 3"' if kind == "removed" else ""
            out.append(f'<path d="M{x1:.0f},{y1:.0f} C{mid:.0f},{y1:.0f} {mid:.0f},{y2 + _H / 2:.0f} '
                       f'{x2:.0f},{y2 + _H / 2:.0f}" fill="none" stroke="{_STYLE[kind][1]}" stroke-width="1.3"'
                       f'{dash} marker-end="url(#arrow-{uid}-{kind})"/>')
    for n in nodes:
        x, y = pos[str(n["name"])]
        status = str(n.get("status"))
        fill, stroke = _STYLE.get(status, _STYLE["same"])
        deco = ' text-decoration="line-through"' if status == "removed" else ""
        out.append(f'<g class="gd-node gd-{esc(status) if status in _STYLE else "same"}">'
                   f"<title>{esc(_tooltip(n))}</title>"
                   f'<rect x="{x}" y="{y}" width="{_W}" height="{_H}" rx="5" fill="{fill}" stroke="{stroke}"/>'
                   f'<text x="{x + _W / 2}" y="{y + 14}" text-anchor="middle" class="gd-op"{deco}>'
                   f"{esc(_label(n))}</text>"
                   f'<text x="{x + _W / 2}" y="{y + 27}" text-anchor="middle" class="gd-shape" font-size="9.5" '
                   'fill="#555">'
                   f"{esc(_fmt_shape(n))}</text></g>")
    out.append("</svg>")
    return "".join(out)


def _summary(members: list[dict[str, Any]]) -> str:
    """``"8 removed: bmm, mul, ...; 1 added: FlashAttentionFn"``."""
    ops: dict[str, list[str]] = defaultdict(list)
    for m in members:
        ops[str(m.get("status"))].append(str(m.get("op", "")).rsplit("::", 1)[-1])
    return "; ".join(f"{len(ops[s])} {s}: {', '.join(ops[s][:8])}{' ...' if len(ops[s]) > 8 else ''}"
                     for s in _BANDS if ops.get(s))


def diff_figures(data: dict[str, Any] | None) -> tuple[list[DiffFigure], int]:
    """The drawn regions of every diff in ``dataflow_diff.json`` (grouped), and how many were left out."""
    groups: dict[tuple[Any, ...], list[_Region]] = {}
    for label, entry in (data or {}).items():
        if not isinstance(entry, dict) or not isinstance(entry.get("nodes"), list):
            continue
        nodes = [n for n in entry["nodes"] if isinstance(n, dict) and "name" in n]
        candidate = str(entry.get("candidate", label))
        for region in _regions(str(label), nodes):
            groups.setdefault((candidate, *region.signature()), []).append(region)
    figures = []
    for i, regions in enumerate(list(groups.values())[:MAX_FIGURES]):
        first = regions[0]
        places = list(dict.fromkeys(f"{r.scope or '(top level)'}" for r in regions))
        entries = list(dict.fromkeys(r.entry for r in regions))
        where = _generic(first.scope) if len(places) > 1 else (first.scope or "(top level)")
        more = len(entries) - 1
        title = f"{entries[0]}: {where}" + (f" (the same in {more} more diff{'s' if more > 1 else ''})" if more else "")
        figures.append(DiffFigure(title, _summary(first.members), _svg(first, f"g{i}"), places))
    return figures, max(0, len(groups) - MAX_FIGURES)
