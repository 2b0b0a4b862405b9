"""The Markdown report: verdicts first, only significant rows unfolded, bounded size, valid tables."""

from __future__ import annotations

import re
from pathlib import Path

import pandas as pd
from report_fixtures import ACC_FAIL, OOM, SKIP, Spec, make_run

from microscope.report.load import load_run
from microscope.report.markdown import MAX_CHARS, esc, render_markdown


def _md(folder: Path) -> str:
    return render_markdown(load_run(folder))


def table_blocks(md: str) -> list[list[str]]:
    """Consecutive lines starting with '|' (outside <pre>), one list per table."""
    blocks: list[list[str]] = []
    current: list[str] = []
    for line in md.splitlines():
        if line.startswith("|"):
            current.append(line)
        elif current:
            blocks.append(current)
            current = []
    if current:
        blocks.append(current)
    return blocks


def cells(line: str) -> int:
    """Cell count of a GFM table row: unescaped pipes minus one."""
    return len(re.findall(r"(?<!\\)\|", line)) - 1


def assert_valid_tables(md: str) -> None:
    blocks = table_blocks(md)
    for block in blocks:
        assert len(block) >= 3, block  # header, separator, at least one row
        assert re.fullmatch(r"\|(-{3}:?\|)+|\|((---|---:)\|)+", block[1]), block[1]
        widths = {cells(line) for line in block}
        assert len(widths) == 1, f"rows with different cell counts: {widths}\n" + "\n".join(block[:5])


def test_headline_comes_first_then_env_warnings_table_and_folds(default_run: Path) -> None:
    md = _md(default_run)
    lines = md.splitlines()
    assert lines[0].startswith("### microscope run 20260101-000000-flash")
    first_bullet = next(i for i, line in enumerate(lines) if line.startswith("- "))
    assert "**accuracy**" in lines[first_bullet] or "**throughput**" in lines[first_bullet]
    order = [md.index(s) for s in ("triton faster than eager in 2/3 correct cases", "**Environment:**", "**Warnings**",
                                   "**Significant changes**", "<details><summary>All comparisons")]
    assert order == sorted(order), order
    assert "| case | dimension | metric | baseline | candidate |" in md
    assert md.count("<details>") == md.count("</details>") >= 3
    assert_valid_tables(md)


def test_headline_sentences_per_dimension(default_run: Path) -> None:
    md = _md(default_run)
    head = md[: md.index("**Environment:**")]
    # the case where triton fails accuracy is not a speed or memory win (KernelBench's fast_p)
    assert "triton faster than eager in 2/3 correct cases (×2.5); 1 not judged, 1 failed" in head
    assert ("triton: 7/8 accuracy checks pass, 1 fail (worst: out.rel\\_err 3.10e-02 in seq=1024); "
            "all checks pass in 3/4 cases") in head
    assert "triton uses less peak memory than eager in 2/3 correct cases (−40.0%); 1 not judged, 1 failed" in head
    assert "**not measured here**: sdpa (needs the flash backend of SDPA (sm80+))" in head


def test_env_line_names_gpu_versions_commit_and_corpus(default_run: Path) -> None:
    env = next(line for line in _md(default_run).splitlines() if line.startswith("**Environment:**"))
    for part in ("GPU NVIDIA H200 (CUDA 12.8, sm 9.0)", "torch 2.13.0", "triton 3.9.0", "python 3.11.7",
                 "commit 0123456789ab", "corpus c0ffee00c0ffee00"):
        assert part in env, (part, env)


def test_only_significant_rows_are_unfolded(default_run: Path) -> None:
    md = _md(default_run)
    unfolded = md[md.index("**Significant changes**"): md.index("<details>")]
    rows = [line for line in unfolded.splitlines() if line.startswith("| seq=")]
    assert len(rows) == 5  # 2 faster + 2 less + 1 fail; the failing case's speed and memory are not judged
    assert rows[0].rstrip().endswith("| fail |")  # regressions first
    assert not any(v in unfolded for v in ("| pass |", "| skipped |", "| failed |"))


