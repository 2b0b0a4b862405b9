"""Worker health on a GPU: a Python-held leak gets a fresh worker; library workspaces do not.

Skipped where no GPU is present (CI). On a GPU host: ``python -m pytest -m gpu tests/test_gpu_workers.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from microscope import cli

pytestmark = pytest.mark.gpu

PLUGIN = '''
import torch
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register

KEPT = []  # a per-call cache that never empties: the leak a fresh worker exists for


def plain(x):
    return x * 2.0


def keeps(x):
    if not torch.is_grad_enabled() and x.shape[0] >= {leak_from}:
        KEPT.append(torch.empty(96 * 2**20 // 4, device=x.device))
    return x * 2.0


def on_a_new_stream(x):
    s = torch.cuda.Stream()  # cuBLAS allocates a workspace per handle and stream: C++-held, once per stream
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        y = (x.view(-1, 64) @ torch.ones(64, 64, device=x.device) / 64.0).view(-1) * 2.0
    torch.cuda.current_stream().wait_stream(s)
    return y


@register("worker_health_probe_{candidate}")
class Probe(Ablation):
    """x * 2, plainly, keeping a tensor per call, and on a fresh stream through a matmul."""

    variants = {{"plain": baseline(plain), "candidate": candidate({candidate}, differentiable=False)}}
    cases = grid(n=[1 << 12, 1 << 13, 1 << 14], dtype=["fp32"])
    tolerance = {{"*": Tolerance(rtol=1e-5, atol=1e-5)}}

    def inputs(self, case, gen, device):
        return {{"x": randn((case["n"],), case.dtype, gen, device)}}
'''


def _groups(tmp_path: Path, candidate: str, leak_from: int = 0) -> list[dict]:
    (tmp_path / "probe.py").write_text(PLUGIN.format(candidate=candidate, leak_from=leak_from))
    (tmp_path / "probe.yaml").write_text(f"plugin: worker_health_probe_{candidate}\nplugins: [probe.py]\n"
                                         "dimensions:\n  throughput: {warmup: 1, rounds: 2, reps: 1}\n"
                                         "  memory: {enabled: false}\n")
    assert cli.main(["run", str(tmp_path / "probe.yaml"), "--device", "cuda", "--out", str(tmp_path / "runs"),
                     "--no-progress", "--no-report"]) in (0, 1)
    (run,) = (tmp_path / "runs").iterdir()
    return [json.loads(line) for line in (run / "groups.jsonl").read_text().splitlines() if line.strip()]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_a_python_held_leak_gets_a_fresh_worker_and_names_its_holder(tmp_path):
    groups = _groups(tmp_path, "keeps", leak_from=1 << 13)
    notes = " ".join(n for g in groups for n in g.get("notes", []))
    assert "a leak" in notes and "fresh worker" in notes and "held by a list" in notes


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_library_workspaces_first_used_in_a_group_keep_the_worker(tmp_path):
    groups = _groups(tmp_path, "on_a_new_stream")
    notes = " ".join(n for g in groups for n in g.get("notes", []))
    assert "a leak" not in notes and "library workspaces (cuBLAS, cuDNN) first used here" in notes
    assert all(g["status"] == "ok" for g in groups)
