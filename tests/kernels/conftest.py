"""Shared fixtures of the kernel tests."""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
#: ``run_room``'s default overrides, which keep a room's run to seconds under the interpreter: forward accuracy
#: only, few timing rounds, no memory dimension.
FAST_RUN = {"dimensions.accuracy.backward": False, "dimensions.throughput.warmup": 0,
            "dimensions.throughput.rounds": 3, "dimensions.throughput.check_rounds": 1,
            "dimensions.throughput.input_sets": 1, "dimensions.memory.enabled": False}


@pytest.fixture
def seed(request: pytest.FixtureRequest) -> int:
    """A fresh random seed per test (kernels must hold on any input), printed so a failure can be replayed
    with ``MICROSCOPE_TEST_SEED=<seed> pytest <test id>``."""
    chosen = os.environ.get("MICROSCOPE_TEST_SEED", "").strip()
    value = int(chosen) if chosen.isdigit() else int.from_bytes(os.urandom(4), "little")
    print(f"{request.node.name}: random seed {value}")
    return value


@dataclass
class RoomRun:
    """A room's config run through microscope's Runner: its records, and the verdict lines the console prints."""

    records: list
    headlines: list[str]

    def find(self, **match: object) -> list:
        return [r for r in self.records if all(getattr(r, k) == v for k, v in match.items())]

    def check_speed_only(self, *names: str) -> None:
        """Each of ``names`` ran as a speed-only peer: accuracy skipped as such, latency measured, and the
        console says so."""
        from microscope.stats.metrics import SPEED_ONLY

        for name in names:
            acc = self.find(variant=name, dimension="accuracy")
            assert acc and all(r.status == "skipped" and r.reason == SPEED_ONLY for r in acc), name
            lat = self.find(variant=name, metric="latency_ms")
            assert lat and all(r.status == "ok" and r.details["speed_only"] for r in lat), name
        (line,) = [h for h in self.headlines if h.endswith("timed, accuracy not checked (different math)")]
        assert set(line.split(":")[0].split(", ")) == set(names)


@pytest.fixture
def run_room(tmp_path: Path) -> Callable[..., RoomRun]:
    """Run ``ablations/<name>.yaml --quick`` on the CPU (validated as ``microscope run`` does; ``overrides`` are
    ``--set`` keys over ``FAST_RUN``, ``profile`` a ``--profile``) and read its records and headlines back."""
    from microscope import config as cfgmod
    from microscope.api import interpreting
    from microscope.commands import load_checked
    from microscope.report.headline import from_comparison
    from microscope.runner import Runner
    from microscope.stats.run_table import save_run_table

    def run(name: str, overrides: dict | None = None, profile: str | None = None) -> RoomRun:
        overrides = {**FAST_RUN, **(overrides or {}), **({cfgmod.PROFILE_KEY: profile} if profile else {})}
        config, plugin = load_checked(ROOT / "ablations" / f"{name}.yaml", "cpu", True, overrides)
        result = Runner(plugin, config, device="cpu", interpreted=interpreting(), out_root=tmp_path,
                        run_id=name).run()
        return RoomRun(result.records, [h.text for h in from_comparison(save_run_table(result.out_dir))])

    return run
