"""Forward and backward hooks on every module: per-module statistics, and what divergence needs.

A verdict says *that* a change moved a number; to see *where*, the baseline and the candidate run on
identical inputs and weights under an ``ActivationRecorder``, and ``divergence`` compares their
captures module by module in execution order::

    with ActivationRecorder(model, backward=True) as rec:
        loss = loss_fn(model(tokens))
        loss.backward()
    rec.stats        # forward: one dict per module output (mean, std, absmax, NaN/Inf, fp16/bf16 hazards)
    rec.grad_stats   # backward: the same for the gradient w.r.t. each module output
    rec.capture      # what ``divergence(base, cand)`` compares

The hooks exist only inside the ``with`` block: entering registers them, leaving removes every one,
so a model that is not being recorded runs with no hook at all (``enabled=False`` registers none even
inside the block). What is kept per tensor is small by default (a statistics vector and a 1024-number
sketch, see ``tensorstats``); ``keep="full"`` keeps copies for exact comparisons of small models.

Operators and callables that are not modules (an ``attn_fn``, an activation function, a plugin's
variant) become visible by wrapping them in ``OpModule`` (see ``callables``).
"""

from __future__ import annotations

import contextlib
import re
import warnings
from collections import defaultdict
from collections.abc import Callable
from typing import Any

import torch
from torch import nn
from torch.utils._pytree import tree_leaves

from microscope.instrument.capture import Capture, Keep, Observation
from microscope.instrument.tensorstats import sketch, summarize

__all__ = ["ROOT", "ActivationRecorder"]

#: The name under which the recorded model itself appears.
ROOT = "<root>"


def _in_backward() -> bool:
    """True while the autograd engine runs a backward pass (e.g. a checkpoint recomputing a block)."""
    current = getattr(torch._C, "_current_graph_task_id", None)
    return current is not None and current() != -1


