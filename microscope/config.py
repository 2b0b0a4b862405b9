"""YAML run configs -> validated, frozen dataclasses; every error names file, line and field.

Configs are read with PyYAML's safe loader (no arbitrary objects) at the node level, so each key keeps
the line it was written on. Validation runs completely before any kernel does, and reports every
problem at once with a suggestion ("did you mean 'rounds'?"), because a typo found after ten minutes
of GPU time is a wasted ten minutes.

Overlays: ``profiles: {cpu: {...}, cuda: {...}}`` are merged over the top level for the device the run
uses, then ``quick: {...}`` for ``--quick`` runs. Keys inside an overlay keep their own line numbers.

Reading is bounded before anything is expanded: a config is a few hundred lines, so a file over
``MAX_FILE_BYTES``, nesting deeper than ``MAX_DEPTH``, more than ``MAX_ALIASES`` aliases, or aliases that
would expand to more than ``MAX_NODES`` values are refused while the YAML is composed; a "billion
laughs" file fails in milliseconds instead of filling memory. Numbers must lie in each field's
``BOUNDS`` (NaN and infinities never do), and ``--set`` values are cited as ``--set key=value``.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import itertools
import math
import stat
import types
import typing
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from microscope.api import DTYPES, Ablation, Role
from microscope.instrument.config import InstrumentConfig


class ConfigError(Exception):
    """One or more problems in a config file; the message lists each as ``file:line: field: problem``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


#: Limits on a config's text, checked before any alias is expanded (the shipped configs use a few
#: hundred values, nest 5 deep and use no aliases at all).
MAX_FILE_BYTES = 1 << 20
MAX_DEPTH = 32
MAX_ALIASES = 64
MAX_NODES = 20_000
#: Largest whole number anywhere in a config: a 64-bit seed is the largest that means anything.
MAX_INT = 2**63 - 1
#: Characters of a value or key quoted in a message; longer ones are cut with "...".
_SHOWN = 80


# --- the schema -------------------------------------------------------------------------------


@dataclass(frozen=True)
class AccuracyConfig:
    """Error of every variant against a float64 evaluation of the reference."""

    enabled: bool = True
    backward: bool = True  # also compare gradients of grad_inputs


@dataclass(frozen=True)
class ThroughputConfig:
    """Latency in interleaved rounds: each round runs every variant ``reps`` times, order alternating."""

    enabled: bool = True
    warmup: int = 3  # untimed calls per variant before the first round
    rounds: int = 10  # interleaved rounds; the statistics work on per-round medians
    reps: int = 5  # timed calls per variant per round
    backward: bool = False  # time forward+backward instead of forward only
    flush_l2: bool = True  # GPU: overwrite the L2 cache before every timed call
    # GPU: what a timed call's milliseconds are. events: CUDA events around each call, launch cost
    # covered by queued work; cuda_graph: the call captured once in a CUDA graph and replayed (device time
    # alone, for kernels of a few microseconds); host: the Python and launch time until the call returns
    mode: Literal["events", "cuda_graph", "host"] = "events"
    table: bool = False  # print each variant's TFLOP/s or GB/s and share of the ceiling per case (a bench table)
    # > 0: a variant whose call takes longer than this many ms per round gets fewer reps (at least 1), so
    # slow peers (eager, a math backend) do not dominate a run's time; the rounds stay paired
    round_budget_ms: float = 0.0
    input_sets: int = 3  # seeded input sets rotated across timed calls (1: the accuracy inputs only)
    check_rounds: int = 3  # rounds whose last timed output is checked against its float64 reference
    # 2 or more, below rounds: sequential rounds (stats/sequential_rounds.py): look after min_rounds rounds, then
    # every look_every, and stop once every candidate's verdict is decided; ``rounds`` is the budget, each look
    # tests at alpha/looks. 0, or >= rounds (a quick profile's few rounds): every case runs all its rounds
    min_rounds: int = 0
    look_every: int = 4

    def __post_init__(self) -> None:
        if self.min_rounds == 1:
            raise ValueError("min_rounds (1): a look needs at least 2 paired rounds; give 2 or more (0: no looks)")


@dataclass(frozen=True)
class MemoryConfig:
    """Peak memory allocated during one call (CUDA allocator on GPU, live torch tensors on CPU)."""

    enabled: bool = True
    backward: bool = False  # measure forward+backward instead of forward only


@dataclass(frozen=True)
class DimensionsConfig:
    accuracy: AccuracyConfig = field(default_factory=AccuracyConfig)
    throughput: ThroughputConfig = field(default_factory=ThroughputConfig)
    memory: MemoryConfig = field(default_factory=MemoryConfig)


@dataclass(frozen=True)
class StatsConfig:
    """Settings of the comparison table's verdicts."""

    alpha: float = 0.05  # significance level (Holm-adjusted across the gating family)
    min_band: float = 0.01  # smallest latency change called real: tau = max(min_band, 2 x A/A noise)
    # "a vs b": also compare variant (arm) a with variant b, beside each with the baseline (exploratory, not gated)
    contrasts: tuple[tuple[str, str], ...] = ()


@dataclass(frozen=True)
class GateConfig:
    """What makes a run exit 1: the comparisons a CI job gates on (README "Exit codes").

    Only candidates are gated (peers are compared, not judged), and a speed or memory verdict only
    counts where the candidate passed accuracy in that case.
    """

    accuracy: bool = True  # candidates pass every accuracy check (model level: accuracy not "worse")
    throughput: Literal["not_slower", "faster", "off"] = "not_slower"  # latency vs the baseline
    best_peer: Literal["off", "not_slower"] = "off"  # latency vs the fastest correct peer of each case
    memory_growth: float | None = 0.05  # largest peak-memory growth vs the baseline (null: not gated)
    stability: bool = False  # stability and generalization must not be "worse"
    failed_trials: bool = True  # a trial that raised, crashed, timed out or returned NaN/Inf fails


@dataclass(frozen=True)
class ExecutorConfig:
    """Where trial groups run and the run's guards (README "Isolation, resume and executors")."""

    kind: Literal["local", "inline", "ray"] = "local"  # worker processes | this process | Ray tasks
    jobs: int | None = None  # workers (local) or tasks in flight (ray); null: one per GPU, one on CPU
    max_wall_s: float | None = None  # the run's budget: groups not finished by then are left to --resume
    memory_limit_gb: float | None = None  # CPU workers' address-space cap (a runaway allocation fails its group)
    address: str = "auto"  # ray: a cluster address; auto: a running cluster, else a local Ray


