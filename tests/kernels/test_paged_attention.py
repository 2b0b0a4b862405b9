"""Paged KV cache: the block allocator's invariants, the capacity count, the cache layouts, and the
block-table decode kernel against float64 attention over the contiguous cache.

The kernel is held to the contiguous result *exactly* on a shuffled physical block order (the same
arithmetic on permuted addresses), and to float64 within 4x eager attention's own error in each
dtype. Each test prints its random seed, shown on failure.
"""

from __future__ import annotations

import random
from pathlib import Path

import pytest
import torch
from microscope_kernels.paged_attention.ablation import PagedAttention, triton_paged, workload_lengths
from microscope_kernels.paged_attention.allocator import SENTINEL, BlockAllocator, PoolExhausted, blocks_for
from microscope_kernels.paged_attention.cache import (
    contiguous_from_packed,
    pack,
    paged_from_contiguous,
    paged_from_packed,
)
from microscope_kernels.paged_attention.capacity import CacheLayout, capacity, mixed_workload
from microscope_kernels.paged_attention.kernel import PAGE_SIZES, choose_split_len, paged_decode_attention
from microscope_kernels.paged_attention.reference import (
    eager_decode_attention,
    flex_decode_attention,
    sdpa_decode_attention,
)

from microscope import config as cfgmod
from microscope.api import Case, Role
from microscope.commands import load_checked

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
FLOAT_DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def rel_err(y: torch.Tensor, truth: torch.Tensor) -> float:
    return float((y.double() - truth).norm() / truth.norm().clamp_min(1e-300))


def odd_lengths(batch: int, tokens: int, seed: int) -> list[int]:
    """Fresh random lengths in [1, tokens] with a full and a single-token sequence among them."""
    rng = random.Random(seed)
    lengths = [rng.randint(1, tokens) for _ in range(batch)]
    lengths[0], lengths[-1] = tokens, 1
    return lengths


def paged_case(b, h, t, d, lengths, page, seed, dtype, shuffle=True, q_scale=1.0):
    """q, a contiguous cache, and its paged copy (shuffled physical order unless ``shuffle=False``)."""
    gen = torch.Generator().manual_seed(seed)
    q = (torch.randn(b, h, d, generator=gen) * q_scale).to(device=DEVICE, dtype=dtype)
    k = torch.randn(b, h, t, d, generator=gen).to(device=DEVICE, dtype=dtype)
    v = torch.randn(b, h, t, d, generator=gen).to(device=DEVICE, dtype=dtype)
    n = sum(blocks_for(x, page) for x in lengths)
    order = torch.randperm(n, generator=gen) if shuffle else None
    if order is not None and n > 1 and torch.equal(order, torch.arange(n)):
        order = order.roll(1)  # a draw that left every block in place (1 in n!: 1 in 120 for 5 blocks)
    k_pool, v_pool, table = paged_from_contiguous(k, v, lengths, page, order)
    seq_lens = torch.tensor(lengths, dtype=torch.int32, device=DEVICE)
    return q, k, v, k_pool, v_pool, table, seq_lens


def truth_and_limit(q, k, v, seq_lens, dtype):
    """float64 attention over the contiguous cache, and 4x eager's own error in ``dtype`` plus eps."""
    truth = eager_decode_attention(q.double(), k.double(), v.double(), seq_lens)
    return truth, 4 * rel_err(eager_decode_attention(q, k, v, seq_lens), truth) + torch.finfo(dtype).eps


# -- the allocator --------------------------------------------------------------------------------
def check_invariants(alloc: BlockAllocator) -> None:
    owned = [b for s in alloc.sequences for b in alloc.blocks(s)]
    assert len(owned) == len(set(owned)), "a block is held by two sequences (or twice by one)"
    assert len(owned) + alloc.free_blocks == alloc.num_blocks
    for s in alloc.sequences:
        assert len(alloc.blocks(s)) == blocks_for(alloc.length(s), alloc.block_size)


