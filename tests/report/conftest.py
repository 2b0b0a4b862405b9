"""Fixtures for the report tests: synthetic results folders (see ``report_fixtures``)."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_fixtures import Spec, make_run


@pytest.fixture
def default_run(tmp_path: Path) -> Path:
    return make_run(tmp_path, Spec())


@pytest.fixture
def full_run(tmp_path: Path) -> Path:
    """Every optional input present: stability curves, generalization, all three instruments."""
    return make_run(tmp_path, Spec(stability=True, instruments=True))


@pytest.fixture(scope="session")
def huge_run(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """1,500 cases: 22,500 records and 7,500 comparison rows (size caps); built once, only read."""
    return make_run(tmp_path_factory.mktemp("huge"), Spec(cases=1500))


@pytest.fixture(scope="session")
def browser(tmp_path_factory: pytest.TempPathFactory):
    """One headless Chromium for the session, driven over CDP (see ``cdp_client``)."""
    from cdp_client import Browser, find_chromium

    binary = find_chromium()
    if binary is None:
        pytest.skip("no Chromium on PATH (chromium, chromium-browser, google-chrome): run .ci/install_browser.sh "
                    "to test the HTML report in a browser")
    chrome = Browser(binary, tmp_path_factory.mktemp("chromium-profile"))
    yield chrome
    chrome.close()
