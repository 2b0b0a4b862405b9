"""The HTML report: self-contained, renders without errors in headless Chromium, charts present.

The browser tests open the file from a file:// URL in headless Chromium driven over the DevTools
protocol (``cdp_client``) and check what a reader would see: no console errors, no request other
than the page itself, every verdict card and chart in the rendered DOM, sortable tables. A full-page
screenshot is kept under the pytest tmp dir as an artifact (its path is printed; ``pytest -s``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cdp_client import Browser
from report_fixtures import Spec, make_run

from microscope.report import write_reports
from microscope.report.headline import headlines
from microscope.report.html import render_html
from microscope.report.load import load_run
from microscope.report.plots import all_plots

PLOT_KEYS = ("latency", "roofline", "memory", "pareto", "curves", "divergence")
REMOTE = re.compile(r"""(?:src|href|xlink:href|action|poster|data)\s*=\s*["']?\s*(?:https?:)?//""", re.I)


def _report(folder: Path, out: Path) -> Path:
    return write_reports(folder, out, formats=("html",))["html"]


def test_html_is_self_contained(full_run: Path, tmp_path: Path) -> None:
    text = _report(full_run, tmp_path / "out").read_text(encoding="utf-8")
    assert not REMOTE.search(text), REMOTE.search(text)
    assert "<link" not in text and "@import" not in text and not re.search(r"url\(\s*['\"]?https?:", text)
    assert "<?xml" not in text and "<!DOCTYPE svg" not in text  # matplotlib's prologue stripped
    assert "default-src 'none'" in text  # the CSP: the browser refuses any fetch
    assert text.count("<svg") == len(PLOT_KEYS)
    assert len(text.encode()) < 5 * 2**20


def test_every_chart_is_drawn_when_its_data_exists(full_run: Path) -> None:
    plots = {p.key: p for p in all_plots(load_run(full_run))}
    assert set(plots) == set(PLOT_KEYS)
    assert all(p.svg for p in plots.values()), {k: p.note for k, p in plots.items() if not p.svg}


def test_missing_data_becomes_notes_not_errors(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, Spec(dims=("throughput",), gpu=False, comparison=False)))
    plots = {p.key: p for p in all_plots(run)}
    assert plots["latency"].svg
    assert plots["roofline"].svg is None and "only on GPU runs" in plots["roofline"].note
    assert plots["curves"].svg is None and plots["divergence"].svg is None
    assert plots["memory"].svg is None and plots["pareto"].svg is None
    html = render_html(run)
    assert "only on GPU runs" in html and "Significant changes" not in html


def test_huge_run_html_stays_small(huge_run: Path) -> None:
    html = render_html(load_run(huge_run))
    assert len(html.encode()) < 5 * 2**20
    assert "more row(s) not shown (size cap)" in html
    assert "showing 12 of 1500 cases" in html


def _open(browser: Browser, path: Path) -> None:
    browser.open(path.as_uri())
    assert browser.console_errors() == []
    assert browser.requests() == [path.as_uri()], "the report fetched something besides itself"
    assert not browser.page_events("Page.javascriptDialogOpening")


def test_report_renders_in_headless_chromium(full_run: Path, tmp_path: Path, browser: Browser) -> None:
    path = _report(full_run, tmp_path / "out")
    _open(browser, path)
    n_cards = len(headlines(load_run(full_run)))
    assert browser.evaluate("document.querySelectorAll('#verdicts .verdict-card').length") == n_cards >= 6
    drawn = browser.evaluate("Object.fromEntries(Array.from(document.querySelectorAll('figure.plot'))"
                             ".map(f => [f.id, f.querySelectorAll('svg').length]))")
    assert drawn == {f"plot-{k}": 1 for k in PLOT_KEYS}
    sizes = browser.evaluate("Array.from(document.querySelectorAll('figure.plot svg'))"
                             ".map(s => s.getBoundingClientRect().width)")
    assert all(w > 100 for w in sizes), sizes  # laid out, not collapsed
    for table in ("table-significant", "table-comparisons", "table-raw", "table-trials"):
        assert browser.evaluate(f"document.querySelectorAll('#{table} tbody tr').length") > 0, table
    # the significant-changes table fits the 1400 px window without a horizontal scroll
    assert browser.evaluate("document.querySelector('table#table-significant')"
                            ".getBoundingClientRect().right") <= 1400
    shot = browser.screenshot(tmp_path / "report.png")
    assert shot.stat().st_size > 10_000
    print(f"\nscreenshot of the HTML report: {shot}")


def test_minimal_run_renders_in_headless_chromium(tmp_path: Path, browser: Browser) -> None:
    folder = make_run(tmp_path, Spec(dims=("accuracy",), comparison=False, gpu=False))
    path = _report(folder, tmp_path / "out")
    _open(browser, path)
    assert browser.evaluate("document.querySelectorAll('.verdict-card').length") >= 1
    assert browser.evaluate("document.querySelectorAll('figure.plot svg').length") == 0
    assert "no per-round latency samples" in browser.evaluate("document.body.innerText")


def test_clicking_a_header_sorts_the_table(default_run: Path, tmp_path: Path, browser: Browser) -> None:
    _open(browser, _report(default_run, tmp_path / "out"))
    col = browser.evaluate("Array.from(document.querySelectorAll('#table-comparisons th'))"
                           ".findIndex(th => th.textContent === 'ratio / delta')")
    read = (f"Array.from(document.querySelectorAll('#table-comparisons tbody tr'))"
            f".map(r => r.cells[{col}].getAttribute('data-v'))")
    header = f"document.querySelectorAll('#table-comparisons th')[{col}]"
    browser.evaluate(f"{header}.click()")
    values = browser.evaluate(read)
    numbers = [float(v) for v in values if v is not None]
    assert numbers == sorted(numbers) and len(numbers) > 3
    assert values[len(numbers):] == [None] * (len(values) - len(numbers))  # missing values last
    assert browser.evaluate(f"{header}.getAttribute('aria-sort')") == "ascending"
    browser.evaluate(f"{header}.click()")
    numbers = [float(v) for v in browser.evaluate(read) if v is not None]
    assert numbers == sorted(numbers, reverse=True)


@pytest.mark.parametrize("dims", [("throughput",), ("memory",)])
def test_single_dimension_runs_render(tmp_path: Path, dims: tuple[str, ...]) -> None:
    html = render_html(load_run(make_run(tmp_path, Spec(dims=dims))))
    assert 'class="card verdict-card' in html and "<svg" in html
