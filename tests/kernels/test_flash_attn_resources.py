"""The flash_attn resource report builds the kernels for sm_90 without a GPU and reads ptxas's report.

Builds run in a child process without ``TRITON_INTERPRET`` (under it the kernels are interpreter functions,
which cannot be compiled); the candidate lists need no build and run here.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
import torch

resources = pytest.importorskip("microscope_kernels.flash_attn.resources")

_BUILD = """
import dataclasses, json, sys, torch
from microscope_kernels.flash_attn import resources
flags = {"HEAD_DIM": 64, "CAUSAL": False, "USE_TMA": True, "INTERPRET": False, "UNMASKED": True}
out = []
for block_m in (64, 48):  # 48 rows: not a power of two, so no build
    constants = {**flags, "BLOCK_M": block_m, "BLOCK_N": 64, "WARP_SPEC": False, "LAZY": False}
    out.append(dataclasses.asdict(resources.compile_report(resources.fa._attn_fwd, torch.bfloat16, constants, 4, 3)))
print(json.dumps(out))
"""


@pytest.mark.skipif(not os.path.exists(resources._ptxas()), reason="this Triton ships no ptxas")
def test_a_forward_candidate_builds_for_hopper_and_a_failing_one_is_a_row():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    done = subprocess.run([sys.executable, "-c", _BUILD], capture_output=True, text=True, env=env, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    built, failed = json.loads(done.stdout.strip().splitlines()[-1])
    assert built["error"] is None
    assert 32 <= built["registers"] <= 255 and built["spill_bytes"] >= 0
    assert built["shared_bytes"] >= 64 * 64 * 2  # at least the resident Q tile
    assert built["wgmma"] and not built["warp_specialized"]
    assert failed["error"] and failed["registers"] == 0


def test_under_the_interpreter_the_report_says_how_to_run_it(monkeypatch):
    if os.environ.get("TRITON_INTERPRET") != "1":
        pytest.skip("the kernels were imported for a GPU here")
    with pytest.raises(RuntimeError, match="without it"):
        resources.compile_report(resources.fa._attn_fwd, torch.bfloat16, {}, 4, 3)


def test_candidates_follow_the_pruning_and_add_the_split_forwards_second_launch():
    rows = resources.candidates(128, torch.bfloat16, causal=True, unmasked=True, kernels=("_attn_fwd",))
    forward = [cfg for name, _, _, cfg in rows if name == "_attn_fwd"]
    assert any(cfg.kwargs["WARP_SPEC"] for cfg in forward), "a single-loop causal forward is warp-specializable"
    rest = [(c["BLOCK_M"], c["BLOCK_N"]) for name, _, c, _ in rows if name == "_attn_fwd_rest"]
    assert sorted(rest) == sorted({(c.kwargs["BLOCK_M"], c.kwargs["BLOCK_N"]) for c in forward})
    assert {name for name, *_ in rows} == {"_attn_fwd", "_attn_fwd_rest"}
    backward = resources.candidates(128, torch.bfloat16, causal=False, unmasked=True)
    assert {name for name, *_ in backward} == {"_attn_fwd", "_attn_bwd_dkdv", "_attn_bwd_dq", "_attn_bwd_dkdvq"}
    assert not any(cfg.kwargs.get("WARP_SPEC") for name, _, _, cfg in backward if name == "_attn_bwd_dkdvq")