def test_failed_trials_are_listed_with_their_reasons(default_run: Path) -> None:
    md = _md(default_run)
    warnings = md[md.index("**Warnings**"): md.index("**Significant changes**")]
    assert "2 failed trial record(s)" in warnings
    assert esc(OOM) in warnings and "triton" in warnings
    assert "12 skipped" in warnings and esc(SKIP) in warnings
    trials = md[md.index("<details><summary>Failed and skipped trials"):]
    assert trials.count(esc(OOM)) == 2 and esc(SKIP) in trials
    assert esc(ACC_FAIL) in md  # the accuracy failure's reason, in the raw numbers


def test_single_dimension_run_without_comparison(tmp_path: Path) -> None:
    folder = make_run(tmp_path, Spec(dims=("throughput",), comparison=False, gpu=False, interpreted=True))
    md = _md(folder)
    head = md[: md.index("**Environment:**")]
    assert "**throughput**" in head and "**accuracy**" not in head and "**memory**" not in head
    assert re.search(r"triton vs eager: latency ×0\.3\d+ the baseline.s", head) and "no statistical verdict" in head
    assert "sdpa vs eager: not measured; 4 skipped" in head
    assert "no comparison table" in md and "CPU interpreter" in md
    assert "**Significant changes**" not in md
    assert "<details><summary>Raw numbers per variant and case" in md
    assert_valid_tables(md)


def test_single_dimension_run_with_comparison(tmp_path: Path) -> None:
    md = _md(make_run(tmp_path, Spec(dims=("memory",))))
    head = md[: md.index("**Environment:**")]
    assert "**memory**" in head and "**throughput**" not in head
    assert_valid_tables(md)


def test_stability_generalization_and_instruments(full_run: Path) -> None:
    md = _md(full_run)
    head = md[: md.index("**Environment:**")]
    assert "**stability**" in head and "loss non-inferior" in head and "grad\\_norm equivalent" in head
    assert "**generalization**" in head and "ood\\_loss worse" in head
    assert "first diverges at layers.3.attn" in md
    assert "3 eager kernels replaced by 1 fused kernel" in md
    for title in ("Layer-wise divergence", "Kernel trace diff", "Graph diff"):
        assert f"<details><summary>{title}" in md
    assert_valid_tables(md)


def test_huge_run_stays_under_the_cap_with_headline_intact(huge_run: Path) -> None:
    md = _md(huge_run)
    assert len(md) < MAX_CHARS == 65_000
    assert "triton faster than eager in 1498/1499 correct cases (×2.5); 1 not judged, 1 failed" in md
    assert "more row(s) not shown here (size cap)" in md
    assert md.count("<details>") == md.count("</details>")
    assert_valid_tables(md)


def test_cut_records_line_is_reported_not_fatal(default_run: Path) -> None:
    with (default_run / "records.jsonl").open("a") as fh:
        fh.write('{"run_id": "20260101-000000-flash_attn", "plugin": "fla')
    md = _md(default_run)
    assert "not JSON records" in md and "killed mid-write" in md
    assert "triton faster than eager" in md


def test_escape_keeps_table_cells_and_html_inert() -> None:
    assert esc("a|b") == "a\\|b"
    assert esc("<b>x</b>") == "&lt;b&gt;x&lt;/b&gt;"
    assert esc("*bold* [link](x) `code`") == "\\*bold\\* \\[link\\](x) \\`code\\`"
    assert esc("two\nlines") == "two lines"


def test_empty_run_still_gets_a_report(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "records.jsonl").write_text("")
    md = _md(tmp_path / "r")
    assert md.startswith("### microscope run r") and "No measurements in this run" in md


def test_run_where_every_trial_failed(tmp_path: Path) -> None:
    folder = make_run(tmp_path, Spec(comparison=False))
    lines = (folder / "records.jsonl").read_text().splitlines()
    broken = [line.replace('"status": "ok"', '"status": "failed"').replace('"reason": null', '"reason": "boom"')
              for line in lines]
    (folder / "records.jsonl").write_text("\n".join(broken) + "\n")
    md = _md(folder)
    assert "triton vs eager: not measured" in md and "failed trial record(s)" in md and "boom" in md
    assert_valid_tables(md)