class ActivationRecorder:
    """Hooks on every module of ``model`` that keep a ``Capture`` of what flowed through them.

    ``backward=True`` also registers ``register_full_backward_hook`` on every module, observing the
    gradient w.r.t. each module output. ``keep`` selects what is kept besides the statistics:
    ``"sketch"`` (default), ``"full"`` or ``"stats"``. ``histograms=k`` keeps a k-bin histogram of the
    finite values of each tensor (one host synchronisation per tensor on a GPU). ``include`` is a
    regular expression; only modules whose name matches it (``re.search``) are hooked.

    Forward hooks that fire while the autograd engine runs (activation checkpointing recomputing a
    block in backward) are ignored, so a checkpointed model records each module once, like an
    un-checkpointed one. Use one recorder per step: a second forward pass inside the same block is
    recorded as each module's second call.

    Run the backward pass inside the block too. (PyTorch binds backward hooks to the graph when the
    forward pass runs, so a backward pass run after the block still reports to this recorder, though
    no hook is registered on the model any more.) Full backward hooks cannot observe a module whose
    output is later modified in place (PyTorch raises); record such models with ``backward=False``.
    """

    def __init__(
        self,
        model: nn.Module,
        *,
        backward: bool = False,
        keep: Keep = "sketch",
        histograms: int = 0,
        include: str | None = None,
        enabled: bool = True,
    ) -> None:
        if keep not in ("stats", "sketch", "full"):
            raise ValueError(f"keep must be 'stats', 'sketch' or 'full', got {keep!r}")
        if histograms < 0:
            raise ValueError("histograms (bins) must be >= 0")
        self.model = model
        self.backward = backward
        self.keep: str = keep
        self.histograms = histograms
        self.include = re.compile(include) if include else None
        self.enabled = enabled
        self._handles: list[torch.utils.hooks.RemovableHandle] = []
        self._calls: dict[tuple[str, str], int] = defaultdict(int)
        self._capture = Capture(keep=keep)
        self._finalized = False
        self._warnings: contextlib.AbstractContextManager[Any] | None = None

    # -- lifecycle ------------------------------------------------------------------------------
    def __enter__(self) -> ActivationRecorder:
        if self._handles:
            raise RuntimeError("this ActivationRecorder is already recording; use one `with` block at a time")
        self.clear()
        if self.enabled:
            if self.backward:
                # Embeddings (integer inputs) and the root module have no input that needs a gradient;
                # PyTorch then warns that the hook sees gradients w.r.t. outputs only -- which is all we
                # read, so the warning is noise here.
                self._warnings = warnings.catch_warnings()
                self._warnings.__enter__()
                warnings.filterwarnings("ignore", message="Full backward hook is firing when gradients")
            for name, module in self.model.named_modules():
                name = name or ROOT
                if self.include is not None and not self.include.search(name):
                    continue
                self._handles.append(module.register_forward_hook(self._forward_hook(name)))
                if self.backward:
                    self._handles.append(module.register_full_backward_hook(self._backward_hook(name)))
        return self

    def __exit__(self, *exc: object) -> None:
        self.remove()
        self._finish()

    def remove(self) -> None:
        """Remove every hook this recorder registered (idempotent)."""
        for handle in self._handles:
            handle.remove()
        self._handles.clear()
        if self._warnings is not None:
            self._warnings.__exit__(None, None, None)
            self._warnings = None

    def clear(self) -> None:
        """Forget what was recorded so far (e.g. keep only the last of several steps)."""
        self._calls.clear()
        self._capture = Capture(keep=self.keep)
        self._finalized = False

    @property
    def num_hooks(self) -> int:
        """Hooks currently registered by this recorder (0 outside the ``with`` block or when disabled)."""
        return len(self._handles)

    # -- results --------------------------------------------------------------------------------
    @property
    def capture(self) -> Capture:
        self._finish()
        return self._capture

    @property
    def stats(self) -> list[dict[str, Any]]:
        """Forward statistics, one dict per module output, in execution order."""
        return self.capture.stats("forward")

    @property
    def grad_stats(self) -> list[dict[str, Any]]:
        """Backward statistics of the gradients w.r.t. module outputs, in the order backward reached them."""
        return self.capture.stats("backward")

    def _finish(self) -> None:
        if not self._finalized and not self._handles:
            self._capture.finalize()
            self._finalized = True

    # -- hooks ----------------------------------------------------------------------------------
    def _observe(self, kind: str, module: str, call: int, output: int, n_outputs: int, t: torch.Tensor) -> None:
        obs_list = self._capture.observations(kind)  # type: ignore[arg-type]
        with torch.no_grad():
            summary = summarize(t)
            obs = Observation(kind=kind, index=len(obs_list), module=module, call=call, output=output,
                              n_outputs=n_outputs, shape=tuple(t.shape), dtype=str(t.dtype).replace("torch.", ""),
                              summary=summary)
            if self.keep == "sketch":
                obs.sketch = sketch(t)
            elif self.keep == "full":
                obs.tensor = t.detach().clone()
            if self.histograms:
                obs.histogram, obs.hist_range = _histogram(t, self.histograms)
        obs_list.append(obs)
        self._finalized = False

    def _forward_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, args: Any, output: Any) -> None:
            if _in_backward():
                return
            call = self._calls["forward", name]
            self._calls["forward", name] = call + 1
            leaves = [t for t in tree_leaves(output) if isinstance(t, torch.Tensor) and t.is_floating_point()]
            for i, t in enumerate(leaves):
                self._observe("forward", name, call, i, len(leaves), t)

        return hook

    def _backward_hook(self, name: str) -> Callable[..., None]:
        def hook(module: nn.Module, grad_input: Any, grad_output: Any) -> None:
            call = self._calls["backward", name]
            self._calls["backward", name] = call + 1
            grads = [(i, g) for i, g in enumerate(grad_output) if isinstance(g, torch.Tensor) and g.is_floating_point()]
            for i, g in grads:
                self._observe("backward", name, call, i, len(grad_output), g)

        return hook


def _histogram(t: torch.Tensor, bins: int) -> tuple[torch.Tensor, tuple[float, float]]:
    """Counts of the finite values of ``t`` in ``bins`` equal bins between their min and max."""
    xf = t.detach().float()
    finite = xf[torch.isfinite(xf)]
    if finite.numel() == 0:
        return torch.zeros(bins), (0.0, 0.0)
    lo, hi = finite.min().item(), finite.max().item()
    if lo == hi:
        lo, hi = lo - 0.5, hi + 0.5
    return torch.histc(finite, bins=bins, min=lo, max=hi), (lo, hi)
