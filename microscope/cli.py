"""``microscope run | list | validate``: the command line.

Exit codes: 0 all trials ran (skips are fine), 1 some trial failed (the others are recorded),
2 the config or plugin is wrong (nothing ran).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.console import Console

from microscope import __version__


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="microscope", description="A change microscope for LLM optimizations.")
    p.add_argument("--version", action="version", version=f"microscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an ablation config and print its table")
    run.add_argument("config", type=Path, help="e.g. ablations/flash_attn.yaml")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                     help="default: the config's device, else auto (cuda when present)")
    run.add_argument("--quick", action="store_true", help="apply the config's quick: overlay (fewer cases/rounds)")
    run.add_argument("--out", type=Path, default=Path("results"), help="results root (default: results/)")
    run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    run.add_argument("--set", nargs="+", default=[], metavar="KEY=VALUE",
                     help="override config fields, e.g. --set workload.steps=60 dimensions.throughput.rounds=20")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")
    run.add_argument("--reports", type=Path, default=Path("reports"),
                     help="where the Markdown and HTML reports go (default: reports/)")
    run.add_argument("--no-report", action="store_true", help="write records only, no reports")
    rep = sub.add_parser("report", help="rebuild the reports of a saved run (nothing is rerun)")
    rep.add_argument("results_dir", type=Path, help="e.g. results/20261202-101500-flash_attn")
    rep.add_argument("--format", nargs="+", default=["md", "html"], choices=["md", "html"])
    rep.add_argument("--out", type=Path, default=Path("reports"))
    cmp = sub.add_parser("compare", help="how run B differs from run A (e.g. main vs a branch)")
    cmp.add_argument("run_a", type=Path)
    cmp.add_argument("run_b", type=Path)
    cmp.add_argument("--out", type=Path, default=Path("reports"))
    cmp.add_argument("--force", action="store_true", help="compare even if the runs used different corpora")
    lst = sub.add_parser("list", help="list plugins, their variants and cases")
    lst.add_argument("--plugins", nargs="*", default=[], help="extra plugin files or modules to load")
    val = sub.add_parser("validate", help="check configs without running anything")
    val.add_argument("configs", nargs="+", type=Path)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # logs and CI: keep table rows on one line each
        console = Console(width=220)
    err = Console(stderr=True, soft_wrap=True)  # never wrap a file:line message across lines
    from microscope import commands  # imported late: the device must be chosen before plugins load

    try:
        if args.command == "run":
            return commands.run(args, console)
        if args.command == "list":
            return commands.list_plugins(args, console)
        if args.command == "validate":
            return commands.validate(args, console)
        if args.command == "report":
            return commands.report(args, console)
        if args.command == "compare":
            return commands.compare(args, console)
    except commands.UserError as exc:
        err.print(f"[bold red]error:[/] {exc}", markup=True, highlight=False)
        return commands.EXIT_BAD_INPUT
    return commands.EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
