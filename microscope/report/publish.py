"""Writing reports to disk: the functions ``microscope report`` and ``microscope compare`` call.

Kept apart from the renderers so the CLI needs one import and the renderers stay pure (RunData in,
text out). Output names are derived from run ids, which are folder names a user can choose, so they
are reduced to a safe character set before they become file names.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Sequence
from pathlib import Path

from .load import ReportError, RunData, load_run

FORMATS = ("md", "html")
_UNSAFE_NAME = re.compile(r"[^A-Za-z0-9._+-]+")


def safe_stem(run_id: str) -> str:
    """A file name stem from a run id: no path separators, no leading dots, never empty."""
    stem = _UNSAFE_NAME.sub("_", run_id).strip("._") or "run"
    return stem[:200]


def _check_formats(formats: Iterable[str]) -> list[str]:
    chosen = [f.lower().lstrip(".") for f in formats]
    unknown = [f for f in chosen if f not in FORMATS]
    if unknown:
        raise ReportError(f"unknown report format(s) {', '.join(map(repr, unknown))}; choose from "
                          f"{', '.join(FORMATS)}")
    return list(dict.fromkeys(chosen))


def write_run_reports(run: RunData, out_dir: Path, formats: Sequence[str] = FORMATS,
                      stem: str | None = None, trends: tuple[list, str] | None = None) -> dict[str, Path]:
    """Render ``run`` in each format into ``<out_dir>/<stem>.<format>``; returns format -> path.
    ``trends`` (``trends.run_trends``) adds the HTML report's Trends section."""
    from .html import render_html
    from .markdown import render_markdown

    chosen = _check_formats(formats)
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    stem = safe_stem(stem or run.run_id)
    renderers = {"md": render_markdown, "html": lambda r: render_html(r, trends)}
    paths = {}
    for f in chosen:
        path = out_dir / f"{stem}.{f}"
        path.write_text(renderers[f](run), encoding="utf-8")
        paths[f] = path
    return paths


def write_reports(results_dir: Path, out_dir: Path = Path("reports"),
                  formats: Sequence[str] = FORMATS, history: Path | None = None) -> dict[str, Path]:
    """Report on one run folder: ``<out_dir>/<run-id>.md`` and ``.html`` (format -> written path); with
    ``history`` the HTML report gains a Trends section of the run's plugins on its machine.

    Raises ``ReportError`` (a user error: print it, no traceback) when the folder holds no records,
    a format is unknown, or the history file is unusable.
    """
    run = load_run(Path(results_dir))
    trends = None
    if history is not None:
        from microscope.store.history_schema import HistoryError

        from .trends import run_trends

        plugins = list(dict.fromkeys(run.records["plugin"].astype(str))) if len(run.records) else []
        try:
            trends = run_trends(history, plugins, run.env)
        except HistoryError as exc:
            raise ReportError(str(exc)) from exc
    return write_run_reports(run, out_dir, formats, stem=run.path.name if run.path else run.run_id, trends=trends)


def report_command(results_dir: Path, formats: Sequence[str] = FORMATS, out: Path = Path("reports"),
                   history: Path | None = None) -> dict[str, Path]:
    """``microscope report RESULTS_DIR [--format md html] [--out reports/] [--history PATH]``."""
    return write_reports(Path(results_dir), Path(out), formats, history=history)


def compare_command(run_a: Path, run_b: Path, out: Path = Path("reports"), force: bool = False,
                    formats: Sequence[str] = FORMATS, history: Path | None = None) -> tuple[RunData, dict[str, Path]]:
    """``microscope compare A B [--out reports/] [--force] [--history PATH]``: B against A, the run as the unit.

    Writes ``<out>/<A>-vs-<B>.md``, ``.html`` and the comparison table as ``.csv``; returns the compared
    ``RunData`` (for the console and the exit code) and the written paths. Raises ``CompareError`` (a
    ``ReportError``) when the sides measure different things and ``force`` is False.
    """
    from .compare import compare_runs

    run = compare_runs(Path(run_a), Path(run_b), force=force, history=history)
    stem = f"{safe_stem(Path(run_a).name)}-vs-{safe_stem(Path(run_b).name)}"
    paths = write_run_reports(run, out, formats, stem=stem)
    if run.comparison is not None:
        csv = Path(out) / f"{stem}.csv"
        run.comparison.to_csv(csv, index=False)
        paths["csv"] = csv
    return run, paths
