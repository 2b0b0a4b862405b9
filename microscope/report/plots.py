"""The HTML report's charts, drawn with matplotlib and inlined as SVG text.

Inline SVG keeps the report one self-contained file that opens offline and scales without blur. The
figures are built with ``matplotlib.figure.Figure`` directly (no pyplot, no GUI backend, no global
state changed for the caller) and saved with text kept as ``<text>`` elements (smaller files) that
matplotlib escapes; the SVG prologue, DOCTYPE and metadata (which carry external URLs) are stripped,
and each figure gets its own id salt so the ids of several inline SVGs never collide. Every chart is
optional: a function returns a ``Plot`` with ``svg=None`` and a note saying why when the run lacks
the data (no rounds, no GPU ceilings, no stability curves, ...).
"""

from __future__ import annotations

import io
import math
import re
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import matplotlib
import numpy as np
import pandas as pd
from matplotlib.figure import Figure

from . import fmt
from .fmt import case_labels
from .headline import by_role
from .instruments import divergence_entries, divergence_rows
from .load import RunData

MAX_CASES = 12
MAX_BARS_CASES = 24
MAX_CURVE_METRICS = 4
MAX_LINES = 8
LABEL_CHARS = 36
_STRIP = re.compile(r"<\?xml[^>]*\?>|<!DOCTYPE[^>]*>|<metadata>.*?</metadata>", re.S)
_UNSAFE = re.compile(r"<script|<foreignObject|\son\w+\s*=|javascript:", re.I)
_METADATA = {"Date": None, "Format": None, "Type": None, "Creator": None}


@dataclass(frozen=True)
class Plot:
    """One chart: ``svg`` markup, or None and a ``note`` saying why it is absent or partial."""

    key: str
    title: str
    svg: str | None
    note: str = ""


def label(text: Any, limit: int = LABEL_CHARS) -> str:
    """Record text made inert for matplotlib: ``$`` would start mathtext, a leading ``_`` hides a legend."""
    s = fmt.clip(text, limit).replace("$", r"\$")
    return " " + s if s.startswith("_") else s


def to_svg(fig: Figure, key: str) -> str:
    """The figure as inline-ready SVG markup (no prologue, no metadata, ids unique to ``key``)."""
    buf = io.StringIO()
    with matplotlib.rc_context({"svg.fonttype": "none", "svg.hashsalt": f"ms-{key}"}):
        fig.savefig(buf, format="svg", bbox_inches="tight", metadata=_METADATA)
    svg = _STRIP.sub("", buf.getvalue()).strip()
    if _UNSAFE.search(svg):  # matplotlib escapes text; this guards against that ever changing
        raise ValueError(f"plot {key!r}: SVG output contains active content; refusing to inline it")
    return svg


def palette(variants: list[str]) -> dict[str, Any]:
    """One colour per variant, the same in every chart of a report."""
    cmap = matplotlib.colormaps["tab10"]
    return {v: cmap(i % 10) for i, v in enumerate(variants)}


def variant_order(run: RunData) -> list[str]:
    return [v for v, _ in by_role(run.records)] if len(run.records) else []


def _new(width: float, height: float) -> Figure:
    return Figure(figsize=(min(width, 14.0), min(height, 40.0)), layout="constrained")


def _ok(records: pd.DataFrame, **match: str) -> pd.DataFrame:
    if not len(records):
        return records
    sel = records["status"] == "ok"
    for col, value in match.items():
        sel &= records[col] == value
    return records[sel]


def _rounds(value: Any) -> list[float]:
    if not isinstance(value, (list, tuple)):
        return []
    return [f for f in (fmt.finite(v) for v in value) if f is not None]


def _log_if_decades(ax: Any, values: list[float], axis: str) -> None:
    """A log axis where the positive values span more than a decade, so small bars and boxes stay visible."""
    pos = [float(v) for v in values if v is not None and np.isfinite(v) and v > 0]
    if pos and max(pos) / min(pos) > 10.0:
        (ax.set_yscale if axis == "y" else ax.set_xscale)("log")


