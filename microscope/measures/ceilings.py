"""The device's measured ceilings: what "fast" means on this GPU, measured in the same run.

Roofline fractions are only honest against ceilings measured on the same card, at the same clocks, in
the same run; a datasheet peak flatters every kernel equally and hides throttling.
"""

from __future__ import annotations

import statistics
from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class Ceilings:
    tflops: float  # dense bf16 matmul, 8192^3
    gbps: float  # device-to-device copy, bytes read + written

    @classmethod
    def measure(cls, reps: int = 20) -> Ceilings:
        n = 8192
        gen = torch.Generator(device="cuda").manual_seed(0)  # its own: the default one is the plugins'
        a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        b = torch.randn(n, n, device="cuda", dtype=torch.bfloat16, generator=gen)
        mm_ms = _median_ms(lambda: torch.mm(a, b), reps)
        a = b = None  # free 256 MiB before the copy test
        src = torch.empty(2**28, device="cuda", dtype=torch.uint8)  # 256 MiB, well beyond L2
        dst = torch.empty_like(src)
        copy_ms = _median_ms(lambda: dst.copy_(src), reps)
        return cls(tflops=2 * n**3 / mm_ms / 1e9, gbps=2 * src.numel() / copy_ms / 1e6)


def _median_ms(fn, reps: int) -> float:  # noqa: ANN001
    for _ in range(3):
        fn()
    torch.cuda.synchronize()
    times = []
    for _ in range(reps):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end))
    return statistics.median(times)
