"""What do the hooks cost? Time a forward+backward step without hooks, with them, and after them.

Run ``python -m microscope.instrument.overhead`` for the embedded workload's small model on this
machine. Three phases are timed in interleaved rounds (none / hooked / after-exit, repeated) so that
drift of the machine hits all three alike; each phase's time is the median over rounds of the mean
step time. The "after" phase checks the promise that leaving the recorder restores the model
exactly: no hooks remain and the step time returns to the no-hook time.
"""

from __future__ import annotations

import argparse
import statistics
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from typing import Any

import torch
from torch import nn

from microscope.instrument.capture import Keep
from microscope.instrument.hooks import ActivationRecorder

__all__ = ["Overhead", "count_hooks", "measure_overhead"]


@dataclass(frozen=True)
class Overhead:
    """Median step times (ms) of the three phases, and their ratios to the no-hook time."""

    keep: str
    backward: bool
    hooks_registered: int
    hooks_after: int
    none_ms: float
    hooked_ms: float
    after_ms: float

    @property
    def ratio(self) -> float:
        return self.hooked_ms / self.none_ms

    @property
    def after_ratio(self) -> float:
        return self.after_ms / self.none_ms

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "ratio": self.ratio, "after_ratio": self.after_ratio}


def count_hooks(model: nn.Module) -> int:
    """Forward, forward-pre and backward hooks registered on any module of ``model``."""
    total = 0
    for module in model.modules():
        total += len(module._forward_hooks) + len(module._forward_pre_hooks)
        total += len(module._backward_hooks) + len(module._backward_pre_hooks)
    return total


def _default_workload(device: str) -> tuple[nn.Module, Callable[[nn.Module], torch.Tensor]]:
    from microscope.workloads.model import ModelConfig, build_model

    cfg = ModelConfig(n_layers=4, d_model=128, n_heads=4, context=64)
    model = build_model(cfg, seed=0, device=device)
    tokens = torch.randint(0, cfg.vocab_size, (4, cfg.context), generator=torch.Generator().manual_seed(0))
    tokens = tokens.to(device)

    def loss(m: nn.Module) -> torch.Tensor:
        logits = m(tokens)
        return nn.functional.cross_entropy(logits.flatten(0, 1), tokens.flatten())

    return model, loss


def measure_overhead(
    model: nn.Module | None = None,
    loss_fn: Callable[[nn.Module], torch.Tensor] | None = None,
    *,
    keep: Keep = "sketch",
    backward: bool = True,
    steps: int = 5,
    rounds: int = 5,
    device: str = "cpu",
) -> Overhead:
    """Time ``loss_fn(model).backward()`` with no hooks, under an ``ActivationRecorder``, and after it.

    Defaults to the embedded workload (4 layers, d_model 128, batch 4 x 64 tokens) on ``device``
    (ignored when a model is given). A fresh recorder
    wraps each hooked step, as the harness would use it (one recording per step).
    """
    if (model is None) != (loss_fn is None):
        raise ValueError("pass both model and loss_fn, or neither (for the default workload)")
    if model is None or loss_fn is None:
        model, loss_fn = _default_workload(device)
    sync = torch.cuda.synchronize if next(model.parameters()).is_cuda else (lambda: None)

    def step() -> None:
        model.zero_grad(set_to_none=True)
        loss = loss_fn(model)
        if backward:
            loss.backward()

    def plain() -> float:
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            step()
        sync()
        return (time.perf_counter() - start) / steps * 1e3

    registered = 0

    def hooked() -> float:
        nonlocal registered
        sync()
        start = time.perf_counter()
        for _ in range(steps):
            with ActivationRecorder(model, backward=backward, keep=keep) as rec:
                registered = rec.num_hooks
                step()
            rec.capture  # noqa: B018  # finalising (host transfer) is part of the cost
        sync()
        return (time.perf_counter() - start) / steps * 1e3

    for _ in range(2):  # warm-up: allocator, thread pools, first-call paths
        step()
    with ActivationRecorder(model, backward=backward, keep=keep):
        step()
    none, with_hooks, after = [], [], []
    for _ in range(rounds):
        none.append(plain())
        with_hooks.append(hooked())
        after.append(plain())
    return Overhead(keep=keep, backward=backward, hooks_registered=registered, hooks_after=count_hooks(model),
                    none_ms=statistics.median(none), hooked_ms=statistics.median(with_hooks),
                    after_ms=statistics.median(after))


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=5)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--forward-only", action="store_true", help="time forward passes only")
    parser.add_argument("--device", default="cpu", help="cpu or cuda")
    args = parser.parse_args(argv)
    print(f"device={args.device} threads={torch.get_num_threads()} "
          f"{'forward' if args.forward_only else 'forward+backward'}, embedded workload 4x128, batch 4x64")
    print(f"{'keep':>7} {'hooks':>6} {'none ms':>9} {'hooked ms':>10} {'after ms':>9} {'ratio':>6} "
          f"{'after/none':>10} {'left':>5}")
    for keep in ("stats", "sketch", "full"):
        o = measure_overhead(keep=keep, backward=not args.forward_only, steps=args.steps, rounds=args.rounds,
                             device=args.device)
        print(f"{o.keep:>7} {o.hooks_registered:>6} {o.none_ms:>9.2f} {o.hooked_ms:>10.2f} {o.after_ms:>9.2f} "
              f"{o.ratio:>6.2f} {o.after_ratio:>10.2f} {o.hooks_after:>5}")


if __name__ == "__main__":
    main()
