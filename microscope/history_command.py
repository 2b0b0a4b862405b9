"""``microscope history add | show``: put runs into the history, read series and steps out of it.

``add`` stores one run folder (or every run folder under a folder) in the history database. ``show``
prints the selected series as a table (one row per series; one row per run when a single series is
selected), then the steps detected in each series with the commit range that introduced them, and
``--plot`` draws the trends to a PNG or SVG file. Every name printed comes from users (plugins,
variants, cases, branches), so all text goes out as ``rich.text.Text``, never as markup.

Exit codes: 0 done; 2 bad input (a missing, damaged, foreign or newer-schema history file, a results
folder without records, a filter that matches nothing, an unknown machine, a bad date or plot name).
"""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.table import Table
from rich.text import Text

from microscope.env import machine_summary
from microscope.store.history_schema import HistoryError

if TYPE_CHECKING:  # the store and statistics load pandas and scipy: only when a history command runs
    import pandas as pd

    from microscope.stats.steps import Drift, Step
    from microscope.store.history import History
    from microscope.store.run_summary import RunInfo

EXIT_OK, EXIT_BAD_INPUT = 0, 2
DEFAULT_PATH = Path("results") / "history.sqlite"
_DERIVED = ("tflops", "gbps")

__all__ = ["DEFAULT_PATH", "Appended", "add_arguments", "append_run_to_history", "main"]


@dataclass
class Appended:
    """What adding one run did: ``status`` is "added", "unchanged" or "replaced"."""

    info: RunInfo
    status: str
    rows: int
    machine: str
    notes: list[str] = field(default_factory=list)

    def describe(self, db: Path) -> str:
        from microscope.stats.steps import short_commit

        gate = f"; gate {self.info.gate}" if self.info.gate else ""
        what = {"added": "added", "unchanged": "already in", "replaced": "replaced (the run grew) in"}[self.status]
        return (f"{what} {db}: run {self.info.run_id}, commit {short_commit(self.info.commit)}, branch "
                f"{self.info.branch}, machine {self.info.fingerprint} ({self.machine}), {self.rows} measurements"
                f"{gate}")


def append_run_to_history(results_dir: Path | str, db_path: Path | str, branch: str | None = None,
                          passed: bool | None = None, commit: str | None = None) -> Appended:
    """Add one finished run to the history at ``db_path`` (created if missing); ``HistoryError`` if unusable.

    ``passed``: the run's gate outcome (``microscope run --history`` knows it); None: the default gate
    over the run's saved comparison table decides. ``commit`` overrides the commit the run recorded.
    """
    from microscope.store.history import History, default_gate
    from microscope.store.run_summary import summarize_run

    summary = summarize_run(results_dir, branch=branch, commit=commit)
    gate = default_gate(Path(results_dir)) if passed is None else passed
    with History.open(db_path, create=True) as history:
        machines = history.machines()
        status = history.add_summary(summary, passed=gate)
        info = history.run(summary.info.key) or summary.info
    notes = list(summary.notes)
    if machines and info.fingerprint not in machines:
        notes.append(f"first run of machine {info.fingerprint} in this history (it also holds {len(machines)} "
                     "other machine(s)); steps and noise are judged per machine")
    return Appended(info, status, len(summary.rows), machine_summary(info.env), notes)


