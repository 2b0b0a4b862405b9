"""Peak memory of a training step and of inference.

On CUDA the allocator's own peak counter is used (``torch.cuda.max_memory_allocated`` after a reset):
the absolute peak of allocated bytes during the measured region, weights included. On CPU there is no
such counter in PyTorch, so the caller passes ``probe``: a zero-argument callable returning a context
manager whose yielded object has ``peak_bytes`` set when the block exits (the harness's memory
measure). Without one, these functions refuse rather than report a number that was not measured.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from typing import Any

import torch

from microscope.workloads.model import Transformer
from microscope.workloads.train import Trainer, TrainRecipe

__all__ = ["PeakProbe", "PeakReading", "cuda_peak_memory", "peak_memory_inference", "peak_memory_train_step"]

#: ``probe() -> context manager``; the object it yields has ``peak_bytes`` (int) after the block.
PeakProbe = Callable[[], AbstractContextManager[Any]]


@dataclass
class PeakReading:
    """What ``cuda_peak_memory`` yields; ``peak_bytes`` is filled in when the block exits."""

    peak_bytes: int = -1


@contextmanager
def cuda_peak_memory(device: torch.device | str) -> Iterator[PeakReading]:
    """Peak bytes allocated on ``device`` by the CUDA caching allocator during the block."""
    reading = PeakReading()
    torch.cuda.synchronize(device)
    torch.cuda.reset_peak_memory_stats(device)
    yield reading
    torch.cuda.synchronize(device)
    reading.peak_bytes = int(torch.cuda.max_memory_allocated(device))


def _probe_for(device: torch.device, probe: PeakProbe | None) -> PeakProbe:
    if probe is not None:
        return probe
    if device.type == "cuda":
        return lambda: cuda_peak_memory(device)
    raise ValueError(
        f"no peak-memory counter for device {device.type!r}: pass probe= (a context-manager factory "
        "whose yielded object gets peak_bytes), e.g. the harness's memory measure"
    )


def _read(reading: Any) -> int:
    peak = getattr(reading, "peak_bytes", None)
    if not isinstance(peak, int) or peak < 0:
        raise RuntimeError(f"memory probe yielded {reading!r} without a peak_bytes reading")
    return peak


def peak_memory_train_step(
    model: Transformer,
    batch: tuple[torch.Tensor, torch.Tensor],
    recipe: TrainRecipe,
    probe: PeakProbe | None = None,
    warmup_steps: int = 1,
) -> int:
    """Peak bytes of one steady-state train step (forward, backward, clip, optimizer step).

    ``warmup_steps`` untimed steps first allocate the optimizer state, so the measured step is a
    typical one. Trains ``model`` in place (pass a fresh one); instrumentation is off so the
    parameter snapshot of the stability statistics does not count.
    """
    device = next(model.parameters()).device
    measure = _probe_for(device, probe)
    trainer = Trainer(model, recipe, device, instrument=False)
    x, y = (t.to(device) for t in batch)
    for step in range(warmup_steps):
        trainer.step(step, x, y)
    with measure() as reading:
        trainer.step(warmup_steps, x, y)
    return _read(reading)


@torch.no_grad()
def peak_memory_inference(
    model: Transformer, prompt: torch.Tensor, new_tokens: int = 0, probe: PeakProbe | None = None
) -> int:
    """Peak bytes of a prefill of ``prompt`` followed by ``new_tokens`` cached greedy decode steps."""
    measure = _probe_for(prompt.device, probe)
    model.eval()
    with measure() as reading:
        logits, cache = model.prefill(prompt)
        token = logits[:, -1].argmax(-1)
        for _ in range(new_tokens):
            token = model.decode_step(token, cache).argmax(-1)
    return _read(reading)
