"""Node-by-node diff of two captured graphs: which ops a change removed, added or replaced.

The two op sequences are aligned with ``difflib.SequenceMatcher`` (no auto-junk: common ops such as
``aten::mul`` must stay matchable). Each non-matching stretch becomes a *replacement* ``old ops ->
new ops`` (either side may be empty: a pure removal or addition). Identical replacements are grouped
and counted, so swapping the attention of a 4-layer model reads as one line
``4x aten::bmm, aten::mul, ..., aten::bmm -> aten::_scaled_dot_product_flash_attention_for_cpu``
with the modules where it happened, rather than as four separate edits. Op counts are compared too:
op kinds only in the baseline are *removed*, only in the candidate *added*, in both with different
counts *changed*.

The diff goes to JSON (for reports) and to Markdown (a TensorBoard text summary).
"""

from __future__ import annotations

import contextlib
import difflib
import json
from collections import Counter
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from torch import nn

from microscope.instrument.callables import SWAP_POINTS, wrap_callables
from microscope.instrument.optrace import OpGraph, capture_graph, fx_graph

__all__ = ["GraphDiff", "Replacement", "compare_models", "diff_graphs"]


@dataclass
class Replacement:
    """A stretch of baseline ops (``old``) that the candidate runs as ``new`` instead, ``count`` times."""

    old: tuple[str, ...]
    new: tuple[str, ...]
    count: int = 0
    modules: list[str] = field(default_factory=list)

    def describe(self, limit: int = 6) -> str:
        def seq(ops: tuple[str, ...]) -> str:
            if not ops:
                return "(nothing)"
            shown = ", ".join(ops[:limit])
            return shown + (f", ... ({len(ops)} ops)" if len(ops) > limit else "")

        return f"{self.count}x {seq(self.old)} -> {seq(self.new)}"


@dataclass
class GraphDiff:
    """Ops removed, added, changed in count, and grouped replacements, baseline -> candidate."""

    baseline: str
    candidate: str
    method: str
    base_ops: int
    cand_ops: int
    removed: dict[str, int]
    added: dict[str, int]
    changed: dict[str, tuple[int, int]]
    replacements: list[Replacement]
    note: str = ""

    @property
    def identical(self) -> bool:
        return not self.replacements

    @property
    def headline(self) -> str:
        """One line: op kinds removed/added/changed and the most frequent replacement."""
        if self.identical:
            return f"same {self.base_ops} ops in the same order"
        parts = [f"{len(self.removed)} op kinds removed", f"{len(self.added)} added",
                 f"{len(self.changed)} changed in count", f"{self.base_ops} -> {self.cand_ops} ops"]
        top = self.replacements[0]
        return ", ".join(parts) + f"; most frequent edit: {top.describe(limit=4)}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``added``/``removed``/``changed`` are lists of ``{op, ...}`` items (what reports list)."""
        return {
            "baseline": self.baseline, "candidate": self.candidate, "method": self.method,
            "headline": self.headline, "note": self.note, "base_ops": self.base_ops, "cand_ops": self.cand_ops,
            "removed": [{"op": op, "count": n} for op, n in sorted(self.removed.items(), key=lambda kv: -kv[1])],
            "added": [{"op": op, "count": n} for op, n in sorted(self.added.items(), key=lambda kv: -kv[1])],
            "changed": [{"op": op, "baseline": a, "candidate": b} for op, (a, b) in sorted(self.changed.items())],
            "replacements": [asdict(r) for r in self.replacements],
        }

    def to_json(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(self.to_dict(), indent=1), encoding="utf-8")
        return path

    def to_markdown(self) -> str:
        """The diff as Markdown (TensorBoard's text plugin renders tables)."""
        lines = [f"**{self.baseline} -> {self.candidate}** ({self.method} trace): {self.headline}", ""]
        if self.note:
            lines += [f"_{self.note}_", ""]
        if self.removed or self.added or self.changed:
            lines += ["| op | baseline | candidate | |", "| --- | ---: | ---: | --- |"]
            for op, n in sorted(self.removed.items(), key=lambda kv: -kv[1]):
                lines.append(f"| `{op}` | {n} | 0 | removed |")
            for op, n in sorted(self.added.items(), key=lambda kv: -kv[1]):
                lines.append(f"| `{op}` | 0 | {n} | added |")
            for op, (a, b) in sorted(self.changed.items()):
                lines.append(f"| `{op}` | {a} | {b} | changed |")
            lines.append("")
        if self.replacements:
            lines += ["| times | baseline ops | candidate ops | where |", "| ---: | --- | --- | --- |"]
            for r in self.replacements:
                where = ", ".join(sorted(set(r.modules))[:4]) + (" ..." if len(set(r.modules)) > 4 else "")
                lines.append(f"| {r.count} | {', '.join(f'`{o}`' for o in r.old) or '-'} | "
                             f"{', '.join(f'`{o}`' for o in r.new) or '-'} | {where} |")
        return "\n".join(lines)


