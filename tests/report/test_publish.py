"""The public API the CLI calls: file names, formats, user errors, lazy package exports."""

from __future__ import annotations

from pathlib import Path

import pytest
from report_fixtures import Spec, make_run

import microscope.report as report
from microscope.report import ReportError, report_command, write_reports


def test_write_reports_names_files_after_the_run(default_run: Path, tmp_path: Path) -> None:
    paths = write_reports(default_run, tmp_path / "reports")
    assert paths == {"md": tmp_path / "reports" / "20260101-000000-flash_attn.md",
                     "html": tmp_path / "reports" / "20260101-000000-flash_attn.html"}
    assert all(p.stat().st_size > 1000 for p in paths.values())


def test_report_command_with_one_format(default_run: Path, tmp_path: Path) -> None:
    paths = report_command(default_run, ["md"], tmp_path / "out")
    assert list(paths) == ["md"] and not (tmp_path / "out" / "20260101-000000-flash_attn.html").exists()


def test_unknown_format_and_missing_records_are_user_errors(default_run: Path, tmp_path: Path) -> None:
    with pytest.raises(ReportError, match="unknown report format.*'pdf'"):
        write_reports(default_run, tmp_path, formats=("pdf",))
    with pytest.raises(ReportError, match="no records.jsonl"):
        write_reports(tmp_path / "nothing-here", tmp_path)


def test_odd_run_folder_names_become_safe_file_names(tmp_path: Path) -> None:
    folder = make_run(tmp_path, Spec(run_id="..weird name;$(x)"))
    paths = write_reports(folder, tmp_path / "out", formats=("md",))
    assert paths["md"].parent == tmp_path / "out" and paths["md"].name == "weird_name_x.md"


def test_package_exports_resolve_lazily() -> None:
    for name in report.__all__:
        assert getattr(report, name) is not None
    with pytest.raises(AttributeError):
        report.no_such_name  # noqa: B018
