"""Diff two profiles: which kernels (GPU) or ops (CPU) a change added, removed or changed.

What is compared, precisely:

* GPU runs: the device kernels (``VariantProfile.kernels``: CUDA kernels, memcpy, memset, by
  readable name), with their call counts and self device time per active step.
* CPU runs: the outermost CPU ops (``VariantProfile.top_level``), with call counts and inclusive CPU
  time per active step -- the ops the variant called, so a fused Function is compared with the
  three ATen ops it replaces, not with the allocation inside it.

A name is *removed* when only the baseline has it, *added* when only the candidate has it,
*count_changed* when both have it with different calls per step, *time_changed* when the counts
match but the time per step moved by more than ``time_rtol`` (default 10%; profiler timings of
single steps are noisy, and the latency verdict -- not the profile -- decides "faster").

Headline, e.g. ``"3 kernels replaced by 1 fused kernel, -41% GPU time"``: the number of distinct
removed and added names (``replaced by`` when both exist, ``fused`` when fewer names came in than
went out), then how many names changed in count, then the change of total time per step (sum of the
compared rows' time, GPU self time or CPU inclusive time of the outermost ops) relative to the baseline.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

from microscope.instrument.profiler import OpStat, VariantProfile

__all__ = ["TraceDiff", "TraceDiffRow", "diff_profiles"]


@dataclass(frozen=True)
class TraceDiffRow:
    """One name in either profile, per active step."""

    name: str
    status: str  # removed | added | count_changed | time_changed | same
    base_calls: float
    cand_calls: float
    base_us: float
    cand_us: float


@dataclass
class TraceDiff:
    baseline: str
    candidate: str
    unit: str  # "kernel" or "op"
    clock: str  # "GPU" or "CPU"
    base_us: float
    cand_us: float
    rows: list[TraceDiffRow] = field(default_factory=list)

    def names(self, status: str) -> list[str]:
        return [r.name for r in self.rows if r.status == status]

    @property
    def removed(self) -> list[str]:
        return self.names("removed")

    @property
    def added(self) -> list[str]:
        return self.names("added")

    @property
    def count_changed(self) -> list[str]:
        return self.names("count_changed")

    @property
    def time_changed(self) -> list[str]:
        return self.names("time_changed")

    @property
    def time_change(self) -> float | None:
        """Relative change of total time per step (candidate / baseline - 1); None without a baseline time."""
        return self.cand_us / self.base_us - 1.0 if self.base_us > 0 else None

    def _n(self, n: int, adjective: str = "") -> str:
        word = self.unit if n == 1 else f"{self.unit}s"
        return f"{n} {adjective}{word}"

    @property
    def headline(self) -> str:
        n_rem, n_add = len(self.removed), len(self.added)
        if n_rem and n_add:
            parts = [f"{self._n(n_rem)} replaced by {self._n(n_add, 'fused ' if n_add < n_rem else '')}"]
        elif n_rem:
            parts = [f"{self._n(n_rem)} removed"]
        elif n_add:
            parts = [f"{self._n(n_add)} added"]
        else:
            parts = [f"same {self._n(sum(1 for r in self.rows))}"]
        if self.count_changed:
            parts.append(f"{len(self.count_changed)} changed in count")
        change = self.time_change
        if change is not None:
            parts.append(f"{change * 100:+.0f}% {self.clock} time")
        return ", ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: ``added``/``removed``/``changed`` are lists of ``{name, ...}`` items (what reports list)."""

        def item(r: TraceDiffRow, **extra: Any) -> dict[str, Any]:
            return {"name": r.name, **extra}

        return {
            "baseline": self.baseline, "candidate": self.candidate, "unit": self.unit, "clock": self.clock,
            "headline": self.headline, "base_us_per_step": self.base_us, "cand_us_per_step": self.cand_us,
            "time_change": self.time_change,
            "removed": [item(r, calls_per_step=r.base_calls, us_per_step=r.base_us)
                        for r in self.rows if r.status == "removed"],
            "added": [item(r, calls_per_step=r.cand_calls, us_per_step=r.cand_us)
                      for r in self.rows if r.status == "added"],
            "changed": [item(r, status=r.status, calls_per_step=f"{r.base_calls:g} -> {r.cand_calls:g}",
                             us_per_step=f"{r.base_us:.1f} -> {r.cand_us:.1f}")
                        for r in self.rows if r.status in ("count_changed", "time_changed")],
            "rows": [asdict(r) for r in self.rows],
        }

    def to_markdown(self) -> str:
        lines = [f"**{self.baseline} -> {self.candidate}**: {self.headline}", "",
                 f"| {self.unit} | status | calls/step | {self.clock} us/step |", "| --- | --- | --- | --- |"]
        for r in self.rows:
            if r.status == "same":
                continue
            lines.append(f"| `{r.name}` | {r.status} | {r.base_calls:g} -> {r.cand_calls:g} | "
                         f"{r.base_us:.1f} -> {r.cand_us:.1f} |")
        return "\n".join(lines)


def _compared(profile: VariantProfile, gpu: bool) -> list[OpStat]:
    return profile.kernels if gpu else profile.top_level


def diff_profiles(base: VariantProfile, cand: VariantProfile, *, time_rtol: float = 0.1) -> TraceDiff:
    """Compare kernels (both runs on a GPU with kernels) or outermost CPU ops (otherwise)."""
    gpu = base.on_gpu and cand.on_gpu
    b = {s.name: s for s in _compared(base, gpu)}
    c = {s.name: s for s in _compared(cand, gpu)}
    b_time = (lambda s: s.self_us) if gpu else (lambda s: s.total_us)
    rows = []
    for name in list(b) + [n for n in c if n not in b]:
        sb, sc = b.get(name), c.get(name)
        bc = sb.count / base.steps if sb else 0.0
        cc = sc.count / cand.steps if sc else 0.0
        bu = b_time(sb) / base.steps if sb else 0.0
        cu = b_time(sc) / cand.steps if sc else 0.0
        if sc is None:
            status = "removed"
        elif sb is None:
            status = "added"
        elif abs(bc - cc) > 1e-9:
            status = "count_changed"
        elif abs(cu - bu) > time_rtol * max(bu, 1e-9):
            status = "time_changed"
        else:
            status = "same"
        rows.append(TraceDiffRow(name, status, bc, cc, bu, cu))
    order = {"removed": 0, "added": 1, "count_changed": 2, "time_changed": 3, "same": 4}
    rows.sort(key=lambda r: (order[r.status], -max(r.base_us, r.cand_us)))
    return TraceDiff(
        baseline=base.name, candidate=cand.name, unit="kernel" if gpu else "op", clock="GPU" if gpu else "CPU",
        base_us=sum(r.base_us for r in rows), cand_us=sum(r.cand_us for r in rows), rows=rows,
    )
