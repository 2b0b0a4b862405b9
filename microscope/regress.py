"""``microscope regress``: tonight's suite against a baseline night, a regression called only when confirmed.

Runs each config ``--repeat`` times in fresh processes (``fresh_runs``), compares the run-level values
with the baseline's runs of the same machine fingerprint in the history (``stats.nightly``), and calls a
regression only when it is significant after Holm, lies beyond the between-run noise band, and a second
sample agrees: the previous night in the history, or a confirming rerun of as many fresh processes.
``--exact`` also checks deterministic metrics against a committed baseline (``store.baselines``).

Exit codes: 0 clean; 1 a confirmed regression or an exact metric outside its tolerance; 2 could not
measure (no comparable baseline, an unknown reference, a damaged history, failed trials or a run that
crashed or timed out, a noisy machine) or bad input; 130 interrupted. Each outcome prints one paragraph
saying why, and ``<out>/regress.md`` holds a report ready to paste into an issue. ``--append`` adds the
night to the history; where the history holds no passing night of this machine yet, the night still
runs and becomes its first one (exit 2: there was nothing to compare with).
"""

from __future__ import annotations

import argparse
import shlex
import signal
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from rich.console import Console
from rich.text import Text

from microscope.fresh_runs import DEFAULT_TIMEOUT_S, FreshRun, FreshRunError, run_fresh
from microscope.history_command import DEFAULT_PATH
from microscope.store.history_schema import HistoryError

if TYPE_CHECKING:  # pandas and the statistics load only when the gate runs, not for `microscope --help`
    import pandas as pd

EXIT_OK, EXIT_REGRESSION, EXIT_CANNOT_MEASURE, EXIT_INTERRUPTED = 0, 1, 2, 130
EXIT_HELP = """exit codes:
  0  clean: no confirmed regression, every exact metric reproduced
  1  a confirmed regression (significant after Holm, beyond the between-run band, seen again by a
     rerun or on the previous night) or an exact metric outside its declared tolerance
  2  could not measure (no run of this machine in the history, unknown reference, damaged history,
     failed trials, noisy machine) or bad input; the paragraph printed says which
  130  interrupted (SIGINT/SIGTERM): the run in progress is stopped, nothing is added to the history
"""
BASELINE_RUNS = 10  # newest runs of the last-good commit used as its baseline

__all__ = ["Night", "Outcome", "add_arguments", "main", "resolve_baseline"]


@dataclass
class Night:
    """One sample of fresh runs (tonight, or its confirming rerun) and their run-level rows."""

    label: str
    runs: list[FreshRun] = field(default_factory=list)
    rows: pd.DataFrame | None = None
    not_gated: set[tuple[str, ...]] = field(default_factory=set)
    failed: list[str] = field(default_factory=list)
    fingerprint: str = ""
    commit: str = ""

    @property
    def folders(self) -> list[Path]:
        return [r.folder for r in self.runs if r.folder is not None]

    @property
    def seconds(self) -> float:
        return sum(r.seconds for r in self.runs)


@dataclass
class Outcome:
    """Everything the verdict, the console and the Markdown report need."""

    exit_code: int = EXIT_OK
    headline: str = ""
    paragraph: str = ""
    command: str = ""
    configs: list[Path] = field(default_factory=list)
    ref: str | None = None
    history: Path | None = None
    fingerprint: str = ""
    machine: str = ""
    baseline_runs: list = field(default_factory=list)  # RunInfo
    previous_runs: list = field(default_factory=list)  # RunInfo
    nights: list[Night] = field(default_factory=list)
    table: pd.DataFrame | None = None
    confirm_table: pd.DataFrame | None = None
    confirmed: dict[tuple[str, ...], str] = field(default_factory=dict)  # key -> by what
    unconfirmed: list[tuple[str, ...]] = field(default_factory=list)
    exact: object | None = None  # ExactReport
    problems: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seconds: float = 0.0
    started: bool = False  # no passing night of this machine yet: tonight (--append) starts the history
    unusable_history: bool = False  # the history file exists but cannot be read (damaged, foreign, newer)
    first_night_clean: bool = False  # a started night whose runs all completed and measured


