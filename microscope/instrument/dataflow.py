"""The dataflow graph a variant ran: ops as nodes, tensors as edges, each op in its module's scope.

``optrace`` lists *which* ops ran; a graph a reviewer can open (TensorBoard's Graphs tab, the HTML
report) also needs *what feeds what*. ``capture_dataflow`` runs a function once and records it at the
dispatcher, which sees every model that runs, with Triton kernels (compiled or interpreted) and
custom ``autograd.Function`` calls included. ``torch.export``, ``make_fx`` and ``jit.trace`` do not:
they stop at, or trace into, the Python of a custom Function and Triton's interpreter, so the kernel a
change introduced would be missing or drawn as its implementation details.

* Every ATen op is a node. Its inputs are the nodes that produced its tensor arguments (tensor
  identity, so an in-place op becomes the producer of the tensor it modified).
* View ops (``view``, ``transpose``, ``expand``...) move no data: their outputs are attributed to the
  producer of their base, so edges skip them (``keep_views=True`` keeps them as nodes).
* A custom ``autograd.Function`` call (``FlashAttentionFn``) or a bare Triton launch is one node; the
  ATen ops it ran inside are counted in its ``inner`` ops, not drawn.
* Parameters and buffers are nodes named by their qualified name (``blocks.0.attn.qkv.weight``),
  created where first read; inputs passed by name are named so (``q``, ``k``, ``v``), and any other
  tensor from outside is ``input_<k>``, numbered in the order the call first read them.
* With ``model``, each node carries the innermost module running it (``blocks.0.attn.attn_fn``) as
  its scope; ops run by the autograd engine (a backward pass) are scoped under ``backward``.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterable, Mapping
from dataclasses import asdict, dataclass, field
from typing import Any

import torch
from torch import nn
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves
from torch.utils.weak import WeakTensorKeyDictionary

from microscope.instrument.hooks import _in_backward
from microscope.instrument.opaque import label_calls
from microscope.instrument.optrace import _ALIAS_OPS

__all__ = ["DataflowGraph", "DataflowNode", "capture_dataflow", "closure_inputs", "scope_path"]

#: ATen ops that only allocate; a bare Triton launch that receives their output is taken to write it.
_ALLOCATORS = {"aten::empty", "aten::empty_like", "aten::empty_strided", "aten::new_empty", "aten::zeros",
               "aten::zeros_like", "aten::new_zeros", "aten::full", "aten::full_like", "aten::new_full"}
_ARGS_SHOWN = 160


@dataclass
class DataflowNode:
    """One node: an op, a Function call, a parameter or an input.

    ``name`` is unique in its graph and ``/``-scoped (``blocks.0/attn/attn_fn/bmm_1``), the form
    TensorBoard folds by; ``inputs`` name producers, ``"node:k"`` for a producer's ``k``-th output.
    """

    name: str
    op: str
    scope: str
    kind: str  # aten | function | triton | parameter | buffer | input
    inputs: list[str] = field(default_factory=list)
    shapes: list[list[int]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    args: str = ""  # the call's non-tensor arguments, e.g. "dim=-1"
    inner: dict[str, int] = field(default_factory=dict)

    @property
    def leaf(self) -> str:
        """The name without its scope (``bmm_1``)."""
        return self.name.rsplit("/", 1)[-1]


@dataclass
class DataflowGraph:
    """The nodes of one captured call, in execution order."""

    nodes: list[DataflowNode]
    note: str = ""

    def __len__(self) -> int:
        return len(self.nodes)

    def by_name(self) -> dict[str, DataflowNode]:
        return {n.name: n for n in self.nodes}

    def ops(self, kinds: Iterable[str] = ("aten", "function", "triton")) -> list[str]:
        """The ops of the nodes of ``kinds`` in execution order (parameters and inputs left out)."""
        wanted = set(kinds)
        return [n.op for n in self.nodes if n.kind in wanted]

    def to_dict(self) -> dict[str, Any]:
        return {"note": self.note, "nodes": [asdict(n) for n in self.nodes]}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> DataflowGraph:
        return cls([DataflowNode(**n) for n in data.get("nodes", [])], data.get("note", ""))


_SAFE_PART = re.compile(r"[^A-Za-z0-9_.\-<>]")


def scope_path(module: str) -> str:
    """A module path as a TensorBoard scope: ``blocks.0.attn.attn_fn`` -> ``blocks.0/attn/attn_fn``.

    A numeric part (a ``ModuleList`` index) stays with its parent, so a layer folds as one box.
    """
    parts: list[str] = []
    for part in (p for p in module.split(".") if p):
        if part.isdigit() and parts:
            parts[-1] += f".{part}"
        else:
            parts.append(_SAFE_PART.sub("_", part))
    return "/".join(parts)


def _short(op: str) -> str:
    """A node's leaf name for an op: ``aten::bmm`` -> ``bmm``, ``triton::_attn_fwd`` -> ``_attn_fwd``."""
    return _SAFE_PART.sub("_", op.rsplit("::", 1)[-1]) or "op"