def add_arguments(sub: argparse._SubParsersAction) -> None:
    """The ``history`` subcommand and its ``add``/``show`` actions (called by ``cli._parser``)."""
    hist = sub.add_parser("history", help="nightly history: add runs, show series and detected steps",
                          description="A history of run-level values per machine (SQLite), with step "
                                      "detection and trend charts.",
                          epilog="exit codes: 0 done; 2 bad input (history file, results folder, filter)")
    actions = hist.add_subparsers(dest="history_command", required=True)
    add = actions.add_parser("add", help="add a run folder (or every run folder under a folder)")
    add.add_argument("results_dir", type=Path, help="e.g. results/20261203-171138-flash_attn")
    add.add_argument("--db", type=Path, default=DEFAULT_PATH, help=f"history file (default {DEFAULT_PATH})")
    add.add_argument("--branch", default=None, help="branch name (default: the one the run recorded)")
    add.add_argument("--commit", default=None,
                     help="commit label (default: the one the run recorded, e.g. <sha>+dirty for a run from an "
                          "uncommitted tree)")
    show = actions.add_parser("show", help="series, latest values and detected steps; --plot draws trends")
    show.add_argument("--db", type=Path, default=DEFAULT_PATH, help=f"history file (default {DEFAULT_PATH})")
    show.add_argument("--plugin", default=None)
    show.add_argument("--variant", default=None)
    show.add_argument("--case", default=None, help="a case id, or part of one")
    show.add_argument("--dimension", default=None, help="accuracy, throughput, memory, stability, ...")
    show.add_argument("--metric", default=None, help="e.g. latency_ms, peak_bytes, out.rel_err")
    show.add_argument("--since", default=None, help="ISO date or time, e.g. 2026-12-01")
    show.add_argument("--branch", default=None)
    show.add_argument("--machine", default=None,
                      help="a machine fingerprint (or its start); 'this' for this machine (default: every machine)")
    show.add_argument("--plot", type=Path, default=None, help="write trend charts to this .png or .svg file")
    show.add_argument("--all-metrics", action="store_true", help="also TFLOP/s and GB/s (they restate latency)")


def main(args: argparse.Namespace, console: Console, err: Console) -> int:
    """Run ``history add`` or ``history show``; a ``HistoryError`` is printed and exits 2."""
    try:
        if args.history_command == "add":
            return _add(args, console)
        return _show(args, console)
    except HistoryError as exc:
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)), highlight=False)
        return EXIT_BAD_INPUT


def _run_folders(path: Path) -> list[Path]:
    if (path / "records.jsonl").is_file() or path.name == "records.jsonl":
        return [path]
    runs = sorted(p for p in path.iterdir() if (p / "records.jsonl").is_file()) if path.is_dir() else []
    if not runs:
        raise HistoryError(f"{path}: neither a run folder (with records.jsonl) nor a folder of run folders")
    return runs


def _add(args: argparse.Namespace, console: Console) -> int:
    for folder in _run_folders(args.results_dir):
        done = append_run_to_history(folder, args.db, branch=args.branch, commit=args.commit)
        console.print(Text(done.describe(args.db)), highlight=False, soft_wrap=True)
        for note in done.notes:
            console.print(Text(f"note: {note}", style="yellow"), highlight=False, soft_wrap=True)
    return EXIT_OK


# -- show ---------------------------------------------------------------------------------------------


def _since(text: str | None) -> str | None:
    if text is None:
        return None
    try:
        when = datetime.fromisoformat(text)
    except ValueError as exc:
        raise HistoryError(f"--since {text!r}: not an ISO date or time (e.g. 2026-12-01 or "
                           "2026-12-01T18:00:00+00:00)") from exc
    if len(text) == 10:
        return when.date().isoformat()
    when = when if when.tzinfo else when.replace(tzinfo=timezone.utc)
    return when.astimezone(timezone.utc).isoformat(timespec="seconds")


def _machine(history: History, wanted: str | None) -> str | None:
    if wanted is None:
        return None
    if wanted == "this":
        from microscope import device as devmod
        from microscope import env as envmod

        device = devmod.resolve("auto")
        wanted = envmod.machine_fingerprint(envmod.capture(device, devmod.prepare(device), ""))
    matches = [fp for fp in history.machines() if fp.startswith(wanted)]
    if len(matches) == 1:
        return matches[0]
    if len(matches) > 1:
        raise HistoryError(f"{history.path}: --machine {wanted!r} matches {len(matches)} machines; give more of it")
    history.require_fingerprint(wanted)
    return wanted


