"""lsh_attention: hashing, sorting and the two visibility rules against from-scratch definitions, the launch
plan's tiles, the Triton kernel (forward and gradients) against float64 eager attention with the same bucket
mask, recall, the peers, the plugin and the model arm.

Kernels run through the Triton interpreter on CPU (compiled on a GPU host). Errors are judged against the
error eager attention itself makes in the same dtype (``rel_err(kernel) <= 4 * rel_err(eager) + floor``).
Every test draws from the printed ``seed`` fixture; rerun one with ``MICROSCOPE_TEST_SEED=<seed>``.
"""

from __future__ import annotations

import bisect
import functools
import random
from pathlib import Path

import pytest
import torch
from attention_checks import DEVICE, DTYPES, assert_eager_arm_matches, error_limit
from attention_checks import fwd_bwd as _fwd_bwd
from attention_checks import rel_err as _rel
from microscope_kernels.lsh_attention.ablation import LSHAttentionAblation
from microscope_kernels.lsh_attention.hashing import draw_rotations, hash_vectors
from microscope_kernels.lsh_attention.kernel import lsh_attention
from microscope_kernels.lsh_attention.model import LSHAttention, use_lsh_attention, window_for
from microscope_kernels.lsh_attention.peers import flash_full, sdpa_full, sdpa_masked
from microscope_kernels.lsh_attention.plan import build_plan
from microscope_kernels.lsh_attention.recall import clustered_qk, recall
from microscope_kernels.lsh_attention.reference import full_attention, lsh_attention_reference
from microscope_kernels.lsh_attention.sorting import bucket_counts, permute, sort_by_bucket, unpermute
from microscope_kernels.lsh_attention.visibility import LSHSpec, key_intervals, scored_pairs, visible_mask

from microscope.api import Case, call_as_timed
from microscope.workloads import EagerAttention, ModelConfig, build_model
from microscope.workloads.checks import future_leak


def _qkv(gen: torch.Generator, sq: int, sk: int, head_dim: int, dtype: torch.dtype, heads: int = 2):
    shapes = [(1, heads, sq, head_dim), (1, heads, sk, head_dim), (1, heads, sk, head_dim), (1, heads, sq, head_dim)]
    return [torch.randn(s, generator=gen, dtype=torch.float64).to(DEVICE, dtype) for s in shapes]


def _args(gen: torch.Generator, head_dim: int, n_buckets: int, n_hashes: int, chunk: int, causal: bool,
          rule: str) -> dict:
    return {"rotations": draw_rotations(n_hashes, head_dim, n_buckets, gen, DEVICE), "n_buckets": n_buckets,
            "chunk": chunk, "causal": causal, "rule": rule}


# -- the kernel against the reference ------------------------------------------------------------------------

# (Sq, Sk, D, dtype, n_buckets, n_hashes, chunk, causal, rule): odd lengths, chunks and bucket counts that are
# no multiple of one another nor of the interpreter's 16 x 16 tiles; every dtype, 1-3 rounds, Sq < Sk.
CASES = [
    (50, 50, 32, "fp32", 4, 1, 8, False, "chunk"),
    (61, 61, 64, "bf16", 4, 2, 10, True, "chunk"),
    (45, 45, 32, "fp16", 8, 3, 7, False, "chunk"),
    (53, 53, 32, "fp32", 6, 2, 9, True, "window"),
    (7, 40, 32, "bf16", 4, 1, 5, True, "window"),
    (37, 37, 128, "fp16", 2, 1, 11, True, "window"),
]


@pytest.mark.parametrize(("sq", "sk", "head_dim", "dtype", "n_buckets", "n_hashes", "chunk", "causal", "rule"),
                         CASES, ids=[f"{c[0]}x{c[1]}-d{c[2]}-{c[3]}-b{c[4]}-h{c[5]}-c{c[6]}-"
                                     f"{'causal' if c[7] else 'full'}-{c[8]}" for c in CASES])
