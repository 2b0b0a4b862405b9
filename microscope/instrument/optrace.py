"""The computation graph a variant actually ran, as an ordered list of ops.

Two ways to capture it, chosen per comparison (see ``graphdiff.compare_models``):

``dispatch`` (default): run the model once under a ``TorchDispatchMode`` and list every ATen op
    that reached the dispatcher, in execution order, with the module it ran in. It records what was
    *executed* -- after Python control flow, after the swapped ``attn_fn`` was called, after
    composite ops decomposed (``torch.matmul`` appears as ``aten::bmm``/``aten::mm``) -- so it
    captures any model that runs. Custom ``autograd.Function`` calls and Triton launches are listed
    as one op each (``FlashAttnFunction``, ``triton::_attn_fwd``, see ``opaque``), with the ATen ops
    they ran inside counted as their ``inner`` ops rather than listed; a Triton kernel launched
    outside a Function is listed by its name too. View ops (``view``, ``transpose``, ``expand``...)
    alias their input and move no data; they are dropped unless ``keep_views=True``.
``fx``: ``torch.fx.symbolic_trace`` -- a static graph of Python-level calls (``torch.matmul``,
    ``Tensor.softmax``, leaf modules such as ``Linear``) that needs no inputs. It fails on models
    whose control flow depends on tensor values or shapes (the embedded workload's attention mask
    does). Were it to trace *into* a custom Function's Python code (listing what the Function does
    in Python rather than the kernel it stands for), ``fx_graph`` refuses with ``FxTraceError``.
    Useful for module-swap changes on traceable models.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from microscope.instrument.opaque import label_calls

__all__ = ["FxTraceError", "OpGraph", "OpNode", "capture_graph", "fx_graph", "trace_ops"]

#: Ops that only re-label a tensor (no data movement); dropped from dispatch traces by default.
_ALIAS_OPS = {"aten::detach", "aten::alias", "aten::lift_fresh", "aten::_unsafe_view"}


@dataclass
class OpNode:
    """One executed op: its name, the module it ran in, output shapes, and ops hidden inside it."""

    index: int
    op: str
    module: str = ""
    kind: str = "aten"  # aten | function | triton | fx
    shapes: list[list[int]] = field(default_factory=list)
    inner: dict[str, int] = field(default_factory=dict)


@dataclass
class OpGraph:
    """The ordered ops of one variant, and how they were captured."""

    method: str
    nodes: list[OpNode]
    note: str = ""

    @property
    def ops(self) -> list[str]:
        return [n.op for n in self.nodes]

    def counts(self) -> Counter[str]:
        return Counter(self.ops)

    def to_dict(self) -> dict[str, Any]:
        return {"method": self.method, "note": self.note, "nodes": [asdict(n) for n in self.nodes]}

    def to_json(self, path: str) -> None:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(self.to_dict(), fh, indent=1)


def _shapes(out: Any) -> list[list[int]]:
    return [list(t.shape) for t in tree_leaves(out) if isinstance(t, torch.Tensor)]


class _Tracer(TorchDispatchMode):
    """Appends one ``OpNode`` per ATen op; inside a labelled call, counts the op as the call's inner op."""

    def __init__(self, graph: OpGraph, module_stack: list[str], keep_views: bool) -> None:
        super().__init__()
        self.graph = graph
        self.module_stack = module_stack
        self.keep_views = keep_views
        self.opaque: list[OpNode] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if self.opaque:
            inner = self.opaque[0].inner
            inner[name] = inner.get(name, 0) + 1
            return out
        if not self.keep_views and (func.is_view or name in _ALIAS_OPS):
            return out
        self.graph.nodes.append(OpNode(len(self.graph.nodes), name, self._module(), "aten", _shapes(out)))
        return out

    def _module(self) -> str:
        return self.module_stack[-1] if self.module_stack else ""

    # -- labelled calls (autograd.Function, Triton launches) ----------------------------------------
    def enter(self, name: str) -> OpNode | None:
        if self.opaque:  # nested inside another labelled call: part of that one
            inner = self.opaque[0].inner
            inner[name] = inner.get(name, 0) + 1
            self.opaque.append(self.opaque[0])
            return None
        kind = "triton" if name.startswith("triton::") else "function"
        node = OpNode(len(self.graph.nodes), name, self._module(), kind)
        self.graph.nodes.append(node)
        self.opaque.append(node)
        return node

    def exit(self, token: OpNode | None) -> None:
        self.opaque.pop()


