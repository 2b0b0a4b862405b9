"""The CLI: ``microscope run | resume | list | validate | report | compare | history | regress | baseline |
calibrate | tensorboard``.

Exit codes (the contract with CI; ``EXIT_CODES`` is what ``--help`` prints): 0 every gated comparison
holds, 1 a candidate fails accuracy, a gated comparison regresses or a trial failed, 2 bad config,
plugin or input (nothing ran).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from microscope import __version__, baseline_command, bytecode_cache, calibrate, history_command, regress

if TYPE_CHECKING:
    from microscope.executors.local import Worker

EXIT_CODES = """exit codes:
  0  every gated comparison holds (the config's gate: section; skipped peers are fine)
  1  a candidate fails accuracy, a gated comparison regresses (e.g. "slower"), or a trial failed
  2  bad config, plugin, records or command line: nothing was measured
  130  interrupted (SIGINT/SIGTERM): what finished is kept; continue with microscope resume DIR
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="microscope", description="A change microscope for LLM optimizations.",
                                epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--version", action="version", version=f"microscope {__version__}")
    sub = p.add_subparsers(dest="command", required=True)
    run = sub.add_parser("run", help="run an ablation config, print its verdicts, exit by its gate",
                         epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    run.add_argument("config", type=Path, help="e.g. ablations/flash_attn.yaml")
    run.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None,
                     help="default: the config's device, else auto (cuda when present)")
    run.add_argument("--quick", action="store_true", help="apply the config's quick: overlay (fewer cases/rounds)")
    run.add_argument("--profile", default=None, metavar="NAME",
                     help="merge the config's profiles: NAME entry after the device's (e.g. bench: the anchor "
                          "shapes and timing of a GPU benchmark); several as NAME,NAME in order")
    run.add_argument("--out", type=Path, default=Path("results"), help="results root (default: results/)")
    run.add_argument("--seed", type=int, default=None, help="override the config's seed")
    run.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                     help="override config fields, e.g. --set workload.steps=60 dimensions.throughput.rounds=20")
    run.add_argument("--no-progress", action="store_true", help="no progress bar (logs, CI)")
    run.add_argument("--reports", type=Path, default=None,
                     help="where the Markdown and HTML reports go (default: reports/, or the run's own "
                          "folder when --out is given)")
    run.add_argument("--verbose", "-v", action="store_true",
                     help="also print every variant and case, and every comparison row")
    run.add_argument("--no-report", action="store_true", help="write records only, no reports")
    run.add_argument("--history", type=Path, default=None, metavar="PATH",
                     help="add the finished run to this history file (gate pass when the exit code is 0); "
                          "the HTML report then shows its trends")
    _executor_arguments(run)
    run.add_argument("--resume", type=Path, default=None, metavar="RESULTS_DIR",
                     help="continue an interrupted run in RESULTS_DIR (its finished groups are kept)")
    res = sub.add_parser("resume", help="continue an interrupted run the way it was started (its run.json)",
                         epilog=EXIT_CODES, formatter_class=argparse.RawDescriptionHelpFormatter)
    res.add_argument("results_dir", type=Path, help="e.g. results/20261202-101500-flash_attn")
    for flag, text in (("--no-progress", "no progress bar (logs, CI)"), ("--no-report", "write records only"),
                       ("--verbose", "also print every comparison row")):
        res.add_argument(flag, action="store_true", help=text)
    res.add_argument("--reports", type=Path, default=None, help="where the reports go (default: the run's folder)")
    res.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                     help="change the run's overrides (with --force), e.g. workload.seeds=5 to add seeds to a "
                          "finished run: only the groups it lacks run")
    _executor_arguments(res)
    rep = sub.add_parser("report", help="rebuild the reports of a saved run (nothing is rerun)")
    rep.add_argument("results_dir", type=Path, help="e.g. results/20261202-101500-flash_attn")
    rep.add_argument("--format", nargs="+", default=["md", "html"], choices=["md", "html"])
    rep.add_argument("--out", type=Path, default=Path("reports"))
    rep.add_argument("--history", type=Path, default=None, metavar="PATH",
                     help="add a Trends section (this plugin on this run's machine) from this history file")
    cmp = sub.add_parser(
        "compare", help="how side B differs from side A (e.g. main vs a branch), the run as the unit",
        description="Each side is a run folder, a folder of run folders (repeats), or a config file that "
                    "is run --repeat times in fresh processes. One run per side can only show a difference "
                    "larger than the between-run noise, which it cannot know: such rows are inconclusive.",
        epilog="exit codes: 0 no regression; 1 B regressed against A (slower, more memory, worse, an accuracy "
               "check that passed in A fails); 2 bad input or sides that measure different things")
    cmp.add_argument("run_a", type=Path, help="side A: a run folder, a folder of runs, or a config")
    cmp.add_argument("run_b", type=Path, help="side B: the same kinds")
    cmp.add_argument("--repeat", type=int, default=None, metavar="N",
                     help="runs per config side, each in a fresh process (default 3)")
    cmp.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None, help="for config sides")
    cmp.add_argument("--quick", action="store_true", help="for config sides")
    cmp.add_argument("--profile", default=None, metavar="NAME", help="for config sides: a named profile")
    cmp.add_argument("--seed", type=int, default=0, help="for config sides (every run uses the same seed)")
    cmp.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE", help="for config sides")
    for side in ("a", "b"):
        cmp.add_argument(f"--set-{side}", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                         help=f"config overrides for side {side.upper()} only (after --set), e.g. a block size")
        cmp.add_argument(f"--env-{side}", nargs="+", action="extend", default=[], metavar="NAME=VALUE",
                         help=f"environment variables for side {side.upper()}'s runs only, e.g. an allocator "
                              "setting or a library switch")
    cmp.add_argument("--timeout", type=float, default=None, metavar="S",
                     help="kill a config side's run still going after S seconds (default: one hour)")
    cmp.add_argument("--results", type=Path, default=Path("results"), help="where config sides' runs go")
    cmp.add_argument("--out", type=Path, default=Path("reports"))
    cmp.add_argument("--tensorboard", type=Path, default=None, metavar="DIR",
                     help="write both sides' TensorBoard logs into DIR (A-<variant>, B-<variant>) with the diff of "
                          "each variant's graph between the sides (diff-B-<variant>); view: microscope tensorboard DIR")
    cmp.add_argument("--history", type=Path, default=None, metavar="PATH",
                     help="take the between-run noise of this machine from this history store (what a side "
                          "with a single run needs for a verdict)")
    cmp.add_argument("--force", action="store_true",
                     help="compare even sides of different plugins, devices, case grids or corpora")
    lst = sub.add_parser("list", help="list plugins, their variants and cases")
    lst.add_argument("--plugins", nargs="*", default=[], help="extra plugin files or modules to load")
    val = sub.add_parser("validate", help="check configs without running anything")
    val.add_argument("configs", nargs="+", type=Path)
    tb = sub.add_parser("tensorboard", help="serve a run's TensorBoard logs: graphs, diff graphs, histograms")
    tb.add_argument("results_dir", type=Path, help="a run folder (its tensorboard/), or a folder of runs")
    tb.add_argument("--host", default="127.0.0.1", help="default 127.0.0.1 (this machine only)")
    tb.add_argument("--port", type=int, default=6006)
    history_command.add_arguments(sub)
    regress.add_arguments(sub)
    baseline_command.add_arguments(sub)
    calibrate.add_arguments(sub)
    return p