def test_allocator_never_hands_out_a_block_twice(seed):
    """Thousands of random appends (some exhausting the pool) and frees: no block is ever held by two
    sequences, held and free blocks always partition the pool, and each sequence holds exactly the
    blocks its length needs."""
    rng = random.Random(seed)
    alloc = BlockAllocator(num_blocks=37, block_size=rng.choice(PAGE_SIZES))
    next_id, refused = 0, 0
    for _ in range(3000):
        live = alloc.sequences
        if live and rng.random() < 0.3:
            seq = rng.choice(live)
            held, free_before = alloc.blocks(seq), alloc.free_blocks
            assert alloc.free(seq) == held and alloc.free_blocks == free_before + len(held)
        else:
            seq = rng.choice(live) if live and rng.random() < 0.6 else next_id
            next_id += seq == next_id
            try:
                alloc.append(seq, rng.randint(0, 3 * alloc.block_size))
            except PoolExhausted:
                refused += 1
        check_invariants(alloc)
    assert refused, "the workload never filled the pool: the exhaustion path went untested"


def test_free_returns_every_block_of_a_finished_sequence(seed):
    rng = random.Random(seed)
    alloc = BlockAllocator(64, 16, order=rng.sample(range(64), 64))
    for seq in range(5):
        alloc.append(seq, rng.randint(1, 150))
    held = {seq: alloc.blocks(seq) for seq in range(5)}
    before = alloc.free_blocks
    freed = alloc.free(2)
    assert sorted(freed) == sorted(held[2]) and alloc.free_blocks == before + len(held[2])
    assert 2 not in alloc.sequences
    with pytest.raises(KeyError, match="no sequence 2"):
        alloc.free(2)
    # the freed blocks are the next ones handed out, and no one else's
    new = alloc.append("next", 16 * len(held[2]))
    assert sorted(new) == sorted(held[2])
    assert all(alloc.blocks(s) == held[s] for s in (0, 1, 3, 4))


def test_exhaustion_is_a_clear_error_that_allocates_nothing():
    alloc = BlockAllocator(4, 16)
    alloc.append("a", 40)  # 3 blocks
    with pytest.raises(PoolExhausted, match=r"sequence 'b' needs 2 more block\(s\) of 16 tokens.*1 of 4 are free"):
        alloc.append("b", 17)
    assert alloc.free_blocks == 1 and alloc.sequences == ["a"]
    with pytest.raises(PoolExhausted, match="sequence 'a' needs 2 more"):
        alloc.append("a", 30)  # 70 tokens: 5 blocks
    assert alloc.length("a") == 40 and len(alloc.blocks("a")) == 3
    alloc.append("a", 8)  # fills the last block's free slots: no new block
    assert alloc.free_blocks == 1 and alloc.length("a") == 48


def test_block_table_is_int32_padded_with_the_sentinel():
    alloc = BlockAllocator(8, 16, order=[5, 2, 7, 0, 1, 3, 4, 6])
    alloc.append(0, 33)
    alloc.append(1, 1)
    table = alloc.block_table([0, 1], max_blocks=4)
    assert table.dtype == torch.int32
    assert table.tolist() == [[5, 2, 7, SENTINEL], [0, SENTINEL, SENTINEL, SENTINEL]]
    with pytest.raises(ValueError, match="more than max_blocks=2"):
        alloc.block_table([0, 1], max_blocks=2)
    with pytest.raises(ValueError, match="permutation"):
        BlockAllocator(3, 16, order=[0, 0, 1])


