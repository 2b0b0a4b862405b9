"""What each CLI command does; ``cli.py`` only parses arguments.

Order matters in ``run``: the device is chosen first, then Triton's interpreter switch is set, and only
then are plugins imported (``@triton.jit`` reads the switch at import time).
"""

from __future__ import annotations

import argparse
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from microscope import config as cfgmod
from microscope import device as devmod
from microscope import registry
from microscope.api import RegistrationError

if TYPE_CHECKING:
    from microscope.executors.local import Worker

EXIT_OK, EXIT_FAILED_TRIALS, EXIT_BAD_INPUT, EXIT_INTERRUPTED = 0, 1, 2, 130
DEFAULT_RESULTS, DEFAULT_REPORTS = Path("results"), Path("reports")


class UserError(Exception):
    """Bad input from the user (config, plugin, device); printed without a traceback."""


def requested_device(path: Path, cli_device: str | None, text: str | None = None) -> str:
    """``--device``, else the config's own ``device:``, else ``auto`` (read with the config's bounded reader)."""
    if cli_device:
        return cli_device
    try:
        raw, _ = cfgmod.read_yaml(cfgmod.read_config_text(path) if text is None else text, str(path))
    except cfgmod.ConfigError:
        return "auto"  # the full load below reports the problem with its line
    value = raw.get("device", "auto") if isinstance(raw, dict) else "auto"
    return value if value in ("auto", "cpu", "cuda") else "auto"


def _problems(path: Path, problems: list[str]) -> str:
    return f"{len(problems)} problem(s) in {path}:\n  " + "\n  ".join(problems)


def load_checked(path: Path, device: str, quick: bool, overrides: dict | None = None, text: str | None = None):
    """Config + plugin, fully validated before anything runs; any problem is a ``UserError``.

    Each ``plugins:`` entry is imported on its own, so a broken one is cited at its own line. ``text``:
    the file's text when the caller has read it already (a run reads its config once).
    """
    try:
        if text is None:
            config = cfgmod.load(path, device=device, quick=quick, overrides=overrides)
        else:
            config = cfgmod.loads(text, str(path), device=device, quick=quick, overrides=overrides)
    except cfgmod.ConfigError as exc:
        raise UserError(_problems(path, exc.problems)) from exc
    cited = "plugin"  # the field a plugin problem is reported at
    try:
        for i, source in enumerate(config.plugins):
            cited = f"plugins[{i}]"
            registry.load_plugin_source(source, path.parent)
        cited = "plugin"
        plugin = registry.get(config.plugin, config.plugins, base_dir=path.parent)
    except (registry.PluginError, RegistrationError) as exc:
        raise UserError(_problems(path, [config.problem(cited, str(exc))])) from exc
    try:
        cfgmod.check_against_plugin(config, plugin)
    except cfgmod.ConfigError as exc:
        raise UserError(_problems(path, exc.problems)) from exc
    return config, plugin


def run(args: argparse.Namespace, console: Console, early: Worker | None = None) -> int:
    """``microscope run CONFIG``, or with ``--resume DIR`` the continuation of an interrupted run; ``early``: a
    worker started before this process imported torch (``local.early_worker``), the run's first if it uses one."""
    if args.resume is not None:
        return _resume(args.resume, console, args=args)
    text = _config_text(args.config)
    try:
        device = devmod.resolve(requested_device(args.config, args.device, text))
    except devmod.DeviceError as exc:
        raise UserError(str(exc)) from exc
    return _execute(args, console, device, _overrides(args), run_dir=None, text=text, early=early)


def _config_text(path: Path) -> str:
    """The config file's text, read once for the whole run (device, validation, hash, copy in the results)."""
    try:
        return cfgmod.read_config_text(path)
    except cfgmod.ConfigError as exc:
        raise UserError(_problems(path, exc.problems)) from exc


def resume(args: argparse.Namespace, console: Console) -> int:
    """``microscope resume DIR``: the run in DIR continued the way it was started (``run.json``)."""
    return _resume(args.results_dir, console, args=args)


