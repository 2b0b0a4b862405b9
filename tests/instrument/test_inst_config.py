"""InstrumentConfig: cheap defaults, validation, and YAML-friendliness through microscope.config."""

import dataclasses

import pytest

from microscope.instrument import InstrumentConfig, ProfileConfig
from microscope.instrument.config import DEFAULT_HISTOGRAM_BINS


def test_defaults_switch_everything_off():
    cfg = InstrumentConfig()
    assert not cfg.enabled
    assert (cfg.hooks, cfg.profile.enabled, cfg.tensorboard, cfg.graph_diff, cfg.model_histogram_bins) == (
        False, False, False, False, 0)
    assert InstrumentConfig(graph_diff=True).enabled
    assert InstrumentConfig(profile=ProfileConfig(enabled=True)).enabled


def test_tensorboard_brings_graphs_and_histograms_unless_told_otherwise():
    tb = InstrumentConfig(tensorboard=True)
    assert tb.dataflow and tb.model_histogram_bins == DEFAULT_HISTOGRAM_BINS
    assert InstrumentConfig(tensorboard=True, histograms=0).model_histogram_bins == 0
    assert InstrumentConfig(histograms=8).model_histogram_bins == 8
    assert InstrumentConfig(graph_diff=True).dataflow and not InstrumentConfig(hooks=True).dataflow


@pytest.mark.parametrize(
    ("factory", "message"),
    [
        (lambda: ProfileConfig(active=0), "active"),
        (lambda: ProfileConfig(wait=-1), "wait"),
        (lambda: InstrumentConfig(divergence_threshold=0.0), "divergence_threshold"),
        (lambda: InstrumentConfig(histograms=-3), "histograms"),
    ],
)
def test_invalid_values_are_refused(factory, message):
    with pytest.raises(ValueError, match=message):
        factory()


def test_profile_steps_is_the_schedule_length():
    assert ProfileConfig(wait=2, warmup=1, active=4).steps == 7


def test_frozen():
    with pytest.raises(dataclasses.FrozenInstanceError):
        InstrumentConfig().hooks = True  # type: ignore[misc]


def test_builds_from_a_yaml_mapping_with_the_config_validator():
    """The switches use only types microscope.config validates, so a YAML section maps onto them."""
    from microscope.config import _build

    problems: list[str] = []
    data = {"hooks": True, "divergence_threshold": 1e-4, "keep": "full",
            "profile": {"enabled": True, "active": 5}, "graph_diff": True}
    cfg = _build(InstrumentConfig, data, "instrument", "run.yaml", {}, problems)
    assert problems == []
    assert cfg == InstrumentConfig(hooks=True, divergence_threshold=1e-4, keep="full",
                                   profile=ProfileConfig(enabled=True, active=5), graph_diff=True)
    _build(InstrumentConfig, {"hook": True, "keep": "most"}, "instrument", "run.yaml", {}, problems)
    assert any("did you mean 'hooks'" in p for p in problems)
    assert any("'most' is not one of" in p for p in problems)
