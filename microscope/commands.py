"""What each CLI command does; ``cli.py`` only parses arguments.

Order matters in ``run``: the device is chosen first, then Triton's interpreter switch is set, and only
then are plugins imported (``@triton.jit`` reads the switch at import time).
"""

from __future__ import annotations

import argparse
from pathlib import Path

import yaml
from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

from microscope import config as cfgmod
from microscope import device as devmod
from microscope import registry
from microscope.api import RegistrationError

EXIT_OK, EXIT_FAILED_TRIALS, EXIT_BAD_INPUT = 0, 1, 2


class UserError(Exception):
    """Bad input from the user (config, plugin, device); printed without a traceback."""


def _requested_device(path: Path, cli_device: str | None) -> str:
    if cli_device:
        return cli_device
    try:
        raw = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except (OSError, yaml.YAMLError):
        return "auto"  # the full load below reports the problem with its line
    value = raw.get("device", "auto") if isinstance(raw, dict) else "auto"
    return value if value in ("auto", "cpu", "cuda") else "auto"


def load_checked(path: Path, device: str, quick: bool, overrides: dict | None = None):
    """Config + plugin, fully validated before anything runs."""
    try:
        config = cfgmod.load(path, device=device, quick=quick, overrides=overrides)
        plugin = registry.get(config.plugin, config.plugins, base_dir=path.parent)
        cfgmod.check_against_plugin(config, plugin)
    except cfgmod.ConfigError as exc:
        raise UserError(f"{len(exc.problems)} problem(s) in {path}:\n  " + "\n  ".join(exc.problems)) from exc
    except (registry.PluginError, RegistrationError) as exc:
        where = config.where("plugin") if "config" in locals() else str(path)
        raise UserError(f"{where}: {exc}") from exc
    return config, plugin


def run(args: argparse.Namespace, console: Console) -> int:
    from microscope.model_runner import ModelRunner
    from microscope.report.console import skipped_summary, summary_table
    from microscope.report.model_console import model_summary_table
    from microscope.runner import INTERPRETER_NOTE, Runner

    try:
        device = devmod.resolve(_requested_device(args.config, args.device))
    except devmod.DeviceError as exc:
        raise UserError(str(exc)) from exc
    interpreted = devmod.prepare(device)
    try:
        overrides = dict(cfgmod.parse_assignment(item) for item in args.set)
    except cfgmod.ConfigError as exc:
        raise UserError(str(exc)) from exc
    if args.seed is not None:
        overrides["seed"] = args.seed
    config, plugin = load_checked(args.config, device, args.quick, overrides)
    text = args.config.read_text(encoding="utf-8")
    console.print(f"[bold]microscope[/] {plugin.name} on [bold]{device}[/] ({devmod.device_name(device)})"
                  f"{' --quick' if args.quick else ''}, seed {config.seed}")
    if interpreted:
        console.print(f"[yellow]note:[/] {INTERPRETER_NOTE}.")
    with Progress(TextColumn("{task.description}"), BarColumn(), TextColumn("{task.completed}/{task.total}"),
                  TimeElapsedColumn(), console=console, disable=args.no_progress, transient=True) as progress:
        model_level = cfgmod.effective_level(config, plugin) == "model"
        runner_cls = ModelRunner if model_level else Runner  # same constructor and RunResult
        runner = runner_cls(plugin, config, device=device, interpreted=interpreted, out_root=args.out,
                            config_text=text)
        task = progress.add_task("planning", total=runner.steps())

        def advance(message: str) -> None:
            progress.update(task, description=message[:60])
            if not message.startswith("measuring"):
                progress.advance(task)

        runner.on_progress = advance
        (runner.out_dir).mkdir(parents=True, exist_ok=True)
        (runner.out_dir / "config.yaml").write_text(text, encoding="utf-8")
        result = runner.run()
    summary = model_summary_table if model_level else summary_table
    console.print(summary(result.records, title=f"{plugin.name}: {result.run_id}"))
    for line in skipped_summary(result.records):
        console.print(f"[dim]skipped[/] {line}", highlight=False)
    _print_comparison(result, config, console)
    failed = result.failed
    console.print(f"{len(result.records)} records in {result.out_dir / 'records.jsonl'} "
                  f"({result.seconds:.1f} s); {len(failed)} failed trial record(s).")
    if not args.no_report:
        _write_reports(result.out_dir, ("md", "html"), args.reports, console)
    return EXIT_FAILED_TRIALS if failed else EXIT_OK


