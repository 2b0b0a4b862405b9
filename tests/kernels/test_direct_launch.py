"""The direct launcher reuses a compiled kernel only where Triton itself would.

On CPU: the specialization key separates what Triton compiles separately, and (on a JITFunction whose
normal path is recorded instead of compiled) the launcher caches per specialization, completes the
argument list in signature order, honours autotuner keys, configs and pre-hooks, evicts the oldest
entry and steps aside for launch hooks; a bound launch keeps its grid and checks its tensors. On the GPU:
for pairs of cache lengths, the kernel the launcher reuses is the very kernel Triton's own dispatch picks,
and the outputs agree bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import triton
from microscope_kernels import direct_launch
from microscope_kernels.direct_launch import DirectLauncher, cdiv, next_power_of_2, specialization
from microscope_kernels.int8_kv_cache.kernel import _LAUNCH_INT8, _LAUNCH_MERGE, int8_decode_attention, quantize_kv
from triton import language as tl
from triton.runtime.jit import JITFunction
from triton.tools.tensor_descriptor import TensorDescriptor


def test_the_plain_python_grid_helpers_equal_tritons():
    for a in [*range(1, 300), 4095, 4096, 4097, 2**31 - 1, 2**31, 2**40 + 3]:
        assert next_power_of_2(a) == triton.next_power_of_2(a), a
        for b in (1, 3, 16, 64, 128):
            assert cdiv(a, b) == triton.cdiv(a, b), (a, b)
    assert cdiv(0, 16) == 0


def test_integers_specialize_on_one_divisibility_by_16_and_32_bit_range():
    assert specialization(1) != specialization(17)  # 1 is compiled in as a constant
    assert specialization(16) != specialization(17)  # divisibility by 16 is an alignment hint
    assert specialization(17) == specialization(33) == specialization(8191)
    assert specialization(32) == specialization(8192)
    assert specialization(2**31) != specialization(2**31 - 16)  # i64 past the 32-bit range
    assert specialization(17, exact=True) != specialization(33, exact=True)  # an autotuner key argument


def test_tensors_and_descriptors_specialize_on_dtype_alignment_and_block():
    words = torch.zeros(64, dtype=torch.int32)
    assert specialization(words) == specialization(torch.ones(8, dtype=torch.int32))
    assert specialization(words) != specialization(words.float())
    assert specialization(words) != specialization(words[1:])  # 4 bytes in: not 16-byte aligned
    block = lambda n: TensorDescriptor(words, [64], [1], [n])  # noqa: E731
    assert specialization(block(16)) == specialization(block(16))
    assert specialization(block(16)) != specialization(block(32))
    assert specialization(0.5) == specialization(3.0)  # fp32 scalars are not specialized
    assert specialization(True) != specialization(False)


class _Compiled:
    """Stands in for a CompiledKernel: records each direct launch's arguments."""

    function, packed_metadata = "function handle", "packed metadata"

    def __init__(self) -> None:
        self.launches: list[tuple] = []

    def run(self, *args) -> None:
        self.launches.append(args)


class _Driver:
    def get_current_device(self) -> int:
        return 0

    def get_current_stream(self, device: int) -> int:
        return 7


def _toy_kernel(X, n, scale, BLOCK: tl.constexpr, EVEN: tl.constexpr):  # never compiled: run() is replaced
    pass


@pytest.fixture
def toy(monkeypatch):
    """A real JITFunction whose normal path (``run``) is recorded instead of compiled, under a fake
    driver: the launcher's caching, argument order and fallbacks, testable without a GPU."""
    monkeypatch.setattr(triton.runtime.driver, "_active", _Driver())
    jit = JITFunction(_toy_kernel)
    normal_path: list[dict] = []

    def run(*args, grid, warmup, **kwargs):
        normal_path.append(dict(zip(jit.arg_names, args), **kwargs))
        return _Compiled()

    monkeypatch.setattr(jit, "run", run)
    return jit, normal_path