def latency_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Per case: a box of each variant's per-round medians with the rounds drawn on top."""
    title = "Latency distributions (per-round medians)"
    rec = _ok(run.records, dimension="throughput", metric="latency_ms")
    if not len(rec) or "details.rounds" not in rec.columns:
        return Plot("latency", title, None, "no per-round latency samples in this run")
    cases = list(dict.fromkeys(rec["case_id"]))
    names_of = case_labels(cases)
    shown = cases[:MAX_CASES]
    ncols = min(4, len(shown))
    nrows = math.ceil(len(shown) / ncols)
    fig = _new(3.3 * ncols, 2.8 * nrows + 0.4)
    axes = fig.subplots(nrows, ncols, squeeze=False)
    rng = np.random.default_rng(0)
    for ax, case in zip(axes.flat, shown):
        crow = rec[rec["case_id"] == case]
        names = [v for v in colors if v in set(crow["variant"])]
        data = [_rounds(crow[crow["variant"] == v]["details.rounds"].iloc[0]) for v in names]
        keep = [i for i, d in enumerate(data) if d]
        if not keep:
            ax.set_axis_off()
            continue
        names, data = [names[i] for i in keep], [data[i] for i in keep]
        ax.boxplot(data, positions=range(len(data)), widths=0.55, showfliers=False,
                   medianprops={"color": "black"})
        for i, (name, d) in enumerate(zip(names, data)):
            ax.scatter(i + rng.uniform(-0.15, 0.15, len(d)), d, s=9, color=colors[name], alpha=0.8, zorder=3)
        ax.set_xticks(range(len(names)), [label(n, 16) for n in names], rotation=30, ha="right", fontsize=7)
        ax.set_title("\n".join(textwrap.wrap(names_of[case], 44)), fontsize=8)
        _log_if_decades(ax, [x for d in data for x in d], "y")
        ax.set_ylabel("ms", fontsize=7)
        ax.tick_params(axis="y", labelsize=7)
    for ax in list(axes.flat)[len(shown):]:
        ax.set_axis_off()
    note = f"showing {len(shown)} of {len(cases)} cases" if len(cases) > len(shown) else ""
    return Plot("latency", title, to_svg(fig, "latency"), note)


def _roofline_points(rec: pd.DataFrame) -> tuple[pd.DataFrame, float | None, float | None]:
    cols = ["variant", "case_id", "value", "details.amount", "details.ceiling"]
    if any(c not in rec.columns for c in cols):
        return pd.DataFrame(), None, None
    tfl = _ok(rec, dimension="throughput", metric="tflops")[cols]
    gbs = _ok(rec, dimension="throughput", metric="gbps")[cols]
    peak = pd.to_numeric(tfl["details.ceiling"], errors="coerce").median()
    bw = pd.to_numeric(gbs["details.ceiling"], errors="coerce").median()
    pts = tfl.merge(gbs, on=["variant", "case_id"], suffixes=("_f", "_b"))
    flops = pd.to_numeric(pts["details.amount_f"], errors="coerce")
    nbytes = pd.to_numeric(pts["details.amount_b"], errors="coerce")
    pts = pts.assign(ai=flops / nbytes, tflops=pd.to_numeric(pts["value_f"], errors="coerce"))
    pts = pts[np.isfinite(pts["ai"]) & (pts["ai"] > 0) & (pts["tflops"] > 0)]
    return pts, fmt.finite(peak), fmt.finite(bw)


