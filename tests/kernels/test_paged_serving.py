"""The serving simulation behind the paged cache's success-rate figures: its policy, step by step."""

from __future__ import annotations

import pytest
from microscope_kernels.paged_attention.ablation import PagedAttention
from microscope_kernels.paged_attention.serving import Request, chat_and_documents, serve

from microscope.api import Case


def test_a_contiguous_cache_decodes_at_most_its_slots_and_a_paged_one_more_for_short_requests():
    stream = [Request(0, 4, 8) for _ in range(12)]  # 12 tokens each, all at once
    contiguous = serve(stream, budget_tokens=4 * 64, max_len=64, deadline=1000)
    paged = serve(stream, budget_tokens=4 * 64, max_len=64, deadline=1000, block_size=16)
    assert contiguous.peak_running == 4 and paged.peak_running == 12
    assert contiguous.success == paged.success == 1.0
    assert contiguous.steps == 3 * 8 and paged.steps == 8  # three waves of 8 decode steps, or one


def test_the_deadline_drops_what_waits_or_runs_too_long():
    stream = [Request(0, 4, 8), Request(0, 4, 8), Request(0, 4, 30)]
    got = serve(stream, budget_tokens=64, max_len=64, deadline=12)  # one slot: the second waits 8 steps
    assert (got.succeeded, got.requests) == (1, 3)  # the second ends at step 16 > 12; the third never starts
    roomy = serve(stream, budget_tokens=3 * 64, max_len=64, deadline=12)
    assert roomy.succeeded == 2  # the third needs 30 steps


def test_a_full_pool_preempts_the_newest_request_which_recomputes_and_finishes():
    stream = [Request(0, 16, 24, long=True), Request(0, 16, 24)]  # 40 tokens each: both do not fit in 64
    got = serve(stream, budget_tokens=64, max_len=64, deadline=1000, block_size=16)
    assert got.preemptions >= 1 and got.succeeded == 2 and got.long_success == 1.0
    assert got.peak_running == 2  # both ran together until the pool ran out


def test_admission_is_first_come_first_served():
    """A head that does not fit blocks the short request behind it, which would fit (no skipping ahead)."""
    first, big, small = Request(0, 40, 12), Request(1, 48, 8), Request(1, 4, 4)
    blocked = serve([first, big, small], budget_tokens=64, max_len=64, deadline=12, block_size=16)
    assert blocked.succeeded == 1  # small waits behind big until first finishes, then misses its deadline
    alone = serve([first, small], budget_tokens=64, max_len=64, deadline=12, block_size=16)
    assert alone.succeeded == 2 and alone.peak_running == 2  # without big ahead of it, small runs beside first


def test_the_stream_is_seeded_in_range_and_loaded_as_asked():
    a = chat_and_documents(20_000, 8192, seed=3, long_share=0.25, load=2.0, slots=16)
    assert a == chat_and_documents(20_000, 8192, seed=3, long_share=0.25, load=2.0, slots=16)
    assert a != chat_and_documents(20_000, 8192, seed=4, long_share=0.25, load=2.0, slots=16)
    assert all(1 <= r.tokens <= 8192 for r in a) and [r.arrival for r in a] == sorted(r.arrival for r in a)
    assert a[-1].arrival < 20_000 <= a[-1].arrival + 200  # arrivals fill the duration
    longs = [r for r in a if r.long]
    assert 0.2 < len(longs) / len(a) < 0.3 and all(r.prompt >= 6144 for r in longs)
    generated_per_step = sum(r.output for r in a) / 20_000
    assert generated_per_step == pytest.approx(2.0 * 16, rel=0.1)  # twice what 16 slots generate per step


def test_bad_arguments_are_refused_with_what_was_given():
    with pytest.raises(ValueError, match="exceeds max_len=64"):
        serve([Request(0, 60, 8)], 128, 64, 10)
    with pytest.raises(ValueError, match="deadline >= 1"):
        serve([], 128, 64, 0)
    with pytest.raises(ValueError, match="0 <= long_share <= 1"):
        chat_and_documents(100, 8192, 0, long_share=1.5)


def test_serve_cases_carry_success_figures_paged_at_least_contiguous_under_load():
    plugin = PagedAttention()
    case = Case.of(batch=4, heads=1, tokens=512, head_dim=16, block=16, lengths="mixed", mode="serve", dtype="fp32")
    figs = plugin.figures(case, {}, "cpu")
    paged, contiguous = figs["triton_paged"], figs["eager"]
    for load in ("1", "2", "4", "8"):
        for key in (f"served.load{load}", f"served_long.load{load}"):
            assert 0 <= contiguous[key].value <= 1 and 0 <= paged[key].value <= 1
    assert paged["served.load4"].value > contiguous["served.load4"].value
    assert contiguous["served.load4"].value < 1  # four times what the slots serve: the queue times out
    decode = plugin.figures(Case.of(**{**dict(case.items), "mode": "decode"}), {}, "cpu")
    assert not any(k.startswith("served") for k in decode["eager"])  # decode cases: capacity only