# -- capacity -----------------------------------------------------------------------------------
def test_capacity_on_a_hand_computed_case():
    """64 bytes per token (K+V, 2 heads x 4 dims fp32), blocks of 4 tokens (256 bytes), 2000 bytes.
    Contiguous reserves 10 tokens (640 bytes) each: 3 fit (1920 bytes) holding 10+2+3 tokens, half
    unused. Paged has 7 blocks: 3+1+1+1 for the first four; the fifth (5 tokens, 2 blocks) does not fit."""
    layout = CacheLayout(heads=2, head_dim=4, dtype=torch.float32, block_size=4)
    assert layout.token_bytes == 64 and layout.block_bytes == 256
    result = capacity(2000, layout, [10, 2, 3, 1, 5, 10], max_len=10)
    assert (result.contiguous.admitted, result.contiguous.reserved_bytes, result.contiguous.used_bytes) == (3, 1920,
                                                                                                            960)
    assert result.contiguous.fragmentation == pytest.approx(0.5)
    assert (result.paged.admitted, result.paged.reserved_bytes, result.paged.used_bytes) == (4, 1536, 1024)
    assert result.paged.fragmentation == pytest.approx(1 / 3)
    assert result.concurrency_ratio == pytest.approx(4 / 3)
    assert result.fragmentation_change == pytest.approx(-1 / 3)
    with pytest.raises(ValueError, match="exceeds max_len=8"):
        capacity(2000, layout, [10], max_len=8)


def test_mixed_workload_is_seeded_and_in_range(seed):
    for dist in ("uniform", "loguniform"):
        lengths = mixed_workload(500, 8192, seed, dist)
        assert lengths == mixed_workload(500, 8192, seed, dist)
        assert len(lengths) == 500 and min(lengths) >= 1 and max(lengths) <= 8192
    assert sum(mixed_workload(500, 8192, seed, "loguniform")) < sum(mixed_workload(500, 8192, seed, "uniform"))
    with pytest.raises(ValueError, match="dist must be one of"):
        mixed_workload(5, 10, seed, "normal")


# -- cache layouts ----------------------------------------------------------------------------------
@pytest.mark.parametrize("page", [16, 128])
def test_paged_layouts_hold_the_contiguous_tokens(page, seed):
    """Gathering the pool through the table gives back each sequence's tokens; the slots past a
    length are NaN (a kernel that read them would return NaN). From packed tokens, both layouts agree."""
    lengths = odd_lengths(4, 150, seed)
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(4, 3, 150, 16, lengths, page, seed, torch.float32)
    for b, n in enumerate(lengths):
        pages = table[b, :blocks_for(n, page)].long()
        assert (table[b, blocks_for(n, page):] == SENTINEL).all()
        for pool, x in ((k_pool, k), (v_pool, v)):
            gathered = pool[pages].transpose(0, 1).reshape(3, -1, 16)
            assert torch.equal(gathered[:, :n], x[b, :, :n])
            assert gathered[:, n:].isnan().all()
    kc, vc = contiguous_from_packed(pack(k, seq_lens), pack(v, seq_lens), seq_lens, 150)
    kp, vp, tp = paged_from_packed(pack(k, seq_lens), pack(v, seq_lens), seq_lens, page, 150)
    mask = torch.arange(150)[None, :] < torch.tensor(lengths)[:, None]
    assert torch.equal(kc[mask[:, None, :, None].expand_as(kc)], k[mask[:, None, :, None].expand_as(k)])
    assert torch.equal(paged_decode_attention(q, kp, vp, tp, seq_lens),
                       paged_decode_attention(q, k_pool, v_pool, table, seq_lens))
    assert torch.equal(eager_decode_attention(q, kc, vc, seq_lens), eager_decode_attention(q, k, v, seq_lens))


# -- the decode kernel ------------------------------------------------------------------------------
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_shuffled_block_order_gives_the_contiguous_result_exactly(page, seed):
    """The same cache in ascending and in shuffled physical blocks: bit-identical outputs."""
    lengths = odd_lengths(3, 200, seed)
    ordered = paged_case(3, 2, 200, 32, lengths, page, seed, torch.bfloat16, shuffle=False)
    shuffled = paged_case(3, 2, 200, 32, lengths, page, seed, torch.bfloat16, shuffle=True)
    assert not torch.equal(ordered[5], shuffled[5]), "the shuffle left the block table as it was"
    out_ordered = paged_decode_attention(*ordered[:1], *ordered[3:])
    out_shuffled = paged_decode_attention(*shuffled[:1], *shuffled[3:])
    assert torch.equal(out_ordered, out_shuffled), f"seed {seed}"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
