"""Simulated nightly runs for the history tests, written the way ``microscope run`` writes a run folder.

Each night is a ``records.jsonl`` and a ``comparison.csv`` of a safe_softmax-like plugin on an H200:
a ``torch`` baseline and a ``triton`` candidate at 4096x16384 bf16, with accuracy (``out.rel_err``),
latency (20 per-round medians: a night-level offset, the between-run noise, times round-to-round
noise, as a real run's rounds vary), GB/s and peak memory. A planted change multiplies one variant's
latency (or memory, or error) from a given night on.
"""

from __future__ import annotations

import csv
import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import numpy as np

from microscope.stats.table import TABLE_COLUMNS

ENV_H200 = {"commit": "", "branch": "main", "python": "3.11.7", "torch": "2.13.0", "triton": "3.9.0",
            "device_name": "NVIDIA H200", "config_hash": "4ef7fde060c83a6c", "interpreter": False, "host_cpus": 16,
            "cuda": "12.8", "capability": "9.0", "gpu_driver": "570.86.15", "gpu_memory_bytes": 150_122_102_784,
            "cpu_model": "Intel(R) Xeon(R) Platinum 8480+", "platform": "linux-x86_64"}
ENV_A100 = ENV_H200 | {"device_name": "NVIDIA A100-SXM4-80GB", "capability": "8.0",
                       "gpu_memory_bytes": 85_899_345_920, "gpu_driver": "535.104.05"}
CASE = "rows=4096,cols=16384,bf16"
START = datetime(2026, 12, 1, 2, 0, tzinfo=timezone.utc)
BYTES = 2 * 4096 * 16384 * 2


def commit_sha(i: int) -> str:
    """A distinct, stable 40-hex sha per night."""
    return hashlib.sha1(f"night {i}".encode()).hexdigest()


@dataclass
class Night:
    """One simulated nightly run; the factors plant changes."""

    index: int
    commit: str = ""
    branch: str = "main"
    env: dict[str, Any] = field(default_factory=lambda: dict(ENV_H200))
    triton_ms: float = 0.50
    torch_ms: float = 1.20
    between_sd: float = 0.005  # night-to-night noise of the level
    round_sd: float = 0.01  # round-to-round noise inside a run
    rounds: int = 20
    triton_peak: float = 268_435_456.0
    triton_err: float = 2.1e-3
    failed_triton: bool = False
    old_csv: bool = False  # a comparison.csv from before the vs/gated columns existed
    seed: int = 0
    device: str = "cuda"

    def __post_init__(self) -> None:
        self.commit = self.commit or commit_sha(self.index)


def _record(night: Night, variant: str, role: str, dimension: str, metric: str, value: float | None,
            **kw: Any) -> dict[str, Any]:
    rec = {"run_id": f"{(START + timedelta(days=night.index)):%Y%m%d-%H%M%S}-safe_softmax", "plugin": "safe_softmax",
           "variant": variant, "role": role, "case_id": CASE, "case": {"rows": 4096, "cols": 16384, "dtype": "bf16"},
           "seed": 7, "dimension": dimension, "metric": metric, "value": value, "unit": "", "status": "ok",
           "reason": None, "passed": None, "details": {}, "device": night.device, "interpreted": False,
           "env": night.env | {"commit": night.commit, "branch": night.branch},
           "time": (START + timedelta(days=night.index, seconds=5)).isoformat(timespec="seconds")}
    rec.update(kw)
    return rec


def _rounds(level_ms: float, night: Night, rng: np.random.Generator) -> list[float]:
    offset = np.exp(rng.normal(0.0, night.between_sd))
    return list(level_ms * offset * np.exp(rng.normal(0.0, night.round_sd, night.rounds)))


def night_records(night: Night) -> list[dict[str, Any]]:
    rng = np.random.default_rng([night.seed, night.index])
    out = []
    for variant, role, ms, peak, err in (("torch", "baseline", night.torch_ms, 402_653_184.0, 2.0e-3),
                                         ("triton", "candidate", night.triton_ms, night.triton_peak, night.triton_err)):
        if variant == "triton" and night.failed_triton:
            for dim, metric in (("accuracy", "out.rel_err"), ("throughput", "latency_ms"), ("memory", "peak_bytes")):
                out.append(_record(night, variant, role, dim, metric, None, status="failed",
                                   reason="out of memory"))
            continue
        rounds = _rounds(ms, night, rng)
        median = float(np.median(rounds))
        out += [
            _record(night, variant, role, "accuracy", "out.rel_err", err, unit="ratio", passed=True),
            _record(night, variant, role, "throughput", "latency_ms", median, unit="ms",
                    details={"rounds": rounds, "gpu_state": [{"sm_mhz": 1980, "throttle": []}]}),
            _record(night, variant, role, "throughput", "gbps", BYTES / (median * 1e6), unit="GB/s"),
            _record(night, variant, role, "memory", "peak_bytes", peak, unit="bytes"),
        ]
    return out


def _comparison_rows(night: Night) -> list[dict[str, Any]]:
    rows = []
    for dim, metric, verdict in (("accuracy", "out.rel_err", "pass"), ("throughput", "latency_ms", "faster"),
                                 ("memory", "peak_bytes", "less"), ("throughput", "gbps", "info")):
        if night.failed_triton:
            verdict = "failed"
        rows.append({"plugin": "safe_softmax", "case_id": CASE, "dimension": dim, "metric": metric,
                     "baseline": "torch", "candidate": "triton", "role": "candidate", "verdict": verdict,
                     "vs": "baseline", "gated": True, "notes": "", "future_column": "ignored"})
    rows.append(rows[1] | {"vs": "best_peer", "verdict": "slower", "baseline": "sdpa"})
    return rows


def write_night(root: Path, night: Night) -> Path:
    """Write one night's run folder under ``root``; returns the folder."""
    records = night_records(night)
    folder = root / records[0]["run_id"]
    folder.mkdir(parents=True, exist_ok=True)
    with (folder / "records.jsonl").open("w", encoding="utf-8") as fh:
        for rec in records:
            fh.write(json.dumps(rec) + "\n")
    rows = _comparison_rows(night)
    columns = [c for c in TABLE_COLUMNS if c not in ("vs", "gated")] if night.old_csv else \
        [*TABLE_COLUMNS, "future_column"]
    if night.old_csv:
        rows = [r for r in rows if r["vs"] == "baseline"]
    with (folder / "comparison.csv").open("w", newline="", encoding="utf-8") as fh:
        writer = csv.DictWriter(fh, fieldnames=columns, extrasaction="ignore")
        writer.writeheader()
        writer.writerows(rows)
    return folder


def write_nights(root: Path, count: int, step_at: int | None = None, factor: float = 1.05, seed: int = 0,
                 **kw: Any) -> list[Path]:
    """``count`` nights, one commit each; from night ``step_at`` on the triton latency is x ``factor``."""
    folders = []
    for i in range(count):
        planted = step_at is not None and i >= step_at
        night = Night(i, seed=seed, triton_ms=0.50 * (factor if planted else 1.0), **kw)
        folders.append(write_night(root, night))
    return folders
