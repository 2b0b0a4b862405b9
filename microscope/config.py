"""YAML run configs -> validated, frozen dataclasses; every error names file, line and field.

Configs are read with PyYAML's safe loader (no arbitrary objects) at the node level, so each key keeps
the line it was written on. Validation runs completely before any kernel does, and reports every
problem at once with a suggestion ("did you mean 'rounds'?"), because a typo found after ten minutes
of GPU time is a wasted ten minutes.

Overlays: ``profiles: {cpu: {...}, cuda: {...}}`` are merged over the top level for the device the run
uses, then ``quick: {...}`` for ``--quick`` runs. Keys inside an overlay keep their own line numbers.
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import types
import typing
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import yaml

from microscope.api import DTYPES, Ablation
from microscope.instrument.config import InstrumentConfig


class ConfigError(Exception):
    """One or more problems in a config file; the message lists each as ``file:line: field: problem``."""

    def __init__(self, problems: list[str]) -> None:
        self.problems = problems
        super().__init__("\n".join(problems))


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


@dataclass(frozen=True)
class WorkloadConfig:
    """Model level: the embedded workload every arm is trained and evaluated on.

    ``profile`` names a size in ``microscope.workloads.profiles`` (``tiny`` for CPUs, ``gpu``);
    ``model``, ``recipe`` and ``corpus`` override single fields of its ``ModelConfig``,
    ``TrainRecipe`` and ``CorpusSpec`` for every arm (an arm's own overrides come last).
    """

    profile: str = "tiny"
    seeds: int = 3  # independent seeds (init, data order, dropout); every arm sees the same ones
    task: Literal["lm", "recall"] = "lm"  # next-token LM on the corpus, or associative recall
    steps: int | None = None  # training steps (default: the profile's)
    batch_size: int | None = None
    eval_tokens: int | None = None  # predicted tokens per evaluation split (default: the profile's)
    eval_batch_size: int | None = None  # rows per evaluation batch and of the inference prompt (default: profile's)
    decode_tokens: int = 16  # greedy decode steps timed through the KV cache
    margin: float = 0.0  # non-inferiority margin of the validation loss, in nats
    model: Mapping[str, Any] = field(default_factory=dict)
    recipe: Mapping[str, Any] = field(default_factory=dict)
    corpus: Mapping[str, Any] = field(default_factory=dict)


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
    timeout_s: float = 600.0  # per trial group (one case of one plugin) when run in a subprocess
    variants: tuple[str, ...] = ()  # subset to run; empty = all (the baseline always runs)
    cases: Mapping[str, tuple[Any, ...]] = field(default_factory=dict)  # axis -> values
    dimensions: DimensionsConfig = field(default_factory=DimensionsConfig)
    stats: StatsConfig = field(default_factory=StatsConfig)
    workload: WorkloadConfig = field(default_factory=WorkloadConfig)
    instrument: InstrumentConfig = field(default_factory=InstrumentConfig)  # hooks, traces, TensorBoard
    # provenance: where the config came from and which line each dotted field was written on
    path: str = "<inline>"
    lines: Mapping[str, int] = field(default_factory=dict, compare=False, repr=False)

    def where(self, dotted: str) -> str:
        """``file:line`` of a dotted field (falls back to the nearest written parent, then the file)."""
        parts = dotted.split(".")
        while parts:
            key = ".".join(parts)
            if key in self.lines:
                return f"{self.path}:{self.lines[key]}"
            parts.pop()
        return self.path


OVERLAY_KEYS = ("profiles", "quick")


# --- YAML with line numbers ---------------------------------------------------------------------


class _Lined:
    """A plain value tree plus ``dotted path -> line`` for every mapping key and list item."""

    def __init__(self) -> None:
        self.lines: dict[str, int] = {}

    def build(self, node: yaml.Node, path: str, problems: list[str], file: str) -> Any:
        if node.tag not in _SAFE_TAGS:
            problems.append(
                f"{file}:{node.start_mark.line + 1}: {path or 'the file'}: YAML tag {node.tag!r} is not allowed; "
                "configs hold plain values, lists and mappings only"
            )
            return None
        if isinstance(node, yaml.MappingNode):
            out: dict[str, Any] = {}
            for key_node, value_node in node.value:
                key = key_node.value
                if not isinstance(key_node, yaml.ScalarNode):
                    problems.append(f"{file}:{key_node.start_mark.line + 1}: keys must be plain names")
                    continue
                sub = f"{path}.{key}" if path else key
                if key in out:
                    problems.append(
                        f"{file}:{key_node.start_mark.line + 1}: {sub}: duplicate key "
                        f"(first at line {self.lines[sub]}); keep one"
                    )
                self.lines[sub] = key_node.start_mark.line + 1
                out[key] = self.build(value_node, sub, problems, file)
            return out
        if isinstance(node, yaml.SequenceNode):
            items = []
            for i, item in enumerate(node.value):
                self.lines[f"{path}[{i}]"] = item.start_mark.line + 1
                items.append(self.build(item, f"{path}[{i}]", problems, file))
            return items
        return _SCALARS.construct_object(node, deep=True)


_SCALARS = yaml.constructor.SafeConstructor()
_SAFE_TAGS = {f"tag:yaml.org,2002:{t}" for t in ("map", "seq", "str", "int", "float", "bool", "null")}
#: Words people write for a device, mapped to the name microscope uses (for "did you mean").
_ALIASES = {"gpu": "cuda", "nvidia": "cuda", "host": "cpu"}


def _suggest(value: object, choices: list[str]) -> str:
    """``"; did you mean 'x'?"`` for the closest choice (aliases first), or ``""``."""
    text = str(value)
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


def _check_value(value: Any, tp: Any, dotted: str, at: str, problems: list[str]) -> Any:
    origin = typing.get_origin(tp)
    if origin is typing.Union or origin is types.UnionType:
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        return _check_value(value, args[0], dotted, at, problems) if value is not None else None
    if origin is Literal:
        choices = typing.get_args(tp)
        if value not in choices:
            hint = _suggest(value, [str(c) for c in choices])
            problems.append(f"{at}: {dotted}: {value!r} is not one of {', '.join(map(repr, choices))}{hint}")
        return value
    if origin is tuple:
        if isinstance(value, str):
            value = [value]
        if not isinstance(value, list):
            problems.append(f"{at}: {dotted}: expected {_type_name(tp)}, got {type(value).__name__} {value!r}")
            return ()
        inner = typing.get_args(tp)[0]
        return tuple(_check_value(v, inner, f"{dotted}[{i}]", at, problems) for i, v in enumerate(value))
    if dataclasses.is_dataclass(tp):
        return value  # handled by _build
    if tp is float:
        if isinstance(value, str):  # PyYAML reads 1e-3 (no dot) as text; take it as the number meant
            try:
                return float(value)
            except ValueError:
                pass
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            problems.append(f"{at}: {dotted}: expected a number, got {type(value).__name__} {value!r}")
            return 0.0
        return float(value)
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            hint = " (write it without quotes or decimals)" if isinstance(value, (str, float)) else ""
            problems.append(f"{at}: {dotted}: expected a whole number, got {type(value).__name__} {value!r}{hint}")
            return 0
        return value
    if tp is bool:
        if not isinstance(value, bool):
            problems.append(f"{at}: {dotted}: expected true or false, got {value!r}")
            return False
        return value
    if tp is str:
        if not isinstance(value, str):
            problems.append(f"{at}: {dotted}: expected text, got {type(value).__name__} {value!r}")
            return ""
        return value
    return value


_NON_NEGATIVE = {"warmup", "seed"}
_POSITIVE = {"rounds", "reps", "repeats", "timeout_s", "alpha", "min_band", "seeds", "steps", "batch_size",
             "eval_tokens", "eval_batch_size", "decode_tokens"}


def _build(cls: type, data: Any, prefix: str, file: str, lines: Mapping[str, int], problems: list[str]) -> Any:
    def at(dotted: str) -> str:
        parts = dotted.split(".")
        while parts:
            if ".".join(parts) in lines:
                return f"{file}:{lines['.'.join(parts)]}"
            parts.pop()
        return file

    if not isinstance(data, Mapping):
        problems.append(f"{at(prefix)}: {prefix or 'the file'}: expected a mapping of keys, got {data!r}")
        return None
    hints = typing.get_type_hints(cls)
    known = [f.name for f in dataclasses.fields(cls) if f.name not in ("path", "lines")]
    kwargs: dict[str, Any] = {}
    for key, value in data.items():
        dotted = f"{prefix}.{key}" if prefix else key
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"known keys here: {', '.join(known)}"
            problems.append(f"{at(dotted)}: {dotted}: unknown key; {hint}")
            continue
        tp = hints[key]
        if dataclasses.is_dataclass(tp):
            kwargs[key] = _build(tp, value, dotted, file, lines, problems)
        elif key == "cases":
            kwargs[key] = _check_cases(value, dotted, at, problems)
        elif cls is WorkloadConfig and key in ("model", "recipe", "corpus"):
            kwargs[key] = _check_overrides(value, _workload_schemas()[key], dotted, at, problems)
        else:
            before = len(problems)
            kwargs[key] = _check_value(value, tp, dotted, at(dotted), problems)
            num = kwargs[key]
            if len(problems) > before:
                continue
            if key in _POSITIVE and isinstance(num, (int, float)) and not isinstance(num, bool) and num <= 0:
                problems.append(f"{at(dotted)}: {dotted}: must be > 0, got {value!r}")
            if key in _NON_NEGATIVE and isinstance(num, int) and num < 0:
                problems.append(f"{at(dotted)}: {dotted}: must be >= 0, got {value!r}")
    missing = [
        f.name
        for f in dataclasses.fields(cls)
        if f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING and f.name not in kwargs
    ]
    for name in missing:
        problems.append(f"{file}: {prefix + '.' if prefix else ''}{name}: required key is missing; add '{name}: ...'")
    if missing or any(v is None for v in kwargs.values() if v is None):
        return None
    try:
        return cls(**{k: v for k, v in kwargs.items() if v is not None})
    except (ValueError, TypeError) as exc:  # a section's own cross-field checks (__post_init__)
        problems.append(f"{at(prefix)}: {prefix or 'config'}: {exc}")
        return None


def _check_overrides(value: Any, schema: type, dotted: str, at: Any, problems: list[str]) -> dict[str, Any]:
    """``workload.model`` etc.: keys must be fields of the workload dataclass they override."""
    if not isinstance(value, Mapping):
        problems.append(f"{at(dotted)}: {dotted}: expected a mapping of {schema.__name__} fields")
        return {}
    known = [f.name for f in dataclasses.fields(schema)]
    for key in value:
        if key not in known:
            close = difflib.get_close_matches(key, known, n=1, cutoff=0.6)
            hint = f"did you mean {close[0]!r}?" if close else f"{schema.__name__} has {', '.join(known)}"
            problems.append(f"{at(f'{dotted}.{key}')}: {dotted}.{key}: unknown {schema.__name__} field; {hint}")
    return {k: (tuple(v) if isinstance(v, list) else v) for k, v in value.items()}


def _check_cases(value: Any, dotted: str, at: Any, problems: list[str]) -> dict[str, tuple[Any, ...]]:
    if not isinstance(value, Mapping):
        problems.append(f"{at(dotted)}: {dotted}: expected a mapping axis -> list of values, e.g. 'seq: [128, 256]'")
        return {}
    out = {}
    for axis, values in value.items():
        if not isinstance(values, list):
            values = [values]
        if not values:
            problems.append(f"{at(f'{dotted}.{axis}')}: {dotted}.{axis}: empty list; give at least one value")
        out[axis] = tuple(values)
    return out


def parse_assignment(text: str) -> tuple[str, Any]:
    """``--set workload.steps=60`` -> ``("workload.steps", 60)``; the value is read as YAML."""
    key, sep, raw = text.partition("=")
    if not sep or not key.strip():
        raise ConfigError([f"--set {text!r}: expected KEY=VALUE, e.g. --set workload.steps=60"])
    try:
        return key.strip(), yaml.safe_load(raw)
    except yaml.YAMLError as exc:
        raise ConfigError([f"--set {text!r}: the value is not valid YAML ({exc})"]) from exc


def _set_dotted(data: dict[str, Any], dotted: str, value: Any) -> None:
    *parents, last = dotted.split(".")
    node = data
    for part in parents:
        child = node.get(part)
        if not isinstance(child, dict):
            child = node[part] = {}
        node = child
    node[last] = value


# --- public entry points --------------------------------------------------------------------------


def load(
    path: str | Path,
    *,
    device: str | None = None,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Read, overlay (device profile, then ``quick``) and validate a config file.

    ``device`` picks the ``profiles:`` entry (``cpu`` or ``cuda``); ``None`` leaves profiles unapplied.
    ``overrides`` are dotted keys from the command line (``seed``, ``workload.steps``), applied last.
    """
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise ConfigError([f"{path}: cannot read the config ({exc.strerror}); check the path"]) from exc
    return loads(text, str(path), device=device, quick=quick, overrides=overrides)


def loads(
    text: str,
    file: str = "<inline>",
    *,
    device: str | None = None,
    quick: bool = False,
    overrides: Mapping[str, Any] | None = None,
) -> RunConfig:
    """Like ``load`` for config text already in memory (``file`` is used in messages)."""
    problems: list[str] = []
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        line = f":{mark.line + 1}" if mark else ""
        raise ConfigError([f"{file}{line}: not valid YAML: {getattr(exc, 'problem', exc)}"]) from exc
    if node is None:
        raise ConfigError([f"{file}: the config is empty; it needs at least 'plugin: <name>'"])
    lined = _Lined()
    data = lined.build(node, "", problems, file)
    if problems:
        raise ConfigError(problems)
    if not isinstance(data, dict):
        raise ConfigError([f"{file}:1: the config must be a mapping of keys (e.g. 'plugin: flash_attn')"])
    lines = lined.lines
    profiles = data.pop("profiles", {}) or {}
    quick_overlay = data.pop("quick", {}) or {}
    if not isinstance(profiles, dict) or any(not isinstance(v, dict) for v in profiles.values()):
        problems.append(
            f"{file}:{lines.get('profiles', 0)}: profiles: expected 'profiles: {{cpu: {{...}}, cuda: {{...}}}}'"
        )
        profiles = {}
    for name in profiles:
        if name not in ("cpu", "cuda"):
            hint = _suggest(name, ["cpu", "cuda"])
            at = f"{file}:{lines.get(f'profiles.{name}', 0)}"
            problems.append(f"{at}: profiles.{name}: unknown device{hint} (use cpu or cuda)")
        else:
            # validate every profile, not only the one this run uses: a typo in the cuda profile
            # must show on a CPU laptop too
            probe = copy.deepcopy(data)
            probe_lines = dict(lines)
            _deep_merge(probe, profiles[name], probe_lines, f"profiles.{name}", "")
            _build(RunConfig, probe, "", file, probe_lines, problems)
    if not isinstance(quick_overlay, dict):
        problems.append(f"{file}:{lines.get('quick', 0)}: quick: expected a mapping of keys to override")
        quick_overlay = {}
    if device in profiles:
        _deep_merge(data, profiles[device], lines, f"profiles.{device}", "")
    if quick:
        _deep_merge(data, quick_overlay, lines, "quick", "")
    for dotted, value in (overrides or {}).items():
        _set_dotted(data, dotted, value)
        lines.pop(dotted, None)  # a command-line value has no line in the file
    config = _build(RunConfig, data, "", file, lines, problems)
    if problems:
        raise ConfigError(list(dict.fromkeys(problems)))
    return dataclasses.replace(config, path=file, lines=dict(lines))


def effective_level(config: RunConfig, plugin: Ablation) -> str:
    """``operator`` or ``model``: the config's ``level``, or for ``auto`` operator when the plugin has it."""
    if config.level != "auto":
        return config.level
    return "operator" if plugin.variants else "model"


def check_against_plugin(config: RunConfig, plugin: Ablation) -> None:
    """Problems that need the plugin: level, unknown variants or arms, unknown case axes, wrong kinds."""
    problems: list[str] = []
    level = effective_level(config, plugin)
    if level not in plugin.levels:
        problems.append(
            f"{config.where('level')}: level: plugin {plugin.name!r} has no {level} level; "
            f"it supports {', '.join(plugin.levels)}"
        )
        raise ConfigError(problems)
    if level == "model":
        names = list(plugin.arms)
        for i, name in enumerate(config.variants):
            if name not in names:
                close = difflib.get_close_matches(name, names, n=1)
                hint = f"did you mean {close[0]!r}?" if close else f"the plugin's arms are {', '.join(names)}"
                problems.append(f"{config.where(f'variants[{i}]')}: variants[{i}]: no arm {name!r}; {hint}")
        if problems:
            raise ConfigError(problems)
        return
    names = list(plugin.variants)
    for i, name in enumerate(config.variants):
        if name not in names:
            close = difflib.get_close_matches(name, names, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the plugin has {', '.join(names)}"
            problems.append(f"{config.where(f'variants[{i}]')}: variants[{i}]: no variant {name!r}; {hint}")
    axes: dict[str, list[Any]] = {}
    for case in plugin.cases:
        for axis, value in case.items:
            axes.setdefault(axis, []).append(value)
    for axis, values in config.cases.items():
        at = config.where(f"cases.{axis}")
        if axis not in axes:
            close = difflib.get_close_matches(axis, list(axes), n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"the plugin's axes are {', '.join(axes)}"
            problems.append(f"{at}: cases.{axis}: plugin {plugin.name!r} has no case axis {axis!r}; {hint}")
            continue
        kinds = {type(v) for v in axes[axis]}
        for value in values:
            if axis == "dtype" and value not in DTYPES:
                close = difflib.get_close_matches(str(value), list(DTYPES), n=1)
                hint = f"; did you mean {close[0]!r}?" if close else ""
                problems.append(f"{at}: cases.dtype: {value!r} is not a dtype ({', '.join(DTYPES)}){hint}")
            elif type(value) not in kinds and not (float in kinds and type(value) is int):
                want = " or ".join(sorted(k.__name__ for k in kinds))
                problems.append(f"{at}: cases.{axis}: {value!r} is a {type(value).__name__}, expected {want}")
    if problems:
        raise ConfigError(problems)
