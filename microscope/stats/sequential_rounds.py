"""Sequential rounds: stop timing a case once every candidate's speed verdict is decided, error rate held.

A clear 2x difference is decided after 8 interleaved rounds; a 1% one may need 40. With
``throughput.min_rounds`` set, the runner looks at the comparisons after ``min_rounds`` rounds, then
every ``look_every`` rounds, and always at ``rounds`` (the budget). Peeking at every look and stopping
at the first p < alpha would inflate the false-positive rate, so each of the ``K`` looks tests at level
``alpha / K`` (Bonferroni over the looks; the same rule as sequential seeds, ``stats.sequential``):
the probability that any look of a comparison calls a difference that is not there stays at or below
``alpha``, and the same holds for a false "equivalent" (its two one-sided tests also run at
``alpha / K``). The comparison table judges a sequential record at that same level and reports its
p-value multiplied by ``K``, so the Holm step across a case's candidates stays valid.

A look stops the rounds when every candidate is decided (faster, slower or equivalent) against the
baseline and against the fastest peer so far: the rows a verdict, the gate and the best-peer headline
read. The table then applies Holm over the run's ``family`` of gating tests (one per candidate and
case), so a look decides at ``alpha / (K * family)``: a comparison stopped as decided stays significant
after that correction. Wilcoxon's smallest two-sided p with ``n`` rounds is ``2 / 2**n``, so the first
look is moved to the round where its level can be reached (``first_decisive_round``): 10 rounds for 2
looks over 8 cases at 0.05.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from .latency import compare_latency

__all__ = ["RoundLooks", "first_decisive_round"]

DECIDED = ("faster", "slower", "equivalent")


def first_decisive_round(level: float) -> int:
    """The fewest paired rounds at which a two-sided Wilcoxon signed-rank test can reach ``p < level``."""
    return max(2, math.floor(math.log2(2.0 / level)) + 1)


@dataclass(frozen=True)
class RoundLooks:
    """Where a case's interleaved rounds may stop, and the rule that stops them."""

    min_rounds: int
    rounds: int
    look_every: int
    alpha: float = 0.05
    min_band: float = 0.01
    #: Gating tests the table corrects together (Holm): the run's candidates times its cases.
    family: int = 1

    def __post_init__(self) -> None:
        if not 2 <= self.min_rounds <= self.rounds:
            raise ValueError(f"min_rounds ({self.min_rounds}) must be between 2 and rounds ({self.rounds})")
        if self.look_every < 1:
            raise ValueError("look_every must be >= 1")
        if self.family < 1:
            raise ValueError("family must be >= 1")

    @property
    def points(self) -> tuple[int, ...]:
        """Rounds completed at each look: min_rounds, then every look_every, and the budget last.

        The first look moves later where its level ``alpha / (looks * family)`` is out of Wilcoxon's reach
        at ``min_rounds`` (a look that cannot decide only costs alpha); fewer looks never need a later start.
        """
        start = self.min_rounds
        while True:
            pts = (*range(start, self.rounds, self.look_every), self.rounds)
            need = first_decisive_round(self.alpha / (len(pts) * self.family))
            if need <= start or start >= self.rounds:
                return pts
            start = min(need, self.rounds)

    @property
    def looks(self) -> int:
        return len(self.points)

    @property
    def alpha_per_look(self) -> float:
        """The level the table judges one look's record at (its p is reported times ``looks``)."""
        return self.alpha / self.looks

    @property
    def stop_level(self) -> float:
        """The level a look decides at: per look, and per gating test of the run's Holm family."""
        return self.alpha_per_look / self.family

    def decided(self, rounds: Mapping[str, Sequence[float]], baseline: str, candidates: Sequence[str],
                peers: Sequence[str] = ()) -> bool:
        """True when every candidate's verdict against the baseline and the fastest peer is decided.

        ``rounds`` holds each still-timed variant's per-round medians (equal lengths: paired). A
        candidate or peer that dropped out (an error) is not waited for; without a baseline nothing is
        decided, so the budget runs out as before.
        """
        if baseline not in rounds:
            return False
        live_peers = [p for p in peers if p in rounds and rounds[p]]
        others = [baseline]
        if live_peers:
            others.append(min(live_peers, key=lambda p: statistics.median(rounds[p])))
        for cand in (c for c in candidates if c in rounds):
            for other in others:
                res = compare_latency(rounds[other], rounds[cand], alpha=self.stop_level,
                                      min_band=self.min_band, seed=0)
                if res.verdict not in DECIDED:
                    return False
        return True

    def as_details(self, done: int) -> dict[str, float | int | bool]:
        """What a throughput record says about its sequential rounds (``details.sequential``)."""
        return {"looks": self.looks, "alpha_per_look": self.alpha_per_look, "family": self.family,
                "max_rounds": self.rounds, "rounds_run": done, "stopped_early": done < self.rounds}
