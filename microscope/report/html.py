"""The HTML report: one self-contained file (inline CSS, JS and SVG) that opens offline in any browser.

Nothing is fetched: styles and the small table-sorting script are inlined from ``templates/``, charts
are inline SVG (``plots.py``), and a Content-Security-Policy of ``default-src 'none'`` makes the
browser refuse any request even if one slipped in. Jinja2 autoescaping is on for every template, and
record, plugin and config text is only ever passed as data (never marked safe); the exceptions are
matplotlib's SVG, which ``plots.to_svg`` checks for active content before it is inlined, and the
drawn graph diffs, which ``graph_svg`` builds from escaped text only.
Tables are capped at ``MAX_ROWS`` rows each so a huge run still gives a file a browser opens quickly.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from jinja2 import Environment, FileSystemLoader, StrictUndefined

from microscope import __version__

from .caveats import caveats, env_lines
from .headline import IMPROVEMENTS, REGRESSIONS, headlines
from .instruments import diff_graph_figures, instrument_findings, instrument_tables
from .load import RunData
from .plots import all_plots
from .tables import Table, comparison_table, raw_table, significant_rows, significant_table, trials_table

MAX_ROWS = 1_000
#: Free-text columns that wrap; every other column stays on one line and the table scrolls sideways.
WIDE_COLUMNS = ("notes", "problems", "reason", "other metrics", "item", "other fields")
TEMPLATES = Path(__file__).parent / "templates"


@dataclass(frozen=True)
class Col:
    label: str
    numeric: bool


@dataclass(frozen=True)
class Cell:
    text: str
    key: float | None
    cls: str


@dataclass(frozen=True)
class Row:
    cells: list[Cell]
    cls: str


@dataclass
class TableView:
    """What ``table.html.j2`` renders: capped rows, a CSS class per row from a fixed set."""

    columns: list[Col]
    rows: list[Row] = field(default_factory=list)
    total: int = 0
    left_out: int = 0


def row_class(verdict: str) -> str:
    """A CSS class from a fixed vocabulary: record text never reaches an attribute unmapped."""
    if verdict in REGRESSIONS and verdict not in ("slower", "more"):
        return "v-bad"
    if verdict in ("slower", "more"):
        return "v-warn"
    if verdict in IMPROVEMENTS:
        return "v-good"
    return "v-skip" if verdict == "skipped" else ""


def table_view(table: Table, limit: int = MAX_ROWS) -> TableView:
    cols = [Col(c, n) for c, n in zip(table.columns, table.numeric)]
    classes = ["num" if n else ("wide" if c in WIDE_COLUMNS else "")
               for c, n in zip(table.columns, table.numeric)]
    rows = [Row([Cell(t, k, c) for t, k, c in zip(texts, keys, classes)], row_class(v))
            for texts, keys, v in zip(table.rows[:limit], table.keys[:limit], table.verdicts[:limit])]
    return TableView(cols, rows, table.total, max(0, table.total - limit))


def environment() -> Environment:
    """Jinja2 with autoescaping on for every template (their names end in .j2, not .html)."""
    return Environment(loader=FileSystemLoader(TEMPLATES), autoescape=True, undefined=StrictUndefined,
                       trim_blocks=True, lstrip_blocks=True, keep_trailing_newline=True)


def render_html(run: RunData, trends: tuple[list, str] | None = None) -> str:
    """The whole report as one HTML string; ``trends``: (``TrendChart`` list, note) from ``trends.run_trends``."""
    comp = run.comparison
    show_plugin = bool(len(run.records) and run.records["plugin"].nunique() > 1) or bool(
        comp is not None and len(comp) and comp["plugin"].nunique() > 1)
    has_comp = comp is not None
    graph_figures, graphs_left_out = diff_graph_figures(run)
    context = {
        "title": run.title or f"microscope run {run.run_id}",
        "env": env_lines(run),
        "headlines": headlines(run),
        "caveats": caveats(run),
        "progress": run.progress.lines() if run.progress is not None else [],
        "findings": instrument_findings(run),
        "significant": (table_view(significant_table(significant_rows(comp), show_plugin)) if has_comp
                        else None),
        "n_comparisons": len(comp) if has_comp else 0,
        "plots": all_plots(run),
        "comparisons": table_view(comparison_table(comp, show_plugin)) if has_comp else None,
        "raw": table_view(raw_table(run.records)),
        "trials": table_view(trials_table(run.records)),
        "instruments": [(title, table_view(t)) for title, t in instrument_tables(run)],
        "graph_figures": graph_figures,
        "graphs_left_out": graphs_left_out,
        "trends": trends,
        "config": run.config_text,
        "version": __version__,
    }
    return environment().get_template("report.html.j2").render(**context)
