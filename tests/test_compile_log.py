"""The worker's Triton build log: one line per kernel build, saying whether it compiled or hit the cache, and
one per autotuned key, saying which configuration won."""

from types import SimpleNamespace

import pytest

from microscope.executors import compile_log

knobs = pytest.importorskip("triton").knobs


def test_each_build_becomes_one_line_naming_kernel_source_and_time():
    lines: list[str] = []
    previous = knobs.compilation.listener, getattr(knobs.autotuning, "listener", None), knobs.autotuning.print
    try:
        assert compile_log.install(lines.append)
        listener = knobs.compilation.listener
        listener(src=None, metadata={"name": "_attn_fwd", "num_warps": 8, "num_stages": 3}, metadata_group={},
                 times=SimpleNamespace(total=2_310_000), cache_hit=False)
        listener(src=None, metadata={"name": "_attn_fwd", "num_warps": 8, "num_stages": 3}, metadata_group={},
                 times=SimpleNamespace(total=41_000), cache_hit=True)
    finally:
        knobs.compilation.listener = previous[0]
        if hasattr(knobs.autotuning, "listener"):
            knobs.autotuning.listener = previous[1]
        knobs.autotuning.print = previous[2]
    assert lines == ["triton _attn_fwd: compiled, 2310 ms (warps 8, stages 3)",
                     "triton _attn_fwd: disk cache, 41 ms (warps 8, stages 3)"]


@pytest.mark.skipif(not hasattr(knobs.autotuning, "listener"), reason="this Triton has no autotuning listener")
def test_each_autotuned_key_becomes_one_line_with_winner_and_runner_up():
    """Called the way Triton's autotuner calls it (its listener cannot run under the interpreter, whose kernels
    are no JITFunction): candidates ranked by median, the winner and runner-up named."""
    triton = pytest.importorskip("triton")

    def add_one(x):  # noqa: ANN001, ANN202 - stands for the tuned kernel; only its name is read
        return x

    fast, slow, slower = (triton.Config({"BLOCK": b}, num_warps=w) for b, w in ((128, 8), (64, 4), (32, 4)))
    lines: list[str] = []
    saved = knobs.compilation.listener, knobs.autotuning.listener
    try:
        assert compile_log.install(lines.append)
        listener = knobs.autotuning.listener
        listener(fn=add_one, key=(4096, "torch.bfloat16"), best_config=fast,
                 configs_timings={slow: [0.25, 0.24, 0.26], fast: [0.125, 0.12, 0.13], slower: 0.5}, duration=1.23,
                 cache_hit=False)
        listener(fn=add_one, key=(64,), best_config=slow, configs_timings=None, duration=None, cache_hit=True)
    finally:
        knobs.compilation.listener, knobs.autotuning.listener = saved
    assert lines == [
        f"triton autotune add_one: key (4096, 'torch.bfloat16'): 3 candidates in 1.2 s, chose {fast} at 0.125 ms; "
        f"runner-up {slow} at 0.25 ms",
        f"triton autotune add_one: key (64,): {slow} (autotuning cache)",
    ]


def test_a_rooms_own_choice_reaches_the_worker_log_once_and_nothing_else_does():
    """A room's INFO line (which path a shape keeps) goes to the log, once even after a second install; its
    DEBUG lines and a logger outside the rooms' do not."""
    import logging

    room = logging.getLogger("microscope_kernels.some_room.kernel")
    kernels = logging.getLogger(compile_log.KERNELS_LOGGER)
    previous = kernels.handlers[:], kernels.level
    lines: list[str] = []
    try:
        compile_log.install_kernel_log(lambda m: lines.append(f"first {m}"))
        compile_log.install_kernel_log(lines.append)
        room.info("int4_linear (1, 4096, 4096): the vector path (vector 9.1 us, direct 11.0 us)")
        room.debug("not this one")
        logging.getLogger("elsewhere").info("nor this one")
        assert lines == ["int4_linear (1, 4096, 4096): the vector path (vector 9.1 us, direct 11.0 us)"]
    finally:
        kernels.handlers[:] = previous[0]
        kernels.setLevel(previous[1])