def _overrides(args: argparse.Namespace) -> dict:
    try:
        overrides = dict(cfgmod.parse_assignment(item) for item in args.set)
    except cfgmod.ConfigError as exc:
        raise UserError(str(exc)) from exc
    if getattr(args, "seed", None) is not None:
        overrides["seed"] = args.seed
    if getattr(args, "profile", None) is not None:
        overrides[cfgmod.PROFILE_KEY] = args.profile
    return overrides


def _resume(run_dir: Path, console: Console, *, args: argparse.Namespace) -> int:
    from microscope.run_state import RunState

    try:
        state = RunState.load(run_dir)
    except ValueError as exc:
        raise UserError(str(exc)) from exc
    if state is None:
        raise UserError(f"{run_dir}: not a run folder that can be resumed (no run.json); start it with "
                        "microscope run CONFIG")
    if getattr(args, "config", None) is not None and args.command == "run":
        config_path, device, quick, overrides = args.config, None, args.quick, _overrides(args)
        try:
            device = devmod.resolve(requested_device(args.config, args.device))
        except devmod.DeviceError as exc:
            raise UserError(str(exc)) from exc
        problems = state.mismatch(config_path, device, quick, overrides)
    else:
        config_path, device, quick = Path(state.config), state.device, state.quick
        overrides = {**state.overrides, **_overrides(args)}
        problems = state.mismatch(config_path, device, quick, overrides) if config_path.exists() else [
            f"the config {config_path} no longer exists"]
    if problems and not args.force:
        raise UserError(f"{run_dir}: cannot resume: " + "; ".join(problems) + "; resume with the same config and "
                        "options, or add --force to continue anyway")
    if problems:  # forced: run.json takes the new arguments, so a later plain resume continues them
        state.adopt(config_path, device, quick, overrides)
    resumed = argparse.Namespace(**{"out": Path(run_dir).parent, **vars(args), "config": Path(config_path),
                                    "quick": quick})
    return _execute(resumed, console, device, overrides, run_dir=Path(run_dir), state=state)