def add_arguments(sub: argparse._SubParsersAction) -> None:
    """The ``regress`` subcommand (called by ``cli._parser``)."""
    p = sub.add_parser("regress", help="nightly gate: tonight's suite against a baseline night, regressions confirmed",
                       description="Run a suite (configs, or folders of configs) --repeat times in fresh processes "
                                   "and compare it with the baseline's runs of this machine in the history; "
                                   "--exact checks deterministic metrics against a committed baseline.",
                       epilog=EXIT_HELP, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("configs", nargs="+", type=Path, help="configs or folders of configs, e.g. ablations/nightly/")
    p.add_argument("--baseline", default=None, metavar="REF",
                   help="a commit (prefix), a branch (its newest commit), a run id, or 'last-good' (the newest "
                        "night whose gate passed)")
    p.add_argument("--history", type=Path, default=DEFAULT_PATH, help=f"history file (default {DEFAULT_PATH})")
    p.add_argument("--repeat", type=int, default=3, metavar="N", help="fresh runs per config tonight (default 3); "
                   "a flagged regression reruns N more unless the previous night shows it")
    p.add_argument("--exact", type=Path, default=None, metavar="FILE",
                   help="exact baseline of deterministic metrics, e.g. results/baselines/nightly_cpu.json")
    p.add_argument("--append", action="store_true",
                   help="add tonight's runs to the history (gate pass when the exit code is 0); with --baseline "
                        "last-good and no passing night of this machine in the history yet, tonight's runs start it")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--quick", action="store_true", help="apply each config's quick: overlay")
    p.add_argument("--seed", type=int, default=None, help="override every config's seed")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides for every config")
    p.add_argument("--out", type=Path, default=None, help="runs and report (default results/regress-<time>/)")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_S, metavar="SECONDS",
                   help=f"kill a run still going after this long (default {DEFAULT_TIMEOUT_S:.0f}); it counts as "
                        "failed")
    p.add_argument("--alpha", type=float, default=0.05, help="family-wise error rate (Holm), default 0.05")
    p.add_argument("--min-band", type=float, default=0.01, help="smallest change called, default 0.01 (1%%)")
    p.add_argument("--max-noise", type=float, default=0.10,
                   help="a candidate none of whose timing rows can rule out a regression this large (its CI reaches "
                        "past it) cannot be vouched for: exit 2 unless a regression is confirmed; default 0.10")


def _configs(paths: list[Path]) -> list[Path]:
    from microscope.commands import UserError

    out: list[Path] = []
    for path in paths:
        if path.is_dir():
            found = sorted([*path.glob("*.yaml"), *path.glob("*.yml")])
            if not found:
                raise UserError(f"{path}: a folder without configs (*.yaml)")
            out += found
        elif path.is_file():
            out.append(path)
        else:
            raise UserError(f"{path}: no such config or folder of configs")
    return list(dict.fromkeys(out))


def _check_args(args: argparse.Namespace) -> None:
    from microscope.commands import UserError

    if args.baseline is None and args.exact is None:
        raise UserError("regress needs --baseline REF (the statistical gate against the history), --exact FILE "
                        "(the exact gate), or both")
    if args.repeat < 2 and args.baseline is not None:
        raise UserError(f"--repeat {args.repeat}: the statistical gate needs at least 2 fresh runs per config "
                        "(the run is the unit; one run has no between-run noise); use --repeat 1 only with --exact")
    if args.repeat < 1 or args.repeat > 100:
        raise UserError(f"--repeat {args.repeat}: between 1 and 100")
    for flag, value, low, high in (("--alpha", args.alpha, 0, 1), ("--min-band", args.min_band, 0, 1),
                                   ("--max-noise", args.max_noise, 0, 10), ("--timeout", args.timeout, 0, 7 * 86400)):
        if not low < value < high and not (flag == "--min-band" and value == 0):
            raise UserError(f"{flag} {value}: must lie between {low} and {high}")