def trace_ops(fn: Callable[[], Any], *, model: nn.Module | None = None, keep_views: bool = False) -> OpGraph:
    """Run ``fn()`` once and list the ops it executed (forward, and backward if ``fn`` calls it).

    With ``model`` each op is attributed to the innermost module running it (hooks that exist only
    during the call). Backward ops run outside any module call and carry an empty module name.
    """
    graph = OpGraph(method="dispatch", nodes=[])
    stack: list[str] = []
    handles = []
    if model is not None:

        def push(name: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                stack.append(name)

            return hook

        def pop(module: nn.Module, args: Any, output: Any) -> None:  # must return None: keeps the output
            if stack:
                stack.pop()

        for name, module in model.named_modules():
            handles.append(module.register_forward_pre_hook(push(name or "<root>")))
            handles.append(module.register_forward_hook(pop))
    tracer = _Tracer(graph, stack, keep_views)
    try:
        with label_calls(tracer.enter, tracer.exit), tracer:
            fn()
    finally:
        for handle in handles:
            handle.remove()
    return graph


class FxTraceError(RuntimeError):
    """``torch.fx`` would misrepresent this model (it traced into a custom kernel)."""


#: Python-level plumbing in fx graphs (attribute reads, tuple indexing); not ops.
_FX_PLUMBING = {"getattr", "_operator.getitem"}


def fx_graph(model: nn.Module) -> OpGraph:
    """The ``torch.fx.symbolic_trace`` graph of ``model`` as an ``OpGraph`` (raises if it cannot trace).

    Raises ``FxTraceError`` when tracing entered a custom ``autograd.Function`` or a Triton launch:
    fx would list the Python inside the Function instead of the kernel it stands for.
    """
    from torch.fx import symbolic_trace
    from torch.fx.node import _get_qualified_name

    kernels: list[str] = []
    with label_calls(kernels.append, lambda token: None):
        gm = symbolic_trace(model)
    if kernels:
        raise FxTraceError(f"torch.fx traced into {', '.join(sorted(set(kernels)))} instead of keeping it as one op")
    nodes: list[OpNode] = []
    for node in gm.graph.nodes:
        if node.op == "call_function":
            op = _get_qualified_name(node.target)
        elif node.op == "call_method":
            op = f"Tensor.{node.target}"
        elif node.op == "call_module":
            op = type(gm.get_submodule(node.target)).__name__
        else:
            continue
        if op in _FX_PLUMBING:
            continue
        stack = node.meta.get("nn_module_stack") or {}
        module = str(node.target) if node.op == "call_module" else (list(stack.values())[-1][0] if stack else "")
        nodes.append(OpNode(len(nodes), op, module, "fx"))
    return OpGraph(method="fx", nodes=nodes)


def capture_graph(
    model: nn.Module,
    *args: Any,
    method: str = "dispatch",
    keep_views: bool = False,
    **kwargs: Any,
) -> OpGraph:
    """The graph of ``model(*args, **kwargs)`` by ``method`` (``"dispatch"`` or ``"fx"``), forward only.

    The dispatch trace runs the model once under ``torch.no_grad`` (the forward graph is the same;
    autograd bookkeeping is not part of it). For forward+backward use ``trace_ops`` with a closure.
    """
    if method == "fx":
        return fx_graph(model)
    if method != "dispatch":
        raise ValueError(f"method must be 'dispatch' or 'fx', got {method!r}")

    def run() -> None:
        with torch.no_grad():
            model(*args, **kwargs)

    return trace_ops(run, model=model, keep_views=keep_views)
