"""Every built-in operator plugin, through the runner on a CUDA GPU: compiled kernels, not the interpreter.

Skipped where no GPU is present (CI). On a GPU host: ``python -m pytest -m gpu``.
"""

from __future__ import annotations

import pytest
import torch

from microscope import config as cfgmod
from microscope import registry
from microscope.runner import Runner

pytestmark = pytest.mark.gpu


def _operator_plugins() -> list[str]:
    if not torch.cuda.is_available():
        return ["(no GPU)"]
    return [name for name, cls in registry.discover().items() if cls.variants and name != "planted_work"]


@pytest.mark.parametrize("name", _operator_plugins())
def test_plugin_on_cuda_every_variant_passes_or_is_skipped(name, tmp_path):
    plugin = registry.get(name)
    config = cfgmod.loads(
        f"plugin: {name}\ndimensions:\n  throughput: {{warmup: 1, rounds: 2, reps: 2}}\n", f"{name}-gpu.yaml"
    )
    result = Runner(plugin, config, device="cuda", interpreted=False, out_root=tmp_path, run_id=name).run()
    # a baseline may legitimately produce NaN/Inf (safe_softmax's naive "before" overflows by design)
    failed = [f"{r.variant} {r.case_id} {r.metric}: {r.reason}" for r in result.records
              if r.status == "failed" and not (r.role == "baseline" and "NaN/Inf" in (r.reason or ""))]
    assert not failed, "\n".join(failed)
    accuracy = [r for r in result.records if r.dimension == "accuracy" and r.status == "ok"]
    assert accuracy and all(r.passed for r in accuracy if r.role != "peer"), [
        f"{r.variant} {r.case_id} {r.metric}: {r.reason}" for r in accuracy if not r.passed
    ]
    assert all(not r.interpreted for r in result.records)
