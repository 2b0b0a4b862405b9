"""The reports' caveats: what a reader must know before trusting a verdict."""

from __future__ import annotations

from dataclasses import asdict

import numpy as np
import pandas as pd

from microscope.report.caveats import caveats
from microscope.report.load import RunData
from microscope.stats import compare_records
from microscope.store.records import Record


def _trained_arm_records(seeds: int, shift: float, training_noise: float = 0.02) -> list[dict]:
    """val_loss per token for a baseline and a candidate arm that trained its own model each seed: the
    candidate's tokens shifted by ``shift`` plus a training-noise offset per seed (sd ``training_noise``)."""
    rng = np.random.default_rng(3)
    recs = []
    for seed in range(seeds):
        base = rng.gamma(2.0, 1.5, 600)
        for variant, role in (("full", "baseline"), ("window", "candidate")):
            offset = shift + rng.normal(0.0, training_noise) if role == "candidate" else 0.0
            per_token = base + offset + rng.normal(0.0, 0.05, 600)
            recs.append(asdict(Record(run_id="run", plugin="swa", variant=variant, role=role, case_id="model", case={},
                                      seed=seed, dimension="accuracy", metric="val_loss",
                                      value=float(per_token.mean()), details={"per_token": per_token.tolist()})))
    return recs


def _warnings(recs: list[dict]) -> list[str]:
    table = compare_records(recs, n_boot=500)
    run = RunData("run", pd.json_normalize(recs, max_level=1), table)
    return [c.text for c in caveats(run) if c.level == "warn"]


def test_a_difference_called_from_one_trained_model_per_arm_is_flagged():
    """No real shift, only one training's offset: the one-seed interval calls it a difference, and the
    caveat says why that verdict is not settled."""
    recs = _trained_arm_records(1, 0.0)
    assert compare_records(recs, n_boot=500).verdict.iloc[0] in ("better", "worse")
    warned = [w for w in _warnings(recs) if "one trained model per arm" in w]
    assert warned == ["1 accuracy verdict(s) (window) rest on one trained model per arm: the intervals cover "
                      "evaluation tokens, not the spread between trainings; workload.seeds >= 3 decides them."]


def test_several_seeds_or_no_difference_raise_no_such_warning():
    assert not [w for w in _warnings(_trained_arm_records(3, 0.05)) if "one trained model" in w]
    assert not [w for w in _warnings(_trained_arm_records(1, 0.0, training_noise=0.0)) if "one trained model" in w]