def _execute(args: argparse.Namespace, console: Console, device: str, overrides: dict, *, run_dir: Path | None,
             state=None, text: str | None = None, early: Worker | None = None) -> int:  # noqa: ANN001 - a RunState
    """Load, run every trial group on the chosen executor, then print, gate and report."""
    import torch

    from microscope.executors import Resume, RunSpec, make_executor
    from microscope.model_runner import ModelRunner
    from microscope.run_state import RunState
    from microscope.runner import Runner

    interpreted = devmod.prepare(device)
    text = _config_text(args.config) if text is None else text
    config, plugin = load_checked(args.config, device, args.quick, overrides, text=text)
    kind = args.executor or config.executor.kind
    jobs = args.jobs or config.executor.jobs
    console.print(Text.assemble(("microscope ", "bold"), f"{plugin.name} on ", (device, "bold"),
                                f" ({devmod.device_name(device)}){' --quick' if args.quick else ''}"
                                + (f" --profile {overrides[cfgmod.PROFILE_KEY]}" if cfgmod.PROFILE_KEY in overrides
                                   else "") + ", "
                                f"seed {config.seed}, executor {kind}" + (" (resumed)" if run_dir else "")))
    model_level = cfgmod.effective_level(config, plugin) == "model"
    runner_cls = ModelRunner if model_level else Runner  # same constructor and RunResult
    out_root = run_dir.parent if run_dir else args.out
    runner = runner_cls(plugin, config, device=device, interpreted=interpreted, out_root=out_root, config_text=text,
                        run_id=run_dir.name if run_dir else None)
    runner.out_dir.mkdir(parents=True, exist_ok=True)
    previous = None
    if run_dir is not None:
        try:
            previous = Resume.prepare(run_dir, retry_failed=args.retry_failed)
        except ValueError as exc:
            raise UserError(str(exc)) from exc
    else:
        (runner.out_dir / "config.yaml").write_text(text, encoding="utf-8")
    plan = [group.key for batch in runner.planned_groups() for group in batch]
    if previous is not None and (dropped := [key for key in previous.done if key not in plan]):
        raise UserError(f"{run_dir}: cannot resume: it holds finished groups this plan no longer has "
                        f"({', '.join(dropped)}); a resume adds groups (e.g. a larger workload.seeds), it cannot "
                        "remove them: start a new run with these settings")
    planned = len(plan)
    state = state or RunState(config=str(args.config.resolve()), config_hash=runner.env.get("config_hash", ""),
                              device=device, quick=args.quick, overrides=overrides, executor=kind,
                              groups_planned=planned)
    state.status, state.resumes = "running", state.resumes + (run_dir is not None)
    state.groups_planned = planned  # a forced resume may plan more groups (more seeds) than the start did
    state.save(runner.out_dir)
    spec = RunSpec(config_path=str(args.config.resolve()), device=device, quick=args.quick, overrides=overrides,
                   run_id=runner.run_id, out_root=str(Path(out_root).resolve()), env=runner.env, cwd=str(Path.cwd()),
                   memory_limit_gb=config.executor.memory_limit_gb, threads=torch.get_num_threads(), config_text=text)
    try:
        executor = make_executor(kind, runner, spec, jobs=jobs, timeout_s=config.timeout_s,
                                 address=config.executor.address, early=early if kind == "local" else None)
    except ImportError as exc:
        raise UserError(f"{config.where('executor.kind')}: executor: {exc}") from exc
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, disable=args.no_progress, transient=True) as progress:
        task = progress.add_task("planning", total=runner.steps())

        def advance(message: str) -> None:
            if (message.startswith(("instrument:", "dropped ")) or "group failed" in message or "GPU" in message
                    or "cut short" in message):
                progress.console.print(Text(message, style="yellow"))
            progress.update(task, description=message[:60])
            if not message.startswith("measuring"):
                progress.advance(task)

        runner.on_progress = advance
        result = runner.run(executor, resume=previous, max_wall_s=config.executor.max_wall_s)
    outcome = result.outcome
    _save_state(state, outcome)
    state.save(result.out_dir)
    _save_comparison(result.out_dir, config.stats)
    code = finish_run(result.out_dir, config, console, verbose=args.verbose, seconds=result.seconds,
                      reports=None if args.no_report else _reports_dir(args, result.out_dir))
    return _append_history(args, _final_code(code, outcome, result.out_dir, console), result.out_dir, console)


def _save_state(state, outcome) -> None:  # noqa: ANN001 - RunState, RunOutcome
    state.groups_finished = len(outcome.finished)
    state.groups_failed = len(outcome.failed)
    state.failed_groups = [{"group": g["group"], "reason": g.get("reason")} for g in outcome.failed]
    state.stopped = outcome.stopped
    if outcome.stopped and outcome.stopped.startswith("interrupted"):
        state.status = "interrupted"
    elif outcome.unfinished:
        state.status = "out of budget"
    else:
        state.status = "complete"


def _final_code(code: int, outcome, run_dir: Path, console: Console) -> int:  # noqa: ANN001 - RunOutcome
    """The gate's exit code, raised for failed or unfinished groups (130 when interrupted)."""
    if outcome.failed:
        console.print(Text(f"{len(outcome.failed)} trial group(s) failed (their reasons are at the top of the "
                           f"reports); rerun them with: microscope resume {run_dir} --retry-failed", style="red"))
        code = max(code, EXIT_FAILED_TRIALS)
    if outcome.unfinished or outcome.stopped:
        done = len(outcome.finished)
        cut = (f" ({outcome.cut_records} record(s) of the groups cut short are kept and shown)"
               if outcome.cut_records else "")
        console.print(Text(f"partial run ({outcome.stopped or 'stopped'}): {done} of {done + len(outcome.unfinished)} "
                           f"trial groups finished{cut}; continue with: microscope resume {run_dir}", style="yellow"))
        if outcome.stopped and outcome.stopped.startswith("interrupted"):
            return EXIT_INTERRUPTED
        code = max(code, EXIT_FAILED_TRIALS)
    return code