def test_the_first_call_per_specialization_takes_the_normal_path_and_later_ones_launch_directly(toy):
    jit, normal_path = toy
    launcher = DirectLauncher(jit, max_entries=2)
    x = torch.zeros(8)
    launcher((4, 2), x, 17, 0.5, BLOCK=32, EVEN=False)
    assert len(normal_path) == 1 and launcher.last[1] is False
    compiled = launcher.last[0]
    launcher((4, 2), torch.ones(8), 33, 2.0, BLOCK=32, EVEN=False)  # same specialization: 33 is 17's class
    assert len(normal_path) == 1 and launcher.last == (compiled, True)
    (launch,) = compiled.launches
    assert launch[:9] == (4, 2, 1, 7, "function handle", "packed metadata", None, None, None)
    assert launch[10:] == (33, 2.0, 32, False)  # positional arguments, then constexprs in signature order
    assert launch[9] is not x
    launcher((4, 2), x, 32, 0.5, BLOCK=32, EVEN=False)  # divisible by 16: Triton compiles it apart
    launcher((4, 2), x, 17, 0.5, BLOCK=64, EVEN=False)  # another constexpr; the LRU drops n=17's entry
    launcher((4, 2), x, 19, 0.5, BLOCK=32, EVEN=False)
    assert len(normal_path) == 4, "evicted entries must compile through the normal path again"


def test_an_autotuner_key_is_matched_exactly_and_its_config_completes_the_launch(toy):
    jit, normal_path = toy
    hooked: list[dict] = []
    config = triton.Config({"BLOCK": 64}, num_warps=4, pre_hook=hooked.append)
    launcher = DirectLauncher(triton.autotune(configs=[config], key=["n"])(jit))
    tensors = [torch.zeros(8) for _ in range(3)]
    for x, n in zip(tensors, (17, 33, 33)):
        launcher((1,), x, n, 1.0, EVEN=True)
    assert [call["n"] for call in normal_path] == [17, 33], "an autotuner tunes per exact key value"
    assert normal_path[0]["BLOCK"] == 64
    assert launcher.last[0].launches[0][10:] == (33, 1.0, 64, True)
    assert len(hooked) == 3, "the config's pre-hook runs on direct launches too"
    assert hooked[-1]["X"] is tensors[-1] and hooked[-1]["BLOCK"] == 64


def test_a_callable_grid_is_given_the_arguments_and_the_chosen_config(toy):
    """As in Triton, a grid callable sizes the launch from the autotuner's config (e.g. its tile width)."""
    jit, normal_path = toy
    launcher = DirectLauncher(triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4)], key=["n"])(jit))
    seen: list[dict] = []

    def grid(meta: dict) -> tuple[int, int]:
        seen.append(meta)
        return triton.cdiv(meta["n"], meta["BLOCK"]), 3

    for _ in range(2):  # the second call launches directly
        launcher(grid, torch.zeros(8), 200, 1.0, EVEN=True)
    assert len(normal_path) == 1 and launcher.last[1] is True
    assert launcher.last[0].launches[0][:3] == (4, 3, 1), "200 columns in tiles of 64: 4 programs"
    assert seen[-1]["BLOCK"] == 64 and seen[-1]["n"] == 200 and seen[-1]["EVEN"] is True


def test_a_bound_launch_fixes_the_grid_and_falls_back_where_a_tensor_or_the_switch_differs(toy, monkeypatch):
    """``bind`` (a hot path's shortcut for a shape it calls again) launches the compiled kernel on the grid worked
    out once; a tensor of another dtype or alignment, or direct launches turned off, take the launcher's path."""
    jit, normal_path = toy
    launcher = DirectLauncher(triton.autotune(configs=[triton.Config({"BLOCK": 64}, num_warps=4)], key=["n"])(jit))
    grids: list[dict] = []

    def grid(meta: dict) -> tuple[int]:
        grids.append(meta)
        return (triton.cdiv(meta["n"], meta["BLOCK"]),)

    assert launcher.bind(grid, torch.zeros(8), 200, 1.0, EVEN=True) is None, "nothing compiled yet"
    launcher(grid, torch.zeros(8), 200, 1.0, EVEN=True)
    bound = launcher.bind(grid, torch.zeros(8), 200, 1.0, EVEN=True)
    compiled = launcher.last[0]
    assert bound is not None and len(grids) == 1
    x = torch.ones(8)
    bound(x, 200, 0.5)
    assert len(grids) == 1 and len(normal_path) == 1, "the grid is not worked out again, no dispatch"
    launch = compiled.launches[-1]
    assert launch[:4] == (4, 1, 1, 7) and launch[9] is x and launch[10:] == (200, 0.5, 64, True)
    assert launcher.last == (compiled, True)
    direct = len(compiled.launches)
    bound(torch.ones(9)[1:], 200, 0.5)  # 4 bytes in: Triton would compile another kernel
    assert len(normal_path) == 2 and len(compiled.launches) == direct
    bound(torch.ones(8, dtype=torch.float64), 200, 0.5)
    assert len(normal_path) == 3
    monkeypatch.setattr(direct_launch, "ENABLED", False)
    bound(x, 200, 0.5)
    assert len(normal_path) == 4 and launcher.last[1] is False and len(compiled.launches) == direct


