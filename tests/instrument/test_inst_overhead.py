"""The overhead measurement: hooks exist only during the hooked phase, and the numbers are sane."""

import math

from toy_stack import make_model

from microscope.instrument import count_hooks, measure_overhead


def test_measure_overhead_leaves_no_hooks(x):
    model = make_model()
    result = measure_overhead(model, lambda m: m(x).square().mean(), steps=1, rounds=2)
    n_modules = len(list(model.modules()))
    assert result.hooks_registered == 2 * n_modules  # a forward and a backward hook on every module
    assert result.hooks_after == 0 == count_hooks(model)
    for value in (result.none_ms, result.hooked_ms, result.after_ms, result.ratio, result.after_ratio):
        assert math.isfinite(value) and value > 0
    assert set(result.to_dict()) >= {"ratio", "after_ratio", "none_ms", "hooked_ms", "after_ms"}


def test_forward_only_registers_forward_hooks_only(x):
    model = make_model()
    result = measure_overhead(model, lambda m: m(x).sum(), backward=False, keep="stats", steps=1, rounds=1)
    assert result.hooks_registered == len(list(model.modules()))
    assert not result.backward and result.hooks_after == 0