def _reports_dir(args: argparse.Namespace, run_dir: Path) -> Path:
    """``--reports`` if given; else the run's own folder when ``--out`` moved the results; else reports/."""
    if args.reports is not None:
        return args.reports
    return run_dir if args.out != DEFAULT_RESULTS else DEFAULT_REPORTS


def finish_run(run_dir: Path, config: cfgmod.RunConfig, console: Console, *, verbose: bool = False,
               seconds: float | None = None, reports: Path | None = None) -> int:
    """Print a finished run (verdicts, notable rows, gate), write its reports; return the gate's exit code."""
    from microscope import gate as gatemod
    from microscope.report.load import load_run
    from microscope.report.verdict_console import print_verdicts

    data = load_run(run_dir)
    if verbose:
        _print_full_tables(data, console)
    note = interpreter_note(data.records)
    if note:
        console.print(Text(f"note: {note}", style="yellow"))
    if config.dimensions.throughput.table:
        _print_rates(data, console)
    gate = gatemod.evaluate(data.comparison, data.records, config.gate)
    print_verdicts(console, data, gate)
    failed = int((data.records["status"] == "failed").sum()) if len(data.records) else 0
    took = f" ({seconds:.1f} s)" if seconds is not None else ""
    console.print(Text(f"{len(data.records)} records in {run_dir / 'records.jsonl'}{took}; "
                       f"{failed} failed trial record(s)."))
    if reports is not None:
        _write_reports(run_dir, ("md", "html"), reports, console)
    return gate.exit_code


def _print_rates(data, console: Console) -> None:  # noqa: ANN001 - a RunData
    """``throughput.table``: the benchmark table (rate and share of the ceiling per variant and case)."""
    from microscope.report.rates_console import rates_table
    from microscope.stats.table import incorrect_variants

    wrong = {(case, variant) for _, case, variant in incorrect_variants(data.records)}
    table = rates_table(data.records, wrong)
    if table is not None:
        console.print(table)


def interpreter_note(records) -> str:  # noqa: ANN001 - a records DataFrame
    """The interpreter warning, only when a variant that needs Triton actually ran through it."""
    from microscope.runner import INTERPRETER_NOTE

    if not len(records) or "details.notes" not in records.columns:
        return ""
    ran = records[(records["status"] == "ok") & records["details.notes"].map(
        lambda n: isinstance(n, list) and INTERPRETER_NOTE in n)]
    if not len(ran):
        return ""
    return f"{INTERPRETER_NOTE} ({', '.join(dict.fromkeys(ran['variant'].astype(str)))})."


def _print_full_tables(data, console: Console) -> None:  # noqa: ANN001 - a RunData
    """``--verbose``: every variant and case, then every comparison row."""
    from microscope import stats
    from microscope.report.console import skipped_summary, summary_table
    from microscope.report.model_console import model_summary_table
    from microscope.store.records import Record

    fields = set(Record.__dataclass_fields__)
    records = [Record(**{k: v for k, v in row.items() if k in fields})
               for row in read_records_lenient(data.path / "records.jsonl")]
    model_level = bool(len(data.records)) and data.records["dimension"].isin(["stability"]).any()
    summary = model_summary_table if model_level else summary_table
    console.print(summary(records, title=f"{data.run_id}"))
    for line in skipped_summary(records):
        console.print(Text(f"skipped {line}", style="dim"))
    if data.comparison is not None:
        stats.print_table(data.comparison, console=console)


def read_records_lenient(path: Path) -> list[dict]:
    """The records of a run as dicts, lines that are not JSON records left out (a killed run's last line)."""
    from microscope.store.records import read_records_lenient

    return read_records_lenient(path)[0]