@pytest.mark.parametrize("page", PAGE_SIZES)
def test_kernel_matches_float64_on_odd_mixed_lengths(page, dtype, seed):
    lengths = odd_lengths(4, 141, seed)
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(4, 2, 141, 32, lengths, page, seed, dtype)
    out = paged_decode_attention(q, k_pool, v_pool, table, seq_lens)
    assert out.shape == q.shape and out.dtype == dtype and torch.isfinite(out).all()
    truth, limit = truth_and_limit(q, k, v, seq_lens, dtype)
    assert rel_err(out, truth) <= limit, f"{rel_err(out, truth):.3g} > {limit:.3g} (seed {seed})"


@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_single_token_sequences_return_their_value(dtype, seed):
    """One token: its weight is exactly 1, so the output is that token's V in every dtype."""
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(5, 3, 1, 64, [1] * 5, 16, seed, dtype)
    assert torch.equal(paged_decode_attention(q, k_pool, v_pool, table, seq_lens), v[:, :, 0])


@pytest.mark.parametrize("forced", [dict(split_len=16), dict(split_len=40), dict(split_len=500),
                                    dict(block_t=32), dict(block_t=128, split_len=64), dict(stages=2)], ids=str)
def test_split_and_tile_boundaries(forced, seed):
    """Splits that end mid-tile or mid-block, one split, tiles spanning several blocks or part of one:
    all the same attention."""
    lengths = odd_lengths(3, 97, seed)
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(3, 2, 97, 32, lengths, 32, seed, torch.float32)
    out = paged_decode_attention(q, k_pool, v_pool, table, seq_lens, **forced)
    truth = eager_decode_attention(q.double(), k.double(), v.double(), seq_lens)
    assert rel_err(out, truth) < 1e-5, f"seed {seed}"


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the interpreter's numpy, overflowing in discarded lanes
def test_large_scores_stay_finite(seed):
    """Scores in the hundreds: the online softmax's running max keeps every exponent <= 0."""
    lengths = odd_lengths(2, 90, seed)
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(2, 2, 90, 32, lengths, 16, seed, torch.float16,
                                                          q_scale=60.0)
    out = paged_decode_attention(q, k_pool, v_pool, table, seq_lens)
    truth = eager_decode_attention(q.double(), k.double(), v.double(), seq_lens)
    assert torch.isfinite(out).all() and rel_err(out, truth) < 4e-3, f"seed {seed}"


def test_rejects_bad_arguments():
    q, k, v, k_pool, v_pool, table, seq_lens = paged_case(2, 2, 20, 16, [20, 3], 16, 0, torch.float32)
    call = dict(q=q, k_pool=k_pool, v_pool=v_pool, block_table=table, seq_lens=seq_lens)
    cases = [
        (dict(seq_lens=seq_lens.long()), TypeError, "must be int32"),
        (dict(k_pool=k_pool.half()), TypeError, "share a dtype"),
        (dict(q=q[:, :1]), ValueError, "expected q"),
        (dict(k_pool=k_pool[:, :, :8], v_pool=v_pool[:, :, :8]), ValueError, "block size .* got 8"),
        (dict(block_t=48), ValueError, "block_t must be one of"),
    ]
    if DEVICE == "cpu":  # values are checked where that costs no device sync
        cases += [
            (dict(seq_lens=torch.tensor([20, 0], dtype=torch.int32)), ValueError, r"seq_lens must be in \[1, 32\]"),
            (dict(seq_lens=torch.tensor([20, 33], dtype=torch.int32)), ValueError, r"seq_lens must be in \[1, 32\]"),
            (dict(block_table=torch.full_like(table, 7)), ValueError, "outside the pool of 3"),
        ]
    for change, error, message in cases:
        with pytest.raises(error, match=message):
            paged_decode_attention(**{**call, **change})


def test_split_plan_fills_an_h200_at_the_target_shape():
    """B16 H32 T8192 (512 heads): 8 splits of 1024 tokens, ~8 waves of 4 programs on 132 SMs."""
    assert choose_split_len(8192, 512, 132) == 1024
    assert all(choose_split_len(t, bh, 132) % 256 == 0 for t in (1, 300, 8192, 32768) for bh in (1, 512))


