"""sliding_window_attention: the mask's tile map against the dense mask, the Triton kernel (forward and
gradients) against float64 eager attention with the same mask, the peers, the plugin and the model arms.

Kernels run through the Triton interpreter on CPU (compiled on a GPU host). Errors are judged against the
error eager attention itself makes in the same dtype (``rel_err(kernel) <= 4 * rel_err(eager) + floor``).
Every test draws from the printed ``seed`` fixture; rerun one with ``MICROSCOPE_TEST_SEED=<seed>``.
"""

from __future__ import annotations

import functools
import random
import warnings
from pathlib import Path

import pytest
import torch
from attention_checks import DEVICE, DTYPES, assert_eager_arm_matches, error_limit
from attention_checks import fwd_bwd as _fwd_bwd
from attention_checks import rel_err as _rel
from microscope_kernels.sliding_window_attention import kernel
from microscope_kernels.sliding_window_attention.ablation import SlidingWindowAttention
from microscope_kernels.sliding_window_attention.kernel import sliding_window_attention
from microscope_kernels.sliding_window_attention.mask import (
    EMPTY,
    FULL,
    PARTIAL,
    MaskSpec,
    block_pairs,
    count_visible,
    dense_mask,
    n_blocks,
    random_block_pattern,
    tile_classes,
    tile_lists,
)
from microscope_kernels.sliding_window_attention.model import (
    WindowAttention,
    model_attention_calls,
    use_window_attention,
    window_for,
)
from microscope_kernels.sliding_window_attention.peers import flex_block_mask, sdpa_masked
from microscope_kernels.sliding_window_attention.reference import masked_attention

from microscope.api import Case, ModelShapes
from microscope.workloads import EagerAttention, ModelConfig, build_model, generate_greedy