def _unmatched(history: History, args: argparse.Namespace, fingerprint: str | None) -> HistoryError:
    """Which filter matched nothing, with the values the history does hold for it."""
    everything = history.rows(fingerprint=fingerprint)
    if not len(everything):
        return HistoryError(f"{history.path}: no runs stored yet; add some with `microscope history add`")
    for flag, column in (("plugin", "plugin"), ("variant", "variant"), ("dimension", "dimension"),
                         ("metric", "metric"), ("branch", "branch")):
        value = getattr(args, flag)
        if value is not None and value not in set(everything[column]):
            known = sorted(set(everything[column]))
            shown = ", ".join(known[:12]) + (" ..." if len(known) > 12 else "")
            return HistoryError(f"{history.path}: no history rows for --{flag} {value!r}; {column}s here: {shown}")
    if args.case is not None and not everything["case_id"].str.contains(args.case, regex=False).any():
        return HistoryError(f"{history.path}: no case id contains {args.case!r}")
    return HistoryError(f"{history.path}: no history rows match these filters together"
                        + (f" since {args.since}" if args.since else ""))


def _finite(value: Any) -> bool:
    try:
        return math.isfinite(float(value))
    except (TypeError, ValueError):
        return False


def _fmt(value: Any, unit: str = "") -> str:
    if not _finite(value):
        return "-"
    return f"{float(value):.4g}{f' {unit}' if unit else ''}"


def _ci(lo: Any, hi: Any) -> str:
    return f"[{float(lo):.4g}, {float(hi):.4g}]" if _finite(lo) and _finite(hi) else ""


def _count(n: Any) -> str:
    try:
        return str(int(n))
    except (TypeError, ValueError):
        return ""


def _change(step: Step) -> str:
    return f"{step.change:+.1%}" if step.relative else f"{step.change:+.4g}"


def _table(title: str, columns: list[str]) -> Table:
    table = Table(title=Text(title), header_style="bold", title_justify="left")
    for col in columns:
        table.add_column(Text(col), overflow="fold")
    return table


def _vs_previous(frame: pd.DataFrame) -> str:
    """The latest run against the one before: a ratio for times, memory and rates, else a difference."""
    from microscope.stats.steps import log_scale

    ok = [float(v) for v, st in zip(frame["value"], frame["status"]) if st == "ok" and _finite(v)]
    if len(ok) < 2:
        return ""
    if log_scale(str(frame["dimension"].iloc[0]), str(frame["metric"].iloc[0])):
        return f"{ok[-1] / ok[-2] - 1:+.1%}" if ok[-2] > 0 else ""
    return f"{ok[-1] - ok[-2]:+.4g}"


def _series_table(series: list[tuple[pd.DataFrame, list[Step], Drift | None]]) -> Table:
    table = _table("history: one row per series (latest run's value)",
                   ["plugin", "variant", "case", "metric", "machine", "runs", "latest", "CI", "vs previous",
                    "steps"])
    for frame, steps, drift in series:
        last = frame.iloc[-1]
        prev = _vs_previous(frame)
        marks = "; ".join(f"{_change(s)} {s.commit_range}" for s in steps)
        if drift is not None:
            marks = "; ".join(m for m in (marks, drift.describe()) if m)
        latest = _fmt(last["value"], str(last["unit"] or "")) if last["status"] == "ok" else str(last["status"])
        table.add_row(*(Text(str(v)) for v in (
            last["plugin"], last["variant"], last["case_id"], f"{last['dimension']} {last['metric']}",
            last["fingerprint"], len(frame), latest, _ci(last["ci_low"], last["ci_high"]), prev, marks or "none")))
    return table