def _overrides(args: argparse.Namespace) -> dict:
    from microscope import config as cfgmod
    from microscope.commands import UserError

    try:
        overrides = dict(cfgmod.parse_assignment(item) for item in args.set)
    except cfgmod.ConfigError as exc:
        raise UserError(str(exc)) from exc
    return overrides | ({"seed": args.seed} if args.seed is not None else {})


def _this_machine(device: str, interpreted: bool) -> tuple[str, str]:
    from microscope import env as envmod

    env = envmod.capture(device, interpreted, "")
    return envmod.machine_fingerprint(env), envmod.machine_summary(env)


def resolve_baseline(history, ref: str, fingerprint: str, limit: int = BASELINE_RUNS) -> list:  # noqa: ANN001
    """The baseline's runs on this machine: ``History.resolve``, and for ``last-good`` every passing run of
    that night's commit (its repeats, the newest ``limit`` per plugin). ``HistoryError`` if none."""
    from microscope.store.history import LAST_GOOD

    runs = history.resolve(ref, fingerprint)
    if ref != LAST_GOOD:
        return runs
    commit = runs[-1].commit
    same = [r for r in history.runs(fingerprint=fingerprint) if r.commit == commit and r.gate == "pass"]
    keep = set()
    for plugin in {p for r in same for p in _plugins(history, r)}:
        mine = [r for r in same if plugin in _plugins(history, r)]
        keep.update(r.key for r in mine[-limit:])
    return [r for r in same if r.key in keep]


def _plugins(history, info) -> set[str]:  # noqa: ANN001
    return set(history.rows(run_keys=[info.key])["plugin"])


def previous_night(history, fingerprint: str, baseline_runs: list, limit: int = BASELINE_RUNS) -> list:  # noqa: ANN001
    """The runs after the baseline on this machine, of the newest commit among them: last night."""
    if not baseline_runs:
        return []
    newest = max(r.date for r in baseline_runs)
    keys = {r.key for r in baseline_runs}
    after = [r for r in history.runs(fingerprint=fingerprint) if r.date > newest and r.key not in keys]
    if not after:
        return []
    return [r for r in after if r.commit == after[-1].commit][-limit:]


def _sample(label: str, configs: list[Path], args: argparse.Namespace, out: Path, console: Console) -> Night:
    """``args.repeat`` fresh runs of every config (configs interleaved), summarised."""
    import pandas as pd

    from microscope.commands import UserError
    from microscope.store.records import read_records
    from microscope.store.run_summary import summarize_run

    night = Night(label)
    frames = []
    for i in range(args.repeat):
        for config in configs:
            try:
                run = run_fresh(config, out / "runs" / f"{label}-{i + 1}", device=args.device, quick=args.quick,
                                seed=args.seed, sets=args.set, timeout_s=args.timeout)
            except FreshRunError as exc:
                raise UserError(str(exc)) from exc
            night.runs.append(run)
            console.print(Text(f"{label}: run {i + 1}/{args.repeat} of {config} (fresh process): "
                               f"{run.describe_exit()}, {run.seconds:.1f} s", style="dim"), highlight=False)
            if not run.completed:  # crashed, killed or timed out: what it measured may be partial
                night.failed.append(f"{run.folder or config}: the run {run.describe_exit()}")
            if run.folder is None:
                continue
            try:
                summary = summarize_run(run.folder)
            except HistoryError as exc:
                night.failed.append(f"{run.folder}: {exc}")
                continue
            night.fingerprint, night.commit = summary.info.fingerprint, summary.info.commit
            frames.append(summary.rows.assign(run_key=summary.info.key))
            for rec in read_records(run.folder):
                details = rec.get("details") if isinstance(rec.get("details"), dict) else {}
                if rec.get("dimension") == "throughput" and details.get("interpreted"):
                    night.not_gated.add(tuple(str(rec.get(k)) for k in ("plugin", "variant", "case_id", "dimension",
                                                                        "metric")))
            bad = summary.rows[summary.rows["status"] == "failed"]
            night.failed += [f"{run.folder.name}: {r.variant} {r.case_id} {r.dimension} {r.metric} failed"
                             for r in bad.itertuples(index=False)]
    night.rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()
    return night