def test_a_config_with_a_pre_hook_is_not_bound(toy):
    jit, _ = toy
    config = triton.Config({"BLOCK": 64}, num_warps=4, pre_hook=lambda named: None)
    launcher = DirectLauncher(triton.autotune(configs=[config], key=["n"])(jit))
    launcher((1,), torch.zeros(8), 17, 1.0, EVEN=True)
    assert launcher.bind((1,), torch.zeros(8), 17, 1.0, EVEN=True) is None


def test_a_registered_launch_hook_keeps_every_call_on_the_normal_path(toy):
    jit, normal_path = toy
    launcher = DirectLauncher(jit)
    chain = triton.knobs.runtime.launch_enter_hook
    chain.add(print)
    try:
        for _ in range(3):
            launcher((1,), torch.zeros(8), 17, 1.0, BLOCK=32, EVEN=False)
    finally:
        chain.remove(print)
    assert len(normal_path) == 3 and launcher.last[1] is False
    launcher((1,), torch.zeros(8), 17, 1.0, BLOCK=32, EVEN=False)  # unhooked: compiled and kept
    bound = launcher.bind((1,), torch.zeros(8), 17, 1.0, BLOCK=32, EVEN=False)
    chain.add(print)
    try:
        bound(torch.zeros(8), 17, 1.0)
    finally:
        chain.remove(print)
    assert len(normal_path) == 5 and launcher.last[1] is False, "a bound launch steps aside for a hook too"


def _cache(tokens: int, granularity: str, seed: int):
    gen = torch.Generator().manual_seed(seed)
    q = torch.randn(2, 3, 64, generator=gen).to("cuda", torch.bfloat16)
    k, v = (torch.randn(2, 3, tokens, 64, generator=gen).to("cuda", torch.bfloat16) for _ in range(2))
    return (q, *quantize_kv(k, granularity), *quantize_kv(v, granularity))


#: Pairs of cache lengths that Triton compiles the same way (same split count, same integer
#: specialization) although they differ; the first of each compiles, the second must reuse it.
_SAME_KERNEL_PAIRS = ((17, 250), (32, 240), (257, 300), (272, 496), (1000, 1011), (4099, 4101))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("granularity", ["token", "channel"])
def test_direct_launches_reuse_the_kernel_triton_picks_and_match_it_bitwise(granularity, monkeypatch):
    """The second length of each pair launches directly the kernel compiled for the first; Triton's
    own dispatch, asked for the second length, picks that same kernel, and the outputs agree bitwise."""
    split, merge = _LAUNCH_INT8["fma", True], _LAUNCH_MERGE
    for seed, (first, second) in enumerate(_SAME_KERNEL_PAIRS):
        int8_decode_attention(*_cache(first, granularity, seed), granularity)
        cache = _cache(second, granularity, seed)
        direct = int8_decode_attention(*cache, granularity)
        (split_kernel, split_direct), (merge_kernel, merge_direct) = split.last, merge.last
        assert split_direct and merge_direct, f"T={second} did not reuse T={first}'s kernels"
        with monkeypatch.context() as patch:
            patch.setattr(direct_launch, "ENABLED", False)
            dispatched = int8_decode_attention(*cache, granularity)
        assert split.last == (split_kernel, False) and merge.last == (merge_kernel, False), f"T={second}"
        assert torch.equal(direct, dispatched), f"T={second}"


def test_a_launch_hook_counts_as_set_only_once_registered():
    """A profiler's launch hook must see every launch: a registered hook sends calls down Triton's
    own path, while the empty chain that triton >= 3.5 always holds does not."""
    chain = type(triton.knobs.runtime.launch_enter_hook)()
    assert not direct_launch._hooked(chain)
    chain.add(print)
    assert direct_launch._hooked(chain)
    assert direct_launch._hooked(print) and not direct_launch._hooked(None)  # triton < 3.5: callable or None
