"""Plugin: decode attention over a paged KV cache (Triton, through a block table) vs a contiguous cache.

Two modes (case parameter ``mode``):

* ``decode``: one decode step over caches built in ``inputs()``; the paged pool's blocks are in a
  seeded shuffled order, so the kernel cannot lean on contiguity. Speed: the paged kernel vs eager
  and SDPA (and flex_attention on CUDA) over the contiguous cache.
* ``serve``: each variant receives the sequences' tokens packed (N, H, D) and builds its own cache
  before the decode step: contiguous reserves ``tokens`` slots per sequence, paged takes blocks from
  the allocator for the tokens each sequence holds. The harness's memory dimension (bytes allocated
  by the call) then measures each layout's footprint for the same workload.

How many sequences fit in a memory budget, and the fragmentation (the concurrency claim), are the plugin's
``figures()``, counted by ``capacity.py``.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

import torch
from microscope_kernels.paged_attention.allocator import blocks_for
from microscope_kernels.paged_attention.cache import contiguous_from_packed, paged_from_contiguous, paged_from_packed
from microscope_kernels.paged_attention.capacity import CacheLayout, capacity, mixed_workload
from microscope_kernels.paged_attention.kernel import PAGE_SIZES, paged_decode_attention
from microscope_kernels.paged_attention.kernel import precompile as compile_candidates
from microscope_kernels.paged_attention.reference import (
    eager_decode_attention,
    flex_decode_attention,
    sdpa_decode_attention,
)
from microscope_kernels.paged_attention.serving import chat_and_documents, serve

from microscope.api import Ablation, Case, Figure, Tolerance, baseline, candidate, grid, peer, randn, register

MODES = ("decode", "serve")
LENGTHS = ("equal", "mixed")
#: The mixed workload's lengths are a function of the case (this seed), not of the run's seed: the
#: harness rotates several seeded input sets through fixed buffers, and ``bytes()`` sees only the case.
WORKLOAD_SEED = 0
#: What a config may sweep on ``triton_paged`` (0: the kernel's own choice, autotuned on a GPU).
PAGED_PARAMS = {"split_len": 0, "block_t": 0, "stages": 0}
#: Length distributions of the capacity figures' request streams (``capacity.mixed_workload``): mostly short
#: (chat traffic), and uniform.
CAPACITY_WORKLOADS = ("loguniform", "uniform")
#: Serve-mode cases' serving figures (``serving.serve``): offered loads, in multiples of what the case's
#: contiguous cache serves; the client's deadline in steps as a share of ``tokens`` (twice a long request's
#: output); the stream's length in deadlines (long enough for the queue to settle).
SERVING_LOADS = (1.0, 2.0, 4.0, 8.0)
SERVING_DEADLINE = 1 / 16
SERVING_DEADLINES = 12


def workload_lengths(batch: int, tokens: int, lengths: str) -> list[int]:
    """Each sequence's length: ``equal``: all ``tokens``; ``mixed``: the first ``tokens``, the last a
    single token (batch >= 2), the rest uniform on [1, tokens] (seeded by ``WORKLOAD_SEED``)."""
    if lengths not in LENGTHS:
        raise ValueError(f"lengths must be one of {', '.join(LENGTHS)}, got {lengths!r}")
    if batch < 1 or tokens < 1:
        raise ValueError(f"batch and tokens must be >= 1, got {batch} and {tokens}")
    if lengths == "equal":
        return [tokens] * batch
    gen = torch.Generator().manual_seed(WORKLOAD_SEED)
    drawn = torch.randint(1, tokens + 1, (batch,), generator=gen).tolist()
    drawn[0] = tokens
    if batch >= 2:
        drawn[-1] = 1
    return drawn


def _contiguous(mode: str, k: torch.Tensor | None, v: torch.Tensor | None, k_new: torch.Tensor | None,
                v_new: torch.Tensor | None, seq_lens: torch.Tensor, tokens: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The contiguous cache: given (decode), or built from the packed tokens inside the call (serve)."""
    if mode == "serve":
        return contiguous_from_packed(k_new, v_new, seq_lens, tokens)
    return k, v


def eager(q: torch.Tensor, seq_lens: torch.Tensor, mode: str, tokens: int, k: torch.Tensor | None = None,
          v: torch.Tensor | None = None, k_new: torch.Tensor | None = None, v_new: torch.Tensor | None = None,
          **_: object) -> torch.Tensor:
    """Eager attention over the contiguous cache, masked past each length (the "before")."""
    k, v = _contiguous(mode, k, v, k_new, v_new, seq_lens, tokens)
    return eager_decode_attention(q, k, v, seq_lens)