def _append_history(args: argparse.Namespace, code: int, run_dir: Path, console: Console) -> int:
    """``run --history PATH``: the finished run goes into the history (gate pass when it exits 0) and its
    HTML report is redrawn with a Trends section; an unusable history file is a ``UserError`` (exit 2).
    An interrupted run (exit 130) is not added."""
    path = getattr(args, "history", None)
    if path is None or code not in (EXIT_OK, EXIT_FAILED_TRIALS):
        return code
    from microscope.history_command import append_run_to_history
    from microscope.store.history_schema import HistoryError

    try:
        done = append_run_to_history(run_dir, path, passed=code == EXIT_OK)
    except HistoryError as exc:
        raise UserError(str(exc)) from exc
    console.print(Text(f"history: {done.describe(path)}"), highlight=False, soft_wrap=True)
    if not args.no_report:
        _write_reports(run_dir, ("html",), _reports_dir(args, run_dir), console, history=path)
    return code


def _write_reports(results_dir: Path, formats, out: Path, console: Console,  # noqa: ANN001
                   history: Path | None = None) -> None:
    from microscope.report.load import ReportError
    from microscope.report.publish import report_command

    try:
        paths = report_command(results_dir, formats, out, history=history)
    except ReportError as exc:
        raise UserError(str(exc)) from exc
    for path in paths.values():
        console.print(f"report: {path}", highlight=False)


def report(args: argparse.Namespace, console: Console) -> int:
    """Rebuild the reports of a saved run; a missing folder or an unwritable ``--out`` is a ``UserError``."""
    folder = args.results_dir
    try:
        is_dir = folder.is_dir()
    except (OSError, ValueError):  # a path too long for the system, a NUL in it
        is_dir = False
    if not is_dir:
        raise UserError(f"{folder}: no such results folder (expected results/<run-id>/ holding records.jsonl)")
    _complete_statistics(folder, console)
    try:
        _write_reports(folder, args.format, args.out, console, history=getattr(args, "history", None))
    except OSError as exc:
        raise UserError(f"{exc.filename or folder}: cannot read or write the report ({exc.strerror or exc}); "
                        "check the path and its permissions") from exc
    return EXIT_OK


def _complete_statistics(folder: Path, console: Console) -> None:
    """A run stopped before its statistics (killed by a time limit, say) still holds every complete
    record: compute and save the comparison table it did not get to, so the report has its verdicts.

    A damaged records file (a bad line in the middle) gets a note instead: the report still shows
    every record it can read, without verdicts.
    """
    import warnings

    from microscope.store.records import RecordsError, read_records

    records = folder / "records.jsonl"
    if not records.is_file() or any((folder / f"comparison.{ext}").is_file() for ext in ("csv", "parquet", "json")):
        return
    config = folder / "config.yaml"
    settings = cfgmod.StatsConfig()
    if config.is_file():
        try:
            settings = cfgmod.load(config).stats
        except cfgmod.ConfigError as exc:
            console.print(Text(f"{exc.problems[0]}\n{config}: unreadable; statistics with the default alpha "
                               "and band"), highlight=False, soft_wrap=True)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            n_records = sum(1 for _ in read_records(records))
        except RecordsError as exc:
            console.print(Text(f"statistics not computed: {exc}. The report shows the records it can read, "
                               "without verdicts."), highlight=False, soft_wrap=True)
            return
    for warning in caught:
        console.print(Text(f"note: {warning.message}"), highlight=False, soft_wrap=True)
    if n_records:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", UserWarning)  # the cut last line was noted just above
            _save_comparison(folder, settings)
        console.print(Text(f"statistics: the run stopped before its comparison table; computed it now from "
                           f"{n_records} records"), highlight=False, soft_wrap=True)


def compare(args: argparse.Namespace, console: Console) -> int:
    from microscope.report.compare import compare_gate
    from microscope.report.load import ReportError
    from microscope.report.publish import compare_command
    from microscope.report.verdict_console import gate_line, print_verdicts

    sides = _compare_sides([(args.run_a, "A"), (args.run_b, "B")], args, console)
    try:
        run, paths = compare_command(sides[0], sides[1], args.out, force=args.force, history=args.history)
    except ReportError as exc:
        raise UserError(str(exc)) from exc
    console.print(Text(run.title, style="bold"))
    for note in run.notes[:6]:
        console.print(Text(f" ! {note}", style="yellow"))
    print_verdicts(console, run, None)
    gate = compare_gate(run.comparison)
    console.print(gate_line(gate))
    for path in paths.values():
        console.print(Text(f"report: {path}"))
    if args.tensorboard is not None:
        _side_by_side(sides, args.tensorboard, console)
    return gate.exit_code