def _stats_kw(args: argparse.Namespace, noise: dict, not_gated: set) -> dict:
    return {"alpha": args.alpha, "min_band": args.min_band, "max_noise": args.max_noise, "noise": noise,
            "not_gated": not_gated}


def main(args: argparse.Namespace, console: Console) -> int:
    """Run the gate; returns its exit code. Bad input raises ``commands.UserError`` (exit 2, no report)."""
    from microscope import commands
    from microscope import device as devmod
    from microscope.report.regress_report import explain, print_outcome, write_report
    from microscope.store.baselines import BaselineError, BaselineFile

    _check_args(args)
    configs = _configs(args.configs)
    try:
        device = devmod.resolve(args.device or commands.requested_device(configs[0], None))
    except devmod.DeviceError as exc:
        raise commands.UserError(str(exc)) from exc
    interpreted = devmod.prepare(device)
    overrides = _overrides(args)
    for config in configs:  # every config valid before anything runs
        commands.load_checked(config, device, args.quick, overrides)
    exact = None
    if args.exact is not None:
        try:
            exact = BaselineFile.load(args.exact)
        except BaselineError as exc:
            raise commands.UserError(str(exc)) from exc
    out = args.out or Path("results") / f"regress-{commands.new_stamp()}"
    outcome = Outcome(command="microscope regress " + " ".join(shlex.quote(a) for a in sys.argv[2:]),
                      configs=configs, ref=args.baseline, history=args.history if args.baseline else None)
    outcome.fingerprint, outcome.machine = _this_machine(device, interpreted)
    start = time.perf_counter()
    history, base_rows = None, None
    previous = signal.signal(signal.SIGTERM, _interrupt)  # a CI timeout: stop the fresh run too
    try:
        if args.baseline is not None:
            history, base_rows = _baseline(args, outcome)
        _gate(args, configs, out, console, outcome, history, base_rows, exact)
    except KeyboardInterrupt:
        console.print(Text(f"regress: interrupted after {time.perf_counter() - start:.0f} s; the runs finished so "
                           f"far are in {out}; nothing was added to the history", style="bold yellow"),
                      highlight=False, soft_wrap=True)
        return EXIT_INTERRUPTED
    finally:
        signal.signal(signal.SIGTERM, previous)
        if history is not None:
            history.close()
    outcome.seconds = time.perf_counter() - start
    explain(outcome)
    if args.append and outcome.nights:
        _append(args, outcome, console)
    report = write_report(outcome, out)
    print_outcome(outcome, console, report)
    return outcome.exit_code


def _interrupt(signum: int, frame: object) -> None:
    """SIGTERM as Ctrl-C: the fresh run (in its own session, out of reach of the signal) is killed on the way."""
    raise KeyboardInterrupt


def _baseline(args: argparse.Namespace, outcome: Outcome):  # noqa: ANN202 - (History | None, DataFrame | None)
    """Open the history and the baseline's rows; a problem becomes "could not measure" (nothing runs).

    With ``--append --baseline last-good`` and no history file yet, or none of this machine's nights
    passing, the night runs anyway and starts the history (``outcome.started``): otherwise a new runner,
    or a driver update (a new fingerprint), would leave the gate without a baseline for ever. A damaged
    file is never started over.
    """
    from microscope.store.history import LAST_GOOD, History

    may_start = args.append and args.baseline == LAST_GOOD
    if may_start and not Path(args.history).exists():
        outcome.started = True
        return None, None
    try:
        history = History.open(args.history)
    except HistoryError as exc:
        outcome.unusable_history = Path(args.history).exists()
        outcome.problems.append(f"no comparable baseline: {exc}")
        return None, None
    if may_start and history.last_good(fingerprint=outcome.fingerprint) is None:
        history.close()
        outcome.started = True
        return None, None
    try:
        outcome.baseline_runs = resolve_baseline(history, args.baseline, outcome.fingerprint)
        outcome.previous_runs = previous_night(history, outcome.fingerprint, outcome.baseline_runs)
    except HistoryError as exc:
        history.close()
        outcome.problems.append(f"no comparable baseline: {exc}")
        return None, None
    return history, history.rows(run_keys=[r.key for r in outcome.baseline_runs])


