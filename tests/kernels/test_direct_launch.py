"""The direct launcher reuses a compiled kernel only where Triton itself would.

On CPU: the specialization key separates what Triton compiles separately. On the GPU: for caches of
many lengths and layouts, the kernel the launcher reuses is the very kernel Triton's own dispatch
picks, and its outputs equal the normal path's bit for bit.
"""

from __future__ import annotations

import pytest
import torch
import triton
from microscope_kernels.int8_kv_cache import direct_launch
from microscope_kernels.int8_kv_cache.direct_launch import specialization
from microscope_kernels.int8_kv_cache.kernel import _LAUNCH_INT8, _LAUNCH_MERGE, int8_decode_attention, quantize_kv
from triton.tools.tensor_descriptor import TensorDescriptor


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