def roofline_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Achieved TFLOP/s against arithmetic intensity, under the device's measured compute/copy roofs."""
    title = "Roofline (measured ceilings)"
    pts, peak, bw = _roofline_points(run.records) if len(run.records) else (pd.DataFrame(), None, None)
    if peak is None or bw is None:
        return Plot("roofline", title, None, "no roofline: device ceilings (matmul TFLOP/s, copy GB/s) are "
                                             "measured only on GPU runs with throughput enabled")
    if not len(pts):
        return Plot("roofline", title, None, "no roofline: it needs both a FLOP and a byte count per case, "
                                             "and this plugin does not declare both")
    ridge = peak * 1e3 / bw
    lo = min(pts["ai"].min(), ridge) / 8
    hi = max(pts["ai"].max(), ridge) * 8
    x = np.logspace(math.log10(lo), math.log10(hi), 200)
    fig = _new(7.0, 4.6)
    ax = fig.subplots()
    ax.plot(x, np.minimum(peak, x * bw / 1e3), color="black", lw=1.5, label="roof")
    ax.axhline(peak, color="grey", ls=":", lw=1, label=f"matmul ceiling {peak:.3g} TFLOP/s")
    ax.plot(x, x * bw / 1e3, color="grey", ls="--", lw=1, label=f"copy ceiling {bw:.3g} GB/s")
    for variant in [v for v in colors if v in set(pts["variant"])]:
        sel = pts[pts["variant"] == variant]
        ax.scatter(sel["ai"], sel["tflops"], s=22, color=colors[variant], label=label(variant), zorder=3)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("arithmetic intensity (FLOP/byte)")
    ax.set_ylabel("achieved TFLOP/s")
    ax.legend(fontsize=7, loc="lower right")
    ax.grid(True, which="both", alpha=0.2)
    return Plot("roofline", title, to_svg(fig, "roofline"))


def _curve_groups(rec: pd.DataFrame) -> dict[str, dict[str, list[list[float]]]]:
    """metric -> line label -> per-seed curves."""
    groups: dict[str, dict[str, list[list[float]]]] = {}
    multi_case = rec["case_id"].nunique() > 1
    for r in rec.to_dict("records"):
        curve = _rounds(r.get("details.curve"))
        if len(curve) < 2:
            continue
        name = str(r["variant"]) + (f" [{r['case_id']}]" if multi_case else "")
        groups.setdefault(str(r["metric"]), {}).setdefault(name, []).append(curve)
    return groups


def curves_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Loss and grad-norm (and any other per-step curve): mean over seeds with the min-max band."""
    title = "Training curves (mean over seeds, band = min to max)"
    rec = _ok(run.records, dimension="stability")
    if not len(rec) or "details.curve" not in rec.columns:
        return Plot("curves", title, None, "no stability curves in this run")
    groups = _curve_groups(rec)
    if not groups:
        return Plot("curves", title, None, "stability records carry no per-step curves")
    metrics = sorted(groups, key=lambda m: (m not in ("loss", "grad_norm"), m))[:MAX_CURVE_METRICS]
    fig = _new(4.6 * min(2, len(metrics)), 3.3 * math.ceil(len(metrics) / 2))
    axes = fig.subplots(math.ceil(len(metrics) / 2), min(2, len(metrics)), squeeze=False)
    fallback = palette([n for m in metrics for n in groups[m]])
    for ax, metric in zip(axes.flat, metrics):
        positive = True
        for name, curves in list(groups[metric].items())[:MAX_LINES]:
            n = min(len(c) for c in curves)
            arr = np.array([c[:n] for c in curves])
            steps = np.arange(n)
            color = colors.get(name.split(" [")[0], fallback[name])
            ax.plot(steps, arr.mean(axis=0), color=color, lw=1.3,
                    label=label(f"{name} ({len(curves)} seed{'s' if len(curves) > 1 else ''})", 44))
            if len(curves) > 1:
                ax.fill_between(steps, arr.min(axis=0), arr.max(axis=0), color=color, alpha=0.2, lw=0)
            positive &= bool((arr > 0).all())
        if positive and "norm" in metric:
            ax.set_yscale("log")
        ax.set_title(label(metric), fontsize=9)
        ax.set_xlabel("step", fontsize=8)
        ax.legend(fontsize=7)
        ax.grid(True, alpha=0.2)
    for ax in list(axes.flat)[len(metrics):]:
        ax.set_axis_off()
    note = f"showing {len(metrics)} of {len(groups)} metrics" if len(groups) > len(metrics) else ""
    return Plot("curves", title, to_svg(fig, "curves"), note)


def divergence_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Relative error of each module's output along the network, first divergent module marked."""
    title = "Layer-wise divergence"
    data = divergence_entries(run.divergence)
    series = {v: [(str(r.get("module")), fmt.finite(r.get("rel_err"))) for r in divergence_rows(e)]
              for v, e in data.items()}
    series = {v: s for v, s in series.items() if any(e is not None for _, e in s)}
    if not series:
        return Plot("divergence", title, None, "no layer-wise divergence data in this run")
    modules = list(dict.fromkeys(m for s in series.values() for m, _ in s))
    fig = _new(max(6.0, min(14.0, 0.22 * len(modules) + 3)), 4.2)
    ax = fig.subplots()
    fallback = palette(list(series))
    pos = {m: i for i, m in enumerate(modules)}
    positive = True
    for variant, s in list(series.items())[:MAX_LINES]:
        xs = [pos[m] for m, e in s if e is not None]
        ys = [e for _, e in s if e is not None]
        color = colors.get(variant, fallback[variant])
        ax.plot(xs, ys, marker="o", ms=3, lw=1.2, color=color, label=label(variant))
        positive &= all(y > 0 for y in ys)
        first = data[variant].get("first_divergent")
        if first is not None and str(first) in pos:
            ax.axvline(pos[str(first)], color=color, ls="--", lw=1)
            ax.annotate(label(f"first divergent: {first}", 48), (pos[str(first)], max(ys)), fontsize=7,
                        rotation=90, va="top", ha="right", color=color)
    if positive:
        ax.set_yscale("log")
    step = max(1, math.ceil(len(modules) / 40))
    ticks = list(range(0, len(modules), step))
    ax.set_xticks(ticks, [label(modules[i], 24) for i in ticks], rotation=60, ha="right", fontsize=6)
    ax.set_ylabel("relative error vs reference")
    ax.legend(fontsize=7)
    ax.grid(True, alpha=0.2)
    return Plot("divergence", title, to_svg(fig, "divergence"))