def diff_graphs(base: OpGraph, cand: OpGraph, *, baseline: str = "baseline", candidate: str = "candidate") -> GraphDiff:
    """Align two graphs captured the same way and report what changed, node by node."""
    if base.method != cand.method:
        raise ValueError(f"cannot diff a {base.method!r} graph against a {cand.method!r} graph: "
                         "capture both the same way (compare_models does)")
    a, b = base.ops, cand.ops
    matcher = difflib.SequenceMatcher(None, a, b, autojunk=False)
    groups: dict[tuple[tuple[str, ...], tuple[str, ...]], Replacement] = {}
    for tag, i1, i2, j1, j2 in matcher.get_opcodes():
        if tag == "equal":
            continue
        key = (tuple(a[i1:i2]), tuple(b[j1:j2]))
        rep = groups.setdefault(key, Replacement(*key))
        rep.count += 1
        where = base.nodes[i1].module if i2 > i1 else cand.nodes[j1].module
        rep.modules.append(where)
    ca, cb = Counter(a), Counter(b)
    notes = [n for n in (base.note, cand.note) if n]
    return GraphDiff(
        baseline=baseline, candidate=candidate, method=base.method, base_ops=len(a), cand_ops=len(b),
        removed={op: n for op, n in ca.items() if op not in cb},
        added={op: n for op, n in cb.items() if op not in ca},
        changed={op: (n, cb[op]) for op, n in ca.items() if op in cb and cb[op] != n},
        replacements=sorted(groups.values(), key=lambda r: (-r.count, -len(r.old) - len(r.new))),
        note="; ".join(dict.fromkeys(notes)),
    )


def compare_models(
    base: nn.Module,
    cand: nn.Module,
    args: Sequence[Any],
    *,
    method: str = "dispatch",
    baseline: str = "baseline",
    candidate: str = "candidate",
    wrap: Sequence[str] = SWAP_POINTS,
) -> GraphDiff:
    """Capture both models' forward graphs the same way and diff them.

    For the dispatch trace the callables named in ``wrap`` (the model's swap points) are wrapped as
    modules during the capture, so the ops of a swapped ``attn_fn`` are attributed to
    ``blocks.<i>.attn.attn_fn`` rather than to the attention module around it.

    ``method="auto"`` uses ``torch.fx`` when *both* models trace symbolically and falls back to the
    dispatch trace for both otherwise (the reason is kept in ``note``): a diff is only meaningful
    between graphs of the same granularity.
    """
    if method == "auto":
        try:
            g_base, g_cand = fx_graph(base), fx_graph(cand)
        except Exception as exc:  # fx raises many kinds (TraceError, TypeError, ...) for untraceable code
            reason = f"torch.fx could not trace ({type(exc).__name__}: {str(exc).splitlines()[0][:160]}); " \
                     "used the dispatch trace of the executed ops"
            g_base, g_cand = _dispatch(base, args, wrap), _dispatch(cand, args, wrap)
            g_base.note = g_cand.note = reason
    elif method == "dispatch":
        g_base, g_cand = _dispatch(base, args, wrap), _dispatch(cand, args, wrap)
    else:
        g_base, g_cand = capture_graph(base, *args, method=method), capture_graph(cand, *args, method=method)
    return diff_graphs(g_base, g_cand, baseline=baseline, candidate=candidate)


def _dispatch(model: nn.Module, args: Sequence[Any], wrap: Sequence[str]) -> OpGraph:
    with wrap_callables(model, wrap) if wrap else contextlib.nullcontext():
        return capture_graph(model, *args, method="dispatch")
