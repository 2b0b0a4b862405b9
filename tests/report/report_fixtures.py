"""Synthetic results folders for the report tests, written by hand the way a run writes them.

``make_run`` writes ``records.jsonl`` lines (the schema of ``microscope.store.records``), a
``comparison.csv`` in the statistics engine's column order, optional instrument JSONs and a config,
so the reports are tested on exactly their inputs without running any kernel. The default run has
a faster candidate, an accuracy fail (whose speed and memory are "not judged"), a failed trial (out
of memory) and a skipped peer.
"""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from microscope.store.comparison import COMPARISON_COLUMNS

ENV_GPU = {"commit": "0123456789abcdef0123456789abcdef01234567", "python": "3.11.7", "torch": "2.13.0",
           "triton": "3.9.0", "device_name": "NVIDIA H200", "config_hash": "4ef7fde060c83a6c",
           "interpreter": False, "host_cpus": 16, "cuda": "12.8", "capability": "9.0",
           "corpus_hash": "c0ffee00c0ffee00", "platform": "linux-x86_64"}
OOM = "out of memory: CUDA out of memory. Tried to allocate 2.00 GiB (GPU 0; 139.8 GiB total)"
SKIP = "needs the flash backend of SDPA (sm80+)"
ACC_FAIL = "rel_err 0.031 > 4 x baseline's 2.1e-03; 5.2% of elements outside atol + rtol*|ref|"


@dataclass
class Spec:
    """What a synthetic run holds; every field can be changed per test."""

    run_id: str = "20260101-000000-flash_attn"
    plugin: str = "flash_attn"
    baseline: str = "eager"
    candidate: str = "triton"
    peer: str = "sdpa"
    cases: int = 4
    dims: tuple[str, ...] = ("accuracy", "throughput", "memory")
    gpu: bool = True
    interpreted: bool = False
    rounds: int = 10
    speedup: float = 2.5
    load: float = 1.0  # machine load of this run: slows every variant's rounds alike
    fail_reason: str = OOM
    skip_reason: str = SKIP
    acc_reason: str = ACC_FAIL
    acc_fail: bool = True  # the candidate fails out.rel_err in the second case
    comparison: bool = True
    stability: bool = False
    instruments: bool = False
    env: dict[str, Any] = field(default_factory=lambda: dict(ENV_GPU))
    seed: int = 0


def record(spec: Spec, variant: str, role: str, case: int, dimension: str, metric: str, value: float | None,
           **kw: Any) -> dict[str, Any]:
    rec = {"run_id": spec.run_id, "plugin": spec.plugin, "variant": variant, "role": role,
           "case_id": f"seq={512 * (case + 1)},bf16", "case": {"seq": 512 * (case + 1), "dtype": "bf16"},
           "seed": 11, "dimension": dimension, "metric": metric, "value": value, "unit": "", "status": "ok",
           "reason": None, "passed": None, "details": {}, "device": "cuda" if spec.gpu else "cpu",
           "interpreted": spec.interpreted, "env": spec.env, "time": "2026-01-01T00:00:00+00:00"}
    rec.update(kw)
    return rec