def memory_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Peak memory per case, one bar per variant."""
    title = "Peak memory per case"
    rec = _ok(run.records, dimension="memory", metric="peak_bytes")
    if not len(rec):
        return Plot("memory", title, None, "no peak-memory measurements in this run")
    peaks = rec.groupby(["case_id", "variant"], sort=False)["value"].max()
    cases = list(dict.fromkeys(rec["case_id"]))
    names_of = case_labels(cases)
    shown = cases[:MAX_BARS_CASES]
    names = [v for v in colors if v in set(rec["variant"])]
    fig = _new(7.5, 0.3 * len(shown) * max(1, len(names)) * 0.55 + 1.4)
    ax = fig.subplots()
    height = 0.8 / max(1, len(names))
    top = float(np.nanmax(peaks.to_numpy())) if len(peaks) else 0.0
    unit, scale = next(((u, s) for u, s in (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)) if top >= s),
                       ("bytes", 1))
    for j, variant in enumerate(names):
        ys = [i + j * height for i in range(len(shown))]
        xs = [peaks.get((c, variant), np.nan) / scale for c in shown]
        ax.barh(ys, xs, height=height, color=colors[variant], label=label(variant))
    ax.set_yticks([i + 0.4 - height / 2 for i in range(len(shown))], [names_of[c] for c in shown],
                  fontsize=7)
    _log_if_decades(ax, [peaks.get((c, v), np.nan) / scale for c in shown for v in names], "x")
    ax.invert_yaxis()
    ax.set_xlabel(f"peak {unit}")
    ax.legend(fontsize=7)
    ax.grid(True, axis="x", alpha=0.2)
    note = f"showing {len(shown)} of {len(cases)} cases" if len(cases) > len(shown) else ""
    return Plot("memory", title, to_svg(fig, "memory"), note)


def _latency_ratios(run: RunData) -> dict[tuple[str, str], float]:
    """(variant, case) -> candidate/baseline latency: the engine's effect, else raw medians."""
    out: dict[tuple[str, str], float] = {}
    comp = run.comparison
    if comp is not None and len(comp):
        lat = comp[(comp["dimension"] == "throughput") & comp["metric"].map(fmt.is_time_metric)]
        for r in lat.to_dict("records"):
            ratio = fmt.finite(r["ratio_or_delta"])
            if ratio and ratio > 0:
                out[(str(r["candidate"]), str(r["case_id"]))] = ratio
                out.setdefault((str(r["baseline"]), str(r["case_id"])), 1.0)
        return out
    rec = _ok(run.records, dimension="throughput", metric="latency_ms")
    baselines = run.records[run.records["role"] == "baseline"]
    base = {p: str(g["variant"].iloc[0]) for p, g in baselines.groupby("plugin")}
    med = rec.groupby(["plugin", "variant", "case_id"])["value"].median()
    for (plugin, variant, case), value in med.items():
        b = med.get((plugin, base.get(plugin, ""), case))
        if b and b > 0:
            out[(str(variant), str(case))] = float(value) / b
    return out