def test_matches_float64_reference(seed, sq, sk, head_dim, dtype, n_buckets, n_hashes, chunk, causal, rule):
    """Out, dq, dk, dv of the kernel vs float64 eager with the same bucket mask, against eager's own error."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, do = _qkv(gen, sq, sk, head_dim, DTYPES[dtype])
    args = _args(gen, head_dim, n_buckets, n_hashes, chunk, causal, rule)
    ref = _fwd_bwd(lsh_attention_reference, [q.double(), k.double(), v.double()], do.double(), args)
    eager = _fwd_bwd(lsh_attention_reference, [q, k, v], do, args)
    got = _fwd_bwd(lsh_attention, [q, k, v], do, args)
    for name, g, e, r in zip(("out", "dq", "dk", "dv"), got, eager, ref):
        assert g.dtype == DTYPES[dtype] and g.shape == r.shape, f"{name}: {g.dtype} {tuple(g.shape)}"
        err, (base, limit) = _rel(g, r), error_limit(e, r, g.dtype)
        assert err <= limit, f"{name}: rel. error {err:.2e} > {limit:.2e} (eager {base:.2e})"


@pytest.mark.parametrize(("causal", "rule"), [(False, "chunk"), (True, "chunk"), (True, "window")])
def test_one_bucket_and_a_chunk_spanning_the_sequence_is_full_attention(seed, causal, rule):
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _ = _qkv(gen, 41, 41, 32, torch.float32)
    args = _args(gen, 32, 1, 1, 64, causal, rule)
    full = full_attention(q.double(), k.double(), v.double(), causal)
    torch.testing.assert_close(lsh_attention_reference(q.double(), k.double(), v.double(), **args), full)
    torch.testing.assert_close(lsh_attention(q, k, v, **args).double(), full, rtol=1e-5, atol=1e-6)


def test_queries_that_see_no_key_output_zeros_with_zero_gradients(seed):
    """Every key points along both rounds' projections and every query the other way: under the window rule no
    query shares a bucket with any key, so output and gradients are exactly zero (and finite)."""
    gen = torch.Generator().manual_seed(seed)
    args = _args(gen, 32, 2, 2, 8, True, "window")
    u = args["rotations"][0, :, 0] + args["rotations"][1, :, 0]  # positive projection in both rounds
    k = u + 0.01 * torch.randn(1, 2, 30, 32, generator=gen).to(DEVICE)
    q, v = -k.clone(), torch.randn(1, 2, 30, 32, generator=gen).to(DEVICE)
    spec = LSHSpec(2, 8, True, "window")
    assert not visible_mask(spec, key_intervals(spec, q, k, args["rotations"])).any()
    for fn in (lsh_attention, lsh_attention_reference):
        out, dq, dk, dv = _fwd_bwd(fn, [q, k, v], torch.randn_like(q), args)
        for name, t in (("out", out), ("dq", dq), ("dk", dk), ("dv", dv)):
            assert torch.count_nonzero(t) == 0, (fn.__name__, name)


def test_bad_arguments_raise_clear_errors():
    q = torch.randn(1, 2, 8, 32)
    rot = draw_rotations(1, 32, 4, torch.Generator().manual_seed(0))
    with pytest.raises(ValueError, match=r"head dims \(32, 64, 128\)"):
        lsh_attention(torch.randn(1, 1, 8, 48), torch.randn(1, 1, 8, 48), torch.randn(1, 1, 8, 48), rot, 4, 4)
    with pytest.raises(ValueError, match="one dtype"):
        lsh_attention(q, q.half(), q, rot, 4, 4)
    with pytest.raises(ValueError, match="Sq == Sk"):
        lsh_attention(q[:, :, :4], q, q, rot, 4, 4)
    with pytest.raises(ValueError, match="window rule is causal"):
        lsh_attention(q, q, q, rot, 4, 4, causal=False, rule="window")
    with pytest.raises(ValueError, match=r"rotations must be \(n_hashes, head_dim=32, n_buckets // 2=4\)"):
        lsh_attention(q, q, q, rot, 8, 4)


# -- hashing, sorting, visibility -------------------------------------------------------------------------------


def test_hashing_is_a_function_of_the_rotation(seed):
    """Same rotation, same buckets (also from a bf16 input and its float64 copy); buckets in range; angular:
    a positive rescale keeps the bucket and negation moves it to the opposite one (b + n/2 mod n)."""
    gen = torch.Generator().manual_seed(seed)
    x = torch.randn(2, 3, 50, 32, generator=gen)
    rot = draw_rotations(3, 32, 8, gen)
    b = hash_vectors(x, rot, 8)
    assert b.shape == (3, 2, 3, 50) and b.dtype == torch.int64 and 0 <= b.min() and b.max() < 8
    assert torch.equal(b, hash_vectors(x.clone(), rot.clone(), 8))
    assert torch.equal(hash_vectors(x * 3.7, rot, 8), b)
    assert torch.equal(hash_vectors(-x, rot, 8), (b + 4) % 8)
    xb = x.bfloat16()
    assert torch.equal(hash_vectors(xb, rot, 8), hash_vectors(xb.double(), rot.double(), 8))
    assert not torch.equal(hash_vectors(x, draw_rotations(3, 32, 8, gen), 8), b)
    assert torch.count_nonzero(hash_vectors(x, draw_rotations(2, 32, 1, gen), 1)) == 0
    for bad in (3, 0, True, 2.0):
        with pytest.raises(ValueError, match="n_buckets"):
            draw_rotations(1, 32, bad, gen)


def test_sorting_is_a_stable_permutation_and_unsorting_restores_order(seed):
    gen = torch.Generator().manual_seed(seed)
    buckets = torch.randint(0, 5, (2, 3, 47), generator=gen)
    perm, rank = sort_by_bucket(buckets)
    ar = torch.arange(47)
    assert torch.equal(perm.sort(-1).values, ar.expand_as(perm))  # a permutation of the positions
    assert torch.equal(rank.gather(-1, perm), ar.expand_as(perm))
    sorted_b = buckets.gather(-1, perm)
    assert (sorted_b.diff(dim=-1) >= 0).all()
    same = sorted_b.diff(dim=-1) == 0
    assert (perm.diff(dim=-1)[same] > 0).all()  # stable: positions increase inside a bucket
    x = torch.randn(2, 3, 47, 8, generator=gen)
    assert torch.equal(unpermute(permute(x, perm), perm), x)
    assert torch.equal(permute(x, perm)[0, 0, 0], x[0, 0, perm[0, 0, 0]])
    assert torch.equal(bucket_counts(buckets, 5).sum(-1), torch.full((2, 3), 47))


def _brute_force_mask(qb: torch.Tensor, kb: torch.Tensor, chunk: int, causal: bool, rule: str) -> torch.Tensor:
    """The rules as written in visibility.py, one query and one round at a time with plain Python."""
    rounds, sq, sk = qb.shape[0], qb.shape[-1], kb.shape[-1]
    off = sk - sq
    seen = torch.zeros(sq, sk, dtype=torch.bool)
    for r in range(rounds):
        qs, ks = qb[r].tolist(), kb[r].tolist()
        q_order = sorted(range(sq), key=lambda i: (qs[i], i))
        k_order = sorted(range(sk), key=lambda j: (ks[j], j))
        for i in range(sq):
            if rule == "chunk":
                c = q_order.index(i) // chunk
                for j in range(sk):
                    if k_order.index(j) // chunk in (c - 1, c) and (not causal or j <= i + off):
                        seen[i, j] = True
            else:
                mine = [j for j in range(sk) if ks[j] == qs[i] and j <= i + off]
                for j in mine[-chunk:]:
                    seen[i, j] = True
    return seen


@pytest.mark.parametrize(("sq", "sk", "causal", "rule"),
                         [(37, 37, False, "chunk"), (37, 37, True, "chunk"), (29, 29, True, "window"),
                          (6, 33, True, "window")])
def test_visibility_matches_the_rules_written_out(seed, sq, sk, causal, rule):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 1, sq, 16, generator=gen), torch.randn(1, 1, sk, 16, generator=gen)
    rot = draw_rotations(2, 16, 6, gen)
    spec = LSHSpec(6, 5, causal, rule)
    got = visible_mask(spec, key_intervals(spec, q, k, rot))[0, 0]
    want = _brute_force_mask(hash_vectors(q, rot, 6)[:, 0, 0], hash_vectors(k, rot, 6)[:, 0, 0], 5, causal, rule)
    assert torch.equal(got, want)


def test_the_window_rule_is_causal_safe_and_the_chunk_rule_is_not():
    """Redraw the second half of q and k: the window rule's rows of the first half never change; the chunk
    rule's do (chunk boundaries move with later tokens' buckets)."""
    gen = torch.Generator().manual_seed(0)
    changed = {"chunk": 0, "window": 0}
    for _ in range(5):
        q, k = torch.randn(1, 2, 64, 16, generator=gen), torch.randn(1, 2, 64, 16, generator=gen)
        q2, k2 = q.clone(), k.clone()
        q2[:, :, 32:] = torch.randn(1, 2, 32, 16, generator=gen)
        k2[:, :, 32:] = torch.randn(1, 2, 32, 16, generator=gen)
        rot = draw_rotations(2, 16, 4, gen)
        for rule in changed:
            spec = LSHSpec(4, 6, True, rule)
            a = visible_mask(spec, key_intervals(spec, q, k, rot))[..., :32, :]
            b = visible_mask(spec, key_intervals(spec, q2, k2, rot))[..., :32, :]
            changed[rule] += int(not torch.equal(a, b))
    assert changed == {"chunk": 5, "window": 0}


@pytest.mark.parametrize("rule", ["chunk", "window"])
def test_plan_tiles_cover_every_interval(seed, rule):
    """Query tiles hold each query once per round and walk at least its interval (window rule: one bucket per
    tile, key walk on the bucket's BLOCK_N grid); key tiles reach every query whose interval meets them."""
    rng = random.Random(seed)
    sq = sk = rng.randint(20, 90)
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 2, sq, 16, generator=gen), torch.randn(1, 2, sk, 16, generator=gen)
    nb, bm, bn = rng.choice([2, 4, 8]), rng.choice([8, 16]), rng.choice([8, 16])
    spec = LSHSpec(nb, rng.randint(1, 12), True, rule)
    iv = key_intervals(spec, q, k, draw_rotations(2, 16, nb, gen))
    plan = build_plan(spec, iv, bm, bn)
    for r in range(2):
        for bh in range(2):
            start, end = plan.start[r, bh].tolist(), plan.end[r, bh].tolist()
            qperm, qbk = plan.qperm[r, bh].tolist(), iv.q_buckets[r, 0, bh].tolist()
            kbk = iv.k_buckets[r, 0, bh].sort().values.tolist()
            covered = []
            for qa, qb, ka, kb in plan.q_tiles[r, bh].tolist():
                assert qb - qa <= bm
                covered += range(qa, qb)
                for i in range(qa, qb):
                    pos = qperm[i]
                    assert start[pos] >= end[pos] or (ka <= start[pos] and end[pos] <= kb)
                if rule == "window" and qa < qb:
                    bucket = qbk[qperm[qa]]
                    assert {qbk[qperm[i]] for i in range(qa, qb)} == {bucket}
                    assert (ka - bisect.bisect_left(kbk, bucket)) % bn == 0
            assert sorted(covered) == list(range(sq))
            for ka, kb, qa, qb in plan.k_tiles[r, bh].tolist():
                for i in range(sq):
                    pos = qperm[i]
                    if max(start[pos], ka) < min(end[pos], kb):
                        assert qa <= i < qb