def _side_by_side(sides: list[Path], out: Path, console: Console) -> None:
    """``compare --tensorboard DIR``: both sides' sub-runs and each shared variant's graph diff."""
    from microscope.instrument.tb_compare import write_side_by_side

    try:
        done = write_side_by_side(sides[0], sides[1], out)
    except OSError as exc:
        raise UserError(f"{exc.filename or out}: cannot write the TensorBoard logs ({exc.strerror or exc})") from exc
    for note in done.notes:
        console.print(Text(f" ! tensorboard: {note}", style="yellow"))
    for variant, headline in done.diffs.items():
        console.print(Text(f"tensorboard: {variant}, graph of B against A: {headline}"))
    if done.subruns:
        console.print(Text(f"tensorboard: {len(done.subruns)} sub-runs in {out}; view with: "
                           f"microscope tensorboard {out}"))


def _compare_sides(sides: list[tuple[Path, str]], args: argparse.Namespace, console: Console) -> list[Path]:
    """Each side as a folder of runs. Config sides run ``--repeat`` times in fresh processes, taking
    turns (A B, B A, A B, ...), so a change of machine load during the compare falls on both sides alike
    instead of looking like a difference between them."""
    from microscope.fresh_runs import DEFAULT_TIMEOUT_S, FreshRunError, run_fresh

    folders: list[Path] = []
    configs: list[tuple[Path, str, Path]] = []
    for path, label in sides:
        if path.suffix not in (".yaml", ".yml"):
            if not path.exists():
                raise UserError(f"{path}: no such run folder or config")
            folders.append(path)
            continue
        if not path.is_file():
            raise UserError(f"{path}: no such config file")
        folder = args.results / f"compare-{label}-{new_stamp()}"
        configs.append((path, label, folder))
        folders.append(folder)
    profile = [f"{cfgmod.PROFILE_KEY}={args.profile}"] if args.profile else []
    per_side = {label: (list(args.set) + profile + list(getattr(args, f"set_{label.lower()}")),
                        side_env(getattr(args, f"env_{label.lower()}"), f"--env-{label.lower()}"))
                for _, label in sides}
    for label in ("A", "B"):
        if (getattr(args, f"set_{label.lower()}") or getattr(args, f"env_{label.lower()}")) and \
                label not in {c[1] for c in configs}:
            raise UserError(f"--set-{label.lower()}/--env-{label.lower()}: side {label} is a run folder, "
                            "not a config; these options only apply to config sides")
    repeat = 3 if args.repeat is None else args.repeat
    if not 1 <= repeat <= 100:
        raise UserError(f"--repeat {repeat}: between 1 and 100 runs per config side")
    if args.timeout is not None and not 0 < args.timeout <= 7 * 86400:
        raise UserError(f"--timeout {args.timeout}: seconds, more than 0 and at most a week")
    for i in range(repeat):
        for path, label, folder in (configs if i % 2 == 0 else configs[::-1]):
            console.print(Text(f"compare: side {label}, run {i + 1}/{repeat} of {path} (fresh process)", style="dim"))
            sets, env = per_side[label]
            try:
                done = run_fresh(path, folder, device=args.device, quick=args.quick, seed=args.seed, sets=sets,
                                 env=env, timeout_s=args.timeout or DEFAULT_TIMEOUT_S)
            except FreshRunError as exc:
                raise UserError(str(exc)) from exc
            if done.folder is None or not done.completed:
                console.print(Text(f" ! side {label}, run {i + 1}: the run {done.describe_exit()}"
                                   + ("" if done.folder else "; it left no records"), style="yellow"))
    for _, label, folder in configs:
        if not folder.is_dir() or not any((p / "records.jsonl").is_file() for p in folder.iterdir()):
            raise UserError(f"side {label}: none of its {repeat} run(s) left records in {folder}; "
                            "run the config alone to see why")
    return folders


