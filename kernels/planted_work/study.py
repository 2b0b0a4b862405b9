"""The planted-effect study: how often do microscope's latency verdicts find a known slowdown?

Runs ``ablations/planted_work.yaml`` through the same path as ``microscope run`` (config, registry,
runner, records, statistics) ``--runs`` times with different seeds, and counts, per planted slowdown,
how many runs called the candidate "slower", "faster", "equivalent" or "inconclusive". The A/A row
(0%) is the false-positive rate; the others are detection rates. Prints the environment and a table.

    python -m microscope_kernels.planted_work.study --runs 20 [--device cuda] [--rounds 20] [--set KEY=VALUE ...]
"""

from __future__ import annotations

import argparse
import collections
import platform
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path

from microscope import device as devmod


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[1])
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--device", default="auto")
    parser.add_argument("--rounds", type=int, default=None, help="override throughput.rounds")
    parser.add_argument("--reps", type=int, default=None, help="override throughput.reps")
    repo = Path(__file__).resolve().parents[2]
    parser.add_argument("--config", type=Path, default=repo / "ablations" / "planted_work.yaml")
    parser.add_argument("--set", nargs="*", default=[], metavar="KEY=VALUE",
                        help="config overrides as for microscope run, e.g. cases.iters=[100000]")
    args = parser.parse_args(argv)
    device = devmod.resolve(args.device)
    interpreted = devmod.prepare(device)

    import dataclasses

    import torch
    import triton

    from microscope import stats
    from microscope.commands import load_checked
    from microscope.config import parse_assignment
    from microscope.runner import Runner
    from microscope.store.records import records_frame

    counts: dict[str, collections.Counter] = collections.defaultdict(collections.Counter)
    ratios: dict[str, list[float]] = collections.defaultdict(list)
    seconds = []
    overrides = dict(parse_assignment(text) for text in args.set)
    with tempfile.TemporaryDirectory() as tmp:
        for run in range(args.runs):
            config, plugin = load_checked(args.config, device, quick=False, overrides={**overrides, "seed": run})
            tp = config.dimensions.throughput
            tp = dataclasses.replace(tp, rounds=args.rounds or tp.rounds, reps=args.reps or tp.reps)
            config = dataclasses.replace(config, dimensions=dataclasses.replace(config.dimensions, throughput=tp))
            start = time.perf_counter()
            result = Runner(plugin, config, device=device, interpreted=interpreted, out_root=Path(tmp),
                            run_id=f"study{run}").run()
            seconds.append(time.perf_counter() - start)
            table = stats.compare_records(records_frame(result.out_dir), alpha=config.stats.alpha,
                                          min_band=config.stats.min_band)
            lat = table[table.metric == "latency_ms"]
            for row in lat.itertuples():
                counts[row.candidate][row.verdict] += 1
                ratios[row.candidate].append(row.ratio_or_delta)
    print(f"planted-effect study, {datetime.now(timezone.utc):%Y-%m-%d %H:%M} UTC, {args.runs} runs, device {device} "
          f"({devmod.device_name(device)}), python {platform.python_version()}, torch {torch.__version__}, "
          f"triton {triton.__version__}, rounds {tp.rounds} x reps {tp.reps}, "
          f"median run time {sorted(seconds)[len(seconds) // 2]:.1f} s"
          + (f", --set {' '.join(args.set)}" if args.set else ""))
    print(f"{'candidate':<12} {'slower':>6} {'faster':>6} {'equiv':>6} {'inconcl':>7}  median ratio")
    for name in sorted(counts, key=lambda n: int(n.split("_")[1].rstrip("pct"))):
        c = counts[name]
        med = sorted(ratios[name])[len(ratios[name]) // 2]
        print(f"{name:<12} {c['slower']:>6} {c['faster']:>6} {c['equivalent']:>6} {c['inconclusive']:>7}  {med:.4f}")


if __name__ == "__main__":
    main()