# -- the peers ----------------------------------------------------------------------------------------
@pytest.mark.filterwarnings("ignore:flex_attention called without torch.compile")
@pytest.mark.parametrize("dtype", FLOAT_DTYPES, ids=str)
def test_peers_mask_past_each_length(dtype, seed):
    """SDPA with the key mask and flex_attention (eager path here) give the reference's attention; with
    every sequence full, both run unmasked."""
    lengths = odd_lengths(3, 45, seed)
    q, k, v, *_, seq_lens = paged_case(3, 2, 45, 32, lengths, 16, seed, dtype)
    truth, limit = truth_and_limit(q, k, v, seq_lens, dtype)
    assert rel_err(sdpa_decode_attention(q, k, v, seq_lens), truth) <= limit
    if dtype == torch.float32:  # flex's eager path is the unfused reference loop: one dtype is enough
        assert rel_err(flex_decode_attention(q, k, v, seq_lens, compiled=False), truth) <= limit
    full = torch.full_like(seq_lens, 45)
    truth_full, limit_full = truth_and_limit(q, k, v, full, dtype)
    assert rel_err(sdpa_decode_attention(q, k, v, None), truth_full) <= limit_full


# -- the plugin -----------------------------------------------------------------------------------
def test_plugin_inputs_are_seeded_shuffled_and_of_fixed_shapes():
    """Same seed, same inputs; another seed, other values and block order in the same shapes (the
    harness rotates input sets through fixed buffers)."""
    plugin = PagedAttention()
    for case in plugin.cases:
        a = plugin.inputs(case, torch.Generator().manual_seed(21), "cpu")
        b = plugin.inputs(case, torch.Generator().manual_seed(21), "cpu")
        c = plugin.inputs(case, torch.Generator().manual_seed(22), "cpu")
        assert a.keys() == c.keys() and a["mode"] == case["mode"] and a["q"].dtype == case.dtype
        for name, x in a.items():
            if isinstance(x, torch.Tensor):
                torch.testing.assert_close(x, b[name], rtol=0, atol=0, equal_nan=True)  # pools: NaN past lengths
                assert x.shape == c[name].shape and x.dtype == c[name].dtype, name
        assert not torch.equal(a["q"], c["q"])
        if case["mode"] == "decode":
            assert not torch.equal(a["block_table"], c["block_table"])
            assert a["seq_lens"].tolist() == workload_lengths(case["batch"], case["tokens"], case["lengths"])


def test_plugin_rejects_bad_case_values_with_clear_messages():
    plugin = PagedAttention()
    base = plugin.cases[0].params
    for change, message in ((dict(block=48), "block must be one of 16, 32, 64, 128"),
                            (dict(lengths="ragged"), "lengths must be one of equal, mixed"),
                            (dict(mode="prefill"), "mode must be one of decode, serve"),
                            (dict(head_dim=48), "head_dim must be a power of two")):
        with pytest.raises(ValueError, match=message):
            plugin.inputs(Case.of(**{**base, **change}), torch.Generator().manual_seed(0), "cpu")


def test_plugin_declares_variants_and_counts():
    plugin = PagedAttention()
    assert {n: v.role for n, v in plugin.variants.items()} == {
        "eager": Role.BASELINE, "triton_paged": Role.CANDIDATE, "sdpa": Role.PEER, "flex": Role.PEER}
    flex_supports = plugin.variants["flex"].supports
    decode = next(c for c in plugin.cases if c["mode"] == "decode")
    serve = next(c for c in plugin.cases if c["mode"] == "serve")
    assert "CUDA" in flex_supports(decode, "cpu") and flex_supports(decode, "cuda") is None
    assert "serve" in flex_supports(serve, "cuda")
    equal = Case.of(**{**decode.params, "lengths": "equal", "dtype": "bf16"})
    b, h, t, d = (equal[n] for n in ("batch", "heads", "tokens", "head_dim"))
    assert plugin.bytes(equal) == 2 * b * h * t * d * 2 + 2 * b * h * d * 2
    assert plugin.flops(equal) == 4 * b * h * t * d
    assert plugin.bytes(serve) is None and plugin.flops(serve) is None


