"""The process that plans a GPU run never starts CUDA: its workers do the GPU's work.

Skipped where no GPU is present (CI). On a GPU host: ``python -m pytest -m gpu tests/test_gpu_cli_process.py``.
Each check runs in a fresh interpreter, since this test process may have started CUDA already.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

PLUGIN = '''
from microscope.api import Ablation, Tolerance, baseline, candidate, grid, randn, register


def double(x):
    return x * 2.0


def double_too(x):
    return x + x


@register("cli_process_probe")
class Probe(Ablation):
    """x * 2 two ways, on the GPU."""

    variants = {"plain": baseline(double), "candidate": candidate(double_too)}
    cases = grid(n=[4096, 65536], dtype=["fp32"])
    tolerance = {"*": Tolerance(rtol=1e-6, atol=1e-6)}

    def inputs(self, case, gen, device):
        return {"x": randn((case["n"],), case.dtype, gen, device)}
'''


def _python(code: str, cwd: Path) -> dict:
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_driver_reports_what_torch_reports_without_starting_cuda(tmp_path):
    seen = _python(
        "import json, torch\n"
        "from microscope.device import gpu_facts\n"
        "f = gpu_facts()\n"
        "started = torch.cuda.is_initialized()\n"
        "p = torch.cuda.get_device_properties(0)\n"
        "print(json.dumps({'started': started, 'facts': [f.name, f.capability, f.memory_bytes],\n"
        "                  'torch': [p.name, f'{p.major}.{p.minor}', int(p.total_memory)]}))\n", tmp_path)
    assert seen["started"] is False
    assert seen["facts"] == seen["torch"]


def test_a_gpu_run_leaves_cuda_unstarted_in_the_process_that_plans_it(tmp_path):
    (tmp_path / "probe.py").write_text(PLUGIN)
    (tmp_path / "probe.yaml").write_text("plugin: cli_process_probe\nplugins: [probe.py]\n"
                                         "dimensions:\n  throughput: {warmup: 1, rounds: 2, reps: 1}\n")
    seen = _python(
        "import json, torch\n"
        "from microscope import cli\n"
        "code = cli.main(['run', 'probe.yaml', '--device', 'cuda', '--out', 'runs', '--no-progress', '--no-report'])\n"
        "print(json.dumps({'code': code, 'started': torch.cuda.is_initialized()}))\n", tmp_path)
    assert seen == {"code": 0, "started": False}
    (run,) = (tmp_path / "runs").iterdir()
    records = [json.loads(line) for line in (run / "records.jsonl").read_text().splitlines() if line.strip()]
    assert records and all(r["status"] == "ok" for r in records)
    assert {r["env"]["device_name"] for r in records} == {torch.cuda.get_device_name(0)}