def triton_paged(q: torch.Tensor, seq_lens: torch.Tensor, mode: str, tokens: int, block: int,
                 k_pool: torch.Tensor | None = None, v_pool: torch.Tensor | None = None,
                 block_table: torch.Tensor | None = None, k_new: torch.Tensor | None = None,
                 v_new: torch.Tensor | None = None, split_len: int = 0, block_t: int = 0, stages: int = 0,
                 **_: object) -> torch.Tensor:
    """Split-K Triton decode reading K/V blocks through the block table (serve: blocks from the allocator).

    ``split_len``, ``block_t`` and ``stages`` force what the kernel otherwise chooses (a sweep over
    them is the kernel's launch study)."""
    if mode == "serve":
        k_pool, v_pool, block_table = paged_from_packed(k_new, v_new, seq_lens, block, tokens)
    return paged_decode_attention(q, k_pool, v_pool, block_table, seq_lens, split_len=split_len or None,
                                  block_t=block_t or None, stages=stages or None)


def sdpa(q: torch.Tensor, seq_lens: torch.Tensor, mode: str, tokens: int, full: bool,
         k: torch.Tensor | None = None, v: torch.Tensor | None = None, k_new: torch.Tensor | None = None,
         v_new: torch.Tensor | None = None, **_: object) -> torch.Tensor:
    """torch SDPA over the contiguous cache: a key mask for mixed lengths, none when all are full."""
    k, v = _contiguous(mode, k, v, k_new, v_new, seq_lens, tokens)
    return sdpa_decode_attention(q, k, v, None if full else seq_lens)


def flex(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, seq_lens: torch.Tensor, full: bool,
         **_: object) -> torch.Tensor:
    """Compiled flex_attention over the contiguous cache, lengths as a score_mod."""
    return flex_decode_attention(q, k, v, None if full else seq_lens)


def flex_supports(case: Case, device: str) -> str | None:
    """flex_attention is a peer where it is a compiled kernel: CUDA, decode mode."""
    if device != "cuda":
        return ("flex_attention is compiled for CUDA; on the CPU it runs an unfused eager loop (or an inductor "
                "C++ build of minutes), which is no peer")
    if case.get("mode") == "serve":
        return "serve mode compares cache layouts; flex_attention reads the contiguous one, as sdpa does"
    return None


def _check_case(case: Case) -> list[int]:
    """The case's lengths, after the checks that give a bad config value a clear message."""
    if case["mode"] not in MODES:
        raise ValueError(f"mode must be one of {', '.join(MODES)}, got {case['mode']!r}")
    if case["block"] not in PAGE_SIZES:
        raise ValueError(f"block must be one of {', '.join(map(str, PAGE_SIZES))} (tokens per block), "
                         f"got {case['block']!r}")
    d = case["head_dim"]
    if not isinstance(d, int) or d < 16 or d & (d - 1):
        raise ValueError(f"head_dim must be a power of two >= 16, got {d!r}")
    if case["heads"] < 1:
        raise ValueError(f"heads must be >= 1, got {case['heads']!r}")
    return workload_lengths(case["batch"], case["tokens"], case["lengths"])


def _serving_figures(case: Case, paged: dict[str, Figure], contiguous: dict[str, Figure]) -> None:
    """Share of requests served within the deadline (all, and the long-text ones) under ``serving.serve``'s
    policy, for a seeded chat-and-documents stream at each of ``SERVING_LOADS`` times the rate the case's
    contiguous cache (``batch`` slots of ``tokens``) serves; paged in blocks of the case's ``block``."""
    slots, max_len = case["batch"], case["tokens"]
    deadline = max(1, int(SERVING_DEADLINE * max_len))
    for load in SERVING_LOADS:
        stream = chat_and_documents(SERVING_DEADLINES * deadline, max_len, WORKLOAD_SEED, load=load, slots=slots)
        note = (f"load {load:g}x the contiguous cache's rate, deadline {deadline} steps, "
                f"{sum(r.long for r in stream)} of {len(stream)} requests long")
        for figs, block in ((paged, case["block"]), (contiguous, None)):
            got = serve(stream, slots * max_len, max_len, deadline, block)
            figs[f"served.load{load:g}"] = Figure(got.success, "ratio", True, note)
            figs[f"served_long.load{load:g}"] = Figure(got.long_success, "ratio", True, note)