def _records(spec: Spec, rng: np.random.Generator) -> list[dict[str, Any]]:
    out = []
    b, c, p = spec.baseline, spec.candidate, spec.peer
    last = spec.cases - 1  # the candidate runs out of memory on the largest case
    for i in range(spec.cases):
        for dim in spec.dims:
            metric = {"accuracy": "rel_err", "throughput": "latency_ms", "memory": "peak_bytes"}.get(dim, dim)
            out.append(record(spec, p, "peer", i, dim, metric, None, status="skipped", reason=spec.skip_reason))
        if "accuracy" in spec.dims:
            for variant, role in ((b, "baseline"), (c, "candidate")):
                for tensor in ("out", "grad_q"):
                    bad = spec.acc_fail and variant == c and tensor == "out" and i == 1
                    out.append(record(spec, variant, role, i, "accuracy", f"{tensor}.rel_err",
                                      0.031 if bad else 2e-3 * (1 + rng.random()), unit="ratio",
                                      passed=not bad, reason=spec.acc_reason if bad else None))
        if "throughput" in spec.dims:
            base_ms = 0.5 * (i + 1)
            for variant, role, scale in ((b, "baseline", 1.0), (c, "candidate", 1 / spec.speedup)):
                if variant == c and i == last:
                    out.append(record(spec, variant, role, i, "throughput", "latency_ms", None, status="failed",
                                      reason=spec.fail_reason))
                    continue
                rounds = list(base_ms * scale * spec.load * (1 + 0.02 * rng.standard_normal(spec.rounds)))
                ms = float(np.median(rounds))
                out.append(record(spec, variant, role, i, "throughput", "latency_ms", ms, unit="ms",
                                  details={"rounds": rounds, "iqr_rel": 0.03, "notes": []}))
                flops, nbytes = 4e9 * (i + 1), 2e7 * (i + 1)
                for metric, amount, unit, scale2, ceiling in (("tflops", flops, "TFLOP/s", 1e12, 700.0),
                                                              ("gbps", nbytes, "GB/s", 1e9, 4000.0)):
                    details = {"amount": amount, "mode": "forward", "notes": []}
                    if spec.gpu:
                        details |= {"ceiling": ceiling, "fraction_of_ceiling": amount / ms * 1e3 / scale2 / ceiling}
                    out.append(record(spec, variant, role, i, "throughput", metric, amount / ms * 1e3 / scale2,
                                      unit=unit, details=details))
        if "memory" in spec.dims:
            for variant, role, mb in ((b, "baseline", 100), (c, "candidate", 60)):
                if variant == c and i == last:
                    out.append(record(spec, variant, role, i, "memory", "peak_bytes", None, status="failed",
                                      reason=spec.fail_reason))
                    continue
                out.append(record(spec, variant, role, i, "memory", "peak_bytes", mb * (i + 1) * 2**20,
                                  unit="bytes", details={"method": "cuda_allocator"}))
    if spec.stability:
        for variant, role, drift in ((b, "baseline", 0.0), (c, "candidate", 0.01)):
            for seed in range(3):
                steps = np.arange(50)
                loss = list(3.0 * np.exp(-steps / 20) + 1 + drift + 0.02 * rng.standard_normal(50))
                grad = list(np.abs(1.0 + 0.1 * rng.standard_normal(50)))
                for metric, curve in (("loss", loss), ("grad_norm", grad)):
                    out.append(record(spec, variant, role, 0, "stability", metric, curve[-1], seed=seed,
                                      case_id="model", details={"curve": curve}))
                out.append(record(spec, variant, role, 0, "generalization", "ood_loss", 2.1 + drift, seed=seed,
                                  case_id="model"))
    return out