def _problem(seed: int, sq: int, sk: int, head_dim: int, dtype: torch.dtype, window: int, globals: int,
             random_blocks: int, block: int, causal: bool) -> tuple[list[torch.Tensor], torch.Tensor, dict]:
    """q, k, v, dO in ``dtype`` (batch 1, 2 heads) and the mask arguments, with a seeded random pattern."""
    gen = torch.Generator().manual_seed(seed)
    spec = MaskSpec(window=window, causal=causal, globals=globals, block=block)
    pattern = random_block_pattern(spec, sk, random_blocks, gen, DEVICE)
    shapes = [(1, 2, sq, head_dim), (1, 2, sk, head_dim), (1, 2, sk, head_dim), (1, 2, sq, head_dim)]
    q, k, v, do = (torch.randn(s, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for s in shapes)
    mask = {"pattern": pattern, "window": window, "globals": globals, "block": block, "causal": causal}
    return [q, k, v], do, mask


def assert_as_accurate_as_eager(seed: int, sq: int, sk: int, head_dim: int, dtype: torch.dtype, window: int,
                                globals: int, random_blocks: int, block: int, causal: bool) -> list[torch.Tensor]:
    """Out, dq, dk, dv of the kernel vs float64 eager with the same mask, against eager's own error."""
    qkv, do, mask = _problem(seed, sq, sk, head_dim, dtype, window, globals, random_blocks, block, causal)
    ref = _fwd_bwd(masked_attention, [t.double() for t in qkv], do.double(), mask)
    eager = _fwd_bwd(masked_attention, qkv, do, mask)
    got = _fwd_bwd(sliding_window_attention, qkv, do, mask)
    for name, g, e, r in zip(("out", "dq", "dk", "dv"), got, eager, ref):
        assert g.dtype == dtype and g.shape == r.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        err, (base, limit) = _rel(g, r), error_limit(e, r, dtype)
        assert err <= limit, (f"{name}: rel. error {err:.2e} > {limit:.2e} (eager {base:.2e}) for Sq={sq} Sk={sk} "
                              f"D={head_dim} {dtype} {mask}")
    return got


# -- the kernel against the reference ------------------------------------------------------------------------

# (Sq, Sk, D, dtype, window, globals, random blocks, block, causal): odd lengths, windows and blocks that are
# no multiple of the 32 x 32 interpreter tiles, every dtype and head dim, Sq < Sk (chunked prefill / decode).
CASES = [
    (100, 100, 64, "fp32", 24, 2, 1, 16, False),
    (100, 100, 64, "bf16", 24, 2, 1, 16, True),
    (77, 77, 32, "fp16", 7, 0, 2, 24, False),
    (53, 53, 128, "fp32", 13, 3, 0, 16, True),
    (45, 130, 64, "bf16", 20, 2, 1, 16, True),
    (33, 97, 128, "fp16", 16, 1, 1, 32, True),
    (1, 70, 64, "fp32", 9, 1, 1, 16, False),
    (90, 90, 64, "fp16", 30, 0, 0, 64, False),
]


@pytest.mark.parametrize(("sq", "sk", "head_dim", "dtype", "window", "globals", "random_blocks", "block", "causal"),
                         CASES, ids=[f"{c[0]}x{c[1]}-d{c[2]}-{c[3]}-w{c[4]}-g{c[5]}-r{c[6]}-b{c[7]}-"
                                     f"{'causal' if c[8] else 'full'}" for c in CASES])
def test_matches_float64_reference(seed, sq, sk, head_dim, dtype, window, globals, random_blocks, block, causal):
    assert_as_accurate_as_eager(seed, sq, sk, head_dim, DTYPES[dtype], window, globals, random_blocks, block, causal)


def test_a_mask_without_random_blocks_builds_its_tile_lists_once_per_shape(seed, monkeypatch):
    """Decode steps (one query over a growing cache) and repeated calls reuse the lists of their shape, and
    give what a fresh build gives (forward and gradients, against float64 eager); with random blocks, or a
    grid above ``CACHED_TILE_PAIRS``, every call builds its own."""
    built = []
    real = kernel.tile_classes
    monkeypatch.setattr(kernel, "tile_classes", lambda *a, **kw: built.append(a[2:4]) or real(*a, **kw))
    kernel._shape_tiles.cache_clear()
    for sk in (40, 41, 42, 40, 41, 42):  # two decode passes over the same lengths
        assert_as_accurate_as_eager(seed, 1, sk, 32, torch.float32, 9, 1, 0, 16, True)
    assert built == [(1, 40), (1, 41), (1, 42)]
    built.clear()
    for _ in range(2):
        assert_as_accurate_as_eager(seed, 1, 40, 32, torch.float32, 9, 1, 1, 16, True)  # random blocks
    assert built == [(1, 40), (1, 40)]
    built.clear()
    monkeypatch.setattr(kernel, "CACHED_TILE_PAIRS", 0)
    for _ in range(2):
        assert_as_accurate_as_eager(seed, 1, 43, 32, torch.float32, 9, 1, 0, 16, True)
    assert built == [(1, 43), (1, 43)]
    kernel._shape_tiles.cache_clear()


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_whole_tiles_take_the_unmasked_path(seed, causal):
    """A wide window, 32 global tokens and random blocks of 32: some tiles are FULL, so the kernels' unmasked
    loops run (the small cases above only ever mask)."""
    spec = MaskSpec(window=70, causal=causal, globals=32, block=32)
    pattern = random_block_pattern(spec, 130, 2, torch.Generator().manual_seed(seed))
    tiles = kernel.tiles_for(torch.float32, 64, 32, True)
    classes = tile_classes(spec, block_pairs(pattern, n_blocks(130, 32)), 130, 130, *tiles)
    assert (classes == FULL).sum() >= 4
    assert_as_accurate_as_eager(seed, 130, 130, 64, torch.float32, 70, 32, 2, 32, causal)


@pytest.mark.parametrize("tiles", [(32, 16), (16, 32)], ids=["32x16", "16x32"])
def test_unequal_tiles(monkeypatch, seed, tiles):
    """Query and key tiles of different sizes: the transposed lists of the dK/dV kernel differ from the rows."""
    monkeypatch.setattr(kernel, "_INTERPRET_TILES", tiles)
    assert_as_accurate_as_eager(seed, 70, 70, 64, torch.float32, 11, 2, 1, 24, True)
    assert_as_accurate_as_eager(seed, 40, 61, 64, torch.bfloat16, 6, 0, 2, 8, False)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_empty_window_without_globals_outputs_zeros(seed, causal):
    """Window 0, no globals, no random blocks: every query sees nothing, so output and gradients are zero."""
    qkv, do, mask = _problem(seed, 45, 45, 64, torch.float32, 0, 0, 0, 16, causal)
    out, dq, dk, dv = _fwd_bwd(sliding_window_attention, qkv, do, mask)
    for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
        assert torch.count_nonzero(t) == 0, name


def test_rows_that_see_no_key_among_others(seed):
    """Window 0 with random blocks, causal: the first block row has no earlier block to draw, so it sees
    nothing and outputs zero, while later rows attend to their random blocks only."""
    got = assert_as_accurate_as_eager(seed, 64, 64, 64, torch.float32, 0, 0, 2, 16, True)
    assert torch.count_nonzero(got[0][:, :, :16]) == 0
    assert torch.count_nonzero(got[0][:, :, 16:]) > 0


def test_empty_window_with_globals_sees_only_the_global_tokens(seed):
    """Window 0 with 3 global tokens: a global query sees every key (causal: every earlier one), any other
    query exactly the 3 global keys."""
    assert_as_accurate_as_eager(seed, 50, 50, 32, torch.float32, 0, 3, 0, 16, False)
    (q, k, v), _, mask = _problem(seed, 50, 50, 32, torch.float32, 0, 3, 0, 16, True)
    out = sliding_window_attention(q, k, v, **mask)
    assert torch.equal(out[:, :, 0], v[:, :, 0])  # the first query sees only itself
    by_hand = torch.softmax(q[:, :, 3:] @ k[:, :, :3].transpose(-1, -2) / 32**0.5, dim=-1) @ v[:, :, :3]
    torch.testing.assert_close(out[:, :, 3:], by_hand, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["full", "causal"])
def test_single_token_window_is_the_identity_on_v(seed, causal):
    """Window 1: each query sees only its own key, so O = V and dV = dO exactly, and dQ = dK = 0 (up to the
    rounding of dO.V against rowsum(dO * O), two sums of the same products)."""
    qkv, do, mask = _problem(seed, 37, 37, 64, torch.float32, 1, 0, 0, 16, causal)
    out, dq, dk, dv = _fwd_bwd(sliding_window_attention, qkv, do, mask)
    assert torch.equal(out, qkv[2])
    assert torch.equal(dv, do)
    assert dq.abs().max() < 1e-5 and dk.abs().max() < 1e-5


def test_bad_arguments_raise_clear_errors():
    q = torch.randn(1, 2, 8, 64)
    with pytest.raises(ValueError, match=r"head dims \(32, 64, 128\)"):
        sliding_window_attention(torch.randn(1, 1, 8, 48), torch.randn(1, 1, 8, 48), torch.randn(1, 1, 8, 48))
    with pytest.raises(ValueError, match="one dtype"):
        sliding_window_attention(q, q.half(), q, window=2)
    with pytest.raises(ValueError, match="Sq <= Sk"):
        sliding_window_attention(q, q[:, :, :4], q[:, :, :4], window=2)
    with pytest.raises(ValueError, match="window must be >= 0"):
        sliding_window_attention(q, q, q, window=-1)
    with pytest.raises(ValueError, match=r"\(n_blocks=1, r\)"):
        sliding_window_attention(q, q, q, torch.zeros(3, 1, dtype=torch.int32), window=2, block=64)


# -- the mask -------------------------------------------------------------------------------------------------


def test_predicate_on_a_small_example():
    spec = MaskSpec(window=2, causal=False, globals=1, block=2)
    pattern = torch.tensor([[-1], [-1], [0]], dtype=torch.int32)  # query block 2 (positions 4, 5) -> key block 0
    got = dense_mask(spec, block_pairs(pattern, 3), 6, 6).int().tolist()
    assert got == [[1, 1, 1, 1, 1, 1],
                   [1, 1, 1, 0, 0, 0],
                   [1, 1, 1, 1, 0, 0],
                   [1, 0, 1, 1, 1, 0],
                   [1, 1, 0, 1, 1, 1],
                   [1, 1, 0, 0, 1, 1]]
    causal = dense_mask(MaskSpec(window=2, causal=True, globals=1, block=2), block_pairs(pattern, 3), 6, 6)
    assert torch.equal(causal, torch.tensor(got, dtype=torch.bool).tril())
    decode = dense_mask(MaskSpec(window=2, causal=True), None, 1, 6)  # the last position, bottom-right aligned
    assert decode.int().tolist() == [[0, 0, 0, 0, 1, 1]]


def test_tile_map_never_skips_a_visible_pair_and_full_tiles_need_no_mask(seed):
    """Random masks and tilings: EMPTY tiles hold no visible pair, FULL tiles only visible pairs inside both
    sequences; the lists keep FULL before PARTIAL; the pair count matches the dense mask."""
    rng = random.Random(seed)
    for _ in range(60):
        sk = rng.randint(1, 140)
        sq = rng.randint(1, sk)
        spec = MaskSpec(window=rng.choice([0, 1, 2, 5, 17, 40, 300]), causal=rng.random() < 0.5,
                        globals=rng.choice([0, 1, 3, 20]), block=rng.choice([1, 3, 16, 24, 64]))
        nb = n_blocks(sk, spec.block)
        draw = torch.Generator().manual_seed(rng.getrandbits(31))
        pattern = random_block_pattern(spec, sk, rng.choice([0, 1, 3]), draw)
        if rng.random() < 0.3:  # any pattern a caller passes, not only BigBird's choice rule
            pattern = torch.randint(-1, nb, (nb, 2), generator=draw)
        pairs = block_pairs(pattern, nb)
        dense = dense_mask(spec, pairs, sq, sk)
        bm, bn = rng.choice([(16, 16), (32, 16), (16, 32), (64, 64), (7, 5)])
        classes = tile_classes(spec, pairs, sq, sk, bm, bn)
        for a in range(classes.shape[0]):
            for b in range(classes.shape[1]):
                tile = dense[a * bm:(a + 1) * bm, b * bn:(b + 1) * bn]
                if classes[a, b] == EMPTY:
                    assert not tile.any(), (spec, sq, sk, bm, bn, a, b)
                if classes[a, b] == FULL:
                    assert tile.shape == (bm, bn) and tile.all(), (spec, sq, sk, bm, bn, a, b)
        lists = tile_lists(classes)
        for a in range(classes.shape[0]):
            count, full, index = int(lists.count[a]), int(lists.full[a]), lists.index[a].tolist()
            assert [classes[a, b].item() for b in index[:count]] == [FULL] * full + [PARTIAL] * (count - full)
            assert index[:full] == sorted(index[:full]) and index[full:count] == sorted(index[full:count])
        assert count_visible(spec, pairs, sq, sk, tile=rng.choice([8, 64])) == int(dense.sum())


def test_tile_map_skips_what_a_window_leaves_out():
    """At 4096 tokens, window 256, 64 x 64 tiles, each query tile visits about 2 * 256 / 64 + 1 key tiles."""
    classes = tile_classes(MaskSpec(window=256, causal=False), None, 4096, 4096, 64, 64)
    visited = (classes != EMPTY).sum(1)
    assert visited.max() <= 9 and visited.float().mean() > 8
    assert (classes == FULL).sum() > 6 * classes.shape[0]


def test_random_pattern_is_seeded_and_bigbird_like(seed):
    """Same seed, same pattern; distinct blocks per row, none holding a global key or a key inside the window
    of one of the row's queries, and (causal) wholly before it; -1 only where a row has too few candidates."""
    for causal in (False, True):
        spec = MaskSpec(window=20, causal=causal, globals=8, block=16)
        one = random_block_pattern(spec, 300, 3, torch.Generator().manual_seed(seed))
        assert torch.equal(one, random_block_pattern(spec, 300, 3, torch.Generator().manual_seed(seed)))
        assert one.shape == (19, 3) and one.dtype == torch.int32
        window_or_global = dense_mask(MaskSpec(window=20, causal=False), None, 300, 300)
        window_or_global[:, :8] = True
        for qb, row in enumerate(one.tolist()):
            chosen = [kb for kb in row if kb >= 0]
            assert len(set(chosen)) == len(chosen)
            for kb in chosen:
                assert not window_or_global[qb * 16:(qb + 1) * 16, kb * 16:(kb + 1) * 16].any()
                assert not causal or kb < qb
        if causal:
            assert one[0].tolist() == [-1, -1, -1] and (one[10:] >= 0).all()


def test_mask_spec_rejects_bad_values():
    for kwargs, message in (({"window": -1}, "window must be >= 0"), ({"window": 4, "globals": -2}, "globals"),
                            ({"window": 4, "block": 0}, "block"), ({"window": 2.5}, "window must be an integer")):
        with pytest.raises(ValueError, match=message):
            MaskSpec(causal=False, **kwargs)
    with pytest.raises(ValueError, match="random_blocks must be >= 0"):
        random_block_pattern(MaskSpec(window=1, causal=False), 10, -1, torch.Generator())


# -- peers ----------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("sq", "sk", "causal"), [(300, 300, False), (200, 333, True)])
def test_peers_compute_the_same_mask(seed, sq, sk, causal):
    """SDPA with the dense mask; flex's BlockMask: its mask_mod (what eager flex_attention applies) and its
    block structure (what compiled flex skips by) against the dense mask and the tile classes."""
    from torch.nn.attention.flex_attention import flex_attention

    qkv, _, mask = _problem(seed, sq, sk, 64, torch.float32, 24, 2, 2, 16, causal)
    ref = masked_attention(*(t.double() for t in qkv), **mask)
    assert _rel(sdpa_masked(*qkv, **mask), ref) < 1e-5
    block_mask = flex_block_mask(mask["pattern"], sq, sk, mask["window"], mask["globals"], mask["block"], causal,
                                 DEVICE)
    with warnings.catch_warnings():  # "called without torch.compile": the unfused path, fine for a check
        warnings.simplefilter("ignore")
        assert _rel(flex_attention(*qkv, block_mask=block_mask), ref) < 1e-5
    spec = MaskSpec(window=24, causal=causal, globals=2, block=16)
    classes = tile_classes(spec, block_pairs(mask["pattern"], n_blocks(sk, 16)), sq, sk, 128, 128)
    assert torch.equal(block_mask.to_dense()[0, 0].bool().cpu(), (classes != EMPTY).cpu())


# -- the plugin -----------------------------------------------------------------------------------------------


def _case(**over) -> Case:
    params = {"batch": 1, "heads": 2, "seq": 100, "head_dim": 64, "window": 24, "globals": 2, "random_blocks": 1,
              "block": 16, "causal": True, "dtype": "fp32"}
    params.update(over)
    return Case.of(**params)


def test_the_configs_load_on_every_device():
    from microscope.commands import load_checked

    for name in ("sliding_window_attention.yaml", "sliding_window_attention_model.yaml"):
        path = Path(__file__).resolve().parents[2] / "ablations" / name
        for device in ("cpu", "cuda"):
            for quick in (False, True):
                load_checked(path, device, quick)


def test_flops_count_the_visible_pairs():
    plugin = SlidingWindowAttention()
    case = _case(seq=130, causal=False)
    spec = MaskSpec(window=24, causal=False, globals=2, block=16)
    pattern = random_block_pattern(spec, 130, 1, torch.Generator().manual_seed(0))
    pairs = int(dense_mask(spec, block_pairs(pattern, n_blocks(130, 16)), 130, 130).sum())
    assert plugin.flops(case) == 4 * 2 * pairs * 64
    assert plugin.flops(case, backward=True) == 3.5 * plugin.flops(case)
    assert pairs < 0.6 * 130 * 130  # the point: far fewer than full attention's pairs


def test_inputs_reject_bad_case_values_with_a_clear_message():
    plugin = SlidingWindowAttention()
    for over, message in (({"window": -3}, "window must be >= 0"), ({"random_blocks": -1}, "random_blocks"),
                          ({"seq": 0}, "seq must be a positive integer"), ({"block": 0}, "block")):
        with pytest.raises(ValueError, match=message):
            plugin.inputs(_case(**over), torch.Generator().manual_seed(0), "cpu")


def test_chunked_ground_truth_equals_the_baseline(seed, monkeypatch):
    import microscope_kernels.attention_inputs as shared

    plugin = SlidingWindowAttention()
    inputs = plugin.inputs(_case(), torch.Generator().manual_seed(seed), "cpu")
    x64 = {n: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in inputs.items()}
    monkeypatch.setattr(shared, "TRUTH_SCORES", 2 * 100 * 7)  # 7 rows a step: 15 steps, the last short
    torch.testing.assert_close(plugin.reference(x64), masked_attention(**x64), rtol=1e-12, atol=1e-14)


# -- model level ----------------------------------------------------------------------------------------------


def test_window_arms_swap_every_block_or_all_but_the_last():
    model = build_model(ModelConfig(n_layers=3, d_model=64, n_heads=2, context=32))
    use_window_attention(model)
    assert all(isinstance(b.attn.attn_fn, WindowAttention) for b in model.blocks)
    assert model.blocks[0].attn.attn_fn.window == window_for(32) == 8
    model = build_model(ModelConfig(n_layers=3, d_model=64, n_heads=2, context=32))
    use_window_attention(model, keep_full_last=True)
    kinds = [type(b.attn.attn_fn) for b in model.blocks]
    assert kinds == [WindowAttention, WindowAttention, EagerAttention]
    with pytest.raises(ValueError, match="head dims"):
        use_window_attention(build_model(ModelConfig(n_layers=1, d_model=96, n_heads=2, context=16)))


def test_the_precompiled_attention_calls_are_the_ones_the_model_makes(seed):
    """``model_attention_calls`` (what ``precompile_model`` compiles for flash_full) lists each kind of call a
    model makes in training, prefill and decode: its causal flag and its query and key lengths."""
    cfg = ModelConfig(n_layers=2, d_model=64, n_heads=2, context=32)
    model = build_model(cfg)
    made = set()

    def recording(q, k, v, causal):  # noqa: ANN001, ANN202 - the attn_fn contract
        made.add((q.shape[2], k.shape[2], causal, q.shape[1], q.shape[3], torch.is_grad_enabled()))
        return EagerAttention()(q, k, v, causal)

    model.set_attention(recording)
    tokens = torch.randint(0, cfg.vocab_size, (2, cfg.context))
    model(tokens).sum().backward()  # a training step's forward
    generate_greedy(model, tokens[:, : cfg.context // 2], 2)  # prefill of half the context, then a decode step
    shapes = ModelShapes(cfg, torch.float32, (), (2 * cfg.context,), trains=True)
    listed = {(q.shape[2], k.shape[2], causal, q.shape[1], q.shape[3], backward)
              for q, k, causal, backward in model_attention_calls(shapes, "cpu")}
    assert made == listed


@pytest.mark.parametrize("keep_full_last", [False, True])
def test_the_eager_arms_compute_the_kernel_arms_function(seed, keep_full_last):
    """window_eager / window_last_full_eager (the CPU-trainable arms) give the kernel arms' logits and gradients."""
    assert_eager_arm_matches(functools.partial(use_window_attention, keep_full_last=keep_full_last),
                             functools.partial(use_window_attention, keep_full_last=keep_full_last, eager=True),
                             seed)


def test_a_window_as_long_as_the_context_is_full_causal_attention(seed):
    """The windowed model with window >= sequence computes what the model's own causal attention does, and
    a decode step through the KV cache matches the prefill's last row."""
    model = build_model(ModelConfig(n_layers=2, d_model=64, n_heads=2, context=16), seed=seed % 1000,
                        device=DEVICE)
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    with torch.no_grad():
        full = model(tokens)
        model.set_attention(WindowAttention(window=20))
        torch.testing.assert_close(model(tokens), full, rtol=1e-4, atol=1e-4)
        model.set_attention(WindowAttention(window=5))
        windowed = model(tokens)
        _, cache = model.prefill(tokens[:, :-1])
        torch.testing.assert_close(model.decode_step(tokens[:, -1], cache), windowed[:, -1], rtol=1e-4, atol=1e-4)


def test_eager_baseline_skips_a_case_whose_matrices_would_not_fit_on_the_gpu(monkeypatch):
    """The H100 bench run: eager at S 32k (bf16, 16 heads) asked for 32 GiB more with 10 GiB free; its three
    (S x S) matrices (96 GiB) fit the H200's 139 GiB, not an 80 GB card. Never refused on the CPU."""
    gib = 2**30
    free = {"now": 75 * gib}
    monkeypatch.setattr(torch.cuda, "mem_get_info", lambda device=None: (free["now"], 80 * gib))
    monkeypatch.setattr(torch.cuda, "memory_reserved", lambda device=None: 0)
    monkeypatch.setattr(torch.cuda, "memory_allocated", lambda device=None: 0)
    supports = SlidingWindowAttention().variants["eager"].supports
    bench = {"batch": 1, "heads": 16, "head_dim": 128, "window": 512, "globals": 128, "random_blocks": 3,
             "block": 64, "causal": False, "dtype": "bf16"}
    reason = supports(Case.of(**bench, seq=32768), "cuda")
    assert reason.startswith("the eager forward's (S x S) matrices would hold 98.0 GiB") and "75.0 GiB" in reason
    assert supports(Case.of(**bench, seq=16384), "cuda") is None
    assert supports(Case.of(**bench, seq=32768), "cpu") is None
    free["now"] = 139 * gib
    assert supports(Case.of(**bench, seq=32768), "cuda") is None