@register("paged_attention")
class PagedAttention(Ablation):
    """One decode step (one query token per sequence and head) over a paged vs a contiguous KV cache.

    Inputs hold both layouts of the same numbers; each variant takes the tensors it needs
    (``**kwargs`` swallows the rest). The truth is float64 eager attention over the contiguous cache.
    """

    variants = {
        "eager": baseline(eager, differentiable=False),
        "triton_paged": candidate(triton_paged, needs=("triton",), differentiable=False, params=PAGED_PARAMS),
        "sdpa": peer(sdpa, differentiable=False),
        "flex": peer(flex, differentiable=False, supports=flex_supports),
    }
    # 75 tokens: not a multiple of any block size; mixed lengths hold a 75- and a 1-token sequence
    cases = grid(batch=[3], heads=[2], tokens=[75], head_dim=[32], block=[16, 32], lengths=["mixed"],
                 mode=["decode", "serve"], dtype=["fp32", "fp16", "bf16"])
    # no lossy step: the element rule is each dtype's output rounding with room for the summation
    # order (outputs are averages of V, ~0.1-1); the norm rule holds it to 4x eager's own error
    tolerance = {
        "fp32": Tolerance(rtol=1e-4, atol=1e-6),
        "fp16": Tolerance(rtol=1e-2, atol=1e-3),
        "bf16": Tolerance(rtol=4e-2, atol=1e-2),
    }

    def inputs(self, case: Case, gen: torch.Generator, device: str) -> dict[str, object]:
        lengths = _check_case(case)
        b, h, t, d = case["batch"], case["heads"], case["tokens"], case["head_dim"]
        dtype, block, mode = case.dtype, case["block"], case["mode"]
        seq_lens = torch.tensor(lengths, dtype=torch.int32, device=device)
        common = {"q": randn((b, h, d), dtype, gen, device), "seq_lens": seq_lens, "mode": mode, "tokens": t,
                  "block": block, "full": all(n == t for n in lengths)}
        if mode == "serve":
            n = sum(lengths)  # the sequences' tokens, packed
            return {**common, "k_new": randn((n, h, d), dtype, gen, device),
                    "v_new": randn((n, h, d), dtype, gen, device)}
        k = randn((b, h, t, d), dtype, gen, device)
        v = randn((b, h, t, d), dtype, gen, device)
        order = torch.randperm(sum(blocks_for(n, block) for n in lengths), generator=gen)
        k_pool, v_pool, block_table = paged_from_contiguous(k, v, lengths, block, order)
        return {**common, "k": k, "v": v, "k_pool": k_pool, "v_pool": v_pool, "block_table": block_table}

    def precompile(self, case: Case, device: str, shard: tuple[int, int], backward: bool) -> None:
        """This shard of the split kernel's autotuning candidates for the case's block size, head dim and
        split plan (decode only: serve mode times cache layouts, not this kernel)."""
        if device != "cuda" or case["mode"] != "decode":
            return
        _check_case(case)
        failed = compile_candidates(case["batch"], case["heads"], case["head_dim"], case["block"], case["tokens"],
                                    case.dtype, device, shard)
        if failed:
            raise RuntimeError(f"{len(failed)} candidate(s) did not compile, first {failed[0][0]}: {failed[0][1]}")

    def figures(self, case: Case, inputs: Mapping[str, Any], device: str) -> dict[str, dict[str, Figure]]:
        """Sequences admitted and fragmentation (``capacity.capacity``), paged for ``triton_paged`` and
        contiguous for the others, in the budget of this case's contiguous cache (``batch`` x ``tokens``
        slots, so the contiguous layout admits ``batch``) from seeded request streams of lengths on [1,
        ``tokens``], one request more than the budget has blocks (``WORKLOAD_SEED``; one per distribution).
        Serve-mode cases add the serving simulation's success rates (``_serving_figures``)."""
        _check_case(case)
        layout = CacheLayout(case["heads"], case["head_dim"], case.dtype, case["block"])
        budget = case["batch"] * case["tokens"] * layout.token_bytes
        requests = max(case["batch"], budget // layout.block_bytes) + 1
        paged: dict[str, Figure] = {}
        contiguous: dict[str, Figure] = {}
        for dist in CAPACITY_WORKLOADS:
            got = capacity(budget, layout, mixed_workload(requests, case["tokens"], WORKLOAD_SEED, dist),
                           max_len=case["tokens"])
            note = f"{dist} lengths, a budget of {case['batch']} x {case['tokens']} slots"
            for figs, admission in ((paged, got.paged), (contiguous, got.contiguous)):
                figs[f"admitted.{dist}"] = Figure(admission.admitted, "sequences", True, note)
                figs[f"fragmentation.{dist}"] = Figure(admission.fragmentation, "ratio", False,
                                                       "reserved but unused bytes / reserved bytes")
        if case["mode"] == "serve":
            _serving_figures(case, paged, contiguous)
        return {name: paged if name == "triton_paged" else contiguous for name in self.variants}

    def flops(self, case: Case, backward: bool = False) -> float | None:
        """q.k^T and p.v over the tokens held: 2 multiply-adds per cached element of K and of V."""
        if case["mode"] != "decode":
            return None
        return 4.0 * case["heads"] * case["head_dim"] * sum(_check_case(case))

    def bytes(self, case: Case, backward: bool = False) -> float | None:
        """The least a decode step must move: the K and V tokens the sequences hold, q and the output.
        Serve calls also build a cache, so no bandwidth figure is given for them."""
        if case["mode"] != "decode":
            return None
        h, d, size = case["heads"], case["head_dim"], case.dtype.itemsize
        return float(2 * h * d * size * sum(_check_case(case)) + 2 * case["batch"] * h * d * size)