def _describe_args(args: Any, kwargs: Any) -> str:
    parts = [repr(a) for a in args if not isinstance(a, torch.Tensor) and not _has_tensor(a)]
    parts += [f"{k}={v!r}" for k, v in (kwargs or {}).items() if not _has_tensor(v)]
    text = ", ".join(parts)
    return text if len(text) <= _ARGS_SHOWN else text[:_ARGS_SHOWN - 3] + "..."


def _has_tensor(value: Any) -> bool:
    return any(isinstance(t, torch.Tensor) for t in tree_leaves(value))


def _tensors(value: Any) -> list[torch.Tensor]:
    return [t for t in tree_leaves(value) if isinstance(t, torch.Tensor)]


def _dtype(t: torch.Tensor) -> str:
    return str(t.dtype).replace("torch.", "")


class _Recorder(TorchDispatchMode):
    """Builds the graph: one node per op reaching the dispatcher, edges by tensor identity."""

    def __init__(self, scopes: list[str], named: WeakTensorKeyDictionary, keep_views: bool) -> None:
        super().__init__()
        self.graph = DataflowGraph(nodes=[])
        self.scopes = scopes
        self.named = named  # parameter/buffer tensor -> (qualified name, kind)
        self.keep_views = keep_views
        self.producers = WeakTensorKeyDictionary()  # tensor -> "node" or "node:k"
        self.opaque: list[DataflowNode] = []
        self.taken: dict[str, int] = {}
        self.allocations: set[str] = set()  # nodes that only allocated (a bare kernel may write them)
        self.n_inputs = 0

    # -- nodes ------------------------------------------------------------------------------------
    def _scope(self) -> str:
        scope = self.scopes[-1] if self.scopes else ""
        if _in_backward():
            return f"backward.{scope}" if scope else "backward"
        return scope

    def _unique(self, scope: str, leaf: str) -> str:
        base = f"{scope_path(scope)}/{leaf}" if scope else leaf
        n = self.taken.get(base, 0)
        self.taken[base] = n + 1
        return base if n == 0 else f"{base}_{n}"

    def _add(self, op: str, kind: str, scope: str, leaf: str, inputs: list[str], args: str = "") -> DataflowNode:
        node = DataflowNode(self._unique(scope, leaf), op, scope, kind, inputs, args=args)
        self.graph.nodes.append(node)
        if op in _ALLOCATORS:
            self.allocations.add(node.name)
        return node

    def _source(self, t: torch.Tensor) -> str:
        """The node that produced ``t``, creating a parameter/buffer/input node on first sight."""
        ref = self.producers.get(t)
        if ref is not None:
            return ref
        named = self.named.get(t)
        if named is not None and named[1] == "input":
            node = self._add("Input", "input", "", named[0], [])
        elif named is not None:
            qualified, kind = named
            scope, _, attr = qualified.rpartition(".")
            node = self._add("Parameter" if kind == "parameter" else "Buffer", kind, scope, attr or qualified, [])
        else:
            node = self._add("Input", "input", "", f"input_{self.n_inputs}", [])
            self.n_inputs += 1
        node.shapes, node.dtypes = [list(t.shape)], [_dtype(t)]
        self.producers[t] = node.name
        return node.name

    def _outputs(self, node: DataflowNode, out: Any) -> None:
        tensors = _tensors(out)
        node.shapes = [list(t.shape) for t in tensors]
        node.dtypes = [_dtype(t) for t in tensors]
        for i, t in enumerate(tensors):
            self.producers[t] = node.name if i == 0 else f"{node.name}:{i}"

    # -- ATen ops ---------------------------------------------------------------------------------
    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        out = func(*args, **(kwargs or {}))
        name = func._schema.name
        if self.opaque:
            inner = self.opaque[0].inner
            inner[name] = inner.get(name, 0) + 1
            return out
        inputs = _tensors((args, kwargs))
        if not self.keep_views and (func.is_view or name in _ALIAS_OPS):
            if inputs:
                source = self._source(inputs[0])
                for t in _tensors(out):
                    self.producers[t] = source
            return out
        sources = list(dict.fromkeys(self._source(t) for t in inputs))
        node = self._add(name, "aten", self._scope(), _short(name), sources, _describe_args(args, kwargs))
        self._outputs(node, out)
        return out

    # -- Function calls and Triton launches (via opaque.label_calls) ------------------------------
    def enter(self, name: str, args: tuple[Any, ...]) -> DataflowNode | None:
        if self.opaque:  # nested inside another labelled call: part of that one
            inner = self.opaque[0].inner
            inner[name] = inner.get(name, 0) + 1
            self.opaque.append(self.opaque[0])
            return None
        tensors = _tensors(args)
        sources = list(dict.fromkeys(self._source(t) for t in tensors))
        kind = "triton" if name.startswith("triton::") else "function"
        node = self._add(name, kind, self._scope(), _short(name), sources, _describe_args(args, {}))
        self.opaque.append(node)
        if kind == "triton":  # a bare launch writes its outputs into buffers allocated before it
            for t in tensors:
                if self.producers.get(t) in self.allocations:
                    self.producers[t] = node.name
        return node

    def exit(self, token: DataflowNode | None, result: Any) -> None:
        self.opaque.pop()
        if token is not None and result is not None and token.kind == "function":
            self._outputs(token, result)