def _write_reports(results_dir: Path, formats, out: Path, console: Console) -> None:  # noqa: ANN001
    from microscope.report.load import ReportError
    from microscope.report.publish import report_command

    try:
        paths = report_command(results_dir, formats, out)
    except ReportError as exc:
        raise UserError(str(exc)) from exc
    for path in paths.values():
        console.print(f"report: {path}", highlight=False)


def report(args: argparse.Namespace, console: Console) -> int:
    if not args.results_dir.is_dir():
        raise UserError(f"{args.results_dir}: no such results folder (expected results/<run-id>/)")
    _complete_statistics(args.results_dir, console)
    _write_reports(args.results_dir, args.format, args.out, console)
    return EXIT_OK


def _complete_statistics(folder: Path, console: Console) -> None:
    """A run stopped before its statistics (killed by a time limit, say) still holds every complete
    record: compute and save the comparison table it did not get to, so the report has its verdicts."""
    records = folder / "records.jsonl"
    if not records.is_file() or any((folder / f"comparison.{ext}").is_file() for ext in ("csv", "parquet", "json")):
        return
    config = folder / "config.yaml"
    settings = cfgmod.StatsConfig()
    if config.is_file():
        try:
            settings = cfgmod.loads(config.read_text(encoding="utf-8"), str(config)).stats
        except cfgmod.ConfigError:
            console.print(f"{config}: unreadable; statistics with the default alpha and band", highlight=False)
    n_records = sum(1 for line in records.read_text(encoding="utf-8").splitlines() if line.strip())
    if n_records:
        _save_comparison(folder, settings)
        console.print(f"statistics: the run stopped before its comparison table; computed it now from "
                      f"{n_records} records", highlight=False)


def compare(args: argparse.Namespace, console: Console) -> int:
    from microscope.report.load import ReportError
    from microscope.report.publish import compare_command

    try:
        paths = compare_command(args.run_a, args.run_b, args.out, force=args.force)
    except ReportError as exc:
        raise UserError(str(exc)) from exc
    for path in paths.values():
        console.print(f"report: {path}", highlight=False)
    return EXIT_OK


def _save_comparison(folder: Path, settings: cfgmod.StatsConfig):  # noqa: ANN202 - a pandas DataFrame
    """The statistics engine's verdict table of the run in ``folder``, saved next to its records."""
    from microscope import stats
    from microscope.store.records import records_frame

    table = stats.compare_records(records_frame(folder), alpha=settings.alpha, min_band=settings.min_band)
    stats.save_table(table, folder)
    return table


def _print_comparison(result, config, console: Console) -> None:  # noqa: ANN001
    """The statistics engine's verdict table, printed and saved next to the records."""
    from microscope import stats

    stats.print_table(_save_comparison(result.out_dir, config.stats), console=console)


def list_plugins(args: argparse.Namespace, console: Console) -> int:
    from rich.table import Table

    devmod.prepare(devmod.resolve("auto"))
    try:
        plugins = registry.discover(args.plugins, base_dir=Path.cwd())
    except (registry.PluginError, RegistrationError) as exc:
        raise UserError(str(exc)) from exc
    table = Table(title="microscope plugins", header_style="bold")
    for col in ("plugin", "variants (role)", "cases", "description"):
        table.add_column(col, overflow="fold")
    for name, cls in plugins.items():
        plugin = cls()
        variants = ", ".join(f"{n} ({v.role.value})" for n, v in plugin.iter_variants())
        axes: dict[str, list] = {}
        for case in plugin.cases:
            for axis, value in case.items:
                axes.setdefault(axis, [])
                if value not in axes[axis]:
                    axes[axis].append(value)
        cases = f"{len(plugin.cases)}: " + "; ".join(f"{a}={v}" for a, v in axes.items())
        doc = (cls.__doc__ or "").strip().split("\n")[0]
        table.add_row(name, variants, cases, doc)
    console.print(table)
    return EXIT_OK


def validate(args: argparse.Namespace, console: Console) -> int:
    devmod.prepare(devmod.resolve("auto"))
    problems = 0
    for path in args.configs:
        for device in ("cpu", "cuda"):
            try:
                load_checked(path, device, quick=False)
                load_checked(path, device, quick=True)
            except UserError as exc:
                console.print(f"[red]invalid[/] {exc}", highlight=False, soft_wrap=True)
                problems += 1
                break
        else:
            console.print(f"[green]ok[/] {path}")
    return EXIT_BAD_INPUT if problems else EXIT_OK
