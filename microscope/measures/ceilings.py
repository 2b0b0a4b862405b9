"""The device's measured ceilings: what "fast" means on this GPU, measured in the same run.

Roofline fractions are only honest against ceilings measured on the same card, at the same clocks, in
the same run; a datasheet peak flatters every kernel equally and hides throttling.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from dataclasses import dataclass
from pathlib import Path

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

    @classmethod
    def for_run(cls, run_dir: Path) -> Ceilings:
        """This GPU's ceilings as first measured in this run: a run's later worker processes (a fresh one
        after a crash or a leak) read them from ``run_dir`` instead of spending ~1.5 s measuring again."""
        index = torch.cuda.current_device()
        path = Path(run_dir) / f"ceilings-{torch.cuda.get_device_properties(index).uuid}.json"
        try:
            return cls(**json.loads(path.read_text()))
        except (OSError, ValueError, TypeError):
            pass
        measured = cls.measure()
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(f".{os.getpid()}.tmp")
        tmp.write_text(json.dumps(dataclasses.asdict(measured)))
        tmp.replace(path)
        return measured


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
