"""Hostile names and reasons (plugin, variant, failure reason, instrument keys) stay text in both formats."""

from __future__ import annotations

import re
from pathlib import Path

import pytest
from cdp_client import Browser
from report_fixtures import Spec, make_run

from microscope.report import write_reports

SCRIPT = "<script>alert(1)</script>"
IMG = '"><img src=x onerror=alert(1)>'


@pytest.fixture
def hostile_run(tmp_path: Path) -> Path:
    spec = Spec(plugin=f"evil{IMG}", candidate=f"{SCRIPT}|x", peer=f"peer{IMG}",
                fail_reason=f"kernel said {IMG} and {SCRIPT}", skip_reason=f"skip {SCRIPT}",
                acc_reason=f"bad {IMG}", stability=True, instruments=True)
    return make_run(tmp_path, spec)


def test_html_shows_hostile_text_escaped(hostile_run: Path, tmp_path: Path) -> None:
    html = write_reports(hostile_run, tmp_path / "out", formats=("html",))["html"].read_text(encoding="utf-8")
    ours = html.rindex("<script>")  # the one inline script: the table sorter, at the end of the body
    assert html.count("<script") == 1 and "alert" not in html[ours:]
    assert "<img" not in html and not re.search(r"<[^>]*\sonerror\s*=", html)
    assert "&lt;script&gt;alert(1)&lt;/script&gt;" in html
    assert "&#34;&gt;&lt;img src=x onerror=alert(1)&gt;" in html or "&quot;&gt;&lt;img" in html


def test_markdown_shows_hostile_text_escaped(hostile_run: Path, tmp_path: Path) -> None:
    md = write_reports(hostile_run, tmp_path / "out", formats=("md",))["md"].read_text(encoding="utf-8")
    assert "<script" not in md and "<img" not in md
    assert "&lt;script&gt;alert(1)&lt;/script&gt;\\|x" in md  # the pipe cannot split a table cell
    assert "&lt;img src=x onerror=alert(1)&gt;" in md
    for line in md.splitlines():
        if line.startswith("|"):
            assert not re.search(r"(?<!\\)\|x", line), line


def test_hostile_text_is_inert_in_the_browser(hostile_run: Path, tmp_path: Path, browser: Browser) -> None:
    path = write_reports(hostile_run, tmp_path / "out", formats=("html",))["html"]
    browser.open(path.as_uri())
    assert not browser.page_events("Page.javascriptDialogOpening"), "an alert() ran"
    assert browser.console_errors() == []
    assert browser.requests() == [path.as_uri()]
    assert browser.evaluate("document.querySelectorAll('img').length") == 0
    assert browser.evaluate("document.scripts.length") == 1
    text = browser.evaluate("document.body.innerText")
    assert SCRIPT in text and "onerror=alert(1)>" in text  # shown to the reader as text
