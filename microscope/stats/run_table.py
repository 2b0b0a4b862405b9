"""The comparison table of one saved run: the one place a run's verdicts are computed and saved.

``microscope run``, ``microscope report`` (for a run stopped before its statistics), resume and the
history all call ``save_run_table``, so a run's verdicts never depend on which command computed them.
A sequential model-level run (``stats.sequential``) is judged at its per-look level, and each tested row
says how many seeds it needed.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from microscope.store.records import records_frame

from .sequential import SequentialPlan
from .table import compare_records, save_table

__all__ = ["save_run_table"]


def save_run_table(folder: Path, alpha: float = 0.05, min_band: float = 0.01,
                   contrasts: Sequence[tuple[str, str]] = ()) -> pd.DataFrame:
    """Compute the run's comparison table from its records, save it next to them, and return it;
    ``contrasts`` are the config's ``stats.contrasts`` pairs."""
    plan = SequentialPlan.load(folder)
    level = plan.alpha_per_look if plan is not None else alpha
    table = compare_records(records_frame(folder), alpha=level, min_band=min_band, contrasts=contrasts)
    if plan is not None and len(table):
        notes = [plan.note(row) for _, row in table.iterrows()]
        table["notes"] = [f"{old}; {new}" if new and old else (new or old)
                          for old, new in zip(table["notes"], notes)]
    save_table(table, folder)
    return table