@dataclass(frozen=True)
class WorkloadConfig:
    """Model level: the embedded workload every arm is trained and evaluated on.

    ``profile`` names a size in ``microscope.workloads.profiles`` (``tiny`` for CPUs, ``gpu``);
    ``model``, ``recipe`` and ``corpus`` override single fields of its ``ModelConfig``,
    ``TrainRecipe`` and ``CorpusSpec`` for every arm (an arm's own overrides come last).
    """

    profile: str = "tiny"
    seeds: int = 3  # independent seeds (init, data order, dropout); every arm sees the same ones
    max_seeds: int | None = None  # sequential: add seeds, one at a time, until every test decides (budget)
    task: Literal["lm", "recall"] = "lm"  # next-token LM on the corpus, or associative recall
    steps: int | None = None  # training steps (default: the profile's)
    batch_size: int | None = None
    eval_tokens: int | None = None  # predicted tokens per evaluation split (default: the profile's)
    eval_batch_size: int | None = None  # rows per evaluation batch and of the inference prompt (default: profile's)
    decode_tokens: int = 16  # greedy decode steps timed through the KV cache
    # generalization: also evaluated at these multiples of the training context ([] where eager attention at
    # 4x would not fit, e.g. a 16k-token context)
    longer_contexts: tuple[Literal[2, 4], ...] = (2, 4)
    margin: float = 0.0  # non-inferiority margin of the validation loss, in nats
    ranks: int | None = None  # processes for every arm the plugin runs on several (2 or 4 GPUs; default: its own)
    model: Mapping[str, Any] = field(default_factory=dict)
    recipe: Mapping[str, Any] = field(default_factory=dict)
    corpus: Mapping[str, Any] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.max_seeds is not None and isinstance(self.seeds, int) and self.max_seeds < self.seeds:
            raise ValueError(f"max_seeds ({self.max_seeds}) is the most seeds a sequential run may reach; "
                             f"it must be >= seeds ({self.seeds})")


#: Field names allowed under workload.model / .recipe / .corpus (checked against the dataclasses).
def _workload_schemas() -> dict[str, type]:
    from microscope.workloads import CorpusSpec, ModelConfig, TrainRecipe

    return {"model": ModelConfig, "recipe": TrainRecipe, "corpus": CorpusSpec}


