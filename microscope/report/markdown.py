"""The Markdown report: a pull-request comment a reviewer can read in ten seconds.

Order: the verdict sentences, the environment line, the warnings, the instrument findings, then
only the significant rows (regressions first); everything else (all comparisons, raw numbers, failed
and skipped trials, instrument tables, config) is folded into ``<details>`` blocks.

GitHub rejects comments over 65,536 characters, so the whole text stays under ``MAX_CHARS`` whatever
the run size: the unfolded part is bounded by construction, and the folded sections share what is
left, each cut at a row boundary with a note saying how many rows were left out. Every piece of text
that comes from a config, a plugin or a record goes through ``esc``: ``<``, ``>`` and ``&`` become
entities (GitHub shows them as text, never as HTML) and Markdown punctuation, pipes included, is
backslash-escaped so no name can break a table or start a link.
"""

from __future__ import annotations

import html
import re
from collections.abc import Sequence

from . import fmt
from .caveats import caveats, env_lines
from .headline import Headline, headlines
from .instruments import instrument_findings, instrument_tables
from .load import RunData
from .tables import Table, comparison_table, raw_table, significant_rows, trials_table

MAX_CHARS = 65_000
#: Kept free below MAX_CHARS for the closing notes, so cutting never needs a second pass.
SAFETY = 1_500
SIGNIFICANT_SHOWN = 25
HEADLINE_CHARS = 1_000
_TONE = {"good": "\u2705", "bad": "\u274c", "warn": "\u26a0\ufe0f", "neutral": "\u2796"}
_MD_SPECIAL = re.compile(r"([\\`*_\[\]|~#!])")
_SIG_COLS = ("plugin", "case", "dimension", "metric", "baseline", "candidate", "baseline value",
             "candidate value", "ratio / delta", "95% CI", "p adj", "verdict")


def esc(text: object) -> str:
    """Text safe anywhere in GitHub Markdown (a table cell, a list item, a summary): shown verbatim."""
    s = " ".join(str(text).split())
    s = html.escape(s, quote=False)
    return _MD_SPECIAL.sub(r"\\\1", s)


def md_table(table: Table, columns: Sequence[str] | None = None, budget: int | None = None,
             start: int = 0) -> tuple[str, int]:
    """A GFM table of ``table`` (optionally a subset of columns) within ``budget`` characters.

    Returns the text and the number of rows that fit; the caller says what was left out.
    """
    idx = [i for i, c in enumerate(table.columns) if columns is None or c in columns]
    head = "| " + " | ".join(esc(table.columns[i]) for i in idx) + " |\n"
    head += "|" + "|".join("---:" if table.numeric[i] else "---" for i in idx) + "|\n"
    if budget is not None and len(head) > budget:
        return "", 0
    lines, used, shown = [head], len(head), 0
    for row in table.rows[start:]:
        line = "| " + " | ".join(esc(row[i]) if row[i] else " " for i in idx) + " |\n"
        if budget is not None and used + len(line) > budget:
            break
        lines.append(line)
        used += len(line)
        shown += 1
    return ("".join(lines), shown) if shown else ("", 0)


def details(summary: str, body: str) -> str:
    """A folded block; the blank lines make GitHub render the Markdown inside it."""
    return f"<details><summary>{esc(summary)}</summary>\n\n{body.rstrip()}\n\n</details>\n\n"


def _left_out(n: int, where: str) -> str:
    return f"\n_{n} more row(s) not shown here (size cap); {esc(where)}._\n"


def _headline_block(items: list[Headline]) -> str:
    if not items:
        return "_No measurements in this run._\n\n"
    lines = [f"- {_TONE.get(h.tone, '')} **{esc(h.dimension)}**: {esc(fmt.clip(h.text, HEADLINE_CHARS))}"
             for h in items]
    return "\n".join(lines) + "\n\n"


def _progress_block(run: RunData) -> str:
    """Failed trial groups and an unfinished run, before any verdict."""
    lines = run.progress.lines() if run.progress is not None else []
    out = []
    for text, items in lines:
        out.append(f"- \u274c **{esc(text)}**")
        out += [f"  - {esc(item)}" for item in items]
    return "\n".join(out) + "\n\n" if out else ""


def _caveat_block(run: RunData) -> str:
    items = caveats(run)
    if not items:
        return ""
    lines = ["**Warnings**", ""]
    for c in items:
        mark = "\u26a0\ufe0f" if c.level == "warn" else "\u2139\ufe0f"
        lines.append(f"- {mark} {esc(c.text)}")
        lines += [f"  - {esc(sub)}" for sub in c.items]
    return "\n".join(lines) + "\n\n"


