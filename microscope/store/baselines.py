"""Exact baselines: committed values of deterministic metrics, checked to a declared tolerance.

On a CPU the same code, inputs and seeds give the same numbers: a kernel's error against its float64
reference, the peak bytes of a call, a tiny model's losses. A statistical gate would wave through a
change in the tenth digit; an exact gate does not. ``results/baselines/<name>.json`` holds, per
(plugin, variant, case, dimension, metric), the value and the tolerance it must be reproduced to
(``|now - value| <= atol + rtol * |value|``; 0 and 0 is bit-exact), plus the machine class it applies
to (``{"device": "cpu", "cpu_capability": "AVX2"}``). Timing metrics are never stored: they are judged only
statistically.

A CPU's SIMD level changes the last bits of a kernel run through the Triton interpreter (numpy's exp and
sums) and of torch's CPU kernels, and so does the CPU itself at the same levels (an fp32 softmax's error read 2%
apart on an AMD EPYC and an Intel Xeon, both AVX512, and on the Xeon it also moved between runs, in 1 of 5), so a
CPU class names the levels torch and numpy dispatch to and the CPU's model. One file holds one set of values per
class (``baseline save`` adds or replaces this machine's); a check uses the class of the machine its runs came
from, and says so when the file has none for it.

Default tolerances when a baseline is saved: 0 for memory and whole numbers (counts, bytes), 1e-9
relative for operator numerics (the float64 error sums may be reduced in another order on another
CPU), 1e-5 relative for model-level metrics (BLAS kernels differ between CPU instruction sets).
A metric that differed between the runs it was saved from is not deterministic and is left out.
"""

from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from .history_schema import HistoryError
from .records import RecordsError, read_records
from .run_summary import summarize_run

__all__ = ["EXACT_DIMENSIONS", "BaselineError", "BaselineFile", "number", "ExactBaseline", "ExactCheck", "ExactMetric",
           "ExactReport", "baseline_from_runs", "check_runs", "machine_class"]

FORMAT, VERSION = "microscope-exact-baseline", 2
#: The keys of a machine class besides ``device``, per device; each is read from the runs' recorded environment.
CLASS_KEYS = {"cpu": ("cpu_capability", "numpy_simd", "cpu_model")}
#: Dimensions whose metrics may be exact on a CPU; throughput (time and rates) never is.
EXACT_DIMENSIONS = ("accuracy", "memory", "stability", "generalization")
NUMERICS_RTOL, MODEL_RTOL = 1e-9, 1e-5
_FIX = "re-save it with `microscope baseline save RUN_DIR NAME`"


def number(value: float) -> str:
    """A value as it round-trips: ``268435456`` for whole numbers, else the shortest exact repr."""
    return str(int(value)) if float(value).is_integer() and abs(value) < 2**53 else repr(float(value))


class BaselineError(Exception):
    """An unreadable or malformed baseline file, or runs a baseline cannot be saved from; exit 2."""


@dataclass(frozen=True)
class ExactMetric:
    """One committed value and the tolerance a new run must reproduce it to."""

    plugin: str
    variant: str
    case: str
    dimension: str
    metric: str
    value: float
    rtol: float = 0.0
    atol: float = 0.0
    unit: str = ""

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (self.plugin, self.variant, self.case, self.dimension, self.metric)

    @property
    def label(self) -> str:
        return f"{self.plugin} | {self.variant} | {self.case} | {self.dimension} {self.metric}"

    def allows(self, now: float) -> bool:
        if self.rtol == 0 and self.atol == 0:
            return now == self.value
        return abs(now - self.value) <= self.atol + self.rtol * abs(self.value)

    def tolerance(self) -> str:
        if self.rtol == 0 and self.atol == 0:
            return "exact"
        parts = ([f"rtol {self.rtol:g}"] if self.rtol else []) + ([f"atol {self.atol:g}"] if self.atol else [])
        return " + ".join(parts)