@dataclass(frozen=True)
class RunConfig:
    """One run: a plugin, the cases and variants to try, and the dimensions to measure."""

    plugin: str
    description: str = ""
    level: Literal["auto", "operator", "model"] = "auto"  # auto: operator if the plugin has variants
    plugins: tuple[str, ...] = ()  # extra plugin files (relative to the config) or module names
    seed: int = 0
    repeats: int = 1  # accuracy: independent input draws per case
    device: Literal["auto", "cpu", "cuda"] = "auto"
    timeout_s: float = 600.0  # per trial group (a case, or a seed of a model run) in a worker process
    variants: tuple[str, ...] = ()  # subset to run; empty = all (the baseline always runs)
    # variant -> parameter -> values: one variant per combination (parameters the plugin declares)
    sweep: Mapping[str, Mapping[str, tuple[Any, ...]]] = field(default_factory=dict)
    # axis -> values (a grid), or a tuple of such grids taken together; read it through case_grids()
    cases: Mapping[str, tuple[Any, ...]] | tuple[Mapping[str, tuple[Any, ...]], ...] = field(default_factory=dict)
    dimensions: DimensionsConfig = field(default_factory=DimensionsConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    gate: GateConfig = field(default_factory=GateConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    executor: ExecutorConfig = field(default_factory=ExecutorConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)  # hooks, traces, TensorBoard
    # provenance: where the config came from and which line each dotted field was written on
    path: str = "<inline>"
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)
    # dotted keys given with --set -> "--set key=value", cited instead of a line of the file
    overridden: Mapping[str, str] = field(default_factory=dict, compare=False, repr=False)

    def where(self, dotted: str) -> str:
        """``file:line`` of a dotted field (falls back to the nearest written parent, then the file), or
        ``--set key=value`` when the field came from the command line."""
        return _Where(self.path, self.lines, self.overridden).at(dotted)

    def problem(self, dotted: str, text: str) -> str:
        """``file:line: field: text`` for a problem with a dotted field (``--set field=value: text``)."""
        return _Where(self.path, self.lines, self.overridden).problem(dotted, text)


def case_grids(config: RunConfig) -> list[tuple[str, Mapping[str, tuple[Any, ...]]]]:
    """The config's case grids with the dotted name each is written at (``cases`` or ``cases[i]``); none
    when the config keeps the plugin's own cases."""
    if isinstance(config.cases, tuple):
        return [(f"cases[{i}]", g) for i, g in enumerate(config.cases)]
    return [("cases", config.cases)] if config.cases else []


OVERLAY_KEYS = ("profiles", "quick")
DEVICE_PROFILES = ("cpu", "cuda")
#: The override key that names a ``profiles:`` entry to merge after the device's (``--profile bench``).
PROFILE_KEY = "profile"


@dataclass(frozen=True)
class Bounds:
    """The accepted range of a numeric field; NaN and the infinities lie in none."""

    low: float
    high: float
    low_open: bool = False
    high_open: bool = False
    whole: bool = False

    def holds(self, value: float) -> bool:
        if not math.isfinite(value):
            return False
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        return above and below

    def __str__(self) -> str:
        if self.whole:
            if self.high >= MAX_INT:
                return f"a whole number >= {self.low}"
            return f"a whole number from {self.low} to {self.high}"
        low = f"> {self.low:g}" if self.low_open else f">= {self.low:g}"
        high = f"< {self.high:g}" if self.high_open else f"<= {self.high:g}"
        return f"a finite number {low} and {high}"


def _whole(low: int, high: int) -> Bounds:
    return Bounds(low, high, whole=True)


#: Accepted ranges by dotted field. Wide enough for any real run, narrow enough that a typo (an extra
#: zero, a NaN, 1e30) is caught before a GPU spends hours on it. Numeric fields not listed are held
#: to ``_POSITIVE``/``_NON_NEGATIVE`` below, and every number to finite and ``|x| <= MAX_INT``.
BOUNDS: dict[str, Bounds] = {
    "seed": _whole(0, MAX_INT),
    "repeats": _whole(1, 1000),
    "timeout_s": Bounds(0, 7 * 24 * 3600, low_open=True),  # a week
    "dimensions.throughput.warmup": _whole(0, 10_000),
    "dimensions.throughput.rounds": _whole(1, 100_000),
    "dimensions.throughput.reps": _whole(1, 100_000),
    "dimensions.throughput.input_sets": _whole(1, 1000),
    "dimensions.throughput.check_rounds": _whole(0, 100_000),
    "dimensions.throughput.round_budget_ms": Bounds(0, 3_600_000),
    "dimensions.throughput.min_rounds": _whole(0, 100_000),
    "dimensions.throughput.look_every": _whole(1, 100_000),
    "executor.jobs": _whole(1, 1024),
    "executor.max_wall_s": Bounds(0, 30 * 24 * 3600, low_open=True),  # a month
    "executor.memory_limit_gb": Bounds(0, 1 << 20, low_open=True),
    "stats.alpha": Bounds(0, 1, low_open=True, high_open=True),
    "stats.min_band": Bounds(0, 1, high_open=True),
    "gate.memory_growth": Bounds(0, 1000),
    "workload.seeds": _whole(1, 1000),
    "workload.max_seeds": _whole(1, 1000),
    "workload.steps": _whole(1, 10_000_000),
    "workload.batch_size": _whole(1, 65_536),
    "workload.eval_tokens": _whole(1, 1_000_000_000),
    "workload.eval_batch_size": _whole(1, 65_536),
    "workload.decode_tokens": _whole(1, 1_000_000),
    "workload.margin": Bounds(0, 10),
    "workload.ranks": _whole(2, 1024),
    "instrument.histograms": _whole(0, 4096),
    "instrument.divergence_threshold": Bounds(0, 1e6, low_open=True),
    "instrument.profile.wait": _whole(0, 1000),
    "instrument.profile.warmup": _whole(0, 1000),
    "instrument.profile.active": _whole(1, 1000),
    "instrument.profile.top_k": _whole(1, 100_000),
}
#: Fields of ``workload.model`` / ``.recipe`` / ``.corpus`` are sizes, rates and counts: never negative.
_OVERRIDE_WHOLE = _whole(0, 2**31 - 1)
_OVERRIDE_NUMBER = Bounds(0, 1e12)
#: Largest case grid a config may ask for (the shipped ones have at most a few dozen cases).
MAX_CASES = 10_000


def _clip(text: str, limit: int = _SHOWN) -> str:
    """``text`` cut to ``limit`` characters (with how long it was), for quoting in a message."""
    return text if len(text) <= limit else f"{text[:limit - 3]}... ({len(text)} characters)"


def _show(value: object) -> str:
    """A value as a message quotes it: its repr, cut to a readable length."""
    return _clip(repr(value))


def _parent(dotted: str) -> str:
    """``a.b[2]`` -> ``a.b`` -> ``a`` -> ``""``."""
    if dotted.endswith("]") and "[" in dotted:
        return dotted[: dotted.rindex("[")]
    return dotted.rpartition(".")[0]


def _under(dotted: str, key: str) -> bool:
    """Whether ``dotted`` is ``key`` or lies inside it (``key.x``, ``key[0]``)."""
    return dotted == key or dotted.startswith((f"{key}.", f"{key}["))


@dataclass(frozen=True)
class _Where:
    """Where a dotted field was written: a line of the file, or a ``--set`` on the command line."""

    file: str
    lines: Mapping[str, int]
    cli: Mapping[str, str]

    def at(self, dotted: str) -> str:
        for key, shown in self.cli.items():
            if _under(dotted, key):
                return shown
        while dotted:
            if dotted in self.lines:
                return f"{self.file}:{self.lines[dotted]}"
            dotted = _parent(dotted)
        return self.file

    def problem(self, dotted: str, text: str) -> str:
        at = self.at(dotted)
        if self.cli.get(dotted) == at:  # "--set seed=-1: must be ..." says the field already
            return f"{at}: {text}"
        return f"{at}: {_clip(dotted) or 'the file'}: {text}"


# --- YAML with line numbers ---------------------------------------------------------------------


class _TooBig(yaml.YAMLError):
    """A limit of ``_BoundedLoader`` was crossed (found while composing, before any expansion)."""

    def __init__(self, mark: yaml.Mark, problem: str) -> None:
        super().__init__(problem)
        self.mark, self.problem = mark, problem


if yaml.__with_libyaml__:  # libyaml's parser for the events (a 1 MiB value: 20 ms, not 1.5 s), composed here

    class _Events(yaml.composer.Composer, yaml.cyaml.CParser, yaml.resolver.Resolver):  # type: ignore[misc]
        def __init__(self, stream: str) -> None:
            yaml.cyaml.CParser.__init__(self, stream)
            yaml.resolver.Resolver.__init__(self)
            yaml.composer.Composer.__init__(self)

else:
    _Events = yaml.SafeLoader  # type: ignore[misc,assignment]


class _BoundedLoader(_Events):
    """PyYAML's safe composer under ``MAX_DEPTH``, ``MAX_ALIASES`` and ``MAX_NODES`` (tags are checked
    later, by ``_Lined``; nothing is constructed here).

    Each node's expanded size (how many values it stands for once aliases are followed) is known the
    moment it is composed, so an alias bomb is refused by arithmetic, never by expanding it.
    """

    def __init__(self, stream: str) -> None:
        super().__init__(stream)
        self._depth = 0
        self._aliases = 0
        self._sizes: dict[int, int] = {}  # id(node) -> values it expands to

    def compose_node(self, parent: yaml.Node | None, index: object) -> yaml.Node:
        event = self.peek_event()
        if isinstance(event, yaml.AliasEvent):
            self._aliases += 1
            if self._aliases > MAX_ALIASES:
                raise _TooBig(event.start_mark, f"more than {MAX_ALIASES} aliases (*name); a config needs few "
                              "or none: write the values out")
            target = self.anchors.get(event.anchor)
            if target is not None and id(target) not in self._sizes:
                raise _TooBig(event.start_mark, f"alias *{_clip(str(event.anchor))} sits inside the value it "
                              "names (a value that contains itself); write the values out")
            return super().compose_node(parent, index)  # type: ignore[no-any-return]
        self._depth += 1
        try:
            if self._depth > MAX_DEPTH:
                raise _TooBig(event.start_mark, f"nested more than {MAX_DEPTH} levels deep; a config nests a "
                              "few levels (dimensions: {throughput: {rounds: 10}})")
            node = super().compose_node(parent, index)
        finally:
            self._depth -= 1
        if isinstance(node, yaml.MappingNode):
            children = [child for pair in node.value for child in pair]
        else:
            children = node.value if isinstance(node, yaml.SequenceNode) else []
        size = 1 + sum(self._sizes[id(child)] for child in children)
        if size > MAX_NODES:
            raise _TooBig(node.start_mark, f"this value expands to more than {MAX_NODES} values (aliases "
                          "repeating aliases, a 'billion laughs' file?); a config holds a few hundred")
        self._sizes[id(node)] = size
        return node  # type: ignore[no-any-return]


class _Lined:
    """A plain value tree plus ``dotted path -> line`` for every mapping key and list item.

    ``file`` starts every message; with ``with_lines=False`` (a ``--set`` value) no line is added.
    """

    def __init__(self, file: str, with_lines: bool = True) -> None:
        self.file = file
        self.with_lines = with_lines
        self.lines: dict[str, int] = {}
        self._scalars = yaml.constructor.SafeConstructor()  # one per file: it keeps every node it built

    def _at(self, node: yaml.Node, path: str) -> str:
        where = f"{self.file}:{node.start_mark.line + 1}" if self.with_lines else self.file
        return f"{where}: {_clip(path) or ('the file' if self.with_lines else 'the value')}"

    def build(self, node: yaml.Node, path: str, problems: list[str]) -> Any:
        if node.tag not in _SAFE_TAGS:
            problems.append(f"{self._at(node, path)}: YAML tag {_show(node.tag)} is not allowed; configs hold "
                            "plain values, lists and mappings only")
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                if not isinstance(key_node, yaml.ScalarNode):
                    problems.append(f"{self._at(key_node, path)}: a key must be a plain name, not a list or "
                                    "mapping")
                    continue
                key = key_node.value
                sub = f"{path}.{key}" if path else key
                if key in out:
                    problems.append(f"{self._at(key_node, sub)}: duplicate key (first at line {self.lines[sub]}); "
                                    "keep one")
                self.lines[sub] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, sub, problems)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[f"{path}[{i}]"] = item.start_mark.line + 1
                items.append(self.build(item, f"{path}[{i}]", problems))
            return items
        return self._scalar(node, path, problems)

    def _scalar(self, node: yaml.Node, path: str, problems: list[str]) -> Any:
        too_large = (f"{self._at(node, path)}: {_clip(node.value)} is too large; whole numbers in a config lie "
                     f"within +-{MAX_INT} (2**63 - 1)")
        try:
            value = self._scalars.construct_object(node, deep=True)
        except (ValueError, OverflowError, yaml.YAMLError) as exc:  # e.g. an int of 5000 digits
            big = node.tag.endswith(":int")
            problems.append(too_large if big else f"{self._at(node, path)}: {_show(node.value)} cannot be read "
                            f"({exc}); write a plain number, text or true/false")
            return None
        if isinstance(value, int) and not isinstance(value, bool) and abs(value) > MAX_INT:
            problems.append(too_large)
            return None
        return value