def _executor_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--executor", choices=["local", "inline", "ray"], default=None,
                        help="where trial groups run (default: the config's executor.kind, local: worker processes)")
    parser.add_argument("--jobs", type=int, default=None, metavar="N",
                        help="worker processes (default: one per GPU, one on CPU)")
    parser.add_argument("--retry-failed", action="store_true", help="with --resume: rerun groups that failed too")
    parser.add_argument("--force", action="store_true", help="with --resume: continue even if the config changed")


def main(argv: list[str] | None = None, *, early_worker: bool = False) -> int:
    """Run one command; ``early_worker``: ``microscope run`` starts its first worker process before this one
    imports torch, so their start-ups overlap (the console command does; tests calling main do not)."""
    args = _parser().parse_args(argv)
    console = Console()
    if not console.is_terminal:  # logs and CI: keep table rows on one line each
        console = Console(width=220)
    err = Console(stderr=True, soft_wrap=True)  # never wrap a file:line message across lines
    if args.command == "tensorboard":
        from microscope.instrument.tb_launch import main as serve_tensorboard

        return serve_tensorboard(args.results_dir, host=args.host, port=args.port)
    if args.command == "history":
        return history_command.main(args, console, err)
    if args.command == "baseline":
        return baseline_command.main(args, console, err)
    early = None
    if early_worker and args.command == "run" and args.resume is None:
        from microscope.executors.local import early_worker as start_early_worker

        early = start_early_worker(args.config, args.executor)
    try:
        return _dispatch(args, console, err, early)
    finally:
        if early is not None and not early.adopted:
            early.discard()


def _dispatch(args: argparse.Namespace, console: Console, err: Console, early: Worker | None) -> int:
    from microscope import commands  # imported late: the device must be chosen before plugins load

    try:
        if args.command == "run":
            return commands.run(args, console, early)
        if args.command == "resume":
            return commands.resume(args, console)
        if args.command == "list":
            return commands.list_plugins(args, console)
        if args.command == "validate":
            return commands.validate(args, console)
        if args.command == "report":
            return commands.report(args, console)
        if args.command == "compare":
            return commands.compare(args, console)
        if args.command == "regress":
            return regress.main(args, console)
        if args.command == "calibrate":
            return calibrate.calibrate(args, console)
    except commands.UserError as exc:
        # the message is printed as text: a name or value in it may look like rich markup ("[/]")
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)), highlight=False)
        return commands.EXIT_BAD_INPUT
    return commands.EXIT_OK


def console_main() -> int:
    """The ``microscope`` command: a process of its own, so it may set up what every process of its run
    shares (one bytecode folder, before torch is imported), then ``main``."""
    bytecode_cache.use_shared_cache()
    return main(early_worker=True)


if __name__ == "__main__":
    sys.exit(console_main())