def machine_class(device: str, env: dict[str, Any]) -> dict[str, str]:
    """The class a run's values hold on: its device and, on a CPU, torch's and numpy's SIMD levels and the
    CPU's model where recorded."""
    found = {"device": device}
    for key in CLASS_KEYS.get(device, ()):
        if env.get(key) not in (None, ""):
            found[key] = str(env[key])
    return found


def describe_class(applies_to: dict[str, str]) -> str:
    """``cpu (cpu_capability AVX2)`` for logs and reports."""
    rest = ", ".join(f"{k} {v}" for k, v in applies_to.items() if k != "device")
    return f"{applies_to.get('device')}{f' ({rest})' if rest else ''}"


@dataclass
class ExactBaseline:
    """One machine class of a baseline file: the class it applies to, provenance and the metrics."""

    name: str
    applies_to: dict[str, str]
    metrics: list[ExactMetric]
    recorded: dict[str, Any] = field(default_factory=dict)
    path: Path | None = None

    def applies(self, found: dict[str, str]) -> bool:
        """Whether values measured on machine class ``found`` are held to this class's values."""
        return all(found.get(key) == value for key, value in self.applies_to.items())

    def to_dict(self) -> dict[str, Any]:
        return {"applies_to": self.applies_to, "recorded": self.recorded, "metrics": [asdict(m) for m in self.metrics]}

    def save(self, path: Path) -> Path:
        """Write this class into ``path``, beside the file's other classes (replacing one for the same class)."""
        try:
            held = BaselineFile.load(path) if path.is_file() else BaselineFile(self.name, [])
        except BaselineError:
            held = BaselineFile(self.name, [])
        kept = [c for c in held.classes if c.applies_to != self.applies_to]
        BaselineFile(self.name, [*kept, self]).save(path)
        self.path = path
        return path


