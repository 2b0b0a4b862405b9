"""``fastest_path``: which whole call a shape keeps, from interleaved timing rounds (the timer is a stand-in
that replays given times, since the choice, not the GPU, is under test here)."""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable

import pytest
from microscope_kernels import path_choice


def _replay(monkeypatch, times: dict[str, Iterable[float]]) -> list[str]:
    """Make each ``do_bench`` call of path ``name`` return its next time from ``times``; the order timed."""
    order: list[str] = []
    rounds = {name: iter(ms) for name, ms in times.items()}

    def do_bench(call, warmup, rep):
        name = call()
        order.append(name)
        return next(rounds[name])

    monkeypatch.setattr(path_choice.triton.testing, "do_bench", do_bench)
    return order


def test_a_path_slow_only_in_its_first_round_is_still_kept_and_rounds_are_interleaved(monkeypatch):
    order = _replay(monkeypatch, {"a": [0.095, 0.058, 0.059], "b": [0.079, 0.078, 0.080]})
    chosen: dict = {}
    paths = {"a": lambda: "a", "b": lambda: "b"}
    assert path_choice.fastest_path(chosen, "key", paths, "kernel") == "a"
    assert order == ["a", "b"] * path_choice.ROUNDS
    assert chosen == {"key": "a"}
    # later calls with the key only look it up: nothing more is timed
    assert path_choice.fastest_path(chosen, "key", paths, "kernel") == "a" and len(order) == 2 * path_choice.ROUNDS


def test_a_failing_alternative_is_left_out_with_a_warning_and_the_first_path_s_failure_is_raised(monkeypatch):
    _replay(monkeypatch, {"a": itertools.repeat(0.05), "c": itertools.repeat(0.01)})

    def broken():
        raise RuntimeError("out of resources")

    with pytest.warns(UserWarning, match="the b path failed on this GPU and is left out: out of resources"):
        assert path_choice.fastest_path({}, 1, {"a": lambda: "a", "b": broken, "c": lambda: "c"}, "kernel") == "c"
    with warnings.catch_warnings(), pytest.raises(RuntimeError, match="out of resources"):
        warnings.simplefilter("error")
        path_choice.fastest_path({}, 2, {"b": broken, "a": lambda: "a"}, "kernel")