def _gate(args: argparse.Namespace, configs: list[Path], out: Path, console: Console, outcome: Outcome,
          history, base_rows: pd.DataFrame | None, exact) -> None:  # noqa: ANN001
    from microscope.stats.nightly import compare_nights, missing_keys
    from microscope.store.baselines import check_runs

    if outcome.problems and exact is None:
        outcome.exit_code = EXIT_CANNOT_MEASURE  # nothing to gate on: do not spend the night running
        return
    tonight = _sample("tonight", configs, args, out, console)
    outcome.nights.append(tonight)
    if tonight.failed:
        outcome.problems.append(f"failed trials: {len(tonight.failed)} measurement(s) or run(s) failed tonight "
                                f"(e.g. {tonight.failed[0]})")
    if exact is not None and tonight.folders:
        outcome.exact = check_runs(exact, tonight.folders)
        outcome.problems += outcome.exact.problems
        if outcome.exact.unmeasured:
            outcome.problems.append(f"exact gate: {len(outcome.exact.unmeasured)} baseline metric(s) not measured "
                                    f"tonight (e.g. {outcome.exact.unmeasured[0].describe()})")
    if outcome.started:
        outcome.first_night_clean = not outcome.problems and not (outcome.exact is not None and outcome.exact.differs)
        outcome.problems.append(f"no comparable baseline: {args.history} holds no passing night of this machine "
                                f"({outcome.fingerprint}) yet")
    if history is not None and base_rows is not None and len(tonight.rows):
        if tonight.fingerprint and tonight.fingerprint != outcome.fingerprint:
            outcome.notes.append(f"tonight's runs report machine {tonight.fingerprint}, not {outcome.fingerprint}")
        noise = _noise(history, tonight.rows, outcome.fingerprint)
        kw = _stats_kw(args, noise, tonight.not_gated)
        table = compare_nights(base_rows, tonight.rows, **kw)
        outcome.table = table
        compared = table[~table["verdict"].isin(["new", "failed"])]
        if not len(compared):
            outcome.problems.append("no comparable baseline: the baseline's runs measured none of tonight's gating "
                                    "measurements (other plugins, cases or variants)")
        missing = missing_keys(base_rows, tonight.rows, tonight.not_gated)
        if missing:
            outcome.notes.append(f"{len(missing)} gating measurement(s) of the baseline not measured tonight (e.g. "
                                 f"{' | '.join(missing[0])}): the suite changed, or a run stopped early")
        if tonight.not_gated:
            outcome.notes.append(f"{len(tonight.not_gated)} timing(s) through the Triton interpreter not gated")
        flagged = table[table["flagged"]]
        if len(flagged):
            _confirm(args, configs, out, console, outcome, history, base_rows, flagged, kw)
        if table["noisy"].any() and not outcome.confirmed:
            noisy = table[table["noisy"]]
            outcome.problems.append(f"noisy machine: {len(noisy)} timing row(s) cannot rule out a {args.max_noise:.0%} "
                                    f"regression (e.g. {noisy.iloc[0]['metric']} CI "
                                    f"[{noisy.iloc[0]['ci_low']:.3g}, {noisy.iloc[0]['ci_high']:.3g}], between-run sd "
                                    f"{noisy.iloc[0]['sigma']:.3g})")
    failed_gate = bool(outcome.confirmed) or bool(outcome.exact is not None and outcome.exact.differs)
    outcome.exit_code = EXIT_REGRESSION if failed_gate else (EXIT_CANNOT_MEASURE if outcome.problems else EXIT_OK)


