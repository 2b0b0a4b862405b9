"""``microscope baseline save | check``: write an exact baseline from runs, or check runs against one.

``save RUN_DIR [RUN_DIR ...] NAME`` keeps every deterministic metric (accuracy, memory, stability,
generalization; never timing) of the runs' non-peer variants with a declared tolerance, in
``results/baselines/NAME.json`` (or NAME itself when it ends in ``.json``). Give two runs of each
config and a metric that differed between them is left out, by name. ``check RUN_DIR ... --exact FILE``
is the exact half of ``microscope regress`` on runs that already exist.

Exit codes: 0 saved / every metric reproduced; 1 a metric outside its tolerance; 2 bad input (a folder
without records, a malformed baseline file, runs from the wrong device, a metric not measured).
"""

from __future__ import annotations

import argparse
from pathlib import Path

from rich.console import Console
from rich.text import Text

EXIT_OK, EXIT_DIFFERS, EXIT_BAD_INPUT = 0, 1, 2
BASELINES = Path("results") / "baselines"

__all__ = ["BASELINES", "add_arguments", "baseline_path", "main"]


def add_arguments(sub: argparse._SubParsersAction) -> None:
    """The ``baseline`` subcommand and its ``save``/``check`` actions (called by ``cli._parser``)."""
    p = sub.add_parser("baseline", help="exact baselines of deterministic metrics: save from runs, check runs",
                       epilog="exit codes: 0 saved or reproduced; 1 a metric outside its tolerance; 2 bad input")
    actions = p.add_subparsers(dest="baseline_command", required=True)
    save = actions.add_parser("save", help="write results/baselines/NAME.json from run folders")
    save.add_argument("paths", nargs="+", type=Path, metavar="RUN_DIR ... NAME",
                      help="run folders (or folders of run folders), then the baseline's name or .json path")
    save.add_argument("--rtol", type=float, default=None, help="relative tolerance for every metric "
                      "(default: 0 for memory and counts, 1e-9 operator numerics, 1e-5 model metrics)")
    save.add_argument("--atol", type=float, default=None, help="absolute tolerance for every metric (default 0)")
    check = actions.add_parser("check", help="check run folders against an exact baseline")
    check.add_argument("runs", nargs="+", type=Path, help="run folders (or folders of run folders)")
    check.add_argument("--exact", type=Path, required=True, metavar="FILE", help="the baseline .json")


def baseline_path(name: str) -> Path:
    """``results/baselines/NAME.json`` for a bare name; a name ending in .json is a path as given."""
    return Path(name) if name.endswith(".json") else BASELINES / f"{name}.json"


def _folders(paths: list[Path]) -> list[Path]:
    from microscope.store.baselines import BaselineError

    out = []
    for path in paths:
        if (path / "records.jsonl").is_file():
            out.append(path)
            continue
        inner = sorted(p for p in path.iterdir() if (p / "records.jsonl").is_file()) if path.is_dir() else []
        if not inner:
            raise BaselineError(f"{path}: neither a run folder (with records.jsonl) nor a folder of run folders")
        out += inner
    return out


def main(args: argparse.Namespace, console: Console, err: Console) -> int:
    from microscope.store.baselines import BaselineError

    try:
        return _save(args, console) if args.baseline_command == "save" else _check(args, console)
    except BaselineError as exc:
        err.print(Text.assemble(("error:", "bold red"), " ", str(exc)), highlight=False)
        return EXIT_BAD_INPUT


def _save(args: argparse.Namespace, console: Console) -> int:
    from microscope.store.baselines import BaselineError, baseline_from_runs, describe_class

    if len(args.paths) < 2:
        raise BaselineError("baseline save needs run folder(s) and then a NAME, e.g. `microscope baseline save "
                            "results/<run-id> nightly_cpu`")
    *runs, name = args.paths
    for flag, value in (("--rtol", args.rtol), ("--atol", args.atol)):
        if value is not None and not 0 <= value < 1:
            raise BaselineError(f"{flag} {value}: a tolerance from 0 to 1")
    target = baseline_path(str(name))
    baseline, notes = baseline_from_runs(_folders(runs), target.stem, rtol=args.rtol, atol=args.atol)
    try:
        baseline.save(target)
    except OSError as exc:
        raise BaselineError(f"{target}: cannot write the baseline ({exc.strerror or exc})") from exc
    console.print(Text(f"saved {target}: {len(baseline.metrics)} deterministic metric(s) of "
                       f"{len({m.plugin for m in baseline.metrics})} plugin(s), for machine class "
                       f"{describe_class(baseline.applies_to)} (the file's other classes are kept)"),
                  highlight=False, soft_wrap=True)
    for note in notes:
        console.print(Text(f"note: {note}", style="yellow"), highlight=False, soft_wrap=True)
    return EXIT_OK


def _check(args: argparse.Namespace, console: Console) -> int:
    from microscope.store.baselines import BaselineError, BaselineFile, check_runs

    report = check_runs(BaselineFile.load(args.exact), _folders(args.runs))
    if report.problems:
        raise BaselineError("; ".join(report.problems))
    for note in report.notes:
        console.print(Text(f"note: {note}", style="yellow"), highlight=False, soft_wrap=True)
    for check in report.differs:
        console.print(Text(f"differs: {check.describe()}", style="red"), highlight=False, soft_wrap=True)
    if report.unmeasured:
        raise BaselineError("; ".join(c.describe() for c in report.unmeasured[:5]))
    same = sum(c.status == "same" for c in report.checks)
    console.print(Text(f"{len(report.checks)} metric(s) checked against {args.exact}: {same} bit-exact, "
                       f"{sum(c.status == 'within' for c in report.checks)} within tolerance, "
                       f"{len(report.differs)} differ"), highlight=False)
    return EXIT_DIFFERS if report.differs else EXIT_OK