def test_plugin_variants_meet_the_tolerance_on_default_cases():
    """Every variant that runs here on every default case, judged as the harness judges: float64
    truth, noise-calibrated against the eager baseline, and the element rule."""
    plugin = PagedAttention()
    for case in plugin.cases:
        inputs = plugin.inputs(case, torch.Generator().manual_seed(9), DEVICE)
        tol = plugin.tolerance_for(case)
        x64 = {k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
               for k, v in inputs.items()}
        truth = plugin.reference(x64)
        limit = tol.ref_factor * max(rel_err(plugin.variants["eager"].fn(**inputs), truth),
                                     torch.finfo(case.dtype).eps / 2)
        for name, variant in plugin.variants.items():
            if variant.supports is not None and variant.supports(case, DEVICE):
                continue
            got = variant.fn(**inputs)
            assert got.shape == inputs["q"].shape and got.dtype == case.dtype
            assert rel_err(got, truth) <= limit, (case.id, name)
            outside = ((got.double() - truth).abs() > tol.atol + tol.rtol * truth.abs()).double().mean()
            assert outside <= tol.max_mismatch, (case.id, name)


def test_the_swept_parameters_force_what_the_kernel_would_choose():
    plugin = PagedAttention()
    assert set(plugin.variants["triton_paged"].params) == {"split_len", "block_t", "stages"}
    case = next(c for c in plugin.cases if c["mode"] == "decode" and c["dtype"] == "fp32")
    inputs = plugin.inputs(case, torch.Generator().manual_seed(5), DEVICE)
    truth = plugin.reference({k: (v.double() if isinstance(v, torch.Tensor) and v.is_floating_point() else v)
                              for k, v in inputs.items()})
    for options in ({"split_len": 16}, {"block_t": 32, "stages": 2}):
        assert rel_err(triton_paged(**inputs, **options), truth) < 1e-5, options


