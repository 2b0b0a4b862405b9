"""Trend charts from the history: one chart per measurement, one line per variant, steps marked.

A reviewer of a nightly regression needs three things on one picture: where the level moved, by how
much against the night-to-night noise, and which commits to blame. Each chart draws the run-level
values in date order (with their CIs), a dashed vertical line between the last run at the old level and
the first at the new one for every detected step (``microscope.store.history.series_changes``), and the
commit range and change next to it. Charts are SVG text for the HTML report (``trend_svgs``) or files
(``save_trend_plot``, PNG or SVG by suffix), drawn on ``matplotlib.figure.Figure`` (no pyplot state).
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np
import pandas as pd
from matplotlib.axes import Axes
from matplotlib.figure import Figure

from microscope.stats.steps import Drift, Step, log_scale, short_commit

from .plots import label, palette, to_svg

if TYPE_CHECKING:
    from microscope.store.history import History

__all__ = ["TrendChart", "chart_frames", "draw_trend", "run_trends", "save_trend_plot", "trend_charts", "trend_svgs"]

MAX_CHARTS = 12
MAX_TICKS = 16
#: Derived rates restate the latency (the statistics table does not test them either): drawn only on request.
DERIVED_METRICS = ("tflops", "gbps")


@dataclass(frozen=True)
class TrendChart:
    """One chart: its title, SVG markup (None when not drawn), the steps it marks and a note."""

    title: str
    svg: str | None
    steps: list[tuple[str, Step]] = field(default_factory=list)  # (variant, step)
    drifts: list[tuple[str, Drift]] = field(default_factory=list)
    note: str = ""


def _title(frame: pd.DataFrame) -> str:
    first = frame.iloc[0]
    return f"{first['plugin']} | {first['case_id']} | {first['dimension']} {first['metric']}"


def chart_frames(rows: pd.DataFrame, include_derived: bool = False) -> list[tuple[str, pd.DataFrame]]:
    """Split history rows into one frame per chart: (machine, plugin, case, dimension, metric)."""
    if not len(rows):
        return []
    if not include_derived:
        rows = rows[~rows["metric"].isin(DERIVED_METRICS)]
    keys = ["fingerprint", "plugin", "case_id", "dimension", "metric"]
    return [(_title(g), g.reset_index(drop=True)) for _, g in rows.groupby(keys, sort=False)]


def draw_trend(ax: Axes, frame: pd.DataFrame, title: str) -> tuple[list[tuple[str, Step]], list[tuple[str, Drift]]]:
    """Draw one chart's variants on ``ax``; returns the steps and drifts it marked."""
    from microscope.store.history import series_changes  # the store imports the stats layer, not reports

    runs = frame.drop_duplicates("run_key")[["run_key", "date", "commit"]].reset_index(drop=True)
    position = {k: i for i, k in enumerate(runs["run_key"])}
    variants = list(dict.fromkeys(frame["variant"]))
    colors = palette(variants)
    unit = next((u for u in frame["unit"] if isinstance(u, str) and u), "")
    marked: list[tuple[str, Step]] = []
    drifts: list[tuple[str, Drift]] = []
    top = float(np.nanmax(frame["value"])) if frame["value"].notna().any() else 1.0
    for variant in variants:
        mine = frame[frame["variant"] == variant].reset_index(drop=True)
        xs = mine["run_key"].map(position).to_numpy(dtype=float)
        ys = np.where(mine["status"] == "ok", mine["value"].to_numpy(dtype=float), np.nan)
        lo, hi = mine["ci_low"].to_numpy(dtype=float), mine["ci_high"].to_numpy(dtype=float)
        color = colors[variant]
        ax.plot(xs, ys, marker="o", ms=3.5, lw=1.3, color=color, label=label(variant))
        has_ci = np.isfinite(lo) & np.isfinite(hi) & np.isfinite(ys)
        if has_ci.any():
            ax.errorbar(xs[has_ci], ys[has_ci], yerr=[np.maximum(ys - lo, 0)[has_ci], np.maximum(hi - ys, 0)[has_ci]],
                        fmt="none", ecolor=color, elinewidth=0.8, capsize=2, alpha=0.7)
        failed = mine["status"] != "ok"
        if failed.any():
            ax.scatter(xs[failed.to_numpy()], np.zeros(int(failed.sum())), marker="x", color=color, s=20,
                       label=label(f"{variant}: failed/skipped"))
        steps, drift = series_changes(mine)
        edges = [0, *(s.index for s in steps), len(mine)]
        levels = [steps[0].level_before, *(s.level_after for s in steps)] if steps else []
        for (a, b), level in zip(zip(edges, edges[1:]), levels):  # the fitted level of each segment
            ax.hlines(level, xs[a] - 0.3, xs[b - 1] + 0.3, color=color, lw=2.2, alpha=0.35)
        for step in steps:
            x = xs[step.index] - 0.5
            ax.axvline(x, color=color, ls="--", lw=1.1)
            size = f"{step.change:+.1%}" if step.relative else f"{step.change:+.3g}"
            ax.annotate(label(f"{size} {step.commit_range}", 48), (x, top), xytext=(3, -3),
                        textcoords="offset points", rotation=90, va="top", ha="left", fontsize=7, color=color,
                        bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": "none", "alpha": 0.85})
            marked.append((variant, step))
        if drift is not None:
            drifts.append((variant, drift))
    step_ticks = max(1, math.ceil(len(runs) / MAX_TICKS))
    ticks = list(range(0, len(runs), step_ticks))
    ax.set_xticks(ticks, [label(f"{str(runs['date'][i])[:10]}\n{short_commit(str(runs['commit'][i]))}", 24)
                          for i in ticks], fontsize=6, rotation=45, ha="right")
    ax.set_xlim(-0.6, max(len(runs) - 0.4, 0.6))
    metric = str(frame["metric"].iloc[0])
    positive = frame["value"][frame["value"] > 0]
    if log_scale(str(frame["dimension"].iloc[0]), metric) and len(positive) and positive.max() > 2 * positive.min():
        ax.set_yscale("log")  # variants far apart: equal ratios look equal
    ax.set_ylabel(label(f"{metric} ({unit})" if unit else metric, 40), fontsize=8)
    scale = "ratio scale" if log_scale(str(frame["dimension"].iloc[0]), metric) else "difference scale"
    ax.set_title(label(title, 90) + f"\nsteps judged on the {scale}", fontsize=8)
    ax.tick_params(axis="y", labelsize=7)
    ax.grid(True, alpha=0.2)
    ax.legend(fontsize=7, loc="lower left")
    return marked, drifts


def _figure(panels: int) -> tuple[Figure, list[Axes]]:
    cols = 1 if panels == 1 else 2
    rows = math.ceil(panels / cols)
    fig = Figure(figsize=(7.5 * cols if cols == 1 else 13.0, min(4.2 * rows, 60.0)), layout="constrained")
    axes = fig.subplots(rows, cols, squeeze=False)
    for ax in list(axes.flat)[panels:]:
        ax.set_axis_off()
    return fig, list(axes.flat)[:panels]


def _order(frames: list[tuple[str, pd.DataFrame]]) -> list[tuple[str, pd.DataFrame]]:
    """Latency first, then the rest, each in the history's order (a stable sort)."""
    return sorted(frames, key=lambda tf: str(tf[1]["dimension"].iloc[0]) != "throughput")


def trend_charts(history: History, plugin: str, fingerprint: str, *, since: str | None = None,
                 metrics: Sequence[str] | None = None, max_charts: int = MAX_CHARTS) -> list[TrendChart]:
    """One chart per (case, dimension, metric) of ``plugin`` on machine ``fingerprint``; charts with steps
    first, then latency, at most ``max_charts`` (a last chart without SVG says how many were left out)."""
    rows = history.rows(plugin=plugin, fingerprint=fingerprint, since=since)
    if metrics is not None:
        rows = rows[rows["metric"].isin(list(metrics))]
    charts = []
    for title, frame in _order(chart_frames(rows, include_derived=metrics is not None)):
        fig, (ax,) = _figure(1)
        steps, drifts = draw_trend(ax, frame, title)
        charts.append(TrendChart(title, to_svg(fig, f"trend-{len(charts)}"), steps, drifts))
    charts.sort(key=lambda c: not c.steps)  # stable: steps first, the history's order otherwise
    shown = charts[:max_charts]
    if len(charts) > len(shown):
        shown.append(TrendChart("more trends", None, note=f"{len(charts) - len(shown)} more series without "
                                "marked steps not drawn; `microscope history show --plot` draws any of them"))
    return shown


def trend_svgs(history: History, plugin: str, fingerprint: str, *, since: str | None = None,
               metrics: Sequence[str] | None = None, max_charts: int = MAX_CHARTS) -> list[tuple[str, str]]:
    """(title, inline SVG) per drawn chart of ``trend_charts``, for the HTML report."""
    charts = trend_charts(history, plugin, fingerprint, since=since, metrics=metrics, max_charts=max_charts)
    return [(c.title, c.svg) for c in charts if c.svg is not None]


def run_trends(history_path: Path | str, plugins: Sequence[str], env: dict) -> tuple[list[TrendChart], str]:
    """The Trends section of a run's HTML report: ``trend_charts`` of each of the run's plugins on the run's
    machine (its fingerprint from ``env``), and a note; ``HistoryError`` when the file is unusable."""
    from microscope.env import machine_fingerprint
    from microscope.store.history import History

    fingerprint = machine_fingerprint(env)
    with History.open(history_path) as history:
        machines = history.machines()
        if fingerprint not in machines:
            others = "; ".join(f"{fp} = {name}" for fp, name in machines.items()) or "none"
            return [], (f"{history_path} holds no run from this run's machine {fingerprint} (only from: {others}); "
                        "trends are drawn per machine")
        charts = [c for plugin in plugins for c in trend_charts(history, plugin, fingerprint)]
    steps = sum(len(c.steps) for c in charts)
    return charts, (f"{history_path}, machine {fingerprint} ({machines[fingerprint]}): {len(charts)} chart(s), "
                    f"{steps} step(s) marked with the commit range that introduced each")


def save_trend_plot(frames: list[tuple[str, pd.DataFrame]], path: Path | str,
                    max_charts: int = MAX_CHARTS) -> tuple[Path, list[tuple[str, str, Step]]]:
    """Draw ``frames`` (from ``chart_frames``) as panels of one figure saved to ``path`` (.png or .svg).

    Returns the path and the (title, variant, step) of every step marked; at most ``max_charts`` panels.
    """
    path = Path(path)
    if path.suffix.lower() not in (".png", ".svg"):
        raise ValueError(f"{path}: the trend plot is written as .png or .svg, not {path.suffix or 'no suffix'!r}")
    frames = _order(frames)[:max_charts]
    if not frames:
        raise ValueError("nothing to plot")
    fig, axes = _figure(len(frames))
    marked = []
    for ax, (title, frame) in zip(axes, frames):
        steps, _ = draw_trend(ax, frame, title)
        marked += [(title, variant, step) for variant, step in steps]
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix.lower() == ".svg":
        path.write_text(to_svg(fig, "trend-plot"), encoding="utf-8")
    else:
        fig.savefig(path, format="png", dpi=130, metadata={"Software": None})
    return path, marked
