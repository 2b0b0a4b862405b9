"""Sequential seeds: add training runs until the model-level verdicts are decided, with the error rate held.

A model-level claim rests on seeds, and the number needed depends on the effect: a large change is
clear after 3 seeds, a small one may need 8. Running the maximum every time wastes the budget; peeking
after every seed and stopping at the first p < alpha inflates the false-positive rate. The rule here is
the simplest one with a guarantee: with ``seeds`` to start and at most ``max_seeds``, there are
``looks = max_seeds - seeds + 1`` analyses, each at level ``alpha / looks`` (Bonferroni over the looks),
so the probability of any false call over the whole sequence stays at or below ``alpha``. Each look
computes the ordinary comparison table at that level; the run stops when no tested model-level row is
"inconclusive", or when the budget is spent. The table a run reports uses the same per-look level, so
its CIs are the ones the stopping rule used, and each row notes the seeds it needed.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import pandas as pd

__all__ = ["SEQUENTIAL_FILE", "SequentialPlan", "undecided"]

SEQUENTIAL_FILE = "sequential.json"
#: The dimensions whose tests decide when a sequential run may stop.
DECIDING = ("accuracy", "stability", "generalization")


@dataclass
class SequentialPlan:
    """The looks of one run and what each decided; saved as ``sequential.json`` next to the records."""

    alpha: float
    seeds: int
    max_seeds: int
    seeds_run: int = 0
    #: row key "metric|candidate" -> seeds at the look that first decided it
    decided_at: dict[str, int] = field(default_factory=dict)

    @property
    def looks(self) -> int:
        return self.max_seeds - self.seeds + 1

    @property
    def alpha_per_look(self) -> float:
        return self.alpha / self.looks

    def look(self, table: pd.DataFrame, seeds_run: int) -> bool:
        """Record what the table at ``seeds_run`` seeds decides; True when nothing is left undecided."""
        self.seeds_run = seeds_run
        rows = _tested(table)
        for _, row in rows[rows["verdict"] != "inconclusive"].iterrows():
            self.decided_at.setdefault(_key(row), seeds_run)
        return undecided(table) == 0

    def note(self, row: pd.Series) -> str | None:
        """"decided at 5 seeds (sequential, alpha 0.0125 per look)" for a tested row, else None."""
        key = _key(row)
        if key in self.decided_at:
            return f"decided at {self.decided_at[key]} seeds (sequential: alpha {self.alpha_per_look:.3g} per look)"
        tested = {_key(r) for _, r in _tested(pd.DataFrame([row])).iterrows()}
        if row.get("verdict") == "inconclusive" and key in tested:
            return f"undecided after {self.seeds_run} seeds, the budget (max_seeds {self.max_seeds})"
        return None

    def save(self, folder: Path) -> None:
        (Path(folder) / SEQUENTIAL_FILE).write_text(json.dumps(asdict(self), indent=1), encoding="utf-8")

    @classmethod
    def load(cls, folder: Path) -> SequentialPlan | None:
        path = Path(folder) / SEQUENTIAL_FILE
        if not path.is_file():
            return None
        try:
            return cls(**json.loads(path.read_text(encoding="utf-8")))
        except (OSError, ValueError, TypeError):
            return None


def _key(row: pd.Series) -> str:
    return f"{row['metric']}|{row['candidate']}"


def _tested(table: pd.DataFrame) -> pd.DataFrame:
    if not len(table):
        return table
    p = pd.to_numeric(table["p"], errors="coerce")
    return table[(table["role"] == "candidate") & table["dimension"].isin(DECIDING) & p.notna()]


def undecided(table: pd.DataFrame) -> int:
    """How many tested model-level candidate rows are still "inconclusive"."""
    rows = _tested(table)
    return int((rows["verdict"] == "inconclusive").sum())