def _runs_table(frame: pd.DataFrame, steps: list[Step], machines: dict[str, str]) -> Table:
    from microscope.stats.steps import short_commit

    first = frame.iloc[0]
    title = (f"history: {first['plugin']} | {first['variant']} | {first['case_id']} | {first['dimension']} "
             f"{first['metric']} on {first['fingerprint']} ({machines.get(first['fingerprint'], '?')})")
    table = _table(title, ["date", "commit", "branch", "value", "CI", "n", "verdict", "step"])
    starts = {s.index: s for s in steps}
    for i, row in frame.iterrows():
        step = starts.get(int(i))
        mark = f"{'up' if step.change > 0 else 'down'} {_change(step)} from {step.commit_range}" if step else ""
        value = _fmt(row["value"], str(row["unit"] or "")) if row["status"] == "ok" else str(row["status"])
        table.add_row(*(Text(str(v)) for v in (str(row["date"])[:19], short_commit(str(row["commit"])),
                                                row["branch"], value, _ci(row["ci_low"], row["ci_high"]),
                                                _count(row["n"]),
                                                row["verdict"] or "", mark)),
                      style="bold" if step else None)
    return table


def _step_lines(series: list[tuple[pd.DataFrame, list[Step], Drift | None]]) -> list[str]:
    lines = []
    for frame, steps, drift in series:
        first = frame.iloc[0]
        where = (f"{first['plugin']} | {first['variant']} | {first['case_id']} | {first['dimension']} "
                 f"{first['metric']} on {first['fingerprint']}")
        unit = str(first["unit"] or "")
        for s in steps:
            dates = f"{str(frame['date'].iloc[s.index - 1])[:10]} -> {str(frame['date'].iloc[s.index])[:10]}"
            lines.append(f"step {where}: {s.describe(unit)} ({dates})")
        if drift is not None:
            lines.append(f"drift {where}: {drift.describe()}")
    return lines


def _show(args: argparse.Namespace, console: Console) -> int:
    from microscope.store.history import SERIES_KEYS, History, series_changes

    since = _since(args.since)
    if args.plot is not None and args.plot.suffix.lower() not in (".png", ".svg"):
        raise HistoryError(f"--plot {args.plot}: write the trend chart as a .png or .svg file")
    with History.open(args.db) as history:
        fingerprint = _machine(history, args.machine)
        rows = history.rows(plugin=args.plugin, variant=args.variant, dimension=args.dimension, metric=args.metric,
                            fingerprint=fingerprint, branch=args.branch, since=since)
        if args.case is not None:
            rows = rows[rows["case_id"].str.contains(args.case, regex=False)]
        if not args.all_metrics and args.metric is None:
            rows = rows[~rows["metric"].isin(_DERIVED)]
        if not len(rows):
            raise _unmatched(history, args, fingerprint)
        machines = history.machines()
    series = []
    for _, frame in rows.groupby(list(SERIES_KEYS)):
        frame = frame.reset_index(drop=True)
        steps, drift = series_changes(frame)
        series.append((frame, steps, drift))
    if len(series) == 1:
        console.print(_runs_table(series[0][0], series[0][1], machines))
    else:
        console.print(_series_table(series))
    for fp in dict.fromkeys(rows["fingerprint"]):
        console.print(Text(f"machine {fp}: {machines.get(fp, '?')}", style="dim"), highlight=False, soft_wrap=True)
    lines = _step_lines(series)
    console.print(Text(f"{sum(len(s) for _, s, _ in series)} step(s) detected in {len(series)} series" +
                       (":" if lines else " (a step needs 2 runs on each side, larger than the run-to-run noise)"),
                       style="bold"), highlight=False)
    for line in lines:
        console.print(Text(f"  {line}"), highlight=False, soft_wrap=True)
    if args.plot is not None:
        _plot(rows, args.plot, console)
    return EXIT_OK


def _plot(rows: pd.DataFrame, path: Path, console: Console) -> None:
    from microscope.report.trends import MAX_CHARTS, chart_frames, save_trend_plot

    frames = chart_frames(rows, include_derived=True)
    try:
        written, _ = save_trend_plot(frames, path)
    except OSError as exc:
        raise HistoryError(f"{path}: cannot write the trend plot ({exc.strerror or exc})") from exc
    more = f" (the first {MAX_CHARTS} of {len(frames)} charts; filter for others)" if len(frames) > MAX_CHARTS else ""
    console.print(Text(f"trend plot: {written}{more}"), highlight=False, soft_wrap=True)