def _noise(history, rows: pd.DataFrame, fingerprint: str) -> dict[tuple[str, ...], float]:  # noqa: ANN001
    from microscope.stats.nightly import KEY, gating_family

    out = {}
    for key in {tuple(str(v) for v in k) for k in gating_family(rows)[list(KEY)].itertuples(index=False)}:
        plugin, variant, case, dimension, metric = key
        sigma = history.between_run_noise(plugin, variant, case, metric, fingerprint, dimension=dimension)
        if sigma is not None:
            out[key] = sigma
    return out


def _confirm(args: argparse.Namespace, configs: list[Path], out: Path, console: Console, outcome: Outcome,
             history, base_rows: pd.DataFrame, flagged: pd.DataFrame, kw: dict) -> None:  # noqa: ANN001
    """(c): the previous night in the history, else a rerun of the flagged plugins' configs, must agree."""
    from microscope.stats.nightly import KEY, confirmed_keys

    keys = [tuple(str(v) for v in k) for k in flagged[list(KEY)].itertuples(index=False)]
    if outcome.previous_runs:
        prev = history.rows(run_keys=[r.key for r in outcome.previous_runs])
        agree, _ = confirmed_keys(flagged, base_rows, prev, **kw)
        commit = outcome.previous_runs[-1].commit
        outcome.confirmed.update({k: f"the previous night in the history (commit {commit[:12]}) shows it too"
                                  for k in agree})
    rest = [k for k in keys if k not in outcome.confirmed]
    if not rest:
        return
    plugins = {k[0] for k in rest}
    rerun = [c for c in configs if _config_plugin(c) in plugins] or configs
    console.print(Text(f"{len(rest)} regression(s) flagged; confirming with {args.repeat} more fresh run(s) per "
                       "config", style="yellow"), highlight=False)
    again = _sample("confirm", rerun, args, out, console)
    outcome.nights.append(again)
    if again.failed:
        outcome.problems.append(f"failed trials in the confirming rerun (e.g. {again.failed[0]})")
    agree, table = confirmed_keys(flagged[[k in rest for k in keys]], base_rows, again.rows, **kw)
    outcome.confirm_table = table
    outcome.confirmed.update({k: f"a confirming rerun of {args.repeat} fresh process(es) shows it too" for k in agree})
    outcome.unconfirmed = [k for k in rest if k not in agree]


def _config_plugin(path: Path) -> str:
    from microscope import config as cfgmod

    try:
        raw, _ = cfgmod.read_yaml(cfgmod.read_config_text(path), str(path))
    except cfgmod.ConfigError:
        return ""
    return str(raw.get("plugin", "")) if isinstance(raw, dict) else ""


def _append(args: argparse.Namespace, outcome: Outcome, console: Console) -> None:
    """Tonight's runs (and a confirming rerun's) into the history; gate pass for a clean night, or for a
    first night of this machine whose runs all completed (the baseline of the next night)."""
    from microscope.history_command import append_run_to_history

    passed = outcome.exit_code == EXIT_OK or (outcome.started and outcome.first_night_clean)
    for night in outcome.nights:
        for folder in night.folders:
            try:
                done = append_run_to_history(folder, args.history, passed=passed)
            except HistoryError as exc:
                outcome.notes.append(f"not added to the history: {exc}")
                return
            console.print(Text(f"history: {done.describe(args.history)}", style="dim"), highlight=False,
                          soft_wrap=True)
    first = f" as the first night of machine {outcome.fingerprint}" if outcome.started else ""
    outcome.notes.append(f"tonight's runs added to {args.history}{first} with gate {'pass' if passed else 'fail'}")
