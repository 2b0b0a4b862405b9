"""Reading a results folder: everything but the records is optional, and damage becomes a note."""

from __future__ import annotations

import json
from pathlib import Path

from report_fixtures import Spec, make_run

from microscope.report.load import load_run


def test_full_folder_loads_every_part(full_run: Path) -> None:
    run = load_run(full_run)
    assert run.run_id == "20260101-000000-flash_attn" and run.path == full_run
    assert run.comparison is not None and len(run.comparison) == 23
    assert run.divergence and run.trace_diff and run.graph_diff
    assert run.config_text and run.config_text.startswith("plugin: flash_attn")
    assert run.env["device_name"] == "NVIDIA H200" and run.notes == []
    assert run.dimensions == ["accuracy", "throughput", "memory", "stability", "generalization"]
    assert isinstance(run.records.loc[run.records["metric"] == "latency_ms", "details.rounds"].dropna().iloc[0], list)


def test_missing_comparison_and_instruments_are_optional(tmp_path: Path) -> None:
    run = load_run(make_run(tmp_path, Spec(comparison=False)))
    assert run.comparison is None and run.divergence is None and run.trace_diff is None
    assert any("no comparison table" in n for n in run.notes)


def test_damaged_inputs_become_notes(default_run: Path) -> None:
    (default_run / "divergence.json").write_text("{not json", encoding="utf-8")
    (default_run / "trace_diff.json").write_text(json.dumps([1, 2]), encoding="utf-8")
    with (default_run / "records.jsonl").open("a") as fh:
        fh.write("[1, 2]\n{cut")
    run = load_run(default_run)
    assert run.divergence is None and run.trace_diff is None
    text = " ".join(run.notes)
    assert "divergence.json unreadable" in text and "trace_diff.json is not an object" in text
    assert "2 line(s) are not JSON records" in text


def test_text_columns_stay_text(default_run: Path) -> None:
    csv = default_run / "comparison.csv"
    csv.write_text(csv.read_text().replace(",sdpa,", ",NA,"), encoding="utf-8")
    run = load_run(default_run)
    assert "NA" in set(run.comparison["candidate"])


def test_records_disagreeing_on_env_are_noted(default_run: Path) -> None:
    lines = (default_run / "records.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["env"] = dict(rec["env"], torch="9.9")
    (default_run / "records.jsonl").write_text("\n".join(lines + [json.dumps(rec)]) + "\n")
    run = load_run(default_run)
    assert run.env["torch"] == "2.13.0"
    assert any("disagree on their environment (torch: 2 values)" in n for n in run.notes)


def test_a_field_some_records_lack_is_no_disagreement(default_run: Path) -> None:
    """A trial that failed before its workload loaded carries fewer env fields; that is not another machine."""
    lines = (default_run / "records.jsonl").read_text().splitlines()
    rec = json.loads(lines[0])
    rec["env"] = {k: v for k, v in rec["env"].items() if k != "torch"}
    (default_run / "records.jsonl").write_text("\n".join(lines + [json.dumps(rec)]) + "\n")
    run = load_run(default_run)
    assert run.env["torch"] == "2.13.0"
    assert not any("disagree on their environment" in n for n in run.notes)