# -- recall -------------------------------------------------------------------------------------------------


def test_recall_is_one_when_everything_is_visible(seed):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(1, 2, 40, 16, generator=gen), torch.randn(1, 2, 40, 16, generator=gen)
    got = recall(q, k, draw_rotations(1, 16, 1, gen), 1, 64, causal=False, top_k=5)
    assert got.top_k_recall == pytest.approx(1.0) and got.mass_kept == pytest.approx(1.0)
    assert got.keys_seen == got.keys_scored == 40
    with pytest.raises(ValueError, match="top_k"):
        recall(q, k, draw_rotations(1, 16, 1, gen), 1, 64, top_k=0)


def test_recall_grows_as_buckets_get_fewer_on_a_planted_case(seed):
    """Each query's heaviest key is planted at 40 degrees from it, somewhere earlier; with a window as long as
    the sequence a query sees exactly the earlier keys of its bucket, so it finds its planted key when the two
    hash together, which fewer (coarser) buckets make likelier."""
    gen = torch.Generator().manual_seed(seed)
    s, d = 256, 32
    q = torch.nn.functional.normalize(torch.randn(1, 4, s, d, generator=gen, dtype=torch.float64), dim=-1)
    k = torch.nn.functional.normalize(torch.randn(1, 4, s, d, generator=gen, dtype=torch.float64), dim=-1)
    ortho = torch.nn.functional.normalize(torch.randn(1, 4, s, d, generator=gen, dtype=torch.float64), dim=-1)
    ortho = torch.nn.functional.normalize(ortho - (ortho * q).sum(-1, keepdim=True) * q, dim=-1)
    angle = torch.tensor(40.0).deg2rad()
    planted = torch.cos(angle) * q + torch.sin(angle) * ortho
    src = torch.arange(1, s)
    dst = (torch.rand(s - 1, generator=gen) * src).long()  # an earlier position for each query but the first
    k[:, :, dst] = planted[:, :, src]
    q, k = 8 * q, 8 * k
    recalls = [recall(q, k, draw_rotations(1, d, nb, gen), nb, s, causal=True, rule="window", top_k=1).top_k_recall
               for nb in (2, 8, 32)]
    assert recalls[0] > recalls[1] + 0.1 and recalls[1] > recalls[2] + 0.02, recalls  # 40 seeds: >= 0.26, 0.077