_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null")}


def read_config_text(path: str | Path) -> str:
    """The text of a config file: a regular file of at most ``MAX_FILE_BYTES``, in UTF-8.

    Anything else (missing, a folder, unreadable, too big, binary, another encoding) is a
    ``ConfigError`` naming the file, and the line and byte offset where the bytes stop being text.
    """
    path = Path(path)
    shown = _clip(str(path), 300)
    try:
        info = path.stat()
        if stat.S_ISDIR(info.st_mode):
            raise ConfigError([f"{shown}: is a folder, not a config file; name a .yaml file"])
        if not stat.S_ISREG(info.st_mode):
            raise ConfigError([f"{shown}: is not a regular file (a device, pipe or socket); name a .yaml file"])
        if info.st_size > MAX_FILE_BYTES:
            raise ConfigError([f"{shown}: {info.st_size} bytes is too large for a config (at most "
                               f"{MAX_FILE_BYTES}); is this the right file?"])
        with path.open("rb") as fh:
            data = fh.read(MAX_FILE_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"{shown}: cannot read the config ({exc.strerror or exc}); check the path"]) from exc
    except ValueError as exc:  # a NUL character in the path
        raise ConfigError([f"{shown}: not a usable path ({exc}); check the path"]) from exc
    if len(data) > MAX_FILE_BYTES:
        raise ConfigError([f"{shown}: more than {MAX_FILE_BYTES} bytes is too large for a config"])
    return decode_config(data, str(path))


def decode_config(data: bytes, file: str) -> str:
    """UTF-8 bytes -> text; a NUL byte or a byte that is not UTF-8 is reported with line and offset."""
    nul = data.find(b"\x00")
    if nul >= 0:
        line = data.count(b"\n", 0, nul) + 1
        raise ConfigError([f"{file}:{line}: a NUL byte at offset {nul}: this is a binary (or UTF-16) file, not "
                           "a UTF-8 YAML config"])
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = data.count(b"\n", 0, exc.start) + 1
        column = exc.start - data.rfind(b"\n", 0, exc.start)
        raise ConfigError([f"{file}:{line}: byte 0x{data[exc.start]:02x} at offset {exc.start} (column {column}) "
                           "is not UTF-8; save the file as UTF-8"]) from None
    return text.removeprefix("\ufeff")


def read_yaml(text: str, file: str, *, with_lines: bool = True) -> tuple[Any, dict[str, int]]:
    """Plain values (``None`` for an empty text) and ``dotted path -> line``, read safely and bounded.

    ``file`` starts every message; ``with_lines=False`` leaves line numbers out (a ``--set`` value).
    """
    def at(line: int) -> str:
        return f"{file}:{line}" if with_lines else file

    if len(text) > MAX_FILE_BYTES:
        raise ConfigError([f"{file}: {len(text)} characters is too large for a config (at most {MAX_FILE_BYTES})"])
    try:
        node = yaml.compose(text, Loader=_BoundedLoader)
    except _TooBig as exc:
        raise ConfigError([f"{at(exc.mark.line + 1)}: {exc.problem}"]) from exc
    except yaml.reader.ReaderError as exc:  # a control character
        found = yaml.reader.Reader.NON_PRINTABLE.search(text)
        offset = found.start() if found else exc.position
        line = text.count("\n", 0, offset) + 1
        code = ord(text[offset]) if offset < len(text) else 0
        raise ConfigError([f"{at(line)}: character U+{code:04X} at offset {offset} (column "
                           f"{offset - text.rfind(chr(10), 0, offset)}) is a control character YAML does not allow; "
                           "delete it (a config is plain text)"]) from exc
    except yaml.MarkedYAMLError as exc:
        line = exc.problem_mark.line + 1 if exc.problem_mark else 1
        context = f" ({exc.context})" if exc.context else ""
        hint = "" if isinstance(exc, yaml.composer.ComposerError) else "; check the indentation, quotes and brackets"
        raise ConfigError([f"{at(line)}: not valid YAML: {exc.problem}{context}{hint}"]) from exc
    except yaml.YAMLError as exc:
        raise ConfigError([f"{file}: not valid YAML: {exc}"]) from exc
    if node is None:
        return None, {}
    lined = _Lined(file, with_lines)
    problems: list[str] = []
    data = lined.build(node, "", problems)
    if problems:
        raise ConfigError(problems)
    return data, lined.lines


#: Words people write for a device, mapped to the name microscope uses (for "did you mean").
_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "host": "cpu"}