def _folded_table(title: str, table: Table, budget: int, where: str, columns: Sequence[str] | None = None,
                  start: int = 0) -> str:
    """A folded table cut to ``budget``; an empty string when the table has no rows to show."""
    remaining = table.total - start
    if remaining <= 0:
        return ""
    note_room = 300 + len(title)
    body, shown = md_table(table, columns, max(0, budget - note_room), start)
    if shown < remaining:
        body += _left_out(remaining - shown, where)
    return details(f"{title} ({remaining} row(s))", body)


def _config_block(text: str, budget: int) -> str:
    """The config as run; whole-line comments go first when it would not fit, so settings are never cut."""
    room = max(0, budget - 200)
    if len(text) > room:
        text = "\n".join(line for line in text.splitlines() if not line.lstrip().startswith("#"))
    body = html.escape(text[:room])
    note = "" if len(text) <= room else f"\n_config cut at {room} characters (size cap)._\n"
    return details("Config", f"<pre>{body}</pre>\n{note}")


def _title(run: RunData) -> str:
    return f"### {esc(run.title or 'microscope run ' + run.run_id)}\n\n"


def render_markdown(run: RunData, max_chars: int = MAX_CHARS) -> str:
    """The whole comment; ``len(result) < max_chars`` for any run."""
    comp = run.comparison
    show_plugin = bool(len(run.records) and run.records["plugin"].nunique() > 1) or bool(
        comp is not None and len(comp) and comp["plugin"].nunique() > 1)
    sig_cols = [c for c in _SIG_COLS if c != "plugin" or show_plugin]

    top = _title(run) + _progress_block(run) + _headline_block(headlines(run))
    top += "**Environment:** " + " <br> ".join(esc(line) for line in env_lines(run)) + "\n\n"
    top += _caveat_block(run)
    findings = instrument_findings(run)
    if findings:
        top += "**Instruments**\n\n" + "\n".join(f"- {esc(f)}" for f in findings[:12]) + "\n\n"
    sig = comparison_table(significant_rows(comp), show_plugin) if comp is not None else None
    if sig is not None:
        if sig.total:
            body, shown = md_table(sig.head(SIGNIFICANT_SHOWN), sig_cols)
            top += f"**Significant changes** ({sig.total} of {len(comp)} comparisons)\n\n{body}\n"
            if sig.total > shown:
                top += f"_{sig.total - shown} more significant row(s) in the folded section below._\n\n"
        else:
            top += f"_No significant changes among {len(comp)} comparisons._\n\n"
    if len(top) > max_chars - SAFETY:  # pathological names: never exceed the cap, say so
        top = top[: max_chars - SAFETY - 200] + "\n\n_Summary cut at the size cap._\n\n"

    where = "see the HTML report or comparison.csv"
    budget = max_chars - SAFETY - len(top)
    folded: list[tuple[str, Table, str, Sequence[str] | None, int]] = []
    if sig is not None and sig.total > SIGNIFICANT_SHOWN:
        folded.append(("More significant changes", sig, where, sig_cols, SIGNIFICANT_SHOWN))
    if comp is not None and len(comp):
        folded.append(("All comparisons", comparison_table(comp, show_plugin), where, None, 0))
    folded.append(("Raw numbers per variant and case", raw_table(run.records), "see the HTML report or "
                   "records.jsonl", None, 0))
    folded.append(("Failed and skipped trials", trials_table(run.records), "see records.jsonl", None, 0))
    for title, table in instrument_tables(run):
        folded.append((title, table, "see the HTML report", None, 0))

    parts = []
    reserve = 400
    for i, (title, table, where_, cols, start) in enumerate(folded):
        later = reserve * (len(folded) - i - 1) + (reserve if run.config_text else 0)
        block = _folded_table(title, table, max(0, budget - later), where_, cols, start)
        if len(block) > budget - later:  # not even the header fits: keep a one-line pointer
            block = f"_{esc(title)}: left out (size cap); {esc(where_)}._\n\n"
        parts.append(block)
        budget -= len(block)
    if run.config_text:
        parts.append(_config_block(run.config_text, budget))
    text = top + "".join(parts)
    footer = "<sub>generated by microscope</sub>\n"
    return text + footer if len(text) + len(footer) < max_chars else text[: max_chars - 1]