@pytest.mark.parametrize(("causal", "rule"), [(False, "chunk"), (True, "window")])
def test_recall_a_few_rows_at_a_time_equals_recall_at_once(seed, causal, rule):
    gen = torch.Generator().manual_seed(seed)
    q, k = torch.randn(2, 2, 45, 16, generator=gen), torch.randn(2, 2, 45, 16, generator=gen)
    rot = draw_rotations(2, 16, 4, gen)
    whole = recall(q, k, rot, 4, 6, causal, rule, top_k=5)
    stepped = recall(q, k, rot, 4, 6, causal, rule, top_k=5, rows_per_step=7)
    assert whole.keys_scored == stepped.keys_scored and whole.keys_seen == pytest.approx(stepped.keys_seen)
    assert stepped.top_k_recall == pytest.approx(whole.top_k_recall)
    assert stepped.mass_kept == pytest.approx(whole.mass_kept)


def test_clustered_qk_gives_each_query_keys_to_attend_to(seed):
    """Seeded like every input; full attention puts far more weight on a query's 8 heaviest keys than on
    random normal q/k, whose softmax is nearly flat."""
    shape = (1, 2, 256, 32)
    q, k = clustered_qk(shape, torch.bfloat16, torch.Generator().manual_seed(seed), "cpu")
    again = clustered_qk(shape, torch.bfloat16, torch.Generator().manual_seed(seed), "cpu")
    assert q.dtype == k.dtype == torch.bfloat16 and q.shape == k.shape == shape
    assert torch.equal(q, again[0]) and torch.equal(k, again[1])

    def top8_mass(q: torch.Tensor, k: torch.Tensor) -> float:
        probs = torch.softmax(q.double() @ k.double().transpose(-2, -1) / 32**0.5, dim=-1)
        return float(probs.topk(8, dim=-1).values.sum(-1).mean())

    gen = torch.Generator().manual_seed(seed)
    flat = top8_mass(torch.randn(shape, generator=gen), torch.randn(shape, generator=gen))
    assert top8_mass(q, k) > 1.7 * flat  # about 0.40 vs 0.19