def _suggest(value: object, choices: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice (aliases first), or ``""``."""
    text = str(value)
    if len(text) > 100:  # nothing that long is a typo of a short name, and difflib would take a while
        return ""
    if _ALIASES.get(text.lower()) in choices:
        return f"; did you mean {_ALIASES[text.lower()]!r}?"
    close = difflib.get_close_matches(text, choices, n=1)
    return f"; did you mean {close[0]!r}?" if close else ""  # safe tags only: str, int, float, bool, null, dates


def _deep_merge(base: dict[str, Any], over: Mapping[str, Any], lines: dict[str, int], src: str, dst: str) -> None:
    """Merge ``over`` (written at dotted ``src``) into ``base`` (at ``dst``), carrying line numbers."""
    for key, value in over.items():
        s, d = f"{src}.{key}", (f"{dst}.{key}" if dst else key)
        if s in lines:
            lines[d] = lines[s]
        if isinstance(value, Mapping) and isinstance(base.get(key), dict) and key != "cases":
            _deep_merge(base[key], value, lines, s, d)
        elif isinstance(value, Mapping) and isinstance(base.get(key), dict):  # cases: axis-wise replace
            base[key] = {**base[key], **value}
            for axis in value:
                lines[f"{d}.{axis}"] = lines.get(f"{s}.{axis}", lines.get(s, 0))
        elif key == "cases" and isinstance(value, Mapping) and isinstance(base.get(key), list):
            # axes over a list of grids (a bench profile's shapes): replaced in each grid, not the list
            base[key] = [{**grid, **value} if isinstance(grid, dict) else grid for grid in base[key]]
            for i, axis in itertools.product(range(len(base[key])), value):
                lines[f"{d}[{i}].{axis}"] = lines.get(f"{s}.{axis}", lines.get(s, 0))
        else:
            base[key] = value


# --- validation against the dataclass schema ----------------------------------------------------


def _type_name(tp: Any) -> str:
    origin = typing.get_origin(tp)
    if origin is Literal:
        return " | ".join(repr(a) for a in typing.get_args(tp))
    if origin in (tuple, list):
        return f"a list of {_type_name(typing.get_args(tp)[0])}"
    return getattr(tp, "__name__", str(tp))


def _check_value(
    value: Any, tp: Any, dotted: str, where: _Where, problems: list[str], bounds: Bounds | None = None
) -> Any:
    """``value`` checked against the type ``tp``; a problem is appended and a stand-in returned if wrong."""

    def wrong(text: str) -> None:
        problems.append(where.problem(dotted, text))

    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _check_value(value, args[0], dotted, where, problems, bounds) if value is not None else None
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = _suggest(value, [str(c) for c in choices])
            wrong(f"{_show(value)} is not one of {', '.join(map(repr, choices))}{hint}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            wrong(f"expected {_type_name(tp)}, got {type(value).__name__} {_show(value)}")
            return ()
        inner = typing.get_args(tp)[0]
        return tuple(_check_value(v, inner, f"{dotted}[{i}]", where, problems) for i, v in enumerate(value))
    if origin is Mapping or origin is dict:
        if not isinstance(value, Mapping):
            wrong(f"expected a mapping of names to values, got {type(value).__name__} {_show(value)}")
            return {}
        for key, item in value.items():
            if isinstance(item, (dict, list)):
                problems.append(where.problem(f"{dotted}.{key}", "expected a plain number, text or true/false"))
        return dict(value)
    if origin is Callable:
        wrong("is Python code (a callable) and cannot be set from a config; set it in the plugin")
        return None
    if dataclasses.is_dataclass(tp):
        return value  # handled by _build
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as text; take it as the number meant
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            wrong(f"expected a number, got {type(value).__name__} {_show(value)}")
            return 0.0
        try:
            return float(value)
        except OverflowError:
            wrong(f"{_show(value)} is too large for a number")
            return 0.0
    if tp is int:
        if isinstance(value, float) and not math.isfinite(value):
            wrong(f"must be {bounds or 'a whole number'}, got {value}")
            return 0
        if isinstance(value, bool) or not isinstance(value, int):
            hint = " (write it without quotes or decimals)" if isinstance(value, (str, float)) else ""
            wrong(f"expected a whole number, got {type(value).__name__} {_show(value)}{hint}")
            return 0
        return value
    if tp is bool:
        if not isinstance(value, bool):
            wrong(f"expected true or false, got {_show(value)}")
            return False
        return value
    if tp is str:
        if not isinstance(value, str):
            wrong(f"expected text, got {type(value).__name__} {_show(value)}")
            return ""
        return value
    return value


_NON_NEGATIVE = {"warmup", "seed", "check_rounds"}
_POSITIVE = {"rounds", "reps", "repeats", "input_sets", "max_seeds", "timeout_s", "alpha", "min_band", "seeds", "steps",
             "batch_size", "eval_tokens", "eval_batch_size", "decode_tokens"}


#: Fields every RunConfig carries about where it came from; never written in a config.
_PROVENANCE = ("path", "lines", "overridden")


def _optional(tp: Any) -> bool:
    return type(None) in typing.get_args(tp)


def _null_problem(f: dataclasses.Field) -> str:  # type: ignore[type-arg]
    """What to say about ``key: null`` (or ``key:`` with nothing after it) where a value is required."""
    if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING:
        return "has no value (null); it is required: give it one"
    if isinstance(f.default, (bool, int, float, str)):
        return f"has no value (null); give it one, or delete the line for the default ({f.default!r})"
    return "has no value (null); give it one, or delete the line for the defaults"


def _known_hint(key: str, known: list[str], what: str = "known keys here") -> str:
    close = difflib.get_close_matches(key, known, n=1, cutoff=0.6) if len(key) <= 100 else []
    return f"did you mean {close[0]!r}?" if close else f"{what}: {', '.join(known)}"


def _check_number(value: Any, key: str, dotted: str, where: _Where, problems: list[str]) -> None:
    """A number against its ``BOUNDS`` (else: finite, and the old > 0 / >= 0 rules by field name)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return
    bounds = BOUNDS.get(dotted)
    if bounds is not None:
        if not bounds.holds(value):
            problems.append(where.problem(dotted, f"must be {bounds}, got {_show(value)}"))
    elif not math.isfinite(value):
        problems.append(where.problem(dotted, f"must be a finite number, got {value}"))
    elif key in _POSITIVE and value <= 0:
        problems.append(where.problem(dotted, f"must be > 0, got {value!r}"))
    elif key in _NON_NEGATIVE and value < 0:
        problems.append(where.problem(dotted, f"must be >= 0, got {value!r}"))


def _check_name(cls: type, key: str, value: Any, dotted: str, where: _Where, problems: list[str]) -> None:
    """Names that can be checked without the plugin: the plugin's name, plugin sources, workload profiles."""
    if cls is RunConfig and key == "plugin" and not value.isidentifier():
        problems.append(where.problem(dotted, f"{_show(value)} is not a plugin name; names are Python identifiers "
                                              "(letters, digits, underscores), e.g. 'plugin: flash_attn'"))
    if cls is RunConfig and key == "plugins":
        for i, source in enumerate(value):
            if not source.strip():
                problems.append(where.problem(f"{dotted}[{i}]", "is empty; give a .py file (relative to this "
                                                                 "config) or a module name"))
    if cls is WorkloadConfig and key == "profile":
        from microscope.workloads.profiles import PROFILES

        if value not in PROFILES:
            problems.append(where.problem(dotted, f"{_show(value)} is not a workload profile; use one of "
                                                  f"{', '.join(PROFILES)}{_suggest(value, list(PROFILES))}"))


def _build(
    cls: type,
    data: Any,
    prefix: str,
    file: str,
    lines: Mapping[str, int],
    problems: list[str],
    cli: Mapping[str, str] | None = None,
) -> Any:
    """``cls`` built from ``data`` (found at dotted ``prefix``), or None once every problem is appended.

    ``cli`` maps dotted keys given with ``--set`` to how messages cite them.
    """
    where = _Where(file, lines, cli or {})
    if not isinstance(data, Mapping):
        problems.append(where.problem(prefix, f"expected a mapping of keys, got {type(data).__name__} {_show(data)}"))
        return None
    hints = typing.get_type_hints(cls)
    fields = {f.name: f for f in dataclasses.fields(cls) if f.name not in _PROVENANCE}
    known = list(fields)
    first = len(problems)
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in fields:
            problems.append(where.problem(dotted, f"unknown key; {_known_hint(key, known)}"))
            continue
        tp = hints[key]
        if value is None and not _optional(tp):
            problems.append(where.problem(dotted, _null_problem(fields[key])))
            continue
        before = len(problems)
        if dataclasses.is_dataclass(tp):
            checked = _build(tp, value, dotted, file, lines, problems, cli)
        elif key == "cases":
            checked = _check_cases(value, dotted, where, problems)
        elif key == "sweep" and cls is RunConfig:
            checked = _check_sweep(value, dotted, where, problems)
        elif cls is StatsConfig and key == "contrasts":
            checked = _check_contrasts(value, dotted, where, problems)
        elif cls is WorkloadConfig and key in ("model", "recipe", "corpus"):
            checked = _check_overrides(value, _workload_schemas()[key], dotted, where, problems)
        else:
            checked = _check_value(value, tp, dotted, where, problems, BOUNDS.get(dotted))
            if len(problems) == before:
                _check_number(checked, key, dotted, where, problems)
                _check_name(cls, key, checked, dotted, where, problems)
        if len(problems) == before:
            kwargs[key] = checked
    for name, f in fields.items():
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and name not in data:
            problems.append(f"{file}: {prefix + '.' if prefix else ''}{name}: required key is missing; "
                            f"add '{name}: ...'")
    if cls is WorkloadConfig and len(problems) == first:
        _check_workload(kwargs, prefix, where, problems)
    if len(problems) > first:
        return None
    try:
        return cls(**kwargs)
    except (ValueError, TypeError) as exc:  # a section's own cross-field checks (__post_init__)
        problems.append(where.problem(prefix, str(exc)))
        return None


def _schema_hints(schema: type) -> dict[str, Any]:
    try:
        return typing.get_type_hints(schema)
    except Exception:  # noqa: BLE001 - an annotation that does not resolve: check keys only
        return {}


def _check_overrides(value: Any, schema: type, dotted: str, where: _Where, problems: list[str]) -> dict[str, Any]:
    """``workload.model`` etc.: keys must be fields of the dataclass they override, values of its types."""
    if not isinstance(value, Mapping):
        problems.append(where.problem(dotted, f"expected a mapping of {schema.__name__} fields, got "
                                              f"{type(value).__name__} {_show(value)}"))
        return {}
    hints = _schema_hints(schema)
    known = [f.name for f in dataclasses.fields(schema)]
    out: dict[str, Any] = {}
    for key, item in value.items():
        sub = f"{dotted}.{key}"
        if key not in known:
            problems.append(where.problem(sub, f"unknown {schema.__name__} field; "
                                               f"{_known_hint(key, known, f'{schema.__name__} has')}"))
            continue
        tp = hints.get(key, Any)
        if item is None:
            if not _optional(tp):
                problems.append(where.problem(sub, "has no value (null); give it one, or delete the line"))
            out[key] = None
            continue
        before = len(problems)
        checked = _check_value(item, tp, sub, where, problems)
        numbers = [(sub, checked)] if not isinstance(checked, tuple) else [
            (f"{sub}[{i}]", v) for i, v in enumerate(checked)]
        for path, number in numbers:
            if isinstance(number, bool) or not isinstance(number, (int, float)):
                continue
            bounds = _OVERRIDE_WHOLE if isinstance(number, int) else _OVERRIDE_NUMBER
            if not bounds.holds(number):
                problems.append(where.problem(path, f"must be {bounds}, got {_show(number)}"))
        if len(problems) == before:
            out[key] = tuple(checked) if isinstance(checked, list) else checked
    return out


def _check_workload(kwargs: dict[str, Any], prefix: str, where: _Where, problems: list[str]) -> None:
    """The profile with this section's overrides must make a valid model, recipe and corpus (their own
    checks: d_model divisible by n_heads, a known precision, ...), before any arm is built."""
    from microscope.workloads.profiles import get_profile

    profile = get_profile(kwargs.get("profile", WorkloadConfig.profile))
    sizes = {key: kwargs[key] for key in ("steps", "batch_size") if kwargs.get(key) is not None}
    for key, base, extra in (("model", profile.model, {}), ("recipe", profile.recipe, sizes),
                             ("corpus", profile.corpus, {})):
        try:
            dataclasses.replace(base, **{**extra, **kwargs.get(key, {})})
        except (ValueError, TypeError, ArithmeticError) as exc:
            dotted = f"{prefix}.{key}" if key in kwargs else prefix
            problems.append(where.problem(dotted, f"with profile {profile.name!r}: {exc}"))


def _check_cases(value: Any, dotted: str, where: _Where, problems: list[str]) -> Any:
    """``cases:`` is a grid, axis -> plain values (numbers, text or true/false, each once: a case is
    hashable), or a list of such grids whose cases are taken together (e.g. benchmark anchor shapes)."""
    if isinstance(value, list):
        if not value:
            problems.append(where.problem(dotted, "empty list; give at least one grid such as '- {seq: [128]}'"))
        return tuple(_check_grid(item, f"{dotted}[{i}]", where, problems) for i, item in enumerate(value))
    return _check_grid(value, dotted, where, problems)


def _check_contrasts(value: Any, dotted: str, where: _Where, problems: list[str]) -> tuple[tuple[str, str], ...]:
    """``stats.contrasts``: "a vs b" strings (one, or a list) as (a, b) pairs; the names are checked against
    the plugin later (``check_against_plugin``)."""
    example = "e.g. 'contrasts: [window_last_full vs window]'"
    items = [value] if isinstance(value, str) else value
    if not isinstance(items, list):
        problems.append(where.problem(dotted, f"expected a list of 'a vs b' strings, {example}"))
        return ()
    out: list[tuple[str, str]] = []
    for i, item in enumerate(items):
        at = f"{dotted}[{i}]" if isinstance(value, list) else dotted
        parts = [p.strip() for p in item.split(" vs ")] if isinstance(item, str) else []
        if len(parts) != 2 or not all(parts):
            problems.append(where.problem(at, f"{_show(item)} is not 'a vs b' (two variant names), {example}"))
        elif parts[0] == parts[1]:
            problems.append(where.problem(at, f"compares {_show(parts[0])} with itself; name two different variants"))
        elif (parts[0], parts[1]) in out:
            problems.append(where.problem(at, f"{_show(item)} is listed twice"))
        else:
            out.append((parts[0], parts[1]))
    return tuple(out)


def _check_sweep(value: Any, dotted: str, where: _Where, problems: list[str]) -> dict[str, dict[str, tuple]]:
    """``sweep:`` is variant -> parameter -> values, each values list checked like a case axis."""
    if not isinstance(value, Mapping) or any(not isinstance(v, Mapping) for v in value.values()):
        problems.append(where.problem(dotted, "expected variant -> parameter -> values, e.g. "
                                              "'sweep: {triton: {warps: [4, 8]}}'"))
        return {}
    return {str(variant): _check_grid(params, f"{dotted}.{variant}", where, problems)
            for variant, params in value.items()}


def _check_grid(value: Any, dotted: str, where: _Where, problems: list[str]) -> dict[str, tuple[Any, ...]]:
    if not isinstance(value, Mapping):
        problems.append(where.problem(dotted, "expected a mapping axis -> list of values, e.g. 'seq: [128, 256]' "
                                              "(or a list of such mappings)"))
        return {}
    out = {}
    for axis, values in value.items():
        sub = f"{dotted}.{axis}"
        if values is None:
            problems.append(where.problem(sub, f"has no values; give a list such as '{_clip(axis)}: [128, 256]', "
                                               "or delete the axis"))
            continue
        if not isinstance(values, list):
            values = [values]
        if not values:
            problems.append(where.problem(sub, "empty list; give at least one value"))
        seen: set[tuple[type, Any]] = set()  # by type too: 1 and true are different case values
        for i, item in enumerate(values):
            at = f"{sub}[{i}]"
            if isinstance(item, (dict, list)):
                kind = "a mapping" if isinstance(item, dict) else "a list"
                problems.append(where.problem(at, f"{kind} {_show(item)} is not a case value; each value is a "
                                                  "number, text or true/false, e.g. 'seq: [128, 256]'"))
            elif isinstance(item, float) and not math.isfinite(item):
                problems.append(where.problem(at, f"{item} is not a finite number"))
            elif (type(item), item) in seen:
                problems.append(where.problem(at, f"{_show(item)} is listed twice; keep one"))
            else:
                seen.add((type(item), item))
        out[axis] = tuple(values)
    return out


def parse_assignment(text: str) -> tuple[str, Any]:
    """``--set workload.steps=60`` -> ``("workload.steps", 60)``; the value is read as YAML (safe, bounded)."""
    key, sep, raw = text.partition("=")
    key = key.strip()
    label = f"--set {_clip(text)}"
    if not sep or not key:
        raise ConfigError([f"{label}: expected KEY=VALUE, e.g. --set workload.steps=60"])
    parts = key.split(".")
    if any(not part for part in parts):
        raise ConfigError([f"{label}: {_show(key)} has an empty part; write dotted field names such as "
                           "dimensions.throughput.rounds"])
    if parts[0] in OVERLAY_KEYS:
        raise ConfigError([f"{label}: {parts[0]} is an overlay of the file; set the field itself (--set applies "
                           "after the profile and quick overlays)"])
    value, _ = read_yaml(raw, label, with_lines=False)
    return key, value


def _render(value: Any) -> str:
    """A ``--set`` value written back the way a user would type it."""
    if isinstance(value, str):
        return _clip(value)
    try:
        text = yaml.safe_dump(value, default_flow_style=True, width=2**16).strip()
    except yaml.YAMLError:
        text = repr(value)
    return _clip(text.removesuffix("...").strip())


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    if parents == ["cases"] and isinstance(data.get("cases"), list):  # an axis of every grid of the list
        for grid_ in data["cases"]:
            if isinstance(grid_, dict):
                grid_[last] = copy.deepcopy(value)
        return
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


def _apply_overrides(data: dict[str, Any], lines: dict[str, int], overrides: Mapping[str, Any]) -> None:
    """Command-line values over the file's; their old lines go (messages cite ``--set`` instead)."""
    for dotted, value in overrides.items():
        _set_dotted(data, dotted, copy.deepcopy(value))
        for key in [k for k in lines if _under(k, dotted)]:
            del lines[key]


# --- public entry points --------------------------------------------------------------------------


def load(
    path: str | Path,
    *,
    device: str | None = None,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Read, overlay (device profile, named profile, then ``quick``) and validate a config file.

    ``device`` picks the ``profiles:`` entry (``cpu`` or ``cuda``); ``None`` leaves profiles unapplied.
    ``overrides`` are dotted keys from the command line (``seed``, ``workload.steps``), applied last;
    the key ``profile`` (``--profile bench`` or ``bench,launch``) names further ``profiles:`` entries to merge.
    """
    return loads(read_config_text(path), str(path), device=device, quick=quick, overrides=overrides)


def loads(
    text: str,
    file: str = "<inline>",
    *,
    device: str | None = None,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Like ``load`` for config text already in memory (``file`` is used in messages)."""
    data, lines = read_yaml(text, file)
    if data is None:
        raise ConfigError([f"{file}: the config is empty; it needs at least 'plugin: <name>'"])
    if not isinstance(data, dict):
        raise ConfigError([f"{file}:1: the config must be a mapping of keys (e.g. 'plugin: flash_attn')"])
    overrides = dict(overrides or {})
    named = overrides.pop(PROFILE_KEY, None)
    cli = {key: f"--set {key}={_render(value)}" for key, value in overrides.items()}
    where = _Where(file, lines, cli)
    problems: list[str] = []
    profiles = data.pop("profiles", None)
    quick_overlay = data.pop("quick", None)
    if profiles is None:
        profiles = {}
    if not isinstance(profiles, dict) or any(not isinstance(v, dict) for v in profiles.values()):
        problems.append(where.problem("profiles", "expected 'profiles: {cpu: {...}, cuda: {...}}'"))
        profiles = {}
    for name in profiles:
        if not isinstance(name, str) or not name.isidentifier():
            problems.append(where.problem(f"profiles.{name}", "a profile is cpu, cuda, or a name of letters, digits "
                                                              "and underscores (e.g. bench)"))
            continue
        device_typo = _suggest(name, list(DEVICE_PROFILES)) if name not in DEVICE_PROFILES else ""
        if device_typo:  # 'gpu:' or 'cdua:' would never apply on a GPU: say so instead of taking it as a name
            problems.append(where.problem(f"profiles.{name}", f"unknown device{device_typo} (device profiles are "
                                                              "cpu and cuda; other names are chosen with --profile)"))
            continue
        # validate every profile, not only the one this run uses: a typo in the cuda profile must show on
        # a CPU laptop too; a named profile is checked over each device profile it may follow
        bases = [None] if name in DEVICE_PROFILES else [None, *(d for d in DEVICE_PROFILES if d in profiles)]
        for base in bases:
            probe = copy.deepcopy(data)
            probe_lines = dict(lines)
            if base is not None:
                _deep_merge(probe, profiles[base], probe_lines, f"profiles.{base}", "")
            _deep_merge(probe, profiles[name], probe_lines, f"profiles.{name}", "")
            _apply_overrides(probe, probe_lines, overrides)
            _build(RunConfig, probe, "", file, probe_lines, problems, cli)
    chosen = [n.strip() for n in str(named).split(",")] if named is not None else []
    choices = [n for n in profiles if isinstance(n, str) and n not in DEVICE_PROFILES]
    for name in chosen:
        if name in DEVICE_PROFILES:
            problems.append(f"--profile {_show(name)}: the {name} profile follows the device (--device {name})")
        elif name not in choices:
            problems.append(f"--profile {_show(name)}: {file} has no such profile"
                            + (f"{_suggest(name, choices)} (its profiles: {', '.join(choices)})" if choices
                               else "; add one under 'profiles:' (e.g. 'bench: {cases: ...}')"))
    if quick_overlay is None:
        quick_overlay = {}
    if not isinstance(quick_overlay, dict):
        problems.append(where.problem("quick", "expected a mapping of keys to override"))
        quick_overlay = {}
    if device in profiles:
        _deep_merge(data, profiles[device], lines, f"profiles.{device}", "")
    for name in chosen:  # in the order given: --profile bench,launch
        if name in choices:
            _deep_merge(data, profiles[name], lines, f"profiles.{name}", "")
    if quick:
        _deep_merge(data, quick_overlay, lines, "quick", "")
    _apply_overrides(data, lines, overrides)
    config = _build(RunConfig, data, "", file, lines, problems, cli)
    if problems or config is None:
        raise ConfigError(list(dict.fromkeys(problems)))
    return dataclasses.replace(config, path=file, lines=dict(lines), overridden=cli)


MAX_SWEPT_VARIANTS = 64


def _check_sweep_against(config: RunConfig, plugin: Ablation, problems: list[str]) -> None:
    """Each swept variant exists, is not the baseline, and declares each parameter; values match the
    type of the declared default."""
    total = 0
    for name, params in config.sweep.items():
        at = f"sweep.{name}"
        variant = plugin.variants.get(name)
        if variant is None:
            close = difflib.get_close_matches(name, list(plugin.variants), n=1) if len(name) <= 100 else []
            hint = f"did you mean {close[0]!r}?" if close else f"the plugin has {', '.join(plugin.variants)}"
            problems.append(config.problem(at, f"no variant {_show(name)}; {hint}"))
            continue
        if variant.role is Role.BASELINE:
            problems.append(config.problem(at, "the baseline is not swept: every variant is compared with it"))
            continue
        if variant.opt_in and name not in config.variants:
            problems.append(config.problem(at, _opt_in_left_out(name, "add it there")))
            continue
        declared = dict(variant.params)
        for param, values in params.items():
            if param not in declared:
                hint = (f"it declares {', '.join(declared)}" if declared else
                        "it declares none (Variant.params lists what a config may sweep)")
                problems.append(config.problem(f"{at}.{param}", f"variant {name!r} has no parameter "
                                                                f"{_show(param)}; {hint}"))
                continue
            kind = type(declared[param])
            for value in values:
                if type(value) is not kind and not (kind is float and type(value) is int):
                    problems.append(config.problem(f"{at}.{param}", f"{_show(value)} is a {type(value).__name__}, "
                                                                    f"expected {kind.__name__}"))
        total += math.prod(len(v) for v in params.values())
    if total > MAX_SWEPT_VARIANTS:
        problems.append(config.problem("sweep", f"asks for {total} swept variants; at most {MAX_SWEPT_VARIANTS}"))


def _check_contrasts_against(config: RunConfig, plugin: Ablation, level: str, problems: list[str]) -> None:
    """Both sides of each contrast are variants (arms) this run includes, and neither is the baseline, which
    every variant is compared with already."""
    kinds = plugin.arms if level == "model" else dict(plugin.iter_variants())
    baseline = next((n for n, v in kinds.items() if v.role is Role.BASELINE), None)
    chosen = set(config.variants)
    for i, pair in enumerate(config.stats.contrasts):
        at = f"stats.contrasts[{i}]" if len(config.stats.contrasts) > 1 else "stats.contrasts"
        for name in pair:
            own = name.split("[", 1)[0] if name.endswith("]") and name.split("[", 1)[0] in config.sweep else name
            if own not in kinds:
                close = difflib.get_close_matches(name, list(kinds), n=1) if len(name) <= 100 else []
                hint = f"did you mean {close[0]!r}?" if close else f"the plugin has {', '.join(kinds)}"
                problems.append(config.problem(at, f"no {'arm' if level == 'model' else 'variant'} {_show(name)}; "
                                                   f"{hint}"))
            elif own == baseline:
                problems.append(config.problem(at, f"{_show(name)} is the baseline, which every variant is "
                                                   "compared with already; contrast two other variants"))
            elif chosen and own not in chosen:
                problems.append(config.problem(at, f"{_show(name)} is not in this run's variants; add it to "
                                                   "'variants:' or drop the contrast"))
            elif getattr(kinds[own], "opt_in", False) and own not in chosen:
                problems.append(config.problem(at, _opt_in_left_out(name, "add it there or drop the contrast")))


def _opt_in_left_out(name: str, fix: str) -> str:
    return f"{_show(name)} runs only where 'variants:' names it (an opt-in variant); {fix}"


def effective_level(config: RunConfig, plugin: Ablation) -> str:
    """``operator`` or ``model``: the config's ``level``, or for ``auto`` operator when the plugin has it."""
    if config.level != "auto":
        return config.level
    return "operator" if plugin.variants else "model"


def _model_case_problem(axis: str) -> str:
    """Why a model-level config cannot have ``cases.<axis>``, and what to write instead."""
    if axis in ("profile", "task"):
        return (f"a model-level run has one case, (workload.profile, workload.task), and no case grid; write "
                f"'workload: {{{axis}: ...}}' and delete cases.{axis}")
    return (f"a model-level run has no case axis {_show(axis)}: its one case is (workload.profile, "
            "workload.task); delete it")


def _unique(values: list[Any]) -> list[Any]:
    out: list[Any] = []
    for value in values:
        if value not in out:
            out.append(value)
    return out


def check_against_plugin(config: RunConfig, plugin: Ablation) -> None:
    """Problems that need the plugin: level, unknown variants or arms, unknown case axes, wrong kinds."""
    problems: list[str] = []
    level = effective_level(config, plugin)
    if level not in plugin.levels:
        problems.append(config.problem("level", f"plugin {plugin.name!r} has no {level} level; it supports "
                                                f"{', '.join(plugin.levels)}"))
        raise ConfigError(problems)
    _check_contrasts_against(config, plugin, level, problems)
    if level == "model":
        names = list(plugin.arms)
        for i, name in enumerate(config.variants):
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1) if len(name) <= 100 else []
                hint = f"did you mean {close[0]!r}?" if close else f"the plugin's arms are {', '.join(names)}"
                problems.append(config.problem(f"variants[{i}]", f"no arm {_show(name)}; {hint}"))
        for at, grid_ in case_grids(config):
            for axis in grid_:
                problems.append(config.problem(f"{at}.{axis}", _model_case_problem(axis)))
        for name in config.sweep:
            problems.append(config.problem(f"sweep.{name}", "model-level runs compare arms; a sweep is for "
                                                            "operator variants (write one arm per setting)"))
        if problems:
            raise ConfigError(problems)
        return
    names = list(plugin.variants)
    for i, name in enumerate(config.variants):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1) if len(name) <= 100 else []
            hint = f"did you mean {close[0]!r}?" if close else f"the plugin has {', '.join(names)}"
            problems.append(config.problem(f"variants[{i}]", f"no variant {_show(name)}; {hint}"))
    _check_sweep_against(config, plugin, problems)
    axes: dict[str, list[Any]] = {}
    for case in plugin.cases:
        for axis, value in case.items:
            axes.setdefault(axis, []).append(value)
    plain = {axis: len(_unique(values)) for axis, values in axes.items()}
    total = 0 if case_grids(config) else math.prod(plain.values())
    for at, grid_ in case_grids(config):
        sizes = dict(plain)
        for axis, values in grid_.items():
            dotted = f"{at}.{axis}"
            if axis not in axes:
                close = difflib.get_close_matches(axis, list(axes), n=1) if len(axis) <= 100 else []
                hint = f"did you mean {close[0]!r}?" if close else f"the plugin's axes are {', '.join(axes)}"
                problems.append(config.problem(dotted, f"plugin {plugin.name!r} has no case axis {_show(axis)}; "
                                                       f"{hint}"))
                continue
            sizes[axis] = len(values)
            kinds = {type(v) for v in axes[axis]}
            for value in values:
                if axis == "dtype" and value not in DTYPES:
                    close = difflib.get_close_matches(str(value), list(DTYPES), n=1)
                    hint = f"; did you mean {close[0]!r}?" if close else ""
                    problems.append(config.problem(dotted, f"{_show(value)} is not a dtype ({', '.join(DTYPES)})"
                                                           f"{hint}"))
                elif type(value) not in kinds and not (float in kinds and type(value) is int):
                    want = " or ".join(sorted(k.__name__ for k in kinds))
                    problems.append(config.problem(dotted, f"{_show(value)} is a {type(value).__name__}, "
                                                           f"expected {want}"))
        total += math.prod(sizes.values())
    if total > MAX_CASES:
        problems.append(config.problem("cases", f"asks for {total} cases (the product of the axes' lengths); at "
                                                f"most {MAX_CASES} are allowed: list fewer values per axis"))
    if problems:
        raise ConfigError(problems)