@dataclass
class BaselineFile:
    """A baseline file: one ``ExactBaseline`` per machine class it was saved on."""

    name: str
    classes: list[ExactBaseline]
    path: Path | None = None

    def to_json(self) -> str:
        data = {"format": FORMAT, "version": VERSION, "name": self.name,
                "classes": [c.to_dict() for c in self.classes]}
        return json.dumps(data, indent=1, sort_keys=False) + "\n"

    def save(self, path: Path) -> Path:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(self.to_json(), encoding="utf-8")
        self.path = path
        return path

    def select(self, found: dict[str, str]) -> ExactBaseline | None:
        """The class whose values hold on machine class ``found`` (the most specific one), or None."""
        fitting = [c for c in self.classes if c.applies(found)]
        return max(fitting, key=lambda c: len(c.applies_to)) if fitting else None

    @classmethod
    def load(cls, path: Path | str) -> BaselineFile:
        """Read and validate ``path`` (version 1: one class; 2: a list); every problem is a
        ``BaselineError`` naming the file and field."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise BaselineError(f"{path}: no such baseline file; save one with `microscope baseline save RUN_DIR "
                                f"{path.stem}`") from None
        except (OSError, UnicodeDecodeError) as exc:
            raise BaselineError(f"{path}: cannot read the baseline ({exc})") from exc
        except json.JSONDecodeError as exc:
            raise BaselineError(f"{path}:{exc.lineno}: not JSON ({exc.msg}); {_FIX}") from exc
        if not isinstance(data, dict) or data.get("format") != FORMAT:
            raise BaselineError(f"{path}: not a microscope exact baseline (field 'format' must be {FORMAT!r})")
        name = str(data.get("name") or path.stem)
        if data.get("version") == 1:
            return cls(name, [_class(path, "", data, name)], path)
        if data.get("version") != VERSION:
            raise BaselineError(f"{path}: field 'version' is {data.get('version')!r}; this microscope reads versions "
                                f"1 and {VERSION}; {_FIX}")
        rows = data.get("classes")
        if not isinstance(rows, list) or not rows or not all(isinstance(r, dict) for r in rows):
            raise BaselineError(f"{path}: field 'classes' must be a non-empty list of objects; {_FIX}")
        classes = [_class(path, f"classes[{i}].", row, name) for i, row in enumerate(rows)]
        for i, c in enumerate(classes):
            if any(c.applies_to == other.applies_to for other in classes[:i]):
                raise BaselineError(f"{path}: classes[{i}]: machine class {describe_class(c.applies_to)} is listed "
                                    "twice; keep one")
        return cls(name, classes, path)


def _class(path: Path, where: str, data: dict, name: str) -> ExactBaseline:
    """One machine class of a baseline file (``where``: its field prefix, for error messages)."""
    applies = data.get("applies_to")
    if not isinstance(applies, dict) or applies.get("device") not in ("cpu", "cuda"):
        raise BaselineError(f"{path}: field '{where}applies_to.device' must be \"cpu\" or \"cuda\" (the machine "
                            "class the values hold on)")
    rows = data.get("metrics")
    if not isinstance(rows, list) or not rows:
        raise BaselineError(f"{path}: field '{where}metrics' must be a non-empty list; {_FIX}")
    metrics = [_metric(path, f"{where}metrics[{i}]", row) for i, row in enumerate(rows)]
    seen: set[tuple[str, ...]] = set()
    for m in metrics:
        if m.key in seen:
            raise BaselineError(f"{path}: {where}metrics: {m.label} is listed twice; keep one")
        seen.add(m.key)
    recorded = data.get("recorded") if isinstance(data.get("recorded"), dict) else {}
    return ExactBaseline(name, {k: str(v) for k, v in applies.items()}, metrics, recorded, path)


def _metric(path: Path, field_name: str, row: Any) -> ExactMetric:
    where = f"{path}: {field_name}"
    if not isinstance(row, dict):
        raise BaselineError(f"{where}: must be an object with plugin, variant, case, dimension, metric, value")
    for name in ("plugin", "variant", "case", "dimension", "metric"):
        if not isinstance(row.get(name), str):
            raise BaselineError(f"{where}: field {name!r} must be a string")
    if row["dimension"] not in EXACT_DIMENSIONS:
        raise BaselineError(f"{where}: dimension {row['dimension']!r} is never exact (timing is judged only "
                            f"statistically); use one of {', '.join(EXACT_DIMENSIONS)}")
    numbers = {}
    for name, default in (("value", None), ("rtol", 0.0), ("atol", 0.0)):
        v = row.get(name, default)
        if isinstance(v, bool) or not isinstance(v, (int, float)) or not math.isfinite(v):
            raise BaselineError(f"{where}: field {name!r} must be a finite number, not {v!r}")
        if name != "value" and v < 0:
            raise BaselineError(f"{where}: field {name!r} must be >= 0 (a tolerance), not {v!r}")
        numbers[name] = float(v)
    return ExactMetric(row["plugin"], row["variant"], row["case"], row["dimension"], row["metric"], numbers["value"],
                       numbers["rtol"], numbers["atol"], str(row.get("unit") or ""))


# -- reading runs ------------------------------------------------------------------------------------


@dataclass(frozen=True)
class _Run:
    folder: Path
    device: str
    model_level: bool
    env: dict[str, Any]
    values: dict[tuple[str, ...], tuple[float | None, str, str]]  # key -> (value, status, unit)


def _read_run(folder: Path) -> _Run:
    try:
        summary = summarize_run(folder)
        devices = {str(r.get("device")) for r in read_records(Path(folder))}
        dims = set(summary.rows["dimension"])
    except (HistoryError, RecordsError) as exc:
        raise BaselineError(str(exc)) from exc
    values = {}
    for r in summary.rows.itertuples(index=False):
        key = (r.plugin, r.variant, r.case_id, r.dimension, r.metric)
        value = float(r.value) if r.status == "ok" and math.isfinite(r.value) else None
        values[key] = (value, str(r.status), str(r.unit or ""))
    roles = {(r.plugin, r.variant): r.role for r in summary.rows.itertuples(index=False)}
    values = {k: v for k, v in values.items() if roles.get(k[:2]) != "peer"}
    device = devices.pop() if len(devices) == 1 else ",".join(sorted(devices))
    return _Run(Path(folder), device, "stability" in dims, summary.info.env, values)


def _default_tolerance(run: _Run, dimension: str, value: float) -> tuple[float, float]:
    if dimension == "memory" or float(value).is_integer():
        return 0.0, 0.0
    return (MODEL_RTOL if run.model_level else NUMERICS_RTOL), 0.0


def baseline_from_runs(run_dirs: list[Path], name: str, *, rtol: float | None = None,
                       atol: float | None = None) -> tuple[ExactBaseline, list[str]]:
    """An exact baseline from one or more run folders (repeats of one suite); returns it and notes.

    Every deterministic-dimension metric of every non-peer variant is kept; one whose value differs
    between runs of the same plugin is left out and named in the notes. ``rtol``/``atol`` replace the
    default tolerances for every metric.
    """
    runs = [_read_run(Path(d)) for d in run_dirs]
    devices = {r.device for r in runs}
    if len(devices) != 1 or not devices <= {"cpu", "cuda"}:
        raise BaselineError(f"runs from devices {', '.join(sorted(devices))}: a baseline holds for one machine class; "
                            "save one per device")
    notes: list[str] = []
    by_key: dict[tuple[str, ...], list[tuple[_Run, float | None, str, str]]] = {}
    for run in runs:
        for key, (value, status, unit) in run.values.items():
            if key[3] in EXACT_DIMENSIONS:
                by_key.setdefault(key, []).append((run, value, status, unit))
    metrics = []
    for key in sorted(by_key):
        seen = by_key[key]
        values = [v for _, v, _, _ in seen]
        label = " | ".join(key[:3]) + f" | {key[3]} {key[4]}"
        if any(v is None for v in values):
            notes.append(f"{label}: left out ({seen[0][2]} in a run)")
            continue
        if len(set(values)) > 1:
            notes.append(f"{label}: left out, not deterministic ({number(min(values))} .. {number(max(values))} over "
                         f"{len(values)} runs)")
            continue
        run, value, _, unit = seen[0]
        default = _default_tolerance(run, key[3], value)
        metrics.append(ExactMetric(*key, value=value, rtol=default[0] if rtol is None else rtol,
                                   atol=default[1] if atol is None else atol, unit=unit))
    if not metrics:
        raise BaselineError(f"{', '.join(str(d) for d in run_dirs)}: no deterministic metric to save (accuracy, "
                            "memory, stability or generalization values that every run measured alike)")
    if len(runs) == 1:
        notes.append("saved from one run per plugin: determinism not checked (give two runs to check it)")
    env = runs[0].env
    recorded = {"date": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "commit": env.get("commit"), "python": env.get("python"), "torch": env.get("torch"),
                "triton": env.get("triton"), "machine": env.get("cpu_model") or env.get("device_name"),
                "cpu_capability": env.get("cpu_capability"),
                "runs": [d.name for d in map(Path, run_dirs)]}
    classes = {json.dumps(machine_class(r.device, r.env), sort_keys=True) for r in runs}
    if len(classes) != 1:
        raise BaselineError(f"runs from machine classes {', '.join(sorted(classes))}: a baseline's values hold for "
                            "one class; save each machine's runs on their own")
    return ExactBaseline(name, machine_class(runs[0].device, runs[0].env), metrics, recorded), notes


# -- checking runs -----------------------------------------------------------------------------------


@dataclass(frozen=True)
class ExactCheck:
    """One committed metric against this night: ``status`` same | within | differs | missing | failed."""

    metric: ExactMetric
    now: float | None
    status: str
    run: str = ""

    @property
    def failed(self) -> bool:
        return self.status == "differs"

    def describe(self) -> str:
        m = self.metric
        if self.status in ("missing", "failed"):
            return f"{m.label}: {'not measured' if self.status == 'missing' else 'its trial failed'} in {self.run}"
        now = "-" if self.now is None else number(self.now)
        diff = "" if self.now is None else f", difference {self.now - m.value:+.3g}"
        return (f"{m.label}: baseline {number(m.value)}, now {now}{diff}, tolerance {m.tolerance()} "
                f"({self.status})")


@dataclass
class ExactReport:
    """Every check of one baseline against a night's runs, and what could not be checked."""

    baseline: ExactBaseline
    checks: list[ExactCheck] = field(default_factory=list)
    problems: list[str] = field(default_factory=list)  # could not check: wrong device
    notes: list[str] = field(default_factory=list)

    @property
    def differs(self) -> list[ExactCheck]:
        return [c for c in self.checks if c.status == "differs"]

    @property
    def unmeasured(self) -> list[ExactCheck]:
        return [c for c in self.checks if c.status in ("missing", "failed")]