def pareto_plot(run: RunData, colors: dict[str, Any]) -> Plot:
    """Speed vs accuracy: latency ratio to the baseline against the worst relative error, per variant."""
    title = "Speed vs accuracy (Pareto)"
    ratios = _latency_ratios(run)
    acc = _ok(run.records, dimension="accuracy")
    acc = acc[acc["metric"].str.endswith("rel_err")] if len(acc) else acc
    errs = acc.groupby(["variant", "case_id"])["value"].max() if len(acc) else pd.Series(dtype=float)
    pts = [(v, c, r, float(errs[(v, c)])) for (v, c), r in ratios.items() if (v, c) in errs.index
           and fmt.finite(errs[(v, c)]) is not None]
    if len({p[0] for p in pts}) < 2:
        return Plot("pareto", title, None, "needs latency and accuracy for at least two variants")
    floor = min((e for *_, e in pts if e > 0), default=1e-12) / 10
    fig = _new(7.0, 4.6)
    ax = fig.subplots()
    fallback = palette(sorted({p[0] for p in pts}))
    summary = []
    for variant in dict.fromkeys(p[0] for p in pts):
        mine = [p for p in pts if p[0] == variant]
        color = colors.get(variant, fallback.get(variant))
        xs, ys = [p[2] for p in mine], [max(p[3], floor) for p in mine]
        ax.scatter(xs, ys, s=12, color=color, alpha=0.35)
        gx, gy = math.exp(np.mean(np.log(xs))), max(ys)
        ax.scatter([gx], [gy], s=70, color=color, edgecolor="black", label=label(variant), zorder=3)
        summary.append((gx, gy))
    front, best = [], math.inf
    for x, y in sorted(summary):
        if y < best:
            front.append((x, y))
            best = y
    if len(front) > 1:
        ax.plot(*zip(*front), color="black", lw=1, ls="--", drawstyle="steps-post", label="Pareto front")
    ax.axvline(1.0, color="grey", lw=0.8, ls=":")
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("latency / baseline latency (left is faster; big dots: geometric mean over cases)")
    ax.set_ylabel("worst relative error (big dots: max over cases)")
    ax.legend(fontsize=7)
    ax.grid(True, which="both", alpha=0.2)
    return Plot("pareto", title, to_svg(fig, "pareto"))


PLOTS: tuple[Callable[[RunData, dict[str, Any]], Plot], ...] = (
    latency_plot, roofline_plot, memory_plot, pareto_plot, curves_plot, divergence_plot)


def all_plots(run: RunData) -> list[Plot]:
    """Every chart in report order; a chart that fails to draw becomes a note, never a failed report."""
    colors = palette(variant_order(run))
    out = []
    for make in PLOTS:
        try:
            out.append(make(run, colors))
        except Exception as exc:  # one odd record must not cost the whole report
            key = make.__name__.removesuffix("_plot")
            out.append(Plot(key, key, None, f"chart not drawn ({type(exc).__name__}: {fmt.clip(exc, 200)})"))
    return out