# -- peers ----------------------------------------------------------------------------------------------------


def test_peers(seed):
    """SDPA with the bucket mask computes the reference's math; the full-attention peers compute full attention."""
    gen = torch.Generator().manual_seed(seed)
    q, k, v, _ = _qkv(gen, 45, 45, 32, torch.float32)
    for causal, rule in ((False, "chunk"), (True, "window")):
        args = _args(gen, 32, 4, 2, 6, causal, rule)
        ref = lsh_attention_reference(q.double(), k.double(), v.double(), **args)
        assert _rel(sdpa_masked(q, k, v, **args), ref) < 1e-5
        full = full_attention(q.double(), k.double(), v.double(), causal)
        assert _rel(sdpa_full(q, k, v, **args), full) < 1e-5
        assert _rel(flash_full(q, k, v, **args), full) < 1e-5


# -- the plugin -----------------------------------------------------------------------------------------------


def _case(**over) -> Case:
    params = {"batch": 1, "heads": 2, "seq": 100, "head_dim": 64, "n_buckets": 4, "n_hashes": 2, "chunk": 14,
              "rule": "chunk", "causal": False, "data": "random", "dtype": "fp32"}
    params.update(over)
    return Case.of(**params)


def test_the_configs_load_on_every_device():
    from microscope.commands import load_checked

    root = Path(__file__).resolve().parents[2] / "ablations"
    for device in ("cpu", "cuda"):
        for quick in (False, True):
            load_checked(root / "lsh_attention_model.yaml", device, quick)
            for profile in (None, "bench", "recall"):
                config, _ = load_checked(root / "lsh_attention.yaml", device, quick,
                                         {"profile": profile} if profile else None)
                assert config.variants == (("triton", "sdpa_full") if profile == "recall" else ())