def _admissions(lengths: list[int], slots: int, max_len: int, block: int) -> tuple[tuple[int, float], ...]:
    """(admitted, fragmentation) of the contiguous and the paged layout, counted in token slots by hand:
    contiguous reserves ``max_len`` slots per sequence, paged whole blocks, both in arrival order."""
    fit = min(len(lengths), slots // max_len)
    contiguous = (fit, 1 - sum(lengths[:fit]) / (fit * max_len))
    free, used = slots // block, []
    for n in lengths:
        if -(-n // block) > free:
            break
        free -= -(-n // block)
        used.append(n)
    held = sum(-(-n // block) for n in used) * block
    return contiguous, (len(used), 1 - sum(used) / held)


def test_capacity_figures_count_the_case_budget_by_hand():
    """The budget is the case's contiguous cache (batch x tokens slots); the request stream is one longer
    than the budget has blocks; the paged figures go to triton_paged, the contiguous ones to the others."""
    plugin = PagedAttention()
    for block, batch, tokens in ((16, 3, 75), (128, 3, 75), (64, 16, 8192)):
        case = Case.of(batch=batch, heads=2, tokens=tokens, head_dim=32, block=block, lengths="equal", mode="serve",
                       dtype="fp16")
        figs = plugin.figures(case, {}, "cpu")
        assert set(figs) == set(plugin.variants) and figs["sdpa"] == figs["eager"] == figs["flex"]
        for dist in ("loguniform", "uniform"):
            requests = max(batch, batch * tokens // block) + 1
            contiguous, paged = _admissions(mixed_workload(requests, tokens, 0, dist), batch * tokens, tokens, block)
            for name, (admitted, fragmentation) in (("eager", contiguous), ("triton_paged", paged)):
                assert figs[name][f"admitted.{dist}"].value == admitted, (block, dist, name)
                assert figs[name][f"fragmentation.{dist}"].value == pytest.approx(fragmentation), (block, dist, name)
            assert contiguous[0] == batch
    big = plugin.figures(Case.of(batch=16, heads=32, tokens=8192, head_dim=128, block=16, lengths="mixed",
                                 mode="decode", dtype="bf16"), {}, "cpu")
    assert big["triton_paged"]["admitted.loguniform"].value > 5 * big["eager"]["admitted.loguniform"].value


def test_a_run_of_the_config_records_the_capacity_figures(run_room):
    """``microscope run ablations/paged_attention.yaml --quick`` on one case: one figures record per metric for
    every variant that ran (flex cannot run on the CPU), and the console's figures line."""
    run = run_room("paged_attention", {"cases": {"block": [16], "mode": ["decode"], "dtype": ["fp32"]},
                                       "dimensions.throughput.enabled": False})
    figs = run.find(dimension="figures")
    assert figs and all(r.status == "ok" for r in figs)
    assert {r.variant for r in figs} == {"eager", "triton_paged", "sdpa"}
    case = next(iter({r.case_id: r for r in figs}.values())).case
    contiguous, paged = _admissions(mixed_workload(3 * 75 // 16 + 1, 75, 0, "loguniform"), 3 * 75, 75, 16)
    got = {(r.variant, r.metric): r.value for r in figs}
    assert case["tokens"] == 75 and got["triton_paged", "admitted.loguniform"] == paged[0]
    assert got["sdpa", "admitted.loguniform"] == got["eager", "admitted.loguniform"] == contiguous[0] == 3
    assert got["triton_paged", "fragmentation.loguniform"] == pytest.approx(paged[1])
    assert any(h.startswith(f"triton_paged: admitted.loguniform {paged[0]} vs eager 3") for h in run.headlines)


@pytest.mark.parametrize("profile", [None, "bench", "bench,configs", "bench,splits"])
def test_the_config_loads_on_every_device_and_profile(profile):
    overrides = {cfgmod.PROFILE_KEY: profile} if profile else None
    path = Path(__file__).resolve().parents[2] / "ablations" / "paged_attention.yaml"
    for device in ("cpu", "cuda"):
        for quick in (False, True):
            config, plugin = load_checked(path, device, quick, overrides)
            assert plugin.name == "paged_attention"
    assert config.cases  # the last one loaded: cuda with the profile's (or the device's) cases


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_precompile_builds_what_the_autotuner_then_loads_from_the_disk_cache(tmp_path, monkeypatch):
    """The precompile step's binaries are the ones a call uses: after two other processes compiled the
    candidates into an empty cache (as a run's precompile step does), the first call here (autotuning
    every candidate) compiles nothing, it only loads from Triton's cache."""
    import subprocess
    import sys

    from triton_builds import triton_builds

    monkeypatch.setenv("TRITON_CACHE_DIR", str(tmp_path))  # empty: only what precompile writes is there
    b, h, t, d, page = 3, 4, 1000, 64, 32
    for shard in range(2):
        code = ("import torch; from microscope_kernels.paged_attention import kernel; "
                f"print(kernel.precompile({b}, {h}, {d}, {page}, {t}, torch.float16, 'cuda', ({shard}, 2)))")
        done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0 and done.stdout.split()[-1:] == ["[]"], done.stderr[-2000:]
    with triton_builds() as seen:
        lens = [t, 1, 517]
        k, v = (torch.randn(b, h, t, d, device="cuda", dtype=torch.float16) for _ in range(2))
        k_pool, v_pool, table = paged_from_contiguous(k, v, lens, page)
        q = torch.randn(b, h, d, device="cuda", dtype=torch.float16)
        paged_decode_attention(q, k_pool, v_pool, table, torch.tensor(lens, device="cuda", dtype=torch.int32))
        torch.cuda.synchronize()
    builds = [hit for _, hit in seen]
    assert len(builds) == 8, builds  # 7 split-kernel candidates and the merge kernel, each built once here
    assert all(builds), f"{builds.count(False)} of {len(builds)} kernel builds compiled in the call"
