"""What ``microscope regress`` says: one paragraph for the console, a Markdown report for an issue.

The paragraph is the verdict a person acts on, so it names the exit code's reason in words: which
measurement regressed, by how much against which band, and what confirmed it; or why the night could
not be measured. The report (``<out>/regress.md``, with the gating table as ``regress.csv``) adds the
machine, the baseline's runs, every flagged and noisy row, the exact checks and the runs' folders.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import pandas as pd
from rich.console import Console
from rich.table import Table
from rich.text import Text

from microscope.stats.steps import short_commit

from . import fmt

if TYPE_CHECKING:
    from microscope.regress import Outcome

__all__ = ["explain", "print_outcome", "render_markdown", "write_report"]

MAX_ROWS = 40


def _label(row: pd.Series | dict) -> str:
    return f"{row['plugin']} | {row['variant']} | {row['case_id']} | {row['dimension']} {row['metric']}"


def _effect(row: pd.Series | dict) -> str:
    """``x1.052 [1.041, 1.063], band +-1.5%`` (ratio) or ``+2.1e-07 [..], band +-3e-08`` (difference)."""
    if fmt.finite(row.get("effect")) is None:
        return "-"
    if row.get("log"):
        band = f", band +-{row['tau']:.1%}" if fmt.finite(row.get("tau")) is not None else ""
        return f"{fmt.times(row['effect'])} {fmt.ci(row['ci_low'], row['ci_high'])}{band}"
    band = f", band +-{row['tau']:.3g}" if fmt.finite(row.get("tau")) is not None else ""
    return f"{row['effect']:+.3g} {fmt.ci(row['ci_low'], row['ci_high'])}{band}"


def _baseline_words(o: Outcome) -> str:
    if not o.baseline_runs:
        return f"baseline {o.ref!r}"
    commits = sorted({short_commit(r.commit) for r in o.baseline_runs})
    return (f"baseline {o.ref!r} (commit {', '.join(commits)}, {len(o.baseline_runs)} run(s) on machine "
            f"{o.fingerprint})")


def _tonight_words(o: Outcome) -> str:
    if not o.nights:
        return "nothing was run"
    night = o.nights[0]
    per = len(night.runs) // max(1, len(o.configs))
    return f"{per} fresh run(s) of each of {len(o.configs)} config(s) tonight"


def explain(o: Outcome) -> None:
    """Fill ``o.headline`` and ``o.paragraph`` from the outcome (the exit code is already decided)."""
    parts: list[str] = []
    table = o.table if o.table is not None else pd.DataFrame()
    tested = int(table["p"].notna().sum()) if len(table) else 0
    exact = o.exact
    if o.exit_code == 1:
        o.headline = "regress: REGRESSION (exit 1)"
        for key, why in list(o.confirmed.items())[:4]:
            row = table[(table[["plugin", "variant", "case_id", "dimension", "metric"]].astype(str)
                         .apply(tuple, axis=1)) == key].iloc[0]
            parts.append(f"{_label(row)} regressed: {_effect(row)} over {row['n_base']} baseline vs {row['n_new']} "
                         f"run(s), p_holm={fmt.pvalue(row['p_holm'])} across {tested} gating test(s); {why}.")
        if exact is not None and exact.differs:
            parts.append(f"The exact gate ({exact.baseline.path}) failed: " +
                         "; ".join(c.describe() for c in exact.differs[:4]) + ".")
        parts.append(f"Compared: {_tonight_words(o)} against the {_baseline_words(o)}." if o.ref else
                     f"Ran: {_tonight_words(o)}.")
        if o.problems:
            parts.append("Also: " + "; ".join(o.problems) + ".")
    elif o.exit_code == 2:
        o.headline = "regress: COULD NOT MEASURE (exit 2)"
        parts.append("Could not measure tonight: " + "; ".join(o.problems) + ".")
        parts.append(_advice(o))
    else:
        o.headline = "regress: clean (exit 0)"
        if o.ref:
            bands = table.loc[table["log"] & table["tau"].notna(), "tau"] if len(table) else pd.Series(dtype=float)
            band = f" (noise bands +-{bands.min():.1%} to +-{bands.max():.1%})" if len(bands) else ""
            if o.unconfirmed:
                parts.append(f"No confirmed regression: {tested} gating comparison(s) of {_tonight_words(o)} against "
                             f"the {_baseline_words(o)}{band}.")
            else:
                parts.append(f"No regression: {tested} gating comparison(s) of {_tonight_words(o)} against the "
                             f"{_baseline_words(o)}; none is significant after Holm beyond its between-run "
                             f"band{band}.")
        if o.unconfirmed:
            parts.append(f"{len(o.unconfirmed)} row(s) looked like regressions in the first sample (e.g. "
                         f"{' | '.join(o.unconfirmed[0])}) but the confirming rerun did not agree: treated as noise.")
        if exact is not None:
            same = sum(c.status == "same" for c in exact.checks)
            parts.append(f"Exact gate ({exact.baseline.path}): {len(exact.checks)} deterministic metric(s) reproduced, "
                         f"{same} bit-exact, {len(exact.checks) - same} within their declared tolerance.")
    if o.seconds:
        parts.append(f"Wall time {o.seconds:.0f} s.")
    o.paragraph = " ".join(p for p in parts if p)


def _advice(o: Outcome) -> str:
    text = " ".join(o.problems)
    if o.started:
        runs = sum(len(n.folders) for n in o.nights)
        verdict = ("gate pass: the next night is compared with them" if o.first_night_clean else
                   "gate fail, because of the problems above: the next night starts the history again")
        return f"Tonight's {runs} run(s) started the history {o.history} for this machine ({verdict})."
    if "noisy machine" in text:
        return ("A regression of that size could hide in the noise: rerun on a quieter machine (no other jobs, "
                "fixed clocks) or with a larger --repeat.")
    if "failed trials" in text:
        return "Fix or explain the failed trials first (their reasons are in the runs' records and reports)."
    if o.unusable_history:
        return (f"Nothing was run and {o.history} was left as it is: fix or replace it as the message says (a "
                "damaged history is never started over).")
    if "no comparable baseline" in text:
        return ("Timings are only comparable on one machine: start the history on this machine (`microscope run "
                "CONFIG --history PATH` for a first night, or `microscope history add`), or name a reference it "
                "holds.")
    return "Check the runs listed in the report."


# -- console ------------------------------------------------------------------------------------------


def _rows_to_show(table: pd.DataFrame | None) -> pd.DataFrame:
    if table is None or not len(table):
        return pd.DataFrame()
    keep = table["flagged"] | table["noisy"] | table["verdict"].isin(["failed", "improved"])
    return table[keep].head(MAX_ROWS)


def print_outcome(o: Outcome, console: Console, report: Path | None) -> None:
    shown = _rows_to_show(o.table)
    if len(shown):
        t = Table(title=Text("regress: rows that moved or could not be judged"), header_style="bold",
                  title_justify="left")
        for col in ("measurement", "baseline", "tonight", "effect, 95% CI, band", "p_holm", "verdict", "confirmed"):
            t.add_column(Text(col), overflow="fold")
        for _, row in shown.iterrows():
            key = tuple(str(row[k]) for k in ("plugin", "variant", "case_id", "dimension", "metric"))
            t.add_row(*(Text(str(v)) for v in (
                _label(row), fmt.metric_value(row["metric"], row["base_value"], row["unit"] or ""),
                fmt.metric_value(row["metric"], row["new_value"], row["unit"] or ""), _effect(row),
                fmt.pvalue(row["p_holm"]), row["verdict"] + (" (noisy)" if row["noisy"] else ""),
                "yes" if key in o.confirmed else ("no" if key in o.unconfirmed else "")))),
        console.print(t)
    if o.exact is not None:
        for check in o.exact.differs[:10]:
            console.print(Text(f"exact: {check.describe()}", style="red"), highlight=False, soft_wrap=True)
    for note in o.notes:
        console.print(Text(f"note: {note}", style="yellow"), highlight=False, soft_wrap=True)
    style = {0: "bold green", 1: "bold red"}.get(o.exit_code, "bold yellow")
    console.print(Text(o.headline, style=style), highlight=False)
    console.print(Text(o.paragraph), highlight=False, soft_wrap=True)
    if report is not None:
        console.print(Text(f"report: {report}"), highlight=False, soft_wrap=True)


# -- Markdown -----------------------------------------------------------------------------------------


def _md(text: object) -> str:
    return str(text).replace("|", "\\|").replace("\n", " ")


def _md_table(table: pd.DataFrame, o: Outcome) -> list[str]:
    lines = ["| measurement | baseline | tonight | effect, 95% CI, band | p | p_holm | noise | verdict |",
             "| --- | --- | --- | --- | --- | --- | --- | --- |"]
    for _, row in table.head(MAX_ROWS).iterrows():
        key = tuple(str(row[k]) for k in ("plugin", "variant", "case_id", "dimension", "metric"))
        verdict = str(row["verdict"]) + (" (noisy)" if row["noisy"] else "")
        verdict += " **confirmed**" if key in o.confirmed else (" (not confirmed)" if key in o.unconfirmed else "")
        noise = f"{row['noise_source']} sd {row['sigma']:.3g}" if fmt.finite(row.get("sigma")) is not None else "-"
        lines.append("| " + " | ".join(_md(v) for v in (
            _label(row), fmt.metric_value(row["metric"], row["base_value"], row["unit"] or ""),
            fmt.metric_value(row["metric"], row["new_value"], row["unit"] or ""), _effect(row), fmt.pvalue(row["p"]),
            fmt.pvalue(row["p_holm"]), noise, verdict)) + " |")
    if len(table) > MAX_ROWS:
        lines.append(f"\n{len(table) - MAX_ROWS} more row(s) in regress.csv")
    return lines


def render_markdown(o: Outcome) -> str:
    """The report: verdict, context, flagged rows, every gating row (folded), exact checks, runs."""
    lines = [f"## {o.headline}", "", o.paragraph, "", "| | |", "| --- | --- |",
             f"| machine | `{o.fingerprint}` {_md(o.machine)} |",
             f"| suite | {', '.join(f'`{c}`' for c in o.configs)} |"]
    if o.ref:
        runs = "; ".join(f"{r.run_id} ({short_commit(r.commit)}, {r.date[:16]})" for r in o.baseline_runs[:6])
        more = f" and {len(o.baseline_runs) - 6} more" if len(o.baseline_runs) > 6 else ""
        lines.append(f"| baseline | `{_md(o.ref)}` in `{o.history}`: {_md(runs) or '-'}{more} |")
    if o.previous_runs:
        commit = short_commit(o.previous_runs[-1].commit)
        lines.append(f"| previous night | {len(o.previous_runs)} run(s), commit {commit} |")
    for night in o.nights:
        lines.append(f"| {night.label} | {len(night.runs)} run(s), commit {short_commit(night.commit)}, "
                     f"{night.seconds:.0f} s |")
    lines += ["", f"Reproduce: `{_md(o.command)}`", ""]
    table = o.table
    if table is not None and len(table):
        shown = _rows_to_show(table)
        if len(shown):
            lines += ["### Rows that moved or could not be judged", "", *_md_table(shown, o), ""]
        lines += ["<details><summary>Every gating comparison "
                  f"({len(table)}, Holm over {int(table['p'].notna().sum())} tests)</summary>", "",
                  *_md_table(table, o), "", "</details>", ""]
    if o.confirm_table is not None and len(o.confirm_table):
        lines += ["### Confirming rerun", "", *_md_table(o.confirm_table, o), ""]
    if o.exact is not None:
        lines += _exact_lines(o)
    if o.problems or o.notes:
        lines += ["### Notes", "", *[f"- {_md(p)}" for p in o.problems + o.notes], ""]
    runs = [(night.label, r) for night in o.nights for r in night.runs]
    if runs:
        lines += ["<details><summary>Runs</summary>", "", "| sample | config | folder | exit | seconds |",
                  "| --- | --- | --- | --- | --- |"]
        lines += [f"| {label} | `{r.config}` | `{r.folder}` | {r.exit_code} | {r.seconds:.1f} |" for label, r in runs]
        lines += ["", "</details>", ""]
    return "\n".join(lines)


def _exact_lines(o: Outcome) -> list[str]:
    from microscope.store.baselines import describe_class, number

    exact = o.exact
    lines = [f"### Exact gate: `{exact.baseline.path}` (values of machine class "
             f"{describe_class(exact.baseline.applies_to)})",
             ""]
    lines += [f"- {_md(p)}" for p in exact.problems + exact.notes]
    bad = exact.differs + exact.unmeasured
    if bad:
        lines += ["", "| metric | baseline | tonight | tolerance | result |", "| --- | --- | --- | --- | --- |"]
        for c in bad[:MAX_ROWS]:
            now = "-" if c.now is None else number(c.now)
            lines.append(f"| {_md(c.metric.label)} | {number(c.metric.value)} | {now} | {c.metric.tolerance()} | "
                         f"**{c.status}** |")
    same = sum(c.status == "same" for c in exact.checks)
    lines += ["", f"{len(exact.checks)} metric(s) checked: {same} bit-exact, "
                  f"{sum(c.status == 'within' for c in exact.checks)} within tolerance, {len(exact.differs)} differ, "
                  f"{len(exact.unmeasured)} not measured.", ""]
    return lines


def write_report(o: Outcome, out: Path) -> Path:
    """``<out>/regress.md`` (and ``regress.csv``, the gating table); returns the Markdown's path."""
    out.mkdir(parents=True, exist_ok=True)
    path = out / "regress.md"
    path.write_text(render_markdown(o), encoding="utf-8")
    if o.table is not None and len(o.table):
        o.table.to_csv(out / "regress.csv", index=False)
    return path
