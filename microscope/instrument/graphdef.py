"""Dataflow graphs as TensorBoard ``GraphDef``s, the format its Graphs tab draws.

Node names keep their ``/`` scopes, so the Graphs tab folds the graph by module (``blocks.0`` ->
``attn`` -> ``attn_fn``); ``inputs`` become edges (``node:k`` for a producer's k-th output). Each node
carries its output shapes in ``_output_shapes`` (the Graphs tab labels edges with them) and, as
string attributes shown in the node's info card, ``dtype``, ``module``, the call's non-tensor
``args`` and, for a Function or kernel drawn as one node, the ``inner_ops`` it ran. A diff graph's
nodes carry ``diff`` (removed/added/changed/same) and the same word as their ``device``, so the
Graphs tab's "Color: Device" colours the four kinds apart.
"""

from __future__ import annotations

import time
from collections.abc import Sequence

from tensorboard.compat.proto.attr_value_pb2 import AttrValue
from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.graph_pb2 import GraphDef
from tensorboard.compat.proto.node_def_pb2 import NodeDef
from tensorboard.compat.proto.tensor_shape_pb2 import TensorShapeProto
from tensorboard.compat.proto.versions_pb2 import VersionDef
from torch.utils.tensorboard import SummaryWriter

from microscope.instrument.dataflow import DataflowNode

__all__ = ["from_graph_def", "to_graph_def", "write_graph_def"]

#: GraphDef producer version TensorBoard's reader accepts (the one torch's add_graph writes).
_PRODUCER = 22


def _text(value: str) -> AttrValue:
    return AttrValue(s=value.encode("utf-8"))


def _shapes(shapes: Sequence[Sequence[int]]) -> AttrValue:
    protos = [TensorShapeProto(dim=[TensorShapeProto.Dim(size=int(s)) for s in shape]) for shape in shapes]
    return AttrValue(list=AttrValue.ListValue(shape=protos))


def _node_def(node: DataflowNode) -> NodeDef:
    attr = {"_output_shapes": _shapes(node.shapes), "module": _text(node.scope or "(top level)"),
            "kind": _text(node.kind)}
    if node.dtypes:
        attr["dtype"] = _text(", ".join(dict.fromkeys(node.dtypes)))
    if node.args:
        attr["args"] = _text(node.args)
    if node.inner:
        inner = sorted(node.inner.items(), key=lambda kv: -kv[1])
        attr["inner_ops"] = _text(", ".join(f"{op} x{n}" for op, n in inner))
    status = getattr(node, "status", "")
    if status:
        attr["diff"] = _text(status)
    return NodeDef(name=node.name, op=node.op, input=list(node.inputs), device=status, attr=attr)


def to_graph_def(nodes: Sequence[DataflowNode]) -> GraphDef:
    """A ``GraphDef`` of the nodes (their names must be unique; inputs must name nodes in ``nodes``)."""
    names = {n.name for n in nodes}
    missing = sorted({ref.split(":")[0] for n in nodes for ref in n.inputs} - names)
    if missing:
        raise ValueError(f"edges from nodes that are not in the graph: {', '.join(missing[:5])}")
    return GraphDef(node=[_node_def(n) for n in nodes], versions=VersionDef(producer=_PRODUCER))


def write_graph_def(writer: SummaryWriter, graph: GraphDef) -> None:
    """Append ``graph`` to the writer's event file as the run's graph (what ``add_graph`` writes)."""
    event = Event(graph_def=graph.SerializeToString(), wall_time=time.time())
    writer._get_file_writer().add_event(event)


def _attr_text(node: NodeDef, key: str, default: str = "") -> str:
    return node.attr[key].s.decode("utf-8", errors="replace") if key in node.attr else default


def _inner(text: str) -> dict[str, int]:
    out: dict[str, int] = {}
    for part in filter(None, (p.strip() for p in text.split(", "))):
        op, _, count = part.rpartition(" x")
        if op and count.isdigit():
            out[op] = int(count)
    return out


def from_graph_def(graph: GraphDef) -> list[DataflowNode]:
    """The nodes of a ``GraphDef`` this module wrote (read back from an event file).

    A graph written by something else (``add_graph``'s jit trace) reads too: its scope is taken from
    the node name and its kind is ``aten``.
    """
    nodes = []
    for nd in graph.node:
        listed = nd.attr["_output_shapes"].list.shape if "_output_shapes" in nd.attr else []
        shapes = [[d.size for d in s.dim] for s in listed]
        scope = _attr_text(nd, "module", nd.name.rpartition("/")[0].replace("/", "."))
        dtypes = _attr_text(nd, "dtype")
        nodes.append(DataflowNode(
            name=nd.name, op=nd.op, scope="" if scope == "(top level)" else scope, kind=_attr_text(nd, "kind", "aten"),
            inputs=list(nd.input), shapes=shapes, dtypes=dtypes.split(", ") if dtypes else [],
            args=_attr_text(nd, "args"), inner=_inner(_attr_text(nd, "inner_ops"))))
    return nodes