def test_model_level_speed_gets_an_untested_headline_with_its_ratios() -> None:
    from microscope.report.headline import from_comparison
    from microscope.stats import TABLE_COLUMNS

    def row(metric: str, base: float, cand: float, plugin: str = "grad_checkpoint") -> dict:
        r = dict.fromkeys(TABLE_COLUMNS, "")
        r.update(plugin=plugin, case_id="profile=gpu,task=lm", dimension="throughput", metric=metric,
                 baseline="none", candidate="every_1", role="candidate", baseline_value=base,
                 candidate_value=cand, ratio_or_delta=cand / base, verdict="info")
        return r

    table = pd.DataFrame([row("train_tokens_per_s", 360951.0, 264445.0), row("decode_tokens_per_s", 4729.0, 3764.0)])
    lines = [h.text for h in from_comparison(table) if h.dimension == "throughput"]
    assert lines == ["every_1 vs none: train_tokens_per_s ×0.733, decode_tokens_per_s ×0.796 "
                     "(rates; no statistical test)"]


def test_a_distributed_arm_against_one_process_gets_its_scaling_efficiency() -> None:
    """ddp on 4 ranks at 3.2x one process's train tokens/s: 80% scaling efficiency. A skipped
    comm_time_share row (the single-process baseline has no communication) is a share, not a latency."""
    from microscope.report.headline import from_comparison
    from microscope.stats import TABLE_COLUMNS

    def row(metric: str, base: float | None, cand: float, verdict: str = "info") -> dict:
        r = dict.fromkeys(TABLE_COLUMNS, "")
        r.update(plugin="data_parallel", case_id="profile=gpu,task=lm", dimension="throughput", metric=metric,
                 baseline="single", candidate="ddp", role="candidate", baseline_value=base, candidate_value=cand,
                 ratio_or_delta=cand / base if base else float("nan"), verdict=verdict)
        return r

    table = pd.DataFrame([row("train_tokens_per_s", 1000.0, 3200.0), row("comm_time_share", None, 0.12, "skipped")])
    lines = [h.text for h in from_comparison(table, {"ddp": 4}) if h.dimension == "throughput"]
    assert lines == ["ddp vs single: train_tokens_per_s ×3.2; scaling efficiency 80% on 4 ranks "
                     "(rates; no statistical test)"]
    # both arms on ranks (ddp vs zero3): no single-process speed to scale from
    lines = [h.text for h in from_comparison(table, {"ddp": 4, "single": 4}) if h.dimension == "throughput"]
    assert lines == ["ddp vs single: train_tokens_per_s ×3.2 (rates; no statistical test)"]


def test_an_undecided_model_accuracy_headline_names_the_metric_closest_to_a_decision() -> None:
    """The accuracy sentence says how many seeds the nearest inconclusive metric would need, from the
    estimate the seed comparison put in its notes; a decided table says nothing of seeds."""
    from microscope.report.headline import from_comparison
    from microscope.stats import TABLE_COLUMNS, compare_seed_accuracy, estimate_seeds_needed

    base = [2.01, 2.11, 2.12]
    shifts = {"val_loss": [0.05, -0.12, -0.05], "decode_loss": [0.02, -0.15, 0.01], "val_ppl": [0.3, -0.1, -0.3]}

    def row(metric: str, shift: list[float]) -> dict:
        res = compare_seed_accuracy(base, [b + s for b, s in zip(base, shift)], method="paired")
        r = dict.fromkeys(TABLE_COLUMNS, "")
        r.update(plugin="sliding_window_attention", case_id="profile=gpu,task=lm", dimension="accuracy",
                 metric=metric, baseline="full", candidate="window", role="candidate",
                 baseline_value=res.base_mean, candidate_value=res.cand_mean, ratio_or_delta=res.estimate,
                 ci_low=res.ci_low, ci_high=res.ci_high, verdict=res.verdict, notes="; ".join(res.notes))
        return r

    table = pd.DataFrame([row(m, s) for m, s in shifts.items()])
    need = {m: estimate_seeds_needed(s) for m, s in shifts.items()}
    nearest = min((n, m) for m, n in need.items() if n is not None)
    lines = [h.text for h in from_comparison(table) if h.dimension == "accuracy"]
    assert len(lines) == 1 and lines[0].endswith(f"; {nearest[1]} needs about {nearest[0]} seeds to decide")
    decided = pd.DataFrame([row("val_loss", [0.10, 0.12, 0.09])])
    assert "seeds" not in " ".join(h.text for h in from_comparison(decided) if h.dimension == "accuracy")
