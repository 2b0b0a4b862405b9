"""The closing table of a model-level run: per arm, the mean over seeds of the numbers read first.

The operator table (``report.console.summary_table``) is organised around kernel error and latency;
a model run is read differently -- did training stay healthy, where did the losses land, what did
it cost in speed and memory -- so it gets its own table. Verdicts with confidence intervals are the
statistics table's job (printed after this one); this table only summarises.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Iterable

from rich.table import Table

from microscope.report.headline import scaling_efficiency
from microscope.store.records import Record

__all__ = ["model_summary_table"]

_ROLE_ORDER = {"baseline": 0, "candidate": 1, "peer": 2}

#: (column header, metric, format, scale): columns whose metric no record has are left out.
_COLUMNS: tuple[tuple[str, str, str, float], ...] = (
    ("final loss", "final_loss", ".4f", 1.0),
    ("val loss", "val_loss", ".4f", 1.0),
    ("token acc", "val_token_acc", ".3f", 1.0),
    ("OOD loss", "ood_loss", ".4f", 1.0),
    ("4x-ctx loss", "val_loss_4x", ".4f", 1.0),
    ("recall acc", "recall_acc", ".3f", 1.0),
    ("recall acc 4x", "recall_acc_4x", ".3f", 1.0),
    ("steps to base", "steps_to_baseline_loss", ".1f", 1.0),
    ("train tok/s", "train_tokens_per_s", ",.0f", 1.0),
    ("saved act MiB", "saved_activation_bytes", ".2f", 2.0**-20),
    ("train peak MiB", "train_step_peak_bytes", ".2f", 2.0**-20),
    ("weights MiB", "weight_bytes", ".2f", 2.0**-20),
    ("greedy agree", "greedy_agreement", ".3f", 1.0),
    ("spikes", "loss_spikes", ".1f", 1.0),
    ("NaN/Inf steps", "nonfinite_steps", ".1f", 1.0),
)


def model_summary_table(records: Iterable[Record], title: str = "") -> Table:
    """One row per arm: seeds that trained, then the seed means of the summary metrics, then problems.

    Where arms train on several ranks and the baseline on one process, a "scaling eff." column gives each
    distributed arm's ``scaling_efficiency`` against the baseline (seed means of train tokens/s)."""
    values: dict[str, dict[str, list[float]]] = defaultdict(lambda: defaultdict(list))
    roles: dict[str, str] = {}
    seeds: dict[str, set[int]] = defaultdict(set)
    problems: dict[str, list[str]] = defaultdict(list)
    ranks: dict[str, int] = {}
    for r in records:
        roles.setdefault(r.variant, r.role)
        if isinstance(r.details, dict) and isinstance(r.details.get("ranks"), int):
            ranks[r.variant] = r.details["ranks"]
        if r.status == "ok" and r.value is not None:
            values[r.variant][r.metric].append(r.value)
            if r.metric == "final_loss":
                seeds[r.variant].add(r.seed)
            if r.passed is False and r.reason and r.reason not in problems[r.variant]:
                problems[r.variant].append(r.reason)
        elif r.status != "ok":
            line = f"{r.status}: {r.reason}"
            if line not in problems[r.variant]:
                problems[r.variant].append(line)
    present = {m for arm in values.values() for m in arm}
    columns = [c for c in _COLUMNS if c[1] in present]
    table = Table(title=title, header_style="bold")
    table.add_column("arm")
    table.add_column("role")
    table.add_column("seeds", justify="right")
    for header, *_ in columns:
        table.add_column(header, justify="right")
    base = next((a for a in roles if roles[a] == "baseline"), None)
    single = (statistics.fmean(values[base]["train_tokens_per_s"])
              if base and base not in ranks and values[base].get("train_tokens_per_s") else None)
    efficiency = single is not None and any(n > 1 for n in ranks.values())
    if efficiency:
        table.add_column("scaling eff.", justify="right")
    table.add_column("notes", overflow="fold")
    for arm in sorted(roles, key=lambda a: _ROLE_ORDER.get(roles[a], 3)):
        cells = []
        for _, metric, spec, scale in columns:
            got = values[arm].get(metric)
            cells.append(format(statistics.fmean(got) * scale, spec) if got else "-")
        if efficiency:
            speed = values[arm].get("train_tokens_per_s")
            speedup = statistics.fmean(speed) / single
            cells.append(f"{scaling_efficiency(speedup, ranks[arm]):.0%} ({ranks[arm]} ranks)"
                         if speed and ranks.get(arm, 1) > 1 else "-")
        notes = "; ".join(problems[arm])
        table.add_row(arm, roles[arm], str(len(seeds[arm])), *cells, notes[:240])
    return table
