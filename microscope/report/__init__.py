"""Reports of a run: the console table, Markdown for a pull request, one self-contained HTML file.

Public API (the CLI's ``report`` and ``compare`` commands)::

    write_reports(results_dir, out_dir=Path("reports"), formats=("md", "html")) -> {"md": path, ...}
    compare_runs(side_a, side_b, *, alpha=None, min_band=None, force=False) -> RunData (run as the unit)
    report_command(results_dir, formats, out) -> {"md": path, "html": path}
    compare_command(side_a, side_b, out, force) -> (RunData, {"md": path, "html": path, "csv": path})
    load_run(results_dir) -> RunData;  render_markdown(run) -> str;  render_html(run) -> str

``ReportError`` (and its subclass ``CompareError``) are user errors: print the message, no traceback.

Names resolve lazily: ``microscope run`` imports ``report.console`` for its closing table and should
not pay for pandas, matplotlib and jinja2 it does not use.
"""

from __future__ import annotations

from importlib import import_module
from typing import Any

_EXPORTS = {
    "write_reports": "publish", "write_run_reports": "publish", "report_command": "publish",
    "compare_command": "publish", "compare_runs": "compare", "CompareError": "compare",
    "load_run": "load", "RunData": "load", "ReportError": "load",
    "render_markdown": "markdown", "render_html": "html",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(import_module(f".{_EXPORTS[name]}", __name__), name)