def test_one_run_records_recall_figures_and_times_full_attention(run_room):
    """The figures of a run are recall.py's on the case's own inputs (the harness's seeded draw), the same
    for every variant computing the bucketed attention and 1 for full attention, which runs as speed-only
    peers beside the accuracy-checked kernel."""
    from microscope.seeding import generator

    run = run_room("lsh_attention", {"cases": {"causal": [True], "dtype": ["fp32"]}})
    run.check_speed_only("sdpa_full", "flash_full")
    acc = run.find(variant="triton", dimension="accuracy")
    assert acc and all(r.status == "ok" and r.passed for r in acc)
    figs = run.find(dimension="figures")
    assert {r.variant for r in figs} == {"eager", "triton", "sdpa_masked", "sdpa_full", "flash_full"}
    got = {(r.variant, r.metric): r.value for r in figs}
    case = Case.of(**figs[0].case)
    inputs = LSHAttentionAblation().inputs(case, generator(figs[0].seed), "cpu")
    want = recall(inputs["q"], inputs["k"], inputs["rotations"], 4, 16, causal=True, top_k=8)
    seen = visible_mask(LSHSpec(4, 16, True), key_intervals(LSHSpec(4, 16, True), inputs["q"], inputs["k"],
                                                           inputs["rotations"]))
    for name in ("eager", "triton", "sdpa_masked"):
        assert got[name, "top8_recall"] == pytest.approx(want.top_k_recall)
        assert got[name, "mass_kept"] == pytest.approx(want.mass_kept)
        assert got[name, "keys_seen"] == pytest.approx(float(seen.sum()) / (2 * 100))
    assert 0 < want.top_k_recall < 1
    for name in ("sdpa_full", "flash_full"):
        assert got[name, "top8_recall"] == got[name, "mass_kept"] == 1.0
        assert got[name, "keys_seen"] == pytest.approx(sum(range(1, 101)) / 100)  # causal: query i sees i + 1
    assert f"sdpa_full: top8_recall 1 vs eager {want.top_k_recall:.3g}" in " ".join(run.headlines)


