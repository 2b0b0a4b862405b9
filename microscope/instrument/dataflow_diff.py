"""The union of two dataflow graphs, every node marked removed, added, changed or same.

What a reviewer wants to see drawn: the baseline's graph and the candidate's in one picture, with
the ops the change took out, the ops it put in, and the wiring between them and the unchanged rest.
Nodes are matched module by module (the same scope in both graphs): parameters, buffers and inputs
by name, ops in execution order with ``difflib.SequenceMatcher`` on their names. A matched pair is one node,
*same* or, when its output shapes, dtypes, non-tensor arguments or hidden inner ops differ, *changed*;
an unmatched baseline node is *removed*, an unmatched candidate node *added*. A node's name is its
status followed by its scoped name (``removed/blocks.0/attn/attn_fn/bmm``,
``added/blocks.0/attn/attn_fn/FlashAttentionFn``), so TensorBoard's Graphs tab shows four boxes
that fold by module; its edges are the union of both graphs' edges, so a same node fed by a removed
op in the baseline and by an added op in the candidate shows both.
"""

from __future__ import annotations

import difflib
from collections import Counter
from dataclasses import asdict, dataclass
from typing import Any

from microscope.instrument.dataflow import DataflowGraph, DataflowNode

__all__ = ["STATUSES", "DataflowDiff", "DiffNode", "diff_dataflow"]

#: Node statuses, in the order reports list them.
STATUSES = ("removed", "added", "changed", "same")
#: Node kinds that are computation (parameters, buffers and inputs are data).
OP_KINDS = ("aten", "function", "triton")


@dataclass
class DiffNode(DataflowNode):
    """A node of the union graph: ``status`` and, for a changed node, what changed (``change``)."""

    status: str = "same"
    change: str = ""


@dataclass
class DataflowDiff:
    """The union graph of ``baseline`` and ``candidate``; ``nodes`` keep a baseline-first execution order."""

    baseline: str
    candidate: str
    nodes: list[DiffNode]
    note: str = ""

    def counts(self) -> Counter[str]:
        """Op nodes per status (parameters and inputs left out)."""
        return Counter(n.status for n in self.nodes if n.kind in OP_KINDS)

    def scopes(self, status: str) -> list[str]:
        """Modules holding an op node of ``status``, in order."""
        return list(dict.fromkeys(n.scope for n in self.nodes if n.status == status and n.kind in OP_KINDS))

    @property
    def headline(self) -> str:
        c = self.counts()
        text = ", ".join(f"{c[s]} ops {s}" if i == 0 else f"{c[s]} {s}" for i, s in enumerate(STATUSES))
        touched = list(dict.fromkeys(s for status in STATUSES[:3] for s in self.scopes(status)))
        if touched:
            shown = ", ".join(t or "(top level)" for t in touched[:4]) + (" ..." if len(touched) > 4 else "")
            text += f"; in {shown}"
        return text

    def to_graph(self) -> DataflowGraph:
        """The union as a plain graph (for ``graphdef.to_graph_def``; the nodes keep their status)."""
        return DataflowGraph(list(self.nodes), self.note)

    def to_dict(self) -> dict[str, Any]:
        return {"baseline": self.baseline, "candidate": self.candidate, "headline": self.headline,
                "counts": dict(self.counts()), "note": self.note, "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataflowDiff:
        return cls(str(data.get("baseline", "")), str(data.get("candidate", "")),
                   [DiffNode(**n) for n in data.get("nodes", [])], str(data.get("note", "")))


def _change(a: DataflowNode, b: DataflowNode) -> str:
    parts = []
    for what, x, y in (("dtype", a.dtypes, b.dtypes), ("shape", a.shapes, b.shapes), ("args", a.args, b.args),
                       ("inner ops", a.inner, b.inner)):
        if x != y:
            parts.append(f"{what} {x} -> {y}")
    return "; ".join(parts)


def _by_scope(graph: DataflowGraph) -> dict[str, list[DataflowNode]]:
    out: dict[str, list[DataflowNode]] = {}
    for node in graph.nodes:
        out.setdefault(node.scope, []).append(node)
    return out


def _copy(node: DataflowNode, status: str, change: str = "") -> DiffNode:
    return DiffNode(name=f"{status}/{node.name}", op=node.op, scope=node.scope, kind=node.kind, inputs=[],
                    shapes=node.shapes, dtypes=node.dtypes, args=node.args, inner=dict(node.inner),
                    status=status, change=change)


def diff_dataflow(base: DataflowGraph, cand: DataflowGraph, *, baseline: str = "baseline",
                  candidate: str = "candidate") -> DataflowDiff:
    """The union graph of ``base`` and ``cand`` with every node's status (see the module docstring)."""
    a_scopes, b_scopes = _by_scope(base), _by_scope(cand)
    nodes: list[DiffNode] = []
    pairs: list[tuple[DiffNode, DataflowNode | None, DataflowNode | None]] = []
    a_map: dict[str, str] = {}
    b_map: dict[str, str] = {}
    def matched(x: DataflowNode, y: DataflowNode) -> None:
        change = _change(x, y)
        node = _copy(y, "changed" if change else "same", change)
        node.name = f"{node.status}/{x.name}"
        pairs.append((node, x, y))

    for scope in dict.fromkeys([*a_scopes, *b_scopes]):
        a_data = {(n.kind, n.leaf): n for n in a_scopes.get(scope, []) if n.kind not in OP_KINDS}
        b_data = {(n.kind, n.leaf): n for n in b_scopes.get(scope, []) if n.kind not in OP_KINDS}
        for key, x in a_data.items():
            if key in b_data:
                matched(x, b_data[key])
            else:
                pairs.append((_copy(x, "removed"), x, None))
        pairs += [(_copy(y, "added"), None, y) for key, y in b_data.items() if key not in a_data]
        a = [n for n in a_scopes.get(scope, []) if n.kind in OP_KINDS]
        b = [n for n in b_scopes.get(scope, []) if n.kind in OP_KINDS]
        matcher = difflib.SequenceMatcher(None, [n.op for n in a], [n.op for n in b], autojunk=False)
        for tag, i1, i2, j1, j2 in matcher.get_opcodes():
            if tag == "equal":
                for x, y in zip(a[i1:i2], b[j1:j2]):
                    matched(x, y)
                continue
            pairs += [(_copy(x, "removed"), x, None) for x in a[i1:i2]]
            pairs += [(_copy(y, "added"), None, y) for y in b[j1:j2]]
    for node, x, y in pairs:
        if x is not None:
            a_map[x.name] = node.name
        if y is not None:
            b_map[y.name] = node.name
    for node, x, y in pairs:
        refs = [_remap(r, a_map) for r in (x.inputs if x else [])] + [_remap(r, b_map) for r in (y.inputs if y else [])]
        node.inputs = list(dict.fromkeys(refs))
        nodes.append(node)
    notes = [n for n in (base.note, cand.note) if n]
    return DataflowDiff(baseline, candidate, nodes, "; ".join(dict.fromkeys(notes)))


def _remap(ref: str, names: dict[str, str]) -> str:
    node, sep, slot = ref.partition(":")
    return names[node] + sep + slot