def check_runs(baseline: ExactBaseline | BaselineFile, run_dirs: list[Path]) -> ExactReport:
    """Check each run's deterministic metrics against ``baseline`` (a file: its class for the runs'
    machine): a value outside its tolerance in any run "differs"; plugins the runs did not measure are not
    checked (a note says how many)."""
    runs = [_read_run(Path(d)) for d in run_dirs]
    held = baseline if isinstance(baseline, BaselineFile) else BaselineFile(baseline.name, [baseline], baseline.path)
    found = [machine_class(r.device, r.env) for r in runs]
    chosen = held.select(found[0]) if found else held.classes[0]
    report = ExactReport(chosen or held.classes[0])
    wrong = [(r, f) for r, f in zip(runs, found) if chosen is None or not chosen.applies(f)]
    if wrong:
        run, machine = wrong[0]
        saved = "; ".join(describe_class(c.applies_to) for c in held.classes)
        device = machine["device"]
        report.problems.append(f"{held.path or held.name}: holds values for {saved}; {run.folder.name} ran on "
                               f"{describe_class(machine)}, so its values cannot be checked (run on a machine of a "
                               f"saved class, e.g. --device {held.classes[0].applies_to.get('device')}, or add this "
                               f"machine's values with `microscope baseline save RUN_DIR {held.name}` on --device "
                               f"{device})")
        return report
    baseline = chosen
    plugins = {k[0] for r in runs for k in r.values}
    skipped = [m for m in baseline.metrics if m.plugin not in plugins]
    if skipped:
        names = ", ".join(sorted({m.plugin for m in skipped}))
        report.notes.append(f"{len(skipped)} metric(s) of plugin(s) not run ({names}) not checked")
    for m in baseline.metrics:
        if m.plugin not in plugins:
            continue
        mine = [r for r in runs if any(k[0] == m.plugin for k in r.values)]
        report.checks.append(_check_one(m, mine))
    known = {m.key for m in baseline.metrics}
    extra = sorted({k for r in runs for k, (v, _, _) in r.values.items()
                    if k[3] in EXACT_DIMENSIONS and k not in known and k[0] in {m.plugin for m in baseline.metrics}})
    if extra:
        report.notes.append(f"{len(extra)} deterministic metric(s) not in the baseline (e.g. {' | '.join(extra[0])}); "
                            "re-save the baseline to gate them")
    return report


def _check_one(m: ExactMetric, runs: list[_Run]) -> ExactCheck:
    worst: ExactCheck | None = None
    for run in runs:
        found = run.values.get(m.key)
        if found is None:
            return ExactCheck(m, None, "missing", run.folder.name)
        value, status, _ = found
        if value is None:
            return ExactCheck(m, None, "failed" if status == "failed" else "missing", run.folder.name)
        if not m.allows(value):
            return ExactCheck(m, value, "differs", run.folder.name)
        if worst is None or (value != m.value and worst.status == "same"):
            worst = ExactCheck(m, value, "same" if value == m.value else "within", run.folder.name)
    return worst or ExactCheck(m, None, "missing", "no run")
