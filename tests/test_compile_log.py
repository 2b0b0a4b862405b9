"""The worker's Triton build log: one line per kernel build, saying whether it compiled or hit the cache."""

from types import SimpleNamespace

import pytest

from microscope.executors import compile_log

knobs = pytest.importorskip("triton").knobs


def test_each_build_becomes_one_line_naming_kernel_source_and_time():
    lines: list[str] = []
    previous = knobs.compilation.listener
    try:
        assert compile_log.install(lines.append)
        listener = knobs.compilation.listener
        listener(src=None, metadata={"name": "_attn_fwd", "num_warps": 8, "num_stages": 3}, metadata_group={},
                 times=SimpleNamespace(total=2_310_000), cache_hit=False)
        listener(src=None, metadata={"name": "_attn_fwd", "num_warps": 8, "num_stages": 3}, metadata_group={},
                 times=SimpleNamespace(total=41_000), cache_hit=True)
    finally:
        knobs.compilation.listener = previous
    assert lines == ["triton _attn_fwd: compiled, 2310 ms (warps 8, stages 3)",
                     "triton _attn_fwd: disk cache, 41 ms (warps 8, stages 3)"]