def test_the_recall_profile_sweeps_buckets_on_clustered_inputs_without_running_a_variant(run_room):
    grid = {"batch": [1], "heads": [4], "seq": [1024], "head_dim": [64], "n_buckets": [2, 16], "n_hashes": [2],
            "chunk": [64], "rule": ["chunk"], "causal": [False], "data": ["clustered"], "dtype": ["fp32"]}
    run = run_room("lsh_attention", {"cases": grid}, profile="recall")  # two of the profile's cases
    assert {r.dimension for r in run.records} == {"figures"}
    recalls = {r.case["n_buckets"]: r.value for r in run.find(variant="triton", metric="top8_recall")}
    assert {r.case["data"] for r in run.records} == {"clustered"} and set(recalls) == {2, 16}
    assert recalls[16] > recalls[2] + 0.2  # 0.64 vs 0.27 at this seed (README's recall table)


def test_inputs_reject_bad_case_values_with_a_clear_message():
    plugin = LSHAttentionAblation()
    for over, message in (({"n_buckets": 3}, "n_buckets must be 1 or even"), ({"chunk": 0}, "chunk must be"),
                          ({"rule": "lsh"}, "rule must be one of"), ({"seq": 0}, "seq must be a positive"),
                          ({"n_hashes": 0}, "n_hashes must be a positive"),
                          ({"rule": "window", "causal": False}, "window rule is causal"),
                          ({"data": "trained"}, "data must be one of")):
        with pytest.raises(ValueError, match=message):
            plugin.inputs(_case(**over), torch.Generator().manual_seed(0), "cpu")