def comparison_rows(spec: Spec) -> list[dict[str, Any]]:
    rows = []
    b, c, p = spec.baseline, spec.candidate, spec.peer
    last = spec.cases - 1

    def row(case: int | str, dim: str, metric: str, cand: str, verdict: str, **kw: Any) -> dict[str, Any]:
        case_id = case if isinstance(case, str) else f"seq={512 * (case + 1)},bf16"
        base = {"plugin": spec.plugin, "case_id": case_id, "dimension": dim, "metric": metric, "baseline": b,
                "candidate": cand, "role": "peer" if cand == p else "candidate", "verdict": verdict, "n": 10,
                "notes": ""}
        return base | kw

    for i in range(spec.cases):
        wrong = spec.acc_fail and "accuracy" in spec.dims and i == 1  # where the candidate fails accuracy
        if "throughput" in spec.dims:
            if i == last:
                rows.append(row(i, "throughput", "latency_ms", c, "failed", notes=spec.fail_reason))
            elif wrong:
                r = 1 / spec.speedup
                rows.append(row(i, "throughput", "latency_ms", c, "not judged", baseline_value=0.5 * (i + 1),
                                candidate_value=0.5 * (i + 1) * r, ratio_or_delta=r,
                                notes="not judged: fails accuracy (out.rel_err)"))
            else:
                r = 1 / spec.speedup
                rows.append(row(i, "throughput", "latency_ms", c, "faster", baseline_value=0.5 * (i + 1),
                                candidate_value=0.5 * (i + 1) * r, ratio_or_delta=r, ci_low=r * 0.95,
                                ci_high=r * 1.05, p=1e-5, p_adj=4e-5))
            rows.append(row(i, "throughput", "latency_ms", p, "skipped", notes=spec.skip_reason))
        if "accuracy" in spec.dims:
            for tensor in ("out", "grad_q"):
                bad = spec.acc_fail and tensor == "out" and i == 1
                rows.append(row(i, "accuracy", f"{tensor}.rel_err", c, "fail" if bad else "pass",
                                baseline_value=2e-3, candidate_value=0.031 if bad else 2.5e-3,
                                ratio_or_delta=15.5 if bad else 1.25, notes=spec.acc_reason if bad else ""))
        if "memory" in spec.dims:
            if i == last:
                rows.append(row(i, "memory", "peak_bytes", c, "failed", notes=spec.fail_reason))
            elif wrong:
                rows.append(row(i, "memory", "peak_bytes", c, "not judged", baseline_value=100 * (i + 1) * 2**20,
                                candidate_value=60 * (i + 1) * 2**20, ratio_or_delta=0.6,
                                notes="not judged: fails accuracy (out.rel_err)"))
            else:
                rows.append(row(i, "memory", "peak_bytes", c, "less", baseline_value=100 * (i + 1) * 2**20,
                                candidate_value=60 * (i + 1) * 2**20, ratio_or_delta=0.6))
    if spec.stability:
        rows.append(row("model", "stability", "loss", c, "non-inferior", baseline_value=1.05,
                        candidate_value=1.06, ratio_or_delta=0.01, ci_low=-0.01, ci_high=0.02, p=0.3))
        rows.append(row("model", "stability", "grad_norm", c, "equivalent", baseline_value=1.0,
                        candidate_value=1.0, ratio_or_delta=0.0, ci_low=-0.02, ci_high=0.02, p=0.9))
        rows.append(row("model", "generalization", "ood_loss", c, "worse", baseline_value=2.1,
                        candidate_value=2.11, ratio_or_delta=0.01, ci_low=0.005, ci_high=0.015, p=0.01))
    return rows


def instruments(spec: Spec) -> dict[str, Any]:
    modules = [f"layers.{i}.{m}" for i in range(6) for m in ("attn", "mlp")]
    div = {spec.candidate: {"rows": [{"module": m, "rel_err": 1e-4 * (1 + k) ** 2} for k, m in enumerate(modules)],
                            "first_divergent": "layers.3.attn"}}
    trace = {spec.candidate: {"headline": "3 eager kernels replaced by 1 fused kernel",
                              "added": [{"name": "_attn_fwd", "calls": 1, "time_us": 41.0}],
                              "removed": ["aten::bmm", "aten::softmax", "aten::bmm"], "changed": []}}
    graph = {spec.candidate: {"headline": "softmax and two matmuls fused", "added": ["flash_attention"],
                              "removed": ["softmax", "matmul", "matmul"],
                              "changed": [{"node": "view", "shape": "[4, 16]"}]}}
    return {"divergence.json": div, "trace_diff.json": trace, "graph_diff.json": graph}


def make_run(root: Path, spec: Spec | None = None) -> Path:
    """Write a results folder ``root/<run_id>/`` for ``spec`` and return it."""
    spec = spec or Spec()
    folder = root / spec.run_id
    folder.mkdir(parents=True)
    rng = np.random.default_rng(spec.seed)
    with (folder / "records.jsonl").open("w", encoding="utf-8") as fh:
        for rec in _records(spec, rng):
            fh.write(json.dumps(rec) + "\n")
    if spec.comparison:
        with (folder / "comparison.csv").open("w", newline="", encoding="utf-8") as fh:
            writer = csv.DictWriter(fh, fieldnames=COMPARISON_COLUMNS)
            writer.writeheader()
            for row in comparison_rows(spec):
                writer.writerow(row)
    if spec.instruments:
        for name, data in instruments(spec).items():
            (folder / name).write_text(json.dumps(data), encoding="utf-8")
    (folder / "config.yaml").write_text(f"plugin: {spec.plugin}\nseed: 0\nstats: {{alpha: 0.05, min_band: 0.01}}\n",
                                        encoding="utf-8")
    return folder