def _named_tensors(model: nn.Module | None, inputs: Mapping[str, Any] | None) -> WeakTensorKeyDictionary:
    named = WeakTensorKeyDictionary()
    for key, value in (inputs or {}).items():
        if isinstance(value, torch.Tensor):
            named[value] = (_SAFE_PART.sub("_", str(key)) or "input", "input")
    if model is not None:
        for qualified, p in model.named_parameters(remove_duplicate=True):
            named[p] = (qualified, "parameter")
        for qualified, b in model.named_buffers(remove_duplicate=True):
            named[b] = (qualified, "buffer")
    return named


def closure_inputs(fn: Callable[..., Any]) -> dict[str, torch.Tensor]:
    """The named tensors a thunk closes over, if it holds them as one mapping (``make_call`` does).

    A harness thunk is ``lambda: variant(**inputs)``: the names of its inputs are only in its closure.
    Returns ``{}`` when no closed-over mapping of names to tensors is found (inputs stay ``input_<k>``).
    """
    for cell in getattr(fn, "__closure__", None) or ():
        try:
            value = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if isinstance(value, Mapping) and value and all(isinstance(k, str) for k in value):
            tensors = {k: v for k, v in value.items() if isinstance(v, torch.Tensor)}
            if tensors:
                return tensors
    return {}


def capture_dataflow(
    fn: Callable[[], Any],
    *,
    model: nn.Module | None = None,
    inputs: Mapping[str, Any] | None = None,
    keep_views: bool = False,
) -> DataflowGraph:
    """Run ``fn()`` once and return the dataflow graph of what it executed.

    With ``model`` every node is scoped by the innermost module running it (hooks that exist only
    during the call) and parameters/buffers are named. Wrap a model's callable swap points first
    (``callables.wrap_callables``) to give a swapped ``attn_fn`` a scope of its own. ``inputs`` names
    the tensors ``fn`` reads from outside (``{"q": q, ...}``).
    """
    scopes: list[str] = []
    handles = []
    if model is not None:

        def push(name: str) -> Callable[..., None]:
            def hook(module: nn.Module, args: Any) -> None:
                scopes.append(name)

            return hook

        def pop(module: nn.Module, args: Any, output: Any) -> None:  # returns None: keeps the output
            if scopes:
                scopes.pop()

        for name, module in model.named_modules():
            if name:  # the root's own ops sit at the top level
                handles.append(module.register_forward_pre_hook(push(name)))
                handles.append(module.register_forward_hook(pop))
    recorder = _Recorder(scopes, _named_tensors(model, inputs), keep_views)
    try:
        with label_calls(recorder.enter, recorder.exit, detail=True), recorder:
            fn()
    finally:
        for handle in handles:
            handle.remove()
    return recorder.graph