def test_flops_count_the_scored_pairs():
    """Non-causal chunk rule: a query in chunk c scores keys of chunks c-1 and c, whatever the data."""
    plugin = LSHAttentionAblation()
    s, m = 100, 14
    per_round = sum(min(s, (i // m + 1) * m) - max(0, (i // m - 1) * m) for i in range(s))
    assert plugin.flops(_case()) == 4 * 2 * 64 * 2 * per_round
    assert plugin.flops(_case(), backward=True) == 3.5 * plugin.flops(_case())
    inputs = plugin.inputs(_case(), torch.Generator().manual_seed(1), "cpu")
    spec = LSHSpec(4, 14, False, "chunk")
    assert scored_pairs(key_intervals(spec, inputs["q"], inputs["k"], inputs["rotations"])) == 2 * 2 * per_round


def test_chunked_ground_truth_equals_the_baseline(seed, monkeypatch):
    import microscope_kernels.attention_inputs as shared

    plugin = LSHAttentionAblation()
    inputs = plugin.inputs(_case(causal=True), torch.Generator().manual_seed(seed), "cpu")
    x64 = {n: t.double() if isinstance(t, torch.Tensor) and t.is_floating_point() else t for n, t in inputs.items()}
    monkeypatch.setattr(shared, "TRUTH_SCORES", 2 * 100 * 7)  # 7 rows a step: 15 steps, the last short
    torch.testing.assert_close(plugin.reference(x64), lsh_attention_reference(**x64), rtol=1e-12, atol=1e-14)


# -- model level ----------------------------------------------------------------------------------------------


def test_the_lsh_arm_swaps_every_block():
    model = build_model(ModelConfig(n_layers=3, d_model=64, n_heads=2, context=32))
    use_lsh_attention(model)
    fns = [b.attn.attn_fn for b in model.blocks]
    assert all(isinstance(f, LSHAttention) for f in fns) and fns[0].window == window_for(32, 8) == 4
    assert fns[0].rotations.shape == (2, 32, 4) and not torch.equal(fns[0].rotations, fns[1].rotations)
    with pytest.raises(ValueError, match="head dims"):
        use_lsh_attention(build_model(ModelConfig(n_layers=1, d_model=96, n_heads=2, context=16)))
    assert isinstance(build_model(ModelConfig(n_layers=1, d_model=64, n_heads=2, context=16)).blocks[0].attn.attn_fn,
                      EagerAttention)


def test_model_with_lsh_is_causal_safe_and_decodes_like_its_prefill(seed):
    """The harness's future-leak probe reads exactly 0 (bitwise); one bucket and a window spanning the
    sequence is the model's own full causal attention; a decode step through the KV cache equals the
    prefill's last row."""
    model = build_model(ModelConfig(n_layers=1, d_model=64, n_heads=2, context=32), seed=seed % 1000, device=DEVICE)
    use_lsh_attention(model, n_buckets=4, n_hashes=2)
    assert future_leak(model, seq_len=32, seed=seed % 1000) == 0.0
    tokens = torch.randint(0, 256, (2, 20), generator=torch.Generator().manual_seed(seed)).to(DEVICE)
    with torch.no_grad():
        lsh = model(tokens)
        _, cache = model.prefill(tokens[:, :-1])
        torch.testing.assert_close(model.decode_step(tokens[:, -1], cache), lsh[:, -1], rtol=1e-4, atol=1e-4)
        full = build_model(ModelConfig(n_layers=1, d_model=64, n_heads=2, context=32), seed=seed % 1000,
                           device=DEVICE)
        ref = full(tokens)
        use_lsh_attention(full, n_buckets=1, n_hashes=1, window=20)
        torch.testing.assert_close(full(tokens), ref, rtol=1e-4, atol=1e-4)


def test_the_eager_arm_computes_the_kernel_arms_function(seed):
    """lsh_eager (the CPU-trainable arm) gives the lsh arm's logits and gradients."""
    assert_eager_arm_matches(use_lsh_attention, functools.partial(use_lsh_attention, eager=True), seed, context=32,
                             tokens=31)


@pytest.mark.gpu
@pytest.mark.parametrize("causal", [False, True])
def test_precompile_builds_the_kernels_a_longer_call_of_the_case_runs(causal, seed):
    """The plugin's precompile runs the kernels once on a short sequence; a call at the case's own length
    then builds nothing (their integer arguments are not specialized, so the binaries are shared)."""
    from triton_builds import triton_builds

    plugin = LSHAttentionAblation()
    case = Case.of(batch=2, heads=4, seq=2048, head_dim=64, n_buckets=16, n_hashes=2, chunk=128, rule="chunk",
                   causal=causal, data="random", dtype="bf16")
    plugin.precompile(case, "cuda", (3, 4), True)
    inputs = plugin.inputs(case, torch.Generator().manual_seed(seed), "cuda")
    with triton_builds() as builds:
        out = call_as_timed(lsh_attention, inputs, ("q", "k", "v"))
        torch.cuda.synchronize()
    assert builds == []
    assert torch.isfinite(out).all()


def test_a_short_warm_call_runs_the_case_cut_to_one_head_and_the_given_length_and_failures_are_raised(monkeypatch):
    """``attention_inputs.warm_short_call`` (the LSH and linear rooms' precompile): one call with its backward
    on batch 1, head 1 and the given length, the case's other parameters kept; ``require_compiled`` names the
    first candidate that did not compile."""
    from microscope_kernels.attention_inputs import require_compiled, warm_short_call

    seen = []

    def recording(q, k, v, **kw):
        seen.append((tuple(q.shape), q.requires_grad, kw["chunk"]))
        return lsh_attention(q, k, v, **kw)

    monkeypatch.setattr(torch.cuda, "synchronize", lambda *a, **kw: None)
    case = Case.of(batch=2, heads=4, seq=2048, head_dim=64, n_buckets=16, n_hashes=2, chunk=128, rule="chunk",
                   causal=True, data="random", dtype="fp32")
    warm_short_call(LSHAttentionAblation(), case, recording, 512, "cpu", True)
    assert seen == [((1, 1, 512, 64), True, 128)]
    require_compiled([])
    with pytest.raises(RuntimeError, match="2 candidate\\(s\\) did not compile, first k BLOCK_M: 64: ptxas"):
        require_compiled([("k", "BLOCK_M: 64", "ptxas"), ("k", "BLOCK_M: 128", "ptxas")])