def side_env(pairs: list[str], flag: str) -> dict[str, str]:
    """``NAME=VALUE`` pairs as a mapping; a malformed pair is a clear error naming the flag."""
    env: dict[str, str] = {}
    for pair in pairs:
        name, sep, value = pair.partition("=")
        if not sep or not name.strip() or not name.strip().replace("_", "").isalnum():
            raise UserError(f"{flag} {pair!r}: expected NAME=VALUE, e.g. "
                            f"{flag} PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True")
        env[name.strip()] = value
    return env


def new_stamp() -> str:
    """A UTC time stamp for folder names (sortable, no separators a shell cares about)."""
    return datetime.now(timezone.utc).strftime("%Y%m%d-%H%M%S")


def _save_comparison(folder: Path, settings: cfgmod.StatsConfig):  # noqa: ANN202 - a pandas DataFrame
    """The statistics engine's verdict table of the run in ``folder``, saved next to its records."""
    from microscope.stats.run_table import save_run_table

    return save_run_table(folder, alpha=settings.alpha, min_band=settings.min_band, contrasts=settings.contrasts)


def list_plugins(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    devmod.prepare(devmod.resolve("auto"))
    try:
        plugins = registry.discover(args.plugins, base_dir=Path.cwd())
    except (registry.PluginError, RegistrationError) as exc:
        raise UserError(str(exc)) from exc
    table = Table(title="microscope plugins", header_style="bold")
    for col in ("plugin", "variants (role)", "cases", "model-level arms (role)", "description"):
        table.add_column(col, overflow="fold")
    for name, cls in plugins.items():
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        try:
            plugin = cls()
            cases = _case_axes(plugin.cases) if plugin.variants else "-"
        except Exception as exc:  # a plugin whose constructor raises is listed with the reason
            table.add_row(name, "-", "-", "-", f"cannot be built: {type(exc).__name__}: {exc}")
            continue
        variants = ", ".join(f"{n} ({v.role.value}{', opt-in' if v.opt_in else ''})"
                             for n, v in plugin.iter_variants()) or "-"
        arms = ", ".join(f"{n} ({a.role.value})" + (" inference only" if a.inference_only else "")
                         for n, a in plugin.arms.items()) or "-"
        table.add_row(name, variants, cases, arms, doc)
    console.print(table)
    return EXIT_OK


def _case_axes(cases: Any) -> str:
    """"6: seq=128,1024; dtype=fp32,bf16": the grid's size and each axis's values."""
    axes: dict[str, list] = {}
    for case in cases:
        for axis, value in case.items:
            axes.setdefault(axis, [])
            if value not in axes[axis]:
                axes[axis].append(value)
    return f"{len(cases)}: " + "; ".join(f"{a}={','.join(map(str, v))}" for a, v in axes.items())


def validate(args: argparse.Namespace, console: Console) -> int:
    """Check every config given, for both devices with and without ``--quick``; a bad one does not stop
    the rest. Messages are printed as text, never as rich markup (a name may hold ``[/]``)."""
    devmod.prepare(devmod.resolve("auto"))
    bad = 0
    for path in args.configs:
        try:
            for device in ("cpu", "cuda"):
                for quick in (False, True):
                    load_checked(path, device, quick=quick)
        except UserError as exc:
            console.print(Text.assemble(("invalid", "red"), " ", str(exc)), highlight=False, soft_wrap=True)
            bad += 1
        else:
            console.print(Text.assemble(("ok", "green"), " ", str(path)), highlight=False, soft_wrap=True)
    if len(args.configs) > 1:
        console.print(Text(f"{bad} of {len(args.configs)} config(s) invalid"), highlight=False)
    return EXIT_BAD_INPUT if bad else EXIT_OK
