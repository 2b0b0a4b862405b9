"""``microscope calibrate CONFIG --runs N``: how often do the latency verdicts call each candidate what?

Runs the config ``N`` times (seeds 0..N-1) through the runner and tallies, per candidate, the verdict
of its latency against the baseline in every case: "slower", "faster", "equivalent", "inconclusive".
On a config whose candidates differ from the baseline by known amounts (``ablations/planted_work.yaml``:
0, 1, 2, 3, 5 and 10% more work) the 0% row is the false-positive rate of the verdict rule and the
others its detection rates. The runs share one process (each a fresh runner and seed): this measures
the within-run rule; ``compare --repeat`` is the between-run one.
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import platform
import statistics
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from rich.console import Console
from rich.table import Table
from rich.text import Text

__all__ = ["add_arguments", "calibrate"]

VERDICTS = ("slower", "faster", "equivalent", "inconclusive")


def add_arguments(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("calibrate", help="run a config N times and count each candidate's latency verdicts",
                       description=__doc__.split("\n\n")[1] if __doc__ else None)
    p.add_argument("config", type=Path, help="e.g. ablations/planted_work.yaml")
    p.add_argument("--runs", type=int, default=20, help="runs, seeds 0..N-1 (default 20)")
    p.add_argument("--device", choices=["auto", "cpu", "cuda"], default=None)
    p.add_argument("--quick", action="store_true", help="apply the config's quick: overlay")
    p.add_argument("--profile", default=None, metavar="NAME", help="a named profile of the config")
    p.add_argument("--set", nargs="+", action="extend", default=[], metavar="KEY=VALUE",
                   help="config overrides, e.g. --set dimensions.throughput.rounds=60")


def calibrate(args: argparse.Namespace, console: Console) -> int:
    """Run, tally and print; exit 0, or 2 for a bad config or ``--runs``."""
    from microscope import config as cfgmod
    from microscope import device as devmod
    from microscope.commands import UserError, load_checked, requested_device
    from microscope.runner import Runner
    from microscope.stats import compare_records
    from microscope.store.records import records_frame

    if not 1 <= args.runs <= 1000:
        raise UserError(f"--runs {args.runs}: between 1 and 1000")
    try:
        overrides = dict(cfgmod.parse_assignment(item) for item in args.set)
    except cfgmod.ConfigError as exc:
        raise UserError(str(exc)) from exc
    if args.profile:
        overrides[cfgmod.PROFILE_KEY] = args.profile
    try:
        device = devmod.resolve(requested_device(args.config, args.device))
    except devmod.DeviceError as exc:
        raise UserError(str(exc)) from exc
    interpreted = devmod.prepare(device)
    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    seconds: list[float] = []
    config = None
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            config, plugin = load_checked(args.config, device, args.quick, {**overrides, "seed": run})
            start = time.perf_counter()
            result = Runner(plugin, config, device=device, interpreted=interpreted, out_root=Path(tmp),
                            run_id=f"calibrate{run}").run()
            seconds.append(time.perf_counter() - start)
            table = compare_records(records_frame(result.out_dir), alpha=config.stats.alpha,
                                    min_band=config.stats.min_band)
            latency = table[(table["metric"] == "latency_ms") & (table["vs"].isin(["baseline", ""]))]
            for row in latency.itertuples():
                counts[row.candidate][row.verdict] += 1
                ratios[row.candidate].append(float(row.ratio_or_delta))
            console.print(Text(f"calibrate: run {run + 1}/{args.runs} ({seconds[-1]:.1f} s)", style="dim"))
    tp = dataclasses.asdict(config.dimensions.throughput) if config is not None else {}
    console.print(Text(f"{args.config}: {args.runs} runs on {device} ({devmod.device_name(device)}), "
                       f"{datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, python {platform.python_version()}, "
                       f"rounds {tp.get('rounds')} x reps {tp.get('reps')}, timing {tp.get('mode')}, "
                       f"median run {statistics.median(seconds):.1f} s", style="bold"))
    out = Table(show_edge=False)
    for name in ("candidate", *VERDICTS, "median ratio"):
        out.add_column(name, justify="left" if name == "candidate" else "right")
    for name in counts:
        c = counts[name]
        out.add_row(name, *(str(c[v]) for v in VERDICTS), f"{statistics.median(ratios[name]):.4f}")
    console.print(out)
    return 0
